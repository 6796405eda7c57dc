"""acl-serve's ASGI application (Starlette): one handler a route, each over the worker's :class:`Service`
(``request.app.state.service``), behind the Open Inference Protocol v2 routes, TEI's ``/predict`` (and ``/``,
``/health``, ``/info``), ``/metrics`` and ``/openapi.json`` (the request schema, :mod:`acl_runtime.serve.schema`).

A full queue is 503 with ``Retry-After`` (the scheduler's estimate of when the queue will have drained); a request
whose deadline passed before it started is 503 with Triton's "Request timeout expired" (no Retry-After). Bad input
is a 4xx with one line and never reaches the model. An unexpected failure is 500 with ``internal error`` and a
request id only; the class, message and traceback go to the log line carrying that id.
"""
import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from typing import Dict, List, Optional

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from acl_runtime import loop
from acl_runtime.scheduler import Closed, DeadlineExpired, QueueFull
from acl_runtime.serve import protocol, schema, tei
from acl_runtime.serve.body import disconnected, read_body
from acl_runtime.serve.edges import Edges
from acl_runtime.serve.metrics import CONTENT_TYPE
from acl_runtime.serve.protocol import BadRequest
from acl_runtime.serve.service import VERSION, Answered, ClientGone, Service, Settings  # noqa: F401  (Settings: the API)

logger = logging.getLogger("acl_runtime.serve")
CLOSE_SECONDS = 1.0  # the scheduler's own drain, after uvicorn's (see lifespan)


def _service(request: Request) -> Service:
    return request.app.state.service


@contextlib.asynccontextmanager
async def lifespan(app: Starlette):
    """Starts the scheduler; at shutdown (SIGTERM: uvicorn has stopped accepting and waited for the requests in
    flight) drains it."""
    service: Service = app.state.service
    service.start()
    yield
    # uvicorn has waited (up to --drain-seconds) for every request in flight, and the handlers it cancelled at that
    # bound freed their rows: a row still queued now is a fault
    if not await asyncio.get_running_loop().run_in_executor(None, service.close, CLOSE_SECONDS):
        logger.error("acl-serve: %d inputs were still queued after --drain-seconds %g", service.scheduler.depth(),
                     service.settings.drain_seconds)


# ---- the request's edge: errors (the body: body.py) ------------------------------------------------------------


def error(status: int, message: str, tei_shape: bool = False, kind: str = "Validation",
          headers: Optional[Dict] = None) -> Response:
    """OIP's ``{"error"}``, or TEI's ``{"error", "error_type"}``."""
    body = {"error": message, "error_type": kind} if tei_shape else {"error": message}
    return Response(json.dumps(body), status_code=status, media_type="application/json", headers=headers)


def answers(route: str, tei_shape: bool = False):
    """A handler's errors as answers (4xx with one line, 503 with Retry-After, 500 with a request id), and its
    status and latency counted under ``route``."""
    def wrap(work):
        @functools.wraps(work)
        async def endpoint(request: Request) -> Response:
            service, start = _service(request), time.perf_counter()
            request.state.phases, request.state.started = (phases := {}), start
            try:
                response = await work(request, service)
            except BadRequest as e:
                response = error(e.status, e.message, tei_shape, e.kind,
                                 {"Connection": "close"} if e.status == 408 else None)
            except asyncio.CancelledError:  # uvicorn's drain ran out of --drain-seconds: the rows were freed
                response = error(503, "the server stopped before this request was answered (--drain-seconds ran "
                                 "out): retry it", tei_shape, "Overloaded", {"Retry-After": "1", "Connection": "close"})
            except DeadlineExpired as e:  # Triton answers its "Request timeout expired" 503 (UNAVAILABLE)
                response = error(503, str(e), tei_shape, "Overloaded")
            except ClientGone:  # no one to answer; counted as nginx counts it, 499 "client closed request"
                response = Response(status_code=499)
            except (QueueFull, Closed) as e:
                retry = getattr(e, "retry_after", 1)
                response = error(503, f"{e} (overloaded: the queue is full or the server is stopping)", tei_shape,
                                 "Overloaded", {"Retry-After": str(int(retry))})
            except Exception:  # a backend failure answers its request; the server goes on
                response = internal_error(route, tei_shape)
            took = time.perf_counter() - start
            service.metrics.answered(route, response.status_code, took)
            if response.status_code == 200 and "answer" in phases:
                service.metrics.phases({**phases, "other": took - sum(phases.values())}, request.state.waits)
            return response
        return endpoint
    return wrap


