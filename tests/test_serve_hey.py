"""benchmarks/serve_hey.py: hey's CSV dump read into a row (counts, throughput, percentiles), and a tiny run end to
end: hey and serve_load's client at the same fixed rate against acl-serve on the tiny exported model, every answer
200, hey's counted by the server, the JSON written and not replaced without --force."""
import json
import shutil

import numpy as np
import pytest

import helpers
from serve_helpers import exported  # noqa: F401  (a fixture)


def test_a_hey_csv_dump_becomes_counts_throughput_and_percentiles():
    import serve_hey

    rows = [(0.010, "200", 0.00), (0.030, "200", 0.05), (0.020, "503", 0.10), (0.050, "200", 0.15),
            (0.000, "0", 0.20)]
    text = "response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset\n" + "".join(
        f"{t},0,0,0,{t},0,{s},{o}\n" for t, s, o in rows)
    row = serve_hey.hey_row(text, 20.0)
    ok = [1000 * t for t, s, _ in rows if s == "200"]
    assert (row["sent"], row["ok"], row["n_503"], row["errors"]) == (5, 3, 1, 1)
    assert row["p50_ms"] == pytest.approx(np.percentile(ok, 50)) and row["p99_ms"] == pytest.approx(
        np.percentile(ok, 99))
    assert row["throughput_per_s"] == pytest.approx(3 / (0.15 + 0.050 - 0.0))


def test_hey_and_the_load_client_at_a_fixed_rate_get_every_answer(exported, tmp_path, capsys):  # noqa: F811
    if shutil.which("hey") is None:
        helpers.skip_needed("hey", "scripts/system_packages.sh installs Debian's hey")
    import serve_hey

    out = tmp_path / "hey.json"
    argv = ["--folder", exported["folder"], "--rate", "20", "--seconds", "1", "--connections", "2", "--json",
            str(out)]
    record = serve_hey.main(argv)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    hey, client = record["rows"]
    assert hey["generator"] == "hey" and 10 <= hey["sent"] <= 22  # hey's ticks: about 20 in its second
    assert hey["ok"] == hey["sent"] == hey["server_counted"]  # every one answered 200 and counted once
    assert (client["sent"], client["ok"], client["errors"]) == (20, 20, 0)
    assert all(r["p50_ms"] <= r["p99_ms"] for r in record["rows"])
    assert record["checks"] == {"exit_0": True, "hey_answers_counted_by_server": True}
    assert "serve_load client" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        serve_hey.main(argv)
    assert refused.value.code == 2
