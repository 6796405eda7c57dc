"""acl-serve with the clients people use, as shipped: huggingface_hub's InferenceClient (TEI's ``/`` and the
Inference API's ``parameters``), tritonclient.http's model configuration, statistics, classification and
compression; TEI's ``/health`` and ``/info``. InferenceClient.text_classification sends one string: it runs on the
classifier of one text per input, the others on the pair model (each model refuses the other kind:
tests/inference/test_pairing.py)."""
import gzip
import json

import numpy as np
import pytest

import helpers
from acl_runtime import loop
from serve_helpers import (  # noqa: F401  (exported, single_folder: fixtures)
    call,
    exported,
    oip_body,
    outputs,
    serving,
    single_folder,
    triton_pairs,
)

ATOL = 1e-5


@pytest.fixture(scope="module")
def server(exported):  # noqa: F811
    with serving(exported["folder"], max_batch=8, max_queue=64) as running:
        yield running


@pytest.fixture(scope="module")
def single(single_folder, single_run):  # noqa: F811
    """The classifier of one text per input served: (URL, its engine, six of its validation sentences)."""
    from acl_runtime.engine import Engine

    with serving(single_folder, max_batch=8, max_queue=64) as (url, _):
        yield url, Engine(single_folder, threads=1), helpers.raw_split(single_run[0])[0][:6]


def _pairs(exported, n=6):  # noqa: F811
    """The pair model's inputs, each as a list: TEI's form of one pair."""
    return [list(t) for t in exported["texts"][:n]]


def _logits(engine, text):
    """The deciding exit's logits of ``text`` under the server's default (the last exit), as the engine gives them."""
    p = engine.predict_early_exit([text])[0]
    return p, np.log([p.probabilities[k] for k in ("0", "1")])


def test_huggingface_hubs_inference_client_classifies_through_teis_root_route(single):
    """InferenceClient(base_url).text_classification posts {"inputs": text, "parameters": {...}} to / and reads a
    list per input; every label comes back, best first, with the engine's probabilities."""
    from huggingface_hub import InferenceClient

    url, engine, texts = single
    client = InferenceClient(base_url=url)
    for text in texts:
        want, _ = _logits(engine, text)
        got = client.text_classification(text)
        assert [e.label for e in got] == sorted(want.probabilities, key=want.probabilities.get, reverse=True)
        assert {e.label: e.score for e in got} == pytest.approx(want.probabilities, abs=ATOL)


def test_inference_client_top_k_and_function_to_apply_are_honoured(single):
    from huggingface_hub import InferenceClient

    url, engine, texts = single
    client = InferenceClient(base_url=url)
    text = texts[0]
    want, logits = _logits(engine, text)
    best = max(want.probabilities, key=want.probabilities.get)
    (top,) = client.text_classification(text, top_k=1)
    assert top.label == best and top.score == pytest.approx(want.probabilities[best], abs=ATOL)
    raw = {e.label: e.score for e in client.text_classification(text, function_to_apply="none")}
    # logits are the probabilities' logs up to one shift: their differences match
    assert raw["0"] - raw["1"] == pytest.approx(logits[0] - logits[1], abs=1e-4)
    sig = {e.label: e.score for e in client.text_classification(text, function_to_apply="sigmoid")}
    assert sig == pytest.approx({k: 1 / (1 + np.exp(-v)) for k, v in raw.items()}, abs=ATOL)


def test_the_root_route_without_parameters_is_teis_predict(server, exported):  # noqa: F811
    """A body without ``parameters`` is TEI's PredictRequest: one list for one input, as /predict answers."""
    url, _ = server
    text = _pairs(exported)[0]
    status, _, root = call(url + "/", {"inputs": text})
    assert status == 200 and root == call(f"{url}/predict", {"inputs": text})[2]
    assert isinstance(root[0], dict) and root[0]["label"] == exported["engine"].predict_early_exit([tuple(text)])[
        0].label


def test_teis_health_and_info_routes(server, exported):  # noqa: F811
    url, service = server
    assert call(url + "/health")[0] == 200 and call(url + "/", method="GET")[0] == 200
    status, _, info = call(url + "/info")
    assert status == 200 and info["model_type"]["classifier"]["id2label"] == {"0": "0", "1": "1"}
    assert info["max_input_length"] == exported["engine"].layout["max_positions"]
    assert info["max_client_batch_size"] == service.settings.max_queue


