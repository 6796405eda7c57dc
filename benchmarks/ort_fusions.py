#!/usr/bin/env python3
"""ONNX Runtime at its speed: which graph fusions and session settings pay on one exported layer graph, fp32 and
int8, at batch 1 and 32, and where a batch-32 pass of the whole served path spends its time (ORT's profiler).

    python benchmarks/ort_fusions.py [--checkpoint CKPT --data DATA_BIN] [--layer 3] [--repeats 7]
        [--json benchmarks/results/ort_fusions.json]
    python benchmarks/ort_fusions.py --toy --json /tmp/ort_fusions_toy.json     # a tiny model, seconds

Systems (:func:`systems`): fp32 at each session level and through the bert optimizer; int8 static and dynamic,
without and with the GELU fusion; the engine's own sessions. Measure: milliseconds per pass against a reference in
rotated rounds, the answers' changes, a call's floor, and kernel profiles of the layer and of the served path. No
targets: the figures and what they decided are in docs/serve.md; the protocol in docs/benchmarks.md.
"""
import json
import os
import tempfile
from collections import Counter
from typing import Dict, List

import numpy as np

import _glue_runs
import _int8_chain as chain
import _serving
import common
import harness

QDQ = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
COLUMNS = ["system", "b1_ms", "b1_vs_base", "b32_ms", "b32_vs_base", "call_us", "d_prob", "b1_vs_b32", "new_ops"]
FORMATS = {"call_us": "{:.0f}", "b1_ms": "{:.1f}", "b32_ms": "{:.1f}", "b1_vs_base": "{:.3f}x",
           "b32_vs_base": "{:.3f}x", "d_prob": "{:.1e}", "b1_vs_b32": "{:.1e}"}


# ---- inputs ----------------------------------------------------------------------------------------


def layer_inputs(folder: str, sentences: List[str], layer: int, batch1: int, calibration: int) -> Dict:
    """The layer's fp32 inputs: ``b1`` (the first ``batch1`` sentences alone), ``b32`` (all, the engine's
    batches), ``calibration`` (the last ``calibration`` sentences alone) and ``b32_rows`` (each batch's sentence
    positions)."""
    from acl_runtime.engine import Engine

    eng = Engine(folder, "fp32", threads=1)
    ids = [eng.encode_with_info(s)[0] for s in sentences]

    def feed(src):
        x, mask = eng.backend.embeddings.run(None, {"src_tokens": np.ascontiguousarray(src, dtype=np.int64)})
        for i in range(1, layer):
            x = eng.layers[i - 1].run(None, {"x": x, "padding_mask": mask})[0]
        return {"x": x, "padding_mask": mask}

    batches = eng.make_batches(ids, 32)
    return {"b1": [feed(np.array([i])) for i in ids[:batch1]], "b32": [feed(src) for _, src in batches],
            "calibration": [feed(np.array([i])) for i in ids[-calibration:]], "b32_rows": [r for r, _ in batches],
            "lengths": [len(i) for i in ids]}


# ---- the graphs ------------------------------------------------------------------------------------


