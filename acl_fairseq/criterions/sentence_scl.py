"""CE + supervised contrastive loss (Gunel et al. 2021, https://arxiv.org/abs/2011.01403).

``L = (1 - lambda) * CE + lambda * SCL``, SCL = SupCon over the L2-normalised sentence
representations of the batch. ``--scl-grad`` drops the SCL term of a batch whose gradient conflicts
with CE's (the ACL-Grad rule, METHOD.md); ``--log-grad-conflict`` only measures. Registered as
``sentence_scl``. Example: ``--criterion sentence_scl --scl-weight 0.9 --scl-temperature 0.3``.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from acl_torch import objective

from . import gating
from .base import ExitCriterionBase, ExitCriterionConfig


@dataclass
class SentenceSclConfig(ExitCriterionConfig):
    scl_weight: float = field(
        default=0.9,
        metadata={"help": "lambda in (1 - lambda) * CE + lambda * SCL; 0 means plain CE, 1 means SCL only"},
    )
    scl_temperature: float = field(
        default=0.3, metadata={"help": "SCL temperature tau (> 0); smaller values sharpen the contrast"}
    )
    scl_feature: ChoiceEnum(["encoder", "head"]) = field(
        default="encoder",
        metadata={
            "help": "representation SCL contrasts: 'encoder' = the pooled encoder state the head reads "
            "(<s>, Gunel et al.), 'head' = the input of the head's out_proj"
        },
    )
    scl_grad: bool = field(
        default=False,
        metadata={"help": "drop the SCL term of a batch when cos(g_CE, g_SCL) is below --scl-grad-threshold (the "
                  "ACL-Grad rule on SCL); logs grad_cos and conflict_rate"},
    )
    scl_grad_threshold: float = field(
        default=0.0, metadata={"help": "--scl-grad drops the SCL term below this cosine (in [-1, 1])"}
    )
    scl_grad_scope: ChoiceEnum(list(gating.SCOPES)) = field(
        default="params",
        metadata={"help": "gradients compared: 'params' = over all trainable parameters both losses reach "
                  "(exact), 'features' = w.r.t. the representations SCL contrasts (cheap)"},
    )
    scl_grad_global_decision: bool = field(
        default=False,
        metadata={"help": "under distributed training, decide on the gradients summed over all workers "
                  "(as --acl-grad-global-decision)"},
    )
    log_grad_conflict: bool = field(
        default=False,
        metadata={"help": "log grad_cos and conflict_rate of the SCL gradient against CE's (with --scl-grad-scope "
                  "and --scl-grad-threshold) without dropping anything; costs a second backward"},
    )


@register_criterion("sentence_scl", dataclass=SentenceSclConfig)
class SentenceSclCriterion(objective.SentenceSclTerms, ExitCriterionBase):
    """The terms, the gate and the ``contrasted`` representations: :class:`acl_torch.objective.SentenceSclTerms`."""
