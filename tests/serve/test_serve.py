"""acl-serve in-process (uvicorn on a free loopback port, in a thread): its answers are the engine's, over plain
JSON, TEI's /predict and tritonclient.http (a client no one here wrote); every bad request is a 4xx with one
line; a full queue is 503 with Retry-After and every request gets exactly one answer; /metrics."""
import concurrent.futures
import os
import random

import numpy as np
import pytest

from acl_runtime import loop
from serve_helpers import call, exported, metric, oip_body, outputs, serving  # noqa: F401  (exported: a fixture)

ATOL = 1e-5


@pytest.fixture(scope="module")
def server(exported):  # noqa: F811
    with serving(exported["folder"], max_batch=8, max_queue=256) as (url, service):
        yield url, service


def spread_requests(exported):  # noqa: F811
    """Exit requests whose thresholds split the texts between exits: the median of the first exit's normalized
    entropy and of its top probability (the tiny model is barely trained, so the table's defaults exit nowhere)."""
    eng = exported["engine"]
    encoded = [eng.encode_with_info(*t)[0] for t in exported["texts"]]
    first = np.concatenate([eng.run_batch(b[1]).exit_logits[:, 0] for b in eng.make_batches(encoded, 64)])
    p = loop.softmax(first)
    entropy = -(p * np.log(p)).sum(1) / np.log(p.shape[1])
    return [{}, {"policy": "none"}, {"policy": "entropy", "threshold": float(np.median(entropy))},
            {"policy": "confidence", "threshold": float(np.median(p.max(1)))}, {"policy": "patience", "threshold": 1},
            {"exit_layer": 2}]


def expected(exported, texts, params):  # noqa: F811
    eng = exported["engine"]
    return eng.predict_early_exit(texts, params.get("policy"), params.get("threshold"), params.get("exit_layer"))


def test_the_thresholds_spread_the_texts_over_the_exits(exported):  # noqa: F811
    """Otherwise the equality tests below would compare the last exit only."""
    layers = {p.exit_layer for params in spread_requests(exported) for p in expected(exported, exported["texts"],
                                                                                         params)}
    assert layers == {1, 2, 3}


