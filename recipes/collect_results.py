#!/usr/bin/env python3
"""Turn the runs' result.json files (written by recipes/glue/finetune.sh) into the results table.

    python recipes/collect_results.py RUNS_DIR [--output results.md|results.json] [--format md|json] [--plot-dir DIR]

One row per method, one column per (task, GLUE metric) as recipes/glue/hparams.tsv's ``report`` column
lists them (CoLA MCC, MRPC F1 and accuracy, STS-B Pearson and Spearman, MNLI matched and mismatched, ...).
A cell is ``mean ± std (n=N)`` over seeds: the sample standard deviation, at each run's best checkpoint.
For multi-exit runs (result.json names an early_exit.json) it also draws, per task, the overlay of the
quality-vs-speed-up curves of every method (``acl_fairseq.inference.report.plot_overlay``), links it, and tabulates
each exit's primary metric over seeds.
``--format json`` (the default for an --output ending in .json) writes the same numbers as JSON instead of
markdown. The table is generated: paste it into the README rather than typing numbers.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from acl_runtime import glue_tasks
from acl_runtime.io import atomic  # noqa: E402
from acl_runtime.tables import read_tsv
from acl_torch.glue_metrics import mean_std

HERE = os.path.dirname(os.path.abspath(__file__))
HPARAMS = glue_tasks.TABLE  # the task table (recipes/glue/hparams.tsv links to it)
METHODS = os.path.join(HERE, "glue", "methods.tsv")

METRIC_NAMES = {"mcc": "MCC", "accuracy": "Acc", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman"}
# column names where a task has more than one validation subset (fairseq-preprocess's valid, valid1, ...)
SUBSET_NAMES = {("MNLI", "valid"): "MNLI-m", ("MNLI", "valid1"): "MNLI-mm"}


def task_columns(hparams: List[glue_tasks.TaskSpec]) -> "OrderedDict[str, List[Tuple[str, str]]]":
    """task -> [(subset, metric), ...] in table order, from the ``report`` column."""
    out = OrderedDict()
    for row in hparams:
        cols = []
        for item in row.report.split(","):
            subset, _, metric = item.rpartition("/")
            cols.append((subset or row.valid_subsets[0], metric))
        out[row.name] = cols
    return out


def column_name(task: str, subset: str, metric: str, first_subset: str) -> str:
    name = SUBSET_NAMES.get((task, subset)) or (task if subset == first_subset else f"{task} {subset}")
    return f"{name} ({METRIC_NAMES.get(metric, metric)})"


def load_results(runs_dir: str) -> List[dict]:
    """Every result.json under ``runs_dir`` (sorted by path), each with ``_dir`` set to its folder."""
    results, seen = [], {}
    for root, dirs, files in os.walk(runs_dir):
        dirs.sort()
        if "result.json" not in files:
            continue
        path = os.path.join(root, "result.json")
        with open(path, encoding="utf-8") as f:
            res = json.load(f)
        key = (res["task"], res["method"], res["seed"])
        if key in seen:
            print(f"warning: {path} repeats {key} of {seen[key]}; keeping the first", file=sys.stderr)
            continue
        seen[key] = path
        res["_dir"] = root
        results.append(res)
    return results


def format_cell(values: List[float]) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    spread = "" if std is None else f" ± {std:.2f}"
    return f"{mean:.2f}{spread} (n={len(values)})"


def summarize(results: List[dict], hparams: List[glue_tasks.TaskSpec], method_order: List[str]) -> dict:
    """The table as data: columns, methods (rows) and per-cell values over seeds."""
    columns = task_columns(hparams)
    first_subset = {row.name: row.valid_subsets[0] for row in hparams}
    tasks_present = {r["task"] for r in results}
    unknown = sorted(tasks_present - set(columns))
    for task in unknown:  # a task missing from the table: show its checkpoint-selection metric
        run = next(r for r in results if r["task"] == task)
        first_subset[task] = next(iter(run["best_valid"]))
        columns[task] = [(first_subset[task], run["best_metric"])]
    cols = [
        {"task": t, "subset": s, "metric": m, "name": column_name(t, s, m, first_subset[t])}
        for t, pairs in columns.items()
        if t in tasks_present
        for s, m in pairs
    ]
    present = {r["method"] for r in results}
    methods = [m for m in method_order if m in present] + sorted(present - set(method_order))
    cells = []
    for method in methods:
        for col in cols:
            runs = sorted(
                (r for r in results if r["method"] == method and r["task"] == col["task"]), key=lambda r: r["seed"]
            )
            pairs = [(r["seed"], r["best_valid"].get(col["subset"], {}).get(col["metric"])) for r in runs]
            pairs = [(s, float(v)) for s, v in pairs if isinstance(v, (int, float))]
            mean, std = mean_std([v for _, v in pairs]) if pairs else (None, None)
            cells.append(
                {
                    "method": method,
                    **{k: col[k] for k in ("task", "subset", "metric", "name")},
                    "seeds": [s for s, _ in pairs],
                    "values": [v for _, v in pairs],
                    "n": len(pairs),
                    "mean": mean,
                    "std": std,
                }
            )
    return {"columns": [c["name"] for c in cols], "methods": methods, "cells": cells}


def per_exit_values(groups: Dict[str, Dict[str, List[dict]]]) -> dict:
    """task -> {"metric": the primary metric, "methods": {method: {exit layer: [value per seed]}}}, from the
    ``per_exit`` rows of the early_exit.json files; tasks without per-exit metrics are left out."""
    out: dict = OrderedDict()
    for task, by_method in groups.items():
        values: Dict[str, Dict[int, List[float]]] = OrderedDict()
        metric = None
        for method, runs in by_method.items():
            for ee in runs:
                for row in ee.get("per_exit") or []:
                    metric = metric or ee.get("primary_metric") or next(iter(row["metrics"]))
                    if isinstance(row["metrics"].get(metric), (int, float)):
                        values.setdefault(method, OrderedDict()).setdefault(int(row["layer"]), []).append(
                            float(row["metrics"][metric]))
        if values:
            out[task] = {"metric": metric, "methods": values}
    return out


def per_exit_markdown(per_exit: dict) -> List[str]:
    """Per task, a table of each exit's primary metric: one row per method, one column per exit layer."""
    lines: List[str] = []
    for task, data in per_exit.items():
        layers = sorted({layer for per in data["methods"].values() for layer in per})
        lines += ["", f"{task}, {METRIC_NAMES.get(data['metric'], data['metric'])} of every exit (the best checkpoint "
                      "of each run, mean ± std over seeds):", "",
                  "| method | " + " | ".join(f"exit {layer}" for layer in layers) + " |",
                  "|---|" + "---|" * len(layers)]
        for method, per in data["methods"].items():
            lines.append(f"| {method} | " + " | ".join(format_cell(per.get(layer, [])) for layer in layers) + " |")
    return lines


