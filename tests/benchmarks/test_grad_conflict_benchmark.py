"""benchmarks/grad_conflict.py --toy: the pilot's measurement end to end on a tiny model, and its records."""
import json
import math
import os

import pytest

import grad_conflict


@pytest.mark.slow  # a benchmark end to end (make test-slow, CI)
def test_toy_pilot_measures_every_pair_and_scope_and_rebuilds_from_its_records(tmp_path, capsys):
    work, results = str(tmp_path / "work"), str(tmp_path / "results")
    assert grad_conflict.main(["--toy", "--runs", "scl", "--work", work, "--results", results]) == 0
    summary = json.load(open(os.path.join(results, "grad_conflict.json")))["results"]["scl_seed1"]
    record = json.load(open(os.path.join(results, "runs", "grad_conflict", "scl_seed1", "steps.json")))
    steps = record["steps"]
    assert len(steps) == 8 and [s["update"] for s in steps] == list(range(1, 9))  # 2 epochs of 4 updates
    for pair in grad_conflict.PAIRS:
        for scope in grad_conflict.SCOPES:
            cos = [s[pair][scope] for s in steps]
            assert all(-1 <= c <= 1 for c in cos)
            stats = summary[pair][scope]["all"]
            assert stats["frac_conflict"] == pytest.approx(sum(c < 0 for c in cos) / len(cos))
            angles = sorted(math.degrees(math.acos(c)) for c in cos)
            assert angles[0] <= stats["angle_p5"] <= stats["angle_median"] <= stats["angle_p95"] <= angles[-1]
            assert summary[pair][scope]["early"]["batches"] == 4 == summary[pair][scope]["late"]["batches"]
    # features differ from parameters: c for SCL, u for ACL (a mix-up would make two pairs' features equal)
    assert [s["ce_vs_scl"]["features"] for s in steps] != [s["ce_vs_acl_samples"]["features"] for s in steps]
    assert os.path.getsize(os.path.join(results, "grad_conflict.png")) > 1000
    before = open(os.path.join(results, "grad_conflict.json")).read()
    os.remove(os.path.join(results, "grad_conflict.json"))
    assert grad_conflict.main(["--toy", "--runs", "scl", "--work", work, "--results", results]) == 0  # recorded
    assert open(os.path.join(results, "grad_conflict.json")).read() == before
    assert "recorded: scl seed 1" in capsys.readouterr().err
    assert [a for a in record["fairseq_train_args"] if os.path.isabs(a)] == []
    assert record["fairseq_train_args"][record["fairseq_train_args"].index("--save-dir") + 1] == "SAVE_DIR"


def test_recorded_arguments_name_no_folder_of_the_machine():
    roots = {"SAVE_DIR": "/tmp/x1", "WORK": "/r/repo/runs/bench", "REPO": "/r/repo"}
    argv = ["--user-dir", "/r/repo/acl_fairseq", "--restore-file", "/r/repo/runs/bench/minilm/model.pt",
            "--save-dir", "/tmp/x1", "--lr", "1e-5", "/r/repository/x", "rel/path"]
    assert grad_conflict.portable_args(argv, roots) == [
        "--user-dir", "REPO/acl_fairseq", "--restore-file", "WORK/minilm/model.pt", "--save-dir", "SAVE_DIR",
        "--lr", "1e-5", "/r/repository/x", "rel/path"]


def test_toy_mode_needs_its_own_results_folder():
    with pytest.raises(SystemExit):
        grad_conflict.main(["--toy"])


@pytest.mark.slow  # a benchmark end to end (make test-slow, CI)
def test_measure_every_n_updates_trains_the_same_schedule_and_measures_every_nth(tmp_path):
    results = str(tmp_path / "results")
    assert grad_conflict.main(["--toy", "--runs", "acl_embed", "--measure-every", "3", "--work", str(tmp_path / "w"),
                               "--results", results]) == 0
    record = json.load(open(os.path.join(results, "runs", "grad_conflict", "acl_embed_seed1", "steps.json")))
    assert record["measure_every"] == 3 and [s["update"] for s in record["steps"]] == [1, 4, 7]
    with pytest.raises(SystemExit):
        grad_conflict.main(["--toy", "--measure-every", "0", "--results", results])
