"""The deadline sweep of benchmarks/serve_deadlines.py, pure but for acl-predict: the references every answer is held
against, a cell's row from the client's records, the issue's goals and the other verdicts, the plot, the time
estimate.

- **references** (acl-predict, once per precision): the server's policy, which gives each sentence's no-deadline
  exit, and every fixed exit (``--exit-layer L``): a deadline exit at layer L must equal acl-predict's answer at
  ``--exit-layer L`` (label, and probabilities within ``--atol``), any other answer the policy's own;
- **a cell** (one offered load, one deadline, one ``--deadline-policy``): a request meets its deadline when it is
  answered (200, its own id) no later than the deadline after its scheduled send, as the client measures it; a 503
  (``Request timeout expired``, or the queue's overload) and a late answer miss it. Accuracy is the answered rows'
  against the gold labels, beside the same rows' no-deadline answers (acl-predict's with the policy: a paired
  difference, so that what a deadline exit costs is not mixed with which sentences were answered);
- **the goals** (issue 58): with ``answer`` and a deadline of 3x the batch-1 median, at least 99% of requests on
  time at every load up to 100% of the full-depth saturation and 95% at 200%, and accuracy at 50% load within 0.5
  point of no deadline; each printed MET or MISSED with the CPU kind.
"""
import json
import os
from typing import Dict, List, Optional, Sequence

import harness
from acl_runtime.deadlines import DEADLINE, EXPIRED

from . import server, stats

LOADS = (0.25, 0.5, 1.0, 1.5, 2.0)  # offered load, x the full-depth saturation
MULTIPLES = (2.0, 3.0, 5.0)  # deadlines, x the batch-1 median
POLICIES = ("answer", "fail")  # the servers' --deadline-policy (delay: the deadline only orders the queues)
GOAL_MULTIPLE, ON_TIME, OVERLOAD, ON_TIME_OVERLOAD = 3.0, 0.99, 2.0, 0.95
ACCURACY_LOAD, ACCURACY_POINTS = 0.5, 0.5
GOALS = {"on_time": f"answer, {GOAL_MULTIPLE:g}x batch-1: lowest share on time at the loads up to 100%",
         "on_time_overload": f"answer, {GOAL_MULTIPLE:g}x batch-1: share on time at {OVERLOAD:.0%} load",
         "accuracy": f"answer, {GOAL_MULTIPLE:g}x batch-1, {ACCURACY_LOAD:.0%} load: accuracy points below the same "
                     "rows' no-deadline answers"}
COLUMNS = ["precision", "policy", "deadline_x", "deadline_ms", "load", "offered_per_s", "sent", "met_rate",
           "accuracy", "accuracy_drop", "mean_exit_layer", "deadline_share", "p50_ms", "p99_ms", "n_503",
           "n_5xx_other", "lost", "mismatches"]
FORMATS = {"deadline_x": "{:g}", "deadline_ms": "{:.1f}", "load": "{:.2f}", "offered_per_s": "{:.1f}",
           "met_rate": "{:.4f}", "accuracy": "{:.2f}", "accuracy_drop": "{:+.2f}", "mean_exit_layer": "{:.2f}",
           "deadline_share": "{:.3f}", "p50_ms": "{:.1f}", "p99_ms": "{:.1f}"}


def references(folder: str, precision: str, sentences: List[str], args, tmp: str, exit_layers: Sequence[int]) -> Dict:
    """acl-predict's rows: ``"policy"`` (the server's policy and threshold) and each exit layer (``--exit-layer``)."""
    refs = {"policy": server.acl_predict(folder, precision, sentences, args, tmp)}
    for layer in exit_layers:
        refs[layer] = server.acl_predict(folder, precision, sentences, args, tmp, exit_layer=layer)
    return refs


def accuracy(labels: Sequence[str], gold: Sequence[str]) -> Optional[float]:
    """Percent of ``labels`` equal to ``gold`` (None for none)."""
    return 100.0 * sum(a == b for a, b in zip(labels, gold)) / len(labels) if labels else None


