"""The per-task GLUE table and a strict reader for the official GLUE TSV files.

Column numbers follow fairseq's ``examples/roberta/preprocess_GLUE_tasks.sh`` (there 1-based ``cut -f``,
here 0-based). Quirks handled here, each noted where it is handled:
  * CoLA train/dev have no header row (its test.tsv does), and CoLA dev.tsv has no final newline;
  * MRPC files may start with a UTF-8 byte-order mark;
  * GLUE text contains stray quotes, so lines are split on tabs only (csv.QUOTE_NONE semantics);
  * QQP train/dev rows with the wrong number of fields are dropped, as fairseq's ``awk NF==6`` does
    (counted in stats.json); for every other task such a row is an error.
"""
import functools
import json
import math
import os
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from acl_runtime.tables import read_tsv

# The task table: one row per task, every fact of the task and the recipe's schedule a column. It lives here, shipped
# in the wheel (setup.py package_data); recipes/glue/hparams.tsv is a link to it, and every reader (this module, the
# run plan, collect_results.py) goes through tasks().
TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "glue_tasks.tsv")


@dataclass(frozen=True)
class TaskSpec:
    """A task's row of the table, parsed: every fact of the task a column (the table's header comment says what each
    holds), the one record of a task for every reader (acl-preprocess, acl-evaluate, the hub, the run plan, the
    benchmarks). The recipe's schedule stays text, as the run plan writes it into fairseq-train's flags."""

    name: str
    num_classes: str
    lr: str
    batch_size: str
    total_updates: str
    warmup_updates: str
    best_metric: str
    regression: bool  # a score to regress, not classes: the criteria that need class labels refuse it
    valid_subsets: List[str]
    report: str
    metrics: List[str]  # GLUE's metrics of the task, the one to select checkpoints on first
    regression_scale: Optional[float]  # GLUE's score = the model's target x this (STS-B: 5); None: classification
    leaderboard: List[str]  # the GLUE leaderboard file of each test split, in order (MNLI: matched, mismatched)
    test_files: List[str]  # the GLUE folder's unlabelled test files, in the same order
    inputs: Tuple[int, ...]  # text columns of train/dev (0-based)
    label: int  # label column of train
    dev_label: Optional[int]  # label column of dev when it differs from train (MNLI)
    labels: Optional[Tuple[str, ...]]  # allowed label strings, in class order; None: a regression score
    test_inputs: Tuple[int, ...]  # text columns of test (test has no label)
    label_header: Optional[str]  # header name of the label column, checked to catch a wrong --task
    header: bool  # train/dev start with a header row (test always does)
    ncols: Optional[int]  # field count of header-less files
    dev_files: List[str]  # labelled dev files -> fairseq splits valid, valid1, ...
    filter_malformed: bool  # drop train/dev rows with a wrong field count (QQP) instead of failing
    score_range: Optional[Tuple[float, float]]  # the scores a regression task's files may hold (STS-B: 0 to 5)

    @property
    def pair(self) -> bool:
        return len(self.inputs) == 2

    @property
    def dev(self) -> Tuple[str, ...]:
        """The dev files' stems (``dev_matched``)."""
        return tuple(f[: -len(".tsv")] for f in self.dev_files)

    @property
    def test(self) -> Tuple[str, ...]:
        """The test files' stems, in leaderboard order."""
        return tuple(f[: -len(".tsv")] for f in self.test_files)


def tasks(table: Optional[str] = None) -> Dict[str, TaskSpec]:
    """Every task's record, by GLUE name, in the table's order (``table``: another file of its format; default
    ``TABLE``)."""
    return _read_tasks(table or TABLE)


@functools.lru_cache(maxsize=None)
def _read_tasks(table: str) -> Dict[str, TaskSpec]:
    rows = read_tsv(table)
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if missing:
        raise GlueDataError(f"{table}: no column {', '.join(missing)}. Fix: give the table every column of {TABLE}")
    return {r["task"]: _parse(table, r) for r in rows}


