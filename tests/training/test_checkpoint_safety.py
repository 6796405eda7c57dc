"""One home for checkpoint I/O: acl-evaluate, acl-predict and the hub read checkpoints through
checkpoint_safety's one loader (torch's safe loader with the allowlist), never fairseq's; a checkpoint holding a
forbidden global is refused naming it, with exit status 2, by every command that reads one; and every data
dictionary refusal (a checkpoint's record, a converted encoder's record, the dict.txt beside --restore-file) is one
check with one error, which the tools report in one line."""
import os
import types

import pytest
import torch

import helpers
from acl_fairseq import checkpoint_safety
from acl_fairseq.cli import evaluate
from acl_fairseq.inference import hub
from acl_fairseq.tasks import sentence_prediction_acl
from acl_runtime import conventions, predict
from test_checkpoint_files import _Payload, data  # noqa: F401  (the module's toy data folder)
from test_criterions import build


def test_evaluate_and_the_hub_read_through_the_one_safe_loader(predict_run, monkeypatch):
    from fairseq import checkpoint_utils

    _, data_bin, ckpt = predict_run

    def fairseq_loader(*args, **kwargs):
        raise AssertionError("fairseq's own checkpoint loader was called")

    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", fairseq_loader)
    loads, real_load = [], torch.load

    def spy(f, *args, **kwargs):
        loads.append((str(f), kwargs.get("weights_only")))
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    model, _, _ = evaluate.load_model(ckpt, data_bin, None, "cpu")
    m = hub.from_pretrained(os.path.dirname(ckpt), os.path.basename(ckpt), data_bin)
    assert loads == [(ckpt, True), (ckpt, True)]
    saved = real_load(ckpt, weights_only=True)["model"]
    for loaded in (model, m.model):
        state = loaded.state_dict()
        assert all(torch.equal(state[k], v) for k, v in saved.items() if k in state) and len(state) > 10


def _evil(tmp_path, legacy=False) -> str:
    path = str(tmp_path / "evil.pt")
    payload = {"model": {}, "args": _Payload(str(tmp_path / "pwned"))}
    torch.save(payload, path, _use_new_zipfile_serialization=not legacy)
    return path


@pytest.mark.parametrize("legacy", [False, True])
def test_the_hub_refuses_a_forbidden_global_naming_it(tmp_path, data, legacy):  # noqa: F811
    path = _evil(tmp_path, legacy)
    with pytest.raises(checkpoint_safety.CheckpointError) as e:
        hub.from_pretrained(str(tmp_path), "evil.pt", data)
    assert str(e.value).startswith(f"{path}: refused as unsafe") and "posix.system" in str(e.value)
    assert not (tmp_path / "pwned").exists()


def test_acl_predict_refuses_a_forbidden_global_in_one_line_exit_2(tmp_path, data):  # noqa: F811
    path = _evil(tmp_path)
    with pytest.raises(SystemExit) as e:
        predict.main([path, "--data", data, "--input", os.path.join(data, "raw", "valid.input0"), "--output",
                      str(tmp_path / "p.jsonl")])
    assert e.value.code == 2 or isinstance(e.value, predict.UsageError)
    message = str(e.value)
    assert message.startswith(f"{path}: refused as unsafe") and "posix.system" in message and "\n" not in message
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "p.jsonl").exists()


def test_acl_export_refuses_a_forbidden_global_in_one_line_exit_2(tmp_path, data, capsys):  # noqa: F811
    from acl_fairseq.hf import export

    path = _evil(tmp_path)
    err = helpers.refusal(export.main, [path, "--data", data, "--output", str(tmp_path / "out"), "--format", "onnx"],
                          export.PROG)
    assert "posix.system" in err and "refused as unsafe" in err
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("legacy", [False, True])
def test_fairseq_train_refuses_a_forbidden_restore_file_naming_it(tmp_path, data, caplog, legacy):  # noqa: F811
    """The plugin task reads --restore-file through the safe loader before fairseq's loader would (a traceback)."""
    path = _evil(tmp_path, legacy)
    with pytest.raises(SystemExit) as e:
        build(data, "sentence_ce", extra=["--task", "sentence_prediction_acl", "--restore-file", path])
    assert e.value.code == 2 and f"{path}: refused as unsafe" in caplog.text and "posix.system" in caplog.text
    assert not (tmp_path / "pwned").exists()


@pytest.mark.slow  # fairseq-train in a subprocess: about 10 s
def test_fairseq_train_with_a_forbidden_restore_file_exits_2_in_one_line(tmp_path, data):  # noqa: F811
    path = _evil(tmp_path)
    proc = helpers.train(data, str(tmp_path / "run"), extra=["--task", "sentence_prediction_acl", "--restore-file",
                                                             path], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "refused as unsafe" in out and "posix.system" in out
    assert not (tmp_path / "pwned").exists() and not os.path.exists(tmp_path / "run" / "checkpoint_last.pt")


# ---- one data-dictionary check ------------------------------------------------------------------------------


def _other_data(tmp_path, data):  # noqa: F811
    """A copy of the data folder's dict.txt with two words swapped: same size, other rows."""
    other = tmp_path / "other"
    (other / "input0").mkdir(parents=True)
    lines = open(os.path.join(data, "input0", "dict.txt"), encoding="utf-8").read().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    (other / "input0" / "dict.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(other), str(other / "input0" / "dict.txt")


def test_every_dictionary_refusal_is_the_one_check(tmp_path, data):  # noqa: F811
    """A checkpoint's record, a converted encoder's record and the dict.txt beside --restore-file each refuse data
    of another dictionary with the same error, which acl-evaluate and acl-predict report in one line (a converted
    encoder's refusal was a plain ConventionsError, a traceback when acl-evaluate loaded such a checkpoint)."""
    other, other_dict = _other_data(tmp_path, data)
    sha = conventions.dictionary_sha256(os.path.join(data, "input0", "dict.txt"))
    assert conventions.dictionary_sha256(other_dict) != sha
    record = {"pair_format": "double", "dictionary_sha256": sha, "dictionary_path": "enc/dict.txt"}
    task = types.SimpleNamespace(cfg=types.SimpleNamespace(separator_token=2, data=other))
    restore = tmp_path / "roberta" / "model.pt"
    restore.parent.mkdir()
    torch.save({}, str(restore))
    os.link(os.path.join(data, "input0", "dict.txt"), restore.parent / "dict.txt")
    restore_cfg = types.SimpleNamespace(restore_file=str(restore), checkpoint_suffix="", data=other)
    refusals = {
        "checkpoint": lambda: checkpoint_safety.check_dictionary(sha, other, "run/checkpoint_best.pt"),
        "converted": lambda: conventions.apply_to_task(record, task),
        "restore": lambda: sentence_prediction_acl.check_restore(restore_cfg),
    }
    for what, refuse in refusals.items():
        with pytest.raises(conventions.DictionaryMismatch) as e:
            refuse()
        assert str(e.value).startswith(f"the data dictionary {other_dict} "), (what, str(e.value))
        assert "--srcdict" in str(e.value) and "\n" not in str(e.value)
    assert checkpoint_safety.DictionaryMismatch is conventions.DictionaryMismatch
    for same in (lambda: checkpoint_safety.check_dictionary(sha, data, "run/checkpoint_best.pt"),
                 lambda: conventions.apply_to_task(record, types.SimpleNamespace(cfg=types.SimpleNamespace(
                     separator_token=2, data=data))),
                 lambda: sentence_prediction_acl.check_restore(types.SimpleNamespace(
                     restore_file=str(restore), checkpoint_suffix="", data=data))):
        same()  # the dictionary the rows follow: accepted
