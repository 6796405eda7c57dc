"""acl-serve --workers 2 under process faults, on real processes and real signals (acl_runtime/serve/supervisor.py):
a worker that stops alone (SIGHUP's restart, SIGTTOU, SIGTERM to its pid) leaves the port to the others; a
replacement that finds another model in the folder refuses to serve; workers that cannot load are retried, then
given up, and acl-serve exits 1 with the port closed; workers die with their supervisor and its metrics folder is
removed at the next start; a worker hung in the drain is killed at the bound."""
import json
import os
import shutil
import signal
import socket
import threading
import time
import urllib.error

import pytest

from serve_faults import workers as _workers  # benchmarks/serve_faults.py
from serve_helpers import call, exported, start  # noqa: F401  (exported: a fixture)


class _Log:
    """The lines a process writes to stderr, read in a thread (a worker's loop of tracebacks must not fill the
    pipe and block it)."""

    def __init__(self, proc):
        self.lines, self.proc = [], proc
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stderr), daemon=True)
        self.thread.start()

    def wait_for(self, words: str, seconds: float = 30) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if words in line]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {words!r} in the log: {''.join(self.lines)[-3000:]}")

    def text(self) -> str:
        self.thread.join(10)
        return "".join(self.lines)


def _serving(exported_or_folder, *flags):
    """acl-serve --workers 2 FLAGS on the folder, logging at INFO (uvicorn says when each worker serves): the
    process, its URL and its log, once both workers serve."""
    os.environ["LOGLEVEL"] = "info"
    try:
        proc, url = start(exported_or_folder, "--workers", "2", *flags)
    finally:
        del os.environ["LOGLEVEL"]
    log = _Log(proc)
    deadline = time.monotonic() + 60
    while sum("Application startup complete" in line for line in list(log.lines)) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(log.lines)[-3000:]
        time.sleep(0.05)
    return proc, url, log


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _status(url: str) -> object:
    """The health route's status on a new connection, or what went wrong."""
    try:
        return call(f"{url}/v2/health/ready", timeout=3)[0]
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        return type(getattr(e, "reason", e)).__name__


def _ask_until(url: str, done, seconds: float):
    """Requests on new connections, 20 a second, until ``done()`` (or ``seconds``): their statuses."""
    statuses, deadline = [], time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        statuses.append(_status(url))
        time.sleep(0.05)
    statuses += [_status(url) for _ in range(10)]
    return statuses


def _stop(proc, log: _Log, status: int = 0) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    text = log.text()
    assert proc.returncode == status, text[-3000:]
    return text


@pytest.mark.parametrize("how", ["SIGHUP", "SIGTTOU", "SIGTERM to one worker"])
def test_a_worker_that_stops_alone_leaves_the_port_to_the_others(exported, how):  # noqa: F811
    """Each of these once shut the listening socket that all the workers share: the port refused everything (for
    good after SIGHUP and SIGTTOU, with the workers left looping on accept()'s EINVAL, 2 MB of log a second)."""
    proc, url, log = _serving(exported["folder"])
    before = set(_workers(proc.pid))
    if how == "SIGTERM to one worker":
        os.kill(min(before), signal.SIGTERM)
        done = lambda: len(set(_workers(proc.pid)) - before) == 1  # noqa: E731  (replaced)
    elif how == "SIGHUP":
        proc.send_signal(signal.SIGHUP)
        done = lambda: not set(_workers(proc.pid)) & before  # noqa: E731  (both replaced, one by one)
    else:
        proc.send_signal(signal.SIGTTOU)
        done = lambda: len(_workers(proc.pid)) == 1  # noqa: E731
    statuses = _ask_until(url, done, 30)
    assert done(), (how, _workers(proc.pid), before)
    text = _stop(proc, log)
    assert statuses == [200] * len(statuses), statuses
    assert "Errno 22" not in text and "Exception in callback" not in text, text[-2000:]


def _changed_copy(folder: str, tmp_path) -> str:
    """A copy of ``folder`` to serve; returns its path."""
    return str(shutil.copytree(folder, tmp_path / "onnx"))


