"""acl-serve fuzzed on both inference routes with bodies drawn from its own request schema (tests/serve_fuzz.py):
never a 500, every error one line of JSON, every request answered exactly once (counted by /metrics, the queue
empty after), the server ready throughout. A bounded number of examples in make test, more under the slow marker."""
import json

import pytest
from hypothesis import HealthCheck, given, settings

from serve_fuzz import bodies
from serve_helpers import call, exported, serving  # noqa: F401  (exported: a fixture)

ROUTES = {"/v2/models/acl/infer": ("InferRequest", "infer"), "/predict": ("PredictRequest", "predict")}
ALLOWED = {200, 400, 404, 413, 422, 503}  # 503: only a deadline that passed before the request started


@pytest.fixture(scope="module")
def server(exported):  # noqa: F811
    with serving(exported["folder"], max_batch=8, max_queue=64, max_body_bytes=4096) as running:
        yield running


def _answered(url: str, route: str) -> float:
    text = call(f"{url}/metrics")[2].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f'acl_requests_total{{route="{route}"'))


def _check(url: str, path: str, body: bytes) -> None:
    route = ROUTES[path][1]
    before = _answered(url, route)
    status, head, answer = call(url + path, body)
    assert status in ALLOWED, (status, body[:300], answer)
    if status != 200:
        assert isinstance(answer, dict) and "\n" not in answer["error"], answer
        assert status != 503 or answer["error"].startswith("Request timeout expired: "), answer
    else:
        if "inference-header-content-length" in head:  # binary outputs asked for: the JSON header, then the tensors
            size = int(head["inference-header-content-length"])
            header = json.loads(answer[:size])
            assert len(answer) == size + sum(o["parameters"]["binary_data_size"] for o in header["outputs"]
                                             if "binary_data_size" in o.get("parameters", {})), header
            answer = header
        assert isinstance(answer, (dict, list)), answer
    assert _answered(url, route) == before + 1  # answered exactly once
    assert call(f"{url}/v2/health/ready")[0] == 200


def _fuzz(server, path: str, examples: int) -> None:
    url, service = server

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies(ROUTES[path][0]))
    def run(body):
        _check(url, path, body)

    run()
    assert service.scheduler.depth() == 0


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_fuzzed_bodies_are_never_a_500_and_each_is_answered_once(server, path):
    _fuzz(server, path, 60)


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(ROUTES))
def test_many_fuzzed_bodies_are_never_a_500_and_each_is_answered_once(server, path):
    _fuzz(server, path, 1500)


def test_the_schema_is_served_as_openapi_and_names_both_routes_bodies(server):
    url, _ = server
    status, _, doc = call(f"{url}/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    schemas = doc["components"]["schemas"]
    for path, struct in (("/v2/models/{name}/infer", "InferRequest"), ("/predict", "PredictRequest"),
                         ("/", "PredictRequest")):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{struct}"}
        assert schemas[struct]["additionalProperties"] is False  # unknown fields are refused, as served
    assert set(schemas["InferParameters"]["properties"]) >= {"policy", "threshold", "exit_layer",
                                                             "binary_data_output"}
    assert set(schemas["TaskParameters"]["properties"]) == {"top_k", "function_to_apply"}
    json.dumps(doc)  # plain JSON throughout
