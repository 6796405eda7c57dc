"""Run records (benchmarks/_records.py): what a finished benchmark run keeps in the repository, so that the
tables add up the runs of every machine and session, and a recorded run is not trained again."""
import json
import os

import pytest

import _converted

TRAIN_LOG = (
    "2026-12-02 | INFO | fairseq_cli.train | Loaded checkpoint /enc/model.pt (epoch 1 @ 0 updates)\n"
    '2026-12-02 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "0.7"}\n'
    '2026-12-02 | INFO | valid | {"epoch": 1, "valid_accuracy": "55.2"}\n'
    '2026-12-02 | INFO | train | {"epoch": 1, "train_train_wall": "100"}\n'
    "2026-12-02 | INFO | fairseq.checkpoint_utils | Saved checkpoint checkpoint_best.pt\n"
    "2026-12-02 | INFO | fairseq_cli.train | done training in 600.0 seconds\n"
)


def _finished_run(rd, result, log=TRAIN_LOG, command="fairseq-train x\n"):
    os.makedirs(rd, exist_ok=True)
    with open(os.path.join(rd, "train.log"), "w") as f:
        f.write(log)
    with open(os.path.join(rd, "command.sh"), "w") as f:
        f.write(command)
    with open(os.path.join(rd, "result.json"), "w") as f:
        json.dump(result, f)


def test_a_record_keeps_the_result_the_command_the_named_report_and_the_log_lines_the_collectors_read(tmp_path):
    import _records as run_records

    rd = tmp_path / "work" / "quality" / "runs" / "SST-2" / "acl_cross_layer" / "seed1"
    _finished_run(str(rd), {"task": "SST-2", "early_exit_json": "early_exit/early_exit.json",
                            "escape": "../../outside.json", "checkpoint": "/abs/checkpoint_best.pt"})
    (rd / "early_exit").mkdir()
    (rd / "early_exit" / "early_exit.json").write_text('{"per_exit": []}')
    (rd / "checkpoint_best.pt").write_bytes(b"x" * 1000)
    (tmp_path / "work" / "quality" / "runs" / "outside.json").write_text("{}")

    dest = run_records.record_dir(str(rd), str(tmp_path / "work"), str(tmp_path / "records"))
    assert dest == str(tmp_path / "records" / "quality" / "runs" / "SST-2" / "acl_cross_layer" / "seed1")
    assert run_records.save(str(rd), dest)
    kept = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, files in os.walk(dest) for f in files)
    assert kept == ["command.sh", os.path.join("early_exit", "early_exit.json"), "result.json", "train.log"]
    assert not (tmp_path / "records" / "quality" / "outside.json").exists()  # a name leaving the run is not followed
    log = open(os.path.join(dest, "train.log")).read().splitlines()
    assert [line.split(" | ")[2] for line in log] == ["fairseq_cli.train", "valid", "train", "fairseq_cli.train"]
    assert run_records.load(dest) == run_records.load(str(rd))

    (rd / "result.json").write_text(json.dumps({"task": "SST-2"}))  # trained again, without the early-exit report
    assert run_records.save(str(rd), dest)
    assert not os.path.exists(os.path.join(dest, "early_exit")) and run_records.load(dest) == {"task": "SST-2"}
    assert sorted(os.listdir(os.path.dirname(dest))) == ["seed1"]  # no temporary folders left

    unfinished = tmp_path / "work" / "quality" / "runs" / "RTE" / "ce" / "seed1"
    unfinished.mkdir(parents=True)
    (unfinished / "train.log").write_text(TRAIN_LOG)
    assert not run_records.save(str(unfinished), str(tmp_path / "records" / "x"))
    assert not (tmp_path / "records" / "x").exists()
    with pytest.raises(ValueError, match="not inside the work folder"):
        run_records.record_dir(str(tmp_path / "elsewhere"), str(tmp_path / "work"), str(tmp_path / "records"))


