"""The run plan of one GLUE recipe run: what recipes/glue/finetune.sh runs, decided in one place.

    plan = build_plan("RTE", "acl_grad", seed=2, overrides={"lr": "3e-05"})
    plan.train        # the fairseq-train argv (resuming from checkpoint_last.pt when the same command was killed)
    plan.evaluations  # one acl-evaluate argv per validation subset (multi-exit methods)
    plan.resume, plan.finished, plan.stops  # what a real run would do, or why it would stop
    runner.run(plan)  # nothing runs, reads only, until this (acl_fairseq/runs/runner.py)

``build_plan`` refuses settings that cannot work (:class:`RecipeError`; ``status`` 2 for a usage error)
before it looks at the data or the run folder. It reads the tables (recipes/glue/hparams.tsv per task, methods.tsv per
method), the checkpoint's folder (acl_fairseq/runs/model_flags.py decides the architecture and layout), the data
folder and the run folder; it writes nothing. The settings are the driver's environment variables
(:data:`SETTINGS`), lower-cased as ``overrides`` keys. Standard library only: the runner runs it with
``python -S`` (acl_fairseq/runs/runner.py).
"""
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from acl_fairseq.runs.model_flags import RecipeError, decide
from acl_fairseq.runs.recipe_tables import REPO, Method, method, refusal, tasks
from acl_runtime.glue_tasks import TaskSpec

WARMUP_FRACTION = 0.06  # fairseq's RoBERTa GLUE recipe: 6 % of the updates, rounded up
# (variable, default, meaning): the driver's settings, read from the environment; empty = the default
SETTINGS = [
    ("SEED", "1", "random seed; runs land in .../seed$SEED"),
    ("MODEL", "base", "pretrained RoBERTa size: base | large"),
    ("MODEL_DIR", "", "holds roberta.$MODEL/ (downloaded if missing); default ${XDG_CACHE_HOME:-$HOME/.cache}/"
                      "acl_fairseq"),
    ("ROBERTA_PATH", "", "checkpoint to start from; default $MODEL_DIR/roberta.$MODEL/model.pt"),
    ("RESTORE", "", "\"none\": start from random weights (tiny smoke runs only)"),
    ("ARCH", "", "fairseq --arch; default from MODEL and the method's exits"),
    ("MODEL_ARGS", "", "extra model flags; default: model_args.txt next to ROBERTA_PATH"),
    ("EXIT_LAYERS", "", "multi_exit_roberta: --exit-layers; empty = every layer (single-exit methods: the top one)"),
    ("EXIT_POOLING", "", "multi_exit_roberta: --exit-pooling cls | mean; empty = the model's default"),
    ("DATA_ROOT", "", "holds one binarized folder per task, <TASK>-bin; default $REPO/data-bin"),
    ("DATA_BIN", "", "this task's binarized data; default $DATA_ROOT/<TASK>-bin"),
    ("OUT_ROOT", "", "output root: runs/TASK/METHOD/seedS and tb/TASK/METHOD/seedS; default $REPO/runs/glue"),
    ("LR", "", "peak learning rate; default the table's"),
    ("BATCH_SIZE", "", "sentences per batch; default the table's (updates not rescaled)"),
    ("MAX_EPOCH", "10", "fairseq's recipe: 10 epochs"),
    ("TOTAL_UPDATES", "", "override the table's total updates (LR schedule length)"),
    ("WARMUP_UPDATES", "", "override warm-up; default the table's, or 6 % of TOTAL_UPDATES"),
    ("MAX_POSITIONS", "512", "longest input in tokens (RoBERTa: 512)"),
    ("MAX_TOKENS", "4400", "fairseq's recipe: at most 4400 tokens per batch"),
    ("LOG_INTERVAL", "200", "updates between train_inner log lines"),
    ("DEVICE", "auto", "auto | cuda | cpu (auto: cuda when nvidia-smi lists a GPU)"),
    ("OPTIMIZER", "adamw_torch", "adamw_torch (fused torch AdamW, the same update as fairseq's adam) | adam"),
    ("FP16", "auto", "auto (on when running on a GPU) | 1 | 0"),
    ("BF16", "0", "1: forward passes in bf16 autocast (--autocast-bf16; refused where the CPU has no native bf16)"),
    ("COMPILE", "0", "1: torch.compile the model (--compile; on CPU slower than eager here: docs/mixed_precision.md)"),
    ("NUM_GPUS", "1", "GPUs per run; the recipe's batch sizes are for one GPU"),
    ("EVAL_ARGS", "", "extra acl-evaluate flags (multi-exit methods)"),
    ("PREDICT_TEST", "0", "1: acl-evaluate also writes GLUE test-set predictions"),
    ("FORCE", "0", "1: rerun even if result.json exists (default: skip done runs)"),
    ("DOWNLOAD", "1", "0: never download roberta.$MODEL, fail instead"),
    ("DRY_RUN", "0", "1 (or --dry-run): print the commands, run nothing"),
    ("FRESH", "0", "1 (or --fresh): start over, even where the same command left checkpoint_last.pt"),
    ("FAIRSEQ_TRAIN", "fairseq-train", "the fairseq-train executable"),
    ("ACL_EVALUATE", "acl-evaluate", "the early-exit evaluation executable"),
    ("PYTHON", "python3", "runs the runner and its result step (standard library only)"),
    ("HPARAMS_TABLE", "", "the per-task table; default the package's (recipes/glue/hparams.tsv links to it)"),
    ("METHODS_TABLE", "", "the per-method table; default recipes/glue/methods.tsv"),
]
WHOLE_NUMBERS = ("SEED", "MAX_EPOCH", "TOTAL_UPDATES", "WARMUP_UPDATES", "BATCH_SIZE", "NUM_GPUS")
# fairseq's GLUE recipe, the same for every task and method (benchmarks/hf_loop.py reads these too)
RECIPE = {"dropout": 0.1, "attention_dropout": 0.1, "weight_decay": 0.1, "adam_betas": (0.9, 0.98),
          "adam_eps": 1e-06, "clip_norm": 0.0}
