"""acl-serve as a real process: SIGTERM stops accepting, answers every accepted request and exits 0 within the bound;
neither torch nor fairseq is imported where they are installed; bad flags are one line and exit 2 before anything
listens; --workers 2 (answers, metrics, SIGTERM, a worker that dies; the latency bound under slow)."""
import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error

import pytest

import helpers
from acl_runtime.serve import cli
from serve_helpers import (  # noqa: F401
    SLOW_LAYER,
    all_accepted,
    assert_oip_equals_engine,
    call,
    exported,
    free_port,
    metric,
    oip_body,
    slow_layer,
    start,
)


def test_sigterm_stops_accepting_answers_every_accepted_request_and_exits_0(exported):  # noqa: F811
    proc, url = start(exported["folder"], "--max-batch", "4", "--drain-seconds", "20", prelude=SLOW_LAYER)
    texts = exported["texts"]
    groups = [texts[k: k + 3] for k in range(0, 36, 3)]
    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
        futures = [pool.submit(call, f"{url}/v2/models/acl/infer", oip_body(g)) for g in groups]
        all_accepted(url, sum(map(len, groups)), futures)  # then SIGTERM
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        time.sleep(0.3)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # refused, or the connection closed unanswered
            call(f"{url}/v2/health/ready", timeout=5)
        answers = [f.result() for f in futures]
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - stopped
    assert proc.returncode == 0, err[-3000:]
    assert took < 20, took  # --drain-seconds
    for group, (status, _, answer) in zip(groups, answers):
        assert status == 200, answer
        assert_oip_equals_engine(answer, exported["engine"].predict_early_exit(group))
    assert err.split("LOADED ")[-1].strip() == "[]"  # neither torch nor fairseq, though both are installed


