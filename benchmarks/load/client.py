#!/usr/bin/env python
"""The client process of benchmarks/serve_load.py: send SST-2 sentences to an acl-serve over Open Inference Protocol
v2 and record every answer.

    python benchmarks/load/client.py SPEC.json OUT.json

SPEC: ``{"host", "port", "model", "texts", "order": [text index per request], "mode": "open" | "closed", "offsets":
[send second per request] (open), "concurrency" (closed), "max_seconds", "drain_seconds", "tag", "parameters"
(optional: every request's OIP parameters, e.g. ``{"timeout": microseconds}``, Triton's deadline)}``. OUT: ``{"end",
"cpu_s", "connections", "records": [...]}``, one record per request sent (see :func:`record`), times in seconds from
the start; ``cpu_s``: this process's CPU time, what it took of the cores the server runs on.

- ``open``: open-loop arrivals. Each request leaves at its offset, whatever the answers before it are doing: a
  request that finds no idle connection opens one, so a slow answer never delays the next send. ``lag`` records how
  late a send left anyway (this process on a busy core); the latency counts from the scheduled time, so lag is
  latency too and a late client cannot hide a slow server (coordinated omission).
- ``closed``: ``concurrency`` loops, each sending the next request when its last answer came (saturation).

Sending stops at ``max_seconds``; answers still missing ``drain_seconds`` later are recorded as lost (status 0).
Standard library only, and a small HTTP/1.1 keep-alive client of its own, so that this process stays light beside
the server it measures. Each request carries an ``id`` that OIP echoes: an answer with another id is a request
answered twice, or to the wrong caller.
"""
import asyncio
import json
import random
import sys
import time
from typing import Dict, List, Optional

from acl_runtime.io import atomic  # noqa: E402


def poisson_offsets(rate: float, n: int, max_seconds: float, seed: int) -> List[float]:
    """Send times (seconds from the start) of at most ``n`` Poisson arrivals at ``rate`` per second, the last before
    ``max_seconds``: exponential gaps drawn up front from ``seed``. The gaps are drawn at rate 1 and scaled, so that
    every rate of one seed is the same schedule stretched."""
    if rate <= 0 or n < 0:
        raise ValueError(f"poisson_offsets: rate {rate} and n {n}: the rate must be > 0 and n >= 0")
    rng, out, t = random.Random(seed), [], 0.0
    for _ in range(n):
        t += rng.expovariate(1.0) / rate
        if t >= max_seconds:
            break
        out.append(t)
    return out


