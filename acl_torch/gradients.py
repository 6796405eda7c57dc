"""Pure tensor maths of the ACL-Grad decision (see docs/method.md "acl_grad"): the cosine between two
gradient lists and the keep/discard rule.

Every function takes tensors and plain numbers and returns tensors; nothing here knows about fairseq
or about distributed training: the global decision passes its all-reduces in (see
:func:`gradient_cosine`). Sums run in float32 whatever the gradients' dtype. No state is kept.
"""
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

# Below this a float32 sum of squares may have flushed terms to zero: gradient sums are then redone
# on rescaled gradients (see gradient_cosine).
_SMALLEST_EXACT_SQUARE = 1e-30


def _shared_pairs(grads_a, grads_b):
    if len(grads_a) != len(grads_b):
        raise ValueError(f"gradient lists differ in length: {len(grads_a)} vs {len(grads_b)}")
    return [(a, b) for a, b in zip(grads_a, grads_b) if a is not None and b is not None]


def gradient_scales(grads_a: Sequence[Optional[Tensor]], grads_b: Sequence[Optional[Tensor]]) -> Tensor:
    """(2,) float32: the largest |entry| of each gradient list, over the pairs both lists have.

    Dividing by these before squaring keeps every square <= 1 (see :func:`gradient_sums`); inf or NaN
    entries make the scale inf or NaN, which the cosine then reports as NaN.
    """
    pairs = _shared_pairs(grads_a, grads_b)
    if not pairs:
        return torch.zeros(2, dtype=torch.float32, device=_device(grads_a, grads_b))
    device = pairs[0][0].device
    with torch.no_grad():
        inf = float("inf")
        amax = torch.stack([torch.stack([torch.linalg.vector_norm(a.detach(), inf).float().to(device),
                                         torch.linalg.vector_norm(b.detach(), inf).float().to(device)])
                            for a, b in pairs])
        return amax.amax(dim=0)


def gradient_sums(
    grads_a: Sequence[Optional[Tensor]], grads_b: Sequence[Optional[Tensor]], scales: Optional[Tensor] = None
) -> Tensor:
    """(3,) float32 ``<a', b'>, |a'|^2, |b'|^2`` of the flattened lists over the pairs both lists have,
    with ``a' = a / scales[0]``, ``b' = b / scales[1]`` (no rescaling without ``scales``).

    The sums of several workers' disjoint parts add up, if every worker uses the same scales. A loop
    over parameters, never a concatenation; the unscaled sums allocate nothing for fp32 gradients.
    """
    pairs = _shared_pairs(grads_a, grads_b)
    if not pairs:
        return torch.zeros(3, dtype=torch.float32, device=_device(grads_a, grads_b))
    device = pairs[0][0].device
    with torch.no_grad():
        inv = None
        if scales is not None:
            inv = 1.0 / scales.to(device=device, dtype=torch.float32).clamp_min(torch.finfo(torch.float32).tiny)
        parts = []  # per parameter: <a, b>, |a|^2, |b|^2 (a loop over parameters, not over the batch)
        for a, b in pairs:
            a32 = a.detach().reshape(-1).to(device=device, dtype=torch.float32)
            b32 = b.detach().reshape(-1).to(device=device, dtype=torch.float32)
            if inv is not None:
                a32, b32 = a32 * inv[0], b32 * inv[1]
            parts.append(torch.stack([torch.dot(a32, b32), torch.dot(a32, a32), torch.dot(b32, b32)]))
        return torch.stack(parts).sum(dim=0)  # one reduction, not 3 adds each


def sums_need_rescaling(sums: Tensor) -> bool:
    """Whether :func:`gradient_sums` without scales may be inexact: a sum overflowed (or an entry is
    inf/NaN), or a squared norm is so small that float32 may have lost it. One host sync."""
    return not bool(torch.isfinite(sums).all() and (sums[1:] >= _SMALLEST_EXACT_SQUARE).all())


