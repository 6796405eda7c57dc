"""The tables of benchmarks/quality.py that read run records only: training time, restored and legacy rows, the
methods against their baselines paired by seed, and the gated methods against their base (the ACL-Grad rule on
SCL); every paired difference with its 95% interval (_paired.py)."""
import glob
import json
import os
import re
import statistics
from typing import Dict, Optional

import _glue_runs
import _paired
import _records
from acl_fairseq.inference import flops, report

TASKS = ["RTE", "CoLA", "SST-2", "STS-B"]
# (method, baseline) compared seed by seed on the task's GLUE metric: the papers' claims (a contrastive term over
# CE, ACL-Embed against SCL, what ACL-Grad's rule changes) and the multi-exit methods against multi-exit CE at the
# last exit
QUALITY_PAIRS = [("scl", "ce"), ("acl_embed", "ce"), ("acl_grad", "ce"), ("acl_embed", "scl"),
                 ("acl_grad", "acl_embed"),
                 ("acl_cross_layer", "multi_exit_ce"), ("multi_exit_kd", "multi_exit_ce"),
                 ("acl_cross_layer_cl_only", "multi_exit_ce")]


def _by_seed(runs_dir: str, task: str, method: str) -> Dict[int, dict]:
    return {int(os.path.basename(os.path.dirname(p))[4:]): _records.load(os.path.dirname(p))
            for p in glob.glob(os.path.join(runs_dir, task, method, "seed*", "result.json"))}


def quality_pairs(runs_dir: str, tasks=TASKS, pairs=QUALITY_PAIRS) -> Dict[str, Dict[str, dict]]:
    """task -> "method − base" -> {"method", "base", "metric", "seeds", "diffs", "ci95", "ahead", "verdict"} over the
    seeds where both have a result (best checkpoint, the task's GLUE metric)."""
    out: Dict[str, Dict[str, dict]] = {}
    for task in tasks:
        for method, base in pairs:
            a, b = _by_seed(runs_dir, task, method), _by_seed(runs_dir, task, base)
            seeds = sorted(set(a) & set(b))
            if not seeds:
                continue
            diffs = [a[s]["best_value"] - b[s]["best_value"] for s in seeds]
            iv = _paired.interval(diffs)
            out.setdefault(task, {})[f"{method} − {base}"] = {
                "method": method, "base": base, "metric": b[seeds[0]]["best_metric"], "seeds": seeds, "diffs": diffs,
                "mean": iv["mean"], "ci95": [iv["lo"], iv["hi"]], "ahead": iv["ahead"], "verdict": _paired.verdict(iv)}
    return out


