"""What the recipe tables say: a task's row of hparams.tsv (its schedule and facts) and a method's row of
methods.tsv, read for the run plan (:mod:`acl_fairseq.runs.plan`), the runner's usage and sweep, acl-tune and the
benchmarks. Standard library only, as the plan (the runner runs it with ``python -S``)."""
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

from acl_runtime import glue_tasks
from acl_runtime.tables import read_tsv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Task:
    """One row of hparams.tsv: the recipe's schedule and the task's facts."""

    name: str
    num_classes: str
    lr: str
    batch_size: str
    total_updates: str
    warmup_updates: str
    best_metric: str
    regression: bool
    valid_subsets: List[str]
    report: str
    metrics: List[str]  # GLUE's metrics of the task, the primary one first
    regression_scale: Optional[float]  # GLUE's score = the model's target x this (STS-B: 5); None: classes
    leaderboard: List[str]  # GLUE leaderboard files of the test splits, in order (MNLI: matched, mismatched)
    test_files: List[str]  # the GLUE folder's unlabelled test files, in the same order


@dataclass(frozen=True)
class Method:
    name: str
    criterion: str
    exits: str  # single | multi
    flags: List[str]

    @property
    def contrastive(self) -> bool:
        """Every criterion but plain cross-entropy needs class labels."""
        return self.criterion != "sentence_ce"


def _table(path: str, default: str) -> str:  # the driver's HPARAMS_TABLE / METHODS_TABLE, else the recipe's
    return path or os.path.join(REPO, "recipes", "glue", default)


def task_rows(table: str = "") -> List[Dict[str, str]]:
    """The task table's rows: the runner's HPARAMS_TABLE, else the package's (``acl_runtime.glue_tasks``)."""
    return glue_tasks.rows(table or None)


def tasks(table: str = "") -> Dict[str, Task]:
    """Every row of the task table (hparams.tsv), in order."""
    out = {}
    for r in task_rows(table):
        scale = r.get("regression_scale", "-")
        out[r["task"]] = Task(
            r["task"], r["num_classes"], r["lr"], r["batch_size"], r["total_updates"], r["warmup_updates"],
            r["best_metric"], r["regression"] == "1", r["valid_subsets"].split(","), r["report"],
            r.get("metrics", r["best_metric"]).split(","), None if scale in ("-", "") else float(scale),
            *([] if r.get(k, "-") == "-" else r[k].split(",") for k in ("leaderboard", "test_files")))
    return out


def method_names(table: str = "") -> List[str]:
    return list(dict.fromkeys(r["method"] for r in read_tsv(_table(table, "methods.tsv"))))


def method(name: str, task: str, table: str = "") -> Optional[Method]:
    """The method's row for ``task``, else its ``*`` row (the last one of each), else None."""
    rows = [r for r in read_tsv(_table(table, "methods.tsv")) if r["method"] == name]
    row = ([r for r in rows if r["task"] == task] or [r for r in rows if r["task"] == "*"] or [None])[-1]
    if row is None:
        return None
    return Method(name, row["criterion"], row["exits"], [] if row["flags"] == "-" else row["flags"].split())


def refusal(task: Task, m: Method) -> Optional[str]:
    """Why ``m`` cannot run on ``task`` (a contrastive criterion on a regression task), or None."""
    if task.regression and m.contrastive:
        return (f"{task.name} is a regression task (--regression-target) and method '{m.name}' uses the contrastive "
                f"criterion '{m.criterion}', which needs class labels; run 'ce' (sentence_ce) or 'multi_exit_ce' on "
                f"{task.name}.")
    return None
