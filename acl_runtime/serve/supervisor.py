"""acl-serve's supervisor of ``--workers N``: uvicorn's, with its faults handled (docs/serve.md, "Faults").

- **SIGTERM and SIGINT reach every worker at once**, from the signal handler (the main thread may be waiting up to
  the health check's timeout for a busy worker's answer: workers took connections 222 ms after SIGTERM). Before it
  signals them, the supervisor sets the stop order that each worker reads (``stopping.Server.stop_order``): only
  then does a worker's stop shut the socket that all of them share. A worker that stops alone (SIGTERM to its
  pid, uvicorn's SIGHUP restart, SIGTTOU) leaves it listening for the others.
- **One model behind the port**: the supervisor pins the model it checked at start (:func:`model_digest`, set in
  ``PIN_ENV``); a worker, replacement or not, checks the folder against it before and after it loads, and a
  worker that finds another model (the folder exported again while serving) refuses to serve, says why, and exits
  ``OTHER_MODEL``.
- **A worker that cannot start is retried with a back-off, then given up**: ``BACKOFF_SECONDS`` doubling, at most
  ``MAX_FAILED_STARTS`` failed starts in a row (its reason is logged by the worker). While no worker runs the
  listening socket is shut (connections refused, not left hanging in the backlog; a new worker's ``listen()``
  opens it again); with every place given up acl-serve exits 1.
- **Workers die with their supervisor** (Linux: ``PR_SET_PDEATHSIG``): a worker whose supervisor was killed gets
  SIGTERM, answers what it took and exits, so that a ``kill -9`` leaves no orphan holding the port. The metrics
  folder of a supervisor that died that way is removed at the next start (:func:`metrics_folder`).
- **The drain is bounded**: a worker still running ``--drain-seconds`` plus the scheduler's second plus
  ``JOIN_MARGIN_SECONDS`` after the stop (hung, or stopped by SIGSTOP) is killed, and acl-serve exits 1.
- **A dead worker's gauges go with it**: its prometheus-client files of live gauges (the queue depth) are removed,
  so that /metrics does not keep adding what it held when it died.
"""
import contextlib
import ctypes
import glob
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from typing import List, Optional

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from acl_runtime import manifest
from acl_runtime.console import UsageError
from acl_runtime.io import file_sha256
from acl_runtime.serve.stopping import Server

logger = logging.getLogger("acl_runtime.serve")
SPAWN = multiprocessing.get_context("spawn")  # uvicorn's workers are spawned
PIN_ENV = "ACL_SERVE_MODEL"  # the model's digest the supervisor checked at start (model_digest)
CANNOT_SERVE = 2  # a worker's exit status when the folder cannot be loaded (a UsageError's)
OTHER_MODEL = 4  # ... when the folder holds another model than the one the server started with
START_FAILURES = (CANNOT_SERVE, OTHER_MODEL, STARTUP_FAILURE)
MAX_FAILED_STARTS = 3  # starts in a row a worker's place may fail before it is given up
BACKOFF_SECONDS = 0.5  # the wait before a place's next start after n failed ones: 0.5, 1, 2 s ...
JOIN_MARGIN_SECONDS = 5.0  # past --drain-seconds and the scheduler's own second, a worker still running is killed
READY_SECONDS = 30.0  # a SIGHUP replacement's time to serve before the restart is abandoned
METRICS_PREFIX = "acl-serve-metrics-"
OWNER = "owner"  # in the metrics folder: the supervisor's pid and start time
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def model_digest(folder: str, precision: str) -> str:
    """What model a folder holds: the sha256 of its manifest's bytes and of each file the engine opens for
    ``precision`` (by the sha256 the manifest records, which the engine checks each file against as it loads;
    else by the file's own bytes)."""
    with open(os.path.join(folder, manifest.MANIFEST), "rb") as f:
        raw = f.read()
    digest, m = hashlib.sha256(raw), json.loads(raw)
    recorded = m.get("sha256") if isinstance(m.get("sha256"), dict) else {}
    for name in manifest.files(folder, m, precision):
        digest.update(f"{name}\0{recorded.get(name) or file_sha256(manifest.inside(folder, name))}\n".encode())
    return digest.hexdigest()


class OtherModel(UsageError):
    def __init__(self, message: str):
        super().__init__(message)
        self.code = OTHER_MODEL


def check_pinned(folder: str, precision: str) -> None:
    """Refuse (:class:`OtherModel`) a folder that no longer holds the model the server started with."""
    pinned = os.environ.get(PIN_ENV)
    if pinned is None:
        return
    try:
        found = model_digest(folder, precision)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{folder}: cannot be read ({e})") from None
    if found != pinned:
        raise OtherModel(f"{folder} now holds another model (digest {found[:12]}, the server started with "
                         f"{pinned[:12]}): this worker does not serve it, so that one port never answers with two "
                         "models; restart acl-serve to serve the new one")


