"""acl-predict on real-world input: a bad byte or an empty line (skipped with file:line, or --strict stops),
a binary file, stdin with a GLUE layout and a byte-order mark, ids, JSONL, bad flags and outputs refused
before the model loads, SIGTERM mid-run. The tiny models are the session's (conftest.py): ``predict_run`` reads
pairs, and ``regression_run`` one text per input, for the files of one text per line (a model refuses inputs of
the other kind: test_pairing.py)."""
import json
import os

import pytest

import helpers
from acl_fairseq.inference import hub
from acl_runtime import predict

# ---- real-world input: bad bytes, pipes, ids, fatal errors, SIGTERM -------------------------------------


class _Recording:
    """The module's model, handed to acl-predict instead of a fresh load: it records the texts classified."""

    def __init__(self, model):
        self.model_, self.texts = model, []

    def __getattr__(self, name):
        return getattr(self.model_, name)

    def eval(self):
        return self

    def predict_texts(self, texts, *args, **kwargs):  # what acl-predict calls, with the request resolved once
        self.texts.extend(texts)
        return self.model_.predict_texts(texts, *args, **kwargs)


def _spy(model, monkeypatch) -> _Recording:
    rec = _Recording(model)
    monkeypatch.setattr(hub, "from_checkpoint", lambda *a, **k: rec)  # acl-predict's one opening
    return rec


@pytest.fixture
def spy(predict_model, monkeypatch):
    """The pair model, recorded."""
    return _spy(predict_model, monkeypatch)


@pytest.fixture(scope="module")
def single_model(regression_run):
    ckpt, data = regression_run
    return hub.from_pretrained(os.path.dirname(ckpt), os.path.basename(ckpt), data).eval()


@pytest.fixture
def single_spy(single_model, monkeypatch):
    """The single-text model, recorded."""
    return _spy(single_model, monkeypatch)


@pytest.fixture
def no_model(monkeypatch):
    """For errors that must come before the model loads."""
    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the error")
    monkeypatch.setattr(hub, "from_checkpoint", refuse)


def _exit(argv):
    with pytest.raises(SystemExit) as e:
        predict.main(argv)
    return e.value


def _records(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_a_bad_byte_and_an_empty_line_are_skipped_with_file_line_and_strict_stops(regression_run, single_spy,
                                                                                    tmp_path, caplog):
    ckpt, data = regression_run
    spy = single_spy
    src, out = tmp_path / "bad.txt", tmp_path / "pred.jsonl"
    src.write_bytes(b"the movie was good\nthe plot was \xe9\xff bad\n\nthe acting was dull\n")
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--output", str(out)])
    assert [r["id"] for r in _records(out)] == ["1", "4"] and summary["skipped"] == 2
    assert spy.texts == [("the movie was good",), ("the acting was dull",)]
    assert f"{src}:2: not valid UTF-8" in caplog.text and f"{src}:3: empty line" in caplog.text
    e = _exit([ckpt, "--data", data, "--input", str(src), "--output", str(tmp_path / "s.jsonl"), "--strict"])
    assert e.code != 2 and f"{src}:2: not valid UTF-8" in str(e)  # status 1: a message, not a usage error
    assert sorted(os.listdir(tmp_path)) == ["bad.txt", "pred.jsonl"]  # no output, no temporary


@pytest.mark.slow
def test_one_bad_byte_in_100k_lines_loses_nothing_else(regression_run, single_spy, tmp_path, caplog):
    """The issue's case: 100,000 lines, a bad byte on line 50,000 and an empty line: 99,998 records in input
    order, both lines reported, and with --strict no output at all."""
    ckpt, data = regression_run
    texts, _ = helpers.raw_split(data)
    lines = [texts[i % len(texts)].encode() for i in range(100000)]
    lines[49999] = b"the plot was \xe9 bad"
    lines[79999] = b""
    src, out = tmp_path / "big.txt", tmp_path / "pred.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--output", str(out), "--batch-size", "256"])
    ids = [r["id"] for r in _records(out)]
    assert len(ids) == 99998 and ids == [str(n) for n in range(1, 100001) if n not in (50000, 80000)]
    assert f"{src}:50000: not valid UTF-8" in caplog.text and f"{src}:80000: empty line" in caplog.text
    assert summary["examples"] == 99998 and summary["skipped"] == 2
    os.remove(out)
    e = _exit([ckpt, "--data", data, "--input", str(src), "--output", str(out), "--strict", "--batch-size", "256"])
    assert e.code != 2 and "big.txt:50000" in str(e) and sorted(os.listdir(tmp_path)) == ["big.txt"]


