"""Deadline exits (acl_runtime.deadlines, in acl_runtime.scheduler): a row whose next layers up to its next exit
would end past its deadline, at the cost those layers take for the batch it would run in, answers from the exit it
has reached; never deeper than its policy's own exit; a request that has not started by its deadline fails with
Triton's error. A fake clock and a fake cost table drive the scheduler: time passes only in backend calls (each
advances the clock by the table's cost for it) or where a test moves it; no sleeps."""
import random

import numpy as np
import pytest

from acl_runtime import deadlines, loop
from acl_runtime.deadlines import CostTable, DeadlineExpired
from acl_runtime.loop import ExitRequest
from acl_runtime.scheduler import Scheduler
from test_loop import PAD, MeanBackend, _inputs

U = 1 / 64  # the table's unit: sums of its multiples are exact in binary, so "exactly when" is exact
EPS = 1 / 4096


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FixedCosts(CostTable):
    """A fake cost table: ``costs[layer]`` units a call at batch 1, ``batch_factor`` x more for each doubling of the
    batch; the scheduler's own timings are ignored."""

    def __init__(self, costs, max_batch=4, batch_factor=1.0):
        super().__init__(len(costs) - 1, max_batch)
        for layer, units in enumerate(costs):
            for b in range(len(self.buckets)):
                self.seconds[layer][b] = units * U * batch_factor ** b

    def observe(self, layer, rows, seconds):
        pass


class TimedBackend(MeanBackend):
    """MeanBackend whose calls take, on ``clock``, what ``costs`` says they cost; ``log``: (layer, rows) of each."""

    def __init__(self, clock, costs, **kw):
        super().__init__(**kw)
        self.clock, self.costs, self.log = clock, costs, []

    def embed(self, ids, mask):
        self.clock.t += self.costs.cost(0, len(mask))
        self.log.append((0, len(mask)))
        return super().embed(ids, mask)

    def layer(self, i, x, mask):
        self.clock.t += self.costs.cost(i, len(mask))
        self.log.append((i, len(mask)))
        return super().layer(i, x, mask)


COSTS = (1, 2, 3, 4, 5)  # units: the embeddings, then layers 1-4


def _scheduler(costs=COSTS, policy="answer", batch_factor=1.0, **kw):
    clock = Clock()
    table = FixedCosts(costs, batch_factor=batch_factor)
    backend = TimedBackend(clock, table)
    sched = Scheduler(backend, max_batch=4, max_queue=64, deadline_policy=policy, costs=table, clock=clock, **kw)
    return sched, backend, clock


def _alone_at(backend, ids, layer):
    """The fixed-exit answer: one row alone, exit layer ``layer`` (what acl-predict --exit-layer computes)."""
    src = np.asarray([ids], dtype=np.int64)
    out = loop.run_batch(MeanBackend(), src, src == PAD, ExitRequest(exit_layer=layer))
    return out.logits[0]


def _rule(deadline, costs=COSTS, last=4):
    """Where the rule says one row alone, no policy, exits: the first exit i at which the next layer's cost
    exceeds the time left (t_i: the embeddings and layers 1..i run), else its last exit."""
    t = costs[0]
    for i in range(1, last):
        t += costs[i]
        if costs[i + 1] > deadline - t:
            return i
    return last


@pytest.mark.parametrize("at", [1, 2, 3])
@pytest.mark.parametrize("shift", [0.0, -EPS])
def test_a_deadline_exit_is_taken_exactly_when_the_next_layers_cost_exceeds_the_time_left(at, shift):
    """Deadline = t_at + cost of layer at+1 (+ shift): exactly the time left is not late (the row goes deeper, to
    where the rule sends it), a hair less is (it answers from exit ``at``)."""
    deadline = (sum(COSTS[: at + 1]) + COSTS[at + 1]) * U + shift
    sched, backend, _ = _scheduler()
    ids = _inputs(1, 5)[0]
    future = sched.submit([ids], deadline=deadline)
    assert sched.close()
    answer, want = future.result(), _rule(deadline / U)
    if shift < 0:
        assert want == at
    assert int(answer.exit_layer[0]) == want
    assert answer.exit_reason[0] == ("deadline" if want < 4 else "last")
    np.testing.assert_allclose(answer.logits[0], _alone_at(backend, ids, want), atol=1e-6)
    assert [layer for layer, _ in backend.log] == list(range(want + 1))  # no layer beyond the exit ran


