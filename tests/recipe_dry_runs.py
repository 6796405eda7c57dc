"""Every ``--dry-run`` of the GLUE recipes that the run plan must keep byte for byte: each task x method, the
few-shot (fewshot.tsv) and converted-encoder (converted.tsv) runs as the benchmarks configure them, the
settings' variants, resuming, and the refusals. Exit status, stdout and stderr, machine paths replaced by
placeholders (<TMP>, <REPO>, <PYTHON>, <BIN>), and the separator flag by <SEPARATOR_FLAG> (only
acl_runtime/conventions.py may spell it: tests/runtime/test_input_layout.py).

    python tests/recipe_dry_runs.py > tests/data/recipe_dry_runs.txt   # regenerate the fixture

The environments of the benchmark cases are spelled out here from the tables, not taken from
benchmarks/_glue_runs.py, so that a change there cannot move the reference with it.
"""
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List, NamedTuple, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)

from acl_runtime.conventions import SEPARATOR_FLAG  # noqa: E402
from acl_runtime.tables import read_tsv  # noqa: E402
from recipe_helpers import GLUE, fake_data, recipe_env  # noqa: E402

FIXTURE = os.path.join(HERE, "data", "recipe_dry_runs.txt")
TASKS = ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]
METHODS = ["ce", "scl", "scl_grad", "acl_embed", "acl_grad", "acl_cross_layer", "multi_exit_ce", "multi_exit_scl",
           "multi_exit_kd", "acl_cross_layer_cl_only"]
SINGLE = ["ce", "scl", "acl_embed", "acl_grad"]
MULTI = ["multi_exit_ce", "acl_cross_layer", "multi_exit_kd", "acl_cross_layer_cl_only"]
ENTROPY_SWEEP = "0.05 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.85 0.9 0.93 0.96 0.98 0.99 1.0"
TRAIN_SIZES = {"RTE": 2490, "CoLA": 8551, "SST-2": 67349, "STS-B": 5749}
ENCODER_ARGS = "--encoder-layers 6 --encoder-embed-dim 384 --encoder-ffn-embed-dim 1536 --encoder-attention-heads 12"


class Case(NamedTuple):
    name: str
    script: str
    args: List[str]
    env: Dict[str, Optional[str]]  # None: unset
    setup: Optional[Callable[[Dict[str, str], str], None]] = None  # (environment, tmp) before the run


def _data_root(tmp: str) -> str:
    root = os.path.join(tmp, "data-bin")
    for task in TASKS:
        subsets = ("valid", "valid1") if task == "MNLI" else ("valid",)
        fake_data(os.path.join(root, f"{task}-bin"), task, subsets, regression=task == "STS-B")
    return root


def _encoder(tmp: str, conventions: Optional[dict] = None) -> str:
    """A converted encoder's folder as acl-convert-hf leaves it (the weights are not read by a dry run)."""
    enc = os.path.join(tmp, "enc")
    os.makedirs(enc, exist_ok=True)
    for name, text in [("model.pt", "x"), ("model_args.txt", ENCODER_ARGS + "\n"), ("dict.txt", "a 1\n"),
                       ("conventions.json", json.dumps(conventions or {"family": "bert", "head_dropout": 0.1,
                                                                        "pair_format": "single"}))]:
        with open(os.path.join(enc, name), "w") as f:
            f.write(text)
    return enc


def _benchmark_env(tmp: str, data_bin: str, out_root: str, multi: bool, pooling: str, schedule: dict) -> dict:
    """What benchmarks/_glue_runs.py's driver_env gave the driver when this fixture was captured."""
    enc = os.path.join(tmp, "enc")
    bin_dir = os.path.dirname(sys.executable)
    env = {"DATA_BIN": data_bin, "OUT_ROOT": out_root, "DEVICE": "cpu", "FP16": "0", "DOWNLOAD": "0",
           "FAIRSEQ_TRAIN": os.path.join(bin_dir, "fairseq-train"),
           "ACL_EVALUATE": os.path.join(bin_dir, "acl-evaluate"),
           "EVAL_ARGS": "--timing-examples 0 --thresholds " + ENTROPY_SWEEP,
           "ROBERTA_PATH": os.path.join(enc, "model.pt"), "ARCH": "multi_exit_roberta"}
    if multi:
        env.update(EXIT_POOLING=pooling, MODEL_ARGS=ENCODER_ARGS)
    else:
        env["MODEL_ARGS"] = f"{ENCODER_ARGS} --exit-layers 6 --exit-pooling {pooling}"
    env.update({k: str(v) for k, v in schedule.items()})
    return env


