"""How acl-serve stops (SIGTERM, Ctrl-C), on top of uvicorn's graceful shutdown.

- **No new connection after the signal.** uvicorn's server notices its exit flag at its next 0.1 s tick, and its
  supervisor (``--workers N``) passes the signal on at its next 0.5 s one; measured under load, new connections
  were still accepted 27 to 125 ms after SIGTERM, and some of them were then reset unanswered. Here the signal
  handler schedules :meth:`Server.stop_accepting` on the event loop at once, and the supervisor passes the signal
  on at once. The stop (:func:`stop_listening`) first has the kernel start no new handshake on the listening socket
  (:func:`refuse_handshakes`: a SYN is dropped, and the client's retry a second later is refused), then takes the
  connections the kernel had completed but nobody had accepted (the backlog), waits ``HANDSHAKE_SECONDS`` for the
  handshakes under way and takes those too, and treats them all as the others (below), rather than reset them when
  the socket closes; ``shutdown(SHUT_RD)`` then stops the socket listening in every process that shares it.
- **Only the server's stop shuts the shared socket.** With ``--workers N`` a worker may stop alone (SIGTERM to its
  pid, uvicorn's SIGHUP restart or SIGTTOU, its supervisor gone): it then only stops taking connections itself and
  drains what it took; the filter, the backlog and ``shutdown(SHUT_RD)`` follow the supervisor's order alone
  (``Server.stop_order``, set by :class:`acl_runtime.serve.supervisor.Supervisor` before it signals the workers).
  A lone stop once shut the socket for every worker (SIGHUP: the port dead for good, the new workers looping on
  ``accept()``'s EINVAL).
- **An accept() error is logged once** (:meth:`Server._loop_error`): the worker stops taking connections and stops
  (the supervisor starts another, whose ``listen()`` opens the socket again); asyncio logged it and called
  ``accept()`` again at once, for ever.
- **The loop's own accepted connections.** The loop stops accepting at the stop, but its server is closed only in
  ``shutdown()``, a turn later: asyncio makes an accepted connection's transport in a task of its own and resets
  the connection when its server was closed first, so a connection the loop accepted in the signal's turn was reset.
- Measured, ``benchmarks/serve_stop.py``, two workers, 15 runs: 5 connections reset in 2 runs before both changes;
  1 in 1 run with the second change alone (a handshake completed between the last ``accept()`` and ``shutdown()``,
  the process preempted there); 0 with both, in 45 runs (docs/serve.md).
- A worker that has the signal while it is still starting (loading the app, or running its startup: the first
  worker ready lets clients in) never starts: its ``listen()`` would open the socket that another worker had shut,
  and take connections after the signal. A worker the signal killed before it could handle it is not replaced
  (serve/supervisor.py).
- **Every connection accepted gets an answer**: a request in flight is answered; a connection with no request under
  way, or one still sending its request, is answered 503 with ``Retry-After`` and closed gently
  (:mod:`acl_runtime.serve.transport`): uvicorn alone closed it unanswered. uvicorn tells each connection once;
  one made after that (taken from the backlog when uvicorn's tick came before the signal's stop, or accepted by the
  loop an instant earlier) is answered 503 as it is made, rather than served and held open.
"""
import asyncio
import contextlib
import functools
import logging
import socket
import struct
import sys
import time
from typing import List, Optional

import uvicorn

logger = logging.getLogger("acl_runtime.serve")
SO_ATTACH_FILTER, SO_DETACH_FILTER = 26, 27  # <asm-generic/socket.h>; the socket module does not name them
HANDSHAKE_SECONDS = 0.005  # a handshake under way at the stop lands in the backlog within it (loopback: microseconds)