def test_the_cost_is_that_of_the_batch_the_row_would_run_in():
    """Every call costs 3x for two rows what it costs for one: layer 2 takes 2 units alone, 6 for two. With the
    same 4 units (less a hair) left after layer 1, one row goes on and two rows together answer from layer 1."""
    costs = (1, 2, 2, 1, 1)
    for texts, after_layer_one in [([list(range(2, 8))], 3), ([list(range(2, 8)), list(range(3, 9))], 9)]:
        sched, backend, _ = _scheduler(costs, batch_factor=3.0)
        future = sched.submit(texts, deadline=(after_layer_one + 4) * U - EPS)
        assert sched.close()
        answer = future.result()
        if len(texts) == 1:
            assert int(answer.exit_layer[0]) > 1 and (2, 1) in backend.log
        else:
            assert list(answer.exit_layer) == [1, 1] and list(answer.exit_reason) == ["deadline"] * 2
            assert backend.log == [(0, 2), (1, 2)]


def test_a_row_late_at_the_boundary_after_a_call_answers_at_once_without_waiting_in_the_next_queue():
    sched, backend, _ = _scheduler()
    future = sched.submit([_inputs(1, 3)[0]], deadline=5 * U)  # after layer 1 (3 units), 2 left: layer 2 costs 3
    sched.step()
    assert not future.done()  # the embeddings reach no exit: it goes on
    sched.step()
    assert future.done() and [len(q) for q in sched.queues] == [0] * 5 and sched.depth() == 0
    assert (int(future.result().exit_layer[0]), future.result().exit_reason[0]) == (1, "deadline")


def test_a_row_that_waited_is_checked_again_when_its_queue_runs_and_answers_without_a_call():
    sched, backend, clock = _scheduler()
    ids = _inputs(1, 3)[0]
    future = sched.submit([ids], deadline=13 * U)  # the whole path costs 15 units: layer by layer
    sched.step()
    sched.step()  # the embeddings and layer 1 ran: at 3 units, 10 left, layer 2 costs 3: it waits for layer 2
    assert [len(q) for q in sched.queues] == [0, 0, 1, 0, 0] and not future.done()
    clock.t += 8 * U  # other work: 2 units left, under layer 2's 3
    calls = len(backend.log)
    sched.step()
    assert future.done() and len(backend.log) == calls and sched.depth() == 0
    answer = future.result()
    assert (int(answer.exit_layer[0]), answer.exit_reason[0]) == (1, "deadline")
    np.testing.assert_allclose(answer.logits[0], _alone_at(backend, ids, 1), atol=1e-6)


def test_a_waiting_row_is_answered_when_its_deadline_catches_it_not_when_its_queue_runs():
    """A row waiting for layer 2 while a request with less slack takes the next calls: before every step the
    queues are swept, so it answers from exit 1 when its time left falls under layer 2's cost, at its deadline or
    before, rather than after the other request's calls, when its queue's turn came (late)."""
    sched, backend, clock = _scheduler()
    ids = _inputs(1, 3)[0]
    future = sched.submit([ids], deadline=13 * U)  # the whole path costs 15 units: layer by layer
    sched.step()
    sched.step()  # at 3 units it waits for layer 2 (3 units) with 10 left
    answered_at = []
    future.add_done_callback(lambda _: answered_at.append(clock.t))
    clock.t = 11 * U  # 2 units left: under layer 2's cost
    other = sched.submit(_inputs(4, 8), deadline=1 * U)  # less slack: rule 1 runs its calls first
    sched.step()
    assert future.done() and answered_at == [11 * U] and backend.log[-1][0] == 0  # then the other's embeddings
    answer = future.result()
    assert (int(answer.exit_layer[0]), answer.exit_reason[0]) == (1, "deadline")
    np.testing.assert_allclose(answer.logits[0], _alone_at(backend, ids, 1), atol=1e-6)
    assert sched.close() and other.done()


