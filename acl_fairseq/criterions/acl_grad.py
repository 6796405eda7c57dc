"""ACL-Grad: ACL-Embed whose ACL term is discarded for a batch when its gradient conflicts with CE's.

If ``cos(g_CE, g_ACL) < --acl-grad-threshold`` the update uses ``g_CE`` alone, else
``g_CE + g_ACL`` (a discard, not a PCGrad projection). ``--acl-grad-scope params`` compares the
gradients over all trainable parameters (exact), ``features`` those over the representations ``u``
(one backward). Logs ``grad_cos`` and ``conflict_rate``. Registered as ``acl_grad``.
Example: ``--criterion acl_grad --acl-grad-scope params``.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from acl_torch import gate, objective

from .acl_embed import AclEmbedConfig, AclEmbedCriterion


@dataclass
class AclGradConfig(AclEmbedConfig):
    acl_grad_threshold: float = field(
        default=0.0,
        metadata={"help": "drop the ACL term when cos(g_CE, g_ACL) is below this value (-1 keeps it always). With "
                  "ACL-Embed the rule rarely fires: the label embeddings are the classifier's rows, so the ACL "
                  "gradient points along CE's (RTE: 79 degrees, no batch over 90; SCL: 45 percent of batches, see "
                  "benchmarks/grad_conflict.py); sentence_scl --scl-grad puts the rule on SCL"},
    )
    acl_grad_scope: ChoiceEnum(list(gate.SCOPES)) = field(
        default="params",
        metadata={
            "help": "gradients compared: 'params' = over all trainable parameters both losses reach "
            "(exact, two extra gradient passes), 'features' = w.r.t. the representations u (cheap)"
        },
    )
    acl_grad_global_decision: bool = field(
        default=False,
        metadata={
            "help": "under distributed training, take the keep/discard decision on the gradients summed "
            "over all workers (every rank decides alike; with --contrast-across-workers it equals the "
            "single-process decision on the global batch). Costs two gradient-sized all-reduces per "
            "step with --acl-grad-scope params, a 3-number all-reduce with 'features'. Off = each "
            "worker decides on its own micro-batch's gradients"
        },
    )


@register_criterion("acl_grad", dataclass=AclGradConfig)
class AclGradCriterion(objective.AclGradTerms, AclEmbedCriterion):
    """The rule's settings from the ``--acl-grad-*`` flags: :class:`acl_torch.objective.AclGradTerms`."""