def test_oip_answers_are_the_engines(server, exported):  # noqa: F811
    url, _ = server
    texts = exported["texts"]
    for params in spread_requests(exported):
        for group in (texts[:len(texts) // 2], texts[len(texts) // 2:]):
            status, _, answer = call(f"{url}/v2/models/acl/infer", oip_body(group, **params))
            assert status == 200, answer
            want = expected(exported, group, params)
            got = outputs(answer)
            assert got["label"] == [p.label for p in want]
            assert got["exit_layer"] == [p.exit_layer for p in want]
            assert got["truncated"] == [p.truncated for p in want]
            probs = np.asarray(got["probabilities"]).reshape(len(group), -1)
            assert np.abs(probs - [[p.probabilities[k] for k in ("0", "1")] for p in want]).max() < ATOL
            assert answer["parameters"]["truncated"] == sum(p.truncated for p in want)


def test_predict_answers_are_the_engines_in_teis_shape(server, exported):  # noqa: F811
    url, _ = server
    texts = exported["texts"]
    batch = [list(t) for t in texts]
    for params in spread_requests(exported):
        status, _, answer = call(f"{url}/predict", {"inputs": batch, **params})
        assert status == 200, answer
        want = expected(exported, texts, params)
        assert len(answer) == len(want)
        for entries, p in zip(answer, want):
            assert [e["score"] for e in entries] == sorted((e["score"] for e in entries), reverse=True)
            assert entries[0]["label"] == p.label
            assert {e["exit_layer"] for e in entries} == {p.exit_layer}
            assert {e["truncated"] for e in entries} == {p.truncated}
            assert max(abs(e["score"] - p.probabilities[e["label"]]) for e in entries) < ATOL
    # TEI's single form: a list of two strings is one pair; an answer is then one list
    a, b = texts[0]
    single = call(f"{url}/predict", {"inputs": [a, b]})[2]
    assert single[0]["exit_layer"] == expected(exported, [(a, b)], {})[0].exit_layer
    assert single[0]["label"] == expected(exported, [(a, b)], {})[0].label
    raw = call(f"{url}/predict", {"inputs": [a, b], "raw_scores": True})[2]  # the deciding exit's logits
    logits = np.asarray([[e["score"] for e in raw]])
    assert sum(e["score"] for e in raw) != pytest.approx(1.0)
    probs = dict(zip((e["label"] for e in raw), loop.softmax(logits)[0]))
    assert probs == pytest.approx(expected(exported, [(a, b)], {})[0].probabilities, abs=ATOL)


def test_concurrent_requests_in_random_order_get_the_answers_of_the_engine(server, exported):  # noqa: F811
    """Rows of many requests share the scheduler's batches in whatever order they arrive; a row's answer must
    not depend on it."""
    url, _ = server
    rng = random.Random(0)
    params = spread_requests(exported)[2]
    jobs = [rng.sample(exported["texts"], rng.randint(1, 5)) for _ in range(60)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda group: call(f"{url}/v2/models/acl/infer", oip_body(group, **params)), jobs))
    for group, (status, _, answer) in zip(jobs, answers):
        assert status == 200, answer
        want = expected(exported, group, params)
        assert outputs(answer)["exit_layer"] == [p.exit_layer for p in want]
        probs = np.asarray(outputs(answer)["probabilities"]).reshape(len(group), -1)
        assert np.abs(probs[:, 1] - [p.probabilities["1"] for p in want]).max() < ATOL


def test_tritonclient_http_reads_the_model_and_its_answers(server, exported):  # noqa: F811
    """tritonclient.http sends binary tensors by default (Triton's binary tensor extension) and JSON on request."""
    import tritonclient.http as triton

    url, _ = server
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("acl")
    meta = client.get_model_metadata("acl")
    assert [i["name"] for i in meta["inputs"]] == ["text", "text_pair"]
    assert {"label", "exit_layer", "probabilities"} <= {o["name"] for o in meta["outputs"]}
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    pairs = exported["texts"][:6]
    params = spread_requests(exported)[2]
    want = expected(exported, pairs, params)
    for binary in (True, False):
        tensors = []
        for name, column in (("text", 0), ("text_pair", 1)):
            t = triton.InferInput(name, [len(pairs)], "BYTES")
            t.set_data_from_numpy(np.asarray([p[column] for p in pairs], dtype=object), binary_data=binary)
            tensors.append(t)
        requested = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("label", "exit_layer",
                                                                                   "probabilities")]
        result = client.infer("acl", tensors, outputs=requested, parameters=params)
        assert [x.decode() if isinstance(x, bytes) else x for x in result.as_numpy("label")] == [p.label for p in
                                                                                               want]
        assert result.as_numpy("exit_layer").tolist() == [p.exit_layer for p in want]
        assert np.abs(result.as_numpy("probabilities")[:, 0] - [p.probabilities["0"] for p in want]).max() < ATOL
    with pytest.raises(triton.InferenceServerException, match="out of range"):
        client.infer("acl", tensors, parameters={"policy": "entropy", "threshold": 2.0})
    with pytest.raises(triton.InferenceServerException, match='this model reads a pair of texts per input: send a '
                                                              '"text_pair" tensor beside "text"'):
        client.infer("acl", tensors[:1])  # the texts without their pairs
    client.close()


def test_a_text_over_the_models_positions_is_cut_and_flagged(server, exported):  # noqa: F811
    url, _ = server
    long = (" ".join(["good"] * 400), "bad")
    answer = outputs(call(f"{url}/v2/models/acl/infer", oip_body([long, ("good", "bad")]))[2])
    assert answer["truncated"] == [True, False]
    entries = call(f"{url}/predict", {"inputs": list(long)})[2]
    assert all(e["truncated"] for e in entries)
    assert entries[0]["label"] == expected(exported, [long], {})[0].label