def test_the_policy_decides_first_a_deadline_never_makes_a_row_go_deeper():
    """A row whose policy fires at layer 1 leaves there as the policy's, whatever its deadline; a confident one
    with a deadline that would allow layer 4 still leaves at its policy's exit."""
    for deadline in (2.5 * U, 100.0, None):
        sched, backend, _ = _scheduler()
        texts = _inputs(6, 11)
        request = ExitRequest("confidence", 0.0)  # fires at the first exit
        future = sched.submit(texts, request, deadline=deadline)
        assert sched.close()
        answer = future.result()
        assert list(answer.exit_layer) == [1] * 6 and set(answer.exit_reason) == {"policy"}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_arrivals_answers_are_the_policys_or_the_fixed_exit_answer_at_a_shallower_layer(seed):
    requests = [ExitRequest(), ExitRequest("entropy", 0.6), ExitRequest("patience", 1),
                ExitRequest("confidence", 0.7), ExitRequest(exit_layer=3)]
    rng = random.Random(seed)
    sched, backend, clock = _scheduler()
    texts, jobs = _inputs(120, seed), []
    for _ in range(30):
        rows, request = rng.sample(texts, rng.randint(1, 5)), rng.choice(requests)
        deadline = rng.choice([None, 3 * U, 8 * U, 12 * U, 30 * U, 1.0])
        jobs.append((rows, request, clock.t, deadline, sched.submit(rows, request, deadline=deadline)))
        for _ in range(rng.randint(0, 3)):
            sched.step()
        clock.t += rng.choice([0, U, 4 * U])
    assert sched.close() and sched.depth() == 0
    seen = set()
    for rows, request, _, deadline, future in jobs:
        if future.exception() is not None:
            assert isinstance(future.exception(), DeadlineExpired) and deadline is not None
            assert str(future.exception()).startswith("Request timeout expired")
            seen.add("expired")
            continue
        answer = future.result()
        for k, ids in enumerate(rows):
            src = np.asarray([ids], dtype=np.int64)
            own = loop.run_batch(MeanBackend(), src, src == PAD, request)
            layer, reason = int(answer.exit_layer[k]), answer.exit_reason[k]
            seen.add(reason)
            if reason == "deadline":
                assert deadline is not None and layer < int(own.exit_layer[0])  # sooner, never deeper
                np.testing.assert_allclose(answer.logits[k], _alone_at(backend, ids, layer), atol=1e-5)
            else:
                assert layer == int(own.exit_layer[0])
                assert reason == ("last" if layer == (request.exit_layer or 4) else "policy")
                np.testing.assert_allclose(answer.logits[k], own.logits[0], atol=1e-5)
    assert {"deadline", "policy", "last"} <= seen  # the case covers every reason


def test_a_request_that_reached_no_exit_by_its_deadline_fails_with_tritons_error():
    for policy in ("answer", "fail"):
        sched, backend, clock = _scheduler(policy=policy)
        other = sched.submit(_inputs(2, 1), deadline=50 * U)
        late = sched.submit(_inputs(3, 2), deadline=2 * U)
        clock.t += 3 * U  # before any step: both still wait for the embeddings; only the second is past its deadline
        assert sched.close() and sched.depth() == 0
        with pytest.raises(DeadlineExpired, match=r"^Request timeout expired: .*31.25 ms.* passed .* embeddings"):
            late.result()
        assert list(other.result().exit_layer) == [4, 4]
        assert sum(rows for layer, rows in backend.log if layer == 0) == 2  # the expired rows never ran