def test_tritonclient_reads_the_model_configuration_and_statistics(server, exported):  # noqa: F811
    """What perf_analyzer reads first (max_batch_size, the inputs and their types), and the statistics extension's
    counts, which move with the requests answered."""
    import tritonclient.http as triton

    url, service = server
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    config = client.get_model_config("acl")
    assert config["name"] == "acl" and config["max_batch_size"] == service.settings.max_queue
    assert [(i["name"], i["data_type"]) for i in config["input"]] == [("text", "TYPE_STRING"),
                                                                       ("text_pair", "TYPE_STRING")]
    assert {o["name"]: o["dims"] for o in config["output"]}["probabilities"] == [2]
    before = client.get_inference_statistics("acl")["model_stats"][0]
    assert call(f"{url}/v2/models/acl/infer", oip_body(exported["texts"][:3]))[0] == 200
    refused = call(f"{url}/v2/models/acl/infer", oip_body([("good", "bad")], policy="fast"))
    assert refused[0] == 400  # never reached the model
    after = client.get_inference_statistics("acl")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 3
    success = after["inference_stats"]["success"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == 1
    assert success["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["execution_count"] > before["execution_count"]
    with pytest.raises(triton.InferenceServerException, match="unknown model 'nope'"):
        client.get_model_config("nope")
    client.close()


def test_the_metadata_gives_each_input_row_the_configurations_dims_and_such_rows_are_answered(server, exported):  # noqa
    """perf_analyzer takes an input's row shape from the metadata, less the batch dimension when max_batch_size
    is above 0 (model_parser.cc), and refuses an empty one ("unable to set shape for the input"): the metadata
    says [-1, 1], the batch and the configuration's dims [1], as Triton says it. A [n, 1] tensor of n texts then
    gets exactly the answers of the same texts as [n]."""
    import tritonclient.http as triton

    url, _ = server
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    meta, config = client.get_model_metadata("acl"), client.get_model_config("acl")
    dims = {i["name"]: i["dims"] for i in config["input"]}
    assert config["max_batch_size"] > 0 and dims == {"text": [1], "text_pair": [1]}
    assert {i["name"]: i["shape"] for i in meta["inputs"]} == {n: [-1] + d for n, d in dims.items()}
    pairs = exported["texts"][:5]
    want = exported["engine"].predict_early_exit(pairs)
    for binary in (True, False):
        answers = []
        for row in ([], [1]):
            tensors = []
            for name, column in (("text", 0), ("text_pair", 1)):
                t = triton.InferInput(name, [len(pairs)] + row, "BYTES")
                t.set_data_from_numpy(np.asarray([p[column] for p in pairs], dtype=object).reshape([-1] + row),
                                      binary_data=binary)
                tensors.append(t)
            asked = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("label", "exit_layer",
                                                                                   "probabilities")]
            answers.append(client.infer("acl", tensors, outputs=asked))
        flat, column = answers
        for name in ("label", "exit_layer"):
            assert np.array_equal(flat.as_numpy(name), column.as_numpy(name)), name
        # the same rows, within float reduction order: a light load's wave is split by length at the worker's fitted
        # cost of a call, which moves between the two requests, so their rows may run in other groups
        assert np.abs(flat.as_numpy("probabilities") - column.as_numpy("probabilities")).max() < 1e-6
        assert [x.decode() if isinstance(x, bytes) else x for x in column.as_numpy("label")] == [p.label for p in
                                                                                               want]
        assert column.as_numpy("exit_layer").tolist() == [p.exit_layer for p in want]
        assert np.abs(column.as_numpy("probabilities")[:, 1] - [p.probabilities["1"] for p in want]).max() < ATOL
    client.close()


def test_triton_classification_answers_score_index_label_strings(server, exported):  # noqa: F811
    """class_count=N on probabilities answers each row's N best classes as "score:index:label", as Triton does."""
    import tritonclient.http as triton

    url, _ = server
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    texts = exported["texts"][:4]
    for binary in (True, False):
        for count in (1, 2, 5):
            asked = [triton.InferRequestedOutput("probabilities", binary_data=binary, class_count=count)]
            got = client.infer("acl", triton_pairs(texts), outputs=asked).as_numpy("probabilities")
            assert got.shape == (len(texts), min(count, 2))
            for row, t in zip(got, texts):
                want = exported["engine"].predict_early_exit([t])[0].probabilities
                fields = [(x.decode() if isinstance(x, bytes) else x).split(":") for x in row]
                assert [f[2] for f in fields] == sorted(want, key=want.get, reverse=True)[: len(row)]
                assert all(f[1] == f[2] for f in fields)  # labels "0" and "1" are their indices
                assert all(abs(float(f[0]) - want[f[2]]) < 1e-5 for f in fields)
    client.close()


def test_gzip_and_deflate_request_bodies_are_decoded_and_answers_compressed_when_accepted(server, exported):  # noqa
    """tritonclient's request_compression_algorithm sends a gzip or deflate body (Content-Encoding); an answer is
    gzip when the client accepts it."""
    import tritonclient.http as triton

    url, _ = server
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    texts = exported["texts"][:6] * 10
    predicted = exported["engine"].predict_early_exit(texts)
    want = [p.label for p in predicted]
    for algorithm in ("gzip", "deflate"):  # every output, binary: over 1 kB, so the answer is gzip too
        result = client.infer("acl", triton_pairs(texts), request_compression_algorithm=algorithm,
                              response_compression_algorithm="gzip")
        assert [x.decode() for x in result.as_numpy("label")] == want
        assert np.abs(result.as_numpy("probabilities")[:, 1] - [p.probabilities["1"] for p in predicted]).max() < ATOL
    client.close()
    body = gzip.compress(json.dumps(oip_body(texts)).encode())
    status, head, answer = call(f"{url}/v2/models/acl/infer", body, headers={"Content-Encoding": "gzip"})
    assert status == 200 and outputs(answer)["label"] == want  # urllib does not decode: the answer was plain
    assert "content-encoding" not in head
    import urllib.request

    req = urllib.request.Request(f"{url}/v2/models/acl/infer", body, headers={
        "Content-Encoding": "gzip", "Accept-Encoding": "gzip", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert outputs(json.loads(gzip.decompress(r.read())))["label"] == want


def test_predict_probabilities_are_the_softmax_of_the_raw_scores(server, exported):  # noqa: F811
    url, _ = server
    text = _pairs(exported)[0]
    raw = call(f"{url}/predict", {"inputs": text, "raw_scores": True})[2]
    probs = call(f"{url}/predict", {"inputs": text})[2]
    logits = np.asarray([[e["score"] for e in sorted(raw, key=lambda e: e["label"])]])
    assert [e["score"] for e in sorted(probs, key=lambda e: e["label"])] == pytest.approx(
        loop.softmax(logits)[0].tolist(), abs=ATOL)