class Server(uvicorn.Server):
    """uvicorn's server that stops taking connections the moment the signal arrives."""

    # a --workers process: the supervisor's flag (a shared byte), true once it ordered the server's stop; None for
    # the one process of --workers 1, whose every stop is the server's
    stop_order = None

    def server_stopping(self) -> bool:
        """Whether a stop now is the server's (the shared socket is shut), not this worker's alone."""
        return self.stop_order is None or bool(self.stop_order.value)

    async def startup(self, sockets: Optional[List[socket.socket]] = None) -> None:
        self._acl_loop, self._acl_listeners = asyncio.get_running_loop(), sockets or []
        self._acl_stopped = self._acl_shut = self._acl_accept_failed = False
        if self.should_exit:
            # the signal came while the app loaded: starting would listen() on the shared socket again, which
            # another worker has shut already, and take connections after the signal
            return
        # the app's startup (its scheduler) runs before the socket is listened on, and the signal is looked at
        # again after it: uvicorn's startup runs it and then listens whatever came meanwhile (a second worker
        # still starting at SIGTERM opened the shut socket 90 ms after the signal and took connections)
        await self.lifespan.startup()
        if self.should_exit and not self.lifespan.should_exit:
            await self.lifespan.shutdown()
            return
        self.lifespan.startup = _started  # done: uvicorn's startup, next, would run it again
        await super().startup(sockets=sockets)
        self._acl_loop.set_exception_handler(self._loop_error)

    def _loop_error(self, loop, context) -> None:
        """asyncio's handler of an exception in a callback: an ``accept()`` that fails on the listening socket
        (EINVAL once it is shut) is logged once, and this worker stops taking connections; asyncio logged it and
        called accept() again at the next turn, for ever (2 MB of log a second)."""
        handle, error = context.get("handle"), context.get("exception")
        callback = getattr(getattr(handle, "_callback", None), "__name__", "")
        if not (isinstance(error, OSError) and callback == "_accept_connection"):
            loop.default_exception_handler(context)
            return
        listener = handle._args[1]  # BaseSelectorEventLoop._accept_connection(protocol_factory, sock, ...)
        with contextlib.suppress(Exception):
            loop.remove_reader(listener.fileno())
        if self.should_exit or self.server_stopping() or self._acl_accept_failed:
            return  # the server's stop shut the socket (another worker's turn came first): this one stops too
        self._acl_accept_failed = True
        logger.error("acl-serve: accept() on the listening socket failed (%s): this worker takes no more connections "
                     "and stops%s", error, "" if self.stop_order is None else "; the supervisor starts another, "
                     "whose listen() opens the socket again")
        self.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        loop = getattr(self, "_acl_loop", None)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.stop_accepting)  # the handler runs between two bytecodes: not there

    async def shutdown(self, sockets: Optional[List[socket.socket]] = None) -> None:
        try:
            self.stop_accepting()  # uvicorn's tick may come first: its close() would reset the backlog
        except Exception:  # the drain below must run whatever happened to the listener
            logger.exception("acl-serve: stopping the listening socket failed; draining the connections taken")
        await asyncio.sleep(0)  # the connections the loop accepted attach to their server before it is closed
        # uvicorn's shutdown() of each connection comes next, once: a connection whose connection_made() comes
        # later (taken just now, or accepted by the loop an instant ago) answers itself (transport.py)
        self.server_state.acl_draining = True
        await super().shutdown(sockets=sockets)

    def stop_accepting(self) -> None:
        """Take the backlog's connections, stop the listening sockets, and hand those connections to the HTTP
        protocol (uvicorn's shutdown then answers any without a request 503)."""
        if not self.started:
            return  # not serving yet (the signal came during startup): shutdown(), which follows, stops it
        if not self._acl_stopped:
            self._acl_stopped = True
            for server in self.servers:
                for sock in server.sockets:
                    # the loop accepts no more; its server is closed in shutdown(), once the connections it
                    # accepted have their transports (Server._attach asserts that the server is open)
                    self._acl_loop.remove_reader(sock.fileno())
        if self._acl_shut or not self.server_stopping():
            # this worker stops alone: the other workers take the socket's connections, and its own close() in
            # shutdown() leaves the socket listening in them (and in the supervisor)
            return
        self._acl_shut = True
        taken = stop_listening(self._acl_listeners)
        protocol = functools.partial(self.config.http_protocol_class, config=self.config,
                                     server_state=self.server_state, app_state=self.lifespan.state)
        for conn in taken:
            asyncio.ensure_future(self._acl_loop.connect_accepted_socket(protocol, conn))
        if taken:
            logger.info("acl-serve: %d connections taken from the backlog at shutdown", len(taken))


async def _started() -> None:
    """A lifespan's startup that has run already."""


def stop_listening(listeners: List[socket.socket], grace: float = HANDSHAKE_SECONDS) -> List[socket.socket]:
    """Stop the listening sockets without resetting a connection the kernel completed: no new handshake starts,
    the backlog is taken, the handshakes under way are given ``grace`` seconds to land in it and are taken too,
    and then the sockets stop listening (every process that shares one). Returns the connections taken."""
    for sock in listeners:
        refuse_handshakes(sock)
    taken = _accept_all(listeners)
    time.sleep(grace)
    taken += _accept_all(listeners)
    for sock in listeners:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)  # the socket stops listening, for every process holding it
        with contextlib.suppress(OSError):
            # a worker that stopped alone is replaced by the supervisor, and its listen() opens the socket again:
            # the filter must not be left on it
            sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
    return taken


def _accept_all(listeners: List[socket.socket]) -> List[socket.socket]:
    taken = []
    for sock in listeners:
        with contextlib.suppress(OSError):  # EAGAIN (asyncio made the socket non-blocking), or shut already
            while True:
                taken.append(sock.accept()[0])
    return taken


def refuse_handshakes(sock: socket.socket) -> bool:
    """Drop every connection attempt's SYN on a listening TCP socket (a classic BPF filter, Linux): a handshake
    under way completes, a new one does not start, and the client's retry after its SYN timeout (1 s) meets a
    closed port and is refused. The filter passes to the connections accepted from then on (the kernel copies it)
    and drops nothing there: a SYN without ACK comes only to a listener. A handshake under way completes when the
    client's ACK comes within the stop's grace (loopback: microseconds; a client further away than that is reset,
    as without the filter). False where it cannot be set (another system, or not TCP; a refusal is logged): the
    stop is then as before, without it."""
    if not sys.platform.startswith("linux") or sock.family not in (socket.AF_INET, socket.AF_INET6) \
            or sock.type != socket.SOCK_STREAM:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, _SYN_FILTER.program)
    except OSError as e:
        logger.warning("acl-serve: cannot filter new connections while stopping (%s): one completed in the "
                       "stop's last instant may be reset", e)
        return False
    return True


class _Filter:
    """A classic BPF program over a TCP segment (the filter sees it from the TCP header): keep it unless its flags
    (byte 13) have SYN set and ACK clear."""

    def __init__(self):
        import ctypes

        code = [(0x30, 0, 0, 13),          # ldb [13]: the flags
                (0x54, 0, 0, 0x12),        # and #(SYN | ACK)
                (0x15, 0, 1, 0x02),        # jeq #SYN: drop, else keep
                (0x06, 0, 0, 0),           # ret #0: drop
                (0x06, 0, 0, 0xFFFFFFFF)]  # ret #-1: keep all of it
        self._code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in code))
        self.program = struct.pack("HP", len(code), ctypes.addressof(self._code))  # struct sock_fprog


_SYN_FILTER = _Filter()
