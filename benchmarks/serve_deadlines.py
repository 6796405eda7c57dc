#!/usr/bin/env python3
"""The deadline sweep of issue 58: acl-serve under open-loop Poisson load at 25% to 200% of its full-depth
saturation, every request carrying a deadline of 2x, 3x or 5x the batch-1 median, for --deadline-policy answer and
fail and without a deadline, fp32 and int8: deadline-met rate, accuracy, mean exit layer, share of deadline exits,
p50/p99, 503s; every answer against acl-predict's at its exit layer.

    python benchmarks/serve_deadlines.py [--precision fp32 int8] [--policies answer fail] [--loads 0.25 0.5 1 1.5 2]
        [--deadlines 2 3 5] [--requests N] [--seconds 60] [--json benchmarks/results/serve_deadlines.json]
    python benchmarks/serve_deadlines.py --toy --precision fp32 --loads 0.5 --deadlines 3 --requests 48 --json PATH

Model, sentences and export: serve_load.py's (the MiniLM acl_cross_layer model, WORK/serve_speed/onnx, the 872 SST-2
dev sentences and their labels; ``--toy``: the toy model, for the test); one worker, refill, one thread, the policy
``--policy``/``--threshold``. The repository defines no held-out slice beside SST-2 dev: accuracy is on dev only.

Per precision: acl-predict's answers with the policy and at every fixed exit (benchmarks/load/deadline.py); then one
acl-serve per ``--policies`` value, ``--deadline-policy`` on its command line, every deadline of the sweep sent per
request in the load client's protocol (OIP, Triton's ``parameters.timeout``, microseconds). On the first server:
warm-up; the batch-1 reference, every sentence sent alone at full depth through the server (one caller, ``"policy":
"none"``): the median and the p99 of those latencies, **the median the unit of the deadlines**; the full-depth
saturation (a closed loop of 8 x max batch callers, ``"policy": "none"``), the unit of the loads; each load without a
deadline. On every server, each load x deadline: ``--requests`` Poisson arrivals (default one a sentence, in a
seeded order: each cell's accuracy is over all of dev), the same seeded schedule stretched to the rate, sending
stopped at ``--seconds``; the client judges each deadline from the scheduled send.

The default run (2 precisions x 5 loads x (1 + 3 deadlines x 2 policies) = 70 cells) takes about 20 minutes on 2 quiet
cores; the estimate is printed at the start and again once a precision's saturation is measured.
"""
import os
import sys
import tempfile
from typing import Dict

import common
import harness
from _serving import model_sentences_labels
from acl_runtime.engine import read_manifest
from load import deadline, flags, server, stats
from load.phases import SATURATION_BATCHES, Config, Phases

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv=None):
    p = harness.parser(__doc__, json="default: benchmarks/results/serve_deadlines.json (--toy: required)")
    p.add_argument("--precision", nargs="+", choices=["fp32", "int8"], default=["fp32", "int8"])
    p.add_argument("--policies", nargs="+", choices=list(deadline.POLICIES), default=list(deadline.POLICIES),
                   help="the servers' --deadline-policy, one server each a precision (default: %(default)s)")
    p.add_argument("--loads", type=float, nargs="+", default=list(deadline.LOADS),
                   help="offered loads, x the full-depth saturation (default: %(default)s)")
    p.add_argument("--deadlines", type=float, nargs="+", default=list(deadline.MULTIPLES),
                   help="deadlines, x the batch-1 median (default: %(default)s)")
    p.add_argument("--requests", type=int, default=0, help="Poisson arrivals a cell (0: one a sentence)")
    p.add_argument("--seconds", dest="max_seconds", type=float, default=60.0, help="sending stops after this, a cell")
    flags.add(p)
    args = p.parse_args(argv)
    flags.check(p, args, "serve_deadlines", args.toy, "--toy runs")
    if args.requests < 0 or args.max_batch < 1 or min(args.loads) <= 0 or min(args.deadlines) <= 0:
        p.error("--requests must be >= 0, --max-batch >= 1, --loads and --deadlines > 0")
    if SATURATION_BATCHES * args.max_batch > args.max_queue:
        p.error(f"--max-queue {args.max_queue}: the saturation loop keeps {SATURATION_BATCHES * args.max_batch} "
                "requests in flight; raise --max-queue, or saturation would count 503s")
    args.slo_ms = None  # a request without its own deadline has none
    return args


