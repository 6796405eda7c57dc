"""acl-evaluate's refusals are one line with exit status 2, and those that the flags and the data
folder decide come before the model loads: a split the folder lacks and an output folder that cannot be written were
tracebacks (the latter after the whole sweep), a head the checkpoint lacks and an unlabeled --split tracebacks after
loading."""
import os
import subprocess
import sys

import pytest

import helpers
from acl_fairseq.cli import evaluate
from acl_runtime import console


def _refused(argv, monkeypatch, loads=False) -> str:
    """The message acl-evaluate refuses ``argv`` with (a UsageError: cli_main prints it as one line and exits 2), or
    "" for argparse's own refusal (exit 2, its usage on stderr); unless ``loads``, the model must not be loaded."""
    if not loads:
        monkeypatch.setattr(evaluate, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:
        evaluate.main(argv)
    if not isinstance(e.value, console.UsageError):
        assert e.value.code == 2
        return ""
    assert "\n" not in str(e.value) and "Fix:" in str(e.value), str(e.value)
    return str(e.value)


def test_a_split_the_data_folder_lacks_is_refused_before_loading(predict_run, tmp_path, monkeypatch):
    _, data, ckpt = predict_run
    common = [ckpt, data, "--output", str(tmp_path / "ee")]
    message = _refused(common + ["--split", "nosuch"], monkeypatch)
    assert message.startswith(f"--split nosuch: {data}/input0 has no such split (it has train, valid)")
    message = _refused(common + ["--test-split", "valid", "test", "--predictions-dir", str(tmp_path / "p")],
                       monkeypatch)
    assert message.startswith(f"--test-split test: {data}/input0 has no such split")
    assert not os.path.exists(tmp_path / "ee") and not os.path.exists(tmp_path / "p")


def test_an_output_folder_that_cannot_be_written_is_refused_before_loading(predict_run, tmp_path, monkeypatch):
    _, data, ckpt = predict_run
    locked = helpers.unwritable_folder(tmp_path)
    message = _refused([ckpt, data, "--output", os.path.join(locked, "ee")], monkeypatch)
    assert message.startswith(f"--output {locked}/ee: cannot write there") and "Fix:" in message
    (tmp_path / "file").write_text("")
    message = _refused([ckpt, data, "--output", str(tmp_path / "ee"), "--test-split", "valid",
                        "--predictions-dir", str(tmp_path / "file" / "p")], monkeypatch)
    assert message.startswith(f"--predictions-dir {tmp_path}/file/p: cannot write there")
    assert not os.path.exists(tmp_path / "ee")


@pytest.mark.parametrize("flag, value", [("--batch-size", "0"), ("--timing-repeats", "0"), ("--max-examples", "0"),
                                         ("--timing-examples", "-1")])
def test_flags_out_of_range_are_refused_before_loading(predict_run, tmp_path, monkeypatch, capsys, flag, value):
    _, data, ckpt = predict_run
    _refused([ckpt, data, "--output", str(tmp_path / "ee"), flag, value], monkeypatch)
    assert f"{flag} must be at least" in capsys.readouterr().err


def test_a_head_the_checkpoint_lacks_is_named_with_the_heads_it_has(predict_run, tmp_path, monkeypatch):
    _, data, ckpt = predict_run
    message = _refused([ckpt, data, "--output", str(tmp_path / "ee"), "--classification-head-name", "nohead",
                        "--device", "cpu"], monkeypatch, loads=True)
    assert message.startswith("model has no classification head 'nohead' (has ['sentence_classification_head'")
    assert not os.path.exists(tmp_path / "ee")


@pytest.mark.slow  # the tool in a subprocess: about 8 s
def test_the_command_prints_the_refusal_in_one_line_with_exit_2(predict_run, tmp_path):
    _, data, ckpt = predict_run
    proc = subprocess.run([sys.executable, "-m", "acl_fairseq.cli.evaluate", ckpt, data, "--output",
                           str(tmp_path / "ee"), "--split", "nosuch"], capture_output=True, text=True,
                          cwd=helpers.REPO, env=dict(os.environ, PYTHONPATH=helpers.REPO, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"acl-evaluate: error: --split nosuch: {data}/input0 has no such split (it has train, valid). Fix: pass one "
        "of those, or binarize that split into the folder"]


def test_an_unlabeled_split_is_refused_with_the_flag_that_predicts_it(predict_run, tmp_path, monkeypatch):
    import shutil

    _, data, ckpt = predict_run
    unlabeled = tmp_path / "data"
    shutil.copytree(data, unlabeled)
    for name in ("valid.bin", "valid.idx"):
        os.remove(unlabeled / "label" / name)
    message = _refused([ckpt, str(unlabeled), "--output", str(tmp_path / "ee"), "--device", "cpu"], monkeypatch,
                       loads=True)
    assert message == ("--split valid has no labels. Fix: score a labeled split, and predict this one with "
                       "--test-split")
