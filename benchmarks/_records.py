"""Run records: the part of a finished benchmark run that is kept in the repository, under RESULTS/runs/ at the run
folder's own path below WORK (RESULTS/runs/quality/runs/RTE/ce/seed1/ for WORK/quality/runs/RTE/ce/seed1/): its
result file, command.sh, git_head.txt, the JSON files the result names and train.log cut to the lines the
collectors read. Why and how: docs/benchmarks.md, "Run records"."""
import json
import os
import re
import sys
from typing import Callable, Iterator, List, Optional, Tuple

from acl_runtime.io import atomic  # noqa: E402

KEPT_FILES = ("command.sh", "git_head.txt", "result.json")
# The file that makes a run finished: the driver's result.json, unless a benchmark adds a step after training
# (fewshot.py scores the test half and writes fewshot_result.json); every function below takes its name.
RESULT = "result.json"
LOG_LINES = re.compile(r"\| (train|valid) \||Loaded checkpoint|done training in")


def epoch_stats(log_path: str, kind: str = "train") -> List[dict]:
    """fairseq's per-epoch ``| train |`` (or ``| valid |``) statistics in a train.log, in order."""
    marker = f"| {kind} |"
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [json.loads(line[line.index("{"):]) for line in f if marker in line and "{" in line]


def records_root(results: str) -> str:
    return os.path.join(results, "runs")


def record_dir(run_dir: str, work: str, records: str) -> str:
    """Where the record of WORK/<path> lives: RECORDS/<path>."""
    rel = os.path.relpath(os.path.abspath(run_dir), os.path.abspath(work))
    if rel.startswith(os.pardir):
        raise ValueError(f"{run_dir} is not inside the work folder {work}")
    return os.path.join(records, rel)


def load(folder: str, result: str = RESULT) -> Optional[dict]:
    """The result file (result.json unless told) of a run folder or a record, or None when there is none."""
    path = os.path.join(folder, result)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _named_files(result: dict) -> Iterator[str]:
    """The relative paths of the JSON files a result.json names (acl-evaluate's early-exit reports)."""
    for value in result.values():
        if isinstance(value, str) and value.endswith(".json") and not os.path.isabs(value) \
                and not os.path.normpath(value).startswith(os.pardir):
            yield value
        elif isinstance(value, dict):
            yield from _named_files(value)


def save(run_dir: str, dest: str, result: str = RESULT) -> bool:
    """Write the record of a finished run (one with its result file) as ``dest``, replacing what was there: it is
    built beside ``dest`` and moved into place, so a record is whole or absent. Returns False (and writes
    nothing) when the run is not finished."""
    if load(run_dir, result) is None:
        return False
    named = list(_named_files(load(run_dir) or {}))
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    with atomic.staging_folder(dest) as tmp:  # built beside dest, then swapped in whole
        for rel in dict.fromkeys(named + list(KEPT_FILES) + [result]):
            if os.path.isfile(os.path.join(run_dir, rel)):
                with open(os.path.join(run_dir, rel), "rb") as f:
                    _write(os.path.join(tmp, rel), f.read())
        log = os.path.join(run_dir, "train.log")
        if os.path.isfile(log):
            with open(log, encoding="utf-8", errors="replace") as f:
                kept = "".join(line for line in f if LOG_LINES.search(line))
            _write(os.path.join(tmp, "train.log"), kept.encode("utf-8"))
    return True


def _record_is_newer(run_dir: str, dest: str, result: str = RESULT) -> bool:
    """The record holds another result than the run folder, written after it: the run is stale (left in the
    work folder, say, while a newer record came with the repository)."""
    theirs, mine = load(dest, result), load(run_dir, result)
    return theirs is not None and theirs != mine and \
        os.path.getmtime(os.path.join(dest, result)) >= os.path.getmtime(os.path.join(run_dir, result))


def keep(run_dir: str, dest: str, result: str = RESULT) -> bool:
    """Save the record of a finished run unless it is already there or a newer record holds another result
    (reported, and kept). Returns whether a record was written."""
    mine = load(run_dir, result)
    if mine is None or mine == load(dest, result):
        return False
    if _record_is_newer(run_dir, dest, result):
        print(f"records: kept {dest}, which is newer than the run {run_dir} (move the run away, or train it again "
              "to replace the record)", file=sys.stderr)
        return False
    return save(run_dir, dest, result)


def sync(work: str, sub: str, records: str, result: str = RESULT) -> int:
    """``keep`` every finished run under WORK/SUB: a run trained again replaces its record, a stale one does
    not. Returns how many records were written."""
    written = 0
    for folder, dirs, files in os.walk(os.path.join(work, sub)):
        dirs.sort()
        if result in files:
            written += keep(folder, record_dir(folder, work, records), result)
    return written


def finished(run_dir: str, work: str, records: Optional[str], result: str = RESULT) -> Optional[str]:
    """The folder holding a finished run's result: the run folder itself unless its record is newer (see
    ``keep``), else the record, else None."""
    dest = record_dir(run_dir, work, records) if records else None
    if os.path.isfile(os.path.join(run_dir, result)):
        return dest if dest and _record_is_newer(run_dir, dest, result) else run_dir
    if dest and os.path.isfile(os.path.join(dest, result)):
        return dest
    return None


def result_or_train(run_dir: str, work: str, records: Optional[str], train: Callable[[], object],
                    check: Optional[Callable[[str], None]] = None, result: str = RESULT) -> Tuple[str, dict]:
    """One run of a benchmark, trained only when neither its folder nor its record holds a result: returns the
    folder holding the result and the result. ``check(folder)`` vets a finished run before it is used (one of
    another schedule must not pass for this one); the run's record is then saved (``keep``), so a run finished by
    an older version of the benchmark gets one too."""
    done = finished(run_dir, work, records, result)
    if done is None:
        train()
        done = run_dir
    elif check is not None:
        check(done)
    if records:
        keep(run_dir, record_dir(run_dir, work, records), result)
    got = load(done, result)
    if got is None:
        raise RuntimeError(f"{run_dir}: training finished without a {result}")
    return done, got