def quality_pairs_markdown(pairs: Dict[str, Dict[str, dict]]) -> str:
    """The quality table's comparisons, paired by seed."""
    rows = [f"| {task} | {name} | {p['metric']} | {', '.join(map(str, p['seeds']))} | {_paired.cell(p['diffs'])} |"
            for task, by_pair in pairs.items() for name, p in by_pair.items()]
    if not rows:
        return ""
    return ("\nPaired by seed (the runs above, same seed = same initialisation and data order): " + _paired.HEADER
            + ":\n\n| task | pair | metric | seeds | difference |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


DONE_RE = re.compile(r"done training in ([0-9.]+) seconds")


def training_minutes(runs_dir: str) -> dict:
    """task -> method -> [minutes of each finished run], read from fairseq's "done training in N seconds" line in
    RUNS_DIR/TASK/METHOD/seedS/train.log (runs without that line are left out)."""
    out = {}
    for log_path in sorted(glob.glob(os.path.join(runs_dir, "*", "*", "seed*", "train.log"))):
        task, method = log_path.split(os.sep)[-4:-2]
        with open(log_path, encoding="utf-8", errors="replace") as f:
            found = DONE_RE.findall(f.read())
        if found:
            out.setdefault(task, {}).setdefault(method, []).append(float(found[-1]) / 60)
    return out


def cost_markdown(minutes: dict, tasks=TASKS) -> str:
    """The measured cost: median training minutes per run (task x method) and their sum, one seed's cost."""
    rows, total = [], 0.0
    for task in [t for t in tasks if t in minutes]:
        for method, values in minutes[task].items():
            med = statistics.median(values)
            total += med
            rows.append(f"| {task} | {method} | {med:.0f} | {min(values):.0f}-{max(values):.0f} | {len(values)} |")
    if not rows:
        return ""
    return ("\nMeasured training time per run (wall minutes, fairseq's \"done training in\"; they depend on what ran "
            "beside them: these ran two at a time on 2 cores, one thread each, so the cores take about half the "
            "sum):\n\n"
            "| task | method | median | range | runs |\n|---|---|---|---|---|\n" + "\n".join(rows)
            + f"\n\nOne seed of the runs above: {total:.0f} run-minutes, "
            f"about {total / 2 / 60:.1f} hours on 2 cores.\n")


def _cell(values) -> str:
    """Mean ± std of the values a curve reached; ``(n=k)`` when fewer seeds than the row's reached it."""
    reached = [v for v in values if v is not None]
    if not reached:
        return "-"
    cell = f"{statistics.mean(reached):.2f}" + (f" ± {statistics.stdev(reached):.2f}" if len(reached) > 1 else "")
    return cell + (f" (n={len(reached)})" if len(reached) < len(values) else "")


def gate_log(run_dir: str) -> dict:
    """Per epoch of a gated run (fairseq's train.log): ``conflict_rate``, the share of updates whose auxiliary term
    the gate dropped, and ``grad_cos``, the mean cosine of the two gradients."""
    stats = [st for st in _records.epoch_stats(os.path.join(run_dir, "train.log")) if "train_conflict_rate" in st]
    return {"conflict_rate": [float(st["train_conflict_rate"]) for st in stats],
            "grad_cos": [float(st["train_grad_cos"]) for st in stats]}


def gate_pairs(runs_dir: str, tasks, gated_methods: Dict[str, str]) -> Dict[str, Dict[str, dict]]:
    """task -> gated method -> {"metric", "seeds", "base", "gated", "conflict_rate", "grad_cos"} over the seeds
    where both the gated method and its ungated base (GATED_METHODS: gated -> base) have a result; the rates are
    per seed, averaged over epochs, the cosines per seed as [first epoch, last epoch]."""
    out: Dict[str, Dict[str, dict]] = {}
    for task in tasks:
        for gated, base in gated_methods.items():
            res = {m: {int(os.path.basename(os.path.dirname(p))[4:]): _records.load(os.path.dirname(p))
                       for p in glob.glob(os.path.join(runs_dir, task, m, "seed*", "result.json"))}
                   for m in (gated, base)}
            seeds = sorted(set(res[gated]) & set(res[base]))
            if not seeds:
                continue
            logs = [gate_log(os.path.join(runs_dir, task, gated, f"seed{s}")) for s in seeds]
            out.setdefault(task, {})[gated] = {
                "metric": res[base][seeds[0]]["best_metric"], "seeds": seeds, "base_method": base,
                "base": [res[base][s]["best_value"] for s in seeds],
                "gated": [res[gated][s]["best_value"] for s in seeds],
                "conflict_rate": [statistics.mean(g["conflict_rate"]) if g["conflict_rate"] else None for g in logs],
                "grad_cos": [[g["grad_cos"][0], g["grad_cos"][-1]] if g["grad_cos"] else None for g in logs]}
            entry = out[task][gated]
            iv = _paired.interval([g - b for g, b in zip(entry["gated"], entry["base"])])
            entry.update(ci95=[iv["lo"], iv["hi"]], ahead=iv["ahead"], verdict=_paired.verdict(iv))
    return out


def gate_markdown(pairs: Dict[str, Dict[str, dict]]) -> str:
    """The gated rows against their base, paired by seed, with the share of updates the gate dropped."""
    rows = []
    for task, by_method in pairs.items():
        for gated, p in by_method.items():
            d = [g - b for g, b in zip(p["gated"], p["base"])]
            rates = [f"{100 * r:.1f}%" if r is not None else "?" for r in p["conflict_rate"]]
            cos = [f"{c[0]:.2f}→{c[1]:.2f}" if c else "?" for c in p["grad_cos"]]
            seeds = ", ".join(map(str, p["seeds"]))
            rows.append(f"| {task} | {gated} − {p['base_method']} | {p['metric']} | {seeds} | {_cell(p['base'])} | "
                        f"{_cell(p['gated'])} | {_paired.cell(d)} | {', '.join(rates)} | {', '.join(cos)} |")
    if not rows:
        return ""
    return ("\nThe ACL-Grad rule on SCL (`scl_grad`: CE+SCL that drops the SCL term of a batch whose gradient points "
            "against CE's, --scl-grad) against CE+SCL (`scl`), paired by seed; 'dropped' is the share of updates "
            "whose SCL term the gate dropped (per seed, over all epochs), cos is the mean cosine of the two gradients "
            "in the first and the last epoch; difference: " + _paired.HEADER + ":\n\n| task | pair | metric | seeds | "
            "ungated | gated | difference | dropped | cos first→last |\n|---|---|---|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


def legacy_markdown(runs_dir: str) -> str:
    """Which rows come from runs trained before converted checkpoints carried their conventions record (pairs
    with fairseq's double separator, no segment embedding, head dropout 0), if any."""
    old = sorted({"/".join(p.split(os.sep)[-4:-2])
                  for p in glob.glob(os.path.join(runs_dir, "*", "*", "seed*", "command.sh"))
                  if not _glue_runs.trained_setting(os.path.dirname(p))["conventions"]})
    if not old:
        return ""
    return ("\nRows trained before the conventions record (no segment embedding, head dropout 0; pairs with fairseq's "
            "double separator): " + ", ".join(old) + ".\n")


def restored_markdown(runs_dir: str) -> str:
    """Which runs are records restored from a committed table (their folders lost): values only, no training
    time."""
    restored = {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "*", "*", "seed*", "result.json"))):
        res = _records.load(os.path.dirname(path))
        if res.get("restored_from"):
            restored.setdefault(res["restored_from"], []).append("/".join(path.split(os.sep)[-4:-1]))
    return "".join(f"\nRestored from {src} (their run folders were lost): {', '.join(runs)}. Values only: without "
                   f"their training logs they are not in the training time below (`git show {src.split()[-1]}:"
                   f"{src.split()[0].replace('.json', '.md')}` has it).\n" for src, runs in restored.items())