def reference_summary(refs: Dict, gold: Sequence[str]) -> Dict:
    """The references' accuracy against the gold labels (percent), each fixed exit's and the policy's, and the
    policy's mean exit layer."""
    return {"policy_accuracy": accuracy([r["label"] for r in refs["policy"]], gold),
            "policy_mean_exit_layer": sum(r["exit_layer"] for r in refs["policy"]) / len(refs["policy"]),
            "fixed_exit_accuracy": {str(k): accuracy([r["label"] for r in v], gold) for k, v in refs.items()
                                    if k != "policy"}}


def on_time(recs: List[Dict], deadline_ms: float) -> int:
    """The requests answered (200, their own id) no later than ``deadline_ms`` after their scheduled send."""
    return sum(1 for r in stats.answered(recs) if stats.latency_ms(r) <= deadline_ms)


def against_references(ok: List[Dict], refs: Dict, labels: Sequence[str], atol: float) -> Dict:
    """The answered rows against acl-predict's at their own exit layer (``mismatches``: label or a probability
    beyond ``atol``; a layer with no reference counts whole), and against the policy's exit: ``deeper`` than it,
    and ``exit_rule_broken``: deeper, a deadline exit not before it, or another answer not at it."""
    out = {"compared": 0, "mismatches": 0, "max_prob_diff": 0.0}
    for layer in sorted({r["exit_layer"] for r in ok}):
        rows = [r for r in ok if r["exit_layer"] == layer]
        if layer not in refs:
            out["compared"], out["mismatches"] = out["compared"] + len(rows), out["mismatches"] + len(rows)
            continue
        got = stats.compare_answers(rows, refs[layer], labels, atol)
        out["compared"] += got["compared"]
        out["mismatches"] += got["mismatches"]
        out["max_prob_diff"] = max(out["max_prob_diff"], got["max_prob_diff"])
    own = [(r, refs["policy"][r["text"]]["exit_layer"]) for r in ok]
    out["deeper"] = sum(1 for r, layer in own if r["exit_layer"] > layer)
    out["exit_rule_broken"] = sum(1 for r, layer in own if _broken(r, layer))
    return out


def _broken(r: Dict, policy_layer: int) -> bool:
    """A deadline exit must leave before the policy's own exit; any other answer at it."""
    return r["exit_layer"] >= policy_layer if r["exit_reason"] == DEADLINE else r["exit_layer"] != policy_layer


def cell(phase: Dict, recs: List[Dict], refs: Dict, gold: Sequence[str], labels: Sequence[str], atol: float,
         deadline_ms: Optional[float], multiples_ms: Dict[float, float]) -> Dict:
    """One cell's row: ``phase`` (stats.summarize's row of its open loop, with its /metrics split) and from its
    records: met, late and their share of the requests sent (no deadline: ``met_rate_at`` each deadline of the
    sweep), the 503s of the deadline, accuracy (answered rows) and the same rows' without a deadline, the deadline
    exits, and the answers against the references."""
    ok = stats.answered(recs)
    sent, split = len(recs), phase.get("split") or {}
    met = None if deadline_ms is None else on_time(recs, deadline_ms)
    row = {k: phase[k] for k in ("offered_per_s", "sent", "unsent", "ok", "throughput_per_s", "p50_ms", "p95_ms",
                                 "p99_ms", "n_503", "n_5xx_other", "errors", "lost", "wrong_id", "max_lag_ms",
                                 "mean_exit_layer", "client_cpu_share")}
    accurate = accuracy([r["label"] for r in ok], [gold[r["text"]] for r in ok])
    unhurried = accuracy([refs["policy"][r["text"]]["label"] for r in ok], [gold[r["text"]] for r in ok])
    deadline_exits = sum(1 for r in ok if r["exit_reason"] == DEADLINE)
    row.update(met=met, late=None if met is None else len(ok) - met,
               met_rate=None if met is None or not sent else met / sent,
               n_503_expired=sum(1 for r in recs if r["status"] == 503 and EXPIRED in (r["error"] or "")),
               accuracy=accurate, accuracy_no_deadline=unhurried,
               accuracy_drop=None if accurate is None else unhurried - accurate,
               deadline_exits=deadline_exits, deadline_share=deadline_exits / len(ok) if ok else None,
               server_deadline_exits=split.get("exit_reasons", {}).get(DEADLINE, 0) if split else None,
               server_deadline_expired=split.get("deadline_expired") if split else None,
               **against_references(ok, refs, labels, atol))
    if deadline_ms is None:
        row["met_rate_at"] = {f"{m:g}": on_time(recs, ms) / sent if sent else None for m, ms in multiples_ms.items()}
    return row


