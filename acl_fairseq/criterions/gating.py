"""The ACL-Grad rule: drop the auxiliary (ACL) term of a batch when its gradient conflicts with CE's.

Both scopes of METHOD.md:
- ``params`` (exact): the gradients of ``ce`` and ``aux`` over every trainable parameter are taken
  with two ``autograd.grad`` calls; the update is ``g_ce`` or ``g_ce + g_aux``. The criterion returns a
  *surrogate* loss ``sum_p <p, g_p.detach()>`` whose gradient is exactly the chosen one, so fairseq's
  one ``backward`` (loss scaling, fp16/AMP, gradient accumulation, DDP's all-reduce) applies to it
  unchanged and no third pass through the encoder is made. The true loss values are logged.
- ``features`` (cheap): the gradients with respect to the exits' representations ``u`` only, found on
  the small head graph; the step then costs one ordinary backward.

Where the decision is taken:
- By default on each worker's own micro-batch, from its *local* gradients, once per forward. With
  ``--update-freq > 1`` each micro-batch decides for itself (the paper's rule is per mini-batch).
  Under DDP every rank decides on its local gradients, so ranks may disagree within one update:
  the applied update is the sum of each rank's chosen gradient.
- With ``--acl-grad-global-decision`` (``global_decision=True``) and more than one worker, the
  decision is taken on the gradients summed over the ranks: ``params`` all-reduces ``g_ce`` and
  ``g_aux`` (two gradient-sized all-reduces per step, in float32) before the cosine; ``features``
  all-reduces the three partial sums ``<g_ce, g_aux>``, ``|g_ce|^2``, ``|g_aux|^2`` over the rows of
  every rank (a 3-element all-reduce, since the feature gradients of different rows are disjoint
  coordinates of the concatenated batch). Every rank then takes the same decision. Together with
  ``--contrast-across-workers`` it equals the single-process decision on the concatenated batch;
  without it, it is the decision on the summed update of each rank's local contrastive terms. Each rank
  still back-propagates only its own (local) chosen gradient; DDP sums them as usual.
"""
from typing import Dict, Optional, Sequence, Tuple

import torch

from .. import distributed, losses
from ..heads import ExitOutputs


def gate(
    model,
    exits: ExitOutputs,
    ce: torch.Tensor,
    aux: torch.Tensor,
    scope: str,
    threshold: float,
    global_decision: bool = False,
) -> Tuple[torch.Tensor, Dict]:
    """Return ``(loss to back-propagate, logging entries)`` under the ACL-Grad rule.

    ``global_decision``: take the decision on the gradients summed over all workers (see the module
    docstring); no effect outside distributed training.
    """
    if scope == "features":
        inputs = [u for u in exits.features if u.requires_grad]
    else:
        inputs = [p for p in model.parameters() if p.requires_grad]
    g_ce = torch.autograd.grad(ce, inputs, retain_graph=True, allow_unused=True)
    g_aux = torch.autograd.grad(aux, inputs, retain_graph=scope == "features", allow_unused=True)
    if global_decision and distributed.world_size() > 1:
        cos = global_gradient_cosine(g_ce, g_aux, scope, device=ce.device)
    else:
        cos = losses.gradient_cosine(g_ce, g_aux)
    keep = losses.acl_grad_keep(cos, threshold)
    log = {
        "grad_cos": cos.detach(),
        "conflict": (~keep).float(),
        "gated_steps": 1,
    }
    if scope == "features":
        return ce + keep.to(aux.dtype) * aux, log
    return _surrogate(inputs, g_ce, g_aux, keep), log


def global_gradient_cosine(
    g_ce: Sequence[Optional[torch.Tensor]],
    g_aux: Sequence[Optional[torch.Tensor]],
    scope: str,
    device=None,
) -> torch.Tensor:
    """``losses.gradient_cosine`` of the gradients over all workers (the same value on every rank).

    ``params``: the per-parameter gradients are summed over ranks, then compared. ``features``: each
    rank holds the gradients of its own rows, so the dot product and squared norms of the
    concatenation are the sums of the per-rank ones.
    """
    if scope != "features":
        return losses.gradient_cosine(distributed.all_reduce_sum(g_ce), distributed.all_reduce_sum(g_aux))
    pairs = [(a, b) for a, b in zip(g_ce, g_aux) if a is not None and b is not None]
    sums = torch.zeros(3, dtype=torch.float32, device=device)  # <a, b>, |a|^2, |b|^2
    for a, b in pairs:
        a32, b32 = a.detach().reshape(-1).float(), b.detach().reshape(-1).float()
        sums = sums + torch.stack([torch.dot(a32, b32), torch.dot(a32, a32), torch.dot(b32, b32)])
    (sums,) = distributed.all_reduce_sum([sums])
    dot, sq_a, sq_b = sums.unbind()
    denom = sq_a.sqrt() * sq_b.sqrt()
    cosine = dot / denom.clamp_min(torch.finfo(torch.float32).tiny)
    return torch.where(denom > 0, cosine.clamp(-1.0, 1.0), torch.zeros_like(cosine))


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
