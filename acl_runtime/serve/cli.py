"""``acl-serve``: an exported OUT/onnx folder as an HTTP service, with early exit and a refilling scheduler.

    acl-serve OUT/onnx [--host 127.0.0.1] [--port 8080] [--model-name acl] [--precision fp32|int8]
        [--policy P --threshold T] [--max-batch 32] [--max-queue ROWS] [--workers N] [--threads 1]
        [--max-body-bytes 1048576] [--refill | --no-refill] [--slo-ms MS] [--deadline-policy answer|fail|delay]
        [--drain-seconds 30] [--read-timeout 30]

Routes: the Open Inference Protocol v2 (``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/NAME``,
``POST /v2/models/NAME/infer``), text-embeddings-inference's ``POST /predict``, and ``/metrics`` (Prometheus).
Each request may name its own ``policy``, ``threshold`` or ``exit_layer``; without them the flags decide, else the
folder's serving policy, else the last exit. Needs onnxruntime, tokenizers, numpy, starlette, uvicorn and
prometheus-client (``pip install .[serve]``), never torch or fairseq.
"""
import argparse
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import time
from typing import List, Optional

from acl_runtime import calibration, console, deadlines, exits, manifest, paths
from acl_runtime.console import UsageError, positive_int

SETTINGS_ENV = "ACL_SERVE_SETTINGS"  # a worker process's Settings, as JSON (--workers N)
EXIT_STATUSES = ("Exit status: 0 after SIGTERM or Ctrl-C once every accepted request is answered (the server stops "
                 "accepting at once, answers a connection without a request 503, and waits up to --drain-seconds, "
                 "past which the rest are answered 503); 2 for a bad flag or folder, or a port in use, "
                 "before anything listens; 1 (--workers N) when no worker could serve (each failed to start 3 "
                 "times in a row) or one was killed still running past the drain's bound.")
MAX_READ_TIMEOUT = 60.0


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a whole number from 0 to 65535 (0: any free one)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acl-serve", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2].rstrip() + "\n\n" + EXIT_STATUSES)
    p.add_argument("folder", help="a folder that acl-export --format onnx wrote (OUT/onnx)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine "
                   "only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=_port, default=8080, help="TCP port (default: %(default)s)")
    p.add_argument("--model-name", type=_model_name, default="acl", help="the model's name in /v2/models/NAME: "
                   "letters, digits, '_', '-' and '.', starting with a letter or digit (default: %(default)s)")
    p.add_argument("--precision", choices=manifest.PRECISIONS, default="fp32", help="the folder's fp32 graphs or the "
                   "int8 copy that acl-export --quantize int8 wrote (default: %(default)s)")
    p.add_argument("--policy", choices=calibration.policy_choices(), help="the default early-exit policy (a request "
                   "may name its own). Default: the folder's serving policy, else none (the last exit)")
    p.add_argument("--threshold", type=float, help="the --policy's threshold. " + "; ".join(
        f"{r.name}: {r.rule}, {r.range_text}, default {r.default:g}" for r in exits.POLICIES.values()))
    p.add_argument("--max-batch", type=positive_int, default=32, help="rows per backend call (default: %(default)s)")
    p.add_argument("--max-queue", type=positive_int, help="inputs accepted and not yet answered, per worker; past "
                   "it a request is answered 503 with Retry-After (default: 32 x --max-batch)")
    p.add_argument("--workers", type=positive_int, default=1, help="server processes, each with its own engine "
                   "and scheduler, sharing the port (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=1, help="ONNX Runtime threads per worker (default: "
                   "%(default)s)")
    p.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="larger request bodies are "
                   "refused with 413 (default: %(default)s)")
    p.add_argument("--refill", action=argparse.BooleanOptionalAction, default=True, help="continuous batching "
                   "across layers (--no-refill: each batch runs to its end, shrinking as rows exit; default: on)")
    p.add_argument("--split-waves", action=argparse.BooleanOptionalAction, default=True, help="with --refill, a "
                   "wave of unlike lengths runs as several calls of like lengths where the worker's own measured "
                   "cost of a call says the padding saved pays for the calls added (--no-split-waves: one padded "
                   "wave; default: on)")
    p.add_argument("--slo-ms", type=_slo_ms, help="a latency objective in milliseconds, from a request's "
                   "tokenized rows to its answer, the deadline of a request that gives none of its own (Triton's "
                   "\"timeout\" parameter in microseconds, /predict's deadline_ms, the X-Deadline-Ms header): the "
                   "scheduler runs first the layer whose waiting row would otherwise miss it, and --deadline-policy "
                   "says what a deadline does beyond that. Default: none, batches as the load allows")
    p.add_argument("--deadline-policy", choices=list(deadlines.POLICIES), default="answer", help="what a request's "
                   "deadline does: " + "; ".join(f"{k}: {v}" for k, v in deadlines.POLICIES.items())
                   + " (default: %(default)s)")
    p.add_argument("--drain-seconds", type=float, default=30.0, help="on SIGTERM, how long the accepted requests "
                   "may take to be answered before the server exits anyway (default: %(default)s)")
    p.add_argument("--read-timeout", type=_read_timeout, default=30.0, help="seconds a request's headers may take "
                   "to arrive, and then its body; past it the answer is 408 and the connection is closed (default: "
                   f"%(default)s, at most {MAX_READ_TIMEOUT:g})")
    return p


MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
ROUTED_NAMES = ("stats",)  # /v2/models/stats is the statistics of every model: a model of that name had no metadata


def _model_name(text: str) -> str:
    """A name that every /v2/models/NAME route can serve: not empty, no '/', no name a route takes."""
    if not MODEL_NAME.fullmatch(text) or text in ROUTED_NAMES:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a model name is 1 to 128 letters, digits, '_', '-' or '.', "
                                         f"starting with a letter or digit, and not {', '.join(ROUTED_NAMES)} "
                                         "(no /v2/models route could serve it)")
    return text


