"""benchmarks/serve_load.py: the percentile and verdict arithmetic, the JSON record; (slow) one --quick run end to end
against acl-serve on the toy model. Its client: test_load_client.py; its server's processes: test_load_server.py."""
import json
import os
import re

import numpy as np
import pytest

from load import phases as load_phases
from load import server as load_server
from load import stats as load_stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- the arithmetic ------------------------------------------------------------------------------


def test_percentile_is_numpys_linear_one():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        xs = list(rng.exponential(size=n))
        for q in (0, 50, 95, 99, 100):
            assert load_stats.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert load_stats.percentile([], 50) is None


def _rec(i, status, scheduled, done, id_ok=True, exit_layer=2, error=None, text=0, label="1", probs=(0.9, 0.1)):
    return {"i": i, "text": text, "scheduled": scheduled, "sent": scheduled, "done": done, "status": status,
            "retry_after": None, "id_ok": id_ok if status == 200 else None, "label": label,
            "exit_layer": exit_layer, "probabilities": list(probs), "error": error}


def test_summarize_counts_each_outcome_and_times_latency_from_the_schedule():
    recs = [_rec(0, 200, 0.0, 0.010, exit_layer=2), _rec(1, 200, 0.5, 0.530, exit_layer=4),
            _rec(2, 200, 1.0, 1.050, exit_layer=6), _rec(3, 503, 1.1, 1.101), _rec(4, 500, 1.2, 1.21),
            _rec(5, 404, 1.3, 1.31), _rec(6, 0, 1.4, None), _rec(7, 0, 1.5, 1.6, error="ConnectionError: x"),
            _rec(8, 200, 1.6, 1.9, id_ok=False)]
    row = load_stats.summarize({"records": recs, "connections": 3}, offered=4.0, planned=10)
    assert (row["sent"], row["unsent"], row["ok"], row["n_503"], row["n_5xx_other"], row["errors"], row["lost"],
            row["wrong_id"]) == (9, 1, 3, 1, 1, 3, 1, 1)
    assert row["p50_ms"] == pytest.approx(30.0) and row["p99_ms"] == pytest.approx(49.6)
    assert row["throughput_per_s"] == pytest.approx(3 / 1.05)
    assert row["mean_exit_layer"] == pytest.approx(4.0)


def test_steady_throughput_leaves_out_the_ramp_and_the_drain():
    # 4 callers: the first answers come slowly (start-up), then one every 10 ms, then a slow tail
    done = [1.0, 1.5, 1.8, 1.99] + [2.0 + 0.01 * k for k in range(100)] + [5.0, 6.0, 7.0, 8.0]
    out = {"records": [_rec(i, 200, None, t) for i, t in enumerate(done)]}
    assert load_stats.steady_throughput(out, 4) == pytest.approx(100 / (done[-5] - done[3]))
    assert load_stats.steady_throughput(out, 4) == pytest.approx(100.0, rel=0.02)
    few = {"records": [_rec(i, 200, None, t) for i, t in enumerate([0.5, 1.0])]}
    assert load_stats.steady_throughput(few, 4) == pytest.approx(2.0)


def test_served_answers_are_compared_with_acl_predicts_rows():
    expected = [{"label": "1", "exit_layer": 2, "probabilities": {"1": 0.9, "0": 0.1}}] * 4
    recs = [_rec(0, 200, 0, 1, text=0), _rec(1, 200, 0, 1, text=1, label="0"), _rec(2, 200, 0, 1, text=2, exit_layer=3),
            _rec(3, 200, 0, 1, text=3, probs=(0.9 + 2e-5, 0.1)), _rec(4, 200, 0, 1, text=0, probs=(0.9 + 5e-6, 0.1)),
            _rec(5, 503, 0, 1, text=3)]
    got = load_stats.compare_answers(recs, expected, ["1", "0"], atol=1e-5)
    assert (got["compared"], got["mismatches"], got["sentences"]) == (5, 3, 4)
    assert (got["label"], got["exit_layer"], got["probabilities"]) == (1, 1, 1)
    assert got["max_prob_diff"] == pytest.approx(2e-5)


