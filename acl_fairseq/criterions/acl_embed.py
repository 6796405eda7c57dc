"""ACL-Embed: CE + a SupCon term where the classifier's label embeddings are extra samples.

Each exit contrasts its representations ``u`` (the input of ``out_proj``) together with the rows of
``out_proj.weight`` (one label embedding per class): ``L = CE + lambda * L_ACL``. Registered as
``acl_embed``. Example: ``--criterion acl_embed --acl-weight 1.0 --acl-temperature 0.5``.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from acl_torch import losses, objective

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
class AclEmbedCriterion(objective.AclEmbedTerms, ExitCriterionBase):
    """The terms and the measuring gate (``--log-grad-conflict``): :class:`acl_torch.objective.AclEmbedTerms`."""
