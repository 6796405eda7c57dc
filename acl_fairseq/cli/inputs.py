"""``acl-predict``'s input: a file or standard input, read as a stream of lines and turned into rows.

Lines are read as bytes and decoded one by one, so a line that is not UTF-8 is reported with ``file:line``
and skipped like any other bad row, and the rest is classified; nothing is decoded ahead of the row being
predicted. A UTF-8 byte-order mark is dropped from the first line (stdin included). A NUL byte in the first
8 KiB marks a binary (or UTF-16) file, refused as a whole before the model loads.

Layouts: a GLUE TSV (``--task``; train/dev or test layout told apart by the first line, which is buffered, so
stdin works too), a TSV with ``--columns``, JSONL, or plain text (one sentence per line).
"""
import argparse
import io
import json
import sys
from typing import IO, Iterator, List, NamedTuple, Optional, Tuple

from acl_fairseq.cli.console import UsageError

KINDS = ("auto", "tsv", "jsonl", "text")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
INDEX_HEADERS = ("index", "id")  # GLUE's index column: "index" (test files, STS-B, MNLI, QNLI, RTE, WNLI), "id" (QQP)
ID_RULE = ("Each record's id: with --task, the file's index column where the GLUE file has one (a first header "
           "field 'index' or 'id': every test.tsv, and dev/train of STS-B, MNLI, QNLI, QQP, RTE, WNLI), else the "
           "line number; for JSONL, the object's 'id' when present, else the line number; otherwise the line "
           "number (1-based, a header line counted).")
BINARY_PROBE = 8192


class Row(NamedTuple):
    id: str
    line: int
    texts: Tuple[str, ...]


class BadRow(ValueError):
    """An input row that cannot be predicted; the message starts with ``file:line``."""


def parse_columns(text: str) -> List[int]:
    """``--columns``: 1-based column numbers (``2`` or ``2,3``) -> 0-based indices; an argparse type."""
    try:
        columns = [int(c) for c in text.split(",")]
    except ValueError:
        columns = []
    if not columns or len(columns) > 2 or min(columns) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or two 1-based column numbers, e.g. 2 or 2,3 "
                                         "(column 1 is the first)")
    return [c - 1 for c in columns]


class Input:
    """An open input: ``rows()`` yields :class:`Row` or, in a bad row's place, :class:`BadRow`.

    Opening checks what can be checked before the model loads: the file is text, and (``--task``) which GLUE
    layout its first line announces."""

    def __init__(self, path: str, kind: str = "auto", task: Optional[str] = None,
                 columns: Optional[List[int]] = None, header: bool = False):
        self.name = "<stdin>" if path == "-" else path
        if kind == "auto" and (task or columns):
            kind = "tsv"
        elif kind == "auto" and self.name.endswith(JSONL_SUFFIXES):
            kind = "jsonl"
        if kind == "tsv" and not (task or columns):
            raise UsageError("a TSV input needs --task or --columns")
        self.kind, self.columns, self.header, self.ncols, self.id_column = kind, columns, header, None, None
        self._f: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")
        try:
            self._check_text()
            self._lines = _numbered(self._f)
            if kind == "auto":  # stdin or another name: JSONL when the first line is a JSON object with a text
                first = self._peek()
                self.kind = "jsonl" if first is not None and _is_jsonl_record(first[1]) else "text"
            if task:
                first = self._peek()
                fields = first[1].decode("utf-8", "replace").split("\t") if first else []
                self.columns, self.header, self.ncols, self.id_column = glue_layout(task, fields, self.name)
        except BaseException:
            self.close()
            raise

    def _peek(self) -> Optional[Tuple[int, bytes]]:
        """The first numbered line (None for an empty input), left in place: it is still a row to read (or, as
        a header, to skip)."""
        first = next(self._lines, None)
        if first is not None:
            self._lines = _prepend(first, self._lines)
        return first

    def _check_text(self) -> None:
        if isinstance(self._f, io.BufferedReader):
            head = self._f.peek(BINARY_PROBE)[:BINARY_PROBE]
        else:  # a stream without peek (a test's BytesIO): read and rewind
            head = self._f.read(BINARY_PROBE)
            self._f.seek(0)
        if b"\0" in head:
            line = head[: head.index(b"\0")].count(b"\n") + 1
            raise UsageError(f"{self.name}:{line}: a NUL byte: a binary or UTF-16 file, not UTF-8 text. Fix: pass "
                             "UTF-8 text, TSV or JSONL (iconv -f UTF-16 -t UTF-8 converts UTF-16)")

    def close(self) -> None:
        if self._f is not sys.stdin.buffer:
            self._f.close()

    def rows(self) -> Iterator[object]:
        for lineno, raw in self._lines:
            if self.header and lineno == 1:
                continue
            where = f"{self.name}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield BadRow(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start + 1}), skipped")
                continue
            if not line.strip():
                yield BadRow(f"{where}: empty line, skipped")
            elif self.kind == "jsonl":
                yield self._jsonl(line, lineno, where)
            elif self.kind == "tsv":
                yield self._tsv(line, lineno, where)
            else:
                yield Row(str(lineno), lineno, (line.strip(),))

    def _jsonl(self, line: str, lineno: int, where: str) -> object:
        try:
            obj = json.loads(line)
        except ValueError as e:
            return BadRow(f"{where}: not JSON ({e}), skipped")
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
            return BadRow(f"{where}: not a JSON object with a non-empty string 'text', skipped")
        pair = obj.get("text_pair")
        if pair is not None and (not isinstance(pair, str) or not pair.strip()):
            return BadRow(f"{where}: 'text_pair' is not a non-empty string, skipped")
        texts = (obj["text"],) + ((pair,) if pair is not None else ())
        return Row(str(lineno) if obj.get("id") is None else str(obj["id"]), lineno, texts)

    def _tsv(self, line: str, lineno: int, where: str) -> object:
        fields = line.split("\t")  # tabs only: GLUE text holds stray quotes
        if (self.ncols and len(fields) != self.ncols) or len(fields) <= max(self.columns):
            return BadRow(f"{where}: {len(fields)} tab-separated fields, expected "
                          f"{self.ncols or max(self.columns) + 1}{' or more' if not self.ncols else ''}, skipped")
        texts = tuple(fields[c].strip() for c in self.columns)
        if not all(texts):
            return BadRow(f"{where}: an empty text field, skipped")
        return Row(str(lineno) if self.id_column is None else fields[self.id_column].strip(), lineno, texts)


