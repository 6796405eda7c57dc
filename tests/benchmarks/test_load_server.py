"""benchmarks/load/server.py, the server serve_load.py measures: each worker's memory peak read, a worker that
outlives its supervisor caught, and a server deaf to SIGTERM killed after the bound."""
import os
import subprocess
import sys
import time

from load import server as load_server

# ---- the server's processes ----------------------------------------------------------------------

SUPERVISOR = """
import subprocess, sys, time
worker = "import time; x = bytearray(60 << 20); print('up', flush=True); time.sleep(60)"
children = [subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE) for _ in range(2)]
for c in children:
    c.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


def _running_in_group(pgid: int):
    out = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            out.append(int(name))
    return out


def test_each_workers_peak_is_read_and_a_worker_outliving_its_supervisor_is_caught(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        rss = load_server.worker_rss(proc.pid, 2)
        assert len(rss["per_worker_mb"]) == 2 and min(rss["per_worker_mb"]) > 60
        assert rss["supervisor_mb"] < 60 and rss["processes"] == 3
        # one worker: the root serves
        assert load_server.worker_rss(proc.pid, 1)["per_worker_mb"] == [rss["supervisor_mb"]]
        stopped = load_server.stop_server(proc, 5.0)  # the supervisor dies of SIGTERM, its workers are not told
        assert (stopped["exit_code"], stopped["killed"], stopped["left"]) == (-15, False, True)
        time.sleep(0.5)
        assert _running_in_group(proc.pid) == []  # killed (a zombie waits for its reaper, which is not us)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def test_a_server_deaf_to_sigterm_is_killed_after_the_bound():
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
           "time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline().strip() == b"ready"
    stopped = load_server.stop_server(proc, 0.5)
    assert stopped["killed"] and stopped["exit_code"] == -9 and 0.5 <= stopped["stop_s"] < 5
