"""Promises of docs/serve.md that no test guarded: bugs planted one at a time in the serving code broke each with
every test passing. Each test here asserts the exact answer (in-process server unless it needs signals)."""
import json
import os
import signal
import socket
import time

import numpy as np
import pytest

from acl_runtime import exits
from serve_helpers import call, exported, oip_body, outputs, serving, start  # noqa: F401  (exported: a fixture)


def _plant(service, per_exit):
    """Every exit layer of ``service``'s backend answers the logits ``per_exit[layer]`` (a row of K) for every row."""
    backend = service.scheduler.backend
    layer = backend.layer

    def planted(i, x, mask):
        hidden, logits = layer(i, x, mask)
        if logits is None:
            return hidden, None
        return hidden, np.tile(np.asarray(per_exit[i], dtype=logits.dtype), (logits.shape[0], 1))

    backend.layer = planted


def test_patience_counts_consecutive_agreeing_exits():
    """A run broken by a changed prediction starts again (exits.py): labels 0 0 1 1 1 2 at patience 2 leave at the
    fifth exit (the third 1), not the fourth (two agreements in all)."""
    labels = [0, 0, 1, 1, 1, 2]
    per_exit = [np.eye(3, dtype=np.float32)[[k]] * 5 for k in labels]
    assert int(exits.exit_layer_indices(per_exit, "patience", 2)[0]) == 4
    assert int(exits.exit_layer_indices(per_exit, "patience", 1)[0]) == 1


@pytest.mark.parametrize("threshold, per_exit, layer", [
    (0.5, {1: [0.0, 0.0], 2: [3.0, 0.0], 3: [3.0, 0.0]}, 1),  # p = 0.5 exactly at the first exit: at least 0.5
    (1.0, {1: [0.0, 0.0], 2: [200.0, 0.0], 3: [0.0, 0.0]}, 2),  # p = 1.0 exactly (float32) at the second
])
def test_confidence_exits_at_a_probability_equal_to_the_threshold(exported, threshold, per_exit, layer):  # noqa
    with serving(exported["folder"]) as (url, service):
        _plant(service, per_exit)
        status, _, answer = call(f"{url}/v2/models/acl/infer",
                                 oip_body([("good", "bad"), ("bad", "good")], policy="confidence", threshold=threshold))
    assert status == 200 and outputs(answer)["exit_layer"] == [layer, layer], answer


def test_an_oip_answers_parameters_are_the_requests_that_ran(exported):  # noqa: F811
    with serving(exported["folder"], policy="entropy", threshold=0.3) as (url, _):
        asked = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")], policy="confidence", threshold=0.7))[2]
        fixed = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")], exit_layer=2))[2]
        default = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")]))[2]
    assert asked["parameters"] == {"policy": "confidence", "threshold": 0.7, "truncated": 0}, asked
    assert fixed["parameters"] == {"policy": "none", "exit_layer": 2, "truncated": 0}, fixed
    assert outputs(fixed)["exit_layer"] == [2]
    assert default["parameters"] == {"policy": "entropy", "threshold": 0.3, "truncated": 0}, default


