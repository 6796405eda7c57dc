"""The GLUE recipes (recipes/glue/*.sh), their tables and the results collector.

Most checks run the driver with ``--dry-run`` and read the ``fairseq-train`` command it prints, or run it
for real with stub ``fairseq-train`` / ``acl-evaluate`` executables (seconds, no training). One test runs
a recipe for real end to end on the toy task with a tiny multi-exit model.
"""
import importlib.util
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys

import pytest

import helpers
from acl_fairseq.conventions import SEPARATOR_FLAG

REPO = helpers.REPO
RECIPES = os.path.join(REPO, "recipes")
GLUE = os.path.join(RECIPES, "glue")
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
# settings of the driver that must not leak in from the developer's shell
RECIPE_ENV = [
    "SEED", "MODEL", "MODEL_DIR", "ROBERTA_PATH", "RESTORE", "ARCH", "MODEL_ARGS", "EXIT_LAYERS", "EXIT_POOLING",
    "DATA_ROOT", "DATA_BIN", "OUT_ROOT", "MAX_EPOCH", "TOTAL_UPDATES", "WARMUP_UPDATES", "MAX_POSITIONS",
    "MAX_TOKENS", "LOG_INTERVAL", "DEVICE", "FP16", "NUM_GPUS", "EVAL_ARGS", "PREDICT_TEST", "FORCE", "DOWNLOAD",
    "DRY_RUN", "FRESH", "FAIRSEQ_TRAIN", "ACL_EVALUATE", "PYTHON", "TASKS", "METHODS", "SEEDS", "KEEP_GOING", "COLLECT",
    "HPARAMS_TABLE", "METHODS_TABLE",
]


def all_scripts():
    out = []
    for root, _, files in os.walk(RECIPES):
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".sh")]
    return sorted(out)


@pytest.fixture
def env(tmp_path):
    """Environment for a recipe run: outputs in tmp, a (fake) pretrained checkpoint, CPU, this venv first."""
    ckpt = tmp_path / "roberta.base" / "model.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"not really a checkpoint")
    e = {k: v for k, v in os.environ.items() if k not in RECIPE_ENV}
    e.update(
        PATH=os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", ""),
        OUT_ROOT=str(tmp_path / "out"),
        DATA_ROOT=str(tmp_path / "data-bin"),
        MODEL_DIR=str(tmp_path / "models"),
        ROBERTA_PATH=str(ckpt),
        DEVICE="cpu",
        PYTHON=sys.executable,
        PYTHONWARNINGS="ignore",
        OMP_NUM_THREADS="1",
    )
    return e


def run(script, *args, env, cwd=None):
    return subprocess.run(
        [os.path.join(GLUE, script), *args], capture_output=True, text=True, env=env, cwd=cwd or REPO
    )


def train_argv(stdout):
    """The fairseq-train argument list a dry run printed (without the `2>&1 | tee` part)."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("fairseq-train ")]
    assert len(lines) == 1, stdout
    argv = shlex.split(lines[0])
    return argv[: argv.index("2>&1")]


def flag(argv, name):
    """The value of the last occurrence of ``name`` (argparse keeps the last one)."""
    idx = [i for i, a in enumerate(argv) if a == name]
    assert idx, f"{name} not in {argv}"
    return argv[idx[-1] + 1]


def fake_data(path, task="SST-2", subsets=("valid",), regression=False):
    """The files the driver checks for (contents do not matter to the checks)."""
    for sub in ("input0", "label"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    for name in ["dict.txt", "train.idx"] + [f"{s}.idx" for s in subsets]:
        open(os.path.join(path, "input0", name), "w").close()
    open(os.path.join(path, "label", "train.label" if regression else "dict.txt"), "w").close()
    return str(path)


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return str(path)


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
    assert "write_result.py" in proc.stdout.splitlines()[-1]
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
        table.write_text(f.read() + "acl_embed\tRTE\tacl_embed\tsingle\t--acl-weight 0.3 --acl-temperature 0.1\n")
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
    for device in ("cuda", "gpu"):  # gpu: the old spelling
        argv = train_argv(run("RTE.sh", "ce", "--dry-run", env=dict(env, DEVICE=device)).stdout)
        assert "--cpu" not in argv and "--fp16" in argv and flag(argv, "--fp16-init-scale") == "4"
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
    """``python -S -m acl_fairseq.cli.recipe``, as the driver runs it (standard library only)."""
    return subprocess.run([sys.executable, "-S", "-m", "acl_fairseq.cli.recipe", *args], capture_output=True,
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


# ---- a real run of the driver with stub executables -----------------------------------------------

# the two `echo` lines are fairseq's one-line JSON log records, kept verbatim (hence the noqa: E501 below)
FAKE_TRAIN = r"""#!/usr/bin/env bash
# fake fairseq-train: writes the checkpoint and fairseq's json log lines for 3 epochs
save=""; prev=""
for a in "$@"; do [[ "$prev" == --save-dir ]] && save="$a"; prev="$a"; done
echo "$*" > "$save/argv.txt"
echo "2026-01-01 00:00:00 | INFO | fairseq.trainer | Loaded checkpoint x.pt (epoch 1 @ 0 updates)"
echo '2026-01-01 00:00:01 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "0.9", "accuracy": "20"}'
i=0
for acc in 70.5 80.25 80.25; do
  i=$((i + 1))
  echo "2026-01-01 00:00:02 | INFO | valid | {\"epoch\": $i, \"valid_loss\": \"0.$i\", \"valid_accuracy\": \"$acc\", \"valid_wps\": \"99\", \"valid_num_updates\": \"$((i * 10))\", \"valid_best_accuracy\": \"$acc\"}"
  echo "2026-01-01 00:00:02 | INFO | valid1 | {\"epoch\": $i, \"valid1_loss\": \"0.$i\", \"valid1_accuracy\": \"6$i\", \"valid1_num_updates\": \"$((i * 10))\"}"
