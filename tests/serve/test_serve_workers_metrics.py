"""acl-serve --workers 2's shared metrics, on real processes: Triton's statistics summed over the workers, and a
full disk under the metrics folder costs metrics, never a request or a worker (acl_runtime/serve/metrics.py)."""
import os
import signal
import subprocess
import time

import pytest

from serve_helpers import call, exported, oip_body, start  # noqa: F401  (exported: a fixture)
from test_serve_supervisor import _Log, _workers


def test_triton_statistics_are_the_workers_totals(exported):  # noqa: F811
    """/v2/models/acl/stats read 40, 40, 20, 40 after 60 infers, by which worker answered (/metrics: 60)."""
    proc, url = start(exported["folder"], "--workers", "2")
    log = _Log(proc)
    try:
        pairs = [("good", "bad"), ("bad", "good")]
        for k in range(12):  # a new connection each: the kernel spreads them over the workers
            assert call(f"{url}/v2/models/acl/infer", oip_body(pairs[: 1 + k % 2]))[0] == 200
        assert call(f"{url}/v2/models/acl/infer", {"inputs": []})[0] == 400  # not an inference: counted nowhere
        reads = [call(f"{url}/v2/models/acl/stats")[2]["model_stats"][0] for _ in range(8)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.text()[-3000:]
    counts = {(r["inference_stats"]["success"]["count"], r["inference_count"]) for r in reads}
    assert counts == {(12, 18)}, counts
    assert all(r["execution_count"] >= 12 and r["inference_stats"]["success"]["ns"] > 0 for r in reads), reads
    assert len({r["inference_stats"]["queue"]["count"] for r in reads}) == 1 and reads[0]["last_inference"] > 0


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _unshare_works(), reason="needs a mount namespace of its own (unshare -rm) for a small "
                    "file system to fill")
@pytest.mark.parametrize("full", ["at start", "while serving"])
def test_a_full_disk_under_the_metrics_folder_costs_metrics_never_a_request_or_a_worker(exported, tmp_path,  # noqa
                                                                                        monkeypatch, full):
    """prometheus-client writes its files through mmap into sparse files: a write to a page the full file system
    could not give killed the worker with SIGBUS, its request lost, and its replacements looped on SIGBUS."""
    disk = tmp_path / "disk"
    disk.mkdir()
    # at start: 8 kB left of 1 MB (tempfile skips a TMPDIR where it cannot write its probe, and the owner file)
    fill = 'dd if=/dev/zero of="$0/fill" bs=4k count=254 2>/dev/null; ' if full == "at start" else ""
    wrap = ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=1m tmpfs "$0" && {fill}exec "$@"', str(disk)]
    monkeypatch.setenv("TMPDIR", str(disk))
    monkeypatch.setenv("LOGLEVEL", "info")  # uvicorn says when each worker serves
    proc, url = start(exported["folder"], "--workers", "2", wrap=wrap)
    log = _Log(proc)
    deadline = time.monotonic() + 60  # both workers serve (a fixed 3 s sleep was once too short for the second)
    while sum("Application startup complete" in line for line in list(log.lines)) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(log.lines)[-3000:]
        time.sleep(0.05)
    workers = set(_workers(proc.pid))
    if full == "while serving":
        inside = f"/proc/{proc.pid}/root{disk}"  # the file system as the server sees it
        subprocess.run(["sh", "-c", f'dd if=/dev/zero of="{inside}/fill" bs=4k 2>/dev/null'], timeout=30)
        assert os.path.getsize(f"{inside}/fill") > 0
    texts = [("good", "bad"), ("bad", "good"), ("the movie was fine", "good"), ("a b c d e f g h", "bad")]  # pairs
    try:
        statuses = [call(f"{url}{route}", body)[0] for route, body in
                    [("/predict", {"inputs": list(t)}) for t in texts] + [("/predict", {"inputs": ""})] +
                    [("/v2/models/acl/infer", oip_body(texts[: k + 1])) for k in range(4)] +
                    [("/v2/models/acl", None), ("/v2/models/acl/config", None), ("/v2/models/acl/ready", None),
                     ("/v2/models/acl/stats", None), ("/metrics", None)] * 2]
        assert set(_workers(proc.pid)) == workers  # none died
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.text()
    assert statuses == [200] * 4 + [422] + [200] * 14, (statuses, text[-3000:])
    assert "SIGBUS" not in text and "died" not in text, text[-3000:]
    if full == "at start":  # said once a worker
        assert text.count("cannot write its metrics") == 2, text[-3000:]

