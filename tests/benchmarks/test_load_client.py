"""benchmarks/load/client.py, serve_load.py's client: the Poisson schedule, and the open-loop and closed-loop client
against a server written here (its answers slow, busy, chunked, lost or with another id). The rest of serve_load:
test_serve_load.py."""
import asyncio
import json
import time

import numpy as np
import pytest

from load import client as load_client
from load import stats as load_stats

# ---- the schedule --------------------------------------------------------------------------------


def test_poisson_offsets_are_seeded_and_one_schedule_stretched_across_rates():
    a, b = load_client.poisson_offsets(10.0, 50, 1e9, seed=3), load_client.poisson_offsets(10.0, 50, 1e9, seed=3)
    assert a == b and len(a) == 50 and a == sorted(a) and a[0] > 0
    assert load_client.poisson_offsets(10.0, 50, 1e9, seed=4) != a
    assert load_client.poisson_offsets(5.0, 50, 1e9, seed=3) == pytest.approx([2 * t for t in a])


def test_poisson_offsets_are_bounded_in_count_and_in_time():
    assert len(load_client.poisson_offsets(100.0, 7, 1e9, seed=1)) == 7
    timed = load_client.poisson_offsets(100.0, 10_000, 2.0, seed=1)
    assert timed and max(timed) < 2.0 and len(timed) < 10_000
    assert len(timed) == len([t for t in load_client.poisson_offsets(100.0, 10_000, 1e9, seed=1) if t < 2.0])


def test_poisson_gaps_are_exponential_at_the_rate():
    t = np.array(load_client.poisson_offsets(40.0, 20_000, 1e9, seed=2))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(1 / 40, rel=0.03)
    assert gaps.std() == pytest.approx(1 / 40, rel=0.03)  # an exponential's std is its mean
    assert (gaps < np.log(2) / 40).mean() == pytest.approx(0.5, abs=0.02)  # and its median ln 2 / rate


def test_a_bad_rate_is_refused():
    with pytest.raises(ValueError, match="rate"):
        load_client.poisson_offsets(0.0, 5, 1.0, seed=1)


# ---- the client against a server of this test ----------------------------------------------------


async def _fake_server(slow_text: str, bad_id_text: str):
    """OIP infer answers: 503 with Retry-After for "busy", a chunked body for "chunked", the wrong id for
    ``bad_id_text``, an answer 0.8 s late for ``slow_text``."""

    async def handle(reader, writer):
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):  # the client left
                break
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            body = json.loads(await reader.readexactly(length))
            text = body["inputs"][0]["data"][0]
            if text == slow_text:
                await asyncio.sleep(0.8)
            if text == "busy":
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 2\r\n\r\n{}")
                continue
            answer = json.dumps({"id": "other" if text == bad_id_text else body["id"], "outputs": [
                {"name": "label", "data": [text[::-1]]}, {"name": "exit_layer", "data": [len(text)]},
                {"name": "probabilities", "data": [0.25, 0.75]}]}).encode()
            if text == "chunked":
                half = len(answer) // 2
                chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (answer[:half], answer[half:]))
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _client_run(texts, spec):
    async def scenario():
        server = await _fake_server(slow_text="slow", bad_id_text="twice")
        port = server.sockets[0].getsockname()[1]
        try:
            return await load_client.run({"host": "127.0.0.1", "port": port, "model": "acl", "texts": texts, "tag": "t",
                                "max_seconds": 5.0, "drain_seconds": 5.0, **spec})
        finally:
            server.close()

    return asyncio.run(scenario())


