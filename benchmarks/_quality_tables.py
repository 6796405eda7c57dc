"""The tables of benchmarks/quality.py, read from the run records only (RUNS_DIR/TASK/METHOD/seedS): the methods
against their baselines, the gated methods against their base (the ACL-Grad rule on SCL) and the multi-exit methods
at every exit and at fixed speed-ups, each paired by seed with its 95% interval (_paired.py); the training time, and
which rows are restored or legacy."""
import glob
import json
import os
import re
import statistics
from typing import Callable, Dict, List, Optional, Sequence

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
MULTI = ["multi_exit_ce", "acl_cross_layer", "multi_exit_kd", "acl_cross_layer_cl_only"]


def by_seed(runs_dir: str, task: str, method: str, read: Callable[[str], object] = _records.load) -> Dict[int, object]:
    """seed -> ``read(run folder)`` of every finished run (one with a result.json) of TASK and METHOD."""
    return {int(os.path.basename(os.path.dirname(p))[4:]): read(os.path.dirname(p))
            for p in sorted(glob.glob(os.path.join(runs_dir, task, method, "seed*", "result.json")))}


def paired_fields(diffs: Sequence[float]) -> dict:
    """The paired differences' mean, 95% interval, seeds ahead and verdict, as the records keep them."""
    iv = _paired.interval(diffs)
    return {"mean": iv["mean"], "ci95": [iv["lo"], iv["hi"]], "ahead": iv["ahead"], "verdict": _paired.verdict(iv)}


def table(head: Sequence[str], rows: List[str]) -> str:
    """A markdown table: the head, its rule, then the rows (each already ``| ... |``)."""
    return "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n" + "\n".join(rows) + "\n"


def quality_pairs(runs_dir: str, tasks=TASKS, pairs=QUALITY_PAIRS) -> Dict[str, Dict[str, dict]]:
    """task -> "method − base" -> {"method", "base", "metric", "seeds", "diffs", "ci95", "ahead", "verdict"} over the
    seeds where both have a result (best checkpoint, the task's GLUE metric)."""
    out: Dict[str, Dict[str, dict]] = {}
    for task in tasks:
        for method, base in pairs:
            a, b = by_seed(runs_dir, task, method), by_seed(runs_dir, task, base)
            seeds = sorted(set(a) & set(b))
            if seeds:
                diffs = [a[s]["best_value"] - b[s]["best_value"] for s in seeds]
                out.setdefault(task, {})[f"{method} − {base}"] = {
                    "method": method, "base": base, "metric": b[seeds[0]]["best_metric"], "seeds": seeds,
                    "diffs": diffs, **paired_fields(diffs)}
    return out


def quality_pairs_markdown(pairs: Dict[str, Dict[str, dict]]) -> str:
    """The quality table's comparisons, paired by seed."""
    rows = [f"| {task} | {name} | {p['metric']} | {', '.join(map(str, p['seeds']))} | {_paired.cell(p['diffs'])} |"
            for task, by_pair in pairs.items() for name, p in by_pair.items()]
    if not rows:
        return ""
    return ("\nPaired by seed (the runs above, same seed = same initialisation and data order): " + _paired.HEADER
            + ":\n\n" + table(["task", "pair", "metric", "seeds", "difference"], rows))


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
            "sum):\n\n" + table(["task", "method", "median", "range", "runs"], rows)
            + f"\nOne seed of the runs above: {total:.0f} run-minutes, about {total / 2 / 60:.1f} hours on 2 cores.\n")


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
            res = {m: by_seed(runs_dir, task, m) for m in (gated, base)}
            seeds = sorted(set(res[gated]) & set(res[base]))
            if not seeds:
                continue
            logs = [gate_log(os.path.join(runs_dir, task, gated, f"seed{s}")) for s in seeds]
            entry = out.setdefault(task, {})[gated] = {
                "metric": res[base][seeds[0]]["best_metric"], "seeds": seeds, "base_method": base,
                "base": [res[base][s]["best_value"] for s in seeds],
                "gated": [res[gated][s]["best_value"] for s in seeds],
                "conflict_rate": [statistics.mean(g["conflict_rate"]) if g["conflict_rate"] else None for g in logs],
                "grad_cos": [[g["grad_cos"][0], g["grad_cos"][-1]] if g["grad_cos"] else None for g in logs]}
            entry.update({k: v for k, v in paired_fields([g - b for g, b in zip(entry["gated"], entry["base"])]).items()
                          if k != "mean"})
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
            "in the first and the last epoch; difference: " + _paired.HEADER + ":\n\n"
            + table(["task", "pair", "metric", "seeds", "ungated", "gated", "difference", "dropped", "cos first→last"],
                    rows))


def early_exit_result(run_dir: str) -> dict:
    """The early_exit.json that a multi-exit run's result.json names ({} when there is none)."""
    rel = (_records.load(run_dir) or {}).get("early_exit_json")
    if not rel:
        return {}
    with open(rel if os.path.isabs(rel) else os.path.join(run_dir, rel)) as f:
        return json.load(f)


