"""Less padding (acl_runtime.padding): the fitted cost of a layer call, the split of a wave by length that costs
least (against every contiguous split, brute force), and the scheduler's light-load wave split only where the
running cost says it pays, every answer unchanged. A fake clock that each call advances by its modelled cost
drives the scheduler: no sleeps, no timing."""
import itertools
import math
import random

import numpy as np
import pytest

from acl_runtime.padding import CallCost, split_by_length
from acl_runtime.scheduler import Scheduler
from test_loop import MeanBackend, _alone


def _brute(lengths, max_batch, fixed, per_position):
    """The least cost over every split of the sorted rows into contiguous groups of at most max_batch."""
    ordered = sorted(lengths)
    best = math.inf
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        groups, start = [], 0
        for k, cut in enumerate(cuts, 1):
            if cut:
                groups.append(ordered[start:k])
                start = k
        groups.append(ordered[start:])
        if max(len(g) for g in groups) <= max_batch:
            best = min(best, sum(fixed + per_position * len(g) * max(g) for g in groups))
    return best


def _cost(lengths, groups, fixed, per_position):
    return sum(fixed + per_position * len(g) * max(lengths[i] for i in g) for g in groups)


@pytest.mark.parametrize("seed", range(40))
def test_the_split_costs_the_least_of_every_contiguous_split(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 9))]
    max_batch, fixed, per_position = rng.randint(1, 6), rng.choice([0.0, 1.0, 20.0, 300.0]), rng.choice([0.5, 1.0])
    groups = split_by_length(lengths, max_batch, fixed, per_position)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))  # every row once
    assert all(1 <= len(g) <= max_batch for g in groups)
    assert all(lengths[a] <= lengths[b] for g in groups for a, b in zip(g, g[1:]))
    assert [max(lengths[i] for i in g) for g in groups] == sorted(max(lengths[i] for i in g) for g in groups)
    assert _cost(lengths, groups, fixed, per_position) == pytest.approx(_brute(lengths, max_batch, fixed,
                                                                                per_position))


def test_a_call_dearer_than_the_padding_keeps_one_wave_and_free_calls_split_every_length():
    lengths = [3, 3, 5, 40, 41]
    assert split_by_length(lengths, 8, fixed=1e9, per_position=1.0) == [[0, 1, 2, 3, 4]]
    assert split_by_length(lengths, 8, fixed=0.0, per_position=1.0) == [[0, 1], [2], [3], [4]]
    # the split pays: 5 x 41 = 205 positions as one wave, 3 x 5 + 2 x 41 = 97 as two, for one call more
    assert split_by_length(lengths, 8, fixed=100.0, per_position=1.0) == [[0, 1, 2], [3, 4]]
    assert split_by_length(lengths, 8, fixed=110.0, per_position=1.0) == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="max_batch 0"):
        split_by_length(lengths, 0, 1.0, 1.0)


def test_the_cost_of_a_call_is_fitted_from_calls_of_different_sizes_and_nonsense_is_not_counted():
    rng = np.random.default_rng(0)
    cost = CallCost(min_calls=32)
    for _ in range(31):
        cost.observe(int(rng.integers(10, 1000)), 2e-4 + 5e-8 * 500)
    assert cost.line() is None  # too few calls
    cost = CallCost()
    for _ in range(100):
        cost.observe(64, 2e-4 + 5e-8 * 64)
    assert cost.line() is None  # one size only: no slope
    for _ in range(400):
        positions = int(rng.integers(10, 1000))
        cost.observe(positions, 2e-4 + 5e-8 * positions + rng.normal(0, 1e-6))
    for bad in (math.nan, math.inf, -1.0):
        cost.observe(500, bad)
    cost.observe(0, 1.0)
    fixed, per_position = cost.line()
    assert fixed == pytest.approx(2e-4, rel=0.05) and per_position == pytest.approx(5e-8, rel=0.05)
    falling = CallCost(min_calls=4)
    for positions in (10, 100, 1000, 10, 100, 1000):
        falling.observe(positions, 1.0 / positions)  # a slope that is not positive says nothing
    assert falling.line() is None
    with pytest.raises(ValueError, match="decay"):
        CallCost(decay=0.0)


