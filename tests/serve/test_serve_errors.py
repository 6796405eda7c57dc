"""acl-serve refuses bad requests with a 4xx and one line, and never dies of them; a full queue answers 503 with
Retry-After, and every request gets exactly one answer."""
import concurrent.futures
import gzip
import json
import struct
import time
import zlib

import numpy as np
import pytest

from acl_runtime import exits
from serve_helpers import call, exported, oip_body, outputs, serving  # noqa: F401  (exported: a fixture)

MAX_QUEUE = 64
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def server(exported):  # noqa: F811
    with serving(exported["folder"], max_batch=8, max_queue=MAX_QUEUE, max_body_bytes=MAX_BODY) as running:
        yield running


def _text(n=1):
    return {"name": "text", "shape": [n], "datatype": "BYTES", "data": ["good"] * n}


def _pair(n=1):
    """Both tensors of n pairs: what the pair model reads (a lone text is refused, tests/inference/test_pairing.py),
    for the requests refused for something else."""
    return [_text(n), {**_text(n), "name": "text_pair"}]


OIP_ERRORS = [  # (path, body, status, words of the message)
    ("acl/infer", b"{not json", 400, "not valid JSON"),
    ("acl/infer", [1, 2], 400, "JSON object"),
    ("acl/infer", {"inputs": []}, 400, "non-empty list"),
    ("acl/infer", {"inputs": [{**_text(), "datatype": "FP32"}]}, 400,
     "inputs[0].datatype: invalid enum value 'FP32': it takes BYTES"),
    ("acl/infer", {"inputs": [{**_text(), "shape": [2]}]}, 400, "but 1 elements"),
    ("acl/infer", {"inputs": [{**_text(), "data": [3]}]}, 400, "inputs[0].data[0]: expected 'str | list', got 'int'"),
    ("acl/infer", {"inputs": [{**_text(), "data": "good"}]}, 400, "inputs[0].data: expected 'list | null', got 'str'"),
    ("acl/infer", {"inputs": [{**_text(), "name": "sentence"}]}, 400,
     "inputs[0].name: invalid enum value 'sentence': it takes text, text_pair"),
    ("acl/infer", {"inputs": [{**_text(), "name": "text_pair"}]}, 400, "\"text\" is missing"),
    ("acl/infer", {"inputs": [_text(2), {**_text(1), "name": "text_pair"}]}, 400, "one pair per text"),
    ("acl/infer", {"inputs": [_text(0)]}, 400, "input text is empty"),
    ("acl/infer", {"inputs": [_text()], "outputs": [{"name": "logits"}]}, 400,
     "outputs[0].name: invalid enum value 'logits': it takes label"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"polcy": "entropy"}}, 400,
     "parameters: unknown field 'polcy': it takes policy, threshold, exit_layer"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"policy": 3}}, 400,
     "parameters.policy: expected 'str | null', got 'int'"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"policy": "entropy", "threshold": "0.3"}}, 400,
     "parameters.threshold: expected 'int | float | null', got 'str'"),
    ("acl/infer", {"inputs": _pair(), "parameters": {"policy": "fast"}}, 400, "unknown early-exit policy 'fast'"),
    ("acl/infer", {"inputs": _pair(), "parameters": {"threshold": 0.3}}, 400, "a threshold needs its policy"),
    ("acl/infer", {"inputs": _pair(), "parameters": {"exit_layer": 7}}, 400, "exit layer 7 is not one of"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"exit_layer": True}}, 400,
     "parameters.exit_layer: expected 'int | null', got 'bool'"),
    ("acl/infer", {"inputs": _pair(), "parameters": {"policy": "entropy", "exit_layer": 2}}, 400, "not both"),
    ("acl/infer", {"inputs": _pair(MAX_QUEUE + 1)}, 413, f"more than the queue holds (--max-queue {MAX_QUEUE})"),
    ("nope/infer", {"inputs": [_text()]}, 404, "unknown model 'nope': this server serves 'acl'"),
    ("acl/versions/2/infer", {"inputs": [_text()]}, 404, "unknown model 'acl' version '2'"),
    ("nope", None, 404, "unknown model 'nope'"),
    # a non-object where an object goes (once 500 AttributeError), strings for booleans (once read as true)
    ("acl/infer", {"inputs": [_text()], "parameters": ["policy"]}, 400,
     "parameters: expected 'object | null', got a list"),
    ("acl/infer", {"inputs": [{**_text(), "parameters": []}]}, 400,
     "inputs[0].parameters: expected 'object | null', got a list"),
    ("acl/infer", {"inputs": [{**_text(), "parameters": "x"}]}, 400,
     "inputs[0].parameters: expected 'object | null', got 'str'"),
    ("acl/infer", {"inputs": [_text()], "outputs": [{"name": "label", "parameters": [1]}]}, 400,
     "outputs[0].parameters: expected 'object | null', got a list"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"binary_data_output": "false"}}, 400,
     "parameters.binary_data_output: expected 'bool', got 'str'"),
    ("acl/infer", {"inputs": [_text()], "outputs": [{"name": "label", "parameters": {"binary_data": "no"}}]}, 400,
     "outputs[0].parameters.binary_data: expected 'bool | null', got 'str'"),
    # unknown keys in an input's or output's parameters, refused by name
    ("acl/infer", {"inputs": [{**_text(), "parameters": {"content_type": "str"}}]}, 400,
     "inputs[0].parameters: unknown field 'content_type': it takes binary_data_size"),
    ("acl/infer", {"inputs": [_text()], "outputs": [{"name": "label", "parameters": {"top_k": 1}}]}, 400,
     "outputs[0].parameters: unknown field 'top_k': it takes binary_data, classification"),
    ("acl/infer", {"inputs": [_text()], "outputs": [{"name": "label", "parameters": {"classification": 2}}]}, 400,
     "classification applies to the class scores only"),
    ("acl/infer", {"inputs": [_text()], "outputs": [{"name": "probabilities", "parameters": {"classification": -1}}]},
     400, "outputs[0].parameters.classification: expected 'int' >= 1"),
    ("acl/infer", {"inputs": [_text()], "inputs2": []}, 400, "unknown field 'inputs2'"),
    # Triton's request parameters: priority is refused with the reason; timeout is microseconds, above 0
    ("acl/infer", {"inputs": [_text()], "parameters": {"priority": 1}}, 400, "'priority' is not supported: this "
     "server orders its queues by deadline"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"timeout": 0}}, 400, "parameters.timeout: 0 is out of range: "
     "a deadline is microseconds above 0"),
    # an empty or blank text: acl-predict skips such a line, the server names it
    ("acl/infer", {"inputs": [{**_text(2), "data": ["good", "  "]}]}, 400, "input text: element 1 is empty or only "
     "spaces"),
    ("acl/infer", oip_body([("good", "")]), 400, "input text_pair: element 0 is empty"),
]

