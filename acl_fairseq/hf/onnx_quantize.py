"""``--quantize int8``: int8 copies of the ONNX layer graphs whose answers depend neither on the batch nor on the
x86 CPU kind.

- **Static QDQ** (``int8``, the default): every quantized tensor has a scale fixed at export, calibrated on a
  seeded sample of the training split (:data:`CALIBRATION_ROWS` rows, each run alone, so padding never widens a
  range). A row's answer is then the same whichever rows share its batch. MatMul and Gemm are quantized (inputs
  only: their outputs, the bias and residual Adds, LayerNorm, Softmax, GELU, the exit heads and the embedding
  graph stay in float, as Optimum's and onnxruntime's guidance leave them). The float GELU and fc1's bias are then
  one onnxruntime ``BiasGelu`` op (:func:`fuse_gelu`): the same outputs, 2 to 5% faster at batch 32.
- **Dynamic** (``int8-dynamic``): activations scaled by each call's own range, so **a row's answer depends on the
  rows that share its batch**. Kept for data without a training split.

Both keep the weights in 7 bits (``reduce_range``), one scale per output channel. onnxruntime's x86 int8 kernels
without VNNI (AVX2 only, e.g. AMD EPYC before Zen 4) add pairs of ``u8 x s8`` products in 16 bits
(``vpmaddubsw``), which saturate with full-range weights (onnxruntime #14642); signed activations (S8S8) do not
help, since the kernels shift them to unsigned first. With 7-bit weights the pair sum fits.

Measured with ``python benchmarks/int8_static.py --avx2-rows 12 --repeats 0 --json
benchmarks/results/int8_static.json`` on the MiniLM acl_cross_layer model of ``benchmarks/serve_speed.py``, SST-2
dev (872 sentences, the runtime's early-exit loop; the last exit, entropy 0.3, and the calibrated entropy 0.8):

- static: labels and exit layers identical at batch 1 and 32 for all 872 rows and all three policies (last-exit
  logits within 7.2e-7); accuracy 84.17 against fp32's 84.29 (83.83 against 83.94 with the calibrated policy) at
  batch 1, 8 and 32 alike. Dynamic: 11 labels differ between batch 1 and 32 at the last exit, 68 and 73 labels or
  exit layers with the two policies, logits up to 0.56 apart; its accuracy moves with the batch (-0.11 to +0.46).
- per channel: one weight scale per matrix costs 2.87 points (static, MinMax).
- MinMax, Percentile and Entropy calibration: -0.11, +0.34 and -0.46 points against fp32, 9, 11 and 8 last-exit
  labels different from fp32's; 128, 512 and all 2000 training rows: 0.00, -0.11, +0.23 points. Within the noise
  of 872 sentences (one sentence is 0.11 points), so MinMax on 512 rows: onnxruntime's default method, no
  histogram to keep, and a quarter of this split (a few seconds of fp32 and calibration passes per layer).
- AVX2 (``qemu-x86_64 -cpu EPYC-Rome``, 12 sentences through every exit): the same logits as on the AVX-512 VNNI
  host for every 7-bit scheme (U8S8 or S8S8, static or dynamic); with full 8-bit weights they move by 0.20 (U8S8,
  one label changed) and 0.22 (S8S8). S8S8 with 7-bit weights decides as U8S8 does, so U8S8 stays.
- speed at batch 32 (``--schemes "static u8/s8 7-bit per-channel MinMax (int8)" dynamic --avx2-rows 0 --repeats
  5``, load average 6.4 on 2 shared cores): 1.72x the torch engine with all layers (the dynamic copy: 1.72x in
  the same rounds), 1.68x with entropy 0.3 (dynamic 1.80x); serve_speed.py on a fresh export, load 4.0: 1.62x,
  where the dynamic copy measured 1.93x (load 3.5). The target, 1.8x, is missed: static is slower at batch 32.
"""
import logging
import os
import tempfile
from typing import Dict, List, Optional

import numpy as np

from acl_fairseq.hf.onnx_tokenizer import ExportError

CALIBRATION_SPLIT = "train"
# each row costs one fp32 pass and one calibration pass per layer
CALIBRATION_ROWS = 512
CALIBRATION_SEED = 0
FLOAT_OPS = ["LayerNormalization", "Softmax", "BiasGelu (GELU and fc1's bias)", "the residual and bias Adds",
             "the exit heads", "the embedding graph"]
# contrib ops (onnxruntime's com.microsoft domain, in every CPU build) that the int8 copy is rewritten to after
# quantization: float ops whose chains onnxruntime's own session optimizer leaves apart
FUSED = ["BiasGelu"]
SCHEMES = {  # --quantize name -> how its copy is made
    "int8": {"kind": "static", "format": "QDQ", "activations": "QUInt8", "weights": "QInt8", "reduce_range": True,
             "per_channel": True, "calibrate": "MinMax", "batch_dependent": False},
    "int8-dynamic": {"kind": "dynamic", "activations": "QUInt8 (scaled per call)", "weights": "QInt8",
                     "reduce_range": True, "per_channel": True, "batch_dependent": True},
}
OPS = ["MatMul", "Gemm"]