def _goal(key: str, value: float, bound: float, at_least: bool, config: str, where: str) -> Dict:
    return harness.target(f"{GOALS[key]} ({where})", value, bound, at_least, config=config, goal=key)


def goal_verdicts(cells: List[Dict], precision: str) -> List[Dict]:
    """The issue's goals for one precision, where the sweep ran their cells."""
    mine = [c for c in cells if c["precision"] == precision and c["policy"] == "answer"
            and c["deadline_x"] == GOAL_MULTIPLE and not c.get("failed")]
    found = []
    light = [c for c in mine if c["load"] <= 1.0 and c["met_rate"] is not None]
    if light:
        worst = min(light, key=lambda c: c["met_rate"])
        loads = ", ".join(f"{c['load']:.0%}" for c in light)
        found.append(_goal("on_time", worst["met_rate"], ON_TIME, True, precision,
                           f"at {worst['load']:.0%}, of {loads}"))
    for c in mine:
        if c["load"] == OVERLOAD and c["met_rate"] is not None:
            found.append(_goal("on_time_overload", c["met_rate"], ON_TIME_OVERLOAD, True, precision,
                               f"{c['sent']} requests"))
        if c["load"] == ACCURACY_LOAD and c["accuracy_drop"] is not None:
            found.append(_goal("accuracy", c["accuracy_drop"], ACCURACY_POINTS, False, precision,
                               f"{c['accuracy']:.2f} against {c['accuracy_no_deadline']:.2f}, {c['ok']} answered"))
    return found


def verdicts(cells: List[Dict], servers: Dict[str, Dict], precisions: Sequence[str]) -> List[Dict]:
    """Per precision: the goals, then what must hold in every cell (each answer acl-predict's at its exit layer,
    no exit deeper than the policy's, none lost, no error but a 503, the server's counts equal to the client's) and
    a clean SIGTERM of each server (``servers``: "precision policy" -> server.stop_server's record)."""
    found = []
    for precision in precisions:
        ran = [c for c in cells if c["precision"] == precision and not c.get("failed")]
        counted = [c for c in ran if c["server_deadline_exits"] is not None]
        stops = [s for name, s in servers.items() if name.startswith(precision + " ")]
        checks = [
            ("answers differing from acl-predict's at their exit layer (fixed-exit references)",
             sum(c["mismatches"] for c in ran)),
            ("answers deeper than the policy's own exit, or leaving elsewhere than the rule says",
             sum(c["exit_rule_broken"] for c in ran)),
            ("requests lost or answered twice", sum(c["lost"] + c["wrong_id"] for c in ran)),
            ("errors: 5xx other than 503, 4xx, connections", sum(c["errors"] for c in ran)),
            ("|deadline exits and timeouts the server counted - those the client got|",
             sum(abs(c["server_deadline_exits"] - c["deadline_exits"]) +
                 abs(c["server_deadline_expired"] - c["n_503_expired"]) for c in counted)),
            ("cells or servers that failed (their error is in the JSON)",
             sum(1 for c in cells if c["precision"] == precision and c.get("failed"))),
            ("SIGTERM ending without exit code 0", sum(int(s["killed"] or s["exit_code"] != 0) for s in stops))]
        found += goal_verdicts(cells, precision) + [harness.target(text, value, 0, False, config=precision)
                                                    for text, value in checks]
    return found


def print_goals(found: List[Dict], precisions: Sequence[str], cpu_kind: str) -> None:
    """The issue's goals, one line each: MET, MISSED, or not run (the sweep left its cells out)."""
    print(f"# goals (issue 58), measured on {cpu_kind}")
    for precision in precisions:
        for key, text in GOALS.items():
            t = next((t for t in found if t.get("goal") == key and t["config"] == precision), None)
            if t is None:
                print(f"  not run  {precision}: {text}")
                continue
            shown = f"{t['value']:.4f}" if key != "accuracy" else f"{t['value']:+.2f}"
            print(f"  {'MET' if t['pass'] else 'MISSED':<7}  {precision}: {t['target']}: {shown} "
                  f"({'>=' if t['at_least'] else '<='} {t['bound']:g})")