def test_metrics_counts_equal_the_requests_rows_and_backend_calls_answered(exported):  # noqa: F811
    """Each histogram's count against what was answered, on a server of its own: a request per status and route
    in the latency histogram, a row per input in the exit-layer one (its buckets the engine's exit layers), and
    the batch-fill one per backend call (Triton's execution_count) and per row through each layer."""
    texts = [("good", "bad"), ("bad", "good"), ("the plot was not clever , honestly", "good")]
    want = exported["engine"].predict_early_exit(texts)
    with serving(exported["folder"], max_batch=4) as (url, _):
        call(f"{url}/predict", {"inputs": [list(t) for t in texts[:2]]})
        call(f"{url}/v2/models/acl/infer", oip_body(texts[2:]))
        call(f"{url}/v2/models/nope/infer", oip_body([("good", "bad")]))
        executions = call(f"{url}/v2/models/acl/stats")[2]["model_stats"][0]["execution_count"]
        status, head, text = call(f"{url}/metrics")
    text = text.decode()
    assert status == 200 and head["content-type"].startswith("text/plain")
    for route, code in [("predict", "200"), ("infer", "200"), ("infer", "404")]:
        assert metric(text, f'acl_requests_total{{route="{route}",status="{code}"}}') == 1
    assert metric(text, 'acl_request_seconds_count{route="predict"}') == 1
    assert metric(text, 'acl_request_seconds_count{route="infer"}') == 2
    assert metric(text, "acl_exit_layer_count") == len(texts)
    for layer in exported["engine"].exit_layers:
        assert metric(text, f'acl_exit_layer_bucket{{le="{float(layer)}"}}') == sum(p.exit_layer <= layer
                                                                                   for p in want)
    assert metric(text, "acl_queue_depth") == 0
    layers = ["0"] + [str(x) for x in exported["engine"].exit_layers]
    calls = [metric(text, f'acl_batch_fill_count{{layer="{x}"}}') for x in layers]
    assert sum(calls) == executions and all(calls)  # the embeddings and every layer ran
    rows = {x: round(metric(text, f'acl_batch_fill_sum{{layer="{x}"}}') * 4) for x in layers}
    assert rows["0"] == len(texts)  # every row embedded once
    for layer in exported["engine"].exit_layers:  # a row runs layer L unless it left at an earlier exit
        assert rows[str(layer)] == sum(p.exit_layer >= layer for p in want)
    # the padded share's counters: a call's positions less its padding are the real tokens of the rows in it
    lengths = [len(exported["engine"].encode_with_info(a, b)[0]) for a, b in texts]
    real = {x: metric(text, f'acl_tokens_total{{layer="{x}"}}')
            - metric(text, f'acl_padded_tokens_total{{layer="{x}"}}') for x in layers}
    assert real["0"] == sum(lengths)
    for layer in exported["engine"].exit_layers:
        assert real[str(layer)] == sum(n for p, n in zip(want, lengths) if p.exit_layer >= layer)


def test_precision_int8_serves_the_int8_copy(exported):  # noqa: F811
    """One input at a time, so that each runs alone, as the engine runs it at batch 1 (int8's activation scales
    are per call)."""
    from acl_runtime.engine import Engine

    int8 = Engine(exported["folder"], "int8", threads=1)
    texts = exported["texts"][-6:]  # the odd pairs among them: int8 moves their probabilities most (by 5e-4)
    with serving(exported["folder"], precision="int8") as (url, _):
        assert call(f"{url}/v2/models/acl")[2]["parameters"]["precision"] == "int8"
        served = [outputs(call(f"{url}/v2/models/acl/infer", oip_body([t]))[2])["probabilities"][1] for t in texts]
    want = [int8.predict_early_exit([t])[0].probabilities["1"] for t in texts]
    fp32 = [exported["engine"].predict_early_exit([t])[0].probabilities["1"] for t in texts]
    assert np.abs(np.subtract(served, want)).max() < ATOL
    assert np.abs(np.subtract(served, fp32)).max() > 10 * ATOL  # not the fp32 graphs


def test_a_worker_encodes_without_the_tokenizers_thread_pool_unless_told(exported, monkeypatch):  # noqa: F811
    """A worker's encode_batch runs in its calling thread (rayon's pool cost more CPU than it saved beside the
    model's thread: docs/serve.md); an operator's TOKENIZERS_PARALLELISM is kept."""
    from acl_runtime.serve.service import Service, Settings

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    Service(Settings(folder=exported["folder"]))
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    Service(Settings(folder=exported["folder"]))
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
