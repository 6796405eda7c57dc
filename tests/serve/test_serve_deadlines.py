"""A request's deadline in acl-serve (acl_runtime.request.deadline_seconds, acl_runtime.deadlines): each protocol's
field (Triton's ``timeout`` in microseconds, ``/predict``'s ``deadline_ms``, the ``X-Deadline-Ms`` header of TEI's
routes) reaches the one rule, a bad value is a 400 naming the field; over HTTP (uvicorn and onnxruntime on the
tests' tiny export, its layers slowed so that a deadline falls inside the model), an answer cut short by its
deadline says so in each protocol's place and equals the fixed-exit answer at its layer; a request that has not
started by its deadline is Triton's 503 "Request timeout expired"; /metrics counts both."""
import concurrent.futures
import time

import pytest

from acl_runtime import request as request_rule
from acl_runtime.serve import protocol, tei
from acl_runtime.serve.errors import BadRequest
from serve_helpers import call, exported, metric, oip_body, outputs, serving  # noqa: F401  (exported: a fixture)

LAYER_SECONDS = 0.04  # each encoder layer's added time: the tiny model's layers take well under a millisecond
DEADLINE_MS = 2.5 * LAYER_SECONDS * 1000  # past layer 1, short of layer 3 (the last exit): a deadline exit


def _oip(timeout=None, raw=None) -> bytes:
    params = "" if timeout is None and raw is None else f', "parameters": {{"timeout": {raw or timeout}}}'
    return ('{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a fine film"]}]' + params +
            "}").encode()


def _tei(deadline_ms=None, raw=None) -> bytes:
    field = "" if deadline_ms is None and raw is None else f', "deadline_ms": {raw or deadline_ms}'
    return ('{"inputs": "a fine film"' + field + "}").encode()


def test_every_protocols_deadline_field_reaches_the_one_rule(monkeypatch):
    seen = []
    rule = request_rule.deadline_seconds
    monkeypatch.setattr(request_rule, "deadline_seconds", lambda v, f: seen.append((v, f)) or rule(v, f))
    assert protocol.parse_infer(_oip(25000), None, ["label"]).deadline == 0.025
    assert tei.parse_predict(_tei(25)).deadline == 0.025
    assert tei.parse_predict(_tei(), " 25 ").deadline == 0.025
    assert seen == [(25000, "parameters.timeout"), (25, "deadline_ms"), (" 25 ", "X-Deadline-Ms")]
    assert protocol.parse_infer(_oip(), None, ["label"]).deadline is None and tei.parse_predict(_tei()).deadline is None
    assert len(seen) == 3  # no field: the rule is not asked, the server's --slo-ms applies


BAD = [  # (what, OIP's timeout as written in JSON, /predict's deadline_ms, the header, words of the refusal)
    ("negative", "-5", "-5", "-5", "is out of range"),
    ("zero", "0", "0", "0", "is out of range"),
    ("NaN", "NaN", "NaN", "NaN", "not a"),
    ("a string", '"25"', '"25"', "soon", ""),
    ("an overflow", "100000000000000000000000000000", "1e400", "1e400", "out of range"),
    ("a bool", "true", "true", "true", ""),
]


@pytest.mark.parametrize("what,oip,body,header,words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_deadline_is_refused_naming_its_field_by_each_protocol(what, oip, body, header, words):
    for field, parse in [("parameters.timeout", lambda: protocol.parse_infer(_oip(raw=oip), None, ["label"])),
                         ("deadline_ms", lambda: tei.parse_predict(_tei(raw=body))),
                         ("X-Deadline-Ms", lambda: tei.parse_predict(_tei(), header))]:
        with pytest.raises(BadRequest) as refused:
            parse()
        message = refused.value.message
        assert refused.value.status == 400 and message.startswith(f"{field}: ") and words in message, message
        assert "\n" not in message


def test_the_rules_range_and_units():
    assert request_rule.deadline_seconds(1, "parameters.timeout") == 1e-6
    assert request_rule.deadline_seconds(86_400_000, "deadline_ms") == 86_400.0  # a day: the largest
    for value, field in [(86_400_000_001, "deadline_ms"), (10 ** 400, "parameters.timeout"),
                         ("25", "deadline_ms"), (float("inf"), "deadline_ms"), ("1_0", "X-Deadline-Ms")]:
        with pytest.raises(ValueError, match=f"^{field}: "):
            request_rule.deadline_seconds(value, field)


def test_a_deadline_in_the_body_and_the_header_at_once_is_refused():
    with pytest.raises(BadRequest, match="deadline_ms and the X-Deadline-Ms header both"):
        tei.parse_predict(_tei(25), "25")


@pytest.fixture(scope="module")
def slowed(exported):  # noqa: F811
    """The tiny export served with every layer slowed by LAYER_SECONDS (the start-up cost table measures it), and
    the engine's fixed-exit answers computed before."""
    from acl_runtime.engine import OrtBackend

    engine, texts = exported["engine"], exported["texts"][:6]
    fixed = {layer: engine.predict_early_exit(texts, exit_layer=layer) for layer in engine.exit_layers}
    plain = OrtBackend.layer

    def layer(self, i, x, mask):
        time.sleep(LAYER_SECONDS)
        return plain(self, i, x, mask)

    OrtBackend.layer = layer
    try:
        with serving(exported["folder"], max_batch=4, max_queue=64, slo_ms=DEADLINE_MS) as running:
            yield running, texts, fixed
    finally:
        OrtBackend.layer = plain


def _send(url, how, text):
    """(exit layer, exit reason, probabilities) of one input (a pair) sent with a deadline of DEADLINE_MS in ``how``."""
    none = {"policy": "none"}  # the last exit, unless the deadline ends it sooner
    if how == "oip":
        status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body([text], timeout=int(DEADLINE_MS * 1000),
                                                                         **none))
        assert status == 200, answer
        exit_layer = next(o for o in answer["outputs"] if o["name"] == "exit_layer")
        return outputs(answer)["exit_layer"][0], exit_layer["parameters"]["exit_reason"], \
            outputs(answer)["probabilities"]
    body = {"inputs": list(text), **none}
    headers = None
    if how == "predict":
        body["deadline_ms"] = DEADLINE_MS
    elif how == "header":
        headers = {"X-Deadline-Ms": str(DEADLINE_MS)}
    status, _, answer = call(f"{url}/predict", body, headers=headers)  # "slo": --slo-ms, the default
    assert status == 200, answer
    by_label = {e["label"]: e["score"] for e in answer}
    return answer[0]["exit_layer"], answer[0]["exit_reason"], by_label


