"""The simulator of benchmarks/serve_ideal.py: one worker's thread serving Poisson arrivals, on a clock of its own.

The schedules are the server's own code (:class:`acl_runtime.scheduler.Scheduler`, its ``clock`` a :class:`Clock`
here) over :class:`SimBackend`, a backend whose calls cost what :class:`CostModel` says (the clock moves by that
much) and whose exits fire where each sentence's drawn exit says (a confidence policy on logits made for it), so
that every schedule runs the same exits:

- ``fifo-wave``: up to ``--max-batch`` rows as they came, through every layer as one shrinking batch
  (``refill=False``: acl-serve ``--no-refill``);
- ``server``: the refill scheduler's rules as acl-serve runs them (``Scheduler._pick``, with ``--slo-ms``);
- ``edf``: refill layer by layer, the queue whose oldest row has the earliest deadline first;
- ``least-slack``: refill layer by layer, the queue whose oldest row has the least slack first (its deadline less
  the layers it may still need at the costs measured so far).

``server`` keeps the scheduler's light-load wave (nothing in flight and at most ``--max-batch`` rows: one wave
through every layer, during which new rows wait); ``edf`` and ``least-slack`` go layer by layer always
(``Scheduler(waves=False)``), so that a new row starts between a wave's layers. Every refill schedule gathers a
batch under the scheduler's padding bound, and every deadline is the request's start plus ``--slo-ms`` (the
deadlines only order: no deadline exits, the exits are the same). All are work-conserving: the thread
runs a model call whenever a row waits. Each request's work outside the model (HTTP, JSON, tokenization:
``CostModel.outside_s``) comes before its row joins the embeddings' queue, done (``FRONTS``) either ``serial``: by
the model's thread, between its calls (arrivals during a call are taken up when it ends), or ``beside``: by a thread
of its own, one request at a time, while the model runs (a front end off the model's thread). A request's latency
runs from its arrival to its row's answer; the scheduler's own Python costs nothing here (an ideal). Pure Python
and numpy, seeded (``random.Random``).
"""
import math
import random
from typing import Dict, List, NamedTuple, Sequence

import numpy as np

from acl_runtime.loop import ExitRequest
from acl_runtime.scheduler import Scheduler
from load.stats import percentile  # noqa: F401  (serve_load's: the same percentile for both)

SCHEDULES = ("fifo-wave", "server", "edf", "least-slack")
FRONTS = ("serial", "beside")
FIRE = ExitRequest("confidence", 0.9)  # SimBackend's logits: [8, 0] at a row's exit (p 0.9997), [0, 0] elsewhere


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class CostModel(NamedTuple):
    """Seconds of one layer call on ``rows`` rows padded to ``width`` tokens: ``call_s`` + p(rows) x rows x width,
    p per token interpolated geometrically in log2(rows) between ``token_1_s`` (batch 1) and ``token_32_s`` (batch
    32 and above); the embeddings are counted in the layers. ``outside_s``: a request's CPU outside the model."""

    layers: int
    call_s: float
    token_1_s: float
    token_32_s: float
    outside_s: float

    def per_token(self, rows: int) -> float:
        x = min(max(math.log2(max(rows, 1)) / 5.0, 0.0), 1.0)
        return self.token_1_s * (self.token_32_s / self.token_1_s) ** x

    def call(self, rows: int, width: int) -> float:
        return self.call_s + self.per_token(rows) * rows * width

    def alone(self, length: int, layers: int) -> float:
        """One request alone: its CPU outside the model and ``layers`` layer calls at batch 1."""
        return self.outside_s + layers * self.call(1, length)


def sorted_batches(lengths: Sequence[int], batch: int) -> List[List[int]]:
    """The lengths sorted and cut into batches of ``batch``, as the engine batches a split (loop.make_batches)."""
    order = sorted(lengths)
    return [order[k: k + batch] for k in range(0, len(order), batch)]


def calibrate(layers: int, call_s: float, batch1_s: float, batched_per_s: float, lengths: Sequence[int],
              outside_s: float) -> CostModel:
    """The cost model that reproduces the two measured references of the bare engine at full depth: ``batch1_s`` a
    sentence alone at its mean length, ``batched_per_s`` sentences a second over ``lengths`` in sorted batches of
    32."""
    mean = sum(lengths) / len(lengths)
    token_1 = (batch1_s / layers - call_s) / mean
    batches = sorted_batches(lengths, 32)
    per_layer = len(lengths) / batched_per_s / layers
    padded = sum(len(b) * max(b) for b in batches)
    token_32 = (per_layer - call_s * len(batches)) / padded
    if not (token_1 > 0 and token_32 > 0):
        raise ValueError(f"the references (batch 1 {batch1_s * 1e3:.2f} ms, {batched_per_s:.1f}/s batched) leave no "
                         f"time per token above the call's fixed {call_s * 1e6:.0f} us")
    return CostModel(layers, call_s, token_1, token_32, outside_s)


