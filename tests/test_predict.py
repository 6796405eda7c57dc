"""Raw text to predictions: the hub interface (acl_fairseq.inference.hub) and ``acl-predict`` on tiny trained models."""
import json
import os
import re
import shutil

import pytest
import torch

import helpers
from acl_fairseq import exits
from acl_fairseq.cli import evaluate, predict
from acl_fairseq.inference import early_exit, hub
from test_models import HEAD, TINY_MULTI, one_thread  # noqa: F401  (autouse fixture, per module)


def _raw(data, split="valid"):
    """(texts, labels) of the toy data's raw split, as preprocessing read them."""
    raw = os.path.join(data, "raw")
    a = open(os.path.join(raw, f"{split}.input0")).read().splitlines()
    b_path = os.path.join(raw, f"{split}.input1")
    texts = list(zip(a, open(b_path).read().splitlines())) if os.path.isfile(b_path) else a
    return texts, open(os.path.join(raw, f"{split}.label")).read().splitlines()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny multi-exit model (mean pooling, every layer an exit) trained 2 epochs on toy pairs."""
    root = tmp_path_factory.mktemp("predict")
    data = helpers.make_data(str(root / "data"), pair=True)["data"]
    helpers.train(data, str(root / "ckpt"), criterion="sentence_prediction", arch="multi_exit_roberta",
                  model_args=TINY_MULTI + ["--exit-pooling", "mean"], max_epoch=2)
    return root, data, str(root / "ckpt" / "checkpoint_best.pt")


def split_threshold(model, data):
    """An entropy threshold that sends about half the validation examples out at the first exit: the
    midpoint between two neighbouring first-exit entropies (so no example sits on it)."""
    task = model.task
    task.load_dataset("valid")
    ds = task.dataset("valid")
    _, logits, _ = evaluate.collect_exit_logits(model.model, evaluate.make_batches(ds, list(range(len(ds))), 32), HEAD)
    h = exits.prediction_entropy(logits[:, 0]).sort().values
    mid = len(h) // 2
    return float((h[mid - 1] + h[mid]) / 2)


@pytest.fixture(scope="module")
def model(run):
    root, data, ckpt = run
    return hub.from_pretrained(str(root / "ckpt"), "checkpoint_best.pt", data).eval()


def test_encode_builds_what_training_read(run, model):
    _, data, _ = run
    model.task.load_dataset("valid")
    ds = model.task.dataset("valid")
    texts, _ = _raw(data)
    for i in range(len(texts)):
        assert model.encode(*texts[i]).tolist() == ds[i]["net_input.src_tokens"].tolist()


def test_predict_pools_as_trained_unlike_the_stock_hub_head(run, model):
    _, data, _ = run
    tokens = model.encode(*_raw(data)[0][0])
    logits, _ = model.model(tokens.unsqueeze(0), classification_head_name=HEAD)
    assert torch.allclose(model.predict(HEAD, tokens, return_logits=True), logits)
    stock = model.model.classification_heads[HEAD](model.extract_features(tokens))  # fairseq's: the <s> state
    assert not torch.allclose(stock, logits, atol=1e-4)


def test_predict_early_exit_makes_the_engines_decisions_in_input_order(run, model):
    _, data, _ = run
    texts, labels = _raw(data)
    threshold = split_threshold(model, data)
    ds = model.task.dataset("valid")
    batches = evaluate.make_batches(ds, list(range(len(ds))), 8)
    engine = {}
    for batch in batches:
        out = early_exit.early_exit_forward(model.model, batch["net_input"]["src_tokens"], HEAD, "entropy", threshold)
        engine.update({int(i): (int(k), int(layer))
                       for i, k, layer in zip(batch["id"], out.logits.argmax(-1), out.exit_layer)})
    preds = model.predict_early_exit(texts, policy="entropy", threshold=threshold, batch_size=8)
    names = model.label_names()
    assert [(names.index(p.label), p.exit_layer) for p in preds] == [engine[i] for i in range(len(texts))]
    assert len({p.exit_layer for p in preds}) > 1, "the threshold should split the examples between exits"
    for p in preds:
        assert abs(sum(p.probabilities.values()) - 1) < 1e-5
        assert p.label == max(p.probabilities, key=p.probabilities.get)
    # no policy: the last exit, like an ordinary classifier; a fixed exit: that layer for all
    assert {p.exit_layer for p in model.predict_early_exit(texts[:5])} == {3}
    assert {p.exit_layer for p in model.predict_early_exit(texts[:5], exit_layer=2)} == {2}


BAD_THRESHOLDS = [("entropy", "1.5"), ("entropy", "nan"), ("confidence", "2"), ("confidence", "-1"),
                  ("patience", "0"), ("patience", "-1"), ("patience", "2.5")]
RANGES = {"entropy": "[0, 1]", "confidence": "[0, 1]", "patience": "a positive integer (1, 2, ...)"}


@pytest.mark.parametrize("policy,threshold", BAD_THRESHOLDS)
def test_cli_refuses_a_threshold_out_of_its_policys_range(policy, threshold, capsys):
    with pytest.raises(SystemExit) as exc:
        predict.main(["missing.pt", "--data", "missing", "--input", "-", "--policy", policy, "--threshold", threshold])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"{policy} threshold" in err and f"it takes {RANGES[policy]}" in err, err


def test_cli_range_refusal_exits_2_naming_the_range():
    proc = helpers.run_tool("acl-predict", ["missing.pt", "--data", "missing", "--input", "-", "--policy", "entropy",
                                            "--threshold", "1.5"], check=False)
    assert proc.returncode == 2 and "entropy threshold 1.5 is out of range: it takes [0, 1]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_hub_refuses_a_threshold_out_of_range_and_defaults_from_the_table(run, model):
    texts, _ = _raw(run[1])
    for policy, threshold in BAD_THRESHOLDS:
        with pytest.raises(ValueError, match=f"{policy} threshold .*it takes {re.escape(RANGES[policy])}"):
            model.predict_early_exit(texts[:2], policy=policy, threshold=float(threshold))
    assert {p: model.check_policy(p, None) for p in exits.POLICIES} == {p: r.default for p, r in
                                                                       exits.POLICIES.items()}
    assert model.check_policy("patience", None, 3.0) == 3 and model.check_policy(None, 2) is None
    by_default = model.predict_early_exit(texts[:8], policy="confidence")
    assert by_default == model.predict_early_exit(texts[:8], policy="confidence", threshold=0.9)


def test_cli_equals_acl_evaluate_on_the_same_split(run, model, tmp_path):
    """Metric and exit layers of acl-predict on the raw dev text equal acl-evaluate's (offline policy on the
    full pass); where they differ, the example sits at the threshold (padding arithmetic), nothing else."""
    _, data, ckpt = run
    texts, labels = _raw(data)
    threshold = split_threshold(model, data)
    src = tmp_path / "valid.jsonl"
    src.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in texts))
    out = tmp_path / "pred.jsonl"
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--output", str(out), "--policy", "entropy",
                            "--threshold", str(threshold), "--batch-size", "32", "--device", "cpu"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [str(i) for i in range(1, len(texts) + 1)]
    assert summary["examples"] == len(texts) and summary["skipped"] == 0
    result = evaluate.main([ckpt, data, "--out-dir", str(tmp_path / "ee"), "--policy", "entropy",
                            "--thresholds", str(threshold), "--batch-size", "32", "--timing-examples", "0",
                            "--device", "cpu"])
    setting = result["settings"][0]
    m, task, _ = evaluate.load_model(ckpt, data, None, device="cpu")
    m.task = task
    ds = (task.load_dataset("valid"), task.dataset("valid"))[1]
    ids, logits, _ = evaluate.collect_exit_logits(m, evaluate.make_batches(ds, list(range(len(ds))), 32), HEAD)
    offline = exits.exit_layer_indices(list(logits.unbind(1)), "entropy", threshold)
    layers = torch.tensor([1, 2, 3])[offline][ids.argsort()]
    entropy = torch.stack([exits.prediction_entropy(logits[:, j]) for j in range(3)], 1)[ids.argsort()]
    differ = [i for i, r in enumerate(records) if r["exit_layer"] != int(layers[i])]
    for i in differ:  # a flip at the threshold: that exit's entropy is the threshold to float rounding
        assert (entropy[i] - threshold).abs().min() < 1e-5, (i, entropy[i])
    assert len(set(layers.tolist())) > 1
    if not differ:
        accuracy = 100 * sum(r["label"] == y for r, y in zip(records, labels)) / len(labels)
        assert accuracy == pytest.approx(setting["metrics"]["accuracy"])
        assert summary["mean_exit_layer"] == pytest.approx(setting["avg_exit_layer"])


def test_tsv_bad_rows_are_reported_and_skipped_or_stop_with_strict(run, tmp_path, caplog):
    _, data, ckpt = run
    texts, _ = _raw(data)
    lines = (["index\tsentence1\tsentence2\tlabel"]
             + [f"{i}\t{a}\t{b}\tentailment" for i, (a, b) in enumerate(texts[:4])])
    lines[2] = "1\tonly one field"
    lines.insert(4, "")
    long = " ".join(["good"] * 200)
    lines.append(f"9\t{long}\t{long}\tentailment")
    src = tmp_path / "dev.tsv"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "pred.tsv"
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--task", "RTE", "--output", str(out),
                            "--format", "tsv", "--cpu"])
    assert f"{src}:3: 2 tab-separated fields" in caplog.text and f"{src}:5: empty line" in caplog.text
    rows = out.read_text().splitlines()
    assert rows[0].split("\t")[:3] == ["id", "label", "exit_layer"]
    assert [r.split("\t")[0] for r in rows[1:]] == ["0", "2", "3", "9"]  # input order, GLUE's index column
    assert summary["skipped"] == 2 and summary["truncated"] == 1
    with pytest.raises(SystemExit, match="exists; pass --force"):
        predict.main([ckpt, "--data", data, "--input", str(src), "--task", "RTE", "--output", str(out)])
    with pytest.raises(SystemExit, match=f"{src}:3: 2 tab-separated fields.*--strict"):
        predict.main([ckpt, "--data", data, "--input", str(src), "--task", "RTE", "--output", str(tmp_path / "s.tsv"),
                      "--strict"])
    assert not os.path.exists(tmp_path / "s.tsv") and not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_moved_data_folder_and_a_plain_roberta_checkpoint(run, tmp_path):
    root, data, ckpt = run
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    texts, _ = _raw(data)
    plain = tmp_path / "plain.pt"
    state = torch.load(ckpt, weights_only=True)
    state["cfg"]["model"].arch = state["cfg"]["model"]._name = "roberta"
    state["model"] = {k: v for k, v in state["model"].items() if "_exit" not in k}
    torch.save(state, plain)
    single = hub.from_pretrained(str(tmp_path), "plain.pt", str(moved)).eval()
    preds = single.predict_early_exit(texts[:6])
    assert {p.exit_layer for p in preds} == {3}
    with pytest.raises(ValueError, match="single exit .* early exit needs a multi-exit model"):
        single.predict_early_exit(texts[:2], policy="entropy", threshold=0.3)


def test_data_folder_without_tokenizer_information_names_the_files(run, tmp_path):
    _, data, ckpt = run
    bare = tmp_path / "bare"
    shutil.copytree(data, bare)
    os.remove(bare / "stats.json")
    with pytest.raises(SystemExit, match="stats.json with a 'tokenizer' entry"):
        predict.main([ckpt, "--data", str(bare), "--input", os.path.join(data, "raw", "valid.input0")])


def test_predict_speed_benchmark_at_toy_size(run, tmp_path):
    import importlib.util

    _, data, ckpt = run
    spec = importlib.util.spec_from_file_location("predict_speed", os.path.join(helpers.REPO, "benchmarks",
                                                                                "predict_speed.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--checkpoint", ckpt, "--data", data, "--input", os.path.join(data, "raw", "valid.input0"),
                       "--examples", "12", "--repeats", "1", "--threshold", "1.0", "--json", str(tmp_path / "p.json")])
    assert [(r["batch_size"], r["mode"]) for r in rows] == [(1, "all layers"), (1, "early exit"), (32, "all layers"),
                                                           (32, "early exit")]
    assert rows[1]["mean_exit_layer"] == 1 and rows[0]["mean_exit_layer"] == 3  # threshold 1: all leave at 1
    assert all(0 < r["prep_share"] < 1 and r["sentences_per_s"] > 0 for r in rows)
    assert json.load(open(tmp_path / "p.json"))[0]["examples"] == 12


# ---- every tokenizer, a moved folder, a converted HF BERT ----------------------------------------------


@pytest.fixture(scope="module")
def glue_assets(tmp_path_factory):
    import toy_glue

    return toy_glue.make_assets(tmp_path_factory.mktemp("glue_assets"))


def _train_two_updates(data, save, model_args, extra=()):
    helpers.train(data, save, criterion="sentence_prediction", arch="multi_exit_roberta",
                  model_args=model_args, extra=["--max-update", "2", *extra])
    return os.path.join(save, "checkpoint_last.pt")


@pytest.mark.parametrize("tokenizer", [pytest.param("gpt2", marks=pytest.mark.slow),
                                       pytest.param("sentencepiece", marks=pytest.mark.slow), "wordpiece"])
def test_each_tokenizer_from_a_moved_data_folder(glue_assets, tmp_path, tokenizer):
    """preprocess/glue.py's folder carries its tokenizer: after a move, raw dev text encodes to exactly the
    binarized dev split, and acl-predict reads the GLUE file."""
    import toy_glue as tp

    folder, written = tp.make_task(tmp_path / "glue", "RTE")
    tp.run_main("RTE", folder, tmp_path / "bin", *tp.tok_args(tokenizer, glue_assets))
    _train_two_updates(str(tmp_path / "bin"), str(tmp_path / "ckpt"),
                       helpers.TINY_ROBERTA + ["--exit-layers", "2,3"])
    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "bin"), moved)
    m = hub.from_pretrained(str(tmp_path / "ckpt"), "checkpoint_last.pt", str(moved)).eval()
    m.task.load_dataset("valid")
    ds = m.task.dataset("valid")
    for i, (a, b, _) in enumerate(written["dev"]):
        assert m.encode(a, b).tolist() == ds[i]["net_input.src_tokens"].tolist()
    summary = predict.main([os.path.join(tmp_path, "ckpt", "checkpoint_last.pt"), "--data", str(moved), "--input",
                            os.path.join(folder, "dev.tsv"), "--task", "RTE", "--output", str(tmp_path / "p.jsonl"),
                            "--policy", "entropy", "--threshold", "0.3"])
    assert summary["examples"] == len(written["dev"]) and summary["skipped"] == 0


def test_converted_tiny_bert_pairs_through_the_hub(tmp_path):
    """A converted BERT: BERT's pair format and segment embedding reach raw-text prediction."""
    import tiny_hf as tc
    import toy_glue as tp
    from acl_fairseq.hf import convert as convert_hf

    tc.write_bert(str(tmp_path / "hf"))
    out = str(tmp_path / "fs")
    convert_hf.convert(str(tmp_path / "hf"), out)
    folder, written = tp.make_task(tmp_path / "glue", "RTE")
    tp.run_main("RTE", folder, tmp_path / "bin", "--tokenizer", "wordpiece", "--vocab", os.path.join(out, "vocab.txt"),
                "--srcdict", os.path.join(out, "dict.txt"), "--lowercase")
    flags = open(os.path.join(out, "model_args.txt")).read().split()
    _train_two_updates(str(tmp_path / "bin"), str(tmp_path / "ckpt"),
                       flags + ["--exit-layers", "2,3", "--conventions", out],
                       ["--restore-file", os.path.join(out, "model.pt"), "--reset-optimizer"])
    m = hub.from_pretrained(str(tmp_path / "ckpt"), "checkpoint_last.pt", str(tmp_path / "bin")).eval()
    a, b, _ = written["dev"][0]
    tokens = m.encode(a, b)
    assert int(tokens.eq(2).sum()) == 2  # <s> A </s> B </s>: BERT's single separator, from the checkpoint
    preds = m.predict_early_exit([(a, b), a], exit_layer=2)
    assert [p.exit_layer for p in preds] == [2, 2] and set(preds[0].probabilities) == {"entailment", "not_entailment"}
    # the converted folder itself, as fairseq's own loader sees it: features, no head
    enc = hub.from_pretrained(out, "model.pt", out)
    assert enc.extract_features(enc.encode(a, b)).shape[-1] == 20