def test_under_a_deadline_inside_the_model_answers_are_flagged_and_equal_the_fixed_exit_answer(slowed):
    (url, service), texts, fixed = slowed
    last = service.engine.exit_layers[-1]
    before = metric(call(f"{url}/metrics")[2].decode(), 'acl_exit_reasons_total{reason="deadline"}')
    jobs = [(how, k) for how in ("oip", "predict", "header", "slo") for k in range(len(texts))]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda job: (job, _send(url, job[0], texts[job[1]])), jobs))
    for (how, k), (layer, reason, probabilities) in answers:
        assert reason == "deadline" and 1 <= layer < last, (how, layer, reason)
        want = fixed[layer][k].probabilities
        if how == "oip":
            probabilities = dict(zip(service.labels, probabilities))
        assert probabilities == pytest.approx(want, abs=1e-5), (how, layer)
    after = metric(call(f"{url}/metrics")[2].decode(), 'acl_exit_reasons_total{reason="deadline"}')
    assert after - before == len(jobs)
    # a long deadline: the policy's own exit, flagged as such
    status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body([texts[0]], timeout=10_000_000, policy="none"))
    assert status == 200 and outputs(answer)["exit_layer"] == [last]
    assert next(o for o in answer["outputs"] if o["name"] == "exit_layer")["parameters"] == {"exit_reason": "last"}


def test_a_request_not_started_by_its_deadline_is_tritons_timeout_error(slowed):
    (url, service), texts, _ = slowed
    before = metric(call(f"{url}/metrics")[2].decode(), "acl_deadline_expired_total")
    status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body(texts[:2], timeout=1))
    assert status == 503 and answer["error"].startswith("Request timeout expired: "), answer
    status, _, answer = call(f"{url}/predict", {"inputs": list(texts[0])}, headers={"X-Deadline-Ms": "0.001"})
    assert status == 503 and answer["error_type"] == "Overloaded" and "Request timeout expired" in answer["error"]
    text = call(f"{url}/metrics")[2].decode()
    assert metric(text, "acl_deadline_expired_total") - before == 3
    assert metric(text, 'acl_requests_total{route="infer",status="503"}') >= 1
    assert service.scheduler.depth() == 0


def test_deadline_policy_flag_reaches_the_settings(capsys):
    from acl_runtime.serve import cli

    assert cli.settings_from(cli.build_parser().parse_args(["folder"])).deadline_policy == "answer"
    args = cli.build_parser().parse_args(["folder", "--deadline-policy", "fail", "--slo-ms", "30"])
    settings = cli.settings_from(args)
    assert (settings.slo_ms, settings.deadline_policy, settings.split_waves) == (30.0, "fail", True)
    assert not cli.settings_from(cli.build_parser().parse_args(["folder", "--no-split-waves"])).split_waves
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["folder", "--deadline-policy", "drop"])
    assert "--deadline-policy" in capsys.readouterr().err


def test_the_service_runs_its_deadline_policy(slowed):
    (_, service), _, _ = slowed
    assert service.scheduler.deadline_policy == "answer" and service.scheduler.slo == DEADLINE_MS / 1000
    assert all(cell is not None for row in service.scheduler.costs.seconds for cell in row)  # measured at start
    # the wave split's cost of a call, seeded from the same start measurement (its line: none here, where a call's
    # time is a fixed sleep, not a cost a position)
    table = service.scheduler.costs
    assert service.scheduler.call_cost.calls >= (len(table.seconds) - 1) * len(table.buckets)
