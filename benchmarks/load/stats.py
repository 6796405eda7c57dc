"""The arithmetic of benchmarks/serve_load.py, pure: a phase's row from the client's records (counts by outcome,
throughput, latency percentiles), the closed loop's steady throughput, the served answers against acl-predict's,
and the issue's verdicts."""
import re
from typing import Dict, List, Optional, Tuple

import harness

REFILL_BOUND, MOONSHOT, P99_BOUND = 0.9, 0.95, 3.0
SERVED_BOUND = 0.95  # saturated / (layer speed-up x the same server at full depth): the scheduler alone
SAME_RATE_BOUND = 1.0  # refill's p99 / no refill's at the same offered rate: "no worse at every load"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def percentile(values: List[float], q: float) -> Optional[float]:
    """numpy's default (linear) percentile; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _start(r: Dict) -> float:
    return r["scheduled"] if r["scheduled"] is not None else r["sent"]


def answered(recs: List[Dict]) -> List[Dict]:
    """The records answered 200 with their own request's id."""
    return [r for r in recs if r["status"] == 200 and r["id_ok"]]


def latency_ms(r: Dict) -> float:
    """An answered record's latency: from its scheduled send (open loop; coordinated omission counted) or its send
    (closed loop) to its answer."""
    return 1000 * (r["done"] - _start(r))


def summarize(out: Dict, offered: Optional[float], planned: int) -> Dict:
    """One phase's row from the client's records: counts by outcome, throughput, latency percentiles (ms), mean exit
    layer. ``ok``: 200 with this request's id; ``lost``: sent and never answered; ``errors``: any other status or
    a connection error; ``unsent``: planned arrivals after the time bound."""
    recs = out["records"]
    ok = answered(recs)
    latency = [latency_ms(r) for r in ok]
    span = max(r["done"] for r in ok) - min(_start(r) for r in recs) if ok else 0.0
    statuses = [r["status"] for r in recs]
    return {"offered_per_s": offered, "planned": planned, "sent": len(recs), "unsent": planned - len(recs),
            "ok": len(ok), "throughput_per_s": len(ok) / span if span > 0 else 0.0,
            "p50_ms": percentile(latency, 50), "p95_ms": percentile(latency, 95), "p99_ms": percentile(latency, 99),
            "n_503": statuses.count(503), "n_5xx_other": sum(1 for s in statuses if s >= 500 and s != 503),
            "errors": sum(1 for r in recs if r["status"] not in (0, 200, 503) or r["error"] and r["status"] == 0),
            "lost": sum(1 for r in recs if r["status"] == 0 and r["error"] is None),
            "wrong_id": sum(1 for r in recs if r["id_ok"] is False),
            "max_lag_ms": max((1000 * (r["sent"] - r["scheduled"]) for r in recs if r["scheduled"] is not None),
                              default=None),
            "mean_exit_layer": sum(r["exit_layer"] for r in ok) / len(ok) if ok else None,
            "connections": out["connections"],
            # the client shares the cores with the server: what it took of them
            "client_cpu_share": out["cpu_s"] / out["end"] if out.get("cpu_s") is not None and out["end"] else None}


def steady_throughput(out: Dict, concurrency: int) -> float:
    """Answers per second of a closed loop between its ``concurrency``-th answer and its ``concurrency``-th last
    (fewer than 4 x concurrency answers: over all of them, from the start)."""
    done = sorted(r["done"] for r in out["records"] if r["status"] == 200 and r["id_ok"])
    if len(done) >= 4 * concurrency:
        return (len(done) - 2 * concurrency) / (done[-concurrency - 1] - done[concurrency - 1])
    return len(done) / done[-1] if done else 0.0


