"""CE + supervised contrastive loss (Gunel et al. 2021, https://arxiv.org/abs/2011.01403).

``L = (1 - lambda) * CE + lambda * SCL``, SCL = SupCon over the L2-normalised sentence
representations of the batch. Registered as ``sentence_scl``.
Example: ``--criterion sentence_scl --scl-weight 0.9 --scl-temperature 0.3``.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from .. import losses
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


@register_criterion("sentence_scl", dataclass=SentenceSclConfig)
class SentenceSclCriterion(ExitCriterionBase):
    needs_class_labels = True
    temperatures = ("scl_temperature",)

    @property
    def ce_weight(self) -> float:
        return 1.0 - self.cfg.scl_weight

    def aux_terms(self, exits, targets, weights):
        feats = exits.pooled if self.cfg.scl_feature == "encoder" else exits.features
        per_exit = [losses.supcon_loss(f, targets, self.cfg.scl_temperature) for f in feats]
        return {"scl_loss": (self.cfg.scl_weight, losses.weighted_exit_sum(per_exit, weights))}
