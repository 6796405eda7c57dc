"""acl-serve when the model fails on one text: that text's request is answered 500, every other request in the
same batches gets the engine's answer, and /metrics counts the isolation; refill on and off."""
import concurrent.futures
import time

import numpy as np
import pytest

from serve_helpers import call, exported, oip_body, outputs, serving  # noqa: F401  (exported: a fixture)

AT = 2  # the layer that fails


def _bad_text(engine, others):
    """A pair whose token count no other pair has, so that a fault can recognise it in any batch by its length."""
    taken = {len(engine.encode_with_info(*t)[0]) for t in others}
    for n in range(1, 40):
        text = (" ".join(["fine"] * n), "fine")
        length = len(engine.encode_with_info(*text)[0])
        if length not in taken:
            return text, length
    raise AssertionError("no free length")


@pytest.mark.parametrize("refill", [True, False])
def test_a_fault_on_one_text_fails_only_its_request(exported, refill):  # noqa: F811
    engine = exported["engine"]
    inputs = exported["texts"][:24]  # pairs: what the model reads
    bad, length = _bad_text(engine, inputs)
    groups = [inputs[k: k + 3] for k in range(0, 24, 3)]
    groups.insert(3, [inputs[0], bad])
    with serving(exported["folder"], max_batch=8, max_queue=256, refill=refill) as (url, service):
        backend = service.scheduler.backend
        layer = backend.layer

        def faulty(i, x, mask):
            time.sleep(0.005)  # requests arrive while others are in flight, so batches mix them
            if i == AT and ((~mask).sum(1) == length).any():
                raise RuntimeError("a fault in one text")
            return layer(i, x, mask)

        backend.layer = faulty
        with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
            answers = list(pool.map(lambda g: call(f"{url}/v2/models/acl/infer", oip_body(g)), groups))
        metrics = call(f"{url}/metrics")[2].decode()
        backend.layer = layer
        assert call(f"{url}/v2/health/ready")[0] == 200
    for k, (group, (status, _, answer)) in enumerate(zip(groups, answers)):
        if k == 3:
            assert status == 500 and answer["error"].startswith("internal error"), answer
            continue
        assert status == 200, answer
        want = engine.predict_early_exit(group)
        assert outputs(answer)["label"] == [p.label for p in want]
        probs = np.asarray(outputs(answer)["probabilities"]).reshape(len(group), -1)[:, 1]
        assert np.abs(probs - [p.probabilities["1"] for p in want]).max() < 1e-5
    counted = f'acl_isolated_failures_total{{layer="{AT if refill else 0}"}} 1.0'
    assert counted in metrics, [line for line in metrics.splitlines() if "isolated" in line]
