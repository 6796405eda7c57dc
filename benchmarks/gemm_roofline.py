#!/usr/bin/env python3
"""Why ONNX Runtime fp32 is not 1.2x torch at batch 32: one served layer (the plugin's fairseq layer at MiniLM's
shape, exported by the project's own layer exporter) in both engines, beside its matrix products alone and a bare
sgemm, on one thread.

    python benchmarks/gemm_roofline.py [--batch 32] [--seq-len 26] [--repeats 9] [--json PATH]

Systems: (layer, its products alone, a bare sgemm) x (torch, onnxruntime), in rotated rounds. Measure: process CPU
time, GFLOP/s against the bare sgemm and the CPU's peak, the products' share of the layer, and the bound on
onnxruntime's layer against torch's. No targets: it explains serve_speed.py's 1.2x miss (docs/serve.md); the
protocol: docs/benchmarks.md.
"""
import os
import tempfile
from typing import Dict, List

import numpy as np
import torch

import _int8_chain as chain
import common
import harness
from acl_fairseq.inference import flops
from acl_torch import acceleration
from acl_torch.machine import read_cpu_kind


def fairseq_layer(tmp: str):
    """One encoder layer of the plugin's multi_exit_roberta at MiniLM-L6's shape (random weights), eval mode."""
    size = common.MODEL_SIZES["minilm"]
    data = common.make_dict_dir(tmp, size["vocab"], 2)
    argv = common.train_argv(data, "sentence_ce", "multi_exit_roberta", "minilm", 64, 2, 8, "cpu")
    torch.manual_seed(0)
    _, _, model, _ = common.build(argv)
    return model.encoder.sentence_encoder.layers[0].eval(), size


def ort_session(path: str):
    """A one-thread session as the engine opens one (level all, its disabled fusions)."""
    from acl_runtime.engine import DISABLED_OPTIMIZERS

    return chain.session(path, disabled=DISABLED_OPTIMIZERS)


def export_layer(layer, x, mask, path: str) -> None:
    from acl_fairseq.hf import onnx_export

    batch = torch.export.Dim("batch", min=1, max=onnx_export.MAX_DIM)
    length = torch.export.Dim("length", min=1, max=onnx_export.MAX_DIM)
    with torch.no_grad():
        onnx_export._export(onnx_export._Layer(layer, None, "cls", None).eval(), (x, mask), ["x", "padding_mask"],
                            ["y"], {"x": {0: length, 1: batch}, "padding_mask": {0: batch, 1: length}}, path)


