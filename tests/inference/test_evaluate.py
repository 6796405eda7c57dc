"""Layer-by-layer early-exit inference (early_exit.py), the acl-evaluate command and its reports."""

import csv
import json
import os
import shutil

import pytest
import torch

import helpers
from acl_fairseq.cli import evaluate
from acl_fairseq.inference import early_exit, report
from acl_runtime import exits
from test_models import HEAD, TINY_MULTI, build

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SETTING_FIELDS = [
    "policy",
    "threshold",
    "metrics",
    "avg_exit_layer",
    "layer_speedup",
    "saved_fraction",
    "latency_full_batch1_s",
    "latency_exit_batch1_s",
    "wallclock_speedup_batch1",
    "latency_full_batched_s",
    "latency_exit_batched_s",
    "wallclock_speedup_batched",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("data")))["data"]


@pytest.fixture(scope="module")
def tiny(data):
    """(task, random multi-exit model in eval mode, a padded batch of 12 lengths-mixed examples)."""
    task, model, _ = build(data)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    tokens = ds.collater([ds[i] for i in range(12)])["net_input"]["src_tokens"]
    lengths = tokens.ne(task.source_dictionary.pad()).sum(1)
    assert len(set(lengths.tolist())) > 2, "want padding of different lengths"
    return task, model, tokens


def full_pass_exit_logits(model, tokens):
    _, extra = model(tokens, classification_head_name=HEAD)
    return [t.detach() for t in extra["exits"].logits]


def test_layer_by_layer_exits_equal_the_full_forward(tiny):
    _, model, tokens = tiny
    out = early_exit.early_exit_forward(model, tokens, HEAD, policy=None)
    assert torch.allclose(out.exit_logits, torch.stack(full_pass_exit_logits(model, tokens), 1), atol=1e-5)
    assert out.exit_layer.tolist() == [3] * 12 and out.layers_computed.tolist() == [3] * 12
    assert torch.allclose(
        early_exit.full_forward(model, tokens, HEAD), full_pass_exit_logits(model, tokens)[-1], atol=1e-5
    )


def test_threshold_that_never_fires_is_the_last_exit(tiny):
    _, model, tokens = tiny
    out = early_exit.early_exit_forward(model, tokens, HEAD, "entropy", 0.0)
    assert out.exit_layer.tolist() == [3] * 12 and out.layers_computed.tolist() == [3] * 12
    assert torch.allclose(out.logits, full_pass_exit_logits(model, tokens)[-1], atol=1e-5)


@pytest.mark.parametrize("policy,value", [("entropy", 1.01), ("confidence", 0.0)])
def test_threshold_that_always_fires_exits_at_the_first_exit(tiny, policy, value):
    _, model, tokens = tiny
    out = early_exit.early_exit_forward(model, tokens, HEAD, policy, value)
    assert out.exit_layer.tolist() == [1] * 12
    assert out.layers_computed.tolist() == [1] * 12  # computation stopped after layer 1
    assert torch.isnan(out.exit_logits[:, 1:]).all()
    assert torch.allclose(out.logits, full_pass_exit_logits(model, tokens)[0], atol=1e-5)


def mixed_entropy_threshold(model, tokens):
    """A threshold at which about half of the rows exit at the first exit."""
    return float(exits.prediction_entropy(full_pass_exit_logits(model, tokens)[0]).median()) + 1e-6


def test_batched_and_batch_one_agree_and_rows_stop_computing(tiny):
    _, model, tokens = tiny
    threshold = mixed_entropy_threshold(model, tokens)
    batched = early_exit.early_exit_forward(model, tokens, HEAD, "entropy", threshold)
    assert 1 < (batched.exit_layer == 1).sum() < 12, "want a mix of early and late exits"
    assert torch.equal(batched.layers_computed, batched.exit_layer)
    pad = 1
    for b in range(tokens.size(0)):
        single = tokens[b : b + 1, : int(tokens[b].ne(pad).sum())]  # no padding at batch size 1
        one = early_exit.early_exit_forward(model, single, HEAD, "entropy", threshold)
        assert one.exit_layer.item() == batched.exit_layer[b].item()
        assert one.logits.argmax(-1).item() == batched.logits[b].argmax(-1).item()
        assert torch.allclose(one.logits[0], batched.logits[b], atol=1e-5)


@pytest.mark.parametrize("policy,value", [("entropy", None), ("patience", 1), ("confidence", 0.5)])
def test_engine_decisions_match_the_offline_policy(tiny, policy, value):
    _, model, tokens = tiny
    value = mixed_entropy_threshold(model, tokens) if value is None else value
    out = early_exit.early_exit_forward(model, tokens, HEAD, policy, value)
    offline = exits.exit_layer_indices(full_pass_exit_logits(model, tokens), policy, value)
    assert torch.equal(out.exit_index, offline)