# ---- real-world input: bad bytes, pipes, ids, fatal errors, SIGTERM -------------------------------------


class _Recording:
    """The module's model, handed to acl-predict instead of a fresh load: it records the texts classified."""

    def __init__(self, model):
        self.model_, self.texts = model, []

    def __getattr__(self, name):
        return getattr(self.model_, name)

    def eval(self):
        return self

    def predict_early_exit(self, texts, *args, **kwargs):
        self.texts.extend(texts)
        return self.model_.predict_early_exit(texts, *args, **kwargs)


@pytest.fixture
def spy(model, monkeypatch):
    rec = _Recording(model)
    monkeypatch.setattr(hub, "from_pretrained", lambda *a, **k: rec)
    return rec


@pytest.fixture
def no_model(monkeypatch):
    """For errors that must come before the model loads."""
    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the error")
    monkeypatch.setattr(hub, "from_pretrained", refuse)


def _exit(argv):
    with pytest.raises(SystemExit) as e:
        predict.main(argv)
    return e.value


def _records(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_a_bad_byte_and_an_empty_line_are_skipped_with_file_line_and_strict_stops(run, spy, tmp_path, caplog):
    _, data, ckpt = run
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
def test_one_bad_byte_in_100k_lines_loses_nothing_else(run, spy, tmp_path, caplog):
    """The issue's case: 100,000 lines, a bad byte on line 50,000 and an empty line: 99,998 records in input
    order, both lines reported, and with --strict no output at all."""
    _, data, ckpt = run
    texts, _ = _raw(data)
    lines = [texts[i % len(texts)][0].encode() for i in range(100000)]
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


def test_a_binary_file_is_refused_before_the_model_loads(run, no_model, tmp_path):
    _, data, ckpt = run
    src = tmp_path / "image.png"
    src.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40)
    e = _exit([ckpt, "--data", data, "--input", str(src), "--output", str(tmp_path / "p.jsonl")])
    assert e.code == 2 and f"{src}:3: a NUL byte" in str(e) and "UTF-8" in str(e)
    assert os.listdir(tmp_path) == ["image.png"]


