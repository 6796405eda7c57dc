#!/usr/bin/env python3
"""int8 on two CPU kinds: the logit error of each quantization scheme against fp32, and its batch dependence.

    python benchmarks/int8_portability.py --folder OUT/onnx [--rows 32] [--qemu-cpu EPYC-Rome]
        [--json benchmarks/results/int8_portability.json]

Systems: seven quantizations of the folder's fp32 layer graphs (:data:`SCHEMES`) and its own ``int8/`` copy, each on
this CPU and under ``qemu-x86_64 -cpu CPU``. Measure: the largest logit error against fp32 at batch 1 and 8, and
batch 1 against 8. No targets (docs/benchmarks.md has the figures and the protocol).
"""
import logging
import os
import shutil
import sys
import tempfile
from typing import Dict, List

import numpy as np

import _int8_chain as chain
import harness

SCHEMES = {  # name -> (static?, activation type, reduce_range, per-channel weights)
    "dynamic u8/s8": (False, "QUInt8", False, False),
    "dynamic u8/s8 reduce_range": (False, "QUInt8", True, False),
    "dynamic u8/s8 reduce_range per-channel": (False, "QUInt8", True, True),
    "static u8/s8": (True, "QUInt8", False, False),
    "static s8/s8": (True, "QInt8", False, False),
    "static s8/s8 reduce_range": (True, "QInt8", True, False),
    "static u8/s8 reduce_range": (True, "QUInt8", True, False),
}


def _calibration_feeds(m: dict, embed, layers, rows: List[np.ndarray]) -> Dict[str, List[dict]]:
    """{layer graph file: its inputs}: ``rows`` run through the fp32 chain (manifest ``m``, its sessions) in batches
    of 8, each layer's input kept for the static schemes' calibration."""
    feeds = {r["file"]: [] for r in m["layers"]}
    for ids in chain.padded(rows, 8, m["input_layout"]["pad"]):
        x, mask = embed.run(None, {"src_tokens": ids})
        for rec, session in zip(m["layers"], layers):
            feeds[rec["file"]].append({"x": x, "padding_mask": mask})
            x = session.run(None, {"x": x, "padding_mask": mask})[0]
    return feeds


def _quantize_layer(source: str, target: str, scheme: tuple, calibration: List[dict]) -> None:
    """The layer graph ``source`` quantized by ``scheme`` (static, activation type, reduce_range, per_channel) into
    ``target``; a static scheme calibrates on the inputs ``calibration``."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self, items):
            self.items = iter(items)

        def get_next(self):
            return next(self.items, None)

    static, activation, reduce_range, per_channel = scheme
    model = onnx.load(source)
    del model.graph.value_info[:]  # as acl-export does: the quantizer infers its own shapes
    folder = os.path.dirname(target)
    bare = os.path.join(folder, "bare.onnx")
    onnx.save(model, bare)
    if static:
        quantize_static(bare, target, Reader(calibration), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["MatMul", "Gemm"], activation_type=getattr(QuantType, activation),
                        weight_type=QuantType.QInt8, reduce_range=reduce_range, per_channel=per_channel)
    else:
        quantize_dynamic(bare, target, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"],
                         reduce_range=reduce_range, per_channel=per_channel)
    for leftover in (bare, os.path.join(folder, "bare-inferred.onnx")):
        if os.path.exists(leftover):
            os.remove(leftover)


def quantize_schemes(folder: str, rows: List[np.ndarray], out: str) -> Dict[str, str]:
    """Each scheme's layer graphs in ``out/<i>``, static ones calibrated on ``rows``; returns name -> folder."""
    m, embed, layers = chain.sessions(folder, "fp32")
    feeds = _calibration_feeds(m, embed, layers, rows)
    logging.getLogger().setLevel(logging.ERROR)
    folders = {}
    for i, (name, scheme) in enumerate(SCHEMES.items()):
        target = os.path.join(out, str(i))
        os.makedirs(target)
        for rec in m["layers"]:
            _quantize_layer(os.path.join(folder, rec["file"]), os.path.join(target, rec["file"]), scheme,
                            feeds[rec["file"]])
        folders[name] = target
    return folders


def measure(folder: str, rows: List[np.ndarray], cpu: str) -> List[Dict]:
    reference = chain.run_rows(folder, rows, 1, "fp32")
    with tempfile.TemporaryDirectory() as tmp:
        systems = [(name, "fp32", layer_dir) for name, layer_dir in quantize_schemes(folder, rows, tmp).items()]
        if "int8" in chain.manifest(folder)["quantized"]:
            systems.append(("acl-export --quantize int8", "int8", None))
        table = []
        for name, precision, layer_dir in systems:
            row = {"scheme": name}
            for where, runner in (("native", chain.run_rows), (f"qemu {cpu}", chain.run_emulated)):
                kw = {"layer_dir": layer_dir} if where == "native" else {"layer_dir": layer_dir, "cpu": cpu}
                one, eight = (runner(folder, rows, b, precision, **kw) for b in (1, 8))
                row[where] = {"err_b1": float(np.abs(one - reference).max()),
                              "err_b8": float(np.abs(eight - reference).max()),
                              "b1_vs_b8": float(np.abs(one - eight).max())}
                print(f"  {name:28s} {where:16s} error {row[where]['err_b1']:.4f} / {row[where]['err_b8']:.4f}, "
                      f"batch 1 vs 8 {row[where]['b1_vs_b8']:.1e}", flush=True)
            table.append(row)
    return table


def main(argv=None) -> None:
    p = harness.parser(__doc__, json="write the table here", epilog=True)
    p.add_argument("--folder", required=True, help="an OUT/onnx folder written by acl-export --format onnx")
    p.add_argument("--rows", type=int, default=32, help="random token rows run through every scheme")
    p.add_argument("--qemu-cpu", default="EPYC-Rome", help="qemu CPU model of the second machine kind (AVX2, no VNNI)")
    args = p.parse_args(argv)
    if shutil.which("qemu-x86_64") is None:
        sys.exit("int8_portability: qemu-x86_64 not found; install Debian's qemu-user (apt-get install qemu-user)")
    rows = chain.token_rows(args.folder, args.rows)
    print(f"{len(rows)} random rows, every exit's logits against fp32 at batch 1; native CPU and qemu {args.qemu_cpu}")
    table = measure(args.folder, rows, args.qemu_cpu)
    if args.json:
        record = {"folder": os.path.basename(os.path.normpath(args.folder)), "rows": len(rows), "cpu": args.qemu_cpu,
                  "fp32_logit_scale": float(np.abs(chain.run_rows(args.folder, rows, 1)).max()), "schemes": table}
        harness.write_json(args.json, record)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
