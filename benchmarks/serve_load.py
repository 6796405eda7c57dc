#!/usr/bin/env python3
"""Load on acl-serve: open-loop Poisson arrivals from a separate client process, at 25% to 125% of the measured
saturation, for refill on and off, fp32 and int8, 1 and 2 workers, with its targets.

    python benchmarks/serve_load.py [--refill on off] [--precision fp32 int8] [--workers 1 2] [--quick]
        [--json benchmarks/results/serve_load.json] [--plot benchmarks/results/serve_load.png]
    python benchmarks/serve_load.py --quick --refill on --precision fp32 --workers 1 --json /tmp/load.json
    python benchmarks/serve_load.py --calibrate max-drop=1.0 --json benchmarks/results/serve_load_calibrated.json
    python benchmarks/serve_load.py --workers 1 --rates 0.25 0.5 --interleave 5 --json PATH

Model and data: serve_speed.py's (the predict_speed MiniLM acl_cross_layer model, exported once with its int8
copy into WORK/serve_speed/onnx; ``--toy``: the toy model, for the test), the 872 SST-2 dev sentences, policy
``--policy``/``--threshold`` on the server's command line. acl-predict runs once per precision on the same
sentences (JSONL, so that every string is sent as it is served); every served answer is compared with its row.

Per configuration (benchmarks/load/phases.py): acl-serve on a free loopback port, driven by a client process
(benchmarks/load/client.py) through warm-up, saturation (a closed loop), the same server at full depth, each rate
of ``--rates`` x saturation (open-loop Poisson arrivals), and without refill also refill's own offered rates
(``--interleave N``: both servers live at once, N rounds, benchmarks/load/pair.py); between them the same
precision's Engine in this process is the reference, and /metrics with the workers' CPU seconds tell where the
time went.

Targets (printed with pass/miss): saturated throughput with refill >= 0.95 x layer speed-up x the same server's
full-depth throughput (the scheduler alone), and >= 0.9 x layer speed-up x the bare engine's full-depth batched
throughput x workers (the whole service; 0.95: the moonshot), both ratios reported without refill; p99 at 50% of
saturation <= 3 x the full-depth batch-1 latency (its median); p99 with refill <= p99 without at each of refill's
offered rates that no refill carries; every answer equal to acl-predict's (label, exit
layer, probabilities within ``--atol``); no request lost or answered twice (each answer carries its request's id,
and the server's /metrics count of answers equals the client's); no 5xx but 503, no 4xx; SIGTERM ends the server
with exit code 0.
``peak_rss_mb``: the largest worker's VmHWM (/proc) before the server stops; the JSON has each worker's, and with
several workers the supervisor's; also each layer's batch fill during saturation (/metrics).

The full run (8 configurations, 872 sentences) takes about 15 minutes on 2 quiet cores (``wall_s`` per
configuration in the JSON). The cached WORK/serve_speed/onnx is exported again when the checkpoint or the exporter's
code changed (_serving.export_source), or with ``--export`` (a note names a dynamic, batch-dependent int8 copy).
"""
import argparse
import json
import os
import sys
import tempfile
from typing import Dict, List, Optional

import common
import harness
from _serving import load, model_and_sentences
from acl_runtime import calibration, deadlines
from acl_runtime.io import atomic
from load import flags, pair, server, stats
from load.phases import SATURATION_BATCHES, Config, Reference, run_config

RATES = (0.25, 0.5, 0.75, 1.0, 1.25)
COLUMNS = ["config", "phase", "offered_per_s", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "n_503", "errors",
           "lost", "mean_exit_layer", "peak_rss_mb"]
FORMATS = {"offered_per_s": "{:.1f}", "throughput_per_s": "{:.1f}", "p50_ms": "{:.1f}", "p95_ms": "{:.1f}",
           "p99_ms": "{:.1f}", "mean_exit_layer": "{:.2f}", "peak_rss_mb": "{:.0f}"}


# ---- report --------------------------------------------------------------------------------------


def table_rows(results: List[Dict]) -> List[Dict]:
    rows = []
    for res in results:
        if res.get("failed"):
            rows.append({"config": res["config"], "phase": "failed"})
            continue
        rss = max(res["peak_rss_mb_per_worker"], default=None)
        full = [("full depth", res["full_depth_served"])] if "full_depth_served" in res else []
        phases = [("saturation", res["saturation"])] + full + [(f"{r['fraction']:.0%}", r) for r in res["rates"]] + \
            [(f"refill's {r['refill_fraction']:.0%}", r) for r in stats.carried(res.get("same_rate_as_refill", []))]
        for phase, p in phases:
            rows.append({"config": res["config"], "phase": phase, **{k: p.get(k) for k in COLUMNS[2:-1]},
                         "peak_rss_mb": rss})
    return rows