def _slo_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: milliseconds above 0, e.g. 20")
    return value


def _read_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_READ_TIMEOUT:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds above 0 and at most {MAX_READ_TIMEOUT:g} (a slow client "
                                         "holds a connection that long)")
    return value


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a port in use is one line and exit 2, and no banner."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is in use (another acl-serve?): stop it or choose another "
                             "--port") from None
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror or e}): choose another --host or --port") \
            from None
    sock.set_inheritable(True)  # the --workers processes receive it
    return sock


def settings_from(args):
    from acl_runtime.serve.app import Settings

    max_queue = args.max_queue or 32 * args.max_batch
    if max_queue < args.max_batch:
        raise UsageError(f"--max-queue {max_queue} is below --max-batch {args.max_batch}: a batch could never fill; "
                         "raise --max-queue")
    return Settings(os.path.abspath(args.folder), args.model_name, args.precision, args.policy, args.threshold,
                    args.max_batch, max_queue, args.max_body_bytes, args.refill, args.threads, args.drain_seconds,
                    args.read_timeout, args.slo_ms, args.deadline_policy, args.split_waves)


def load_service(settings):
    """The worker's :class:`~acl_runtime.serve.app.Service`; a bad folder or flag is a :class:`UsageError`."""
    from acl_runtime import engine
    from acl_runtime.serve.app import Service

    try:
        return Service(settings)
    except (OSError, ValueError, engine.RuntimeMissing) as e:
        raise UsageError(str(e)) from None


def worker_app():
    """The app of one ``--workers`` process (uvicorn's factory, in a fresh interpreter): the model the supervisor
    pinned at start, else a one-line reason in the log and the worker's exit (``supervisor.CANNOT_SERVE``,
    ``OTHER_MODEL``), which the supervisor tells apart."""
    from acl_runtime.serve import supervisor

    console.setup_logging("WARNING")
    fields = json.loads(os.environ[SETTINGS_ENV])
    try:
        supervisor.check_pinned(fields["folder"], fields["precision"])  # before the web stack and the engine load
        from acl_runtime.serve.app import Settings, build_app

        settings = Settings(**fields)
        service = load_service(settings)
        supervisor.check_pinned(settings.folder, settings.precision)  # not replaced while it loaded
    except UsageError as e:
        logging.getLogger("acl_runtime.serve").error("acl-serve: worker %d cannot serve: %s", os.getpid(), e)
        raise
    return build_app(service)


