#!/usr/bin/env python3
"""Where one acl-serve worker's CPU outside the model goes, at saturation.

    python benchmarks/serve_cpu_split.py FOLDER [--precision int8] [--seconds 8] [--concurrency 32] [--profile]
        [--split-waves on off] [--rounds 3] [--json OUT.json [--force]]

One worker in this process, served as acl-serve serves it (uvicorn's h11 with TCP_NODELAY, the Starlette app of
:mod:`acl_runtime.serve.app`, the header and body timeouts), and benchmarks/load/client.py in a process of its own,
closed-loop (``--concurrency`` connections, one SST-2 dev sentence a request, OIP v2), for ``--seconds``. Reported:
requests/s, the worker's CPU seconds (this process) and its model calls' (``acl_model_cpu_seconds_total``), the
CPU milliseconds a request outside the model and their share of the worker's, and each layer's padded share of the
model calls' positions (``acl_padded_tokens_total`` / ``acl_tokens_total``), and where the model's thread's busy time
goes (``model_thread``: its calls on and off the CPU, its Python between calls, its waits for the GIL or a core
between calls). ``--split-waves on off`` serves the
worker with and without acl-serve's ``--split-waves`` in ``--rounds`` interleaved rounds (``harness.rounds``,
rotated), each round a fresh worker; the JSON keeps every run and each system's medians.

``--profile`` runs cProfile on the event loop's thread and on the scheduler's, each with its own thread's CPU clock
(not wall time: a thread waiting for the GIL is not busy), and splits the CPU outside the model into parts
(:data:`PARTS`, matched on each function's file and name; the model's calls and the waits left out). Profiling
slows pure Python more than C, so its shares lean towards Python, and its milliseconds are not the unprofiled
ones: measure without ``--profile`` for those.
"""
import contextlib
import cProfile
import json
import os
import pstats
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Dict, Optional

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
# (part, predicate on (file, function name)), first match wins; a function matching none is "builtins and other"
PARTS = [
    ("waiting (left out)", lambda f, n: "epoll" in n or "acquire" in n),
    ("model (left out)", lambda f, n: "onnxruntime" in f or "onnxruntime" in n),
    ("socket syscalls", lambda f, n: "'send'" in n or "'recv'" in n),
    ("tokenization", lambda f, n: "tokenizers" in n or "tokenization.py" in f
     or ("engine.py" in f and ("encode" in n or "_text_ids" in n))),
    ("JSON", lambda f, n: "/json/" in f or "msgspec" in n or "schema.py" in f or "json" in n),
    ("metrics", lambda f, n: "prometheus_client" in f or "serve/metrics.py" in f),
    ("HTTP (uvicorn, h11)", lambda f, n: "h11" in f or "uvicorn" in f or "transport.py" in f),
    ("Starlette", lambda f, n: "starlette" in f),
    ("asyncio", lambda f, n: "asyncio" in f or "concurrent/futures" in f or "threading.py" in f
     or "_contextvars" in n),
    ("scheduler", lambda f, n: "scheduler" in f or "deadlines.py" in f or "loop.py" in f),
    ("numpy", lambda f, n: "numpy" in f or "numpy" in n or "ufunc" in n or "ndarray" in n),
    ("handlers", lambda f, n: "acl_runtime" in f),
]
OTHER = "builtins and other"


def part_of(filename: str, name: str) -> str:
    return next((part for part, match in PARTS if match(filename, name)), OTHER)


def split(profiles, requests: int) -> Dict[str, Dict[str, float]]:
    """``{part: {"ms_per_request", "share"}}`` of the profiled CPU outside the model (waits and model left out)."""
    seconds = Counter()
    for prof in profiles:
        for (filename, _, name), (_, _, own, _, _) in pstats.Stats(prof).stats.items():
            seconds[part_of(filename, name)] += own
    outside = {k: v for k, v in seconds.items() if not k.endswith("(left out)")}
    total = sum(outside.values()) or 1.0
    return {k: {"ms_per_request": 1000 * v / max(requests, 1), "share": v / total}
            for k, v in sorted(outside.items(), key=lambda kv: -kv[1])}


def padded_shares(metrics) -> Dict[str, float]:
    """Each layer's padded positions over its positions, from the worker's own counters."""
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    read = lambda name: {k: float(v) for k, v in re.findall(name + r'\{layer="(\d+)"\} (\S+)', text)}  # noqa: E731
    tokens, padded = read("acl_tokens_total"), read("acl_padded_tokens_total")
    return {k: padded.get(k, 0.0) / v for k, v in tokens.items() if v > 0}


