"""Every checkpoint records the hash of the data dictionary it was trained with, and a data folder binarized
with another dictionary is refused wherever a checkpoint meets it: acl-evaluate, acl-predict, the hub and
``fairseq-train --restore-file`` (or a resume). A checkpoint that records none is used with a warning. A
``--restore-file`` that does not exist is refused instead of training from random weights."""
import logging
import os
import shutil
import sys
import types

import pytest
import torch

import helpers
from acl_fairseq import checkpoint_safety
from acl_fairseq.cli import evaluate
from acl_fairseq.inference import hub
from acl_fairseq.tasks import sentence_prediction_acl
from acl_runtime import console, conventions, predict

# run name -> how it was trained: the plugin task records for a plain roberta (conftest's plugin_task_run),
# multi_exit_roberta's build records under the stock task
RUNS = {"plugin": dict(task="sentence_prediction_acl"), "stock": dict(arch="multi_exit_roberta")}


@pytest.fixture(scope="module")
def runs(plugin_task_run, tmp_path_factory):
    """(root, data, other): a tiny model per RUNS entry trained on ``data`` (the plugin run is conftest's
    plugin_task_run, copied here); ``other`` is the same toy task binarized from another sample (seed 7): the same
    words, counted and so ordered differently."""
    root = tmp_path_factory.mktemp("dictionary")
    data, plugin_run = plugin_task_run
    shutil.copytree(plugin_run, root / "plugin")
    other = helpers.make_data(str(root / "other"), seed=7)["data"]
    helpers.train(data, str(root / "stock"), **RUNS["stock"])
    return root, data, other


def ckpt(root, name):
    return str(root / name / "checkpoint_best.pt")


def without_record(src, dst):
    """A copy of checkpoint ``src`` as trained before checkpoints carried the hash."""
    state = torch.load(src, weights_only=True)
    delattr(state["cfg"]["model"], checkpoint_safety.DICTIONARY_KEY)
    torch.save(state, dst)
    return str(dst)


def test_the_two_data_folders_differ_only_in_word_order(runs):
    _, data, other = runs
    ours, theirs = (open(os.path.join(d, "input0", "dict.txt")).read().split("\n") for d in (data, other))
    assert len(ours) == len(theirs) and ours != theirs


@pytest.mark.parametrize("name", list(RUNS))
def test_training_records_the_data_dictionary_in_every_checkpoint(runs, name):
    root, data, _ = runs
    expected = conventions.dictionary_sha256(os.path.join(data, "input0", "dict.txt"))
    for file in ("checkpoint_best.pt", "checkpoint_last.pt"):
        state = torch.load(str(root / name / file), weights_only=True)
        assert getattr(state["cfg"]["model"], checkpoint_safety.DICTIONARY_KEY) == expected
        assert checkpoint_safety.dictionary_in_file(str(root / name / file)) == expected


@pytest.mark.parametrize("name", list(RUNS))
def test_another_dictionary_is_refused_by_evaluate_predict_and_the_hub(runs, name, tmp_path):
    root, data, other = runs
    path = ckpt(root, name)
    message = f"data dictionary {other}/input0/dict.txt is not the one {path} was trained with"
    with pytest.raises(console.UsageError, match=message):  # the one opening's error policy (hub.open_checkpoint)
        evaluate.main([path, other, "--output", str(tmp_path / "ev"), "--timing-examples", "0"])
    with pytest.raises(checkpoint_safety.DictionaryMismatch, match=message):
        hub.from_pretrained(str(root / name), "checkpoint_best.pt", other)
    with pytest.raises(SystemExit, match="the " + message) as refused:  # console.run adds "acl-predict: error:"
        predict.main([path, "--data", other, "--input", os.path.join(other, "raw", "valid.input0"),
                      "--output", str(tmp_path / "p.jsonl")])
    assert refused.value.code == 2  # an input error, as acl-predict's other refusals
    assert not os.path.exists(tmp_path / "ev") and not os.path.exists(tmp_path / "p.jsonl")
    model = hub.from_pretrained(str(root / name), "checkpoint_best.pt", data)  # its own data: accepted
    assert len(model.predict_early_exit(["the movie was good"])) == 1


