"""acl-tune's search spaces (recipes/glue/search_spaces.tsv) and its seeded TPE sampler. Standard library and
optuna only.

    space = search_space("scl", "SST-2", "fewshot")   # [Param(lambda, --scl-weight, choice, ...), ...]
    overrides, extra = plan_arguments(space, trial)    # for build_plan(task, method, seed, overrides, extra)
"""
import hashlib
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

from acl_fairseq.runs.plan import REPO
from acl_runtime.tables import read_tsv

SPACE_TABLE = os.path.join(REPO, "recipes", "glue", "search_spaces.tsv")
COLUMNS = ["method", "task", "setting", "param", "target", "kind", "values", "source"]
SETTINGS = ("full", "fewshot")
KINDS = ("choice", "float", "log", "off")


@dataclass(frozen=True)
class Param:
    name: str
    target: str  # a plan setting (upper case: LR) or a fairseq-train flag (--scl-weight)
    kind: str
    values: Tuple[str, ...]  # choice: the categories; float/log: (low, high)
    source: str

    def suggest(self, trial) -> str:
        """The trial's value, as the word the plan or fairseq-train reads."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.values))
        low, high = (float(v) for v in self.values)
        return repr(trial.suggest_float(self.name, low, high, log=self.kind == "log"))


def _check(row: Dict[str, str], where: str) -> Param:
    kind, target = row["kind"], row["target"]
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, not '{kind}'")
    if not (target.startswith("--") or target.isupper()):
        raise ValueError(f"{where}: target must be a plan setting (LR) or a fairseq-train flag (--scl-weight), "
                         f"not '{target}'")
    values = tuple(v.strip() for v in row["values"].split("," if kind == "choice" else ":"))
    if kind in ("float", "log"):
        try:
            low, high = (float(v) for v in values)
        except ValueError:
            raise ValueError(f"{where}: a {kind} range is low:high, not '{row['values']}'") from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high and (kind == "float" or low > 0)):
            raise ValueError(f"{where}: bad {kind} range {row['values']} (low < high, and > 0 for log)")
    elif kind == "choice":
        for v in values:
            try:
                float(v)
            except ValueError:
                raise ValueError(f"{where}: choice '{v}' is not a number") from None
    return Param(row["param"], target, kind, values, row["source"])


def search_space(method: str, task: str, setting: str, table: str = "") -> List[Param]:
    """The method's parameters on ``task`` in ``setting`` (full | fewshot), in the table's order: for each param
    the matching row with the most specific method, then task, then setting (the last of equals)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {', '.join(SETTINGS)}, not '{setting}'")
    path = table or SPACE_TABLE
    best: Dict[str, Tuple[Tuple[bool, bool, bool], int, Dict[str, str]]] = {}
    for i, row in enumerate(read_tsv(path, COLUMNS)):
        if row["method"] not in ("*", method) or row["task"] not in ("*", task) \
                or row["setting"] not in ("*", setting):
            continue
        rank = (row["method"] != "*", row["task"] != "*", row["setting"] != "*")
        if row["param"] not in best or rank >= best[row["param"]][0]:
            best[row["param"]] = (rank, i, row)
    out = []
    for _, i, row in sorted(best.values(), key=lambda b: b[1]):
        p = _check(row, f"{path}: row {i + 1} ({row['method']} {row['param']})")
        if p.kind != "off":
            out.append(p)
    return out


def plan_arguments(space: Sequence[Param], values: Mapping[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """(overrides, extra) of build_plan for the values of ``space``'s params."""
    overrides, extra = {}, []
    for p in space:
        if p.target.startswith("--"):
            extra += [p.target, str(values[p.name])]
        else:
            overrides[p.target] = str(values[p.name])
    return overrides, extra


def trial_seed(seed: int, number: int) -> int:
    """The sampler's seed for trial ``number`` of a study seeded ``seed``: the same on every worker, another for
    each trial, so concurrent workers do not draw the same start-up points."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:4], "little")


def make_sampler(seed: int, n_startup_trials: int):
    """Optuna's TPE, reseeded before each trial from (seed, trial number): a study's trial k draws the same values
    whichever worker runs it (given the same finished trials), and two workers never share a random stream.
    constant_liar: running trials count as bad, so concurrent workers spread out (Optuna's advice for
    distributed TPE)."""
    import optuna

    class SeededTPE(optuna.samplers.TPESampler):
        def before_trial(self, study, trial):
            s = trial_seed(seed, trial.number)
            # the two random streams TPESampler draws from (optuna 5.1's attributes, pinned in requirements.txt)
            self._rng.rng.seed(s)
            self._random_sampler._rng.rng.seed(s)
            super().before_trial(study, trial)

    return SeededTPE(seed=seed, n_startup_trials=n_startup_trials, constant_liar=True)
