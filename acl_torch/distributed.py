"""Distributed helpers: a global contrastive set (``--contrast-across-workers``) and the collectives of
ACL-Grad's global decision (``--acl-grad-global-decision``).

All collectives run on the default process group (the one fairseq's data-parallel training uses when
there is no model parallelism), on the tensors' own device (CPU with gloo, GPU with NCCL). Every rank
must call them in the same order; the shared criterion forward does, for every batch (fairseq feeds a
rank that ran out of data a dummy batch, so all ranks run the same number of forwards).

Why the global set is exact (base.py multiplies the batch-mean contrastive terms by ``n_global``):
each rank computes the *full* global loss ``N * L(u_1..u_N, W)`` over every anchor, but its gradient
reaches only the rank's own rows of ``u`` (the other ranks' rows are detached copies). fairseq sums
the gradients over ranks and divides by the total sample size ``N``; the sum over ranks of
``N dL/du_r du_r/dtheta`` is ``N dL/dtheta`` through all rows, i.e. the single-process gradient on the
concatenated batch. The label embeddings ``W`` (``out_proj.weight``) are shared parameters that every
rank's global loss reaches *directly*, so their direct gradient would be counted once per rank;
they are returned with the gradient scaled by ``1 / R`` (value unchanged), R the ranks with real rows.

Replayed (dummy) batches: a rank that ran out of data runs an old batch with ``loss * 0``. Its rows
must not enter the other ranks' sets, so it contributes none (``real=False``, which the plugin's task
signals), fairseq zeroes its sample size, and R counts only the ranks with real rows: the update is
one process's on the concatenation of the real rows.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .exit_heads import ExitOutputs

# all_reduce_sum flattens tensors into float32 buffers of at most this many elements (64 MiB)
_BUCKET_NUMEL = 1 << 24


def world_size() -> int:
    """Number of workers of the default process group (1 when not distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This worker's rank in the default process group (0 when not distributed)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def scale_grad(x: Tensor, factor: float) -> Tensor:
    """``x`` with the same value, whose gradient is multiplied by ``factor``."""
    if not x.requires_grad:
        return x
    d = x.detach()
    return d + (x - d) * factor


def all_gather_sizes(n: int, device) -> List[int]:
    """Every rank's ``n`` (e.g. its batch size), in rank order."""
    mine = torch.tensor([n], dtype=torch.long, device=device)
    out = [torch.zeros_like(mine) for _ in range(world_size())]
    dist.all_gather(out, mine)
    return [int(t.item()) for t in out]


def _all_gather_rows(x: Tensor, sizes: Sequence[int]) -> List[Tensor]:
    """All ranks' ``x`` (n_r, ...) for variable n_r: pad to max(sizes), all_gather, trim. Detached."""
    n_max = max(sizes)
    buf = x.detach()
    if buf.shape[0] < n_max:
        buf = torch.cat([buf, buf.new_zeros((n_max - buf.shape[0], *buf.shape[1:]))])
    out = [torch.empty_like(buf) for _ in sizes]
    dist.all_gather(out, buf.contiguous())
    return [t[:s] for t, s in zip(out, sizes)]


def _gather_floats(local: List[Tensor], sizes: List[int], me: int, ws: int) -> List[Tensor]:
    """Every rank's rows of each tensor of ``local`` (each (B_r, D_i)), in rank order, this rank's own tensors kept.

    One all_gather for every float tensor: concatenated along dim 1 in a common (wider) dtype, so no value is
    rounded; each part is cast back to its own dtype afterwards."""
    dtype = local[0].dtype
    for t in local[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    widths = [t.shape[1] for t in local]
    packed = torch.cat([t.detach().to(dtype) for t in local], dim=1)
    per_rank = [rows.split(widths, dim=1) for rows in _all_gather_rows(packed, sizes)]
    merged = []
    for i, mine in enumerate(local):
        parts = [mine if r == me else per_rank[r][i].to(mine.dtype) for r in range(ws)]
        merged.append(torch.cat(parts))
    return merged


def gather_for_contrast(exits: ExitOutputs, targets: Tensor, real: bool = True) -> Tuple[ExitOutputs, Tensor, int]:
    """The global contrastive set: every rank's exits' ``features`` and ``pooled`` and targets.

    Args:
        exits: this rank's :class:`ExitOutputs` (M exits, B_r rows each; B_r may differ per rank).
        targets: (B_r,) this rank's labels.
        real: False while fairseq replays a dummy batch on this rank (its loss is zeroed): the rank
            then contributes no rows, so the set holds the real rows only, on every rank.

    Returns:
        ``(exits_all, targets_all, n_global)``: ``features``/``pooled`` are (N, .) with
        ``N = n_global = sum_r B_r`` over the real ranks, rows in rank order; the rows of the other
        ranks are detached copies and this rank's rows are the local tensors themselves (gradients
        flow to them only). ``label_embeddings`` have the same values, their gradient scaled by
        1 / (number of ranks with real rows), since each of those ranks' losses reaches them directly;
        ``logits`` and ``layers`` are the local ones. Three collectives (sizes, floats, targets).
    """
    ws, me = world_size(), rank()
    if ws == 1:
        return exits, targets, targets.numel()
    if not real:
        exits = ExitOutputs(
            logits=exits.logits, features=[u[:0] for u in exits.features], pooled=[c[:0] for c in exits.pooled],
            label_embeddings=exits.label_embeddings, layers=exits.layers,
        )
        targets = targets[:0]
    sizes = all_gather_sizes(targets.shape[0], targets.device)
    contributing = sum(1 for s in sizes if s > 0)
    merged = _gather_floats(list(exits.features) + list(exits.pooled), sizes, me, ws)
    m = len(exits.features)
    targets_parts = _all_gather_rows(targets, sizes)
    targets_parts[me] = targets
    out = ExitOutputs(
        logits=exits.logits,
        features=merged[:m],
        pooled=merged[m:],
        label_embeddings=[scale_grad(w, 1.0 / max(contributing, 1)) for w in exits.label_embeddings],
        layers=exits.layers,
    )
    return out, torch.cat(targets_parts), sum(sizes)


def all_reduce_max(x: Tensor) -> Tensor:
    """The elementwise maximum of ``x`` over ranks (a copy; ``x`` itself outside distributed training)."""
    if world_size() == 1:
        return x
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


def all_reduce_sum(tensors: Sequence[Optional[Tensor]]) -> List[Optional[Tensor]]:
    """The sum over ranks of each tensor, in float32, out of place (None stays None).

    The tensors are flattened into buffers of at most 2**24 elements, so a model's gradients take a
    few collectives, not one per parameter. Every rank must pass the same shapes in the same order.
    """
    out: List[Optional[Tensor]] = [None] * len(tensors)
    if world_size() == 1:
        return [None if t is None else t.detach().float().clone() for t in tensors]
    bucket: List[int] = []
    numel = 0

    def flush():
        if not bucket:
            return
        flat = torch.cat([tensors[i].detach().reshape(-1).float() for i in bucket])
        dist.all_reduce(flat)
        for i, part in zip(bucket, flat.split([tensors[i].numel() for i in bucket])):
            out[i] = part.view_as(tensors[i])
        bucket.clear()

    for i, t in enumerate(tensors):
        if t is None:
            continue
        if bucket and numel + t.numel() > _BUCKET_NUMEL:
            flush()
            numel = 0
        bucket.append(i)
        numel += t.numel()
    flush()
    return out
