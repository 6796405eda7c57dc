"""CE + supervised contrastive loss (Gunel et al. 2021, https://arxiv.org/abs/2011.01403).

``L = (1 - lambda) * CE + lambda * SCL``, SCL = SupCon over the L2-normalised sentence
representations of the batch. ``--scl-grad`` drops the SCL term of a batch whose gradient conflicts
with CE's (the ACL-Grad rule, METHOD.md); ``--log-grad-conflict`` only measures. Registered as
``sentence_scl``. Example: ``--criterion sentence_scl --scl-weight 0.9 --scl-temperature 0.3``.
"""
from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from .. import losses
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
class SentenceSclCriterion(ExitCriterionBase):
    needs_class_labels = True
    contrasts = True
    temperatures = ("scl_temperature",)
    logged_ratios = gating.LOGGED_RATIOS
    logged_sums = gating.LOGGED_SUMS

    @property
    def ce_weight(self) -> float:
        return 1.0 - self.cfg.scl_weight

    def contrasted(self, exits):
        """The representations SCL contrasts, per exit."""
        return exits.pooled if self.cfg.scl_feature == "encoder" else exits.features

    def combine(self, model, exits, ce, aux):
        cfg = self.cfg
        if not (cfg.scl_grad or cfg.log_grad_conflict):
            return super().combine(model, exits, ce, aux)
        config = gating.GateConfig(cfg.scl_grad_scope, cfg.scl_grad_threshold, cfg.scl_grad_global_decision,
                                   apply=cfg.scl_grad)
        return gating.combine(model, exits, ce, aux, config, features=self.contrasted(exits))

    def aux_terms(self, exits, targets, weights):
        feats = self.contrasted(exits)
        per_exit = [losses.supcon_loss(f, targets, self.cfg.scl_temperature) for f in feats]
        return {"scl_loss": (self.cfg.scl_weight, losses.weighted_exit_sum(per_exit, weights))}