def _fewshot_cases(tmp: str) -> List[Case]:
    cases = []
    for row in read_tsv(os.path.join(GLUE, "fewshot.tsv")):
        n, batch, epochs, every = int(row["n"]), int(row["batch_size"]), int(row["epochs"]), row["validate_every"]
        per_epoch = math.ceil(n / batch)
        for method in SINGLE:
            for seed in ((1, 2) if method == "ce" else (1,)):
                db = os.path.join(tmp, "bench", "data", "fewshot", f"SST-2-N{n}-seed{seed}-bin")
                env = _benchmark_env(tmp, db, os.path.join(tmp, "bench", "fewshot", f"N{n}"), False, "mean", dict(
                    LR=float(row["lr"]), BATCH_SIZE=batch, MAX_EPOCH=epochs, TOTAL_UPDATES=per_epoch * epochs,
                    LOG_INTERVAL=max(1, per_epoch), SEED=seed))
                extra = ["--validate-interval", every, "--save-interval", every, "--no-last-checkpoints",
                         "--no-save-optimizer-state"]
                cases.append(Case(f"fewshot N={n} {method} seed {seed}", "finetune.sh",
                                  ["SST-2", method, *extra, "--dry-run"], env,
                                  lambda e, t, db=db: (_encoder(t), fake_data(db, "SST-2", ("valid", "test")))))
    return cases


def _converted_cases(tmp: str) -> List[Case]:
    cases = []
    for row in read_tsv(os.path.join(GLUE, "converted.tsv")):
        task = row["task"]
        methods = ["ce"] if task == "STS-B" else SINGLE + ["scl_grad"] + (MULTI if task == "SST-2" else [])
        n = int(row["train_subset"]) or TRAIN_SIZES[task]
        updates = math.ceil(n / int(row["batch_size"])) * int(row["epochs"])
        db = os.path.join(tmp, "bench", "data", "quality", f"{task}-bin")
        for method in methods:
            env = _benchmark_env(tmp, db, os.path.join(tmp, "bench", "quality"), method in MULTI, row["pooling"], dict(
                LR=float(row["lr"]), BATCH_SIZE=row["batch_size"], MAX_EPOCH=row["epochs"], TOTAL_UPDATES=updates,
                LOG_INTERVAL=10, SEED=1))
            cases.append(Case(f"converted {task} {method}", "finetune.sh",
                              [task, method, "--no-last-checkpoints", "--dry-run"], env,
                              lambda e, t, db=db, task=task: (_encoder(t), fake_data(db, task,
                                                                                     regression=task == "STS-B"))))
    return cases


def _resume(extra_env=None, result=False):
    """Leave what a killed run of the same command leaves: its command.sh line and checkpoint_last.pt."""
    def setup(env, tmp):
        first = run_case(Case("", "RTE.sh", ["ce", "--dry-run"], {}), env, tmp)[1]
        line = next(ln for ln in first.splitlines() if ln.startswith("fairseq-train "))
        run_dir = os.path.join(env["OUT_ROOT"], "runs", "RTE", "ce", "seed1")
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "command.sh"), "w") as f:
            f.write(f"#!/usr/bin/env bash\n# RTE / ce / seed 1\ncd {REPO}\n{line}\n")
        open(os.path.join(run_dir, "checkpoint_last.pt"), "w").close()
        if result:
            open(os.path.join(run_dir, "result.json"), "w").close()
    return setup


def _methods_table(env, tmp):
    with open(os.path.join(GLUE, "methods.tsv")) as f:
        text = f.read()
    with open(os.path.join(tmp, "methods.tsv"), "w") as f:
        f.write(text + "acl_embed\tRTE\tacl_embed\tsingle\t1\t--acl-weight 0.3 --acl-temperature 0.1\n")
    env["METHODS_TABLE"] = os.path.join(tmp, "methods.tsv")