def test_delay_runs_a_late_row_through_and_fail_lets_a_started_row_finish():
    """``fail`` is Triton's: only a request that has not started by its deadline fails; ``delay`` fails none."""
    for policy in ("delay", "fail"):
        sched, backend, clock = _scheduler(policy=policy)
        started = sched.submit(_inputs(1, 4), deadline=13 * U)
        others = sched.submit(_inputs(4, 5))  # five rows, over --max-batch: layer by layer
        sched.step()  # the embeddings of four rows, the oldest first
        assert not any(r.job.future is started for r in sched.queues[0])
        clock.t += 100 * U  # long past its deadline, in flight
        assert sched.close()
        answer = started.result()
        assert (int(answer.exit_layer[0]), answer.exit_reason[0]) == (4, "last") and others.result()
    sched, _, clock = _scheduler(policy="delay")
    waiting = sched.submit(_inputs(1, 4), deadline=U)
    clock.t += 10 * U  # past its deadline before it started
    assert sched.close() and waiting.result().exit_reason[0] == "last"


def test_a_light_loads_wave_runs_whole_unless_a_deadline_could_end_a_row_in_it():
    for deadline, whole in [(15 * U, True), (15 * U - EPS, False), (None, True)]:
        sched, backend, _ = _scheduler()
        future = sched.submit(_inputs(2, 9), deadline=deadline)
        assert sched.step()
        assert future.done() is whole and (backend.log == [(i, 2) for i in range(5)]) is whole
        assert sched.close()


def test_the_cost_table_buckets_smooths_and_falls_back_to_the_nearest_measured_size():
    assert deadlines.buckets(32) == [1, 2, 4, 8, 16, 32] and deadlines.buckets(24) == [1, 2, 4, 8, 16, 24]
    assert deadlines.buckets(1) == [1]
    table = CostTable(2, 8, weight=0.25)
    assert table.cost(1, 3) == 0.0  # nothing measured: only a deadline already passed decides
    table.observe(1, 3, 0.4)  # batch 3 counts in bucket 4
    assert table.cost(1, 4) == 0.4 and table.cost(1, 1) == 0.4 and table.cost(1, 8) == 0.4  # above, else below
    table.observe(1, 4, 0.8)
    assert table.cost(1, 3) == pytest.approx(0.5)
    for bad in (float("nan"), float("inf"), -1.0):
        table.observe(1, 4, bad)
    assert table.cost(1, 4) == pytest.approx(0.5)
    table.observe(1, 1, 0.1)
    assert table.cost(1, 2) == pytest.approx(0.5) and table.path(0, 2, 2) == pytest.approx(0.5)
    assert deadlines.late(0.1, 0.2) and not deadlines.late(0.2, 0.2) and deadlines.late(-1e-9, 0.0)


def test_costs_are_measured_at_start_and_kept_current_from_the_schedulers_own_calls():
    clock = Clock()
    truth = FixedCosts(COSTS, batch_factor=2.0)
    table = deadlines.measure(TimedBackend(clock, truth), CostTable(4, 4), _inputs(1, 1)[0], clock=clock)
    assert table.seconds == truth.seconds  # every layer at every bucket, from the backend's own calls
    live = CostTable(4, 4, weight=0.5)
    sched = Scheduler(TimedBackend(clock, truth), max_batch=4, max_queue=64, costs=live, clock=clock)
    sched.submit(_inputs(3, 2))
    assert sched.close()
    assert [live.seconds[layer][2] for layer in range(5)] == [c * U * 4 for c in COSTS]  # batch 3: bucket 4


def test_a_bad_deadline_policy_is_refused():
    with pytest.raises(ValueError, match="answer, fail, delay"):
        Scheduler(MeanBackend(), deadline_policy="drop")