def exit_metrics(run_dir: str) -> dict:
    """{exit layer: primary metric} of one multi-exit run, from the early_exit.json its result.json names."""
    ee = early_exit_result(run_dir)
    return {row["layer"]: row["metrics"][ee["primary_metric"]] for row in ee["per_exit"]} if ee else {}


def speedup_profiles(runs_dir: str, task: str, methods=MULTI, axis: str = "layers") -> Dict[str, Dict[int, dict]]:
    """method -> seed -> {"1.5", "2", "3", "area", "metric"} of every multi-exit run of TASK with early-exit results;
    AXIS "flops" reads the curve at FLOPs speed-ups (dev_lengths.py: the records' exit shares and the dev lengths)."""
    lengths = (read_lengths() or {}).get(task) if axis == "flops" else None
    if axis == "flops" and not lengths:
        return {}
    profiles: Dict[str, Dict[int, dict]] = {}
    for m in methods:
        for seed, ee in by_seed(runs_dir, task, m, early_exit_result).items():
            if ee:
                prof = flops_profile(ee, lengths) if lengths else report.speedup_profile(ee)
                profiles.setdefault(m, {})[seed] = {**prof["at"], "area": prof["area"], "metric": prof["metric"]}
    return profiles


def speedup_markdown(runs_dir: str, task: str, methods=MULTI, base: str = "multi_exit_ce", axis: str = "layers") -> str:
    """Each multi-exit method's metric at 1.5x, 2x and 3x fewer layers (or FLOPs) and its mean over 1x-3x (the entropy
    curve, report.speedup_profile), mean ± std over seeds, then each method minus BASE paired by seed."""
    keys = [f"{x:g}" for x in report.SPEEDUPS] + ["area"]
    labels = [f"at {k}x" if k != "area" else "mean 1x-3x" for k in keys]
    profiles = speedup_profiles(runs_dir, task, methods, axis)
    if not profiles:
        return ""
    metric = next(iter(next(iter(profiles.values())).values()))["metric"]
    rows = [f"| {m} | {len(ps)} | " + " | ".join(_cell([p[k] for p in ps.values()]) for k in keys) + " |"
            for m, ps in profiles.items()]
    what = ("layer speed-up" if axis == "layers" else "FLOPs speed-up (estimated from each setting's exit shares and "
            "the dev set's lengths, as benchmarks/dev_lengths.py says; 2 FLOPs per multiply-add, embeddings excluded)")
    out = (f"\n{task}: {metric} against {what} on the entropy curve (interpolated; '-' where a curve does not "
           "reach the speed-up), mean ± std over seeds:\n\n" + table(["method", "seeds", *labels], rows))
    diffs = []
    for m, ps in profiles.items():
        seeds = sorted(set(ps) & set(profiles.get(base, {}))) if m != base else []
        if seeds:
            cells = [_paired.cell([ps[s][k] - profiles[base][s][k] for s in seeds
                                   if None not in (ps[s][k], profiles[base][s][k])]) for k in keys]
            diffs.append(f"| {m} − {base} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    if diffs:
        out += (f"\nPaired by seed (the seeds both have): {_paired.HEADER}:\n\n"
                + table(["pair", "seeds", *labels], diffs))
    return out


def paired_exit_markdown(runs_dir: str, task: str, method: str = "acl_cross_layer", base: str = "multi_exit_ce") -> str:
    """METHOD minus BASE at every exit, paired by seed (the seeds both have): mean difference with its 95% interval,
    the number of seeds where METHOD is ahead, and the verdict."""
    a, b = (by_seed(runs_dir, task, m, exit_metrics) for m in (method, base))
    seeds = sorted(s for s in set(a) & set(b) if a[s] and b[s])
    if not seeds:
        return ""
    layers = sorted(set.intersection(*(set(a[s]) & set(b[s]) for s in seeds)))
    ivs = [_paired.interval([a[s][layer] - b[s][layer] for s in seeds]) for layer in layers]
    return (f"\n{task}: {method} minus {base} at every exit, paired by seed (seeds {', '.join(map(str, seeds))}): "
            "mean difference [95% interval, Student t, n − 1 degrees of freedom], the seeds where it is ahead, and "
            "the verdict (ahead or behind only where the interval excludes 0):\n\n"
            "| | " + " | ".join(f"exit {layer}" for layer in layers) + " |\n|---|" + "---|" * len(layers) + "\n"
            "| difference | " + " | ".join(f"{iv['mean']:+.2f}" for iv in ivs) + " |\n"
            "| 95% interval | " + " | ".join(_paired.interval_text(iv)[_paired.interval_text(iv).find("["):] or "-"
                                              for iv in ivs) + " |\n"
            "| ahead | " + " | ".join(f"{iv['ahead']} of {iv['n']}" for iv in ivs) + " |\n"
            "| verdict | " + " | ".join(_paired.verdict(iv) for iv in ivs) + " |\n")


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
LENGTHS_RECORD = os.path.join(_glue_runs.RESULTS, "dev_lengths.json")


def read_lengths(path: str = LENGTHS_RECORD) -> Optional[dict]:
    return _records.load(*os.path.split(path))


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
