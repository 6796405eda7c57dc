"""An empty or cut-short checkpoint is one line naming the file and the fix, exit status 2, before anything
loads it: in acl-evaluate, acl-predict, ``fairseq-train --restore-file`` and a resumed run
(``acl_fairseq.checkpoint_safety.check_readable``)."""
import os
import subprocess
import sys

import pytest
import torch

import helpers
from acl_fairseq import checkpoint_safety
from test_criterions import build


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("ckfiles") / "data"), n_train=16, n_valid=8)["data"]


def _saved(path, legacy=False):
    torch.save({"model": {"w": torch.zeros(2000)}, "args": None}, str(path),
               _use_new_zipfile_serialization=not legacy)
    return path.read_bytes()


def _damaged(tmp_path, name="damaged.pt"):
    """(empty file, file cut to half its length) of a real torch checkpoint."""
    whole = _saved(tmp_path / "whole.pt")
    empty, cut = tmp_path / f"empty_{name}", tmp_path / f"cut_{name}"
    empty.write_bytes(b"")
    cut.write_bytes(whole[: len(whole) // 2])
    return str(empty), str(cut)


def test_check_readable_tells_whole_from_empty_and_cut_short(tmp_path):
    empty, cut = _damaged(tmp_path)
    checkpoint_safety.check_readable(str(tmp_path / "whole.pt"))
    with pytest.raises(checkpoint_safety.CheckpointError, match=r"empty_damaged.pt: empty file \(0 bytes\).*Fix:"):
        checkpoint_safety.check_readable(empty)
    with pytest.raises(checkpoint_safety.CheckpointError, match=r"cut_damaged.pt: truncated or damaged.*Fix:"):
        checkpoint_safety.check_readable(cut)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(checkpoint_safety.CheckpointError, match="not a torch checkpoint"):
        checkpoint_safety.check_readable(str(tmp_path / "notes.txt"))
    # a legacy (pre-zip) file cut short passes the cheap check; its load is named the same way
    legacy = _saved(tmp_path / "legacy.pt", legacy=True)
    (tmp_path / "legacy_cut.pt").write_bytes(legacy[: len(legacy) // 2])
    checkpoint_safety.check_readable(str(tmp_path / "legacy_cut.pt"))
    with pytest.raises(checkpoint_safety.CheckpointError, match="legacy_cut.pt: truncated or damaged"):
        with checkpoint_safety.reading(str(tmp_path / "legacy_cut.pt")):
            torch.load(str(tmp_path / "legacy_cut.pt"))


def _one_line_exit_2(proc, path):
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert path in err and "Fix:" in err


@pytest.mark.slow  # each tool in a subprocess (make test-slow, CI)
@pytest.mark.parametrize("tool", ["evaluate", "predict"])
def test_tools_refuse_an_empty_or_cut_short_checkpoint_in_one_line(tmp_path, data, tool):
    env = dict(os.environ, PYTHONPATH=helpers.REPO, PYTHONWARNINGS="ignore")
    args = {"evaluate": [data, "--output", str(tmp_path / "out")],
            "predict": ["--data", data, "--input", os.path.join(data, "raw", "valid.input0"), "--output",
                        str(tmp_path / "p.jsonl")]}[tool]
    for path in _damaged(tmp_path):
        module = {"evaluate": "acl_fairseq.cli.evaluate", "predict": "acl_runtime.predict"}[tool]
        proc = subprocess.run([sys.executable, "-m", module, path, *args], capture_output=True,
                              text=True, env=env, cwd=helpers.REPO)
        _one_line_exit_2(proc, path)
    assert not os.path.exists(tmp_path / "p.jsonl") and not os.path.exists(tmp_path / "out")


def test_task_stops_on_a_cut_short_restore_file_or_resume_checkpoint(tmp_path, data, caplog):
    empty, cut = _damaged(tmp_path)
    plugin = ["--task", "sentence_prediction_acl"]
    for path in (empty, cut):
        with pytest.raises(SystemExit) as e:
            build(data, "sentence_ce", extra=[*plugin, "--restore-file", path])
        assert e.value.code == 2 and f"{path} (--restore-file): " in caplog.text
    save = tmp_path / "run"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(open(cut, "rb").read())
    caplog.clear()
    with pytest.raises(SystemExit) as e:
        build(data, "sentence_ce", extra=[*plugin, "--save-dir", str(save)])
    assert e.value.code == 2 and "the run's checkpoint_last.pt" in caplog.text and "remove it" in caplog.text
    os.remove(save / "checkpoint_last.pt")
    build(data, "sentence_ce", extra=[*plugin, "--save-dir", str(save)])  # a first launch: nothing to check


def test_fairseq_train_resuming_from_a_cut_short_checkpoint_exits_2_in_one_line(tmp_path, data):
    save = tmp_path / "run"
    save.mkdir()
    _, cut = _damaged(tmp_path)
    os.replace(cut, save / "checkpoint_last.pt")
    proc = helpers.train(data, str(save), extra=["--task", "sentence_prediction_acl"], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and f"{save}/checkpoint_last.pt (the run's checkpoint_last.pt): truncated" in out


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pickle_asking_for_a_forbidden_global_is_refused_as_unsafe_naming_it(tmp_path, legacy):
    """Not "truncated or damaged ... download it again": the file is whole, and a fresh copy would be refused too."""
    path = str(tmp_path / "evil.pt")
    payload = {"model": {}, "args": _Payload(str(tmp_path / "pwned"))}
    torch.save(payload, path, _use_new_zipfile_serialization=not legacy)
    for load in (lambda: torch.load(path, weights_only=True), lambda: checkpoint_safety.load(path, mmap=True)):
        with pytest.raises(checkpoint_safety.CheckpointError) as e:
            with checkpoint_safety.reading(path):
                load()
        message = str(e.value)
        assert message.startswith(f"{path}: refused as unsafe") and "posix.system" in message, message
        assert "truncated" not in message and "download" not in message and "\n" not in message
    assert not (tmp_path / "pwned").exists()


def test_the_safe_loader_reads_a_legacy_file_and_maps_a_zip_one(tmp_path):
    """mmap=True is a request, not a requirement: torch maps only its zip format, and a legacy (pre-zip) file,
    which fairseq and the hub read, is read whole instead of refused."""
    _saved(tmp_path / "legacy.pt", legacy=True)
    _saved(tmp_path / "zip.pt")
    for name in ("legacy.pt", "zip.pt"):
        state = checkpoint_safety.load(str(tmp_path / name), mmap=True)
        assert state["model"]["w"].shape == (2000,) and state["args"] is None
    _, cut = _damaged(tmp_path)
    with pytest.raises(checkpoint_safety.CheckpointError, match="cut_damaged.pt: truncated or damaged"):
        checkpoint_safety.load(cut, mmap=True)


@pytest.mark.slow  # the tool in a subprocess (make test-slow, CI)
def test_evaluate_names_the_refused_global_in_one_line(tmp_path, data):
    path = str(tmp_path / "evil.pt")
    torch.save({"model": {}, "args": _Payload(str(tmp_path / "pwned"))}, path)
    env = dict(os.environ, PYTHONPATH=helpers.REPO, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "acl_fairseq.cli.evaluate", path, data, "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, cwd=helpers.REPO)
    _one_line_exit_2(proc, path)
    assert "refused as unsafe" in proc.stderr and "posix.system" in proc.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


def test_one_config_reader_for_cfg_and_argparse_era_checkpoints(tmp_path):
    """checkpoint_safety.read_cfg, which acl-export and the dictionary check both read through: fairseq's cfg,
    an argparse-era checkpoint's sections built from its arguments, and a file that is not a checkpoint refused."""
    import argparse

    key = checkpoint_safety.DICTIONARY_KEY
    torch.save({"model": {}, "cfg": {"model": {key: "abc"}, "task": {"data": "d"}}}, tmp_path / "cfg.pt")
    legacy = argparse.Namespace(arch="roberta_base", data="d", **{key: "def"})
    torch.save({"model": {}, "args": legacy}, tmp_path / "args.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    cfg = checkpoint_safety.read_cfg(str(tmp_path / "cfg.pt"))
    assert cfg["task"] == {"data": "d"} and checkpoint_safety.dictionary_in_file(str(tmp_path / "cfg.pt")) == "abc"
    cfg = checkpoint_safety.read_cfg(str(tmp_path / "args.pt"))
    assert cfg["model"].arch == "roberta_base" and cfg["task"]["data"] == "d" and cfg["optimizer"] is cfg["task"]
    assert checkpoint_safety.dictionary_in_file(str(tmp_path / "args.pt")) == "def"
    with pytest.raises(checkpoint_safety.CheckpointError, match="list.pt is not a fairseq checkpoint"):
        checkpoint_safety.read_cfg(str(tmp_path / "list.pt"))