def compare_answers(recs: List[Dict], expected: List[Dict], labels: List[str], atol: float) -> Dict:
    """Served answers against acl-predict's rows (by sentence): how many differ (in label, exit layer, or a
    probability beyond ``atol``: each counted apart too), and how many sentences were answered at least once."""
    bad, label, layer, prob, seen, worst = 0, 0, 0, 0, set(), 0.0
    ok = answered(recs)
    for r in ok:
        e = expected[r["text"]]
        diff = max(abs(a - e["probabilities"][k]) for a, k in zip(r["probabilities"], labels))
        worst = max(worst, diff)
        label += r["label"] != e["label"]
        layer += r["exit_layer"] != e["exit_layer"]
        prob += diff > atol
        bad += r["label"] != e["label"] or r["exit_layer"] != e["exit_layer"] or diff > atol
        seen.add(r["text"])
    return {"compared": len(ok), "mismatches": bad, "label": label, "exit_layer": layer, "probabilities": prob,
            "max_prob_diff": worst, "sentences": len(seen)}


def refill_ratio(saturated: float, layer_speedup: float, full_depth: float, workers: int) -> float:
    """Saturated throughput over what converting every saved layer into throughput would give."""
    return saturated / (workers * layer_speedup * full_depth)


def verdicts(results: List[Dict], n_sentences: int) -> List[Dict]:
    """The issue's targets per configuration, each with its value, bound and pass (None: reported, no bound): its
    throughput and where its CPU went, then its answers and its stop; then refill against no refill at the same
    offered rate."""
    out = []
    for res in results:
        found = [("the configuration ran (its error is in the JSON)", 0, 1, True)] if res.get("failed") else \
            throughput_targets(res) + answer_targets(res, n_sentences)
        out += [harness.target(text, value, bound, at_least, config=res["config"])
                for text, value, bound, at_least in found]
    return out + [harness.target(text, value, bound, at_least, config=config)
                  for config, text, value, bound, at_least in same_rate_targets(results)]


def throughput_targets(res: Dict) -> List[Tuple]:
    """(text, value, bound, at least) of a configuration's saturated throughput, its latency at half load and the
    share of its CPU outside the model."""
    sat, ref, served, speedup = res["saturation"], res["reference"], res.get("full_depth_served"), res["layer_speedup"]
    ratio = refill_ratio(sat["throughput_per_s"], speedup, ref["full_batched_per_s"], res["workers"])
    found = []
    if served and served["throughput_per_s"] > 0:  # the same HTTP, JSON and tokenization: the scheduler alone
        found.append(("saturated / (layer speed-up x the same server at full depth)" + ("" if res["refill"] else
                      ", no refill"), sat["throughput_per_s"] / (speedup * served["throughput_per_s"]),
                      SERVED_BOUND if res["refill"] else None, True))
    if res["refill"]:  # the whole service against the bare engine
        found += [("saturated / (layer speed-up x full-depth batched engine x workers)", ratio, REFILL_BOUND, True),
                  ("the same, moonshot", ratio, MOONSHOT, True)]
    else:
        found.append(("saturated / (layer speed-up x full-depth batched engine x workers), no refill", ratio, None,
                      True))
    split = sat.get("split") or {}
    if split.get("cpu_share_outside_model") is not None:
        found.append(("share of the workers' CPU time outside the model at saturation",
                      split["cpu_share_outside_model"], None, False))
    own, full = cpu_per_request(split), cpu_per_request((served or {}).get("split") or {})
    if own and full:  # the scheduler-alone ratio taken apart: the model calls, and the rest
        found += [("model CPU a request at full depth / (layer speed-up x with this policy): its model calls' "
                   "efficiency", full[1] / (speedup * own[1]), None, True),
                  ("CPU outside the model a request, with this policy / at full depth", own[0] / full[0], None, False)]
    half = next((r for r in res["rates"] if r["fraction"] == 0.5), None)
    if half is not None and half["p99_ms"] is not None:
        found.append(("p99 at 50% / full-depth batch-1 latency", half["p99_ms"] / ref["batch1_ms"], P99_BOUND, False))
        if ref.get("batch1_p99_ms"):  # judged where the simulation says it is reachable: serve_ideal.py
            found.append(("p99 at 50% / p99 of requests alone at batch 1", half["p99_ms"] / ref["batch1_p99_ms"], None,
                          False))
    return found


