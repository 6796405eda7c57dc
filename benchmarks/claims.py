#!/usr/bin/env python3
"""README's "Did the papers' claims hold" bullets and the results table's paired cells, generated from the committed
tables, so that no claim is typed by hand.

Systems: the comparisons of quality_paired.json, quality_gate.json, quality_speedup*.json (benchmarks/quality.py),
fewshot.json (fewshot.py), grad_conflict.json (grad_conflict.py), hf_parity.json (hf_parity.py) and
tune_fewshot.json (tune_fewshot.py --report). Measure: each paired difference's mean and 95% interval
(benchmarks/_paired.py). Targets: "ahead" or "behind" only where the interval excludes 0, else "within noise (n =
k)"; written between the ``<!-- claims:begin -->`` and ``<!-- claims:end -->`` lines of the README and of
docs/benchmarks.md and into the README's paired rows (``ROWS``); ``--check`` writes nothing and exits 1 when either
file differs.

    python benchmarks/claims.py [--results benchmarks/results] [--readme README.md] [--docs docs/benchmarks.md]
        [--check]
"""
import json
import os
import sys
import textwrap
from typing import Dict, List

import _paired
import _tune_report
import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
POINTS = ["1.5", "2", "3", "area"]
POINT_NAMES = {"1.5": "1.5x", "2": "2x", "3": "3x", "area": "mean 1x-3x"}


def _load(results: str, name: str) -> dict:
    with open(os.path.join(results, name), encoding="utf-8") as f:
        return json.load(f)


def _seeds(seeds: List[int]) -> str:
    return f"seeds {seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else \
        "seeds " + ", ".join(map(str, seeds))


def _said(diffs: List[float]) -> str:
    """"+0.16 [−0.23, +0.56], within noise (n = 3)"."""
    iv = _paired.interval(diffs)
    return f"{_paired.interval_text(iv)}, {_paired.verdict(iv)}"


def _where(verdicts: Dict[str, str], word: str) -> List[str]:
    return [k for k, v in verdicts.items() if v == word]


def _headline(verdicts: Dict[str, str], yes: str, no: str) -> str:
    """``yes`` with where it is ahead and where behind; ``no`` when every comparison is within noise."""
    ahead, behind = _where(verdicts, "ahead"), _where(verdicts, "behind")
    if not ahead and not behind:
        return no
    parts = ([f"ahead on {', '.join(ahead)}"] if ahead else []) + ([f"behind on {', '.join(behind)}"] if behind else [])
    return f"{yes}: {'; '.join(parts)}; within noise elsewhere" if len(ahead) + len(behind) < len(verdicts) else \
        f"{yes}: {'; '.join(parts)}"


def speedup_pairs(profiles: dict, method: str, base: str = "multi_exit_ce") -> Dict[str, List[float]]:
    """point -> METHOD minus BASE by seed, from quality_speedup*.json's per-seed profiles."""
    a, b = profiles.get(method, {}), profiles.get(base, {})
    seeds = sorted(set(a) & set(b), key=int)
    return {p: [a[s][p] - b[s][p] for s in seeds if a[s][p] is not None and b[s][p] is not None] for p in POINTS}


