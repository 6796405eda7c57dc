"""The scheduler's latency rules (acl_runtime.scheduler, ``Scheduler._pick``): a row that would miss its deadline
runs before a fuller queue; a light load runs through as one wave, the deepest queue first; with deadlines the
answers still do not depend on arrival or batch-mates; acl-serve's --slo-ms and Triton's ``timeout`` parameter
set them."""
import random
import time

import numpy as np
import pytest

from acl_runtime.loop import ExitRequest
from acl_runtime.scheduler import Scheduler
from acl_runtime.serve import cli, protocol
from test_loop import MeanBackend, _inputs
from test_scheduler import _check, _jobs


def _calls(**kw):
    """The ordering rules alone (``delay``: a deadline only orders the queues); what a deadline does beyond that is
    tests/runtime/test_deadline_exits.py's."""
    calls = []
    sched = Scheduler(MeanBackend(exit_layers=(2, 4)), on_batch=lambda layer, n, s, c: calls.append((layer, n)),
                      max_batch=3, max_queue=64, **{"deadline_policy": "delay", **kw})
    return sched, calls


def _old_row_at_layer_three(sched, deadline=None):
    """One row waiting for layer 3 and one for the embeddings: the old row came with three that left at layer 2
    (four rows, over --max-batch: layer by layer)."""
    old = sched.submit(_inputs(1, 1), deadline=deadline)
    sched.submit(_inputs(3, 3), ExitRequest(exit_layer=2), deadline=100.0)
    for _ in range(3):  # the embeddings, layer 1, layer 2 on a full batch each
        sched.step()
    assert [len(q) for q in sched.queues] == [1, 0, 0, 1, 0] and sched.queues[3][0].job.future is old
    return old


def test_a_row_that_would_miss_its_deadline_runs_before_a_full_queue():
    sched, calls = _calls()
    _old_row_at_layer_three(sched, deadline=0.002)
    sched.submit(_inputs(8, 2), deadline=100.0)  # full batches for the embeddings
    time.sleep(0.003)  # the old row is now late
    sched.step()
    assert calls[-1] == (3, 1)


def test_without_a_deadline_the_full_queue_goes_first():
    """The same queues with no deadline: the rule above is what moved the late row."""
    sched, calls = _calls()
    _old_row_at_layer_three(sched)
    sched.submit(_inputs(8, 2))
    time.sleep(0.003)
    sched.step()
    assert calls[-1] == (0, 3)


def test_a_row_with_time_left_waits_for_the_full_queue():
    sched, calls = _calls(slo=100.0)
    _old_row_at_layer_three(sched)
    sched.submit(_inputs(8, 2))
    sched.step()
    assert calls[-1] == (0, 3)


def test_least_slack_runs_a_new_rows_queue_before_an_older_row_with_fewer_layers_ahead():
    """Rule 1 as it stands (docs/serve.md, the int8 half-load miss): where the objective is under the cost of a
    full-depth pass, a new row's slack is gone as it arrives and is below an older row's with fewer layers ahead,
    so the embeddings' queue runs before the row in flight."""
    sched, calls = _calls(slo=1.0)
    sched.submit(_inputs(1, 1))
    others = sched.submit(_inputs(3, 3), ExitRequest(exit_layer=2))  # four rows, over --max-batch: layer by layer
    for _ in range(3):  # the embeddings, layer 1, layer 2: one row waits for layer 3, one for the embeddings
        sched.step()
    sched.cancel(others)  # the one left at the embeddings goes: the old row alone is in flight
    time.sleep(0.002)
    sched.submit(_inputs(1, 2))  # 2 ms younger
    sched._call = 0.3  # the measured cost of a call: 5 of them ahead of a row at the embeddings, 2 at layer 3
    now = time.perf_counter()
    slack = {i: q[0].deadline - now - (q[0].last + 1 - i) * sched._call for i, q in enumerate(sched.queues) if q}
    assert sorted(slack) == [0, 3] and slack[0] < 0 < slack[3]
    assert sched.queues[3][0].deadline <= min(r.deadline for r in sched.queues[0])  # the older row, or as old
    sched.step()
    assert calls[-1][0] == 0


