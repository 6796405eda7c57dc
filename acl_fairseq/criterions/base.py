"""Shared plumbing of every criterion in this plugin: one forward, one ``reduce_metrics``.

A criterion here is ``loss = ce_weight * CE + aux`` where ``CE`` is the (exit-weighted) cross-entropy
(MSE for ``--regression-target``) and ``aux`` is what a subclass adds in :meth:`aux_terms` (SCL, ACL,
cross-layer ACL). The maths of every criterion, the gate included, is :mod:`acl_torch.objective`'s (which the
Hugging Face trainer calls too): a criterion here inherits its :class:`~acl_torch.objective.Terms` class, which
declares the logging keys it adds (``logged_ratios``, ``logged_sums``) so that :meth:`reduce_metrics` reports them.
Losses follow fairseq's sum convention: sums over the batch, divided by ``sample_size`` (sentences)
by the optimizer; contrastive means are multiplied by the batch size to match.

Logged (and shown in TensorBoard under the same names): ``loss``, ``ce_loss``, each contrastive part,
the subclass's declared keys (``grad_cos`` and ``conflict_rate`` when gated), the GLUE metrics
``accuracy``/``f1``/``mcc`` (classification; F1/MCC with the positive class mapped through the label dictionary) or
``pearson``/``spearman`` (regression, validation), and ``accuracy_exit{L}`` per exit of a multi-exit
model.
"""
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.criterions import FairseqCriterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from omegaconf import II

from acl_torch import alignment, glue_metrics, losses, objective
from acl_torch.exit_heads import ExitOutputs

from ..heads import collect_exit_outputs
from .meters import current_update, log_regression_predictions

logger = logging.getLogger(__name__)

_WARNED = []  # the --required-batch-size-multiple warning was given


@dataclass
class ExitCriterionConfig(SentencePredictionConfig):
    exit_weighting: ChoiceEnum(list(losses.EXIT_WEIGHTINGS)) = field(
        default="layer",
        metadata={
            "help": "how a multi-exit model weights its exits' losses: 'layer' = proportional to the "
            "layer index (PABEE), 'uniform' = equal weights; no effect with one exit"
        },
    )
    no_alignment_metrics: bool = field(
        default=False,
        metadata={
            "help": "do not log the validation alignment scalars (align_own/other/gap per exit, "
            "align_to_last per shallow exit); they cost a K x d product per batch and exit"
        },
    )
    contrast_across_workers: bool = field(
        default=False,
        metadata={
            "help": "under distributed training, contrast each sample against the features of every "
            "worker's batch (the global batch, as one large-batch run would), with gradients flowing "
            "to the local part; off = each worker contrasts within its own batch. Needs --task "
            "sentence_prediction_acl, which tells the criterion which batches fairseq replays as "
            "dummies (their rows are never contrasted)"
        },
    )
    # not an option of its own: fairseq fills it from --required-batch-size-multiple (start-up check)
    required_batch_size_multiple: Optional[int] = II("dataset.required_batch_size_multiple")


