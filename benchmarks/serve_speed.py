#!/usr/bin/env python3
"""Serving speed of one trained multi-exit model on three engines: the torch engine (the hub), ONNX Runtime fp32 and
ONNX Runtime int8 (the exported ``OUT/onnx`` folder, :mod:`acl_runtime`), each with all layers and with early exit,
on SST-2 dev.

    python benchmarks/serve_speed.py [--checkpoint CKPT --data DATA_BIN] [--threshold T] [--repeats 5]
        [--threads 1] [--json benchmarks/results/serve_speed.json]
    python benchmarks/serve_speed.py --toy --json /tmp/serve_toy.json     # a tiny model, seconds (tests)

Systems: 3 engines x (all layers, early exit), in one process, in rotated rounds. Measure: batch-1 latency
percentiles and batched sentences/s (engine time, tokenization apart), accuracy, the early-exit efficiency, the
ratio to torch (wall and CPU time), and each engine's peak resident memory in a process of its own. Targets: ORT
fp32 >= 1.3x torch at batch 1; early-exit efficiency >= 0.9 at batch 1; ORT int8 >= 1.8x torch batched; int8
accuracy within 1.0 point of fp32. The protocol: docs/benchmarks.md, "What the serving benchmarks measure".
"""
import os
import sys
from typing import Dict, List

import _glue_runs
import _serving
import common
import harness
from acl_runtime import console, exits
from load import serve_child

ENGINES = ("torch", "ort-fp32", "ort-int8")
MODES = ("all", "exit")  # all layers, early exit
COLUMNS = ["system", "batch", "p50_ms", "p95_ms", "tok_ms", "sent_per_s", "accuracy", "mean_exit_layer",
           "layer_speedup", "wall_speedup", "efficiency", "cpu_efficiency", "vs_torch", "cpu_vs_torch", "peak_rss_mb",
           "rss_vs_torch"]
FORMATS = {"p50_ms": "{:.2f}", "p95_ms": "{:.2f}", "tok_ms": "{:.3f}", "sent_per_s": "{:.1f}", "accuracy": "{:.2%}",
           "mean_exit_layer": "{:.2f}", "layer_speedup": "{:.2f}x", "wall_speedup": "{:.2f}x",
           "efficiency": "{:.2f}", "cpu_efficiency": "{:.2f}", "vs_torch": "{:.2f}x",
           "cpu_vs_torch": "{:.2f}x", "peak_rss_mb": "{:.0f}", "rss_vs_torch": "{:.2f}"}


# ---- the systems ---------------------------------------------------------------------------------


class System:
    """One engine in one mode, behind the interface the hub and the runtime share (encode, batch, run)."""

    def __init__(self, engine: str, mode: str, runner, policy, threshold):
        self.engine, self.mode, self.runner = engine, mode, runner
        self.name = f"{engine} {mode}"
        self.policy, self.threshold = (policy, threshold) if mode == "exit" else (None, None)
        self.rounds: Dict[int, List[Dict]] = {}  # batch size -> per repeat: times and outputs

    def encode(self, sentence: str):
        return self.runner.encode_with_info(sentence)[0]

    def run(self, ids: list, batch_size: int):
        """(logits, exit layers) in input order, as numpy arrays (the torch engine's converted after the clock)."""
        return self.runner.run_batches(self.runner.make_batches(ids, batch_size), len(ids), self.policy,
                                       self.threshold)


def numpy_out(out):
    logits, layers = out
    return getattr(logits, "numpy", lambda: logits)(), getattr(layers, "numpy", lambda: layers)()


def make_systems(hub, folder: str, policy: str, threshold: float, threads: int) -> List[System]:
    from acl_runtime.engine import Engine

    runners = {"torch": hub, "ort-fp32": Engine(folder, "fp32", threads), "ort-int8": Engine(folder, "int8", threads)}
    return [System(e, m, runners[e], policy, threshold) for e in ENGINES for m in MODES]


def one_pass(system: System, sentences: List[str], batch_size: int) -> Dict:
    """One pass over ``sentences``: at batch 1 every sentence alone, else all of them in the hub's batches.
    Per call: tokenization and engine times (wall, and the engine's CPU); the outputs in input order."""
    out = {"tok": [], "model": [], "cpu": [], "logits": [], "layers": []}
    for group in ([s] for s in sentences) if batch_size == 1 else [sentences]:
        start = harness.now()
        ids = [system.encode(s) for s in group]
        encoded = harness.now()
        found = system.run(ids, batch_size)
        model, cpu = harness.since(encoded)
        logits, layers = numpy_out(found)
        for key, value in (("tok", encoded[0] - start[0]), ("model", model), ("cpu", cpu)):
            out[key].append(value)
        out["logits"] += list(logits)
        out["layers"] += list(layers)
    return out


