"""benchmarks/harness/: what the benchmark scripts share: the clock, the targets' verdict and its printer, the parent
parser, the setup record and the study pipeline."""
import os

import harness


def test_a_target_passes_on_its_side_of_the_bound_and_without_a_bound_has_no_verdict():
    assert harness.target("ratio", 1.8, 1.8)["pass"] is True and harness.target("ratio", 1.79, 1.8)["pass"] is False
    assert harness.target("p99 / batch 1", 3.0, 3.0, at_least=False)["pass"] is True
    assert harness.target("p99 / batch 1", 3.01, 3.0, at_least=False)["pass"] is False
    assert harness.target("reported", 0.5, None)["pass"] is None
    assert harness.target("x", 2.0, 1.0, config="refill fp32 w1", cpu_value=2.5)["config"] == "refill fp32 w1"


def test_the_printer_names_config_value_bound_and_verdict(capsys):
    harness.print_targets([harness.target("ratio", 0.73, 0.9, config="refill fp32 w1"),
                     harness.target("p99", 2.0, 3.0, at_least=False, cpu_value=1.5), harness.target("seen", 1.0, None)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# targets"
    assert "refill fp32 w1: ratio" in lines[1] and "0.730 >= 0.9" in lines[1] and lines[1].split()[-1] == "MISS"
    assert "<= 3.0" in lines[2] and "pass   (cpu 1.500)" in lines[2]
    assert lines[3].rstrip().endswith("-")


def test_the_clock_keeps_wall_and_cpu_time_apart():
    import time

    wall, cpu, out = harness.timed(lambda: time.sleep(0.05) or "done")
    assert out == "done" and wall >= 0.05 and cpu < wall  # sleeping takes wall time, next to no CPU time
    seconds, out = harness.wall(lambda: sum(range(1000)))
    assert out == 499500 and seconds >= 0


def test_the_clock_syncs_around_the_call_keeps_the_collector_off_and_reads_since_a_start():
    import gc

    calls = []
    wall, cpu, enabled = harness.timed(lambda: calls.append("fn") or gc.isenabled(), sync=lambda: calls.append("sync"),
                                 no_gc=True)
    assert calls == ["sync", "fn", "sync"] and enabled is False and gc.isenabled()
    start = harness.now()
    harness.timed(lambda: sum(range(10000)))
    assert all(x >= 0 for x in harness.since(start))
    try:
        harness.timed(lambda: 1 / 0, no_gc=True)
    except ZeroDivisionError:
        pass
    assert gc.isenabled()  # back on after an error too


def test_one_round_scheduler_rotates_or_shuffles_every_system_once_a_round():
    import random

    import pytest

    rotated = [order for _, order in harness.rounds("abc", 4)]
    assert rotated == [list("abc"), list("bca"), list("cab"), list("abc")]
    shuffled = list(harness.rounds("abcd", 3, "shuffle", seed=5))
    rng, want = random.Random(5), []
    for _ in range(3):
        order = list("abcd")
        rng.shuffle(order)
        want.append(order)
    assert [r for r, _ in shuffled] == [0, 1, 2] and [o for _, o in shuffled] == want
    assert all(sorted(o) == list("abcd") for o in want) and len({tuple(o) for o in want}) > 1
    with pytest.raises(ValueError, match="rotate, shuffle"):
        list(harness.rounds("ab", 1, "random"))


def test_the_benchmarks_read_time_through_the_harness_clock_and_schedule_rounds_through_it():
    """One clock and one round scheduler: no benchmark module reads a clock of its own (load/client.py is the one
    exception: it runs by path as its own process, and its clock is its schedule of arrivals) or rotates or
    shuffles its rounds itself."""
    import pathlib
    import re

    folder = pathlib.Path(__file__).parents[2] / "benchmarks"
    clock = re.compile(r"time\.(perf_counter|time|monotonic|process_time)\(\)|\bTimer\(|latency import clock")
    rounds = re.compile(r"% len\(\w+\)\n?\s*.*\[k:\] \+|rng\.shuffle\(order\)")
    own = {("harness", "clock.py"), ("load", "client.py")}
    found = [str(p.relative_to(folder)) for p in folder.rglob("*.py")
             if p.parts[-2:] not in own and (clock.search(p.read_text()) or rounds.search(p.read_text()))]
    assert found == []


def test_the_machine_record_names_the_cpu_kind_and_the_flags_that_decide_the_kernels():
    from acl_torch.machine import read_cpu_kind

    got = harness.machine()
    kind = read_cpu_kind()
    assert got["cpu_kind"] == kind.describe() and got["cpus"] >= 1
    assert set(got["cpu_flags"]) == {f for f in harness.CPU_FLAGS if f in kind.flags}


def test_every_report_row_names_the_cpu_kind(tmp_path, capsys):
    import json

    out = tmp_path / "rows.json"
    harness.report([{"system": "a", "ms": 1.0}], ["system", "ms"], {"ms": "{:.1f}"}, str(out))
    assert capsys.readouterr().out.startswith("# cpu: ")
    assert json.loads(out.read_text())[0]["cpu_kind"] == harness.machine()["cpu_kind"]


def test_the_parent_parser_refuses_an_existing_json_without_force_naming_the_fix(tmp_path, capsys):
    import pytest

    path = tmp_path / "out.json"
    assert harness.parser("doc", json=True).parse_args(["--json", str(path)]).json == str(path)  # not there yet: taken
    path.write_text("earlier")
    with pytest.raises(SystemExit) as e:
        harness.parser("doc", json=True).parse_args(["--json", str(path)])
    assert e.value.code == 2 and f"{path} exists: pass --force to replace it" in capsys.readouterr().err
    assert harness.parser("doc", json=True).parse_args(["--json", str(path), "--force"]).force
    # a script that fills in a default --json after parsing asks again
    p = harness.parser("doc", json="default: out.json")
    args = p.parse_args([])
    args.json = str(path)
    with pytest.raises(SystemExit):
        p.refuse_existing(args)
    assert path.read_text() == "earlier"
    # a --force of a parser without --json (fewshot.py's own) refuses nothing
    p = harness.parser("doc")
    p.add_argument("--json")
    assert p.parse_args(["--json", str(path)]).json == str(path)


def test_the_parent_parser_gives_threads_one_spelling_with_the_scripts_default():
    assert harness.parser("Doc line.\n\nmore").description == "Doc line."
    assert harness.parser("doc", threads=2).parse_args([]).threads == 2
    assert harness.parser("doc", threads=[1]).parse_args(["--threads", "1", "2"]).threads == [1, 2]
    assert not hasattr(harness.parser("doc").parse_args([]), "threads")
    helps = {a.help for t in (1, 2, [1]) for a in harness.parser("doc", threads=t)._actions
             if "--threads" in a.option_strings}
    assert len({h.split(". Several")[0] for h in helps}) == 1


def test_no_entry_script_builds_its_own_parser_or_imports_the_old_harness_module():
    import pathlib

    folder = pathlib.Path(__file__).parents[2] / "benchmarks"
    assert not (folder / "_harness.py").exists()
    entries = [p for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "common"]
    assert len(entries) >= 20
    own = [p.stem for p in entries if "argparse.ArgumentParser(" in p.read_text()]
    old = [p.stem for p in folder.glob("*.py") if "import _harness" in p.read_text()]
    unparented = [p.stem for p in entries if "harness.parser(__doc__" not in p.read_text()]
    assert (own, old, unparented) == ([], [], [])


def test_the_setup_record_names_cpu_kind_flags_threads_and_versions_and_the_header_prints_it(tmp_path, capsys):
    import platform

    harness.parser("doc", json=True).parse_args(["--json", str(tmp_path / "a b.json")])
    got = harness.header("demo", model="minilm", threads=3)
    line = capsys.readouterr().out
    assert got["model"] == "minilm" and got["threads"] == 3 and got["python"] == platform.python_version()
    assert {k: got[k] for k in ("cpu_kind", "cpu_flags")} == {k: harness.machine()[k]
                                                               for k in ("cpu_kind", "cpu_flags")}
    assert "torch" in got and "onnxruntime" in got  # both installed here
    assert line.count("\n") == 1 and line.startswith("# demo: model=minilm; cpu " + got["cpu_kind"])
    assert "threads=3" in line and f"python={got['python']}" in line and f"torch={got['torch']}" in line
    assert line.rstrip().endswith(f"python benchmarks/{__file__.rsplit('/', 1)[-1]} --json '{tmp_path / 'a b.json'}'")
    import torch

    assert harness.record()["threads"] == torch.get_num_threads() and harness.record(1, toy=True)["toy"] is True


def test_the_setup_record_reads_the_versions_without_importing_torch():
    import pathlib
    import subprocess
    import sys

    code = ("import sys, harness; r = harness.record(); "
            "assert 'torch' not in sys.modules and r['threads'] is None and r['torch'], r")
    benchmarks = pathlib.Path(__file__).parents[2] / "benchmarks"
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(benchmarks), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---- the study pipeline (harness/study.py), on tiny fake run functions: no training ------------------------------

def test_the_study_grid_runs_seed_major_or_cell_major_one_block_after_the_other():
    import pytest

    cells = [(20, "ce"), (20, "scl"), (100, "ce"), (100, "scl")]
    assert harness.grid(cells[:2], [1, 2]) == [((20, "ce"), 1), ((20, "scl"), 1), ((20, "ce"), 2), ((20, "scl"), 2)]
    assert harness.grid(cells[:2], [1, 2], "cell-major") == [((20, "ce"), 1), ((20, "ce"), 2), ((20, "scl"), 1),
                                                       ((20, "scl"), 2)]
    by_n = harness.grid(cells, [1, 2], "seed-major", block=lambda c: c[0])
    assert [(c[0], s) for c, s in by_n] == [(20, 1), (20, 1), (20, 2), (20, 2), (100, 1), (100, 1), (100, 2), (100, 2)]
    assert [c for c, s in by_n][:2] == [(20, "ce"), (20, "scl")]
    assert harness.grid(cells, [1, 2], "seed-major")[:4] == [((20, "ce"), 1), ((20, "scl"), 1), ((100, "ce"), 1),
                                                      ((100, "scl"), 1)]
    with pytest.raises(ValueError, match="seed-major"):
        harness.grid(cells, [1], "random")


def _fake_study(tmp_path, lines=None):
    """A study of fake runs: each writes score.json = {cell, seed, acc} into WORK/toy/<cell>/seed<s>."""
    import json

    study = harness.Study("toy", str(tmp_path / "work"), str(tmp_path / "results" / "runs"), result="score.json",
                    log=(lines.append if lines is not None else lambda m: None))
    trained = []

    def run_one(cell, seed):
        rd = study.root(cell, f"seed{seed}")

        def train():
            trained.append((cell, seed))
            os.makedirs(rd, exist_ok=True)
            with open(os.path.join(rd, "score.json"), "w") as f:
                json.dump({"cell": cell, "seed": seed, "acc": 10.0 * seed + len(cell)}, f)
        return study.result_or_train(rd, train)[1]
    return study, run_one, trained


def test_a_study_runs_every_cell_and_seed_once_with_progress_lines_and_skips_a_recorded_run(tmp_path):
    import shutil

    lines = []
    study, run_one, trained = _fake_study(tmp_path, lines)
    plan = harness.grid(["a", "bb"], [1, 2])
    got = study.run(plan, run_one, label=lambda c, s: f"{c} seed {s}")
    assert trained == [("a", 1), ("bb", 1), ("a", 2), ("bb", 2)] and [g["acc"] for g in got] == [11, 12, 21, 22]
    assert [line.split(" (elapsed")[0] for line in lines] == ["[1/4] a seed 1", "[2/4] bb seed 1", "[3/4] a seed 2",
                                                              "[4/4] bb seed 2"]
    assert all(line.endswith("s)") for line in lines)
    # every finished run has its record; with the work folder gone, a second pass trains nothing
    assert (tmp_path / "results" / "runs" / "toy" / "bb" / "seed2" / "score.json").is_file()
    shutil.rmtree(tmp_path / "work")
    trained.clear()
    assert [g["acc"] for g in study.run(plan + [("a", 3)], run_one)] == [11, 12, 21, 22, 31]
    assert trained == [("a", 3)]


def test_a_study_collects_every_result_from_the_records_after_the_work_folder_is_gone(tmp_path):
    import shutil

    study, run_one, _ = _fake_study(tmp_path)
    for cell, seed in harness.grid(["a", "bb"], [2, 1]):
        run_one(cell, seed)
    # a run finished in the work folder but never recorded (stopped before its record): collect records it first
    lines = []
    study.log = lines.append
    shutil.rmtree(tmp_path / "results" / "runs" / "toy" / "a" / "seed2")
    assert len(study.collect()) == 4 and lines[0].startswith("records: 1 written from ")
    shutil.rmtree(tmp_path / "work")
    runs = study.collect(key=lambda r: (r["cell"], r["seed"]))
    assert [(r["cell"], r["seed"]) for r in runs] == [("a", 1), ("a", 2), ("bb", 1), ("bb", 2)]


def test_the_paired_summary_takes_the_seeds_both_cells_have_and_leaves_a_cell_without_base_out():
    import pytest

    def run(n, method, seed, acc):
        return {"n": n, "method": method, "seed": seed, "acc": acc, "steps": seed * 10}

    runs = [run(8, "ce", 1, 50.0), run(8, "ce", 2, 60.0), run(8, "ce", 3, 70.0),
            run(8, "scl", 2, 61.0), run(8, "scl", 3, 73.0), run(8, "scl", 4, 99.0),
            run(16, "scl", 1, 80.0), run(8, "acl", 3, 75.0)]
    declared = [(n, m) for n in (8, 16) for m in ("ce", "scl", "acl", "none")]
    cells = harness.summarize_cells(runs, ("n", "method"), declared, ["acc"], lists=["steps"])
    assert [(c["n"], c["method"]) for c in cells] == [(8, "ce"), (8, "scl"), (8, "acl"), (16, "scl")]
    ce = cells[0]
    assert list(ce) == ["n", "method", "num_seeds", "seeds", "acc_mean", "acc_std", "acc", "steps"]
    assert ce["seeds"] == [1, 2, 3] and ce["acc_mean"] == 60.0 and ce["acc_std"] == pytest.approx(10.0)
    assert cells[3]["acc_std"] is None  # one seed: no spread
    pairs = harness.paired_cells(cells, ("n", "method"), "method", "ce", "acc", diffs="delta_vs_ce")
    assert [(p["n"], p["method"], p["base"]) for p in pairs] == [(8, "scl", "ce"), (8, "acl", "ce")]  # N=16: no ce
    scl = pairs[0]
    assert scl["seeds"] == [2, 3] and scl["delta_vs_ce"] == [1.0, 3.0]  # seed 1 (ce only) and 4 (scl only) left out
    assert scl["mean"] == 2.0 and scl["ahead"] == 2 and scl["ci95"][0] < 2.0 < scl["ci95"][1]
    assert scl["verdict"] == "within noise (n = 2)" and "diffs" not in scl
    assert pairs[1]["seeds"] == [3] and pairs[1]["ci95"] == [None, None] and pairs[1]["std"] is None
    only = harness.paired_cells(cells, ("n", "method"), "method", "scl", "acc", only=["acl"], diffs="delta")
    assert [(p["method"], p["base"], p["seeds"], p["delta"]) for p in only] == [("acl", "scl", [3], [2.0])]
    assert harness.paired(cells[0], {"seeds": [9], "acc": [1.0]}, "acc") is None


def test_the_study_outputs_are_written_whole_or_not_at_all(tmp_path):
    import json

    import matplotlib
    import pytest

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def plot(summary, path):
        fig, ax = plt.subplots()
        ax.plot(summary["x"], summary["x"])
        harness.save_figure(fig, path)

    paths = harness.write_outputs(str(tmp_path / "out"), "toy", {"x": [1, 2]}, "| a |\n", plot)
    assert [os.path.basename(p) for p in paths] == ["toy.json", "toy.md", "toy.png"]
    assert json.loads((tmp_path / "out" / "toy.json").read_text()) == {"x": [1, 2]}
    assert (tmp_path / "out" / "toy.md").read_text() == "| a |\n"
    assert (tmp_path / "out" / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def broken(summary, path):  # a plot that fails halfway leaves the earlier PNG, and no partial file beside it
        fig, _ = plt.subplots()

        def half(tmp, **kw):
            open(tmp, "wb").write(b"\x89PNG half")
            raise RuntimeError("disk full")
        fig.savefig = half
        harness.save_figure(fig, path)

    before = (tmp_path / "out" / "toy.png").read_bytes()
    with pytest.raises(RuntimeError, match="disk full"):
        harness.write_outputs(str(tmp_path / "out"), "toy", {"x": [3]}, "| b |\n", broken)
    assert (tmp_path / "out" / "toy.png").read_bytes() == before
    assert sorted(os.listdir(tmp_path / "out")) == ["toy.json", "toy.md", "toy.png"]
    assert json.loads((tmp_path / "out" / "toy.json").read_text()) == {"x": [3]}


def test_no_benchmark_module_imports_a_module_under_a_one_or_two_letter_alias():
    """``import harness``, ``import _records``: the name a reader can follow, not ``H`` or ``R`` (torch's
    ``functional as F`` and numpy's ``np`` are the conventions kept)."""
    import pathlib
    import re

    folder = pathlib.Path(__file__).parents[2] / "benchmarks"
    alias = re.compile(r"^\s*(?:from \S+ )?import (\S+) as ([A-Za-z]{1,2})\b", re.M)
    found = [(str(p.relative_to(folder)), m.group(1), m.group(2)) for p in folder.rglob("*.py")
             for m in alias.finditer(p.read_text()) if m.group(1) not in ("torch.nn.functional", "numpy")]
    assert found == []


def test_every_record_table_and_json_is_written_through_the_harness_writer(tmp_path):
    """One writer (harness.write_json, harness.write_text): no benchmark module writes its results through the
    atomic module or a writer of its own (load/client.py runs by path, as its own process, and writes its records
    itself)."""
    import json
    import pathlib
    import re

    folder = pathlib.Path(__file__).parents[2] / "benchmarks"
    own = re.compile(r"atomic\.write_(json|text)\(|def write_atomic\(|\bwrite_atomic\(")
    found = [str(p.relative_to(folder)) for p in folder.rglob("*.py")
             if p.parts[-2:] not in {("harness", "outputs.py"), ("load", "client.py")} and own.search(p.read_text())]
    assert found == []
    harness.write_json(str(tmp_path / "a" / "b.json"), {"x": [1, 2]}, sort_keys=True)
    assert (tmp_path / "a" / "b.json").read_text() == '{\n "x": [\n  1,\n  2\n ]\n}\n'
    harness.write_json(str(tmp_path / "c.json"), {"b": 1, "a": 2}, indent=None)
    assert json.loads((tmp_path / "c.json").read_text()) == {"b": 1, "a": 2}
    harness.write_text(str(tmp_path / "t.md"), "table\n")
    assert (tmp_path / "t.md").read_text() == "table\n"
