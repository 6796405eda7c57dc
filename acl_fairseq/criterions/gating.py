"""The ACL-Grad rule: drop the auxiliary (ACL) term of a batch when its gradient conflicts with CE's.

Both scopes of METHOD.md:
- ``params`` (exact): the gradients of ``ce`` and ``aux`` over every trainable parameter are taken
  with two ``autograd.grad`` calls; the update is ``g_ce`` or ``g_ce + g_aux``. The criterion returns a
  *surrogate* loss ``sum_p <p, g_p.detach()>`` whose gradient is exactly the chosen one, so fairseq's
  one ``backward`` (loss scaling, fp16/AMP, gradient accumulation, DDP's all-reduce) applies to it
  unchanged and no third pass through the encoder is made. The true loss values are logged.
- ``features`` (cheap): the gradients with respect to the exits' representations ``u`` only, found on
  the small head graph; the step then costs one ordinary backward.

Where the decision is taken: on each worker's own micro-batch (its local gradients), once per
forward. With ``--update-freq > 1`` each micro-batch decides for itself, as the paper's rule is per
mini-batch. Under DDP every rank decides on its local gradients (see README "Distributed").
"""
from typing import Dict, Tuple

import torch

from .. import losses
from ..heads import ExitOutputs


def gate(model, exits: ExitOutputs, ce: torch.Tensor, aux: torch.Tensor, scope: str, threshold: float) -> Tuple[torch.Tensor, Dict]:
    """Return ``(loss to back-propagate, logging entries)`` under the ACL-Grad rule."""
    if scope == "features":
        inputs = [u for u in exits.features if u.requires_grad]
    else:
        inputs = [p for p in model.parameters() if p.requires_grad]
    g_ce = torch.autograd.grad(ce, inputs, retain_graph=True, allow_unused=True)
    g_aux = torch.autograd.grad(aux, inputs, retain_graph=scope == "features", allow_unused=True)
    cos = losses.gradient_cosine(g_ce, g_aux)
    keep = losses.acl_grad_keep(cos, threshold)
    log = {
        "grad_cos": cos.detach(),
        "conflict": (~keep).float(),
        "gated_steps": 1,
        "true_loss": (ce + aux).detach(),
    }
    if scope == "features":
        return ce + keep.to(aux.dtype) * aux, log
    return _surrogate(inputs, g_ce, g_aux, keep), log


def _surrogate(params, g_ce, g_aux, keep: torch.Tensor) -> torch.Tensor:
    """``sum_p <p, (g_ce + keep * g_aux).detach()>``: its gradient w.r.t. ``p`` is the chosen update."""
    total = None
    for p, gc, ga in zip(params, g_ce, g_aux):
        if gc is None and ga is None:
            continue
        g = gc if ga is None else (ga * keep.to(ga.dtype) if gc is None else gc + ga * keep.to(ga.dtype))
        term = (p.float() * g.detach().float()).sum()
        total = term if total is None else total + term
    if total is None:  # nothing reached: still return a differentiable zero
        total = sum(p.sum() * 0.0 for p in params)
    return total