class SimBackend:
    """A backend (acl_runtime.loop.Backend) whose calls move ``clock`` by ``cost``'s price of the call, and whose
    rows exit where their first id says (id 2 + exit layer; the others are 3): the state carries it."""

    pad = 1
    num_classes = 2

    def __init__(self, clock: Clock, cost: CostModel):
        self.clock, self.cost = clock, cost
        self.exit_layers = list(range(1, cost.layers + 1))

    def embed(self, ids, mask):
        ids = np.asarray(ids)
        state = np.zeros((ids.shape[1], ids.shape[0], 1), dtype=np.float32)
        state[:, :, 0] = (ids[:, 0] - 2)[None, :]
        return state

    def layer(self, i, x, mask):
        self.clock.t += self.cost.call(x.shape[1], x.shape[0])
        logits = np.zeros((x.shape[1], 2), dtype=np.float32)
        logits[x[0, :, 0] == i, 0] = 8.0
        return x, logits

    def take(self, x, rows, length):
        return np.ascontiguousarray(x[:length, rows])

    def join(self, states, width):
        out = np.zeros((width, sum(s.shape[1] for s in states), 1), dtype=np.float32)
        b = 0
        for s in states:
            out[: s.shape[0], b: b + s.shape[1]] = s
            b += s.shape[1]
        return out


class _EDF(Scheduler):
    def _pick(self, now: float) -> int:
        waiting = [i for i, q in enumerate(self.queues) if q]
        return min(waiting, key=lambda i: (self.queues[i][0].deadline, -i))


class _LeastSlack(Scheduler):
    def _pick(self, now: float) -> int:
        waiting = [i for i, q in enumerate(self.queues) if q]
        rows = min(self.max_batch, self._rows)
        return min(waiting, key=lambda i: (self.queues[i][0].deadline - now
                                           - self.costs.path(i, self.queues[i][0].last, rows), -i))


def scheduler(schedule: str, backend: SimBackend, clock: Clock, max_batch: int, slo_s: float) -> Scheduler:
    kinds = {"fifo-wave": (Scheduler, False), "server": (Scheduler, True), "edf": (_EDF, True),
             "least-slack": (_LeastSlack, True)}
    kind, refill = kinds[schedule]
    return kind(backend, max_batch=max_batch, max_queue=1 << 30, refill=refill, slo=slo_s, deadline_policy="delay",
                clock=clock, waves=schedule in ("fifo-wave", "server"))


def poisson_arrivals(rate: float, n: int, rng: random.Random) -> List[float]:
    """``n`` arrival times of a Poisson process of ``rate`` a second from 0."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def simulate(schedule: str, cost: CostModel, lengths: Sequence[int], exits: Sequence[int], arrivals: Sequence[float],
             max_batch: int = 32, slo_s: float = 0.02, front: str = "serial") -> List[float]:
    """Each request's latency (seconds, in arrival order): request k is a sentence of ``lengths[k]`` tokens that
    leaves at layer ``exits[k]``, arriving at ``arrivals[k]`` (increasing); ``front``: one of :data:`FRONTS`."""
    if front not in FRONTS:
        raise ValueError(f"front {front!r} is not one of {FRONTS}")
    clock = Clock()
    sched = scheduler(schedule, SimBackend(clock, cost), clock, max_batch, slo_s)
    ready, done = [], 0.0  # beside: when each request's own front-end work ends, its thread one at a time
    for arrived in arrivals:
        done = max(done, arrived) + cost.outside_s
        ready.append(done)
    futures, k, n = [], 0, len(arrivals)
    while k < n or sched.depth():
        due = arrivals if front == "serial" else ready
        if not sched.depth() and due[k] > clock.t:
            clock.t = due[k]  # idle until the next request is there
        while k < n and due[k] <= clock.t:
            if front == "serial":  # the model's thread does it, now
                clock.t += cost.outside_s
                futures.append(sched.submit(_row(lengths[k], exits[k]), FIRE))
            else:  # it joined the queue when its front end finished, during the call just ended
                now, clock.t = clock.t, ready[k]
                futures.append(sched.submit(_row(lengths[k], exits[k]), FIRE))
                clock.t = now
            k += 1
        if sched.depth():
            sched.step()
    out = []
    for arrived, future, layer in zip(arrivals, futures, exits):
        answer = future.result(0)
        assert int(answer.exit_layer[0]) == layer  # the same exits in every schedule
        out.append(answer.done_at - arrived)
    return out


def _row(length: int, exit_layer: int) -> List[List[int]]:
    return [[2 + exit_layer] + [3] * (length - 1)]


def draw_exits(fractions: Sequence[float], n: int, rng: random.Random) -> List[int]:
    """``n`` exit layers whose share reaching layer l is ``fractions[l - 1]`` (1 = all; decreasing), shuffled."""
    reach = list(fractions) + [0.0]
    counts = [round(n * (reach[i] - reach[i + 1])) for i in range(len(fractions))]
    counts[-1] += n - sum(counts)
    layers = [layer for layer, c in enumerate(counts, start=1) for _ in range(c)]
    rng.shuffle(layers)
    return layers


def lengths_from(histogram: Dict[str, int]) -> List[int]:
    """The token lengths a dev_lengths.json histogram holds, one per sentence."""
    return [int(length) for length, count in sorted(histogram.items(), key=lambda kv: int(kv[0]))
            for _ in range(count)]