def _result(refill, workers, sat, full, layer_speedup, p99, batch1, mismatches=0, lost=0, errors=0, code=0):
    phase = {"lost": lost, "wrong_id": 0, "errors": errors, "throughput_per_s": sat}
    return {"config": f"c{refill}{workers}", "refill": refill, "workers": workers, "saturation": phase,
            "rates": [{**phase, "lost": 0, "errors": 0, "fraction": 0.5, "p99_ms": p99}],
            "reference": {"full_batched_per_s": full, "batch1_ms": batch1}, "layer_speedup": layer_speedup,
            "answers": {"mismatches": mismatches, "sentences": 10},
            "server": {"exit_code": code, "stop_s": 0.5, "killed": False}}


def _pick(found, config, start):
    (v,) = [v for v in found if v["config"] == config and v["target"].startswith(start)]
    return v


def test_verdicts_hold_the_issues_bounds():
    found = load_stats.verdicts([_result(True, 1, 90.0, 60.0, 1.5, 29.0, 10.0),
                        _result(True, 2, 90.0, 60.0, 1.5, 31.0, 10.0, mismatches=1, lost=2, errors=1, code=-15),
                        _result(False, 1, 45.0, 60.0, 1.5, 5.0, 10.0)], n_sentences=10)
    ratio = "saturated / (layer speed-up x full-depth batched engine x workers)"
    assert _pick(found, "cTrue1", ratio)["value"] == pytest.approx(1.0)
    assert _pick(found, "cTrue1", "p99 at 50%")["value"] == pytest.approx(2.9)
    assert [v["pass"] for v in found if v["config"] == "cTrue1"] == [True] * 7
    assert _pick(found, "cTrue2", ratio)["value"] == pytest.approx(0.5)  # two workers: twice the reference
    assert [v["pass"] for v in found if v["config"] == "cTrue2"] == [False] * 7
    assert _pick(found, "cTrue2", "requests lost")["value"] == 2
    assert _pick(found, "cTrue2", "SIGTERM")["value"] == 1
    no_refill = _pick(found, "cFalse1", ratio)
    assert no_refill["pass"] is None and no_refill["value"] == pytest.approx(0.5)
    assert not [v for v in found if v["config"] == "cFalse1" and "moonshot" in v["target"]]
    json.dumps(found)  # the record takes them as they are
    assert not [v for v in found if "requests alone" in v["target"]]  # a record without the p99 alone: none
    alone = _result(True, 1, 90.0, 60.0, 1.5, 29.0, 10.0)
    alone["reference"]["batch1_p99_ms"] = 14.5
    got = _pick(load_stats.verdicts([alone], n_sentences=10), "cTrue1", "p99 at 50% / p99 of requests alone")
    assert got["value"] == pytest.approx(2.0) and got["pass"] is None  # judged by serve_ideal, where reachable


def test_the_share_outside_the_model_is_cpu_against_cpu():
    got = load_phases.outside_model({"model_seconds": 9.0, "model_cpu_seconds": 3.0}, 10.0, 14.0)
    assert got["worker_cpu_seconds"] == 4.0 and got["cpu_share_outside_model"] == pytest.approx(0.25)
    assert load_phases.outside_model({"model_cpu_seconds": 3.0}, None, 14.0)["cpu_share_outside_model"] is None


def test_the_scheduler_alone_is_judged_against_the_same_server_at_full_depth():
    res = _result(True, 1, 90.0, 60.0, 1.5, 29.0, 10.0)
    res["full_depth_served"] = {"throughput_per_s": 62.0, "lost": 1, "wrong_id": 0, "errors": 0}
    res["saturation"]["split"] = {"cpu_share_outside_model": 0.4}
    found = load_stats.verdicts([res], n_sentences=10)
    served = _pick(found, "cTrue1", "saturated / (layer speed-up x the same server at full depth)")
    assert served["value"] == pytest.approx(90.0 / (1.5 * 62.0)) and served["bound"] == load_stats.SERVED_BOUND
    assert served["pass"] is True
    assert _pick(found, "cTrue1", "share of the workers' CPU")["value"] == 0.4
    assert _pick(found, "cTrue1", "requests lost")["value"] == 1  # the full-depth phase is counted too
    assert not [v for v in found if v["target"].startswith("model CPU a request")]  # no CPU read: not made up
    # the ratio taken apart: 100 requests each; with refill 0.6 s in model calls of 1.0 s, at full depth 1.2 of 1.5
    res["saturation"]["split"] = {"requests": 100, "worker_cpu_seconds": 1.0, "model_cpu_seconds": 0.6}
    res["full_depth_served"]["split"] = {"requests": 100, "worker_cpu_seconds": 1.5, "model_cpu_seconds": 1.2}
    found = load_stats.verdicts([res], n_sentences=10)
    assert _pick(found, "cTrue1", "model CPU a request")["value"] == pytest.approx(12.0 / (1.5 * 6.0))
    assert _pick(found, "cTrue1", "CPU outside the model a request")["value"] == pytest.approx(4.0 / 3.0)
    assert load_stats.cpu_per_request({"requests": 0, "worker_cpu_seconds": 1.0, "model_cpu_seconds": 0.5}) is None


