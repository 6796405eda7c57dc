"""Bounded memory per row: each text is cut at a byte budget derived from max_positions
before it is tokenized (acl_runtime.tokenization.clip), flagged as truncated, on the checkpoint and on its
ONNX folder; acl-predict's reader never holds more of a line than that budget per text field (a plain line, a TSV
field, a JSON string), skipping the rest and flagging the row; a 50 MB line peaks under 1 GB in acl-predict on
both (slow: two subprocesses), and texts within the budget answer as before."""
import io
import json
import os
import subprocess
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers
from acl_runtime import inputs, tokenization
from test_tokenization_parity import pair  # noqa: F401  (the checkpoint and its ONNX folder, built once per module)

PEAK_LIMIT_KB = 1024 * 1024  # 1 GiB, in ru_maxrss's unit


def test_clip_keeps_text_within_the_budget_and_cuts_at_a_character():
    budget = tokenization.byte_budget(4)
    within = " ".join(["é" * 10] * 100)[: budget // 2]
    assert tokenization.clip(f"  {within} \n", 4) == (within, False)
    long = "é" * budget  # 2 bytes each: twice the budget
    cut, flagged = tokenization.clip(long, 4)
    assert flagged and long.startswith(cut) and len(cut.encode("utf-8")) == budget
    cut, _ = tokenization.clip("x" + long, 4)  # the budget falls inside a character: that character goes
    assert len(cut.encode("utf-8")) == budget - 1 and cut.encode("utf-8").decode("utf-8") == cut


def test_a_cut_text_is_flagged_even_when_its_tokens_fit(pair):  # noqa: F811
    """One word longer than the budget is one <unk>: the ids fit, but text was dropped, which the row says."""
    for model in pair:
        budget = tokenization.byte_budget(model.max_positions if hasattr(model, "max_positions")
                                          else model.layout["max_positions"])
        ids, truncated = model.encode_with_info("good " + "x" * (budget + 10))
        assert truncated and len(list(ids)) == 4


def test_the_cut_does_not_change_answers_within_the_budget(pair):  # noqa: F811
    """A text just within the budget gets the ids of its words tokenized whole; one far beyond it the same
    ids (both longer than max_positions tokens), and the same answer."""
    hub, eng = pair
    words = ("the music was not bad " * 100_000)
    budget = tokenization.byte_budget(hub.max_positions)
    within = words[:budget].strip()
    d = hub.task.source_dictionary
    whole = tokenization.dictionary_ids(d, within.split())
    for model in pair:
        ids, truncated = model.encode_with_info(within)
        assert truncated and list(ids)[1:-1] == whole[: hub.max_positions - 2]
        far, far_truncated = model.encode_with_info(words)
        assert far_truncated and list(far) == list(ids)
        near, beyond = model.predict_early_exit([(within, "good"), (words, "good")])  # pairs: what it reads
        assert near == beyond


def _rows(text: str, kind: str, max_positions: int = 4, **kw):
    source = inputs.Input.__new__(inputs.Input)  # the reader on a stream, without a file to open
    source.name, source.kind, source.header, source.ncols, source.id_column = "<t>", kind, False, None, None
    source.columns = kw.get("columns")
    source._f = io.BytesIO(text.encode("utf-8"))
    source._reader = inputs._Lines(source._f, max_positions, "\t" if kind == "tsv" else kind)
    source._lines = iter(source._reader)
    return list(source.rows())


def test_the_reader_keeps_each_text_within_the_budget_and_flags_the_row():
    """acl-predict's reader keeps of each text field (a plain line, a TSV field, a JSON string) the model's budget
    and skips the rest of the line, flagging the row; a JSON record still parses, the other fields are whole."""
    keep = tokenization.byte_budget(4) + inputs.FIELD_SLACK
    long = "é" * keep + "tail"  # 2 bytes each: the cut falls inside a character
    row, short = _rows(f"{long}\nthe music\n", "text")
    assert row.cut and long.startswith(row.texts[0]) and keep - 1 <= len(row.texts[0].encode()) <= keep
    assert short == inputs.Row("2", 2, ("the music",))
    (row,) = _rows(f"7\t{long}\tthe plot\n", "tsv", columns=[1, 2])
    assert row.cut and long.startswith(row.texts[0]) and row.texts[1] == "the plot"
    record = {"id": "a\tb", "text": long, "text_pair": "x\\\"y\u00e9" * 3}
    (row,) = _rows(json.dumps(record) + "\n", "jsonl")
    assert row.cut and row.id == "a\tb" and long.startswith(row.texts[0])
    assert len(row.texts[0].encode()) >= tokenization.byte_budget(4)  # escaped 6 bytes each: never less than clip
    assert row.texts[1] == record["text_pair"]
    (row,) = _rows(json.dumps(dict(record, text="é" * 100)) + "\n", "jsonl")
    assert not row.cut and row.texts == ("é" * 100, record["text_pair"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n\r"),
                        max_size=300), min_size=1, max_size=3))