TEI_ERRORS = [  # (body, status, error_type, words of the message)
    (b"{[", 400, "Validation", "not valid JSON"),
    ({"input": "good"}, 422, "Validation", "the body: unknown field 'input': it takes inputs, truncate"),
    ({"inputs": 5}, 422, "Validation", "inputs: expected 'str | list', got 'int'"),
    ({"inputs": []}, 400, "Empty", "empty list"),
    ({"inputs": ["a", "b", "c"]}, 422, "Validation", "a list of strings is one pair"),
    ({"inputs": [["a", "b", "c"]]}, 422, "Validation", "inputs[0] must be"),
    ({"inputs": [["a"], "b"]}, 422, "Validation", "inputs[1] must be"),
    ({"inputs": "a", "raw_scores": "yes"}, 422, "Validation", "raw_scores: expected 'bool', got 'str'"),
    ({"inputs": "a", "normalize": True}, 422, "Validation", "unknown field 'normalize'"),
    ({"inputs": ["a", "b"], "policy": "confidence", "threshold": 2}, 400, "Validation", "out of range"),
    ({"inputs": [["good", "bad"]] * (MAX_QUEUE + 1)}, 413, "Validation", "--max-queue"),
    ({"inputs": "a", "parameters": "top_k"}, 422, "Validation", "parameters: expected 'object | null', got 'str'"),
    ({"inputs": "a", "parameters": [1]}, 422, "Validation", "parameters: expected 'object | null', got a list"),
    ({"inputs": "a", "parameters": {"top_k": 0}}, 422, "Validation", "parameters.top_k: expected 'int' >= 1"),
    ({"inputs": "a", "parameters": {"function_to_apply": "relu"}}, 422, "Validation",
     "parameters.function_to_apply: invalid enum value 'relu': it takes softmax"),
    ({"inputs": "a", "parameters": {"truncation": True}}, 422, "Validation",
     "parameters: unknown field 'truncation': it takes top_k, function_to_apply"),
    ({"inputs": "a", "raw_scores": True, "parameters": {"function_to_apply": "softmax"}}, 422, "Validation",
     "send one"),
    ({"inputs": ""}, 422, "Validation", "inputs holds a text that is empty or only spaces"),
    ({"inputs": [["good"], [" ", "b"]]}, 422, "Validation", "inputs[1] holds a text that is empty"),
]