def test_acl_evaluate_says_so_in_one_line(runs, tmp_path):
    root, _, other = runs
    proc = helpers._run([sys.executable, "-m", "acl_fairseq.cli.evaluate", ckpt(root, "stock"), other, "--output",
                         str(tmp_path / "ev")], "acl-evaluate", None, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("acl-evaluate: error: the data dictionary")


@pytest.mark.parametrize("name", list(RUNS))
def test_a_checkpoint_without_the_record_is_used_with_a_warning(runs, name, tmp_path, caplog):
    root, _, other = runs
    old = without_record(ckpt(root, name), tmp_path / "old.pt")
    with caplog.at_level(logging.WARNING, logger="acl_fairseq.checkpoint_safety"):
        evaluate.load_model(old, other, None, "cpu")
        hub.from_pretrained(str(tmp_path), "old.pt", other)
    warned = [r.getMessage() for r in caplog.records if "records no data dictionary hash" in r.getMessage()]
    assert len(warned) == 2 and all(f"{other}/input0/dict.txt" in w for w in warned)


def train_from(root, data, save_dir, restore=None, **kw):
    extra = ["--reset-optimizer"] + (["--restore-file", restore] if restore else [])
    return helpers.train(data, str(save_dir), task="sentence_prediction_acl", extra=extra, check=False, **kw)


@pytest.mark.slow  # fairseq-train runs (make test-slow, CI)
def test_restore_file_trained_with_another_dictionary_is_refused(runs, tmp_path):
    root, data, other = runs
    path = ckpt(root, "stock")
    proc = train_from(root, other, tmp_path / "on_other", path, arch="multi_exit_roberta")
    assert proc.returncode != 0
    assert (f"DictionaryMismatch: the data dictionary {other}/input0/dict.txt is not the one --restore-file {path} "
            "was trained with") in proc.stderr
    assert not os.path.exists(tmp_path / "on_other" / "checkpoint_last.pt")
    proc = train_from(root, data, tmp_path / "on_data", path, arch="multi_exit_roberta")  # its own data
    assert proc.returncode == 0 and f"Loaded checkpoint {path}" in proc.stdout + proc.stderr


@pytest.mark.slow  # fairseq-train runs (make test-slow, CI)
def test_resuming_a_run_on_another_dictionary_is_refused(runs, tmp_path):
    root, _, other = runs
    shutil.copytree(root / "plugin", tmp_path / "run")
    proc = train_from(root, other, tmp_path / "run")  # the default --restore-file: the run's checkpoint_last.pt
    assert proc.returncode != 0
    assert f"is not the one {tmp_path / 'run' / 'checkpoint_last.pt'} was trained with" in proc.stderr


@pytest.mark.slow  # fairseq-train runs (make test-slow, CI)
@pytest.mark.parametrize("restore", ["missing/model.pt", "ABSOLUTE"])
def test_a_restore_file_that_does_not_exist_is_refused(runs, tmp_path, restore):
    """fairseq trains from random weights and exits 0 when a non-default --restore-file is missing."""
    root, data, _ = runs
    restore = str(tmp_path / "nope.pt") if restore == "ABSOLUTE" else restore
    proc = train_from(root, data, tmp_path / "save", restore)
    assert proc.returncode != 0
    assert f"FileNotFoundError: --restore-file {restore}: no such file (fairseq would train from random weights)" \
        in proc.stderr
    assert not os.path.exists(tmp_path / "save" / "checkpoint_last.pt")


def test_a_sharded_or_suffixed_restore_file_counts_as_present(tmp_path):
    """fairseq reads --restore-file X.pt as X{--checkpoint-suffix}.pt, and X{suffix}-shardN.pt when sharded."""
    def cfg(restore, suffix=""):
        return types.SimpleNamespace(restore_file=str(tmp_path / restore), checkpoint_suffix=suffix, data=None)

    (tmp_path / "model-ft.pt").write_bytes(b"")
    (tmp_path / "big-shard0.pt").write_bytes(b"")
    sentence_prediction_acl.check_restore(cfg("model.pt", "-ft"))
    sentence_prediction_acl.check_restore(cfg("big.pt"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        sentence_prediction_acl.check_restore(cfg("model.pt"))
