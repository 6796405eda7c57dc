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

from .. import losses
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
class AclCrossLayerCriterion(AclGradCriterion):
    needs_multi_exit = True
    temperatures = ("acl_temperature", "acl_cl_temperature")

    def __init__(self, cfg: AclCrossLayerConfig, task):
        super().__init__(cfg, task)
        # only None (unset) means tau: an explicit 0 was refused above like any other temperature
        self.cl_temperature = cfg.acl_temperature if cfg.acl_cl_temperature is None else cfg.acl_cl_temperature

    @property
    def acl_grad(self) -> bool:
        """Whether the ACL-Grad rule gates the non-CE part (on unless ``--no-acl-grad``)."""
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
