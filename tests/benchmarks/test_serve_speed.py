"""benchmarks/serve_speed.py --toy: the whole benchmark end to end on a tiny model (trained, exported to ONNX with
int8, six systems timed, the peak-memory processes, the targets), and its refusals."""
import json
import os

import pytest

import _serving
import serve_speed

pytestmark = pytest.mark.slow  # the whole toy benchmark once per module (make test-slow, CI)

SYSTEMS = [f"{e} {m}" for e in serve_speed.ENGINES for m in serve_speed.MODES]
FIELDS = {"system", "engine", "mode", "batch", "p50_ms", "p95_ms", "tok_ms", "sent_per_s", "e2e_sent_per_s",
          "accuracy", "agreement_with_torch", "mean_exit_layer", "layer_speedup", "wall_speedup", "efficiency",
          "vs_torch", "peak_rss_mb", "rss_vs_torch", "examples", "repeats", "cpu_sent_per_s", "cpu_speedup",
          "cpu_efficiency", "cpu_vs_torch"}


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_speed")
    out = str(root / "serve_speed.json")
    # threshold 0.9: the toy model is confident enough there for some sentences to leave before the last layer
    serve_speed.main(["--toy", "--work", str(root / "work"), "--json", out, "--repeats", "2", "--examples", "24",
                      "--batch-size", "8", "--threshold", "0.9"])
    with open(out) as f:
        return json.load(f), root


def test_toy_run_reports_every_system_at_both_batch_sizes(toy_run):
    result, _ = toy_run
    rows = result["rows"]
    assert [(r["system"], r["batch"]) for r in rows] == [(s, b) for b in (1, 8) for s in SYSTEMS]
    assert result["setup"]["threshold"] == 0.9 and result["setup"]["threshold_source"] == "--threshold"
    for r in rows:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["examples"] == 24 and r["repeats"] == 2 and r["sent_per_s"] > 0
        assert (r["p50_ms"] is not None) == (r["batch"] == 1)
        if r["batch"] == 1:
            assert 0 < r["p50_ms"] <= r["p95_ms"]
        assert r["efficiency"] == pytest.approx(r["wall_speedup"] / r["layer_speedup"])
        assert r["cpu_efficiency"] == pytest.approx(r["cpu_speedup"] / r["layer_speedup"])
        if r["mode"] == "all":
            assert r["mean_exit_layer"] == 3 and r["layer_speedup"] == 1 and r["policy"] is None
        else:
            assert r["policy"] == "entropy" and r["threshold"] == 0.9
    exit_rows = [r for r in rows if r["mode"] == "exit"]
    assert all(r["mean_exit_layer"] < 3 for r in exit_rows)  # the policy ran: some sentences left early
    torch_rows = [r for r in rows if r["engine"] == "torch"]
    assert all(r["vs_torch"] == 1 == r["cpu_vs_torch"] and r["agreement_with_torch"] == 1 for r in torch_rows)


def test_ort_fp32_gives_torchs_labels_and_exit_layers(toy_run):
    at = {(r["system"], r["batch"]): r for r in toy_run[0]["rows"]}
    for b in (1, 8):
        for mode in serve_speed.MODES:
            ort, ref = at[(f"ort-fp32 {mode}", b)], at[(f"torch {mode}", b)]
            assert ort["agreement_with_torch"] == 1.0
            assert ort["accuracy"] == ref["accuracy"]
            assert ort["mean_exit_layer"] == pytest.approx(ref["mean_exit_layer"])


def test_peak_memory_processes_and_targets(toy_run):
    result, _ = toy_run
    rss = result["rss"]
    assert set(rss) == set(serve_speed.ENGINES)
    assert rss["torch"]["torch_loaded"] and rss["torch"]["fairseq_loaded"]
    for engine in ("ort-fp32", "ort-int8"):
        assert not rss[engine]["torch_loaded"] and not rss[engine]["fairseq_loaded"]
        # the process's own peak (not the parent's, which a forked child's ru_maxrss would report)
        assert 0 < rss[engine]["peak_rss_mb"] < rss["torch"]["peak_rss_mb"]
    for r in result["rows"]:
        assert r["peak_rss_mb"] == rss[r["engine"]]["peak_rss_mb"]
    targets = result["targets"]
    assert len(targets) == 10
    for t in targets:
        assert t["pass"] == (t["value"] >= t["bound"] if t["at_least"] else t["value"] <= t["bound"])
        assert (t["cpu_value"] is None) == ("accuracy" in t["target"])


def test_toy_mode_needs_its_own_json(tmp_path):
    with pytest.raises(SystemExit) as e:
        serve_speed.main(["--toy"])
    assert e.value.code == 2
    results = os.path.join(serve_speed._glue_runs.REPO, "benchmarks", "results", "serve_speed.json")
    with pytest.raises(SystemExit) as e:
        serve_speed.main(["--toy", "--json", results])
    assert e.value.code == 2


def test_an_existing_json_is_kept_without_force(tmp_path, capsys):
    out = tmp_path / "out.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as e:
        serve_speed.main(["--toy", "--json", str(out)])
    assert e.value.code == 2 and "--force" in capsys.readouterr().err
    assert out.read_text() == "{}"


def test_the_cached_export_is_made_again_when_the_exporter_changes(tmp_path, monkeypatch):
    """The stamp holds the exporter's code, not only the checkpoint: a cached dynamic-int8 export was reused
    after the exporter turned static."""
    from acl_fairseq.hf import onnx_export

    made = []

    def write_onnx(hub, out, quantize):
        made.append(out)
        open(os.path.join(out, "model.onnx"), "w").write(str(len(made)))

    monkeypatch.setattr(onnx_export, "write_onnx", write_onnx)
    ckpt, folder = tmp_path / "checkpoint.pt", str(tmp_path / "serve" / "onnx")
    ckpt.write_bytes(b"weights")
    _serving.exported(None, str(ckpt), folder)
    _serving.exported(None, str(ckpt), folder)
    assert len(made) == 1  # the same checkpoint and exporter: the cache is used
    stamp = json.load(open(os.path.join(folder, "source.json")))
    monkeypatch.setattr(_serving, "export_source", lambda c: {**stamp, "exporter_sha256": "another exporter"})
    _serving.exported(None, str(ckpt), folder)
    assert len(made) == 2 and open(os.path.join(folder, "model.onnx")).read() == "2"
    assert sorted(os.listdir(tmp_path / "serve")) == ["onnx"]  # no temporary or old folder left beside it