def _converted_checkpoint(conventions, args="--encoder-layers 6 --encoder-embed-dim 384\n"):
    def setup(env, tmp):
        conv = os.path.join(tmp, "converted")
        os.makedirs(conv)
        for name, text in [("model.pt", "x"), ("model_args.txt", args)] + (
                [("conventions.json", json.dumps(conventions))] if conventions is not None else []):
            with open(os.path.join(conv, name), "w") as f:
                f.write(text)
        env["ROBERTA_PATH"] = os.path.join(conv, "model.pt")
    return setup


def _variant_cases() -> List[Case]:
    ft = "finetune.sh"
    c = [
        Case("cuda", ft, ["RTE", "ce", "--dry-run"], {"DEVICE": "cuda"}),
        Case("cuda without fp16", ft, ["RTE", "ce", "--dry-run"], {"DEVICE": "cuda", "FP16": "0"}),
        Case("cuda, 2 GPUs", ft, ["MNLI", "multi_exit_ce", "--dry-run"], {"DEVICE": "cuda", "NUM_GPUS": "2"}),
        Case("auto without a visible GPU", ft, ["RTE", "ce", "--dry-run"],
             {"DEVICE": "auto", "CUDA_VISIBLE_DEVICES": ""}),
        Case("fp16 on cpu", ft, ["RTE", "ce", "--dry-run"], {"FP16": "1"}),
        Case("total updates: 6 % warm-up", ft, ["CoLA", "ce", "--dry-run"], {"TOTAL_UPDATES": "50"}),
        Case("total updates 1", ft, ["CoLA", "ce", "--dry-run"], {"TOTAL_UPDATES": "1"}),
        Case("total updates 100", ft, ["CoLA", "ce", "--dry-run"], {"TOTAL_UPDATES": "100"}),
        Case("total updates 12345", ft, ["CoLA", "ce", "--dry-run"], {"TOTAL_UPDATES": "12345"}),
        Case("total and warm-up updates", ft, ["CoLA", "ce", "--dry-run"],
             {"TOTAL_UPDATES": "50", "WARMUP_UPDATES": "7"}),
        Case("warm-up updates only", ft, ["CoLA", "ce", "--dry-run"], {"WARMUP_UPDATES": "0"}),
        Case("schedule and sizes", ft, ["SST-2", "scl", "--dry-run"],
             {"LR": "3e-05", "BATCH_SIZE": "8", "MAX_EPOCH": "3", "MAX_POSITIONS": "256", "MAX_TOKENS": "2000",
              "LOG_INTERVAL": "5", "OPTIMIZER": "adam", "SEED": "42"}),
        Case("every setting at once", "CoLA.sh", ["multi_exit_ce", "--dry-run"],
             {"SEED": "7", "MAX_EPOCH": "1", "TOTAL_UPDATES": "50", "MODEL": "large", "RESTORE": "none", "LR": "5e-4",
              "BATCH_SIZE": "8", "DATA_BIN": "<TMP>/mydata", "ARCH": "multi_exit_roberta", "EXIT_LAYERS": "2,3",
              "EXIT_POOLING": "mean", "MODEL_ARGS": "--encoder-layers 3"}),
        Case("large", ft, ["CoLA", "ce", "--dry-run"], {"MODEL": "large"}),
        Case("large multi-exit", ft, ["CoLA", "acl_cross_layer", "--dry-run"], {"MODEL": "large"}),
        Case("restore none", ft, ["RTE", "ce", "--dry-run"], {"RESTORE": "none"}),
        Case("exit layers and pooling", ft, ["SST-2", "multi_exit_kd", "--dry-run"],
             {"EXIT_LAYERS": "4,8,12", "EXIT_POOLING": "mean"}),
        Case("predict test, MNLI", ft, ["MNLI", "multi_exit_ce", "--dry-run"],
             {"PREDICT_TEST": "1", "EVAL_ARGS": "--timing-examples 8  --thresholds 0.1 0.2"}),
        Case("predict test, single exit", ft, ["RTE", "ce", "--dry-run"], {"PREDICT_TEST": "1"}),
        Case("executables", ft, ["RTE", "acl_cross_layer", "--dry-run"],
             {"FAIRSEQ_TRAIN": "/opt/fs train", "ACL_EVALUATE": "my-eval", "PYTHON": "python3.11"}),
        Case("extra flags, last and quoted", ft,
             ["RTE", "ce", "--lr", "3e-05", "--dry-run", "--update-freq", "2", "--tag", "it's a b", ""], {}),
        Case("fresh flag", ft, ["RTE", "ce", "--fresh", "--dry-run"], {}),
        Case("download when missing", ft, ["RTE", "ce", "--dry-run"], {"ROBERTA_PATH": None}),
        Case("download into the default cache", ft, ["RTE", "ce", "--dry-run"],
             {"ROBERTA_PATH": None, "MODEL_DIR": None, "XDG_CACHE_HOME": None}),
        Case("download into XDG_CACHE_HOME", ft, ["RTE", "ce", "--dry-run"],
             {"ROBERTA_PATH": None, "MODEL_DIR": None, "XDG_CACHE_HOME": "<TMP>/xdg"}),
        Case("no download", ft, ["RTE", "ce", "--dry-run"], {"ROBERTA_PATH": None, "DOWNLOAD": "0"}),
        Case("missing explicit checkpoint", ft, ["RTE", "ce", "--dry-run"], {"ROBERTA_PATH": "<TMP>/no/model.pt"}),
        Case("missing data", ft, ["RTE", "ce", "--dry-run"], {"DATA_ROOT": "<TMP>/empty"}),
        Case("missing regression data", ft, ["STS-B", "multi_exit_ce", "--dry-run"], {"DATA_ROOT": "<TMP>/empty"}),
        Case("missing valid1", ft, ["MNLI", "ce", "--dry-run"], {"DATA_BIN": "<TMP>/mnli-valid-only"},
             lambda e, t: fake_data(os.path.join(t, "mnli-valid-only"), "MNLI")),
        Case("per-task method row", "RTE.sh", ["acl_embed", "--dry-run"], {}, _methods_table),
        Case("per-task method row, other task", "CoLA.sh", ["acl_embed", "--dry-run"], {}, _methods_table),
        Case("resume", "RTE.sh", ["ce", "--dry-run"], {}, _resume()),
        Case("resume: --fresh", "RTE.sh", ["ce", "--dry-run", "--fresh"], {}, _resume()),
        Case("resume: FRESH=1", "RTE.sh", ["ce", "--dry-run"], {"FRESH": "1"}, _resume()),
        Case("resume: another command", "RTE.sh", ["ce", "--dry-run", "--lr", "3e-05"], {}, _resume()),
        Case("finished run", "RTE.sh", ["ce", "--dry-run"], {}, _resume(result=True)),
        Case("finished run, FORCE=1", "RTE.sh", ["ce", "--dry-run"], {"FORCE": "1"}, _resume(result=True)),
        Case("converted checkpoint, model_args.txt", "SST-2.sh", ["ce", "--dry-run"], {}, _converted_checkpoint(None)),
        Case("converted checkpoint, multi-exit", "SST-2.sh", ["multi_exit_ce", "--dry-run"], {},
             _converted_checkpoint(None)),
        Case("converted, single separator", "RTE.sh", ["ce", "--dry-run"], {},
             _converted_checkpoint({"pair_format": "single"})),
        Case("converted, double separator", "RTE.sh", ["ce", "--dry-run"], {},
             _converted_checkpoint({"pair_format": "double"})),
        Case("converted, multi-exit, mean pooling", "RTE.sh", ["multi_exit_ce", "--dry-run"],
             {"EXIT_POOLING": "mean"}, _converted_checkpoint({"pair_format": "single"})),
        Case("conventions in MODEL_ARGS", "RTE.sh", ["multi_exit_ce", "--dry-run"],
             {"MODEL_ARGS": "--encoder-layers 6 --conventions <TMP>/converted"},
             _converted_checkpoint({"pair_format": "single"})),
        # refusals
        Case("refused: model_args.txt names --arch", "SST-2.sh", ["ce", "--dry-run"], {},
             _converted_checkpoint(None, "--arch roberta --encoder-layers 6\n")),
        Case("refused: unknown pair format", "RTE.sh", ["ce", "--dry-run"], {},
             _converted_checkpoint({"pair_format": "triple"})),
        Case("refused: single-exit arch for a multi-exit method", ft, ["RTE", "acl_cross_layer", "--dry-run"],
             {"ARCH": "roberta"}),
        Case("refused: no arguments", ft, ["--dry-run"], {}),
        Case("refused: task only", ft, ["RTE"], {}),
        Case("refused: unknown task", ft, ["RTX", "ce", "--dry-run"], {}),
        Case("refused: unknown method", ft, ["RTE", "acl", "--dry-run"], {}),
        Case("refused: a flag as the method", ft, ["RTE", "--lr", "--dry-run"], {}),
        Case("help in the method place", "CoLA.sh", ["--help"], {}),
        Case("help in the task place", ft, ["-h"], {}),
    ]
    for key, value in [("MODEL", "huge"), ("DEVICE", "tpu"), ("FP16", "yes"), ("RESTORE", "yes"), ("SEED", "one"),
                       ("TOTAL_UPDATES", "1e3"), ("WARMUP_UPDATES", "-1"), ("BATCH_SIZE", "16x"), ("MAX_EPOCH", "2.5"),
                       ("NUM_GPUS", "two")]:
        c.append(Case(f"refused: {key}={value}", ft, ["RTE", "ce", "--dry-run"], {key: value}))
    c += [
        Case("sweep", "sweep.sh", ["--dry-run", "--update-freq", "4"],
             {"TASKS": "STS-B RTE", "METHODS": "ce scl", "SEEDS": "1 2"}),
        Case("sweep: multi-exit on MNLI", "sweep.sh", ["--dry-run"],
             {"TASKS": "MNLI", "METHODS": "acl_cross_layer", "SEEDS": "3"}),
        Case("sweep refused: unknown method", "sweep.sh", ["--dry-run"], {"METHODS": "ce nope"}),
        Case("sweep refused: unknown task", "sweep.sh", ["--dry-run"], {"TASKS": "RTE XYZ"}),
        Case("sweep refused: seed", "sweep.sh", ["--dry-run"], {"TASKS": "RTE", "SEEDS": "1 x"}),
    ]
    return c