def main(argv: Optional[List[str]] = None) -> int:
    started = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    console.check_request_flags(parser, args)
    paths.check(args.folder, (paths.ONNX,), "acl-serve")  # a checkpoint, OUT, a manifest.json: what to pass
    settings = settings_from(args)
    sock = bind(args.host, args.port)  # before the model loads: a port in use is one line, no banner
    try:
        return _serve(args, settings, sock, started)
    finally:
        sock.close()


def _serve(args, settings, sock: socket.socket, started: float) -> int:
    from acl_runtime.serve.app import build_app

    # the worker processes load their own; this one checks the folder and flags first, so that a bad one is one
    # line and exit 2 rather than N workers failing, and pins the model it checked (every worker serves that one)
    service = load_service(settings)
    default = service.default
    loaded = time.perf_counter()
    app = build_app(service) if args.workers == 1 else None
    del service  # with N workers this process keeps no model
    config = _uvicorn_config(args, settings, app)
    policy = "last exit" if default.policy is None else f"{default.policy} {default.threshold:g} ({default.source})"
    # the socket listens already (bind): a client connecting once this line is out is served
    print(f"acl-serve: {settings.model_name} from {settings.folder} ({settings.precision}, {policy}; refill "
          f"{'on' if settings.refill else 'off'}, max batch {settings.max_batch}, max queue {settings.max_queue}) on "
          f"http://{args.host}:{sock.getsockname()[1]} with {args.workers} worker(s); loaded in "
          f"{loaded - started:.2f} s", file=sys.stderr, flush=True)
    return _run_until_drained(args, settings, config, sock)


def _uvicorn_config(args, settings, app):
    """uvicorn's Config: ``app`` served in this process, or (``app`` None, --workers N) N worker processes, each
    building its own from the settings and pin passed in the environment."""
    import uvicorn

    from acl_runtime.serve import supervisor
    from acl_runtime.serve.transport import NoDelayH11Protocol

    config = dict(host=args.host, port=args.port, log_level=os.environ.get("LOGLEVEL", "warning").lower(),
                  access_log=False, timeout_graceful_shutdown=settings.drain_seconds, lifespan="on",
                  http=NoDelayH11Protocol, loop="asyncio")  # the stop (stopping.py) is built on asyncio's own loop
    if app is None:
        os.environ[SETTINGS_ENV] = json.dumps(settings._asdict())
        os.environ[supervisor.PIN_ENV] = _digest(settings)
        # prometheus-client's multiprocess mode: each worker writes its values in this folder, /metrics sums them
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = supervisor.metrics_folder()
        config = uvicorn.Config("acl_runtime.serve.cli:worker_app", factory=True, workers=args.workers, **config)
    else:
        config = uvicorn.Config(app, **config)
    config.acl_read_timeout = settings.read_timeout  # the headers' deadline (serve/transport.py); pickled to workers
    return config


def _run_until_drained(args, settings, config, sock: socket.socket) -> int:
    """Serve until SIGTERM or Ctrl-C, then drain: 0 once every accepted request is answered."""
    from acl_runtime.serve import supervisor
    from acl_runtime.serve.stopping import Server

    # uvicorn handles SIGTERM and SIGINT while it serves, then re-raises the signal under the handler found before
    # it: this one, so that a drained server exits 0 instead of dying by the signal
    drained = []
    signal.signal(signal.SIGTERM, lambda signum, frame: drained.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: drained.append(signum))
    if args.workers > 1:
        try:  # the supervisor passes SIGTERM to every worker at once, each drains, and it joins them (bounded)
            return supervisor.Supervisor(config, [sock], settings.drain_seconds).run()
        finally:
            shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    Server(config).run(sockets=[sock])  # stops accepting the moment SIGTERM comes (serve/stopping.py)
    return 0


def _digest(settings) -> str:
    from acl_runtime.serve.supervisor import model_digest

    try:
        return model_digest(settings.folder, settings.precision)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{settings.folder}: cannot be read ({e})") from None


def cli_main() -> None:
    console.setup_logging("WARNING")
    console.run("acl-serve", main)


if __name__ == "__main__":
    cli_main()