@pytest.mark.parametrize("argv, words", [
    (["{missing}"], "nor manifest.json. Fix: pass a folder that acl-export --format onnx wrote"),
    (["{folder}", "--precision", "int8", "--policy", "entropy", "--threshold", "1.5"], "out of range: it takes [0, 1]"),
    (["{folder}", "--threshold", "0.3"], "a threshold needs its policy"),
    (["{folder}", "--max-batch", "64", "--max-queue", "8"], "--max-queue 8 is below --max-batch 64"),
    (["{folder}", "--port", "70000"], "a port is a whole number from 0 to 65535"),
])
def test_bad_flags_are_one_line_and_exit_2_before_anything_listens(exported, tmp_path, capsys, argv,  # noqa: F811
                                                                    words):
    argv = [a.format(folder=exported["folder"], missing=str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as stop:
        try:
            cli.main(argv)
        except cli.UsageError as e:  # console.run prints it as one line
            print(f"acl-serve: error: {e}", file=sys.stderr)
            raise
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert stop.value.code == 2 and len(lines) == 1 and words in lines[0], lines


def test_a_port_in_use_is_one_line_naming_it_and_exit_2_without_a_banner(exported, capsys):  # noqa: F811
    """The socket is bound before the model loads; the banner (which said the server ran) never comes."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(cli.UsageError) as refused:
            cli.main([exported["folder"], "--port", str(port)])
    assert f"port {port} on 127.0.0.1 is in use" in str(refused.value) and "\n" not in str(refused.value)
    assert "acl-serve: acl from" not in capsys.readouterr().err


@pytest.mark.parametrize("field, value, words", [
    ("pad", 3, "input_layout's pad 3 is not the padding id of embed.onnx"),
    ("max_positions", 100, "input_layout's max_positions 100, but embed.onnx's position table holds fewer"),
])
def test_a_manifest_changed_against_its_graphs_is_one_line_naming_the_field_and_exit_2(exported, tmp_path,  # noqa
                                                                                         capsys, monkeypatch, field,
                                                                                         value, words):
    """The files keep their sha256, so only the graphs can tell: the embeddings graph's padding id and position
    table. A larger max_positions once loaded and failed later, on the first long text, with a 500."""
    import uvicorn

    def served(*args, **kwargs):
        raise AssertionError("the changed folder was served")

    monkeypatch.setattr(uvicorn.Server, "run", served)
    folder = shutil.copytree(exported["folder"], tmp_path / "onnx")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["input_layout"][field] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(cli.UsageError) as refused:
        cli.main([str(folder), "--port", str(free_port())])
    message = str(refused.value)
    assert words in message and "\n" not in message and message.startswith(str(folder / "manifest.json")), message
    assert "acl-serve: acl from" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "61", "soon"])
def test_a_read_timeout_outside_0_to_60_seconds_is_refused(exported, capsys, value):  # noqa: F811
    with pytest.raises(SystemExit) as stop:
        cli.main([exported["folder"], "--read-timeout", value])
    assert stop.value.code == 2 and "at most 60" in capsys.readouterr().err


def test_the_banner_comes_once_the_port_listens(exported):  # noqa: F811
    """A client that connects when the banner is out is served (stalled connections at SIGTERM:
    tests/serve/test_serve_shutdown.py)."""
    port = free_port()
    argv = ["acl-serve", exported["folder"], "--port", str(port)]
    code = f"import sys\nsys.argv = {argv!r}\nfrom acl_runtime.serve.cli import cli_main\ncli_main()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=helpers.REPO, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.startswith("acl-serve: acl from"):
                break
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:  # refused if the banner came early
            conn.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(100).startswith(b"HTTP/1.1 200")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stderr.close()
    assert proc.returncode == 0


@pytest.mark.parametrize("argv", [["acl-serve", "{folder}", "--port", "8080"], ["acl-serve", "--help"]])
def test_importing_the_package_for_acl_serve_imports_neither_torch_nor_fairseq(exported, argv):  # noqa: F811
    """What the workers of --workers N do too: multiprocessing hands them the parent's argv before they import it.
    --help took 9.5 s when it registered with fairseq. Every other command still registers
    (tests/inference/test_onnx.py)."""
    argv = [a.format(folder=exported["folder"]) for a in argv]
    code = (f"import sys\nsys.argv = {argv!r}\nimport acl_runtime.serve.app\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'fairseq'}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=helpers.REPO)
    assert proc.returncode == 0 and proc.stdout.split("\n")[-2] == "[]", proc.stderr[-2000:]


def test_two_workers_share_the_port_sum_their_metrics_and_stop_on_sigterm(exported):  # noqa: F811
    proc, url = start(exported["folder"], "--workers", "2")
    texts = exported["texts"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda k: call(f"{url}/predict", {"inputs": [list(texts[k % len(texts)])]}),
                                range(40)))
    assert [status for status, _, _ in answers] == [200] * 40
    for k, (_, _, answer) in enumerate(answers):
        want = exported["engine"].predict_early_exit([texts[k % len(texts)]])[0]
        scores = {e["label"]: e["score"] for e in answer[0]}
        assert (answer[0][0]["label"], answer[0][0]["exit_layer"]) == (want.label, want.exit_layer)
        assert max(abs(scores[n] - v) for n, v in want.probabilities.items()) < 1e-5
    metrics = call(f"{url}/metrics")[2].decode()
    assert metric(metrics, 'acl_requests_total{route="predict",status="200"}') == 40
    assert metric(metrics, "acl_queue_depth") == 0  # each worker's gauge fell with its last answer, scraped or not
    workers = _children(proc.pid)  # the supervisor's: uvicorn's workers (and multiprocessing's resource tracker)
    assert len(workers) >= 2
    for pid in [proc.pid] + workers:  # torch's library mapped in none of them
        assert "libtorch" not in open(f"/proc/{pid}/maps").read()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]


@pytest.mark.slow  # a wall-clock bound: on a loaded machine it measures the machine
def test_two_workers_answer_a_kept_alive_connection_without_nagles_delay(exported):  # noqa: F811
    """Without TCP_NODELAY on the workers' sockets (acl_runtime/serve/transport.py) every answer waited 40 ms or
    more for the client's delayed ACK; with it, about 1.3 ms."""
    proc, url = start(exported["folder"], "--workers", "2")
    try:
        assert _median_latency(url) < 0.03
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def _children(pid: int):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _median_latency(url: str, n: int = 20) -> float:
    """Seconds a /predict takes on one kept-alive connection, one request at a time (the median of ``n``)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        conn.request("POST", "/predict", b'{"inputs": ["good", "bad"]}', {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.read()  # an answer, not a refusal's time
        times.append(time.perf_counter() - start)
    conn.close()
    return statistics.median(times)


def _workers(pid: int):
    """The supervisor's uvicorn workers (not multiprocessing's resource tracker)."""
    def cmdline(child):
        with open(f"/proc/{child}/cmdline", "rb") as f:
            return f.read()
    return [c for c in _children(pid) if b"spawn_main" in cmdline(c) and b"resource_tracker" not in cmdline(c)]


def _gauge_of(folder: str, pid: int) -> float:
    """acl_queue_depth as one worker's own file in the metrics folder holds it (0 when it has none)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    path = os.path.join(folder, f"gauge_livesum_{pid}.db")
    if not os.path.exists(path):
        return 0.0
    alone = tempfile.mkdtemp()
    shutil.copy(path, alone)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=alone)  # reads the folder at each collection
    value = registry.get_sample_value("acl_queue_depth") or 0.0
    shutil.rmtree(alone)
    return value


