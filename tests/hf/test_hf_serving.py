"""From training to serving: an HF-trained multi-exit folder (acl-train-hf's output) through ``acl-export --format
onnx``, then ``acl-predict OUT/onnx`` and ``acl-serve OUT/onnx``, answering as the HF model itself does
(``model(...)``'s exit logits, ``model.predict_early_exit``).

The model: test_hf_train_cli's tiny random BERT with MiniLM's WordPiece tokenizer, trained 4 steps by acl-train-hf on
a toy SST-2 folder. A barely trained head says one label for everything at nearly 0.5, so its heads are then sharpened
(out_proj times SHARPEN) and their biases centred on TEXTS, and the model saved back into the folder
(``save_pretrained``): the texts spread over both labels and over the exits. Measured on 2 cores of a Xeon with AMX
(machine shared): probabilities within 1.5e-6 of the HF model's at every exit (fp32 rounding: fairseq's layers sum in
another order), hence ATOL 1e-5; with fairseq's LayerNorm epsilon (1e-5) in place of BERT's (1e-12) they were 1.8e-4
apart.
"""
import json
import os

import numpy as np
import pytest

import helpers
from test_hf_train_cli import flags, tiny  # noqa: F401  (tiny: a fixture)

pytest.importorskip("transformers")
pytest.importorskip("fairseq")

SHARPEN = 64.0
ATOL = 1e-5
INT8_ATOL = 0.15  # measured 0.047 (static int8, the heads sharpened 64 times)
TEXTS = ["the movie was really great and fun", "a dull and boring plot", "lovely acting , good film",
         "bad , awful , poor", "The Movie WAS Great !", "café naïve déjà-vu", "   spaced    out   words  ",
         "an utterly forgettable sequel", "one of the best films of the year", "i hated every minute of it",
         "not bad at all", "a masterpiece of boredom"]


def encode(tokenizer, text):
    return tokenizer(*([text] if isinstance(text, str) else text), return_tensors="pt")


def hf_exit_logits(model, tokenizer, texts) -> np.ndarray:
    """(rows, exits, classes): every exit's logits, one input at a time."""
    import torch

    with torch.no_grad():
        return np.stack([torch.stack(model(**encode(tokenizer, t)).exit_logits, 1)[0].numpy() for t in texts])


