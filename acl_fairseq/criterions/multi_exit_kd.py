"""Self-distillation baseline for multi-exit models (BERxiT/FastBERT style).

Each student exit m < M matches the last exit's softened distribution, the teacher under stop-gradient:
``L = sum_m w_m CE^m + mu * mean_{m<M} T^2 KL(softmax(z^M / T) || softmax(z^m / T))``. It separates
"a teacher exit helps the shallow exits" from "the contrastive form of acl_cross_layer helps".
Classification only. Registered as ``multi_exit_kd``.
Example: ``--arch multi_exit_roberta_base --criterion multi_exit_kd --kd-weight 1.0 --kd-temperature 2``.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion

from acl_torch import objective

from .base import ExitCriterionBase, ExitCriterionConfig


@dataclass
class MultiExitKdConfig(ExitCriterionConfig):
    kd_weight: float = field(
        default=1.0, metadata={"help": "mu, the weight (>= 0) of the mean distillation term; 0 means multi-exit CE"}
    )
    kd_temperature: float = field(
        default=2.0, metadata={"help": "T (> 0), the softening temperature of teacher and students"}
    )


@register_criterion("multi_exit_kd", dataclass=MultiExitKdConfig)
class MultiExitKdCriterion(objective.MultiExitKdTerms, ExitCriterionBase):
    """The distillation term: :class:`acl_torch.objective.MultiExitKdTerms`."""
