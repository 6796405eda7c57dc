"""acl-serve --workers 2 under process faults: for each case, a client sends /v2/health/ready on a new connection at
a fixed rate while the fault happens, and counts what came back (200, another status, refused, lost: reset or no
answer within 3 s), then how acl-serve ended. The figures of docs/serve.md's fault table.

    python benchmarks/serve_faults.py --folder OUT/onnx [--rate 40] [--seconds 6] [--cases hup ttou ...]
        [--json PATH [--force]]
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import List

import harness
from acl_runtime.io import atomic
from load import server

CASES = ("hup", "ttou", "term-worker", "kill-worker", "reexport-kill-worker", "delete-kill-workers",
         "kill-9-supervisor", "term-then-stop-worker")


def workers(pid: int):
    """The uvicorn workers of acl-serve's supervisor ``pid`` (not multiprocessing's resource tracker)."""
    return [child for child in server.process_tree(pid)[1:]
            if "spawn_main" in server.cmdline(child) and "resource_tracker" not in server.cmdline(child)]


def _ask(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=3) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except (urllib.error.URLError, ConnectionError, socket.timeout, OSError) as e:
        reason = getattr(e, "reason", e)
        return "refused" if isinstance(reason, ConnectionRefusedError) else "lost"


def _client(url: str, rate: float, until: float, out: list) -> None:
    """One request every 1/rate s on a new connection, each in its own thread (a lost one does not hold the
    others back)."""
    threads, at = [], harness.now()[0]
    while at < until:
        thread = threading.Thread(target=lambda: out.append(_ask(url)))
        thread.start()
        threads.append(thread)
        at += 1 / rate
        time.sleep(max(0.0, at - harness.now()[0]))
    for thread in threads:
        thread.join(10)


def _start(case: str, served: str, work: str):
    """``(process, url, log lines)`` of acl-serve with two workers on ``served``, once both workers serve."""
    port = server.free_port()
    url = f"http://127.0.0.1:{port}"
    drain = ["--drain-seconds", "1"] if case == "term-then-stop-worker" else []
    proc = subprocess.Popen([sys.executable, "-m", "acl_runtime.serve.cli", served, "--workers", "2", "--port",
                             str(port), *drain], stderr=subprocess.PIPE, text=True, env=dict(os.environ,
                                                                                         TMPDIR=work))
    log = []
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
    deadline = harness.now()[0] + 60
    while len(workers(proc.pid)) < 2 or _ask(url) != "200":
        if harness.now()[0] > deadline or proc.poll() is not None:
            raise SystemExit(f"{case}: acl-serve did not start: {''.join(log)[-2000:]}")
        time.sleep(0.1)
    time.sleep(2)  # both workers serve
    return proc, url, log


def _inject(case: str, proc, pids: List[int], served: str, work: str) -> None:
    """The fault ``case`` names, done to the supervisor ``proc``, its workers ``pids`` or the served folder."""
    if case == "hup":
        proc.send_signal(signal.SIGHUP)
    elif case == "ttou":
        proc.send_signal(signal.SIGTTOU)
    elif case == "term-worker":
        os.kill(pids[0], signal.SIGTERM)
    elif case == "kill-worker":
        os.kill(pids[0], signal.SIGKILL)
    elif case == "reexport-kill-worker":
        aside = shutil.copytree(served, os.path.join(work, "new"))
        with open(os.path.join(aside, "manifest.json")) as f:
            manifest = json.load(f)
        manifest.update(policy="entropy", threshold=0.5)
        with open(os.path.join(aside, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        atomic.replace_folder(aside, served)  # as acl-export --force replaces OUT/onnx
        os.kill(pids[0], signal.SIGKILL)
    elif case == "delete-kill-workers":
        shutil.rmtree(served)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    elif case == "kill-9-supervisor":
        proc.kill()
    elif case == "term-then-stop-worker":
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.02)
        os.kill(pids[0], signal.SIGSTOP)


def _stop(case: str, proc, pids: List[int]):
    """``(exit code or what kept it, workers running when the client ended)``: the cases that end the server are
    waited for, the others are sent SIGTERM; a server still running is killed."""
    try:
        code = proc.wait(timeout=60) if case in ("delete-kill-workers", "kill-9-supervisor",
                                                 "term-then-stop-worker") else None
    except subprocess.TimeoutExpired:
        code = "still running after 60 s"
    left = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    if code is None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = "still running 60 s after SIGTERM"
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return code, left


def run_case(case: str, folder: str, rate: float, seconds: float) -> dict:
    work = tempfile.mkdtemp(prefix="serve_faults_")
    served = shutil.copytree(folder, os.path.join(work, "onnx"))
    proc, url, log = _start(case, served, work)
    statuses, started = [], harness.now()[0]
    client = threading.Thread(target=_client, args=(url, rate, started + seconds, statuses))
    client.start()
    time.sleep(0.5)
    pids = workers(proc.pid)
    _inject(case, proc, pids, served, work)
    signalled = harness.now()[0]
    client.join()
    code, left = _stop(case, proc, pids)
    ended = harness.now()[0] - signalled
    time.sleep(0.5)
    orphans = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and
               open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    text = "".join(log)
    shutil.rmtree(work, ignore_errors=True)
    counts = {k: statuses.count(k) for k in sorted(set(statuses))}
    return {"case": case, "sent": len(statuses), "answers": counts, "exit": code, "seconds_to_exit": round(ended, 1),
            "workers_left_after_exit": len(orphans), "log_lines": text.count("\n"),
            "accept_errors": text.count("Errno 22"), "running_at_client_end": len(left)}


def main(argv=None) -> int:
    p = harness.parser(__doc__, json="the rows as JSON (default: none, the table only)")
    p.add_argument("--folder", required=True, help="the acl-export OUT/onnx folder acl-serve --workers 2 serves")
    p.add_argument("--rate", type=float, default=40.0, help="requests per second during each case (default 40)")
    p.add_argument("--seconds", type=float, default=6.0, help="how long each case sends (default 6)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="the faults to cause (default: all)")
    args = p.parse_args(argv)
    rows = []
    for case in args.cases:
        rows.append(run_case(case, args.folder, args.rate, args.seconds))
        print(json.dumps(rows[-1]), flush=True)  # each case as it ends: a case takes seconds
    harness.report(rows, ["case", "sent", "answers", "exit", "seconds_to_exit", "workers_left_after_exit",
                          "accept_errors", "running_at_client_end"], {}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
