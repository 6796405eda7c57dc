"""Shared plumbing of every criterion in this plugin: one forward, one ``reduce_metrics``.

A criterion here is ``loss = ce_weight * CE + aux`` where ``CE`` is the (exit-weighted) cross-entropy
(MSE for ``--regression-target``) and ``aux`` is what a subclass adds in :meth:`aux_terms` (SCL, ACL,
cross-layer ACL). A subclass may put the two parts together otherwise by overriding :meth:`combine`
(ACL-Grad's gradient-conflict gate: ``acl_embed.py`` and ``sentence_scl.py`` hand it to ``gating.py``), and
declare the logging keys it adds (``logged_ratios``, ``logged_sums``) so that :meth:`reduce_metrics` reports them.
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
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from omegaconf import II

from .. import alignment, distributed, glue_metrics, losses
from ..heads import ExitOutputs, collect_exit_outputs
from .meters import log_regression_predictions
from .weights import check_weights

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


class ExitCriterionBase(FairseqCriterion):
    """Cross-entropy over every exit plus the subclass's auxiliary terms."""

    needs_class_labels = False  # contrastive criteria set True: they refuse --regression-target
    needs_multi_exit = False  # acl_cross_layer sets True
    contrasts = False  # a contrastive set that --contrast-across-workers can make global (sentence_scl, acl_*)
    temperatures: Tuple[str, ...] = ()  # config fields that must be > 0 (None: unset), checked at construction
    # logging keys a subclass adds, and how reduce_metrics reports them:
    logged_ratios: Dict[str, Tuple[str, str, int]] = {}  # metric -> (summed key, count key, digits): their ratio
    logged_sums: Tuple[str, ...] = ()  # keys logged as their sum over the batches

    def __init__(self, cfg: ExitCriterionConfig, task):
        super().__init__(task)
        self.cfg = cfg
        for key in self.temperatures:
            if getattr(cfg, key) is not None:
                losses.check_temperature(getattr(cfg, key), "--" + key.replace("_", "-"))
        check_weights(cfg)  # the loss weights and ACL-Grad's threshold, each in its range
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

    # --- what subclasses change -------------------------------------------------------------
    @property
    def ce_weight(self) -> float:
        """Multiplier of the cross-entropy part (SCL uses 1 - lambda)."""
        return 1.0

    def aux_terms(
        self, exits: ExitOutputs, targets: torch.Tensor, weights: torch.Tensor
    ) -> Dict[str, Tuple[float, torch.Tensor]]:
        """Auxiliary terms ``{name: (weight, batch-mean loss)}``, e.g. ``{"acl_loss": (1.0, l)}``.

        ``sum(weight * loss)`` is added to the CE part; each loss is logged unweighted under its name.
        ``weights`` are the exit weights (M,).
        """
        return {}

    def combine(self, model, exits: ExitOutputs, ce: torch.Tensor, aux: torch.Tensor) -> Tuple[torch.Tensor, Dict]:
        """``(loss to back-propagate, extra logging entries)`` from the CE part (already times ``ce_weight``)
        and the auxiliary part, both in the sum convention: here their sum. The gated criteria override it with
        ACL-Grad's gate (``acl_embed.py``, which acl_grad and acl_cross_layer inherit, and ``sentence_scl.py``, both
        calling ``gating.py``'s)."""
        return ce + aux, {}

    # --- the shared forward -------------------------------------------------------------------
    def forward(self, model, sample, reduce=True):
        exits = collect_exit_outputs(model, sample["net_input"], self.head_name)
        if self.needs_multi_exit and len(exits.logits) < 2:
            raise ValueError(
                f"{type(self).__name__} needs a multi-exit model (at least two exits); use "
                "--arch multi_exit_roberta_base (or _large) and keep more than one --exit-layers"
            )
        targets = model.get_targets(sample, [exits.logits[-1]]).view(-1)
        n = targets.numel()
        weights = losses.exit_weights(exits.layers, self.cfg.exit_weighting).to(targets.device)
        task_losses = [self._task_loss(logits, targets) for logits in exits.logits]
        ce = losses.weighted_exit_sum(task_losses, weights)  # sum over the batch
        aux_exits, aux_targets, n_contrast = exits, targets, n
        if self.cfg.contrast_across_workers and distributed.world_size() > 1:
            aux_exits, aux_targets, n_contrast = distributed.gather_for_contrast(exits, targets, real=not self.replayed)
        aux_parts = self.aux_terms(aux_exits, aux_targets, weights) if n_contrast > 0 else {}
        # sum convention: a batch-mean term counts once per sample of the set it was computed on
        aux = sum(w * v for w, v in aux_parts.values()) * n_contrast if aux_parts else ce.new_zeros(())
        loss, combine_log = self.combine(model, exits, self.ce_weight * ce, aux)
        logging_output = {
            # the true objective (under a gate's params scope the returned loss is a gradient surrogate)
            "loss": (self.ce_weight * ce + aux * n / max(n_contrast, 1)).detach(),
            "ce_loss": ce.data,
            "ntokens": sample["ntokens"],
            "nsentences": n,
            "sample_size": n,
            **{k: v.data * n for k, (_, v) in aux_parts.items()},
            **combine_log,
        }
        self._log_predictions(logging_output, exits, targets, model.training)
        if self.alignment_metrics and not (model.training or self.regression):
            logging_output.update(_alignment_sums(exits, targets))
        return loss, n, logging_output

    def _task_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.regression:
            return F.mse_loss(logits.view(-1).float(), targets.float(), reduction="sum")
        return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, reduction="sum")

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
    """Per-exit summed cosines for the validation alignment scalars (see acl_fairseq.alignment)."""
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
