"""acl-serve at HTTP's edges, on real sockets (in-process server): a trailing slash, Content-Length with
Transfer-Encoding, Accept-Encoding's qvalues, requests h11 refuses, gzip members, an absolute-form target; and
--model-name values no route could serve (acl_runtime/serve/edges.py, transport.py, app.py, cli.py)."""
import gzip
import json
import socket

import pytest

from acl_runtime.serve import cli
from serve_helpers import call, exported, serving  # noqa: F401  (exported: a fixture)

BODY = b'{"inputs": ["the movie", "was good"]}'


@pytest.fixture(scope="module")
def server(exported):  # noqa: F811
    with serving(exported["folder"]) as (url, service):
        yield url


def _raw(url: str, data: bytes, timeout: float = 10):
    """Send ``data`` on a new connection and read until the server closes (or ``timeout``): (the answers' bytes,
    whether the server closed the connection)."""
    host, port = url.removeprefix("http://").split(":")
    got, closed = b"", False
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(data)
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    closed = True
                    break
                got += chunk
        except socket.timeout:
            pass
        except ConnectionResetError:
            closed = True
    return got, closed


def _first(answer: bytes):
    """(status, lower-case headers, body) of the first answer in ``answer``."""
    head, _, rest = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, rest[:int(headers.get("content-length", len(rest)))]


@pytest.mark.parametrize("method, path", [("GET", "/metrics/"), ("GET", "/v2/health/ready/"), ("POST", "/predict/"),
                                          ("POST", "/v2/models/acl/infer/")])