def test_a_worker_that_dies_is_replaced_and_its_queue_depth_leaves_the_metrics(exported):  # noqa: F811
    """uvicorn's supervisor replaced a dead worker, but prometheus-client's file of the dead worker's live gauge
    stayed, so /metrics added the rows it held when it died to acl_queue_depth for ever."""
    proc, url = start(exported["folder"], "--workers", "2", "--max-batch", "2", prelude=slow_layer(0.05))
    environ = open(f"/proc/{_workers(proc.pid)[0]}/environ", "rb").read().split(b"\0")  # set after the start
    folder = next(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
    texts = exported["texts"]
    groups = [[texts[(3 * k + j) % len(texts)] for j in range(3)] for k in range(16)]

    def ask(group):
        try:
            return call(f"{url}/predict", {"inputs": [list(t) for t in group]})[0]
        except (urllib.error.URLError, ConnectionError):
            return "dropped"  # the killed worker's own clients

    try:
        with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
            futures = [pool.submit(ask, g) for g in groups]
            deadline, victim = time.monotonic() + 30, None
            while victim is None:
                assert time.monotonic() < deadline, ("no worker ever held queued rows", folder, os.listdir(folder),
                                                     _workers(proc.pid))
                time.sleep(0.01)
                for pid in _workers(proc.pid):
                    os.kill(pid, signal.SIGSTOP)  # its gauge holds still while it is read
                    if _gauge_of(folder, pid) > 0:
                        victim = pid
                        os.kill(pid, signal.SIGKILL)
                        break
                    os.kill(pid, signal.SIGCONT)
            statuses = [f.result() for f in futures]
        while len(set(_workers(proc.pid)) - {victim}) < 2:  # replaced
            assert time.monotonic() < deadline + 30, _workers(proc.pid)
            time.sleep(0.1)
        while metric(call(f"{url}/metrics")[2].decode(), "acl_queue_depth") != 0:
            assert time.monotonic() < deadline + 40, "the dead worker's queue depth stayed in /metrics"
            time.sleep(0.1)
        assert not os.path.exists(os.path.join(folder, f"gauge_livesum_{victim}.db"))
        assert set(statuses) <= {200, "dropped"}, statuses  # the kernel may have given every one to the victim
        assert call(f"{url}/predict", {"inputs": ["good", "bad"]})[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
