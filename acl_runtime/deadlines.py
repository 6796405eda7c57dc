"""What a request's deadline does inside the scheduler (:mod:`acl_runtime.scheduler`): numpy only.

A row's deadline is its request's arrival plus the request's own deadline (:func:`acl_runtime.request.deadline_seconds`:
Triton's ``timeout``, ``/predict``'s ``deadline_ms``, the ``X-Deadline-Ms`` header), else the server's ``--slo-ms``;
with neither there is none. ``--deadline-policy`` (:data:`POLICIES`) says what it does:

- ``answer`` (the default): at every layer boundary, a row that has reached an exit and whose next layers up to its
  next exit would end past its deadline, at the cost those layers take for the batch it would run in
  (:class:`CostTable`), **answers from the exit it has reached** (exit reason ``deadline``): :func:`late` is the
  rule. The policy's own decision comes first (a deadline only makes a row exit sooner, never later). A row that
  has reached no exit yet (waiting for the embeddings, or for a layer before the first exit) when its deadline
  passes fails its request with :class:`DeadlineExpired` (Triton's "Request timeout expired"), never silently;
- ``fail``: Triton's behaviour (``timeout_action: REJECT``): a request with a row still waiting in a queue once its
  deadline has passed fails with :class:`DeadlineExpired`; rows in a backend call already running finish it;
- ``delay``: the deadline only orders the queues (Triton's ``timeout_action: DELAY``, and acl-serve before deadline
  exits): a late row runs every layer its policy asks for and is answered late.

The boundaries: right after a backend call, for the rows going on (the batch they would run in: the rows that
would then wait for the next layer, at most ``--max-batch``), before every step for every row still waiting
(:meth:`Steps._sweep`: a row waiting behind other layers' calls is answered when its deadline catches it, not
when its queue's turn comes), and again when their queue runs (the batch gathered).
"""
import bisect
import math
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import numpy as np

from acl_runtime.scheduler_rows import take_out

if TYPE_CHECKING:
    from acl_runtime.scheduler_rows import _Row

POLICIES = {
    "answer": "a row whose next layer would make it late answers from the exit it has reached (exit_reason "
              "deadline); a request with a row that reached no exit when its deadline passes fails (Triton's "
              "'Request timeout expired')",
    "fail": "Triton's: a request with a row still waiting when its deadline has passed fails with 'Request "
            "timeout expired'",
    "delay": "the deadline only orders the queues: a late row runs every layer its policy asks for (Triton's "
             "timeout_action DELAY)",
}
# why a row left where it did, as each answer and /metrics say it
POLICY, LAST, DEADLINE = "policy", "last", "deadline"  # its exit policy fired; its last exit (the model's, or the
REASONS = (POLICY, LAST, DEADLINE)  # request's exit_layer); its deadline (answer)
EXPIRED = "Request timeout expired"  # Triton's words (core's dynamic_batch_scheduler.cc), first in every such error
PROBE_TEXT = " ".join(["the movie was good"] * 6)  # a start-up measurement's text: about SST-2's mean length


class DeadlineExpired(Exception):
    """A request's deadline passed while one of its rows waited and could not answer from an exit (``answer``),
    or while any of its rows waited (``fail``): the request fails, as Triton fails it, and its other rows leave
    their queues."""


def late(remaining: float, cost: float) -> bool:
    """A row with ``remaining`` seconds to its deadline that needs ``cost`` seconds of backend calls to its next
    exit would answer late: the cost exceeds the time left, or the deadline has passed already."""
    return cost > remaining or remaining < 0


def buckets(max_batch: int) -> List[int]:
    """The batch sizes a :class:`CostTable` keeps: powers of two below ``max_batch``, and ``max_batch``."""
    out = [1]
    while out[-1] * 2 < max_batch:
        out.append(out[-1] * 2)
    return out + ([max_batch] if max_batch > 1 else [])


class CostTable:
    """Seconds of one backend call per layer (0: the embeddings) and batch size bucket (:func:`buckets`: a call of
    ``rows`` rows counts in the smallest bucket at least that large): the last measured value, smoothed
    (``weight`` for each new one). :func:`measure` fills it at start; the scheduler's every call keeps it current.
    A bucket never measured costs what the nearest measured bucket above it costs, else the largest below, else 0
    (nothing measured at that layer: only a deadline already passed decides)."""

    def __init__(self, layers: int, max_batch: int, weight: float = 0.1):
        self.buckets = buckets(max_batch)
        self.weight = weight
        self.seconds: List[List[Optional[float]]] = [[None] * len(self.buckets) for _ in range(layers + 1)]

    def bucket(self, rows: int) -> int:
        return min(bisect.bisect_left(self.buckets, rows), len(self.buckets) - 1)

    def observe(self, layer: int, rows: int, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):  # a clock's nonsense never decides a deadline exit
            return
        cells, b = self.seconds[layer], self.bucket(rows)
        old = cells[b]
        cells[b] = seconds if old is None else (1 - self.weight) * old + self.weight * seconds

    def cost(self, layer: int, rows: int) -> float:
        cells, b = self.seconds[layer], self.bucket(rows)
        if cells[b] is not None:
            return cells[b]
        above = [c for c in cells[b + 1:] if c is not None]
        below = [c for c in cells[:b] if c is not None]
        return above[0] if above else below[-1] if below else 0.0

    def path(self, first: int, last: int, rows: int) -> float:
        """Seconds of layers ``first`` to ``last`` (0: the embeddings) for a batch of ``rows``."""
        return sum(self.cost(layer, rows) for layer in range(first, last + 1))