def balance(model, tokenizer, texts) -> None:
    """Sharpen every exit head (out_proj times SHARPEN) and shift its bias so that half of ``texts`` get each label
    at every exit."""
    import torch

    heads = [model.classification_heads[n] for n in model.head_names()]
    with torch.no_grad():
        for head in heads:
            head.out_proj.weight.mul_(SHARPEN)
            head.out_proj.bias.mul_(SHARPEN)
        logits = hf_exit_logits(model, tokenizer, texts)
        for m, head in enumerate(heads):  # an even count: the median lies between two texts
            head.out_proj.bias[0] -= float(np.median(logits[:, m, 0] - logits[:, m, 1]))


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def export_balanced(model, tokenizer, folder, texts, out, *flags) -> str:
    """Balance ``model`` on ``texts``, save it into ``folder`` and export that: OUT/onnx."""
    from acl_fairseq.hf import export

    balance(model, tokenizer, texts)
    model.save_pretrained(folder)
    export.main([folder, "--output", out, "--format", "onnx", *flags])
    return os.path.join(out, "onnx")


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):  # noqa: F811
    """(the HF model, its tokenizer, OUT/onnx, the HF folder): trained by acl-train-hf, balanced, exported with a
    static int8 copy calibrated on the training texts of its GLUE folder."""
    from transformers import AutoTokenizer

    from acl_hf import MultiExitForSequenceClassification, train

    root = tmp_path_factory.mktemp("hf_serving")
    run = str(root / "run")
    train.cli_main(flags(tiny, run))
    model = MultiExitForSequenceClassification.from_pretrained(run).eval()
    tokenizer = AutoTokenizer.from_pretrained(run)
    return model, tokenizer, export_balanced(model, tokenizer, run, TEXTS, str(root / "out"), "--quantize", "int8",
                                             "--data", tiny[1]), run


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    """(the HF model, its tokenizer, OUT/onnx, inputs): a tiny random multi-exit RoBERTa (exits on layers 2 and 3,
    mean pooling, labels neg/pos) with a byte-level BPE trained on TEXTS, saved by save_pretrained without a
    result.json (so it reads single texts and pairs), balanced on single texts and pairs, exported."""
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    import hf_encoders
    from acl_hf import MultiExitConfig, MultiExitForSequenceClassification

    root = tmp_path_factory.mktemp("hf_serving_roberta")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(TEXTS, vocab_size=320, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                            show_progress=False)
    spec = json.loads(bpe.to_str())["model"]
    tokenizer = transformers.RobertaTokenizer(vocab=spec["vocab"], merges=[tuple(m) for m in spec["merges"]])
    encoder = hf_encoders.encoder_config("roberta")
    encoder.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    model = MultiExitForSequenceClassification(MultiExitConfig(
        encoder=encoder.to_dict(), num_labels=2, exit_layers=[2, 3], exit_pooling="mean",
        id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})).eval()
    folder = str(root / "model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # HF's RoBERTa tokenizer reads a text's surrounding spaces (Ġ tokens), which the runtime strips, as acl-predict
    # strips them on a checkpoint (docs/deploy.md, known limits): the texts are given without them
    texts = [t.strip() for t in TEXTS]
    inputs = texts + list(zip(texts[::2], texts[1::2]))
    return model, tokenizer, export_balanced(model, tokenizer, folder, inputs, str(root / "out")), inputs


def entropy_threshold(logits: np.ndarray) -> float:
    """A threshold of the first exit's normalized entropy over the texts at the middle of the widest gap between two
    of the middle half's values: about half leave there, none near the threshold."""
    p = softmax(logits[:, 0])
    values = np.sort(-(p * np.log(p)).sum(1) / np.log(p.shape[1]))
    middle = values[len(values) // 4: len(values) - len(values) // 4]
    k = int(np.argmax(np.diff(middle)))
    return float(middle[k] + middle[k + 1]) / 2


def early_exit(model, tokenizer, texts, threshold):
    """``[(exit layer, probabilities)]`` of ``model.predict_early_exit`` (entropy), one input at a time."""
    out = []
    for t in texts:
        answer = model.predict_early_exit("entropy", threshold, **encode(tokenizer, t))
        out.append((int(answer.exit_layer[0]), softmax(answer.logits[0].numpy())))
    return out


def acl_predict(folder, tmp_path, texts, *flags) -> list:
    """acl-predict FOLDER on ``texts`` (JSONL): its records, in input order."""
    from acl_runtime import predict

    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"text": t} if isinstance(t, str) else {"text": t[0], "text_pair": t[1]}) + "\n"
                           for t in texts))
    if dst.exists():
        dst.unlink()
    predict.main([folder, "--input", str(src), "--output", str(dst), *flags])
    return [json.loads(line) for line in dst.read_text().splitlines()]


def probabilities(rows, names) -> np.ndarray:
    return np.array([[row["probabilities"][n] for n in names] for row in rows])


def assert_predict_answers_as_the_model(model, tokenizer, folder, tmp_path, texts) -> np.ndarray:
    """acl-predict's labels and probabilities at every exit (--exit-layer) and its exit layers under an entropy
    policy equal the HF model's; returns the model's exit logits."""
    names = [model.config.id2label[k] for k in range(model.num_labels)]
    logits = hf_exit_logits(model, tokenizer, texts)
    for m, layer in enumerate(model.layers):
        rows = acl_predict(folder, tmp_path, texts, "--exit-layer", str(layer))
        want = softmax(logits[:, m])
        assert {row["exit_layer"] for row in rows} == {layer}
        assert [row["label"] for row in rows] == [names[k] for k in want.argmax(1)]
        assert np.abs(probabilities(rows, names) - want).max() < ATOL
        assert len(set(want.argmax(1))) == 2  # both labels at every exit: the label comparison means something

    threshold = entropy_threshold(logits)
    want = early_exit(model, tokenizer, texts, threshold)
    rows = acl_predict(folder, tmp_path, texts, "--policy", "entropy", "--threshold", repr(threshold))
    assert [row["exit_layer"] for row in rows] == [layer for layer, _ in want]
    assert len({layer for layer, _ in want}) > 1  # the inputs leave at more than one exit
    assert np.abs(probabilities(rows, names) - np.array([p for _, p in want])).max() < ATOL
    return logits