class Connection:
    """One keep-alive HTTP/1.1 connection: a request, then its whole response (Content-Length or chunked)."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> "Connection":
        return cls(*await asyncio.open_connection(host, port))

    async def request(self, method: str, path: str, host: str, body: bytes = b""):
        """(status, headers with lower-case names, body); the connection is reusable unless ``closes``."""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode("ascii")
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection before answering")
        status = int(status_line.split()[1])
        headers = {}
        while True:
            line = (await self.reader.readline()).decode("latin-1").strip()
            if not line:
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                data += chunk[:-2]
        else:
            data = await self.reader.readexactly(int(headers.get("content-length", 0)))
        return status, headers, data

    def closes(self, headers: Dict[str, str]) -> bool:
        return headers.get("connection", "").lower() == "close"

    def close(self) -> None:
        self.writer.close()


IDLE_S = 2.0  # a connection idle this long is closed, not reused: uvicorn closes keep-alive connections after 5 s


class Pool:
    """Idle connections to reuse (the most recent first; one idle for ``IDLE_S`` is closed, as HTTP clients do
    before the server's keep-alive timeout would make it fail); a request that finds none opens a new one."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.idle, self.opened = host, port, [], 0

    async def call(self, path: str, body: bytes):
        conn, now = None, time.monotonic()
        while self.idle and conn is None:
            conn, since = self.idle.pop()
            if now - since > IDLE_S:
                conn.close()
                conn = None
        if conn is None:
            conn = await Connection.open(self.host, self.port)
            self.opened += 1
        try:
            status, headers, data = await conn.request("POST", path, self.host, body)
        except BaseException:
            conn.close()  # half a response may be left on it: never reuse it
            raise
        if conn.closes(headers):
            conn.close()
        else:
            self.idle.append((conn, time.monotonic()))
        return status, headers, data

    def close(self) -> None:
        for conn, _ in self.idle:
            conn.close()


def oip_body(text: str, request_id: str, parameters: Optional[Dict] = None) -> bytes:
    body = {"id": request_id, "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode("utf-8")


def read_answer(data: bytes) -> Dict:
    """The OIP answer's id, label, exit layer and probabilities (its one row), and why it left there: the exit
    layer output's ``exit_reason`` parameter (policy, last, deadline; None where the server sends none)."""
    got = json.loads(data)
    outputs = {o["name"]: o for o in got.get("outputs", [])}
    layer = outputs["exit_layer"]
    return {"id": got.get("id"), "label": outputs["label"]["data"][0], "exit_layer": int(layer["data"][0]),
            "exit_reason": (layer.get("parameters") or {}).get("exit_reason"),
            "probabilities": [float(p) for p in outputs["probabilities"]["data"]]}


def record(i: int, text_index: int, scheduled: Optional[float], sent: float) -> Dict:
    """One request's record: ``status`` 0 until it is answered (lost, or a connection error in ``error``)."""
    return {"i": i, "text": text_index, "scheduled": scheduled, "sent": sent, "done": None, "status": 0,
            "retry_after": None, "id_ok": None, "label": None, "exit_layer": None, "exit_reason": None,
            "probabilities": None, "error": None}


async def one(pool: Pool, spec: Dict, i: int, rec: Dict, clock) -> None:
    request_id = f"{spec['tag']}-{i}"
    try:
        status, headers, data = await pool.call(f"/v2/models/{spec['model']}/infer",
                                                oip_body(spec["texts"][rec["text"]], request_id,
                                                         spec.get("parameters")))
        rec["done"], rec["status"] = clock(), status
        rec["retry_after"] = headers.get("retry-after")
        if status == 200:
            answer = read_answer(data)
            rec["id_ok"] = answer.pop("id") == request_id
            rec.update(answer)
        else:
            rec["error"] = data[:200].decode("utf-8", "replace")
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, KeyError) as e:
        rec["done"], rec["error"] = clock(), f"{type(e).__name__}: {e}"


async def run(spec: Dict) -> Dict:
    pool, records, tasks = Pool(spec["host"], spec["port"]), [], []
    t0 = time.perf_counter()

    def clock():
        return time.perf_counter() - t0

    order = spec["order"]
    if spec["mode"] == "open":
        for i, (text_index, at) in enumerate(zip(order, spec["offsets"])):
            delay = at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if clock() >= spec["max_seconds"]:
                break
            records.append(record(i, text_index, at, clock()))
            tasks.append(asyncio.create_task(one(pool, spec, i, records[-1], clock)))
    else:
        queue = iter(range(len(order)))

        async def loop():
            for i in queue:
                if clock() >= spec["max_seconds"]:
                    return
                records.append(record(i, order[i], None, clock()))
                await one(pool, spec, i, records[-1], clock)

        tasks = [asyncio.create_task(loop()) for _ in range(spec["concurrency"])]
    if tasks:
        await asyncio.wait(tasks, timeout=max(0.0, spec["max_seconds"] + spec["drain_seconds"] - clock()))
    for task in tasks:
        task.cancel()
    pool.close()
    records.sort(key=lambda r: r["i"])
    return {"end": clock(), "cpu_s": time.process_time(), "connections": pool.opened, "records": records}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: client.py SPEC.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    out = asyncio.run(run(spec))
    atomic.write_text(argv[1], json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