def _one_line(message: str) -> bool:
    return bool(message) and "\n" not in message


@pytest.mark.parametrize("path, body, status, words", OIP_ERRORS)
def test_a_bad_oip_request_is_a_4xx_with_one_line(server, path, body, status, words):
    url, _ = server
    got, _, answer = call(f"{url}/v2/models/{path}", body)
    assert got == status and words in answer["error"] and _one_line(answer["error"]), answer


@pytest.mark.parametrize("body, status, kind, words", TEI_ERRORS)
def test_a_bad_predict_request_is_a_4xx_in_teis_error_shape(server, body, status, kind, words):
    url, _ = server
    got, _, answer = call(f"{url}/predict", body)
    assert (got, answer["error_type"]) == (status, kind) and words in answer["error"], answer
    assert _one_line(answer["error"]) and set(answer) == {"error", "error_type"}


@pytest.mark.parametrize("policy, threshold", [("entropy", 1.5), ("confidence", -0.1), ("patience", 0.5),
                                               ("patience", 0)])
def test_a_threshold_out_of_range_is_named_as_acl_predict_names_it(server, policy, threshold):
    url, _ = server
    with pytest.raises(ValueError) as flag:  # what acl-predict --policy P --threshold T says
        exits.validate(policy, threshold)
    status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")], policy=policy,
                                                                        threshold=threshold))
    assert (status, answer["error"]) == (400, str(flag.value))


def test_a_body_over_the_limit_is_413_and_a_bad_binary_header_400(server):
    url, _ = server
    big = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["good " * MAX_BODY]}]}
    status, _, answer = call(f"{url}/v2/models/acl/infer", big)
    assert status == 413 and f"limit of {MAX_BODY} bytes (--max-body-bytes)" in answer["error"]
    status, _, answer = call(f"{url}/predict", {"inputs": "good " * MAX_BODY})
    assert status == 413 and answer["error_type"] == "Validation"
    body = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": 9}}]}).encode()
    for length, words in ((str(len(body) + 99), "not a length within"), (str(len(body)), "does not fit")):
        status, _, answer = call(f"{url}/v2/models/acl/infer", body, headers={"Inference-Header-Content-Length":
                                                                              length})
        assert status == 400 and words in answer["error"], answer


