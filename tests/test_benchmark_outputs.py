"""Every benchmark that writes ``--json`` keeps an existing file unless ``--force`` is given, and says so before any
work (benchmarks/_records.py: add_json_flags, refuse_existing)."""
import importlib

import pytest

# the script, and the arguments it needs besides --json to get past its parser
SCRIPTS = {"early_exit_latency": [], "hf_speed": [], "int8_portability": ["--folder", "x"], "optimizer_time": [],
           "predict_speed": [], "preprocess_speed": [], "step_time": [], "int8_static": [], "serve_speed": [],
           "serve_load": [], "ort_fusions": []}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_an_existing_json_is_kept_without_force(name, tmp_path, capsys):
    module = importlib.import_module(name)
    path = tmp_path / "results.json"
    path.write_text("earlier results")
    entry = getattr(module, "parse_args", None) or module.main
    with pytest.raises(SystemExit) as e:
        entry(["--json", str(path), *SCRIPTS[name]])
    assert e.value.code == 2 and f"{path} exists: pass --force to replace it" in capsys.readouterr().err
    assert path.read_text() == "earlier results"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_force_is_in_help(name, capsys):
    module = importlib.import_module(name)
    entry = getattr(module, "parse_args", None) or module.main
    with pytest.raises(SystemExit):
        entry(["--help"])
    assert "--force" in capsys.readouterr().out
