"""acl-tune: Optuna studies over the run plan. Workers are real processes on one study (SQLite; PostgreSQL in the
slow test) running the real recipe driver with a stub fairseq-train (seconds); one small study trains for real.
"""
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import optuna  # noqa: E402  (pinned in requirements.txt: a missing optuna is a broken set-up, not a skip)
import pytest

import helpers
from recipe_helpers import REPO, fake_data, recipe_env, write_exe

# fake fairseq-train: validation accuracy 50 + 40 x --scl-weight + the validation's index, one record every
# $STUB_SLEEP seconds (so a pruner and a SIGKILL can meet a run in progress)
STUB_TRAIN = r"""#!/usr/bin/env bash
save=""; w="0"; prev=""
for a in "$@"; do
  [[ "$prev" == --save-dir ]] && save="$a"
  [[ "$prev" == --scl-weight ]] && w="$a"
  prev="$a"
done
echo "$*" > "$save/argv.txt"
echo "2026-01-01 00:00:00 | INFO | fairseq.trainer | Loaded checkpoint x.pt (epoch 1 @ 0 updates)"
for i in 1 2 3; do
  sleep "${STUB_SLEEP:-0.2}"
  acc=$(python3 -c "print(round(50 + 40 * $w + $i, 4))")
  echo "2026-01-01 00:00:02 | INFO | valid | {\"epoch\": $i, \"valid_loss\": \"0.$i\", \"valid_accuracy\": \"$acc\", \"valid_num_updates\": \"$((i * 10))\"}"
done
touch "$save/checkpoint_best.pt" "$save/checkpoint_last.pt"
"""  # noqa: E501

# fake acl-evaluate --split test: the test accuracy is 1 point below the run's last validation
STUB_EVALUATE = r"""#!/usr/bin/env bash
ckpt="$1"; out=""; prev=""
for a in "$@"; do [[ "$prev" == --output ]] && out="$a"; prev="$a"; done
mkdir -p "$out"
res="$(dirname "$ckpt")/result.json"
acc=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['best_value'] - 1)" "$res")
echo "{\"per_exit\": [{\"layer\": 1, \"metrics\": {\"accuracy\": $acc}}]}" > "$out/early_exit.json"
"""


@pytest.fixture
def env(tmp_path):
    e = recipe_env(tmp_path)
    e.update(FAIRSEQ_TRAIN=write_exe(tmp_path / "stub-train", STUB_TRAIN),
             ACL_EVALUATE=write_exe(tmp_path / "stub-evaluate", STUB_EVALUATE), STUB_SLEEP="0.2")
    return e


def fewshot_data(path, seed=1):
    """A few-shot folder: its valid split is the protocol's, nothing is carved."""
    fake_data(path, subsets=("valid", "test"))
    with open(os.path.join(path, "protocol.json"), "w") as f:
        json.dump({"few_shot": 8, "seed": seed}, f)
    return str(path)


def tune(args, env, **kw):
    return subprocess.Popen([sys.executable, "-m", "acl_fairseq.cli.tune", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def study_trials(url, name="SST-2-scl-fewshot"):
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}}
                                         if url.startswith("sqlite") else {})
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def running_trials(url):
    """The RUNNING trials, or [] while the worker is still creating the study (its schema, its row: this reader
    races it to create the schema, as two workers do, and the loser's insert of the schema's version fails)."""
    from sqlalchemy.exc import DBAPIError

    try:
        return [t for t in study_trials(url) if t.state.name == "RUNNING"]
    except (KeyError, DBAPIError):
        return []


def common(tmp_path, url, trials=4):
    return ["SST-2", "scl", "--data-bin", fewshot_data(tmp_path / "fs"), "--study-dir", str(tmp_path / "study"),
            "--storage", url, "--trials", str(trials), "--poll", "0.1", "--threads", "1", "--pruner-startup", "2"]


def finished(trials):
    return [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]


