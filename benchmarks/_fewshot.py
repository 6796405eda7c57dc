"""The few-shot SST-2 protocol that fewshot.py and tune_fewshot.py share: the methods, the schedule per N
(recipes/glue/fewshot.tsv) and where a draw's binarized data lives."""
import math
import os
import statistics
from typing import Dict, List, Optional, Tuple

import _glue_runs
import _paired
import harness
from acl_runtime.tables import read_tsv

TASK = "SST-2"
METHODS = ["ce", "scl", "acl_embed", "acl_grad"]
# Schedule per N: the recipe table recipes/glue/fewshot.tsv (batch, epochs, validation interval, lr, and the
# reason for each). Method hyperparameters are methods.tsv's; only the schedule is few-shot.
SCHEDULE_TABLE = os.path.join(_glue_runs.REPO, "recipes", "glue", "fewshot.tsv")


def read_schedules(path: str = SCHEDULE_TABLE) -> Dict[int, Dict[str, object]]:
    """N -> dict(batch, epochs, every, lr, reason) of the recipe table."""
    rows = read_tsv(path, ["n", "batch_size", "epochs", "validate_every", "lr", "reason"])
    return {int(r["n"]): dict(batch=int(r["batch_size"]), epochs=int(r["epochs"]), every=int(r["validate_every"]),
                              lr=float(r["lr"]), reason=r["reason"]) for r in rows}


SCHEDULES = read_schedules()
TOY_SCHEDULE = dict(batch=8, epochs=2, every=1, lr=1e-4)


def schedule_for(n: int, toy: bool) -> Dict[str, object]:
    if toy:
        return dict(TOY_SCHEDULE)
    if n in SCHEDULES:
        return dict(SCHEDULES[n])
    # other N: the N >= 100 rule, about 70 updates and at least 3 epochs
    batch = 16
    per_epoch = math.ceil(n / batch)
    epochs = max(3, math.ceil(70 / per_epoch))
    return dict(batch=batch, epochs=epochs, every=max(1, epochs // 5), lr=1e-4,
                reason="not in recipes/glue/fewshot.tsv: batch 16, about 70 updates and at least 3 epochs, lr 1e-4")


def result(n: int, method: str, seed: int, sizes: dict, test: dict, valid: dict, best_num_updates, sch: dict,
           seconds: float, **extra) -> dict:
    """A finished run's record (fewshot_result.json), either trainer's: ``extra`` after the seed (``trainer``)."""
    return {"task": TASK, "n": n, "method": method, "seed": seed, **extra, "split_sizes": sizes,
            "test_accuracy": float(test["accuracy"]), "valid_accuracy": float(valid["accuracy"]),
            "best_num_updates": best_num_updates, "total_updates": math.ceil(n / sch["batch"]) * sch["epochs"],
            "schedule": sch, "test_metrics": test, "valid_metrics": valid, "seconds": round(seconds, 1),
            **{k: v for k, v in harness.machine().items() if k in ("cpu_kind", "cpu_flags")}}


def data_bin(work: str, n: int, seed: int) -> str:
    return os.path.join(work, "data", "fewshot", f"{TASK}-N{n}-seed{seed}-bin")


BF16_BOUND = 0.3  # points of test accuracy: bf16 training must stay this close to fp32, seed by seed


def study(bf16: bool, trainer: str = "fairseq") -> str:
    """The runs' folder below the work folder and the records: fp32 and bf16 runs, and the two trainers' runs, never
    share one."""
    return "fewshot_hf" if trainer == "hf" else "fewshot_bf16" if bf16 else "fewshot"


def twin_pairs(runs: List[dict], twins: List[dict], column: str, names: Tuple[str, str],
               bound: Optional[float] = None) -> Dict[str, list]:
    """Each run beside its twin of the same N, method and seed (the same sample, split and seed), in rows whose
    ``column`` names the side (``names``: the runs', the twins'), and per (N, method) the paired test-accuracy
    differences, runs minus twins, with their 95 % interval (held against ``bound`` when given). A run without its
    twin is left out and named in ``unpaired``."""
    mine, theirs = names
    twin = {(r["n"], r["method"], r["seed"]): r for r in twins}
    rows, unpaired = [], []
    for r in runs:
        f = twin.get((r["n"], r["method"], r["seed"]))
        if f is None:
            unpaired.append(f"N={r['n']} {r['method']} seed {r['seed']}")
            continue
        for side, x in ((mine, r), (theirs, f)):
            rows.append({column: side, "n": x["n"], "method": x["method"], "seed": x["seed"],
                         "test_accuracy": x["test_accuracy"], "valid_accuracy": x["valid_accuracy"],
                         "best_num_updates": x.get("best_num_updates"), "seconds": x.get("seconds")})
    paired = []
    for n, method in dict.fromkeys((r["n"], r["method"]) for r in rows):
        acc = {(r[column], r["seed"]): r["test_accuracy"] for r in rows if (r["n"], r["method"]) == (n, method)}
        seeds = sorted({seed for _, seed in acc})
        d = [acc[mine, s] - acc[theirs, s] for s in seeds]
        iv = _paired.interval(d)
        cell = {"n": n, "method": method, "seeds": seeds, f"{mine}_minus_{theirs}_per_seed": d,
                "mean": statistics.mean(d), "max_abs": max(map(abs, d)), "ci95": [iv["lo"], iv["hi"]]}
        if bound is not None:
            cell[f"within_{bound}_points"] = max(map(abs, d)) <= bound
        paired.append(cell)
    return {"rows": rows, "paired": paired, "unpaired": unpaired}