def glue_layout(task: str, first: List[str], name: str = "<input>"
                ) -> Tuple[List[int], bool, Optional[int], Optional[int]]:
    """(text columns, header?, field count, id column) of a GLUE file ``name`` of ``task`` whose first line has
    the fields ``first``: train/dev or test layout, told apart by the header (test files have no label column).
    A first line that is neither layout's is refused: read with another task's columns (or a header-less file's
    first row taken for a header) a file would be classified from its index or label column, without an error."""
    from acl_fairseq.preprocessing.glue_tasks import GlueDataError, get_task

    try:
        spec = get_task(task)
    except GlueDataError as e:
        raise UsageError(f"--task: {e}") from None
    names = [f.strip() for f in first]
    if not names:  # an empty input: nothing to lay out, nothing to predict
        return list(spec.test_inputs), True, None, None
    if spec.label_header is None or not spec.header:  # CoLA: header-less train/dev, a header on test
        if spec.ncols and len(first) == spec.ncols:
            return list(spec.inputs), False, spec.ncols, None
        _check_test_header(spec, names, name)
        return list(spec.test_inputs), True, None, _id_column(first)
    label_cols = {spec.label, spec.label if spec.dev_label is None else spec.dev_label}
    if spec.label_header in names:
        if not any(c < len(names) and names[c] == spec.label_header for c in label_cols):
            raise _not_this_task(spec, name, f"its {spec.label_header!r} column is column "
                                 f"{names.index(spec.label_header) + 1}, {spec.name}'s is column "
                                 f"{min(label_cols) + 1}")
        return list(spec.inputs), True, len(first), _id_column(first)
    _check_test_header(spec, names, name)
    return list(spec.test_inputs), True, len(first), _id_column(first)


def _check_test_header(spec, names: List[str], name: str) -> None:
    if names[0].lower() not in INDEX_HEADERS:
        raise _not_this_task(spec, name, f"it starts with {names[0][:40]!r}, not a train/dev header (with a "
                             f"{spec.label_header or 'label'!r} column) nor a test header (starting with 'index')")
    if len(names) <= max(spec.test_inputs):
        raise _not_this_task(spec, name, f"the header has {len(names)} fields, {spec.name}'s test layout reads "
                             f"column {max(spec.test_inputs) + 1}")


def _not_this_task(spec, name: str, why: str) -> UsageError:
    return UsageError(f"{name}:1: not a GLUE {spec.name} file: {why}. Fix: pass the --task this file belongs to, "
                      "or --columns (and --header) for another TSV")


def _id_column(header: List[str]) -> Optional[int]:
    return 0 if header and header[0].strip().lower() in INDEX_HEADERS else None


def _is_jsonl_record(line: bytes) -> bool:
    try:
        obj = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return False
    return isinstance(obj, dict) and "text" in obj


def _numbered(f: IO[bytes]) -> Iterator[Tuple[int, bytes]]:
    """(1-based line number, line without its end) of a byte stream; splits on b"\\n" only, so a stray \\r or
    \\x85 inside text stays text, and a first line's byte-order mark is dropped."""
    for lineno, raw in enumerate(f, start=1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        yield lineno, raw.rstrip(b"\r\n")


def _prepend(item, rest: Iterator) -> Iterator:
    yield item
    yield from rest
