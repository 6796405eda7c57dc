"""The one objective of every criterion, for both trainers: every exit's logits and features and the targets in,
the loss to back-propagate and its logged parts out (docs/method.md).

A criterion is a :class:`Terms` subclass that reads its options from ``self.cfg`` (fairseq's criterion config, or
the Hugging Face trainer's :class:`acl_hf.arguments.CriterionArguments`: the same field names and defaults):
``loss = ce_weight * CE + aux`` where ``CE`` is the exit-weighted cross-entropy (MSE for a regression target),
``aux`` what :meth:`Terms.aux_terms` adds (SCL, ACL, cross-layer ACL, distillation), and the two are put together
by the ACL-Grad gate where the criterion asks for one (:meth:`Terms.gate_config`). The fairseq criteria
(``acl_fairseq/criterions/``) inherit these classes; ``acl_hf.trainer.AclTrainer`` builds one from its arguments.

Losses follow fairseq's sum convention: sums over the batch, divided by the batch size by the trainer (fairseq's
``sample_size``; the Hugging Face trainer divides by its ``num_items_in_batch``); contrastive means are multiplied
by the size of the set they were computed on. Nothing here imports fairseq or transformers.
"""
from typing import Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import distributed, gate, losses
from .exit_heads import ExitOutputs
from .weights import check_weights


class Parts(NamedTuple):
    """What :func:`objective` returns."""

    loss: torch.Tensor  # to back-propagate (sum convention; under a gate's params scope a gradient surrogate)
    total: torch.Tensor  # the true objective, detached (sum convention over the local batch)
    ce: torch.Tensor  # the exit-weighted task loss (sum over the batch, not times ce_weight), detached
    aux: Dict[str, torch.Tensor]  # each auxiliary term's batch-mean loss, unweighted, detached
    gate_log: Dict[str, torch.Tensor]  # the gate's logging tensors (filled in by the backward), or {}
    n: int  # local examples
    n_contrast: int  # examples of the contrastive set (the global one under contrast_across_workers)


def flag(key: str) -> str:
    """fairseq's spelling of an option in messages: ``acl_weight`` -> ``--acl-weight``."""
    return "--" + key.replace("_", "-")


class Terms:
    """Cross-entropy over every exit; subclasses add auxiliary terms and may ask for the gate."""

    name = "sentence_ce"
    needs_class_labels = False  # contrastive criteria set True: they refuse a regression target
    needs_multi_exit = False  # acl_cross_layer and multi_exit_kd set True
    contrasts = False  # a contrastive set that contrast_across_workers can make global (sentence_scl, acl_*)
    temperatures: Tuple[str, ...] = ()  # options that must be > 0 (None: unset)
    # logging keys a criterion adds, and how they are reported:
    logged_ratios: Dict[str, Tuple[str, str, int]] = {}  # metric -> (summed key, count key, digits): their ratio
    logged_sums: Tuple[str, ...] = ()  # keys logged as their sum over the batches

    def check_options(self, spell: Callable[[str], str] = flag) -> None:
        """Raise ValueError naming the option (as ``spell`` writes it) for a temperature <= 0 or a weight outside
        its range (:mod:`acl_torch.weights`)."""
        for key in self.temperatures:
            if getattr(self.cfg, key) is not None:
                losses.check_temperature(getattr(self.cfg, key), spell(key))
        check_weights(self.cfg, spell)

    @property
    def ce_weight(self) -> float:
        """Multiplier of the cross-entropy part (SCL uses 1 - lambda)."""
        return 1.0

    def aux_terms(
        self, exits: ExitOutputs, targets: torch.Tensor, weights: torch.Tensor
    ) -> Dict[str, Tuple[float, torch.Tensor]]:
        """Auxiliary terms ``{name: (weight, batch-mean loss)}``, e.g. ``{"acl_loss": (1.0, l)}``; ``weights``: the
        exit weights (M,)."""
        return {}

    def gate_config(self) -> Optional[gate.GateConfig]:
        """The ACL-Grad gate's settings, or None: the loss is ``ce + aux`` with no gradient comparison."""
        return None

    def gated_features(self, exits: ExitOutputs) -> Optional[Sequence[torch.Tensor]]:
        """What the gate's ``features`` scope compares gradients on (None: the exits' ``u``)."""
        return None


