"""Raw text to predictions: the hub interface (acl_fairseq.inference.hub) and ``acl-predict`` on tiny trained models.

acl-predict on real-world input (bad bytes, pipes, ids, fatal errors, SIGTERM): test_predict_input.py."""
import json
import os
import re
import shutil

import pytest
import torch

import exit_parity
import helpers
from acl_fairseq.cli import evaluate
from acl_fairseq.inference import early_exit, hub
from acl_runtime import exits, predict
from test_models import HEAD


@pytest.fixture(scope="module")
def run(predict_run):
    return predict_run


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
def model(predict_model):
    return predict_model


def test_encode_builds_what_training_read(run, model):
    _, data, _ = run
    model.task.load_dataset("valid")
    ds = model.task.dataset("valid")
    texts, _ = helpers.raw_split(data)
    for i in range(len(texts)):
        assert model.encode(*texts[i]).tolist() == ds[i]["net_input.src_tokens"].tolist()


def test_predict_pools_as_trained_unlike_the_stock_hub_head(run, model):
    _, data, _ = run
    tokens = model.encode(*helpers.raw_split(data)[0][0])
    logits, _ = model.model(tokens.unsqueeze(0), classification_head_name=HEAD)
    assert torch.allclose(model.predict(HEAD, tokens, return_logits=True), logits)
    stock = model.model.classification_heads[HEAD](model.extract_features(tokens))  # fairseq's: the <s> state
    assert not torch.allclose(stock, logits, atol=1e-4)


def test_predict_early_exit_makes_the_engines_decisions_in_input_order(run, model):
    _, data, _ = run
    texts, labels = helpers.raw_split(data)
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
    texts, _ = helpers.raw_split(run[1])
    for policy, threshold in BAD_THRESHOLDS:
        with pytest.raises(ValueError, match=f"{policy} threshold .*it takes {re.escape(RANGES[policy])}"):
            model.predict_early_exit(texts[:2], policy=policy, threshold=float(threshold))
    assert {p: model.resolve_request(p).threshold for p in exits.POLICIES} == {p: r.default for p, r in
                                                                              exits.POLICIES.items()}
    assert model.resolve_request("patience", 3.0).threshold == 3
    assert model.resolve_request(None, None, 2).threshold is None
    by_default = model.predict_early_exit(texts[:8], policy="confidence")
    assert by_default == model.predict_early_exit(texts[:8], policy="confidence", threshold=0.9)


