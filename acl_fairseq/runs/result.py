"""Write RUN_DIR/result.json for one fine-tuning run: its identity, the best validation metrics parsed
from fairseq's ``--log-format json`` log (RUN_DIR/train.log), and where its early-exit results are.

The best validation is the one ``checkpoint_best.pt`` holds: the largest ``--best-checkpoint-metric`` on
the first validation subset, the *last* one on ties (fairseq saves on ``>=``). Other subsets (MNLI's
``valid1``) are reported at the same update. Standard library only: the runner's last step
(acl_fairseq/runs/runner.py), recorded in command.sh as

    python3 -S -m acl_fairseq.runs.result RUN_DIR --task CoLA --method ce --seed 1 --best-metric mcc
        [--valid-subsets valid]
        [--early-exit valid=early_exit/early_exit.json ...]
"""
import argparse
import json
import os
import re
import sys
from typing import Dict, List

from acl_runtime.io import atomic
from acl_torch.machine import CPU_FLAGS, read_cpu_kind

# `2026-01-01 12:00:00 | INFO | valid | {"epoch": 1, "valid_loss": "0.99", ...}`
LOG_LINE = re.compile(r"\|\s*(?P<tag>[\w.-]+)\s*\|\s*(?P<stats>\{.*\})\s*$")
# throughput and bookkeeping fields fairseq adds to every validation line: not metrics
NOT_METRICS = {"wps", "wpb", "bsz", "ups", "wall", "train_wall", "gb_free", "num_updates"}


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def validation_records(log_path: str, subset: str) -> List[Dict[str, object]]:
    """Every validation of ``subset`` in the log: ``{"epoch", "num_updates", "metrics": {...}}``."""
    records, prefix = [], subset + "_"
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LOG_LINE.search(line)
            if not m or m.group("tag") != subset:
                continue
            try:
                stats = json.loads(m.group("stats"))
            except json.JSONDecodeError:
                continue
            metrics = {
                k[len(prefix):]: _number(v)
                for k, v in stats.items()
                if k.startswith(prefix) and k[len(prefix):] not in NOT_METRICS
                and not k[len(prefix):].startswith("best_")
            }
            num_updates = stats.get(prefix + "num_updates")
            records.append(
                {
                    "epoch": stats.get("epoch"),
                    "num_updates": int(float(num_updates)) if num_updates is not None else None,
                    "metrics": metrics,
                }
            )
    return records


def best_validation(log_path: str, subsets: List[str], best_metric: str) -> Dict[str, object]:
    """The best validation of ``subsets[0]`` by ``best_metric`` and the other subsets at that update."""
    first = validation_records(log_path, subsets[0])
    scored = [(i, r) for i, r in enumerate(first) if isinstance(r["metrics"].get(best_metric), float)]
    if not scored:
        found = sorted(first[-1]["metrics"]) if first else []
        raise SystemExit(
            f"error: no '{subsets[0]}' validation with metric '{best_metric}' in {log_path}"
            + (f" (metrics logged: {', '.join(found)})" if found else " (no validation line at all)")
        )
    best_i, best = max(scored, key=lambda ir: (ir[1]["metrics"][best_metric], ir[0]))
    out = {
        "best_epoch": best["epoch"],
        "best_num_updates": best["num_updates"],
        "num_validations": len(first),
        "best_valid": {subsets[0]: best["metrics"]},
    }
    for subset in subsets[1:]:
        records = validation_records(log_path, subset)
        same = [r for r in records if r["num_updates"] == best["num_updates"]]
        if not same and best_i < len(records):
            same = [records[best_i]]
        out["best_valid"][subset] = same[-1]["metrics"] if same else {}
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--task", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--criterion", default=None)
    p.add_argument("--arch", default=None)
    p.add_argument("--best-metric", required=True)
    p.add_argument("--valid-subsets", default="valid", help="comma-separated, the first tracks the best")
    p.add_argument("--log", default="train.log", help="the json log, relative to run_dir")
    p.add_argument("--early-exit", action="append", default=[], metavar="SUBSET=PATH",
                   help="early_exit.json of a subset, relative to run_dir (repeatable)")
    return p


def _early_exit_paths(run_dir: str, items: List[str]) -> Dict[str, str]:
    """{subset: path relative to run_dir} of the --early-exit evaluations; one the evaluation did not write stops."""
    early_exit = {}
    for item in items:
        subset, _, path = item.partition("=")
        if not os.path.isfile(os.path.join(run_dir, path)):
            raise SystemExit(f"error: the early-exit evaluation wrote no {os.path.join(run_dir, path)}")
        early_exit[subset] = path
    return early_exit


def _provenance(run_dir: str) -> dict:
    """The machine the run trained on (for every record built from it) and the commit it ran, where recorded."""
    kind = read_cpu_kind()
    out = {"cpu_kind": kind.describe(), "cpu_flags": [f for f in CPU_FLAGS if f in kind.flags]}
    head_file = os.path.join(run_dir, "git_head.txt")
    if os.path.isfile(head_file):
        with open(head_file) as f:
            out["git_head"] = f.read().split("\n")[0].strip()
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    subsets = args.valid_subsets.split(",")
    result = {
        "task": args.task,
        "method": args.method,
        "seed": args.seed,
        "criterion": args.criterion,
        "arch": args.arch,
        "best_metric": args.best_metric,
    }
    best = best_validation(os.path.join(args.run_dir, args.log), subsets, args.best_metric)
    result["best_value"] = best["best_valid"][subsets[0]][args.best_metric]
    result.update(best)
    early_exit = _early_exit_paths(args.run_dir, args.early_exit)
    result["early_exit_json"] = early_exit.get(subsets[0])  # relative to this result.json
    result["early_exit_jsons"] = early_exit
    provenance = _provenance(args.run_dir)
    result["cpu_kind"], result["cpu_flags"] = provenance["cpu_kind"], provenance["cpu_flags"]
    result["checkpoint"] = "checkpoint_best.pt"
    result["train_log"] = args.log
    if "git_head" in provenance:
        result["git_head"] = provenance["git_head"]
    path = os.path.join(args.run_dir, "result.json")
    atomic.write_text(path, json.dumps(result, indent=2, sort_keys=False) + "\n")
    print(
        f"[recipe] {args.task} / {args.method} / seed {args.seed}: best {subsets[0]} {args.best_metric} = "
        f"{result['best_value']:g} (epoch {result['best_epoch']}, update {result['best_num_updates']}) -> {path}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
