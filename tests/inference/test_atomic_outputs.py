"""Every command writes through acl_runtime.io.atomic: acl-evaluate's own outputs
(early_exit.json, .csv, .png, the test predictions) are whole or absent; a run that fails while writing one keeps
the previous file, and leaves no temporary."""
import json
import os

import pytest

import helpers
from acl_fairseq.cli import evaluate
from acl_fairseq.inference import report


def _evaluate(predict_run, out):
    _, data, ckpt = predict_run
    return evaluate.main([ckpt, data, "--output", str(out), "--policy", "entropy", "--thresholds", "0.3",
                          "--timing-examples", "0", "--device", "cpu"])


class Fault(Exception):
    pass


def test_acl_evaluate_failing_while_writing_keeps_each_previous_output(predict_run, tmp_path, monkeypatch):
    out = tmp_path / "ee"
    _evaluate(predict_run, out)
    names = ["early_exit.csv", "early_exit.json", "early_exit.png"]
    assert sorted(os.listdir(out)) == names
    before = {n: (out / n).read_bytes() for n in names}
    assert json.loads(before["early_exit.json"])["settings"]

    def half_csv(result, path):
        with open(path, "w") as f:
            f.write("policy,thre")
        raise Fault()

    monkeypatch.setattr(report, "write_csv", half_csv)
    with pytest.raises(Fault):
        _evaluate(predict_run, out)
    assert sorted(os.listdir(out)) == names and (out / "early_exit.csv").read_bytes() == before["early_exit.csv"]
    monkeypatch.undo()

    def half_png(result, path):
        with open(path, "wb") as f:
            f.write(b"\x89PNG")
        raise Fault()

    monkeypatch.setattr(report, "plot_result", half_png)
    with pytest.raises(Fault):
        _evaluate(predict_run, out)
    assert sorted(os.listdir(out)) == names and (out / "early_exit.png").read_bytes() == before["early_exit.png"]


def test_the_only_rename_into_place_is_the_atomic_writers():
    """A temporary file renamed over the result is acl_runtime.io.atomic's job alone (fsync, stale temporaries of
    killed runs removed, the folder swap): no other module, script or benchmark renames files into place."""
    import ast
    import pathlib

    home = pathlib.Path(helpers.REPO, "acl_runtime", "io", "atomic.py")
    found = []
    for folder in ("acl_runtime", "acl_fairseq", "benchmarks", "recipes", "scripts", "preprocess"):
        for path in pathlib.Path(helpers.REPO, folder).rglob("*.py"):
            if path == home:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in ("replace", "rename") and getattr(node.func.value, "id", "") == "os":
                    found.append(f"{path.relative_to(helpers.REPO)}:{node.lineno}")
    assert not found, found