def plot(cells: List[Dict], precisions: Sequence[str], path: str) -> Optional[str]:
    """Met rate and accuracy against the offered load, one line per (policy, deadline) and one without a deadline
    (its met rate at the goal's deadline), a panel per precision: None, or why there is no plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, axes = plt.subplots(2, len(precisions), figsize=(5.5 * len(precisions), 7), squeeze=False, sharex=True)
    for col, precision in enumerate(precisions):
        mine = [c for c in cells if c["precision"] == precision and not c.get("failed")]
        lines = sorted({(c["policy"], c["deadline_x"]) for c in mine if c["deadline_x"] is not None})
        multiples = sorted({m for _, m in lines})
        for policy, m in lines:
            at = sorted((c for c in mine if (c["policy"], c["deadline_x"]) == (policy, m)), key=lambda c: c["load"])
            style = dict(linestyle="-" if policy == "answer" else "--", marker="o", color=f"C{multiples.index(m)}",
                         label=f"{policy}, {m:g}x batch-1")
            axes[0][col].plot([c["load"] for c in at], [c["met_rate"] for c in at], **style)
            axes[1][col].plot([c["load"] for c in at], [c["accuracy"] for c in at], **style)
        base = sorted((c for c in mine if c["deadline_x"] is None), key=lambda c: c["load"])
        goal = f"{GOAL_MULTIPLE:g}" if f"{GOAL_MULTIPLE:g}" in (base[0]["met_rate_at"] if base else {}) else None
        if base and goal:
            axes[0][col].plot([c["load"] for c in base], [c["met_rate_at"][goal] for c in base], ":", marker="s",
                              color="k", label=f"no deadline (on time at {goal}x)")
        axes[1][col].plot([c["load"] for c in base], [c["accuracy"] for c in base], ":", marker="s", color="k",
                          label="no deadline")
        axes[0][col].set_title(precision)
        axes[0][col].set_ylabel("deadline met (share of requests sent)")
        axes[1][col].set_ylabel("accuracy of the answered rows (%)")
        axes[1][col].set_xlabel("offered load (x full-depth saturation)")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
        axes[0][col].legend(fontsize=7)
    fig.tight_layout()
    harness.save_figure(fig, path)
    return None


def prior(precision: str, record: str) -> Dict:
    """What the time estimate assumes before anything is measured: the full-depth saturation and the batch-1
    latency of ``record`` (serve_load's one-worker refill configuration of this precision), else a guess."""
    guess = {"fp32": (100.0, 10.0), "int8": (200.0, 5.0)}[precision]
    try:
        with open(record, encoding="utf-8") as f:
            found = next(c for c in json.load(f)["results"] if c["config"] == f"refill {precision} w1")
        return {"full_per_s": found["full_depth_served"]["throughput_per_s"],
                "batch1_ms": found["reference"]["batch1_ms"], "source": os.path.basename(record)}
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return {"full_per_s": guess[0], "batch1_ms": guess[1], "source": "a guess"}


def estimate_seconds(full_per_s: float, batch1_ms: float, n: int, exits: int, args, measured: bool = False) -> float:
    """Seconds one precision takes: acl-predict once per exit and once with the policy, a server per
    ``--policies`` (start with its cost table, warm-up, stop), and, unless ``measured``, the batch-1 reference and
    the saturation; then each cell: its arrivals (at most ``--seconds``), the queue's drain past the early-exit
    capacity (about 1.4x the full-depth one), and the client process."""
    fixed = len(args.policies) * 20.0 + (0.0 if measured else (exits + 1) * (3.0 + n / full_per_s) +
                                         1.3 * n * batch1_ms / 1000 + max(2 * n, 1024) / full_per_s)
    cells = 0.0
    for load in args.loads:
        span = min(args.requests / (load * full_per_s), args.max_seconds)
        cells += (1 + len(args.deadlines) * len(args.policies)) * (span * (1 + max(0.0, load - 1.4) / 1.4) + 2.0)
    return fixed + cells
