#!/usr/bin/env python3
"""acl-serve under load generators nobody here wrote: ``hey`` (Debian's package) sends one sentence to ``/predict``
at a fixed rate; beside it, serve_load's own client (benchmarks/load/client.py) at the same rate on the same
server (the OIP infer route), then Triton's perf_analyzer where one is found (``--perf-analyzer PATH``, else on
PATH; none: a one-line note and no rows), so that each generator checks the others' latency.

    python benchmarks/serve_hey.py --toy --rate 50 --seconds 10 --json /tmp/hey.json [--force]
    python benchmarks/serve_hey.py --folder OUT/onnx --rate 20 --seconds 2 --json /tmp/hey.json

Systems: the three generators, in turn for ``--rounds``, on one acl-serve (``--folder``, else serve_speed.py's
model; ``--toy`` its toy model). Measure: sent, answered, p50/p99 and throughput of each. Checks: every answer
counted by the server's /metrics (none lost), acl-serve exits 0 on SIGTERM. How each generator paces, and the
figures: docs/serve.md, "Load generators nobody here wrote".
"""
import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import _serving
import harness
from load import server, stats

COLUMNS = ["generator", "route", "round", "rate_per_s", "sent", "ok", "n_503", "errors", "throughput_per_s",
           "p50_ms", "p99_ms"]
FORMATS = {"rate_per_s": "{:.1f}", "throughput_per_s": "{:.1f}", "p50_ms": "{:.2f}", "p99_ms": "{:.2f}"}


def hey_row(csv_text: str, rate: float) -> Dict:
    """A row from hey's ``-o csv`` dump: one line per request (response-time s, ..., status-code, offset s)."""
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    ok = [r for r in rows if r["status-code"] == "200"]
    latency = [1000 * float(r["response-time"]) for r in ok]
    span = max((float(r["offset"]) + float(r["response-time"]) for r in ok), default=0.0) - \
        min((float(r["offset"]) for r in rows), default=0.0)
    statuses = [r["status-code"] for r in rows]
    return {"generator": "hey", "route": "/predict", "rate_per_s": rate, "sent": len(rows), "ok": len(ok),
            "n_503": statuses.count("503"), "errors": sum(1 for s in statuses if s not in ("200", "503")),
            "throughput_per_s": len(ok) / span if span > 0 else 0.0, "p50_ms": stats.percentile(latency, 50),
            "p99_ms": stats.percentile(latency, 99)}


def run_hey(hey: str, port: int, text: str, args) -> Dict:
    body = json.dumps({"inputs": text})
    cmd = [hey, "-z", f"{args.seconds:g}s", "-c", str(args.connections), "-q", f"{args.rate / args.connections:g}",
           "-m", "POST", "-T", "application/json", "-d", body, "-o", "csv", f"http://127.0.0.1:{port}/predict"]
    before = _answered(port)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 60)
    if proc.returncode:
        raise RuntimeError(f"serve_hey: hey failed ({proc.returncode}): {proc.stderr[-2000:]}")
    row = hey_row(proc.stdout, args.rate)
    row["server_counted"] = _answered(port) - before
    return row


# one request of perf_analyzer's --profile-export-file: its send time and its answer's (ns); the file is not JSON
# that json.loads reads, since it dumps binary output tensors raw into its strings
_EXPORTED = re.compile(rb'\{"timestamp":(\d+),"request_inputs":\{.*?\},"response_timestamps":\[(\d*)', re.DOTALL)


def perf_analyzer_row(export: bytes, rate: float) -> Dict:
    """A row from perf_analyzer's profile export: a request without an answer's timestamp is an error."""
    sent = [(int(a), int(b) if b else None) for a, b in _EXPORTED.findall(export)]
    done = [(a, b) for a, b in sent if b is not None]
    latency = [(b - a) / 1e6 for a, b in done]
    span = (max((b for _, b in done), default=0) - min((a for a, _ in sent), default=0)) / 1e9
    return {"generator": "perf_analyzer", "route": "/v2/models/acl/infer", "rate_per_s": rate, "sent": len(sent),
            "ok": len(done), "n_503": 0, "errors": len(sent) - len(done),
            "throughput_per_s": len(done) / span if span > 0 else 0.0, "p50_ms": stats.percentile(latency, 50),
            "p99_ms": stats.percentile(latency, 99)}