def gemm_graph(path: str, shapes: List[tuple]) -> None:
    """One graph of independent MatMuls, input i of ``shapes[i] = (a_shape, b_shape)``."""
    from onnx import TensorProto, helper, save

    inputs, nodes, outputs = [], [], []
    for i, (a, b) in enumerate(shapes):
        inputs += [helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, a),
                   helper.make_tensor_value_info(f"b{i}", TensorProto.FLOAT, b)]
        nodes.append(helper.make_node("MatMul", [f"a{i}", f"b{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "gemms", inputs, outputs)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def layer_shapes(batch: int, length: int, dim: int, ffn: int, heads: int) -> List[tuple]:
    """The (a, b) operand shapes of a layer's matrix products."""
    tokens, head = batch * length, dim // heads
    return ([((tokens, dim), (dim, dim))] * 4 + [((tokens, dim), (dim, ffn)), ((tokens, ffn), (ffn, dim))]
            + [((batch * heads, length, head), (batch * heads, head, length)),
               ((batch * heads, length, length), (batch * heads, length, head))])


def checked_layer(args, tmp: str):
    """(the torch layer and its input, the onnxruntime session and its feed, the model's size): the layer exported
    and checked to compute what torch computes (both engines time the same function)."""
    layer, size = fairseq_layer(tmp)
    x = torch.randn(args.seq_len, args.batch, size["dim"], generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(args.batch, args.seq_len, dtype=torch.bool)
    export_layer(layer, x, mask, os.path.join(tmp, "layer.onnx"))
    session = ort_session(os.path.join(tmp, "layer.onnx"))
    feed = {"x": x.numpy(), "padding_mask": mask.numpy()}
    with torch.no_grad():
        out = layer(x, encoder_padding_mask=mask)
        out = out[0] if isinstance(out, tuple) else out
        gap = float(np.abs(session.run(None, feed)[0] - out.numpy()).max())
    if gap > 1e-4:
        raise SystemExit(f"gemm_roofline: the exported layer differs from torch's by {gap:.2e} (bound 1e-4)")
    return (layer, x, mask), (session, feed), size


def products(shapes: List[tuple], path: str, seed: int = 1):
    """(torch's calls, onnxruntime's call, FLOPs) of the matrix products of ``shapes`` on random operands."""
    g = torch.Generator().manual_seed(seed)
    operands = [(torch.randn(*a, generator=g), torch.randn(*b, generator=g)) for a, b in shapes]
    gemm_graph(path, shapes)
    session = ort_session(path)
    feed = {f"{k}{i}": t.numpy() for i, pair in enumerate(operands) for k, t in zip("ab", pair)}

    def torch_calls():
        with torch.no_grad():
            for a, b in operands:
                torch.matmul(a, b)

    return torch_calls, lambda: session.run(None, feed), sum(2 * int(np.prod(a)) * b[-1] for a, b in shapes)


def systems(args, tmp: str) -> List[Dict]:
    (layer, x, mask), (session, feed), size = checked_layer(args, tmp)
    shapes = layer_shapes(args.batch, args.seq_len, size["dim"], size["ffn"], size["heads"])
    torch_gemms, ort_gemms, gemm_flop = products(shapes, os.path.join(tmp, "gemms.onnx"))
    torch_sgemm, ort_sgemm, square_flop = products([((args.square,) * 2, (args.square,) * 2)],
                                                   os.path.join(tmp, "square.onnx"))
    layer_flop = args.batch * flops.layer_flops(args.seq_len, size["dim"], size["ffn"])

    def torch_layer():
        with torch.no_grad():
            layer(x, encoder_padding_mask=mask)

    return [dict(what="layer", engine="torch", flop=layer_flop, fn=torch_layer),
            dict(what="layer", engine="onnxruntime", flop=layer_flop, fn=lambda: session.run(None, feed)),
            dict(what="gemms", engine="torch", flop=gemm_flop, fn=torch_gemms),
            dict(what="gemms", engine="onnxruntime", flop=gemm_flop, fn=ort_gemms),
            dict(what="sgemm", engine="torch", flop=square_flop, fn=torch_sgemm),
            dict(what="sgemm", engine="onnxruntime", flop=square_flop, fn=ort_sgemm)]


def measure(found: List[Dict], repeats: int) -> None:
    for s in found:
        s["times"], s["cpu_times"] = [], []
        for _ in range(2):  # warm-up
            s["fn"]()
    for _, order in harness.rounds(found, repeats, "rotate"):
        for s in order:
            wall, cpu = harness.timed(s["fn"], no_gc=True)[:2]
            s["times"].append(wall)
            s["cpu_times"].append(cpu)


def rows_of(found: List[Dict], args) -> List[Dict]:
    kind = read_cpu_kind()
    peak, _ = acceleration.peak_gflops(kind, torch.float32, 1)
    at = {(s["what"], s["engine"]): common.median(s["cpu_times"]) for s in found}
    gflops = {(s["what"], s["engine"]): s["flop"] / at[(s["what"], s["engine"])] / 1e9 for s in found}
    rows = []
    for s in found:
        key = (s["what"], s["engine"])
        row = {"what": s["what"], "engine": s["engine"], "batch": args.batch, "seq_len": args.seq_len,
               "cpu_ms": at[key] * 1e3, "wall_ms": common.median(s["times"]) * 1e3, "gflops": gflops[key],
               "vs_sgemm": gflops[key] / gflops[("sgemm", s["engine"])],
               "peak_frac": gflops[key] / peak if peak else None, "vs_torch": at[(s["what"], "torch")] / at[key],
               "cpu_kind": kind.describe(), "threads": 1, "repeats": args.repeats}
        if s["what"] == "layer":
            row["gemm_share"] = at[("gemms", s["engine"])] / at[key]
            row["bound_vs_torch"] = at[("layer", "torch")] / at[("gemms", s["engine"])]
        rows.append(row)
    return rows


def parse_args(argv=None):
    p = harness.parser(__doc__, json="write the rows here")
    p.add_argument("--batch", type=int, default=32, help="rows of the layer call")
    p.add_argument("--seq-len", type=int, default=26, help="its padded length")
    p.add_argument("--square", type=int, default=1024, help="the bare sgemm's size")
    p.add_argument("--repeats", type=int, default=9, help="timed rounds (each runs every system once)")
    return p.parse_args(argv)


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    harness.set_threads(1)
    with tempfile.TemporaryDirectory(prefix="acl_gemm_") as tmp:
        found = systems(args, tmp)
        measure(found, args.repeats)
    rows = rows_of(found, args)
    harness.header("gemm_roofline", threads=1, batch=args.batch, seq_len=args.seq_len, repeats=args.repeats)
    harness.report(rows, ["what", "engine", "cpu_ms", "wall_ms", "gflops", "vs_sgemm", "peak_frac", "vs_torch",
                          "gemm_share", "bound_vs_torch"],
                   {"cpu_ms": "{:.2f}", "wall_ms": "{:.2f}", "gflops": "{:.1f}", "vs_sgemm": "{:.2f}",
                    "peak_frac": "{:.2f}",
                    "vs_torch": "{:.2f}x", "gemm_share": "{:.2f}", "bound_vs_torch": "{:.2f}x"}, args.json)
    print(f"# peak: {acceleration.peak_gflops(read_cpu_kind(), torch.float32, 1)[1]}")
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
