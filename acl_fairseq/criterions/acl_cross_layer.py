"""ACL cross-layer: the last exit teaches the shallow exits of a multi-exit RoBERTa.

For each student exit m < M, SupCon with anchors ``u^m`` against the (stop-gradient) teacher's
``u^M`` of the whole batch and its label embeddings ``l^M``:
``L = sum_m w_m [CE^m + lambda * L_ACL^m] + mu * mean_{m<M} L_CL^m``, with the ACL-Grad rule on
the non-CE part unless ``--no-acl-grad``. Multi-exit models only. Registered as ``acl_cross_layer``.
Example: ``--arch multi_exit_roberta_base --criterion acl_cross_layer --acl-cl-weight 1.0``.
"""
from dataclasses import dataclass, field
from typing import Optional

from fairseq.criterions import register_criterion

from acl_torch import objective

from .acl_grad import AclGradConfig, AclGradCriterion


@dataclass
class AclCrossLayerConfig(AclGradConfig):
    acl_cl_weight: float = field(
        default=1.0, metadata={"help": "mu, the weight of the mean cross-layer term; 0 means none"}
    )
    acl_cl_temperature: Optional[float] = field(
        default=None,
        metadata={"help": "temperature (> 0) of the cross-layer term; unset means the --acl-temperature value"},
    )
    # METHOD.md's spelling; the code reads the positive AclCrossLayerCriterion.acl_grad
    no_acl_grad: bool = field(
        default=False, metadata={"help": "always keep the non-CE part (turn the ACL-Grad gating off)"}
    )


@register_criterion("acl_cross_layer", dataclass=AclCrossLayerConfig)
class AclCrossLayerCriterion(objective.AclCrossLayerTerms, AclGradCriterion):
    """The teacher's and the students' terms: :class:`acl_torch.objective.AclCrossLayerTerms`."""
