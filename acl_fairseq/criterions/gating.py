"""The ACL-Grad rule as fairseq's criteria call it: the gate itself is :mod:`acl_torch.gate` (both trainers');
this module tells it what only fairseq knows: the model's parameters, whether fairseq runs a loss scaler, and the
update count that an error names.

The same gate serves ``acl_grad``, ``acl_cross_layer`` and ``sentence_scl --scl-grad`` (the rule on the SCL
term), and, with ``apply=False``, ``--log-grad-conflict``: both gradients are taken and the cosine logged,
but the update is always ``g_ce + g_aux``. When and where the decision is taken, both scopes, non-finite
gradients and the global decision: :mod:`acl_torch.gate`.
"""
from typing import Dict, Optional, Sequence, Tuple

import torch

from acl_torch import gate as _gate
from acl_torch.exit_heads import ExitOutputs
from acl_torch.gate import LOGGED_RATIOS, LOGGED_SUMS, SCOPES, GateConfig  # noqa: F401 (the criteria's names)

from .base import has_loss_scaler
from .meters import current_update


def _where() -> str:
    return f"update {current_update()}"


def combine(
    model, exits: ExitOutputs, ce: torch.Tensor, aux: torch.Tensor, config: GateConfig,
    features: Optional[Sequence[torch.Tensor]] = None,
) -> Tuple[torch.Tensor, Dict]:
    """A criterion's ``combine`` under the rule (:func:`acl_torch.gate.combine`), fairseq's loss scaler guessed
    from the model (:func:`has_loss_scaler`)."""
    return _gate.combine(model.parameters, exits, ce, aux, config, training=model.training,
                         loss_scaler=has_loss_scaler(model), features=features, where=_where)


def gate(model, exits: ExitOutputs, ce: torch.Tensor, aux: torch.Tensor, scope: str, threshold: float,
         global_decision: bool = False, loss_scaler: bool = False, apply: bool = True,
         features: Optional[Sequence[torch.Tensor]] = None) -> Tuple[torch.Tensor, Dict]:
    """:func:`acl_torch.gate.gate` over ``model``'s parameters, an error naming fairseq's update count."""
    return _gate.gate(model.parameters, exits, ce, aux, scope, threshold, global_decision=global_decision,
                      loss_scaler=loss_scaler, apply=apply, features=features, where=_where)
