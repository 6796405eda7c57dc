"""Thresholds calibrated to a budget: the choice (acl_runtime.calibration), ``acl-evaluate --calibrate`` and
``exit_policy.json`` applied by default in acl-predict, the hub, acl-export and the ONNX runtime."""
import argparse
import json
import math
import os
import shutil

import pytest
import torch

import helpers
from acl_fairseq.cli import evaluate
from acl_fairseq.inference import hub
from acl_runtime import calibration, exits, predict
from acl_runtime.calibration import Budget
from test_models import HEAD

# ---- the choice on synthetic per-exit logits, through the offline policy code acl-evaluate runs ----------

# example -> (normalized entropy of its first exit, is the first exit right); exits 2 and 3: see _exit_logits
FIRST_EXIT = [(0.05, True)] * 4 + [(0.2, True), (0.2, False), (0.4, True), (0.4, False), (0.6, False), (0.95, False)]
GRID = [0.1, 0.3, 0.5, 0.7, 0.99]
# threshold -> (accuracy, layer speed-up): examples with entropy below it leave at layer 1, the rest at layer 3
EXPECTED = {0.1: (100.0, 3 / 2.2), 0.3: (90.0, 3 / 1.8), 0.5: (80.0, 3 / 1.4), 0.7: (70.0, 3 / 1.2), 0.99: (60.0, 3.0)}


def _gap(h: float) -> float:
    """The logit gap of two classes whose normalized entropy is ``h`` (bisection: entropy falls with the gap)."""
    lo, hi = 0.0, 60.0
    for _ in range(200):
        mid = (lo + hi) / 2
        p = 1 / (1 + math.exp(-mid))
        entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p)) / math.log(2)
        lo, hi = (mid, hi) if entropy > h else (lo, mid)
    return lo


def _exit_logits():
    """(N, 3 exits, 2) logits and targets: exit 1 as FIRST_EXIT says; exit 2 undecided (entropy exactly 1, so
    no entropy threshold below 1 fires there); exit 3 right and sure."""
    targets = torch.tensor([i % 2 for i in range(len(FIRST_EXIT))])
    logits = torch.zeros(len(FIRST_EXIT), 3, 2)
    for i, (h, right) in enumerate(FIRST_EXIT):
        y = int(targets[i])
        logits[i, 0, y if right else 1 - y] = _gap(h)
        logits[i, 2, y] = 20.0
    return logits, targets


@pytest.fixture(scope="module")
def synthetic():
    logits, targets = _exit_logits()
    ctx = {"task_name": "SST-2", "regression": False, "positive": None, "delta": exits.DEFAULT_REGRESSION_DELTA}
    per_exit = [{"layer": m + 1, "metrics": evaluate.score(logits[:, m], targets, ctx)} for m in range(3)]
    settings = [evaluate.setting_quality(logits, targets, [1, 2, 3], 3, "entropy", t, ctx)[0] for t in GRID]
    return {"primary_metric": "accuracy", "per_exit": per_exit, "settings": settings, "split": "valid",
            "num_examples": len(FIRST_EXIT), "task": "SST-2"}


def test_synthetic_logits_give_the_designed_curve(synthetic):
    assert synthetic["per_exit"][-1]["metrics"]["accuracy"] == 100.0
    got = {s["threshold"]: (s["metrics"]["accuracy"], s["layer_speedup"]) for s in synthetic["settings"]}
    assert got == {t: (a, pytest.approx(x)) for t, (a, x) in EXPECTED.items()}


@pytest.mark.parametrize("budget,threshold", [
    ("max-drop=0", 0.1), ("max-drop=9.99", 0.1), ("max-drop=10", 0.3), ("max-drop=25", 0.5), ("max-drop=100", 0.99),
    ("min-speedup=1", 0.1), ("min-speedup=1.5", 0.3), ("min-speedup=2", 0.5), ("min-speedup=3", 0.99),
])
def test_choice_on_synthetic_logits(synthetic, budget, threshold):
    assert calibration.choose(synthetic, calibration.parse_budget(budget))["threshold"] == threshold


def test_unmet_budgets_name_the_closest_setting(synthetic):
    with pytest.raises(calibration.Unmet) as e:
        calibration.choose(synthetic, Budget("min-speedup", 3.5))
    assert str(e.value) == "no entropy threshold reaches a layer speed-up of 3.5x; the closest: 0.99 at 60 (3.00x)"
    without_first = dict(synthetic, settings=synthetic["settings"][1:])
    with pytest.raises(calibration.Unmet) as e:
        calibration.choose(without_first, Budget("max-drop", 5))
    assert str(e.value) == "no entropy threshold keeps accuracy within 5 of 100; the closest: 0.3 at 90 (1.67x)"


