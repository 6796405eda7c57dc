"""One acl-serve worker's model: :class:`Settings` (what the flags say), :class:`Service` (the engine, its
refilling scheduler, the metrics and the statistics Triton's extension reads), and the model's descriptions
(OIP metadata, Triton's model configuration and statistics, TEI's ``/info``).

Every backend call is made by the scheduler's thread (:class:`acl_runtime.scheduler.Scheduler`); a request
encodes its texts, submits the rows, and awaits their future, so the event loop never runs a model.
"""
import asyncio
import os
import threading
import time
from typing import Awaitable, Callable, Dict, List, NamedTuple, Optional

import numpy as np

from acl_runtime import deadlines, loop
from acl_runtime.engine import Engine
from acl_runtime.scheduler import DeadlineExpired, Scheduler
from acl_runtime.serve import protocol
from acl_runtime.serve.metrics import Metrics, shared
from acl_runtime.serve.protocol import BadRequest

VERSION = "1"  # the one model version served (OIP's /versions/{v} paths)
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"  # the tokenizers package's switch for its thread pool
SPLIT = ("queue", "compute_input", "compute_infer", "compute_output")  # Triton's statistics of a success


class Settings(NamedTuple):
    """What acl-serve's flags say about one worker (JSON-serializable: passed to ``--workers`` processes)."""

    folder: str
    model_name: str = "acl"
    precision: str = "fp32"
    policy: Optional[str] = None
    threshold: Optional[float] = None
    max_batch: int = 32
    max_queue: int = 1024
    max_body_bytes: int = 1 << 20
    refill: bool = True
    threads: int = 1
    drain_seconds: float = 30.0
    read_timeout: float = 30.0  # seconds for a request's headers, and for its body once they came (408 past it)
    slo_ms: Optional[float] = None  # the scheduler's latency objective (--slo-ms), a request's default deadline
    deadline_policy: str = "answer"  # what a deadline does (--deadline-policy: acl_runtime.deadlines.POLICIES)
    split_waves: bool = True  # a light load's wave split by length where it pays (--split-waves)


class Answered(NamedTuple):
    predictions: list  # loop.Prediction per input
    logits: np.ndarray  # (n, K) of the deciding exits
    exit_layer: np.ndarray  # (n,)
    request: loop.ExitRequest
    phases: Dict[str, float]  # seconds of the phases spent here (metrics.PHASES: tokenize ... answer so far)
    waits: np.ndarray  # (n, layers + 1): each input's seconds in each queue
    exit_reason: np.ndarray  # (n,): why each input left where it did (acl_runtime.deadlines.REASONS)


class Statistics:
    """What Triton's statistics extension reports and this server measures: requests answered (success / fail,
    with their total nanoseconds from submit to answer), inputs answered and backend calls made; and of each
    success, in Triton's names (perf_analyzer requires the three compute counts equal): ``queue`` its slowest
    input's queue waits, ``compute_input`` its tokenization, ``compute_infer`` the backend calls that input was
    in, ``compute_output`` its predictions built."""

    def __init__(self, metrics: Optional[Metrics] = None):
        self._lock = threading.Lock()
        self.metrics = metrics if metrics is not None and shared() else None  # --workers N: the files, summed
        self.success = [0, 0]  # count, ns
        self.fail = [0, 0]
        self.split = {k: [0, 0] for k in SPLIT}
        self.inferences = 0  # inputs answered
        self.executions = 0  # backend calls
        self.last_ms = 0  # ms since the epoch of the last answer

    def answered(self, ok: bool, inputs: int, ns: int, split: Optional[Dict[str, float]] = None) -> None:
        """``split``: a success's seconds under ``SPLIT``'s names."""
        with self._lock:
            bucket = self.success if ok else self.fail
            bucket[0], bucket[1] = bucket[0] + 1, bucket[1] + ns
            for name, seconds in (split or {}).items():
                self.split[name][0] += 1
                self.split[name][1] += int(1e9 * seconds)
            self.inferences += inputs if ok else 0
            self.last_ms = int(time.time() * 1000)
        if self.metrics is not None:
            self.metrics.triton("success" if ok else "fail", 1, ns, self.last_ms)
            for name, seconds in (split or {}).items():
                self.metrics.triton(name, 1, int(1e9 * seconds))
            if ok:
                self.metrics.triton("inference", inputs)

    def executed(self) -> None:
        with self._lock:
            self.executions += 1
        if self.metrics is not None:
            self.metrics.triton("execution", 1)

    def totals(self) -> "Statistics":
        """These statistics, or with ``--workers N`` every worker's summed (their shared files)."""
        if self.metrics is None:
            return self
        t, summed = self.metrics.triton_totals(), Statistics()
        read = lambda stat: [int(t.get((stat, "count"), 0)), int(t.get((stat, "ns"), 0))]  # noqa: E731
        summed.success, summed.fail = read("success"), read("fail")
        summed.split = {k: read(k) for k in SPLIT}
        summed.inferences, summed.executions = read("inference")[0], read("execution")[0]
        summed.last_ms = int(t.get(("last", "ms"), 0))
        return summed


