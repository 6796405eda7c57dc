"""Refill against no refill at the same offered rate, interleaved (benchmarks/serve_load.py ``--interleave N``).

Each configuration's rates are fractions of its own saturation, and measured minutes apart; a p99 of a few
hundred requests moves more than the difference between the two at a light load. Here two servers of one
precision and worker count, one with refill and one without, are live at once (the idle one waits on its socket),
and each of refill's offered rates (requests/s) runs on both in turn, ``N`` rounds, the first server alternating
round by round; the same seeded arrivals and sentences every time. The verdict is the median over rounds of
refill's p99 over no refill's, each round's pair run back to back. Each phase keeps its own split (``/metrics``
before and after), and the rounds' table sets each p99 ratio beside the ratio of the two servers' model CPU a
request in that round: the same rows through the same layers, so a ratio above 1 is refill's batching, or the
machine's speed moving between the two phases.
"""
import os
import random
import statistics
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import _glue_runs
import harness

from . import client, server, stats

SIDES = (("refill", True), ("no_refill", False))
ROUND_COLUMNS = ["config", "rate_per_s", "round", "first", "refill_p50_ms", "refill_p99_ms", "none_p50_ms",
                 "none_p99_ms", "p99_ratio", "refill_model_cpu_ms", "none_model_cpu_ms", "model_cpu_ratio"]
ROUND_FORMATS = {"rate_per_s": "{:.1f}", "p99_ratio": "{:.2f}", "model_cpu_ratio": "{:.2f}",
                 **{c: "{:.1f}" for c in ROUND_COLUMNS if c.endswith("_ms") and "model" not in c},
                 "refill_model_cpu_ms": "{:.2f}", "none_model_cpu_ms": "{:.2f}"}


def refill_rates(results: List[Dict], precision: str, workers: int) -> List[Tuple[float, float]]:
    """(fraction, offered rate per s) of each rate that ``precision`` and ``workers`` ran with refill, so that no
    refill runs at the same load (each one's fractions are of its own saturation, and refill's is higher)."""
    twin = stats.ran(results, True, precision, workers)
    return [(r["fraction"], r["offered_per_s"]) for r in twin["rates"]] if twin else []


def pairs(args, results: List[Dict], folder: str, sentences: List[str], tmp: str) -> List[Dict]:
    """``--interleave``: per precision and workers that ran with refill, its offered rates on both servers (those
    the same configuration without refill carried, when it ran)."""
    found = []
    for precision in args.precision:
        for workers in args.workers:
            rates = refill_rates(results, precision, workers)
            off = stats.ran(results, False, precision, workers)
            if off:
                rates = [(f, r) for f, r in rates if r <= off["saturation"]["throughput_per_s"]]
            if not rates:
                continue
            try:
                found.append(interleaved(args, precision, workers, rates, folder, sentences, tmp))
            except RuntimeError as e:
                print(f"# interleaved {precision} w{workers}: failed: {e}", file=sys.stderr)
    return found


def interleaved(args, precision: str, workers: int, rates: Sequence[Tuple[float, float]], folder: str,
                sentences: List[str], tmp: str) -> Dict:
    """``rates``: (refill's fraction, its offered rate per s). The rounds of each rate and their medians."""
    order = list(range(len(sentences)))
    random.Random(args.seed).shuffle(order)
    unit = client.poisson_offsets(1.0, args.requests, float("inf"), args.seed)
    name = f"{precision} w{workers}"
    servers, stopped = {}, {}
    try:
        for side, refill in SIDES:
            servers[side] = start_side(args, (side, refill), precision, workers, folder, tmp)
            server.drive(server.phase_spec(args, servers[side][1], sentences, order[: args.max_batch],
                                           f"{name}/{side}/warm", mode="closed", concurrency=args.max_batch), tmp)
        ports = {side: port for side, (_, port) in servers.items()}
        results = [rate_rounds(args, ports, rated, unit, (name, sentences, order), tmp) for rated in rates]
    finally:
        for side, (proc, _) in servers.items():
            stopped[side] = server.stop_server(proc, args.stop_seconds)
    return {"precision": precision, "workers": workers, "rounds": args.interleave, "rates": results,
            "servers": stopped}


def start_side(args, sided: Tuple[str, bool], precision: str, workers: int, folder: str, tmp: str):
    """(process, port) of one side's server, ``sided`` its (name, refill), started and ready."""
    side, refill = sided
    port = server.free_port()
    log = os.path.join(tmp, f"pair-{side}.log")
    _glue_runs.log(f"interleaved {precision} w{workers}: acl-serve {side} on 127.0.0.1:{port}")
    proc = server.start_server(server.server_command(args, refill, precision, workers, folder, port), log, port,
                               args.ready_seconds)
    return proc, port


