"""What tests/test_serve*.py share: the tiny exported folder, an in-process acl-serve on a free loopback port, and
a plain-JSON client (urllib: no client library of ours between the test and the server)."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

import helpers

_EXPORTED = {}  # the test files importing the fixture share one export (20 s), as a conftest fixture would


@pytest.fixture(scope="module")
def exported(predict_run, tmp_path_factory):
    """predict_run's tiny multi-exit model (every layer an exit, sentence pairs) through acl-export --format onnx
    --quantize int8, its validation pairs (and more pairs: see _export), and the engine acl-predict would run on
    the folder."""
    if _EXPORTED.get("run") != predict_run:
        _EXPORTED.update(run=predict_run, value=_export(predict_run, tmp_path_factory))
    return _EXPORTED["value"]


def _export(predict_run, tmp_path_factory):
    from acl_fairseq.hf import export
    from acl_runtime.engine import Engine

    _, data, ckpt = predict_run
    out = tmp_path_factory.mktemp("serve") / "out"
    export.main([ckpt, "--data", data, "--output", str(out), "--format", "onnx", "--quantize", "int8",
                 "--metrics-split", "none"])
    folder = str(out / "onnx")
    texts, _ = helpers.raw_split(data)
    # pairs (the model reads a pair per input: a lone text is refused, acl_runtime.pairing), their sides swapped,
    # and the odd ones: spacing, accents, a text over the positions (an empty text is refused, as acl-predict skips
    # an empty line: tests/serve/test_serve_errors.py)
    texts = list(texts) + [(b, a) for a, b in texts][:8] + [
        ("  the   movie ", texts[0][1]), ("café naïve", texts[1][1]), (" ".join(["good"] * 400), texts[2][1])]
    return {"folder": folder, "texts": texts, "engine": Engine(folder, threads=1)}


@pytest.fixture(scope="module")
def single_folder(single_run, tmp_path_factory) -> str:
    """conftest's classifier of one text per input, exported to ONNX: for the clients that send a lone text (a pair
    model refuses one: tests/inference/test_pairing.py)."""
    from acl_fairseq.hf import export

    data, ckpt = single_run
    out = tmp_path_factory.mktemp("serve_single") / "out"
    export.main([ckpt, "--data", data, "--output", str(out), "--format", "onnx", "--metrics-split", "none"])
    return os.path.join(str(out), "onnx")


@pytest.fixture(scope="module")
def regression_folder(regression_run, tmp_path_factory):
    """conftest's tiny multi-exit model trained on the toy task's [0, 1] scores (shared with
    test_export_errors.py), exported to ONNX, and its validation texts: a model of one text per input."""
    from acl_fairseq.hf import export

    ckpt, data = regression_run
    out = tmp_path_factory.mktemp("serve_regression") / "out"
    export.main([ckpt, "--data", data, "--output", str(out), "--format", "onnx", "--metrics-split", "none"])
    return os.path.join(str(out), "onnx"), helpers.raw_split(data)[0][:12]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(folder: str, **settings):
    """acl-serve's app on uvicorn in a thread of this process, with acl-serve's h11 protocol (TCP_NODELAY, the
    headers' read timeout): (base URL, Service)."""
    import uvicorn

    from acl_runtime.serve.app import Service, Settings, build_app
    from acl_runtime.serve.transport import NoDelayH11Protocol

    service = Service(Settings(folder, **settings))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(build_app(service), log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                            http=NoDelayH11Protocol)
    config.acl_read_timeout = service.settings.read_timeout  # as acl-serve sets it (serve/cli.py)
    server = uvicorn.Server(config)
    thread = run_in_thread(server, sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", service
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def run_in_thread(server, sock: socket.socket) -> threading.Thread:
    """Run a uvicorn ``server`` on the bound ``sock`` in a daemon thread; the thread, once the server serves."""
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    return thread


def call(url: str, body=None, method=None, headers=None, timeout: float = 60):
    """(status, headers (lower-case names), parsed JSON body or the raw bytes); ``body``: a dict (sent as JSON) or
    bytes."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, head, raw = r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        status, head, raw = e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    try:
        return status, head, json.loads(raw) if raw else None
    except ValueError:
        return status, head, raw


def oip_body(texts, **parameters):
    """An OIP v2 infer request in plain JSON: a ``text`` tensor, and ``text_pair`` when the inputs are pairs."""
    pairs = [t if isinstance(t, (tuple, list)) else (t, None) for t in texts]
    inputs = [{"name": "text", "shape": [len(pairs)], "datatype": "BYTES", "data": [a for a, _ in pairs]}]
    if all(b is not None for _, b in pairs):
        inputs.append({"name": "text_pair", "shape": [len(pairs)], "datatype": "BYTES", "data": [b for _, b in pairs]})
    body = {"inputs": inputs}
    if parameters:
        body["parameters"] = parameters
    return body


def triton_pairs(pairs, binary_data: bool = True) -> list:
    """tritonclient.http's input tensors ``text`` and ``text_pair`` of (text, text_pair) ``pairs``."""
    import numpy as np
    import tritonclient.http as triton

    tensors = []
    for name, column in (("text", 0), ("text_pair", 1)):
        t = triton.InferInput(name, [len(pairs)], "BYTES")
        t.set_data_from_numpy(np.asarray([p[column] for p in pairs], dtype=object), binary_data=binary_data)
        tensors.append(t)
    return tensors


def outputs(answer) -> dict:
    return {o["name"]: o["data"] for o in answer["outputs"]}


def slow_layer(seconds: float) -> str:
    """A prelude for :func:`start`: every encoder layer takes ``seconds`` more (a model big enough that requests
    are still queued when the test acts)."""
    return ("import time\n"
            "from acl_runtime.engine import OrtBackend\n"
            "_layer = OrtBackend.layer\n"
            "def layer(self, i, x, mask):\n"
            f"    time.sleep({seconds!r})\n"
            "    return _layer(self, i, x, mask)\n"
            "OrtBackend.layer = layer\n")


SLOW_LAYER = slow_layer(0.02)


def start(folder: str, *flags: str, prelude: str = "", wrap=()):
    """acl-serve FOLDER FLAGS in a fresh interpreter, and its URL once ready. ``prelude`` runs first in it and in
    each ``--workers`` process (spawned: a fresh interpreter too), as a ``sitecustomize`` module; ``wrap``: a
    command that runs the interpreter (its argv prefix)."""
    port = free_port()
    env = dict(os.environ)
    if prelude:
        site = tempfile.mkdtemp(prefix="acl_serve_prelude_")
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(prelude)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, helpers.REPO, env.get("PYTHONPATH")) if p)
    argv = ["acl-serve", folder, "--port", str(port), *flags]
    code = (f"import sys\nsys.argv = {argv!r}\n"  # before acl_fairseq is imported: what the command line gives
            "import atexit\n"
            "atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'torch', "
            "'fairseq'}), file=sys.stderr))\n"
            "from acl_runtime.serve.cli import cli_main\ncli_main()\n")
    proc = subprocess.Popen([*wrap, sys.executable, "-c", code], cwd=helpers.REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while True:
        try:
            if call(f"{url}/v2/health/ready", timeout=5)[0] == 200:
                return proc, url
        except (urllib.error.URLError, ConnectionError, TimeoutError):  # a loaded machine: the workers still load
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"acl-serve did not start: {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)


def metric(text: str, name: str) -> float:
    """The value of one sample line of a /metrics exposition (``name`` with its labels), 0 when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def all_accepted(url: str, rows: int, futures=()) -> None:
    """Wait until every one of ``rows`` inputs sent is accepted (queued or answered) and some are still queued: a
    request whose connection the server has not yet taken when the test acts is refused, rightly."""
    deadline = time.monotonic() + 30
    while True:
        text = call(f"{url}/metrics")[2].decode()
        queued = metric(text, "acl_queue_depth")
        if queued and queued + metric(text, "acl_exit_layer_count") == rows:
            return
        assert time.monotonic() < deadline, f"{queued:g} of {rows} rows queued"
        assert not any(f.done() and f.result()[0] != 200 for f in futures)
        time.sleep(0.005)


def assert_oip_equals_engine(answer: dict, want: list, abs_tol: float = 1e-5) -> None:
    """An OIP answer's labels, exit layers and probabilities (to ``abs_tol``) against the engine's predictions."""
    got = outputs(answer)
    assert got["label"] == [p.label for p in want]
    assert got["exit_layer"] == [p.exit_layer for p in want]
    names = list(want[0].probabilities)
    probs = got["probabilities"]
    for k, p in enumerate(want):
        row = probs[k * len(names): (k + 1) * len(names)]
        assert max(abs(a - p.probabilities[n]) for a, n in zip(row, names)) < abs_tol, (row, p)
