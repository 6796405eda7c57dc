"""The converted-encoder protocol that quality.py, hf_parity.py, grad_conflict.py and predict_speed.py share: the
schedule table (recipes/glue/converted.tsv), the GLUE training sizes, the seeded SST-2 training subset, the
binarized data, and one run of the table's schedule through the recipes' runner."""
import os
import random
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import _glue_runs
import _records
from acl_fairseq.runs import recipe_tables
from acl_runtime.tables import read_tsv

CONVERTED_TABLE = os.path.join(_glue_runs.REPO, "recipes", "glue", "converted.tsv")
TRAIN_SIZES = {"RTE": 2490, "CoLA": 8551, "SST-2": 67349, "STS-B": 5749}
SUBSET_SEED = 1  # the SST-2 training subset is the same for every run


def read_protocol(path: str = CONVERTED_TABLE) -> Dict[str, Dict[str, object]]:
    """task -> dict(lr, pooling, epochs, batch, train_subset, reason) of the converted-encoder recipe table."""
    rows = read_tsv(path, ["task", "lr", "pooling", "epochs", "batch_size", "train_subset", "reason"])
    return {r["task"]: dict(lr=float(r["lr"]), pooling=r["pooling"], epochs=int(r["epochs"]),
                            batch=int(r["batch_size"]), train_subset=int(r["train_subset"]) or None,
                            reason=r["reason"]) for r in rows}


PROTOCOL = read_protocol()


def check_finished(run_dir: str, sch: Dict[str, object]) -> None:
    """A finished run of another schedule, or of the pipeline before the conventions record, must not pass for this
    one (the driver skips a run with a result)."""
    if not os.path.isfile(os.path.join(run_dir, "result.json")):
        return
    got = _glue_runs.trained_setting(run_dir)
    if (got["lr"], got["pooling"], got["epochs"]) != (sch["lr"], sch["pooling"], sch["epochs"]):
        sys.exit(f"quality: {run_dir} was trained with lr {got['lr']:g}, {got['pooling']} pooling, {got['epochs']} "
                 f"epochs, but {CONVERTED_TABLE} now says lr {sch['lr']:g}, {sch['pooling']} pooling, {sch['epochs']} "
                 "epochs: move the run away (or pass another --work) so that it is trained again")
    if not got["conventions"]:
        sys.exit(f"quality: {run_dir} was trained before the converted encoder carried its conventions record (pairs "
                 "with fairseq's double separator, no segment embedding, no head dropout): move the run away (or pass "
                 "another --work) so that it is trained again")


def run_one(task: str, method: str, seed: int, work: str, enc: "_glue_runs.Encoder", extra=(), keep_checkpoints=False,
            threads: int = 2, records: Optional[str] = None) -> Tuple[str, dict]:
    """One run of the table's schedule through the driver, into WORK/quality/runs/TASK/METHOD/seedS, its record
    saved under RECORDS (skipped when either has a result); returns the folder holding it and result.json."""
    out_root = os.path.join(work, "quality")
    sch = PROTOCOL[task]
    rd = _glue_runs.run_dir(out_root, task, method, seed)

    def train():
        db = binarize(task, work, enc)
        n = sch["train_subset"] or TRAIN_SIZES[task]
        multi = recipe_tables.method(method, task).exits == "multi"
        env = _glue_runs.driver_env(_glue_runs.Encoder(enc.dir, pooling=sch["pooling"]), db, out_root, seed, multi,
                                    _glue_runs.schedule(sch["lr"], sch["batch"], sch["epochs"], n, 10))
        env["OMP_NUM_THREADS"] = str(threads)
        _glue_runs.finetune(task, method, env, ["--no-last-checkpoints", *extra])
        if not keep_checkpoints:
            _glue_runs.drop_checkpoints(rd)

    def check(done):
        check_finished(done, sch)
        if done != rd:  # trained on another machine or in an earlier session
            _glue_runs.log(f"recorded: {task} {method} seed {seed} ({done})")

    return _records.result_or_train(rd, work, records, train, check)


def subset_indices(n_total: int, n: int, seed: int = SUBSET_SEED) -> List[int]:
    """The seeded training subset: ``n`` of the ``n_total`` rows of train.tsv after its header, in file order."""
    return sorted(random.Random(seed).sample(range(n_total), n))


def binarize(task: str, work: str, enc: _glue_runs.Encoder) -> str:
    out = os.path.join(work, "data", "quality", f"{task}-bin")
    if os.path.isfile(os.path.join(out, "stats.json")):
        return out
    src = os.path.join(_glue_runs.GLUE_DIR, task)
    n = PROTOCOL[task]["train_subset"]
    if not n:
        return _glue_runs.preprocess(task, src, out, enc)
    with tempfile.TemporaryDirectory(prefix=f"acl_{task}_subset_") as tmp:  # outside the repo, deleted after
        with open(os.path.join(src, "train.tsv"), encoding="utf-8") as f:
            header, *rows = f.read().splitlines()
        keep = subset_indices(len(rows), n, SUBSET_SEED)
        with open(os.path.join(tmp, "train.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join([header] + [rows[i] for i in keep]) + "\n")
        os.symlink(os.path.join(src, "dev.tsv"), os.path.join(tmp, "dev.tsv"))
        _glue_runs.preprocess(task, tmp, out, enc)
    return out