def profile_scheduler(profile: cProfile.Profile) -> None:
    """Profile the scheduler's thread (its CPU time) for as long as it runs."""
    from acl_runtime import scheduler as scheduler_module

    plain = scheduler_module.Scheduler._run

    def profiled(self):
        profile.enable()
        try:
            plain(self)
        finally:
            profile.disable()
    scheduler_module.Scheduler._run = profiled


@contextlib.contextmanager
def step_clock(totals: Dict[str, float]):
    """While inside: the scheduler's steps' wall and thread CPU seconds summed into ``totals`` (``step_wall_s``,
    ``step_cpu_s``). With the model calls' own wall and CPU (/metrics), the model's thread's time splits into its
    calls on the CPU, its calls off it (the GIL taken back after ONNX Runtime, other processes), its Python between
    calls, and its waits for the GIL between calls: what a front end in a process of its own could give back."""
    from acl_runtime import scheduler as scheduler_module

    plain = scheduler_module.Scheduler.step
    totals.update(step_wall_s=0.0, step_cpu_s=0.0)

    def clocked(self):
        start = harness.thread_now()
        try:
            return plain(self)
        finally:
            end = harness.thread_now()
            totals["step_wall_s"] += end[0] - start[0]
            totals["step_cpu_s"] += end[1] - start[1]
    scheduler_module.Scheduler.step = clocked
    try:
        yield totals
    finally:
        scheduler_module.Scheduler.step = plain


def model_thread(totals: Dict[str, float], model_wall: float, model_cpu: float) -> Dict[str, float]:
    """Shares of the model's thread's busy wall time (its steps): in calls on / off the CPU, between calls on the
    CPU (the scheduler's Python) and off it (waiting for the GIL or a core)."""
    wall = max(totals["step_wall_s"], 1e-9)
    between_wall, between_cpu = totals["step_wall_s"] - model_wall, totals["step_cpu_s"] - model_cpu
    return {"calls_on_cpu": model_cpu / wall, "calls_off_cpu": (model_wall - model_cpu) / wall,
            "between_on_cpu": between_cpu / wall, "between_off_cpu": (between_wall - between_cpu) / wall}


def one_worker(args, split_waves: bool = True):
    """(service, uvicorn server, port): one worker in this process, configured as acl-serve configures it."""
    import uvicorn

    from acl_runtime.serve.app import build_app
    from acl_runtime.serve.service import Service, Settings
    from acl_runtime.serve.transport import NoDelayH11Protocol

    service = Service(Settings(folder=args.folder, precision=args.precision, threads=1, split_waves=split_waves))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(build_app(service), host="127.0.0.1", port=port, log_level="warning", access_log=False,
                            http=NoDelayH11Protocol, loop="asyncio", lifespan="on")
    config.acl_read_timeout = 30.0
    return service, uvicorn.Server(config), port


