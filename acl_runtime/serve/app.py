"""acl-serve's ASGI application (Starlette): one :class:`Service` (an ONNX Runtime engine and its refilling
scheduler) behind the Open Inference Protocol v2 routes, TEI's ``/predict`` and ``/metrics``.

Every backend call is made by the scheduler's thread (:class:`acl_runtime.scheduler.Scheduler`); a request
encodes its texts, submits the rows, and awaits their future, so the event loop never runs a model. A full queue is
503 with ``Retry-After`` (the scheduler's estimate of when the queue will have drained). Bad input is a 4xx with one
line and never reaches the model.
"""
import asyncio
import contextlib
import json
import logging
import time
from typing import Dict, List, NamedTuple, Optional

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from acl_runtime import loop
from acl_runtime.engine import Engine
from acl_runtime.scheduler import Closed, QueueFull, Scheduler
from acl_runtime.serve import protocol
from acl_runtime.serve.metrics import CONTENT_TYPE, Metrics
from acl_runtime.serve.protocol import BadRequest

logger = logging.getLogger("acl_runtime.serve")
VERSION = "1"  # the one model version served (OIP's /versions/{v} paths)
CLOSE_SECONDS = 1.0  # the scheduler's own drain, after uvicorn's (see build_app's lifespan)


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


class Answered(NamedTuple):
    predictions: list  # loop.Prediction per input
    logits: np.ndarray  # (n, K) of the deciding exits
    exit_layer: np.ndarray  # (n,)
    request: loop.ExitRequest


class Service:
    """One worker's model: the engine, the server's default exit request (its --policy flags, else the folder's
    serving policy), the scheduler and the metrics. Built before the server listens, so a bad folder or flag is
    one line and exit 2 (:mod:`acl_runtime.serve.cli`)."""

    def __init__(self, settings: Settings):
        self.settings = s = settings
        self.engine = Engine(s.folder, s.precision, threads=s.threads)
        self.default = self.engine.resolve_request(s.policy, s.threshold, None, source="flag")
        self.labels = [] if self.engine.regression else self.engine.label_names()
        self.metrics = Metrics(self.engine.exit_layers, s.max_batch)
        self.scheduler = Scheduler(self.engine.backend, self.engine.regression, max_batch=s.max_batch,
                                   max_queue=s.max_queue, refill=s.refill, on_batch=self._on_batch,
                                   pad=self.engine.pad)
        self.metrics.depth = self.scheduler.depth
        self.ready = False

    def _on_batch(self, layer: int, rows: int) -> None:
        self.metrics.on_batch(layer, rows)
        self.metrics.track_depth()

    def start(self) -> None:
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

    async def predict(self, texts: List[protocol.Pair], params: Dict) -> Answered:
        request = self.exit_request(params)
        if len(texts) > self.settings.max_queue:
            raise BadRequest(413, f"{len(texts)} inputs in one request, more than the queue holds (--max-queue "
                             f"{self.settings.max_queue}): split the request")
        encoded = [self.engine.encode_with_info(a, b) for a, b in texts]
        try:
            future = self.scheduler.submit([ids for ids, _ in encoded], request)
        except ValueError as e:
            raise BadRequest(400, str(e)) from None
        self.metrics.track_depth()
        answer = await asyncio.wrap_future(future)
        self.metrics.track_depth()
        truncated = [cut for _, cut in encoded]
        self.metrics.exits(answer.exit_layer)
        return Answered(self.engine.to_predictions(answer.logits, answer.exit_layer, truncated), answer.logits,
                        answer.exit_layer, request)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (by its Content-Length, else as it streams in)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise BadRequest(413, f"the body is {length} bytes, over the limit of {limit} bytes (--max-body-bytes): "
                         "send fewer or shorter texts per request")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"the body is over the limit of {limit} bytes (--max-body-bytes): send fewer or "
                             "shorter texts per request")
        chunks.append(chunk)
    return b"".join(chunks)


def _tensors(service: Service, answered: Answered, truncated: List[bool]) -> Dict:
    preds = answered.predictions
    tensors = {"label": ("BYTES", np.asarray([p.label for p in preds], dtype=object)),
               "exit_layer": ("INT64", np.asarray(answered.exit_layer, dtype=np.int64)),
               "truncated": ("BOOL", np.asarray(truncated, dtype=bool))}
    if service.engine.regression:
        tensors["label"] = ("FP32", np.asarray([p.label for p in preds], dtype=np.float32))
    else:
        tensors["probabilities"] = ("FP32", loop.softmax(np.asarray(answered.logits, dtype=np.float32)))
    return tensors


def output_names(service: Service) -> List[str]:
    return ["label", "exit_layer"] + ([] if service.engine.regression else ["probabilities"]) + ["truncated"]


def _exit_parameters(request: loop.ExitRequest, truncated: List[bool]) -> Dict:
    """What ran, for the response's ``parameters`` (OIP parameters are scalars)."""
    out = {"policy": request.policy or "none", "truncated": int(sum(truncated))}
    if request.threshold is not None:
        out["threshold"] = request.threshold
    if request.exit_layer is not None:
        out["exit_layer"] = request.exit_layer
    return out


def _check_model(service: Service, request: Request) -> None:
    name, version = request.path_params["name"], request.path_params.get("version", VERSION)
    if name != service.settings.model_name or version != VERSION:
        served = f"{service.settings.model_name!r} version {VERSION}"
        raise BadRequest(404, f"unknown model {name!r}" + (f" version {version!r}" if version != VERSION else "") +
                         f": this server serves {served}")