class Sweep:
    """One precision's sweep: acl-predict's references, then a server per --policies value; its cells, the batch-1
    reference and the saturation measured on the first server, each server's stop."""

    def __init__(self, args, precision: str, folder: str, sentences, gold, tmp: str):
        self.args, self.precision, self.folder, self.sentences, self.gold, self.tmp = \
            args, precision, folder, sentences, gold, tmp
        manifest = read_manifest(folder)
        self.labels = list(manifest["labels"] or [])
        self.refs = deadline.references(folder, precision, sentences, args, tmp, manifest["exit_layers"])
        self.cells, self.servers, self.measured, self.deadlines_ms = [], {}, None, {}

    def run(self) -> None:
        for policy in self.args.policies:
            try:
                self.serve(policy)
            except RuntimeError as e:  # one server's failure must not cost the others' cells
                print(f"# {self.precision} {policy}: failed: {e}", file=sys.stderr)
                self.cells.append({"precision": self.precision, "policy": policy, "deadline_x": None, "load": None,
                                   "failed": str(e)[-3000:]})

    def serve(self, policy: str) -> None:
        args, port = self.args, server.free_port()
        args.deadline_policy = policy
        command = server.server_command(args, True, self.precision, 1, self.folder, port)
        proc = server.start_server(command, os.path.join(self.tmp, "server.log"), port, args.ready_seconds)
        try:
            run = Phases(args, Config(True, self.precision, 1), self.sentences, port, proc, self.tmp)
            run.drive(args.max_batch, "warm", mode="closed", concurrency=args.max_batch)
            if self.measured is None:
                self.measure(run)
                for load in args.loads:
                    self.cell(run, None, load, None)
            for load in args.loads:
                for multiple in args.deadlines:
                    self.cell(run, policy, load, multiple)
        finally:
            self.servers[f"{self.precision} {policy}"] = server.stop_server(proc, args.stop_seconds)

    def measure(self, run: Phases) -> None:
        """The batch-1 reference (each sentence alone, full depth) and the full-depth saturation."""
        n, concurrency = len(self.sentences), SATURATION_BATCHES * self.args.max_batch
        alone = stats.summarize(run.drive(n, "alone", mode="closed", concurrency=1, parameters={"policy": "none"}),
                                None, n)
        full, _, _ = run.closed(max(2 * n, 4 * concurrency), "full", concurrency, run.reading(),
                                extra={"concurrency": concurrency}, parameters={"policy": "none"})
        if not alone["p50_ms"] or full["throughput_per_s"] <= 0:
            raise RuntimeError(f"serve_deadlines: {self.precision}: no batch-1 latency or no full-depth throughput")
        self.measured = {"batch1": alone, "full_depth_saturation": full}
        self.deadlines_ms = {m: m * alone["p50_ms"] for m in self.args.deadlines}
        left = deadline.estimate_seconds(full["throughput_per_s"], alone["p50_ms"], n, 0, self.args, measured=True)
        print(f"# {self.precision}: full-depth saturation {full['throughput_per_s']:.1f}/s, batch-1 median "
              f"{alone['p50_ms']:.2f} ms (p99 {alone['p99_ms']:.2f} ms): deadlines "
              + ", ".join(f"{m:g}x = {ms:.1f} ms" for m, ms in self.deadlines_ms.items())
              + f"; its cells: about {left / 60:.0f} min", flush=True)

    def cell(self, run: Phases, policy, load: float, multiple) -> None:
        ms = None if multiple is None else self.deadlines_ms[multiple]
        what = f"{load:.0%} load, " + ("no deadline" if ms is None else f"{policy}, {multiple:g}x = {ms:.1f} ms")
        start, timeout = len(run.records), None if ms is None else {"timeout": max(1, round(ms * 1e3))}  # us
        phase = run.open_loop(load * self.measured["full_depth_saturation"]["throughput_per_s"], what,
                              f"{load}-{multiple}", parameters=timeout)
        row = deadline.cell(phase, run.records[start:], self.refs, self.gold, self.labels, self.args.atol, ms,
                            self.deadlines_ms)
        self.cells.append({"precision": self.precision, "policy": policy, "deadline_x": multiple, "deadline_ms": ms,
                           "load": load, **row, "split": phase.get("split")})

    def record(self, wall_s: float) -> Dict:
        """The batch-1 reference, the saturation, the deadlines (ms, and over the batch-1 p99), the references'
        accuracy."""
        p99 = (self.measured or {}).get("batch1", {}).get("p99_ms")
        return {**(self.measured or {}), "deadlines_ms": {f"{m:g}": ms for m, ms in self.deadlines_ms.items()},
                "deadlines_over_batch1_p99": {f"{m:g}": ms / p99 for m, ms in self.deadlines_ms.items()} if p99 else {},
                "references": deadline.reference_summary(self.refs, self.gold), "wall_s": wall_s}


