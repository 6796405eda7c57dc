"""Every benchmark that writes ``--json`` keeps an existing file unless ``--force`` is given, and says so before any
work (the harness's parent parser, benchmarks/harness/cli.py); every entry script's --help runs."""
import importlib
import pathlib

import pytest

# the script, and the arguments it needs besides --json to get past its parser
SCRIPTS = {"dev_lengths": [], "early_exit_latency": [], "hf_speed": [], "int8_portability": ["--folder", "x"],
           "optimizer_time": [], "predict_speed": [], "preprocess_speed": [], "step_time": [], "int8_static": [],
           "serve_speed": [], "serve_load": [], "ort_fusions": [], "serve_hey": [], "serve_stop": ["--folder", "x"],
           "serve_ideal": [], "serve_faults": ["--folder", "x"], "serve_deadlines": [], "gemm_roofline": [],
           "serve_cpu_split": ["x"]}
ENTRIES = sorted(p.stem for p in (pathlib.Path(__file__).parents[2] / "benchmarks").glob("*.py")
                 if not p.stem.startswith("_") and p.stem != "common")


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


@pytest.mark.parametrize("name", ENTRIES)
def test_every_entry_scripts_help_runs_and_shows_json_and_force_where_it_writes_json(name, capsys):
    assert len(ENTRIES) >= 20 and set(SCRIPTS) <= set(ENTRIES)
    module = importlib.import_module(name)
    build = getattr(module, "build_parser", None)
    entry = build().parse_args if build else getattr(module, "parse_args", None) or module.main
    with pytest.raises(SystemExit) as e:
        entry(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith(f"usage: {name}.py ")
    assert ("--json PATH" in out and "--force" in out) == (name in SCRIPTS), out
