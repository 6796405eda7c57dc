"""acl_runtime.io.atomic, the one home of atomic files and folders, and acl-export's use of it: a fault injected between
every two steps of a replace (standing for a signal at that instant) leaves the old folder or the new one whole,
never neither; temporaries of killed runs are removed by the next run, and a live run's are kept."""
import ast
import os
import subprocess
import sys

import pytest

from acl_fairseq.hf import export
from acl_runtime.io import atomic


class Fault(Exception):
    pass


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _folder(path, text):
    os.makedirs(path, exist_ok=True)
    for name in ("a.onnx", "b.onnx"):
        with open(os.path.join(path, name), "w") as f:
            f.write(f"{text} {name}")


def _content(path):
    if not os.path.isdir(path):
        return None
    return {n: open(os.path.join(path, n)).read() for n in sorted(os.listdir(path))}


OLD = {"a.onnx": "old a.onnx", "b.onnx": "old b.onnx"}
NEW = {"a.onnx": "new a.onnx", "b.onnx": "new b.onnx"}


@pytest.fixture(params=["exchange", "two-renames"])
def swap(request, monkeypatch):
    if request.param == "exchange":
        if atomic._exchange is None:
            pytest.fail("renameat2 is not available on this Linux: the two-renames case still covers the replace")
    else:
        monkeypatch.setattr(atomic, "_exchange", None)
    return request.param


def _faulting(monkeypatch, fault_at, error=Fault):
    """Raise ``error`` at the ``fault_at``-th step: every rename or replace, and every step the module marks."""
    count = [0]

    def tick():
        count[0] += 1
        if count[0] == fault_at:
            raise error()

    def wrap(fn):
        def wrapped(*a, **k):
            tick()
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(os, "rename", wrap(os.rename))
    monkeypatch.setattr(os, "replace", wrap(os.replace))
    monkeypatch.setattr(atomic, "_step", lambda name: tick())
    return count


def test_a_folder_replace_interrupted_at_any_step_leaves_the_old_or_the_new(tmp_path, monkeypatch, swap):
    outcomes = set()
    for fault_at in range(1, 20):
        base = tmp_path / str(fault_at)
        _folder(base / "onnx", "old")
        with monkeypatch.context() as m:
            count = _faulting(m, fault_at)
            try:
                with atomic.staging_folder(str(base / "onnx")) as tmp:
                    _folder(tmp, "new")
            except Fault:
                pass
        after = _content(base / "onnx")
        assert after in (OLD, NEW), (fault_at, after)
        outcomes.add("new" if after == NEW else "old")
        if count[0] < fault_at:  # every step passed: the replace is complete
            assert sorted(os.listdir(base)) == ["onnx"]
            break
    else:
        pytest.fail("the replace never ran to the end")
    assert outcomes == {"old", "new"}


def test_export_force_interrupted_between_its_renames_keeps_an_export(tmp_path, monkeypatch, swap):
    """Case 4: acl-export --force moved OUT/onnx into the temporary folder and then removed that folder, so a
    SIGTERM between the two renames left OUT without either export."""
    for fault_at in range(1, 20):
        out = tmp_path / str(fault_at)
        _folder(out / "onnx", "old")
        with monkeypatch.context() as m:
            count = _faulting(m, fault_at, export._Terminated)
            try:
                export.write_atomically(str(out), True, lambda tmp: _folder(os.path.join(tmp, "onnx"), "new"))
            except SystemExit as e:
                assert e.code == 143
        assert _content(out / "onnx") in (OLD, NEW), (fault_at, os.listdir(out))
        if count[0] < fault_at:
            assert _content(out / "onnx") == NEW and os.listdir(out) == ["onnx"]
            return
    pytest.fail("the export never ran to the end")


def test_an_export_removes_the_temporaries_of_killed_runs_only(tmp_path):
    """Case 5: .export.tmp-* folders left by a SIGKILL stayed forever. A live run's are kept."""
    out = tmp_path / "out"
    dead, live = _dead_pid(), os.getppid()
    for name in (f".export.tmp-{dead}-ab12cd34", f".export.tmp-{live}-ab12cd34", ".export.tmp-x7k2_q9z"):
        _folder(out / name, "partial")
    past = atomic.RUN_START - 60
    os.utime(out / ".export.tmp-x7k2_q9z", (past, past))  # written before this run, by a run without pids
    (out / f"notes.tmp{dead}").write_text("the user's")  # another name: not the export's to remove
    export.write_atomically(str(out), True, lambda tmp: _folder(os.path.join(tmp, "onnx"), "new"))
    assert sorted(os.listdir(out)) == [f".export.tmp-{live}-ab12cd34", f"notes.tmp{dead}", "onnx"]


def test_an_old_folder_of_a_run_killed_between_two_renames_is_put_back(tmp_path):
    dead = _dead_pid()
    _folder(tmp_path / f".onnx.old-{dead}-0a1b2c3d", "old")
    _folder(tmp_path / f".onnx.tmp-{dead}-0a1b2c3d", "new")
    assert len(atomic.clean_stale(str(tmp_path))) == 2
    assert os.listdir(tmp_path) == ["onnx"] and _content(tmp_path / "onnx") == OLD


def test_a_file_write_is_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "exit_policy.json"
    path.write_text("old\n")
    with pytest.raises(Fault):
        with atomic.writing(str(path)) as f:
            f.write("half")
            raise Fault()
    monkeypatch.setattr(atomic, "_step", lambda name: (_ for _ in ()).throw(Fault()))
    with pytest.raises(Fault):
        atomic.write_text(str(path), "new\n")
    assert os.listdir(tmp_path) == ["exit_policy.json"] and path.read_text() == "old\n"
    monkeypatch.undo()
    atomic.write_json(str(path), {"policy": "entropy"})
    assert path.read_text() == '{\n "policy": "entropy"\n}\n'
    with pytest.raises(FileExistsError):
        atomic.write_text(str(path), "x", force=False)


def test_a_file_write_removes_a_dead_runs_temporary_of_that_file(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".p.tsv.tmp-{dead}-0a1b2c3d").write_text("partial")
    (tmp_path / f".other.tsv.tmp-{dead}-0a1b2c3d").write_text("partial")
    (tmp_path / f"p.tsv.tmp{dead}").write_text("partial")  # acl-predict's --output temporary
    (tmp_path / f"p.tsv.tmp{os.getppid()}").write_text("a live run's")
    atomic.write_text(str(tmp_path / "p.tsv"), "x\n")
    assert sorted(os.listdir(tmp_path)) == [f".other.tsv.tmp-{dead}-0a1b2c3d", "p.tsv", f"p.tsv.tmp{os.getppid()}"]


def test_the_module_imports_the_standard_library_only():
    """The serving path (acl-predict OUT/onnx, without torch or fairseq) writes through it."""
    tree = ast.parse(open(atomic.__file__).read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names and names <= set(sys.stdlib_module_names), names