def _chunked(url: str, path: str, body: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: "
                     "chunked\r\nConnection: close\r\n\r\n".encode())
        for k in range(0, len(body), 4096):
            part = body[k: k + 4096]
            conn.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
        conn.sendall(b"0\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("path", ["/predict", "/v2/models/acl/infer"])
def test_a_chunked_body_over_max_body_bytes_is_413(exported, path):  # noqa: F811
    """No Content-Length to refuse it by: it is counted as it streams in."""
    body = json.dumps({"inputs": "x " * 3000}).encode()  # 6 kB
    with serving(exported["folder"], max_body_bytes=4096) as (url, _):
        answer = _chunked(url, path, body)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"over the limit of 4096 bytes" in answer


def test_binary_data_output_returns_the_listed_outputs_binary_and_binary_data_false_keeps_one_json(exported):  # noqa
    body = oip_body([("good", "bad"), ("bad", "good")], binary_data_output=True)
    body["outputs"] = [{"name": "exit_layer"}, {"name": "label", "parameters": {"binary_data": False}}]
    with serving(exported["folder"]) as (url, _):
        status, headers, raw = call(f"{url}/v2/models/acl/infer", body)
    assert status == 200 and headers["content-type"] == "application/octet-stream", headers
    size = int(headers["inference-header-content-length"])
    head = json.loads(raw[:size])
    by_name = {o["name"]: o for o in head["outputs"]}
    assert by_name["exit_layer"]["parameters"]["binary_data_size"] == 16 and "data" not in by_name["exit_layer"]
    assert "binary_data_size" not in by_name["label"].get("parameters", {}) and len(by_name["label"]["data"]) == 2
    assert len(raw) == size + 16 and np.frombuffer(raw[size:], dtype="<i8").tolist() == [3, 3]


@pytest.mark.parametrize("pair", [["", "the movie"], ["the movie", "   "], ["\u200b", "the movie"],
                                  ["the movie", " \ufeff"]])
def test_predict_refuses_a_blank_text_on_either_side_of_a_pair(exported, pair):  # noqa: F811
    """Blank as acl-predict reads it (acl_runtime.inputs.blank): spaces, or only format characters such as a
    zero-width space, which show nothing and tokenize to nothing."""
    with serving(exported["folder"]) as (url, _):
        status, _, answer = call(f"{url}/predict", {"inputs": pair})
    assert status == 422 and "empty or only spaces" in answer["error"], answer


def test_predict_refuses_a_truncation_direction_other_than_right(exported):  # noqa: F811
    with serving(exported["folder"]) as (url, _):
        status, _, answer = call(f"{url}/predict", {"inputs": "good", "truncation_direction": "left"})
    assert status == 422 and "truncation_direction" in answer["error"], answer


def test_a_failed_request_counts_in_triton_fail_not_success(exported):  # noqa: F811
    with serving(exported["folder"]) as (url, service):
        assert call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")]))[0] == 200
        backend = service.scheduler.backend
        backend.layer = lambda i, x, mask: (_ for _ in ()).throw(RuntimeError("a planted fault"))
        assert call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")]))[0] == 500
        stats = call(f"{url}/v2/models/acl/stats")[2]["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 1 and stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_count"] == 1, stats


def test_no_backend_call_is_over_max_batch(exported):  # noqa: F811
    """The batch cap, through the server: 9 inputs in one request and 3 more at once, --max-batch 2."""
    rows = []
    with serving(exported["folder"], max_batch=2, max_queue=64) as (url, service):
        backend = service.scheduler.backend
        layer = backend.layer

        def counted(i, x, mask):
            rows.append(mask.shape[0])
            return layer(i, x, mask)

        backend.layer = counted
        status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body([("good movie", "bad")] * 9))
    assert status == 200 and len(outputs(answer)["label"]) == 9
    assert rows and max(rows) == 2, rows


def test_policy_none_answers_from_the_last_exit_whatever_the_default(exported):  # noqa: F811
    with serving(exported["folder"], policy="confidence", threshold=0.0) as (url, _):  # the default: the first exit
        none = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad"), ("bad", "good")], policy="none"))[2]
        default = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad"), ("bad", "good")]))[2]
        tei = call(f"{url}/predict", {"inputs": ["good", "bad"], "policy": "none"})[2]
    assert outputs(none)["exit_layer"] == [3, 3] and none["parameters"]["policy"] == "none", none
    assert outputs(default)["exit_layer"] == [1, 1], default
    assert tei[0]["exit_layer"] == 3, tei


def test_sigterm_reaches_every_worker_at_once_while_the_health_check_waits(exported):  # noqa: F811
    """The supervisor's main thread waits up to 5 s on a worker that does not answer its health check (here one
    stopped with SIGSTOP); the signal is passed on from the handler, so the other worker stops taking
    connections at once, not after that wait."""
    from test_serve_supervisor import _serving, _workers

    proc, url, log = _serving(exported["folder"])
    stuck = _workers(proc.pid)[0]
    host, port = url.removeprefix("http://").split(":")
    try:
        os.kill(stuck, signal.SIGSTOP)
        time.sleep(1.0)  # the supervisor's next tick pings it, and waits
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=0.2).close()
            except (ConnectionRefusedError, socket.timeout):
                break
            assert time.monotonic() - signalled < 1.0, "the port still took connections 1 s after SIGTERM"
            time.sleep(0.01)
    finally:
        os.kill(stuck, signal.SIGCONT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.text()[-3000:]


def test_a_kept_alive_connection_idle_at_sigterm_gets_503_with_retry_after_1(exported):  # noqa: F811
    proc, url = start(exported["folder"])
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(65536).startswith(b"HTTP/1.1 200")
        proc.send_signal(signal.SIGTERM)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    proc.communicate(timeout=60)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1\r\n" in answer.lower(), answer
    assert proc.returncode == 0
