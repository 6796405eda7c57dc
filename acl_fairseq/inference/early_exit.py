# Licensed under the MIT license.
"""Early-exit inference that stops computing for the rows that have exited.

The encoder runs layer by layer with fairseq's own pieces (``forward_embedding``, each
``TransformerEncoderLayer`` with its padding mask, the final LayerNorm of a pre-norm encoder). After
each exit the rows that exit leave the batch: the remaining rows of ``x`` and of the padding mask are
``index_select``-ed (and padding columns nobody needs any more are cut) before the next layer. Works
at batch size 1 and batched, for ``multi_exit_roberta`` and for a stock ``roberta`` (one exit).
Inference only: call in eval mode, under ``torch.no_grad`` (done here).
"""

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

from acl_fairseq import exits
from acl_fairseq.heads import head_forward, pool_states


class EarlyExitOutput(NamedTuple):
    logits: Tensor  # (B, K) float32: logits of the exit each example left at
    exit_index: Tensor  # (B,) long: 0-based index into the model's exits
    exit_layer: Tensor  # (B,) long: 1-based encoder layer of that exit
    layers_computed: Tensor  # (B,) long: encoder layers actually run for each example
    exit_logits: Tensor  # (B, M, K) float32: every exit computed for the example, NaN after its exit


def exit_plan(model: nn.Module, head_name: str) -> Tuple[List[int], List[nn.Module], str]:
    """``(layers, heads, pooling)`` of a model's exits, in layer order.

    A stock ``roberta`` model has a single exit: ``head_name`` on the last layer's ``<s>`` state.
    """
    if head_name not in model.classification_heads:
        raise ValueError(f"model has no classification head {head_name!r} (has {sorted(model.classification_heads)})")
    if hasattr(model, "exit_head_names"):
        heads = [model.classification_heads[n] for n in model.exit_head_names(head_name)]
        return list(model.exit_layers), heads, model.exit_pooling
    num_layers = len(model.encoder.sentence_encoder.layers)
    return [num_layers], [model.classification_heads[head_name]], "cls"


def _run_layer(layer: nn.Module, x: Tensor, padding_mask: Tensor) -> Tensor:
    """One fairseq encoder layer, given the padding mask only when there is padding (as fairseq does)."""
    out = layer(x, encoder_padding_mask=padding_mask if padding_mask.any() else None)
    return out[0] if isinstance(out, tuple) else out  # return_fc layers also give the fc result


def _embed(encoder: nn.Module, src_tokens: Tensor) -> Tuple[Tensor, Tensor]:
    """Embeddings as ``TransformerEncoder.forward_scriptable`` makes them: (T x B x C, B x T mask)."""
    padding_mask = src_tokens.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(src_tokens)
    x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))  # zero the padding positions
    # B x T x C -> T x B x C
    return x.transpose(0, 1), padding_mask


@torch.no_grad()
def early_exit_forward(
    model: nn.Module,
    src_tokens: Tensor,
    head_name: str = "sentence_classification_head",
    policy: Optional[str] = None,
    threshold: float = 0.0,
    regression: bool = False,
    delta: float = exits.DEFAULT_REGRESSION_DELTA,
    exit_layer: Optional[int] = None,
) -> EarlyExitOutput:
    """Run ``model`` on ``src_tokens`` (B x T, right-padded) exiting per example under ``policy``
    (``exits.POLICIES``) with its ``threshold`` (entropy/confidence level or patience count, not range-checked
    here: the tools and the hub check what users give); ``policy=None`` runs every exit.
    ``exit_layer``: stop at that exit (one of the model's exit layers) for every example; the exits
    after it are not computed (NaN in ``exit_logits``)."""
    layers, heads, pooling = exit_plan(model, head_name)
    num_exits = len(layers)
    if exit_layer is not None:
        if exit_layer not in layers:
            raise ValueError(f"exit layer {exit_layer} is not one of the model's exits {layers}")
        layers, heads = layers[: layers.index(exit_layer) + 1], heads[: layers.index(exit_layer) + 1]
    encoder = model.encoder.sentence_encoder
    x, padding_mask = _embed(encoder, src_tokens)
    batch_size, device = src_tokens.size(0), src_tokens.device
    num_classes = heads[0].out_proj.out_features
    exit_logits = torch.full((batch_size, num_exits, num_classes), float("nan"), device=device)
    exit_index = torch.full((batch_size,), len(layers) - 1, dtype=torch.long, device=device)
    computed = torch.zeros(batch_size, dtype=torch.long, device=device)
    rows = torch.arange(batch_size, device=device)  # original row of each row still running
    state = exits.init_state(batch_size, device)
    exit_at = {layer: m for m, layer in enumerate(layers)}
    for layer_no, layer in enumerate(encoder.layers[: layers[-1]], start=1):
        x = _run_layer(layer, x, padding_mask)
        computed[rows] += 1
        m = exit_at.get(layer_no)
        if m is None:
            continue
        states = x if layer_no < len(encoder.layers) or encoder.layer_norm is None else encoder.layer_norm(x)
        # T x B x C -> B x T x C
        logits, _ = head_forward(heads[m], pool_states(states.transpose(0, 1), padding_mask, pooling))
        exit_logits[rows, m] = logits.float()
        if policy is None or m == len(layers) - 1:
            continue
        fire, state = exits.policy_step(policy, logits, state, threshold, regression=regression, delta=delta)
        exit_index[rows[fire]] = m
        keep = (~fire).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        x, padding_mask, rows, state = _keep_rows(x, padding_mask, rows, state, keep)
    final = exit_logits[torch.arange(batch_size, device=device), exit_index]
    exit_layer = torch.tensor(layers, device=device)[exit_index]
    return EarlyExitOutput(final, exit_index, exit_layer, computed, exit_logits)


def _keep_rows(x: Tensor, padding_mask: Tensor, rows: Tensor, state: Tensor, keep: Tensor):
    """Select the rows still running (x: T x B x C) and cut padding columns none of them uses."""
    x = x.index_select(1, keep)
    padding_mask = padding_mask.index_select(0, keep)
    length = int((~padding_mask).sum(1).max())  # right padding: columns >= length are all padding
    return x[:length], padding_mask[:, :length], rows.index_select(0, keep), state.index_select(0, keep)


@torch.no_grad()
def full_forward(model: nn.Module, src_tokens: Tensor, head_name: str = "sentence_classification_head") -> Tensor:
    """The baseline: all layers, then the final exit only (ordinary RoBERTa inference). (B, K)."""
    layers, heads, pooling = exit_plan(model, head_name)
    if layers[-1] == len(model.encoder.sentence_encoder.layers):
        features, _ = model.encoder.extract_features(src_tokens)  # B x T x C
    else:  # the final exit sits below the top layer (--exit-layers): stop there
        encoder = model.encoder.sentence_encoder
        x, mask = _embed(encoder, src_tokens)
        for layer in encoder.layers[: layers[-1]]:
            x = _run_layer(layer, x, mask)
        features = x.transpose(0, 1)  # T x B x C -> B x T x C
    padding_mask = src_tokens.eq(model.encoder.sentence_encoder.padding_idx)
    return head_forward(heads[-1], pool_states(features, padding_mask, pooling))[0]
