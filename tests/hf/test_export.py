"""acl-export --format hf: tiny trained models of both families leave fairseq as standard HF folders.

A BERT family model: a tiny random HF BERT, converted (acl-convert-hf), fine-tuned two updates on RTE-format
pairs tokenized with its WordPiece. A RoBERTa family model: fairseq's multi_exit_roberta on a local GPT-2 BPE,
whose dict.txt orders the BPE ids by frequency (so the vocabulary is re-indexed). Both have two exits, so the
exported classifier is the last one and the other goes to exit_heads.safetensors.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import transformers

import helpers
from acl_fairseq.hf import convert as convert_hf
from acl_fairseq.hf import export
from acl_fairseq.inference import early_exit, hub
from acl_runtime import predict

HEAD = "sentence_classification_head"


def _train(data, save, model_args, extra=()):
    helpers.train(data, save, criterion="sentence_prediction", arch="multi_exit_roberta", model_args=model_args,
                  extra=["--max-update", "2", *extra])
    return os.path.join(save, "checkpoint_last.pt")


def _bert(root, bert):
    """A copy in ``root`` of conftest's tiny_bert_rte (its checkpoint is sharpened here, in place)."""
    shared = os.path.dirname(bert["data"])
    shutil.copytree(shared, root, dirs_exist_ok=True)
    return tuple(os.path.join(str(root), os.path.relpath(bert[k], shared)) for k in ("folder", "ckpt"))


def _roberta(root):
    import toy_glue as tp

    bpe_dir = tp.make_assets(root)["bpe_dir"]
    folder, _ = tp.make_task(root / "glue", "RTE")
    tp.run_main("RTE", folder, root / "bin", "--tokenizer", "gpt2", "--bpe-dir", bpe_dir)
    return folder, _train(str(root / "bin"), str(root / "ckpt"), helpers.TINY_ROBERTA + ["--exit-layers", "1,3"])


