"""The refilling scheduler (acl_runtime.scheduler): a row's answer (label, exit layer, logits) does not depend
on its arrival order or on which rows share its batches; the queues refill layer 1 while deeper layers finish older
rows; the caps, the overload refusal, the close. On test_loop.py's numpy backend (no torch), then on an exported
folder and the torch model against what acl-predict computes for the same inputs."""
import random
import threading
import time

import numpy as np
import pytest

from acl_runtime import loop
from acl_runtime.scheduler import Closed, QueueFull, Scheduler
from test_loop import PAD, MeanBackend, _inputs

REQUESTS = [loop.ExitRequest(), loop.ExitRequest("entropy", 0.6), loop.ExitRequest("patience", 1),
            loop.ExitRequest("confidence", 0.7), loop.ExitRequest(exit_layer=2)]


def _alone(backend, ids, request):
    """What acl-predict computes for one row at batch 1."""
    src = np.asarray([ids], dtype=np.int64)
    out = loop.run_batch(backend, src, src == PAD, request)
    return out.logits[0], int(out.exit_layer[0])


def _check(backend, jobs, futures):
    for (rows, request), fut in zip(jobs, futures):
        ans = fut.result(timeout=60)
        for k, ids in enumerate(rows):
            logits, layer = _alone(backend, ids, request)
            assert ans.exit_layer[k] == layer, (request, ids)
            np.testing.assert_allclose(ans.logits[k], logits, atol=1e-5)


