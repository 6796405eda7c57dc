"""The criterion's options for :class:`acl_hf.trainer.AclTrainer` and ``acl-train-hf``: fairseq's flags with
underscores (``--acl-grad-scope`` is ``--acl_grad_scope``; HfArgumentParser takes the dashed spelling too), with the
plugin's defaults (docs/method.md; tests/hf/test_hf_trainer.py checks them against the fairseq criteria's configs).
The exits' weighting is the model's (``MultiExitConfig.exit_weighting``), not an option here."""
from dataclasses import dataclass, field
from typing import Optional

from acl_torch.gate import SCOPES
from acl_torch.losses import ANCHOR_MODES
from acl_torch.objective import TERMS


def _help(text: str, choices=None) -> dict:
    meta = {"help": text + " (docs/method.md)"}
    if choices is not None:
        meta["choices"] = list(choices)
    return meta


@dataclass
class CriterionArguments:
    criterion: str = field(default="sentence_ce", metadata=_help("the loss", TERMS))
    # sentence_scl
    scl_weight: float = field(default=0.9, metadata=_help("lambda in (1 - lambda) CE + lambda SCL, in [0, 1]"))
    scl_temperature: float = field(default=0.3, metadata=_help("SCL's temperature (> 0)"))
    scl_feature: str = field(default="encoder", metadata=_help("what SCL contrasts: the pooled state or u",
                                                               ("encoder", "head")))
    scl_grad: bool = field(default=False, metadata=_help("the ACL-Grad rule on the SCL term"))
    scl_grad_threshold: float = field(default=0.0, metadata=_help("scl_grad's cosine threshold, in [-1, 1]"))
    scl_grad_scope: str = field(default="params", metadata=_help("scl_grad's gradients", SCOPES))
    scl_grad_global_decision: bool = field(default=False, metadata=_help("scl_grad decides over all ranks"))
    # acl_embed, acl_grad, acl_cross_layer
    acl_weight: float = field(default=1.0, metadata=_help("lambda in CE + lambda L_ACL, >= 0"))
    acl_temperature: float = field(default=0.5, metadata=_help("ACL's temperature (> 0)"))
    acl_anchors: str = field(default="all", metadata=_help("ACL-Embed's anchors", ANCHOR_MODES))
    log_grad_conflict: bool = field(default=False, metadata=_help("log grad_cos and conflict_rate, drop nothing"))
    acl_grad_threshold: float = field(default=0.0, metadata=_help("ACL-Grad's cosine threshold, in [-1, 1]"))
    acl_grad_scope: str = field(default="params", metadata=_help("ACL-Grad's gradients", SCOPES))
    acl_grad_global_decision: bool = field(default=False, metadata=_help("ACL-Grad decides over all ranks"))
    acl_cl_weight: float = field(default=1.0, metadata=_help("mu, the cross-layer term's weight, >= 0"))
    acl_cl_temperature: Optional[float] = field(default=None, metadata=_help("the cross-layer temperature; "
                                                                            "unset: acl_temperature"))
    no_acl_grad: bool = field(default=False, metadata=_help("acl_cross_layer without the ACL-Grad gate"))
    # multi_exit_kd
    kd_weight: float = field(default=1.0, metadata=_help("mu, the distillation term's weight, >= 0"))
    kd_temperature: float = field(default=2.0, metadata=_help("T (> 0), the softening temperature"))
    # every contrastive criterion
    contrast_across_workers: bool = field(default=False, metadata=_help(
        "under DDP, contrast against every rank's rows (needs dataloader_drop_last)"))


def spell(key: str) -> str:
    """An option as acl-train-hf spells it in messages: ``--acl_weight``."""
    return "--" + key
