# Licensed under the MIT license.
"""Early-exit inference that stops computing for the rows that have exited.

The encoder runs layer by layer with fairseq's own pieces (``forward_embedding``, each
``TransformerEncoderLayer`` with its padding mask, the final LayerNorm of a pre-norm encoder): that is
:class:`TorchBackend`, and the loop over it is :func:`acl_runtime.loop.run_batch`, the one the ONNX
Runtime engine runs too. After each exit the rows that exit leave the batch: the remaining rows of ``x`` and of
the padding mask are ``index_select``-ed (and padding columns nobody needs any more are cut) before the next
layer. Works at batch size 1 and batched, for ``multi_exit_roberta`` and for a stock ``roberta`` (one exit).
Inference only: call in eval mode, under ``torch.no_grad`` (done here).
"""

from typing import List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from acl_runtime import exits, loop
from acl_torch.exit_heads import head_forward, pool_states


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


def _embed(encoder: nn.Module, src_tokens: Tensor, padding_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Embeddings as ``TransformerEncoder.forward_scriptable`` makes them: (T x B x C, B x T mask); the mask is
    the caller's (from lengths) when given, else fairseq's (the padding id)."""
    padding_mask = src_tokens.eq(encoder.padding_idx) if padding_mask is None else padding_mask
    x, _ = encoder.forward_embedding(src_tokens)
    x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))  # zero the padding positions
    # B x T x C -> T x B x C
    return x.transpose(0, 1), padding_mask


class TorchBackend:
    """The model cut at its layers for :func:`acl_runtime.loop.run_batch` (the loop both engines share):
    fairseq's own embedding, each ``TransformerEncoderLayer`` with its padding mask, the exit heads on the pooled
    states (after a pre-norm encoder's final LayerNorm on the top layer). States stay on the model's device."""

    def __init__(self, model: nn.Module, head_name: str = "sentence_classification_head"):
        self.exit_layers, self.heads, self.pooling = exit_plan(model, head_name)
        self.encoder = model.encoder.sentence_encoder
        self.num_classes = self.heads[0].out_proj.out_features
        self.device = next(model.parameters()).device
        self.pad = self.encoder.padding_idx
        self._exit_at = {layer: m for m, layer in enumerate(self.exit_layers)}

    @torch.no_grad()
    def embed(self, ids, mask: np.ndarray) -> Tensor:
        ids = ids if torch.is_tensor(ids) else torch.from_numpy(np.asarray(ids))
        return _embed(self.encoder, ids.to(self.device), torch.from_numpy(np.asarray(mask)).to(self.device))[0]

    @torch.no_grad()
    def layer(self, i: int, x: Tensor, mask: np.ndarray) -> Tuple[Tensor, Optional[np.ndarray]]:
        padding_mask = torch.from_numpy(np.ascontiguousarray(mask)).to(self.device)
        x = _run_layer(self.encoder.layers[i - 1], x, padding_mask)
        m = self._exit_at.get(i)
        if m is None:
            return x, None
        top = i == len(self.encoder.layers) and self.encoder.layer_norm is not None
        states = self.encoder.layer_norm(x) if top else x
        # T x B x C -> B x T x C
        logits, _ = head_forward(self.heads[m], pool_states(states.transpose(0, 1), padding_mask, self.pooling))
        return x, logits.float().cpu().numpy()

    def take(self, x: Tensor, rows: np.ndarray, length: int) -> Tensor:
        return x.index_select(1, torch.from_numpy(rows).to(x.device))[:length]

    def join(self, states: List[Tensor], width: int) -> Tensor:
        return torch.cat([torch.nn.functional.pad(x, (0, 0, 0, 0, 0, width - x.size(0))) for x in states], dim=1)


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
    backend = TorchBackend(model, head_name)
    ids = src_tokens.cpu().numpy()
    mask = loop.padding_mask(loop.right_padded_lengths(ids, backend.encoder.padding_idx), ids.shape[1])
    out = loop.run_batch(backend, src_tokens, mask, loop.ExitRequest(policy, threshold, exit_layer), regression,
                         delta)
    return EarlyExitOutput(*(torch.from_numpy(a).to(src_tokens.device) for a in out))


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