def test_sync_writes_the_missing_and_the_newer_records_only(tmp_path, capsys):
    import _records as run_records

    work, records = str(tmp_path / "work"), str(tmp_path / "records")
    for seed in (1, 2):
        _finished_run(os.path.join(work, "quality", "runs", "RTE", "ce", f"seed{seed}"), {"seed": seed, "v": 50})
    os.makedirs(os.path.join(work, "quality", "runs", "RTE", "ce", "seed3"))  # running: no result yet
    assert run_records.sync(work, "quality", records) == 2
    assert run_records.sync(work, "quality", records) == 0  # nothing new
    run2, rec2 = (os.path.join(root, "quality", "runs", "RTE", "ce", "seed2") for root in (work, records))
    _finished_run(run2, {"seed": 2, "v": 51})  # trained again
    os.utime(os.path.join(run2, "result.json"), (2e9, 2e9))
    assert run_records.sync(work, "quality", records) == 1
    assert run_records.load(rec2)["v"] == 51

    _finished_run(run2, {"seed": 2, "v": 49})  # a stale run: older than the record (say, the record was pulled)
    os.utime(os.path.join(run2, "result.json"), (1e9, 1e9))
    assert run_records.sync(work, "quality", records) == 0
    assert run_records.load(rec2)["v"] == 51 and "kept" in capsys.readouterr().err
    assert run_records.sync(work, "parity", records) == 0  # no such folder


def _encoder(tmp_path):
    import _glue_runs as glue_runs

    enc = tmp_path / "enc"
    enc.mkdir(exist_ok=True)
    (enc / "model_args.txt").write_text("--encoder-layers 2 --encoder-embed-dim 8\n")
    return glue_runs.Encoder(str(enc))


def test_quality_skips_a_recorded_run_and_records_a_new_one(tmp_path, monkeypatch):
    import _glue_runs as glue_runs
    import _records as run_records

    work, records = str(tmp_path / "work"), str(tmp_path / "records")
    sch = _converted.PROTOCOL["RTE"]
    command = (f"fairseq-train x --lr {sch['lr']:g} --exit-pooling {sch['pooling']} --max-epoch {sch['epochs']} "
               "--conventions c.json\n")
    monkeypatch.setattr(_converted, "binarize", lambda task, work, enc: "/data-bin")
    trained = []

    def finetune(task, method, env, extra):
        rd = glue_runs.run_dir(env["OUT_ROOT"], task, method, int(env["SEED"]))
        trained.append((task, method, int(env["SEED"])))
        _finished_run(rd, {"task": task, "method": method, "seed": int(env["SEED"]), "best_value": 57.0},
                      command=command)
        return run_records.load(rd)

    monkeypatch.setattr(glue_runs, "finetune", finetune)
    recorded = os.path.join(records, "quality", "runs", "RTE", "ce", "seed1")  # from another machine
    _finished_run(recorded, {"task": "RTE", "method": "ce", "seed": 1, "best_value": 56.0}, command=command)

    rd, res = _converted.run_one("RTE", "ce", 1, work, _encoder(tmp_path), records=records)
    assert (rd, res["best_value"], trained) == (recorded, 56.0, [])  # not trained again

    rd, res = _converted.run_one("RTE", "ce", 2, work, _encoder(tmp_path), records=records)
    assert trained == [("RTE", "ce", 2)] and rd == glue_runs.run_dir(os.path.join(work, "quality"), "RTE", "ce", 2)
    assert run_records.load(os.path.join(records, "quality", "runs", "RTE", "ce", "seed2"))["best_value"] == 57.0

    # a run left in the work folder, older than the record that came with the repository: the record wins
    old_run = glue_runs.run_dir(os.path.join(work, "quality"), "RTE", "ce", 1)
    _finished_run(old_run, {"task": "RTE", "method": "ce", "seed": 1, "best_value": 50.0}, command=command)
    os.utime(os.path.join(old_run, "result.json"), (1e9, 1e9))
    rd, res = _converted.run_one("RTE", "ce", 1, work, _encoder(tmp_path), records=records)
    assert (rd, res["best_value"], run_records.load(recorded)["best_value"]) == (recorded, 56.0, 56.0)

    stale = os.path.join(records, "quality", "runs", "RTE", "ce", "seed3")  # a record of another schedule
    _finished_run(stale, {"task": "RTE"}, command=command.replace(f"--lr {sch['lr']:g}", "--lr 0.001"))
    with pytest.raises(SystemExit, match="seed3 was trained with lr 0.001"):
        _converted.run_one("RTE", "ce", 3, work, _encoder(tmp_path), records=records)


def test_hf_parity_does_not_train_a_recorded_hf_run_again(tmp_path, monkeypatch):
    import _glue_runs as glue_runs
    import hf_parity

    results, work = tmp_path / "results", tmp_path / "work"
    rec = results / "runs" / "parity" / "lr2e-05_cls" / "hf" / "RTE" / "seed1"
    rec.mkdir(parents=True)
    (rec / "result.json").write_text(json.dumps({"best": {"accuracy": 57.0}, "primary_metric": "accuracy",
                                                 "train_samples_per_s": 3.0}))
    monkeypatch.setattr(glue_runs, "run", lambda *a, **k: pytest.fail("a recorded run was trained again"))
    args = hf_parity.build_parser().parse_args(["--work", str(work), "--results", str(results)])
    out = hf_parity.hf_job(args, None, "RTE", 1, 2e-5, "cls", str(work / "parity" / "lr2e-05_cls"))
    assert out["metric"] == 57.0