def multi_exit_bullet(results: str) -> str:
    layers, by_flops = _load(results, "quality_speedup.json"), _load(results, "quality_speedup_flops.json")
    verdicts, parts = {}, []
    for task, profiles in layers.items():
        seeds = sorted(set(profiles.get("acl_cross_layer", {})) & set(profiles.get("multi_exit_ce", {})), key=int)
        if not seeds:
            continue
        metric = next(iter(profiles["multi_exit_ce"].values()))["metric"]
        sentences = []
        for method, label in (("acl_cross_layer", "`acl_cross_layer`"),
                              ("multi_exit_kd", "self-distillation (`multi_exit_kd`, no contrast)"),
                              ("acl_cross_layer_cl_only", "the cross-layer term alone")):
            pairs = {p: d for p, d in speedup_pairs(profiles, method).items() if d}
            if not pairs:
                continue
            found = {POINT_NAMES[p]: _paired.verdict(_paired.interval(d)) for p, d in pairs.items()}
            said = " / ".join(_paired.interval_text(_paired.interval(d)) for d in pairs.values())
            if len(set(found.values())) == 1:
                said += f", {next(iter(found.values()))} at each"
            else:
                said += " (" + "; ".join(f"{k} {v}" for k, v in found.items()) + ")"
            sentences.append(f"{label} {said}")
            if method == "acl_cross_layer":
                verdicts.update({f"{task} at {k}": v for k, v in found.items()})
        parts.append(f"{task} {metric} ({_seeds([int(s) for s in seeds])}) minus multi-exit CE at 1.5x / 2x / 3x "
                     "fewer layers / the mean over 1x-3x: " + "; ".join(sentences) + ".")
    flops_moved = max(abs(layers[t][m][s][p] - by_flops[t][m][s][p])
                      for t in by_flops for m in by_flops[t] for s in by_flops[t][m] for p in POINTS
                      if layers[t][m][s][p] is not None and by_flops[t][m][s][p] is not None)
    head = _headline(verdicts, "Multi-exit, cross-layer ACL over multi-exit CE", "Multi-exit, cross-layer ACL over "
                     "multi-exit CE: not shown")
    return (f"- **{head}.** " + " ".join(parts) + " Read at the same FLOPs speed-ups instead of layers, no value "
            f"moves by more than {flops_moved:.2f} (the exit heads cost under 1% of a layer; quality.md has both "
            "tables).")


def pilot_bullet(results: str) -> str:
    gc = _load(results, "grad_conflict.json")
    runs = gc["results"]

    def span(pair, key, scale=1.0, fmt="{:.0f}"):
        vals = sorted(scale * runs[r][pair]["params"]["all"][key] for r in runs)
        lo, hi = fmt.format(vals[0]), fmt.format(vals[-1])
        return lo if lo == hi else f"{lo}-{hi}"

    never = all(runs[r]["ce_vs_acl"]["params"]["all"]["frac_conflict"] == 0 for r in runs)
    acl_conflict = "never" if never else f"{span('ce_vs_acl', 'frac_conflict', 100)}% of batches"
    shown = "for SCL, yes; not for ACL-Embed" if never else "for SCL and for ACL-Embed"
    same = _quality(results, "acl_grad − acl_embed")
    return (f"- **CE and a contrastive term conflict (the pilot): {shown}.** {gc['task']}, one seed, "
            f"{len(runs)} runs: SCL at median {span('ce_vs_scl', 'angle_median')}° to CE, "
            f"{span('ce_vs_scl', 'frac_conflict', 100)}% of batches above 90° (the paper: 75°-105°, ~20%); "
            f"ACL-Embed at {span('ce_vs_acl', 'angle_median')}°, above 90° {acl_conflict} "
            "([why](docs/method.md#why-acl-grad-rarely-fires-on-acl-embed)), so ACL-Grad has little to drop: "
            "`acl_grad` − `acl_embed` on GLUE dev " + ", ".join(
                f"{task} {_paired.interval_text(_paired.interval(p['diffs']))}" for task, p in same.items()) + ".")


def _gate(results: str):
    """(task, its scl_grad pair, gated − base by seed, the % of updates the gate dropped) of quality_gate.json."""
    for task, by_method in _load(results, "quality_gate.json").items():
        p = by_method["scl_grad"]
        yield task, p, [g - b for g, b in zip(p["gated"], p["base"])], [100 * r for r in p["conflict_rate"]
                                                                         if r is not None]


def gate_bullet(results: str) -> str:
    verdicts, parts = {}, []
    for task, p, diffs, rates in _gate(results):
        verdicts[task] = _paired.verdict(_paired.interval(diffs))
        parts.append(f"{task} {p['metric']} ({_seeds(p['seeds'])}; SCL dropped in {min(rates):.1f}-{max(rates):.1f}% "
                     f"of updates): {_said(diffs)} ({_paired.interval(diffs)['ahead']} of {len(diffs)} seeds ahead)")
    head = _headline(verdicts, "Dropping the conflicting term (ACL-Grad's rule, on SCL where it bites)",
                     "Dropping the conflicting term (ACL-Grad's rule, on SCL where it bites): no effect shown")
    return f"- **{head}.** `scl_grad` − `scl`: " + "; ".join(parts) + "."


def _quality(results: str, pair: str) -> Dict[str, dict]:
    return {task: by_pair[pair] for task, by_pair in _load(results, "quality_paired.json").items() if pair in by_pair}