def _imports():
    try:
        import onnx
        import onnxruntime
        from onnxruntime import quantization
    except ImportError as e:
        raise ExportError(f"--quantize int8 needs onnx and onnxruntime ({e}); pip install -r requirements.txt") \
            from None
    return onnx, onnxruntime, quantization


def calibration_rows(hub, n: int = CALIBRATION_ROWS, seed: int = CALIBRATION_SEED,
                     texts: Optional[List[tuple]] = None) -> List[np.ndarray]:
    """``n`` rows of the hub's training split (a seeded sample without replacement), as the model reads them: the
    task's own ``src_tokens`` (``<s>``, segments, pairs), unpadded. ExportError when the split is missing. ``texts``
    (an HF-trained folder's training split, read from its GLUE folder): the sample is drawn from them, each encoded
    as the hub encodes an input."""
    if texts is not None:
        return [hub.encode(*texts[i]).numpy().astype(np.int64) for i in _sample(len(texts), n, seed)]
    data = hub.cfg.task.data
    if not os.path.isfile(os.path.join(data, "input0", f"{CALIBRATION_SPLIT}.bin")):
        raise ExportError(f"--quantize int8 calibrates on the training split, and "
                          f"{os.path.join(data, 'input0', CALIBRATION_SPLIT + '.bin')} is missing: pass the --data "
                          "folder the model was trained on, or --quantize int8-dynamic (batch-dependent)")
    hub.task.load_dataset(CALIBRATION_SPLIT)
    split = hub.task.dataset(CALIBRATION_SPLIT)
    return [split[i]["net_input.src_tokens"].numpy().astype(np.int64) for i in _sample(len(split), n, seed)]


def _sample(total: int, n: int, seed: int) -> List[int]:
    """``min(n, total)`` indices of ``range(total)``, drawn with ``seed`` without replacement, in order."""
    return [int(i) for i in sorted(np.random.default_rng(seed).choice(total, size=min(n, total), replace=False))]


def _session(path: str):
    _, ort, _ = _imports()
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def layer_feeds(folder: str, graphs: Dict, rows: List[np.ndarray]) -> Dict[str, List[Dict]]:
    """Each layer graph's fp32 inputs for ``rows``: layer file -> one feed per row (batch 1, no padding)."""
    embed = _session(os.path.join(folder, graphs["embeddings"]))
    layers = [(rec["file"], _session(os.path.join(folder, rec["file"]))) for rec in graphs["layers"]]
    feeds = {name: [] for name, _ in layers}
    for row in rows:
        x, mask = embed.run(None, {"src_tokens": row[None, :]})
        for name, session in layers:
            feeds[name].append({"x": x, "padding_mask": mask})
            x = session.run(None, {"x": x, "padding_mask": mask})[0]
    return feeds


def _head_nodes(model) -> List[str]:
    """The exit head's MatMul/Gemm nodes (weights named ``head.*``): one pooled row per sentence, so float costs
    nothing there, and they make the decision."""
    weights = {t.name for t in model.graph.initializer if t.name.startswith("head.")}
    return [n.name for n in model.graph.node if n.op_type in OPS and any(i in weights for i in n.input)]


def quantize_graph(src: str, dst: str, scheme: Dict, feeds: Optional[List[Dict]] = None, fuse: bool = True) -> None:
    """One layer graph ``src`` -> ``dst`` by ``scheme`` (a :data:`SCHEMES` value; static ones read ``feeds``);
    ``fuse``: the float GELU chain as one :data:`FUSED` op (:func:`fuse_gelu`), as shipped."""
    onnx, _, q = _imports()
    model = onnx.load(src)
    # the exporter's intermediate shapes fail the quantizer's strict shape inference (a symbolic size against a
    # traced one); without them it infers its own
    del model.graph.value_info[:]
    common = {"op_types_to_quantize": OPS, "per_channel": scheme["per_channel"],
              "reduce_range": scheme["reduce_range"], "weight_type": getattr(q.QuantType, scheme["weights"]),
              "nodes_to_exclude": _head_nodes(model)}
    with tempfile.TemporaryDirectory(prefix="quantize_", dir=os.path.dirname(dst)) as tmp:
        bare = os.path.join(tmp, "bare.onnx")
        onnx.save(model, bare)
        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(logging.ERROR)  # the quantizer logs every tensor it leaves alone to the root logger
        try:
            if scheme["kind"] == "dynamic":
                q.quantize_dynamic(bare, dst, **common)
                quantized = onnx.load(dst)
            else:
                q.quantize_static(bare, dst, _Rows(q.CalibrationDataReader, feeds), quant_format=q.QuantFormat.QDQ,
                                  activation_type=getattr(q.QuantType, scheme["activations"]),
                                  calibrate_method=getattr(q.CalibrationMethod, scheme["calibrate"]),
                                  # outputs stay float: the bias and residual Adds that read them are float ops.
                                  # One row per collection: the histogram calibrators stack a call's tensors,
                                  # which rows of different lengths cannot be
                                  extra_options={"OpTypesToExcludeOutputQuantization": OPS,
                                                 "CalibStridedMinMax": 1}, **common)
                quantized = onnx.load(dst)
                _float_ops_read_float(quantized)
            if fuse:
                fuse_gelu(quantized)
            onnx.save(quantized, dst)
        finally:
            root.setLevel(level)


