"""Geometry of ACL, as numbers: how close samples sit to their own label embedding, and shallow
exits to the last one. Pure tensor functions, used for validation logging and the projector.

Cost: one (N, K) and, per exit, one (N,) cosine matrix on the head representations the criterion
already has: O(N K d + M N d) per batch, negligible next to the encoder (measured in README).
"""
from typing import Dict

import torch
import torch.nn.functional as F
from torch import Tensor


def label_alignment_sums(features: Tensor, labels: Tensor, label_embeddings: Tensor) -> Dict[str, Tensor]:
    """Summed cosines of each sample to its own and to the other label embeddings.

    features: (N, d) head representations u; labels: (N,) in [0, K); label_embeddings: (K, d).
    Returns fp32 scalars ``own`` = sum_i cos(u_i, l_{y_i}) and ``other`` = sum_i mean_{k != y_i}
    cos(u_i, l_k) (0 when K = 1); divide by N for the means. Not differentiable by design.
    """
    with torch.no_grad():
        u = F.normalize(features.detach().float(), dim=-1, eps=1e-12)
        w = F.normalize(label_embeddings.detach().float(), dim=-1, eps=1e-12)
        cos = u @ w.t()  # N x K
        own = cos.gather(1, labels.view(-1, 1)).squeeze(1)
        k = cos.size(1)
        other = (cos.sum(1) - own) / (k - 1) if k > 1 else torch.zeros_like(own)
        return {"own": own.sum(), "other": other.sum()}


def exit_agreement_sum(features: Tensor, last_features: Tensor) -> Tensor:
    """sum_i cos(u_i^m, u_i^M): how close one exit's representations are to the last exit's (fp32)."""
    with torch.no_grad():
        return F.cosine_similarity(features.detach().float(), last_features.detach().float(), dim=-1).sum()