def test_cli_equals_acl_evaluate_on_the_same_split(run, model, tmp_path):
    """Metric and exit layers of acl-predict on the raw dev text equal acl-evaluate's (offline policy on the
    full pass). A row whose decision flips sits at the threshold (padding arithmetic) and is still compared:
    its label is its own exit's, and the totals differ from acl-evaluate's by exactly the flipped rows."""
    _, data, ckpt = run
    texts, labels = helpers.raw_split(data)
    threshold = split_threshold(model, data)
    src = tmp_path / "valid.jsonl"
    src.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in texts))
    out = tmp_path / "pred.jsonl"
    summary = predict.main([ckpt, "--data", data, "--input", str(src), "--output", str(out), "--policy", "entropy",
                            "--threshold", str(threshold), "--batch-size", "32", "--device", "cpu"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [str(i) for i in range(1, len(texts) + 1)]
    assert summary["examples"] == len(texts) and summary["skipped"] == 0
    result = evaluate.main([ckpt, data, "--output", str(tmp_path / "ee"), "--policy", "entropy",
                            "--thresholds", str(threshold), "--batch-size", "32", "--timing-examples", "0",
                            "--device", "cpu"])
    setting = result["settings"][0]
    m, task, _ = evaluate.load_model(ckpt, data, None, device="cpu")
    ds = (task.load_dataset("valid"), task.dataset("valid"))[1]
    ids, logits, _ = evaluate.collect_exit_logits(m, evaluate.make_batches(ds, list(range(len(ds))), 32), HEAD)
    offline = exits.exit_layer_indices(list(logits.unbind(1)), "entropy", threshold)
    layers = torch.tensor([1, 2, 3])[offline][ids.argsort()].tolist()
    logits = logits[ids.argsort()]  # input order
    entropy = torch.stack([exits.prediction_entropy(logits[:, j]) for j in range(3)], 1)
    d = task.label_dictionary

    def label_at(i, layer):
        return d[int(logits[i, layer - 1].argmax()) + d.nspecial]

    n = len(labels)
    offline_right = [label_at(i, layers[i]) == y for i, y in enumerate(labels)]
    assert len(set(layers)) > 1
    assert 100 * sum(offline_right) / n == pytest.approx(setting["metrics"]["accuracy"])
    assert sum(layers) / n == pytest.approx(setting["avg_exit_layer"])
    # every row, flipped or not: acl-predict's label is the one of the exit it stopped at
    assert [r["label"] for r in records] == [label_at(i, r["exit_layer"]) for i, r in enumerate(records)]
    differ = [i for i, r in enumerate(records) if r["exit_layer"] != layers[i]]
    # a flip at the threshold: that exit's entropy is the threshold to within the two batchings' measured reach
    served = exit_parity.all_exits(model, [model.encode(a, b) for a, b in texts], 32)
    reach = exit_parity.flip_tolerance("entropy", logits.numpy(), served)
    for i in differ:
        assert (entropy[i] - threshold).abs().min() < reach, (i, entropy[i], reach)
    right = [r["label"] == y for r, y in zip(records, labels)]
    kept = [i for i in range(n) if i not in differ]
    assert [right[i] for i in kept] == [offline_right[i] for i in kept]
    # the totals: acl-evaluate's, moved by the flipped rows' own contributions only
    accuracy_shift = 100 * sum(right[i] - offline_right[i] for i in differ) / n
    assert 100 * sum(right) / n == pytest.approx(setting["metrics"]["accuracy"] + accuracy_shift)
    layer_shift = sum(records[i]["exit_layer"] - layers[i] for i in differ) / n
    assert summary["mean_exit_layer"] == pytest.approx(setting["avg_exit_layer"] + layer_shift)


def test_tsv_bad_rows_are_reported_and_skipped_or_stop_with_strict(run, tmp_path, caplog):
    _, data, ckpt = run
    texts, _ = helpers.raw_split(data)
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
                            "--format", "tsv", "--device", "cpu"])
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
    texts, _ = helpers.raw_split(data)
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


def test_converted_tiny_bert_pairs_through_the_hub(tiny_bert_rte):
    """A converted BERT: BERT's pair format and segment embedding reach raw-text prediction."""
    bert = tiny_bert_rte
    out, written = bert["encoder"], bert["written"]
    m = hub.from_pretrained(os.path.dirname(bert["ckpt"]), "checkpoint_last.pt", bert["data"]).eval()
    a, b, _ = written["dev"][0]
    tokens = m.encode(a, b)
    assert int(tokens.eq(2).sum()) == 2  # <s> A </s> B </s>: BERT's single separator, from the checkpoint
    preds = m.predict_early_exit([(a, b), (b, a)], exit_layer=2)
    assert [p.exit_layer for p in preds] == [2, 2] and set(preds[0].probabilities) == {"entailment", "not_entailment"}
    # the converted folder itself, as fairseq's own loader sees it: features, no head
    enc = hub.from_pretrained(out, "model.pt", out)
    assert enc.extract_features(enc.encode(a, b)).shape[-1] == 20


def test_from_checkpoint_is_the_one_opening_and_its_errors_are_one_usage_error(run, tmp_path):
    """acl-predict, acl-export and the benchmarks open a checkpoint through hub.from_checkpoint: in eval mode, and
    whatever keeps it from opening is one UsageError naming the file (a cut-short file, CUDA where there is none)."""
    from acl_runtime.console import UsageError

    _, data, ckpt = run
    model = hub.from_checkpoint(ckpt, data)
    assert not model.training and not model.model.training
    cut = tmp_path / "checkpoint_cut.pt"
    cut.write_bytes(open(ckpt, "rb").read()[:1000])
    with pytest.raises(UsageError, match="checkpoint_cut.pt") as e:
        hub.from_checkpoint(str(cut), data)
    assert "\n" not in str(e.value)
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            hub.from_checkpoint(ckpt, data, device="cuda")