def test_binary_text_that_is_not_utf8_is_400(server):
    url, _ = server
    raw = struct.pack("<I", 2) + b"\xff\xfe"
    head = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    status, _, answer = call(f"{url}/v2/models/acl/infer", head + raw,
                             headers={"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and "not UTF-8 text" in answer["error"], answer


def test_a_model_failure_answers_500_with_a_request_id_only_and_logs_the_cause_under_it(server, caplog):
    """The class, message and traceback of a failure go to the log line carrying the request id; the client sees
    "internal error" and that id (they once read the exception's text)."""
    url, service = server
    backend = service.scheduler.backend
    layer = backend.layer

    def broken(i, x, mask):
        raise RuntimeError("the device went away")

    backend.layer = broken
    try:
        with caplog.at_level("ERROR", logger="acl_runtime.serve"):
            status, head, answer = call(f"{url}/predict", {"inputs": ["good", "bad"]})
            oip = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")]))
    finally:
        backend.layer = layer
    rid = head["x-request-id"]
    assert status == 500 and answer == {"error": f"internal error (request id {rid})", "error_type": "Backend"}
    assert oip[0] == 500 and set(oip[2]) == {"error"} and oip[2]["error"].startswith("internal error (request id")
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert len(logged) == 1 and "the device went away" in caplog.text
    assert "RuntimeError" in (logged[0].exc_text or "") and "the device went away" in logged[0].exc_text
    assert call(f"{url}/predict", {"inputs": ["good", "bad"]})[0] == 200


def test_the_server_still_answers_after_every_bad_request(server):
    url, _ = server
    assert call(f"{url}/v2/health/ready")[0] == 200
    status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad"), ("bad", "good")]))
    assert status == 200 and len(outputs(answer)["label"]) == 2


def test_a_full_queue_answers_503_with_retry_after_and_every_request_exactly_once(exported):  # noqa: F811
    """A slowed model, a queue of 8 rows and 40 requests of 3 rows at once: each request gets one answer, either
    the engine's (200) or 503 with Retry-After; none is lost, none is answered twice, nothing else."""
    with serving(exported["folder"], max_batch=4, max_queue=8) as (url, service):
        backend = service.scheduler.backend
        layer = backend.layer

        def slow_layer(i, x, mask):
            time.sleep(0.01)  # a model big enough that requests pile up
            return layer(i, x, mask)

        backend.layer = slow_layer
        groups = [[exported["texts"][(3 * k + j) % len(exported["texts"])] for j in range(3)] for k in range(40)]
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(lambda g: call(f"{url}/v2/models/acl/infer", oip_body(g)), groups))
        statuses = [status for status, _, _ in answers]
        assert set(statuses) == {200, 503}, statuses
        for group, (status, head, answer) in zip(groups, answers):
            if status == 503:
                assert int(head["retry-after"]) >= 1 and "overloaded" in answer["error"]
                continue
            want = exported["engine"].predict_early_exit(group)
            assert outputs(answer)["label"] == [p.label for p in want]
            probs = np.asarray(outputs(answer)["probabilities"]).reshape(3, -1)[:, 1]
            assert np.abs(probs - [p.probabilities["1"] for p in want]).max() < 1e-5
        text = call(f"{url}/metrics")[2].decode()
        counted = {s: float(text.split(f'acl_requests_total{{route="infer",status="{s}"}} ')[1].split()[0])
                   for s in (200, 503)}
        assert counted == {200: statuses.count(200), 503: statuses.count(503)}
        assert service.scheduler.depth() == 0


@pytest.mark.parametrize("path, status, words", [("/v2/models/acl/infer", 400, "inputs[0]: expected a JSON object"),
                                                 ("/predict", 422, "inputs[0][0]: expected 'str', got a list")])
def test_json_nested_thousands_deep_is_refused_not_a_500(server, path, status, words):
    """Python's json recursed once per level and answered 500 RecursionError; the schema's typed decoder stops at
    the first level that is not what the field takes, and names it."""
    url, _ = server
    got, _, answer = call(url + path, b'{"inputs": ' + b"[" * 20000 + b"]" * 20000 + b"}")
    assert got == status and words in answer["error"], answer
    assert call(f"{url}/v2/health/ready")[0] == 200


def test_bytes_left_after_the_last_binary_tensor_are_refused(server):
    url, _ = server
    raw = struct.pack("<I", 4) + b"good"
    head = json.dumps({"inputs": [{"name": name, "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(raw)}} for name in ("text", "text_pair")]
                       }).encode()
    ok = call(f"{url}/v2/models/acl/infer", head + raw + raw, headers={"Inference-Header-Content-Length":
                                                                         str(len(head))})
    assert ok[0] == 200, ok
    status, _, answer = call(f"{url}/v2/models/acl/infer", head + raw + raw + b"junk",
                             headers={"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and "4 bytes are left after the last binary tensor" in answer["error"], answer


@pytest.mark.parametrize("method, path, status, words", [("GET", "/v3/models", 404, "no route /v3/models"),
                                                         ("GET", "/predict", 405, "GET is not allowed on /predict"),
                                                         ("PUT", "/v2/models/acl/infer", 405, "PUT is not allowed")])
def test_unrouted_paths_and_methods_answer_json_errors(server, method, path, status, words):
    url, _ = server
    got, head, answer = call(url + path, b"{}" if method == "PUT" else None, method=method)
    assert got == status and head["content-type"] == "application/json" and words in answer["error"], answer


def test_a_compressed_body_is_held_to_the_limit_by_what_it_inflates_to(server):
    """A gzip bomb (64 kB of zeros per 64 bytes sent) is 413, counted on the decompressed size; a corrupt or
    unknown encoding is refused by name."""
    url, _ = server
    inner = json.dumps({"inputs": [{**_text(), "data": ["good" + " " * (4 * MAX_BODY)]}]}).encode()
    bomb = gzip.compress(inner)
    assert len(bomb) < MAX_BODY // 8
    for body, encoding in ((bomb, "gzip"), (zlib.compress(inner), "deflate")):
        status, _, answer = call(f"{url}/v2/models/acl/infer", body, headers={"Content-Encoding": encoding})
        assert status == 413 and f"limit of {MAX_BODY} bytes (--max-body-bytes, decompressed)" in answer["error"]
    status, _, answer = call(f"{url}/predict", gzip.compress(b'{"inputs": "good"}')[:-9],
                             headers={"Content-Encoding": "gzip"})
    assert status == 400 and "not valid gzip data" in answer["error"], answer
    status, _, answer = call(f"{url}/predict", b'{"inputs": "good"}', headers={"Content-Encoding": "br"})
    assert status == 415 and "Content-Encoding 'br' is not supported" in answer["error"], answer


def test_a_failure_outside_the_inference_handlers_is_the_same_500_with_a_request_id(server, caplog, monkeypatch):
    """Starlette's own last resort answered a plain-text "Internal Server Error"."""
    url, service = server

    def broken(version):
        raise KeyError("a missing label")

    monkeypatch.setattr(service, "info", broken)
    with caplog.at_level("ERROR", logger="acl_runtime.serve"):
        status, head, answer = call(f"{url}/info")
    rid = head["x-request-id"]
    assert status == 500 and answer == {"error": f"internal error (request id {rid})"}
    assert any(rid in r.getMessage() and "a missing label" in (r.exc_text or "") for r in caplog.records)
    assert call(f"{url}/v2/health/ready")[0] == 200


@pytest.mark.parametrize("route", ["predict", "v2/models/acl/infer"])
def test_a_field_name_with_a_newline_is_quoted_on_one_line(server, route):
    """What the slow fuzz found: an unknown field named "\\n" was echoed raw, a two-line error."""
    url, _ = server
    body = {"inputs": "good", "\n": 1} if route == "predict" else {"inputs": [], "a\nb": 1}
    got, _, answer = call(f"{url}/{route}", body)
    assert got in (400, 422) and _one_line(answer["error"]) and "\\n" in answer["error"], answer