def build_app(service: Service) -> Starlette:
    """The routes over ``service``; the lifespan starts its scheduler and, at shutdown (SIGTERM: uvicorn has
    stopped accepting and waited for the requests in flight), drains it."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.start()
        yield
        # uvicorn has waited (up to --drain-seconds) for every request in flight: rows still queued now belong to
        # requests it cancelled at that bound, which no one waits for
        if not await asyncio.get_running_loop().run_in_executor(None, service.close, CLOSE_SECONDS):
            logger.error("acl-serve: %d inputs were still queued after --drain-seconds %g", service.scheduler.depth(),
                         service.settings.drain_seconds)

    async def handle(request: Request, route: str, tei: bool, work) -> Response:
        start = time.perf_counter()
        try:
            response = await work(request)
        except BadRequest as e:
            response = _error(e.status, e.message, e.kind, tei)
        except (QueueFull, Closed) as e:
            retry = getattr(e, "retry_after", 1)
            response = _error(503, f"{e} (overloaded: the queue is full or the server is stopping)", "Overloaded",
                              tei, {"Retry-After": str(int(retry))})
        except Exception as e:  # a backend failure answers its request; the server goes on
            logger.exception("acl-serve: %s failed", route)
            response = _error(500, f"internal error: {type(e).__name__}: {e}", "Backend", tei)
        service.metrics.answered(route, response.status_code, time.perf_counter() - start)
        return response

    async def infer(request: Request) -> Response:
        _check_model(service, request)
        body = await read_body(request, service.settings.max_body_bytes)
        req = protocol.parse_infer(body, request.headers.get("inference-header-content-length"),
                                   output_names(service))
        answered = await service.predict(req.texts, req.params)
        truncated = [p.truncated for p in answered.predictions]
        content, header = protocol.infer_response(service.settings.model_name, VERSION, req,
                                                  _tensors(service, answered, truncated),
                                                  _exit_parameters(answered.request, truncated))
        if header is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(header)})

    async def predict(request: Request) -> Response:
        body = await read_body(request, service.settings.max_body_bytes)
        req = protocol.parse_predict(body)
        answered = await service.predict(req.texts, req.params)
        if service.engine.regression:
            names, scores = ["score"], np.asarray([[p.label] for p in answered.predictions], dtype=np.float32)
        else:
            names = service.labels
            scores = answered.logits if req.raw_scores else loop.softmax(answered.logits)
        return JSONResponse(protocol.predict_response(req, names, scores, answered.exit_layer,
                                                      [p.truncated for p in answered.predictions]))

    async def model_metadata(request: Request) -> Response:
        _check_model(service, request)
        return JSONResponse(model_metadata_body(service))

    async def model_ready(request: Request) -> Response:
        _check_model(service, request)
        return Response(status_code=200 if service.ready else 503)

    def wrap(route: str, work, tei: bool = False):
        async def endpoint(request: Request) -> Response:
            return await handle(request, route, tei, work)
        return endpoint

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if service.ready else 503)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse({"name": "acl-serve", "version": _package_version(),
                             "extensions": ["binary_tensor_data"]})

    async def metrics(request: Request) -> Response:
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)

    infer_ep = wrap("infer", infer)
    routes = [
        Route("/v2", server_metadata),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2/models/{name}", wrap("metadata", model_metadata)),
        Route("/v2/models/{name}/versions/{version}", wrap("metadata", model_metadata)),
        Route("/v2/models/{name}/ready", wrap("ready", model_ready)),
        Route("/v2/models/{name}/versions/{version}/ready", wrap("ready", model_ready)),
        Route("/v2/models/{name}/infer", infer_ep, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer_ep, methods=["POST"]),
        Route("/predict", wrap("predict", predict, tei=True), methods=["POST"]),
        Route("/metrics", metrics),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def model_metadata_body(service: Service) -> Dict:
    engine = service.engine
    k = len(service.labels)
    outputs = [{"name": "label", "datatype": "FP32" if engine.regression else "BYTES", "shape": [-1]},
               {"name": "exit_layer", "datatype": "INT64", "shape": [-1]}]
    if not engine.regression:
        outputs.append({"name": "probabilities", "datatype": "FP32", "shape": [-1, k]})
    outputs.append({"name": "truncated", "datatype": "BOOL", "shape": [-1]})
    default = service.default
    return {"name": service.settings.model_name, "versions": [VERSION], "platform": "acl_fairseq_onnx_early_exit",
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]},
                       {"name": "text_pair", "datatype": "BYTES", "shape": [-1], "optional": True}],
            "outputs": outputs,
            "parameters": {"labels": service.labels, "exit_layers": list(engine.exit_layers),
                           "precision": service.settings.precision, "policy": default.policy or "none",
                           "threshold": default.threshold}}


def _error(status: int, message: str, kind: str, tei: bool, headers: Optional[Dict] = None) -> Response:
    """OIP's ``{"error"}``, or TEI's ``{"error", "error_type"}`` on /predict."""
    body = {"error": message, "error_type": kind} if tei else {"error": message}
    return Response(json.dumps(body), status_code=status, media_type="application/json", headers=headers)


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("acl_fairseq")
    except Exception:  # not installed (run from a checkout)
        return "0"
