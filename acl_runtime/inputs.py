"""``acl-predict``'s input: a file or standard input, read as a stream of lines and turned into rows.

Lines are read as bytes and decoded one by one, so a line that is not UTF-8 is reported with ``file:line``
and skipped like any other bad row, and the rest is classified; nothing is decoded ahead of the row being
predicted. Memory per line is bounded (:class:`_Lines`): a line is read in blocks, and of each text field (a TSV
field, a JSON string, a plain-text line) only the model's byte budget is kept (``tokenization.byte_budget`` of
its positions, a little more for the spaces the tokenizer strips first), the rest skipped and the row flagged
truncated; a model uses no more than that of a text anyway. A UTF-8 byte-order mark is dropped from the first
line (stdin included). A NUL byte in the first 8 KiB marks a binary (or UTF-16) file, refused as a whole before
the model loads.

Layouts: a GLUE TSV (``--task``; train/dev or test layout told apart by the first line, which is buffered, so
stdin works too), a TSV with ``--columns``, JSONL, or plain text (one sentence per line).
"""
import argparse
import io
import json
import re
import sys
import unicodedata
from typing import IO, Iterator, List, NamedTuple, Optional, Tuple

from acl_runtime import tokenization
from acl_runtime.console import UsageError

KINDS = ("auto", "tsv", "jsonl", "text")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
INDEX_HEADERS = ("index", "id")  # GLUE's index column: "index" (test files, STS-B, MNLI, QNLI, RTE, WNLI), "id" (QQP)
ID_RULE = ("Each record's id: with --task, the file's index column where the GLUE file has one (a first header "
           "field 'index' or 'id': every test.tsv, and dev/train of STS-B, MNLI, QNLI, QQP, RTE, WNLI), else the "
           "line number; for JSONL, the object's 'id' when present, else the line number; otherwise the line "
           "number (1-based, a header line counted).")
BINARY_PROBE = 8192
BLOCK = 1 << 16  # bytes read at a time from a line
FIELD_SLACK = 1024  # kept beyond the byte budget: the spaces tokenization.clip strips before it counts


