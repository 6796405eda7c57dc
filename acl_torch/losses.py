"""Pure tensor maths for the contrastive criteria and the multi-exit model (see docs/method.md).

Every function takes tensors and plain numbers and returns tensors; nothing here knows about
fairseq. Contrastive maths runs in float32 at least: float16/bfloat16 inputs are upcast and the
result is float32; float64 inputs stay float64 (so that ``torch.autograd.gradcheck`` can be used).
Features are passed un-normalized unless a docstring says otherwise. No state is kept between calls.
ACL-Grad's gradient cosine is in :mod:`acl_torch.gradients`, the early-exit entropy in :mod:`acl_runtime.exits`.
"""
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

# Floor on ||v|| in norm(v): a zero vector maps to zero (no 0/0 NaN); far below any real norm.
_NORM_EPS = 1e-12

# The allowed values of string options, defined here once. The criteria's ChoiceEnums are built from
# them, so fairseq checks a value when it parses the flag and again when it builds the criterion
# from its config; here only the public functions check, once at entry, for direct callers.
ANCHOR_MODES = ("all", "samples")  # --acl-anchors: which members of ACL-Embed's augmented set are anchors
EXIT_WEIGHTINGS = ("layer", "uniform")  # --exit-weighting: exit_weights' schemes


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


def check_temperature(temperature: float, name: str = "temperature") -> None:
    """Raise ValueError unless ``temperature > 0`` (``name``: the option, e.g. "--acl-temperature")."""
    if not temperature > 0:
        raise ValueError(f"{name} must be > 0, got {temperature}")


def _check_choice(value: str, choices: Sequence[str], name: str) -> None:
    """Raise ValueError unless ``value`` is one of ``choices`` (e.g. :data:`ANCHOR_MODES`)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def _supcon_mean(
    anchors: Tensor,
    candidates: Tensor,
    anchor_labels: Tensor,
    candidate_labels: Tensor,
    temperature: float,
    exclude_diagonal: bool,
) -> Tensor:
    """METHOD.md's SupCon core and the mean over valid anchors, in few operations (the hot path; its
    slow, obvious per-anchor reference is ``supcon_core`` in tests/loss_references.py).

    Per anchor ``loss_p = lse_p - sum_q w_pq s_pq`` with ``lse_p`` the log-sum-exp over
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
        float64 for float64 inputs). No argument checks: the public functions make them.
    """
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
    check_temperature(temperature)
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
    _check_choice(anchors, ANCHOR_MODES, "anchors")
    check_temperature(temperature)
    return _acl_embed(features, labels, label_embeddings, temperature, anchors)


def _acl_embed(features: Tensor, labels: Tensor, label_embeddings: Tensor, temperature: float, anchors: str) -> Tensor:
    """ACL-Embed over (..., N, d) features and (..., K, d) label embeddings -> (...), in their compute dtype."""
    dtype = _compute_dtype(features, label_embeddings)
    features, label_embeddings = features.to(dtype), label_embeddings.to(dtype)
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
    _check_choice(anchors, ANCHOR_MODES, "anchors")
    check_temperature(temperature)
    if len(features) == 0 or len(features) != len(label_embeddings):
        raise ValueError(f"got {len(features)} feature sets for {len(label_embeddings)} label-embedding sets")
    dtype = _compute_dtype(*features, *label_embeddings)
    shapes = {tuple(t.shape) for t in features}, {tuple(t.shape) for t in label_embeddings}
    if len(features) == 1 or len(shapes[0]) > 1 or len(shapes[1]) > 1:  # nothing to batch
        return torch.stack([_acl_embed(u, labels, w, temperature, anchors).to(dtype)
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
    check_temperature(temperature)
    return _cross_layer(student_features, teacher_features, labels, teacher_label_embeddings, temperature)


def _cross_layer(students: Tensor, teacher_features: Tensor, labels: Tensor, teacher_label_embeddings: Tensor,
                 temperature: float) -> Tensor:
    """ACL-CL of (..., N, d) students against one teacher -> (...), in their compute dtype."""
    dtype = _compute_dtype(students, teacher_features, teacher_label_embeddings)
    students = students.to(dtype)
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
    check_temperature(temperature)
    dtype = _compute_dtype(*student_features, teacher_features, teacher_label_embeddings)
    if len(student_features) == 1 or len({tuple(t.shape) for t in student_features}) > 1:  # nothing to batch
        return torch.stack([_cross_layer(u, teacher_features, labels, teacher_label_embeddings, temperature).to(dtype)
                            for u in student_features])
    return _cross_layer(_stack(student_features, dtype), teacher_features, labels, teacher_label_embeddings,
                        temperature)


def self_distillation_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """Self-distillation of one student exit from the (stop-gradient) last exit (BERxiT/FastBERT).

    ``T^2 * KL(softmax(z^M / T) || softmax(z^m / T))``, averaged over the batch; ``T^2`` keeps the
    gradient's scale independent of T (Hinton et al.).

    Args:
        student_logits: (N, K) z^m.
        teacher_logits: (N, K) z^M; detached here.
        temperature: T > 0.

    Returns:
        Scalar float32 (float64 for float64 inputs), >= 0; gradients reach student_logits only.
    """
    check_temperature(temperature)
    dtype = _compute_dtype(student_logits, teacher_logits)
    log_q = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_p = F.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
    # kl_div's log_target form: p * (log p - log q) without exp-then-log of tiny probabilities
    kl = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(dim=-1)  # (N,)
    return kl.mean() * temperature ** 2


def exit_weights(layers: Sequence[int], scheme: str = "layer") -> Tensor:
    """Weights of the per-exit losses, summing to 1.

    Args:
        layers: the 1-based layer index of each exit, e.g. [1, 2, ..., 12] or a subset [2, 4].
        scheme: "layer" (w_m proportional to the layer index, PABEE) or "uniform".

    Returns:
        (M,) float32 on the CPU; move it with ``.to(loss)``.
    """
    _check_choice(scheme, EXIT_WEIGHTINGS, "scheme")
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