def _fewshot(results: str, method: str, base: str) -> Dict[int, dict]:
    fs = _load(results, "fewshot.json")
    rows = fs["paired_delta_vs_ce"] + fs.get("paired_other", [])
    return {d["n"]: d for d in rows if d["method"] == method and d.get("base", "ce") == base}


def contrastive_bullet(results: str, method: str, base: str, title: str, no: str) -> str:
    verdicts, parts = {}, []
    few = _fewshot(results, method, base)
    if few:
        for n, d in sorted(few.items()):
            verdicts[f"few-shot N = {n}"] = _paired.verdict(_paired.interval(d.get("delta_vs_ce", d.get("delta"))))
        parts.append("few-shot SST-2 accuracy (" + _seeds(next(iter(few.values()))["seeds"]) + "): " + "; ".join(
            f"N = {n} {_said(d.get('delta_vs_ce', d.get('delta')))}" for n, d in sorted(few.items())))
    glue = _quality(results, f"{method} − {base}")
    for task, p in glue.items():
        verdicts[f"{task} (GLUE dev)"] = _paired.verdict(_paired.interval(p["diffs"]))
    if glue:
        parts.append("GLUE dev (" + _seeds(next(iter(glue.values()))["seeds"]) + "): " + "; ".join(
            f"{task} {p['metric']} {_said(p['diffs'])} ({p['ahead']} of {len(p['diffs'])} seeds ahead)"
            for task, p in glue.items()))
    return f"- **{_headline(verdicts, title, no)}.** `{method}` − `{base}`: " + ". ".join(parts) + "."


def _noise_note(verdicts: List[str]) -> str:
    """"every difference within noise (n = 3)", or which are not."""
    odd = [v for v in verdicts if not v.startswith("within noise")]
    if not odd:
        return "every difference " + (verdicts[0] if len(set(verdicts)) == 1 else "within noise")
    return f"{len(odd)} of {len(verdicts)} differences outside noise"


def multi_exit_row(results: str) -> str:
    """The results table's multi-exit cell: the means at 1.5x, 2x and over 1x-3x, and what the intervals say."""
    parts, verdicts = [], []
    for task, profiles in sorted(_load(results, "quality_speedup.json").items(), reverse=True):
        cells = []
        for method, label in (("acl_cross_layer", "`acl_cross_layer`"), ("multi_exit_kd", "`multi_exit_kd`"),
                              ("acl_cross_layer_cl_only", "the cross-layer term alone")):
            pairs = speedup_pairs(profiles, method)
            if all(pairs[p] for p in ("1.5", "2", "area")):
                ivs = [_paired.interval(pairs[p]) for p in ("1.5", "2", "area")]
                # the interval of the mean over 1x-3x; those at 1.5x and 2x are in quality.md
                cells.append(f"{label} " + " / ".join(_paired.signed(iv["mean"]) for iv in ivs[:-1]) + " / "
                             + _paired.interval_text(ivs[-1]))
                verdicts += [_paired.verdict(iv) for iv in ivs]
        metric = next(iter(profiles["multi_exit_ce"].values()))["metric"]
        seeds = sorted(profiles["multi_exit_ce"], key=int)
        parts.append(f"{task} {metric} ({_seeds([int(x) for x in seeds])}): " + "; ".join(cells))
    return ". ".join(parts) + f": {_noise_note(verdicts)} (every interval in quality.md)"


def gate_row(results: str) -> str:
    out = []
    for task, p, diffs, rates in _gate(results):
        iv = _paired.interval(diffs)
        digits = 1 if max(rates) < 10 else 0  # 0.5-1.6%, not 1-2%
        out.append(f"{task} {_paired.interval_text(iv)} {p['metric']} ({iv['ahead']} of {iv['n']} seeds ahead; "
                   f"SCL dropped in {min(rates):.{digits}f}-{max(rates):.{digits}f}% of updates): "
                   f"{_paired.verdict(iv)}")
    return "; ".join(out)


def fewshot_row(results: str) -> str:
    few = _fewshot(results, "scl", "ce")
    return ", ".join(f"{_paired.interval_text(_paired.interval(d['delta_vs_ce']), 1)} at N = {n} "
                     f"({_paired.verdict(_paired.interval(d['delta_vs_ce']))})" for n, d in sorted(few.items()))


