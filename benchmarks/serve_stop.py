#!/usr/bin/env python3
"""What acl-serve does with connections when SIGTERM comes under load: clients open a new connection for each
``/predict``, SIGTERM is sent mid-stream, and every attempt is classed by when it started (before or after the
signal) and how it ended: refused at connect, or taken and then answered (200, 503) or dropped (reset, or closed
with no answer).

    python benchmarks/serve_stop.py --folder OUT/onnx [--workers 1 2] [--runs 3] --json /tmp/stop.json [--force]

Systems: acl-serve at each ``--workers``, ``--runs`` times. Promised (docs/serve.md, SIGTERM): no connection is taken
after the signal has been handled, and every connection taken gets an answer. Targets: none taken after SIGTERM and
dropped, none dropped at the signal, every exit 0. The columns: docs/benchmarks.md.
"""
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Dict, List

import harness
from load import server

COLUMNS = ["workers", "run", "before_200", "before_dropped", "dropped_at_signal", "after_refused", "after_taken",
           "after_dropped", "after_503", "last_taken_ms", "exit_code"]
FORMATS = {"last_taken_ms": "{:.1f}"}
BODY = b'{"inputs": [["the movie was good"], ["a dull plot"]]}'
REQUEST = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
           % (len(BODY), BODY))


def attempt(port: int) -> str:
    """One connection and one request: 'refused', the answer's status, or 'dropped'."""
    try:
        conn = socket.create_connection(("127.0.0.1", port), timeout=15)
    except OSError:
        return "refused"
    data = b""
    try:
        with conn:
            conn.sendall(REQUEST)
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
                if length and len(rest) >= length[0]:
                    break
    except OSError:
        return "dropped"
    return data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "dropped"


def one_run(args, workers: int, run: int, tmp: str) -> Dict:
    port, log = server.free_port(), os.path.join(tmp, "server.log")
    proc = server.start_server([args.server, args.folder, "--port", str(port), "--workers", str(workers),
                           "--drain-seconds", "10"], log, port, 120.0)
    time.sleep(0.5)
    sigterm, outcomes, lock = [None], [], threading.Lock()

    def client():
        while sigterm[0] is None or harness.now()[0] - sigterm[0] < args.after_seconds:
            start = harness.now()[0]
            outcome = attempt(port)
            with lock:
                outcomes.append((start, outcome, harness.now()[0]))
            if outcome == "refused":
                time.sleep(0.002)

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(args.before_seconds)
    sigterm[0] = harness.now()[0]
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join()
    code = proc.wait(60)
    return {"workers": workers, "run": run, **classify(outcomes, sigterm[0]), "exit_code": code,
            "log_tail": server.tail(log) if code else None}


def classify(outcomes: List[tuple], sigterm: float) -> Dict:
    """The counts of a run's ``(start, outcome, end)`` attempts around the signal. An attempt begun before it whose
    drop came after it was reset at the signal (a connection still in the listener's backlog when the server closed
    it: never taken), not in the server's steady state: ``dropped_at_signal``, apart from ``before_dropped``."""
    at_signal = sum(t < sigterm <= end and o == "dropped" for t, o, end in outcomes)
    before = Counter(o for t, o, end in outcomes if t < sigterm and not (o == "dropped" and end >= sigterm))
    after = [(t - sigterm, o) for t, o, _ in outcomes if t >= sigterm]
    taken = [(t, o) for t, o in after if o != "refused"]
    return {"before_200": before["200"], "before_dropped": before["dropped"], "dropped_at_signal": at_signal,
            "after_refused": sum(o == "refused" for _, o in after), "after_taken": len(taken),
            "after_dropped": sum(o == "dropped" for _, o in taken), "after_503": sum(o == "503" for _, o in taken),
            "last_taken_ms": 1000 * max((t for t, _ in taken), default=0.0),
            "before": dict(before), "after": dict(Counter(o for _, o in after))}


def targets(rows: List[Dict]) -> List[Dict]:
    """The promises, over every run: no connection taken after the signal goes unanswered, none completed before it
    is reset at the stop, and acl-serve exits 0."""
    return [harness.target("taken after SIGTERM, dropped unanswered", sum(r["after_dropped"] for r in rows), 0, False),
            harness.target("begun before SIGTERM, dropped at it", sum(r["dropped_at_signal"] for r in rows), 0, False),
            harness.target("runs whose server exited other than 0", sum(r["exit_code"] != 0 for r in rows), 0, False)]


def main(argv=None) -> List[Dict]:
    p = harness.parser(__doc__, json=True)
    p.add_argument("--folder", required=True, help="an acl-export OUT/onnx folder")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="acl-serve --workers")
    p.add_argument("--runs", type=int, default=3, help="runs per worker count")
    p.add_argument("--clients", type=int, default=16, help="client threads, a new connection per request")
    p.add_argument("--before-seconds", type=float, default=1.5, help="load before SIGTERM")
    p.add_argument("--after-seconds", type=float, default=1.0, help="attempts go on this long after it")
    p.add_argument("--server", default=server.tool("acl-serve"), help="the acl-serve executable (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.json:
        p.error("--json PATH is required")
    with tempfile.TemporaryDirectory(prefix="serve_stop_") as tmp:
        rows = [one_run(args, w, k + 1, tmp) for w in args.workers for k in range(args.runs)]
    setup = harness.header("serve_stop", clients=args.clients, before_seconds=args.before_seconds,
                           after_seconds=args.after_seconds, server=args.server, folder=args.folder, threads=None)
    harness.print_noted_table(rows, COLUMNS, FORMATS)
    found = targets(rows)
    harness.print_targets(found)
    harness.write_json(args.json, {"benchmark": "serve_stop", "setup": setup, "rows": rows, "targets": found})
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
