"""How acl-serve's listening socket stops (acl_runtime/serve/stopping.py), in-process, the event loop's turns made
to come in a chosen order: every connection completed before the stop is taken and answered, whoever accepted it
(the stop from the backlog, or the event loop an instant earlier), and none is reset or left unanswered."""
import signal
import socket
import sys
import threading
import time

import pytest

from acl_runtime.serve import stopping
from serve_helpers import run_in_thread

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the SYN filter is Linux's")


def _answer(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes; b"reset" or b"no answer" when it was reset, or went silent."""
    data = b""
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return b"reset"
    except socket.timeout:
        return b"no answer"


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def _serving(sock: socket.socket):
    """acl-serve's uvicorn Server (stopping.Server, its HTTP protocol) on ``sock`` in a thread, with an app that
    answers 200; returns it once it serves."""
    import uvicorn

    from acl_runtime.serve.transport import NoDelayH11Protocol

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})

    config = uvicorn.Config(app, lifespan="off", log_level="warning", http=NoDelayH11Protocol,
                            timeout_keep_alive=30, timeout_graceful_shutdown=30)
    server = stopping.Server(config)
    return server, run_in_thread(server, sock)


def _hold(loop) -> threading.Event:
    """Block the event loop in one of its callbacks until the returned event is set (a loop busy elsewhere)."""
    held, release = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(lambda: (held.set(), release.wait(30)))
    assert held.wait(10)
    return release


def _status(answer: bytes) -> int:
    return int(answer[9:12]) if answer.startswith(b"HTTP/1.1 ") else 0


@linux
def test_once_the_stop_begins_a_new_connection_is_refused_never_completed_then_reset(monkeypatch):
    """The kernel completed a connection made while the stop took the backlog, and the listener's shutdown() then
    reset it, its request sent (serve_stop, two workers: 1 in 15 runs). From the stop on its SYN is dropped, and
    its retry meets the closed port."""
    sock = _listener()
    before = socket.create_connection(sock.getsockname(), timeout=5)  # completed: in the backlog
    sock.setblocking(False)
    taken, filtered, refuse = [], threading.Event(), stopping.refuse_handshakes
    monkeypatch.setattr(stopping, "refuse_handshakes", lambda s: (refuse(s), filtered.set())[0])
    stopping_now = threading.Thread(target=lambda: taken.extend(stopping.stop_listening([sock], grace=2.0)))
    stopping_now.start()
    assert filtered.wait(10)  # the stop has begun; within its grace the socket still listens
    with pytest.raises((socket.timeout, ConnectionRefusedError)):
        socket.create_connection(sock.getsockname(), timeout=0.5)  # its SYN is dropped: never completed
    stopping_now.join(10)
    assert [c.getpeername() for c in taken] == [before.getsockname()]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(sock.getsockname(), timeout=5)
    sock.listen(8)  # a worker that stopped alone is replaced, and listens on the shared socket again
    again = socket.create_connection(sock.getsockname(), timeout=2)  # the stop took its filter away with it
    for conn in taken + [before, again, sock]:
        conn.close()


def test_a_connection_the_loop_accepted_just_before_the_stop_is_answered_not_reset():
    """asyncio accepts a connection, then makes its transport in a task of its own; a transport made after its
    server was closed is reset (Server._attach asserts). The stop closed the server at once, so a connection the
    loop had accepted in the same turn as the signal was reset unanswered when the process exited (here, in-process,
    left unanswered); benchmarks/serve_stop.py, two workers: 5 connections in 2 of 15 runs, and make test once."""
    sock = _listener()
    server, thread = _serving(sock)
    loop = server._acl_loop
    release = _hold(loop)
    clients = [socket.create_connection(sock.getsockname(), timeout=5) for _ in range(4)]  # in the backlog
    for conn in clients:
        conn.sendall(REQUEST)
    # the loop's next turn runs a second hold, then its accept of the four (the listener is readable): the signal
    # comes during that hold, so the stop is queued behind the accept and runs before the four transports are made
    go = threading.Event()
    held = threading.Event()
    loop.call_soon_threadsafe(lambda: (held.set(), go.wait(30)))
    release.set()
    assert held.wait(10)
    server.handle_exit(signal.SIGTERM, None)
    go.set()
    answers = [_answer(conn) for conn in clients]
    thread.join(30)
    assert not thread.is_alive()
    assert [_status(a) in (200, 503) for a in answers] == [True] * 4, answers


def test_a_connection_made_after_the_drain_began_is_answered_503_at_once():
    """uvicorn's tick can come before the signal's stop (stopping.Server): the connections that the stop then
    took from the backlog were made after uvicorn's shutdown() of every connection, so no one answered them 503;
    a request sent on one was served and the connection held open (keep-alive), or held for all of
    --drain-seconds when its body was incomplete."""
    sock = _listener()
    server, thread = _serving(sock)
    loop = server._acl_loop
    paused = threading.Event()
    loop.call_soon_threadsafe(lambda: (loop.remove_reader(sock.fileno()), paused.set()))  # a loop busy elsewhere
    assert paused.wait(10)
    conn = socket.create_connection(sock.getsockname(), timeout=5)  # in the backlog, not accepted
    conn.sendall(REQUEST)
    server.should_exit = True  # what the signal's handler does first; uvicorn's tick then runs the drain
    started = time.monotonic()
    answer = _answer(conn)
    took = time.monotonic() - started
    conn.close()
    thread.join(30)
    assert _status(answer) == 503 and b"retry-after: 1" in answer.lower(), (answer, took)
    assert took < 2, took


class _Order:
    """The supervisor's stop order as a worker reads it (supervisor.Supervisor.stop_order)."""
    value = False


def test_a_worker_that_stops_alone_leaves_the_shared_socket_listening():
    """A worker's own stop (SIGTERM to its pid, uvicorn's SIGHUP restart or SIGTTOU) shut the socket that every
    worker shares: the other workers then refused every connection. Only the supervisor's order shuts it."""
    sock = _listener()  # the supervisor's; the worker serves its own copy (its close() leaves this one open)
    server, thread = _serving(sock.dup())
    server.stop_order = _Order()
    server.handle_exit(signal.SIGTERM, None)
    thread.join(30)
    assert not thread.is_alive()
    with socket.create_connection(sock.getsockname(), timeout=2):  # still listening: the others take it
        pass
    sock.close()


def test_the_supervisors_order_shuts_the_shared_socket():
    sock = _listener()  # the supervisor's; the worker serves its own copy (its close() leaves this one open)
    server, thread = _serving(sock.dup())
    server.stop_order = _Order()
    server.stop_order.value = True
    server.handle_exit(signal.SIGTERM, None)
    thread.join(30)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(sock.getsockname(), timeout=2)
    sock.close()


def test_an_accept_error_is_logged_once_and_the_worker_stops(caplog):
    """A listening socket shut under a serving worker (another worker's stop did it): asyncio logged accept()'s
    EINVAL and called it again at once, for ever (2 MB of log a second, the port dead)."""
    sock = _listener()  # the supervisor's; the worker serves its own copy (its close() leaves this one open)
    server, thread = _serving(sock.dup())
    server.stop_order = _Order()
    with caplog.at_level("ERROR"):
        sock.shutdown(socket.SHUT_RD)
        thread.join(30)
    assert not thread.is_alive()  # it stops; its supervisor starts another, whose listen() opens the socket again
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "accept() on the listening socket failed ([Errno 22]" in errors[0], errors
    sock.close()