@pytest.mark.slow  # make test's 10 minutes: quality.py's tables and plots rebuilt from records: about 7 s
def test_the_tables_are_built_from_the_records_when_the_work_folder_is_gone(tmp_path, capsys):
    import shutil

    import _records as run_records
    import hf_parity
    import quality

    results, work = tmp_path / "results", tmp_path / "old_machine"
    runs = work / "quality" / "runs"
    for seed, acc in ((1, 56.0), (2, 58.0)):
        _finished_run(str(runs / "RTE" / "ce" / f"seed{seed}"), {
            "task": "RTE", "method": "ce", "seed": seed, "best_metric": "accuracy", "best_value": acc,
            "best_valid": {"valid": {"accuracy": acc}}},
            command="fairseq-train x --lr 2e-05 --exit-pooling cls --max-epoch 5 --conventions c.json\n")
    assert run_records.sync(str(work), "quality", str(results / "runs")) == 2
    shutil.rmtree(work)
    restored = results / "runs" / "quality" / "runs" / "RTE" / "scl" / "seed1"  # restored from a table: result only
    restored.mkdir(parents=True)
    (restored / "result.json").write_text(json.dumps({
        "task": "RTE", "method": "scl", "seed": 1, "best_metric": "accuracy", "best_value": 55.0,
        "best_valid": {"valid": {"accuracy": 55.0}}, "restored_from": "benchmarks/results/quality.json at abc1234",
        "setting": {"lr": 2e-5, "pooling": "cls", "epochs": 5, "conventions": True}}))
    hf = results / "runs" / "parity" / "lr2e-05_cls" / "hf" / "RTE"
    for seed, acc in ((1, 57.0), (2, 60.0)):
        (hf / f"seed{seed}").mkdir(parents=True)
        (hf / f"seed{seed}" / "result.json").write_text(json.dumps(
            {"best": {"accuracy": acc}, "primary_metric": "accuracy", "train_samples_per_s": 3.0}))

    empty_work = str(tmp_path / "new_machine")
    assert quality.main(["--tasks", "RTE", "--collect-only", "--work", empty_work, "--results", str(results)]) == 0
    md = (results / "quality.md").read_text()
    assert "| ce | 57.00 ± 1.41 (n=2) |" in md and "| scl | 55.00 (n=1) |" in md
    assert "Restored from benchmarks/results/quality.json at abc1234 (their run folders were lost): RTE/scl/seed1" in md
    assert "| RTE | ce | 10 | 10-10 | 2 |" in md  # the records' cut logs keep "done training in"

    summary = hf_parity.write_results(empty_work, str(results), "test")
    entry = summary["lr2e-05_cls"]["RTE"]
    assert entry["plugin"]["values"] == [56.0, 58.0] and entry["paired"]["diffs"] == [-1.0, -2.0]
    assert entry["plugin"]["samples_per_s"] == pytest.approx(24.9)  # 2490 examples / the record log's 100 s
    capsys.readouterr()


def test_result_or_train_trains_only_what_no_folder_holds_and_records_it(tmp_path):
    import _records as run_records

    work, records = str(tmp_path / "work"), str(tmp_path / "records")
    rd = os.path.join(work, "parity", "x", "RTE", "ce", "seed1")
    trained, checked = [], []
    train = lambda: trained.append(1) or _finished_run(rd, {"v": 1})  # noqa: E731
    assert run_records.result_or_train(rd, work, records, train, checked.append) == (rd, {"v": 1})
    assert (trained, checked) == ([1], [])  # a run just trained is not vetted as an old one
    assert run_records.load(run_records.record_dir(rd, work, records)) == {"v": 1}

    old = os.path.join(work, "parity", "x", "RTE", "ce", "seed2")  # finished by a version without records
    _finished_run(old, {"v": 2})
    assert run_records.result_or_train(old, work, records, train, checked.append) == (old, {"v": 2})
    assert trained == [1] and checked == [old]
    assert run_records.load(run_records.record_dir(old, work, records)) == {"v": 2}

    broken = os.path.join(work, "parity", "x", "RTE", "ce", "seed3")
    with pytest.raises(RuntimeError, match="seed3: training finished without a result.json"):
        run_records.result_or_train(broken, work, records, lambda: None)