def internal_error(route: str, tei_shape: bool = False) -> Response:
    """500 with ``internal error`` and a request id only; the exception being handled goes to the log line that
    carries the id."""
    rid = uuid.uuid4().hex[:16]
    logger.exception("acl-serve: request %s on %s failed", rid, route)
    return error(500, f"internal error (request id {rid})", tei_shape, "Backend", {"X-Request-Id": rid})


async def unexpected(request: Request, exc: Exception) -> Response:
    """Starlette's last resort (a route without :func:`answers`, a middleware): the same 500 as the handlers'."""
    return internal_error(request.url.path)


def _check_model(service: Service, request: Request) -> None:
    name, version = request.path_params["name"], request.path_params.get("version", VERSION)
    if name != service.settings.model_name or version != VERSION:
        served = f"{service.settings.model_name!r} version {VERSION}"
        raise BadRequest(404, f"unknown model {_cut(name)!r}" + (f" version {_cut(version)!r}" if version != VERSION
                                                                 else "") + f": this server serves {served}")


def _cut(text: str, most: int = 100) -> str:
    """A client's text echoed in an error: its first ``most`` characters."""
    return text if len(text) <= most else text[:most] + "..."


def _phase(request: Request, name: str) -> None:
    """Records the phase ``name`` as the time since the handler started (for "read": the body read and parsed)."""
    request.state.phases[name] = time.perf_counter() - request.state.started


def _answered(request: Request, answered: Answered, back: float) -> None:
    """The phases :meth:`Service.predict` measured, and the answer's build since it returned."""
    phases = request.state.phases
    phases.update(answered.phases)
    phases["answer"] += time.perf_counter() - back
    request.state.waits = answered.waits


# ---- Open Inference Protocol v2 --------------------------------------------------------------------------------


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


def _exit_parameters(request: loop.ExitRequest, truncated: List[bool]) -> Dict:
    """What ran, for the response's ``parameters`` (OIP parameters are scalars)."""
    out = {"policy": request.policy or "none", "truncated": int(sum(truncated))}
    if request.threshold is not None:
        out["threshold"] = request.threshold
    if request.exit_layer is not None:
        out["exit_layer"] = request.exit_layer
    return out


@answers("infer")
async def infer(request: Request, service: Service) -> Response:
    _check_model(service, request)
    body = await read_body(request, service.settings.max_body_bytes, service.settings.read_timeout)
    req = protocol.parse_infer(body, request.headers.get("inference-header-content-length"), service.output_names())
    protocol.check_texts(service.engine.texts_per_input, req.texts, "infer")
    _phase(request, "read")
    answered = await service.predict(req.texts, req.params, functools.partial(disconnected, request), req.deadline)
    back = time.perf_counter()
    truncated = [p.truncated for p in answered.predictions]
    # why each input left where it did, beside its exit layer (OIP parameters are scalars: one per input, in order)
    reasons = {"exit_layer": {"exit_reason": ",".join(map(str, answered.exit_reason))}}
    content, header = protocol.infer_response(service.settings.model_name, VERSION, req,
                                              _tensors(service, answered, truncated),
                                              _exit_parameters(answered.request, truncated), service.labels, reasons)
    _answered(request, answered, back)
    if header is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(header)})


@answers("metadata")
async def model_metadata(request: Request, service: Service) -> Response:
    _check_model(service, request)
    return JSONResponse(service.metadata())


@answers("metadata")
async def model_config(request: Request, service: Service) -> Response:
    _check_model(service, request)
    return JSONResponse(service.config())


@answers("metadata")
async def model_stats(request: Request, service: Service) -> Response:
    if "name" in request.path_params:
        _check_model(service, request)
    return JSONResponse(service.statistics())


@answers("ready")
async def model_ready(request: Request, service: Service) -> Response:
    _check_model(service, request)
    return Response(status_code=200 if service.ready else 503)


async def live(request: Request) -> Response:
    return Response(status_code=200)