class ExitCriterionBase(objective.Terms, FairseqCriterion):
    """Cross-entropy over every exit plus the auxiliary terms of the criterion's :class:`objective.Terms`."""

    def __init__(self, cfg: ExitCriterionConfig, task):
        FairseqCriterion.__init__(self, task)
        self.cfg = cfg
        self.check_options()  # temperatures > 0, the loss weights and ACL-Grad's threshold each in its range
        self.head_name = cfg.classification_head_name
        self.regression = cfg.regression_target
        name = type(self).__name__
        if self.regression and self.needs_class_labels:
            raise ValueError(
                f"{name} needs class labels (it contrasts or distils class distributions), but --regression-target "
                "is set (e.g. STS-B); use --criterion sentence_ce for regression tasks"
            )
        self.positive = None
        if not self.regression:
            self.positive = _check_label_dictionary(task)
        self.replayed = False  # set by the plugin's task while fairseq replays a dummy batch
        if cfg.contrast_across_workers and not self.contrasts:
            # the auxiliary term would be scaled by the global batch size over local logits (multi_exit_kd)
            raise ValueError(
                f"--contrast-across-workers shares the contrastive set of sentence_scl and the acl_* criteria; "
                f"{name} has none: drop the flag"
            )
        knows_replays = getattr(task, "marks_replayed_batches", False)
        if cfg.contrast_across_workers and not knows_replays:
            raise ValueError(
                "--contrast-across-workers needs --task sentence_prediction_acl: when a worker runs out "
                "of batches fairseq replays an old one with its loss zeroed, and only the plugin's task "
                "tells the criterion, so that those rows are not contrasted by the other workers"
            )
        multiple = _config_value(cfg, "required_batch_size_multiple")
        if multiple and multiple > 1 and not getattr(task, "validates_every_example", False) and not _WARNED:
            _WARNED.append(multiple)  # once per process, not once per criterion built
            logger.warning(
                "fairseq drops the last validation batch when its size is not a multiple of "
                "--required-batch-size-multiple (%d here), so validation metrics may skip examples: pass "
                "--required-batch-size-multiple 1, or use --task sentence_prediction_acl (it validates "
                "every example)", multiple,
            )

    @contextmanager
    def replaying(self, replayed: bool):
        """While fairseq replays a dummy batch (``ignore_grad``): its rows are not contrast candidates."""
        before, self.replayed = self.replayed, bool(replayed)
        try:
            yield
        finally:
            self.replayed = before

    @property
    def alignment_metrics(self) -> bool:
        """Whether validation logs the alignment scalars (on unless ``--no-alignment-metrics``)."""
        return not self.cfg.no_alignment_metrics

    # --- the shared forward -------------------------------------------------------------------
    def forward(self, model, sample, reduce=True):
        exits = collect_exit_outputs(model, sample["net_input"], self.head_name)
        if self.needs_multi_exit and len(exits.logits) < 2:
            raise ValueError(
                f"{type(self).__name__} needs a multi-exit model (at least two exits); use "
                "--arch multi_exit_roberta_base (or _large) and keep more than one --exit-layers"
            )
        targets = model.get_targets(sample, [exits.logits[-1]]).view(-1)
        parts = objective.objective(
            self, exits, targets, params=model.parameters, training=model.training,
            loss_scaler=has_loss_scaler(model), regression=self.regression, gather=self.cfg.contrast_across_workers,
            real=not self.replayed, where=lambda: f"update {current_update()}",
        )
        n = parts.n
        logging_output = {
            # the true objective (under a gate's params scope the returned loss is a gradient surrogate)
            "loss": parts.total,
            "ce_loss": parts.ce,
            "ntokens": sample["ntokens"],
            "nsentences": n,
            "sample_size": n,
            **{k: v * n for k, v in parts.aux.items()},
            **parts.gate_log,
        }
        self._log_predictions(logging_output, exits, targets, model.training)
        if self.alignment_metrics and not (model.training or self.regression):
            logging_output.update(_alignment_sums(exits, targets))
        return parts.loss, n, logging_output

    def _task_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return objective.task_loss(logits, targets, self.regression)

    def _log_predictions(self, out: Dict, exits: ExitOutputs, targets: torch.Tensor, training: bool) -> None:
        if self.regression:
            pred = exits.logits[-1].detach().view(-1).float()
            out.update(_regression_sums(pred, targets.float()))
            if not training:
                out["_pred"], out["_targ"] = pred.cpu(), targets.float().cpu()
            return
        for layer, logits in zip(exits.layers, exits.logits):
            out[exit_key("ncorrect", layer)] = (logits.argmax(-1) == targets).sum()
        pred = exits.logits[-1].argmax(-1)
        out["ncorrect"] = out[exit_key("ncorrect", exits.layers[-1])]
        if self.positive is not None:
            pos_p, pos_t = pred == self.positive, targets == self.positive
            out["tp"], out["fp"] = (pos_p & pos_t).sum(), (pos_p & ~pos_t).sum()
            out["fn"], out["tn"] = (~pos_p & pos_t).sum(), (~pos_p & ~pos_t).sum()
        if len(exits.layers) == 1:
            del out[exit_key("ncorrect", exits.layers[-1])]

    def logging_outputs_can_be_summed(self) -> bool:
        # regression validation carries per-example predictions (for Spearman): gather, don't sum
        return not self.regression

    # --- metrics ----------------------------------------------------------------------------
    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        def total(key):
            return float(sum(log.get(key, 0) for log in logging_outputs))

        n = total("sample_size")
        if n == 0:
            return
        metrics.log_scalar("loss", total("loss") / n / math.log(2), n, round=3)
        keys = set().union(*(log.keys() for log in logging_outputs))
        for key in sorted(k for k in keys if k.endswith("_loss")):
            metrics.log_scalar(key, total(key) / n / math.log(2), n, round=3)
        for key in cls.logged_sums:
            if total(key):
                metrics.log_scalar_sum(key, total(key), round=0)
        for name, (summed, count, digits) in cls.logged_ratios.items():
            if total(count):
                metrics.log_scalar(name, total(summed) / total(count), total(count), round=digits)
        if "ncorrect" in keys:
            metrics.log_scalar("accuracy", 100.0 * total("ncorrect") / n, n, round=2)
            for layer, key in exit_keys(keys, "ncorrect"):
                metrics.log_scalar(exit_key("accuracy", layer), 100.0 * total(key) / n, n, round=2)
        if "tp" in keys:
            tp, fp, fn, tn = (total(k) for k in ("tp", "fp", "fn", "tn"))
            for k, v in dict(tp=tp, fp=fp, fn=fn, tn=tn).items():
                metrics.log_scalar_sum("_" + k, v)
            metrics.log_derived("f1", lambda m: round(glue_metrics.f1_from_counts(*_counts(m)[:3]), 2))
            metrics.log_derived("mcc", lambda m: round(glue_metrics.mcc_from_counts(*_counts(m)), 2))
        if "sxy" in keys:
            for k in ("n_reg", "sx", "sy", "sxx", "syy", "sxy"):
                metrics.log_scalar_sum("_" + k, total(k))
            metrics.log_derived("pearson", lambda m: round(glue_metrics.pearson_from_sums(*_sums(m)), 2))
        for layer, key in exit_keys(keys, "align_own"):
            own, other = total(key) / n, total(exit_key("align_other", layer)) / n
            metrics.log_scalar(key, own, n, round=4)
            metrics.log_scalar(exit_key("align_other", layer), other, n, round=4)
            metrics.log_scalar(exit_key("align_gap", layer), own - other, n, round=4)
        for _, key in exit_keys(keys, "align_to_last"):
            metrics.log_scalar(key, total(key) / n, n, round=4)
        log_regression_predictions(logging_outputs)