done
touch "$save/checkpoint_best.pt" "$save/checkpoint_last.pt"
"""  # noqa: E501

FAKE_EVALUATE = r"""#!/usr/bin/env bash
# fake acl-evaluate: writes OUT_DIR/early_exit.json
out=""; prev=""
for a in "$@"; do [[ "$prev" == --out-dir ]] && out="$a"; prev="$a"; done
mkdir -p "$out"
echo '{"task": "MNLI", "num_layers": 12, "per_exit": [], "settings": []}' > "$out/early_exit.json"
"""


def test_driver_run_writes_command_log_and_result(env, tmp_path):
    env.update(
        FAIRSEQ_TRAIN=write_exe(tmp_path / "fake-train", FAKE_TRAIN),
        ACL_EVALUATE=write_exe(tmp_path / "fake-evaluate", FAKE_EVALUATE),
        DATA_BIN=fake_data(tmp_path / "mnli", subsets=("valid", "valid1")),
        SEED="3",
    )
    proc = run("MNLI.sh", "multi_exit_ce", "--update-freq", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = os.path.join(env["OUT_ROOT"], "runs", "MNLI", "multi_exit_ce", "seed3")
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    assert (result["task"], result["method"], result["seed"]) == ("MNLI", "multi_exit_ce", 3)
    assert result["criterion"] == "sentence_ce" and result["arch"] == "multi_exit_roberta_base"
    # the best of equal scores is the last one, as fairseq keeps it (`>=`): epoch 3, and valid1 of that update
    assert result["best_metric"] == "accuracy" and result["best_value"] == 80.25
    assert (result["best_epoch"], result["best_num_updates"], result["num_validations"]) == (3, 30, 3)
    assert result["best_valid"] == {"valid": {"loss": 0.3, "accuracy": 80.25},
                                    "valid1": {"loss": 0.3, "accuracy": 63.0}}
    assert result["early_exit_json"] == "early_exit/early_exit.json"
    assert result["early_exit_jsons"]["valid1"] == "early_exit_valid1/early_exit.json"
    assert os.path.isfile(os.path.join(run_dir, "early_exit_valid1", "early_exit.json"))
    # the exact command and the code version are kept with the run; the log is tee'd
    with open(os.path.join(run_dir, "command.sh")) as f:
        command = f.read()
    assert "--update-freq 2" in command and "acl-evaluate" not in command and "fake-evaluate" in command
    with open(os.path.join(run_dir, "argv.txt")) as f:
        assert f.read().split()[-2:] == ["--update-freq", "2"]
    with open(os.path.join(run_dir, "git_head.txt")) as f:
        head = f.readline().strip()
    git = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head == (git.stdout.strip() if git.returncode == 0 else "unknown (not a git checkout)")
    assert result["git_head"] == head
    with open(os.path.join(run_dir, "train.log")) as f:
        assert '"valid1_accuracy": "63"' in f.read()
    assert "80.25" in proc.stderr  # the closing summary line

    # a finished run is skipped on the next call, FORCE=1 runs it again
    os.remove(os.path.join(run_dir, "argv.txt"))
    again = run("MNLI.sh", "multi_exit_ce", env=env)
    assert again.returncode == 0 and "skipping" in again.stderr
    assert not os.path.exists(os.path.join(run_dir, "argv.txt"))
    assert run("MNLI.sh", "multi_exit_ce", env=dict(env, FORCE="1")).returncode == 0
    assert os.path.exists(os.path.join(run_dir, "argv.txt"))


def test_a_killed_run_resumes_on_the_same_call(env, tmp_path):
    """kill -9 mid-run, then the same recipe call: fairseq-train restores the run's checkpoint_last.pt with
    nothing reset, the log keeps both parts, and the run finishes."""
    marker = tmp_path / "killed_once"
    killed = FAKE_TRAIN.replace("echo \"$*\" > \"$save/argv.txt\"\n", f"""echo "$*" > "$save/argv.txt"