def parity_row(results: str) -> str:
    out = []
    for _, tasks in sorted(_load(results, "hf_parity.json").items()):
        for task, e in sorted(tasks.items(), key=lambda kv: kv[0] != "SST-2"):
            if "paired" in e:
                d = e["paired"]
                out.append(f"{task} {_paired.interval_text(_paired.interval(d['diffs']))} ("
                           + ("within target" if d["within_target"] else "target **missed**")
                           + f"; {_paired.verdict(_paired.interval(d['diffs']))})")
    return "; ".join(out)


# the results table's rows that compare by seed: their first cell -> their headline cell, from the tables
ROWS = {
    "| Multi-exit on the entropy curve, minus multi-exit CE (paired): at 1.5x / 2x / mean 1x-3x |": multi_exit_row,
    "| ACL-Grad's rule on SCL, `scl_grad` − `scl` (paired) |": gate_row,
    "| Few-shot SST-2, CE+SCL − CE (5 seeds) |": fewshot_row,
    "| Fine-tuning vs a plain HF loop |": parity_row,
    "| Few-shot SST-2 tuned on Optuna, the same 24-trial budget per method (5 seeds) |":
        lambda results: _tune_report.row(_tune_report.load(results)),
}


def replace_rows(text: str, results: str) -> str:
    """Each row of ROWS with its headline cell regenerated; its first cell and its command kept."""
    lines = text.split("\n")
    for first, make in ROWS.items():
        found = [i for i, line in enumerate(lines) if line.startswith(first)]
        if len(found) != 1:
            raise ValueError(f"the README needs one results row starting {first!r}")
        command = lines[found[0]].rsplit(" | ", 1)[1]
        lines[found[0]] = f"{first} {make(results)} | {command}"
    return "\n".join(lines)


NOTE = ("Generated by `python benchmarks/claims.py` from the tables those commands write: mean paired difference "
        "[95% interval, Student t with n − 1 degrees of freedom]; \"ahead\" or \"behind\" only where the interval "
        "excludes 0.")


def bullets(results: str) -> str:
    """The whole block: a note, then one bullet per claim, each from its table, wrapped as the README is."""
    return "\n".join(textwrap.fill(text, width=115, subsequent_indent="  " if text.startswith("- ") else "",
                                    break_long_words=False, break_on_hyphens=False) for text in [
        NOTE,
        multi_exit_bullet(results),
        pilot_bullet(results),
        gate_bullet(results),
        contrastive_bullet(results, "scl", "ce", "CE+SCL over CE", "CE+SCL over CE: not shown"),
        contrastive_bullet(results, "acl_embed", "scl", "ACL-Embed against SCL",
                           "ACL-Embed at least as good as SCL: within noise everywhere, never behind"),
        _tune_report.bullet(_tune_report.load(results)),
    ]) + "\n"


def replace_block(text: str, block: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"the README needs one {BEGIN} line and one {END} line after it")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + block + text[end:]


def regenerated(path: str, results: str, readme: bool) -> str:
    """PATH's text with its claims block (and, for the README, its paired results rows) from the tables; the docs
    page links from docs/ itself."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if readme:
        return replace_rows(replace_block(text, bullets(results)), results)
    return replace_block(text, bullets(results).replace("](docs/", "]("))


def main(argv=None) -> int:
    p = harness.parser(__doc__)
    p.add_argument("--results", default=os.path.join(REPO, "benchmarks", "results"))
    p.add_argument("--readme", default=os.path.join(REPO, "README.md"))
    p.add_argument("--docs", default=os.path.join(REPO, "docs", "benchmarks.md"),
                   help="the benchmarks page, which repeats the bullets above its details")
    p.add_argument("--check", action="store_true", help="exit 1 when a file's claims are not what the tables say")
    args = p.parse_args(argv)
    stale = 0
    for path, readme in ((args.readme, True), (args.docs, False)):
        new = regenerated(path, args.results, readme)
        with open(path, encoding="utf-8") as f:
            if f.read() == new:
                continue
        if args.check:
            print(f"claims: {path} differs from the tables; run python benchmarks/claims.py", file=sys.stderr)
            stale = 1
            continue
        harness.write_text(path, new)
    if not args.check:
        print(bullets(args.results), end="")
    return stale


if __name__ == "__main__":
    sys.exit(main())