def has_loss_scaler(model) -> bool:
    """Whether training runs with a dynamic loss scaler: fp16 weights (``--fp16``,
    ``--memory-efficient-fp16``) or fp16 autocast (``--amp``); not fp32, bf16 or bf16 autocast."""
    first = next((p for p in model.parameters() if p.requires_grad), None)
    if first is None:
        return False
    device = first.device.type
    autocast_fp16 = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16
    return first.dtype == torch.float16 or autocast_fp16


def exit_key(stem: str, layer) -> str:
    """The logging key of one exit's value: ``ncorrect_exit3``, ``align_own_exit1``, ``accuracy_exit3``."""
    return f"{stem}_exit{layer}"


def exit_keys(keys, stem: str) -> List[Tuple[str, str]]:
    """``(layer, key)`` of the per-exit keys of ``stem`` among ``keys``, by key (:func:`exit_key`'s inverse)."""
    prefix = exit_key(stem, "")
    return [(k[len(prefix):], k) for k in sorted(keys) if k.startswith(prefix) and k[len(prefix):].isdigit()]


def _config_value(cfg, key: str):
    """``cfg.key``, or None where its interpolation cannot resolve (a config detached from fairseq's)."""
    try:
        return getattr(cfg, key, None)
    except Exception:  # omegaconf's InterpolationResolutionError and relatives
        return None


def _alignment_sums(exits: ExitOutputs, targets: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Per-exit summed cosines for the validation alignment scalars (see acl_torch.alignment)."""
    out = {}
    for layer, u, w in zip(exits.layers, exits.features, exits.label_embeddings):
        sums = alignment.label_alignment_sums(u, targets, w)
        out[exit_key("align_own", layer)], out[exit_key("align_other", layer)] = sums["own"], sums["other"]
    for layer, u in zip(exits.layers[:-1], exits.features[:-1]):
        out[exit_key("align_to_last", layer)] = alignment.exit_agreement_sum(u, exits.features[-1])
    return out


def _counts(meters):
    return tuple(meters["_" + k].sum for k in ("tp", "fp", "fn", "tn"))


def _sums(meters):
    return tuple(meters["_" + k].sum for k in ("n_reg", "sx", "sy", "sxx", "syy", "sxy"))


def _regression_sums(pred: torch.Tensor, targ: torch.Tensor) -> Dict[str, torch.Tensor]:
    pred, targ = pred.double(), targ.double()
    return {
        "n_reg": pred.new_tensor(float(pred.numel())),
        "sx": pred.sum(), "sy": targ.sum(),
        "sxx": (pred * pred).sum(), "syy": (targ * targ).sum(), "sxy": (pred * targ).sum(),
    }


def _check_label_dictionary(task):
    """Check --num-classes against the label dictionary; return the positive class index (or None)."""
    label_dict = getattr(task, "label_dictionary", None)
    if label_dict is None:
        raise ValueError(
            "no label dictionary: classification needs DATA/label/dict.txt (binarize the labels "
            "with fairseq-preprocess or preprocess/glue.py), or pass --regression-target for scores"
        )
    names = glue_metrics.label_names(label_dict)
    num_classes = task.cfg.num_classes
    if num_classes != len(names):
        raise ValueError(
            f"--num-classes {num_classes} does not match the label dictionary, which has "
            f"{len(names)} labels ({', '.join(names)}); set --num-classes {len(names)}"
        )
    return glue_metrics.positive_index(label_dict)