def test_exit_below_the_top_layer_stops_there(data, tiny):
    _, _, tokens = tiny
    _, model, _ = build(data, extra=["--exit-layers", "1,2", "--exit-pooling", "mean"])
    out = early_exit.early_exit_forward(model, tokens, HEAD, policy=None)
    assert out.layers_computed.tolist() == [2] * 12
    expected = full_pass_exit_logits(model, tokens)
    assert torch.allclose(out.exit_logits, torch.stack(expected, 1), atol=1e-5)
    assert torch.allclose(early_exit.full_forward(model, tokens, HEAD), expected[-1], atol=1e-5)


def test_plain_roberta_has_one_exit(data, tiny):
    _, _, tokens = tiny
    _, model, _ = build(data, arch="roberta", extra=helpers.TINY_ROBERTA)
    out = early_exit.early_exit_forward(model, tokens, HEAD, "entropy", 1.01)
    logits, _ = model(tokens, classification_head_name=HEAD)
    assert out.exit_layer.tolist() == [3] * 12 and torch.allclose(out.logits, logits, atol=1e-5)


def test_glue_prediction_format_uses_label_names_and_stsb_scale(tiny):
    task, _, _ = tiny
    names = evaluate.format_predictions(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), task.label_dictionary, False)
    assert names == [task.label_dictionary[4], task.label_dictionary[5]] and set(names) == {"0", "1"}
    scores = evaluate.format_predictions(torch.tensor([[0.5], [1.3], [-0.2]]), None, True, 5.0)
    assert scores == ["2.500", "5.000", "0.000"]
    assert evaluate.format_predictions(torch.tensor([[1.3], [-0.2]]), None, True) == ["1.300", "-0.200"]
    assert evaluate.prediction_file_names("MNLI", ["test", "test1"]) == ["MNLI-m.tsv", "MNLI-mm.tsv"]
    assert evaluate.prediction_file_names("MNLI", ["test"]) == ["MNLI-m.tsv"]
    assert evaluate.prediction_file_names("RTE", ["test"]) == ["RTE.tsv"]
    assert evaluate.prediction_file_names("NEW", ["test", "test1"]) == ["NEW.tsv", "NEW-test1.tsv"]


def test_missing_checkpoint_is_a_clear_error(tmp_path, data):
    from acl_runtime.console import UsageError

    with pytest.raises(UsageError, match="nope.pt: no such file or folder. Fix: pass a checkpoint file"):
        evaluate.main([str(tmp_path / "nope.pt"), data, "--output", str(tmp_path / "out")])


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "acl-evaluate"]
    assert ep.value == "acl_fairseq.cli.evaluate:cli_main" and ep.load() is evaluate.cli_main


def test_every_tool_is_an_acl_console_script():
    """One prefix, one way to start each tool."""
    from importlib.metadata import distribution

    scripts = {e.name: e.value for e in distribution("acl_fairseq").entry_points if e.group == "console_scripts"}
    assert scripts == {
        "acl-evaluate": "acl_fairseq.cli.evaluate:cli_main",
        "acl-predict": "acl_runtime.predict:cli_main",
        "acl-tune": "acl_fairseq.cli.tune:cli_main",
        "acl-serve": "acl_runtime.serve.cli:cli_main",
        "acl-convert-hf": "acl_fairseq.hf.convert:cli_main",
        "acl-export": "acl_fairseq.hf.export:cli_main",
        "acl-preprocess": "acl_fairseq.preprocessing.glue:cli_main",
        "acl-help": "acl_fairseq.cli.help:cli_main",
        "acl-train-hf": "acl_hf.train:cli_main",
    }


# ---- the command on trained checkpoints -------------------------------------------------------


def add_unlabeled_test_split(data, root):
    """Binarize an unlabeled ``test`` split with the data's dictionary (like GLUE's test sets)."""
    from fairseq_cli import preprocess

    from toy_data import make_examples, write_raw

    write_raw(str(root / "test"), make_examples(10, seed=7))
    out = str(root / "bin")
    argv = [
        "--only-source",
        "--testpref",
        str(root / "test.input0"),
        "--destdir",
        out,
        "--srcdict",
        os.path.join(data, "input0", "dict.txt"),
        "--workers",
        "1",
    ]
    preprocess.main(preprocess.options.get_preprocessing_parser().parse_args(argv))
    for ext in ("bin", "idx"):
        shutil.copy(os.path.join(out, f"test.{ext}"), os.path.join(data, "input0", f"test.{ext}"))


