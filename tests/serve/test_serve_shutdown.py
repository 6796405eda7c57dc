"""How acl-serve stops, on real processes under load: after SIGTERM no new connection is taken and every connection
that was taken gets an answer (its request served, or 503 with Retry-After), with one worker or two; a drain that
runs out of --drain-seconds answers what is left 503 and frees its rows; a client that disconnects while its rows
are queued frees them (in-process)."""
import asyncio
import concurrent.futures
import errno
import json
import os
import select
import signal
import socket
import threading
import time
import urllib.error

import pytest

from serve_helpers import (  # noqa: F401  (exported, single_folder: fixtures)
    all_accepted,
    call,
    exported,
    oip_body,
    serving,
    single_folder,
    slow_layer,
    start,
)

BODY = b'{"inputs": ["the movie", "was"]}'  # a pair: what the model reads
REQUEST = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
           % len(BODY) + BODY)


def _answer(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes (b"" when it closed unanswered)."""
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def _connect(port: int, timeout: float):
    """A connection to ``port``, "refused", or "no handshake" when nothing came back within ``timeout``. The wait
    is select()'s, called after connect(): a client thread the machine ran late still sees an answer that came in
    time (socket.create_connection's own timeout counts from before connect() and gave up on a refusal that had
    arrived while its thread waited for a core)."""
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.setblocking(False)
    err = conn.connect_ex(("127.0.0.1", port))
    if err == errno.EINPROGRESS:
        select.select([], [conn], [], timeout)
        err = conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err == 0 and not select.select([], [conn], [], 0)[1]:
            conn.close()
            return "no handshake"  # the stop dropped its SYN (stopping.refuse_handshakes): never taken
    if err == errno.ECONNREFUSED:
        conn.close()
        return "refused"
    assert err == 0, os.strerror(err)
    conn.setblocking(True)
    return conn


def _probe(port: int, since: float, until: float, out: list) -> None:
    """New connections, each with one request, until ``until``: (seconds after SIGTERM, what came back), in order
    of ``at``. A connection taken is answered in a thread of its own, so that one served to the end (taken before
    the stop) does not hold up the probes after it."""
    answers, readers = [], []

    def read(at: float, conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(REQUEST)
                answers.append((at, _answer(conn)))
            except ConnectionError as e:
                answers.append((at, f"reset: {e}"))

    while time.monotonic() < until:
        at = time.monotonic() - since
        conn = _connect(port, 0.1)
        if isinstance(conn, str):
            answers.append((at, conn))
        else:
            conn.settimeout(30)
            readers.append(threading.Thread(target=read, args=(at, conn)))
            readers[-1].start()
        time.sleep(0.003)
    for reader in readers:
        reader.join(timeout=60)
    out.extend(sorted(answers, key=lambda a: a[0]))


def _status(answer: bytes) -> int:
    return int(answer[9:12]) if isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 ") else 0


def _silent_only_while_stopping(probes: list) -> None:
    """A dropped handshake only during the stop, which then closes the port: every one comes before the first
    refusal (judged by order, not by a clock: a loaded machine may run the stop's few milliseconds late), and the
    stop holds at most two probes (each waits 0.1 s for its handshake)."""
    silent = [at for at, outcome in probes if outcome == "no handshake"]
    refused = [at for at, outcome in probes if outcome == "refused"]
    assert refused, probes  # then the port is closed, not silent
    shown = [(round(at, 3), outcome if isinstance(outcome, str) else outcome[:12]) for at, outcome in probes]
    assert all(at < refused[0] for at in silent) and len(silent) <= 2, shown


@pytest.mark.parametrize("workers", ["1", "2"])
def test_after_sigterm_new_connections_are_refused_and_every_taken_one_is_answered(exported, workers):  # noqa
    """uvicorn took new connections until its next tick (0.1 s; its supervisor's 0.5 s with workers) and closed
    those without a request unanswered; a request sent on a connection opened before SIGTERM got nothing back."""
    proc, url = start(exported["folder"], "--max-batch", "2", "--drain-seconds", "20", "--workers", workers,
                      prelude=slow_layer(0.03))
    port = int(url.rsplit(":", 1)[1])
    texts = exported["texts"]
    groups = [texts[k: k + 3] for k in range(0, 24, 3)]
    idle = socket.create_connection(("127.0.0.1", port))  # taken before SIGTERM, its request sent after
    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
        futures = [pool.submit(call, f"{url}/v2/models/acl/infer", oip_body(g)) for g in groups]
        all_accepted(url, sum(map(len, groups)), futures)
        proc.send_signal(signal.SIGTERM)
        stopped, probes = time.monotonic(), []
        prober = threading.Thread(target=_probe, args=(port, stopped, stopped + 0.4, probes))
        prober.start()
        time.sleep(0.25)  # past uvicorn's own tick: the idle connection has been dealt with
        idle.sendall(REQUEST)
        late = _answer(idle)
        prober.join()
        answers = [f.result() for f in futures]
    _, err = proc.communicate(timeout=60)
    idle.close()
    assert proc.returncode == 0, err[-3000:]
    assert [status for status, _, _ in answers] == [200] * len(groups)  # in flight at SIGTERM: served
    assert _status(late) == 503 and b"retry-after: 1" in late.lower(), late
    for at, outcome in probes:  # taken: answered 200, or 503 with Retry-After; never dropped
        assert outcome in ("refused", "no handshake") or _status(outcome) == 200 or (
            _status(outcome) == 503 and b"retry-after" in outcome.lower()), (at, outcome, probes[:12])
    _silent_only_while_stopping(probes)
    taken = [at for at, outcome in probes if outcome not in ("refused", "no handshake")]
    assert not taken or max(taken) < 0.05, taken  # stopped at once, not at uvicorn's tick (0.1 s, 0.5 s)
    assert len(probes) > 10


def _second_worker_starts_slowly(marks: str, seconds: float, stage: str) -> str:
    """A prelude for :func:`start`: the second ``--workers`` process to start takes ``seconds`` more in ``stage``
    ("app": loading its app; "startup": the app's startup, uvicorn's lifespan, which ran before listen()); it
    writes ``marks``/loading first. Every event loop runs late by 0.5 s once it listens (a loaded machine)."""
    return ("import asyncio, os, time\n"
            "from acl_runtime.serve import cli\n"
            "from uvicorn.lifespan.on import LifespanOn\n"
            "def slowly(step):\n"
            "    def run(*args):\n"
            "        try:\n"
            f"            os.close(os.open(os.path.join({marks!r}, 'first'), os.O_CREAT | os.O_EXCL))\n"
            "        except FileExistsError:\n"
            f"            open(os.path.join({marks!r}, 'loading'), 'w').close()\n"
            f"            time.sleep({seconds!r})\n"
            "        return step(*args)\n"
            "    return run\n"
            f"if {stage!r} == 'app':\n"
            "    cli.worker_app = slowly(cli.worker_app)\n"
            "else:\n"
            "    LifespanOn.startup = slowly(LifespanOn.startup)\n"
            "_start_serving = asyncio.base_events.Server._start_serving\n"
            "def _late(self):\n"
            "    _start_serving(self)\n"
            "    time.sleep(0.5)\n"
            "asyncio.base_events.Server._start_serving = _late\n")


@pytest.mark.parametrize("stage", ["app", "startup"])
def test_a_worker_still_starting_at_sigterm_never_listens(exported, tmp_path, stage):  # noqa: F811
    """A worker that had the signal while it loaded went on to start: its listen() opened the socket that the
    other worker had just shut, and it took connections after the signal (one of them was held for all of
    --drain-seconds). So did one that had it during its app's startup (uvicorn listens after the lifespan's startup
    whatever came meanwhile): it took connections and then, stopping, dropped handshakes after the port had refused
    them."""
    proc, url = start(exported["folder"], "--workers", "2", "--drain-seconds", "20",
                      prelude=_second_worker_starts_slowly(str(tmp_path), 3.0, stage))
    port = int(url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while not (tmp_path / "loading").exists():
        assert time.monotonic() < deadline, "the second worker did not start loading"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stopped, probes = time.monotonic(), []
    _probe(port, stopped, stopped + 4.5, probes)  # past the second worker's load
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    _silent_only_while_stopping(probes)
    first_refused = min(at for at, outcome in probes if outcome == "refused")
    taken = [(round(at, 3), _status(outcome) or outcome) for at, outcome in probes
             if outcome not in ("refused", "no handshake")]
    assert all(at < first_refused for at, _ in taken), taken[:12]  # the first worker's stop only, never after


def test_a_drain_out_of_time_answers_what_is_left_503_and_exits_0(exported):  # noqa: F811
    """Past --drain-seconds uvicorn cancels the handlers still waiting: each answers 503 with Retry-After (it
    sent nothing) and its rows leave the queue (they were computed for no one, and logged as left queued)."""
    proc, url = start(exported["folder"], "--max-batch", "2", "--drain-seconds", "1", prelude=slow_layer(0.05))
    texts = exported["texts"]
    groups = [texts[k: k + 3] for k in range(0, 36, 3)]
    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
        futures = [pool.submit(call, f"{url}/predict", {"inputs": [list(t) for t in g]}) for g in groups]
        all_accepted(url, sum(map(len, groups)), futures)
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        answers = [f.result() for f in futures]
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - stopped
    assert proc.returncode == 0, err[-3000:]
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    for status, headers, body in answers:
        if status == 503:
            assert headers["retry-after"] == "1" and "--drain-seconds ran out" in body["error"], body
    assert took < 1 + 1 + 5, took  # --drain-seconds, the scheduler's second, a loaded machine
    assert "still queued after --drain-seconds" not in err, err[-2000:]


def test_a_client_that_disconnects_while_queued_frees_its_rows(exported):  # noqa: F811
    """Its rows were computed to the end for no one, and counted against --max-queue meanwhile."""
    texts = exported["texts"][:8]
    with serving(exported["folder"], max_batch=1, max_queue=64) as (url, service):
        backend = service.scheduler.backend
        layer, calls = backend.layer, []

        def slow(i, x, mask):
            calls.append(len(x))
            time.sleep(0.03)
            return layer(i, x, mask)

        backend.layer = slow
        body = json.dumps({"inputs": [list(t) for t in texts]}).encode()
        port = int(url.rsplit(":", 1)[1])
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 30
        while service.scheduler.depth() < len(texts):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        conn.close()
        while service.scheduler.depth():
            assert time.monotonic() < deadline, service.scheduler.depth()
            time.sleep(0.01)
        done = len(calls)
        metrics = call(f"{url}/metrics")[2].decode()
        backend.layer = layer
        status, _, answer = call(f"{url}/predict", {"inputs": list(texts[0])})
    assert done < len(texts) * 2, done  # most rows never ran a layer (all of them: 8 rows x 3 layers)
    assert 'acl_requests_total{route="predict",status="499"} 1.0' in metrics
    assert status == 200 and answer[0]["label"] == exported["engine"].predict_early_exit(texts[:1])[0].label


def test_stalled_requests_at_drain_start_are_answered_503(exported):  # noqa: F811
    """A connection still sending its headers or its body when SIGTERM comes is answered 503 with Retry-After
    and closed at once (uvicorn closed it unanswered; waiting for it held the drain)."""
    proc, url = start(exported["folder"], "--drain-seconds", "20")
    port = int(url.rsplit(":", 1)[1])
    headers = socket.create_connection(("127.0.0.1", port))
    headers.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
    body = socket.create_connection(("127.0.0.1", port))
    body.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"inputs\"")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    answers = [_answer(headers), _answer(body)]
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - stopped
    headers.close()
    body.close()
    assert proc.returncode == 0 and took < 5, (took, err[-2000:])  # not --drain-seconds 20
    for answer in answers:
        assert _status(answer) == 503 and b"retry-after: 1" in answer.lower(), answer
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        call(f"{url}/v2/health/ready", timeout=5)


class _ResetTransport(asyncio.Transport):
    """A transport whose peer has reset: shutting its write side fails as the kernel's does (ENOTCONN)."""

    def __init__(self):
        super().__init__()
        self.written, self.closed = b"", False

    def get_extra_info(self, name, default=None):
        return default

    def write(self, data):
        self.written += data

    def can_write_eof(self):
        return True

    def write_eof(self):
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True


def test_a_connection_reset_just_before_the_drain_does_not_stop_it():
    """uvicorn's shutdown calls each connection's shutdown() in turn: the 503's write_eof() on a connection its
    client had just reset raised, and acl-serve exited 1 with the other connections unanswered (1 run in 8 of
    benchmarks/serve_stop.py)."""
    import uvicorn
    from uvicorn.server import ServerState

    from acl_runtime.serve.transport import NoDelayH11Protocol

    async def scenario():
        config = uvicorn.Config(lambda scope, receive, send: None, log_level="warning")
        config.load()
        protocol = NoDelayH11Protocol(config, ServerState(), {})
        transport = _ResetTransport()
        protocol.connection_made(transport)
        protocol.shutdown()  # no request under way: answered 503, or closed when it cannot be
        return transport

    transport = asyncio.run(scenario())
    assert transport.closed and transport.written.startswith(b"HTTP/1.1 503")


def test_serve_stop_counts_a_drop_at_the_signal_apart_from_a_drop_before_it():
    import serve_stop

    outcomes = [(0.0, "200", 0.1), (0.2, "dropped", 0.3),  # a drop in the steady state, before the signal
                (0.9, "dropped", 1.2),  # begun before the signal, reset after it: the listener's backlog closed
                (1.1, "refused", 1.1), (1.2, "503", 1.3), (1.3, "dropped", 1.4)]
    got = serve_stop.classify(outcomes, sigterm=1.0)
    assert (got["before_200"], got["before_dropped"], got["dropped_at_signal"]) == (1, 1, 1)
    assert (got["after_refused"], got["after_taken"], got["after_503"], got["after_dropped"]) == (1, 2, 1, 1)
    assert got["last_taken_ms"] == pytest.approx(300.0)


def test_serve_stop_measures_a_stop_with_every_connection_taken_answered(single_folder, tmp_path):  # noqa: F811
    """benchmarks/serve_stop.py at its smallest: one run, two clients; its JSON, and no replacing it. It sends
    single sentences: a model of one text per input (a pair model refuses them)."""
    import serve_stop

    out = tmp_path / "stop.json"
    argv = ["--folder", single_folder, "--workers", "1", "--runs", "1", "--clients", "2", "--before-seconds",
            "0.5", "--after-seconds", "0.3", "--json", str(out)]
    (row,) = serve_stop.main(argv)
    assert row["exit_code"] == 0 and row["before_200"] > 0 and row["after_refused"] > 0
    assert row["before_dropped"] == row["after_dropped"] == 0
    assert json.loads(out.read_text())["rows"][0]["after"] == row["after"]
    with pytest.raises(SystemExit) as refused:
        serve_stop.main(argv)
    assert refused.value.code == 2