def _export_again(served: str, tmp_path) -> None:
    """What acl-export --force does to a served folder: the new export built aside, then renamed over; here a
    manifest-only change (another default policy)."""
    aside = tmp_path / "new"
    shutil.copytree(served, aside)
    manifest = json.loads((aside / "manifest.json").read_text())
    manifest.update(policy="entropy", threshold=0.5)
    (aside / "manifest.json").write_text(json.dumps(manifest))
    os.rename(served, tmp_path / "old")
    os.rename(aside, served)


def test_a_replacement_that_finds_another_model_refuses_to_serve_it(exported, tmp_path):  # noqa: F811
    """A replacement worker loaded whatever the folder held: one port answered with two models."""
    served = _changed_copy(exported["folder"], tmp_path)
    proc, url, log = _serving(served)
    policy = call(f"{url}/v2/models/acl")[2]["parameters"]
    _export_again(served, tmp_path)
    victim = _workers(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    line = log.wait_for("now holds another model")
    assert "restart acl-serve to serve the new one" in line, line
    answers = [call(f"{url}/v2/models/acl")[2]["parameters"] for _ in range(20)]
    assert answers == [policy] * 20, answers  # the one model it started with
    _stop(proc, log)


@pytest.mark.slow  # 10 to 25 s: three failed starts in a row, each a fresh interpreter, and their back-off
def test_workers_that_cannot_load_are_given_up_and_acl_serve_exits_1_with_the_port_closed(exported,  # noqa: F811
                                                                                           tmp_path):
    """The folder deleted, then the workers killed: they exited 2 without a word and were restarted every second
    for ever, while the port completed handshakes that no one answered."""
    served = _changed_copy(exported["folder"], tmp_path)
    proc, url, log = _serving(served)
    shutil.rmtree(served)
    for pid in _workers(proc.pid):
        os.kill(pid, signal.SIGKILL)
    reason = log.wait_for("cannot serve")
    assert "manifest.json" in reason, reason
    log.wait_for("no worker runs: connections are refused")
    assert _status(url) in ("ConnectionRefusedError", "ConnectionResetError", "RemoteDisconnected"), _status(url)
    proc.wait(timeout=30)
    text = log.text()
    assert proc.returncode == 1, text[-3000:]
    assert "no worker can serve" in text, text[-3000:]
    assert _status(url) == "ConnectionRefusedError"


def test_workers_die_with_their_supervisor_and_its_metrics_folder_goes_at_the_next_start(exported, tmp_path,  # noqa
                                                                                          monkeypatch):
    """kill -9 of acl-serve left both workers serving as orphans, the port taken and the metrics folder behind."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the metrics folders of this test's servers alone
    proc, url, log = _serving(exported["folder"])
    workers = _workers(proc.pid)
    left = [p for p in os.listdir(tmp_path) if p.startswith("acl-serve-metrics-")]
    assert len(left) == 1, left
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in workers):
        assert time.monotonic() < deadline, [pid for pid in workers if _alive(pid)]
        time.sleep(0.05)
    assert _status(url) == "ConnectionRefusedError"
    log.text()
    again, url, log = _serving(exported["folder"])
    now = [p for p in os.listdir(tmp_path) if p.startswith("acl-serve-metrics-")]
    _stop(again, log)
    assert left[0] not in now and len(now) == 1, (left, now)


@pytest.mark.slow  # about 9 s: the bound is --drain-seconds, the scheduler's second and a 5 s margin
def test_a_worker_hung_in_the_drain_is_killed_at_the_bound_and_acl_serve_exits_1(exported):  # noqa: F811
    """SIGTERM, then SIGSTOP to one worker 20 ms later: acl-serve still ran 25 s later, past --drain-seconds."""
    from acl_runtime.serve.app import CLOSE_SECONDS
    from acl_runtime.serve.supervisor import JOIN_MARGIN_SECONDS

    proc, url, log = _serving(exported["folder"], "--drain-seconds", "1")
    hung = _workers(proc.pid)[0]
    proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    time.sleep(0.02)
    os.kill(hung, signal.SIGSTOP)
    proc.wait(timeout=60)
    took = time.monotonic() - stopped
    text = log.text()
    assert proc.returncode == 1 and f"worker {hung} still runs" in text, text[-3000:]
    assert took < 1 + CLOSE_SECONDS + JOIN_MARGIN_SECONDS + 5, took
    assert not _alive(hung)
