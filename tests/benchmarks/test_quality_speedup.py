"""benchmarks/quality.py: multi-exit methods compared at fixed layer speed-ups, and the gated SCL against SCL,
paired by seed."""
import json

import pytest

import _quality_tables
import quality
from acl_fairseq.inference import flops


def fake_run(root, task, method, seed, acc_at):
    """A run folder whose early_exit.json has an entropy curve through (speed-up, accuracy) points."""
    run = root / task / method / f"seed{seed}"
    (run / "early_exit").mkdir(parents=True)
    ee = {"num_layers": 6, "primary_metric": "accuracy",
          "per_exit": [{"layer": 6, "metrics": {"accuracy": acc_at[0][1]}}],
          "settings": [{"policy": "entropy", "threshold": i / 10, "layer_speedup": x, "metrics": {"accuracy": y}}
                       for i, (x, y) in enumerate(acc_at[1:])]}
    (run / "early_exit" / "early_exit.json").write_text(json.dumps(ee))
    (run / "result.json").write_text(json.dumps({"early_exit_json": "early_exit/early_exit.json"}))


def test_speedup_table_and_paired_differences(tmp_path):
    for seed, shift in ((1, 0.0), (2, 1.0)):
        fake_run(tmp_path, "SST-2", "multi_exit_ce", seed, [(1, 90 + shift), (2, 80 + shift), (3, 70 + shift)])
        fake_run(tmp_path, "SST-2", "multi_exit_kd", seed, [(1, 90 + shift), (2, 82 + shift), (3, 69 + shift)])
    fake_run(tmp_path, "SST-2", "acl_cross_layer", 1, [(1, 90), (1.8, 85)])  # stops short of 2x
    profiles = quality.speedup_profiles(str(tmp_path), "SST-2")
    assert profiles["multi_exit_kd"][2]["2"] == 83.0 and profiles["multi_exit_ce"][1]["1.5"] == 85.0
    assert profiles["acl_cross_layer"][1]["2"] is None and profiles["acl_cross_layer"][1]["area"] is None
    md = quality.speedup_markdown(str(tmp_path), "SST-2")
    assert "| multi_exit_ce | 2 | 85.50 ± 0.71 | 80.50 ± 0.71 | 70.50 ± 0.71 |" in md
    # kd minus ce at 2x is +2 in both seeds, at 3x -1 in both; acl_cross_layer has no 2x value to pair
    kd_row = next(line for line in md.splitlines() if line.startswith("| multi_exit_kd − multi_exit_ce"))
    # no spread between the seeds: an interval of one point, which excludes 0
    assert "+2.00 [+2.00, +2.00] (2 of 2 seeds ahead): ahead" in kd_row
    assert "−1.00 [−1.00, −1.00] (0 of 2 seeds ahead): behind" in kd_row
    fake_run(tmp_path, "SST-2", "acl_cross_layer", 2, [(1, 91), (2.5, 80)])  # reaches 2x: one of two seeds there
    md = quality.speedup_markdown(str(tmp_path), "SST-2")
    assert "| acl_cross_layer | 2 | 87.10 ± 0.32 | 83.67 (n=1) | - |" in md  # 86.875 and 87.33; 83.67
    acl_row = next(line for line in md.splitlines() if line.startswith("| acl_cross_layer − multi_exit_ce"))
    assert acl_row.count("| - ") == 2  # 3x and the area: no curve reaches them


def fake_gated(root, task, method, seed, value, epochs=()):
    """A single-exit run with its best value and, for a gated one, fairseq's per-epoch train stats."""
    run = root / task / method / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"best_metric": "mcc", "best_value": value}))
    lines = [f'2026-01-01 | INFO | train | {{"epoch": {i + 1}, "train_loss": "1.2", "train_grad_cos": "{c}", '
             f'"train_conflict_rate": "{r}", "train_num_updates": "{10 * (i + 1)}"}}'
             for i, (c, r) in enumerate(epochs)]
    (run / "train.log").write_text("\n".join(["2026-01-01 | INFO | valid | {\"epoch\": 1}"] + lines) + "\n")


