"""A request inside the scheduler (:mod:`acl_runtime.scheduler`): its :class:`Answer`, the job that gathers its
rows' answers into it, a row (its states, policy state, deadline, the exit it has reached), and the backend whose
calls are timed; the refusals of a submit (the queue full, the scheduler closing). numpy only."""
import time
from concurrent.futures import Future
from typing import Callable, List, NamedTuple, Optional

import numpy as np

from acl_runtime import exits, loop


class QueueFull(Exception):
    """More rows than ``max_queue`` would be waiting: refused before anything was queued."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Closed(Exception):
    """The scheduler is closing: it takes nothing new."""


def take_out(queue, leaving: Callable[["_Row"], bool]) -> List["_Row"]:
    """The rows of ``queue`` (a deque) for which ``leaving`` holds, taken out of it in place; the others keep their
    order."""
    kept, out = [], []
    for r in queue:
        (out if leaving(r) else kept).append(r)
    if out:
        queue.clear()
        queue.extend(kept)
    return out


class Answer(NamedTuple):
    logits: np.ndarray  # (n, K) float32: the exit each row left at
    exit_layer: np.ndarray  # (n,) int64: 1-based layer of that exit
    waits: np.ndarray  # (n, layers + 1) float64: seconds each row waited in each queue (0: the embeddings')
    model: np.ndarray  # (n,) float64: seconds of the backend calls each row was in
    done_at: float  # the scheduler's clock (time.perf_counter()) when the last row was answered
    exit_reason: np.ndarray  # (n,) str: why each row left where it did (deadlines.REASONS)


class _Job:
    """One :meth:`Scheduler.submit`: its future and the answers of its rows so far."""

    def __init__(self, n: int, num_classes: int, queues: int, budget: Optional[float], clock: Callable[[], float]):
        self.future: Future = Future()
        self.logits = np.zeros((n, num_classes), dtype=np.float32)
        self.layers = np.zeros(n, dtype=np.int64)
        self.reasons = np.full(n, "", dtype="<U8")
        self.waits = np.zeros((n, queues), dtype=np.float64)
        self.model = np.zeros(n, dtype=np.float64)
        self.left, self.budget, self.clock = n, budget, clock  # budget: seconds from submit to its deadline

    def answer(self, row: "_Row", logits: np.ndarray, layer: int, reason: str) -> None:
        k = row.index
        self.logits[k], self.layers[k], self.model[k], self.reasons[k] = logits, layer, row.model, reason
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(Answer(self.logits, self.layers, self.waits, self.model, self.clock(),
                                          self.reasons))


class _Row:
    __slots__ = ("job", "index", "ids", "request", "last", "state", "policy", "since", "seq", "queued_at", "model",
                 "deadline", "reached")

    def __init__(self, job: _Job, index: int, ids: np.ndarray, request: loop.ExitRequest, last: int, seq: int,
                 now: float, deadline: float):
        self.job, self.index, self.ids, self.request, self.last, self.seq = job, index, ids, request, last, seq
        self.deadline = deadline  # time.perf_counter() by which it should be answered (inf: none)
        self.state = None  # T x 1 x C hidden states after the layers run so far
        self.policy = exits.init_state(1)  # (1, 2): [previous prediction, run]
        self.since = 0  # the step count when the row joined its queue
        self.queued_at = now  # time.perf_counter() when it joined its queue
        self.model = 0.0  # seconds of the backend calls it was in
        self.reached: Optional[tuple] = None  # (logits (K,), layer) of the last exit it passed: a deadline answers it


class _Timed:
    """A backend whose ``embed`` and ``layer`` calls are timed and reported, ``report(layer, rows, seconds,
    cpu_seconds, tokens, padded)`` (layer 0: the embeddings; ``tokens`` the positions of the call, rows x width,
    ``padded`` those of them that are padding): every backend call the scheduler makes, a step's or
    ``run_batch``'s (the states' ``join`` before a call is not counted in it)."""

    def __init__(self, backend, report: Callable[[int, int, float, float, int, int], None],
                 clock: Callable[[], float] = time.perf_counter):
        self.backend, self.report, self.clock = backend, report, clock
        self.exit_layers, self.num_classes, self.take = backend.exit_layers, backend.num_classes, backend.take
        self.seconds: List[float] = []  # per call, in order: the embeddings, layer 1, 2, ...

    def _timed(self, layer: int, mask: np.ndarray, call, *args):
        started, cpu = self.clock(), time.thread_time()
        out = call(*args)
        took = self.clock() - started
        self.seconds.append(took)
        self.report(layer, len(mask), took, time.thread_time() - cpu, int(mask.size), int(np.count_nonzero(mask)))
        return out

    def embed(self, ids, mask):
        return self._timed(0, mask, self.backend.embed, ids, mask)

    def layer(self, i, x, mask):
        return self._timed(i, mask, self.backend.layer, i, x, mask)
