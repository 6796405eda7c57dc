"""recipes/collect_results.py: the GLUE table over seeds, per-exit tables and the early-exit plots."""
import importlib.util
import json
import os
import subprocess
import sys

from recipe_helpers import RECIPES


def load_collector():
    spec = importlib.util.spec_from_file_location("collect_results", os.path.join(RECIPES, "collect_results.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_result(runs, task, method, seed, valid, valid1=None, early_exit=None):
    d = os.path.join(runs, task, method, f"seed{seed}")
    os.makedirs(d, exist_ok=True)
    best = {"valid": valid, **({"valid1": valid1} if valid1 else {})}
    res = {"task": task, "method": method, "seed": seed, "best_metric": next(iter(valid)), "best_valid": best,
           "early_exit_json": None}
    if early_exit:
        os.makedirs(os.path.join(d, "early_exit"))
        with open(os.path.join(d, "early_exit", "early_exit.json"), "w") as f:
            json.dump(early_exit, f)
        res["early_exit_json"] = "early_exit/early_exit.json"
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(res, f)


def test_the_collector_imports_neither_torch_nor_fairseq():
    """A table of finished runs needs no training stack (its subprocess took 7 s of make test for their imports)."""
    code = (f"import sys; sys.argv = ['collect_results.py', '--help']; sys.path.insert(0, {RECIPES!r})\n"
            "try:\n    import runpy; runpy.run_path(sys.path[0] + '/collect_results.py', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'fairseq', 'acl_fairseq') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_collector_table(tmp_path, capsys):
    runs = str(tmp_path / "runs")
    fake_result(runs, "CoLA", "ce", 1, {"mcc": 60.0, "accuracy": 80.0})
    fake_result(runs, "CoLA", "ce", 2, {"mcc": 62.0, "accuracy": 81.0})
    fake_result(runs, "MNLI", "acl_embed", 1, {"accuracy": 87.5}, {"accuracy": 87.0})
    out = tmp_path / "results.md"
    proc = subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), runs, "--output", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "| method | CoLA (MCC) | MNLI-m (Acc) | MNLI-mm (Acc) |"
    assert lines[1] == "|---|---|---|---|"
    assert lines[2] == "| ce | 61.00 ± 1.41 (n=2) | – | – |"
    assert lines[3] == "| acl_embed | – | 87.50 (n=1) | 87.00 (n=1) |"
    assert "sample standard deviation" in out.read_text()
    # the other formats in process (the script itself ran above, and refuses below): a subprocess each cost
    # make test 1-3 s
    collector = load_collector()
    capsys.readouterr()
    assert collector.main([runs, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert collector.main([runs, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == data  # the deprecated switch still works
    by_suffix = tmp_path / "table.json"
    assert collector.main([runs, "--output", str(by_suffix)]) == 0
    assert json.loads(by_suffix.read_text()) == data
    cell = next(c for c in data["cells"] if c["method"] == "ce" and c["task"] == "CoLA")
    assert cell["values"] == [60.0, 62.0] and cell["seeds"] == [1, 2] and cell["n"] == 2
    assert cell["mean"] == 61.0 and abs(cell["std"] - 2 ** 0.5) < 1e-12
    empty = subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), str(tmp_path / "none")],
                           capture_output=True, text=True)
    assert empty.returncode == 2 and "not a folder" in empty.stderr


def test_collector_plots_multi_exit_runs(tmp_path, monkeypatch):
    collector = load_collector()
    runs = str(tmp_path / "runs")
    ee = {"task": "RTE", "num_layers": 2, "per_exit": [], "settings": []}
    fake_result(runs, "RTE", "acl_cross_layer", 1, {"accuracy": 70.0}, early_exit=ee)
    fake_result(runs, "RTE", "acl_cross_layer", 2, {"accuracy": 72.0}, early_exit=ee)
    fake_result(runs, "RTE", "ce", 1, {"accuracy": 71.0})
    calls = []
    fake_report = type(sys)("acl_fairseq.inference.report")
    fake_report.plot_overlay = lambda groups, path: calls.append((groups, path)) or open(path, "w").close()
    monkeypatch.setitem(sys.modules, "acl_fairseq.inference.report", fake_report)
    assert collector.main([runs, "--output", str(tmp_path / "results.md")]) == 0
    assert len(calls) == 1
    groups, path = calls[0]
    assert list(groups) == ["acl_cross_layer"] and groups["acl_cross_layer"] == [ee, ee]
    assert path == str(tmp_path / "early_exit_RTE.png")
    assert "![early exit RTE](early_exit_RTE.png)" in (tmp_path / "results.md").read_text()


def test_collector_says_so_when_the_plot_function_is_missing(tmp_path, monkeypatch, capsys):
    collector = load_collector()
    runs = str(tmp_path / "runs")
    fake_result(runs, "RTE", "multi_exit_ce", 1, {"accuracy": 70.0}, early_exit={"settings": []})
    monkeypatch.setitem(sys.modules, "acl_fairseq.inference.report", None)  # makes the import fail
    assert collector.main([runs]) == 0
    captured = capsys.readouterr()
    assert "plot_overlay is unavailable" in captured.err and "| multi_exit_ce | 70.00 (n=1) |" in captured.out


def test_collector_tabulates_every_exit_over_seeds(tmp_path, monkeypatch):
    collector = load_collector()
    runs = str(tmp_path / "runs")

    def ee(*accs):
        return {"task": "SST-2", "primary_metric": "accuracy", "settings": [],
                "per_exit": [{"layer": i + 1, "metrics": {"accuracy": a, "f1": 0.0}} for i, a in enumerate(accs)]}

    fake_result(runs, "SST-2", "multi_exit_ce", 1, {"accuracy": 80.0}, early_exit=ee(70.0, 80.0))
    fake_result(runs, "SST-2", "multi_exit_ce", 2, {"accuracy": 82.0}, early_exit=ee(72.0, 82.0))
    fake_result(runs, "SST-2", "acl_cross_layer", 1, {"accuracy": 81.0}, early_exit=ee(75.0, 81.0))
    fake_result(runs, "SST-2", "ce", 1, {"accuracy": 83.0})  # single exit: no early_exit.json, no row
    monkeypatch.setitem(sys.modules, "acl_fairseq.inference.report", None)  # no plot needed here
    out = tmp_path / "results.md"
    assert collector.main([runs, "--output", str(out)]) == 0
    text = out.read_text()
    assert "SST-2, Acc of every exit" in text
    assert "| method | exit 1 | exit 2 |" in text
    assert "| multi_exit_ce | 71.00 ± 1.41 (n=2) | 81.00 ± 1.41 (n=2) |" in text
    assert "| acl_cross_layer | 75.00 (n=1) | 81.00 (n=1) |" in text
    assert "| ce | 83.00 (n=1) |" in text and "| ce | 83.00 (n=1) | –" not in text
    assert collector.main([runs, "--format", "json", "--output", str(tmp_path / "r.json")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["per_exit"]["SST-2"]["metric"] == "accuracy"
    assert data["per_exit"]["SST-2"]["methods"]["multi_exit_ce"] == {"1": [70.0, 72.0], "2": [80.0, 82.0]}