def measure(backend, table: CostTable, ids: Sequence[int], repeats: int = 2,
            clock: Callable[[], float] = time.perf_counter) -> CostTable:
    """``table`` filled from ``backend``'s own calls: the embeddings and every layer at each of its bucket sizes, on
    rows of ``ids`` (no padding), ``repeats`` times (the first call of a shape allocates), the last kept."""
    layers = len(table.seconds) - 1
    ids = np.asarray(ids, dtype=np.int64)
    for b, rows in enumerate(table.buckets):
        src = np.tile(ids, (rows, 1))
        mask = np.zeros(src.shape, dtype=bool)
        for _ in range(repeats):
            started = clock()
            state = backend.embed(src, mask)
            took = [clock() - started]
            for i in range(1, layers + 1):
                started = clock()
                state, _ = backend.layer(i, state, mask)
                took.append(clock() - started)
        for layer, seconds in enumerate(took):
            table.seconds[layer][b] = seconds
    return table


class Steps:
    """The scheduler's deadline steps (:class:`acl_runtime.scheduler.Scheduler` is one): on its ``queues``,
    ``costs``, ``_next_exit``, ``max_batch``, ``deadline_policy``, ``_deadlines`` (a request with a deadline has
    come), and its ``_cond`` and ``_rows``."""

    def _due(self, layer: int, rows: List["_Row"], now: float):
        """``(the rows that run layer, the count of the others done)``: at the embeddings, a request whose
        deadline has passed fails (``answer``, ``fail``); at a deeper layer, a row that would be late answers from
        the exit it has reached (``answer``; the batch it would run in: ``rows``)."""
        if self.deadline_policy == "delay":
            return rows, 0
        if layer == 0:
            expired = [r for r in rows if r.deadline < now]
            if not expired:
                return rows, 0
            gone = self._expire(expired, now)
            kept = [r for r in rows if id(r.job) not in gone]
            return kept, len(rows) - len(kept)
        if self.deadline_policy == "answer":
            kept = self._deadline_exits(layer, rows, len(rows), now)
            return kept, len(rows) - len(kept)
        return rows, 0

    def _sweep(self, now: float) -> int:
        """Before each step (under the lock), the rows their deadline has caught while they wait in a queue: at the
        embeddings, past it (their requests fail, as :meth:`_due` fails them when their queue runs); at a deeper
        layer (``answer``), a row that reached an exit and would be late at its next, at the cost of the batch its
        queue would run, answers from that exit now: waiting for its queue's turn, it was late by then. Every row of
        every queue is looked at (a queue is in no deadline order), once a request with a deadline came
        (``_deadlines``). The count of rows done."""
        if self.deadline_policy == "delay" or not self._deadlines:
            return 0
        before = self._rows
        expired = [r for r in self.queues[0] if r.deadline < now]
        if expired:
            self._expire(expired, now)  # their rows leave every queue, and the count
        done = before - self._rows
        if self.deadline_policy != "answer":
            return done
        for layer in range(1, len(self.queues)):
            queue = self.queues[layer]
            if not queue:
                continue
            cost = self.costs.path(layer, self._next_exit[layer], min(len(queue), self.max_batch))
            caught = take_out(queue, lambda r, cost=cost: r.reached is not None and late(r.deadline - now, cost))
            for r in caught:
                r.job.answer(r, r.reached[0], r.reached[1], DEADLINE)
            self._rows -= len(caught)
            done += len(caught)
        return done

    def _deadline_exits(self, layer: int, rows: List["_Row"], batch: int, now: float) -> List["_Row"]:
        """Of ``rows`` about to wait for (or run) ``layer``, those that go on; a row that has reached an exit and
        would be late at its next one, at the cost of the layers up to it for a batch of ``batch`` rows (at most
        ``max_batch``), answers from the exit it has reached (``deadlines.late``)."""
        cost = self.costs.path(layer, self._next_exit[layer], min(batch, self.max_batch))
        going = []
        for r in rows:
            if r.reached is not None and late(r.deadline - now, cost):
                r.job.answer(r, r.reached[0], r.reached[1], DEADLINE)
            else:
                going.append(r)
        return going

    def _expire(self, rows: List["_Row"], now: float) -> set:
        """Fail the requests of ``rows``, waiting for the embeddings past their deadline, with
        :class:`DeadlineExpired` (Triton's words); their rows still queued leave. The ids of their jobs."""
        jobs = {}
        for r in rows:
            jobs.setdefault(id(r.job), r)
        with self._cond:
            removed = 0
            for queue in self.queues:
                removed += len(take_out(queue, lambda r: id(r.job) in jobs))
            self._rows -= removed
        for r in jobs.values():
            if not r.job.future.done():
                late_ms = 1e3 * (now - r.deadline)
                r.job.future.set_exception(DeadlineExpired(
                    f"{EXPIRED}: the request's deadline ({1e3 * (r.job.budget or 0):g} ms) passed "
                    f"{late_ms:.3g} ms ago while its input {r.index} still waited for the embeddings, before any "
                    "layer ran"))
        return set(jobs)

    def _wave_may_end_early(self, now: float) -> bool:
        """Whether a deadline could end a row of the light load's wave (every row waiting for the embeddings) before
        its own exits: a row that would be late through all its layers at the wave's measured cost."""
        n, paths = len(self.queues[0]), {}
        for r in self.queues[0]:
            if r.deadline == math.inf:
                continue
            if r.last not in paths:
                paths[r.last] = self.costs.path(0, r.last, min(n, self.max_batch))
            if late(r.deadline - now, paths[r.last]):
                return True
        return False