def test_refill_is_judged_against_no_refill_at_the_same_offered_rate():
    """Each configuration's fractions are of its own saturation; the verdict pairs refill's rates with the runs
    of the same rates without refill (one skipped above no refill's saturation), a miss is a miss."""
    on, off = _result(True, 1, 90.0, 60.0, 1.5, 29.0, 10.0), _result(False, 1, 45.0, 60.0, 1.5, 5.0, 10.0)
    on["rates"] = [{**on["rates"][0], "fraction": f, "offered_per_s": f * 90.0, "p99_ms": p} for f, p in
                   ((0.25, 12.0), (0.5, 30.0), (1.0, 80.0))]
    off["same_rate_as_refill"] = [
        {"refill_fraction": 0.25, "offered_per_s": 22.5, "p99_ms": 10.0, "lost": 0, "wrong_id": 0, "errors": 0},
        {"refill_fraction": 0.5, "offered_per_s": 45.0, "p99_ms": 60.0, "lost": 3, "wrong_id": 0, "errors": 0},
        {"refill_fraction": 1.0, "offered_per_s": 90.0, "skipped": "above this configuration's saturation"}]
    found = load_stats.verdicts([on, off], n_sentences=10)
    same = [v for v in found if v["target"].startswith("p99 with refill / without")]
    assert [(v["config"], v["value"], v["pass"]) for v in same] == [
        ("cTrue1", pytest.approx(1.2), False), ("cTrue1", pytest.approx(0.5), True)]
    assert "22.5/s, 25% of refill's saturation" in same[0]["target"] and load_stats.SAME_RATE_BOUND == 1.0
    assert _pick(found, "cFalse1", "requests lost")["value"] == 3  # the same-rate phases are counted too


def test_no_refill_runs_refills_own_rates_of_the_same_precision_and_workers():
    from load import pair as load_pair

    ran = [{"config": "refill fp32 w1", "refill": True, "precision": "fp32", "workers": 1,
            "rates": [{"fraction": 0.25, "offered_per_s": 40.0}, {"fraction": 0.5, "offered_per_s": 80.0}]},
           {"config": "refill int8 w1", "refill": True, "precision": "int8", "workers": 1, "failed": "x"}]
    assert load_pair.refill_rates(ran, "fp32", 1) == [(0.25, 40.0), (0.5, 80.0)]
    assert load_pair.refill_rates(ran, "fp32", 2) == []
    assert load_pair.refill_rates(ran, "int8", 1) == []  # its twin failed


def test_interleaved_rounds_are_judged_by_their_median_ratio():
    from load import pair as load_pair

    def phase(p99, p50=10.0, lost=0, model_cpu=0.4):
        return {"p99_ms": p99, "p50_ms": p50, "lost": lost, "wrong_id": 0, "errors": 0,
                "split": {"requests": 100, "model_cpu_seconds": model_cpu}}

    rounds = [{"refill": phase(30.0, model_cpu=0.46), "no_refill": phase(20.0)},
              {"refill": phase(20.0), "no_refill": phase(25.0)},
              {"refill": phase(18.0, lost=1), "no_refill": {**phase(20.0), "split": None}}]
    got = load_pair.medians(rounds)
    assert got["p99_ratios"] == pytest.approx([1.5, 0.8, 0.9]) and got["p99_ratio_median"] == pytest.approx(0.9)
    assert got["model_cpu_ratios"] == pytest.approx([1.15, 1.0]) and got["model_cpu_ratio_median"] == \
        pytest.approx(1.075)  # a round without a split has no model CPU ratio
    pair = {"precision": "int8", "workers": 1, "rounds": 3, "servers": {"refill": {"killed": False, "exit_code": 0},
                                                                        "no_refill": {"killed": False, "exit_code": 0}},
            "rates": [{"refill_fraction": 0.25, "offered_per_s": 80.0, "rounds": rounds, **got}]}
    found = load_pair.verdicts([pair])
    assert [(v["config"], v["value"], v["pass"]) for v in found] == [
        ("refill int8 w1", pytest.approx(0.9), True), ("refill int8 w1", 1, False)]  # the lost request counts
    assert "median of 3 interleaved rounds" in found[0]["target"]
    rows = load_pair.round_rows([pair])
    assert [(r["round"], r["first"]) for r in rows] == [(1, "refill"), (2, "no_refill"), (3, "refill")]
    assert rows[0]["refill_model_cpu_ms"] == pytest.approx(4.6) and rows[0]["model_cpu_ratio"] == pytest.approx(1.15)
    assert rows[2]["none_model_cpu_ms"] is None and rows[2]["model_cpu_ratio"] is None
    assert rows[1]["p99_ratio"] == pytest.approx(0.8)


