"""``--quantize int8``: int8 copies of the ONNX layer graphs that give the same answers on every x86 CPU kind.

onnxruntime runs int8 MatMuls through ``u8 x s8`` kernels on x86. Without VNNI (AVX2 only, e.g. AMD EPYC before
Zen 4) those add pairs of products in 16 bits (``vpmaddubsw``), which saturate with full-range 8-bit weights
(onnxruntime #14642). ``reduce_range`` keeps the weights in 7 bits, so the pair sum fits. Measured with
``benchmarks/int8_portability.py`` on the tiny test model, the AVX2 machine emulated by
``qemu-x86_64 -cpu EPYC-Rome`` and the host an AVX-512 VNNI Xeon: the largest logit error against fp32 was 0.03
on the host and 2.66 on AVX2 with full-range weights (static S8S8 saturated alike, 2.62), and 0.043 on both with
``reduce_range``.

The weights are quantized per output channel: with one scale per matrix, 7 bits cost the MiniLM acl_cross_layer
model of ``benchmarks/serve_speed.py`` 2.9 points of SST-2 dev accuracy at batch 32 (81.42 against fp32's 84.29);
one scale per channel gives 84.17 (full-range 8-bit weights: 83.72 per matrix, 84.86 per channel, on a VNNI host
only). The copy is quantized dynamically: each call's activations are scaled by that call's own range. **So a
row's int8 answer depends on the rows that share its batch** (logits moved by up to 0.045 between batch 1 and 8 on
the test model; decisions near a threshold can flip). Static scales remove that dependence, but calibrated on a
small training split they cost ten times the error on the test model (0.058 against 0.006), so they are not the
default until measured on a real model. Only MatMul and Gemm are quantized: LayerNorm, Softmax, GELU, the
residual Adds and the embedding graph stay in float.
"""
import logging
import os
from typing import Dict

from acl_fairseq.hf.onnx_tokenizer import ExportError

METHOD = {"kind": "dynamic", "activations": "uint8, scaled per call (batch-dependent)",
          "weights": "int8 per output channel, reduce_range (7 bits)", "ops": ["MatMul", "Gemm"]}


def quantize_int8(out_dir: str, graphs: Dict) -> Dict:
    """Write ``int8/layerN.onnx`` for every layer graph; returns the manifest's ``quantized`` entry."""
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise ExportError(f"--quantize int8 needs onnx and onnxruntime ({e}); pip install -r requirements.txt") \
            from None
    os.makedirs(os.path.join(out_dir, "int8"), exist_ok=True)
    files = {}
    for rec in graphs["layers"]:
        target, bare = f"int8/{rec['file']}", os.path.join(out_dir, "int8", "bare.onnx")
        model = onnx.load(os.path.join(out_dir, rec["file"]))
        # the exporter's intermediate shapes fail the quantizer's strict shape inference (a symbolic size
        # against a traced one); without them it infers its own
        del model.graph.value_info[:]
        onnx.save(model, bare)
        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(logging.ERROR)  # the quantizer logs every tensor it leaves alone to the root logger
        try:
            quantize_dynamic(bare, os.path.join(out_dir, target), weight_type=QuantType.QInt8,
                             op_types_to_quantize=METHOD["ops"], reduce_range=True, per_channel=True)
        finally:
            root.setLevel(level)
            os.remove(bare)
        files[rec["file"]] = target
    return {"int8": {"embeddings": graphs["embeddings"], "layers": files, "method": METHOD}}