# the GLUE dev sets' token lengths (benchmarks/dev_lengths.py writes it), for FLOPs from the run records
LENGTHS_RECORD = os.path.join(_glue_runs.REPO, "benchmarks", "results", "dev_lengths.json")


def read_lengths(path: str = LENGTHS_RECORD) -> Optional[dict]:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def flops_axis(ee: dict, lengths: dict, num_classes: int = 2) -> dict:
    """A copy of an early-exit result whose settings' ``layer_speedup`` is the FLOPs speed-up (estimated as
    benchmarks/dev_lengths.py's docstring says), so that report.speedup_profile reads the curve at fixed FLOPs
    speed-ups."""
    hist = {int(t): c for t, c in lengths["histogram"].items()}
    shape = flops.Shape(num_classes=num_classes, exit_layers=ee["exit_layers"], **lengths["shape"])
    count = sum(hist.values())
    layer = sum(c * flops.layer_flops(t, shape.dim, shape.ffn_dim) for t, c in hist.items()) / count
    head = flops.head_flops(shape)
    full = shape.exit_layers[-1] * layer + head
    settings = []
    for s in ee["settings"]:
        cost = sum(share * (lay * layer + (m + 1) * head)
                   for m, (share, lay) in enumerate(zip(s["exit_fractions"], shape.exit_layers)))
        settings.append({**s, "layer_speedup": full / cost})
    return {**ee, "settings": settings}


def flops_profile(ee: dict, lengths: dict) -> dict:
    """report.speedup_profile on the FLOPs axis."""
    return report.speedup_profile(flops_axis(ee, lengths), "entropy")