def drive(args, texts, service, server, port: int, tmp: str, result: Dict) -> None:
    """The closed-loop client process against the started server, then the server told to stop; ``result`` gets
    this process's CPU seconds, the model's and the client's counts."""
    while not server.started:
        time.sleep(0.05)
    spec = {"host": "127.0.0.1", "port": port, "model": "acl", "texts": texts, "mode": "closed",
            "order": list(range(len(texts))) * 100, "concurrency": args.concurrency,
            "max_seconds": args.seconds, "drain_seconds": 5, "tag": "cpu"}
    with open(os.path.join(tmp, "spec.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f)
    metrics = service.metrics
    cpu, model, model_wall = harness.now()[1], metrics.model_cpu._value.get(), metrics.model_seconds._value.get()
    with step_clock({}) as steps:
        subprocess.run([sys.executable, os.path.join(HERE, "load", "client.py"), os.path.join(tmp, "spec.json"),
                        os.path.join(tmp, "out.json")], check=True)
    result.update(worker_cpu_s=harness.now()[1] - cpu, model_cpu_s=metrics.model_cpu._value.get() - model)
    result["model_thread"] = model_thread(steps, metrics.model_seconds._value.get() - model_wall,
                                          result["model_cpu_s"])
    with open(os.path.join(tmp, "out.json"), encoding="utf-8") as f:
        out = json.load(f)
    result.update(requests=sum(r["status"] == 200 for r in out["records"]), seconds=out["end"],
                  failed=sum(r["status"] != 200 for r in out["records"]))
    server.should_exit = True


def run(args, texts, split_waves: bool = True) -> Dict:
    profiles = {"loop": cProfile.Profile(time.thread_time), "scheduler": cProfile.Profile(time.thread_time)}
    if args.profile:
        profile_scheduler(profiles["scheduler"])
    service, server, port = one_worker(args, split_waves)
    result, tmp = {}, tempfile.mkdtemp(prefix="cpu_split_")
    threading.Thread(target=drive, args=(args, texts, service, server, port, tmp, result), daemon=True).start()
    if args.profile:
        profiles["loop"].enable()
    server.run()
    if args.profile:
        profiles["loop"].disable()
    n, outside = result["requests"], result["worker_cpu_s"] - result["model_cpu_s"]
    result.update(requests_per_s=n / result["seconds"], outside_ms_per_request=1000 * outside / max(n, 1),
                  model_ms_per_request=1000 * result["model_cpu_s"] / max(n, 1),
                  outside_share=outside / result["worker_cpu_s"], padded_share=padded_shares(service.metrics))
    if args.profile:
        paths = []
        for name, prof in profiles.items():
            paths.append(os.path.join(tmp, f"{name}.prof"))
            prof.dump_stats(paths[-1])
        result["profiled_split"] = split(paths, n)
    return result


MEDIANS = ["requests_per_s", "outside_ms_per_request", "model_ms_per_request", "outside_share", "padded_share",
           "model_thread_off_cpu"]


def figure(result: Dict, key: str) -> float:
    """One of :data:`MEDIANS` from a run: the padded share is the layers' mean, the model's thread off the CPU its
    calls' and its waits between them."""
    if key == "padded_share":
        return statistics.mean(result[key].values() or [0.0])
    if key == "model_thread_off_cpu":
        return result["model_thread"]["calls_off_cpu"] + result["model_thread"]["between_off_cpu"]
    return result[key]


def medians(runs: Dict[str, list]) -> Dict[str, Dict[str, float]]:
    """Each system's median of every run's figures (:func:`figure`)."""
    out = {}
    for name, results in runs.items():
        row = {}
        for key in MEDIANS:
            values = [figure(r, key) for r in results]
            row[key] = statistics.median(values)
        out[name] = row
    return out



def parse_args(argv=None):
    p = harness.parser(__doc__, json=True)
    p.add_argument("folder", help="an exported OUT/onnx folder")
    p.add_argument("--precision", default="fp32", choices=["fp32", "int8"])
    p.add_argument("--seconds", type=float, default=8.0, help="of closed-loop load (default 8)")
    p.add_argument("--concurrency", type=int, default=32, help="client connections (default 32)")
    p.add_argument("--profile", action="store_true", help="split the CPU outside the model by cProfile")
    p.add_argument("--texts", help="one text a line (default: SST-2 dev, GLUE_DIR)")
    p.add_argument("--split-waves", nargs="+", choices=["on", "off"], default=["on"],
                   help="the worker's --split-waves, each a system (default: on, as acl-serve)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every system (default 1)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.concurrency < 1 or args.rounds < 1:
        p.error("--seconds must be > 0, --concurrency and --rounds at least 1")
    if args.profile and (args.rounds > 1 or len(args.split_waves) > 1):
        p.error("--profile profiles one run: one --split-waves and one round")
    return args


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    if args.texts:
        with open(args.texts, encoding="utf-8") as f:
            texts = [line.rstrip("\n") for line in f if line.strip()]
    else:
        import _glue_runs  # benchmarks/ is on the path of a script run by path

        texts = list(_glue_runs.dev_rows("SST-2")[0])
    setup = harness.header("serve_cpu_split", precision=args.precision, seconds=args.seconds,
                           concurrency=args.concurrency, rounds=args.rounds)
    runs: Dict[str, list] = {name: [] for name in args.split_waves}
    try:
        for _, order in harness.rounds(args.split_waves, args.rounds):
            for name in order:
                runs[name].append(run(args, texts, split_waves=name == "on"))
                print(f"split-waves {name}: " + json.dumps({k: v for k, v in runs[name][-1].items()
                                                             if k != "profiled_split"}), flush=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"serve_cpu_split.py: {e}", file=sys.stderr)
        return 2
    result = {"benchmark": "serve_cpu_split", "setup": setup, "runs": runs, "medians": medians(runs)}
    if len(runs) == 1 and args.rounds == 1:
        result.update(next(iter(runs.values()))[0])  # one run: its figures at the top, as before
    harness.print_table([{"split_waves": name, **row} for name, row in result["medians"].items()],
                        ["split_waves", *MEDIANS], {k: "{:.3f}" for k in MEDIANS})
    if args.json:
        harness.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
