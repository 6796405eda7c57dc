"""acl-serve's Prometheus metrics (``prometheus-client``), served at ``/metrics``.

- ``acl_requests_total{route,status}``: requests answered, by route and HTTP status;
- ``acl_request_seconds{route}``: latency, from the whole body read to the answer built (a histogram);
- ``acl_exit_layer``: the layer each answered input left at (a histogram with one bucket per exit);
- ``acl_exit_reasons_total{reason}``: answered inputs by why they left where they did: ``policy`` (the exit policy
  fired), ``last`` (their last exit: the model's, or the request's ``exit_layer``), ``deadline`` (the next layer
  would have made them late: acl_runtime.deadlines);
- ``acl_deadline_expired_total``: inputs of requests that failed because their deadline passed before they started
  (Triton's "Request timeout expired");
- ``acl_queue_depth``: inputs accepted and not yet answered (the scheduler's queue);
- ``acl_batch_fill{layer}``: rows of each backend call over ``--max-batch`` (layer 0: the embeddings);
- ``acl_tokens_total{layer}``, ``acl_padded_tokens_total{layer}``: positions the backend calls ran (rows x the
  batch's width) and those of them that were padding: the padded share of a layer's calls is their ratio
  (``rate(acl_padded_tokens_total[1m]) / rate(acl_tokens_total[1m])``);
- ``acl_isolated_failures_total{layer}``: inputs failed alone after a backend call on their batch raised and was
  run again in halves (the other rows of the batch were answered);
- ``acl_request_phase_seconds{phase}``: where each answered request's time went (a histogram per phase, ``PHASES``;
  the phases of one request add up to its ``acl_request_seconds``);
- ``acl_queue_wait_seconds{layer}``: each answered input's wait in each queue it passed (layer 0: the embeddings');
- ``acl_model_seconds_total``, ``acl_model_cpu_seconds_total``: wall and CPU seconds the scheduler's thread
  spent in backend calls (the model; its CPU against the worker's: the share of its CPU time spent outside it).

- ``acl_triton_total{stat,unit}``, ``acl_triton_last_inference_ms``: Triton's statistics extension's counts and
  nanoseconds, which ``/v2/models/NAME/stats`` reads summed over the workers (``--workers N``; one worker's own
  totals went to the client, by whichever answered, and perf_analyzer's deltas went negative).

With ``--workers N`` every worker writes its values to ``PROMETHEUS_MULTIPROC_DIR`` (set by acl-serve before the
workers start) and ``/metrics`` sums them over the workers, whichever answers. prometheus-client writes them
through ``mmap`` into sparse files, and a full disk under that folder killed the worker with SIGBUS when a write
reached a page the file system could not give (a new series, or the file grown). Here every such file is
allocated before it is mapped (``posix_fallocate``: a full disk is an ``OSError`` then, :class:`_AllocatedDict`),
and a metric that cannot be written is given up once, with one line in the log (:func:`_kept`): a full disk costs
metrics, never a request or a worker.
"""
import functools
import logging
import os
from typing import Dict, Sequence, Tuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.mmap_dict import MmapedDict

from acl_runtime.deadlines import REASONS

logger = logging.getLogger("acl_runtime.serve")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FILL_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
PHASE_BUCKETS = (0.0001, 0.00025, 0.0005) + LATENCY_BUCKETS
# a request's phases, in order; they add up to its latency (acl_request_seconds)
PHASES = {
    "read": "the body read, decoded and parsed",
    "tokenize": "its texts encoded",
    "queue": "its slowest input's waits in the layers' queues",
    "model": "the backend calls that input was in",
    "schedule": "the rest of the scheduler's time to its last answer: batching, the policy, the states' copies",
    "handoff": "from its last answer in the scheduler's thread to the event loop taking it up",
    "answer": "the answer built and serialized",
    "other": "the rest: routing and the handler's own work",
}


