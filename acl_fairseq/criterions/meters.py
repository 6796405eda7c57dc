"""What criteria read from and add to fairseq's meters: the update count, and a validation-only meter
for Spearman correlation, which needs every prediction (not sums)."""
from typing import List

import torch
from fairseq.logging import metrics
from fairseq.logging.meters import Meter

from acl_torch import glue_metrics


def current_update(default: int = -1) -> int:
    """The trainer's update count (it logs ``num_updates`` to the always-active default aggregator);
    ``default`` outside fairseq's trainer."""
    meter = metrics.get_meter("default", "num_updates")
    value = getattr(meter, "val", None) if meter is not None else None
    return int(value) if value is not None else default


class PredictionMeter(Meter):
    """Collects (prediction, target) pairs of one validation pass.

    Only ever logged inside fairseq's temporary validation aggregator, so it is never saved into
    a checkpoint (fairseq restores meters by class name from its own module only).
    """

    def __init__(self):
        self.pred: List[float] = []
        self.targ: List[float] = []

    def update(self, pred: torch.Tensor, targ: torch.Tensor) -> None:
        self.pred.extend(pred.view(-1).tolist())
        self.targ.extend(targ.view(-1).tolist())

    def reset(self) -> None:
        self.pred, self.targ = [], []

    @property
    def smoothed_value(self) -> float:
        return float(len(self.pred))


def log_regression_predictions(logging_outputs) -> None:
    """Log ``spearman`` (percent) when the outputs carry per-example regression predictions."""
    preds = [log["_pred"] for log in logging_outputs if "_pred" in log]
    if not preds:
        return
    targs = [log["_targ"] for log in logging_outputs if "_targ" in log]
    metrics.log_custom(PredictionMeter, "_predictions", torch.cat(preds), torch.cat(targs))
    metrics.log_derived(
        "spearman",
        lambda m: round(glue_metrics.regression_metrics(m["_predictions"].pred, m["_predictions"].targ)["spearman"], 2),
    )