def blank(text: str) -> bool:
    """Whether ``text`` holds nothing to classify: empty, spaces, or only Unicode format characters (category Cf: a
    zero-width space U+200B, joiners, U+FEFF), which show nothing and which the tokenizers drop. The one rule of a
    blank text: acl-predict skips such a line or field, and acl-serve refuses it on every route."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)
LINE_FIELDS = 4  # a line keeps at most this many fields' budgets in all (a pair, an id, a label)
# before the model is known (the first line, read to lay the input out): a budget no model of ours exceeds
DEFAULT_MAX_POSITIONS = 4096


class Row(NamedTuple):
    id: str
    line: int
    texts: Tuple[str, ...]
    cut: bool = False  # the reader dropped the end of a text beyond the model's byte budget


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
        if (kind == "tsv" or (kind == "auto" and self.name.lower().endswith(".tsv"))) and not (task or columns):
            raise _tsv_without_layout(f"{self.name}: a TSV")
        self.kind, self.columns, self.header, self.ncols, self.id_column = kind, columns, header, None, None
        self._f: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")
        try:
            self._check_text()
            self._reader = _Lines(self._f, DEFAULT_MAX_POSITIONS, "\t" if kind == "tsv" else kind)
            self._lines = iter(self._reader)
            if kind == "auto":  # stdin or another name: JSONL when the first line is a JSON object with a text
                first = self._peek()
                self.kind = "jsonl" if first is not None and _is_jsonl_record(first[1]) else "text"
                if self.kind == "text" and first is not None and b"\t" in first[1]:  # a header and labels too
                    raise _tsv_without_layout(f"{self.name}:1: a tab, so a TSV")
            self._reader.kind = "\t" if self.kind == "tsv" else self.kind
            if task:
                first = self._peek()
                fields = first[1].decode("utf-8", "replace").split("\t") if first else []
                self.columns, self.header, self.ncols, self.id_column = glue_layout(task, fields, self.name)
        except BaseException:
            self.close()
            raise

    def limit(self, max_positions: int) -> None:
        """Keep of each text field no more than a model of ``max_positions`` positions reads (from the next line
        on: the first was read to lay the input out)."""
        self._reader.budget = tokenization.byte_budget(max_positions) + FIELD_SLACK

    def _peek(self) -> Optional[Tuple[int, bytes, bool]]:
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
        for lineno, raw, cut in self._lines:
            if self.header and lineno == 1:
                continue
            where = f"{self.name}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield BadRow(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start + 1}), skipped")
                continue
            if blank(line):
                yield BadRow(f"{where}: empty line, skipped")
                continue
            if self.kind == "jsonl":
                row = self._jsonl(line, lineno, where, cut)
            elif self.kind == "tsv":
                row = self._tsv(line, lineno, where)
            else:
                row = Row(str(lineno), lineno, (line.strip(),))
            yield row._replace(cut=True) if cut and isinstance(row, Row) else row

    def _jsonl(self, line: str, lineno: int, where: str, cut: bool = False) -> object:
        try:
            obj = json.loads(line)
        except ValueError as e:
            if cut:  # the strings were cut whole: what broke it is the rest, past the line's budget
                return BadRow(f"{where}: a JSON record of more than {6 * self._reader.budget * LINE_FIELDS} bytes "
                              "besides its texts' ends, skipped")
            return BadRow(f"{where}: not JSON ({e}), skipped")
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or blank(obj["text"]):
            return BadRow(f"{where}: not a JSON object with a non-empty string 'text', skipped")
        pair = obj.get("text_pair")
        if pair is not None and (not isinstance(pair, str) or blank(pair)):
            return BadRow(f"{where}: 'text_pair' is not a non-empty string, skipped")
        texts = (obj["text"],) + ((pair,) if pair is not None else ())
        return Row(str(lineno) if obj.get("id") is None else str(obj["id"]), lineno, texts)

    def _tsv(self, line: str, lineno: int, where: str) -> object:
        fields = line.split("\t")  # tabs only: GLUE text holds stray quotes
        if (self.ncols and len(fields) != self.ncols) or len(fields) <= max(self.columns):
            return BadRow(f"{where}: {len(fields)} tab-separated fields, expected "
                          f"{self.ncols or max(self.columns) + 1}{' or more' if not self.ncols else ''}, skipped")
        texts = tuple(fields[c].strip() for c in self.columns)
        if any(blank(t) for t in texts):
            return BadRow(f"{where}: an empty text field, skipped")
        return Row(str(lineno) if self.id_column is None else fields[self.id_column].strip(), lineno, texts)


def _tsv_without_layout(what: str) -> UsageError:
    """Read as plain text, a TSV's header line and label column would be classified, without an error."""
    return UsageError(f"{what} needs its columns named: pass --task TASK or --columns N, or --input-format text to "
                      "read whole lines")


def glue_layout(task: str, first: List[str], name: str = "<input>"
                ) -> Tuple[List[int], bool, Optional[int], Optional[int]]:
    """(text columns, header?, field count, id column) of a GLUE file ``name`` of ``task`` whose first line has
    the fields ``first``: train/dev or test layout, told apart by the header (test files have no label column).
    A first line that is neither layout's is refused: read with another task's columns (or a header-less file's
    first row taken for a header) a file would be classified from its index or label column, without an error."""
    from acl_runtime.glue_tasks import GlueDataError, get_task

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


_STRING_STOP = re.compile(rb'["\\]')  # what ends a run of plain bytes inside a JSON string


