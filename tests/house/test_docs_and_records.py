"""What the code, the docs and the records say about each other: no script patches
``sys.path``, cited files exist, acl-help points fairseq at the plugin, a documented number is the records', the
gradient-conflict benchmark names its scope and interval, and a results record names no folder of its machine."""
import glob
import json
import os
import re
import sys

import pytest

import helpers

PACKAGE = os.path.join(helpers.REPO, "acl_fairseq")


def _python_files(*folders):
    return sorted(p for f in folders for p in glob.glob(os.path.join(helpers.REPO, f, "**", "*.py"), recursive=True))


def test_no_script_outside_tests_patches_sys_path():
    """The bar of the clean-up that made benchmarks import each other as scripts run by path do: tests/conftest.py
    is the one place that sets the path."""
    patching = re.compile(r"sys\.path\s*(\.(insert|append|extend)\(|\+?=|\[)")
    found = [f"{os.path.relpath(p, helpers.REPO)}:{n}" for p in _python_files("acl_fairseq", "benchmarks", "recipes",
                                                                              "scripts", "preprocess")
             for n, line in enumerate(open(p, encoding="utf-8"), 1) if patching.search(line)]
    assert found == []


def test_docs_the_package_cites_exist():
    cited = {(os.path.relpath(p, helpers.REPO), m) for p in _python_files("acl_fairseq")
             for m in re.findall(r"\bdocs/[\w.-]+\.md\b", open(p, encoding="utf-8").read())}
    assert cited and all(os.path.isfile(os.path.join(helpers.REPO, doc)) for _, doc in cited), cited


def test_acl_help_points_fairseq_at_the_plugin_folder(monkeypatch, capsys):
    from acl_fairseq.cli import help as acl_help

    monkeypatch.setattr(sys, "argv", ["acl-help"])
    acl_help.main(["--list"])
    assert sys.argv[1:] == ["--user-dir", PACKAGE] and "acl_grad" in capsys.readouterr().out


def test_every_criterion_that_logs_the_gate_names_its_settings():
    """A criterion that reports the gate's keys (grad_cos, conflict_rate) says where its gate's settings come from: its
    acl_torch.objective class overrides ``gate_config`` (the base class, plain CE, has none)."""
    from acl_torch import objective

    logging_gate = [t for t in objective.TERMS.values() if t.logged_ratios]
    assert {t.name for t in logging_gate} == {"sentence_scl", "acl_embed", "acl_grad", "acl_cross_layer"}
    for terms in logging_gate:
        assert terms.gate_config is not objective.Terms.gate_config, terms.name
    assert objective.Terms.gate_config(objective.Terms()) is None


def _epoch_cosines(log):
    """[(grad_cos, conflict_rate)] of each epoch line of a fairseq json train log."""
    rows = [json.loads(line.split("| train | ", 1)[1]) for line in open(log, encoding="utf-8") if "| train | " in line]
    return [(float(r["train_grad_cos"]), float(r["train_conflict_rate"])) for r in rows]


def test_benchmarks_md_gives_the_acl_grad_cosine_range_of_the_records():
    """Over the acl_grad quality runs whose rule never fired, the per-epoch mean grad_cos spans what the page says."""
    logs = glob.glob(os.path.join(helpers.REPO, "benchmarks", "results", "runs", "quality", "runs", "*", "acl_grad",
                                  "seed*", "train.log"))
    never = [cos for log in logs for cos, rate in _epoch_cosines(log) if all(r == 0 for _, r in _epoch_cosines(log))]
    assert len(never) > 10
    text = open(os.path.join(helpers.REPO, "docs", "benchmarks.md"), encoding="utf-8").read()
    assert f"its epoch mean `grad_cos` {min(never):.2f}-{max(never):.2f})" in text


def test_grad_conflict_names_its_scope_and_how_often_it_measures(tmp_path, monkeypatch, capsys):
    """The plot's params panels are over the parameters both losses reach, and --measure-every 3 is not logged
    as 'every update'."""
    import matplotlib.axes

    import grad_conflict

    titles = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, text, **kw: titles.append(text))
    monkeypatch.setattr(grad_conflict, "prepare", lambda args: ("DATA", None, 7))
    fake = {pair: {scope: 0.5 for scope in grad_conflict.SCOPES} for pair in grad_conflict.PAIRS}
    monkeypatch.setattr(grad_conflict, "train_and_measure", lambda argv, every: [
        dict(fake, update=u, epoch=1) for u in (1, 4, 7)])
    assert grad_conflict.main(["--toy", "--runs", "scl", "--measure-every", "3", "--work", str(tmp_path / "w"),
                               "--results", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "measuring before one update in 3 (updates 1, 4, 7, ...)" in err and "measuring every update" not in err
    assert titles == ["trained with scl_seed1: angle to g_CE, the parameters both losses reach"]


def test_serve_speed_records_paths_relative_to_its_run_folder(tmp_path):
    import serve_speed

    work = tmp_path / "bench"
    args = serve_speed.parse_args(["--toy", "--work", str(work), "--json", str(tmp_path / "toy.json")])
    setup = serve_speed.run_paths(args, str(work / "toy" / "ckpt" / "checkpoint_best.pt"), str(work / "onnx"))
    assert (setup["checkpoint"], setup["onnx"]) == (os.path.join("toy", "ckpt", "checkpoint_best.pt"), "onnx")


def _strings(x):
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return [x] if isinstance(x, str) else []


RESULTS = os.path.join(helpers.REPO, "benchmarks", "results")


# every committed JSON record: the acl-evaluate records of the runs and logs were rewritten once from the absolute
# paths of the machine they ran on (their checkpoint's folder held the --output early_exit/), grad_conflict's
# steps.json with benchmarks/grad_conflict.py's portable_args
COMMITTED = glob.glob(os.path.join(RESULTS, "**", "*.json"), recursive=True)


@pytest.mark.parametrize("name", sorted(os.path.relpath(p, RESULTS) for p in COMMITTED))
def test_committed_results_name_no_folder_of_their_machine(name):
    record = json.load(open(os.path.join(RESULTS, name), encoding="utf-8"))
    assert [s for s in _strings(record) if os.path.isabs(s)] == []


def test_acl_evaluate_records_paths_relative_to_its_output(predict_run, tmp_path):
    from acl_fairseq.cli import evaluate

    _, data, ckpt = predict_run
    out, pred = tmp_path / "runs" / "early_exit", tmp_path / "pred"
    evaluate.main([os.path.abspath(ckpt), os.path.abspath(data), "--output", str(out), "--policy", "entropy",
                   "--thresholds", "0.3", "--timing-examples", "0", "--device", "cpu", "--test-split", "valid",
                   "--predictions-dir", str(pred)])
    record = json.load(open(out / "early_exit.json", encoding="utf-8"))
    assert [s for s in _strings(record) if os.path.isabs(s)] == []
    assert os.path.samefile(out / record["checkpoint"], ckpt) and os.path.samefile(out / record["data"], data)
    assert [os.path.normpath(out / p) for p in record["predictions"]] == [str(pred / "predictions.tsv")]