def _stdin(monkeypatch, data: bytes):
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_stdin_with_task_reads_the_glue_test_layout_and_a_bom_goes(run, spy, tmp_path, monkeypatch):
    _, data, ckpt = run
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
def test_the_id_is_the_glue_index_column_or_the_line_number(run, spy, tmp_path, task, text, ids):
    _, data, ckpt = run
    src = tmp_path / "in.tsv"
    src.write_text(text)
    predict.main([ckpt, "--data", data, "--input", str(src), "--task", task, "--output", str(tmp_path / "p.jsonl")])
    assert [r["id"] for r in _records(tmp_path / "p.jsonl")] == ids


def test_jsonl_ids_and_a_null_text(run, spy, tmp_path, caplog):
    _, data, ckpt = run
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "the movie was good", "id": "x7"}\n{"text": "the plot was bad"}\n'
                   '{"text": "the acting was fine", "id": null}\n{"text": null}\n{"text": "a", "text_pair": 3}\n')
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--output", str(tmp_path / "p.jsonl")])
    assert [r["id"] for r in _records(tmp_path / "p.jsonl")] == ["x7", "2", "3"] and summary["skipped"] == 2
    assert f"{src}:4: not a JSON object with a non-empty string 'text'" in caplog.text
    assert f"{src}:5: 'text_pair' is not a non-empty string" in caplog.text
    assert ("None",) not in spy.texts