def _drop_split_character(data: bytearray) -> None:
    """Remove from the end of ``data`` a UTF-8 character that a cut left incomplete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return
        if byte >= 0xC0:  # a lead byte: the character needs 2, 3 or 4 bytes
            if back < (2 if byte < 0xE0 else 3 if byte < 0xF0 else 4):
                del data[-back:]
            return


class _Lines:
    """(1-based line number, line without its end, cut) of a byte stream, each line read in blocks of
    :data:`BLOCK` bytes, keeping of each text field at most ``budget`` bytes and of the line at most
    :data:`LINE_FIELDS` budgets: the rest is skipped (a character the cut would split goes too) and the line
    marked cut. A field is a tab-separated field (``kind`` ``"\\t"``), a JSON string (``"jsonl"``, or
    ``"auto"`` for a line starting with ``{``; cut at a whole character or escape and closed, so the record
    still parses), else the whole line. Splits on b"\\n" only, so a stray \\r or \\x85 inside text stays text; a
    first line's byte-order mark is dropped."""

    def __init__(self, f: IO[bytes], max_positions: int, kind: str):
        self.f, self.kind = f, kind
        self.budget = tokenization.byte_budget(max_positions) + FIELD_SLACK

    def __iter__(self) -> Iterator[Tuple[int, bytes, bool]]:
        lineno = 0
        while True:
            block = self.f.readline(BLOCK)
            if not block:
                return
            lineno += 1
            if lineno == 1 and block.startswith(b"\xef\xbb\xbf"):
                block = block[3:]
            json_mode = self.kind == "jsonl" or (self.kind == "auto" and block.lstrip().startswith(b"{"))
            # an escape (\\u00e9, \\u0001) spells one UTF-8 byte in up to 6: a JSON string keeps 6 budgets
            line = _JsonLine(6 * self.budget) if json_mode else _FieldLine(self.budget, self.kind == "\t")
            while True:
                ends = block.endswith(b"\n")
                line.add(block[:-1] if ends else block, last=ends)
                if ends:
                    break
                block = self.f.readline(BLOCK)
                if not block:
                    line.add(b"", last=True)
                    break
            yield lineno, bytes(line.kept).rstrip(b"\r"), line.cut


class _FieldLine:
    """A line kept field by field (tab-separated, or one field), each within ``budget`` bytes."""

    def __init__(self, budget: int, tabs: bool):
        self.budget, self.tabs, self.kept, self.field, self.cut = budget, tabs, bytearray(), bytearray(), False
        self.field_cut = False

    def add(self, block: bytes, last: bool) -> None:
        parts = block.split(b"\t") if self.tabs else [block]
        for i, part in enumerate(parts):
            if i:
                self._close_field()
                self.kept += b"\t"
            room = min(self.budget - len(self.field), self.budget * LINE_FIELDS - len(self.kept) - len(self.field))
            if len(part) > room:
                self.cut = self.field_cut = True
                part = part[: max(room, 0)]
            self.field += part
        if last:
            self._close_field()

    def _close_field(self) -> None:
        if self.field_cut:  # only a cut's: a field that is not UTF-8 stays so, and is reported with file:line
            _drop_split_character(self.field)
        self.kept += self.field
        self.field, self.field_cut = bytearray(), False


class _JsonLine:
    """A JSON line kept with each string within ``budget`` bytes (cut after a whole character or escape, then
    closed) and the whole within :data:`LINE_FIELDS` budgets (beyond that what is kept does not parse: a bad
    row)."""

    def __init__(self, budget: int):
        self.budget, self.kept, self.cut = budget, bytearray(), False
        self.in_string, self.skipping, self.string_bytes, self.carry = False, False, 0, b""

    def _keep(self, data: bytes) -> None:
        if len(self.kept) + len(data) > self.budget * LINE_FIELDS:
            self.cut = True  # many strings or a huge structure: what is left does not parse, a bad row
            return
        self.kept += data

    def add(self, block: bytes, last: bool) -> None:
        block, self.carry = self.carry + block, b""
        i = 0
        while i < len(block):
            if not self.in_string:
                j = block.find(b'"', i)
                self._keep(block[i:] if j < 0 else block[i: j + 1])
                if j < 0:
                    return
                self.in_string, self.skipping, self.string_bytes, i = True, False, 0, j + 1
                continue
            stop = _STRING_STOP.search(block, i)
            k = len(block) if stop is None else stop.start()
            self._string_bytes(block[i:k])
            if stop is None:
                return
            if block[k:k + 1] == b'"':
                self._keep(b'"')
                self.in_string, i = False, k + 1
                continue
            size = 6 if block[k + 1:k + 2] == b"u" else 2  # \uXXXX, or a backslash and one character
            if k + size > len(block) and not last:
                self.carry = block[k:]  # an escape split between two blocks: read whole with the next one
                return
            self._string_bytes(block[k:k + size], whole=True)
            i = k + size

    def _string_bytes(self, data: bytes, whole: bool = False) -> None:
        if self.skipping or not data:
            return
        room = self.budget - self.string_bytes
        if len(data) <= room:
            self._keep(data)
            self.string_bytes += len(data)
            return
        self.cut = self.skipping = True
        if not whole:
            self._keep(data[:room])
            _drop_split_character(self.kept)


def _prepend(item, rest: Iterator) -> Iterator:
    yield item
    yield from rest
