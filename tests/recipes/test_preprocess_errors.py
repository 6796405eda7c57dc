"""preprocess/glue.py on bad input and interrupted runs: a clear error with ``file:line`` that leaves nothing
behind, a failed rerun that keeps the complete output, an unwritable folder, SIGTERM mid-run."""
import os
import subprocess
import sys

import pytest

from helpers import REPO, tool
from toy_glue import make_assets, make_task, run_main, stats_of, tok_args


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


# ------------------------------------------------------------------ errors


def _break(folder, stem, lineno, new_line):
    path = os.path.join(folder, stem + ".tsv")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    lines[lineno - 1] = new_line
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


BREAKAGES = {
    "wrong_columns": (lambda d: _break(d, "train", 5, "4\ta\tb\tentailment\textra"),
                      "train.tsv:5: expected 4 tab-separated fields, found 5"),
    "unknown_label": (lambda d: _break(d, "dev", 3, "1\ta b\tc d\tmaybe"), "dev.tsv:3: unknown label 'maybe'"),
    "empty_file": (lambda d: open(os.path.join(d, "train.tsv"), "w").close(), "train.tsv: empty file"),
    "missing_split": (lambda d: os.remove(os.path.join(d, "dev.tsv")), "dev.tsv: missing split"),
    "missing_test": (lambda d: os.remove(os.path.join(d, "test.tsv")), "--skip-test"),
    "wrong_task_header": (lambda d: _break(d, "train", 1, "index\tsentence1\tsentence2\tQuality"),
                          "train.tsv:1: header column 4"),
}


@pytest.mark.parametrize("case", list(BREAKAGES))
def test_bad_input_is_a_clear_error_and_leaves_nothing(tmp_path, assets, capsys, case):
    folder, _ = make_task(tmp_path, "RTE")
    breaker, expected = BREAKAGES[case]
    breaker(folder)
    os.makedirs(tmp_path / "out")
    rc = run_main("RTE", folder, tmp_path / "out" / "bin", *tok_args("wordpiece", assets))
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and "Fix:" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "out" / "bin") and os.listdir(tmp_path / "out") == []


def test_skip_test_goes_without_test_tsv(tmp_path, assets):
    folder, _ = make_task(tmp_path, "RTE")
    os.remove(os.path.join(folder, "test.tsv"))
    assert run_main("RTE", folder, tmp_path / "bin", *tok_args("wordpiece", assets), "--skip-test") == 0
    assert set(stats_of(tmp_path / "bin")["splits"]) == {"train", "valid"}


# a subprocess each, 6 s idle: make test keeps the console script; the checkout's path is slow (the same main,
# whose errors the in-process tests above check)
@pytest.mark.parametrize("command", [pytest.param("path", marks=pytest.mark.slow), "console script"])
def test_missing_folder_and_cli_exit_code(tmp_path, command):
    """Both ways to start it: ``python preprocess/glue.py`` from a checkout, and ``acl-preprocess``."""
    start = {"path": [sys.executable, os.path.join(REPO, "preprocess", "glue.py")],
             "console script": [tool("acl-preprocess")]}[command]
    proc = subprocess.run(
        [*start, "--task", "rte", "--input", str(tmp_path / "nope"),
         "--output", str(tmp_path / "bin"), "--tokenizer", "wordpiece", "--vocab", "v.txt"],
        capture_output=True, text=True, cwd=str(tmp_path),
    )
    assert proc.returncode == 2 and "nope: no such folder" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "bin").exists()


def test_failed_rerun_keeps_complete_output(tmp_path, assets, capsys):
    folder, _ = make_task(tmp_path, "RTE")
    out = tmp_path / "bin"
    assert run_main("RTE", folder, out, *tok_args("wordpiece", assets)) == 0
    before = {p: (out / p).read_bytes() for p in ("stats.json", "input0/train.bin", "label/dict.txt")}
    assert run_main("RTE", folder, out, *tok_args("wordpiece", assets)) == 2
    assert "output exists" in capsys.readouterr().err
    _break(folder, "train", 3, "broken")
    assert run_main("RTE", folder, out, *tok_args("wordpiece", assets), "--force") == 2
    assert {p: (out / p).read_bytes() for p in before} == before
    assert sorted(os.listdir(tmp_path)) == ["RTE", "bin"]
    make_task(tmp_path, "RTE", seed=5)  # repaired input: --force replaces the old output
    assert run_main("RTE", folder, out, *tok_args("wordpiece", assets), "--force") == 0
    assert (out / "input0" / "train.bin").read_bytes() != before["input0/train.bin"]
    assert sorted(os.listdir(tmp_path)) == ["RTE", "bin"]


# ------------------------------------------------------------------ an unwritable output, SIGTERM


def test_output_in_an_unwritable_folder_is_one_line_and_exit_status_2(tmp_path, assets, capsys):
    import helpers

    folder, _ = make_task(tmp_path, "RTE")
    out = os.path.join(helpers.unwritable_folder(tmp_path), "new", "bin")
    rc = run_main("RTE", folder, out, *tok_args("wordpiece", assets))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert f"{out}: cannot write there" in line and "Fix: choose an --output" in line


def test_sigterm_mid_run_removes_the_temporary_folder(tmp_path, assets):
    """What schedulers and `timeout` send: the hidden .bin.tmp-PID-* folder goes, as on Ctrl-C (exit 143)."""
    import glob
    import signal
    import time

    folder, _ = make_task(tmp_path, "SST-2", n=(100000, 12, 6))
    out = tmp_path / "bin"
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "preprocess", "glue.py"), "--task", "SST-2", "--input",
                             folder, "--output", str(out), "--workers", "2", *tok_args("wordpiece", assets)],
                            env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not glob.glob(str(tmp_path / f".bin.tmp-{proc.pid}-*" / ".text" / "train.input0")):  # tokenizing: mid-run
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be stopped"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 143, err[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["SST-2"], "no temporary folder, no output"


def test_a_killed_runs_temporary_folder_goes_at_the_next_run(tmp_path, assets):
    """A SIGKILL leaves .bin.tmp-PID-* (nothing can remove it then): the next run removes it, and keeps a live
    run's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder, _ = make_task(tmp_path, "RTE")
    stale, live = tmp_path / f".bin.tmp-{dead.pid}-0a1b2c3d", tmp_path / f".bin.tmp-{os.getppid()}-0a1b2c3d"
    for partial in (stale, live):
        (partial / ".text").mkdir(parents=True)
    assert run_main("RTE", folder, tmp_path / "bin", *tok_args("wordpiece", assets)) == 0
    assert sorted(os.listdir(tmp_path)) == [live.name, "RTE", "bin"]
