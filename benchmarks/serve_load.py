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

Per configuration the server (``acl-serve``, one thread a worker) is started on a free loopback port and the
client (benchmarks/load/client.py, its own process, asyncio and a connection pool that grows) drives it:
- warm-up: ``max_batch`` requests, discarded;
- saturation: a closed loop of ``--concurrency`` callers (default 8 x max batch x workers: with refill a worker's
  rows wait in one queue per layer, so it takes a full batch for the embeddings and each of the MiniLM's 6 layers,
  and one more, to keep every layer's batch full) over the sentences in a
  seeded order; throughput counted between the ``concurrency``-th answer and the ``concurrency``-th last, so the
  ramp and the drain are left out;
- the same closed loop with ``"policy": "none"`` on every request: the same server at full depth (same HTTP, JSON
  and tokenization), the reference that measures the scheduler alone;
- each rate of ``--rates`` x saturation: ``--requests`` Poisson arrivals (send times drawn up front, seeded; the
  same schedule stretched for every rate), sending stopped at ``--max-seconds``. Latency counts from the scheduled
  send time;
- without refill, also refill's own offered rates (requests/s, from the configuration of the same precision and
  workers run before it; those above this configuration's saturation are recorded as skipped): each one's
  fractions are of its own saturation, and refill's is higher, so only these compare the two at the same load;
  with ``--interleave N`` in their place, after all configurations: both servers live at once and refill's rates
  run on each in turn, N rounds, the median ratio judged (benchmarks/load/pair.py).

The reference is measured in this process, interleaved with the load (the server idle meanwhile), so that both
see the same machine: once just before and once just after the saturation phase, the same precision's Engine at one
thread runs every sentence full-depth in batches of ``--max-batch``, then with early exit, then a subset full-depth
at batch 1; the reference is the mean of the two rounds (the JSON keeps each). It times the engine only (ids
tokenized up front), the server's HTTP, JSON and tokenization count against it. The layer speed-up is layers / the
mean exit layer of the answers served at saturation.

Where the time goes: before and after the saturation phase and each rate, /metrics' ``acl_request_phase_seconds``
(read, tokenize, queue, model, schedule, handoff, answer, other) gives each phase's mean ms a request and its share, and
``acl_model_seconds_total`` against the workers' CPU seconds (/proc) the share of their CPU time outside the model
(``split`` in the JSON). The client's own CPU share is ``client_cpu_share`` (it shares the cores with the server).

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
import random
import sys
import tempfile
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import _glue_runs
import common
import harness
from _serving import add_model_flags, check_model_flags, load, model_and_sentences
from acl_runtime import calibration, console, deadlines, exits
from acl_runtime.io import atomic
from load import client, pair, server, stats

RATES = (0.25, 0.5, 0.75, 1.0, 1.25)
SATURATION_BATCHES = 8  # closed-loop callers per worker, in max batches: a full batch per queue, and one more
COLUMNS = ["config", "phase", "offered_per_s", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "n_503", "errors",
           "lost", "mean_exit_layer", "peak_rss_mb"]
FORMATS = {"offered_per_s": "{:.1f}", "throughput_per_s": "{:.1f}", "p50_ms": "{:.1f}", "p95_ms": "{:.1f}",
           "p99_ms": "{:.1f}", "mean_exit_layer": "{:.2f}", "peak_rss_mb": "{:.0f}"}


class Config(NamedTuple):
    refill: bool
    precision: str
    workers: int

    @property
    def name(self) -> str:
        return f"{'refill' if self.refill else 'no-refill'} {self.precision} w{self.workers}"


# ---- the reference -------------------------------------------------------------------------------


class Reference:
    """The same precision's Engine in this process, one thread: full-depth and early-exit passes over all
    sentences in batches of ``max_batch``, and full depth at batch 1 on a seeded subset. Each :meth:`round` adds
    one measurement of each."""

    def __init__(self, folder: str, precision: str, sentences: List[str], args):
        from acl_runtime.engine import Engine

        self.engine = Engine(folder, precision, threads=1)
        self.ids = [self.engine.encode_with_info(s)[0] for s in sentences]
        k = min(args.batch1_sentences, len(self.ids))
        self.single = [self.ids[i] for i in sorted(random.Random(args.seed).sample(range(len(self.ids)), k))]
        self.max_batch, self.policy, self.threshold = args.max_batch, args.policy, args.threshold
        self.rounds: List[Dict] = []
        # the first calls of a session allocate for their shapes: untimed, so that the first round is not slower
        self._pass(self.ids[: 2 * self.max_batch], self.max_batch, None)
        self._pass(self.single[:4], 1, None)

    def _pass(self, ids, batch: int, policy) -> tuple:
        seconds, (_, layers) = harness.wall(lambda: self.engine.run_batches(self.engine.make_batches(ids, batch),
                                                                            len(ids),
                                                                            policy, self.threshold if policy else None))
        return seconds, float(layers.mean())

    def round(self) -> None:
        full, _ = self._pass(self.ids, self.max_batch, None)
        early, layer = self._pass(self.ids, self.max_batch, self.policy)
        single = [self._pass([ids], 1, None)[0] for ids in self.single]
        self.rounds.append({"full_batched_per_s": len(self.ids) / full, "exit_batched_per_s": len(self.ids) / early,
                            "exit_mean_layer": layer, "batch1_ms": 1000 * stats.percentile(single, 50)})

    def summary(self) -> Dict:
        keys = self.rounds[0].keys()
        return {**{k: sum(r[k] for r in self.rounds) / len(self.rounds) for k in keys}, "rounds": self.rounds,
                "sentences": len(self.ids), "batch1_sentences": len(self.single)}


# ---- one configuration ---------------------------------------------------------------------------


def run_config(args, cfg: Config, folder: str, sentences: List[str], ref: Reference, expected: List[Dict],
               labels: List[str], tmp: str, same_rates: Sequence[Tuple[float, float]] = ()) -> Dict:
    """Warm-up, a reference round, saturation, a reference round, the offered rates, then ``same_rates`` ((refill's
    fraction, its offered rate per s): refill's rates, run again without refill); then the workers' peaks and a
    SIGTERM. The sentences go in one seeded order, repeated as far as each phase needs."""
    order = list(range(len(sentences)))
    random.Random(args.seed).shuffle(order)

    def cycle(n):
        return [order[i % len(order)] for i in range(n)]

    started = harness.now()
    port = server.free_port()
    log = os.path.join(tmp, "server.log")
    _glue_runs.log(f"{cfg.name}: acl-serve on 127.0.0.1:{port}")
    command = server.server_command(args, cfg.refill, cfg.precision, cfg.workers, folder, port)
    proc = server.start_server(command, log, port, args.ready_seconds)
    records = []
    try:
        concurrency = args.concurrency or SATURATION_BATCHES * args.max_batch * cfg.workers
        warm = server.drive(server.phase_spec(args, port, sentences, cycle(args.max_batch), f"{cfg.name}/warm",
                                              mode="closed", concurrency=args.max_batch), tmp)
        ref.round()
        before, cpu_before = server.metrics(port), server.cpu_seconds(proc.pid, cfg.workers)
        n_sat = args.saturation_requests or max(2 * len(sentences), 4 * concurrency)
        out = server.drive(server.phase_spec(args, port, sentences, cycle(n_sat), f"{cfg.name}/sat", mode="closed",
                                             concurrency=concurrency), tmp)
        after, cpu_after = server.metrics(port), server.cpu_seconds(proc.pid, cfg.workers)
        records += out["records"]
        saturation = {**stats.summarize(out, None, n_sat),
                      "throughput_per_s": stats.steady_throughput(out, concurrency), "concurrency": concurrency,
                      "split": outside_model(stats.split_between(before, after), cpu_before, cpu_after)}
        # the same server at full depth ("policy": "none" on each request): the scheduler's own reference
        full = server.drive(server.phase_spec(args, port, sentences, cycle(n_sat), f"{cfg.name}/full", mode="closed",
                                              concurrency=concurrency, parameters={"policy": "none"}), tmp)
        after_full, cpu_after_full = server.metrics(port), server.cpu_seconds(proc.pid, cfg.workers)
        ref.round()
        full_depth = {**stats.summarize(full, None, n_sat),
                      "throughput_per_s": stats.steady_throughput(full, concurrency),
                      "split": outside_model(stats.split_between(after, after_full), cpu_after, cpu_after_full)}
        if saturation["throughput_per_s"] <= 0:
            raise RuntimeError(f"serve_load: {cfg.name}: no answer at saturation; the server's log ends:\n"
                               f"{server.tail(log)}")
        unit = client.poisson_offsets(1.0, args.requests, float("inf"), args.seed)

        def open_loop(rate: float, what: str, tag: str) -> Dict:
            offsets = [t / rate for t in unit if t / rate < args.max_seconds]
            _glue_runs.log(f"{cfg.name}: {what}, {rate:.1f}/s, {len(offsets)} requests")
            start = server.metrics(port)
            out = server.drive(server.phase_spec(args, port, sentences, cycle(len(offsets)), f"{cfg.name}/{tag}",
                                                 mode="open", offsets=offsets), tmp)
            records.extend(out["records"])
            return {**stats.summarize(out, rate, len(unit)), "split": stats.split_between(start, server.metrics(port))}

        rates = [{"fraction": f, **open_loop(f * saturation["throughput_per_s"], f"{f:.0%} of saturation", str(f))}
                 for f in args.rates]
        same = []  # without refill: refill's own offered rates, those this configuration can carry
        for fraction, rate in same_rates:
            if rate > saturation["throughput_per_s"]:
                same.append({"refill_fraction": fraction, "offered_per_s": rate,
                             "skipped": "above this configuration's saturation"})
            else:
                same.append({"refill_fraction": fraction,
                             **open_loop(rate, f"refill's {fraction:.0%}", f"refill-{fraction}")})
        counted = server.metrics(port)
        rss = server.worker_rss(proc.pid, cfg.workers)
    finally:
        stopped = server.stop_server(proc, args.stop_seconds)
    if stopped["exit_code"] or any(p["errors"] for p in [saturation] + rates + stats.carried(same)):
        print(f"# {cfg.name}: errors or exit code {stopped['exit_code']}; the server's log ends:\n{server.tail(log)}",
              file=sys.stderr)
    answered = [r for r in records if r["status"] == 200 and r["id_ok"]]
    metrics = None if counted is None else {"answered": counted["answered"],
                                           "fill_saturation": stats.fill_between(before, after),
                                           "fill_all_phases": stats.fill_between(None, counted)}
    return {"config": cfg.name, **cfg._asdict(), "saturation": saturation, "full_depth_served": full_depth,
            "rates": rates, "same_rate_as_refill": same,
            "reference": ref.summary(), "mean_exit_layer": saturation["mean_exit_layer"],
            "layer_speedup": ref.engine.num_layers / saturation["mean_exit_layer"],
            "all_phases_mean_exit_layer": sum(r["exit_layer"] for r in answered) / max(1, len(answered)),
            "peak_rss_mb_per_worker": rss["per_worker_mb"], "peak_rss_mb_supervisor": rss["supervisor_mb"],
            "server_processes": rss["processes"], "server": stopped, "metrics": metrics,
            "answers": stats.compare_answers(records, expected, labels, args.atol),
            "client_answered": sum(1 for r in warm["records"] + full["records"] + records if r["status"]),
            "wall_s": harness.since(started)[0]}


def outside_model(split: Optional[Dict], cpu_before: Optional[float], cpu_after: Optional[float]) -> Optional[Dict]:
    """The saturation phase's split, with the workers' CPU seconds and the share of them spent outside the
    backend calls (HTTP, JSON, tokenization, scheduling: everything but the model; CPU against CPU, so that a
    loaded machine's waits count on neither side)."""
    if split is None:
        return None
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    outside = None if not cpu else 1 - split["model_cpu_seconds"] / cpu
    return {**split, "worker_cpu_seconds": cpu, "cpu_share_outside_model": outside}


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
    p.add_argument("--toy", action="store_true", help="serve_speed.py's toy model (tests); needs its own --json")
    p.add_argument("--server", default=server.tool("acl-serve"), help="the acl-serve executable (default: %(default)s)")
    p.add_argument("--policy", default="entropy", choices=list(exits.POLICIES), help="early-exit policy")
    p.add_argument("--threshold", type=float, help="its threshold (default: the policy table's, 0.3 for entropy)")
    p.add_argument("--calibrate", type=_budget, metavar="BUDGET", help="serve at the --policy threshold that "
                   "acl-evaluate --calibrate BUDGET picks from the checkpoint's sweep (e.g. max-drop=1.0), in place "
                   "of --threshold")
    p.add_argument("--max-batch", type=int, default=32, help="the server's --max-batch and the reference's batch")
    p.add_argument("--slo-ms", type=float, help="the server's --slo-ms (default: none)")
    p.add_argument("--deadline-policy", choices=list(deadlines.POLICIES), default="delay", help="the server's "
                   "--deadline-policy (default: %(default)s, the deadline only orders the queues, as the records "
                   "made before deadline exits ran: every answer is then acl-predict's)")
    p.add_argument("--max-queue", type=int, default=512, help="the server's --max-queue (rows; default %(default)s)")
    p.add_argument("--rates", type=float, nargs="+", default=list(RATES), help="offered loads, x saturation")
    p.add_argument("--requests", type=int, default=872, help="Poisson arrivals per rate (bounded by --max-seconds)")
    p.add_argument("--saturation-requests", type=int, default=0, help="0: two passes over the sentences")
    p.add_argument("--concurrency", type=int, default=0, help="closed-loop callers (0: 8 x max batch x workers)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="sending stops after this, per phase")
    p.add_argument("--drain-seconds", type=float, default=30.0, help="answers later than this are lost")
    p.add_argument("--batch1-sentences", type=int, default=200, help="the batch-1 reference's subset")
    p.add_argument("--atol", type=float, default=1e-5, help="probabilities equal to acl-predict's within this")
    p.add_argument("--interleave", type=int, default=0, metavar="N",
                   help="compare refill with no refill at refill's offered rates on two live servers, the phases "
                   "alternated, N rounds, medians (benchmarks/load/pair.py); in place of the no-refill "
                   "configurations' single same-rate phases (default 0: those)")
    p.add_argument("--seed", type=int, default=1, help="the arrivals, the sentence order, the batch-1 subset")
    p.add_argument("--examples", type=int, default=0, help="first N dev sentences (0: all; --quick: 128)")
    p.add_argument("--ready-seconds", type=float, default=120.0, help="start-up bound of the server")
    p.add_argument("--stop-seconds", type=float, default=30.0, help="SIGTERM bound of the server")
    add_model_flags(p)
    p.add_argument("--export", action="store_true", help="export the model again (fp32 and int8) even if "
                   "neither the checkpoint nor the exporter's code has changed")
    p.add_argument("--plot", help="default: the --json path with .png")
    args = p.parse_args(argv)
    if args.calibrate and args.threshold is not None:
        p.error("--calibrate chooses the threshold: leave --threshold out")
    console.check_request_flags(p, args, fill_default=True)
    if args.quick:
        args.examples = args.examples or 128
        args.requests, args.batch1_sentences = min(args.requests, 48), min(args.batch1_sentences, 16)
    results = os.path.abspath(os.path.join(_glue_runs.REPO, "benchmarks", "results"))
    if args.quick or args.toy:
        if not args.json or os.path.abspath(args.json).startswith(results + os.sep):
            p.error("--quick and --toy need their own --json outside benchmarks/results: a smoke run's numbers must "
                    "not replace the real ones")
    args.json = args.json or os.path.join(results, "serve_load.json")
    args.plot = args.plot or os.path.splitext(args.json)[0] + ".png"
    p.refuse_existing(args)
    check_model_flags(p, args)
    if min(args.workers) < 1 or args.max_batch < 1 or args.requests < 1 or min(args.rates) <= 0:
        p.error("--workers, --max-batch and --requests must be >= 1, --rates > 0")
    if args.interleave < 0:
        p.error(f"--interleave {args.interleave}: rounds must be >= 0 (0: no interleaved comparison)")
    for w in args.workers:
        need = args.concurrency or SATURATION_BATCHES * args.max_batch * w
        if need > args.max_queue * w:
            p.error(f"--max-queue {args.max_queue}: the saturation loop keeps {need} requests in flight on {w} "
                    "worker(s); raise --max-queue or lower --concurrency, or saturation would count 503s")
    if not os.path.exists(args.server):
        p.error(f"--server {args.server}: not found; install acl-serve (pip install -e .[serve]) or name it")
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
    atomic.write_json(args.json, record)
    print(plot(results, args.plot) or f"# plot: {args.plot}")
    return record


if __name__ == "__main__":
    common.quiet()
    main()