def shared() -> bool:
    """Whether the values are kept in files shared by the workers (prometheus-client's multiprocess mode)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def _allocate(fd: int, size: int) -> None:
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)  # ENOSPC here, not SIGBUS at the first write to the mapping


class _AllocatedDict(MmapedDict):
    """prometheus-client's file of one process's values, its blocks allocated before they are mapped."""

    def __init__(self, filename, read_mode=False):
        if not read_mode:
            created = not os.path.exists(filename)
            fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                _allocate(fd, max(os.fstat(fd).st_size, 1 << 16))  # mmap_dict._INITIAL_MMAP_SIZE
            except OSError:
                if created:  # an empty file would fail /metrics' reading of the folder
                    os.unlink(filename)
                raise
            finally:
                os.close(fd)
        super().__init__(filename, read_mode)

    def _init_value(self, key):
        encoded = len(key.encode("utf-8"))
        need, capacity = self._used + 4 + encoded + (8 - (encoded + 4) % 8) + 16, self._capacity
        while need > capacity:  # what MmapedDict._init_value grows the file to
            capacity *= 2
        if capacity != self._capacity:
            _allocate(self._f.fileno(), capacity)
        super()._init_value(key)


values.MmapedDict = _AllocatedDict  # what MultiProcessValue opens (prometheus-client 0.2x: values.py)


def _kept(method):
    """A :class:`Metrics` method that gives the metrics up, once and with one line in the log, when their files
    cannot be written (a full disk), rather than fail the request or the worker."""
    @functools.wraps(method)
    def kept(self, *args, **kwargs):
        if self.lost:
            return None
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            self.give_up(e)
            return None
    return kept


class Metrics:
    def __init__(self, exit_layers: Sequence[int], max_batch: int):
        self.lost, self.max_batch = False, max_batch
        self._children: Dict[tuple, object] = {}  # (id(metric), label values) -> its child (_child)
        self.depth = lambda: 0  # the scheduler's depth(), read at each scrape and after each answer
        try:
            self._build(exit_layers)
        except OSError as e:
            self.give_up(e)

    def _child(self, metric, *values: str):
        """``metric.labels(*values)``, looked up once: prometheus-client's ``labels`` checks and joins the values on
        every call (12 lookups a request were 0.18 of the worker's 2.3 CPU ms a request outside the model, profiled:
        docs/serve.md)."""
        key = (id(metric),) + values
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def give_up(self, error: Exception) -> None:
        if not self.lost:
            self.lost = True
            logger.error("acl-serve: worker %d cannot write its metrics under %s (%s): it stops counting them; its "
                         "requests are served", os.getpid(), os.environ.get("PROMETHEUS_MULTIPROC_DIR"), error)

    def _build(self, exit_layers: Sequence[int]) -> None:
        # a registry per server: tests start several in one process
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("acl_requests", "requests answered, by route and HTTP status", ["route", "status"],
                                registry=r)
        self.latency = Histogram("acl_request_seconds", "seconds from the request's body read to its answer",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.exit_layer = Histogram("acl_exit_layer", "encoder layer each answered input left at",
                                    buckets=[float(x) for x in exit_layers], registry=r)
        self.exit_reasons = Counter("acl_exit_reasons", "answered inputs by why they left where they did: policy (the "
                                    "exit policy fired), last (their last exit), deadline (the next layer would have "
                                    "made them late)", ["reason"], registry=r)
        for reason in REASONS:  # every reason shown from the start, 0 until one happens
            self.exit_reasons.labels(reason=reason)
        self.expired = Counter("acl_deadline_expired", "inputs of requests failed because their deadline passed "
                               "before they started (Triton's 'Request timeout expired')", registry=r)
        self._build_model_metrics(r)

    def _build_model_metrics(self, r: CollectorRegistry) -> None:
        """The scheduler's side: queues, batches, positions, the model's time and Triton's statistics."""
        self.queue_depth = Gauge("acl_queue_depth", "inputs accepted and not yet answered", registry=r,
                                 multiprocess_mode="livesum")
        self.batch_fill = Histogram("acl_batch_fill", "rows of a backend call over --max-batch, by layer (0: the "
                                    "embeddings)", ["layer"], buckets=FILL_BUCKETS, registry=r)
        self.tokens = Counter("acl_tokens", "positions the backend calls ran (rows x the batch's width), by layer (0: "
                              "the embeddings)", ["layer"], registry=r)
        self.padded = Counter("acl_padded_tokens", "positions of the backend calls that were padding (their share: "
                              "over acl_tokens_total), by layer", ["layer"], registry=r)
        self.isolated = Counter("acl_isolated_failures", "inputs failed alone after their batch's backend call "
                                "raised (the batch was split and the other rows answered), by layer", ["layer"],
                                registry=r)
        self.phase = Histogram("acl_request_phase_seconds", "seconds of each answered request's phases: "
                               + "; ".join(f"{k}: {v}" for k, v in PHASES.items()), ["phase"],
                               buckets=PHASE_BUCKETS, registry=r)
        self.queue_wait = Histogram("acl_queue_wait_seconds", "seconds each answered input waited in each queue it "
                                    "passed (0: the embeddings')", ["layer"], buckets=PHASE_BUCKETS, registry=r)
        self.model_seconds = Counter("acl_model_seconds", "seconds the scheduler's thread spent in backend calls",
                                     registry=r)
        self.model_cpu = Counter("acl_model_cpu_seconds", "CPU seconds of the scheduler's thread in backend calls "
                                 "(ONNX Runtime's own threads beyond --threads 1 not counted)", registry=r)
        self.triton_counts = Counter("acl_triton", "Triton's statistics extension (/v2/models/NAME/stats) by stat: "
                                     "success, fail, queue, compute_input, compute_infer, compute_output, "
                                     "inference, execution; unit count or ns", ["stat", "unit"], registry=r)
        self.triton_last = Gauge("acl_triton_last_inference_ms", "ms since the epoch of the last answer", registry=r,
                                 multiprocess_mode="max")

    @_kept
    def triton(self, stat: str, count: int, ns: int = 0, last_ms: int = 0) -> None:
        """Counts ``count`` (and ``ns``) under Triton's ``stat``; ``last_ms``: the answer's time."""
        self._child(self.triton_counts, stat, "count").inc(count)
        if ns:
            self._child(self.triton_counts, stat, "ns").inc(ns)
        if last_ms:
            self.triton_last.set(last_ms)

    def triton_totals(self) -> Dict[Tuple[str, str], float]:
        """(stat, unit) -> the value summed over the workers, and ("last", "ms") -> the latest answer's time."""
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        totals = {}
        for family in registry.collect():
            for sample in family.samples:
                if sample.name == "acl_triton_total":
                    totals[(sample.labels["stat"], sample.labels["unit"])] = sample.value
                elif sample.name == "acl_triton_last_inference_ms":
                    totals[("last", "ms")] = max(sample.value, totals.get(("last", "ms"), 0.0))
        return totals

    @_kept
    def track_depth(self) -> None:
        self.queue_depth.set(self.depth())

    @_kept
    def on_batch(self, layer: int, rows: int, seconds: float, cpu: float) -> None:
        """The scheduler's ``on_batch``: called from its thread after every backend call."""
        self._child(self.batch_fill, str(layer)).observe(rows / self.max_batch)
        self.model_seconds.inc(seconds)
        self.model_cpu.inc(cpu)

    @_kept
    def on_tokens(self, layer: int, tokens: int, padded: int) -> None:
        """The scheduler's ``on_tokens``: a backend call's positions and its padded ones."""
        self._child(self.tokens, str(layer)).inc(tokens)
        self._child(self.padded, str(layer)).inc(padded)

    @_kept
    def phases(self, seconds: dict, waits) -> None:
        """One answered request's phases (``PHASES``' names to seconds), and the waits of its inputs (an inputs x
        queues array; a queue an input never passed holds 0 and is left out)."""
        for name, value in seconds.items():
            self._child(self.phase, name).observe(value)
        for layer in range(waits.shape[1]):
            column = waits[:, layer]
            for value in column[column > 0]:
                self._child(self.queue_wait, str(layer)).observe(float(value))

    @_kept
    def on_fault(self, layer: int, rows: int) -> None:
        """The scheduler's ``on_fault``: ``rows`` inputs failed alone at ``layer``."""
        self.isolated.labels(layer=str(layer)).inc(rows)

    @_kept
    def answered(self, route: str, status: int, seconds: float) -> None:
        self._child(self.requests, route, str(status)).inc()
        self._child(self.latency, route).observe(seconds)

    @_kept
    def exits(self, layers: Sequence[int], reasons: Sequence[str]) -> None:
        for layer, reason in zip(layers, reasons):
            self.exit_layer.observe(int(layer))
            self._child(self.exit_reasons, str(reason)).inc()

    def exposition(self) -> bytes:
        self.track_depth()
        if shared():  # the other workers' values, and this one's while it could write them
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry) if not self.lost else b""


CONTENT_TYPE = CONTENT_TYPE_LATEST