def test_a_binary_file_is_refused_before_the_model_loads(predict_run, no_model, tmp_path):
    _, data, ckpt = predict_run
    src = tmp_path / "image.png"
    src.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    e = _exit([ckpt, "--data", data, "--input", str(src), "--output", str(tmp_path / "p.jsonl")])
    assert e.code == 2 and f"{src}:3: a NUL byte" in str(e) and "UTF-8" in str(e)
    assert os.listdir(tmp_path) == ["image.png"]


def _stdin(monkeypatch, data: bytes):
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_stdin_with_task_reads_the_glue_test_layout_and_a_bom_goes(regression_run, single_spy, tmp_path,
                                                                   monkeypatch):
    ckpt, data = regression_run
    spy = single_spy
    _stdin(monkeypatch, b"index\tsentence\n7\tthe movie was good\n8\tthe plot was not dull\n")
    predict.main([ckpt, "--data", data, "--input", "-", "--task", "SST-2", "--output", str(tmp_path / "a.jsonl")])
    assert spy.texts == [("the movie was good",), ("the plot was not dull",)]
    assert [r["id"] for r in _records(tmp_path / "a.jsonl")] == ["7", "8"]
    spy.texts.clear()
    _stdin(monkeypatch, b"\xef\xbb\xbfthe movie was good\n")
    predict.main([ckpt, "--data", data, "--input", "-", "--output", str(tmp_path / "b.jsonl")])
    assert spy.texts == [("the movie was good",)]


@pytest.mark.parametrize("task,text,ids", [
    ("SST-2", "sentence\tlabel\nthe movie was good\t1\nthe plot was bad\t0\n", ["2", "3"]),  # no index: line
    ("MRPC", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t10\t20\tthe movie\twas good\n"
             "1\t11\t21\tthe plot\twas good\n", ["2", "3"]),  # the first column is the label, not an id
    ("QQP", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n17\t1\t2\tthe movie\twas good\t0\n"
            "18\t3\t4\tthe plot\twas bad\t1\n", ["17", "18"]),
    ("RTE", "index\tsentence1\tsentence2\n40\tthe movie\twas good\n41\tthe plot\twas bad\n", ["40", "41"]),
])
def test_the_id_is_the_glue_index_column_or_the_line_number(predict_run, regression_run, request, tmp_path, task,
                                                            text, ids):
    """SST-2's one sentence on the single-text model, the others' pairs on the pair model."""
    if task == "SST-2":
        request.getfixturevalue("single_spy")
        ckpt, data = regression_run
    else:
        request.getfixturevalue("spy")
        _, data, ckpt = predict_run
    src = tmp_path / "in.tsv"
    src.write_text(text)
    predict.main([ckpt, "--data", data, "--input", str(src), "--task", task, "--output", str(tmp_path / "p.jsonl")])
    assert [r["id"] for r in _records(tmp_path / "p.jsonl")] == ids