@pytest.fixture(scope="module")
def evaluated(data, tmp_path_factory):
    """Train a tiny multi-exit model (2 epochs), then run ``acl-evaluate`` on it."""
    root = tmp_path_factory.mktemp("evaluated")
    helpers.train(
        data,
        str(root / "ckpt"),
        criterion="sentence_prediction",
        arch="multi_exit_roberta",
        model_args=TINY_MULTI,
        max_epoch=2,
    )
    add_unlabeled_test_split(data, root)
    args = [
        str(root / "ckpt" / "checkpoint_best.pt"),
        data,
        "--output",
        str(root / "out"),
        "--task-name",
        "SST-2",
        "--policy",  # named, so that a policy added to exits.POLICIES leaves the expected settings as they are
        "entropy",
        "patience",
        "confidence",
        "--thresholds",
        "0.0",
        "0.5",
        "1.0",  # the top of entropy's range: H/log K < 1 fires for every row that is not exactly uniform
        "--confidence-thresholds",
        "0.9",
        "--batch-size",
        "5",
        "--timing-examples",
        "6",
        "--timing-repeats",
        "1",
        "--tensorboard-logdir",
        str(root / "tb"),
        "--test-split",
        "test",
        "--predictions-dir",
        str(root / "pred"),
    ]
    proc = helpers.run_tool("acl-evaluate", args)
    return root, proc.stdout


def test_evaluate_writes_json_with_every_field(evaluated):
    root, stdout = evaluated
    result = json.load(open(root / "out" / "early_exit.json"))
    for key in ("task", "split", "checkpoint", "num_layers", "exit_layers", "per_exit", "settings"):
        assert key in result
    assert result["task"] == "SST-2" and result["num_layers"] == 3 and result["exit_layers"] == [1, 2, 3]
    assert [e["layer"] for e in result["per_exit"]] == [1, 2, 3]
    assert all(set(e["metrics"]) == {"accuracy"} for e in result["per_exit"])
    policies = [(s["policy"], s["threshold"]) for s in result["settings"]]
    assert policies == [
        ("entropy", 0.0),
        ("entropy", 0.5),
        ("entropy", 1.0),
        ("patience", 1),
        ("patience", 2),
        ("confidence", 0.9),
    ]
    for s in result["settings"]:
        assert all(s[k] is not None for k in SETTING_FIELDS), s
        assert s["layer_speedup"] == pytest.approx(3 / s["avg_exit_layer"])
        assert s["saved_fraction"] == pytest.approx(1 - s["avg_exit_layer"] / 3)
        assert s["engine_agreement"] == 1.0
    never, always = result["settings"][0], result["settings"][2]
    assert never["avg_exit_layer"] == 3 and never["metrics"] == result["per_exit"][-1]["metrics"]
    assert always["avg_exit_layer"] == 1 and always["metrics"] == result["per_exit"][0]["metrics"]
    profile = result["speedup_profile"]  # the entropy curve reaches 3x, where every example leaves at layer 1
    assert profile["metric"] == "accuracy" and profile["at"]["3"] == pytest.approx(always["metrics"]["accuracy"])
    assert profile["area"] is not None
    assert "layer_speedup" in stdout and "confidence" in stdout  # the printed table


def test_evaluate_reports_flops_per_setting_beside_the_layer_speedup(evaluated):
    root, stdout = evaluated
    result = json.load(open(root / "out" / "early_exit.json"))
    assert "2 FLOPs per multiply-add" in result["flops"]["convention"]
    never, always = result["settings"][0], result["settings"][2]  # entropy 0.0 (all layers) and 1.0 (layer 1)
    # all layers plus the two shallow heads that ran to decide: a hair more than the baseline
    assert never["flops_speedup"] < 1.0 < never["flops_speedup"] + 0.01
    # three layers against one: a little under 3x, the head being paid at every exit
    assert 2.9 < always["flops_speedup"] < 3.0 == always["layer_speedup"]
    for s in result["settings"]:
        assert s["flops_per_example"] * s["flops_speedup"] == pytest.approx(result["flops"]["full_per_example"])
    header = next(line for line in stdout.splitlines() if "layer_speedup" in line).split()
    assert header[header.index("saved_fraction") + 1: header.index("saved_fraction") + 3] == ["flops", "flops_x"]
    assert "flops per example: 2 FLOPs per multiply-add" in stdout
    # the static exits: the model cut at an exit, one head; the last exit is the baseline
    first, last = result["per_exit"][0], result["per_exit"][-1]
    assert last["flops_per_example"] == pytest.approx(result["flops"]["full_per_example"])
    assert last["flops_speedup"] == pytest.approx(1.0) and 2.9 < first["flops_speedup"] < 3.0
    assert first["flops_speedup"] == pytest.approx(always["flops_speedup"])  # every example leaves at exit 1
    csv_rows = list(csv.DictReader(open(root / "out" / "early_exit.csv")))
    assert [float(r["flops_speedup"]) for r in csv_rows] == pytest.approx(
        [e["flops_speedup"] for e in result["per_exit"]] + [s["flops_speedup"] for s in result["settings"]])