def answer_targets(res: Dict, n_sentences: int) -> List[Tuple]:
    """(text, value, bound, at least) of a configuration's answers (against acl-predict's, none lost, the server's
    count, no error) and of its SIGTERM."""
    served, ans, stop = res.get("full_depth_served"), res["answers"], res["server"]
    phases = [res["saturation"]] + res["rates"] + carried(res.get("same_rate_as_refill", [])) + \
        ([served] if served else [])
    found = [(f"answers differing from acl-predict's ({ans['sentences']} of {n_sentences} sentences)",
              ans["mismatches"], 0, False),
             ("requests lost or answered twice", sum(p["lost"] + p["wrong_id"] for p in phases), 0, False)]
    if res.get("metrics"):
        counted = sum(v for k, v in res["metrics"]["answered"].items() if k.startswith("infer "))
        found.append((f"|answers the server counted ({counted:.0f}) - those the client got|",
                      abs(counted - res["client_answered"]), 0, False))
    how = f"killed after {stop['stop_s']:.1f} s" if stop["killed"] else f"in {stop['stop_s']:.1f} s" + \
        (", a process of it left behind" if stop.get("left") else "")
    return found + [(f"SIGTERM ending without exit code 0 (exit code {stop['exit_code']}, {how})",
                     int(stop["killed"] or stop["exit_code"] != 0 or bool(stop.get("left"))), 0, False),
                    ("errors: 5xx other than 503, 4xx, connections", sum(p["errors"] for p in phases), 0, False)]


def same_rate_targets(results: List[Dict]) -> List[Tuple]:
    """(refill's configuration, text, value, bound, at least): refill's p99 over no refill's at each of refill's
    offered rates that no refill also ran."""
    found = []
    for res in results:
        twin = None if res.get("refill") else ran(results, True, res.get("precision"), res["workers"])
        for same in carried(res.get("same_rate_as_refill", [])) if twin and not res.get("failed") else []:
            own = next(r for r in twin["rates"] if r["fraction"] == same["refill_fraction"])
            if own["p99_ms"] is not None and same["p99_ms"]:
                found.append((twin["config"], f"p99 with refill / without at the same offered rate "
                              f"({same['offered_per_s']:.1f}/s, {same['refill_fraction']:.0%} of refill's saturation)",
                              own["p99_ms"] / same["p99_ms"], SAME_RATE_BOUND, False))
    return found


def ran(results: List[Dict], refill: bool, precision: Optional[str], workers: int) -> Optional[Dict]:
    """The configuration of ``results`` with this refill, precision and worker count that ran (None: none, or it
    failed)."""
    return next((r for r in results if bool(r.get("refill")) == refill and not r.get("failed")
                 and r.get("precision") == precision and r["workers"] == workers), None)


def cpu_per_request(split: Dict) -> Optional[Tuple[float, float]]:
    """(CPU ms outside the model, CPU ms in model calls) a request answered in a phase, from its split; None where
    the workers' CPU was not read."""
    cpu, model, n = split.get("worker_cpu_seconds"), split.get("model_cpu_seconds"), split.get("requests")
    if not cpu or model is None or not n:
        return None
    return 1000 * (cpu - model) / n, 1000 * model / n


def carried(phases: List[Dict]) -> List[Dict]:
    """The same-rate phases that ran (a rate above the configuration's saturation is recorded as skipped)."""
    return [p for p in phases if not p.get("skipped")]


