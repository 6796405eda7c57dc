"""The GLUE recipes (recipes/glue/*.sh) and their tables: the ``fairseq-train`` command a ``--dry-run`` prints
for every task and method, and the checks that refuse bad settings before training.

Runs of the driver with stub executables are in test_recipe_runs.py, the results collector in
test_collect_results.py.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from acl_runtime.conventions import SEPARATOR_FLAG
from recipe_helpers import GLUE, RECIPES, REPO, fake_data, flag, recipe_env, run, train_argv, write_exe

TASKS = ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]
METHODS = ["ce", "scl", "acl_embed", "acl_grad", "acl_cross_layer", "multi_exit_ce", "multi_exit_scl", "multi_exit_kd",
           "acl_cross_layer_cl_only"]
MULTI_EXIT = {"acl_cross_layer", "multi_exit_ce", "multi_exit_scl", "multi_exit_kd", "acl_cross_layer_cl_only"}
CRITERION = {
    "ce": "sentence_ce", "scl": "sentence_scl", "acl_embed": "acl_embed", "acl_grad": "acl_grad",
    "acl_cross_layer": "acl_cross_layer", "multi_exit_ce": "sentence_ce", "multi_exit_scl": "sentence_scl",
    "multi_exit_kd": "multi_exit_kd", "acl_cross_layer_cl_only": "acl_cross_layer",
}
# fairseq's RoBERTa GLUE table (README.glue.md@v0.10.2): num classes, lr, batch size, total and warm-up
# updates; WNLI derived the same way (10 x 635 / 16). Best metric: the task's GLUE metric.
FAIRSEQ = {
    "MNLI": (3, "1e-05", 32, 123873, 7432, "accuracy"),
    "QNLI": (2, "1e-05", 32, 33112, 1986, "accuracy"),
    "QQP": (2, "1e-05", 32, 113272, 28318, "accuracy"),
    "RTE": (2, "2e-05", 16, 2036, 122, "accuracy"),
    "SST-2": (2, "1e-05", 32, 20935, 1256, "accuracy"),
    "MRPC": (2, "1e-05", 16, 2296, 137, "f1"),
    "CoLA": (2, "1e-05", 16, 5336, 320, "mcc"),
    "STS-B": (1, "2e-05", 16, 3598, 214, "pearson"),
    "WNLI": (2, "1e-05", 16, 397, 24, "accuracy"),
}


def all_scripts():
    out = []
    for root, _, files in os.walk(RECIPES):
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".sh")]
    return sorted(out)


@pytest.fixture
def env(tmp_path):
    return recipe_env(tmp_path)


# ---- syntax and lint -------------------------------------------------------------------------------


@pytest.mark.parametrize("script", all_scripts(), ids=lambda p: os.path.relpath(p, RECIPES))
def test_bash_syntax(script):
    proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(script) as f:
        text = f.read()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    if not script.endswith("common.sh"):  # common.sh is sourced, not run
        assert os.access(script, os.X_OK), f"{script} is not executable"


def test_shellcheck():
    shellcheck = shutil.which("shellcheck") or os.path.join(os.path.dirname(sys.executable), "shellcheck")
    proc = subprocess.run([shellcheck, "-x", *all_scripts()], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_one_thin_script_per_task():
    for task in TASKS:
        with open(os.path.join(GLUE, f"{task}.sh")) as f:
            body = [ln for ln in f.read().splitlines() if ln and not ln.startswith("#") and not ln.startswith("set ")]
        assert body == [f'exec "$(dirname "${{BASH_SOURCE[0]}}")/finetune.sh" {task} "$@"'], body


# ---- the command line, per task and method ----------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("task", TASKS)
def test_dry_run_command(task, method, env):
    proc = run(f"{task}.sh", method, "--dry-run", env=env)
    num_classes, lr, bsz, total, warmup, metric = FAIRSEQ[task]
    if task == "STS-B" and method not in ("ce", "multi_exit_ce"):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "regression" in proc.stderr and "needs class labels" in proc.stderr and "'ce'" in proc.stderr
        assert "fairseq-train" not in proc.stdout
        return
    assert proc.returncode == 0, proc.stderr
    argv = train_argv(proc.stdout)
    assert argv[1] == os.path.join(env["DATA_ROOT"], f"{task}-bin")
    assert flag(argv, "--user-dir") == os.path.join(REPO, "acl_fairseq")
    assert flag(argv, "--criterion") == CRITERION[method]
    multi = method in MULTI_EXIT
    assert flag(argv, "--arch") == ("multi_exit_roberta_base" if multi else "roberta")
    assert flag(argv, "--num-classes") == str(num_classes)
    assert flag(argv, "--lr") == lr
    assert flag(argv, "--batch-size") == str(bsz)
    assert flag(argv, "--total-num-update") == flag(argv, "--max-update") == str(total)
    assert flag(argv, "--warmup-updates") == str(warmup)
    assert flag(argv, "--best-checkpoint-metric") == metric
    assert "--maximize-best-checkpoint-metric" in argv
    assert ("--regression-target" in argv) == (task == "STS-B")
    assert flag(argv, "--valid-subset") == ("valid,valid1" if task == "MNLI" else "valid")
    # fairseq's GLUE settings
    assert flag(argv, "--restore-file") == env["ROBERTA_PATH"]
    for f in ("--reset-optimizer", "--reset-dataloader", "--reset-meters", "--find-unused-parameters",
              "--no-epoch-checkpoints", "--cpu"):
        assert f in argv, f
    assert "--fp16" not in argv
    for name, value in [("--task", "sentence_prediction_acl"), ("--init-token", "0"), (SEPARATOR_FLAG, "2"),
                        ("--adam-betas", "(0.9,0.98)"), ("--adam-eps", "1e-06"), ("--weight-decay", "0.1"),
                        ("--clip-norm", "0.0"), ("--lr-scheduler", "polynomial_decay"), ("--max-epoch", "10"),
                        ("--dropout", "0.1"), ("--attention-dropout", "0.1"), ("--max-positions", "512"),
                        ("--log-format", "json"), ("--seed", "1")]:
        assert flag(argv, name) == value, name
    out = env["OUT_ROOT"]
    assert flag(argv, "--save-dir") == os.path.join(out, "runs", task, method, "seed1")
    assert flag(argv, "--tensorboard-logdir") == os.path.join(out, "tb", task, method, "seed1")
    # multi-exit runs are followed by the early-exit evaluation of each validation subset
    evals = [ln for ln in proc.stdout.splitlines() if ln.startswith("acl-evaluate ")]
    assert len(evals) == (0 if not multi else 2 if task == "MNLI" else 1)
    for ln in evals:
        ev = shlex.split(ln)
        assert ev[1] == os.path.join(out, "runs", task, method, "seed1", "checkpoint_best.pt")
        assert flag(ev, "--task-name") == task
        assert flag(ev, "--device") == ("cpu" if "--cpu" in argv else "cuda")  # the training run's device
    assert "acl_fairseq.runs.result" in proc.stdout.splitlines()[-1]
    assert not os.path.exists(out), "a dry run must not create anything"


def test_method_hyperparameters_come_from_the_table(env):
    argv = train_argv(run("RTE.sh", "acl_grad", "--dry-run", env=env).stdout)
    assert flag(argv, "--acl-weight") == "1.0" and flag(argv, "--acl-temperature") == "0.5"
    assert flag(argv, "--acl-grad-threshold") == "0.0" and flag(argv, "--acl-grad-scope") == "params"
    argv = train_argv(run("RTE.sh", "scl", "--dry-run", env=env).stdout)
    assert flag(argv, "--scl-weight") == "0.9" and flag(argv, "--scl-temperature") == "0.3"
    argv = train_argv(run("RTE.sh", "acl_cross_layer", "--dry-run", env=env).stdout)
    assert flag(argv, "--acl-cl-weight") == "1.0" and flag(argv, "--exit-weighting") == "layer"


def test_per_task_row_overrides_the_default_row(env, tmp_path):
    table = tmp_path / "methods.tsv"
    with open(os.path.join(GLUE, "methods.tsv")) as f:
        table.write_text(f.read() + "acl_embed\tRTE\tacl_embed\tsingle\t1\t--acl-weight 0.3 --acl-temperature 0.1\n")
    env["METHODS_TABLE"] = str(table)
    rte = train_argv(run("RTE.sh", "acl_embed", "--dry-run", env=env).stdout)
    assert flag(rte, "--acl-weight") == "0.3" and flag(rte, "--acl-temperature") == "0.1"
    cola = train_argv(run("CoLA.sh", "acl_embed", "--dry-run", env=env).stdout)
    assert flag(cola, "--acl-weight") == "1.0"


def test_extra_flags_pass_through_last(env):
    proc = run("finetune.sh", "RTE", "ce", "--lr", "3e-05", "--dry-run", "--update-freq", "2", env=env)
    argv = train_argv(proc.stdout)
    assert argv[-4:] == ["--lr", "3e-05", "--update-freq", "2"]
    assert flag(argv, "--lr") == "3e-05" and "--dry-run" not in argv


def test_environment_overrides(env, tmp_path):
    env.update(SEED="7", MAX_EPOCH="1", TOTAL_UPDATES="50", MODEL="large", RESTORE="none", LR="5e-4", BATCH_SIZE="8",
               DATA_BIN=str(tmp_path / "mydata"), ARCH="multi_exit_roberta", EXIT_LAYERS="2,3",
               EXIT_POOLING="mean", MODEL_ARGS="--encoder-layers 3")
    argv = train_argv(run("CoLA.sh", "multi_exit_ce", "--dry-run", env=env).stdout)
    assert argv[1] == str(tmp_path / "mydata")
    assert flag(argv, "--seed") == "7" and flag(argv, "--save-dir").endswith(os.path.join("multi_exit_ce", "seed7"))
    assert flag(argv, "--max-epoch") == "1" and flag(argv, "--lr") == "5e-4" and flag(argv, "--batch-size") == "8"
    assert flag(argv, "--total-num-update") == flag(argv, "--max-update") == "50"
    assert flag(argv, "--warmup-updates") == "3"  # 6 % of the overridden total
    assert "--restore-file" not in argv and "--reset-optimizer" not in argv
    assert flag(argv, "--arch") == "multi_exit_roberta"
    assert flag(argv, "--exit-layers") == "2,3" and flag(argv, "--exit-pooling") == "mean"
    assert flag(argv, "--encoder-layers") == "3"

    env.pop("ARCH"), env.pop("RESTORE")
    assert flag(train_argv(run("CoLA.sh", "ce", "--dry-run", env=env).stdout), "--arch") == "roberta_large"
    assert flag(train_argv(run("CoLA.sh", "acl_cross_layer", "--dry-run", env=env).stdout), "--arch") == (
        "multi_exit_roberta_large")


def test_gpu_uses_fp16_and_no_cpu_flag(env):
    argv = train_argv(run("RTE.sh", "ce", "--dry-run", env=dict(env, DEVICE="cuda")).stdout)
    assert "--cpu" not in argv and "--fp16" in argv and flag(argv, "--fp16-init-scale") == "4"
    refused = run("RTE.sh", "ce", "--dry-run", env=dict(env, DEVICE="gpu"))  # no second spelling of cuda
    assert refused.returncode == 2 and "DEVICE must be auto, cuda or cpu, not 'gpu'" in refused.stderr
    argv = train_argv(run("RTE.sh", "ce", "--dry-run", env=dict(env, DEVICE="cuda", FP16="0")).stdout)
    assert "--fp16" not in argv


def test_converter_model_args_file_sets_the_model_flags(env, tmp_path):
    conv = tmp_path / "converted"
    conv.mkdir()
    (conv / "model.pt").write_bytes(b"x")
    (conv / "model_args.txt").write_text("--encoder-layers 6 --encoder-embed-dim 384")  # no newline
    env["ROBERTA_PATH"] = str(conv / "model.pt")
    argv = train_argv(run("SST-2.sh", "ce", "--dry-run", env=env).stdout)
    assert argv.count("--arch") == 1 and flag(argv, "--arch") == "roberta"
    assert flag(argv, "--encoder-layers") == "6" and flag(argv, "--encoder-embed-dim") == "384"
    argv = train_argv(run("SST-2.sh", "multi_exit_ce", "--dry-run", env=env).stdout)
    assert argv.count("--arch") == 1 and flag(argv, "--arch") == "multi_exit_roberta"
    assert flag(argv, "--encoder-layers") == "6"
    # the method chooses the architecture: a file that names one is refused, not silently edited
    (conv / "model_args.txt").write_text("--arch roberta --encoder-layers 6\n")
    r = run("SST-2.sh", "ce", "--dry-run", env=env)
    assert r.returncode != 0 and "model_args.txt hold --arch" in r.stderr and "remove it" in r.stderr


@pytest.mark.parametrize("pair_format, separator", [("single", None), ("double", "2")])
def test_converted_encoder_conventions_set_pair_format_arch_and_exit(env, tmp_path, pair_format, separator):
    conv = tmp_path / "converted"
    conv.mkdir()
    (conv / "model.pt").write_bytes(b"x")
    (conv / "model_args.txt").write_text("--encoder-layers 6 --encoder-embed-dim 384\n")
    (conv / "conventions.json").write_text(json.dumps({"pair_format": pair_format}))
    env["ROBERTA_PATH"] = str(conv / "model.pt")
    argv = train_argv(run("RTE.sh", "ce", "--dry-run", env=env).stdout)
    assert (flag(argv, SEPARATOR_FLAG) if separator else SEPARATOR_FLAG not in argv) in (separator, True)
    # a BERT's segment embedding lives in multi_exit_roberta: a single-exit method gets one exit, the top layer
    assert flag(argv, "--arch") == "multi_exit_roberta" and flag(argv, "--exit-layers") == "6"
    assert flag(argv, "--conventions") == str(conv / "conventions.json")
    env["EXIT_POOLING"] = "mean"
    argv = train_argv(run("RTE.sh", "multi_exit_ce", "--dry-run", env=env).stdout)
    assert "--exit-layers" not in argv and flag(argv, "--exit-pooling") == "mean"
    assert argv.count("--conventions") == 1


def test_explicit_conventions_in_the_model_flags_set_the_pair_format(env, tmp_path):
    """The layout follows the record the model is built with, also when MODEL_ARGS names it."""
    conv = tmp_path / "bert"
    conv.mkdir()
    (conv / "conventions.json").write_text(json.dumps({"pair_format": "single"}))
    env["MODEL_ARGS"] = f"--encoder-layers 6 --conventions {conv}"
    argv = train_argv(run("RTE.sh", "multi_exit_ce", "--dry-run", env=env).stdout)
    assert SEPARATOR_FLAG not in argv and flag(argv, "--init-token") == "0"
    assert flag(argv, "--conventions") == str(conv) and argv.count("--conventions") == 1


def recipe_cli(*args):
    """``python -S -m acl_fairseq.runs.model_flags``, as the driver runs it (standard library only)."""
    return subprocess.run([sys.executable, "-S", "-m", "acl_fairseq.runs.model_flags", *args], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=REPO))


@pytest.mark.parametrize("pair_format, expected", [(None, ["--init-token", "0", SEPARATOR_FLAG, "2"]),
                                                   ("double", ["--init-token", "0", SEPARATOR_FLAG, "2"]),
                                                   ("single", ["--init-token", "0"])])
def test_recipe_flags_print_the_layout_of_a_record(tmp_path, pair_format, expected):
    args = []
    if pair_format:
        (tmp_path / "conventions.json").write_text(json.dumps({"pair_format": pair_format}))
        args = ["--conventions", str(tmp_path)]
    proc = recipe_cli("flags", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == expected
    (tmp_path / "conventions.json").write_text(json.dumps({"pair_format": "triple"}))
    bad = recipe_cli("flags", "--conventions", str(tmp_path))
    assert bad.returncode == 1 and "cannot read the pair format" in bad.stderr and "triple" in bad.stderr


def test_the_same_command_resumes_from_its_checkpoint_last(env):
    first = run("RTE.sh", "ce", "--dry-run", env=env)
    line = next(ln for ln in first.stdout.splitlines() if ln.startswith("fairseq-train "))
    run_dir = os.path.join(env["OUT_ROOT"], "runs", "RTE", "ce", "seed1")
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "command.sh"), "w") as f:
        f.write(f"#!/usr/bin/env bash\n# RTE / ce / seed 1\ncd {REPO}\n{line}\n")
    last = os.path.join(run_dir, "checkpoint_last.pt")
    open(last, "w").close()
    proc = run("RTE.sh", "ce", "--dry-run", env=env)
    argv = train_argv(proc.stdout)
    assert flag(argv, "--restore-file") == last and argv.count("--restore-file") == 1
    assert not [a for a in argv if a.startswith("--reset-")]
    assert "resume from " + last in proc.stderr and "| tee -a " in proc.stdout
    # starting over: --fresh, FRESH=1, another command
    for args, extra in [(["--fresh"], {}), ([], {"FRESH": "1"}), (["--lr", "3e-05"], {})]:
        argv = train_argv(run("RTE.sh", "ce", "--dry-run", *args, env=dict(env, **extra)).stdout)
        assert flag(argv, "--restore-file") == env["ROBERTA_PATH"] and "--reset-optimizer" in argv, (args, extra)
    # a finished run (result.json) rerun with FORCE=1 starts over: its checkpoint_last.pt is the end
    open(os.path.join(run_dir, "result.json"), "w").close()
    argv = train_argv(run("RTE.sh", "ce", "--dry-run", env=dict(env, FORCE="1")).stdout)
    assert flag(argv, "--restore-file") == env["ROBERTA_PATH"]


def test_download_only_when_missing(env, tmp_path):
    env.pop("ROBERTA_PATH")
    proc = run("RTE.sh", "ce", "--dry-run", env=env)
    models = env["MODEL_DIR"]
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"{RECIPES}/download_roberta.sh base {models}"
    assert flag(train_argv(proc.stdout), "--restore-file") == os.path.join(models, "roberta.base", "model.pt")
    os.makedirs(os.path.join(models, "roberta.base"))
    open(os.path.join(models, "roberta.base", "model.pt"), "w").close()
    proc = run("RTE.sh", "ce", "--dry-run", env=env)
    assert "download_roberta.sh" not in proc.stdout
    # the download script itself: usage on bad arguments, nothing to do when the model is there
    script = os.path.join(RECIPES, "download_roberta.sh")
    bad = subprocess.run([script, "medium", models], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
    ok = subprocess.run([script, "base", models], capture_output=True, text=True)
    assert ok.returncode == 0 and "already present" in ok.stderr


# ---- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "usage"),
        (["RTE"], "usage"),
        (["RTX", "ce"], "unknown task 'RTX'"),
        (["RTE", "acl"], "unknown method 'acl'"),
        (["RTE", "--lr"], "unknown method '--lr'"),
    ],
)
def test_bad_arguments_print_usage(args, message, env):
    proc = run("finetune.sh", *args, env=env)
    assert proc.returncode == 2
    assert message in proc.stderr and "usage:" in proc.stderr
    assert "fairseq-train" not in proc.stdout


def test_bad_settings_exit_2(env):
    for key, value in [("MODEL", "huge"), ("DEVICE", "tpu"), ("RESTORE", "yes"), ("SEED", "one"),
                       ("TOTAL_UPDATES", "1e3")]:
        proc = run("RTE.sh", "ce", env=dict(env, **{key: value}))
        assert proc.returncode == 2 and key in proc.stderr, (key, proc.stderr)
    proc = run("RTE.sh", "acl_cross_layer", "--dry-run", env=dict(env, ARCH="roberta"))
    assert proc.returncode == 2 and "multi-exit architecture" in proc.stderr
    assert run("CoLA.sh", "--help", env=env).returncode == 0


@pytest.fixture
def stub_trainer(tmp_path):
    """A fake fairseq-train that records that it ran."""
    marker = tmp_path / "trainer_ran"
    exe = write_exe(tmp_path / "fake-train", f"#!/usr/bin/env bash\ntouch {marker}\n")
    return exe, marker


def test_missing_data_is_refused_before_training(env, stub_trainer):
    exe, marker = stub_trainer
    proc = run("RTE.sh", "ce", env=dict(env, FAIRSEQ_TRAIN=exe))
    assert proc.returncode == 1
    assert "binarized data for RTE not found" in proc.stderr
    assert os.path.join(env["DATA_ROOT"], "RTE-bin", "input0", "train.idx") in proc.stderr
    assert not marker.exists() and not os.path.exists(env["OUT_ROOT"])


@pytest.mark.parametrize("how", ["explicit path", "no download"])
def test_missing_checkpoint_is_refused_before_training(how, env, stub_trainer, tmp_path):
    exe, marker = stub_trainer
    env.update(FAIRSEQ_TRAIN=exe, DATA_BIN=fake_data(tmp_path / "rte"))
    if how == "explicit path":
        env["ROBERTA_PATH"] = str(tmp_path / "nowhere" / "model.pt")
    else:
        env.pop("ROBERTA_PATH")
        env["DOWNLOAD"] = "0"
    proc = run("RTE.sh", "ce", env=env)
    assert proc.returncode == 1
    assert "checkpoint not found" in proc.stderr and "random weights" in proc.stderr
    assert not marker.exists()


def test_bf16_and_compile_are_one_variable_each(env):
    argv = train_argv(run("RTE.sh", "acl_embed", "--dry-run", env=dict(env, BF16="1", COMPILE="1")).stdout)
    assert "--autocast-bf16" in argv and "--compile" in argv and "--fp16" not in argv
    argv = train_argv(run("RTE.sh", "acl_embed", "--dry-run", env=env).stdout)
    assert "--autocast-bf16" not in argv and "--compile" not in argv
    for bad, words in [(dict(BF16="yes"), "BF16 must be 0 or 1, not 'yes'"),
                       (dict(BF16="1", DEVICE="cuda"), "choose one precision")]:
        refused = run("RTE.sh", "ce", "--dry-run", env=dict(env, **bad))
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
