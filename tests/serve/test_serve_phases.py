"""Where a served request's time goes (acl_runtime/serve/metrics.py PHASES): every answered request's phases are
in /metrics and add up to its latency; the queues' waits and the backend calls' seconds are counted; Triton's
statistics carry the queue and compute split; serve_load reads the split back (benchmarks/load_stats.py)."""
import sys
import time

import pytest

import helpers
from acl_runtime.serve.metrics import PHASES
from serve_helpers import call, exported, metric, oip_body, serving  # noqa: F401  (exported: a fixture)

sys.path.insert(0, f"{helpers.REPO}/benchmarks")
from load import stats as load_stats


def _phase(text: str, phase: str, part: str) -> float:
    return metric(text, f'acl_request_phase_seconds_{part}{{phase="{phase}"}}')


@pytest.fixture(scope="module")
def served(exported):  # noqa: F811
    """Three /predict and two OIP requests on a model whose layers take 5 ms more; the /metrics after."""
    with serving(exported["folder"], max_batch=4) as (url, service):
        backend, layer = service.scheduler.backend, service.scheduler.backend.layer

        def slow(i, x, mask):
            time.sleep(0.005)
            return layer(i, x, mask)

        backend.layer = slow
        texts = exported["texts"][:6]
        for k in range(3):
            assert call(f"{url}/predict", {"inputs": [list(t) for t in texts[2 * k: 2 * k + 2]]})[0] == 200
        for k in range(2):
            assert call(f"{url}/v2/models/acl/infer", oip_body(texts[k: k + 3]))[0] == 200
        text, stats = call(f"{url}/metrics")[2].decode(), service.statistics()
        assert call(f"{url}/predict", {"inputs": 5})[0] == 422
        refused = call(f"{url}/metrics")[2].decode()
        yield {"text": text, "service": service, "layers": len(service.engine.exit_layers), "refused": refused,
               "url": url, "texts": texts, "stats": stats}


def test_each_answered_request_has_every_phase_and_they_add_up_to_its_latency(served):
    text, refused = served["text"], served["refused"]
    for phase in PHASES:
        assert _phase(text, phase, "count") == 5, phase
        assert _phase(refused, phase, "count") == 5, phase  # a refused request has none
    total = sum(_phase(text, p, "sum") for p in PHASES)
    latency = sum(metric(text, f'acl_request_seconds_sum{{route="{r}"}}') for r in ("predict", "infer"))
    assert total == pytest.approx(latency, rel=1e-6, abs=1e-6)
    # each of 5 requests' slowest input went through at least one slowed layer: at least 5 ms of model each
    assert _phase(text, "model", "sum") >= 5 * 0.005
    assert min(_phase(text, p, "sum") for p in ("read", "tokenize", "answer")) > 0


def test_queue_waits_are_counted_per_queue_and_the_model_seconds_in_all(served):
    text, layers = served["text"], served["layers"]
    inputs = 3 * 2 + 2 * 3
    # one request at a time, a light load: each input waited for the embeddings, then ran through in one go
    assert metric(text, 'acl_queue_wait_seconds_count{layer="0"}') == inputs
    assert sum(metric(text, f'acl_queue_wait_seconds_count{{layer="{k}"}}') for k in range(layers + 1)) == inputs
    calls = sum(metric(text, f'acl_batch_fill_count{{layer="{k}"}}') for k in range(1, layers + 1))
    assert metric(text, "acl_model_seconds_total") >= calls * 0.005
    # the thread's CPU in those calls: some, and less than their wall time, which holds the layers' 5 ms sleeps
    assert 0 < metric(text, "acl_model_cpu_seconds_total") < metric(text, "acl_model_seconds_total") - calls * 0.004


def test_triton_statistics_split_queue_and_compute(served):
    stats = served["stats"]["model_stats"][0]["inference_stats"]
    success, queue, compute = stats["success"], stats["queue"], stats["compute_infer"]
    parts = [stats[k] for k in ("queue", "compute_input", "compute_infer", "compute_output")]
    assert [p["count"] for p in parts] == [success["count"]] * 4 == [5] * 4  # perf_analyzer requires them equal
    assert compute["ns"] >= 5 * 5_000_000 and min(p["ns"] for p in parts) > 0
    assert queue["ns"] + compute["ns"] <= success["ns"]


def test_serve_load_reads_the_split_between_two_scrapes(served):
    text = served["text"]
    after = load_stats.server_side(load_stats.parse_metrics(text))
    split = load_stats.split_between(None, after)
    assert split["requests"] == 5 and set(split["per_request_ms"]) == set(PHASES)
    assert sum(split["share"].values()) == pytest.approx(1.0)
    assert split["model_seconds"] == pytest.approx(metric(text, "acl_model_seconds_total"))
    assert split["model_cpu_seconds"] == pytest.approx(metric(text, "acl_model_cpu_seconds_total"))
    assert load_stats.split_between(after, after)["requests"] == 0


def test_a_triton_timeout_reaches_the_scheduler_as_the_requests_deadline(served, monkeypatch):
    scheduler, deadlines = served["service"].scheduler, []
    submit = scheduler.submit
    monkeypatch.setattr(scheduler, "submit", lambda rows, request, deadline=None: deadlines.append(deadline) or
                        submit(rows, request, deadline))
    url, texts = served["url"], served["texts"]
    assert call(f"{url}/v2/models/acl/infer", oip_body(texts[:2], timeout=25000))[0] == 200
    assert call(f"{url}/v2/models/acl/infer", oip_body(texts[:2]))[0] == 200
    assert deadlines == [0.025, None]  # None: the server's --slo-ms