def parse_metrics(text: str) -> List[Tuple[str, Dict[str, str], float]]:
    """Prometheus's text format as (name, labels, value) samples; comments skipped."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            labels = dict(LABEL.findall(m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def server_side(samples: List[Tuple[str, Dict[str, str], float]]) -> Dict:
    """From acl-serve's /metrics: requests answered by route and status; each layer's backend calls and the sum
    of their batch fills (rows over --max-batch; layer 0: the embeddings); each request phase's and each queue's
    seconds and counts; the backend calls' seconds; the inputs answered by exit reason, and those failed by their
    deadline."""
    answered: Dict[str, float] = {}
    sums: Dict[str, Dict[str, Dict[str, float]]] = {"fill": {}, "phases": {}, "waits": {}}
    histograms = {"acl_batch_fill": ("fill", "layer"), "acl_request_phase_seconds": ("phases", "phase"),
                  "acl_queue_wait_seconds": ("waits", "layer")}
    model, model_cpu, reasons, expired = 0.0, 0.0, {}, 0.0
    for name, labels, value in samples:
        base, _, part = name.rpartition("_")
        if name == "acl_requests_total":
            key = f"{labels.get('route')} {labels.get('status')}"
            answered[key] = answered.get(key, 0) + value
        elif name == "acl_exit_reasons_total":
            reasons[labels.get("reason", "?")] = reasons.get(labels.get("reason", "?"), 0.0) + value
        elif name == "acl_deadline_expired_total":
            expired += value
        elif name == "acl_model_seconds_total":
            model += value
        elif name == "acl_model_cpu_seconds_total":
            model_cpu += value
        elif base in histograms and part in ("sum", "count"):
            kind, label = histograms[base]
            sums[kind].setdefault(labels.get(label, "?"), {"sum": 0.0, "count": 0.0})[part] += value
    return {"answered": answered, **sums, "model_seconds": model, "model_cpu_seconds": model_cpu,
            "exit_reasons": reasons, "deadline_expired": expired}


def split_between(before: Optional[Dict], after: Optional[Dict]) -> Optional[Dict]:
    """Where the answered requests' time went between two :func:`server_side` readings: each phase's mean ms a
    request and its share of their latency, each queue's mean wait an input, the backend calls' seconds, the inputs
    answered by exit reason and those failed by their deadline."""
    if not after or not after["phases"]:
        return None
    old = before or {"phases": {}, "waits": {}, "model_seconds": 0.0, "model_cpu_seconds": 0.0}
    reasons, then = after.get("exit_reasons", {}), old.get("exit_reasons", {})

    def delta(kind, key):
        now, then = after[kind][key], old[kind].get(key, {"sum": 0.0, "count": 0.0})
        return now["sum"] - then["sum"], now["count"] - then["count"]

    phases = {k: delta("phases", k) for k in after["phases"]}
    total = sum(s for s, _ in phases.values())
    requests = max((c for _, c in phases.values()), default=0)
    waits = {k: delta("waits", k) for k in sorted(after["waits"], key=lambda k: int(k) if k.isdigit() else -1)}
    return {"requests": int(requests),
            "per_request_ms": {k: 1000 * s / c if c else None for k, (s, c) in phases.items()},
            "share": {k: s / total if total else None for k, (s, _) in phases.items()},
            "queue_wait_ms": {k: 1000 * s / c if c else None for k, (s, c) in waits.items()},
            "model_seconds": after["model_seconds"] - old["model_seconds"],
            "model_cpu_seconds": after["model_cpu_seconds"] - old["model_cpu_seconds"],
            "exit_reasons": {k: int(v - then.get(k, 0.0)) for k, v in reasons.items()},
            "deadline_expired": int(after.get("deadline_expired", 0.0) - old.get("deadline_expired", 0.0))}


def fill_between(before: Optional[Dict], after: Optional[Dict]) -> Optional[Dict]:
    """Per layer (in order), the backend calls between two :func:`server_side` readings and their mean fill."""
    if not after:
        return None
    old = (before or {}).get("fill", {})
    out = {}
    for layer in sorted(after["fill"], key=lambda k: int(k) if k.isdigit() else -1):
        calls = after["fill"][layer]["count"] - old.get(layer, {}).get("count", 0.0)
        total = after["fill"][layer]["sum"] - old.get(layer, {}).get("sum", 0.0)
        out[layer] = {"calls": int(calls), "mean_fill": total / calls if calls else None}
    return out
