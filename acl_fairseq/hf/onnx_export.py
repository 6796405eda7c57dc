"""``OUT/onnx``: a trained (multi-exit) model as ONNX graphs that :mod:`acl_runtime` runs without torch.

    acl-export CHECKPOINT --data DATA_BIN --output OUT --format onnx [--quantize int8] [--force]   # writes OUT/onnx

The segmentation follows the layer-by-layer engine (:mod:`acl_fairseq.inference.early_exit`), so that exited
rows never enter a later graph:

- ``embed.onnx``: token ids (B, T) -> ``x`` (T, B, C) and the padding mask (B, T), exactly as the engine's
  ``_embed`` makes them (scaled token embedding, learned positions, BERT's ``segment_delta`` through the model's
  own hook, embedding LayerNorm, padding zeroed);
- ``layerN.onnx`` for every layer up to the last exit: ``(x, padding_mask) -> x``, and for a layer with an exit
  also that exit's ``logits`` (B, K): the head on the pooled states (``cls`` or ``mean``, as trained), after a
  pre-norm encoder's final LayerNorm on the top layer. Batch and length are dynamic in every graph.

Beside them: ``tokenizer.json`` (a ``tokenizers`` file whose ids are the fairseq dictionary's, see
:mod:`acl_fairseq.hf.onnx_tokenizer`) and ``manifest.json`` (:data:`SCHEMA`: files, exits, pooling, labels, the
input layout, the serving policy, each file's sha256 and the checkpoint's, which
:mod:`acl_runtime.manifest` checks at load). ``--quantize int8`` adds ``int8/layerN.onnx``, statically
quantized (QDQ, scales calibrated on a sample of the training split) with 7-bit weights
(:mod:`acl_fairseq.hf.onnx_quantize`: a row's answer depends neither on its batch nor on the CPU kind, AVX2-only or
VNNI); ``--quantize int8-dynamic`` scales activations per call instead (batch-dependent). The embeddings stay fp32.

:func:`write_onnx` is the writer acl-export's format table calls (``write(ctx, folder)``).
"""
import logging
import os
import warnings
from typing import Dict, List, Optional

import torch
from torch import nn

from acl_fairseq.hf import onnx_quantize, onnx_tokenizer
from acl_fairseq.hf.onnx_tokenizer import ExportError
from acl_fairseq.inference import early_exit
from acl_runtime import exits, pairing, request
from acl_runtime import manifest as checks
from acl_runtime.io import atomic
from acl_torch.exit_heads import head_forward, pool_states

logger = logging.getLogger(__name__)
SCHEMA, MANIFEST = checks.SCHEMA, checks.MANIFEST  # the folder's contract: acl_runtime.manifest
QUANTIZE = tuple(onnx_quantize.SCHEMES)  # --quantize choices
OPSET = 18
MAX_DIM = 1 << 16  # upper bound of the dynamic batch and length dimensions


class _Embed(nn.Module):
    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, src_tokens):
        return early_exit._embed(self.encoder, src_tokens)  # the engine's own embedding step


class _Layer(nn.Module):
    """One encoder layer, and its exit head when it has one (``head`` None: the layer alone)."""

    def __init__(self, layer: nn.Module, head: Optional[nn.Module], pooling: str, final_norm: Optional[nn.Module]):
        super().__init__()
        self.layer, self.head, self.pooling, self.final_norm = layer, head, pooling, final_norm

    def forward(self, x, padding_mask):
        out = self.layer(x, encoder_padding_mask=padding_mask)
        x = out[0] if isinstance(out, tuple) else out
        if self.head is None:
            return x
        states = x if self.final_norm is None else self.final_norm(x)
        logits, _ = head_forward(self.head, pool_states(states.transpose(0, 1), padding_mask, self.pooling))
        return x, logits.float()


def _export(module: nn.Module, args: tuple, names: List[str], outputs: List[str], dynamic: Dict, path: str) -> None:
    with warnings.catch_warnings():  # the exporter's notes on axis names and its own deprecations, once per graph
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.onnx.export(module, args, dynamo=True, input_names=names, output_names=outputs,
                                    dynamic_shapes=dynamic, opset_version=OPSET, verbose=False)
    program.save(path)


def export_graphs(model: nn.Module, head_name: str, out_dir: str) -> Dict:
    """Write ``embed.onnx`` and one graph per layer up to the last exit; returns the manifest's graph part."""
    layers, heads, pooling = early_exit.exit_plan(model, head_name)
    encoder = model.encoder.sentence_encoder
    batch, length = torch.export.Dim("batch", min=1, max=MAX_DIM), torch.export.Dim("length", min=1, max=MAX_DIM)
    # a sample of 3 rows x 7 tokens with padding (1 or 0 would be specialised into the graph)
    pad, special = encoder.padding_idx, min(max(encoder.padding_idx, 3) + 1, encoder.embed_tokens.num_embeddings - 1)
    src = torch.full((3, 7), special, dtype=torch.long)
    src[1, 5:], src[2, 3:] = pad, pad
    src[:, 0] = 0
    with torch.no_grad():
        _export(_Embed(encoder).eval(), (src,), ["src_tokens"], ["x", "padding_mask"],
                {"src_tokens": {0: batch, 1: length}}, os.path.join(out_dir, "embed.onnx"))
        x, mask = early_exit._embed(encoder, src)
        exit_at = {layer: m for m, layer in enumerate(layers)}
        records = []
        for layer_no, layer in enumerate(encoder.layers[: layers[-1]], start=1):
            m = exit_at.get(layer_no)
            top = layer_no == len(encoder.layers) and encoder.layer_norm is not None
            wrapped = _Layer(layer, heads[m] if m is not None else None, pooling,
                             encoder.layer_norm if top and m is not None else None).eval()
            name = f"layer{layer_no}.onnx"
            _export(wrapped, (x, mask), ["x", "padding_mask"], ["x_out"] + (["logits"] if m is not None else []),
                    {"x": {0: length, 1: batch}, "padding_mask": {0: batch, 1: length}}, os.path.join(out_dir, name))
            records.append({"layer": layer_no, "file": name, "exit": m})
            x = early_exit._run_layer(layer, x, mask)
    return {"embeddings": "embed.onnx", "layers": records, "exit_layers": layers, "pooling": pooling,
            "num_layers": len(encoder.layers), "num_classes": heads[0].out_proj.out_features}


