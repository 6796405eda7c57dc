"""benchmarks/harness/: what the benchmark scripts share: the clock, the targets' verdict and its printer, the parent
parser and the setup record."""
import harness as H


def test_a_target_passes_on_its_side_of_the_bound_and_without_a_bound_has_no_verdict():
    assert H.target("ratio", 1.8, 1.8)["pass"] is True and H.target("ratio", 1.79, 1.8)["pass"] is False
    assert H.target("p99 / batch 1", 3.0, 3.0, at_least=False)["pass"] is True
    assert H.target("p99 / batch 1", 3.01, 3.0, at_least=False)["pass"] is False
    assert H.target("reported", 0.5, None)["pass"] is None
    assert H.target("x", 2.0, 1.0, config="refill fp32 w1", cpu_value=2.5)["config"] == "refill fp32 w1"


def test_the_printer_names_config_value_bound_and_verdict(capsys):
    H.print_targets([H.target("ratio", 0.73, 0.9, config="refill fp32 w1"),
                     H.target("p99", 2.0, 3.0, at_least=False, cpu_value=1.5), H.target("seen", 1.0, None)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# targets"
    assert "refill fp32 w1: ratio" in lines[1] and "0.730 >= 0.9" in lines[1] and lines[1].split()[-1] == "MISS"
    assert "<= 3.0" in lines[2] and "pass   (cpu 1.500)" in lines[2]
    assert lines[3].rstrip().endswith("-")


def test_the_clock_keeps_wall_and_cpu_time_apart():
    import time

    wall, cpu, out = H.timed(lambda: time.sleep(0.05) or "done")
    assert out == "done" and wall >= 0.05 and cpu < wall  # sleeping takes wall time, next to no CPU time
    seconds, out = H.wall(lambda: sum(range(1000)))
    assert out == 499500 and seconds >= 0


def test_the_machine_record_names_the_cpu_kind_and_the_flags_that_decide_the_kernels():
    from acl_runtime.machine import read_cpu_kind

    got = H.machine()
    kind = read_cpu_kind()
    assert got["cpu_kind"] == kind.describe() and got["cpus"] >= 1
    assert set(got["cpu_flags"]) == {f for f in H.CPU_FLAGS if f in kind.flags}


def test_every_report_row_names_the_cpu_kind(tmp_path, capsys):
    import json

    out = tmp_path / "rows.json"
    H.report([{"system": "a", "ms": 1.0}], ["system", "ms"], {"ms": "{:.1f}"}, str(out))
    assert capsys.readouterr().out.startswith("# cpu: ")
    assert json.loads(out.read_text())[0]["cpu_kind"] == H.machine()["cpu_kind"]


def test_the_parent_parser_refuses_an_existing_json_without_force_naming_the_fix(tmp_path, capsys):
    import pytest

    path = tmp_path / "out.json"
    assert H.parser("doc", json=True).parse_args(["--json", str(path)]).json == str(path)  # not there yet: taken
    path.write_text("earlier")
    with pytest.raises(SystemExit) as e:
        H.parser("doc", json=True).parse_args(["--json", str(path)])
    assert e.value.code == 2 and f"{path} exists: pass --force to replace it" in capsys.readouterr().err
    assert H.parser("doc", json=True).parse_args(["--json", str(path), "--force"]).force
    # a script that fills in a default --json after parsing asks again
    p = H.parser("doc", json="default: out.json")
    args = p.parse_args([])
    args.json = str(path)
    with pytest.raises(SystemExit):
        p.refuse_existing(args)
    assert path.read_text() == "earlier"
    # a --force of a parser without --json (fewshot.py's own) refuses nothing
    p = H.parser("doc")
    p.add_argument("--json")
    assert p.parse_args(["--json", str(path)]).json == str(path)


def test_the_parent_parser_gives_threads_one_spelling_with_the_scripts_default():
    assert H.parser("Doc line.\n\nmore").description == "Doc line."
    assert H.parser("doc", threads=2).parse_args([]).threads == 2
    assert H.parser("doc", threads=[1]).parse_args(["--threads", "1", "2"]).threads == [1, 2]
    assert not hasattr(H.parser("doc").parse_args([]), "threads")
    helps = {a.help for t in (1, 2, [1]) for a in H.parser("doc", threads=t)._actions
             if "--threads" in a.option_strings}
    assert len({h.split(". Several")[0] for h in helps}) == 1


def test_no_entry_script_builds_its_own_parser_or_imports_the_old_harness_module():
    import pathlib

    folder = pathlib.Path(__file__).parents[1] / "benchmarks"
    assert not (folder / "_harness.py").exists()
    entries = [p for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "common"]
    assert len(entries) >= 20
    own = [p.stem for p in entries if "argparse.ArgumentParser(" in p.read_text()]
    old = [p.stem for p in folder.glob("*.py") if "import _harness" in p.read_text()]
    unparented = [p.stem for p in entries if "H.parser(__doc__" not in p.read_text()]
    assert (own, old, unparented) == ([], [], [])


def test_the_setup_record_names_cpu_kind_flags_threads_and_versions_and_the_header_prints_it(tmp_path, capsys):
    import platform

    H.parser("doc", json=True).parse_args(["--json", str(tmp_path / "a b.json")])
    got = H.header("demo", model="minilm", threads=3)
    line = capsys.readouterr().out
    assert got["model"] == "minilm" and got["threads"] == 3 and got["python"] == platform.python_version()
    assert {k: got[k] for k in ("cpu_kind", "cpu_flags")} == {k: H.machine()[k] for k in ("cpu_kind", "cpu_flags")}
    assert "torch" in got and "onnxruntime" in got  # both installed here
    assert line.count("\n") == 1 and line.startswith("# demo: model=minilm; cpu " + got["cpu_kind"])
    assert "threads=3" in line and f"python={got['python']}" in line and f"torch={got['torch']}" in line
    assert line.rstrip().endswith(f"python benchmarks/{__file__.rsplit('/', 1)[-1]} --json '{tmp_path / 'a b.json'}'")
    import torch

    assert H.record()["threads"] == torch.get_num_threads() and H.record(1, toy=True)["toy"] is True


def test_the_setup_record_reads_the_versions_without_importing_torch():
    import pathlib
    import subprocess
    import sys

    code = ("import sys, harness; r = harness.record(); "
            "assert 'torch' not in sys.modules and r['threads'] is None and r['torch'], r")
    benchmarks = pathlib.Path(__file__).parents[1] / "benchmarks"
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(benchmarks), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