def test_evaluate_writes_csv_png_tensorboard_and_predictions(evaluated):
    root, _ = evaluated
    lines = open(root / "out" / "early_exit.csv").read().splitlines()
    assert lines[0].startswith("policy,threshold,accuracy,avg_exit_layer") and len(lines) == 1 + 3 + 6
    png = root / "out" / "early_exit.png"
    assert open(png, "rb").read(8) == PNG_MAGIC
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).ndim == 3
    scalars = helpers.read_scalars(str(root / "tb"))
    assert any("per_exit/accuracy" in tags for tags in scalars.values())
    rows = open(root / "pred" / "SST-2.tsv").read().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 11
    assert [r.split("\t")[0] for r in rows[1:]] == [str(i) for i in range(10)]
    assert {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}


def test_overlay_plot_of_several_runs(evaluated, tmp_path):
    root, _ = evaluated
    result = json.load(open(root / "out" / "early_exit.json"))
    report.plot_overlay({"ce": [result, result], "acl": [result]}, str(tmp_path / "overlay.png"))
    assert open(tmp_path / "overlay.png", "rb").read(8) == PNG_MAGIC
    points = report.overlay_points([result, result], "entropy", "accuracy")
    assert len(points) == 3 and all(p["y_sd"] == 0 and p["n"] == 2 for p in points)


def as_plain_roberta_checkpoint(multi_ckpt, path):
    """The trained multi-exit checkpoint turned into a stock ``roberta`` one (final head only)."""
    state = torch.load(multi_ckpt)
    state["cfg"]["model"].arch = state["cfg"]["model"]._name = "roberta"
    state["model"] = {k: v for k, v in state["model"].items() if "_exit" not in k}
    torch.save(state, path)


def test_evaluate_runs_on_a_plain_roberta_checkpoint(evaluated, data, tmp_path):
    root, _ = evaluated
    as_plain_roberta_checkpoint(root / "ckpt" / "checkpoint_best.pt", tmp_path / "plain.pt")
    result = evaluate.main(
        [
            str(tmp_path / "plain.pt"),
            data,
            "--output",
            str(tmp_path / "out"),
            "--thresholds",
            "0.5",
            "--policy",
            "entropy",
            "patience",
            "--timing-examples",
            "2",
            "--timing-repeats",
            "1",
            "--device",
            "cpu",
        ]
    )
    assert result["exit_layers"] == [3] and len(result["per_exit"]) == 1
    assert [(s["policy"], s["avg_exit_layer"]) for s in result["settings"]] == [("entropy", 3)]
    assert set(result["per_exit"][0]["metrics"]) == {"accuracy", "f1", "mcc"}  # unknown task: all metrics
    multi = json.load(open(root / "out" / "early_exit.json"))
    assert result["per_exit"][0]["metrics"]["accuracy"] == multi["per_exit"][-1]["metrics"]["accuracy"]


# ---- the sweep comes from exits.POLICIES; thresholds outside a policy's range are usage errors ----------------

BAD_SWEEPS = [("--thresholds", "1.5"), ("--thresholds", "nan"), ("--confidence-thresholds", "2"),
              ("--confidence-thresholds", "-1"), ("--patience-values", "0"), ("--patience-values", "-1"),
              ("--patience-values", "2.5")]


@pytest.mark.parametrize("flag,value", BAD_SWEEPS)
def test_cli_refuses_a_threshold_out_of_its_policys_range(flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        evaluate.build_parser().parse_args(["c.pt", "data", "--output", "o", flag, value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {flag}: " in err and "it takes" in err, err


def test_cli_range_refusal_exits_2_before_loading_anything():
    proc = helpers.run_tool("acl-evaluate", ["missing.pt", "missing", "--output", "o", "--thresholds", "nan"],
                            check=False)
    assert proc.returncode == 2 and "entropy threshold nan is out of range: it takes [0, 1]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sweep_reads_the_policy_table():
    args = evaluate.build_parser().parse_args(["c.pt", "data", "--output", "o"])
    settings = evaluate.sweep(args, 4, regression=False)
    want = [(name, v) for name, row in exits.POLICIES.items() for v in row.sweep(4)]
    assert settings == want and ("patience", 3) in settings and ("confidence", 0.99) in settings
    assert {p for p, _ in evaluate.sweep(args, 4, regression=True)} == {"patience"}
    args = evaluate.build_parser().parse_args(["c.pt", "data", "--output", "o", "--policy", "patience",
                                               "--patience-values", "2", "5"])
    assert evaluate.sweep(args, 4, regression=False) == [("patience", 2), ("patience", 5)]