def measure(systems: List[System], sentences: List[str], batch_size: int, repeats: int) -> None:
    """``repeats`` rounds, each running every system once (order rotated by one per round), the garbage collector
    off during a pass, after one untimed warm-up round on a few sentences."""
    def one(s: System, sents):
        return harness.timed(lambda: one_pass(s, sents, batch_size), no_gc=True)[2]

    for s in systems:
        one(s, sentences[:8])
        s.rounds[batch_size] = []
    for _, order in harness.rounds(systems, repeats):
        for s in order:
            s.rounds[batch_size].append(one(s, sentences))


# ---- summary -------------------------------------------------------------------------------------


def labels_of(system: System, logits) -> List[str]:
    names = system.runner.label_names()
    return [names[int(row.argmax())] for row in logits]


def ratio(num: System, den: System, b: int, key: str) -> float:
    """Median over repeats of num's total time over den's in the same repeat (``key``: model = wall, cpu)."""
    return common.median([sum(x[key]) / sum(y[key]) for x, y in zip(num.rounds[b], den.rounds[b])])


def row_of(s: System, by_name: Dict[str, System], b: int, gold: List[str], num_layers: int) -> Dict:
    import numpy as np

    rounds, n = s.rounds[b], len(gold)
    total, tok = [sum(r["model"]) for r in rounds], [sum(r["tok"]) for r in rounds]
    full, ref = by_name[f"{s.engine} all"], by_name[f"torch {s.mode}"]
    labels, torch_labels = labels_of(s, rounds[0]["logits"]), labels_of(ref, ref.rounds[b][0]["logits"])
    mean_exit = float(np.mean(rounds[0]["layers"]))
    row = {"system": s.name, "engine": s.engine, "mode": s.mode, "batch": b,
           "policy": s.policy, "threshold": s.threshold,
           "p50_ms": 1000 * common.median([np.percentile(r["model"], 50) for r in rounds]) if b == 1 else None,
           "p95_ms": 1000 * common.median([np.percentile(r["model"], 95) for r in rounds]) if b == 1 else None,
           "tok_ms": 1000 * common.median(tok) / n, "model_ms_per_sentence": 1000 * common.median(total) / n,
           "sent_per_s": n / common.median(total),
           "e2e_sent_per_s": n / common.median([a + t for a, t in zip(total, tok)]),
           "cpu_sent_per_s": n / common.median([sum(r["cpu"]) for r in rounds]),
           "accuracy": sum(p == g for p, g in zip(labels, gold)) / n,
           "agreement_with_torch": sum(p == t for p, t in zip(labels, torch_labels)) / n,
           "mean_exit_layer": mean_exit, "layer_speedup": num_layers / mean_exit,
           "wall_speedup": ratio(full, s, b, "model"), "cpu_speedup": ratio(full, s, b, "cpu"),
           "vs_torch": ratio(ref, s, b, "model"), "cpu_vs_torch": ratio(ref, s, b, "cpu"),
           "examples": n, "repeats": len(rounds)}
    row["efficiency"] = row["wall_speedup"] / row["layer_speedup"]
    row["cpu_efficiency"] = row["cpu_speedup"] / row["layer_speedup"]
    return row


# ---- targets -------------------------------------------------------------------------------------


def targets(rows: List[Dict], batch: int) -> List[Dict]:
    """The targets, each with its measured value and pass/miss."""
    at = {(r["system"], r["batch"]): r for r in rows}
    out = []

    def add(text, row, field, bound, at_least=True, value=None):
        value = row[field] if value is None else value
        # cpu_value: the same measured in process CPU time, where there is one
        out.append(harness.target(text, value, bound, at_least, cpu_value=row.get(f"cpu_{field}")))

    for mode in MODES:
        add(f"ORT fp32 >= 1.3x torch, batch 1, {mode}", at[(f"ort-fp32 {mode}", 1)], "vs_torch", 1.3)
    for engine in ("ort-fp32", "ort-int8"):
        add(f"early-exit efficiency >= 0.9, batch 1, {engine}", at[(f"{engine} exit", 1)], "efficiency", 0.9)
    for mode in MODES:
        add(f"ORT int8 >= 1.8x torch, batch {batch}, {mode}", at[(f"ort-int8 {mode}", batch)], "vs_torch", 1.8)
    # at both batch sizes: dynamic quantization scales activations per call, so a sentence's label can depend on
    # the batch it shares
    for b in (1, batch):
        for mode in MODES:
            fp32, int8 = at[(f"ort-fp32 {mode}", b)], at[(f"ort-int8 {mode}", b)]
            add(f"ORT int8 accuracy within 1.0 point of fp32, batch {b}, {mode}", int8, "accuracy", 1.0,
                at_least=False, value=100 * abs(fp32["accuracy"] - int8["accuracy"]))
    return out


