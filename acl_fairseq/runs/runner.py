"""The GLUE recipes' runner: it runs a run plan (:mod:`acl_fairseq.runs.plan`) itself, in Python.

    python -S -m acl_fairseq.runs.runner finetune [--repo REPO] TASK METHOD [--dry-run] [--fresh] [flags...]
    python -S -m acl_fairseq.runs.runner sweep [--repo REPO] [--dry-run] [flags...]   (TASKS, METHODS, SEEDS)

recipes/glue/finetune.sh and sweep.sh are these two lines. ``finetune`` builds the plan from the environment's
settings and, unless it is a dry run, :func:`run` s it: fetch roberta.$MODEL when it is missing, fairseq-train with
its output kept in RUN_DIR/train.log (appended to when it resumes), the check that it loaded its checkpoint,
acl-evaluate for multi-exit methods, then result.json; RUN_DIR/command.sh and git_head.txt record what ran.
``sweep`` runs tasks x methods x seeds through :func:`run`, then writes the results table. acl-tune and the
benchmarks call :func:`run` in-process. Standard library only (``python -S``: importing the plugin does not load
fairseq). Exit status: 0, 2 for a usage error, else the failed step's.
"""
import datetime
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from acl_fairseq.runs import plan as run_plan
from acl_fairseq.runs import recipe_tables
from acl_fairseq.runs.model_flags import RecipeError
from acl_runtime.io import atomic

USAGE = """usage: recipes/glue/finetune.sh TASK METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
   or: recipes/glue/<TASK>.sh METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
  TASK:    {tasks}
  METHOD:  {methods}
  Contrastive methods need class labels: STS-B (regression) runs ce / multi_exit_ce only.
  Settings come from the environment (SEED, MODEL, ROBERTA_PATH, RESTORE, ARCH, MODEL_ARGS, DATA_ROOT,
  DATA_BIN, OUT_ROOT, MAX_EPOCH, TOTAL_UPDATES, DEVICE, FP16, ...): see the top of recipes/glue/finetune.sh."""


class Stop(Exception):
    """A step that cannot go on: ``error: MESSAGE`` on stderr and exit ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def note(text: str, out=None) -> None:
    """Progress on stderr (the stdout of a dry run holds only commands), or in ``out``, a run's own log."""
    if out is None:
        print(f"[recipe] {text}", file=sys.stderr, flush=True)
    else:
        _echo(out, f"[recipe] {text}\n".encode())


def _usage(env: Mapping[str, str], status: int) -> int:
    s = run_plan.settings(env)
    tasks, methods = recipe_tables.tasks(s["HPARAMS_TABLE"]), recipe_tables.method_names(s["METHODS_TABLE"])
    print(USAGE.format(tasks=" ".join(tasks), methods=" ".join(methods)), file=sys.stderr)
    return status


def finetune(argv: Sequence[str], env: Mapping[str, str], repo: str = run_plan.REPO) -> int:
    """recipes/glue/finetune.sh: parse, plan, then print the dry run or run the plan."""
    overrides, args = {}, []
    for a in argv:
        if a in ("--dry-run", "--fresh"):
            overrides[a[2:].replace("-", "_")] = "1"
        else:
            args.append(a)
    if args[:1] in (["-h"], ["--help"]) or args[1:2] in (["-h"], ["--help"]):  # CoLA.sh -h; later: fairseq's
        return _usage(env, 0)
    if len(args) < 2:
        return _usage(env, 2)
    try:
        plan = run_plan.build_plan(args[0], args[1], overrides=overrides, extra=args[2:], environ=env, repo=repo)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return _usage(env, e.status) if str(e).startswith("unknown ") else e.status
    if plan.settings["DRY_RUN"] == "1":
        for line in plan.dry_run_notes():
            note(line)
        print("\n".join(plan.commands()), flush=True)
        return 0
    return run(plan, env)


