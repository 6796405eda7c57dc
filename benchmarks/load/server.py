"""The processes of benchmarks/serve_load.py: acl-serve on a free loopback port (started in a session of its own,
ready once /v2/health/ready answers, stopped by SIGTERM), its workers' peak memory from /proc, the client process
(benchmarks/load/client.py), and acl-predict's answers on the same sentences."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Dict, List, Optional

import harness

MODEL = "acl"


def server_command(args, refill: bool, precision: str, workers: int, folder: str, port: int) -> List[str]:
    """acl-serve on ``folder`` with serve_load's flags (``args``), one thread a worker."""
    return [args.server, folder, "--host", "127.0.0.1", "--port", str(port), "--model-name", MODEL,
            "--precision", precision, "--policy", args.policy, "--threshold", str(args.threshold),
            "--max-batch", str(args.max_batch), "--max-queue", str(args.max_queue), "--workers", str(workers),
            "--refill" if refill else "--no-refill", "--threads", "1",
            *(["--slo-ms", str(args.slo_ms)] if args.slo_ms else []), "--deadline-policy", args.deadline_policy]


def phase_spec(args, port: int, texts: List[str], order: List[int], tag: str, **kw) -> Dict:
    """One phase of the client (benchmarks/load/client.py): the sentences in ``order``, closed or open loop."""
    return {"host": "127.0.0.1", "port": port, "model": MODEL, "texts": texts, "order": order, "tag": tag,
            "max_seconds": args.max_seconds, "drain_seconds": args.drain_seconds, **kw}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, timeout: float = 5.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read()


def tail(path: str, n: int = 3000) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()[-n:]


def start_server(cmd: List[str], log: str, port: int, timeout: float) -> subprocess.Popen:
    """``cmd`` started in a session of its own (its workers with it), once /v2/health/ready answers 200."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = harness.now()[0] + timeout
    while harness.now()[0] < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve_load: {' '.join(cmd[:2])} exited ({proc.returncode}) before it was ready:\n"
                               f"{tail(log)}")
        try:
            if get(port, "/v2/health/ready", 2.0)[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    stop_server(proc, 5.0)
    raise RuntimeError(f"serve_load: the server was not ready within {timeout:.0f} s:\n{tail(log)}")


def stop_server(proc: subprocess.Popen, timeout: float) -> Dict:
    """SIGTERM, then its exit code and how long it took; its session (workers included) is killed past ``timeout``,
    and so is any process of it left behind once it exited (``left``: a worker that outlived its supervisor)."""
    t = harness.now()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return {"exit_code": proc.wait(), "stop_s": harness.since(t)[0], "killed": True, "left": None}
    stop_s, left = harness.since(t)[0], False
    try:
        os.killpg(proc.pid, 0)  # raises once nothing of the session is left
        time.sleep(2.0)
        os.killpg(proc.pid, signal.SIGKILL)
        left = True
    except ProcessLookupError:
        pass
    return {"exit_code": code, "stop_s": stop_s, "killed": False, "left": left}


def metrics(port: int) -> Optional[Dict]:
    """The server's own counts (:func:`stats.server_side`), or None where /metrics does not answer."""
    from . import stats

    try:
        status, body = get(port, "/metrics")
    except OSError:
        return None
    return stats.server_side(stats.parse_metrics(body.decode("utf-8", "replace"))) if status == 200 \
        else None


def process_tree(root: int) -> List[int]:
    """``root`` and its descendants, from /proc."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def vmhwm_mb(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def worker_rss(root: int, workers: int) -> Dict:
    """Peak resident MiB of each worker and of the supervisor. One worker is the server's own process; with more,
    the workers are its descendants but multiprocessing's resource tracker, and the root only supervises (its peak
    can hold an engine it loaded to check the flags, so it is never taken for a worker)."""
    pids = process_tree(root)
    if workers == 1:
        return {"per_worker_mb": [vmhwm_mb(root)], "supervisor_mb": None, "processes": len(pids)}
    others = [p for p in pids[1:] if "resource_tracker" not in cmdline(p)]
    peaks = sorted((m for m in map(vmhwm_mb, others) if m is not None), reverse=True)
    return {"per_worker_mb": peaks[:workers], "supervisor_mb": vmhwm_mb(root), "processes": len(pids)}


def cpu_seconds(root: int, workers: int) -> Optional[float]:
    """User and system CPU seconds of the worker processes so far (one worker: the server's own process), from
    /proc; None when one cannot be read."""
    pids = [root] if workers == 1 else [p for p in process_tree(root)[1:] if "resource_tracker" not in cmdline(p)]
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def drive(spec: Dict, tmp: str) -> Dict:
    """The client process on ``spec``; its records."""
    path, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "client.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    client = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client.py")
    try:
        proc = subprocess.run([sys.executable, client, path, out], capture_output=True, text=True,
                              timeout=spec["max_seconds"] + spec["drain_seconds"] + 120)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"serve_load: the client of {spec['tag']} did not finish in time") from None
    if proc.returncode:
        raise RuntimeError(f"serve_load: the client failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def tool(name: str) -> str:
    """A console script of this environment (beside its Python), else from PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.path.exists(here) else name


def acl_predict(folder: str, precision: str, sentences: List[str], args, tmp: str,
                exit_layer: Optional[int] = None) -> List[Dict]:
    """acl-predict's rows for ``sentences`` (fed as JSONL, so that each string is the one served), with
    ``args.policy`` and ``args.threshold``, or every row at the fixed exit ``exit_layer`` (``--exit-layer``)."""
    src = os.path.join(tmp, "sentences.jsonl")
    out = os.path.join(tmp, f"predict_{precision}" + ("" if exit_layer is None else f"_exit{exit_layer}") + ".jsonl")
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": s}) + "\n" for s in sentences)
    exits = ["--policy", args.policy, "--threshold", str(args.threshold)] if exit_layer is None else \
        ["--exit-layer", str(exit_layer)]
    cmd = [tool("acl-predict"), folder, "--precision", precision, "--input", src, "--input-format", "jsonl",
           *exits, "--batch-size", str(args.max_batch), "--output", out, "--format", "jsonl", "--force"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"serve_load: acl-predict failed ({proc.returncode}): {proc.stderr[-2000:]}")
    with open(out, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    if len(rows) != len(sentences):
        raise RuntimeError(f"serve_load: acl-predict wrote {len(rows)} rows for {len(sentences)} sentences")
    return rows
