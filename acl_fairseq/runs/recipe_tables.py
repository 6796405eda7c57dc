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
class Method:
    name: str
    criterion: str
    exits: str  # single | multi
    needs_class_labels: bool  # the criterion contrasts or distils class distributions: no regression task
    flags: List[str]


def _table(path: str, default: str) -> str:  # the driver's HPARAMS_TABLE / METHODS_TABLE, else the recipe's
    return path or os.path.join(REPO, "recipes", "glue", default)


def tasks(table: str = "") -> Dict[str, glue_tasks.TaskSpec]:
    """Every row of the task table (hparams.tsv), in order: the runner's HPARAMS_TABLE, else the package's
    (:func:`acl_runtime.glue_tasks.tasks`, the one record of a task)."""
    return glue_tasks.tasks(table or None)


def method_names(table: str = "") -> List[str]:
    return list(dict.fromkeys(r["method"] for r in read_tsv(_table(table, "methods.tsv"))))


def method(name: str, task: str, table: str = "") -> Optional[Method]:
    """The method's row for ``task``, else its ``*`` row (the last one of each), else None."""
    rows = [r for r in read_tsv(_table(table, "methods.tsv")) if r["method"] == name]
    row = ([r for r in rows if r["task"] == task] or [r for r in rows if r["task"] == "*"] or [None])[-1]
    if row is None:
        return None
    return Method(name, row["criterion"], row["exits"], row["needs_class_labels"] == "1",
                  [] if row["flags"] == "-" else row["flags"].split())


def refusal(task: glue_tasks.TaskSpec, m: Method) -> Optional[str]:
    """Why ``m`` cannot run on ``task`` (a criterion that needs class labels on a regression task), or None."""
    if task.regression and m.needs_class_labels:
        return (f"{task.name} is a regression task (--regression-target) and method '{m.name}' uses the contrastive "
                f"criterion '{m.criterion}', which needs class labels; run 'ce' (sentence_ce) or 'multi_exit_ce' on "
                f"{task.name}.")
    return None