# ---- the choice on hand-made settings: ties, NaN, policies ----------------------------------------------


def _setting(policy, threshold, metric, speedup):
    return {"policy": policy, "threshold": threshold, "metrics": {"accuracy": metric}, "layer_speedup": speedup}


# each tie's loser comes first, so that a choice without the tie-break picks it
SETTINGS = [_setting("entropy", 0.1, float("nan"), 3.0), _setting("entropy", 0.4, 85.0, 1.5),
            _setting("entropy", 0.2, 80.0, 2.0), _setting("entropy", 0.3, 85.0, 2.0),
            _setting("confidence", 0.9, 90.0, 2.5)]
RESULT = {"primary_metric": "accuracy", "per_exit": [{"metrics": {"accuracy": 0.0}}, {"metrics": {"accuracy": 90.0}}],
          "settings": SETTINGS}


@pytest.mark.parametrize("budget,policy,threshold", [
    (Budget("max-drop", 10), "entropy", 0.3),  # 0.2 and 0.3 equally fast: the better metric
    (Budget("min-speedup", 1.5), "entropy", 0.3),  # 0.3 and 0.4 equally good: the faster
    (Budget("min-speedup", 2.5), "confidence", 0.9),  # only the named policy's settings
    (Budget("max-drop", 0), "confidence", 0.9),
])
def test_ties_and_policies(budget, policy, threshold):
    assert calibration.choose(RESULT, budget, policy)["threshold"] == threshold


def test_nan_never_decides_and_a_missing_policy_or_single_exit_is_named():
    with pytest.raises(calibration.Unmet, match=r"reaches a layer speed-up of 2.5x; the closest: 0.3 at 85 \(2.00x\)"):
        calibration.choose(RESULT, Budget("min-speedup", 2.5))  # the NaN setting at 3x does not count
    with pytest.raises(calibration.Unmet, match="no patience settings in the sweep"):
        calibration.choose(RESULT, Budget("max-drop", 1), "patience")
    with pytest.raises(calibration.Unmet, match="single exit"):
        calibration.choose(dict(RESULT, per_exit=RESULT["per_exit"][1:]), Budget("max-drop", 1))
    nan_reference = dict(RESULT, per_exit=[{"metrics": {"accuracy": 1.0}}, {"metrics": {"accuracy": float("nan")}}])
    with pytest.raises(calibration.Unmet, match="last exit's accuracy is nan"):
        calibration.choose(nan_reference, Budget("max-drop", 1))


@pytest.mark.parametrize("text,budget", [("max-drop=0.5", Budget("max-drop", 0.5)),
                                         ("max-drop=0", Budget("max-drop", 0)),
                                         ("min-speedup=1", Budget("min-speedup", 1)),
                                         ("min-speedup=1.5", Budget("min-speedup", 1.5))])
def test_budget_parses(text, budget):
    assert calibration.parse_budget(text) == budget and str(budget) == text


@pytest.mark.parametrize("text,message", [
    ("max-drop", "has no '='"), ("max_drop=1", "unknown budget 'max_drop'"), ("speedup=2", "unknown budget"),
    ("max-drop=abc", "not a number"), ("max-drop=", "not a number"), ("max-drop=nan", "finite number >= 0"),
    ("max-drop=-0.1", "finite number >= 0"), ("min-speedup=0.9", "finite number >= 1"),
    ("min-speedup=inf", "finite number >= 1"),
])
def test_bad_budgets_are_usage_errors(text, message, capsys):
    with pytest.raises(ValueError, match=message):
        calibration.parse_budget(text)
    with pytest.raises(SystemExit) as e:
        evaluate.build_parser().parse_args(["c.pt", "d", "--output", "o", "--calibrate", text])
    assert e.value.code == 2 and message.split("'")[0] in capsys.readouterr().err


def test_record_is_written_whole_and_not_over_an_existing_one(tmp_path):
    path = str(tmp_path / calibration.FILE_NAME)
    calibration.write({"schema": calibration.SCHEMA, "policy": "entropy", "threshold": 0.4}, path, force=False)
    with pytest.raises(FileExistsError, match="--force"):
        calibration.write({"policy": "x"}, path, force=False)
    assert calibration.read(path)["threshold"] == 0.4 and os.listdir(tmp_path) == [calibration.FILE_NAME]
    calibration.write({"schema": calibration.SCHEMA, "policy": "entropy", "threshold": 1.5}, path, force=True)
    with pytest.raises(calibration.RecordError, match="entropy threshold 1.5 is out of range"):
        calibration.read(path)


