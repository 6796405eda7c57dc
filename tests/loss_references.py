"""Slow, obvious references for acl_torch.losses, written from docs/METHOD.md: Python loops on plain floats,
and ``supcon_core``, the SupCon core per anchor written the obvious way (tensors, no fusion); and the inputs
they are compared on (several N, K, d, with the edge cases)."""
import math
from typing import List, Optional, Sequence, Set, Tuple

import torch


# ----------------------------------------------------------------------------------------------
# Loop references on plain Python floats, straight from METHOD.md's formulas
# ----------------------------------------------------------------------------------------------
def _ref_norm(v: Sequence[float]) -> List[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v] if n > 0 else [0.0 for _ in v]


def ref_supcon_per_anchor(
    anchors: List[List[float]],
    candidates: List[List[float]],
    a_labels: List[int],
    c_labels: List[int],
    tau: float,
    self_pairs: Set[Tuple[int, int]],
) -> List[Optional[float]]:
    """loss_p for each anchor, None where P(p) is empty."""
    out: List[Optional[float]] = []
    for p, a in enumerate(anchors):
        s = [sum(x * y for x, y in zip(a, b)) / tau for b in candidates]
        others = [q for q in range(len(candidates)) if (p, q) not in self_pairs]
        log_den = math.log(sum(math.exp(s[r]) for r in others)) if others else 0.0
        pos = [q for q in others if c_labels[q] == a_labels[p]]
        out.append(-sum(s[q] - log_den for q in pos) / len(pos) if pos else None)
    return out


def _ref_mean(per_anchor: List[Optional[float]]) -> float:
    valid = [x for x in per_anchor if x is not None]
    return sum(valid) / len(valid) if valid else 0.0


def _rows(x: torch.Tensor) -> List[List[float]]:
    return [_ref_norm(r) for r in x.double().tolist()]


def supcon_core(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    anchor_labels: torch.Tensor,
    candidate_labels: torch.Tensor,
    temperature: float,
    self_mask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """METHOD.md's SupCon core per anchor, written the obvious way (the reference of the fused
    ``losses._supcon_mean``).

    anchors (A, d) and candidates (C, d) already L2-normalized; labels (A,), (C,); ``self_mask``
    (A, C) bool marks the anchor's own pair, left out of the denominator and of the positives.
    Returns ``(per_anchor (A,), valid (A,) bool)``: ``-(1/|P(p)|) sum_{q in P(p)} log p_pq`` in
    float32 (float64 for float64 inputs), exactly 0 where the anchor has no positive.
    """
    dtype = torch.promote_types(torch.promote_types(anchors.dtype, candidates.dtype), torch.float32)
    logits = anchors.to(dtype) @ candidates.to(dtype).t() / temperature  # (A, C)
    positives = anchor_labels[:, None] == candidate_labels[None, :]  # (A, C)
    masked_logits = logits
    if self_mask is not None:
        positives = positives & ~self_mask
        masked_logits = logits.masked_fill(self_mask, torch.finfo(dtype).min)
    # log p_pq from the *unmasked* logits, so no finfo.min value enters the positive sum below
    log_prob = logits - torch.logsumexp(masked_logits, dim=1, keepdim=True)  # (A, C)
    n_pos = positives.sum(dim=1)  # (A,)
    valid = n_pos > 0
    pos_log_prob = torch.where(positives, log_prob, torch.zeros_like(log_prob)).sum(dim=1)
    per_anchor = -pos_log_prob / n_pos.clamp_min(1).to(dtype)
    return torch.where(valid, per_anchor, torch.zeros_like(per_anchor)), valid


def ref_supcon_loss(features, labels, tau) -> float:
    z, y = _rows(features), labels.tolist()
    self_pairs = {(i, i) for i in range(len(z))}
    return _ref_mean(ref_supcon_per_anchor(z, z, y, y, tau, self_pairs))


def ref_acl_embed_loss(features, labels, label_emb, tau, anchors="all") -> float:
    aug = _rows(features) + _rows(label_emb)
    aug_y = labels.tolist() + list(range(label_emb.shape[0]))
    n_anchors = len(aug) if anchors == "all" else features.shape[0]
    self_pairs = {(i, i) for i in range(n_anchors)}
    per = ref_supcon_per_anchor(aug[:n_anchors], aug, aug_y[:n_anchors], aug_y, tau, self_pairs)
    return _ref_mean(per)


def ref_cross_layer_loss(student, teacher, labels, teacher_emb, tau) -> float:
    cands = _rows(teacher) + _rows(teacher_emb)
    c_y = labels.tolist() + list(range(teacher_emb.shape[0]))
    per = ref_supcon_per_anchor(_rows(student), cands, labels.tolist(), c_y, tau, set())
    return _ref_mean(per)


# ----------------------------------------------------------------------------------------------
# Inputs: several N, K, d, with the edge cases of the brief
# ----------------------------------------------------------------------------------------------
CASES = {
    "n1": (1, 2, 3, [1]),
    "one_class": (5, 1, 4, [0, 0, 0, 0, 0]),
    "singleton_class": (6, 3, 5, [0, 0, 1, 1, 1, 2]),
    "absent_class": (5, 4, 6, [0, 1, 1, 0, 1]),
    "all_distinct_labels": (4, 4, 3, [0, 1, 2, 3]),
    "duplicate_features": (6, 2, 4, [0, 1, 0, 1, 0, 1]),
    "random_wide": (13, 4, 7, None),
}


def make_case(name: str, dtype: torch.dtype, seed: int = 0):
    n, k, d, labels = CASES[name]
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, d, generator=g, dtype=torch.float64)
    if name == "duplicate_features":
        feats[3:] = feats[:3]  # rows 0/3 (same label) and 1/4 are exact duplicates
    if labels is None:
        labels = torch.randint(0, k, (n,), generator=g).tolist()
    label_emb = torch.randn(k, d, generator=g, dtype=torch.float64)
    teacher = torch.randn(n, d, generator=g, dtype=torch.float64)
    return (feats.to(dtype), torch.tensor(labels), label_emb.to(dtype), teacher.to(dtype))


def as_float(x: torch.Tensor) -> float:
    return float(x.detach().double())


TEMPERATURES = [0.1, 0.5]