def run(plan: run_plan.Plan, environ: Mapping[str, str] = os.environ, stdout=None) -> int:
    """Run ``plan`` (a real run: its DRY_RUN is ignored); returns the exit status. ``stdout``: a file opened in
    binary mode that gets every step's output (fairseq-train's besides train.log), the progress notes and the
    error; default: this process's stdout, and stderr for the notes."""
    # the result step is `python -S -m acl_fairseq.runs.result`: this checkout's package, wherever the run is
    env = {**environ, **plan.environment(), "PYTHONPATH": os.pathsep.join(
        [plan.repo] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    try:
        if plan.finished:
            note(f"{plan.run_dir}/result.json exists: skipping (FORCE=1 reruns)", stdout)
            return 0
        plan = _ready(plan, env, stdout)
        _start(plan, stdout)
        _train(plan, env, stdout)
        for cmd in plan.evaluations:
            note(run_plan.quote(cmd), stdout)
            _call(cmd, env, stdout)
        _call(plan.result, env, stdout)
        return 0
    except Stop as e:
        if stdout is not None:
            _echo(stdout, f"error: {e}\n".encode())
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.status


def _ready(plan: run_plan.Plan, env: Dict[str, str], out) -> run_plan.Plan:
    """What must hold before training: no stop, the executables, the pretrained checkpoint (fetched when the plan
    says so, then planned again: its dict.txt may change the plan)."""
    for stop in plan.stops:
        raise Stop(stop)
    s = plan.settings
    if shutil.which(s["FAIRSEQ_TRAIN"]) is None:
        raise Stop(f"'{s['FAIRSEQ_TRAIN']}' not found: activate the environment or set FAIRSEQ_TRAIN")
    if plan.method.exits == "multi" and shutil.which(s["ACL_EVALUATE"]) is None:
        raise Stop(f"'{s['ACL_EVALUATE']}' not found: install this package (pip install -e .) or set ACL_EVALUATE")
    if plan.download:
        note(f"roberta.{s['MODEL']} not found at {plan.checkpoint}: downloading it into "
             f"{os.path.dirname(os.path.dirname(plan.default_checkpoint))}", out)
        _call(plan.download, env, out)
        if not os.path.isfile(plan.checkpoint):
            raise Stop(f"download finished but {plan.checkpoint} is still missing")
        plan = run_plan.build_plan(plan.task.name, plan.method.name, overrides=plan.settings, extra=plan.extra,
                                   environ=env, repo=plan.repo)
    if run_plan.dictionaries_differ(plan.checkpoint, plan.data_bin):
        note(f"warning: {plan.data_bin}/input0/dict.txt differs from the checkpoint's dict.txt (fairseq#1048: size "
             "mismatch)", out)
    return plan


def _start(plan: run_plan.Plan, out) -> None:
    """The run folder before training: checkpoint_last.pt kept only to resume, command.sh and git_head.txt, no
    result.json of an earlier run."""
    os.makedirs(plan.run_dir, exist_ok=True)
    os.makedirs(plan.tb_dir, exist_ok=True)
    if plan.resume:
        note(f"resuming from {plan.last}, left by the same command (FRESH=1 starts over)", out)
    elif os.path.isfile(plan.last):
        why = "FRESH=1" if plan.settings["FRESH"] == "1" else "another command, or a finished run"
        note(f"an earlier run left {plan.last}: this run starts again from the start ({why})", out)
        if not plan.checkpoint:  # without --restore-file fairseq would resume from it
            os.remove(plan.last)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    atomic.write_text(os.path.join(plan.run_dir, "command.sh"), "\n".join([
        "#!/usr/bin/env bash", f"# {plan.task.name} / {plan.method.name} / seed {plan.seed}, written by "
        f"recipes/glue/finetune.sh on {stamp}", *record_lines(plan)]) + "\n")
    atomic.write_text(os.path.join(plan.run_dir, "git_head.txt"), "".join(line + "\n" for line in git_head(plan.repo)))
    if os.path.exists(os.path.join(plan.run_dir, "result.json")):
        os.remove(os.path.join(plan.run_dir, "result.json"))
    note(f"{plan.task.name} / {plan.method.name} / seed {plan.seed} -> {plan.run_dir}", out)
    if not plan.checkpoint:
        note("RESTORE=none: training from random initialization", out)
    note(run_plan.quote(plan.train), out)


def record_lines(plan: run_plan.Plan) -> List[str]:
    """command.sh's commands: what a later run of the same command compares to resume (``plan.train_line``)."""
    resumed = ([f"# resumed: fairseq-train ran with --restore-file {run_plan.quote([plan.last])} and no resets"]
               if plan.resume else [])
    return resumed + [f"cd {run_plan.quote([plan.repo])}", plan.train_line,
                      *(run_plan.quote(e) for e in plan.evaluations), run_plan.quote(plan.result)]


def git_head(repo: str) -> List[str]:
    """The checkout's commit, and a line when it has uncommitted changes."""
    head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return ["unknown (not a git checkout)"]
    clean = subprocess.run(["git", "-C", repo, "diff", "--quiet", "HEAD", "--"], capture_output=True)
    return [head.stdout.strip()] + ([] if clean.returncode == 0 else ["uncommitted changes present"])


def _train(plan: run_plan.Plan, env: Dict[str, str], stdout) -> None:
    """fairseq-train, its output to ``stdout`` and to train.log; then the checks that it saved a best checkpoint
    and, when it restored one, that its log says it loaded it."""
    log_path = os.path.join(plan.run_dir, "train.log")
    log_start = _count_lines(log_path) if plan.resume else 0
    out = stdout or sys.stdout
    with open(log_path, "ab" if plan.resume else "wb") as log:
        proc = subprocess.Popen(plan.train, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout:  # tee: the log is complete up to where a killed run stopped
            log.write(line)
            log.flush()
            _echo(out, line)
        status = proc.wait()
    if status != 0:
        raise Stop(f"fairseq-train exited with status {status} (see {log_path})", status)
    if not os.path.isfile(os.path.join(plan.run_dir, "checkpoint_best.pt")):
        raise Stop(f"training ended without {plan.run_dir}/checkpoint_best.pt (see train.log)")
    restored = plan.last if plan.resume else plan.checkpoint
    if restored:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            loaded = any("Loaded checkpoint" in line for i, line in enumerate(f) if i >= log_start)
        if not loaded:
            raise Stop(f"train.log does not say 'Loaded checkpoint {restored}': the run may have started from random "
                       "weights")


def _echo(out, line: bytes) -> None:
    """``line`` to a text stream (through its byte buffer where it has one) or a binary file."""
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(line)
        buffer.flush()
    elif "b" in getattr(out, "mode", ""):
        out.write(line)
        out.flush()
    else:
        out.write(line.decode("utf-8", "replace"))


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _call(cmd: Sequence[str], env: Dict[str, str], stdout) -> None:
    """One step; a non-zero exit stops the run with its status."""
    try:
        status = subprocess.run(list(cmd), env=env, stdout=stdout, stderr=stdout and subprocess.STDOUT).returncode
    except OSError as e:
        raise Stop(f"{cmd[0]}: {e.strerror or e}") from None
    if status != 0:
        raise Stop(f"{os.path.basename(cmd[0])} exited with status {status}", status)


def sweep(argv: Sequence[str], env: Mapping[str, str], repo: str = run_plan.REPO) -> int:
    """recipes/glue/sweep.sh: TASKS x METHODS x SEEDS (environment) through :func:`finetune`, then the table."""
    runs = sweep_runs(argv, env)
    if isinstance(runs, int):
        return runs
    dry = env.get("DRY_RUN", "0") == "1" or "--dry-run" in argv
    failed = []
    for item in runs:
        if isinstance(item, str):
            note(item)
            continue
        task, method, seed = item
        if finetune([task, method, *argv], {**env, "SEED": seed}, repo) != 0:
            if env.get("KEEP_GOING", "0") != "1":
                print(f"error: {task} / {method} / seed {seed} failed (KEEP_GOING=1 carries on)", file=sys.stderr)
                return 1
            failed.append(f"{task}/{method}/seed{seed}")
    out_root = env.get("OUT_ROOT") or os.path.join(repo, "runs", "glue")
    if not dry and env.get("COLLECT", "1") == "1" and os.path.isdir(os.path.join(out_root, "runs")):
        _call([env.get("PYTHON") or "python3", os.path.join(repo, "recipes", "collect_results.py"),
               os.path.join(out_root, "runs"), "--output", os.path.join(out_root, "results.md")], dict(env), None)
    if failed:
        print(f"error: {len(failed)} run(s) failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def sweep_runs(argv: Sequence[str], env: Mapping[str, str]):
    """The sweep's runs in order: ``(task, method, seed)``, or a note for a pair the plan refuses; or the exit
    status of its usage (--help, or TASKS, METHODS or SEEDS that name nothing known)."""
    s = run_plan.settings(env)
    all_tasks, all_methods = recipe_tables.tasks(s["HPARAMS_TABLE"]), recipe_tables.method_names(s["METHODS_TABLE"])

    def usage(status: int, error: Optional[str] = None) -> int:
        if error:
            print(f"error: {error}", file=sys.stderr)
        print(f"usage: [TASKS=...] [METHODS=...] [SEEDS=...] recipes/glue/sweep.sh [--dry-run] [extra fairseq-train "
              f"flags...]\n  tasks:   {' '.join(all_tasks)}\n  methods: {' '.join(all_methods)}", file=sys.stderr)
        return status

    if list(argv[:1]) in (["-h"], ["--help"]):
        return usage(0)

    def words(name: str, default: str) -> List[str]:
        return ((env.get(name) or default).splitlines() or [""])[0].split()

    tasks, methods = words("TASKS", " ".join(all_tasks)), words("METHODS", "ce scl acl_embed acl_grad")
    seeds = words("SEEDS", "1 2 3 4 5")
    if not (tasks and methods and seeds):
        return usage(2)
    unknown = [m for m in methods if recipe_tables.method(m, "*", s["METHODS_TABLE"]) is None]
    bad = next((f"unknown task '{t}'" for t in tasks if t not in all_tasks), None) or next(
        (f"unknown method '{m}'" for m in unknown), None) or next(
        (f"seed '{x}' is not a number" for x in seeds if not x.isascii() or not x.isdigit()), None)
    if bad:
        return usage(2, bad)
    runs = []
    for t in tasks:
        for m in methods:
            row = recipe_tables.method(m, t, s["METHODS_TABLE"])
            if recipe_tables.refusal(all_tasks[t], row):
                runs.append(f"skipping {t} / {m}: {t} is a regression task and {row.criterion} needs class labels")
                continue
            runs += [(t, m, seed) for seed in seeds]
    return runs


def main(argv: Optional[List[str]] = None) -> int:
    # not argparse: the words after the command are the recipe's, fairseq-train flags included
    argv = list(sys.argv[1:] if argv is None else argv)
    command, env, repo = (argv or [""])[0], dict(os.environ), run_plan.REPO
    if argv[1:2] == ["--repo"] and len(argv) > 2:  # the checkout whose recipes/ runs (recipes/glue/common.sh)
        repo, argv = argv[2], argv[:1] + argv[3:]
    if command not in ("finetune", "sweep"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        return finetune(argv[1:], env, repo) if command == "finetune" else sweep(argv[1:], env, repo)
    except (RecipeError, Stop, ValueError, OSError) as e:  # a table that cannot be read
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "status", 1)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
