"""Plausible mistakes with the commands, each one line with the fix and exit status 2: a path that is not what the
command reads (a run's folder, a manifest.json, acl-export's OUT, a checkpoint given to acl-serve), a TSV read with
no --task or --columns (its header and label column were classified as text, exit 0), and a checkpoint given
another task's --data (a 38-line size-mismatch traceback from fairseq, exit 1)."""
import os
import shutil

import pytest

import helpers
from acl_fairseq.cli import evaluate
from acl_fairseq.hf import export
from acl_runtime import console, inputs, paths, predict
from acl_runtime.serve import cli as serve_cli


def _usage(main, argv) -> str:
    with pytest.raises(console.UsageError) as e:
        main(argv)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


# ---- paths: one reading, every command -----------------------------------------------------------------


@pytest.fixture
def export_out(tmp_path):
    """The shape of an export's OUT (no model needed: each refusal comes before anything loads)."""
    out = tmp_path / "export"
    (out / "onnx").mkdir(parents=True)
    (out / "onnx" / "manifest.json").write_text("{}")
    return out


def test_a_run_folder_a_manifest_and_an_export_out_each_name_what_to_pass(predict_run, export_out, tmp_path):
    _, data, ckpt = predict_run
    run = os.path.dirname(ckpt)
    out = str(tmp_path / "p.jsonl")
    common = ["--data", data, "--input", os.path.join(data, "raw", "valid.input0"), "--output", out]
    assert _usage(predict.main, [run] + common) == f"{run} is a folder of checkpoints. Fix: pass the file, {ckpt}"
    manifest = str(export_out / "onnx" / "manifest.json")
    assert _usage(predict.main, [manifest] + common) == (f"{manifest} is an export's manifest. Fix: pass its folder, "
                                                         f"{export_out / 'onnx'}")
    assert _usage(predict.main, [str(export_out)] + common) == (f"{export_out} is acl-export's OUT folder. Fix: pass "
                                                                f"{export_out / 'onnx'}")
    # acl-serve: the same reading, and a checkpoint is told how to become a folder it serves
    assert _usage(serve_cli.main, [str(export_out)]).endswith(f"Fix: pass {export_out / 'onnx'}")
    assert _usage(serve_cli.main, [ckpt]) == (f"{ckpt} is a file; acl-serve reads a folder that acl-export --format "
                                              f"onnx wrote (OUT/onnx): acl-export {ckpt} --data DATA --output OUT "
                                              "--format onnx writes one; then acl-serve OUT/onnx")
    assert _usage(serve_cli.main, [run]).startswith(f"{run} is a folder of checkpoints; acl-serve reads")
    # acl-evaluate: a folder of checkpoints, an export
    assert _usage(evaluate.main, [run, data, "--output", str(tmp_path / "ee")]).endswith(f"pass the file, {ckpt}")
    assert "pass the checkpoint it was exported from" in _usage(
        evaluate.main, [str(export_out / "onnx"), data, "--output", str(tmp_path / "ee")])
    assert not os.path.exists(out) and not os.path.exists(tmp_path / "ee")


def test_acl_export_reads_the_same_paths(predict_run, tmp_path, capsys):
    _, data, ckpt = predict_run
    err = helpers.refusal(export.main, [os.path.dirname(ckpt), "--data", data, "--output", str(tmp_path / "out"),
                                        "--format", "onnx"], export.PROG)
    assert err == f"acl-export: error: {os.path.dirname(ckpt)} is a folder of checkpoints. Fix: pass the file, {ckpt}"
    assert not os.path.exists(tmp_path / "out")


def test_classify_tells_each_kind(tmp_path):
    assert paths.classify(str(tmp_path / "none")) == ("missing", str(tmp_path / "none"))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert paths.classify(str(tmp_path / "hf"))[0] == "hf"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint3.pt").write_text("")
    assert paths.classify(str(tmp_path / "run")) == ("run", str(tmp_path / "run" / "checkpoint3.pt"))
    with pytest.raises(console.UsageError, match="no such file or folder. Fix: pass a checkpoint file"):
        paths.check(str(tmp_path / "none"), (paths.CHECKPOINT, paths.ONNX), "acl-predict")


# ---- a TSV without its columns ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,first", [("dev.tsv", "a movie\n"), ("dev.txt", "sentence\tlabel\n")])
def test_a_tsv_read_without_task_or_columns_is_refused_with_the_fix(tmp_path, name, first):
    src = tmp_path / name
    src.write_text(first + "good\t1\n")
    with pytest.raises(console.UsageError) as e:
        inputs.Input(str(src))
    assert str(e.value).endswith("needs its columns named: pass --task TASK or --columns N, or --input-format text "
                                 "to read whole lines")
    source = inputs.Input(str(src), "text")  # asked for: whole lines
    assert [r.texts for r in source.rows()][-1] == ("good\t1",)
    source.close()
    source = inputs.Input(str(src), columns=[0], header=True)
    assert [r.texts for r in source.rows()] == [("good",)]
    source.close()