def test_a_trailing_slash_is_404_json_with_nothing_reflected(server, method, path):
    """It was a 307 to a URL built from the client's Host header: a following client posted its body there."""
    answer, _ = _raw(server, f"{method} {path} HTTP/1.1\r\nHost: evil.example\r\nContent-Length: {len(BODY)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + BODY)
    status, headers, body = _first(answer)
    assert status == 404 and "location" not in headers and b"evil" not in answer, answer
    assert headers["content-type"] == "application/json" and json.loads(body)["error"].startswith("no route")


def test_content_length_with_transfer_encoding_is_400_json_and_closed(server):
    """h11 framed it by Transfer-Encoding and kept the connection: the request pipelined after it was answered."""
    smuggled = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n"
                b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    answer, closed = _raw(server, smuggled)
    status, headers, body = _first(answer)
    assert status == 400 and "Transfer-Encoding" in json.loads(body)["error"], answer
    assert closed and answer.count(b"HTTP/1.1 ") == 1, answer  # the pipelined request never answered


@pytest.mark.parametrize("header, compressed", [("gzip", True), ("gzip;q=0", False), ("gzip;q=0, identity", False),
                                                ("gzip; q=0.5", True), ("*", True), ("identity, *;q=0", False),
                                                ("GZIP;Q=0", False), ("br, *;q=0.1", True), ("gzip;q=bad", False),
                                                ("deflate", False)])
def test_gzip_answers_honour_accept_encodings_qvalues(server, header, compressed):
    """Starlette compressed whenever the header held the letters gzip, gzip;q=0 included (RFC 9110 12.5.3)."""
    from acl_runtime.serve.edges import accepts_gzip

    status, headers, _ = call(f"{server}/openapi.json", headers={"Accept-Encoding": header})  # over 1 kB
    assert status == 200 and (headers.get("content-encoding") == "gzip") is compressed, headers
    assert accepts_gzip(header) is compressed


@pytest.mark.parametrize("request_bytes, status", [
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),  # a bad chunk size
    (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
    (b"GET /v2/health/ready HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
    (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n", 400),  # a NUL in a header
    (b"GET /v2/health/r\xc3\xa9ady HTTP/1.1\r\nHost: x\r\n\r\n", 400),  # a raw non-ASCII target
    (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n", 431),
])
def test_a_request_h11_refuses_is_answered_in_json_and_closed(server, request_bytes, status):
    """uvicorn answered these in plain text (Invalid HTTP request received.); serve.md promises JSON."""
    answer, closed = _raw(server, request_bytes)
    got, headers, body = _first(answer)
    assert (got, headers["content-type"]) == (status, "application/json"), answer[:300]
    message = json.loads(body)["error"]
    assert message.startswith("the request is not valid HTTP/1.1") and b"\xc3" not in body and "zz" not in message
    assert closed


def _post_gzip(url: str, body: bytes):
    return call(f"{url}/predict", body, headers={"Content-Encoding": "gzip"})


def test_every_gzip_member_is_read(server):
    """RFC 1952 2.2: a gzip body may be several members; only the first was read ("Input data was truncated")."""
    status, _, answer = _post_gzip(server, gzip.compress(BODY[:10]) + gzip.compress(BODY[10:]))
    assert status == 200 and answer[0]["label"] in ("0", "1"), answer
    assert call(f"{server}/predict", BODY)[2] == answer


@pytest.mark.parametrize("tail", [b"junk", b"\x1f", b"\x00" * 8])
def test_bytes_after_the_gzip_data_are_refused(server, tail):
    """They were dropped and the first member answered."""
    status, _, answer = _post_gzip(server, gzip.compress(BODY) + tail)
    assert status == 400 and "gzip" in answer["error"], answer


def test_a_second_gzip_member_with_a_bad_body_is_refused(server):
    status, _, answer = _post_gzip(server, gzip.compress(BODY) + gzip.compress(b", junk"))
    assert status == 400, answer  # read, and the JSON it completes is not valid


def test_an_absolute_form_target_is_served_by_its_path(server):
    """RFC 9112 3.2.2: a server MUST accept it; it was a 404."""
    host = server.removeprefix("http://")
    answer, _ = _raw(server, f"POST {server}/predict?x=1 HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                     f"\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n".encode() + BODY)
    status, _, body = _first(answer)
    assert status == 200 and json.loads(body)[0]["label"] in ("0", "1"), answer


@pytest.mark.parametrize("name", ["", "a/b", "stats", "-x", "a b", "é"])
def test_a_model_name_no_route_can_serve_is_refused_at_start(exported, capsys, monkeypatch, name):  # noqa: F811
    """'' and 'a/b' started and every model route answered 404; 'stats' hid the model's metadata behind the
    statistics route."""
    import uvicorn

    def served(*args, **kwargs):
        raise AssertionError(f"acl-serve started with --model-name {name!r}")

    monkeypatch.setattr(uvicorn.Server, "run", served)
    with pytest.raises(SystemExit) as stop:
        cli.main([exported["folder"], f"--model-name={name}", "--port", "0"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert stop.value.code == 2 and len(err) == 1 and "a model name is" in err[0], err


def test_a_model_name_every_route_serves_is_accepted():
    for name in ("acl", "sst2-v1.0", "Model_2"):
        assert cli.build_parser().parse_args(["x", "--model-name", name]).model_name == name


def test_an_encoded_slash_is_not_a_path_separator(server):
    """uvicorn decoded %2F before routing: acl%2Fversions%2F1 was routed as acl/versions/1."""
    status, _, answer = call(f"{server}/v2/models/acl%2Fversions%2F1")
    assert status == 404 and "%2F" in answer["error"], answer
    assert call(f"{server}/v2/models/acl/versions/1")[0] == 200


def test_an_output_asked_for_twice_is_refused(server):
    """It was merged silently (a duplicate input is a 400)."""
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["good"]}],
            "outputs": [{"name": "label"}, {"name": "label", "parameters": {"binary_data": True}}]}
    status, _, answer = call(f"{server}/v2/models/acl/infer", body)
    assert status == 400 and "'label' is asked for twice" in answer["error"], answer


def test_info_names_the_model_not_the_servers_folder(server):
    status, _, info = call(f"{server}/info")
    assert status == 200 and info["model_id"] == "acl", info


def test_a_long_model_name_in_a_path_is_cut_in_the_404(server):
    status, _, answer = call(f"{server}/v2/models/{'m' * 100_000}")
    assert status == 404 and len(answer["error"]) < 400, len(answer["error"])


def test_the_openapi_document_is_built_once(server):
    from acl_runtime.serve import app

    first = call(f"{server}/openapi.json")[2]
    hits = app._openapi.cache_info().hits
    assert call(f"{server}/openapi.json")[2] == first and app._openapi.cache_info().hits == hits + 1
