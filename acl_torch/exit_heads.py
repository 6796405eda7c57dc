"""What a criterion reads from a classifier with one or several exits, in one shape, and the exits' maths.

Notation follows METHOD.md: ``u^m`` is the input of exit m's ``out_proj`` (after the head's second
dropout), ``W_c^m = out_proj.weight`` holds the label embeddings, ``c^m`` is the pooled state the
head reads. Both trainers build :class:`ExitOutputs`: the fairseq plugin in ``acl_fairseq.heads`` (a
multi-exit RoBERTa or a stock ``roberta_*`` model), the Hugging Face path in ``acl_hf.modeling``.
"""
from typing import List, NamedTuple, Tuple

from torch import Tensor, nn

POOLING_MODES = ("cls", "mean")  # --exit-pooling: what pool_states can do (the model validates it once)


class ExitOutputs(NamedTuple):
    logits: List[Tensor]  # M x (B, K): each exit's classifier output
    features: List[Tensor]  # M x (B, d): u^m, the input of each exit's out_proj
    pooled: List[Tensor]  # M x (B, d): c^m, the pooled layer state each head reads
    label_embeddings: List[Tensor]  # M x (K, d): out_proj.weight of each exit
    layers: List[int]  # 1-based encoder layer behind each exit, increasing


def pool_states(states: Tensor, padding_mask: Tensor, mode: str) -> Tensor:
    """Pool one layer's token states into a sentence vector.

    states: (B, T, C); padding_mask: (B, T) bool, True at padding; mode: one of :data:`POOLING_MODES`,
    "cls" (the first token's state, fairseq's ``<s>`` and BERT's ``[CLS]``) or "mean" (mean of the
    non-padding states). Returns (B, C).
    """
    if mode == "cls":
        return states[:, 0, :]
    if mode == "mean":
        keep = (~padding_mask).unsqueeze(-1).to(states.dtype)  # B x T x 1
        return (states * keep).sum(1) / keep.sum(1).clamp_min(1.0)
    raise ValueError(f"unknown pooling mode {mode!r}; expected one of {POOLING_MODES}")


def head_forward(head: nn.Module, pooled: Tensor) -> Tuple[Tensor, Tensor]:
    """Run a classification head (``dropout``, ``dense``, ``activation_fn``, ``out_proj``, as fairseq's
    ``RobertaClassificationHead``) on an already pooled (B, C) state.

    Returns ``(logits (B, K), u (B, d))`` where ``u`` is what ``out_proj`` reads, so that the
    contrastive losses see exactly the representation the classifier sees.
    """
    x = head.dropout(pooled)
    x = head.dense(x)
    x = head.activation_fn(x)
    u = head.dropout(x)
    return head.out_proj(u), u
