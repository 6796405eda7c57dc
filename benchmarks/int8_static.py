#!/usr/bin/env python3
"""int8 schemes on a real model: SST-2 dev decisions at batch 1, 8 and 32 against fp32, on this CPU and on an
emulated AVX2 one, and the speed of the shipped copy against the torch engine.

    python benchmarks/int8_static.py [--checkpoint CKPT --data DATA_BIN] [--avx2-rows 12] [--repeats 5]
        [--json benchmarks/results/int8_static.json]

Systems: the shipped static scheme, one change each from it (:func:`candidates`), and dynamic; for speed, torch,
ORT fp32, the shipped int8 and int8-dynamic. Measure: accuracy and decisions against fp32 at three batch sizes and
three policies, batch 1 against 32, the emulated AVX2 CPU against this one, and the batch-32 speed in interleaved
rounds. Targets (:func:`targets`): identical decisions at batch 1 and 32; accuracy within 0.5 of fp32; the same
answers on emulated AVX2; ORT int8 >= 1.8x torch at batch 32. The protocol: docs/benchmarks.md.
"""
import hashlib
import json
import os
import sys
from typing import Dict, List

import numpy as np

import _glue_runs
import _int8_chain as chain
import _records
import _serving
import common
import harness
from acl_runtime.io import atomic

BATCHES = (1, 8, 32)
MAX_DROP = 0.5  # the budget the "calibrated" policy is chosen under
COLUMNS = ["scheme", "worst_drop", "fp32_rows", "fp32_logit", "b1_vs_b32_rows", "b1_vs_b32_logit", "b32_s",
           "avx2_logit", "avx2_rows"]
FORMATS = {"worst_drop": "{:+.2f}", "fp32_logit": "{:.3f}", "b1_vs_b32_logit": "{:.1e}", "b32_s": "{:.1f}",
           "avx2_logit": "{:.1e}"}