def plot(results: List[Dict], path: str) -> Optional[str]:
    """p50 and p99 latency against the offered load (fraction of saturation), one colour per configuration."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, res in enumerate(r for r in results if not r.get("failed")):
        xs = [r["fraction"] for r in res["rates"]]
        for q, style in (("p50_ms", ":"), ("p99_ms", "-")):
            ax.plot(xs, [r[q] for r in res["rates"]], style, marker="o", color=f"C{k}",
                    label=f"{res['config']} {q[:3]}")
    ax.set_xlabel("offered load (fraction of the configuration's saturated throughput)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic.write_through(path, fig.savefig)
    plt.close(fig)
    return None


# ---- main ----------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = harness.parser(__doc__, json="default: benchmarks/results/serve_load.json (--quick, --toy: required)")
    p.add_argument("--refill", nargs="+", choices=["on", "off"], default=["on", "off"], help="scheduler refill")
    p.add_argument("--precision", nargs="+", choices=["fp32", "int8"], default=["fp32", "int8"])
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2], help="server worker processes")
    p.add_argument("--quick", action="store_true",
                   help="a smoke check: 128 sentences, 48 requests a rate, saturation over 4 x concurrency")
    p.add_argument("--calibrate", type=_budget, metavar="BUDGET", help="serve at the --policy threshold that "
                   "acl-evaluate --calibrate BUDGET picks from the checkpoint's sweep (e.g. max-drop=1.0), in place "
                   "of --threshold")
    p.add_argument("--slo-ms", type=float, help="the server's --slo-ms (default: none)")
    p.add_argument("--deadline-policy", choices=list(deadlines.POLICIES), default="delay", help="the server's "
                   "--deadline-policy (default: %(default)s, the deadline only orders the queues, as the records "
                   "made before deadline exits ran: every answer is then acl-predict's)")
    p.add_argument("--rates", type=float, nargs="+", default=list(RATES), help="offered loads, x saturation")
    p.add_argument("--requests", type=int, default=872, help="Poisson arrivals per rate (bounded by --max-seconds)")
    p.add_argument("--saturation-requests", type=int, default=0, help="0: two passes over the sentences")
    p.add_argument("--concurrency", type=int, default=0, help="closed-loop callers (0: 8 x max batch x workers)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="sending stops after this, per phase")
    p.add_argument("--batch1-sentences", type=int, default=200, help="the batch-1 reference's subset")
    p.add_argument("--interleave", type=int, default=0, metavar="N",
                   help="compare refill with no refill at refill's offered rates on two live servers, the phases "
                   "alternated, N rounds, medians (benchmarks/load/pair.py); in place of the no-refill "
                   "configurations' single same-rate phases (default 0: those)")
    flags.add(p)
    args = p.parse_args(argv)
    if args.calibrate and args.threshold is not None:
        p.error("--calibrate chooses the threshold: leave --threshold out")
    if args.quick:
        args.examples = args.examples or 128
        args.requests, args.batch1_sentences = min(args.requests, 48), min(args.batch1_sentences, 16)
    flags.check(p, args, "serve_load", args.quick or args.toy, "--quick and --toy")
    if min(args.workers) < 1 or args.max_batch < 1 or args.requests < 1 or min(args.rates) <= 0:
        p.error("--workers, --max-batch and --requests must be >= 1, --rates > 0")
    if args.interleave < 0:
        p.error(f"--interleave {args.interleave}: rounds must be >= 0 (0: no interleaved comparison)")
    for w in args.workers:
        need = args.concurrency or SATURATION_BATCHES * args.max_batch * w
        if need > args.max_queue * w:
            p.error(f"--max-queue {args.max_queue}: the saturation loop keeps {need} requests in flight on {w} "
                    "worker(s); raise --max-queue or lower --concurrency, or saturation would count 503s")
    return args


def _budget(text: str):
    try:
        return calibration.parse_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def calibrated(args) -> Dict:
    """The setting that ``--calibrate`` picks from the acl-evaluate sweep beside the checkpoint (the recipes
    runner writes it); args.threshold becomes its threshold."""
    sweep = os.path.join(os.path.dirname(os.path.abspath(load(args)[0])), "early_exit", "early_exit.json")
    if not os.path.isfile(sweep):
        raise SystemExit(f"serve_load: --calibrate: no acl-evaluate sweep at {sweep}: run acl-evaluate on the "
                         "checkpoint first")
    with open(sweep, encoding="utf-8") as f:
        try:
            chosen = calibration.choose(json.load(f), args.calibrate, args.policy)
        except calibration.Unmet as e:
            raise SystemExit(f"serve_load: --calibrate {args.calibrate}: {e}") from None
    args.threshold = chosen["threshold"]
    return {"budget": str(args.calibrate), "sweep": os.path.relpath(sweep, args.work), "policy": chosen["policy"],
            "threshold": chosen["threshold"], "layer_speedup": chosen["layer_speedup"], "metrics": chosen["metrics"]}


def int8_method(folder: str) -> Optional[Dict]:
    """How the folder's int8 copy was made (its manifest's record), with a warning when its answers depend on the
    batch: the served ones then cannot all equal acl-predict's."""
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
        method = (json.load(f).get("quantized") or {}).get("int8", {}).get("method")
    if method and method.get("kind") == "dynamic":
        print(f"# note: the int8 copy in {folder} is dynamic quantization (activations scaled per call): its answers "
              "depend on the batch; pass --export to export it again with the current acl-export --quantize int8")
    return method


