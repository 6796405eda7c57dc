"""Pure tensor maths for the contrastive criteria and the multi-exit model (see docs/METHOD.md).

Every function takes tensors and plain numbers and returns tensors; nothing here knows about
fairseq. Contrastive maths runs in float32 at least: float16/bfloat16 inputs are upcast and the
result is float32; float64 inputs stay float64 (so that ``torch.autograd.gradcheck`` can be used).
Features are passed un-normalized unless a docstring says otherwise. No state is kept between calls.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

# Floor on ||v|| in norm(v): a zero vector maps to zero (no 0/0 NaN); far below any real norm.
_NORM_EPS = 1e-12

# Below this a float32 sum of squares may have flushed terms to zero: gradient sums are then redone
# on rescaled gradients (see gradient_cosine).
_SMALLEST_EXACT_SQUARE = 1e-30

_ANCHOR_MODES = ("all", "samples")
_EXIT_SCHEMES = ("layer", "uniform")


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float32, or float64 if any input is float64 (float16/bfloat16 are upcast)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _normalize(x: Tensor, dtype: torch.dtype) -> Tensor:
    """norm(x) row-wise in ``dtype``: x: (N, d) -> (N, d), exact for every finite x.

    Each nonzero row is first divided by its largest |entry| (detached: norm is scale-invariant, so
    the gradient is unchanged), so ||x||^2 cannot overflow, as it would in float32 above ~1.8e19.
    """
    x = x.to(dtype)
    amax = x.detach().abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax, torch.ones_like(amax))  # a zero row stays 0, its gradient finite
    return F.normalize(x / scale, p=2.0, dim=-1, eps=_NORM_EPS)


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _supcon_mean(
    anchors: Tensor,
    candidates: Tensor,
    anchor_labels: Tensor,
    candidate_labels: Tensor,
    temperature: float,
    exclude_diagonal: bool,
) -> Tensor:
    """``supcon_core`` followed by the mean over valid anchors, in fewer operations (the hot path).

    Same maths: per anchor ``loss_p = lse_p - sum_q w_pq s_pq`` with ``lse_p`` the log-sum-exp over
    the candidates other than itself and ``w_pq = 1/|P(p)|`` on its positives (0 elsewhere), so
    ``-(1/|P|) sum_{q in P} (s_pq - lse_p)`` becomes one weighted sum; the mean over anchors with a
    positive is ``(sum_p valid_p lse_p - sum_pq w_pq s_pq) / max(#valid, 1)``. The masks and weights
    carry no gradient and are built without autograd. An anchor without positive has ``valid_p = 0``
    and a zero weight row, so it adds an exact 0 to the loss and to every gradient (its
    log-sum-exp is finite: masked entries are ``finfo.min``, never ``-inf``).

    Args:
        anchors: (..., A, d) normalized; candidates: (..., C, d) normalized (leading dimensions
            broadcast, e.g. one set per exit); labels (A,) and (C,), shared by every leading index.
        exclude_diagonal: anchor p's own pair is candidate p (needs A <= C), as in SupCon/ACL-Embed.

    Returns:
        Tensor of the leading shape (a scalar for 2-D inputs) in the compute dtype (float32,
        float64 for float64 inputs).
    """
    _check_temperature(temperature)
    with torch.autocast(anchors.device.type, enabled=False):  # --amp would run the product in fp16
        return _supcon_mean_fp32(anchors, candidates, anchor_labels, candidate_labels, temperature, exclude_diagonal)


def _supcon_mean_fp32(anchors, candidates, anchor_labels, candidate_labels, temperature, exclude_diagonal):
    dtype = _compute_dtype(anchors, candidates)
    logits = torch.matmul(anchors.to(dtype), candidates.to(dtype).transpose(-1, -2)) / temperature  # (..., A, C)
    with torch.no_grad():
        positives = anchor_labels[:, None] == candidate_labels[None, :]  # (A, C)
        if exclude_diagonal:
            positives.diagonal().fill_(False)
        n_pos = positives.sum(dim=1, keepdim=True)  # (A, 1)
        weights = positives.to(dtype) / n_pos.clamp_min(1).to(dtype)  # (A, C), rows sum to 1 or 0
        valid = (n_pos.squeeze(1) > 0).to(dtype)  # (A,)
        n_valid = valid.sum().clamp_min(1)
    if exclude_diagonal:
        self_mask = torch.eye(logits.shape[-2], logits.shape[-1], dtype=torch.bool, device=logits.device)
        lse = torch.logsumexp(logits.masked_fill(self_mask, torch.finfo(dtype).min), dim=-1)  # (..., A)
    else:
        lse = torch.logsumexp(logits, dim=-1)
    total = torch.matmul(lse, valid) - torch.matmul(logits.flatten(-2), weights.reshape(-1))
    return total / n_valid


def _stack(tensors: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    return torch.stack([t.to(dtype) for t in tensors])


def supcon_core(
    anchors: Tensor,
    candidates: Tensor,
    anchor_labels: Tensor,
    candidate_labels: Tensor,
    temperature: float,
    self_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """SupCon core of METHOD.md, per anchor.

    Args:
        anchors: (A, d), already L2-normalized.
        candidates: (C, d), already L2-normalized.
        anchor_labels: (A,) integer labels.
        candidate_labels: (C,) integer labels.
        temperature: tau > 0.
        self_mask: optional (A, C) bool; True marks the anchor's own pair ("itself"), which is left
            out of both the softmax denominator and the positives.

    Returns:
        per_anchor_loss: (A,) float32 (float64 for float64 inputs),
            ``-(1/|P(p)|) sum_{q in P(p)} log p_pq``, exactly 0 where the anchor has no positive.
        valid: (A,) bool, ``|P(p)| > 0``.
    """
    _check_temperature(temperature)
    dtype = _compute_dtype(anchors, candidates)
    a, b = anchors.to(dtype), candidates.to(dtype)
    logits = a @ b.t() / temperature  # (A, C); O(A C d), no (A, C, d) tensor

    positives = anchor_labels[:, None] == candidate_labels[None, :]  # (A, C)
    if self_mask is not None:
        positives = positives & ~self_mask
        masked_logits = logits.masked_fill(self_mask, torch.finfo(dtype).min)
    else:
        masked_logits = logits
    # log p_pq from the *unmasked* logits, so no -inf/finfo.min value enters the positive sum below.
    log_prob = logits - torch.logsumexp(masked_logits, dim=1, keepdim=True)  # (A, C)

    n_pos = positives.sum(dim=1)  # (A,)
    valid = n_pos > 0
    pos_log_prob = torch.where(positives, log_prob, torch.zeros_like(log_prob)).sum(dim=1)
    per_anchor = -pos_log_prob / n_pos.clamp_min(1).to(dtype)
    # torch.where, not a product: what an invalid row computed never reaches the loss or its grad.
    per_anchor = torch.where(valid, per_anchor, torch.zeros_like(per_anchor))
    return per_anchor, valid


def supcon_loss(features: Tensor, labels: Tensor, temperature: float) -> Tensor:
    """SCL of Gunel et al. (2021): SupCon over norm(features) within the batch, self-pairs excluded.

    Args:
        features: (N, d), un-normalized, any float dtype.
        labels: (N,) integer labels.
        temperature: tau > 0.

    Returns:
        Scalar float32 (float64 for float64 input): mean loss over anchors with at least one
        positive; an exact 0 that still back-propagates (zero gradient) when no anchor has one.
    """
    dtype = _compute_dtype(features)
    z = _normalize(features, dtype)  # (N, d)
    return _supcon_mean(z, z, labels, labels, temperature, exclude_diagonal=True)


def acl_embed_loss(
    features: Tensor,
    labels: Tensor,
    label_embeddings: Tensor,
    temperature: float,
    anchors: str = "all",
) -> Tensor:
    """ACL-Embed: SupCon over the batch augmented with the classifier's label embeddings.

    The augmented set is A = {u_1..u_N} U {l_0..l_{K-1}} with labels y_1..y_N, 0..K-1; candidates
    are all of A except the anchor itself. Labels must lie in [0, K).

    Args:
        features: (N, d) head features u_i (input of out_proj), un-normalized.
        labels: (N,) integer labels in [0, K).
        label_embeddings: (K, d) = out_proj.weight, un-normalized (gradients flow into it).
        temperature: tau > 0.
        anchors: "all" (the N samples and the K label embeddings are anchors) or "samples" (only the
            N samples are anchors; the label embeddings stay candidates).

    Returns:
        Scalar float32 (float64 for float64 inputs): mean over anchors with a positive. A label
        embedding whose class is absent from the batch has no positive and is left out.
    """
    if anchors not in _ANCHOR_MODES:
        raise ValueError(f"anchors must be one of {_ANCHOR_MODES}, got {anchors!r}")
    dtype = _compute_dtype(features, label_embeddings)
    return _acl_embed(features.to(dtype), labels, label_embeddings.to(dtype), temperature, anchors)


def _acl_embed(features: Tensor, labels: Tensor, label_embeddings: Tensor, temperature: float, anchors: str) -> Tensor:
    """ACL-Embed over (..., N, d) features and (..., K, d) label embeddings of one dtype -> (...)."""
    n, k = features.shape[-2], label_embeddings.shape[-2]
    # one row-wise normalization of the augmented set A = {u_1..u_N} U {l_0..l_{K-1}}: (..., N+K, d)
    aug = _normalize(torch.cat([features, label_embeddings], dim=-2), features.dtype)
    class_ids = torch.arange(k, dtype=labels.dtype, device=labels.device)
    aug_labels = torch.cat([labels, class_ids])  # (N+K,)
    n_anchors = n + k if anchors == "all" else n
    # anchor p is row p of A, so its own pair is column p: the diagonal of the (A, N+K) logits
    return _supcon_mean(
        aug[..., :n_anchors, :], aug, aug_labels[:n_anchors], aug_labels, temperature, exclude_diagonal=True
    )


def acl_embed_losses(
    features: Sequence[Tensor],
    labels: Tensor,
    label_embeddings: Sequence[Tensor],
    temperature: float,
    anchors: str = "all",
) -> Tensor:
    """``acl_embed_loss`` of every exit at once: (M,) per-exit losses, as M separate calls give.

    Args:
        features: M tensors (N, d), exit m's ``u^m``; label_embeddings: M tensors (K, d), ``W_c^m``.
            Exits with different shapes are computed one by one; otherwise one batched product.
        labels, temperature, anchors: as in :func:`acl_embed_loss`.

    Returns:
        (M,) float32 (float64 for float64 inputs).
    """
    if anchors not in _ANCHOR_MODES:
        raise ValueError(f"anchors must be one of {_ANCHOR_MODES}, got {anchors!r}")
    if len(features) == 0 or len(features) != len(label_embeddings):
        raise ValueError(f"got {len(features)} feature sets for {len(label_embeddings)} label-embedding sets")
    dtype = _compute_dtype(*features, *label_embeddings)
    shapes = {tuple(t.shape) for t in features}, {tuple(t.shape) for t in label_embeddings}
    if len(features) == 1 or len(shapes[0]) > 1 or len(shapes[1]) > 1:  # nothing to batch
        return torch.stack([acl_embed_loss(u, labels, w, temperature, anchors).to(dtype)
                            for u, w in zip(features, label_embeddings)])
    return _acl_embed(_stack(features, dtype), labels, _stack(label_embeddings, dtype), temperature, anchors)


def cross_layer_acl_loss(
    student_features: Tensor,
    teacher_features: Tensor,
    labels: Tensor,
    teacher_label_embeddings: Tensor,
    temperature: float,
) -> Tensor:
    """ACL-CL for one student exit: student features against the (stop-gradient) last exit.

    Anchors are norm(u_i^m); candidates are sg(norm(u_j^M)) for all j plus sg(norm(l_k^M)).
    Positives are the same-label candidates, the teacher's view of the anchor's own example
    included; there is no self-pair to exclude (an anchor is never among the candidates). The
    teacher is detached here.

    Args:
        student_features: (N, d) u^m, un-normalized.
        teacher_features: (N, d) u^M, un-normalized.
        labels: (N,) integer labels in [0, K).
        teacher_label_embeddings: (K, d) = the last exit's out_proj.weight.
        temperature: tau > 0.

    Returns:
        Scalar float32 (float64 for float64 inputs): mean over anchors (each has at least the
        teacher's view of its own example as a positive). Gradients reach student_features only.
    """
    dtype = _compute_dtype(student_features, teacher_features, teacher_label_embeddings)
    return _cross_layer(student_features.to(dtype), teacher_features, labels, teacher_label_embeddings, temperature)


def _cross_layer(students: Tensor, teacher_features: Tensor, labels: Tensor, teacher_label_embeddings: Tensor,
                 temperature: float) -> Tensor:
    """ACL-CL of (..., N, d) students (in the compute dtype) against one teacher -> (...)."""
    dtype = students.dtype
    k = teacher_label_embeddings.shape[0]
    student = _normalize(students, dtype)  # (..., N, d)
    teacher = _normalize(
        torch.cat([teacher_features.detach().to(dtype), teacher_label_embeddings.detach().to(dtype)]), dtype
    )  # (N+K, d), no gradient
    class_ids = torch.arange(k, dtype=labels.dtype, device=labels.device)
    teacher_labels = torch.cat([labels, class_ids])  # (N+K,)
    return _supcon_mean(student, teacher, labels, teacher_labels, temperature, exclude_diagonal=False)


def cross_layer_acl_losses(
    student_features: Sequence[Tensor],
    teacher_features: Tensor,
    labels: Tensor,
    teacher_label_embeddings: Tensor,
    temperature: float,
) -> Tensor:
    """``cross_layer_acl_loss`` of every student exit at once: (M-1,) losses, as separate calls give.

    Args:
        student_features: the students' ``u^m`` (m < M), each (N, d); one batched product when they
            share a shape, one call each otherwise.
        teacher_features, labels, teacher_label_embeddings, temperature: as in
            :func:`cross_layer_acl_loss` (the teacher is detached).

    Returns:
        (M-1,) float32 (float64 for float64 inputs).
    """
    if len(student_features) == 0:
        raise ValueError("cross_layer_acl_losses needs at least one student exit")
    dtype = _compute_dtype(*student_features, teacher_features, teacher_label_embeddings)
    if len(student_features) == 1 or len({tuple(t.shape) for t in student_features}) > 1:  # nothing to batch
        return torch.stack([cross_layer_acl_loss(u, teacher_features, labels, teacher_label_embeddings,
                                                 temperature).to(dtype) for u in student_features])
    return _cross_layer(_stack(student_features, dtype), teacher_features, labels, teacher_label_embeddings,
                        temperature)


def exit_weights(layers: Sequence[int], scheme: str = "layer") -> Tensor:
    """Weights of the per-exit losses, summing to 1.

    Args:
        layers: the 1-based layer index of each exit, e.g. [1, 2, ..., 12] or a subset [2, 4].
        scheme: "layer" (w_m proportional to the layer index, PABEE) or "uniform".

    Returns:
        (M,) float32 on the CPU; move it with ``.to(loss)``.
    """
    if scheme not in _EXIT_SCHEMES:
        raise ValueError(f"scheme must be one of {_EXIT_SCHEMES}, got {scheme!r}")
    layers = list(layers)
    if not layers:
        raise ValueError("exit_weights needs at least one exit layer")
    if any(int(layer) < 1 for layer in layers):
        raise ValueError(f"exit layers are 1-based and must be >= 1, got {layers}")
    if scheme == "uniform":
        raw = torch.ones(len(layers), dtype=torch.float32)
    else:
        raw = torch.tensor([float(layer) for layer in layers], dtype=torch.float32)
    return raw / raw.sum()


def weighted_exit_sum(values: Sequence[Tensor], weights: Tensor) -> Tensor:
    """sum_m weights[m] * values[m].

    Args:
        values: M tensors of one shape (usually scalars), one per exit.
        weights: (M,), e.g. from ``exit_weights``; moved to the values' device.

    Returns:
        Tensor of the values' shape, float32 at least.
    """
    if len(values) == 0 or len(values) != weights.numel():
        raise ValueError(f"got {len(values)} values for {weights.numel()} weights")
    stacked = torch.stack(list(values))  # (M, ...)
    dtype = _compute_dtype(stacked, weights)
    w = weights.to(device=stacked.device, dtype=dtype).reshape(-1, *([1] * (stacked.dim() - 1)))
    return (w * stacked.to(dtype)).sum(dim=0)


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


def gradient_cosine(
    grads_a: Sequence[Optional[Tensor]], grads_b: Sequence[Optional[Tensor]]
) -> Tensor:
    """Cosine between two flattened gradient lists, over the entries that both losses reach.

    Args:
        grads_a, grads_b: per-parameter gradients in the same parameter order; None where a loss
            does not reach that parameter. Pairs with a None on either side are skipped.

    Returns:
        Scalar float32: sum of per-tensor dots over sqrt(sum |a|^2) sqrt(sum |b|^2), clamped to
        [-1, 1]; 0 when either norm is 0 or no pair is shared; NaN when an entry is inf or NaN.
        Exact for any finite gradients: where the plain float32 sums overflow or underflow, they are
        redone with each list divided by its largest entry.
    """
    sums = gradient_sums(grads_a, grads_b)
    if sums_need_rescaling(sums):  # rare: an overflow, a tiny or zero gradient, or inf/NaN entries
        sums = gradient_sums(grads_a, grads_b, gradient_scales(grads_a, grads_b))
    return cosine_from_sums(sums)


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


def prediction_entropy(logits: Tensor) -> Tensor:
    """Normalized entropy H(p) / log K of softmax(logits), computed from logits.

    Args:
        logits: (B, K), any float dtype; -inf entries (masked classes) are allowed.

    Returns:
        (B,) float32 (float64 for float64 input) in [0, 1]; 0 when K == 1.
    """
    dtype = _compute_dtype(logits)
    x = logits.to(dtype)
    num_classes = x.shape[-1]
    if num_classes <= 1:
        return x.new_zeros(x.shape[:-1])  # one class: H = 0 = log 1
    # clamp so that a -inf logit gives 0 * finfo.min = 0, not 0 * -inf = NaN
    log_p = F.log_softmax(x, dim=-1).clamp_min(torch.finfo(dtype).min)
    entropy = -(F.softmax(x, dim=-1) * log_p).sum(dim=-1)  # (B,)
    return entropy / math.log(num_classes)