FP16_FLAGS = ["--fp16", "--fp16-init-scale", "4", "--threshold-loss-scale", "1", "--fp16-scale-window", "128"]


def settings(environ: Mapping[str, str] = os.environ, overrides: Optional[Mapping[str, object]] = None
             ) -> Dict[str, str]:
    """Every setting by variable name: ``overrides`` (lower-case keys welcome), else the environment, else
    the default; an empty value is the default, as the driver's ``${VAR:-default}``."""
    given = {k.upper(): "" if v is None else str(v) for k, v in (overrides or {}).items()}
    unknown = sorted(set(given) - {name for name, _, _ in SETTINGS})
    if unknown:
        raise RecipeError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(n for n, _, _ in SETTINGS)}", 2)
    return {name: given.get(name, environ.get(name, "")) or default for name, default, _ in SETTINGS}


def warmup_updates(total: int, fraction: float = WARMUP_FRACTION) -> int:
    """The recipe's warm-up: ``fraction`` of ``total`` updates, rounded up, in exact arithmetic (100 x 0.06 is
    6.000000000000001 in floats, and the recipe's warm-up for 100 updates is 6)."""
    return int(-(-total * Fraction(str(fraction)) // 1))


def quote(args: Sequence[str]) -> str:
    """The words as one line that a shell reads back as the same words (plain words unquoted)."""
    return " ".join(a if re.fullmatch(r"[A-Za-z0-9_./:=,+@%-]+", a) else "'" + a.replace("'", "'\\''") + "'"
                    for a in args)


def run_dir(out_root: str, task: str, method_name: str, seed: object) -> str:
    return os.path.join(out_root, "runs", task, method_name, f"seed{seed}")


def has_gpu(environ: Mapping[str, str] = os.environ) -> bool:
    """An NVIDIA GPU is visible: nvidia-smi lists one and CUDA_VISIBLE_DEVICES does not hide them all."""
    if environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    listed = subprocess.run([exe, "-L"], capture_output=True, text=True).stdout
    return any(line.startswith("GPU") for line in listed.splitlines())


def dictionaries_differ(checkpoint: str, data_bin: str) -> bool:
    """The checkpoint's dict.txt (when it has one) is not byte for byte the data's (fairseq#1048)."""
    ours = os.path.join(os.path.dirname(checkpoint), "dict.txt")
    if not checkpoint or not os.path.isfile(ours):
        return False
    try:
        with open(ours, "rb") as a, open(os.path.join(data_bin, "input0", "dict.txt"), "rb") as b:
            return a.read() != b.read()
    except OSError:
        return True


@dataclass
class Plan:
    task: TaskSpec
    method: Method
    settings: Dict[str, str]
    extra: List[str]
    repo: str
    arch: str
    device: str
    data_bin: str
    run_dir: str
    tb_dir: str
    checkpoint: str  # the pretrained weights to restore ("": random initialisation)
    default_checkpoint: str
    train: List[str]  # what runs: the resumed command when resuming
    train_line: str  # the fresh command as command.sh records it; a later run of the same line resumes
    evaluations: List[List[str]]
    result: List[str]
    download: List[str]  # empty unless the default checkpoint must be downloaded first
    resume: bool
    finished: bool  # result.json exists and FORCE is not 1: a real run skips
    missing_data: List[str] = field(default_factory=list)
    missing_checkpoint: str = ""

    seed = property(lambda self: self.settings["SEED"])
    last = property(lambda self: os.path.join(self.run_dir, "checkpoint_last.pt"))  # what a resumed run restores

    @property
    def stops(self) -> List[str]:
        """Why a real run would stop before training (a dry run only notes them)."""
        out = []
        if self.missing_data:
            out.append(f"binarized data for {self.task.name} not found:\n" + "\n".join(self.missing_data) + "\n"
                       f"Binarize it first (python preprocess/glue.py --task {self.task.name} --input GLUE_DIR/"
                       f"{self.task.name} --output {self.data_bin}),\nor point DATA_ROOT (the folder of <TASK>-bin "
                       "folders) or DATA_BIN at existing data.")
        return out + ([self.missing_checkpoint] if self.missing_checkpoint else [])

    def dry_run_notes(self) -> List[str]:
        notes = [f"dry run: {self.task.name} / {self.method.name} / seed {self.seed}, nothing is executed"]
        if self.missing_data:
            notes.append("data missing (a real run would stop): " + "".join(p + " " for p in self.missing_data))
        if self.missing_checkpoint:
            notes.append(f"a real run would stop: {self.missing_checkpoint}")
        if not self.checkpoint:
            notes.append("RESTORE=none: random initialization")
        if self.finished:
            notes.append(f"{self.run_dir}/result.json exists: a real run would skip")
        if self.resume:
            notes.append(f"a real run would resume from {self.last} (FRESH=1 starts over)")
        return notes

    def commands(self) -> List[str]:
        """The lines a dry run prints, in the order a real run runs them."""
        log = quote([os.path.join(self.run_dir, "train.log")])
        return ([quote(self.download)] if self.download else []) + [
            f"{quote(self.train)} 2>&1 | tee {'-a ' if self.resume else ''}{log}",
            *(quote(e) for e in self.evaluations), quote(self.result)]

    def driver(self) -> List[str]:
        """The runner's command line for this plan (its settings go in the environment, :meth:`environment`),
        for a caller that runs it as a process of its own (acl-tune, to stop a pruned trial's whole group); run
        in-process, it is ``runner.run(plan)``."""
        return [self.settings["PYTHON"], "-S", "-m", "acl_fairseq.runs.runner", "finetune", self.task.name,
                self.method.name, *self.extra]

    def environment(self) -> Dict[str, str]:
        """The settings as the runner's environment variables (a plan built as a dry run runs as one), and the
        path to this checkout's package."""
        return {**self.settings, "PYTHONPATH": self.repo}


def _checkpoint_paths(s: Dict[str, str], environ: Mapping[str, str]) -> Tuple[str, str, str]:
    """``(model_dir, default_checkpoint, checkpoint)``: where pretrained models are kept, the MODEL's file there,
    and the checkpoint the run restores ("" with RESTORE=none)."""
    model_dir = s["MODEL_DIR"] or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME", ""), ".cache"), "acl_fairseq")
    default_checkpoint = os.path.join(model_dir, f"roberta.{s['MODEL']}", "model.pt")
    checkpoint = "" if s["RESTORE"] == "none" else s["ROBERTA_PATH"] or default_checkpoint
    return model_dir, default_checkpoint, checkpoint


def _device_and_fp16(s: Dict[str, str], environ: Mapping[str, str]) -> Tuple[str, str]:
    """``(device, fp16)`` with "auto" resolved; a precision the device cannot run is refused."""
    device = s["DEVICE"] if s["DEVICE"] != "auto" else "cuda" if has_gpu(environ) else "cpu"
    fp16 = s["FP16"] if s["FP16"] != "auto" else "1" if device == "cuda" else "0"
    if device == "cpu" and fp16 == "1":
        raise RecipeError("FP16=1 needs a GPU (DEVICE=cpu)", 2)
    if fp16 == "1" and s["BF16"] == "1":
        raise RecipeError("BF16=1 and FP16 on: choose one precision (FP16=0 for bf16)", 2)
    return device, fp16


def build_plan(task_name: str, method_name: str, seed: Optional[object] = None,
               overrides: Optional[Mapping[str, object]] = None, extra: Sequence[str] = (),
               environ: Mapping[str, str] = os.environ, repo: str = REPO) -> Plan:
    """The plan of one run. ``overrides`` (driver variables, any case) win over ``environ``; ``extra`` are
    fairseq-train flags that go last; ``seed`` is SEED."""
    s = settings(environ, {**(overrides or {}), **({"SEED": seed} if seed is not None else {})})
    task, m = _checked(s, task_name, method_name)
    model_dir, default_checkpoint, checkpoint = _checkpoint_paths(s, environ)
    d = decide(s["MODEL"], m.exits, m.name, s["ARCH"], s["MODEL_ARGS"], checkpoint or None, s["EXIT_LAYERS"],
               s["EXIT_POOLING"])
    device, fp16 = _device_and_fp16(s, environ)
    data_bin = s["DATA_BIN"] or os.path.join(s["DATA_ROOT"] or os.path.join(repo, "data-bin"), f"{task.name}-bin")
    out_root = s["OUT_ROOT"] or os.path.join(repo, "runs", "glue")
    rd = run_dir(out_root, task.name, m.name, s["SEED"])
    tb = os.path.join(out_root, "tb", task.name, m.name, f"seed{s['SEED']}")
    head = [s["FAIRSEQ_TRAIN"], data_bin, "--user-dir", os.path.join(repo, "acl_fairseq")]
    restore = ["--restore-file", checkpoint, "--reset-optimizer", "--reset-dataloader", "--reset-meters"]
    rest = _train_flags(s, task, m, d, rd, tb, device, fp16, extra)
    train = head + (restore if checkpoint else []) + rest
    train_line = f"{quote(train)} 2>&1 | tee {quote([os.path.join(rd, 'train.log')])}"
    evaluations, early_exit = _evaluations(s, task, m, rd, tb, data_bin, device)
    result = [s["PYTHON"], "-S", "-m", "acl_fairseq.runs.result", rd, "--task", task.name,
              "--method", m.name, "--seed", s["SEED"], "--criterion", m.criterion, "--arch", d.arch,
              "--best-metric", task.best_metric, "--valid-subsets", ",".join(task.valid_subsets), *early_exit]
    download, missing_checkpoint = _pretrained(s, checkpoint, default_checkpoint, model_dir, repo)
    finished = os.path.isfile(os.path.join(rd, "result.json"))
    resume = s["FRESH"] != "1" and os.path.isfile(os.path.join(rd, "checkpoint_last.pt")) and not finished and (
        _records(os.path.join(rd, "command.sh"), train_line))
    if resume:  # fairseq continues exactly (weights, optimizer, schedule, data order): nothing is reset
        train = head + ["--restore-file", os.path.join(rd, "checkpoint_last.pt")] + rest
    return Plan(task, m, s, list(extra), repo, d.arch, device, data_bin, rd, tb, checkpoint, default_checkpoint,
                train, train_line, evaluations, result, download, resume, finished and s["FORCE"] != "1",
                _missing_data(data_bin, task), missing_checkpoint)


def _checked(s: Dict[str, str], task_name: str, method_name: str):
    """``(task, method)`` of the tables, after every refusal that the settings alone decide (a usage error, 2)."""
    task = tasks(s["HPARAMS_TABLE"]).get(task_name)
    if task is None:
        raise RecipeError(f"unknown task '{task_name}'", 2)
    m = method(method_name, task_name, s["METHODS_TABLE"])
    if m is None:
        raise RecipeError(f"unknown method '{method_name}'", 2)
    why = refusal(task, m)
    if why:
        raise RecipeError(why, 2)
    if s["MODEL"] not in ("base", "large"):
        raise RecipeError(f"MODEL must be base or large, not '{s['MODEL']}'", 2)
    for name, allowed in (("DEVICE", ("auto", "cuda", "cpu")), ("FP16", ("auto", "0", "1")), ("BF16", ("0", "1")),
                          ("COMPILE", ("0", "1"))):
        if s[name] not in allowed:
            raise RecipeError(f"{name} must be {', '.join(allowed[:-1])} or {allowed[-1]}, not '{s[name]}'", 2)
    for name in WHOLE_NUMBERS:
        if not re.fullmatch(r"[0-9]*", s[name]):
            raise RecipeError(f"{name} must be a whole number, not '{s[name]}'", 2)
    if s["RESTORE"] not in ("", "none"):
        raise RecipeError(f"RESTORE must be empty or 'none', not '{s['RESTORE']}' (set ROBERTA_PATH to choose a "
                          "checkpoint)", 2)
    return task, m


def _train_flags(s, task: TaskSpec, m: Method, d, rd: str, tb: str, device: str, fp16: str, extra) -> List[str]:
    """fairseq-train's flags after the data and the checkpoint: fairseq's GLUE recipe, the task's row, the method's
    row, the schedule (TOTAL_UPDATES and its 6 % warm-up, or the row's), the device, then ``extra``."""
    if s["TOTAL_UPDATES"]:
        total, warmup = s["TOTAL_UPDATES"], s["WARMUP_UPDATES"] or str(warmup_updates(int(s["TOTAL_UPDATES"])))
    else:
        total, warmup = task.total_updates, s["WARMUP_UPDATES"] or task.warmup_updates
    device_flags = ["--distributed-world-size", s["NUM_GPUS"]] if device != "cpu" else [
        "--cpu", "--distributed-world-size", "1"]
    return [
        "--task", "sentence_prediction_acl", *d.task_flags, "--num-classes", task.num_classes,
        *(["--regression-target"] if task.regression else []),
        "--max-positions", s["MAX_POSITIONS"], "--batch-size", s["BATCH_SIZE"] or task.batch_size,
        "--max-tokens", s["MAX_TOKENS"], "--required-batch-size-multiple", "1", *d.model_flags,
        "--criterion", m.criterion, *m.flags,
        "--dropout", str(RECIPE["dropout"]), "--attention-dropout", str(RECIPE["attention_dropout"]),
        "--weight-decay", str(RECIPE["weight_decay"]), "--optimizer", s["OPTIMIZER"],
        "--adam-betas", "(%s,%s)" % RECIPE["adam_betas"], "--adam-eps", str(RECIPE["adam_eps"]),
        "--clip-norm", str(RECIPE["clip_norm"]),
        "--lr-scheduler", "polynomial_decay", "--lr", s["LR"] or task.lr,
        "--total-num-update", total, "--max-update", total, "--warmup-updates", warmup,
        "--max-epoch", s["MAX_EPOCH"], "--seed", s["SEED"], "--find-unused-parameters",
        "--valid-subset", ",".join(task.valid_subsets),
        "--best-checkpoint-metric", task.best_metric, "--maximize-best-checkpoint-metric",
        "--save-dir", rd, "--no-epoch-checkpoints",
        "--tensorboard-logdir", tb, "--log-format", "json", "--log-interval", s["LOG_INTERVAL"],
        *device_flags, *(FP16_FLAGS if fp16 == "1" else []), *(["--autocast-bf16"] if s["BF16"] == "1" else []),
        *(["--compile"] if s["COMPILE"] == "1" else []), *extra]


def _evaluations(s, task: TaskSpec, m: Method, rd: str, tb: str, data_bin: str, device: str):
    """``(acl-evaluate argvs, result.py's --early-exit flags)``: one evaluation per validation subset of a
    multi-exit method (the first also predicts the test splits with PREDICT_TEST=1); none for a single exit."""
    evaluations, early_exit = [], []
    if m.exits != "multi":
        return evaluations, early_exit
    eval_extra = (s["EVAL_ARGS"].splitlines() or [""])[0].split()
    for i, subset in enumerate(task.valid_subsets):
        name = "early_exit" if i == 0 else f"early_exit_{subset}"
        cmd = [s["ACL_EVALUATE"], os.path.join(rd, "checkpoint_best.pt"), data_bin, "--output",
               os.path.join(rd, name), "--split", subset, "--task-name", task.name, "--tensorboard-logdir",
               os.path.join(tb, f"early_exit_{subset}")]
        if s["PREDICT_TEST"] == "1" and i == 0:  # test splits pair with the valid ones: test, test1, ...
            cmd += ["--test-split", *(re.sub("^valid", "test", v) for v in task.valid_subsets),
                    "--predictions-dir", os.path.join(rd, "predictions")]
        evaluations.append(cmd + ["--device", device, *eval_extra])
        early_exit += ["--early-exit", f"{subset}={name}/early_exit.json"]
    return evaluations, early_exit


def _pretrained(s, checkpoint: str, default_checkpoint: str, model_dir: str, repo: str):
    """``(download argv, why a real run would stop)`` for the pretrained checkpoint: fetched when it is the default
    one and missing (DOWNLOAD=1), else a missing one stops the run (fairseq would train from random weights)."""
    if not checkpoint or os.path.isfile(checkpoint):
        return [], ""
    if checkpoint == default_checkpoint and s["DOWNLOAD"] == "1":
        return [os.path.join(repo, "recipes", "download_roberta.sh"), s["MODEL"], model_dir], ""
    return [], (f"checkpoint not found: {checkpoint} (fairseq would silently train from random weights). Set "
                f"ROBERTA_PATH to an existing model.pt, unset it to download roberta.{s['MODEL']} into MODEL_DIR, or "
                "set RESTORE=none to train from scratch on purpose.")


def _records(path: str, line: str) -> bool:
    """``path`` holds ``line`` as one of its lines."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return line in f.read().splitlines()
    except OSError:
        return False


def _missing_data(data_bin: str, task: TaskSpec) -> List[str]:
    """The files of the binarized folder that fairseq's sentence_prediction task reads and that are missing."""
    need = ["input0/dict.txt", "input0/train.idx", *(f"input0/{s}.idx" for s in task.valid_subsets),
            "label/train.label" if task.regression else "label/dict.txt"]
    return [os.path.join(data_bin, f) for f in need if not os.path.isfile(os.path.join(data_bin, f))]