def _jobs(seed, n=30):
    rng = random.Random(seed)
    texts = _inputs(120, seed)
    return [(rng.sample(texts, rng.randint(1, 6)), rng.choice(REQUESTS)) for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("refill", [True, False])
def test_answers_do_not_depend_on_arrival_order_or_batch_mates(seed, refill):
    backend = MeanBackend()
    sched = Scheduler(backend, max_batch=5, max_queue=400, refill=refill)
    rng = random.Random(seed)
    jobs, futures = _jobs(seed), []
    for job in jobs:  # arrivals between steps, at random
        futures.append(sched.submit(*job))
        for _ in range(rng.randint(0, 3)):
            sched.step()
    assert sched.close()
    assert all(f.done() for f in futures) and sched.depth() == 0
    _check(backend, jobs, futures)
    # the patience counter travelled with its rows: a patience request did leave early somewhere
    patience = [f.result().exit_layer for (_, r), f in zip(jobs, futures) if r.policy == "patience"]
    assert patience and min(np.concatenate(patience)) < 4


def test_layer_one_takes_new_rows_while_deeper_layers_finish_older_ones():
    backend = MeanBackend()
    calls = []
    sched = Scheduler(backend, max_batch=4, max_queue=400, on_batch=lambda layer, n, s, c: calls.append((layer, n)))
    texts = _inputs(40, 3)
    first = sched.submit(texts[:8])
    for _ in range(4):
        sched.step()
    second = sched.submit(texts[8:16])
    while sched.step():
        pass
    assert first.done() and second.done()
    assert max(n for _, n in calls) <= 4 and len(backend.calls) == sum(layer > 0 for layer, _ in calls)
    # a deep layer ran on older rows before the new rows were through layer 1, and after them too
    seen_deep = [k for k, (layer, _) in enumerate(calls) if layer >= 2]
    new_first = next(k for k, (layer, _) in enumerate(calls) if k > 4 and layer == 0)
    assert any(k < new_first for k in seen_deep) and any(k > new_first for k in seen_deep)


def test_batches_join_rows_from_different_requests():
    backend = MeanBackend(exit_layers=(4,))
    sched = Scheduler(backend, max_batch=8, max_queue=64, max_padding=10.0)
    futures = [sched.submit([ids]) for ids in _inputs(8, 4)]  # eight requests of one row each
    while sched.step():
        pass
    assert all(f.done() for f in futures)
    assert [(layer, rows) for layer, rows, _ in backend.calls] == [(i, 8) for i in (1, 2, 3, 4)]


def test_padding_waste_is_capped_when_batches_refill():
    backend = MeanBackend(exit_layers=(2,))
    sched = Scheduler(backend, max_batch=2, max_queue=64, max_padding=0.5)  # 3 rows: more than a batch
    short, long = [2] * 2, [3] * 11
    futures = [sched.submit([long]), sched.submit([short]), sched.submit([short])]
    while sched.step():
        pass
    assert all(f.done() for f in futures)
    # a 2-token row and an 11-token row never share a batch: 2 x 11 positions for 13 real ones
    assert all(not (rows == 2 and length == 11) for _, rows, length in backend.calls)


def test_a_light_loads_wave_takes_every_waiting_row_as_without_refill():
    """Nothing in flight and at most a batch waiting: one wave of all of them, whatever their lengths (capped, a
    burst of unlike lengths ran as two waves, the second waiting for the first: a longer tail than without
    refill at the same rate)."""
    short, long = [2] * 2, [3] * 11
    for refill in (True, False):
        backend = MeanBackend(exit_layers=(2,))
        sched = Scheduler(backend, max_batch=8, max_queue=64, max_padding=0.5, refill=refill)
        futures = [sched.submit([short]), sched.submit([long]), sched.submit([short])]
        assert sched.step() and not sched.step()  # one step answered all three
        assert all(f.done() for f in futures)
        assert [(rows, length) for _, rows, length in backend.calls] == [(3, 11)] * 2, refill  # layers 1 and 2


def test_no_row_waits_for_ever():
    """New rows keep layer 1 the fullest queue; max_wait still brings the deep rows through."""
    backend = MeanBackend(exit_layers=(4,))
    sched = Scheduler(backend, max_batch=4, max_queue=10_000, max_wait=6)
    texts = _inputs(200, 5)
    old = sched.submit(texts[:1])
    steps = 0
    while not old.done():
        sched.submit(texts[steps % 200: steps % 200 + 4] or texts[:4])
        sched.step()
        steps += 1
        assert steps < 60, "the first row starved behind new arrivals"


def test_a_full_queue_refuses_before_queueing_anything():
    sched = Scheduler(MeanBackend(), max_batch=2, max_queue=5)
    sched.submit(_inputs(4, 6))
    with pytest.raises(QueueFull) as e:
        sched.submit(_inputs(2, 7))
    assert e.value.retry_after >= 1 and sched.depth() == 4 and "at most 5" in str(e.value)
    sched.submit(_inputs(1, 8))  # what fits is taken
    assert sched.close() and sched.depth() == 0


def test_bad_submissions_are_refused_with_a_reason():
    sched = Scheduler(MeanBackend())
    with pytest.raises(ValueError, match="no inputs"):
        sched.submit([])
    with pytest.raises(ValueError, match="padding id"):
        sched.submit([[5, PAD, 6]])
    with pytest.raises(ValueError, match="exit layer 7"):
        sched.submit([[5]], loop.ExitRequest(exit_layer=7))
    with pytest.raises(ValueError, match="max_queue"):
        Scheduler(MeanBackend(), max_batch=8, max_queue=4)
    assert sched.depth() == 0


def test_a_backend_error_fails_its_requests_and_the_scheduler_goes_on():
    """(Rows at fault are found by splitting the batch: tests/runtime/test_fault_isolation.py.)"""
    class Failing(MeanBackend):
        def layer(self, i, x, mask):
            if ((~mask).sum(1) == 3).any():  # a row of 3 tokens raises, whatever its batch
                raise RuntimeError("boom")
            return super().layer(i, x, mask)

    backend = Failing(exit_layers=(2,))
    sched = Scheduler(backend, max_batch=3, max_queue=64, max_padding=100.0)
    bad = sched.submit([[5, 6, 7], [5, 6]])
    while sched.step():
        pass
    good = sched.submit([[4, 5], [4, 5, 6, 7]])
    assert sched.close()
    with pytest.raises(RuntimeError, match="boom"):
        bad.result()
    assert good.result().logits.shape == (2, backend.num_classes)


def test_threaded_random_arrivals_and_close_answers_every_accepted_row():
    backend = MeanBackend()
    sched = Scheduler(backend, max_batch=6, max_queue=1000).start()
    jobs = _jobs(11, 60)
    futures = [None] * len(jobs)

    def client(part):
        rng = random.Random(part)
        for k in range(part, len(jobs), 3):
            time.sleep(rng.random() * 0.002)
            futures[k] = sched.submit(*jobs[k])

    threads = [threading.Thread(target=client, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sched.close(timeout=60)
    with pytest.raises(Closed):
        sched.submit(_inputs(1, 12))
    _check(backend, jobs, futures)


# ---- the real backends: an exported folder and the torch model, against acl-predict's computation -------------


@pytest.fixture(scope="module")
def exported(predict_run, tmp_path_factory):
    from test_onnx import _export

    root, data, ckpt = predict_run
    out = str(tmp_path_factory.mktemp("sched") / "onnx")
    model, engine = _export(ckpt, data, out, ["a b c"])
    return model, engine


def _texts(n, seed):
    rng = random.Random(seed)
    words = "the a movie was not good bad great really film plot acting dull fun".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 14))) for _ in range(n)]