@pytest.mark.parametrize("task,text,why", [
    ("SST-2", "index\tsentence1\tsentence2\tlabel\n0\tthe movie\twas good\tentailment\n",  # RTE's dev file
     "its 'label' column is column 4, SST-2's is column 2"),
    ("RTE", "sentence\tlabel\nthe movie was good\t1\n",  # SST-2's dev file
     "its 'label' column is column 2, RTE's is column 4"),
    ("SST-2", "the movie was good\t1\nthe plot was bad\t0\n",  # no header: its first row is not one
     "it starts with 'the movie was good', not a train/dev header"),
    ("RTE", "index\tsentence\n0\tthe movie was good\n",  # SST-2's test file
     "the header has 2 fields, RTE's test layout reads column 3"),
])
def test_a_file_of_another_task_or_without_its_header_is_refused_before_the_model_loads(
        predict_run, no_model, tmp_path, task, text, why):
    """Read with another task's columns, such a file was classified from its index or label column, exit 0."""
    _, data, ckpt = predict_run
    src = tmp_path / "in.tsv"
    src.write_text(text)
    e = _exit([ckpt, "--data", data, "--input", str(src), "--task", task, "--output", str(tmp_path / "p.jsonl")])
    assert e.code == 2 and f"{src}:1: not a GLUE {task} file: {why}" in str(e) and "Fix: pass the --task" in str(e)
    assert not (tmp_path / "p.jsonl").exists()


def test_jsonl_ids_and_a_null_text(predict_run, spy, tmp_path, caplog):
    _, data, ckpt = predict_run
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "the movie", "text_pair": "was good", "id": "x7"}\n{"text": "the plot", "text_pair": '
                   '"was bad"}\n{"text": "the acting", "text_pair": "was fine", "id": null}\n{"text": null, '
                   '"text_pair": "b"}\n{"text": "a", "text_pair": 3}\n')
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--output", str(tmp_path / "p.jsonl")])
    assert [r["id"] for r in _records(tmp_path / "p.jsonl")] == ["x7", "2", "3"] and summary["skipped"] == 2
    assert f"{src}:4: not a JSON object with a non-empty string 'text'" in caplog.text
    assert f"{src}:5: 'text_pair' is not a non-empty string" in caplog.text
    assert spy.texts == [("the movie", "was good"), ("the plot", "was bad"), ("the acting", "was fine")]


@pytest.mark.parametrize("flags,message", [
    (["--columns", "0"], "1-based"), (["--columns", "a,b"], "1-based"), (["--columns", "1,2,3"], "one or two"),
    (["--batch-size", "0"], "positive"), (["--chunk-size", "-1"], "positive"),
])
def test_bad_flag_values_are_usage_errors_before_the_model_loads(predict_run, no_model, tmp_path, capsys, flags,
                                                                 message):
    _, data, ckpt = predict_run
    e = _exit([ckpt, "--data", data, "--input", os.path.join(data, "raw", "valid.input0"), *flags])
    assert e.code == 2 and message in capsys.readouterr().err


def test_output_that_cannot_be_written_is_refused_before_the_model_loads(predict_run, no_model, tmp_path):
    _, data, ckpt = predict_run
    src = os.path.join(data, "raw", "valid.input0")
    (tmp_path / "adir").mkdir()
    cases = [(str(tmp_path / "missing" / "p.jsonl"), [], "does not exist"),
             (str(tmp_path / "adir"), [], "is a folder"), (str(tmp_path / "adir"), ["--force"], "is a folder"),
             (os.path.join(helpers.unwritable_folder(tmp_path), "p.jsonl"), [], "cannot write in")]
    for out, extra, message in cases:
        e = _exit([ckpt, "--data", data, "--input", src, "--output", out, *extra])
        assert e.code == 2 and message in str(e) and "Fix:" in str(e), (out, str(e))
    assert sorted(os.listdir(tmp_path)) == ["adir", "read_only"] and os.listdir(tmp_path / "adir") == []


