"""acl-serve's read timeout (--read-timeout): a connection whose request headers, or whose body, have not all
arrived in time is answered 408 and closed, and the server goes on serving."""
import socket
import time

import pytest

from serve_helpers import call, exported, serving  # noqa: F401  (exported: a fixture)

TIMEOUT = 1.0


@pytest.fixture(scope="module")
def server(exported):  # noqa: F811
    with serving(exported["folder"], read_timeout=TIMEOUT) as running:
        yield running


def _stall(url: str, sent: bytes) -> tuple:
    """(seconds until the server answered and closed, what it answered) for a connection that sends ``sent`` and
    then nothing."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10 * TIMEOUT) as conn:
        start = time.monotonic()
        conn.sendall(sent)
        answer = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return time.monotonic() - start, answer
            answer += chunk


@pytest.mark.parametrize("sent", [b"", b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: appl"],
                         ids=["nothing", "half the headers"])
def test_headers_not_in_within_the_read_timeout_are_408_and_closed(server, sent):
    url, _ = server
    took, answer = _stall(url, sent)
    assert TIMEOUT * 0.9 <= took < 8 * TIMEOUT, took  # not early; the 408 says it was the timeout (slack: load)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"--read-timeout" in answer, answer
    assert call(f"{url}/predict", {"inputs": ["good", "bad"]})[0] == 200


@pytest.mark.parametrize("path", ["/predict", "/v2/models/acl/infer"])
def test_a_body_not_in_within_the_read_timeout_is_408_and_closed(server, path):
    url, service = server
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    took, answer = _stall(url, head.encode() + b'{"inputs": "go')
    assert TIMEOUT * 0.9 <= took < 8 * TIMEOUT, took  # not early; the 408 says it was the timeout (slack: load)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"did not all arrive within 1 s (--read-timeout)" in answer
    assert call(f"{url}/predict", {"inputs": ["good", "bad"]})[0] == 200
    deadline = time.monotonic() + 10  # the scheduler's count drops just after the answer goes out
    while service.scheduler.depth() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.scheduler.depth() == 0  # nothing of the timed-out request is left queued


def test_a_kept_alive_connection_is_not_timed_out_between_quick_requests(server):
    """The deadline runs from a request's first byte (or the connection's opening), not over the connection."""
    import http.client

    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    start = time.monotonic()
    while time.monotonic() - start < 2.5 * TIMEOUT:
        conn.request("POST", "/predict", b'{"inputs": ["good", "bad"]}', {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.read()
        time.sleep(0.2)
    conn.close()