def main(argv=None) -> Dict:
    args = parse_args(argv)
    folder, sentences, gold = model_sentences_labels(args)
    args.requests = args.requests or len(sentences)
    exits = len(read_manifest(folder)["exit_layers"])
    setup = harness.header("serve_deadlines", threads=1, onnx=os.path.relpath(folder, args.work),
                           sentences=len(sentences), toy=args.toy, policy=args.policy, threshold=args.threshold,
                           policies=args.policies, loads=args.loads, deadlines=args.deadlines, requests=args.requests)
    priors = {p: deadline.prior(p, os.path.join(RESULTS, "serve_load.json")) for p in args.precision}
    total = sum(deadline.estimate_seconds(q["full_per_s"], q["batch1_ms"], len(sentences), exits, args)
                for q in priors.values())
    print(f"# estimate: about {total / 60:.0f} min (full-depth rates and batch-1 latency from "
          f"{', '.join(sorted({q['source'] for q in priors.values()}))})", flush=True)
    per_precision, cells, servers = {}, [], {}
    with tempfile.TemporaryDirectory(prefix="serve_deadlines_") as tmp:
        for precision in args.precision:
            started = harness.now()
            sweep = Sweep(args, precision, folder, sentences, gold, tmp)
            sweep.run()
            per_precision[precision] = sweep.record(harness.since(started)[0])
            cells, servers = cells + sweep.cells, {**servers, **sweep.servers}
    found = deadline.verdicts(cells, servers, args.precision)
    record = {"benchmark": "serve_deadlines",
              "setup": {**setup, "max_batch": args.max_batch, "max_queue": args.max_queue, "max_seconds":
                        args.max_seconds, "seed": args.seed, "atol": args.atol, "threads_per_worker": 1,
                        "deadline_unit": "the batch-1 median: each sentence sent alone at full depth through the "
                                         "server", "held_out": None},
              "precisions": per_precision, "servers": servers, "cells": cells, "verdicts": found}
    harness.report(cells, deadline.COLUMNS, deadline.FORMATS, None)
    harness.print_targets([t for t in found if not t.get("goal")])
    deadline.print_goals(found, args.precision, setup["cpu_kind"])
    harness.write_json(args.json, record)
    print(deadline.plot(cells, args.precision, args.plot) or f"# plot: {args.plot}")
    return record


if __name__ == "__main__":
    common.quiet()
    main()