def test_ort_backend_join_pads_each_row_and_keeps_the_order():
    from acl_runtime.engine import OrtBackend

    a, b = np.ones((2, 1, 3), np.float32), 2 * np.ones((4, 2, 3), np.float32)
    joined = OrtBackend(None, [], [1], 2).join([a, b], 5)
    assert joined.shape == (5, 3, 3)
    np.testing.assert_array_equal(joined[:2, 0], 1)
    np.testing.assert_array_equal(joined[:4, 1:], 2)
    assert not joined[2:, 0].any() and not joined[4:, 1:].any()


@pytest.mark.slow  # about 40 s: exports a tiny model to ONNX; the numpy tests above cover the scheduling
@pytest.mark.parametrize("side", ["onnx", "torch"])
def test_served_rows_equal_acl_predict_on_a_real_model(exported, side):
    model, engine = exported
    predictor = engine if side == "onnx" else model
    texts = list(zip(_texts(60, 13), _texts(60, 14)))  # pairs: what the model reads
    requests = [predictor.resolve_request(policy, threshold) for policy, threshold in
                [("none", None), ("entropy", 0.5), ("patience", 1), ("confidence", 0.9)]]
    want = {r: predictor.predict_texts(texts, r, batch_size=1) for r in requests}  # acl-predict --batch-size 1
    assert predictor.backend.pad == predictor.pad
    sched = Scheduler(predictor.backend, max_batch=8, max_queue=1000).start()
    rng = random.Random(14)
    jobs = []
    for _ in range(40):
        request, idx = rng.choice(requests), rng.sample(range(len(texts)), rng.randint(1, 5))
        ids = [predictor.encode_with_info(*texts[i])[0] for i in idx]
        jobs.append((request, idx, sched.submit(ids, request)))
        time.sleep(rng.random() * 0.003)
    assert sched.close(timeout=120)
    for request, idx, fut in jobs:
        ans = fut.result()
        got = predictor.to_predictions(ans.logits, ans.exit_layer, [False] * len(idx))
        for g, i in zip(got, idx):
            w = want[request][i]
            assert (g.label, g.exit_layer) == (w.label, w.exit_layer), (request, texts[i])
            for name in w.probabilities:
                assert g.probabilities[name] == pytest.approx(w.probabilities[name], abs=1e-5)


@pytest.mark.parametrize("refill", [True, False])
def test_a_cancelled_request_frees_its_queued_rows_and_the_others_are_answered(refill):
    """A client that goes away (or a drain out of time) gives up its request: its rows leave the queues at once,
    so they are neither computed nor counted against --max-queue, and every other request is answered."""
    backend = MeanBackend()
    sched = Scheduler(backend, max_batch=3, max_queue=40, refill=refill)
    jobs = _jobs(21, 4)
    futures = [sched.submit(*jobs[0])]
    sched.step()  # the first request is under way
    futures += [sched.submit(*job) for job in jobs[1:]]
    gone = futures.pop(1)
    queued = sched.depth()
    freed = sched.cancel(gone)
    assert gone.cancelled() and freed == len(jobs[1][0]) and sched.depth() == queued - freed
    assert sched.close() and sched.depth() == 0
    _check(backend, jobs[:1] + jobs[2:], futures)
    assert sched.cancel(futures[0]) == 0 and not futures[0].cancelled()  # an answered request stays answered


@pytest.mark.parametrize("refill", [True, False])
def test_every_backend_call_reports_its_positions_and_padding(refill):
    """on_tokens(layer, tokens, padded) after each call: rows x the call's width, and the positions beyond each
    row's length (two rows of 3 and 7 tokens run together: 14 positions, 4 of them padding, at every layer)."""
    backend, seen = MeanBackend(exit_layers=(4,)), []
    sched = Scheduler(backend, max_batch=4, max_queue=8, refill=refill, max_padding=10.0,
                      on_tokens=lambda layer, tokens, padded: seen.append((layer, tokens, padded)))
    future = sched.submit([[5, 6, 7], [5, 6, 7, 8, 9, 10, 11]])
    while sched.step():
        pass
    assert future.done()
    assert seen == [(layer, 14, 4) for layer in range(5)]
