"""ACL-Embed: CE + a SupCon term where the classifier's label embeddings are extra samples.

Each exit contrasts its representations ``u`` (the input of ``out_proj``) together with the rows of
``out_proj.weight`` (one label embedding per class): ``L = CE + lambda * L_ACL``. Registered as
``acl_embed``. Example: ``--criterion acl_embed --acl-weight 1.0 --acl-temperature 0.5``.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from .. import losses
from . import gating
from .base import ExitCriterionBase, ExitCriterionConfig


@dataclass
class AclEmbedConfig(ExitCriterionConfig):
    acl_weight: float = field(
        default=1.0, metadata={"help": "lambda in CE + lambda * L_ACL; 0 means plain CE"}
    )
    acl_temperature: float = field(
        default=0.5, metadata={"help": "ACL temperature tau (> 0) of the contrastive term"}
    )
    acl_anchors: ChoiceEnum(list(losses.ANCHOR_MODES)) = field(
        default="all",
        metadata={
            "help": "which members of the augmented set are anchors: 'all' = samples and label "
            "embeddings, 'samples' = only the batch's samples (label embeddings stay candidates)"
        },
    )
    log_grad_conflict: bool = field(
        default=False,
        metadata={
            "help": "log grad_cos and conflict_rate of the ACL term's gradient against CE's (over all parameters; "
            "acl_cross_layer: its --acl-grad-scope) without dropping anything; costs a second backward"
        },
    )


@register_criterion("acl_embed", dataclass=AclEmbedConfig)
class AclEmbedCriterion(ExitCriterionBase):
    needs_class_labels = True
    contrasts = True
    temperatures = ("acl_temperature",)
    logged_ratios = gating.LOGGED_RATIOS
    logged_sums = gating.LOGGED_SUMS

    def gated(self) -> bool:
        """Whether the ACL-Grad rule drops the auxiliary part on conflict (acl_grad, acl_cross_layer)."""
        return False

    def gate_config(self, apply: bool) -> gating.GateConfig:
        """The gate's settings; ACL-Embed only measures, over all parameters at METHOD.md's threshold 0."""
        return gating.GateConfig("params", 0.0, apply=apply)

    def combine(self, model, exits, ce, aux):
        if self.gated() or self.cfg.log_grad_conflict:
            return gating.combine(model, exits, ce, aux, self.gate_config(apply=self.gated()))
        return super().combine(model, exits, ce, aux)

    def acl_term(self, exits, targets, weights):
        per_exit = losses.acl_embed_losses(  # (M,): every exit in one batched product
            exits.features, targets, exits.label_embeddings, self.cfg.acl_temperature, anchors=self.cfg.acl_anchors
        )
        return weights.to(per_exit) @ per_exit

    def aux_terms(self, exits, targets, weights):
        return {"acl_loss": (self.cfg.acl_weight, self.acl_term(exits, targets, weights))}