@pytest.mark.parametrize("threshold", [True, "0.3", None])
def test_a_threshold_that_is_not_a_json_number_is_refused(tmp_path, threshold):
    """JSON's true was read as 1 (Python's bool is an int), a string or null as a threshold too."""
    path = str(tmp_path / calibration.FILE_NAME)
    json.dump({"schema": calibration.SCHEMA, "policy": "patience", "threshold": threshold}, open(path, "w"))
    with pytest.raises(calibration.RecordError, match=f"threshold is {json.dumps(threshold)}, not a number"):
        calibration.read(path)


def _read_only_folder(monkeypatch, folder):
    """Creating a file in ``folder`` fails as on a read-only folder (root, who runs the tests here, ignores
    permission bits: the kernel's answer is simulated, as a full disk is elsewhere)."""
    real_open = os.open

    def refusing(path, *args, **kwargs):
        if os.path.dirname(os.path.abspath(path)) == os.path.abspath(folder):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)


@pytest.mark.parametrize("obstacle", ["read-only folder", "a folder named like the record"])
def test_a_record_that_cannot_be_written_is_refused_before_the_sweep(tmp_path, monkeypatch, obstacle):
    """It was refused only at the end of the whole sweep."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "checkpoint_best.pt").write_bytes(b"never read: the refusal comes first")
    monkeypatch.setattr(evaluate, "evaluate", lambda args: pytest.fail("the sweep ran"))
    flags = ["--calibrate", "max-drop=1"]
    if obstacle == "read-only folder":
        _read_only_folder(monkeypatch, folder)
        reason = "Permission denied"
    else:
        (folder / calibration.FILE_NAME).mkdir()
        flags.append("--force")
        reason = "a folder is in the way"
    with pytest.raises(SystemExit) as e:
        evaluate.main([str(folder / "checkpoint_best.pt"), str(tmp_path), "--output", str(tmp_path / "ee"), *flags])
    message = str(e.value)
    assert e.value.code == 2 and message.startswith(f"--calibrate writes {folder / calibration.FILE_NAME}, which "
                                                    f"cannot be written here ({reason})") and "\n" not in message


# ---- acl-evaluate --calibrate on a tiny trained model, and who applies the record --------------------------


@pytest.fixture(scope="module")
def run(cls_pair_run, tmp_path_factory):
    """conftest's tiny multi-exit model trained 2 epochs on toy pairs (shared: only copies of it are changed
    here); entropy thresholds at the quartiles of its first exit's validation entropies (midpoints, so that
    each one sends more examples out at layer 1)."""
    root = tmp_path_factory.mktemp("calibrate")
    data, ckpt = cls_pair_run
    model, task, _ = evaluate.load_model(ckpt, data, None, device="cpu")
    task.load_dataset("valid")
    ds = task.dataset("valid")
    _, logits, _ = evaluate.collect_exit_logits(model, evaluate.make_batches(ds, list(range(len(ds))), 32), HEAD)
    h = sorted(set(exits.prediction_entropy(logits[:, 0]).tolist()))
    thresholds = [(h[k - 1] + h[k]) / 2 for k in (len(h) // 4, len(h) // 2, 3 * len(h) // 4)]
    raw = os.path.join(data, "raw")
    texts = list(zip(*(open(os.path.join(raw, f"valid.input{i}")).read().splitlines() for i in (0, 1))))
    return {"root": root, "data": data, "ckpt": ckpt, "thresholds": thresholds, "texts": texts}


def _copy(run, folder) -> str:
    os.makedirs(folder)
    return shutil.copy(run["ckpt"], os.path.join(folder, "checkpoint_best.pt"))


def _evaluate(run, ckpt, out, *extra):
    return evaluate.main([ckpt, run["data"], "--output", str(out), "--policy", "entropy", "--thresholds",
                          *map(str, run["thresholds"]), "--timing-examples", "0", "--device", "cpu", *extra])


@pytest.fixture(scope="module")
def calibrated(run):
    """A copy of the checkpoint calibrated with max-drop=100: any metric is within 100 points, so the choice is
    the fastest setting, the largest threshold."""
    ckpt = _copy(run, str(run["root"] / "calibrated"))
    result = _evaluate(run, ckpt, run["root"] / "ee", "--calibrate", "max-drop=100")
    return dict(run, ckpt=ckpt, result=result, threshold=max(run["thresholds"]))


def test_calibrate_writes_the_record_beside_the_checkpoint(calibrated):
    path = os.path.join(os.path.dirname(calibrated["ckpt"]), calibration.FILE_NAME)
    record = json.load(open(path))
    (chosen,) = [s for s in calibrated["result"]["settings"] if s["threshold"] == calibrated["threshold"]]
    assert chosen["layer_speedup"] == max(s["layer_speedup"] for s in calibrated["result"]["settings"])
    assert record["policy"] == "entropy" and record["threshold"] == calibrated["threshold"]
    assert record["budget"] == "max-drop=100" and record["metric"] == "accuracy" and record["split"] == "valid"
    assert record["value"] == chosen["metrics"]["accuracy"] and record["layer_speedup"] == chosen["layer_speedup"]
    assert record["last_exit_value"] == calibrated["result"]["per_exit"][-1]["metrics"]["accuracy"]
    assert record["num_examples"] == len(calibrated["texts"]) and record["checkpoint"] == "checkpoint_best.pt"
    assert record["checkpoint_sha256"] == calibration.file_sha256(calibrated["ckpt"]) and record["date"][:2] == "20"


def test_an_existing_record_is_refused_before_loading_and_replaced_with_force(calibrated, tmp_path, monkeypatch):
    path = os.path.join(os.path.dirname(calibrated["ckpt"]), calibration.FILE_NAME)
    before = open(path).read()
    monkeypatch.setattr(evaluate, "evaluate", lambda args: pytest.fail("the model was evaluated"))
    with pytest.raises(SystemExit) as e:
        _evaluate(calibrated, calibrated["ckpt"], tmp_path / "a", "--calibrate", "min-speedup=1")
    assert e.value.code == 2 and "exists; pass --force" in str(e.value) and open(path).read() == before
    monkeypatch.undo()
    ckpt = _copy(calibrated, str(tmp_path / "copy"))
    shutil.copy(path, os.path.dirname(ckpt))
    _evaluate(calibrated, ckpt, tmp_path / "b", "--calibrate", "min-speedup=1", "--force")
    assert json.load(open(os.path.join(os.path.dirname(ckpt), calibration.FILE_NAME)))["budget"] == "min-speedup=1"


def test_an_unmet_budget_is_one_line_exit_2_naming_the_closest(run, tmp_path):
    ckpt = _copy(run, str(tmp_path / "c"))
    args = [ckpt, run["data"], "--output", str(tmp_path / "ee"), "--policy", "entropy", "--thresholds",
            *map(str, run["thresholds"]), "--timing-examples", "0", "--device", "cpu", "--calibrate",
            "min-speedup=3.5"]
    proc = helpers.run_tool("acl-evaluate", args, check=False)
    (line,) = [x for x in proc.stderr.splitlines() if "error" in x]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert line.startswith("acl-evaluate: error: --calibrate min-speedup=3.5: no entropy threshold reaches a layer "
                           f"speed-up of 3.5x; the closest: {max(run['thresholds']):g} at ")
    assert os.path.isfile(tmp_path / "ee" / "early_exit.json")  # the sweep is still there to look at
    assert not os.path.exists(os.path.join(os.path.dirname(ckpt), calibration.FILE_NAME))


def _input(calibrated, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in calibrated["texts"]))
    return str(src)


def _predict(calibrated, tmp_path, *flags, ckpt=None):
    out = tmp_path / f"out{len(os.listdir(tmp_path))}.jsonl"
    argv = [ckpt or calibrated["ckpt"], "--input", _input(calibrated, tmp_path), "--output", str(out), *flags]
    if os.path.isfile(argv[0]):
        argv += ["--data", calibrated["data"], "--device", "cpu"]
    predict.main(argv)
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def model(calibrated):
    return hub.from_pretrained(os.path.dirname(calibrated["ckpt"]), "checkpoint_best.pt", calibrated["data"]).eval()


def test_the_hub_applies_the_record_by_default_and_none_is_the_last_exit(calibrated, model):
    texts, t = calibrated["texts"], calibrated["threshold"]
    assert model.calibrated["threshold"] == t and model.serving_policy["source"].endswith(calibration.FILE_NAME)
    default = [p.exit_layer for p in model.predict_early_exit(texts)]
    assert default == [p.exit_layer for p in model.predict_early_exit(texts, policy="entropy", threshold=t)]
    assert len(set(default)) > 1 and min(default) == 1
    assert {p.exit_layer for p in model.predict_early_exit(texts, policy="none")} == {3}
    assert {p.exit_layer for p in model.predict_early_exit(texts, exit_layer=2)} == {2}
    with pytest.raises(ValueError, match="a threshold needs its policy"):
        model.predict_early_exit(texts, threshold=0.2)


def test_acl_predict_uses_the_record_by_default_and_flags_override_it(calibrated, model, tmp_path, capsys):
    texts, t = calibrated["texts"], calibrated["threshold"]
    records = _predict(calibrated, tmp_path)
    path = os.path.join(os.path.dirname(calibrated["ckpt"]), calibration.FILE_NAME)
    assert f"acl-predict: using the calibrated policy entropy {t:g} from {path}" in capsys.readouterr().err
    expected = model.predict_early_exit(texts, policy="entropy", threshold=t)
    assert [(r["label"], r["exit_layer"]) for r in records] == [(p.label, p.exit_layer) for p in expected]
    assert {r["exit_layer"] for r in _predict(calibrated, tmp_path, "--policy", "none")} == {3}
    assert "using the calibrated" not in capsys.readouterr().err
    assert {r["exit_layer"] for r in _predict(calibrated, tmp_path, "--exit-layer", "2")} == {2}
    confident = _predict(calibrated, tmp_path, "--policy", "confidence", "--threshold", "0.6")
    expected = model.predict_early_exit(texts, policy="confidence", threshold=0.6)
    assert [r["exit_layer"] for r in confident] == [p.exit_layer for p in expected]
    with pytest.raises(SystemExit) as e:
        _predict(calibrated, tmp_path, "--threshold", "0.3")
    assert e.value.code == 2 and "a threshold needs its policy" in capsys.readouterr().err


def test_a_record_for_another_checkpoint_is_named_and_not_used(calibrated, tmp_path, caplog):
    ckpt = _copy(calibrated, str(tmp_path / "other"))
    record = json.load(open(os.path.join(os.path.dirname(calibrated["ckpt"]), calibration.FILE_NAME)))
    record["checkpoint_sha256"] = "0" * 64  # as if calibrated before the checkpoint was trained again
    calibration.write(record, os.path.join(os.path.dirname(ckpt), calibration.FILE_NAME), force=False)
    (tmp_path / "pred").mkdir()
    records = _predict(calibrated, tmp_path / "pred", ckpt=ckpt)
    assert {r["exit_layer"] for r in records} == {3}
    assert "was calibrated on another checkpoint" in caplog.text and "not used" in caplog.text


@pytest.mark.slow  # make test's 10 minutes: an ONNX export and the runtime over it: about 9 s
def test_acl_export_records_the_calibrated_policy_and_the_runtime_applies_it(calibrated, model, tmp_path, capsys):
    from acl_fairseq.hf import export, hf_folder
    from acl_runtime import engine as runtime

    out = tmp_path / "out"
    export.main([calibrated["ckpt"], "--data", calibrated["data"], "--output", str(out), "--format", "onnx",
                 "--metrics-split", "none"])
    assert "recording the calibrated policy entropy" in capsys.readouterr().err
    manifest = json.load(open(out / "onnx" / "manifest.json"))
    assert manifest["policy"] == "entropy" and manifest["threshold"] == calibrated["threshold"]
    assert manifest["calibration"]["budget"] == "max-drop=100"
    (tmp_path / "pred").mkdir()
    records = _predict(calibrated, tmp_path / "pred", ckpt=str(out / "onnx"))
    err = capsys.readouterr().err
    assert f"using the calibrated policy entropy {calibrated['threshold']:g} from {out / 'onnx'}" in err
    engine = runtime.Engine(str(out / "onnx"), threads=1)  # its own explicit run: the engines may flip at t
    expected = engine.predict_early_exit(calibrated["texts"], policy="entropy", threshold=calibrated["threshold"])
    assert [r["exit_layer"] for r in records] == [p.exit_layer for p in expected]
    assert len({p.exit_layer for p in expected}) > 1
    assert {p.exit_layer for p in engine.predict_early_exit(calibrated["texts"], policy="none")} == {3}
    # --policy none and an explicit policy override the record, in the HF folder's record as in the manifest
    for flags, policy in [(["--policy", "none"], None), (["--policy", "confidence"], "confidence")]:
        args = export.build_parser().parse_args([calibrated["ckpt"], "--data", calibrated["data"], "--output", "o",
                                                 "--format", "onnx", *flags])
        export.precheck(args)
        export.serving_policy(args, model)
        assert (args.policy, args.calibration) == (policy, None)
    args = argparse.Namespace(policy=None, threshold=None)
    export.serving_policy(args, model)
    record = hf_folder.early_exit_record(export.Context(args, model, {}), [1, 2, 3], ["0", "1"], {})
    assert (record["policy"], record["threshold"]) == ("entropy", calibrated["threshold"])
    assert record["calibration"]["checkpoint_sha256"] == calibration.file_sha256(calibrated["ckpt"])
