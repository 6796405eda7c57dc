# Licensed under the MIT license.
"""FLOPs of a (multi-exit) RoBERTa encoder per example, from its shape and the example's length; no torch.

Convention (:data:`CONVENTION`): 2 FLOPs per multiply-add of a matrix product, as
``torch.utils.flop_counter.FlopCounterMode`` counts; element-wise work (layer norms, softmax, GELU, bias
additions, pooling, the exit decision) and the embeddings (table lookups, no product) count 0. One encoder
layer over T tokens, width d, feed-forward width f:

    2 * (4 T d^2          the q, k, v and output projections
         + 2 T^2 d        attention scores and the weighted sum of values
         + 2 T d f)       the two feed-forward matrices

An exit head (``dense`` d -> d_h, ``out_proj`` d_h -> K) is ``2 (d d_h + d_h K)``. Early exit at exit m
runs the layers up to m's layer and every exit head up to m (each is evaluated to decide); the baseline runs
the layers up to the final exit and that head only (ordinary inference, ``early_exit.full_forward``).
"""

from typing import NamedTuple, Sequence

CONVENTION = ("2 FLOPs per multiply-add of a matrix product (torch.utils.flop_counter's count); embeddings excluded "
              "(lookups); norms, softmax, activations and pooling count 0; each example at its own length, with the "
              "exit heads it ran")


class Shape(NamedTuple):
    dim: int  # d, the encoder width
    ffn_dim: int  # f, the feed-forward width
    head_dim: int  # d_h, the exit head's dense output
    num_classes: int  # K
    exit_layers: Sequence[int]  # 1-based layer of each exit, increasing


def layer_flops(seq_len: int, dim: int, ffn_dim: int) -> int:
    """One encoder layer over ``seq_len`` tokens."""
    t, d = seq_len, dim
    return 2 * (4 * t * d * d + 2 * t * t * d + 2 * t * d * ffn_dim)


def head_flops(shape: Shape) -> int:
    """One exit head on a pooled vector."""
    return 2 * (shape.dim * shape.head_dim + shape.head_dim * shape.num_classes)


def exit_flops(shape: Shape, seq_len: int, exit_index: int) -> int:
    """An example of ``seq_len`` tokens leaving at exit ``exit_index`` (0-based): its layers and the heads up to it."""
    layers = shape.exit_layers[exit_index]
    return layers * layer_flops(seq_len, shape.dim, shape.ffn_dim) + (exit_index + 1) * head_flops(shape)


def static_flops(shape: Shape, seq_len: int, exit_index: int = -1) -> int:
    """The model cut at exit ``exit_index`` on one example: its layers, then that exit's head only. The final exit
    (the default) is the baseline."""
    return shape.exit_layers[exit_index] * layer_flops(seq_len, shape.dim, shape.ffn_dim) + head_flops(shape)


def full_flops(shape: Shape, seq_len: int) -> int:
    """The baseline on one example: every layer up to the final exit, then that exit's head only."""
    return static_flops(shape, seq_len)


def mean_flops(shape: Shape, seq_lens: Sequence[int], exit_indices: Sequence[int]) -> float:
    """FLOPs per example over a split: each example at its own length and exit."""
    if len(seq_lens) != len(exit_indices) or not seq_lens:
        raise ValueError(f"need one exit per example, got {len(seq_lens)} lengths and {len(exit_indices)} exits")
    return sum(exit_flops(shape, t, m) for t, m in zip(seq_lens, exit_indices)) / len(seq_lens)


def mean_full_flops(shape: Shape, seq_lens: Sequence[int], exit_index: int = -1) -> float:
    """The baseline's FLOPs per example over a split; with ``exit_index``, the model cut at that exit's."""
    return sum(static_flops(shape, t, exit_index) for t in seq_lens) / len(seq_lens)
