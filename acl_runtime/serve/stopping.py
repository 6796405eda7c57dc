"""How acl-serve stops (SIGTERM, Ctrl-C), on top of uvicorn's graceful shutdown.

- **No new connection after the signal.** uvicorn's server notices its exit flag at its next 0.1 s tick, and its
  supervisor (``--workers N``) passes the signal on at its next 0.5 s one; measured under load, new connections
  were still accepted 27 to 125 ms after SIGTERM, and some of them were then reset unanswered. Here the signal
  handler schedules :meth:`Server.stop_accepting` on the event loop at once, and the supervisor passes the signal
  on at once. Connections the kernel had already completed but nobody had accepted (the backlog) are taken then
  and treated as the others (below), rather than reset when the socket closes; ``shutdown(SHUT_RD)`` then stops the
  socket listening in every process that shares it. A worker that has the signal while it is still starting (loading
  the app: the first worker ready lets clients in) never starts: its ``listen()`` would open the socket that another
  worker had shut, and take connections after the signal. A worker the signal killed before it could handle it is
  not replaced.
- **Every connection accepted gets an answer**: a request in flight is answered; a connection with no request under
  way, or one still sending its request, is answered 503 with ``Retry-After`` and closed gently
  (:mod:`acl_runtime.serve.transport`): uvicorn alone closed it unanswered. uvicorn tells each connection once;
  one made after that (taken from the backlog when uvicorn's tick came before the signal's stop, or accepted by the
  loop an instant earlier) is answered 503 as it is made, rather than served and held open.
- **A dead worker's gauges go with it**: its prometheus-client files of live gauges (the queue depth) are removed,
  so that /metrics does not keep adding what it held when it died.
"""
import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
from typing import List, Optional

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

logger = logging.getLogger("acl_runtime.serve")


class Server(uvicorn.Server):
    """uvicorn's server that stops taking connections the moment the signal arrives."""

    async def startup(self, sockets: Optional[List[socket.socket]] = None) -> None:
        self._acl_loop, self._acl_listeners, self._acl_stopped = asyncio.get_running_loop(), sockets or [], False
        if self.should_exit:
            # the signal came while the app loaded: starting would listen() on the shared socket again, which
            # another worker has shut already, and take connections after the signal
            return
        await super().startup(sockets=sockets)

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        loop = getattr(self, "_acl_loop", None)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.stop_accepting)  # the handler runs between two bytecodes: not there

    async def shutdown(self, sockets: Optional[List[socket.socket]] = None) -> None:
        self.stop_accepting()  # uvicorn's tick may come first: its close() of the socket would reset the backlog
        # uvicorn's shutdown() of each connection comes next, once: a connection whose connection_made() comes
        # later (taken just now, or accepted by the loop an instant ago) answers itself (transport.py)
        self.server_state.acl_draining = True
        await super().shutdown(sockets=sockets)

    def stop_accepting(self) -> None:
        """Take the backlog's connections, stop the listening sockets, and hand those connections to the HTTP
        protocol (uvicorn's shutdown then answers any without a request 503)."""
        if self._acl_stopped or not self.started:
            return  # not serving yet (the signal came during startup): shutdown(), which follows, stops it
        self._acl_stopped = True
        taken, interval = [], sys.getswitchinterval()
        # a connection the kernel completes between the last accept() and shutdown() is reset: after each accept()
        # this thread waits for the GIL, up to the switch interval (5 ms) while the scheduler's thread holds it
        sys.setswitchinterval(1e-5)
        try:
            for sock in self._acl_listeners:
                with contextlib.suppress(OSError):
                    while True:
                        taken.append(sock.accept()[0])  # non-blocking (asyncio made it so): ends at EAGAIN
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)  # the socket stops listening, for every process holding it
        finally:
            sys.setswitchinterval(interval)
        for server in self.servers:
            server.close()
        protocol = functools.partial(self.config.http_protocol_class, config=self.config,
                                     server_state=self.server_state, app_state=self.lifespan.state)
        for conn in taken:
            asyncio.ensure_future(self._acl_loop.connect_accepted_socket(protocol, conn))
        if taken:
            logger.info("acl-serve: %d connections taken from the backlog at shutdown", len(taken))


class _Worker(Process):
    """uvicorn's worker process, running :class:`Server`."""

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = Server(config=self.config)
        return self._server


class Supervisor(Multiprocess):
    """uvicorn's supervisor of ``--workers N``: workers run :class:`Server`; SIGTERM and SIGINT reach them at once;
    a worker that died has its live gauges' files removed before it is replaced."""

    def __init__(self, config: uvicorn.Config, sockets: List[socket.socket]):
        super().__init__(config, sockets)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)

    def _stop(self, signum, frame) -> None:
        """Pass the signal on from the handler itself: the main thread may be waiting up to the health check's
        timeout for a busy worker's answer (measured: workers taking connections 222 ms after SIGTERM)."""
        self.should_exit.set()
        for process in self.processes:
            with contextlib.suppress(OSError, TypeError):  # gone already, or not started (pid None)
                os.kill(process.pid, signal.SIGTERM)

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            process = _Worker(self.config, self.sockets)
            process.start()
            self.processes.append(process)

    def keep_subprocess_alive(self) -> None:
        for idx, process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung, or dead already
            process.join()
            forget_worker(process.pid)
            if process.exitcode == STARTUP_FAILURE:
                logger.error("acl-serve: worker %s failed to start; stopping", process.pid)
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return  # the stop signal killed it before it could handle it (it was starting): not replaced
            logger.warning("acl-serve: worker %s died (exit %s); starting another", process.pid, process.exitcode)
            self.processes[idx] = _Worker(self.config, self.sockets)
            self.processes[idx].start()


def forget_worker(pid: Optional[int]) -> None:
    """Remove a dead worker's live-gauge files (prometheus-client's multiprocess mode); its counters stay."""
    from prometheus_client import multiprocess

    from acl_runtime.serve.metrics import shared

    if pid is not None and shared():
        multiprocess.mark_process_dead(pid)