@pytest.mark.parametrize("flags,message", [
    (["--columns", "0"], "1-based"), (["--columns", "a,b"], "1-based"), (["--columns", "1,2,3"], "one or two"),
    (["--batch-size", "0"], "positive"), (["--chunk-size", "-1"], "positive"),
])
def test_bad_flag_values_are_usage_errors_before_the_model_loads(run, no_model, tmp_path, capsys, flags, message):
    _, data, ckpt = run
    e = _exit([ckpt, "--data", data, "--input", os.path.join(data, "raw", "valid.input0"), *flags])
    assert e.code == 2 and message in capsys.readouterr().err


def test_output_that_cannot_be_written_is_refused_before_the_model_loads(run, no_model, tmp_path):
    _, data, ckpt = run
    src = os.path.join(data, "raw", "valid.input0")
    (tmp_path / "adir").mkdir()
    cases = [(str(tmp_path / "missing" / "p.jsonl"), [], "does not exist"),
             (str(tmp_path / "adir"), [], "is a folder"), (str(tmp_path / "adir"), ["--force"], "is a folder"),
             (os.path.join(helpers.unwritable_folder(tmp_path), "p.jsonl"), [], "cannot write in")]
    for out, extra, message in cases:
        e = _exit([ckpt, "--data", data, "--input", src, "--output", out, *extra])
        assert e.code == 2 and message in str(e) and "Fix:" in str(e), (out, str(e))
    assert sorted(os.listdir(tmp_path)) == ["adir", "read_only"] and os.listdir(tmp_path / "adir") == []


def test_sigterm_mid_run_leaves_the_old_output_and_no_temporary(run, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    _, data, ckpt = run
    texts, _ = _raw(data)
    src, out = tmp_path / "big.txt", tmp_path / "pred.jsonl"
    src.write_text("".join(texts[i % len(texts)][0] + "\n" for i in range(400000)))
    out.write_text("the previous output\n")
    proc = subprocess.Popen([sys.executable, "-m", "acl_fairseq.cli.predict", ckpt, "--data", data, "--input",
                             str(src), "--output", str(out), "--force", "--chunk-size", "64", "--device", "cpu"],
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
