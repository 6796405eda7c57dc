"""A scheduler that refills: continuous batching across the layers of an early-exit model (numpy only).

Batched early exit on its own (:func:`acl_runtime.loop.run_batch`) lets exited rows leave a batch that then
only shrinks: a batch costs about what its slowest row's path costs. Here every row waits in the queue of the
layer it needs next, with its own hidden states and its policy state (patience's counter travels with its row):

- new rows queue for the embeddings (queue 0), then for layer 1, 2, ...;
- each step runs one layer on a batch gathered from that layer's queue, whatever batches the rows came from
  (``backend.join`` pads their states to one width; padding is masked, so a row's answer does not depend on its
  neighbours beyond float reduction order);
- rows that exit are answered at once; the others queue for the next layer.

So layer 1 keeps taking new requests while deeper layers finish older ones.

Which layer runs (:meth:`Scheduler._pick`), in order:

1. a deadline: the queue whose oldest row has the least slack, once that slack is gone (its deadline, less the
   layers it may still need at the measured cost of a call, is now). A row's deadline is its submit time plus its
   request's own ``deadline`` or the scheduler's ``slo`` (acl-serve: the request's deadline field, else
   ``--slo-ms``); with neither there is none. What a deadline does beyond ordering (``deadline_policy``: a row
   answers from the exit it has reached rather than be late, a request that has not started by it fails) is
   :mod:`acl_runtime.deadlines`;
2. a queue whose oldest row has been passed over ``max_wait`` steps (no row waits for ever);
3. a light load (at most ``max_batch`` rows in all): the deepest queue, so that the rows in flight run through to
   their exits as one wave and a request costs about what it costs alone; when all of them wait for the
   embeddings (nothing in flight), they all run through every layer in one go, exactly as without refill
   (``run_batch``: no step between layers to pay for), split by length only where the running server's own cost
   of a call says the split pays (``split_waves``, :mod:`acl_runtime.padding`: ``max_padding`` split a burst of
   unlike lengths into two waves even where the second then waited longer than the whole wave would take);
4. else the deepest queue holding a full batch (finishing work in flight bounds the memory held in queues);
5. else the queue holding the most rows, the deeper on a tie.

The rules tried before these, with their figures: docs/serve.md ("The scheduler's rules").

A batch starts with its queue's oldest row and takes the rows closest to it in length while the padding stays
within ``max_padding`` of the real tokens. With ``refill=False`` the scheduler is today's batched early exit: up to
``max_batch`` queued rows, as they came, through :func:`~acl_runtime.loop.run_batch` (the baseline of
benchmarks/serve_load.py).

One thread makes every backend call (one ONNX Runtime session set per worker); :meth:`Scheduler.submit` is safe
from any thread and returns a :class:`concurrent.futures.Future`.

A backend call that raises fails only the rows at fault (:meth:`Scheduler._isolate`): the batch is split in halves
and each half run again, down to single rows, so that a row that raises alone fails its request and every other row
is answered as if the bad one had never come (``on_fault(layer, rows_failed)`` counts each such isolation).
"""
import collections
import itertools
import math
import threading
import time
from concurrent.futures import Future
from typing import Callable, Deque, Dict, List, Optional, Sequence

import numpy as np

from acl_runtime import deadlines, exits, loop, padding
from acl_runtime.deadlines import LAST, POLICY, DeadlineExpired  # noqa: F401  (DeadlineExpired: the API)
from acl_runtime.scheduler_rows import Answer, Closed, QueueFull, _Job, _Row, _Timed, take_out  # noqa: F401