def cosine_from_sums(sums: Tensor) -> Tensor:
    """The cosine from :func:`gradient_sums`' ``(dot, |a|^2, |b|^2)``: clamped to [-1, 1], 0 when either
    norm is 0, NaN when any sum is not finite (an overflowed or NaN gradient: never a number that
    could pass for a decision)."""
    dot, sq_a, sq_b = sums.unbind()
    denom = sq_a.sqrt() * sq_b.sqrt()  # not sqrt(sq_a * sq_b): the product may underflow
    cosine = dot / denom.clamp_min(torch.finfo(sums.dtype).tiny)
    cosine = torch.where(denom > 0, cosine.clamp(-1.0, 1.0), torch.zeros_like(cosine))
    return torch.where(torch.isfinite(sums).all(), cosine, torch.full_like(cosine, float("nan")))


def gradient_cosine_defined(
    grads_a: Sequence[Optional[Tensor]],
    grads_b: Sequence[Optional[Tensor]],
    sum_over: Optional[Callable[[Tensor], Tensor]] = None,
    max_over: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tuple[Tensor, Tensor]:
    """Cosine between two flattened gradient lists, over the entries that both losses reach, and whether it
    is defined.

    Args:
        grads_a, grads_b: per-parameter gradients in the same parameter order; None where a loss
            does not reach that parameter. Pairs with a None on either side are skipped.
        sum_over, max_over: for gradients split into disjoint parts (e.g. each worker's rows), the
            elementwise sum and max of a small tensor over the parts (an all-reduce); every part must
            call them alike. None (one part): the identity.

    Returns:
        ``(cosine, defined)``. The cosine: scalar float32, sum of per-tensor dots over sqrt(sum |a|^2)
        sqrt(sum |b|^2), clamped to [-1, 1]; 0 when either norm is 0 or no pair is shared; NaN when an
        entry is inf or NaN.
        Exact for any finite gradients: where the plain float32 sums overflow or underflow, they are
        redone with each list divided by its largest entry. ``defined``: scalar bool, False where either
        list is exactly 0 (a term that reaches nothing, or an exact 0 such as SupCon without a positive
        pair: there is no direction to compare), True otherwise (NaN included).
    """
    sum_over = sum_over or _identity
    max_over = max_over or _identity
    sums = sum_over(gradient_sums(grads_a, grads_b))
    if sums_need_rescaling(sums):  # rare: an overflow, a tiny or zero gradient, or inf/NaN entries
        scales = max_over(gradient_scales(grads_a, grads_b))  # the same scales for every part
        sums = sum_over(gradient_sums(grads_a, grads_b, scales))
    defined = ((sums[1] > 0) & (sums[2] > 0)) | ~torch.isfinite(sums).all()
    return cosine_from_sums(sums), defined


def gradient_cosine(
    grads_a: Sequence[Optional[Tensor]],
    grads_b: Sequence[Optional[Tensor]],
    sum_over: Optional[Callable[[Tensor], Tensor]] = None,
    max_over: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tensor:
    """The cosine of :func:`gradient_cosine_defined` (0 where it is not defined)."""
    return gradient_cosine_defined(grads_a, grads_b, sum_over, max_over)[0]


def _identity(x: Tensor) -> Tensor:
    return x


def _device(*lists):
    return next((g.device for grads in lists for g in grads if g is not None), None)


def acl_grad_keep(cosine: Tensor, threshold: float) -> Tensor:
    """ACL-Grad decision: keep the ACL gradient iff cosine >= threshold (discard when below).

    A NaN cosine (an inf or NaN gradient) keeps: the non-finite gradient then reaches the optimizer,
    which treats it as an overflow (fp16/AMP: skip the step, lower the loss scale), instead of being
    dropped silently. Callers without a loss scaler raise on it first (see ``criterions.gating``).

    Args:
        cosine: scalar (or any shape) cosine, e.g. from ``gradient_cosine``.
        threshold: the ``--acl-grad-threshold`` value.

    Returns:
        bool tensor of cosine's shape.
    """
    cosine = torch.as_tensor(cosine)
    return (cosine >= threshold) | torch.isnan(cosine)