class _ContrastiveTerms(Terms):
    """A contrastive term over class labels, which the gate may measure or gate (it logs the gate's keys)."""

    needs_class_labels = True
    contrasts = True
    logged_ratios = gate.LOGGED_RATIOS
    logged_sums = gate.LOGGED_SUMS


class SentenceSclTerms(_ContrastiveTerms):
    """``(1 - lambda) * CE + lambda * SCL`` over the pooled state (or ``u``), optionally gated (``scl_grad``)."""

    name = "sentence_scl"
    temperatures = ("scl_temperature",)

    @property
    def ce_weight(self) -> float:
        return 1.0 - self.cfg.scl_weight

    def contrasted(self, exits):
        """The representations SCL contrasts, per exit."""
        return exits.pooled if self.cfg.scl_feature == "encoder" else exits.features

    def gate_config(self):
        cfg = self.cfg
        if not (cfg.scl_grad or cfg.log_grad_conflict):
            return None
        return gate.GateConfig(cfg.scl_grad_scope, cfg.scl_grad_threshold, cfg.scl_grad_global_decision,
                               apply=cfg.scl_grad)

    def gated_features(self, exits):
        return self.contrasted(exits)

    def aux_terms(self, exits, targets, weights):
        feats = self.contrasted(exits)
        per_exit = [losses.supcon_loss(f, targets, self.cfg.scl_temperature) for f in feats]
        return {"scl_loss": (self.cfg.scl_weight, losses.weighted_exit_sum(per_exit, weights))}


class AclEmbedTerms(_ContrastiveTerms):
    """``CE + lambda * L_ACL``, the label embeddings as extra samples; measured, never gated."""

    name = "acl_embed"
    temperatures = ("acl_temperature",)

    def gated(self) -> bool:
        """Whether the ACL-Grad rule drops the auxiliary part on conflict (acl_grad, acl_cross_layer)."""
        return False

    def acl_gate(self, apply: bool) -> gate.GateConfig:
        """The gate's settings; ACL-Embed only measures, over all parameters at METHOD.md's threshold 0."""
        return gate.GateConfig("params", 0.0, apply=apply)

    def gate_config(self):
        if self.gated() or self.cfg.log_grad_conflict:
            return self.acl_gate(apply=self.gated())
        return None

    def acl_term(self, exits, targets, weights):
        per_exit = losses.acl_embed_losses(  # (M,): every exit in one batched product
            exits.features, targets, exits.label_embeddings, self.cfg.acl_temperature, anchors=self.cfg.acl_anchors
        )
        return weights.to(per_exit) @ per_exit

    def aux_terms(self, exits, targets, weights):
        return {"acl_loss": (self.cfg.acl_weight, self.acl_term(exits, targets, weights))}


class AclGradTerms(AclEmbedTerms):
    """ACL-Embed whose ACL term is dropped for a batch whose gradient conflicts with CE's."""

    name = "acl_grad"

    def gated(self) -> bool:
        return True

    def acl_gate(self, apply: bool) -> gate.GateConfig:
        cfg = self.cfg  # read at each step: the options' values, passed to the gate (which reads no cfg)
        return gate.GateConfig(cfg.acl_grad_scope, cfg.acl_grad_threshold, cfg.acl_grad_global_decision, apply)


class AclCrossLayerTerms(AclGradTerms):
    """The last exit teaches the shallow ones: ``sum_m w_m [CE^m + lambda L_ACL^m] + mu mean_{m<M} L_CL^m``."""

    name = "acl_cross_layer"
    needs_multi_exit = True
    temperatures = ("acl_temperature", "acl_cl_temperature")

    @property
    def cl_temperature(self) -> float:
        # only None (unset) means tau: an explicit 0 is refused like any other temperature
        cfg = self.cfg
        return cfg.acl_temperature if cfg.acl_cl_temperature is None else cfg.acl_cl_temperature

    @property
    def acl_grad(self) -> bool:
        """Whether the ACL-Grad rule gates the non-CE part (on unless ``no_acl_grad``)."""
        return not self.cfg.no_acl_grad

    def gated(self) -> bool:
        return self.acl_grad

    def aux_terms(self, exits, targets, weights):
        teacher_u, teacher_l = exits.features[-1], exits.label_embeddings[-1]
        per_student = losses.cross_layer_acl_losses(  # (M-1,)
            exits.features[:-1], teacher_u, targets, teacher_l, self.cl_temperature
        )
        return {
            "acl_loss": (self.cfg.acl_weight, self.acl_term(exits, targets, weights)),
            "acl_cl_loss": (self.cfg.acl_cl_weight, per_student.mean()),
        }