def test_the_start_measurement_seeds_the_line_and_a_steady_load_of_like_calls_keeps_the_last_one():
    from acl_runtime.deadlines import CostTable

    table = CostTable(layers=3, max_batch=32)  # as deadlines.measure fills it: every layer at every bucket
    for layer in range(4):
        for b, rows in enumerate(table.buckets):
            table.seconds[layer][b] = 1e-4 + 2e-7 * rows * 26 + (0.5 if layer == 0 else 0.0)
    cost = CallCost()
    cost.seed(table, width=26)
    assert cost.calls == 3 * len(table.buckets)  # the layers only: the embeddings cost otherwise
    fixed, per_position = cost.line()
    assert fixed == pytest.approx(1e-4) and per_position == pytest.approx(2e-7)
    for _ in range(3000):  # full waves of one size, for long: too alike to fit a line, the last one stays
        cost.observe(32 * 55, 1e-4 + 2e-7 * 32 * 55)
    assert cost.line() == (pytest.approx(1e-4), pytest.approx(2e-7))


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _PricedBackend(MeanBackend):
    """MeanBackend whose every layer call advances the fake clock by fixed + per_position x positions."""

    def __init__(self, clock, fixed, per_position, **kw):
        super().__init__(**kw)
        self.clock, self.fixed, self.per_position = clock, fixed, per_position

    def layer(self, i, x, mask):
        self.clock.now += self.fixed + self.per_position * mask.size
        return super().layer(i, x, mask)


def _warm(sched, backend, rng):
    """Waves of random sizes until the scheduler's fitted cost of a call is known."""
    while sched.call_cost.line() is None:
        texts = [[int(t) for t in rng.integers(2, 32, size=rng.integers(2, 40))] for _ in range(rng.integers(1, 8))]
        sched.submit(texts)
        while sched.step():
            pass
    backend.calls.clear()


@pytest.mark.parametrize("split", [True, False])
def test_a_light_load_wave_of_unlike_lengths_splits_where_the_fitted_cost_says_it_pays(split):
    clock = _Clock()
    backend = _PricedBackend(clock, fixed=1e-4, per_position=1e-6, exit_layers=(4,))
    sched = Scheduler(backend, max_batch=8, max_queue=64, clock=clock, split_waves=split)
    rng = np.random.default_rng(1)
    _warm(sched, backend, rng)
    fixed, per_position = sched.call_cost.line()
    assert fixed == pytest.approx(1e-4, rel=1e-6) and per_position == pytest.approx(1e-6, rel=1e-6)
    short, long = [[5, 6, 7]] * 3, [[int(t) for t in rng.integers(2, 32, size=200)]]
    futures = [sched.submit([t]) for t in short + long]
    start = clock.now
    assert sched.step() and not sched.step()  # still one step: the light load's wave, split inside it
    took = clock.now - start
    calls = [(rows, width) for _, rows, width in backend.calls]
    if split:  # 4 x 200 positions a layer as one wave; 3 x 3 + 200 as two, for one call more
        assert calls == [(3, 3)] * 4 + [(1, 200)] * 4
        assert took == pytest.approx(4 * (2 * 1e-4 + 1e-6 * 209))
    else:
        assert calls == [(4, 200)] * 4 and took == pytest.approx(4 * (1e-4 + 1e-6 * 800))
    for text, future in zip(short + long, futures):
        ans = future.result(timeout=5)
        np.testing.assert_allclose(ans.logits[0], _alone(backend, text)[-1], atol=1e-5)


def test_without_refill_or_before_the_cost_is_known_a_wave_is_one_call():
    clock = _Clock()
    backend = _PricedBackend(clock, fixed=1e-4, per_position=1e-6, exit_layers=(2,))
    fresh = Scheduler(backend, max_batch=8, max_queue=64, clock=clock)
    fresh.submit([[5, 6, 7], [int(t) for t in range(2, 30)]])
    while fresh.step():
        pass
    assert [(rows, width) for _, rows, width in backend.calls] == [(2, 28)] * 2  # nothing fitted yet
    baseline = Scheduler(backend, max_batch=8, max_queue=64, clock=clock, refill=False)
    _warm(baseline, backend, np.random.default_rng(2))
    baseline.submit([[5, 6, 7], [int(t) for t in range(2, 30)]])
    while baseline.step():
        pass
    assert [(rows, width) for _, rows, width in backend.calls] == [(2, 28)] * 2  # --no-refill: acl-predict's waves