def test_a_light_load_runs_as_one_wave_deepest_queue_first():
    """Up to --max-batch rows waiting: the deeper rows finish before new ones start (the fullest-queue rule ran the
    two new rows' embeddings first and kept the old row waiting)."""
    sched, calls = _calls()
    old = _old_row_at_layer_three(sched)
    sched.submit(_inputs(1, 2))
    sched.step()
    sched.step()
    assert calls[-2:] == [(3, 1), (4, 1)] and old.done()


def test_a_light_load_with_nothing_in_flight_runs_through_in_one_go():
    """All rows waiting for the embeddings and no more than --max-batch: one step runs them to their exits
    (run_batch, a request at a time), not a step per layer; each backend call is still reported; the answers are
    those of each row alone (test_scheduler.py's _check)."""
    sched, calls = _calls()
    backend = sched.backend
    jobs = [(_inputs(2, 5), ExitRequest()), (_inputs(1, 6), ExitRequest("entropy", 0.6))]
    futures = [sched.submit(*job) for job in jobs]
    assert sched.step() and all(f.done() for f in futures) and sched.depth() == 0
    assert calls[:5] == [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2)] and calls[5][0] == 0  # then the second request
    _check(backend, jobs, futures)


def test_without_waves_a_light_load_goes_layer_by_layer():
    """``waves=False`` (benchmarks/serve_ideal.py's pure schedules): one backend call a step even with nothing in
    flight, so that a new row can start between a wave's layers; the answers are each row's alone."""
    sched, calls = _calls(waves=False)
    backend = sched.backend
    jobs = [([list(range(2, 8)), list(range(3, 9))], ExitRequest())]  # one length: one batch
    futures = [sched.submit(*jobs[0])]
    assert sched.step() and calls == [(0, 2)] and not futures[0].done()
    assert sched.step() and calls[-1] == (1, 2)
    jobs.append((_inputs(1, 6), ExitRequest("entropy", 0.6)))
    futures.append(sched.submit(*jobs[1]))  # joins between the first request's layers
    assert sched.close() and sched.depth() == 0
    _check(backend, jobs, futures)


@pytest.mark.parametrize("seed", [0, 1])
def test_with_deadlines_answers_do_not_depend_on_arrival_order_or_batch_mates(seed):
    backend = MeanBackend()
    sched = Scheduler(backend, max_batch=5, max_queue=400, slo=0.0005, deadline_policy="delay")
    rng = random.Random(seed)
    jobs, futures = _jobs(seed), []
    for job in jobs:
        futures.append(sched.submit(*job, deadline=rng.choice([None, 1e-6, 0.01, 10.0])))
        for _ in range(rng.randint(0, 3)):
            sched.step()
    assert sched.close() and sched.depth() == 0
    _check(backend, jobs, futures)


def test_an_answer_says_where_its_rows_time_went():
    sched = Scheduler(MeanBackend(exit_layers=(4,)), max_batch=4, max_queue=64)
    future = sched.submit(_inputs(3, 4))
    time.sleep(0.002)
    assert sched.close()
    answer = future.result()
    assert answer.waits.shape == (3, 5) and (answer.waits[:, 0] >= 0.002).all()
    assert (answer.model > 0).all() and answer.done_at <= time.perf_counter()
    np.testing.assert_array_equal(answer.exit_layer, [4, 4, 4])
    sched = Scheduler(MeanBackend(exit_layers=(4,)), max_batch=2, max_queue=64)  # over --max-batch: layer by layer
    future = sched.submit(_inputs(5, 4))
    assert sched.close()
    waits = future.result().waits
    assert (waits[:, 0] > 0).all() and (waits[:, 1:] > 0).sum() > 0 and (waits >= 0).all()


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "soon"])
def test_slo_ms_takes_positive_milliseconds(value, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["folder", "--slo-ms", value])
    assert "--slo-ms" in capsys.readouterr().err


def test_slo_ms_reaches_the_scheduler_in_seconds():
    args = cli.build_parser().parse_args(["folder", "--slo-ms", "25"])
    assert cli.settings_from(args).slo_ms == 25.0
    with pytest.raises(ValueError, match="slo"):
        Scheduler(MeanBackend(), slo=0.0)


def test_a_triton_timeout_is_the_requests_deadline_in_seconds():
    body = b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}], ' \
           b'"parameters": {"timeout": 25000}}'
    assert protocol.parse_infer(body, None, ["label"]).deadline == 0.025
    assert protocol.parse_infer(body.replace(b', "parameters": {"timeout": 25000}', b""), None,
                                ["label"]).deadline is None