if [[ ! -f {marker} ]]; then
  touch {marker} "$save/checkpoint_last.pt"
  echo "2026-01-01 00:00:00 | INFO | fairseq.trainer | Loaded checkpoint x.pt (epoch 1 @ 0 updates)"
  echo "first part"
  exit 137
fi
""", 1)
    assert killed != FAKE_TRAIN
    env.update(FAIRSEQ_TRAIN=write_exe(tmp_path / "fake-train", killed), DATA_BIN=fake_data(tmp_path / "rte"))
    assert run("RTE.sh", "ce", env=env).returncode != 0
    run_dir = os.path.join(env["OUT_ROOT"], "runs", "RTE", "ce", "seed1")
    proc = run("RTE.sh", "ce", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "resuming from " + os.path.join(run_dir, "checkpoint_last.pt") in proc.stderr
    with open(os.path.join(run_dir, "argv.txt")) as f:
        argv = f.read().split()
    assert flag(argv, "--restore-file") == os.path.join(run_dir, "checkpoint_last.pt")
    assert "--reset-optimizer" not in argv and "--reset-dataloader" not in argv and "--reset-meters" not in argv
    with open(os.path.join(run_dir, "train.log")) as f:
        log = f.read()
    assert "first part" in log and '"valid_accuracy": "80.25"' in log
    with open(os.path.join(run_dir, "command.sh")) as f:
        command = f.read()
    assert "# resumed" in command and f"--restore-file {env['ROBERTA_PATH']} --reset-optimizer" in command
    assert os.path.isfile(os.path.join(run_dir, "result.json"))


def test_driver_refuses_a_run_that_did_not_load_the_checkpoint(env, tmp_path):
    no_load = FAKE_TRAIN.replace("Loaded checkpoint", "No existing checkpoint found")
    env.update(FAIRSEQ_TRAIN=write_exe(tmp_path / "fake-train", no_load), DATA_BIN=fake_data(tmp_path / "rte"))
    proc = run("RTE.sh", "ce", env=env)
    assert proc.returncode == 1 and "Loaded checkpoint" in proc.stderr
    assert not os.path.exists(os.path.join(env["OUT_ROOT"], "runs", "RTE", "ce", "seed1", "result.json"))


# ---- sweep --------------------------------------------------------------------------------------------


def test_sweep_dry_run_loops_and_skips_contrastive_sts_b(env):
    env.update(TASKS="STS-B RTE", METHODS="ce scl", SEEDS="1 2")
    proc = subprocess.run([os.path.join(GLUE, "sweep.sh"), "--dry-run", "--update-freq", "4"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    runs = [train_argv(ln) for ln in proc.stdout.splitlines() if ln.startswith("fairseq-train ")]
    got = sorted((a[1].rsplit("/", 1)[1], flag(a, "--criterion"), flag(a, "--seed")) for a in runs)
    assert got == sorted([("STS-B-bin", "sentence_ce", s) for s in "12"] +
                         [("RTE-bin", c, s) for c in ("sentence_ce", "sentence_scl") for s in "12"])
    assert all(flag(a, "--update-freq") == "4" for a in runs)
    assert "skipping STS-B / scl" in proc.stderr
    bad = subprocess.run([os.path.join(GLUE, "sweep.sh")], capture_output=True, text=True,
                         env=dict(env, METHODS="ce nope"))
    assert bad.returncode == 2 and "unknown method 'nope'" in bad.stderr and "usage:" in bad.stderr


def test_sweep_runs_then_writes_the_table(env, tmp_path):
    env.update(TASKS="RTE", METHODS="ce acl_embed", SEEDS="1 2", DATA_BIN=fake_data(tmp_path / "rte"),
               FAIRSEQ_TRAIN=write_exe(tmp_path / "fake-train", FAKE_TRAIN))
    proc = subprocess.run([os.path.join(GLUE, "sweep.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(env["OUT_ROOT"], "results.md")) as f:
        lines = f.read().splitlines()
    assert lines[:4] == ["| method | RTE (Acc) |", "|---|---|", "| ce | 80.25 ± 0.00 (n=2) |",
                         "| acl_embed | 80.25 ± 0.00 (n=2) |"]


# ---- collector ----------------------------------------------------------------------------------------


def load_collector():
    spec = importlib.util.spec_from_file_location("collect_results", os.path.join(RECIPES, "collect_results.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_result(runs, task, method, seed, valid, valid1=None, early_exit=None):
    d = os.path.join(runs, task, method, f"seed{seed}")
    os.makedirs(d, exist_ok=True)
    best = {"valid": valid, **({"valid1": valid1} if valid1 else {})}
    res = {"task": task, "method": method, "seed": seed, "best_metric": next(iter(valid)), "best_valid": best,
           "early_exit_json": None}
    if early_exit:
        os.makedirs(os.path.join(d, "early_exit"))
        with open(os.path.join(d, "early_exit", "early_exit.json"), "w") as f:
            json.dump(early_exit, f)
        res["early_exit_json"] = "early_exit/early_exit.json"
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump(res, f)


def test_collector_table(tmp_path):
    runs = str(tmp_path / "runs")
    fake_result(runs, "CoLA", "ce", 1, {"mcc": 60.0, "accuracy": 80.0})
    fake_result(runs, "CoLA", "ce", 2, {"mcc": 62.0, "accuracy": 81.0})
    fake_result(runs, "MNLI", "acl_embed", 1, {"accuracy": 87.5}, {"accuracy": 87.0})
    out = tmp_path / "results.md"
    proc = subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), runs, "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "| method | CoLA (MCC) | MNLI-m (Acc) | MNLI-mm (Acc) |"
    assert lines[1] == "|---|---|---|---|"
    assert lines[2] == "| ce | 61.00 ± 1.41 (n=2) | – | – |"
    assert lines[3] == "| acl_embed | – | 87.50 (n=1) | 87.00 (n=1) |"
    assert "sample standard deviation" in out.read_text()
    js = subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), runs, "--format", "json"],
                        capture_output=True, text=True)
    data = json.loads(js.stdout)
    old_spelling = subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), runs, "--json"],
                                  capture_output=True, text=True)
    assert json.loads(old_spelling.stdout) == data  # the deprecated switch still works
    by_suffix = tmp_path / "table.json"
    subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), runs, "--out", str(by_suffix)],
                   check=True, capture_output=True)
    assert json.loads(by_suffix.read_text()) == data
    cell = next(c for c in data["cells"] if c["method"] == "ce" and c["task"] == "CoLA")
    assert cell["values"] == [60.0, 62.0] and cell["seeds"] == [1, 2] and cell["n"] == 2
    assert cell["mean"] == 61.0 and abs(cell["std"] - 2 ** 0.5) < 1e-12
    empty = subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), str(tmp_path / "none")],
                           capture_output=True, text=True)
    assert empty.returncode == 2 and "not a folder" in empty.stderr


def test_collector_plots_multi_exit_runs(tmp_path, monkeypatch):
    collector = load_collector()
    runs = str(tmp_path / "runs")
    ee = {"task": "RTE", "num_layers": 2, "per_exit": [], "settings": []}
    fake_result(runs, "RTE", "acl_cross_layer", 1, {"accuracy": 70.0}, early_exit=ee)
    fake_result(runs, "RTE", "acl_cross_layer", 2, {"accuracy": 72.0}, early_exit=ee)
    fake_result(runs, "RTE", "ce", 1, {"accuracy": 71.0})
    calls = []
    fake_report = type(sys)("acl_fairseq.cli.report")
    fake_report.plot_overlay = lambda groups, path: calls.append((groups, path)) or open(path, "w").close()
    monkeypatch.setitem(sys.modules, "acl_fairseq.cli.report", fake_report)
    assert collector.main([runs, "--out", str(tmp_path / "results.md")]) == 0
    assert len(calls) == 1
    groups, path = calls[0]
    assert list(groups) == ["acl_cross_layer"] and groups["acl_cross_layer"] == [ee, ee]
    assert path == str(tmp_path / "early_exit_RTE.png")
    assert "![early exit RTE](early_exit_RTE.png)" in (tmp_path / "results.md").read_text()


def test_collector_says_so_when_the_plot_function_is_missing(tmp_path, monkeypatch, capsys):
    collector = load_collector()
    runs = str(tmp_path / "runs")
    fake_result(runs, "RTE", "multi_exit_ce", 1, {"accuracy": 70.0}, early_exit={"settings": []})
    monkeypatch.setitem(sys.modules, "acl_fairseq.cli.report", None)  # makes the import fail
    assert collector.main([runs]) == 0
    captured = capsys.readouterr()
    assert "plot_overlay is unavailable" in captured.err and "| multi_exit_ce | 70.00 (n=1) |" in captured.out


# ---- end to end ---------------------------------------------------------------------------------------


def test_tiny_end_to_end_run(env, tmp_path):
    """SST-2's recipe for real on the toy task: a tiny multi-exit RoBERTa from scratch with acl_cross_layer,
    through to the checkpoint, TensorBoard events, the early-exit JSON, result.json and the table."""
    data = helpers.make_data(str(tmp_path / "toy"))["data"]
    env.pop("ROBERTA_PATH")
    env.update(DATA_BIN=data, ARCH="multi_exit_roberta", MODEL_ARGS=" ".join(helpers.TINY_SHAPE), RESTORE="none",
               MAX_EPOCH="2", TOTAL_UPDATES="4",
               LOG_INTERVAL="1", EVAL_ARGS="--timing-examples 8 --timing-repeats 1")
    proc = run("SST-2.sh", "acl_cross_layer", "--num-workers", "0", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = env["OUT_ROOT"]
    run_dir = os.path.join(out, "runs", "SST-2", "acl_cross_layer", "seed1")
    assert os.path.isfile(os.path.join(run_dir, "checkpoint_best.pt"))
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    assert result["best_metric"] == "accuracy" and 0 <= result["best_value"] <= 100
    assert result["best_valid"]["valid"]["accuracy"] == result["best_value"]
    with open(os.path.join(run_dir, result["early_exit_json"])) as f:
        early = json.load(f)
    assert early["num_layers"] == 3 and [e["layer"] for e in early["per_exit"]] == [1, 2, 3]
    assert early["settings"]
    scalars = helpers.read_scalars(os.path.join(out, "tb", "SST-2", "acl_cross_layer", "seed1"))
    assert "accuracy" in scalars["valid"] and len(scalars["valid"]["accuracy"]) == 2
    assert "early_exit_valid" in scalars
    with open(os.path.join(run_dir, "command.sh")) as f:
        assert "--criterion acl_cross_layer" in f.read()
    table = subprocess.run([sys.executable, os.path.join(RECIPES, "collect_results.py"), os.path.join(out, "runs"),
                            "--out", os.path.join(out, "results.md")], capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    assert os.path.isfile(os.path.join(out, "early_exit_SST-2.png"))
    with open(os.path.join(out, "results.md")) as f:
        assert f.read().startswith("| method | SST-2 (Acc) |\n|---|---|\n| acl_cross_layer | ")


def test_collector_tabulates_every_exit_over_seeds(tmp_path, monkeypatch):
    collector = load_collector()
    runs = str(tmp_path / "runs")

    def ee(*accs):
        return {"task": "SST-2", "primary_metric": "accuracy", "settings": [],
                "per_exit": [{"layer": i + 1, "metrics": {"accuracy": a, "f1": 0.0}} for i, a in enumerate(accs)]}

    fake_result(runs, "SST-2", "multi_exit_ce", 1, {"accuracy": 80.0}, early_exit=ee(70.0, 80.0))
    fake_result(runs, "SST-2", "multi_exit_ce", 2, {"accuracy": 82.0}, early_exit=ee(72.0, 82.0))
    fake_result(runs, "SST-2", "acl_cross_layer", 1, {"accuracy": 81.0}, early_exit=ee(75.0, 81.0))
    fake_result(runs, "SST-2", "ce", 1, {"accuracy": 83.0})  # single exit: no early_exit.json, no row
    monkeypatch.setitem(sys.modules, "acl_fairseq.cli.report", None)  # no plot needed here
    out = tmp_path / "results.md"
    assert collector.main([runs, "--out", str(out)]) == 0
    text = out.read_text()
    assert "SST-2, Acc of every exit" in text
    assert "| method | exit 1 | exit 2 |" in text
    assert "| multi_exit_ce | 71.00 ± 1.41 (n=2) | 81.00 ± 1.41 (n=2) |" in text
    assert "| acl_cross_layer | 75.00 (n=1) | 81.00 (n=1) |" in text
    assert "| ce | 83.00 (n=1) |" in text and "| ce | 83.00 (n=1) | –" not in text
    assert collector.main([runs, "--json", "--out", str(tmp_path / "r.json")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["per_exit"]["SST-2"]["metric"] == "accuracy"
    assert data["per_exit"]["SST-2"]["methods"]["multi_exit_ce"] == {"1": [70.0, 72.0], "2": [80.0, 82.0]}
