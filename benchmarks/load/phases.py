"""One configuration of benchmarks/serve_load.py against a live acl-serve: its phases, the reference engine
measured in this process between them, the workers' peaks and the stop.

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
"""
import os
import random
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import _glue_runs
import harness

from . import client, server, stats

SATURATION_BATCHES = 8  # closed-loop callers per worker, in max batches: a full batch per queue, and one more


class Config(NamedTuple):
    refill: bool
    precision: str
    workers: int

    @property
    def name(self) -> str:
        return f"{'refill' if self.refill else 'no-refill'} {self.precision} w{self.workers}"


class Reference:
    """The same precision's Engine in this process, one thread: full-depth and early-exit passes over all
    sentences in batches of ``max_batch``, and full depth at batch 1 on a seeded subset (``--batch1-sentences``;
    the median request alone, ``batch1_ms``, and the p99 of requests alone, ``batch1_p99_ms``). Each
    :meth:`round` adds one measurement of each."""

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
                            "exit_mean_layer": layer, "batch1_ms": 1000 * stats.percentile(single, 50),
                            "batch1_p99_ms": 1000 * stats.percentile(single, 99)})

    def summary(self) -> Dict:
        keys = self.rounds[0].keys()
        return {**{k: sum(r[k] for r in self.rounds) / len(self.rounds) for k in keys}, "rounds": self.rounds,
                "sentences": len(self.ids), "batch1_sentences": len(self.single)}


class Phases:
    """The phases of one configuration on its live server: the client's runs (each sentence in one seeded order,
    repeated as far as a phase needs), every answered record kept for the comparison with acl-predict."""

    def __init__(self, args, cfg: Config, sentences: List[str], port: int, proc, tmp: str):
        self.args, self.cfg, self.sentences, self.port, self.proc, self.tmp = args, cfg, sentences, port, proc, tmp
        self.order = list(range(len(sentences)))
        random.Random(args.seed).shuffle(self.order)
        self.records: List[Dict] = []
        self.unit = client.poisson_offsets(1.0, args.requests, float("inf"), args.seed)

    def drive(self, n: int, tag: str, **spec) -> Dict:
        cycle = [self.order[i % len(self.order)] for i in range(n)]
        return server.drive(server.phase_spec(self.args, self.port, self.sentences, cycle, f"{self.cfg.name}/{tag}",
                                              **spec), self.tmp)

    def reading(self) -> Tuple[Optional[Dict], Optional[float]]:
        """(/metrics, the workers' CPU seconds) now."""
        return server.metrics(self.port), server.cpu_seconds(self.proc.pid, self.cfg.workers)

    def closed(self, n: int, tag: str, concurrency: int, start: Tuple, keep: bool = False,
               extra: Optional[Dict] = None, **spec) -> Tuple[Dict, Dict, Tuple]:
        """A closed loop of ``concurrency`` callers over ``n`` requests after the reading ``start``: (its row, its
        output, the reading after it). The row has the steady throughput, ``extra`` and the split of the workers'
        CPU time; ``keep``: its records are compared with acl-predict's."""
        before, cpu_before = start
        out = self.drive(n, tag, mode="closed", concurrency=concurrency, **spec)
        after, cpu_after = self.reading()
        if keep:
            self.records += out["records"]
        row = {**stats.summarize(out, None, n), "throughput_per_s": stats.steady_throughput(out, concurrency),
               **(extra or {}), "split": outside_model(stats.split_between(before, after), cpu_before, cpu_after)}
        return row, out, (after, cpu_after)

    def open_loop(self, rate: float, what: str, tag: str, **spec) -> Dict:
        """The Poisson schedule stretched to ``rate`` per s, sending stopped at --max-seconds; ``spec``: more of the
        client's spec (``parameters``: every request's). Its records are appended to ``records``."""
        offsets = [t / rate for t in self.unit if t / rate < self.args.max_seconds]
        _glue_runs.log(f"{self.cfg.name}: {what}, {rate:.1f}/s, {len(offsets)} requests")
        start = server.metrics(self.port)
        out = self.drive(len(offsets), tag, mode="open", offsets=offsets, **spec)
        self.records.extend(out["records"])
        return {**stats.summarize(out, rate, len(self.unit)),
                "split": stats.split_between(start, server.metrics(self.port))}

    def same_rates(self, same_rates: Sequence[Tuple[float, float]], saturated: float) -> List[Dict]:
        """Without refill: refill's own offered rates, those this configuration can carry (the rest skipped)."""
        return [{"refill_fraction": fraction, "offered_per_s": rate, "skipped": "above this configuration's saturation"}
                if rate > saturated else
                {"refill_fraction": fraction, **self.open_loop(rate, f"refill's {fraction:.0%}", f"refill-{fraction}")}
                for fraction, rate in same_rates]