class MultiExitKdTerms(Terms):
    """Self-distillation: each shallow exit matches the stop-gradient last exit's softened distribution."""

    name = "multi_exit_kd"
    needs_class_labels = True  # a softmax distribution to match: no regression target
    needs_multi_exit = True
    temperatures = ("kd_temperature",)

    def aux_terms(self, exits, targets, weights):
        teacher = exits.logits[-1]
        per_student = torch.stack([losses.self_distillation_loss(z, teacher, self.cfg.kd_temperature)
                                   for z in exits.logits[:-1]])  # (M-1,)
        return {"kd_loss": (self.cfg.kd_weight, per_student.mean())}


# criterion name -> its terms, in the order `acl-help --list` prints the criteria
TERMS = {t.name: t for t in (Terms, SentenceSclTerms, AclEmbedTerms, AclGradTerms, AclCrossLayerTerms,
                             MultiExitKdTerms)}


def task_loss(logits: torch.Tensor, targets: torch.Tensor, regression: bool) -> torch.Tensor:
    """One exit's summed task loss in float32: CE over classes, or MSE for a regression target."""
    if regression:
        return F.mse_loss(logits.view(-1).float(), targets.float(), reduction="sum")
    return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, reduction="sum")


def _aux_parts(terms: Terms, exits: ExitOutputs, targets: torch.Tensor, weights: torch.Tensor, gather: bool,
               real: bool):
    """``({name: (weight, value)}, n_contrast)``: the criterion's auxiliary terms over the contrastive set (this
    rank's rows, or every rank's with ``gather``) and that set's size; no terms over an empty set."""
    aux_exits, aux_targets, n_contrast = exits, targets, targets.numel()
    if gather and distributed.world_size() > 1:
        aux_exits, aux_targets, n_contrast = distributed.gather_for_contrast(exits, targets, real=real)
    return (terms.aux_terms(aux_exits, aux_targets, weights) if n_contrast > 0 else {}), n_contrast


def objective(
    terms: Terms,
    exits: ExitOutputs,
    targets: torch.Tensor,
    *,
    params: Callable[[], Sequence[torch.Tensor]], training: bool, loss_scaler: bool,
    regression: bool = False, gather: bool = False, real: bool = True,
    where: Callable[[], str] = lambda: "this step",
    advice: str = gate.FAIRSEQ_ADVICE,
) -> Parts:
    """The criterion's loss over one (micro-)batch, in the sum convention.

    Args:
        terms: the criterion (a :class:`Terms` with its ``cfg``).
        exits: every exit's outputs; targets: (B,) labels (float scores for a regression target).
        params: returns the model's parameters (the gate's ``params`` scope); training: the model trains (the
            gate decides only then); loss_scaler: a dynamic loss scaler skips overflowed steps (the gate then
            passes an inf/NaN on instead of raising).
        gather: contrast against every rank's rows (``contrast_across_workers``; no effect on one process);
            real: False while this rank replays a dummy batch (it contributes no rows).
        where, advice: what the gate's error names and advises.
    """
    n = targets.numel()
    weights = losses.exit_weights(exits.layers, terms.cfg.exit_weighting).to(targets.device)
    ce = losses.weighted_exit_sum([task_loss(logits, targets, regression) for logits in exits.logits], weights)
    aux_parts, n_contrast = _aux_parts(terms, exits, targets, weights, gather, real)
    # sum convention: a batch-mean term counts once per sample of the set it was computed on
    aux = sum(w * v for w, v in aux_parts.values()) * n_contrast if aux_parts else ce.new_zeros(())
    weighted_ce = terms.ce_weight * ce
    config = terms.gate_config()
    if config is None:
        loss, gate_log = weighted_ce + aux, {}
    else:
        loss, gate_log = gate.combine(params, exits, weighted_ce, aux, config, training=training,
                                      loss_scaler=loss_scaler, features=terms.gated_features(exits), where=where,
                                      advice=advice)
    total = (weighted_ce + aux * n / max(n_contrast, 1)).detach()
    return Parts(loss, total, ce.detach(), {k: v.detach() for k, (_, v) in aux_parts.items()}, gate_log, n,
                 n_contrast)

