"""tests/prebuilt.py, the background builder of the session's trained models: what it builds, in which order, and
that a fixture gets its model whether the background process built it, failed on it or is gone."""
import os
import shutil
import subprocess
import sys

import pytest

import prebuilt


class _Item:
    def __init__(self, *names):
        self.fixturenames = list(names)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Two builders that record their calls; the background state reset after the test."""
    calls = []

    def good(root):
        calls.append(("good", str(root)))
        (root / "model.txt").write_text("trained")
        return {"root": root, "pair": ("a", "b")}

    def bad(root):
        calls.append(("bad", str(root)))
        raise RuntimeError("fairseq-train failed")

    monkeypatch.setitem(prebuilt.BUILDERS, "good", good)
    monkeypatch.setitem(prebuilt.BUILDERS, "bad", bad)
    monkeypatch.delenv(prebuilt.SHARED, raising=False)  # make test's own workers share one: not these tests'
    for attr in ("root", "proc", "pid", "names"):
        monkeypatch.setattr(prebuilt._Background, attr, getattr(prebuilt._Background, attr))
    return calls


class _Factory:
    def __init__(self, base):
        self.base, self.made = base, []

    def mktemp(self, name):
        path = self.base / f"{name}{len(self.made)}"
        path.mkdir()
        self.made.append(path)
        return path


def test_main_pickles_each_model_whole_and_marks_a_failure(fake, tmp_path):
    assert prebuilt.main([str(tmp_path), "bad", "good"]) == 0
    assert [name for name, _ in fake] == ["bad", "good"]  # a failure does not stop the others
    assert "fairseq-train failed" in (tmp_path / "bad.failed").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "bad.failed", "good", "good.pickle"]
    assert (tmp_path / "good" / "model.txt").read_text() == "trained"


def test_a_fixture_reads_the_background_model_and_builds_a_failed_one_itself(fake, tmp_path):
    root = tmp_path / "bg"
    root.mkdir()
    prebuilt.main([str(root), "good", "bad"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    prebuilt._Background.root, prebuilt._Background.proc, prebuilt._Background.names = str(root), done, ["good", "bad"]
    factory = _Factory(tmp_path)
    got = prebuilt.get("good", factory)
    assert got == {"root": root / "good", "pair": ("a", "b")} and factory.made == []  # nothing built again
    calls = len(fake)
    with pytest.raises(RuntimeError, match="fairseq-train failed"):  # its error, raised where the model is used
        prebuilt.get("bad", factory)
    assert fake[calls:] == [("bad", str(factory.made[0]))]


def test_a_fixture_builds_its_model_when_the_background_process_is_gone(fake, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(9)"])
    gone.wait()
    prebuilt._Background.root, prebuilt._Background.proc, prebuilt._Background.names = str(tmp_path), gone, ["good"]
    factory = _Factory(tmp_path)
    got = prebuilt.get("good", factory)
    assert got["root"] == factory.made[0] and (factory.made[0] / "model.txt").exists()


def test_start_builds_what_the_collected_tests_use_first_used_first(monkeypatch):
    started = []
    monkeypatch.setattr(prebuilt.subprocess, "Popen", lambda argv, **kw: started.append(argv) or "proc")
    monkeypatch.delenv(prebuilt.SHARED, raising=False)
    for attr in ("root", "proc", "pid", "names"):
        monkeypatch.setattr(prebuilt._Background, attr, getattr(prebuilt._Background, attr))
    names = prebuilt.start([_Item("tmp_path", "plugin_task_run"), _Item("predict_onnx", "predict_run"),
                            _Item("plugin_task_run", "cls_pair_run")])
    try:
        assert names == ["plugin_task_run", "predict_run", "cls_pair_run"]
        (argv,) = started
        assert argv[1] == os.path.abspath(prebuilt.__file__) and argv[3:] == names
        assert prebuilt.start([_Item("tmp_path")]) == [] and len(started) == 1  # nothing to build: no process
    finally:
        shutil.rmtree(started[0][2])


def test_workers_sharing_a_folder_start_one_builder_and_wait_on_its_files(fake, monkeypatch, tmp_path):
    """make test's two xdist workers: the first to claim the shared folder starts the builder, the second reads its
    pid and its models; the controller's stop_shared ends it and removes the folder."""
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started, real_popen = [], subprocess.Popen
    monkeypatch.setattr(prebuilt.subprocess, "Popen", lambda argv, **kw: started.append(argv) or builder)
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv(prebuilt.SHARED, str(shared))
    items = [_Item("good")]
    assert prebuilt.start(items) == ["good"] and len(started) == 1 and started[0][2] == str(shared)
    assert (shared / "pid").read_text() == str(builder.pid)
    prebuilt._Background.proc = prebuilt._Background.pid = None  # the second worker's process
    assert prebuilt.start(items) == ["good"] and len(started) == 1  # no second builder
    assert prebuilt._Background.pid == builder.pid and prebuilt._running()
    monkeypatch.setattr(prebuilt.subprocess, "Popen", real_popen)  # the stand-in served the two starts only
    prebuilt.main([str(shared), "good"])  # what the builder writes
    factory = _Factory(tmp_path)
    assert prebuilt.get("good", factory)["pair"] == ("a", "b") and factory.made == []
    prebuilt.stop()  # a worker's stop leaves the shared builder alone
    assert builder.poll() is None and shared.exists()
    prebuilt.stop_shared(str(shared))
    assert builder.wait(timeout=10) == -9 and not shared.exists()