def markdown(summary: dict, plots: Dict[str, str], per_exit: Optional[List[str]] = None) -> str:
    names = summary["columns"]
    lines = [
        "| method | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for method in summary["methods"]:
        row = [c for c in summary["cells"] if c["method"] == method]
        lines.append(f"| {method} | " + " | ".join(format_cell(c["values"]) for c in row) + " |")
    lines += [
        "",
        "GLUE dev sets, best checkpoint of each run (selected on the same dev set by the task's GLUE metric):",
        "mean ± sample standard deviation over n seeds.",
    ]
    for task, path in plots.items():
        lines += ["", f"Early exit on {task}, quality against speed-up (mean and spread over seeds):", "",
                  f"![early exit {task}]({path})"]
    lines += per_exit or []
    return "\n".join(lines) + "\n"


def early_exit_groups(results: List[dict]) -> Dict[str, Dict[str, List[dict]]]:
    """task -> method -> [early_exit.json dicts over seeds], for the runs that have one."""
    groups: Dict[str, Dict[str, List[dict]]] = OrderedDict()
    for r in sorted(results, key=lambda r: (r["task"], r["method"], r["seed"])):
        rel = r.get("early_exit_json")
        if not rel:
            continue
        path = rel if os.path.isabs(rel) else os.path.join(r["_dir"], rel)
        if not os.path.isfile(path):
            print(f"warning: {path} (named by {r['_dir']}/result.json) is missing", file=sys.stderr)
            continue
        with open(path, encoding="utf-8") as f:
            groups.setdefault(r["task"], OrderedDict()).setdefault(r["method"], []).append(json.load(f))
    return groups


def plot_early_exit(groups: Dict[str, Dict[str, List[dict]]], plot_dir: str, link_dir: str) -> Dict[str, str]:
    """One overlay plot per task; returns task -> path relative to ``link_dir``."""
    if not groups:
        return {}
    try:
        from acl_fairseq.inference.report import plot_overlay
    except ImportError as e:
        print(
            f"warning: multi-exit results found but acl_fairseq.inference.report.plot_overlay is unavailable ({e}); "
            "no early-exit overlay plot was written (install the package: pip install -e .)",
            file=sys.stderr,
        )
        return {}
    os.makedirs(plot_dir, exist_ok=True)
    out = OrderedDict()
    for task, by_method in groups.items():
        path = os.path.join(plot_dir, f"early_exit_{task}.png")
        plot_overlay(by_method, path)
        out[task] = os.path.relpath(path, link_dir)
        print(f"[collect] wrote {path}", file=sys.stderr)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=__doc__.split("\n\n")[1].strip())
    p.add_argument("runs_dir", help="folder searched recursively for result.json (e.g. OUT_ROOT/runs)")
    p.add_argument("--output", help="write here instead of standard output")
    p.add_argument("--format", choices=["md", "json"], help="markdown table or the numbers as JSON (default: json "
                   "for an --output ending in .json, else md)")
    p.add_argument("--plot-dir", help="where early-exit plots go (default: beside --output, else RUNS_DIR)")
    p.add_argument("--hparams", default=HPARAMS, help="the task table (report column, task order)")
    args = p.parse_args(argv)

    if not os.path.isdir(args.runs_dir):
        p.error(f"{args.runs_dir} is not a folder")
    results = load_results(args.runs_dir)
    if not results:
        print(f"error: no result.json under {args.runs_dir}", file=sys.stderr)
        return 1
    method_order = [row["method"] for row in read_tsv(METHODS)] if os.path.isfile(METHODS) else []
    table = list(glue_tasks.tasks(args.hparams).values())
    summary = summarize(results, table, list(OrderedDict.fromkeys(method_order)))

    link_dir = os.path.dirname(os.path.abspath(args.output)) if args.output else os.path.abspath(args.runs_dir)
    groups = early_exit_groups(results)
    plots = plot_early_exit(groups, args.plot_dir or link_dir, link_dir)
    per_exit = per_exit_values(groups)
    if (args.format or ("json" if (args.output or "").endswith(".json") else "md")) == "json":
        text = json.dumps({**summary, "plots": plots, "per_exit": per_exit}, indent=2) + "\n"
    else:
        text = markdown(summary, plots, per_exit_markdown(per_exit))
    if args.output:
        atomic.write_text(args.output, text)
        print(f"[collect] {len(results)} runs -> {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