class Scheduler(deadlines.Steps):
    """Continuous batching across layers over a :class:`acl_runtime.loop.Backend` with ``join``.

    ``max_batch`` caps the rows of one backend call, ``max_queue`` the rows accepted and not yet answered (more is
    :class:`QueueFull`), ``max_padding`` the padded positions of a batch beyond its real tokens (0.5: at most 1.5x),
    ``max_wait`` the steps a queue's oldest row may be passed over (default: twice the layers), ``slo`` the seconds
    from a request's submit to its answer that :meth:`_pick` aims at (None: no objective; a request's own
    ``deadline`` overrides it). ``on_batch(layer, rows, seconds, cpu_seconds)`` is called after every backend call
    (layer 0: the embeddings; the call's wall and thread CPU seconds), ``on_fault(layer, rows_failed)`` after
    each failed call's rows at fault were found, ``on_depth(rows)`` whenever rows left (answered, failed or
    cancelled), from the scheduler's thread (or :meth:`cancel`'s caller), ``on_tokens(layer, tokens, padded)``
    after every backend call: its positions (rows x width) and how many are padding. ``pad``: the padding id
    (default: the backend's). ``deadline_policy``: what a deadline does beyond ordering
    (:data:`acl_runtime.deadlines.POLICIES`), at the costs of ``costs`` (a :class:`~acl_runtime.deadlines.CostTable`,
    kept current from every call); ``clock``: the seconds every time here is read from (tests drive it). ``waves``:
    rule 3's run of a light load with nothing in flight as one wave through every layer (False: layer by layer
    always, so that new rows can start between a wave's layers; benchmarks/serve_ideal.py's pure schedules).
    ``split_waves``: such a wave split by length where it pays (:mod:`acl_runtime.padding`)."""

    def __init__(self, backend, regression: bool = False, max_batch: int = 32, max_queue: int = 1024,
                 refill: bool = True, max_padding: float = 0.5, max_wait: Optional[int] = None,
                 delta: float = exits.DEFAULT_REGRESSION_DELTA, slo: Optional[float] = None,
                 on_batch: Optional[Callable[[int, int, float, float], None]] = None, pad: Optional[int] = None,
                 on_fault: Optional[Callable[[int, int], None]] = None,
                 on_depth: Optional[Callable[[int], None]] = None, deadline_policy: str = "answer",
                 on_tokens: Optional[Callable[[int, int, int], None]] = None,
                 costs: Optional[deadlines.CostTable] = None, clock: Callable[[], float] = time.perf_counter,
                 waves: bool = True, split_waves: bool = True):
        if max_batch < 1 or max_queue < max_batch:
            raise ValueError(f"max_batch {max_batch} must be at least 1 and max_queue {max_queue} at least max_batch")
        self.backend, self.regression, self.delta = backend, regression, delta
        self.pad = backend.pad if pad is None else pad
        self.max_batch, self.max_queue, self.refill, self.max_padding = max_batch, max_queue, refill, max_padding
        self.layers = list(backend.exit_layers)
        self.max_wait = 2 * self.layers[-1] if max_wait is None else max_wait
        self.on_batch, self.on_fault, self.on_depth, self.on_tokens = on_batch, on_fault, on_depth, on_tokens
        if slo is not None and not slo > 0:
            raise ValueError(f"slo {slo} must be a positive number of seconds")
        if deadline_policy not in deadlines.POLICIES:
            raise ValueError(f"deadline policy {deadline_policy!r} is not one of {', '.join(deadlines.POLICIES)}")
        self.slo, self.deadline_policy, self.clock, self.waves = slo, deadline_policy, clock, waves
        self.split_waves, self.call_cost, self._deadlines = split_waves, padding.CallCost(), False
        self.costs = deadlines.CostTable(self.layers[-1], max_batch) if costs is None else costs
        # the exit a row waiting for layer j reaches next
        self._next_exit = {j: min(e for e in self.layers if e >= j) for j in range(1, self.layers[-1] + 1)}
        self._call = 0.0  # seconds a backend call takes, smoothed: what a row's remaining layers will cost
        self.queues: List[Deque[_Row]] = [collections.deque() for _ in range(self.layers[-1] + 1)]
        self.steps, self._rows, self._seq = 0, 0, itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: Optional[threading.Thread] = None
        self._rate = 0.0  # rows answered per second, smoothed: Retry-After's estimate

    # ---- the outside -----------------------------------------------------------------------------

    def submit(self, token_lists: Sequence[Sequence[int]], request: loop.ExitRequest = loop.LAST_EXIT,
               deadline: Optional[float] = None) -> Future:
        """Queue the rows (id lists, as ``encode_with_info`` makes them) under a resolved ``request``; the future's
        result is an :class:`Answer`, rows in input order. ``deadline``: seconds from now by which the rows should
        be answered (default: ``slo``); what it does is ``deadline_policy``'s (:mod:`acl_runtime.deadlines`)."""
        if len(token_lists) == 0:
            raise ValueError("no inputs: send at least one")
        if request.exit_layer is not None and request.exit_layer not in self.layers:
            raise ValueError(f"exit layer {request.exit_layer} is not one of the model's exits {self.layers}")
        rows_ids = [np.asarray(t, dtype=np.int64) for t in token_lists]
        for k, ids in enumerate(rows_ids):
            if ids.size == 0 or (ids == self.pad).any():
                raise ValueError(f"input {k} is empty or holds the padding id {self.pad}: encode text with "
                                 "encode_with_info(), which never makes one")
        last = request.exit_layer or self.layers[-1]
        budget = self.slo if deadline is None else deadline
        job = _Job(len(rows_ids), self.backend.num_classes, len(self.queues), budget, self.clock)
        now = self.clock()
        due = now + budget if budget is not None else math.inf
        self._deadlines = self._deadlines or due < math.inf  # from now on, every step sweeps the queues
        with self._cond:
            if self._closing:
                raise Closed("the scheduler is closing: it takes no new requests")
            if self._rows + len(rows_ids) > self.max_queue:
                wait = max(1, math.ceil(self._rows / self._rate)) if self._rate > 0 else 1
                raise QueueFull(f"the queue holds {self._rows} rows of at most {self.max_queue}: retry later", wait)
            for k, ids in enumerate(rows_ids):
                row = _Row(job, k, ids, request, last, next(self._seq), now, due)
                row.since = self.steps
                self.queues[0].append(row)
            self._rows += len(rows_ids)
            self._cond.notify()
        return job.future

    def depth(self) -> int:
        """Rows accepted and not yet answered."""
        return self._rows

    def cancel(self, future: Future) -> int:
        """Give up a :meth:`submit` (its client went away, or the drain ran out of time): the future is cancelled
        and its rows still queued leave their queues at once; a row inside the backend call now running is dropped
        when the call returns. The count of rows freed now."""
        future.cancel()
        with self._cond:
            freed = 0
            for queue in self.queues:
                freed += len(take_out(queue, lambda r: r.job.future is future))
            self._rows -= freed
            self._cond.notify_all()
        if freed and self.on_depth is not None:
            self.on_depth(self._rows)
        return freed

    def start(self) -> "Scheduler":
        self._thread = threading.Thread(target=self._run, name="acl-scheduler", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: Optional[float] = None) -> bool:
        """Take nothing new, answer every accepted row, stop the thread. True when all were answered in time."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive() and self._rows == 0
        while self.step():
            pass
        return self._rows == 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._rows == 0 and not self._closing:
                    self._cond.wait()
                if self._rows == 0:
                    return
            self.step()

    # ---- one step --------------------------------------------------------------------------------

    def step(self) -> bool:
        """Run one backend call (or one ``run_batch`` without refill) on waiting rows; False when none wait."""
        with self._cond:
            if self._rows == 0:
                return False
            now = self.clock()
            swept = self._sweep(now)
            whole = not self.refill or self.waves and self._rows <= self.max_batch and len(self.queues[0]) == self._rows
            if whole and self.refill and self.deadline_policy == "answer" and self._wave_may_end_early(now):
                whole = False  # layer by layer, so that a deadline can end a row at a boundary
            if self._rows == 0:  # the sweep answered or failed every waiting row
                layer, rows, whole = 0, [], False
            elif not self.refill:
                layer, rows = 0, [self.queues[0].popleft() for _ in range(min(self.max_batch, len(self.queues[0])))]
            elif whole:  # a light load with nothing in flight: every row in one wave through every layer
                layer, rows = 0, list(self.queues[0])
                self.queues[0].clear()
            else:
                layer = self._pick(now)
                rows = self._gather(self.queues[layer])
            self.steps += 1
        start = self.clock()
        for r in rows:
            r.job.waits[r.index, layer] += start - r.queued_at
        rows, done = self._due(layer, rows, start)
        if rows:
            done += self._shrinking(rows) if whole else self._isolate(layer, rows, self._advance)
        with self._cond:
            self._rows -= done
            if done:
                rate = done / max(self.clock() - start, 1e-6)
                self._rate = rate if self._rate == 0 else 0.9 * self._rate + 0.1 * rate
        if (done or swept) and self.on_depth is not None:
            self.on_depth(self._rows)  # after the count fell: a request's own answer comes before it
        return True

    def _pick(self, now: float) -> int:
        waiting = [i for i, q in enumerate(self.queues) if q]
        slack = {i: self.queues[i][0].deadline - now - (self.queues[i][0].last + 1 - i) * self._call
                 for i in waiting}
        due = [i for i in waiting if slack[i] <= 0]
        if due:
            return min(due, key=slack.__getitem__)
        late = [i for i in waiting if self.steps - self.queues[i][0].since >= self.max_wait]
        if late:
            return min(late, key=lambda i: self.queues[i][0].seq)
        if self._rows <= self.max_batch:
            return waiting[-1]
        full = [i for i in waiting if len(self.queues[i]) >= self.max_batch]
        if full:
            return full[-1]
        return max(waiting, key=lambda i: (len(self.queues[i]), i))

    def _gather(self, queue: Deque[_Row]) -> List[_Row]:
        """The oldest row, then the rows nearest it in length while padding stays within ``max_padding``."""
        first = queue[0]
        rest = sorted(itertools.islice(queue, 1, None), key=lambda r: (abs(r.ids.size - first.ids.size), r.seq))
        chosen, real, width = [first], first.ids.size, first.ids.size
        for row in rest:
            if len(chosen) == self.max_batch:
                break
            w = max(width, row.ids.size)
            if w * (len(chosen) + 1) <= (1 + self.max_padding) * (real + row.ids.size):
                chosen.append(row)
                real, width = real + row.ids.size, w
        taken = {id(r) for r in chosen}
        take_out(queue, lambda r: id(r) in taken)
        return chosen

    def _advance(self, layer: int, rows: List[_Row]) -> int:
        """Run ``layer`` (0: the embeddings) on ``rows``; queue the rows that go on; the count answered."""
        lengths = np.asarray([r.ids.size for r in rows], dtype=np.int64)
        width = int(lengths.max())
        mask = loop.padding_mask(lengths, width)
        timed = _Timed(self.backend, self._called, self.clock)
        if layer == 0:
            ids = np.full((len(rows), width), self.pad, dtype=np.int64)
            for k, r in enumerate(rows):
                ids[k, : r.ids.size] = r.ids
            state, logits = timed.embed(ids, mask), None
        else:
            state, logits = timed.layer(layer, self.backend.join([r.state for r in rows], width), mask)
        for r in rows:
            r.model += timed.seconds[0]
        fire = self._decide(layer, rows, logits) if logits is not None else np.zeros(len(rows), dtype=bool)
        going = []
        for k, r in enumerate(rows):
            if fire[k]:
                r.job.answer(r, logits[k], layer, LAST if layer == r.last else POLICY)
            elif not r.job.future.done():  # a failed request's other rows stop here
                r.state = self.backend.take(state, np.asarray([k]), int(lengths[k]))
                if logits is not None:
                    r.reached = (logits[k], layer)
                going.append(r)
        if going and self.deadline_policy == "answer":  # the batch they would run in: those waiting with them
            going = self._deadline_exits(layer + 1, going, len(self.queues[layer + 1]) + len(going), self.clock())
        with self._cond:
            now = self.clock()
            for r in going:
                r.since, r.queued_at = self.steps, now
                self.queues[layer + 1].append(r)
        return len(rows) - len(going)

    def _called(self, layer: int, rows: int, seconds: float, cpu: float, tokens: int, padded: int) -> None:
        """After each backend call: the smoothed cost of a call and of that layer at that batch size, ``on_batch``
        and ``on_tokens``."""
        self._call = seconds if self._call == 0 else 0.9 * self._call + 0.1 * seconds
        self.costs.observe(layer, rows, seconds)
        if layer > 0:
            self.call_cost.observe(tokens, seconds)
        if self.on_batch is not None:
            self.on_batch(layer, rows, seconds, cpu)
        if self.on_tokens is not None:
            self.on_tokens(layer, tokens, padded)

    def _decide(self, layer: int, rows: List[_Row], logits: np.ndarray) -> np.ndarray:
        """Which rows leave at the exit of ``layer``: their last exit, or their policy's step on its own rows. The
        rows' policy states change only once every group's step has run (a failed call is run again)."""
        fire = np.asarray([layer == r.last for r in rows])
        groups: Dict[loop.ExitRequest, List[int]] = {}
        for k, r in enumerate(rows):
            if not fire[k] and r.request.policy is not None:
                groups.setdefault(r.request, []).append(k)
        states = {}
        for request, idx in groups.items():
            state = np.concatenate([rows[k].policy for k in idx])
            go, state = exits.policy_step(request.policy, logits[idx], state, request.threshold,
                                          regression=self.regression, delta=self.delta)
            for j, k in enumerate(idx):
                fire[k], states[k] = bool(go[j]), state[j: j + 1]
        for k, state in states.items():
            rows[k].policy = state
        return fire

    def _shrinking(self, rows: List[_Row]) -> int:
        """Without refill, or a light load's wave: the rows of each request through ``run_batch``, sorted by
        length, as acl-predict runs; with refill and ``split_waves``, in the groups of like lengths that cost
        least by the fitted cost of a call (:mod:`acl_runtime.padding`; one wave until that cost is known)."""
        by_request: Dict[loop.ExitRequest, List[_Row]] = {}
        for r in rows:
            by_request.setdefault(r.request, []).append(r)
        line = self.call_cost.line() if self.refill and self.split_waves else None
        for group in by_request.values():
            if line is None:
                batches = [positions for positions, _ in loop.make_batches([r.ids for r in group], self.max_batch,
                                                                            self.pad)]
            else:
                batches = padding.split_by_length([r.ids.size for r in group], self.max_batch, *line)
            for positions in batches:
                self._isolate(0, [group[p] for p in positions], self._run_whole)
        return len(rows)

    def _run_whole(self, layer: int, rows: List[_Row]) -> int:
        """``rows`` of one request through ``run_batch`` to their exits (without refill); the count answered."""
        lengths = np.asarray([r.ids.size for r in rows], dtype=np.int64)
        src = np.full((len(rows), int(lengths.max())), self.pad, dtype=np.int64)
        for k, r in enumerate(rows):
            src[k, : r.ids.size] = r.ids
        timed = _Timed(self.backend, self._called, self.clock)
        out = loop.run_batch(timed, src, loop.padding_mask(lengths, src.shape[1]), rows[0].request,
                             self.regression, self.delta)
        spent = np.cumsum(timed.seconds)  # the embeddings, then each layer: a row was in the calls up to its exit
        for k, r in enumerate(rows):
            r.model += float(spent[int(out.layers_computed[k])])
            layer = int(out.exit_layer[k])
            r.job.answer(r, out.logits[k], layer, LAST if layer == r.last else POLICY)
        return len(rows)

    def _isolate(self, layer: int, rows: List[_Row], run: Callable[[int, List[_Row]], int]) -> int:
        """``run(layer, rows)``; when it raises, each half of ``rows`` again, down to single rows: a row that
        raises alone fails its request, the others are answered (a backend error never stops the scheduler). The
        count of rows done (answered, failed, or dropped with a failed request)."""
        try:
            return run(layer, rows)
        except Exception as error:
            if len(rows) == 1:
                self._fail(rows, error)
                if self.on_fault is not None:
                    self.on_fault(layer, 1)
                return 1
        half = len(rows) // 2
        return self._isolate(layer, rows[:half], run) + self._isolate(layer, rows[half:], run)

    def _fail(self, rows: List[_Row], error: Exception) -> int:
        for r in rows:
            if not r.job.future.done():
                r.job.future.set_exception(error)
        return len(rows)
