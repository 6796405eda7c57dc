"""Run records: the part of a finished benchmark run that is kept in the repository.

WORK (``--work``, default runs/bench) is scratch: checkpoints, TensorBoard logs, full training logs. It is
not committed and does not outlive the machine, so a table collected from WORK alone would hold only the
runs of the last machine. A record is the small part of a run that the tables need, kept under
RESULTS/runs/ at the run folder's own path below WORK:

    RESULTS/runs/quality/runs/RTE/ce/seed1/        (WORK/quality/runs/RTE/ce/seed1/)
    RESULTS/runs/parity/lr2e-05_cls/hf/RTE/seed1/  (WORK/parity/lr2e-05_cls/hf/RTE/seed1/)

It keeps result.json, command.sh and git_head.txt, every JSON file that result.json names (the early-exit
report), and train.log cut to the lines the collectors read: fairseq's per-epoch ``| train |`` and ``| valid |``
summaries, "Loaded checkpoint" and "done training in" (a few kB per run instead of 50). The benchmarks save a
record when a run finishes, skip a run whose record exists, and build their tables from the records, so runs
made on different machines and in different sessions add up.

A record restored from a committed table, its run folder lost, has only result.json, with ``restored_from``
saying where its numbers come from.
"""
import json
import os
import re
import sys
from typing import Iterator, Optional

KEPT_FILES = ("result.json", "command.sh", "git_head.txt")
LOG_LINES = re.compile(r"\| (train|valid) \||Loaded checkpoint|done training in")


def records_root(results: str) -> str:
    return os.path.join(results, "runs")


def record_dir(run_dir: str, work: str, records: str) -> str:
    """Where the record of WORK/<path> lives: RECORDS/<path>."""
    rel = os.path.relpath(os.path.abspath(run_dir), os.path.abspath(work))
    if rel.startswith(os.pardir):
        raise ValueError(f"{run_dir} is not inside the work folder {work}")
    return os.path.join(records, rel)


def load(folder: str) -> Optional[dict]:
    """result.json of a run folder or a record, or None when there is none."""
    path = os.path.join(folder, "result.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _named_files(result: dict) -> Iterator[str]:
    """The relative paths of the JSON files a result.json names (acl-evaluate's early-exit reports)."""
    for value in result.values():
        if isinstance(value, str) and value.endswith(".json") and not os.path.isabs(value) \
                and not os.path.normpath(value).startswith(os.pardir):
            yield value
        elif isinstance(value, dict):
            yield from _named_files(value)


def save(run_dir: str, dest: str) -> bool:
    """Write the record of a finished run (one with result.json) into ``dest``; result.json goes last, so a
    record that has it is whole. Returns False (and writes nothing) when the run is not finished."""
    result = load(run_dir)
    if result is None:
        return False
    for rel in _named_files(result):
        if os.path.isfile(os.path.join(run_dir, rel)):
            with open(os.path.join(run_dir, rel), "rb") as f:
                _write(os.path.join(dest, rel), f.read())
    log = os.path.join(run_dir, "train.log")
    if os.path.isfile(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            kept = "".join(line for line in f if LOG_LINES.search(line))
        _write(os.path.join(dest, "train.log"), kept.encode("utf-8"))
    for name in KEPT_FILES:
        if os.path.isfile(os.path.join(run_dir, name)):
            with open(os.path.join(run_dir, name), "rb") as f:
                _write(os.path.join(dest, name), f.read())
    return True


def sync(work: str, sub: str, records: str) -> int:
    """Save the record of every finished run under WORK/SUB whose record is missing, or holds another result
    that is older than the run's (a run trained again replaces its record; a stale run left in WORK does not
    replace a newer record: it is reported). Returns how many records were written."""
    written = 0
    for folder, dirs, files in os.walk(os.path.join(work, sub)):
        dirs.sort()
        if "result.json" not in files:
            continue
        dest = record_dir(folder, work, records)
        theirs = load(dest)
        if theirs == load(folder):
            continue
        if theirs is not None and os.path.getmtime(os.path.join(dest, "result.json")) >= \
                os.path.getmtime(os.path.join(folder, "result.json")):
            print(f"records: kept {dest}, which is newer than the run {folder} (move the run away or train it "
                  "again to replace it)", file=sys.stderr)
            continue
        written += save(folder, dest)
    return written


def finished(run_dir: str, work: str, records: Optional[str]) -> Optional[str]:
    """The folder holding a finished run's result: the run folder itself, else its record, else None."""
    if os.path.isfile(os.path.join(run_dir, "result.json")):
        return run_dir
    if records:
        dest = record_dir(run_dir, work, records)
        if os.path.isfile(os.path.join(dest, "result.json")):
            return dest
    return None