COLUMNS = ("task", "num_classes", "lr", "batch_size", "total_updates", "warmup_updates", "best_metric", "regression",
           "valid_subsets", "report", "metrics", "regression_scale", "leaderboard", "test_files", "inputs", "label",
           "dev_label", "labels", "test_inputs", "label_header", "header", "ncols", "dev_files", "filter_malformed",
           "score_range")


def _parse(table: str, r: Dict[str, str]) -> TaskSpec:
    def listed(column: str) -> List[str]:
        return [] if r[column] in ("", "-") else r[column].split(",")

    def numbers(column: str, kind=int) -> Optional[tuple]:
        try:
            return tuple(kind(x) for x in listed(column)) or None
        except ValueError:
            raise GlueDataError(f"{table}: {r['task']}'s {column} {r[column]!r} is not a list of numbers. Fix: correct "
                                "the row") from None

    scale, bounds = numbers("regression_scale", float), numbers("score_range", float)
    if (r["regression"] == "1") == bool(listed("labels")):
        raise GlueDataError(f"{table}: {r['task']} has regression {r['regression']} and labels {r['labels']!r}: a "
                            "regression task lists no labels ('-'), a classification task lists them. Fix: correct "
                            "the row")
    return TaskSpec(
        r["task"], r["num_classes"], r["lr"], r["batch_size"], r["total_updates"], r["warmup_updates"],
        r["best_metric"], r["regression"] == "1", listed("valid_subsets"), r["report"], listed("metrics"),
        scale[0] if scale else None, listed("leaderboard"), listed("test_files"), numbers("inputs"),
        numbers("label")[0], (numbers("dev_label") or (None,))[0],
        tuple(listed("labels")) or None, numbers("test_inputs"), (listed("label_header") or [None])[0],
        r["header"] == "1", (numbers("ncols") or (None,))[0], listed("dev_files"), r["filter_malformed"] == "1",
        bounds)


def regression_scale(task_name: Optional[str]) -> float:
    """GLUE's score per unit of the model's regression output: the task row's scale, 1 for other tasks."""
    known = tasks().get(task_name)
    return known.regression_scale if known and known.regression_scale is not None else 1.0