def test_open_loop_sends_on_schedule_while_an_answer_is_slow():
    texts = ["slow", "ab", "busy", "chunked", "twice", "xyz"]
    offsets = [0.05 * (i + 1) for i in range(len(texts))]
    out = _client_run(texts, {"mode": "open", "order": list(range(len(texts))), "offsets": offsets})
    recs = out["records"]
    assert [r["i"] for r in recs] == list(range(len(texts)))
    slow, fast = recs[0], recs[1]
    for r in recs[1:]:  # each left on schedule, in order, before the first answer (0.8 s) came
        assert r["sent"] >= r["scheduled"] and r["sent"] < slow["done"]
    assert [r["sent"] for r in recs] == sorted(r["sent"] for r in recs)
    assert slow["done"] - slow["scheduled"] >= 0.8 and fast["done"] < slow["done"]
    assert out["connections"] >= 2  # the slow answer held one connection, so the next send opened another
    assert (fast["status"], fast["label"], fast["exit_layer"], fast["probabilities"], fast["id_ok"]) == \
        (200, "ba", 2, [0.25, 0.75], True)
    assert (recs[2]["status"], recs[2]["retry_after"]) == (503, "2")
    assert (recs[3]["label"], recs[3]["id_ok"]) == ("deknuhc", True)
    assert recs[4]["id_ok"] is False
    row = load_stats.summarize(out, offered=20.0, planned=7)
    assert (row["sent"], row["unsent"], row["ok"], row["n_503"], row["wrong_id"], row["lost"], row["errors"]) == \
        (6, 1, 4, 1, 1, 0, 0)


def test_a_connection_idle_past_the_servers_keep_alive_is_not_reused(monkeypatch):
    """uvicorn closes a keep-alive connection idle for 5 s: at a low rate the client must open a new one, not send
    on the closed one (each such send was counted as an error)."""
    async def scenario():
        async def keep_alive_2(reader, writer):  # closes a connection idle for 2 s, as uvicorn does after 5 s
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    break
                length = int(next(h.split(b":")[1] for h in head.split(b"\r\n")
                                  if h.lower().startswith(b"content-length")))
                body = json.loads(await reader.readexactly(length))
                answer = json.dumps({"id": body["id"], "outputs": [{"name": "label", "data": ["1"]}, {
                    "name": "exit_layer", "data": [1]}, {"name": "probabilities", "data": [0.5, 0.5]}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
            writer.close()

        server = await asyncio.start_server(keep_alive_2, "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            return await load_client.run({"host": "127.0.0.1", "port": port, "model": "acl",
                                "texts": ["a"], "tag": "t", "max_seconds": 5.0, "drain_seconds": 5.0,
                                "mode": "open", "order": [0, 0, 0], "offsets": [0.0, 0.05, 3.0]})
        finally:
            server.close()

    # 20 times the gap before the second send, half the server's idle limit
    monkeypatch.setattr(load_client, "IDLE_S", 1.0)
    out = asyncio.run(scenario())
    assert [r["status"] for r in out["records"]] == [200, 200, 200], [r["error"] for r in out["records"]]
    assert out["connections"] == 2  # the second send reused the first connection, the third opened a new one


def test_closed_loop_keeps_its_callers_busy_and_answers_every_request():
    texts = ["a", "bb", "ccc"]
    out = _client_run(texts, {"mode": "closed", "order": [0, 1, 2] * 10, "concurrency": 4})
    assert [r["i"] for r in out["records"]] == list(range(30))
    assert all(r["status"] == 200 and r["id_ok"] for r in out["records"])
    assert [r["exit_layer"] for r in out["records"]] == [1, 2, 3] * 10
    assert out["connections"] == 4


def test_a_request_the_server_never_answers_is_lost():
    async def scenario():
        async def silent(reader, writer):
            await asyncio.sleep(10)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        try:
            t = time.perf_counter()
            port = server.sockets[0].getsockname()[1]
            out = await load_client.run({"host": "127.0.0.1", "port": port, "model": "acl",
                               "texts": ["x"], "tag": "t", "mode": "open", "order": [0], "offsets": [0.0],
                               "max_seconds": 0.2, "drain_seconds": 0.3})
            return out, time.perf_counter() - t
        finally:
            server.close()

    out, took = asyncio.run(scenario())
    assert took < 2.0
    assert load_stats.summarize(out, 1.0, 1)["lost"] == 1