def test_sigterm_mid_run_leaves_the_old_output_and_no_temporary(predict_run, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    _, data, ckpt = predict_run
    texts, _ = helpers.raw_split(data)
    src, out = tmp_path / "big.txt", tmp_path / "pred.jsonl"
    src.write_text("".join("\t".join(texts[i % len(texts)]) + "\n" for i in range(400000)))
    out.write_text("the previous output\n")
    proc = subprocess.Popen([sys.executable, "-m", "acl_runtime.predict", ckpt, "--data", data, "--input",
                             str(src), "--columns", "1,2", "--output", str(out), "--force", "--chunk-size", "64",
                             "--device", "cpu"],
                            env=dict(os.environ, PYTHONPATH=helpers.REPO, OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=helpers.REPO)
    tmp = tmp_path / f"pred.jsonl.tmp{proc.pid}"
    deadline = time.time() + 120
    while not (tmp.exists() and tmp.stat().st_size > 0):  # records are being written: mid-run
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be stopped"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 143, err[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["big.txt", "pred.jsonl"] and out.read_text() == "the previous output\n"


def test_a_reader_that_goes_away_ends_the_run_quietly_with_sigpipes_status(predict_run, tmp_path):
    """acl-predict ... | head -1: the second write finds the pipe closed; no traceback, status 141 (128 +
    SIGPIPE) as a Unix filter's under ``set -o pipefail``."""
    import subprocess
    import sys

    _, data, ckpt = predict_run
    texts, _ = helpers.raw_split(data)
    src = tmp_path / "many.tsv"
    src.write_text("".join("\t".join(texts[i % len(texts)]) + "\n" for i in range(2000)))
    proc = subprocess.Popen([sys.executable, "-m", "acl_runtime.predict", ckpt, "--data", data, "--input",
                             str(src), "--columns", "1,2", "--chunk-size", "64", "--device", "cpu"],
                            env=dict(os.environ, PYTHONPATH=helpers.REPO, OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=helpers.REPO)
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert json.loads(first)["label"] and proc.returncode == 141, err[-2000:]
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-2000:]


def test_stdin_jsonl_is_detected_and_a_tsv_id_stays_on_its_line(predict_run, spy, tmp_path, monkeypatch):
    """JSONL piped in (auto: the first line is a JSON object with a text) was classified as raw text; a JSONL
    id with a tab and a line break split a --format tsv record over two lines."""
    _, data, ckpt = predict_run
    _stdin(monkeypatch, b'{"text": "the movie", "text_pair": "was good", "id": "a\\tb\\nc"}\n'
                        b'{"text": "the plot", "text_pair": "was bad"}\n')
    predict.main([ckpt, "--data", data, "--input", "-", "--format", "tsv", "--output", str(tmp_path / "p.tsv")])
    assert spy.texts == [("the movie", "was good"), ("the plot", "was bad")]
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert len(lines) == 3 and len({len(line.split("\t")) for line in lines}) == 1
    assert [line.split("\t")[0] for line in lines[1:]] == ["a\\tb\\nc", "2"]


def test_a_named_pipe_is_read_like_a_file(regression_run, single_spy, tmp_path):
    """What <(zcat dev.tsv.gz) and /dev/stdin hand over: not a regular file, but readable."""
    import threading

    ckpt, data = regression_run
    spy = single_spy
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w") as f:
            f.write("the movie was good\nthe plot was bad\n")

    writer = threading.Thread(target=feed, daemon=True)  # never blocks the run if the fifo is not opened
    writer.start()
    predict.main([ckpt, "--data", data, "--input", str(fifo), "--output", str(tmp_path / "p.jsonl")])
    writer.join(timeout=30)
    assert spy.texts == [("the movie was good",), ("the plot was bad",)]
    with pytest.raises(SystemExit) as e:
        predict.main([ckpt, "--data", data, "--input", str(tmp_path), "--output", str(tmp_path / "q.jsonl")])
    assert e.value.code == 2 and "a folder, not a file" in str(e.value)


def test_a_text_beyond_its_byte_budget_is_cut_before_tokenizing_and_flagged(predict_run, predict_model, tmp_path):
    """A word longer than the budget (1024 bytes per position) is one <unk> whole or cut: the same answer as any
    unknown word, but the row says that text was dropped."""
    from acl_runtime import tokenization

    _, data, ckpt = predict_run
    huge = "good " + "x" * (3 * tokenization.byte_budget(predict_model.max_positions))
    src, out = tmp_path / "huge.jsonl", tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"text": t, "text_pair": "the plot was bad"}) + "\n"
                           for t in (huge, "good zzz")), encoding="utf-8")
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--output", str(out)])
    cut, unknown = _records(out)
    assert summary["truncated"] == 1 and cut["truncated"] and not unknown["truncated"]
    assert cut["probabilities"] == unknown["probabilities"] and cut["exit_layer"] == unknown["exit_layer"]