def run_config(args, cfg: Config, folder: str, sentences: List[str], ref: Reference, expected: List[Dict],
               labels: List[str], tmp: str, same_rates: Sequence[Tuple[float, float]] = ()) -> Dict:
    """Warm-up, a reference round, saturation, the same server at full depth ("policy": "none" on each request:
    the scheduler's own reference), a reference round, the offered rates, then ``same_rates`` ((refill's fraction,
    its offered rate per s): refill's rates, run again without refill); then the workers' peaks and a SIGTERM."""
    started, port, log = harness.now(), server.free_port(), os.path.join(tmp, "server.log")
    _glue_runs.log(f"{cfg.name}: acl-serve on 127.0.0.1:{port}")
    command = server.server_command(args, cfg.refill, cfg.precision, cfg.workers, folder, port)
    proc = server.start_server(command, log, port, args.ready_seconds)
    try:
        run = Phases(args, cfg, sentences, port, proc, tmp)
        got = measure_phases(run, ref, same_rates, log)
    finally:
        stopped = server.stop_server(proc, args.stop_seconds)
    phases = [got["saturation"]] + got["rates"] + stats.carried(got["same"])
    if stopped["exit_code"] or any(p["errors"] for p in phases):
        print(f"# {cfg.name}: errors or exit code {stopped['exit_code']}; the server's log ends:\n{server.tail(log)}",
              file=sys.stderr)
    record = config_record(run, ref, got, stopped, (expected, labels))
    record["wall_s"] = harness.since(started)[0]
    return record


def measure_phases(run: Phases, ref: Reference, same_rates: Sequence[Tuple[float, float]], log: str) -> Dict:
    """Each phase's output by name, from the warm-up to the workers' peaks (:func:`run_config`'s order); a server
    that answered nothing at saturation is an error that quotes its log's end."""
    args, cfg = run.args, run.cfg
    concurrency = args.concurrency or SATURATION_BATCHES * args.max_batch * cfg.workers
    warm = run.drive(args.max_batch, "warm", mode="closed", concurrency=args.max_batch)
    ref.round()
    n_sat = args.saturation_requests or max(2 * len(run.sentences), 4 * concurrency)
    before = run.reading()
    saturation, _, after = run.closed(n_sat, "sat", concurrency, before, keep=True,
                                      extra={"concurrency": concurrency})
    full_depth, full, _ = run.closed(n_sat, "full", concurrency, after, parameters={"policy": "none"})
    ref.round()
    saturated = saturation["throughput_per_s"]
    if saturated <= 0:
        raise RuntimeError(f"serve_load: {cfg.name}: no answer at saturation; the server's log ends:\n"
                           f"{server.tail(log)}")
    rates = [{"fraction": f, **run.open_loop(f * saturated, f"{f:.0%} of saturation", str(f))} for f in args.rates]
    same = run.same_rates(same_rates, saturated)
    counted, rss = server.metrics(run.port), server.worker_rss(run.proc.pid, cfg.workers)
    return {"warm": warm, "before": before, "saturation": saturation, "after": after, "full_depth": full_depth,
            "full": full, "rates": rates, "same": same, "counted": counted, "rss": rss}


def config_record(run: Phases, ref: Reference, got: Dict, stopped: Dict, truth: Tuple[List[Dict], List[str]]) -> Dict:
    """serve_load's record of one configuration from :func:`measure_phases`' outputs; ``truth`` is acl-predict's
    answers and the label names, that the served answers are compared with."""
    saturation, counted, rss = got["saturation"], got["counted"], got["rss"]
    answered = [r for r in run.records if r["status"] == 200 and r["id_ok"]]
    metrics = None if counted is None else {"answered": counted["answered"],
                                           "fill_saturation": stats.fill_between(got["before"][0], got["after"][0]),
                                           "fill_all_phases": stats.fill_between(None, counted)}
    return {"config": run.cfg.name, **run.cfg._asdict(), "saturation": saturation,
            "full_depth_served": got["full_depth"], "rates": got["rates"], "same_rate_as_refill": got["same"],
            "reference": ref.summary(), "mean_exit_layer": saturation["mean_exit_layer"],
            "layer_speedup": ref.engine.num_layers / saturation["mean_exit_layer"],
            "all_phases_mean_exit_layer": sum(r["exit_layer"] for r in answered) / max(1, len(answered)),
            "peak_rss_mb_per_worker": rss["per_worker_mb"], "peak_rss_mb_supervisor": rss["supervisor_mb"],
            "server_processes": rss["processes"], "server": stopped, "metrics": metrics,
            "answers": stats.compare_answers(run.records, truth[0], truth[1], run.args.atol),
            "client_answered": sum(1 for r in got["warm"]["records"] + got["full"]["records"] + run.records
                                   if r["status"])}


def outside_model(split: Optional[Dict], cpu_before: Optional[float], cpu_after: Optional[float]) -> Optional[Dict]:
    """The saturation phase's split, with the workers' CPU seconds and the share of them spent outside the
    backend calls (HTTP, JSON, tokenization, scheduling: everything but the model; CPU against CPU, so that a
    loaded machine's waits count on neither side)."""
    if split is None:
        return None
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    outside = None if not cpu else 1 - split["model_cpu_seconds"] / cpu
    return {**split, "worker_cpu_seconds": cpu, "cpu_share_outside_model": outside}