def _sharpen(ckpt, data, examples, spread=0.02):
    """Rescale the last exit's out_proj in ``ckpt`` so that its logit difference has std ``spread`` over
    ``examples``, centred between the two middle examples: a random two-update model gives nearly the same
    probabilities to every input (std ~1e-4), which would let a wrong mapping pass a 1e-4 comparison and
    every label be the same. Returns the smallest |logit difference| (the margin from a tie)."""
    model = hub.from_pretrained(os.path.dirname(ckpt), os.path.basename(ckpt), data).eval()
    with torch.no_grad():
        logits = torch.cat([model.predict(HEAD, model.encode(*((x,) if isinstance(x, str) else x)),
                                          return_logits=True) for x in examples])
    diff = (logits[:, 0] - logits[:, 1]).double()
    ordered = diff.sort().values
    centre, scale = float(ordered[len(diff) // 2 - 1] + ordered[len(diff) // 2]) / 2, spread / float(diff.std())
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    key = f"classification_heads.{HEAD}.out_proj."
    state["model"][key + "weight"] = state["model"][key + "weight"] * scale
    state["model"][key + "bias"] = (state["model"][key + "bias"] - torch.tensor([centre / 2, -centre / 2])) * scale
    torch.save(state, ckpt)
    return float((diff - centre).abs().min()) * scale


@pytest.fixture(scope="module", params=["bert", "roberta"])
def run(request, tmp_path_factory):
    """(family, root, GLUE folder, checkpoint, data, exported folder OUT, the hub model)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "bert":
        folder, ckpt = _bert(root, request.getfixturevalue("tiny_bert_rte"))
    else:
        folder, ckpt = _roberta(root)
    margin = _sharpen(ckpt, str(root / "bin"), _examples(folder))
    assert margin > 1e-4, margin  # every label well away from a tie at fp32 noise (~1e-6 after scaling)
    out = str(root / "export")
    export.main([ckpt, "--data", str(root / "bin"), "--output", out])
    model = hub.from_pretrained(os.path.dirname(ckpt), os.path.basename(ckpt), str(root / "bin")).eval()
    return request.param, root, folder, ckpt, str(root / "bin"), out, model


def _examples(folder):
    """RTE dev: the pairs with their sides swapped, then the pairs (the model reads pairs: a lone text is refused,
    acl_runtime.pairing)."""
    lines = open(os.path.join(folder, "dev.tsv"), encoding="utf-8").read().splitlines()[1:]
    rows = [line.split("\t") for line in lines]
    return [(r[2].strip(), r[1].strip()) for r in rows] + [(r[1].strip(), r[2].strip()) for r in rows]


def _predict_cli(run, tmp_path):
    """acl-predict's records for the swapped pairs (a TSV read with --columns) and the pairs (the GLUE file)."""
    _, _, folder, ckpt, data, _, _ = run
    examples = _examples(folder)
    swapped = tmp_path / "swapped.tsv"
    swapped.write_text("".join(f"{a}\t{b}\n" for a, b in examples[: len(examples) // 2]), encoding="utf-8")
    records = []
    for extra, name in ((["--input", str(swapped), "--columns", "1,2"], "a.jsonl"),
                        (["--input", os.path.join(folder, "dev.tsv"), "--task", "RTE"], "b.jsonl")):
        predict.main([ckpt, "--data", data, *extra, "--output", str(tmp_path / name), "--device", "cpu"])
        records += [json.loads(line) for line in open(tmp_path / name)]
    return records


def test_pipeline_gives_acl_predicts_labels_and_probabilities(run, tmp_path):
    family, _, folder, _, _, out, model = run
    examples = _examples(folder)
    records = _predict_cli(run, tmp_path)
    assert len(records) == len(examples) and not any(r["truncated"] for r in records)
    classify = transformers.pipeline("text-classification", model=os.path.join(out, "hf"), top_k=None)
    assert type(classify.model).__name__ == {"bert": "BertForSequenceClassification",
                                             "roberta": "RobertaForSequenceClassification"}[family]
    for a, _ in examples:  # a sentence alone: the same row too, though the model reads pairs
        assert classify.tokenizer(a)["input_ids"] == model.encode(a).tolist(), a
    labels = []
    for x, rec in zip(examples, records):
        assert classify.tokenizer(*x)["input_ids"] == model.encode(*x).tolist(), x  # the same rows, specials, layout
        got = classify({"text": x[0], "text_pair": x[1]})
        got = {d["label"]: d["score"] for d in (got[0] if isinstance(got[0], list) else got)}
        labels.append(rec["label"])
        assert max(got, key=got.get) == rec["label"], (x, got, rec)
        assert got.keys() == rec["probabilities"].keys()
        assert max(abs(got[k] - p) for k, p in rec["probabilities"].items()) < 1e-4, (x, got, rec)
    assert len(set(labels)) == 2  # both labels occur, so a swapped or constant classifier would fail


def test_convert_hf_round_trips_to_the_same_logits(run, tmp_path):
    import tiny_hf as tc

    family, _, folder, _, _, out, model = run
    convert_hf.cli_main([os.path.join(out, "hf"), str(tmp_path / "back")])  # no flags: the classifier is kept
    back, dictionary, _ = tc.load_fairseq(str(tmp_path / "back"), num_classes=2)
    # the same rows; a converted RoBERTa's dict.txt spells them as HF ids, which are now the rows themselves
    assert len(dictionary) == len(model.task.source_dictionary)
    expected = model.task.source_dictionary.symbols if family == "bert" else \
        model.task.source_dictionary.symbols[:4] + [str(i) for i in range(4, len(dictionary) - 1)] + ["<mask>"]
    assert dictionary.symbols == expected
    for x in _examples(folder):
        tokens = model.encode(*((x,) if isinstance(x, str) else x))
        with torch.no_grad():
            theirs = back(tokens[None], classification_head_name=HEAD)[0]
        torch.testing.assert_close(theirs, model.predict(HEAD, tokens, return_logits=True), atol=1e-5, rtol=0)


def test_exit_heads_and_record_reproduce_every_exit(run):
    """HF's hidden states and exit_heads.safetensors, run as early_exit.json says, give the engine's exit logits."""
    from safetensors.torch import load_file

    family, _, folder, _, _, out, model = run
    hf_dir = os.path.join(out, "hf")
    record = json.load(open(os.path.join(hf_dir, "early_exit.json")))
    assert record["exit_layers"] == model.exit_layers and record["pooling"] == "cls" and record["policy"] is None
    assert record["input_layout"]["pair_format"] == {"bert": "single", "roberta": "double"}[family]
    heads = load_file(os.path.join(hf_dir, record["heads_file"]))
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    pairs = [x for x in _examples(folder) if not isinstance(x, str)][:4]
    for a, b in pairs:
        with torch.no_grad():
            res = hf(**tok(a, b, return_tensors="pt"), output_hidden_states=True)
            ours = early_exit.early_exit_forward(model.model, model.encode(a, b)[None], HEAD).exit_logits[0]
        for m, layer in enumerate(record["exit_layers"][:-1]):
            name = record["heads"][str(layer)]
            cls = res.hidden_states[layer][:, 0]
            x = torch.tanh(cls @ heads[f"{name}.dense.weight"].T + heads[f"{name}.dense.bias"])
            logits = x @ heads[f"{name}.out_proj.weight"].T + heads[f"{name}.out_proj.bias"]
            torch.testing.assert_close(logits[0], ours[m], atol=1e-5, rtol=0)
        torch.testing.assert_close(res.logits[0], ours[-1], atol=1e-5, rtol=0)


def test_config_and_model_card(run):
    family, _, _, _, _, out, model = run
    hf_dir = os.path.join(out, "hf")
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    names = model.label_names()
    assert config["layer_norm_eps"] == 1e-5 and config["model_type"] == family
    assert config["id2label"] == {str(i): n for i, n in enumerate(names)} and sorted(names) == ["entailment",
                                                                                               "not_entailment"]
    card = open(os.path.join(hf_dir, "README.md")).read()
    assert "fairseq-train DATA_BIN" in card and "--criterion sentence_prediction" in card and "--max-update 2" in card
    assert all(f"`{n}`" in card for n in names)
    rows = [line for line in card.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == model.exit_layers  # one metrics row per exit
    assert sorted(os.listdir(out)) == ["hf"]


def test_mean_pooling_is_refused_before_loading(run, tmp_path, capsys):
    _, _, _, ckpt, data, _, _ = run
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    state["cfg"]["model"].exit_pooling = "mean"
    torch.save(state, tmp_path / "mean.pt")
    err = helpers.refusal(export.main, [str(tmp_path / "mean.pt"), "--data", data, "--output", str(tmp_path / "out")],
                          export.PROG)
    assert "--exit-pooling mean" in err and "[CLS]" in err
    assert not os.path.exists(tmp_path / "out")


def test_force_replaces_only_the_format_folders_and_keeps_the_rest_of_out(run, tmp_path, capsys):
    """OUT may be the run's own folder: an existing OUT/hf is refused without --force and replaced with it;
    the checkpoint beside it and another format's folder are never touched (as HF's save_pretrained)."""
    _, _, _, ckpt, data, _, _ = run
    out = tmp_path / "out"
    (out / "onnx").mkdir(parents=True)  # an earlier export of the other format
    (out / "onnx" / "manifest.json").write_text("{}")
    (out / "checkpoint_best.pt").write_text("mine")
    argv = [ckpt, "--data", data, "--output", str(out), "--metrics-split", "none"]
    export.main(argv)
    assert sorted(os.listdir(out)) == ["checkpoint_best.pt", "hf", "onnx"]
    (out / "hf" / "stale.txt").write_text("from the last export")
    assert f"{out / 'hf'} exists; pass --force" in helpers.refusal(export.main, argv, export.PROG)
    assert (out / "hf" / "stale.txt").exists()
    export.main(argv + ["--force"])
    assert sorted(os.listdir(out)) == ["checkpoint_best.pt", "hf", "onnx"]  # no temporary folder left
    assert not (out / "hf" / "stale.txt").exists() and (out / "hf" / "config.json").is_file()
    assert (out / "checkpoint_best.pt").read_text() == "mine" and (out / "onnx" / "manifest.json").read_text() == "{}"
    assert "is a file: give a folder" in helpers.refusal(
        export.main, [ckpt, "--data", data, "--output", str(out / "checkpoint_best.pt")], export.PROG)


def test_quantize_needs_the_onnx_format(run, tmp_path, capsys):
    _, _, _, ckpt, data, _, _ = run
    assert "--quantize applies to --format onnx" in helpers.refusal(
        export.main, [ckpt, "--data", data, "--output", str(tmp_path / "out"), "--quantize", "int8"], export.PROG)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow  # a whole ONNX export (make test-slow, CI)
def test_mean_pooling_exports_to_onnx_but_not_to_hf(run, tmp_path, capsys):
    """The ONNX graphs run any exit as trained; only HF's standard classifier reads [CLS] alone. The ONNX
    tokenizer file is exact for WordPiece, and GPT-2 BPE is refused with the reason."""
    family, _, _, ckpt, data, _, _ = run
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    state["cfg"]["model"].exit_pooling = "mean"
    torch.save(state, tmp_path / "mean.pt")
    argv = [str(tmp_path / "mean.pt"), "--data", data, "--output", str(tmp_path / "out"), "--format", "onnx",
            "--metrics-split", "none"]
    if family == "bert":
        export.main(argv)
        manifest = json.load(open(tmp_path / "out" / "onnx" / "manifest.json"))
        assert manifest["pooling"] == "mean" and os.listdir(tmp_path / "out") == ["onnx"]
    else:
        assert "tokenizer is 'gpt2'" in helpers.refusal(export.main, argv, export.PROG)
        assert not os.path.exists(tmp_path / "out")


def test_a_vocabulary_the_dictionary_does_not_cover_is_refused_and_nothing_is_left(run, tmp_path, capsys):
    import shutil

    family, _, _, ckpt, data, _, _ = run
    shutil.copytree(data, tmp_path / "bin")
    if family == "bert":  # a wordpiece the dictionary lacks: fairseq reads it as <unk>, HF's WordPiece would not
        with open(tmp_path / "bin" / "vocab.txt", "a", encoding="utf-8") as f:
            f.write("zzzextra\n")
    else:
        encoder = json.load(open(tmp_path / "bin" / "encoder.json"))
        encoder["zzzextra"] = len(encoder)
        json.dump(encoder, open(tmp_path / "bin" / "encoder.json", "w"))
    err = helpers.refusal(export.main, [ckpt, "--data", str(tmp_path / "bin"), "--output", str(tmp_path / "out")],
                          export.PROG)
    assert "'zzzextra'" in err and "the data dictionary lacks 1 of" in err, err
    assert sorted(os.listdir(tmp_path)) == ["bin"]  # neither OUT nor its temporary folder


def test_a_tokenizer_without_an_hf_equivalent_is_refused_before_loading(run, tmp_path, capsys):
    _, _, _, ckpt, _, _, _ = run
    data = helpers.make_data(str(tmp_path / "toy"), n_train=8, n_valid=4)["data"]  # whitespace tokens
    err = helpers.refusal(export.main, [ckpt, "--data", data, "--output", str(tmp_path / "out")], export.PROG)
    assert "tokenizer is 'whitespace'" in err, err
    assert not os.path.exists(tmp_path / "out")


def test_sigterm_removes_the_temporary_folder(tmp_path):
    def build(tmp):
        open(os.path.join(tmp, "partial"), "w").close()
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as exc:
        export.write_atomically(str(tmp_path / "out"), False, build)
    assert exc.value.code == 128 + signal.SIGTERM and os.listdir(tmp_path) == []


def test_help_names_every_flag():
    proc = subprocess.run([sys.executable, "-m", "acl_fairseq.hf.export", "--help"], capture_output=True, text=True,
                          cwd=helpers.REPO)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--data", "--output", "--format", "--force", "--policy", "--threshold", "--metrics-split"):
        assert flag in proc.stdout


@pytest.mark.parametrize("policy,threshold", [("entropy", "1.5"), ("confidence", "nan"), ("patience", "0")])
def test_a_threshold_outside_its_policys_range_is_refused_before_loading(run, tmp_path, capsys, policy, threshold):
    _, _, _, ckpt, data, _, _ = run
    err = helpers.refusal(export.main, [ckpt, "--data", data, "--output", str(tmp_path / "out"), "--policy", policy,
                                        "--threshold", threshold], export.PROG)
    assert policy in err
    assert not os.path.exists(tmp_path / "out")