def setup_record(args, folder: str, n: int) -> Dict:

    return {"onnx": os.path.relpath(folder, args.work), "int8_method": args.int8_method, "sentences": n,
            "toy": args.toy, "quick": args.quick, "policy": args.policy, "threshold": args.threshold,
            "calibrated": args.calibrated, "max_batch": args.max_batch, "max_queue": args.max_queue,
            "slo_ms": args.slo_ms, "deadline_policy": args.deadline_policy, "rates": args.rates,
            "requests": args.requests,
            "max_seconds": args.max_seconds,
            "concurrency": args.concurrency or f"{SATURATION_BATCHES} x max_batch x workers",
            "seed": args.seed, "atol": args.atol, "threads_per_worker": 1, **harness.record(threads=1)}


def main(argv=None) -> Dict:
    args = parse_args(argv)
    folder, sentences = model_and_sentences(args)
    args.calibrated = calibrated(args) if args.calibrate else None
    args.int8_method = int8_method(folder) if "int8" in args.precision else None
    configs = [Config(r == "on", p, w) for r in args.refill for p in args.precision for w in args.workers]
    results = []
    with tempfile.TemporaryDirectory(prefix="serve_load_") as tmp:
        expected = {p: server.acl_predict(folder, p, sentences, args, tmp) for p in args.precision}
        refs = {p: Reference(folder, p, sentences, args) for p in args.precision}
        labels = refs[args.precision[0]].engine.label_names()
        for cfg in configs:
            ref = refs[cfg.precision]
            ref.rounds = []
            try:
                results.append(run_config(args, cfg, folder, sentences, ref, expected[cfg.precision], labels, tmp,
                                          same_rates=[] if args.interleave or cfg.refill else
                                          pair.refill_rates(results, cfg.precision, cfg.workers)))
            except RuntimeError as e:  # one configuration's failure must not cost the others' measurements
                print(f"# {cfg.name}: failed: {e}", file=sys.stderr)
                results.append({"config": cfg.name, **cfg._asdict(), "failed": str(e)[-3000:]})
        pairs = pair.pairs(args, results, folder, sentences, tmp) if args.interleave else []
    found = stats.verdicts(results, len(sentences)) + pair.verdicts(pairs)
    record = {"benchmark": "serve_load", "setup": setup_record(args, folder, len(sentences)), "results": results,
              "interleaved": pairs, "verdicts": found}
    print(f"# serve_load: {len(sentences)} sentences of {'the toy task' if args.toy else 'SST-2 dev'}, policy "
          f"{args.policy} {args.threshold}, max batch {args.max_batch}, one thread a worker, {os.cpu_count()} cpus")
    harness.print_noted_table(table_rows(results), COLUMNS, FORMATS)
    if pairs:
        print("# interleaved rounds: refill / no refill at the same offered rate")
        harness.print_noted_table(pair.round_rows(pairs), pair.ROUND_COLUMNS, pair.ROUND_FORMATS)
    harness.print_targets(found)
    harness.write_json(args.json, record)
    print(plot(results, args.plot) or f"# plot: {args.plot}")
    return record


if __name__ == "__main__":
    common.quiet()
    main()