def find_perf_analyzer(path: Optional[str]) -> Tuple[Optional[str], str]:
    """(perf_analyzer's path or None, a one-line note when it is not found or cannot run: --perf-analyzer, else this
    environment's (scripts/setup_env.sh installs it), else PATH). Found but missing a shared library (make env
    installs the binary, the system its libraries): None, and the note names the Debian package that has it."""
    found = path or shutil.which(server.tool("perf_analyzer"))
    if not found:
        return None, ("serve_hey: perf_analyzer not found (--perf-analyzer PATH, make env, or on PATH; pip install "
                      "--no-deps 'tritonclient==2.48.0' nvidia-cuda-runtime-cu12): its rows are left out")
    lacking = missing_libraries(found)
    if lacking:
        packages = system_packages()
        named = ", ".join(f"{lib} (Debian: {packages[lib]})" if lib in packages else lib for lib in lacking)
        return None, (f"serve_hey: perf_analyzer cannot run: {named} not installed (scripts/system_packages.sh "
                      "installs it): its rows are left out")
    return found, ""


def missing_libraries(binary: str) -> List[str]:
    """The shared libraries ``binary`` links that the dynamic linker cannot find (``ldd``'s "=> not found"), with
    perf_analyzer's environment; [] where ldd is not there to ask (the run then says what failed)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    out = subprocess.run([ldd, binary], capture_output=True, text=True, env=_perf_analyzer_env(binary)).stdout
    return re.findall(r"^\s*(\S+) => not found", out, flags=re.M)


def system_packages() -> Dict[str, str]:
    """scripts/system_packages.tsv's rows as {command or library: Debian package}."""
    table = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                         "system_packages.tsv")
    with open(table, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    return {row[1]: row[2] for row in rows[1:]}


def _perf_analyzer_env(binary: str) -> Dict[str, str]:
    """The environment with pip's CUDA runtime (nvidia-cuda-runtime-cu12, beside the binary's install) on
    LD_LIBRARY_PATH: perf_analyzer links libcudart.so.12 even against an HTTP server."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(binary)))
    libs = glob.glob(os.path.join(root, "nvidia", "cuda_runtime", "lib")) + glob.glob(
        os.path.join(root, "lib", "python3*", "site-packages", "nvidia", "cuda_runtime", "lib"))
    paths = libs + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(paths)}


def run_perf_analyzer(binary: str, port: int, text: str, args, tmp: str, k: int) -> Dict:
    """perf_analyzer at ``--rate`` for rate x seconds requests (``--request-count``: one measurement, no
    stabilising windows), the sentence as ``--input-data`` (text only, so the optional text_pair is not sent),
    version 1 named (``-x 1``: without it perf_analyzer picks the version whose statistics' queue count grew, and
    stopped while this server left the queue count out)."""
    n = int(args.rate * args.seconds)
    data, export = os.path.join(tmp, "perf_analyzer_input.json"), os.path.join(tmp, f"perf_analyzer_{k}.json")
    with open(data, "w", encoding="utf-8") as f:
        json.dump({"data": [{"text": [text]}]}, f)
    cmd = [binary, "-m", "acl", "-x", "1", "-u", f"127.0.0.1:{port}", "-i", "http", "--input-data", data,
           "--request-rate-range", f"{args.rate:g}", "--request-count", str(n), "--max-threads",
           str(args.connections), "--profile-export-file", export]
    before = _answered(port, "infer")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 60,
                          env=_perf_analyzer_env(binary))
    if proc.returncode or not os.path.isfile(export):
        raise RuntimeError(f"serve_hey: perf_analyzer failed ({proc.returncode}): "
                           f"{(proc.stdout + proc.stderr)[-2000:]}")
    with open(export, "rb") as f:
        row = perf_analyzer_row(f.read(), args.rate)
    for q in (50, 99):  # its own summary, beside the export's (the JSON only): the same requests, its percentile
        found = re.search(rf"p{q} latency: (\d+) usec", proc.stdout)
        row[f"reported_p{q}_ms"] = int(found.group(1)) / 1000 if found else None
    row["server_counted"] = _answered(port, "infer") - before
    return row


def run_client(port: int, text: str, args, tmp: str) -> Dict:
    n = int(args.rate * args.seconds)
    spec = {"host": "127.0.0.1", "port": port, "model": "acl", "texts": [text], "order": [0] * n, "tag": "hey-ref",
            "max_seconds": args.seconds + 1, "drain_seconds": 30.0, "mode": "open",
            "offsets": [i / args.rate for i in range(n)]}
    summary = stats.summarize(server.drive(spec, tmp), args.rate, n)
    return {"generator": "serve_load client", "route": "/v2/models/acl/infer", "rate_per_s": args.rate,
            **{k: summary[k] for k in ("sent", "ok", "n_503", "errors", "throughput_per_s", "p50_ms", "p99_ms")}}


def _answered(port: int, route: str = "predict") -> float:
    """A route's 200s as the server counts them."""
    status, body = server.get(port, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(f'acl_requests_total{{route="{route}",status="200"}} '):
            return float(line.split()[-1])
    return 0.0


def parse_args(argv=None):
    p = harness.parser(__doc__, json=True)
    p.add_argument("--folder", help="an acl-export OUT/onnx folder to serve (default: serve_speed.py's model; --toy: "
                   "its toy model)")
    _serving.add_served_flags(p)
    p.add_argument("--rate", type=float, default=50.0, help="requests per second, both generators")
    p.add_argument("--seconds", type=float, default=10.0, help="how long each generator sends")
    p.add_argument("--connections", type=int, default=4, help="hey's workers (-c), each at rate / connections")
    p.add_argument("--rounds", type=int, default=1, help="hey, the client (and perf_analyzer) in turn, this many times")
    p.add_argument("--perf-analyzer", metavar="PATH", help="Triton's perf_analyzer (2.48.0), a third generator "
                   "(default: from PATH; none found: a note, no rows)")
    p.add_argument("--text", help="the sentence sent (default: the model's first dev sentence)")
    p.add_argument("--workers", type=int, default=1, help="acl-serve --workers")
    p.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    p.add_argument("--server", default=server.tool("acl-serve"), help="the acl-serve executable (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.json:
        p.error("--json PATH is required (the table is printed; the JSON keeps every row and the setup)")
    if args.rate <= 0 or args.seconds <= 0 or args.connections < 1 or args.rounds < 1:
        p.error("--rate and --seconds must be above 0, --connections and --rounds at least 1")
    if args.perf_analyzer and not os.access(args.perf_analyzer, os.X_OK):
        p.error(f"--perf-analyzer {args.perf_analyzer}: not an executable file")
    if args.rate * args.seconds < 1:
        p.error(f"--rate {args.rate:g} x --seconds {args.seconds:g} is under one request")
    return args


def _rounds(args, hey: str, perf_analyzer, folder: str, text: str):
    """``(rows, the server's stop record)``: one acl-serve, and per round hey, the Python client and perf_analyzer
    (where installed) in turn."""
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory(prefix="serve_hey_") as tmp:
        port, log = server.free_port(), os.path.join(tmp, "server.log")
        cmd = [args.server, folder, "--port", str(port), "--precision", args.precision, "--workers",
               str(args.workers), "--threads", "1"]
        proc = server.start_server(cmd, log, port, 120.0)
        try:
            for k in range(args.rounds):
                rows.append({**run_hey(hey, port, text, args), "round": k + 1})
                rows.append({**run_client(port, text, args, tmp), "round": k + 1})
                if perf_analyzer:
                    rows.append({**run_perf_analyzer(perf_analyzer, port, text, args, tmp, k), "round": k + 1})
        finally:
            stopped = server.stop_server(proc, 30.0)
    return rows, stopped


def main(argv=None) -> Dict:
    args = parse_args(argv)
    hey = shutil.which("hey")
    if hey is None:
        sys.exit("serve_hey: hey is not installed (Debian: apt-get install hey; scripts/system_packages.sh)")
    perf_analyzer, note = find_perf_analyzer(args.perf_analyzer)
    if note:
        print(note, file=sys.stderr)
    if args.folder:
        folder, sentences = args.folder, []
    else:
        folder, sentences = _serving.model_and_sentences(args)
    text = args.text or (sentences[0] if sentences else "the movie was good")
    rows, stopped = _rounds(args, hey, perf_analyzer, folder, text)
    lost = {g: [r for r in rows if r["generator"] == g and r["server_counted"] != r["ok"]]
            for g in ("hey", "perf_analyzer")}
    setup = harness.header("serve_hey", folder=folder, text=text, rate_per_s=args.rate, seconds=args.seconds,
                           connections=args.connections, workers=args.workers, precision=args.precision, hey=hey,
                           perf_analyzer=perf_analyzer, threads=1)
    record = {"benchmark": "serve_hey", "setup": setup, "rows": rows, "server": stopped,
              "checks": {"exit_0": stopped["exit_code"] == 0, "hey_answers_counted_by_server": not lost["hey"],
                         **({"perf_analyzer_answers_counted_by_server": not lost["perf_analyzer"]}
                            if perf_analyzer else {})}}
    harness.print_noted_table(rows, COLUMNS, FORMATS)
    harness.write_json(args.json, record)
    if not all(record["checks"].values()):
        sys.exit(f"serve_hey: a check failed: {record['checks']} (server exit {stopped['exit_code']})")
    return record


if __name__ == "__main__":
    main()
