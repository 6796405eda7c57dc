"""acl-serve refuses bad requests with a 4xx and one line, and never dies of them; a full queue answers 503 with
Retry-After, and every request gets exactly one answer."""
import concurrent.futures
import json
import struct
import time

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


OIP_ERRORS = [  # (path, body, status, words of the message)
    ("acl/infer", b"{not json", 400, "not valid JSON"),
    ("acl/infer", [1, 2], 400, "JSON object"),
    ("acl/infer", {"inputs": []}, 400, "non-empty list"),
    ("acl/infer", {"inputs": [{**_text(), "datatype": "FP32"}]}, 400, "expected \"BYTES\""),
    ("acl/infer", {"inputs": [{**_text(), "shape": [2]}]}, 400, "but 1 elements"),
    ("acl/infer", {"inputs": [{**_text(), "data": [3]}]}, 400, "must be a string"),
    ("acl/infer", {"inputs": [{**_text(), "data": "good"}]}, 400, "must be a list of strings"),
    ("acl/infer", {"inputs": [{**_text(), "name": "sentence"}]}, 400, "unknown input 'sentence'"),
    ("acl/infer", {"inputs": [{**_text(), "name": "text_pair"}]}, 400, "\"text\" is missing"),
    ("acl/infer", {"inputs": [_text(2), {**_text(1), "name": "text_pair"}]}, 400, "one pair per text"),
    ("acl/infer", {"inputs": [_text(0)]}, 400, "input text is empty"),
    ("acl/infer", {"inputs": [_text()], "outputs": [{"name": "logits"}]}, 400, "unknown output 'logits'"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"polcy": "entropy"}}, 400, "unknown parameter 'polcy'"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"policy": 3}}, 400, "parameter policy 3"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"policy": "entropy", "threshold": "0.3"}}, 400,
     "parameter threshold \"0.3\": expected a number"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"policy": "fast"}}, 400, "unknown early-exit policy 'fast'"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"threshold": 0.3}}, 400, "a threshold needs its policy"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"exit_layer": 7}}, 400, "exit layer 7 is not one of"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"exit_layer": True}}, 400, "parameter exit_layer true"),
    ("acl/infer", {"inputs": [_text()], "parameters": {"policy": "entropy", "exit_layer": 2}}, 400, "not both"),
    ("acl/infer", {"inputs": [_text(MAX_QUEUE + 1)]}, 413, f"more than the queue holds (--max-queue {MAX_QUEUE})"),
    ("nope/infer", {"inputs": [_text()]}, 404, "unknown model 'nope': this server serves 'acl'"),
    ("acl/versions/2/infer", {"inputs": [_text()]}, 404, "unknown model 'acl' version '2'"),
    ("nope", None, 404, "unknown model 'nope'"),
]

TEI_ERRORS = [  # (body, status, error_type, words of the message)
    (b"[[", 400, "Validation", "not valid JSON"),
    ({"input": "good"}, 422, "Validation", "with \"inputs\""),
    ({"inputs": 5}, 422, "Validation", "inputs is int"),
    ({"inputs": []}, 400, "Empty", "empty list"),
    ({"inputs": ["a", "b", "c"]}, 422, "Validation", "a list of strings is one pair"),
    ({"inputs": [["a", "b", "c"]]}, 422, "Validation", "inputs[0] must be"),
    ({"inputs": [["a"], "b"]}, 422, "Validation", "inputs[1] must be"),
    ({"inputs": "a", "raw_scores": "yes"}, 422, "Validation", "raw_scores must be true or false"),
    ({"inputs": "a", "normalize": True}, 422, "Validation", "unknown field 'normalize'"),
    ({"inputs": "a", "policy": "confidence", "threshold": 2}, 400, "Validation", "out of range"),
    ({"inputs": [["good"]] * (MAX_QUEUE + 1)}, 413, "Validation", "--max-queue"),
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
    status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body(["good"], policy=policy, threshold=threshold))
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


def test_a_model_failure_answers_500_for_its_request_and_the_server_goes_on(server):
    url, service = server
    backend = service.scheduler.backend
    layer = backend.layer

    def broken(i, x, mask):
        raise RuntimeError("the device went away")

    backend.layer = broken
    try:
        status, _, answer = call(f"{url}/predict", {"inputs": "good"})
    finally:
        backend.layer = layer
    assert status == 500 and "the device went away" in answer["error"] and answer["error_type"] == "Backend"
    assert call(f"{url}/predict", {"inputs": "good"})[0] == 200


def test_the_server_still_answers_after_every_bad_request(server):
    url, _ = server
    assert call(f"{url}/v2/health/ready")[0] == 200
    status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body(["good", "bad"]))
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
        groups = [[t if isinstance(t, str) else t[0] for t in g] for g in groups]
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