def fuse_gelu(model) -> None:
    """The exact (erf) GELU and the bias Add before it (Add, Div, Erf, Add, Mul, Mul) as one ``BiasGelu`` (a
    ``Gelu`` where the MatMul holds the bias, as dynamic int8's does), in place, by onnxruntime's own transformer
    fusions. onnxruntime's session optimizer fuses neither this GELU form nor its bias, and in the int8 copy each of
    the six float ops reads and writes the whole FFN activation (B x T x 1536 for MiniLM) between two integer
    MatMuls: one op makes a static MiniLM layer 2 to 5% faster at batch 32, with the same outputs
    (``benchmarks/ort_fusions.py``, docs/serve.md). A graph without the pattern is left as it is."""
    import onnx
    from onnxruntime.transformers.fusion_biasgelu import FusionBiasGelu
    from onnxruntime.transformers.fusion_gelu import FusionGelu
    from onnxruntime.transformers.onnx_model import OnnxModel

    wrapped = OnnxModel(model)
    FusionGelu(wrapped).apply()
    FusionBiasGelu(wrapped, is_fastgelu=False).apply()
    wrapped.prune_graph(allow_remove_graph_inputs=False)
    wrapped.topological_sort()
    if any(n.domain == "com.microsoft" for n in model.graph.node) and \
            not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def _Rows(base, feeds: List[Dict]):
    """A calibration reader over ``feeds`` that the quantizer can also cut into ranges (``set_range``)."""

    class Rows(base):
        def __init__(self):
            self.items, self.at, self.end = feeds, 0, len(feeds)

        def __len__(self):
            return len(self.items)

        def set_range(self, start_index: int, end_index: int):
            self.at, self.end = start_index, min(end_index, len(self.items))

        def get_next(self):
            if self.at >= self.end:
                return None
            self.at += 1
            return self.items[self.at - 1]

    return Rows()


def _float_ops_read_float(model) -> None:
    """The quantizer hands a quantized tensor's every reader its dequantized copy, so the residual Add beside the
    projections that read ``x`` would add the rounded ``x``. Every reader but MatMul and Gemm is given the float
    tensor back: only those two compute in int8."""
    graph = model.graph
    source = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    floats = {n.output[0]: source[n.input[0]] for n in graph.node
              if n.op_type == "DequantizeLinear" and n.input[0] in source}
    for node in graph.node:
        if node.op_type not in OPS and node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            for k, name in enumerate(node.input):
                if name in floats:
                    node.input[k] = floats[name]


def quantize_int8(out_dir: str, graphs: Dict, hub=None, name: str = "int8", scheme: Optional[Dict] = None,
                  rows: Optional[List[np.ndarray]] = None) -> Dict:
    """Write ``int8/layerN.onnx`` for every layer graph in ``out_dir`` by ``SCHEMES[name]`` (or ``scheme``); a
    static scheme calibrates on ``rows``, by default :func:`calibration_rows` of ``hub``. Returns the manifest's
    ``quantized`` entry (served as ``--precision int8`` whichever scheme made it; ``method`` says which)."""
    scheme = dict(SCHEMES[name] if scheme is None else scheme)
    method = {**scheme, "ops": OPS, "float": FLOAT_OPS, "fused": FUSED}
    feeds = {}
    if scheme["kind"] == "static":
        if rows is None:
            rows = calibration_rows(hub)
        method["calibration"] = {"split": CALIBRATION_SPLIT, "rows": len(rows), "seed": CALIBRATION_SEED,
                                 "batch": 1}
        feeds = layer_feeds(out_dir, graphs, rows)
    os.makedirs(os.path.join(out_dir, "int8"), exist_ok=True)
    files = {}
    for rec in graphs["layers"]:
        target = f"int8/{rec['file']}"
        quantize_graph(os.path.join(out_dir, rec["file"]), os.path.join(out_dir, target), scheme,
                       feeds.get(rec["file"]))
        files[rec["file"]] = target
    return {"int8": {"embeddings": graphs["embeddings"], "layers": files, "method": method}}