def candidates() -> Dict[str, Dict]:
    """Label -> scheme: the shipped one, then one change each (activation type, weight bits, per tensor,
    calibration method), and dynamic."""
    from acl_fairseq.hf import onnx_quantize

    base, n = onnx_quantize.SCHEMES["int8"], onnx_quantize.CALIBRATION_ROWS
    return {"static u8/s8 7-bit per-channel MinMax (int8)": base,
            "static u8/s8 7-bit per-channel Percentile": {**base, "calibrate": "Percentile"},
            "static u8/s8 7-bit per-channel Entropy": {**base, "calibrate": "Entropy"},
            f"static u8/s8 7-bit per-channel MinMax, {n // 4} rows": {**base, "rows": n // 4},
            f"static u8/s8 7-bit per-channel MinMax, {n * 4} rows": {**base, "rows": n * 4},
            "static u8/s8 7-bit per-tensor MinMax": {**base, "per_channel": False},
            "static s8/s8 7-bit per-channel MinMax": {**base, "activations": "QInt8"},
            "static s8/s8 8-bit per-channel MinMax": {**base, "activations": "QInt8", "reduce_range": False},
            "static u8/s8 8-bit per-channel MinMax": {**base, "reduce_range": False},
            "dynamic u8/s8 7-bit per-channel (int8-dynamic)": onnx_quantize.SCHEMES["int8-dynamic"]}


def stamp_of(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_schemes(hub, folder: str, work: str, wanted: List[str]) -> Dict[str, str]:
    """Label -> folder of that scheme's layer graphs (fp32 file names); the shipped scheme is the export's own."""
    from acl_fairseq.hf import onnx_quantize

    graphs = chain.manifest(folder)
    dirs, feeds = {}, {}
    for i, (label, scheme) in enumerate(candidates().items()):
        if wanted and not any(label.startswith(w) for w in wanted):
            continue
        if scheme == onnx_quantize.SCHEMES["int8"]:
            dirs[label] = os.path.join(folder, "int8")
            continue
        target = os.path.join(work, "schemes", str(i))
        stamp = stamp_of(scheme, _records.load(folder, "source.json"))
        if _records.load(target, "scheme.json") != {"stamp": stamp}:
            n = scheme.get("rows", onnx_quantize.CALIBRATION_ROWS)
            if n not in feeds:
                feeds[n] = onnx_quantize.layer_feeds(folder, graphs, onnx_quantize.calibration_rows(hub, n))
            _glue_runs.log(f"quantize: {label} -> {target}")
            os.makedirs(target, exist_ok=True)
            for rec in graphs["layers"]:
                onnx_quantize.quantize_graph(os.path.join(folder, rec["file"]), os.path.join(target, rec["file"]),
                                             scheme,
                                             feeds[n][rec["file"]])
            harness.write_json(os.path.join(target, "scheme.json"), {"stamp": stamp}, indent=None)
        dirs[label] = target
    return dirs


def engine(folder: str, layer_dir: str = None, precision: str = "fp32"):
    """``runtime.Engine`` on ``folder``, its layer sessions taken from ``layer_dir`` when given."""
    from acl_runtime.engine import Engine

    eng = Engine(folder, precision, threads=1)
    if layer_dir is not None:
        layers = [chain.session(os.path.join(layer_dir, r["file"])) for r in eng.manifest["layers"]]
        chain.swap_sessions(eng, eng.backend.embeddings, layers)
    return eng


def decisions(eng, ids: List[List[int]], policies: List, batches=BATCHES) -> Dict:
    """(policy name, batch) -> logits, exit layers, seconds."""
    out = {}
    for b in batches:
        for name, policy, threshold in policies:
            def one(b=b, policy=policy, threshold=threshold):
                return eng.run_batches(eng.make_batches(ids, b), len(ids), policy, threshold)

            seconds, (logits, layers) = harness.wall(one)
            out[(name, b)] = {"logits": logits, "layers": layers, "seconds": seconds}
    return out


def fp32_decisions(folder: str, work: str, ids, policies) -> Dict:
    """fp32's, cached in ``work`` (keyed by the graphs' sha256, the inputs and the policies)."""
    manifest = chain.manifest(folder)
    key = stamp_of({k: v for k, v in manifest["sha256"].items() if not k.startswith("int8/")}, ids, policies)
    path = os.path.join(work, f"fp32_{key}.npz")
    if os.path.isfile(path):
        data = np.load(path)
        return {(n, b): {"logits": data[f"{n}_{b}_logits"], "layers": data[f"{n}_{b}_layers"]}
                for n, _, _ in policies for b in BATCHES}
    _glue_runs.log("fp32: decisions at batch 1, 8, 32 (cached for the next run)")
    out = decisions(engine(folder), ids, policies)
    arrays = {f"{n}_{b}_{k}": v[k] for (n, b), v in out.items() for k in ("logits", "layers")}
    atomic.write_through(path, lambda tmp: np.savez(tmp, **arrays))
    return out


def accuracy(logits: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean(logits.argmax(1) == gold) * 100)


def summary(label: str, got: Dict, ref: Dict, gold: np.ndarray, policies) -> Dict:
    row = {"scheme": label, "accuracy": {}, "drop": {}, "b1_vs_b32": {}, "vs_fp32": {}}
    for name, _, _ in policies:
        for b in BATCHES:
            mine, theirs = got[(name, b)], ref[(name, b)]
            acc, fp32 = accuracy(mine["logits"], gold), accuracy(theirs["logits"], gold)
            row["accuracy"][f"{name} b{b}"] = acc
            row["drop"][f"{name} b{b}"] = acc - fp32
            row["vs_fp32"][f"{name} b{b}"] = int(((mine["logits"].argmax(1) != theirs["logits"].argmax(1)) |
                                                  (mine["layers"] != theirs["layers"])).sum())
        one, many = got[(name, 1)], got[(name, 32)]
        differ = (one["logits"].argmax(1) != many["logits"].argmax(1)) | (one["layers"] != many["layers"])
        row["b1_vs_b32"][name] = int(differ.sum())
    row["worst_drop"] = min(row["drop"].values())
    row["fp32_rows"] = max(row["vs_fp32"].values())
    row["fp32_logit"] = float(np.abs(got[("last", 32)]["logits"] - ref[("last", 32)]["logits"]).max())
    row["b1_vs_b32_rows"] = sum(row["b1_vs_b32"].values())
    row["b1_vs_b32_logit"] = float(np.abs(got[("last", 1)]["logits"] - got[("last", 32)]["logits"]).max())
    row["b32_s"] = got[("last", 32)]["seconds"]
    return row


def avx2(folder: str, layer_dir: str, rows: List[np.ndarray], cpu: str) -> Dict:
    native = chain.run_rows(folder, rows, 8, "fp32", layer_dir)
    emulated = chain.run_emulated(folder, rows, 8, "fp32", cpu, layer_dir)
    flips = (native.argmax(-1) != emulated.argmax(-1)).any(1)
    return {"avx2_logit": float(np.abs(native - emulated).max()), "avx2_rows": int(flips.sum()),
            "avx2_err_vs_fp32": float(np.abs(emulated - chain.run_rows(folder, rows, 8, "fp32")).max())}


def speed(hub, folder: str, dynamic_dir: str, sentences: List[str], repeats: int) -> List[Dict]:
    """Batch 32, all layers and entropy 0.3: median over interleaved rounds of torch's engine time over each
    system's (wall and process CPU)."""
    engines = {"torch": hub, "ort fp32": engine(folder), "ort int8": engine(folder, precision="int8"),
               "ort int8-dynamic": engine(folder, dynamic_dir)}
    ids = {name: [e.encode_with_info(s)[0] for s in sentences] for name, e in engines.items()}
    systems = [(name, mode) for name in engines for mode in ("all", "exit")]
    times = {s: [] for s in systems}
    for r, order in harness.rounds(systems, repeats + 1):  # round 0 warms up
        for name, mode in order:
            e, policy = engines[name], ("entropy", 0.3) if mode == "exit" else (None, None)
            w, c, _ = harness.timed(lambda: e.run_batches(e.make_batches(ids[name], 32), len(sentences), *policy))  # noqa: B023
            if r:
                times[(name, mode)].append((w, c))
    out = []
    for name, mode in systems:
        t, ref = times[(name, mode)], times[("torch", mode)]
        out.append({"system": f"{name} {mode}", "sent_per_s": len(sentences) / common.median([x[0] for x in t]),
                    "vs_torch": common.median([a[0] / b[0] for a, b in zip(ref, t)]),
                    "cpu_vs_torch": common.median([a[1] / b[1] for a, b in zip(ref, t)]), "repeats": repeats})
    return out


def targets(rows: List[Dict], shipped: str, speed_rows: List[Dict]) -> List[Dict]:
    row = next(r for r in rows if r["scheme"] == shipped)
    found = [("identical decisions at batch 1 and 32 (rows that differ)", row["b1_vs_b32_rows"], 0, False),
             ("accuracy within 0.5 of fp32 at batch 1, 8, 32 (worst difference)", row["worst_drop"], -0.5, True)]
    if row.get("avx2_rows") is not None:
        found.append(("the same answers on emulated AVX2 (rows whose label differs)", row["avx2_rows"], 0, False))
    for s in speed_rows:
        if s["system"].startswith("ort int8 "):
            found.append((f"{s['system']} >= 1.8x torch at batch 32", s["vs_torch"], 1.8, True))
    return [harness.target(t, v, b, at_least) for t, v, b, at_least in found]


def parse_args(argv=None):
    p = harness.parser(__doc__, json="write the setup, rows and targets here", epilog=True)
    _serving.add_model_flags(p)
    p.add_argument("--examples", type=int, default=0, help="first N dev sentences (0: all 872)")
    p.add_argument("--schemes", nargs="*", help="measure only the labels starting with these (default: all)")
    p.add_argument("--avx2-rows", type=int, default=12, help="sentences run under qemu per scheme (0: skip; "
                   "the S8S8 schemes take minutes a row there)")
    p.add_argument("--qemu-cpu", default="EPYC-Rome", help="qemu CPU model: AVX2 without AVX-512 or VNNI")
    p.add_argument("--repeats", type=int, default=5, help="interleaved speed rounds (0: skip the speed part)")
    args = p.parse_args(argv)
    _serving.check_model_flags(p, args)
    return args


def compared_policies(ckpt: str):
    """(the calibrated setting, the policies compared: last exit, entropy 0.3 and the one ``calibration.choose``
    finds with max-drop=MAX_DROP on the checkpoint's acl-evaluate sweep)."""
    from acl_runtime import calibration

    sweep = json.load(open(os.path.join(os.path.dirname(os.path.abspath(ckpt)), "early_exit", "early_exit.json")))
    chosen = calibration.choose(sweep, calibration.Budget("max-drop", MAX_DROP))
    return chosen, [("last", None, None), ("entropy 0.3", "entropy", 0.3),
                    ("calibrated", chosen["policy"], chosen["threshold"])]


def measure_schemes(args, folder: str, dirs: Dict[str, str], data, sample: List[np.ndarray]) -> List[Dict]:
    """One row per scheme: its decisions against fp32's (``data`` is ids, gold labels, policies and fp32's
    decisions) and, for the schemes with kernels of their own, the emulated AVX2 CPU against this one."""
    ids, gold, policies, ref = data
    rows = []
    for label, layer_dir in dirs.items():
        _glue_runs.log(f"measure: {label}")
        eng = engine(folder, precision="int8") if layer_dir == os.path.join(folder, "int8") else \
            engine(folder, layer_dir)
        row = summary(label, decisions(eng, ids, policies), ref, gold, policies)
        # the calibration variants run the shipped scheme's kernels: emulating them would only repeat its check
        if args.avx2_rows and "rows" not in label and not any(m in label for m in ("Percentile", "Entropy")):
            row.update(avx2(folder, layer_dir, sample, args.qemu_cpu))
        rows.append(row)
        if args.json:  # each scheme as it is measured: the run is long
            harness.write_json(args.json + ".partial", rows)
        print(f"  {label}: worst {row['worst_drop']:+.2f}, b1/b32 rows {row['b1_vs_b32_rows']}, "
              f"avx2 {row.get('avx2_logit')}", flush=True)
    return rows


def print_report(result: Dict, ckpt: str, chosen: Dict, repeats: int) -> None:
    print(f"# int8_static: {result['examples']} SST-2 dev sentences, checkpoint {ckpt}; policies: last exit, "
          f"entropy 0.3, calibrated {chosen['policy']} {chosen['threshold']:g} (max-drop={MAX_DROP}); fp32 accuracy "
          + ", ".join(f"{k} {v:.2f}" for k, v in result["fp32_accuracy"].items() if k.endswith("b32")))
    harness.print_noted_table(result["schemes"], COLUMNS, FORMATS)
    if result["speed"]:
        print(f"# speed at batch 32, {repeats} interleaved rounds (median ratio of torch's engine time)")
        harness.print_table(result["speed"], ["system", "sent_per_s", "vs_torch", "cpu_vs_torch"],
                            {"sent_per_s": "{:.1f}", "vs_torch": "{:.2f}x", "cpu_vs_torch": "{:.2f}x"})
    harness.print_targets(result["targets"])


def main(argv=None) -> Dict:
    args = parse_args(argv)
    import torch

    from acl_fairseq.hf import onnx_quantize
    from acl_fairseq.inference import hub as hub_mod

    torch.set_num_threads(1)
    ckpt, data = _serving.trained_checkpoint(args)
    hub = hub_mod.from_checkpoint(ckpt, data)
    work = os.path.join(args.work, "int8_static")
    folder = _serving.exported(hub, ckpt, os.path.join(work, "onnx"))
    dirs = build_schemes(hub, folder, work, args.schemes)
    sentences, gold_names = _serving.sst2_dev(args.examples)
    fp32 = engine(folder)
    ids = [fp32.encode_with_info(s)[0] for s in sentences]
    gold = np.array([fp32.label_names().index(g) for g in gold_names])
    chosen, policies = compared_policies(ckpt)
    ref = fp32_decisions(folder, work, ids, policies)
    rng = np.random.default_rng(0)
    sample = [np.array(ids[i]) for i in sorted(rng.choice(len(ids), min(args.avx2_rows, len(ids)), replace=False))]
    rows = measure_schemes(args, folder, dirs, (ids, gold, policies, ref), sample)
    dynamic = next((d for k, d in dirs.items() if "int8-dynamic" in k), None)
    speed_rows = speed(hub, folder, dynamic, sentences, args.repeats) if args.repeats and dynamic else []
    shipped = next((k for k in dirs if k.endswith("(int8)")), None)
    fp32_acc = {f"{n} b{b}": accuracy(ref[(n, b)]["logits"], gold) for n, _, _ in policies for b in BATCHES}
    result = {"benchmark": "int8_static", "checkpoint": os.path.relpath(ckpt, args.work), "examples": len(ids),
              "policies": [[n, p, t] for n, p, t in policies], "fp32_accuracy": fp32_acc,
              "calibration_rows": onnx_quantize.CALIBRATION_ROWS, "avx2_rows": len(sample) if args.avx2_rows else 0,
              "cpu": args.qemu_cpu, **harness.record(threads=1), "schemes": rows, "speed": speed_rows,
              "targets": targets(rows, shipped, speed_rows) if shipped else []}
    print_report(result, ckpt, chosen, args.repeats)
    if args.json:
        harness.write_json(args.json, result)
        if os.path.exists(args.json + ".partial"):
            os.remove(args.json + ".partial")
    return result


if __name__ == "__main__":
    common.quiet()
    sys.exit(0 if main() is not None else 1)
