"""Smoke tests of the benchmarks at a tiny size: they run and write rows with the documented fields.

No timing assertions (the numbers depend on the machine and its load)."""
import json
import os

import pytest

import _converted
import helpers

REPO = helpers.REPO  # benchmarks/ is on the path: conftest.py

STEP_FIELDS = {"criterion", "scope", "model", "batch", "seq_len", "median_step_s", "ratio_to_ce", "peak_mem_mb"}
LATENCY_FIELDS = {"policy", "threshold", "batch", "avg_exit_layer", "layer_speedup", "wallclock_speedup"}


@pytest.fixture(autouse=True)
def _restore_threads():
    """The benchmarks' --threads sets torch's thread count for the whole process: put it back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # make test's 10 minutes: a benchmark at toy size, every criterion's model built: about 11 s
def test_step_time_smoke(tmp_path, capsys):
    import step_time

    out = tmp_path / "steps.json"
    step_time.main(["--model", "tiny", "--batch-size", "4", "--seq-len", "16", "--repeats", "1", "--warmup", "0",
                    "--mem-repeats", "1", "--threads", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert all(STEP_FIELDS <= set(r) for r in rows)
    got = {(r["criterion"], r["scope"], r["model"]) for r in rows}
    assert got == {
        ("sentence_ce", None, "tiny"),
        ("sentence_scl", None, "tiny"),
        ("acl_embed", None, "tiny"),
        ("acl_grad", "features", "tiny"),
        ("acl_grad", "params", "tiny"),
        ("sentence_ce", None, "tiny_multi_exit"),
        ("acl_cross_layer", "off", "tiny_multi_exit"),
        ("acl_cross_layer", "features", "tiny_multi_exit"),
        ("acl_cross_layer", "params", "tiny_multi_exit"),
    }
    for r in rows:
        assert r["batch"] == 4 and r["seq_len"] == 16
        assert r["median_step_s"] > 0 and r["ratio_to_ce"] > 0 and r["peak_mem_mb"] >= 0
        if r["criterion"] == "sentence_ce":
            assert r["ratio_to_ce"] == pytest.approx(1.0)
    assert "ratio_to_ce" in capsys.readouterr().out


def test_step_time_criteria_filter_keeps_the_baseline(tmp_path):
    import step_time

    out = tmp_path / "steps.json"
    step_time.main(["--model", "tiny", "--batch-size", "4", "--seq-len", "8", "--repeats", "1", "--warmup", "0",
                    "--mem-repeats", "0", "--no-multi-exit", "--criteria", "acl_embed", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["criterion"] for r in rows] == ["sentence_ce", "acl_embed"]
    assert all(r["peak_mem_mb"] is None for r in rows)


def test_early_exit_latency_smoke(tmp_path, capsys):
    import early_exit_latency

    out = tmp_path / "latency.json"
    early_exit_latency.main(["--model", "tiny", "--seq-len", "16", "--examples", "8", "--batch-size", "4",
                             "--points", "3", "--repeats", "1", "--threads", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert rows and all(LATENCY_FIELDS <= set(r) for r in rows)
    assert {r["batch"] for r in rows} == {1, 4}
    assert {r["policy"] for r in rows} == {"entropy"}
    layers = sorted(r["avg_exit_layer"] for r in rows)
    # the automatic thresholds reach both ends: everything at the first exit, nothing before the last
    assert layers[0] == pytest.approx(1.0) and layers[-1] == pytest.approx(3.0)
    for r in rows:
        assert r["layer_speedup"] == pytest.approx(3.0 / r["avg_exit_layer"])
        assert r["wallclock_speedup"] > 0
    assert "wallclock_speedup" in capsys.readouterr().out


def test_early_exit_latency_other_policies(tmp_path):
    import early_exit_latency

    out = tmp_path / "latency.json"
    early_exit_latency.main(["--model", "tiny", "--seq-len", "8", "--examples", "4", "--batch-size", "2",
                             "--policy", "confidence", "patience", "--confidence-thresholds", "0.9",
                             "--patience-values", "1", "--repeats", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert {(r["policy"], r["threshold"]) for r in rows} == {("confidence", 0.9), ("patience", 1)}


def test_quality_plan_runs_each_method_where_it_applies():
    import quality
    every = quality.SINGLE + list(quality.GATED) + quality.MULTI
    assert quality.methods_for("STS-B", every) == ["ce"]  # regression: no contrastive or multi-exit runs
    assert quality.methods_for("RTE", every) == quality.SINGLE + ["scl_grad"]  # the gated SCL runs where SCL does
    assert quality.methods_for("SST-2", every) == every  # the early-exit task
    assert quality.methods_for("RTE", every, multi_exit_tasks=("RTE",)) == every
    assert quality.methods_for("CoLA", ["acl_cross_layer"]) == []
    # per seed by default: RTE 4, CoLA 4, SST-2 6, STS-B 1 (the cost the docstring states); every method: RTE 5,
    # CoLA 5, SST-2 9, STS-B 1
    assert sum(len(quality.methods_for(t, quality.DEFAULT_METHODS)) for t in quality.TASKS) == 15
    assert sum(len(quality.methods_for(t, every)) for t in quality.TASKS) == 20


def test_quality_schedule_is_the_converted_table_and_a_stale_run_stops_it(tmp_path):
    import _glue_runs as glue_runs
    import quality

    assert set(_converted.PROTOCOL) == set(quality.TASKS)
    assert _converted.PROTOCOL["SST-2"]["train_subset"] == 2000 and _converted.PROTOCOL["RTE"]["train_subset"] is None
    rd = tmp_path / "RTE" / "ce" / "seed1"
    rd.mkdir(parents=True)
    sch = dict(_converted.PROTOCOL["RTE"])
    (rd / "command.sh").write_text(f"fairseq-train x --lr {sch['lr']:g} --exit-pooling {sch['pooling']} --max-epoch "
                                   f"{sch['epochs']} --adam-betas '(0.9,0.98)' --conventions c.json\n")
    _converted.check_finished(str(rd), sch)  # no result yet: nothing to check
    (rd / "result.json").write_text("{}")
    _converted.check_finished(str(rd), sch)  # the same schedule: it may be skipped
    assert glue_runs.trained_setting(str(rd))["conventions"] is True
    other = "mean" if sch["pooling"] == "cls" else "cls"
    with pytest.raises(SystemExit, match=f"trained with lr {sch['lr']:g}, {sch['pooling']} pooling.*now says lr "
                       f"{sch['lr']:g}, {other} pooling.*move the run away"):
        _converted.check_finished(str(rd), dict(sch, pooling=other))
    with pytest.raises(SystemExit, match=f"{sch['epochs']} epochs, but"):
        _converted.check_finished(str(rd), dict(sch, epochs=sch["epochs"] + 1))
    (rd / "command.sh").write_text(f"fairseq-train x --lr {sch['lr']:g} --exit-pooling {sch['pooling']} --max-epoch "
                                   f"{sch['epochs']}\n")  # the same schedule, from before the conventions record
    with pytest.raises(SystemExit, match="trained before the converted encoder carried its conventions record"):
        _converted.check_finished(str(rd), sch)


def test_quality_cost_is_read_from_the_training_logs(tmp_path):
    import quality
    done = "2026-01-01 00:00:00 | INFO | fairseq_cli.train | done training in {} seconds\n"
    for task, method, seed, seconds in [("RTE", "ce", 1, 600.0), ("RTE", "ce", 2, 1200.0), ("RTE", "ce", 3, 660.0),
                                        ("SST-2", "scl", 1, 240.0)]:
        rd = tmp_path / task / method / f"seed{seed}"
        rd.mkdir(parents=True)
        (rd / "train.log").write_text("epoch 001 | loss 0.7\n" + done.format(seconds))
    unfinished = tmp_path / "RTE" / "scl" / "seed1"  # no "done training" line: not counted
    unfinished.mkdir(parents=True)
    (unfinished / "train.log").write_text("epoch 001 | loss 0.7\n")

    minutes = quality.training_minutes(str(tmp_path))
    assert minutes == {"RTE": {"ce": [10.0, 20.0, 11.0]}, "SST-2": {"scl": [4.0]}}
    md = quality.cost_markdown(minutes)
    assert "| RTE | ce | 11 | 10-20 | 3 |" in md  # median, range, count
    assert "| SST-2 | scl | 4 | 4-4 | 1 |" in md
    assert "One seed of the runs above: 15 run-minutes" in md  # 11 + 4
    assert quality.cost_markdown({}) == ""


def test_quality_pairs_the_multi_exit_methods_by_seed(tmp_path):
    import quality

    def run(method, seed, accs):
        rd = tmp_path / "SST-2" / method / f"seed{seed}"
        (rd / "early_exit").mkdir(parents=True)
        (rd / "result.json").write_text(json.dumps({"early_exit_json": "early_exit/early_exit.json"}))
        (rd / "early_exit" / "early_exit.json").write_text(json.dumps({"primary_metric": "accuracy", "per_exit": [
            {"layer": i + 1, "metrics": {"accuracy": a, "f1": 0.0}} for i, a in enumerate(accs)]}))

    run("multi_exit_ce", 1, [70.0, 80.0])
    run("multi_exit_ce", 2, [72.0, 82.0])
    run("multi_exit_ce", 3, [50.0, 50.0])  # no acl_cross_layer seed 3: not paired
    run("acl_cross_layer", 1, [71.0, 79.0])
    run("acl_cross_layer", 2, [75.0, 82.0])
    md = quality.paired_exit_markdown(str(tmp_path), "SST-2")
    assert "(seeds 1, 2)" in md
    assert "| difference | +2.00 | -0.50 |" in md  # (1 + 3) / 2, (-1 + 0) / 2
    assert "| ahead | 2 of 2 | 0 of 2 |" in md  # a tie is not ahead
    assert quality.paired_exit_markdown(str(tmp_path), "RTE") == ""


def _hf_speed(tmp_path, *flags):
    import importlib.util

    from tiny_hf import write_bert

    write_bert(str(tmp_path / "hf"), model_cls="BertModel")
    spec = importlib.util.spec_from_file_location("hf_speed", os.path.join(REPO, "benchmarks", "hf_speed.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.main(["--hf-dir", str(tmp_path / "hf"), "--shapes", "2x8", "--repeats", "2", "--mem-repeats", "1",
                       "--json", str(tmp_path / "s.json"), *flags])


@pytest.mark.slow  # fairseq-train runs / model loads: kept out of make test's 10 minutes
def test_hf_speed_at_toy_size(tmp_path):
    """The HF-vs-plugin step benchmark on a tiny random BERT: every system timed, ratios against HF."""
    rows = _hf_speed(tmp_path, "--modes", "eager", "--hf-modes", "eager", "--trainer-modes", "eager")
    criteria = ["sentence_ce", "sentence_ce/all exits", "sentence_scl", "acl_embed", "acl_grad/features",
                "acl_grad/params", "acl_cross_layer/features/all exits", "multi_exit_kd/all exits"]
    assert [r["system"] for r in rows] == ["hf"] + [f"plugin/{c}" for c in criteria] + ["trainer"] + [
        f"acl_hf/{c}" for c in criteria]
    assert rows[0]["ratio_to_hf"] == 1.0 and all(r["ratio_to_hf"] > 0 and r["peak_mem_mb"] is not None for r in rows)
    assert len(json.load(open(tmp_path / "s.json"))) == 18
    ce = {r["system"]: r["ratio_to_ce"] for r in rows}  # each against CE with the same exits, in its own trainer
    assert ce["plugin/sentence_ce"] == 1.0 and ce["plugin/sentence_ce/all exits"] == 1.0
    assert ce["trainer"] == 1.0 and ce["acl_hf/sentence_ce/all exits"] == 1.0  # AclTrainer's one-exit CE: vs Trainer
    assert all(ce[s] > 0 for s in ce if s != "hf")
    trainer = {r["system"]: r["ratio_to_trainer"] for r in rows}
    assert trainer["trainer"] == 1.0 and all(v > 0 for v in trainer.values())


@pytest.mark.slow  # compiles (aot_eager: traced, no code generated) every mode of both sides: about 90 s
def test_hf_speed_times_every_mode_side_by_side(tmp_path):
    from acl_torch import acceleration

    rows = _hf_speed(tmp_path, "--criteria", "acl_embed", "--compile-backend", "aot_eager", "--trainer-modes", "eager",
                     "compiled")
    if acceleration.read_cpu_kind().bf16_unit is None:  # left out in one line (the test below), the rest timed
        assert {m for _, m in ((r["system"], r["mode"]) for r in rows)} == {"eager", "compiled"}
        return
    modes = [(r["system"], r["mode"]) for r in rows]
    assert modes[:3] == [("hf", "eager"), ("hf", "compiled"), ("hf", "bf16")]
    assert {m for s, m in modes if s == "plugin/acl_embed"} == {"eager", "compiled", "bf16", "compiled-bf16"}
    assert {m for s, m in modes if s == "acl_hf/acl_embed"} == {"eager", "compiled"}  # the Trainer's torch_compile
    assert all(r["cpu_kind"] == acceleration.read_cpu_kind().describe() and r["gflops"] > 0 for r in rows)
    assert all((r["compile_s"] is None) == ("compiled" not in r["mode"]) for r in rows)
    assert all(r["ratio_to_ce"] > 0 for r in rows if r["system"].startswith("plugin/"))


@pytest.mark.slow  # model loads
def test_hf_speed_leaves_compiled_modes_out_in_one_line_where_compiling_fails(tmp_path, capsys):
    rows = _hf_speed(tmp_path, "--criteria", "sentence_ce", "--modes", "eager", "compiled", "--hf-modes", "eager",
                     "compiled", "--trainer-modes", "eager", "compiled", "--compile-backend", "no_such_backend")
    assert {(r["system"], r["mode"]) for r in rows} == {("hf", "eager"), ("plugin/sentence_ce", "eager"),
                                                        ("trainer", "eager"), ("acl_hf/sentence_ce", "eager")}
    assert capsys.readouterr().out.count("compiled modes left out: torch.compile (backend no_such_backend)") == 1


@pytest.mark.slow  # model loads
def test_hf_speed_leaves_bf16_modes_out_in_one_line_on_a_cpu_without_bf16_units(tmp_path, capsys, monkeypatch):
    """README's speed command with its default modes on an AVX2-only EPYC: the fp32 modes timed, not a
    ValueError from the bf16 check."""
    from acl_torch import acceleration
    from acl_torch.machine import read_cpu_kind
    from test_acceleration import ROME

    monkeypatch.setattr(acceleration, "read_cpu_kind", lambda text=None: read_cpu_kind(ROME))
    rows = _hf_speed(tmp_path, "--criteria", "sentence_ce", "--modes", "eager", "bf16", "--hf-modes", "eager", "bf16",
                     "--trainer-modes", "eager", "bf16")
    assert {(r["system"], r["mode"]) for r in rows} == {("hf", "eager"), ("plugin/sentence_ce", "eager"),
                                                        ("trainer", "eager"), ("acl_hf/sentence_ce", "eager")}
    assert capsys.readouterr().out.count("# bf16 modes left out: this CPU (AMD EPYC 7B12, AVX2 only") == 1


@pytest.mark.parametrize("needs, kept", [(0, ["eager", "bf16"]), (1, ["eager", "compiled"])])
def test_hf_speed_leaves_out_only_the_modes_that_need_what_is_missing(needs, kept, capsys):
    import argparse

    import hf_speed

    args = argparse.Namespace(modes=list(hf_speed.MODES), hf_modes=["eager", "compiled", "bf16"],
                              trainer_modes=list(hf_speed.MODES))
    hf_speed.leave_out(args, needs, "some modes", lambda: "the reason")
    assert args.modes == args.hf_modes == args.trainer_modes == kept
    assert capsys.readouterr().out == "# some modes left out: the reason\n"
    hf_speed.leave_out(args, needs, "some modes", lambda: None)  # nothing missing: nothing dropped, nothing said
    assert args.modes == kept and capsys.readouterr().out == ""


def test_hf_speed_verdicts_claim_nothing_about_amx_on_another_cpu():
    import hf_speed

    def row(system, mode, t, unit, ratio_to_ce=None):
        return {"system": system, "mode": mode, "batch": 16, "seq_len": 128, "threads": 1, "median_step_s": t,
                "ratio_to_ce": ratio_to_ce, "cpu_kind": "X", "bf16_unit": unit}

    def rows(unit):
        return [row("hf", "eager", 2.0, unit), row("hf", "compiled", 1.8, unit), row("hf", "bf16", 1.0, unit),
                row("plugin/sentence_ce", "eager", 1.9, unit, 1.0), row("plugin/sentence_ce", "bf16", 0.9, unit, 1.0),
                row("plugin/acl_grad/params", "eager", 3.5, unit, 1.84),
                row("plugin/acl_embed", "bf16", 0.95, unit, 1.05)]

    def verdicts(unit):  # (value to 2 places, pass) of the targets whose name holds each key
        got = hf_speed.verdicts(rows(unit), "CMD")
        return {key: [(round(t["value"], 2), t["pass"]) for t in got if key in t["target"]] for key in (
            "fp32: plugin sentence_ce", "over HF eager fp32", "over HF bf16", "acl_grad/params", "acl_embed bf16",
            "not measured on AMX: run `CMD`")}

    zen, amx = verdicts("avx512_bf16"), verdicts("amx")
    assert zen["fp32: plugin sentence_ce"] == [(0.95, False)]  # 1.8 / 1.9: behind HF compiled
    assert zen["over HF eager fp32"] == [(2.22, None)] and zen["over HF bf16"] == [(1.11, None)]  # no AMX verdict
    assert len(zen["not measured on AMX: run `CMD`"]) == 2 and amx["not measured on AMX: run `CMD`"] == []
    assert zen["acl_grad/params"] == [(1.84, False)] and zen["acl_embed bf16"] == [(1.05, True)]
    assert amx["over HF eager fp32"] == [(2.22, True)] and amx["over HF bf16"] == [(1.11, True)]  # 2.0 / 0.9


def test_hf_speed_holds_an_all_exit_criterion_against_ce_with_all_exits():
    import hf_speed

    labels = [r[0] + "/" + r[2] for r in hf_speed.chosen(["acl_cross_layer"])]
    assert labels == ["sentence_ce/top", "sentence_ce/all", "acl_cross_layer/all"]
    assert [r[0] + "/" + r[2] for r in hf_speed.chosen(["acl_embed"])] == ["sentence_ce/top", "acl_embed/top"]
    assert {r[0] for r in hf_speed.chosen(None)} >= {"sentence_scl", "acl_cross_layer", "multi_exit_kd"}
    rows = [{"system": s, "mode": "eager", "batch": 16, "seq_len": 128, "threads": 1, "median_step_s": 1.0,
             "ratio_to_ce": r, "cpu_kind": "X", "bf16_unit": None}
            for s, r in (("plugin/sentence_ce/all exits", 1.0), ("plugin/acl_cross_layer/features/all exits", 1.05),
                         ("plugin/multi_exit_kd/all exits", 1.2))]
    got = {t["target"]: (t["value"], t["pass"]) for t in hf_speed.verdicts(rows, "CMD")}
    assert got["cost over CE: plugin/acl_cross_layer/features/all exits eager"] == (1.05, True)
    assert got["cost over CE: plugin/multi_exit_kd/all exits eager"] == (1.2, False)
    assert not any("cost over CE: plugin/sentence_ce" in name for name in got)


def test_optimizer_time_at_toy_size(tmp_path):
    import optimizer_time

    rows = optimizer_time.main(["--model", "tiny", "--repeats", "2", "--json", str(tmp_path / "o.json")])
    assert ([(r["layout"], r["optimizer"]) for r in rows][:2]
            == [("tensors", "fairseq adam"), ("tensors", "adamw_torch fused")])
    assert {r["layout"] for r in rows} == {"tensors", "flat"} and all(r["median_step_ms"] > 0 for r in rows)


def test_hf_parity_summary_pairs_by_seed_and_names_settings():
    import argparse

    import hf_parity

    runs = {"matched": {"RTE": {
        "plugin": [{"seed": 1, "metric": 60.0, "samples_per_s": 3.0}, {"seed": 2, "metric": 62.0, "samples_per_s": 3.2},
                   {"seed": 3, "metric": 58.0, "samples_per_s": None}],
        "hf": [{"seed": 2, "metric": 61.0, "samples_per_s": 2.9}, {"seed": 1, "metric": 63.0, "samples_per_s": 3.1}]}}}
    entry = hf_parity.summarize(runs)["matched"]["RTE"]
    assert entry["paired"]["seeds"] == [1, 2] and entry["paired"]["diffs"] == [-3.0, 1.0]
    assert entry["paired"]["within_target"] is True  # |mean -1| <= max(1, std 2.83)
    assert entry["plugin"]["values"] == [60.0, 62.0, 58.0] and entry["plugin"]["samples_per_s"] == 3.1
    args = argparse.Namespace(pair_format="double", head_dropout=None, clip_norm=1.0, adam_betas=None, adam_eps=None,
                              hf_max_len=512, hf_batching="shuffle", no_segment=True, hf_fold_token_types=False)
    assert hf_parity.setting_name(args, 3e-5, "mean") == "lr3e-05_mean_pair_format=double_clip_norm=1.0_no_segment"
    args.hf_batching, args.hf_fold_token_types, args.hf_max_len = "fixed", True, 128
    name = hf_parity.setting_name(args, 3e-5, "mean")
    assert name == ("lr3e-05_mean_pair_format=double_clip_norm=1.0_hf_max_len=128_hf_batching=fixed_no_segment"
                    "_hf_fold_token_types")
    assert hf_parity.plugin_setting(name) == "lr3e-05_mean_pair_format=double_clip_norm=1.0_no_segment"
    assert "| matched | RTE | 60.0, 62.0, 58.0 |" in hf_parity.markdown(hf_parity.summarize(runs), "cmd")
    assert set(_converted.PROTOCOL) >= {"RTE", "STS-B", "SST-2"}


def test_hf_parity_hf_only_switches_pair_with_the_plugin_runs_without_them(tmp_path, monkeypatch):
    import hf_parity

    def result(path, payload):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f)

    parity = tmp_path / "parity"
    for seed, value in ((1, 57.0), (2, 56.0)):
        rd = parity / "lr2e-05_cls_pair_format=double" / "runs" / "RTE" / "ce" / f"seed{seed}"
        result(str(rd / "result.json"), {"task": "RTE", "best_value": value})
        (rd / "train.log").write_text("")
    for setting in ("lr2e-05_cls_pair_format=double", "lr2e-05_cls_pair_format=double_hf_batching=fixed"):
        for seed, value in ((1, 58.0), (2, 59.0)):
            result(str(parity / setting / "hf" / "RTE" / f"seed{seed}" / "result.json"),
                   {"best": {"accuracy": value}, "primary_metric": "accuracy", "train_samples_per_s": 3.0})
    summary = hf_parity.summarize(hf_parity.collect(str(tmp_path)))
    fixed = summary["lr2e-05_cls_pair_format=double_hf_batching=fixed"]["RTE"]
    assert fixed["plugin"]["values"] == [57.0, 56.0] and fixed["paired"]["diffs"] == [-1.0, -3.0]
    assert summary["lr2e-05_cls_pair_format=double"]["RTE"]["plugin"]["values"] == [57.0, 56.0]

    args = hf_parity.build_parser().parse_args(["--tasks", "RTE", "--seeds", "1", "--pair-format", "double",
                                                "--hf-batching", "fixed", "--work", str(tmp_path)])
    roots = {system: os.path.basename(root) for system, *_, root in hf_parity.plan(args)}
    assert roots == {"plugin": "lr2e-05_cls_pair_format=double",
                     "hf": "lr2e-05_cls_pair_format=double_hf_batching=fixed"}


def test_hf_parity_samples_per_s_uses_each_epochs_train_wall(tmp_path):
    # fairseq logs the epoch's time in train_step as train_train_wall; train_wall is the run's running total
    import hf_parity

    log = tmp_path / "train.log"
    log.write_text("".join(
        f'2026-12-01 | INFO | train | {{"epoch": {e}, "train_train_wall": "100", "train_wall": "{105 * e}"}}\n'
        for e in (1, 2, 3)) + '2026-12-01 | INFO | valid | {"epoch": 3, "valid_wall": "400"}\n')
    assert hf_parity._fairseq_samples_per_s(str(log), 250) == pytest.approx(2.5)


def test_report_keeps_the_earlier_json_when_the_rows_cannot_be_written(tmp_path, capsys):
    """A row that json cannot encode must not leave a truncated file where the earlier results were."""
    import harness

    path = tmp_path / "rows.json"
    harness.report([{"a": 1}], ["a"], {}, str(path))
    first = json.loads(path.read_text())
    assert [r["a"] for r in first] == [1]
    with pytest.raises(TypeError):
        harness.report([{"a": object()}], ["a"], {}, str(path))
    assert json.loads(path.read_text()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.json"]
