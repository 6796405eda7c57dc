"""A converted BERT in fairseq-train: restored with its conventions (pair format, segment embedding, head
dropout) that travel in the checkpoint; refused without its segment embedding or with another dictionary."""
import json
import os
import shutil

import pytest
import torch

import helpers
from acl_fairseq.hf import convert as convert_hf
from acl_runtime import conventions
from tiny_hf import write_bert
from toy_data import make_examples, write_raw


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    """The converted tiny BERT (with a pooler head for 2 classes) and the toy task binarized with its dict."""
    root = tmp_path_factory.mktemp("bert_run")
    hf_dir = str(root / "hf")
    write_bert(hf_dir)
    out = str(root / "fs")
    convert_hf.convert(hf_dir, out, num_classes=2)
    raw = str(root / "raw")
    os.makedirs(raw)
    write_raw(os.path.join(raw, "train"), make_examples(24, seed=0, pair=True))
    write_raw(os.path.join(raw, "valid"), make_examples(8, seed=1, pair=True))
    _binarize(raw, str(root / "data"), os.path.join(out, "dict.txt"))
    return out, str(root / "data")


def _binarize(raw: str, out: str, srcdict: str) -> None:
    """The toy task with input0 mapped through the converted dict.txt (labels get their own dict)."""
    from fairseq_cli import preprocess

    fields = [("input0", ["--srcdict", srcdict]), ("label", [])]
    if os.path.isfile(os.path.join(raw, "train.input1")):
        fields.append(("input1", ["--srcdict", srcdict]))
    for field, extra in fields:
        args = ["--only-source", "--destdir", os.path.join(out, field), "--workers", "1",
                "--trainpref", os.path.join(raw, f"train.{field}"), "--validpref", os.path.join(raw, f"valid.{field}")]
        preprocess.main(preprocess.options.get_preprocessing_parser().parse_args(args + extra))


def _restore_flags(out):
    return ["--restore-file", os.path.join(out, "model.pt"), "--reset-optimizer", "--reset-dataloader",
            "--reset-meters"]


def _model_flags(out, *more):
    return open(os.path.join(out, "model_args.txt")).read().split() + ["--dropout", "0.0", "--attention-dropout",
                                                                        "0.0", *more]


def test_converted_bert_restores_in_fairseq_train_with_its_conventions(bert_run, tmp_path):
    out, data = bert_run
    proc = helpers.train(data, str(tmp_path / "ckpt"), arch="multi_exit_roberta", extra=_restore_flags(out),
                         model_args=_model_flags(out, "--exit-layers", "3", "--conventions", out))
    log = proc.stdout + proc.stderr
    assert f"Loaded checkpoint {os.path.join(out, 'model.pt')}" in log, log[-3000:]
    assert "No existing checkpoint found" not in log
    assert "newly initialised" not in log  # the pooler-initialised head was kept
    # helpers pass RoBERTa's separator token 2; the BERT record says single, and wins (reported)
    assert f"{conventions.SEPARATOR_FLAG} 2 becomes None" in log
    state = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", weights_only=True, map_location="cpu")
    record = json.loads(state["cfg"]["model"].conventions)  # the record itself travels in the checkpoint
    assert record["pair_format"] == "single" and record["segment_embedding"] is True
    from fairseq import checkpoint_utils  # what acl-evaluate and the hub do: the record applies again

    _, _, task = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "ckpt" / "checkpoint_last.pt")])
    task.load_dataset("valid")
    tokens = task.datasets["valid"][0]["net_input.src_tokens"]
    assert tokens[0] == 0 and int(tokens.eq(2).sum()) == 2  # <s> A </s> B </s>: one separator
    assert state["cfg"]["model"].pooler_dropout == 0.0  # SIZES: hidden_dropout_prob 0.0 -> head dropout 0
    start = torch.load(os.path.join(out, "model.pt"), weights_only=True)["model"]["segment_delta"]
    assert not torch.equal(state["model"]["segment_delta"], start)  # trained like any parameter


# a fairseq-train subprocess each, 4-6 s idle: make test keeps the multi-exit case (the plugin's own message);
# plain roberta's, which is torch's strict loading, is slow
@pytest.mark.parametrize("arch, extra, message", [
    pytest.param("roberta", [], 'Unexpected key(s) in state_dict: "segment_delta"', marks=pytest.mark.slow),
    ("multi_exit_roberta", ["--exit-layers", "3"], "built without it: pass --conventions"),
])
def test_converted_bert_without_its_segment_embedding_is_refused(bert_run, tmp_path, arch, extra, message):
    out, data = bert_run
    proc = helpers.train(data, str(tmp_path / "ckpt"), arch=arch, extra=_restore_flags(out),
                         model_args=_model_flags(out, *extra), check=False)
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_data_binarized_with_another_dictionary_is_refused_before_training(bert_run, tmp_path):
    out, data = bert_run
    other = tmp_path / "data"
    shutil.copytree(data, other)
    with open(other / "input0" / "dict.txt", "a") as f:
        f.write("someotherword 1\n")
    proc = helpers.train(str(other), str(tmp_path / "ckpt"), arch="multi_exit_roberta", extra=_restore_flags(out),
                         model_args=_model_flags(out, "--exit-layers", "3", "--conventions", out), check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-2000:]
    assert f"the data dictionary {other / 'input0' / 'dict.txt'} differs from the encoder's " \
           f"{os.path.join(out, 'dict.txt')}" in log, log[-3000:]
    assert "begin training" not in log and not os.path.exists(tmp_path / "ckpt" / "checkpoint_last.pt")
