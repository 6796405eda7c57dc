"""benchmarks/serve_hey.py: hey's CSV dump read into a row (counts, throughput, percentiles), and a tiny run end to
end: hey and serve_load's client at the same fixed rate against acl-serve on the tiny exported model, every answer
200, hey's counted by the server, the JSON written and not replaced without --force. The model reads one text per
input, as the generators send (a lone text on a pair model is refused: tests/inference/test_pairing.py)."""
import contextlib
import io
import json
import shutil
import subprocess

import numpy as np
import pytest

import helpers
from serve_helpers import single_folder  # noqa: F401  (a fixture)


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


def test_a_perf_analyzer_profile_export_becomes_counts_throughput_and_percentiles():
    """Its export dumps binary output tensors raw into JSON strings (quotes, backslashes and braces included), so
    it is read with a pattern per request, not json.loads; a request without an answer's timestamp is an error."""
    import serve_hey

    junk = b'"\\}{\x00\xce"'
    sent = [(0, 10), (50, 80), (100, None), (150, 170)]  # ms: send, answer
    requests = b",".join(
        b'{"timestamp":%d,"request_inputs":{"text":"a } b"},"response_timestamps":[%s],"response_outputs":[{"label":'
        b'"%s"}]}' % (a * 10**6, b"" if b is None else b"%d" % (b * 10**6), junk) for a, b in sent)
    export = b'{"experiments":[{"experiment":{"mode":"request_rate","value":20.0},"requests":[' + requests + b"]}]}"
    row = serve_hey.perf_analyzer_row(export, 20.0)
    ok = [b - a for a, b in sent if b is not None]
    assert (row["generator"], row["sent"], row["ok"], row["errors"]) == ("perf_analyzer", 4, 3, 1)
    assert row["p50_ms"] == pytest.approx(np.percentile(ok, 50)) and row["p99_ms"] == pytest.approx(
        np.percentile(ok, 99))
    assert row["throughput_per_s"] == pytest.approx(3 / 0.170)


def test_perf_analyzer_not_found_is_a_one_line_note_and_a_wrong_path_refused(tmp_path, monkeypatch, capsys):
    import serve_hey

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(serve_hey.server, "tool", lambda name: name)  # not beside this Python either
    found, note = serve_hey.find_perf_analyzer(None)
    assert found is None and "\n" not in note and note.startswith("serve_hey: perf_analyzer not found")
    assert serve_hey.find_perf_analyzer("/opt/pa/bin/perf_analyzer") == ("/opt/pa/bin/perf_analyzer", "")
    with pytest.raises(SystemExit) as refused:
        serve_hey.parse_args(["--toy", "--json", str(tmp_path / "x.json"), "--perf-analyzer", str(tmp_path / "no")])
    assert refused.value.code == 2 and "--perf-analyzer" in capsys.readouterr().err


def test_perf_analyzer_found_without_a_library_it_links_is_a_note_naming_the_debian_package(tmp_path, monkeypatch):
    """A binary whose shared library is not installed (perf_analyzer without libb64.so.0d on a fresh machine) is
    left out with one line naming the package, not run to fail every request (it made make test error)."""
    import serve_hey

    if shutil.which("cc") is None or shutil.which("ldd") is None:
        pytest.skip("no C compiler or ldd here to build a binary with a missing library")
    (tmp_path / "lib.c").write_text("int acl_lib(void) { return 1; }\n")
    (tmp_path / "main.c").write_text("int acl_lib(void);\nint main(void) { return acl_lib() - 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libacl_gone.so.0", "-o", str(tmp_path / "libacl_gone.so.0"),
                    str(tmp_path / "lib.c")], check=True)
    subprocess.run(["cc", "-o", str(tmp_path / "perf_analyzer"), str(tmp_path / "main.c"),
                    str(tmp_path / "libacl_gone.so.0")], check=True)
    (tmp_path / "libacl_gone.so.0").unlink()
    monkeypatch.setattr(serve_hey, "system_packages", lambda: {"libacl_gone.so.0": "libacl-gone0"})
    found, note = serve_hey.find_perf_analyzer(str(tmp_path / "perf_analyzer"))
    assert found is None and "\n" not in note
    assert "libacl_gone.so.0 (Debian: libacl-gone0)" in note and "scripts/system_packages.sh" in note


def test_the_system_packages_table_names_perf_analyzers_library():
    import serve_hey

    assert serve_hey.system_packages()["libb64.so.0d"] == "libb64-0d"
    assert serve_hey.system_packages()["hey"] == "hey"


@pytest.fixture(scope="module")
def driven(single_folder, tmp_path_factory):  # noqa: F811
    """One serve_hey run (1 s at 20/s from each generator) that both tests below read."""
    if shutil.which("hey") is None:
        helpers.skip_needed("hey", "scripts/system_packages.sh installs Debian's hey")
    import serve_hey

    out = tmp_path_factory.mktemp("serve_hey") / "hey.json"
    argv = ["--folder", single_folder, "--rate", "20", "--seconds", "1", "--connections", "2", "--json",
            str(out)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        record = serve_hey.main(argv)
    return {"record": record, "out": out, "argv": argv, "printed": printed.getvalue()}


def test_perf_analyzer_drives_the_server_at_a_fixed_rate_and_gets_every_answer(driven):
    """perf_analyzer (scripts/setup_env.sh installs it beside the venv's Python): its requests, [1, 1] BYTES
    tensors shaped from the metadata, all answered 200."""
    import serve_hey

    found, note = serve_hey.find_perf_analyzer(None)
    if found is None:  # not installed (make env), or a library missing (scripts/system_packages.sh): the note says
        helpers.skip_needed("perf_analyzer", note)
    record = driven["record"]
    pa = {r["generator"]: r for r in record["rows"]}["perf_analyzer"]
    assert (pa["sent"], pa["ok"], pa["errors"], pa["server_counted"]) == (20, 20, 0, 20)
    assert pa["reported_p50_ms"] is not None and pa["reported_p99_ms"] is not None  # its own summary, read too
    assert record["checks"]["perf_analyzer_answers_counted_by_server"] and all(record["checks"].values())


def test_hey_and_the_load_client_at_a_fixed_rate_get_every_answer(driven):
    import serve_hey

    record, out = driven["record"], driven["out"]
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    rows = {r["generator"]: r for r in record["rows"]}  # and perf_analyzer's (above)
    hey, client = rows["hey"], rows["serve_load client"]
    assert hey["generator"] == "hey" and 10 <= hey["sent"] <= 22  # hey's ticks: about 20 in its second
    assert hey["ok"] == hey["sent"] == hey["server_counted"]  # every one answered 200 and counted once
    assert (client["sent"], client["ok"], client["errors"]) == (20, 20, 0)
    assert all(r["p50_ms"] <= r["p99_ms"] for r in record["rows"])
    assert record["checks"]["exit_0"] and all(record["checks"].values()), record["checks"]
    assert "serve_load client" in driven["printed"]
    with pytest.raises(SystemExit) as refused:
        serve_hey.main(driven["argv"])
    assert refused.value.code == 2