# ---- main ----------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = harness.parser(__doc__, json="write the setup, rows and targets here", threads=1)
    _serving.add_served_flags(p, export=False)
    p.add_argument("--policy", default="entropy", choices=list(exits.POLICIES), help="early-exit policy")
    p.add_argument("--threshold", type=float, help="its threshold (default: the policy table's, 0.3 for entropy)")
    p.add_argument("--batch-size", type=int, default=32, help="the batched setting (batch 1 always runs)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds, each running every system once")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-memory processes")
    args = p.parse_args(argv)
    args.threshold_source = "--threshold" if args.threshold is not None else "policy default"
    console.check_request_flags(p, args, fill_default=True)
    if args.threads < 1 or args.repeats < 1 or args.batch_size < 2:
        p.error("--threads and --repeats must be >= 1, --batch-size >= 2 (batch 1 always runs)")
    _serving.check_served_flags(p, args)
    return args


def peak_memory(args, model: tuple, sentences: List[str], rows: List[Dict]) -> Dict:
    """Each row's peak resident memory and its ratio to torch's (none with ``--no-rss``), from one process per
    engine (``model``: checkpoint, data, ONNX folder); the processes' records."""
    rss = {} if args.no_rss else serve_child.peak_rss(*model, sentences, args.policy, args.threshold,
                                                        args.batch_size, args.threads)
    for row in rows:
        rec = rss.get(row["engine"])
        row["peak_rss_mb"] = rec["peak_rss_mb"] if rec else None
        row["rss_vs_torch"] = rec["peak_rss_mb"] / rss["torch"]["peak_rss_mb"] if rec else None
    return {k: {f: v for f, v in r.items() if f != "labels"} for k, r in rss.items()}


def run_paths(args, ckpt: str, folder: str) -> Dict[str, str]:
    """The checkpoint and the export, relative to --work, the run folder: the record names no folder of the machine
    it ran on."""
    return {"checkpoint": os.path.relpath(ckpt, args.work), "onnx": os.path.relpath(folder, args.work)}


def main(argv=None) -> Dict:
    args = parse_args(argv)
    import torch

    from acl_fairseq.inference import hub as hub_mod

    torch.set_num_threads(args.threads)
    ckpt, data, sentences, gold, folder = _serving.load(args)
    hub = hub_mod.from_checkpoint(ckpt, data)
    if hub.regression:
        sys.exit("serve_speed: the checkpoint has a regression head; it measures accuracy, so give a classifier")
    folder = _serving.exported(hub, ckpt, folder)
    systems = make_systems(hub, folder, args.policy, args.threshold, args.threads)
    by_name = {s.name: s for s in systems}
    for b in (1, args.batch_size):
        _glue_runs.log(f"timing: batch {b}, {len(sentences)} sentences, {args.repeats} repeats of {len(systems)} "
                       "systems")
        measure(systems, sentences, b, args.repeats)
    rows = [row_of(s, by_name, b, gold, hub.num_layers) for b in (1, args.batch_size) for s in systems]
    rss = peak_memory(args, (ckpt, data, folder), sentences, rows)
    found = targets(rows, args.batch_size)
    setup = harness.header("serve_speed", args.threads, **run_paths(args, ckpt, folder), examples=len(sentences),
                           toy=args.toy,
                           policy=args.policy, threshold=args.threshold, threshold_source=args.threshold_source,
                           batch_sizes=[1, args.batch_size], repeats=args.repeats)
    result = {"benchmark": "serve_speed", "setup": setup, "rows": rows, "rss": rss, "targets": found}
    harness.print_noted_table(rows, COLUMNS, FORMATS)
    harness.print_targets(found, "# targets, on the wall clock; cpu: the same in process CPU time (steady under load)")
    if args.json:
        harness.write_json(args.json, result)
    return result


if __name__ == "__main__":
    common.quiet()
    main()