def task_of_data(data_dir: Optional[str]) -> Optional[str]:
    """The GLUE task of a binarized folder: its stats.json's ``task`` (acl-preprocess records it), else the folder's
    name without ``-bin`` (``RTE-bin``: RTE) when that is a GLUE task; None when neither says. The one guess of
    every command that is given no task."""
    if not data_dir:
        return None
    path = os.path.join(data_dir, "stats.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            task = json.load(f).get("task")
        if task:
            return task
    stem = os.path.basename(os.path.normpath(data_dir))
    stem = stem[: -len("-bin")] if stem.endswith("-bin") else stem
    return stem if stem in tasks() else None


class GlueDataError(Exception):
    """Bad input or settings; the message names the file (and line) and the fix. No traceback is shown."""


TASKS: Dict[str, TaskSpec] = tasks()  # the package's table, read once


def get_task(name: str) -> TaskSpec:
    """Look a task up by name, forgiving case and dashes (``sts-b``, ``STSB``, ``sst2``)."""
    key = name.upper().replace("-", "")
    for spec in tasks().values():
        if spec.name.upper().replace("-", "") == key:
            return spec
    raise GlueDataError(f"unknown task {name!r}. Fix: use one of {', '.join(tasks())}")


class Example(NamedTuple):
    texts: Tuple[str, ...]
    label: Optional[str]
    line: int  # 1-based line number in the source file, for error messages


@dataclass
class SplitData:
    path: str
    examples: List[Example]
    filtered: int = 0  # malformed rows dropped (QQP only)


def split_path(input_dir: str, stem: str) -> str:
    return os.path.join(input_dir, stem + ".tsv")


def _read_lines(path: str, task: str) -> List[str]:
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        found = sorted(f for f in os.listdir(folder) if f.endswith(".tsv")) if os.path.isdir(folder) else []
        raise GlueDataError(
            f"{path}: missing split {os.path.basename(path)!r} for {task} "
            f"(found: {', '.join(found) or 'no .tsv files'}). "
            f"Fix: point --input at the unpacked GLUE {task} folder (re-download it if files are missing)"
            + ("; pass --skip-test to go without the test split" if "test" in os.path.basename(path) else "")
        )
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")  # -sig: MRPC files may start with a byte-order mark
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise GlueDataError(
            f"{path}:{line}: not valid UTF-8 ({e.reason}). Fix: re-download or re-encode the file as UTF-8"
        ) from None
    # Split on "\n" only (not str.splitlines, which also splits on \x85, \u2028, ... inside text);
    # tolerate CRLF endings and a missing final newline (CoLA dev.tsv has none).
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise GlueDataError(f"{path}: empty file. Fix: re-download the GLUE {task} data; the file should hold examples")
    return lines


def read_split(input_dir: str, stem: str, spec: TaskSpec, kind: str) -> SplitData:
    """Read ``input_dir/stem.tsv`` as a ``kind`` ("train", "dev" or "test") split of ``spec``."""
    path = split_path(input_dir, stem)
    lines = _read_lines(path, spec.name)
    has_header = spec.header or kind == "test"
    cols = spec.test_inputs if kind == "test" else spec.inputs
    label_col = None if kind == "test" else (
        spec.dev_label if kind == "dev" and spec.dev_label is not None else spec.label
    )
    if has_header:
        header = lines[0].split("\t")
        _check_header(path, header, cols, label_col, spec)
        ncols, first = len(header), 1
    else:
        ncols, first = spec.ncols, 0
    if len(lines) <= first:
        raise GlueDataError(f"{path}: has a header but no examples. Fix: re-download the GLUE {spec.name} data")
    out = SplitData(path, [])
    for lineno, line in enumerate(lines[first:], start=first + 1):
        fields = line.split("\t")  # quoting disabled: a '"' is text, never a field delimiter
        if len(fields) != ncols:
            if spec.filter_malformed and kind != "test":
                out.filtered += 1  # fairseq: awk -F '\t' 'NF==6' for QQP train/dev
                continue
            raise GlueDataError(
                f"{path}:{lineno}: expected {ncols} tab-separated fields, found {len(fields)}. Fix: repair or remove "
                "this row (a tab or line break inside the text, or a truncated line); re-download the file if unsure"
            )
        texts = tuple(fields[c].strip() for c in cols)
        label = None if label_col is None else _check_label(path, lineno, fields[label_col].strip(), spec)
        out.examples.append(Example(texts, label, lineno))
    if not out.examples:
        raise GlueDataError(
            f"{path}: no well-formed rows ({out.filtered} filtered). Fix: re-download the GLUE {spec.name} data"
        )
    return out


def _check_header(path: str, header: Sequence[str], cols, label_col, spec: TaskSpec) -> None:
    need = max(cols + ((label_col,) if label_col is not None else ()))
    if len(header) <= need:
        raise GlueDataError(
            f"{path}:1: header has {len(header)} fields but {spec.name} reads column {need + 1}. "
            f"Fix: check that --task {spec.name} matches this folder"
        )
    if label_col is not None and spec.label_header and header[label_col].strip() != spec.label_header:
        raise GlueDataError(
            f"{path}:1: header column {label_col + 1} is {header[label_col].strip()!r}, expected {spec.label_header!r} "
            f"for {spec.name}. Fix: check that --task {spec.name} matches this folder"
        )


def _check_label(path: str, lineno: int, value: str, spec: TaskSpec) -> str:
    if spec.regression:
        low, high = spec.score_range or (-math.inf, math.inf)
        try:
            score = float(value)
        except ValueError:
            score = float("nan")
        if not low <= score <= high:  # NaN too
            raise GlueDataError(
                f"{path}:{lineno}: {spec.name} score {value!r} is not a number in [{low:g}, {high:g}] (the task row's "
                "score_range). Fix: correct the score"
            )
        return value
    if value not in spec.labels:
        raise GlueDataError(
            f"{path}:{lineno}: unknown label {value!r} for {spec.name}; expected one of {', '.join(spec.labels)}. "
            f"Fix: correct the label, or check that --task {spec.name} matches this folder"
        )
    return value