def test_lines_within_the_budget_are_read_unchanged_across_blocks(fields):
    """Lines within the budget come back byte for byte, however the 16-byte blocks split characters and escapes."""
    text_line = "\t".join(fields)
    record = json.dumps({"text": fields[0] or "x", "more": fields[1:]}, ensure_ascii=len(fields) % 2 == 0)
    for kind, line in (("text", text_line), ("\t", text_line), ("jsonl", record)):
        reader = inputs._Lines(io.BytesIO(f"{line}\nend\n".encode()), 64, kind)
        old, inputs.BLOCK = inputs.BLOCK, 16
        try:
            got = list(reader)
        finally:
            inputs.BLOCK = old
        assert got == [(1, line.encode(), False), (2, b"end", False)], kind


@pytest.mark.parametrize("kind", ["text", "tsv", "jsonl"])
def test_a_50_mb_line_is_never_held_whole_by_the_reader(tmp_path, kind):
    """Peak Python memory while reading a 50 MB line: a few copies of a budget (512 positions: 0.5 MiB of text, 3
    MiB of a JSON string), not the line, which the reader held whole before (tracemalloc: 3 s each, no model)."""
    line = "the music was not bad " * (50 * 2 ** 20 // 22)
    path = tmp_path / f"huge.{kind}"
    with open(path, "w", encoding="utf-8") as f:
        f.write({"text": line, "tsv": f"1\t{line}\tshort", "jsonl": json.dumps({"text": line})}[kind] + "\n")
        f.write({"text": "ok", "tsv": "2\tok\tshort", "jsonl": json.dumps({"text": "ok"})}[kind] + "\n")
    source = inputs.Input(str(path), kind, columns=[1, 2] if kind == "tsv" else None)
    source.limit(512)
    tracemalloc.start()
    try:
        rows = list(source.rows())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        source.close()
    assert [(r.cut, r.texts[0][:9]) for r in rows] == [(True, "the music"), (False, "ok")]
    assert peak < 16 * 2 ** 20, f"{kind}: peak {peak / 2 ** 20:.1f} MiB"  # 3 MiB of a JSON string, decoded, parsed


def _peak_kb(argv) -> int:
    """Peak RSS of acl-predict run with ``argv``: a wrapper process whose only child it is."""
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL);"
               " print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "acl_runtime.predict", *argv],
                         capture_output=True, text=True, cwd=helpers.REPO)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_a_50_mb_line_peaks_under_1_gb_on_both_paths(pair, predict_run, tmp_path):  # noqa: F811
    _, data, ckpt = predict_run
    line = tmp_path / "huge.tsv"  # pairs, what the model reads: the line's first field is the 50 MB
    with open(line, "w", encoding="utf-8") as f:
        f.write("the music was not bad " * (50 * 2 ** 20 // 22) + "\tthe plot\nthe music was not bad\tthe plot\n")
    for model in (ckpt, pair[1].folder):
        argv = [model, "--input", str(line), "--columns", "1,2", "--output",
                str(tmp_path / f"{os.path.basename(model)}.jsonl")]
        peak = _peak_kb(argv + (["--data", data] if model == ckpt else []))
        assert peak < PEAK_LIMIT_KB, f"{model}: peak RSS {peak / 1024:.0f} MB"


@pytest.mark.parametrize("text, is_blank", [("", True), ("  \t", True), ("\u200b", True), (" \ufeff\u200d ", True),
                                            ("\u200ba", False), ("a", False), ("\u00a0", True)])
def test_a_text_of_only_spaces_or_format_characters_is_blank(text, is_blank):
    assert inputs.blank(text) == is_blank


@pytest.mark.parametrize("kind, line", [("text", "\u200b"), ("jsonl", '{"text": "\\u200b"}'),
                                        ("jsonl", '{"text": "a", "text_pair": "\\u200b \\ufeff"}')])
def test_acl_predict_skips_a_zero_width_space_alone_as_it_skips_an_empty_line(tmp_path, kind, line):
    """acl-serve refuses such a text (422, tests/serve/test_serve_promises.py's blank sides): the one rule of a blank
    text (inputs.blank), so the two agree."""
    path = tmp_path / f"in.{'jsonl' if kind == 'jsonl' else 'txt'}"
    good = '{"text": "the movie was good"}' if kind == "jsonl" else "the movie was good"
    path.write_text(f"{line}\n{good}\n", encoding="utf-8")
    source = inputs.Input(str(path), kind)
    try:
        rows = list(source.rows())
    finally:
        source.close()
    assert isinstance(rows[0], inputs.BadRow) and "skipped" in str(rows[0])
    assert isinstance(rows[1], inputs.Row)
