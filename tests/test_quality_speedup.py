"""benchmarks/quality.py: multi-exit methods compared at fixed layer speed-ups, paired by seed."""
import json

import quality


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
    assert "+2.00 ± 0.00 (2/2 ahead)" in kd_row and "-1.00 ± 0.00 (0/2 ahead)" in kd_row
    fake_run(tmp_path, "SST-2", "acl_cross_layer", 2, [(1, 91), (2.5, 80)])  # reaches 2x: one of two seeds there
    md = quality.speedup_markdown(str(tmp_path), "SST-2")
    assert "| acl_cross_layer | 2 | 87.10 ± 0.32 | 83.67 (n=1) | - |" in md  # 86.875 and 87.33; 83.67
    acl_row = next(line for line in md.splitlines() if line.startswith("| acl_cross_layer − multi_exit_ce"))
    assert acl_row.count("| - ") == 2  # 3x and the area: no curve reaches them