def check_two_workers(tmp_path, env, url, n=5):
    procs = [tune(common(tmp_path, url, n), env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    logs = "\n".join(err[-3000:] for _, err in outs)  # both workers' stderr, in every failure message
    assert [p.returncode for p in procs] == [0, 0], logs
    trials = study_trials(url)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)), logs
    assert len(finished(trials)) == n, ([(t.number, t.state.name) for t in trials], logs)
    # surplus trials (two workers asking for the last slot at once) are never run
    assert all(t.user_attrs.get("surplus") for t in trials if t.state.name == "FAIL"), logs
    runs = [t for t in finished(trials) if "repeat_of" not in t.user_attrs]  # a setting drawn again is not rerun
    assert len({t.user_attrs["run_dir"] for t in runs}) == len(runs)
    # both workers ran trials: the study was shared, not run twice over or by one worker alone
    workers = {t.user_attrs.get("worker") for t in runs}
    assert len(workers) == 2 and None not in workers, ([(t.number, t.user_attrs.get("worker")) for t in runs], logs)
    return trials


def test_two_workers_share_one_sqlite_study(tmp_path, env):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    trials = check_two_workers(tmp_path, env, url)
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    # the objective is the run's best validation, from its result.json: 50 + 40 lambda + 3
    assert best.value == pytest.approx(53 + 40 * float(best.params["lambda"]))
    with open(os.path.join(best.user_attrs["run_dir"], "argv.txt")) as f:
        argv = f.read().split()
    assert argv[argv.index("--scl-weight", argv.index("--scl-weight") + 1) + 1] == best.params["lambda"]
    assert argv[argv.index("--lr") + 1] == best.params["lr"] and argv[argv.index("--seed") + 1] == "1"
    assert not os.path.exists(os.path.join(best.user_attrs["run_dir"], "checkpoint_best.pt"))
    # a study resumes: asked for more trials, it runs only the missing ones
    proc = tune(common(tmp_path, url, 6), env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert len(finished(study_trials(url))) == 6


@pytest.mark.slow  # make test's 10 minutes: a worker killed mid-trial, the study resumed: about 9 s
def test_a_killed_worker_trial_fails_and_the_study_still_finishes(tmp_path, env):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    args = common(tmp_path, url, 3) + ["--heartbeat", "1", "--grace", "2"]
    env["STUB_SLEEP"] = "2"
    proc = tune(args, env, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:  # until the first trial's run is training
        running = running_trials(url) if (tmp_path / "study.db").exists() else []
        if running and "pgid" in running[0].user_attrs:
            break
        time.sleep(0.2)
    assert running, "no trial started"
    os.killpg(proc.pid, signal.SIGKILL)  # the worker, as a machine lost: no clean-up runs
    os.killpg(running[0].user_attrs["pgid"], signal.SIGKILL)  # and the run it started (its own session)
    proc.communicate()
    assert [t.state.name for t in study_trials(url)] == ["RUNNING"]
    env["STUB_SLEEP"] = "0.1"
    resumed = tune(args, env)
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err[-2000:]
    trials = study_trials(url)
    assert trials[0].state.name == "FAIL" and not trials[0].user_attrs.get("surplus")
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
    assert len(retry) == 1 and retry[0].params == trials[0].params  # its setting was run again, not lost
    assert len([t for t in trials if t.state.name == "COMPLETE"]) == 3


@pytest.mark.slow  # make test's 10 minutes: a study run twice over: about 7 s
def test_a_setting_drawn_again_is_not_run_again(tmp_path, env):
    table = tmp_path / "spaces.tsv"
    table.write_text("method\ttask\tsetting\tparam\ttarget\tkind\tvalues\tsource\n"
                     "*\t*\t*\tlr\tLR\tchoice\t1e-04\tone value\n"
                     "scl\t*\t*\tlambda\t--scl-weight\tchoice\t0.3,0.5\ttwo values\n")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    proc = tune(common(tmp_path, url, 6) + ["--space-table", str(table)], env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    trials = finished(study_trials(url))
    assert len(trials) == 6
    runs = [t for t in trials if "repeat_of" not in t.user_attrs]
    repeats = [t for t in trials if "repeat_of" in t.user_attrs]
    assert len(repeats) >= 3  # two settings: two runs, and a third only where a pruned one is no longer pruned
    for t in repeats:
        first = study_trials(url)[t.user_attrs["repeat_of"]]
        assert first.params == t.params and t.user_attrs["run_dir"] == first.user_attrs["run_dir"]
        if t.state.name == "COMPLETE":
            assert first.state.name == "COMPLETE" and t.value == first.value
    assert len(list((tmp_path / "study" / "trials").glob("trial*/runs/*/*/*/argv.txt"))) == len(runs)


@pytest.mark.slow  # make test's 10 minutes: pruned trials' runs stopped: about 10 s
def test_pruned_trials_stop_their_run(tmp_path, env):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    proc = tune(common(tmp_path, url, 8) + ["--pruner-startup", "1"], env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    pruned = [t for t in study_trials(url) if t.state.name == "PRUNED"]
    assert pruned, "every trial of 8 beat the median of the ones before"
    for t in pruned:
        values = list(t.intermediate_values.values())
        assert len(values) < 3 and not os.path.exists(os.path.join(t.user_attrs["run_dir"], "result.json"))


@pytest.mark.slow  # about 16 s of stub training runs (make test-slow, CI)
def test_evaluate_best_scores_tuned_beside_default_on_the_test_half(tmp_path, env):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    for seed in (1, 2):
        fewshot_data(tmp_path / f"fs{seed}", seed)
    args = common(tmp_path, url, 3)
    args[args.index("--data-bin") + 1] = str(tmp_path / "fs{seed}")
    proc = tune(args, env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    proc = tune(args + ["--evaluate-best", "--seeds", "1", "2"], env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    with open(tmp_path / "study" / "best.json") as f:
        best = json.load(f)
    lam = float(best["best_params"]["lambda"])
    # default: methods.tsv's --scl-weight 0.9; the stub's test score is its last validation minus 1
    assert best["default"]["values"] == {"1": pytest.approx(52 + 36), "2": pytest.approx(52 + 36)}
    assert best["tuned"]["values"]["2"] == pytest.approx(52 + 40 * lam)
    assert best["tuned_minus_default"]["values"] == pytest.approx([40 * lam - 36] * 2)
    assert out.startswith("| setting | seed 1 | seed 2 | mean ± std |") and "tuned − default" in out
    assert os.path.isfile(tmp_path / "study" / "best" / "tuned" / "runs" / "SST-2" / "scl" / "seed2" /
                          "test_result.json")


def test_refusals_before_any_trial(tmp_path, env, monkeypatch, capsys):
    from acl_fairseq.cli import tune

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    for argv, why in ((["STS-B", "scl"], "regression task"),
                      (["SST-2", "scl", "--data-bin", str(tmp_path / "nowhere")], "binarized data not found"),
                      (["SST-2", "scl", "--set", "NO_SUCH=1"], "unknown setting"),
                      (["SST-2", "scl", "--trials", "0"], "at least 1"),
                      (["SST-2", "scl", "--data-bin", fewshot_data(tmp_path / "fs"), "--storage", "nodb://x"],
                       "cannot open the storage nodb://x")):
        with pytest.raises(SystemExit) as e:
            tune.main(argv + ([] if "--storage" in argv else ["--storage", url]) + ["--study-dir", str(tmp_path / "s")])
        assert e.value.code == 2 and why in capsys.readouterr().err
    assert not (tmp_path / "study.db").exists()


def test_tune_sh_help_and_acl_tune_help():
    out = subprocess.run([os.path.join(REPO, "recipes", "glue", "tune.sh"), "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and "--evaluate-best" in out.stdout and "--storage" in out.stdout


@pytest.mark.slow  # two real fairseq-train trials, about 17 s (make test-slow, CI)
def test_a_real_study_trains_on_the_carved_split(tmp_path, env):
    """Two trials of fairseq-train on the toy task (a tiny RoBERTa from scratch): the runs train on the carved
    train part and validate on the carved part of train, never on the dev set."""
    data = helpers.make_data(str(tmp_path / "toy"))["data"]
    env.pop("ROBERTA_PATH")
    env.pop("FAIRSEQ_TRAIN")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    proc = tune(["SST-2", "ce", "--data-bin", data, "--study-dir", str(tmp_path / "study"), "--storage", url,
                 "--trials", "2", "--poll", "0.5", "--threads", "1", "--carve-fraction", "0.25",
                 "--set", "RESTORE=none", "--set", "ARCH=multi_exit_roberta", "--set",
                 "MODEL_ARGS=" + " ".join(helpers.TINY_SHAPE + ["--exit-layers", "3"]), "--set", "MAX_EPOCH=2",
                 "--set", "TOTAL_UPDATES=4", "--set", "LOG_INTERVAL=1", "--", "--num-workers", "0"], env)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    trials = study_trials(url, "SST-2-ce-full")
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    for t in trials:
        assert t.params["lr"] in ("1e-05", "2e-05", "3e-05") and len(t.intermediate_values) == 2
        with open(os.path.join(t.user_attrs["run_dir"], "train.log")) as f:
            log = f.read()
        # 36 of the toy's 48 training examples train, the other 12 validate; its 24 dev examples are not read
        carved = os.path.join(str(tmp_path / "study" / "data-seed1"), "input0")
        assert f"loaded 12 examples from: {carved}/valid" in log and f"loaded 36 examples from: {carved}/train" in log
        assert "#samples: 24" not in log
        assert t.value == max(t.intermediate_values.values())


# ---- PostgreSQL: Optuna's own distributed mode on a real server ------------------------------------------


def _pg_bin(name):
    """A PostgreSQL server binary: on PATH, else Debian's /usr/lib/postgresql/<version>/bin (package postgresql)."""
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]
    return found if isinstance(found, str) else (found[0] if found else None)


@pytest.fixture
def postgres_url():
    """A throwaway PostgreSQL cluster on a free loopback port, run as the ``postgres`` user when the tests run as
    root (the server refuses root); trust authentication, nothing outside the loopback interface."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        helpers.skip_needed("PostgreSQL's server", "scripts/system_packages.sh installs Debian's postgresql")
    root = tempfile.mkdtemp(prefix="acl-tune-pg-")
    as_user = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = os.path.join(root, "data")
    subprocess.run(as_user + [initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"], check=True,
                   capture_output=True)
    started = subprocess.run(as_user + [pg_ctl, "-D", data, "-l", os.path.join(root, "log"), "-w", "-o",
                                        f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start"],
                             capture_output=True, text=True)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user + [pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_two_workers_share_one_postgresql_study(tmp_path, env, postgres_url):
    trials = check_two_workers(tmp_path, env, postgres_url)
    assert not (tmp_path / "study" / "study.db").exists()  # the study lives in the server only
    assert sorted(t.number for t in trials) == list(range(len(trials)))


def test_fewshot_study_commands_use_the_fewshot_benchmark_settings(tmp_path):
    enc = tmp_path / "minilm"
    enc.mkdir()
    (enc / "model_args.txt").write_text("--encoder-layers 6 --encoder-embed-dim 384\n")
    out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "tune_fewshot.py"), "--dry-run", "--ns",
                          "20", "100", "--methods", "scl", "--work", str(tmp_path), "--seeds", "1", "2"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    import shlex

    lines = [shlex.split(line.split("  # ")[0]) for line in out.stdout.splitlines()]
    assert len(lines) == 4 and "--evaluate-best" not in lines[0]
    at = lines[1].index("--evaluate-best")
    assert lines[1][at:at + 5] == ["--evaluate-best", "--seeds", "1", "2", "--"]
    n20, n100 = lines[0], lines[2]
    assert n20[n20.index("--data-bin") + 1] == str(tmp_path / "data" / "fewshot" / "SST-2-N20-seed{seed}-bin")
    # recipes/glue/fewshot.tsv: N=20 batch 20, 30 epochs of 1 update, valid every 10; N=100 batch 16, 10 x 7
    assert {"--set=BATCH_SIZE=20", "--set=TOTAL_UPDATES=30", "--set=LR=0.0001"} <= set(n20)
    assert n20[n20.index("--validate-interval") + 1] == "10" and "--set=TOTAL_UPDATES=70" in n100
    assert "--set=MODEL_ARGS=--encoder-layers 6 --encoder-embed-dim 384 --exit-layers 6 --exit-pooling mean" in n20
