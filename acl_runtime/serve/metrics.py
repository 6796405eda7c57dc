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
- ``acl_isolated_failures_total{layer}``: inputs failed alone after a backend call on their batch raised and was
  run again in halves (the other rows of the batch were answered);
- ``acl_request_phase_seconds{phase}``: where each answered request's time went (a histogram per phase, ``PHASES``;
  the phases of one request add up to its ``acl_request_seconds``);
- ``acl_queue_wait_seconds{layer}``: each answered input's wait in each queue it passed (layer 0: the embeddings');
- ``acl_model_seconds_total``, ``acl_model_cpu_seconds_total``: wall and CPU seconds the scheduler's thread
  spent in backend calls (the model; its CPU against the worker's: the share of its CPU time spent outside it).

With ``--workers N`` every worker writes its values to ``PROMETHEUS_MULTIPROC_DIR`` (set by acl-serve before the
workers start) and ``/metrics`` sums them over the workers, whichever answers.
"""
import os
from typing import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from acl_runtime.deadlines import REASONS

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


class Metrics:
    def __init__(self, exit_layers: Sequence[int], max_batch: int):
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
        self.queue_depth = Gauge("acl_queue_depth", "inputs accepted and not yet answered", registry=r,
                                 multiprocess_mode="livesum")
        self.batch_fill = Histogram("acl_batch_fill", "rows of a backend call over --max-batch, by layer (0: the "
                                    "embeddings)", ["layer"], buckets=FILL_BUCKETS, registry=r)
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
        self.max_batch = max_batch
        self.depth = lambda: 0  # the scheduler's depth(), read at each scrape and after each answer

    def track_depth(self) -> None:
        self.queue_depth.set(self.depth())

    def on_batch(self, layer: int, rows: int, seconds: float, cpu: float) -> None:
        """The scheduler's ``on_batch``: called from its thread after every backend call."""
        self.batch_fill.labels(layer=str(layer)).observe(rows / self.max_batch)
        self.model_seconds.inc(seconds)
        self.model_cpu.inc(cpu)

    def phases(self, seconds: dict, waits) -> None:
        """One answered request's phases (``PHASES``' names to seconds), and the waits of its inputs (an inputs x
        queues array; a queue an input never passed holds 0 and is left out)."""
        for name, value in seconds.items():
            self.phase.labels(phase=name).observe(value)
        for layer in range(waits.shape[1]):
            column = waits[:, layer]
            for value in column[column > 0]:
                self.queue_wait.labels(layer=str(layer)).observe(float(value))

    def on_fault(self, layer: int, rows: int) -> None:
        """The scheduler's ``on_fault``: ``rows`` inputs failed alone at ``layer``."""
        self.isolated.labels(layer=str(layer)).inc(rows)

    def answered(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def exits(self, layers: Sequence[int], reasons: Sequence[str]) -> None:
        for layer, reason in zip(layers, reasons):
            self.exit_layer.observe(int(layer))
            self.exit_reasons.labels(reason=str(reason)).inc()

    def exposition(self) -> bytes:
        self.track_depth()
        if shared():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


CONTENT_TYPE = CONTENT_TYPE_LATEST
