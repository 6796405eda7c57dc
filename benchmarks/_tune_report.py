"""The few-shot tuning study's report (benchmarks/tune_fewshot.py --report): every study's ``best.json``
(acl-tune --evaluate-best) gathered into one record and one table: tuned beside default per method, and method
against method, tuned and at the default, each a paired difference over the seeds with its 95% interval
(benchmarks/_paired.py)."""
import os
from typing import Dict, List, Optional

import _paired
import _records

PAIRS = [("scl", "ce"), ("acl_embed", "ce"), ("acl_embed", "scl")]  # (first, second): first − second


def _study(out: str, n: int, method: str) -> Optional[dict]:
    return _records.load(os.path.join(out, f"N{n}", method), "best.json")


def _paired_difference(a: Dict[str, float], b: Dict[str, float]) -> dict:
    seeds = sorted(set(a) & set(b), key=int)
    diffs = [a[s] - b[s] for s in seeds]
    return {"seeds": [int(s) for s in seeds], "diffs": diffs, **_paired.interval(diffs), "verdict": _paired.verdict(
        _paired.interval(diffs))}


def collect(out: str, ns: List[int], methods: List[str], previous: Optional[dict] = None) -> dict:
    """{"studies": {N: {method: summary}}, "pairs": {N: [...]}, "missing": ["N=100 acl_embed", ...]}.

    A study whose folder is not under ``out`` keeps its summary from ``previous`` (the report written before, for
    example by another machine whose ``runs/`` is gone): a report over N = 100 alone must not drop N = 20."""
    studies, pairs, missing = {}, {}, []
    earlier = (previous or {}).get("studies", {})
    ns = sorted(set(ns) | {int(n) for n, by in earlier.items() if by})
    for n in ns:
        by_method = {}
        for method in methods:
            best = _study(out, n, method)
            if best is None:
                if method in earlier.get(str(n), {}):
                    by_method[method] = earlier[str(n)][method]
                else:
                    missing.append(f"N={n} {method}")
                continue
            by_method[method] = {
                "trials": best["trials_finished"], "best_trial": best["best_trial"], "best_valid": best["best_valid"],
                "best_params": best["best_params"], "default": best["default"]["values"],
                "tuned": best["tuned"]["values"], "tuned_minus_default": _paired_difference(best["tuned"]["values"],
                                                                              best["default"]["values"])}
        studies[str(n)] = by_method
        pairs[str(n)] = [{"first": a, "second": b, "setting": setting,
                          **_paired_difference(by_method[a][setting], by_method[b][setting])}
                         for a, b in PAIRS if a in by_method and b in by_method for setting in ("tuned", "default")]
    return {"task": "SST-2", "metric": "accuracy", "scored_on": "the few-shot protocol's test half",
            "studies": studies, "pairs": pairs, "missing": missing}


def _mean_std(values: Dict[str, float]) -> str:
    import statistics

    v = list(values.values())
    return f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}"


def _params(params: dict) -> str:
    return ", ".join(f"{k} {float(v):.3g}" for k, v in params.items())


def markdown(record: dict) -> str:
    lines = ["| N | method | default | tuned | tuned − default | tuned setting (trials) |", "|---|---|---|---|---|---|"]
    for n, by_method in record["studies"].items():
        for method, s in by_method.items():
            d = s["tuned_minus_default"]
            lines.append(f"| {n} | {method} | {_mean_std(s['default'])} | {_mean_std(s['tuned'])} | "
                         f"{_paired.cell(d['diffs'])} | {_params(s['best_params'])} ({s['trials']}) |")
    lines += ["", "| N | comparison | tuned | at the default |", "|---|---|---|---|"]
    for n, pairs in record["pairs"].items():
        by = {(p["first"], p["second"], p["setting"]): p for p in pairs}
        for a, b in PAIRS:
            if (a, b, "tuned") in by:
                t, d = by[(a, b, "tuned")], by[(a, b, "default")]
                lines.append(f"| {n} | {a} − {b} | {_paired.cell(t['diffs'])} | {_paired.cell(d['diffs'])} |")
    lines += ["", f"Differences: {_paired.HEADER}."]
    if record["missing"]:
        lines += ["", "Not yet run: " + ", ".join(record["missing"]) + "."]
    return "\n".join(lines) + "\n"


# ---- README: the results row and the claim bullet (benchmarks/claims.py), from tune_fewshot.json ------------------


def load(results: str) -> Optional[dict]:
    return _records.load(results, "tune_fewshot.json")


def _word(verdict: str) -> str:
    return "within noise" if verdict.startswith("within noise") else verdict


def _said(p: dict) -> str:
    return f"{_paired.interval_text(p)} ({p['verdict']}; {p['ahead']} of {p['n']} seeds ahead)"


def row(record: dict) -> str:
    """The results table's cell: per N, tuned − default per method, then the tuned method pairs."""
    parts = []
    for n, by_method in record["studies"].items():
        if not by_method:
            continue
        own = ", ".join(f"{m} {_said(s['tuned_minus_default'])}" for m, s in by_method.items())
        pairs = ", ".join(f"{p['first']} − {p['second']} {_said(p)}" for p in record["pairs"][n]
                          if p["setting"] == "tuned")
        parts.append(f"N = {n}: tuned − default {own}" + (f"; tuned {pairs}" if pairs else ""))
    missing = f"; not yet run: {', '.join(record['missing'])}" if record["missing"] else ""
    return "; ".join(parts) + missing + " (tune_fewshot.md)"


def bullet(record: dict) -> str:
    """What tuning changed, whichever way it fell: the verdicts that moved between the default and the tuned
    settings, and each method's tuned − default."""
    moved, changed, seeds, trials = [], [], set(), set()
    for n, by_method in record["studies"].items():
        for m, s in by_method.items():
            trials.add(s["trials"])
            seeds.update(s["tuned_minus_default"]["seeds"])
            if _word(s["tuned_minus_default"]["verdict"]) != "within noise":
                moved.append(f"{m} {s['tuned_minus_default']['verdict']} of its default at N = {n}")
        by = {(p["first"], p["second"], p["setting"]): p for p in record["pairs"][n]}
        for a, b in PAIRS:
            if (a, b, "tuned") in by:
                vt, vd = by[(a, b, "tuned")]["verdict"], by[(a, b, "default")]["verdict"]
                if _word(vt) != _word(vd):
                    changed.append(f"{a} − {b} at N = {n} from {vd} to {vt}")
    head = "; ".join(([f"tuned, {', '.join(moved)}"] if moved else ["no method's tuned − default is outside noise"])
                     + ([f"verdicts moved: {'; '.join(changed)}"] if changed else
                        ["every method-against-method verdict is the same tuned as at the default"]))
    detail = []
    for n, pairs in record["pairs"].items():
        if pairs:
            detail.append(f"N = {n}, tuned / at the default: " + "; ".join(
                f"{p['first']} − {p['second']} {_said(p)} / {_said(d)}"
                for p, d in zip(pairs[::2], pairs[1::2])))
    missing = f" Not yet run: {', '.join(record['missing'])}." if record["missing"] else ""
    seeds_text = f"seeds {min(seeds)}-{max(seeds)}" if seeds else "no seeds"
    return (f"- **What tuning changed: {head}.** Few-shot SST-2 accuracy on the protocol's test half, each method "
            f"tuned by acl-tune with {'/'.join(map(str, sorted(trials)))} trials (TPE, median pruning, the objective "
            f"on the protocol's valid half), then its best setting and its default on {seeds_text}. "
            + ". ".join(detail) + "." + missing)