class ClientGone(Exception):
    """The client disconnected before its answer: the request was given up."""


async def _first(answer: asyncio.Future, gone: Optional[Callable[[], Awaitable]]):
    """``answer``'s result, or :class:`ClientGone` when ``gone()`` returns first."""
    if gone is None:
        return await answer
    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait([answer, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not answer.done():
        answer.cancel()
        raise ClientGone("the client disconnected before its answer")
    return answer.result()


class Service:
    """One worker's model: the engine, the server's default exit request (its --policy flags, else the folder's
    serving policy), the scheduler and the metrics. Built before the server listens, so a bad folder or flag is
    one line and exit 2 (:mod:`acl_runtime.serve.cli`)."""

    def __init__(self, settings: Settings):
        self.settings = s = settings
        # a request's texts are encoded in one encode_batch (Engine.encode_many), the GIL released; without rayon's
        # threads, which cost more CPU than they save beside the model's thread (MiniLM's WordPiece, SST-2, 4 texts:
        # 75 us a text against 42 in the calling thread; docs/serve.md). An operator's own setting is kept.
        os.environ.setdefault(TOKENIZERS_PARALLELISM, "false")
        self.engine = Engine(s.folder, s.precision, threads=s.threads)
        self.default = self.engine.resolve_request(s.policy, s.threshold, None, source="flag")
        self.labels = [] if self.engine.regression else self.engine.label_names()
        self.metrics = Metrics(self.engine.exit_layers, s.max_batch)
        self.stats = Statistics(self.metrics)
        self.scheduler = Scheduler(self.engine.backend, self.engine.regression, max_batch=s.max_batch,
                                   max_queue=s.max_queue, refill=s.refill, on_batch=self._on_batch,
                                   slo=None if s.slo_ms is None else s.slo_ms / 1000,
                                   pad=self.engine.pad, on_fault=self.metrics.on_fault,
                                   on_depth=lambda rows: self.metrics.track_depth(),
                                   on_tokens=self.metrics.on_tokens,
                                   deadline_policy=s.deadline_policy, split_waves=s.split_waves)
        self.metrics.depth = self.scheduler.depth
        self.ready = False

    def _on_batch(self, layer: int, rows: int, seconds: float, cpu: float) -> None:
        self.metrics.on_batch(layer, rows, seconds, cpu)
        self.metrics.track_depth()
        self.stats.executed()

    def start(self) -> None:
        """Measure what a layer costs at each batch size on this machine (the deadlines' table: every layer at every
        bucket, before the first request; the wave split's line through them), then take requests."""
        probe = self.engine.encode_with_info(deadlines.PROBE_TEXT)[0]
        deadlines.measure(self.engine.backend, self.scheduler.costs, probe)
        self.scheduler.call_cost.seed(self.scheduler.costs, len(probe))  # the wave split's cost of a call too
        self.scheduler.start()
        self.ready = True

    def close(self, timeout: Optional[float] = None) -> bool:
        """Take nothing new and answer every accepted row (within ``timeout`` seconds); True when all were."""
        self.ready = False
        return self.scheduler.close(timeout)

    def exit_request(self, params: Dict) -> loop.ExitRequest:
        """The request's own policy / threshold / exit layer, range-checked as acl-predict checks its flags; the
        server's default when it names none."""
        if not params:
            return self.default
        try:
            return self.engine.resolve_request(params.get("policy"), params.get("threshold"),
                                               params.get("exit_layer"), source="request")
        except ValueError as e:
            raise BadRequest(400, str(e)) from None

    async def _wait(self, future, gone: Optional[Callable[[], Awaitable]], n: int, start: float):
        """The scheduler's answer to the ``n`` submitted rows; a request given up, expired or failed frees its rows
        and is counted as unanswered."""
        self.metrics.track_depth()
        try:
            return await _first(asyncio.wrap_future(future), gone)
        except BaseException as e:
            if isinstance(e, DeadlineExpired):
                self.metrics.expired.inc(n)
            self.scheduler.cancel(future)
            self.stats.answered(False, n, int(1e9 * (time.perf_counter() - start)))
            raise
        finally:
            self.metrics.track_depth()

    async def predict(self, texts: List[protocol.Pair], params: Dict,
                      gone: Optional[Callable[[], Awaitable]] = None, deadline: Optional[float] = None) -> Answered:
        """The inputs' answers. ``gone()``, when given, returns once the client has disconnected: the request is
        then given up and its queued rows freed (:meth:`Scheduler.cancel`), as they are when this is cancelled
        (the drain ran out of time). ``deadline``: seconds from now to the request's deadline (default: --slo-ms;
        what it does: --deadline-policy); past it before it started, :class:`DeadlineExpired`."""
        request = self.exit_request(params)
        if len(texts) > self.settings.max_queue:
            raise BadRequest(413, f"{len(texts)} inputs in one request, more than the queue holds (--max-queue "
                             f"{self.settings.max_queue}): split the request")
        began = time.perf_counter()
        # the texts of a request of several in one encode_batch (the GIL released once for all); a lone input's in
        # this thread: releasing and taking back the GIL beside the busy model thread cost more than its text
        encoded = self.engine.encode_many(texts, batch=len(texts) > 1)
        start = time.perf_counter()  # before the rows' queue waits start
        try:
            future = self.scheduler.submit([ids for ids, _ in encoded], request, deadline)
        except ValueError as e:
            raise BadRequest(400, str(e)) from None
        answer = await self._wait(future, gone, len(texts), start)
        answered = time.perf_counter()
        slowest = int(np.argmax(answer.waits.sum(axis=1) + answer.model))
        queue, model = float(answer.waits[slowest].sum()), float(answer.model[slowest])
        truncated = [cut for _, cut in encoded]
        self.metrics.exits(answer.exit_layer, answer.exit_reason)
        predictions = self.engine.to_predictions(answer.logits, answer.exit_layer, truncated)
        built = time.perf_counter()
        self.stats.answered(True, len(texts), int(1e9 * (answered - start)), {
            "queue": queue, "compute_input": start - began, "compute_infer": model, "compute_output": built - answered})
        phases = {"tokenize": start - began, "queue": queue, "model": model,
                  "schedule": answer.done_at - start - queue - model, "handoff": answered - answer.done_at,
                  "answer": built - answered}
        return Answered(predictions, answer.logits, answer.exit_layer, request, phases, answer.waits,
                        answer.exit_reason)

    # ---- what the model is, in each protocol's words ----------------------------------------------

    def output_names(self) -> List[str]:
        return ["label", "exit_layer"] + ([] if self.engine.regression else ["probabilities"]) + ["truncated"]

    def _outputs(self) -> List[tuple]:
        """(name, OIP datatype, shape after the batch dimension) of each output."""
        k = len(self.labels)
        return [("label", "FP32" if self.engine.regression else "BYTES", []), ("exit_layer", "INT64", []),
                *([] if self.engine.regression else [("probabilities", "FP32", [k])]), ("truncated", "BOOL", [])]

    def metadata(self) -> Dict:
        """OIP's model metadata, with this model's labels, exits, precision and default policy. An input's shape is
        Triton's for :meth:`config`'s: the batch, then the dims ([-1, 1]; perf_analyzer sends each row as that
        [1]); [n] is accepted too."""
        default = self.default
        return {"name": self.settings.model_name, "versions": [VERSION], "platform": "acl_fairseq_onnx_early_exit",
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
                           {"name": "text_pair", "datatype": "BYTES", "shape": [-1, 1], "optional": True}],
                "outputs": [{"name": n, "datatype": t, "shape": [-1] + dims} for n, t, dims in self._outputs()],
                "parameters": {"labels": self.labels, "exit_layers": list(self.engine.exit_layers),
                               "precision": self.settings.precision, "policy": default.policy or "none",
                               "threshold": default.threshold}}

    def config(self) -> Dict:
        """Triton's model configuration (what ``tritonclient``'s ``get_model_config`` and perf_analyzer read): a
        batched model whose batch is a request's inputs (``max_batch_size``: --max-queue); each text is one
        element (dims [1] read as a scalar)."""
        types = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL"}
        scalar = {"dims": [1], "reshape": {"shape": []}}
        return {"name": self.settings.model_name, "platform": "acl_fairseq_onnx_early_exit", "backend": "acl-serve",
                "version_policy": {"specific": {"versions": [int(VERSION)]}},
                "max_batch_size": self.settings.max_queue,
                "input": [{"name": "text", "data_type": "TYPE_STRING", "format": "FORMAT_NONE", **scalar},
                          {"name": "text_pair", "data_type": "TYPE_STRING", "format": "FORMAT_NONE",
                           "optional": True, **scalar}],
                "output": [{"name": n, "data_type": types[t], **({"dims": dims} if dims else scalar),
                            **({"label_filename": ""} if n == "probabilities" else {})}
                           for n, t, dims in self._outputs()],
                "dynamic_batching": {"max_queue_delay_microseconds": 0},
                "parameters": {"exit_layers": {"string_value": ",".join(map(str, self.engine.exit_layers))}}}

    def statistics(self) -> Dict:
        """Triton's statistics extension, for what this server measures (:class:`Statistics`); the scheduler
        interleaves requests layer by layer, so a backend call counts for every request in it."""
        s = self.stats.totals()
        return {"model_stats": [{"name": self.settings.model_name, "version": VERSION, "last_inference": s.last_ms,
                                 "inference_count": s.inferences, "execution_count": s.executions,
                                 "inference_stats": {"success": {"count": s.success[0], "ns": s.success[1]},
                                                     "fail": {"count": s.fail[0], "ns": s.fail[1]},
                                                     **{k: {"count": c, "ns": ns} for k, (c, ns) in
                                                        s.split.items()}}}]}

    def info(self, version: str) -> Dict:
        """TEI's ``/info`` (router/src/lib.rs ``Info``) for a classifier."""
        names = self.labels or ["score"]
        return {"model_id": self.settings.model_name, "model_sha": None,  # never the server's folder
                "model_dtype": "float32" if self.settings.precision == "fp32" else self.settings.precision,
                "model_type": {"classifier": {"id2label": {str(i): n for i, n in enumerate(names)},
                                              "label2id": {n: i for i, n in enumerate(names)}}},
                "max_concurrent_requests": self.settings.max_queue,
                "max_input_length": int(self.engine.layout["max_positions"]),
                "max_batch_requests": self.settings.max_batch, "max_client_batch_size": self.settings.max_queue,
                "auto_truncate": True, "tokenization_workers": 1, "version": version, "sha": None,
                "docker_label": None}
