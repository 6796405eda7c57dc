"""The few-shot SST-2 protocol that fewshot.py and tune_fewshot.py share: the methods, the schedule per N
(recipes/glue/fewshot.tsv) and where a draw's binarized data lives."""
import math
import os
from typing import Dict

import _glue_runs as G
from acl_runtime.tables import read_tsv

TASK = "SST-2"
METHODS = ["ce", "scl", "acl_embed", "acl_grad"]
# Schedule per N: the recipe table recipes/glue/fewshot.tsv (batch, epochs, validation interval, lr, and the
# reason for each). Method hyperparameters are methods.tsv's; only the schedule is few-shot.
SCHEDULE_TABLE = os.path.join(G.REPO, "recipes", "glue", "fewshot.tsv")


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


def data_bin(work: str, n: int, seed: int) -> str:
    return os.path.join(work, "data", "fewshot", f"{TASK}-N{n}-seed{seed}-bin")