def rate_rounds(args, ports: Dict[str, int], rated: Tuple[float, float], unit: List[float], load, tmp: str) -> Dict:
    """One of refill's rates (``rated``: its fraction, its offered rate per s) on both servers, ``--interleave``
    rounds, the first server alternating; ``load`` is (the configuration's name, the sentences, their order)."""
    fraction, rate = rated
    name, sentences, order = load
    offsets = [t / rate for t in unit if t / rate < args.max_seconds]
    cycle = [order[i % len(order)] for i in range(len(offsets))]
    _glue_runs.log(f"interleaved {name}: refill's {fraction:.0%}, {rate:.1f}/s, {args.interleave} rounds of "
                   f"{len(offsets)} requests on each server")
    rounds = []
    for k in range(args.interleave):
        row = {}
        for side, _ in (SIDES if k % 2 == 0 else SIDES[::-1]):
            start = server.metrics(ports[side])
            out = server.drive(server.phase_spec(args, ports[side], sentences, cycle, f"{name}/{side}/{k}",
                                                 mode="open", offsets=offsets), tmp)
            row[side] = {**stats.summarize(out, rate, len(unit)),
                         "split": stats.split_between(start, server.metrics(ports[side])) if start else None}
        rounds.append(row)
    return {"refill_fraction": fraction, "offered_per_s": rate, "rounds": rounds, **medians(rounds)}


def medians(rounds: List[Dict]) -> Dict:
    """Per round, refill's p99 and p50 over no refill's; their medians (None where a round has no latency)."""
    out: Dict[str, Optional[float]] = {}
    for q in ("p99", "p50"):
        ratios = [r["refill"][f"{q}_ms"] / r["no_refill"][f"{q}_ms"] for r in rounds
                  if r["refill"][f"{q}_ms"] is not None and r["no_refill"][f"{q}_ms"]]
        out[f"{q}_ratios"] = ratios
        out[f"{q}_ratio_median"] = statistics.median(ratios) if ratios else None
    cpu = [(model_cpu_ms(r["refill"]), model_cpu_ms(r["no_refill"])) for r in rounds]
    out["model_cpu_ratios"] = [a / b for a, b in cpu if a is not None and b]
    out["model_cpu_ratio_median"] = statistics.median(out["model_cpu_ratios"]) if out["model_cpu_ratios"] else None
    return out


def model_cpu_ms(phase: Dict) -> Optional[float]:
    """The model calls' CPU ms a request answered in one phase (its split), None without one."""
    split = phase.get("split")
    return 1000 * split["model_cpu_seconds"] / split["requests"] if split and split["requests"] else None


def round_rows(pairs: List[Dict]) -> List[Dict]:
    """One row a round: each server's p50 and p99 and model CPU a request, and refill's ratios over no refill's."""
    rows = []
    for pair in pairs:
        for rate in pair["rates"]:
            for k, r in enumerate(rate["rounds"]):
                a, b = model_cpu_ms(r["refill"]), model_cpu_ms(r["no_refill"])
                p99 = (r["refill"]["p99_ms"], r["no_refill"]["p99_ms"])
                rows.append({"config": f"{pair['precision']} w{pair['workers']}", "rate_per_s": rate["offered_per_s"],
                             "round": k + 1, "first": SIDES[k % 2][0], "refill_p50_ms": r["refill"]["p50_ms"],
                             "refill_p99_ms": p99[0], "none_p50_ms": r["no_refill"]["p50_ms"], "none_p99_ms": p99[1],
                             "p99_ratio": p99[0] / p99[1] if None not in p99 and p99[1] else None,
                             "refill_model_cpu_ms": a, "none_model_cpu_ms": b,
                             "model_cpu_ratio": a / b if a is not None and b else None})
    return rows


def verdicts(pairs: List[Dict]) -> List[Dict]:
    """The median p99 ratio per rate against "no worse" (1.0), and none lost, no error, a clean SIGTERM."""
    found = []
    for pair in pairs:
        config = f"refill {pair['precision']} w{pair['workers']}"
        for rate in pair["rates"]:
            if rate["p99_ratio_median"] is not None:
                found.append(harness.target(
                    f"p99 with refill / without at the same offered rate ({rate['offered_per_s']:.1f}/s, "
                    f"{rate['refill_fraction']:.0%} of refill's saturation), median of {pair['rounds']} interleaved "
                    "rounds", rate["p99_ratio_median"], stats.SAME_RATE_BOUND, False, config=config))
        phases = [p for rate in pair["rates"] for r in rate["rounds"] for p in r.values()]
        found.append(harness.target("interleaved: requests lost, errors, or a SIGTERM without exit code 0",
                                    sum(p["lost"] + p["wrong_id"] + p["errors"] for p in phases) +
                                    sum(int(s["killed"] or s["exit_code"] != 0) for s in pair["servers"].values()),
                                    0, False, config=config))
    return found
