"""A backend call that raises fails only the rows at fault (acl_runtime.scheduler.Scheduler._isolate): the batch
is split and run again in halves, a row that raises alone fails its request, and every other request is answered
exactly as if the bad one had never come; refill on and off. On test_loop.py's numpy backend."""
import random

import numpy as np
import pytest

from acl_runtime import loop
from acl_runtime.scheduler import Scheduler
from test_loop import MeanBackend, _inputs
from test_scheduler import REQUESTS, _alone

BAD_LENGTH = 13  # no row of _inputs() is this long (2 to 11 tokens)


class FaultAt(MeanBackend):
    """Raises at layer ``at`` whenever a row of BAD_LENGTH tokens is in the batch (a fault in one text)."""

    def __init__(self, at: int, **kw):
        super().__init__(**kw)
        self.at, self.raised = at, 0

    def layer(self, i, x, mask):
        if i == self.at and ((~mask).sum(1) == BAD_LENGTH).any():
            self.raised += 1
            raise RuntimeError("bad row")
        return super().layer(i, x, mask)


@pytest.mark.parametrize("refill", [True, False])
@pytest.mark.parametrize("at", [1, 3])
def test_only_the_request_holding_the_bad_row_fails_and_the_others_answer_as_without_it(refill, at):
    backend = FaultAt(at)
    faults = []
    sched = Scheduler(backend, max_batch=8, max_queue=400, refill=refill, max_padding=100.0,
                      on_fault=lambda layer, rows: faults.append((layer, rows)))
    rng = random.Random(at)
    texts = _inputs(60, at)
    jobs = [(rng.sample(texts, rng.randint(1, 5)), REQUESTS[k % len(REQUESTS)]) for k in range(24)]
    bad_rows = [list(range(2, 2 + BAD_LENGTH))]
    jobs.insert(7, (jobs[7][0][:2] + bad_rows, loop.ExitRequest()))  # a request whose third row is at fault
    futures = [sched.submit(*job) for job in jobs]
    assert sched.close()
    assert backend.raised >= 1 and sched.depth() == 0
    with pytest.raises(RuntimeError, match="bad row"):
        futures[7].result()
    for k, ((rows, request), fut) in enumerate(zip(jobs, futures)):
        if k == 7:
            continue
        ans = fut.result(timeout=10)
        for j, ids in enumerate(rows):
            logits, layer = _alone(MeanBackend(), ids, request)
            assert ans.exit_layer[j] == layer
            np.testing.assert_allclose(ans.logits[j], logits, atol=1e-5)
    assert faults == [(at if refill else 0, 1)]


def test_a_fault_that_no_single_row_causes_fails_nothing():
    """A call that fails for its size (memory, say) and not for a row: every half runs, every request is
    answered, nothing is counted as isolated."""
    class TooBig(MeanBackend):
        def layer(self, i, x, mask):
            if x.shape[1] > 4:
                raise MemoryError("too big")
            return super().layer(i, x, mask)

    faults = []
    sched = Scheduler(TooBig(), max_batch=8, max_queue=64, max_padding=100.0,
                      on_fault=lambda layer, rows: faults.append(rows))
    texts = _inputs(16, 5)
    futures = [sched.submit(texts[k: k + 4]) for k in range(0, 16, 4)]
    assert sched.close()
    for k, fut in enumerate(futures):
        for j, ids in enumerate(texts[4 * k: 4 * k + 4]):
            np.testing.assert_allclose(fut.result().logits[j], _alone(MeanBackend(), ids, loop.ExitRequest())[0],
                                       atol=1e-5)
    assert faults == []
