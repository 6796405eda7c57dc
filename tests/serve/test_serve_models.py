"""acl-serve on the models beside the fp32 classifier: the int8 graphs under concurrent requests whose rows share
batches (mixed policies and sizes), and a regression head over HTTP (an FP32 ``label``, patience its only policy).
Each answer against the engine's (what acl-predict computes), probabilities or values to 1e-5."""
import concurrent.futures
import random

import pytest

from serve_helpers import (  # noqa: F401  (exported, regression_folder: fixtures)
    assert_oip_equals_engine,
    call,
    exported,
    oip_body,
    outputs,
    regression_folder,
    serving,
)

POLICIES = [{}, {"policy": "none"}, {"policy": "entropy", "threshold": 0.6}, {"policy": "patience", "threshold": 1},
            {"policy": "confidence", "threshold": 0.7}, {"exit_layer": 2}]


def test_int8_answers_under_concurrency_equal_the_int8_engine_row_by_row(exported):  # noqa: F811
    """Requests of 1 to 5 inputs under six exit requests, 40 at once, so that rows of different requests and
    policies share the refilling scheduler's batches; each equals the int8 engine on that request alone."""
    from acl_runtime.engine import Engine

    engine = Engine(exported["folder"], "int8", threads=1)
    rng = random.Random(5)
    pairs = exported["texts"]  # the model reads pairs: a lone text is refused (tests/inference/test_pairing.py)
    jobs = [(rng.sample(pairs, rng.randint(1, 5)), rng.choice(POLICIES)) for _ in range(40)]
    with serving(exported["folder"], precision="int8", max_batch=6) as (url, service):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda job: call(f"{url}/v2/models/acl/infer", oip_body(*job[:1], **job[1])),
                                    jobs))
        metrics = call(f"{url}/metrics")[2].decode()
    # a batch of 6 rows (fill above 5/6) holds rows of two requests or more: no request has more than 5
    fives = [line for line in metrics.splitlines() if line.startswith("acl_batch_fill_bucket") and 'le="0.875"' in line]
    assert any(float(line.split()[-1]) < float(_count(metrics, line)) for line in fives), fives
    for (group, params), (status, _, answer) in zip(jobs, answers):
        assert status == 200, answer
        want = engine.predict_early_exit(group, params.get("policy"), params.get("threshold"),
                                         params.get("exit_layer"))
        assert_oip_equals_engine(answer, want)
    fp32 = exported["engine"].predict_early_exit(jobs[0][0], "none")  # the int8 graphs ran, not the fp32 ones
    int8 = engine.predict_early_exit(jobs[0][0], "none")
    assert max(abs(a.probabilities["0"] - b.probabilities["0"]) for a, b in zip(fp32, int8)) > 1e-4


def _count(metrics: str, bucket_line: str) -> float:
    """The ``_count`` sample of the histogram series that ``bucket_line`` belongs to."""
    labels = bucket_line.split("{", 1)[1].rsplit("}", 1)[0]
    layer = [part for part in labels.split(",") if part.startswith("layer=")]
    name = "acl_batch_fill_count" + ("{" + layer[0] + "}" if layer else "")
    return next(line.split()[-1] for line in metrics.splitlines() if line.startswith(name + " "))


def test_a_regression_model_answers_its_fp32_values_with_patience_over_http(regression_folder):  # noqa: F811
    from acl_runtime.engine import Engine

    folder, texts = regression_folder
    engine = Engine(folder, threads=1)
    want_last = engine.predict_early_exit(texts, "none")
    want_patience = engine.predict_early_exit(texts, "patience", 1)
    assert len({round(p.label, 4) for p in want_last}) > 1  # values, not one constant
    with serving(folder, max_batch=4) as (url, service):
        metadata = call(f"{url}/v2/models/acl")[2]
        status, _, last = call(f"{url}/v2/models/acl/infer", oip_body(texts, policy="none"))
        _, _, patience = call(f"{url}/v2/models/acl/infer", oip_body(texts, policy="patience", threshold=1))
        _, _, tei = call(f"{url}/predict", {"inputs": [[t] for t in texts], "policy": "patience", "threshold": 1})
        refused = call(f"{url}/v2/models/acl/infer", oip_body(texts[:1], policy="entropy", threshold=0.5))
    assert {o["name"]: o["datatype"] for o in metadata["outputs"]}["label"] == "FP32"
    assert "probabilities" not in {o["name"] for o in metadata["outputs"]}
    assert status == 200
    for answer, want in [(last, want_last), (patience, want_patience)]:
        got = outputs(answer)
        assert got["label"] == pytest.approx([p.label for p in want], abs=1e-5)
        assert got["exit_layer"] == [p.exit_layer for p in want]
        assert next(o for o in answer["outputs"] if o["name"] == "label")["datatype"] == "FP32"
    assert [row[0]["score"] for row in tei] == pytest.approx([p.label for p in want_patience], abs=1e-5)
    assert [row[0]["label"] for row in tei] == ["score"] * len(texts)
    assert [row[0]["exit_layer"] for row in tei] == [p.exit_layer for p in want_patience]
    assert refused[0] == 400 and "regression" in refused[2]["error"] and "\n" not in refused[2]["error"], refused