def build_graphs(folder: str, layer_file: str, work: str, feeds: List[Dict], heads: int, hidden: int) -> Dict:
    """Name -> path of each graph measured, and the transformer optimizer's fusion statistics."""
    from onnxruntime.transformers.optimizer import optimize_model

    from acl_fairseq.hf import onnx_quantize

    fp32 = os.path.join(folder, layer_file)
    paths = {"fp32": fp32}
    optimized = optimize_model(fp32, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    fired = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    paths["fp32 bert-optimizer"] = os.path.join(work, "fp32_bert_optimizer.onnx")
    optimized.save_model_to_file(paths["fp32 bert-optimizer"])
    for name, scheme, fuse in (("int8 static", "int8", False), ("int8 static+BiasGelu", "int8", True),
                               ("int8 dynamic", "int8-dynamic", False),
                               ("int8 dynamic+BiasGelu", "int8-dynamic", True)):
        paths[name] = os.path.join(work, name.replace(" ", "_").replace("+", "_") + ".onnx")
        onnx_quantize.quantize_graph(fp32, paths[name], onnx_quantize.SCHEMES[scheme],
                                     feeds if scheme == "int8" else None, fuse=fuse)
    return {"paths": paths, "bert_optimizer_fusions": fired}


def systems() -> List[Dict]:
    """The systems: name, graph, session level, optimizers disabled, reference name."""
    off = ["SkipLayerNormFusion"]
    out = [{"name": f"fp32, level {lv}", "graph": "fp32", "level": lv, "base": "fp32, level all"}
           for lv in chain.LEVELS]
    out.append({"name": "fp32 bert-optimizer, level all", "graph": "fp32 bert-optimizer", "level": "all",
                "base": "fp32, level all"})
    out.append({"name": "fp32, level all, no SkipLayerNorm (engine)", "graph": "fp32", "level": "all",
                "disabled": off, "base": "fp32, level all"})
    base = "int8 static, level all"
    out += [{"name": f"int8 static, level {lv}", "graph": "int8 static", "level": lv, "base": base}
            for lv in ("basic", "extended", "all")]
    out += [{"name": f"{g}, level all", "graph": g, "level": "all", "base": base}
            for g in ("int8 static+BiasGelu", "int8 dynamic", "int8 dynamic+BiasGelu")]
    out.append({"name": "int8 static+BiasGelu, level all, no SkipLayerNorm (engine)", "graph": "int8 static+BiasGelu",
                "level": "all", "disabled": off, "base": base})
    return out


# ---- measures --------------------------------------------------------------------------------------


def outputs(sess, feeds: List[Dict]) -> List[List[np.ndarray]]:
    return [sess.run(None, f) for f in feeds]


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def row_checks(out: Dict, ref: Dict, inputs: Dict) -> Dict:
    """``d_prob`` against the reference (both batch sizes), ``b1_vs_b32``: a row's logits alone and in its batch."""
    d = max(float(np.abs(softmax(a[1]) - softmax(b[1])).max()) for k in ("b1", "b32")
            for a, b in zip(out[k], ref[k]))
    where = {row: (k, j) for k, rows in enumerate(inputs["b32_rows"]) for j, row in enumerate(rows)}
    moved = max(float(np.abs(out["b1"][i][1][0] - out["b32"][where[i][0]][1][where[i][1]]).max())
                for i in range(len(inputs["b1"])))
    return {"d_prob": d, "b1_vs_b32": moved}


def time_rounds(sessions: Dict, inputs: Dict, repeats: int) -> Dict[str, Dict[str, List[float]]]:
    """Seconds of each system's pass over each feed set, per round (one untimed round first)."""
    names, times = list(sessions), {n: {"b1": [], "b32": []} for n in sessions}
    for r, order in harness.rounds(names, repeats + 1):
        for name in order:
            for b in ("b1", "b32"):
                sess, feeds = sessions[name], inputs[b]
                seconds, _, _ = harness.timed(lambda: [sess.run(None, f) for f in feeds], no_gc=True)  # noqa: B023
                if r:
                    times[name][b].append(seconds)
    return times


def call_floor(sess, feed: Dict, calls: int = 200) -> float:
    """Median microseconds of one call on a single token (its first row's first position): what a layer call
    costs beyond its arithmetic."""
    one = {k: np.ascontiguousarray(v[:1, :1]) for k, v in feed.items()}  # x: T x B x C, the mask B x T
    sess.run(None, one)
    return 1e6 * common.median([harness.wall(lambda: sess.run(None, one))[0] for _ in range(calls)])


def kernel_profile(path: str) -> Dict:
    """An ORT profile file: kernel microseconds by op type, the number and microseconds of ``model_run`` events."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    os.remove(path)
    ops, runs, run_us = Counter(), 0, 0
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            ops[e["args"]["op_name"]] += e["dur"]
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            runs, run_us = runs + 1, run_us + e["dur"]
    return {"ops_us": dict(ops.most_common()), "runs": runs, "run_us": run_us}


def layer_profile(path: str, feeds: List[Dict], work: str) -> Dict:
    sess = chain.session(path, profile=os.path.join(work, "profile"))
    outputs(sess, feeds)
    return kernel_profile(sess.end_profiling())


def served_profile(folder: str, precision: str, sentences: List[str], work: str) -> Dict:
    """One batch-32 pass of ``runtime.Engine`` over ``sentences``, all layers, every session profiled (and set as
    the engine sets its own)."""
    from acl_runtime.engine import DISABLED_OPTIMIZERS, Engine

    eng = Engine(folder, precision, threads=1)
    m = eng.manifest
    files = m["quantized"][precision] if precision != "fp32" else \
        {"embeddings": m["embeddings"], "layers": {r["file"]: r["file"] for r in m["layers"]}}
    prefix = os.path.join(work, f"served_{precision}")
    embed, *layers = [chain.session(os.path.join(folder, f), profile=prefix, disabled=DISABLED_OPTIMIZERS)
                      for f in [files["embeddings"]] + [files["layers"][r["file"]] for r in m["layers"]]]
    chain.swap_sessions(eng, embed, layers)
    batches = eng.make_batches([eng.encode_with_info(s)[0] for s in sentences], 32)
    seconds, _ = harness.wall(lambda: eng.run_batches(batches, len(sentences)))
    parts = [kernel_profile(s.end_profiling()) for s in [embed] + layers]
    ops = Counter()
    for p in parts:
        ops.update(p["ops_us"])
    runs, run_us, kernel_us = sum(p["runs"] for p in parts), sum(p["run_us"] for p in parts), sum(ops.values())
    return {"precision": precision, "wall_s": seconds, "calls": runs, "model_run_s": run_us / 1e6,
            "kernel_s": kernel_us / 1e6, "ort_overhead_us_per_call": (run_us - kernel_us) / runs,
            "python_us_per_call": (seconds * 1e6 - run_us) / runs,
            "ops_s": {k: v / 1e6 for k, v in ops.most_common()}}


# ---- main ------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = harness.parser(__doc__,
                       json="write the setup, rows and profiles here (default: benchmarks/results/ort_fusions.json)",
                       epilog=True)
    _serving.add_served_flags(p)
    p.add_argument("--layer", type=int, default=3, help="the layer graph measured (1-based)")
    p.add_argument("--batch1", type=int, default=150, help="sentences run alone (the batch-1 pass)")
    p.add_argument("--calibration", type=int, default=128, help="sentences calibrating the int8 copies made here")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds, each running every system once")
    args = p.parse_args(argv)
    if min(args.layer, args.batch1, args.calibration, args.repeats) < 1:
        p.error("--layer, --batch1, --calibration and --repeats must be >= 1")
    _serving.check_served_flags(p, args, "ort_fusions.json")
    return args


def rows_of(specs: List[Dict], times: Dict, checks: Dict, ops: Dict) -> List[Dict]:
    rows = []
    for s in specs:
        t, base = times[s["name"]], times[s["base"]]
        plain = ops["plain"]["fp32"]
        rows.append({"system": s["name"], "base": s["base"], **checks[s["name"]],
                     "b1_ms": 1000 * common.median(t["b1"]), "b32_ms": 1000 * common.median(t["b32"]),
                     "b1_vs_base": common.median([a / b for a, b in zip(base["b1"], t["b1"])]),
                     "b32_vs_base": common.median([a / b for a, b in zip(base["b32"], t["b32"])]),
                     "ops": dict(ops[s["name"]]),
                     "new_ops": " ".join(sorted(k for k in ops[s["name"]] if k not in plain and k not in QDQ)) or None})
    return rows


def _sessions_and_checks(paths: Dict[str, str], specs: List[dict], inputs: dict):
    """``(sessions, ops, checks)`` per system: its session, the ops each session (and each plain graph) runs, and
    its rows checked against its base system's, with its call floor."""
    import onnx

    sessions = {s["name"]: chain.session(paths[s["graph"]], s["level"], disabled=s.get("disabled", ())) for s in specs}
    ops = {s["name"]: chain.session_ops(paths[s["graph"]], s["level"], s.get("disabled", ())) for s in specs}
    ops["plain"] = {g: Counter(n.op_type for n in onnx.load(p).graph.node) for g, p in paths.items()}
    out = {n: {b: outputs(sess, inputs[b]) for b in ("b1", "b32")} for n, sess in sessions.items()}
    checks = {s["name"]: {**row_checks(out[s["name"]], out[s["base"]], inputs),
                          "call_us": call_floor(sessions[s["name"]], inputs["b1"][0])} for s in specs}
    return sessions, ops, checks


def _print_profiles(layer_prof: Dict[str, dict], served: List[dict]) -> None:
    """Where the kernel time goes: the layer's copies at batch 32, then the whole served path."""
    for g, prof in layer_prof.items():
        total = sum(prof["ops_us"].values())
        top = ", ".join(f"{k} {v / total:.0%}" for k, v in list(prof["ops_us"].items())[:6])
        print(f"# layer profile, {g}, batch 32: {total / 1e3:.0f} ms in kernels: {top}")
    for s in served:
        top = ", ".join(f"{k} {v / s['kernel_s']:.0%}" for k, v in list(s["ops_s"].items())[:6])
        print(f"# served path, {s['precision']}, batch 32, all layers: {s['wall_s']:.2f} s wall, {s['calls']} calls, "
              f"{s['kernel_s']:.2f} s in kernels ({top}); per call: ORT {s['ort_overhead_us_per_call']:.0f} us "
              f"beyond its kernels, Python {s['python_us_per_call']:.0f} us between calls")


def measure(args, folder: str, sentences: List[str], inputs: Dict, heads: int, hidden: int):
    """``(the graphs built, the rows, the layer's profiles, the served path's)``: every system timed and checked."""
    with tempfile.TemporaryDirectory(prefix="ort_fusions_") as work:
        layer_file = chain.manifest(folder)["layers"][args.layer - 1]["file"]
        built = build_graphs(folder, layer_file, work, inputs["calibration"], heads, hidden)
        paths, specs = built["paths"], systems()
        sessions, ops, checks = _sessions_and_checks(paths, specs, inputs)
        _glue_runs.log(f"timing: {len(specs)} systems, {args.repeats} rounds")
        times = time_rounds(sessions, inputs, args.repeats)
        _glue_runs.log("profiling: the layer's copies, then the served path at batch 32")
        layer_prof = {g: layer_profile(paths[g], inputs["b32"], work)
                      for g in ("fp32", "int8 static", "int8 static+BiasGelu", "int8 dynamic")}
        served = [served_profile(folder, p, sentences, work) for p in ("fp32", "int8")]
    return built, rows_of(specs, times, checks, ops), layer_prof, served


def main(argv=None) -> Dict:
    args = parse_args(argv)
    folder, sentences = _serving.model_and_sentences(args)
    _glue_runs.log(f"inputs: layer {args.layer}, {len(sentences)} sentences")
    inputs = layer_inputs(folder, sentences, args.layer, args.batch1, args.calibration)
    heads = common.MODEL_SIZES["tiny" if args.toy else "minilm"]["heads"]  # for the bert optimizer
    hidden = int(inputs["b1"][0]["x"].shape[2])  # x: T x B x C
    built, rows, layer_prof, served = measure(args, folder, sentences, inputs, heads, hidden)
    setup = harness.header("ort_fusions", onnx=os.path.relpath(folder, args.work), layer=args.layer, toy=args.toy,
                           examples=len(sentences), batch1_sentences=args.batch1,
                           mean_tokens=float(np.mean(inputs["lengths"])), batch32_passes=len(inputs["b32"]),
                           calibration_sentences=args.calibration, repeats=args.repeats, heads=heads, hidden=hidden,
                           threads=1)
    result = {"benchmark": "ort_fusions", "setup": setup, "bert_optimizer_fusions": built["bert_optimizer_fusions"],
              "rows": rows, "layer_profiles": layer_prof, "served_profiles": served}
    print(f"# bert optimizer fusions that fired: {built['bert_optimizer_fusions'] or 'none'}")
    harness.print_noted_table(rows, COLUMNS, FORMATS)
    _print_profiles(layer_prof, served)
    harness.write_json(args.json, result)
    return result


if __name__ == "__main__":
    common.quiet()
    main()