def test_acl_predict_refuses_a_tsv_without_its_columns_before_the_model_loads(predict_run, tmp_path, monkeypatch):
    _, data, ckpt = predict_run
    monkeypatch.setattr(predict, "load_hub", lambda args: pytest.fail("the model was loaded"))
    src = tmp_path / "dev.tsv"
    src.write_text("sentence1\tsentence2\tlabel\na\tb\t1\n")
    message = _usage(predict.main, [ckpt, "--data", data, "--input", str(src)])
    assert message.startswith(f"{src}: a TSV needs its columns named: pass --task TASK or --columns N")


# ---- another task's data folder ---------------------------------------------------------------------------


@pytest.fixture
def other_data(predict_run, tmp_path):
    """predict_run's data with a dictionary of more words: another task's, as far as the checkpoint can tell."""
    _, data, _ = predict_run
    other = tmp_path / "other-bin"
    shutil.copytree(data, other)
    with open(other / "input0" / "dict.txt", "a") as f:
        f.write("".join(f"extraword{i} 1\n" for i in range(24)))
    return str(other)


def test_another_tasks_data_is_one_line_before_fairseq_loads_weights(predict_run, other_data, tmp_path,
                                                                      monkeypatch):
    from fairseq import checkpoint_utils

    _, data, ckpt = predict_run
    monkeypatch.setattr(checkpoint_utils, "load_model_ensemble_and_task",
                        lambda *a, **k: pytest.fail("fairseq loaded the weights"))
    message = _usage(predict.main, [ckpt, "--data", other_data, "--input", os.path.join(data, "raw", "valid.input0"),
                                    "--output", str(tmp_path / "p.jsonl")])
    assert message.startswith(f"the data dictionary {other_data}/input0/dict.txt is not the one {ckpt} was trained "
                              "with"), message
    with pytest.raises(console.UsageError, match="use the data folder the model was trained on"):
        evaluate.main([ckpt, other_data, "--output", str(tmp_path / "ee")])
    assert not os.path.exists(tmp_path / "p.jsonl") and not os.path.exists(tmp_path / "ee")


# ---- acl-export: every format checked before any is written -------------------------------------------------


def test_export_says_which_format_cannot_be_written_why_and_what_can(predict_run, tmp_path, capsys, monkeypatch):
    _, data, ckpt = predict_run  # whitespace tokens: no standard Hugging Face tokenizer
    monkeypatch.setattr(export, "load_hub", lambda args: pytest.fail("the model was loaded"))
    err = helpers.refusal(export.main, [ckpt, "--data", data, "--output", str(tmp_path / "out"), "--format", "hf",
                                        "onnx"], export.PROG)
    assert err.startswith("acl-export: error: --format hf cannot be written: the data folder's tokenizer is "
                          "'whitespace'"), err
    assert err.endswith("Nothing was written. Fix: --format onnx can: pass it alone (hf needs a model fine-tuned "
                        "from a converted BERT or RoBERTa: docs/hf_import.md)"), err
    assert not os.path.exists(tmp_path / "out")
    # int8 calibration without the training split: onnx cannot be written either, and each says why
    shutil.copytree(data, tmp_path / "notrain")
    os.remove(tmp_path / "notrain" / "input0" / "train.bin")
    err = helpers.refusal(export.main, [ckpt, "--data", str(tmp_path / "notrain"), "--output", str(tmp_path / "out"),
                                        "--format", "hf", "onnx", "--quantize", "int8"], export.PROG)
    assert "--format hf cannot be written" in err and "--format onnx cannot be written: --quantize int8" in err, err
    assert "no format can be written with these flags" in err, err


def test_an_unknown_policy_is_told_that_none_is_taken_too():
    from acl_runtime import request

    with pytest.raises(ValueError, match=r"^unknown early-exit policy 'fast'; expected one of entropy, .*, or none "
                                         r"\(the last exit\)$"):
        request.resolve(None, "fast")
    assert request.resolve([1, 2], "none") == request.ExitRequest(source="argument")


def test_a_checkpoint_without_the_dictionary_hash_gets_the_one_line_too(predict_run, other_data, tmp_path):
    import torch

    from acl_fairseq import checkpoint_safety

    _, data, ckpt = predict_run  # a checkpoint trained before checkpoints recorded their dictionary's hash
    state = checkpoint_safety.load(ckpt)  # the safe loader, through the allowlist
    delattr(state["cfg"]["model"], checkpoint_safety.DICTIONARY_KEY)  # an argparse Namespace
    old = tmp_path / "old" / "checkpoint_best.pt"
    old.parent.mkdir()
    torch.save(state, old)
    message = _usage(predict.main, [str(old), "--data", other_data, "--input",
                                    os.path.join(data, "raw", "valid.input0"), "--output", str(tmp_path / "p.jsonl")])
    assert message.startswith(f"the data dictionary {other_data}/input0/dict.txt gives "), message
    assert "embedding rows" in message and message.endswith("use the data folder the model was trained on"), message