def die_with_parent(parent: int) -> None:
    """Linux: have SIGTERM when the supervisor dies (``kill -9`` included), so that no orphan keeps serving the
    port; a worker whose supervisor is gone already exits at once."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            logger.warning("acl-serve: worker %d cannot ask to stop with its supervisor (errno %d)", os.getpid(),
                           ctypes.get_errno())
    if os.getppid() != parent:
        sys.exit(0)


class _Worker(Process):
    """uvicorn's worker process, running :class:`stopping.Server` with the supervisor's stop order."""

    def __init__(self, config: uvicorn.Config, sockets: List[socket.socket], stop_order):
        super().__init__(config, sockets)
        self.stop_order, self.parent = stop_order, os.getpid()  # pickled with the process object (spawn)

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = Server(config=self.config)
            self._server.stop_order = self.stop_order
        return self._server

    def target(self, sockets=None) -> None:  # in the worker
        die_with_parent(self.parent)
        super().target(sockets)


class Supervisor(Multiprocess):
    """uvicorn's supervisor, its workers :class:`_Worker`; :meth:`run` returns acl-serve's exit status."""

    def __init__(self, config: uvicorn.Config, sockets: List[socket.socket], drain_seconds: float):
        from acl_runtime.serve.app import CLOSE_SECONDS

        super().__init__(config, sockets)
        self.stop_order = SPAWN.RawValue(ctypes.c_bool, False)  # shared memory, no lock: set in a signal handler
        self.join_seconds = drain_seconds + CLOSE_SECONDS + JOIN_MARGIN_SECONDS
        self.processes: List[Optional[_Worker]] = []  # None: a place waiting for its next start, or given up
        self.failed: List[int] = []  # per place: starts failed in a row
        self.retry_at: List[Optional[float]] = []  # per empty place: when its next start is due (None: given up)
        self.served: List[bool] = []  # per place: its worker answered a health check as started
        self.status, self.refusing = 0, False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)

    def run(self) -> int:
        super().run()
        return self.status

    def _stop(self, signum, frame) -> None:
        self.stop_order.value = True  # first: each worker's stop now shuts the shared socket
        self.should_exit.set()
        for process in self.processes:
            with contextlib.suppress(OSError, TypeError, AttributeError):  # gone, not started (pid None), or None
                os.kill(process.pid, signal.SIGTERM)

    def _start(self) -> _Worker:
        process = _Worker(self.config, self.sockets, self.stop_order)
        process.start()
        self.refusing = False  # its listen() opens the socket again
        return process

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            self._add(self._start())

    def _add(self, process: _Worker) -> None:
        self.processes.append(process)
        self.failed.append(0)
        self.retry_at.append(None)
        self.served.append(False)

    def keep_subprocess_alive(self) -> None:
        for idx, process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            if process is None:
                if self.retry_at[idx] is not None and time.monotonic() >= self.retry_at[idx]:
                    self.retry_at[idx] = None
                    self.processes[idx], self.served[idx] = self._start(), False
                continue
            started = process._healthcheck(self.config.timeout_worker_healthcheck) \
                if process.process.is_alive() else None
            if started is not None:
                self.served[idx] = self.served[idx] or started
                continue
            self._replace(idx, process)
        if not self.should_exit.is_set() and not any(self.processes):
            self._none_serving()

    def _replace(self, idx: int, process: _Worker) -> None:
        """A worker that died, or did not answer its health check (hung: killed), is started again: at once when
        it had served, else after a back-off, and its place given up after MAX_FAILED_STARTS in a row."""
        process.kill()
        process.join()
        forget_worker(process.pid)
        self.processes[idx] = None
        if self.should_exit.is_set():
            return  # the stop signal killed it before it could handle it (it was starting): not replaced
        code = process.exitcode
        how = {CANNOT_SERVE: "could not load the model (its reason is logged above)",
               OTHER_MODEL: "found another model in the folder (logged above)",
               STARTUP_FAILURE: "failed to start"}.get(code, f"died (exit {code})")
        self.failed[idx] = 0 if self.served[idx] and code not in START_FAILURES else self.failed[idx] + 1
        if self.failed[idx] >= MAX_FAILED_STARTS:
            serving = sum(p is not None for p in self.processes)
            logger.error("acl-serve: worker %s %s; its place failed to start %d times in a row and is given up: %d "
                         "of %d workers run", process.pid, how, self.failed[idx], serving, len(self.processes))
            return
        wait = 0.0 if self.failed[idx] == 0 else BACKOFF_SECONDS * 2 ** (self.failed[idx] - 1)
        logger.warning("acl-serve: worker %s %s; another starts in %.1f s", process.pid, how, wait)
        self.retry_at[idx] = time.monotonic() + wait

    def _none_serving(self) -> None:
        """No worker runs: refuse connections (the kernel would complete them and no one would answer); with every
        place given up, stop (exit 1)."""
        if all(at is None for at in self.retry_at):
            logger.error("acl-serve: no worker can serve (each place failed to start %d times in a row; the reasons "
                         "are logged above): the port is closed and acl-serve stops", MAX_FAILED_STARTS)
            self.status = 1
            self.should_exit.set()
        elif not self.refusing:
            logger.error("acl-serve: no worker runs: connections are refused until one starts")
        if not self.refusing:
            self.refusing = True
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)

    def terminate_all(self) -> None:
        for process in self.processes:
            if process is not None:
                process.terminate()

    def join_all(self) -> None:
        deadline = time.monotonic() + self.join_seconds
        for process in self.processes:
            if process is not None and not self._join(process, max(deadline - time.monotonic(), 0.0)):
                self.status = 1

    def _join(self, process: _Worker, timeout: float) -> bool:
        """Wait for a stopped worker up to ``timeout`` seconds, then kill it; whether it exited in time."""
        process.process.join(timeout)
        if process.exitcode is not None:
            return True
        logger.error("acl-serve: worker %s still runs %.1f s after its stop (hung, or stopped); killed: what it held "
                     "is lost", process.pid, timeout)
        process.kill()
        process.join()
        return False

    def restart_all(self) -> None:
        """SIGHUP: each worker replaced in turn, the new one serving before the old one stops (alone: the socket
        stays listening)."""
        for idx, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._start()
            if not new.wait_until_ready(READY_SECONDS, self.should_exit):
                new.kill()
                new.join()
                forget_worker(new.pid)
                if not self.should_exit.is_set():
                    logger.error("acl-serve: SIGHUP: the new worker %s did not serve within %g s; worker %s is kept "
                                 "and the restart abandoned", new.pid, READY_SECONDS, getattr(old, "pid", None))
                return
            if old is not None:
                old.terminate()
                self._join(old, self.join_seconds)
                forget_worker(old.pid)
            self.processes[idx], self.failed[idx], self.retry_at[idx], self.served[idx] = new, 0, None, True

    def handle_ttin(self) -> None:
        logger.info("acl-serve: SIGTTIN: one worker more")
        self.processes_num += 1
        self._add(self._start())

    def handle_ttou(self) -> None:
        if self.processes_num <= 1:
            logger.info("acl-serve: SIGTTOU: one worker runs already; none stopped")
            return
        logger.info("acl-serve: SIGTTOU: one worker fewer")
        self.processes_num -= 1
        process = self.processes.pop()
        for column in (self.failed, self.retry_at, self.served):
            column.pop()
        if process is not None:
            process.terminate()
            self._join(process, self.join_seconds)
            forget_worker(process.pid)


def forget_worker(pid: Optional[int]) -> None:
    """Remove a dead worker's live-gauge files (prometheus-client's multiprocess mode); its counters stay."""
    from prometheus_client import multiprocess

    from acl_runtime.serve.metrics import shared

    if pid is not None and shared():
        multiprocess.mark_process_dead(pid)


def _identity(pid: int) -> str:
    """``pid start-time`` (Linux: the start time tells a reused pid apart); "" for a process that is gone."""
    if os.path.exists("/proc/self/stat"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f"{pid} {f.read().rsplit(')', 1)[1].split()[19]}"
        except OSError:
            return ""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ""
    except PermissionError:
        pass
    return str(pid)


def metrics_folder() -> str:
    """A new folder for prometheus-client's multiprocess files, recording its owner; first, the folders that a
    supervisor which died without removing its own (``kill -9``) left in the same temporary folder are removed."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), METRICS_PREFIX + "*")):
        try:
            with open(os.path.join(path, OWNER)) as f:
                owner = f.read()
            pid = int(owner.split()[0])
        except (OSError, ValueError, IndexError):
            continue  # not one this version wrote, or not ours to read: left alone
        if _identity(pid) != owner:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
            logger.info("acl-serve: removed %s, left by an acl-serve that was killed", path)
    folder = tempfile.mkdtemp(prefix=METRICS_PREFIX)
    try:
        with open(os.path.join(folder, OWNER), "w") as f:
            f.write(_identity(os.getpid()))
    except OSError as e:  # a full disk: the workers say so too, and serve without metrics
        logger.error("acl-serve: cannot write %s (%s): if acl-serve is killed, the folder stays", folder, e)
    return folder