def input_layout(hub) -> Dict:
    """How the runtime builds ids from text, as the hub builds them (``MultiExitHubInterface.encode_with_info``)."""
    d = hub.task.source_dictionary
    # conventions.InputLayout's fields (the one home of the layout; the runtime rebuilds it from them)
    return {**hub.layout._asdict(), "pair_format": hub.layout.pair_format, "pad": d.pad(), "unk": d.unk(),
            "strip": True, "max_positions": hub.max_positions}


def serving_policy(hub, policy: Optional[str], threshold: Optional[float]) -> Dict:
    """The policy the runtime applies when none is given (none: the last exit decides), range-checked."""
    if policy is None:
        return {"policy": None, "threshold": None}
    resolved = request.resolve(hub.exit_layers, policy, threshold, regression=hub.regression)
    return {"policy": resolved.policy, "threshold": resolved.threshold}


def write_onnx(hub, out_dir: str, quantize: Optional[str] = None, policy: Optional[str] = None,
               threshold: Optional[float] = None, tokenizer_file: Optional[str] = None,
               calibration: Optional[Dict] = None, checkpoint: Optional[str] = None,
               calibration_texts: Optional[List[tuple]] = None) -> List[str]:
    """Write the ONNX folder of a loaded hub model (``acl_fairseq.inference.hub``) into the existing, empty
    ``out_dir``; returns the file names written. ExportError for what cannot be exported exactly. The manifest
    records every file's sha256 and the checkpoint's (``checkpoint``: its path), which the runtime checks
    (:mod:`acl_runtime.manifest`). ``calibration_texts``: what static int8 calibrates on where the hub's data folder
    has no binarized training split (an HF-trained folder's training texts)."""
    if not hub.model.classification_heads:
        raise ExportError("the checkpoint has no classification head: export a fine-tuned checkpoint")
    if quantize is not None and quantize not in QUANTIZE:
        raise ExportError(f"--quantize {quantize!r}: expected one of {', '.join(QUANTIZE)}")
    tok = onnx_tokenizer.write(hub, os.path.join(out_dir, onnx_tokenizer.FILE_NAME), tokenizer_file)
    graphs = export_graphs(hub.model, hub.head_name, out_dir)
    manifest = {"schema": SCHEMA, **graphs, "tokenizer": onnx_tokenizer.FILE_NAME, "tokenizer_kind": tok,
                "labels": None if hub.regression else hub.label_names(), "regression": hub.regression,
                "regression_scale": hub.regression_scale,
                "input_layout": input_layout(hub), **serving_policy(hub, policy, threshold),
                pairing.MANIFEST_KEY: hub.texts_per_input,  # 1 or 2 texts per input (acl_runtime.pairing)
                "calibration": calibration,  # the exit_policy.json record the serving policy came from, if any
                "policy_defaults": {name: row.default for name, row in exits.POLICIES.items()},
                "quantized": {} if quantize is None else onnx_quantize.quantize_int8(
                    out_dir, graphs, hub, quantize, rows=None if calibration_texts is None or quantize != "int8"
                    else onnx_quantize.calibration_rows(hub, texts=calibration_texts))}
    files = sorted(os.path.relpath(os.path.join(root, n), out_dir).replace(os.sep, "/")
                   for root, _, names in os.walk(out_dir) for n in names)
    manifest["sha256"] = {name: checks.file_sha256(os.path.join(out_dir, name)) for name in files}
    manifest["checkpoint_sha256"] = None if checkpoint is None else checks.file_sha256(checkpoint)
    atomic.write_json(os.path.join(out_dir, MANIFEST), manifest)
    return sorted(files + [MANIFEST])


def write(ctx, out_dir: str) -> List[str]:
    """acl-export's format writer: ``ctx.hub`` and ``ctx.args`` (``quantize``, ``policy``, ``threshold``,
    ``tokenizer``, ``calibration``: settled by acl-export's ``serving_policy``; ``weights``: an HF folder's weights
    file, whose sha256 the manifest records in place of the checkpoint's; ``calibration_texts``: its training texts)."""
    args = ctx.args
    return write_onnx(ctx.hub, out_dir, getattr(args, "quantize", None), args.policy, args.threshold,
                      getattr(args, "tokenizer", None), getattr(args, "calibration", None),
                      getattr(args, "weights", None) or getattr(args, "checkpoint", None),
                      getattr(args, "calibration_texts", None))