# ---- the command line and the record -------------------------------------------------------------


@pytest.mark.parametrize("flags, message", [
    (["--quick"], "need their own --json"),
    (["--toy", "--json", os.path.join(REPO, "benchmarks", "results", "x.json")], "need their own --json"),
    (["--concurrency", "300", "--max-queue", "256", "--json", "TMP"], "--max-queue 256"),
    (["--server", "/nonexistent/acl-serve", "--json", "TMP"], "not found"),
    (["--calibrate", "max-drop=1", "--threshold", "0.2", "--json", "TMP"], "leave --threshold out"),
    (["--calibrate", "max-drop", "--json", "TMP"], "budget 'max-drop' has no '='"),
    (["--interleave", "-1", "--json", "TMP"], "--interleave -1: rounds must be >= 0"),
])
def test_bad_flags_are_refused_with_a_line_naming_the_fix(flags, message, tmp_path, capsys):
    import serve_load

    argv = ["--server", __file__] + [str(tmp_path / "x.json") if f == "TMP" else f for f in flags]
    with pytest.raises(SystemExit):
        serve_load.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_record_holds_setup_results_and_verdicts_and_is_written_whole(tmp_path, monkeypatch, capsys):
    import serve_load

    class FakeReference:
        def __init__(self, folder, precision, sentences, args):
            self.engine = type("E", (), {"label_names": lambda self: ["1", "0"]})()

    def fake_run(args, cfg, folder, sentences, ref, expected, labels, tmp, same_rates=()):
        if not cfg.refill:
            raise RuntimeError("acl-serve exited (1) before it was ready")
        res = _result(cfg.refill, cfg.workers, 90.0, 60.0, 1.5, 29.0, 10.0)
        phase = {k: 1.0 for k in serve_load.COLUMNS[2:-1]}
        return {**res, "config": cfg.name, "precision": cfg.precision, "peak_rss_mb_per_worker": [300.0],
                "saturation": {**res["saturation"], **phase},
                "rates": [{**r, **phase, "fraction": f, "p99_ms": 29.0} for r, f in zip(res["rates"] * 2, (0.5, 1.0))]}

    monkeypatch.setattr(serve_load, "model_and_sentences", lambda args: (str(tmp_path / "onnx"), ["a", "b"]))
    monkeypatch.setattr(load_server, "acl_predict", lambda *a: [])
    monkeypatch.setattr(serve_load, "int8_method", lambda folder: {"kind": "static"})
    monkeypatch.setattr(serve_load, "Reference", FakeReference)
    monkeypatch.setattr(serve_load, "run_config", fake_run)
    out = tmp_path / "load.json"
    got = serve_load.main(["--server", __file__, "--json", str(out), "--refill", "on", "off", "--precision",
                           "int8", "--workers", "2", "--work", str(tmp_path), "--rates", "0.5", "1.0"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(got))
    assert [r["config"] for r in got["results"]] == ["refill int8 w2", "no-refill int8 w2"]
    assert got["setup"]["onnx"] == "onnx" and got["setup"]["rates"] == [0.5, 1.0]
    assert got["setup"]["int8_method"] == {"kind": "static"}
    assert {v["config"] for v in got["verdicts"]} == {"refill int8 w2", "no-refill int8 w2"}
    failed = [v for v in got["verdicts"] if v["config"] == "no-refill int8 w2"]  # the others still measured
    assert [v["pass"] for v in failed] == [False] and "before it was ready" in got["results"][1]["failed"]
    assert (tmp_path / "load.png").stat().st_size > 0
    printed = capsys.readouterr()
    assert re.search(r"no-refill int8 w2 +failed", printed.out) and "# targets" in printed.out
    assert "no-refill int8 w2: failed: acl-serve exited (1)" in printed.err
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    with pytest.raises(SystemExit):  # and is not replaced without --force
        serve_load.parse_args(["--server", __file__, "--json", str(out)])


def test_calibrate_serves_at_the_threshold_the_sweep_picks(tmp_path, monkeypatch):
    import serve_load

    ckpt = tmp_path / "run" / "checkpoint_best.pt"
    (ckpt.parent / "early_exit").mkdir(parents=True)
    setting = lambda t, acc, speed: {"policy": "entropy", "threshold": t, "layer_speedup": speed,  # noqa: E731
                                     "metrics": {"accuracy": acc}}
    sweep = {"primary_metric": "accuracy", "per_exit": [{"metrics": {"accuracy": 80.0}}] * 2 + [
        {"metrics": {"accuracy": 90.0}}], "settings": [setting(0.1, 89.9, 1.2), setting(0.4, 89.2, 2.5),
                                                     setting(0.6, 88.0, 3.0)]}
    (ckpt.parent / "early_exit" / "early_exit.json").write_text(json.dumps(sweep))
    monkeypatch.setattr(serve_load, "load", lambda args: (str(ckpt), None, [], [], None))
    args = serve_load.parse_args(["--server", __file__, "--json", str(tmp_path / "x.json"), "--calibrate",
                                  "max-drop=1.0", "--work", str(tmp_path)])
    got = serve_load.calibrated(args)
    assert args.threshold == 0.4 and got["threshold"] == 0.4 and got["budget"] == "max-drop=1"
    assert got["sweep"] == os.path.join("run", "early_exit", "early_exit.json")
    args.calibrate = serve_load._budget("max-drop=0.01")
    with pytest.raises(SystemExit, match="no entropy threshold keeps accuracy within 0.01"):
        serve_load.calibrated(args)


# ---- end to end ----------------------------------------------------------------------------------


@pytest.mark.slow  # 80-110 s on 2 busy cores: the toy model trained (fairseq-train), two servers, ~1000 requests
def test_a_quick_run_serves_every_sentence_as_acl_predict_does(tmp_path):
    import serve_load

    out = tmp_path / "load.json"
    got = serve_load.main(["--toy", "--quick", "--refill", "on", "off", "--precision", "fp32", "--workers", "1",
                           "--work", str(tmp_path / "work"), "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(got))
    assert [r["config"] for r in got["results"]] == ["refill fp32 w1", "no-refill fp32 w1"]
    n = got["setup"]["sentences"]
    assert n == 64
    for res in got["results"]:
        assert res["answers"]["sentences"] == n and res["answers"]["mismatches"] == 0
        assert res["answers"]["compared"] >= res["saturation"]["ok"] > 0
        for phase in [res["saturation"]] + res["rates"]:
            assert phase["sent"] == phase["ok"] + phase["n_503"] and phase["errors"] == phase["lost"] == 0
        assert [r["fraction"] for r in res["rates"]] == [0.25, 0.5, 0.75, 1.0, 1.25]
        assert all(r["planned"] == 48 and r["throughput_per_s"] > 0 for r in res["rates"])
        assert res["reference"]["full_batched_per_s"] > 0 and len(res["reference"]["rounds"]) == 2
        assert 1.0 <= res["layer_speedup"] <= 3.0  # the toy model has 3 layers
        assert res["server"] == {**res["server"], "exit_code": 0, "killed": False, "left": False}
        assert len(res["peak_rss_mb_per_worker"]) == 1 and res["peak_rss_mb_per_worker"][0] > 50
        assert res["metrics"]["fill_saturation"]["0"]["calls"] > 0  # the server's own metrics were read
        assert res["full_depth_served"]["split"]["requests"] > 0  # and its full-depth phase's split
    kept = [v for v in got["verdicts"] if v["bound"] == 0]  # answers, none lost, the server's count, SIGTERM, errors
    assert len(kept) == 10 and all(v["pass"] for v in kept)
    on, off = got["results"]  # no refill also ran refill's own rates, those it could carry
    assert on["same_rate_as_refill"] == []
    assert [(s["refill_fraction"], s["offered_per_s"]) for s in off["same_rate_as_refill"]] == \
        [(r["fraction"], r["offered_per_s"]) for r in on["rates"]]
    for s in off["same_rate_as_refill"]:
        assert s.get("skipped") or (s["errors"] == s["lost"] == 0 and s["sent"] == s["ok"] + s["n_503"] > 0)
    assert (tmp_path / "load.png").stat().st_size > 0


@pytest.mark.slow  # two live servers and the toy model: about 40 s
def test_interleave_runs_refills_rates_on_both_live_servers_in_turn(tmp_path):
    import serve_load

    got = serve_load.main(["--toy", "--quick", "--refill", "on", "off", "--precision", "fp32", "--workers", "1",
                           "--rates", "0.5", "--interleave", "2", "--work", str(tmp_path / "work"), "--json",
                           str(tmp_path / "load.json")])
    on, off = got["results"]
    assert off["same_rate_as_refill"] == []  # the interleaved rounds take the place of the single phases
    (pair,) = got["interleaved"]
    (rate,) = pair["rates"]
    assert (pair["precision"], pair["workers"], pair["rounds"]) == ("fp32", 1, 2)
    assert rate["offered_per_s"] == on["rates"][0]["offered_per_s"] and len(rate["rounds"]) == 2
    for r in rate["rounds"]:
        for side in ("refill", "no_refill"):
            assert r[side]["ok"] == r[side]["sent"] > 0 and r[side]["errors"] == r[side]["lost"] == 0
            assert r[side]["split"]["requests"] == r[side]["ok"]  # each round's own split, from /metrics
    assert len(rate["p99_ratios"]) == 2 and rate["p99_ratio_median"] > 0
    assert all(s["exit_code"] == 0 for s in pair["servers"].values())
    assert [v["pass"] for v in got["verdicts"] if v["target"].startswith("interleaved:")] == [True]


METRICS = """# HELP acl_requests_total requests answered, by route and HTTP status
# TYPE acl_requests_total counter
acl_requests_total{route="infer",status="200"} 40.0
acl_requests_total{route="infer",status="503"} 2.0
acl_requests_total{route="predict",status="200"} 7.0
acl_batch_fill_sum{layer="0"} 3.5
acl_batch_fill_count{layer="0"} 5.0
acl_batch_fill_bucket{layer="1",le="0.125"} 1.0
acl_batch_fill_sum{layer="10"} 0.5
acl_batch_fill_count{layer="10"} 2.0
acl_batch_fill_sum{layer="2"} 0.0
acl_batch_fill_count{layer="2"} 0.0
"""


def test_the_servers_own_counts_are_read_from_its_metrics():
    got = load_stats.server_side(load_stats.parse_metrics(METRICS))
    assert got["answered"] == {"infer 200": 40.0, "infer 503": 2.0, "predict 200": 7.0}
    fill = load_stats.fill_between(None, got)
    assert list(fill) == ["0", "2", "10"]
    assert fill["0"] == {"calls": 5, "mean_fill": pytest.approx(0.7)}
    assert fill["2"] == {"calls": 0, "mean_fill": None}
    later = load_stats.server_side(load_stats.parse_metrics(
        METRICS.replace("sum{layer=\"0\"} 3.5", "sum{layer=\"0\"} 5.5")
        .replace("count{layer=\"0\"} 5.0", "count{layer=\"0\"} 9.0")))
    assert load_stats.fill_between(got, later)["0"] == {"calls": 4, "mean_fill": pytest.approx(0.5)}
    assert load_stats.fill_between(got, later)["10"] == {"calls": 0, "mean_fill": None}
    assert load_stats.fill_between(got, None) is None
    res = _result(True, 1, 90.0, 60.0, 1.5, 29.0, 10.0)
    for client, ok in ((42, True), (41, False), (43, False)):  # the predict route's answers are not the client's
        found = load_stats.verdicts([{**res, "metrics": got, "client_answered": client}], n_sentences=10)
        assert _pick(found, "cTrue1", "|answers the server counted (42)")["pass"] is ok
