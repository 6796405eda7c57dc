"""Shared by the recipe tests: the driver's environment, running a recipe script, reading what it printed."""
import os
import shlex
import stat
import subprocess
import sys

import helpers

REPO = helpers.REPO
RECIPES = os.path.join(REPO, "recipes")
GLUE = os.path.join(RECIPES, "glue")
# settings of the driver that must not leak in from the developer's shell
RECIPE_ENV = [
    "SEED", "MODEL", "MODEL_DIR", "ROBERTA_PATH", "RESTORE", "ARCH", "MODEL_ARGS", "EXIT_LAYERS", "EXIT_POOLING",
    "DATA_ROOT", "DATA_BIN", "OUT_ROOT", "MAX_EPOCH", "TOTAL_UPDATES", "WARMUP_UPDATES", "MAX_POSITIONS",
    "MAX_TOKENS", "LOG_INTERVAL", "DEVICE", "FP16", "NUM_GPUS", "EVAL_ARGS", "PREDICT_TEST", "FORCE", "DOWNLOAD",
    "DRY_RUN", "FRESH", "FAIRSEQ_TRAIN", "ACL_EVALUATE", "PYTHON", "TASKS", "METHODS", "SEEDS", "KEEP_GOING", "COLLECT",
    "HPARAMS_TABLE", "METHODS_TABLE",
]


def recipe_env(tmp_path):
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