async def ready(request: Request) -> Response:
    return Response(status_code=200 if _service(request).ready else 503)


async def server_metadata(request: Request) -> Response:
    return JSONResponse({"name": "acl-serve", "version": _package_version(),
                         "extensions": ["binary_tensor_data", "classification", "model_configuration",
                                        "statistics"]})


# ---- TEI ---------------------------------------------------------------------------------------------------------


@answers("predict", tei_shape=True)
async def predict(request: Request, service: Service) -> Response:
    body = await read_body(request, service.settings.max_body_bytes, service.settings.read_timeout)
    req = tei.parse_predict(body, request.headers.get("x-deadline-ms"))
    protocol.check_texts(service.engine.texts_per_input, req.texts, "predict", 422)
    _phase(request, "read")
    answered = await service.predict(req.texts, req.params, functools.partial(disconnected, request), req.deadline)
    back = time.perf_counter()
    if service.engine.regression:
        names, scores = ["score"], np.asarray([[p.label] for p in answered.predictions], dtype=np.float32)
    else:
        names, scores = service.labels, tei.scores(req, answered.logits)
    response = JSONResponse(tei.predict_response(req, names, scores, answered.exit_layer,
                                                 [p.truncated for p in answered.predictions], answered.exit_reason))
    _answered(request, answered, back)
    return response


async def health(request: Request) -> Response:
    """TEI's ``/health`` (and ``GET /``): 200, or 503 with TEI's ``Unhealthy`` error."""
    if _service(request).ready:
        return Response(status_code=200)
    return error(503, "unhealthy", True, "Unhealthy")


async def info(request: Request) -> Response:
    return JSONResponse(_service(request).info(_package_version()))


async def openapi(request: Request) -> Response:
    """Both inference routes and their request bodies, from the schema that validates them (built once: 4.9 ms a
    request when rebuilt each time)."""
    return Response(_openapi(_package_version()), media_type="application/json")


@functools.lru_cache(maxsize=1)
def _openapi(version: str) -> bytes:
    return JSONResponse(schema.openapi(version)).body


async def metrics(request: Request) -> Response:
    return Response(_service(request).metrics.exposition(), media_type=CONTENT_TYPE)


async def not_routed(request: Request, exc: HTTPException) -> Response:
    """Starlette's 404 and 405 as this server's ``{"error"}``."""
    path = _cut(request.url.path, 200)
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {path}"
    else:
        message = f"no route {path}: see /openapi.json for the inference routes"
    return error(exc.status_code, message, headers=exc.headers)


ROUTES = [
    Route("/v2", server_metadata),
    Route("/v2/health/live", live),
    Route("/v2/health/ready", ready),
    Route("/v2/models/stats", model_stats),
    Route("/v2/models/{name}", model_metadata),
    Route("/v2/models/{name}/versions/{version}", model_metadata),
    Route("/v2/models/{name}/config", model_config),
    Route("/v2/models/{name}/versions/{version}/config", model_config),
    Route("/v2/models/{name}/stats", model_stats),
    Route("/v2/models/{name}/versions/{version}/stats", model_stats),
    Route("/v2/models/{name}/ready", model_ready),
    Route("/v2/models/{name}/versions/{version}/ready", model_ready),
    Route("/v2/models/{name}/infer", infer, methods=["POST"]),
    Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
    Route("/predict", predict, methods=["POST"]),
    Route("/", predict, methods=["POST"]),  # TEI serves a classifier's /predict at / too (and GET / is health)
    Route("/", health, methods=["GET"]),
    Route("/health", health),
    Route("/info", info),
    Route("/metrics", metrics),
    Route("/openapi.json", openapi),
]


def build_app(service: Service) -> Starlette:
    """The routes over ``service``; gzip answers for clients that accept them."""
    handlers = {404: not_routed, 405: not_routed, Exception: unexpected}
    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers=handlers,
                    middleware=[Middleware(Edges), Middleware(GZipMiddleware, minimum_size=1024, compresslevel=5)])
    # a path with a trailing slash is unrouted (404), never a 307 to a URL built from the client's Host header
    app.router.redirect_slashes = False
    app.state.service = service
    return app


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("acl_fairseq")
    except Exception:  # not installed (run from a checkout)
        return "0"