def cases(tmp: str) -> List[Case]:
    grid = [Case(f"{task} {method}", f"{task}.sh", [method, "--dry-run"], {}) for task in TASKS for method in METHODS]
    return grid + _fewshot_cases(tmp) + _converted_cases(tmp) + _variant_cases()


def normalise(text: str, tmp: str) -> str:
    for path, name in [(sys.executable, "<PYTHON>"), (os.path.dirname(sys.executable), "<BIN>"), (tmp, "<TMP>"),
                       (REPO, "<REPO>"), (SEPARATOR_FLAG, "<SEPARATOR_FLAG>")]:
        text = text.replace(path, name)
    return text


def run_case(case: Case, env: Dict[str, str], tmp: str):
    """(exit status, stdout, stderr) of one case, in ``env`` (the base environment, changed by the case)."""
    env = dict(env)
    for k, v in case.env.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v.replace("<TMP>", tmp)
    if case.setup:
        case.setup(env, tmp)
    proc = subprocess.run([os.path.join(GLUE, case.script), *case.args], capture_output=True, text=True, env=env,
                          cwd=REPO)
    return proc.returncode, proc.stdout, proc.stderr


def base_env(tmp: str) -> Dict[str, str]:
    os.makedirs(tmp, exist_ok=True)
    env = recipe_env(pathlib.Path(tmp))
    env.update(DATA_ROOT=_data_root(tmp), HOME=os.path.join(tmp, "home"))
    env.pop("XDG_CACHE_HOME", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def render(case: Case, tmp: str) -> str:
    """One case's block of the fixture, run in the fresh folder ``tmp`` (normalised to <TMP>)."""
    status, out, err = run_case(case, base_env(tmp), tmp)
    block = f"=== {case.name}: {case.script} {' '.join(case.args)}\nexit {status}\n--- stdout\n{out}--- stderr\n{err}"
    return normalise(block, tmp)


def all_blocks(root: str):
    """(case name, block) of every case, each in its own folder under ``root``."""
    names = [c.name for c in cases(os.path.join(root, "x"))]
    assert len(names) == len(set(names)), "case names must be unique"
    for i, name in enumerate(names):
        tmp = os.path.join(root, f"c{i}")
        yield name, render(cases(tmp)[i], tmp)  # the case's paths are under its own <TMP>


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dry_runs_") as root:
        for _, block in all_blocks(root):
            sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