def test_gated_scl_is_paired_with_scl_by_seed_with_its_drop_rate(tmp_path):
    for seed, base, gated in ((1, 40.0, 41.5), (2, 42.0, 41.0), (3, 44.0, 45.0)):
        fake_gated(tmp_path, "CoLA", "scl", seed, base)
        fake_gated(tmp_path, "CoLA", "scl_grad", seed, gated, epochs=[(0.02, 0.5), (0.1, 0.3), (0.2, 0.1)])
    fake_gated(tmp_path, "RTE", "scl_grad", 1, 55.0, epochs=[(0.0, 0.4)])  # no ungated run: nothing to pair
    pairs = quality.gate_pairs(str(tmp_path), ["RTE", "CoLA"], quality.GATED)
    assert list(pairs) == ["CoLA"]
    p = pairs["CoLA"]["scl_grad"]
    assert p["seeds"] == [1, 2, 3] and p["base"] == [40.0, 42.0, 44.0] and p["gated"] == [41.5, 41.0, 45.0]
    assert p["conflict_rate"] == [0.3, 0.3, 0.3] and p["grad_cos"][0] == [0.02, 0.2]
    md = quality.gate_markdown(pairs)
    row = next(line for line in md.splitlines() if line.startswith("| CoLA |"))
    # differences +1.5, -1.0, +1.0: mean +0.50, std 1.323, t(0.975, 2) = 4.303: +0.50 ± 3.29, two of three seeds
    # ahead, the interval holds 0; 30% of updates dropped in each seed
    assert ("| scl_grad − scl | mcc | 1, 2, 3 | 42.00 ± 2.00 | 42.50 ± 2.18 | +0.50 [−2.79, +3.79] (2 of 3 seeds "
            "ahead): within noise (n = 3) |") in row
    assert p["verdict"] == "within noise (n = 3)" and p["ci95"] == pytest.approx([-2.786, 3.786], abs=1e-3)
    assert row.endswith("| 30.0%, 30.0%, 30.0% | 0.02→0.20, 0.02→0.20, 0.02→0.20 |")
    assert quality.gate_markdown({}) == ""


def test_quality_pairs_by_seed_with_interval(tmp_path):
    for seed, ce, scl in ((1, 50.0, 52.0), (2, 51.0, 53.5), (3, 49.0, 50.5)):
        fake_gated(tmp_path, "CoLA", "ce", seed, ce)
        fake_gated(tmp_path, "CoLA", "scl", seed, scl)
    fake_gated(tmp_path, "CoLA", "acl_embed", 4, 60.0)  # no ce of seed 4: nothing to pair
    pairs = quality.quality_pairs(str(tmp_path), ["CoLA"])
    assert list(pairs["CoLA"]) == ["scl − ce"]
    p = pairs["CoLA"]["scl − ce"]
    # +2.0, +2.5, +1.5: mean 2.0, std 0.5, half-width 4.303 * 0.5 / sqrt(3) = 1.24: the interval excludes 0
    assert p["diffs"] == [2.0, 2.5, 1.5] and p["ci95"] == pytest.approx([0.758, 3.242], abs=1e-3)
    assert p["verdict"] == "ahead" and p["ahead"] == 3
    assert "| CoLA | scl − ce | mcc | 1, 2, 3 | +2.00 [+0.76, +3.24] (3 of 3 seeds ahead): ahead |" in \
        quality.quality_pairs_markdown(pairs)


def test_flops_axis_from_exit_shares_and_dev_lengths():
    lengths = {"shape": {"dim": 4, "ffn_dim": 6, "head_dim": 4}, "histogram": {"5": 1, "9": 3}}
    ee = {"exit_layers": [1, 2], "num_layers": 2, "primary_metric": "accuracy",
          "per_exit": [{"layer": 2, "metrics": {"accuracy": 90.0}}],
          "settings": [{"policy": "entropy", "threshold": 1.0, "layer_speedup": 2.0, "exit_fractions": [1.0, 0.0],
                        "metrics": {"accuracy": 80.0}},
                       {"policy": "entropy", "threshold": 0.5, "layer_speedup": 4 / 3, "exit_fractions": [0.5, 0.5],
                        "metrics": {"accuracy": 85.0}}]}
    shape = flops.Shape(4, 6, 4, 2, [1, 2])
    layer = (flops.layer_flops(5, 4, 6) + 3 * flops.layer_flops(9, 4, 6)) / 4  # the mean over the histogram
    head = flops.head_flops(shape)
    got = [s["layer_speedup"] for s in _quality_tables.flops_axis(ee, lengths)["settings"]]
    # every example at exit 1: one layer and one head, against two layers and one head
    assert got[0] == pytest.approx((2 * layer + head) / (layer + head))
    # half at exit 2, which also ran exit 1's head
    assert got[1] == pytest.approx((2 * layer + head) / (0.5 * (layer + head) + 0.5 * (2 * layer + 2 * head)))
    assert got[0] < 2.0 and got[1] < 4 / 3  # the heads that ran make it a little less than in layers
    assert ee["settings"][0]["layer_speedup"] == 2.0  # the record is left as it was