def test_acl_predict_on_the_export_answers_as_the_hf_model_at_every_exit_and_under_early_exit(trained, tmp_path):
    import acl_hf
    from acl_fairseq.hf import multi_exit_folder

    assert multi_exit_folder.MODEL_TYPE == acl_hf.MODEL_TYPE  # the plugin knows the folder by its config alone
    model, tokenizer, folder, _ = trained
    manifest = json.loads(open(os.path.join(folder, "manifest.json")).read())
    assert manifest["labels"] == ["0", "1"] and manifest["exit_layers"] == [1, 2, 3]
    assert manifest["texts_per_input"] == 1  # result.json's task, SST-2: single sentences
    logits = assert_predict_answers_as_the_model(model, tokenizer, folder, tmp_path, TEXTS)
    # the static int8 copy (acl-predict --precision int8): its own numbers, near the model's, whatever the batch
    assert manifest["quantized"]["int8"]["method"]["calibration"]["rows"] == 24  # the toy train.tsv's rows
    int8 = acl_predict(folder, tmp_path, TEXTS, "--precision", "int8", "--exit-layer", "3")
    assert 0 < np.abs(probabilities(int8, ["0", "1"]) - softmax(logits[:, -1])).max() < INT8_ATOL
    assert acl_predict(folder, tmp_path, TEXTS, "--precision", "int8", "--exit-layer", "3", "--batch-size", "1") == int8


def test_a_roberta_pair_model_exports_and_answers_as_the_hf_model(roberta, tmp_path):
    model, tokenizer, folder, inputs = roberta
    manifest = json.loads(open(os.path.join(folder, "manifest.json")).read())
    assert manifest["labels"] == ["neg", "pos"] and manifest["exit_layers"] == [2, 3]
    assert manifest["pooling"] == "mean" and manifest["tokenizer_kind"] == "hf_byte_bpe"
    # no result.json: the task is unknown, so single texts and pairs are both read (not checked)
    assert manifest["texts_per_input"] is None and manifest["input_layout"]["pair_format"] == "double"
    assert_predict_answers_as_the_model(model, tokenizer, folder, tmp_path, inputs)


def test_acl_serve_on_the_export_answers_as_the_hf_model(trained):
    from serve_helpers import call, start

    model, tokenizer, folder, _ = trained
    logits = hf_exit_logits(model, tokenizer, TEXTS)
    want = early_exit(model, tokenizer, TEXTS, entropy_threshold(logits))
    proc, url = start(folder)
    try:
        status, _, answer = call(f"{url}/predict", {"inputs": [[t] for t in TEXTS], "policy": "entropy",
                                                    "threshold": entropy_threshold(logits)})
        assert status == 200, answer
        for entries, (layer, p) in zip(answer, want):
            assert {e["exit_layer"] for e in entries} == {layer}
            assert entries[0]["label"] == model.config.id2label[int(p.argmax())]
            assert max(abs(e["score"] - p[int(e["label"])]) for e in entries) < ATOL
        for m, layer in enumerate(model.layers):  # every exit's raw logits
            status, _, answer = call(f"{url}/predict", {"inputs": [[t] for t in TEXTS], "exit_layer": layer,
                                                        "raw_scores": True})
            assert status == 200, answer
            got = np.array([[{e["label"]: e["score"] for e in entries}[k] for k in ("0", "1")] for entries in answer])
            assert np.abs(got - logits[:, m]).max() < ATOL  # logits: measured 4.8e-6
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


@pytest.mark.parametrize("encoder, words", [("deberta-v2", ["DeBERTa-v2/v3", "relative positions"]),
                                            ("modernbert", ["ModernBERT", "pre-LayerNorm"]),
                                            ("distilbert", ["no place for its weights"])])
def test_an_encoder_without_a_fairseq_mapping_is_refused_in_one_line(tmp_path, capsys, encoder, words):
    import hf_encoders
    from acl_fairseq.hf import export

    folder = tmp_path / encoder
    hf_encoders.multi_exit(encoder).save_pretrained(str(folder))
    capsys.readouterr()  # save_pretrained's progress
    err = helpers.refusal(export.main, [str(folder), "--output", str(tmp_path / "out"), "--format", "onnx"],
                          export.PROG)
    assert f"its encoder is {encoder}" in err and "no fairseq mapping" in err and "bert and roberta" in err, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, words", [(["--data", "DATA"], ["--data DATA", "--quantize int8 alone", "drop --data"]),
                                          (["--quantize", "int8"], ["--quantize int8", "--data GLUE_DIR",
                                                                    "int8-dynamic"]),
                                          (["--quantize", "int8", "--data", "DATA"], ["result.json", "int8-dynamic"]),
                                          (["--format", "hf"], ["--format hf", "a transformers folder already",
                                                                "pass --format onnx"])])
def test_flags_an_hf_folder_cannot_use_are_refused_before_it_loads(tmp_path, capsys, extra, words):
    import hf_encoders
    from acl_fairseq.hf import export

    folder = tmp_path / "bert"
    hf_encoders.multi_exit("bert").save_pretrained(str(folder))
    capsys.readouterr()  # save_pretrained's progress
    err = helpers.refusal(export.main, [str(folder), "--output", str(tmp_path / "out"), "--format", "onnx", *extra],
                          export.PROG)
    assert all(w in err for w in words), err
