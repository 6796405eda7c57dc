"""The run plan (acl_fairseq/cli/plan.py) as shell code for the GLUE recipes, which evaluate it.

    python -S -m acl_fairseq.cli.plan_shell finetune --repo REPO TASK METHOD [--dry-run] [--fresh] [flags...]
    python -S -m acl_fairseq.cli.plan_shell sweep --repo REPO [--help]

``finetune`` prints the code recipes/glue/finetune.sh evaluates: for a dry run or ``--help`` the lines to
print and ``exit 0`` (the notes go to stderr from here); otherwise the plan's variables (commands as arrays,
messages, what to resume) for the script to run. ``sweep`` checks TASKS, METHODS and SEEDS (environment)
and prints ``runs``: "TASK METHOD SEED" words in order, or "#note" for a pair the plan refuses. A refusal
prints ``error: ...`` on stderr and exits with its status (2: usage). Settings come from the environment.
"""
import os
import sys
from typing import Dict, List, Optional, Sequence

from acl_fairseq.cli import plan as P
from acl_fairseq.cli.recipe import RecipeError


def _word(value: str) -> str:
    return P.quote([value])


def _assign(name: str, value) -> str:
    if isinstance(value, (list, tuple)):
        return f"{name}=({P.quote(value)})"
    return f"{name}={_word(str(value))}"


def _usage(env: Dict[str, str], status: int) -> int:
    s = P.settings(env)
    print(f"""usage: recipes/glue/finetune.sh TASK METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
   or: recipes/glue/<TASK>.sh METHOD [--dry-run] [--fresh] [extra fairseq-train flags...]
  TASK:    {' '.join(P.tasks(s['HPARAMS_TABLE']))}
  METHOD:  {' '.join(P.method_names(s['METHODS_TABLE']))}
  Contrastive methods need class labels: STS-B (regression) runs ce / multi_exit_ce only.
  Settings come from the environment (SEED, MODEL, ROBERTA_PATH, RESTORE, ARCH, MODEL_ARGS, DATA_ROOT,
  DATA_BIN, OUT_ROOT, MAX_EPOCH, TOTAL_UPDATES, DEVICE, FP16, ...): see the top of recipes/glue/finetune.sh.""",
          file=sys.stderr)
    if status == 0:
        print("exit 0")
    return status


def _note(text: str) -> None:
    print(f"[recipe] {text}", file=sys.stderr)


def finetune(argv: Sequence[str], repo: str, env: Dict[str, str]) -> int:
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
        plan = P.build_plan(args[0], args[1], overrides=overrides, extra=args[2:], environ=env, repo=repo)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return _usage(env, e.status) if str(e).startswith("unknown ") else e.status
    if plan.settings["DRY_RUN"] == "1":
        for line in plan.dry_run_notes():
            _note(line)
        print(f"printf '%s\\n' {P.quote(plan.commands())}\nexit 0")
        return 0
    print("\n".join(_assign(k, v) for k, v in shell_variables(plan).items()))
    return 0


def shell_variables(plan: P.Plan) -> Dict[str, object]:
    """What finetune.sh needs to run ``plan``: names and values (lists become arrays)."""
    s, rd, last = plan.settings, plan.run_dir, plan.last
    record = ([f"# resumed: fairseq-train ran with --restore-file {P.quote([last])} and no resets"]
              if plan.resume else [])
    record += [f"cd {P.quote([plan.repo])}", plan.train_line, *(P.quote(e) for e in plan.evaluations),
               P.quote(plan.result)]
    start_note, drop_last = "", 0
    if plan.resume:
        start_note = f"resuming from {last}, left by the same command (FRESH=1 starts over)"
    elif os.path.isfile(last):
        why = "FRESH=1" if s["FRESH"] == "1" else "another command, or a finished run"
        start_note = f"an earlier run left {last}: this run starts again from the start ({why})"
        # without --restore-file fairseq would resume from it; with one it is overwritten after epoch 1 anyway
        drop_last = int(not plan.checkpoint)
    dict_warning = ""
    if P.dictionaries_differ(plan.checkpoint, plan.data_bin):
        dict_warning = (f"warning: {plan.data_bin}/input0/dict.txt differs from the checkpoint's dict.txt "
                        "(fairseq#1048: size mismatch)")
    return {
        "TASK": plan.task.name, "METHOD": plan.method.name, "SEED": plan.seed, "RUN_DIR": rd, "TB_DIR": plan.tb_dir,
        "ROBERTA_PATH": plan.checkpoint, "MULTI": int(plan.method.exits == "multi"),
        "FAIRSEQ_TRAIN": s["FAIRSEQ_TRAIN"], "ACL_EVALUATE": s["ACL_EVALUATE"],
        "RESUME": int(plan.resume), "SKIP": int(plan.finished), "stops": plan.stops,
        "download_cmd": plan.download,
        "download_note": (f"roberta.{s['MODEL']} not found at {plan.checkpoint}: downloading it into "
                          f"{os.path.dirname(os.path.dirname(plan.default_checkpoint))}" if plan.download else ""),
        "dict_warning": dict_warning, "start_note": start_note, "drop_last": drop_last,
        "train_cmd": plan.train, "train_shown": P.quote(plan.train),
        "eval_cmds": [P.quote(e) for e in plan.evaluations], "result_cmd": plan.result, "record_lines": record,
        "restored": last if plan.resume else plan.checkpoint,
    }


def sweep(argv: Sequence[str], env: Dict[str, str]) -> int:
    s = P.settings(env)
    all_tasks, all_methods = P.tasks(s["HPARAMS_TABLE"]), P.method_names(s["METHODS_TABLE"])

    def usage(status: int, error: Optional[str] = None) -> int:
        if error:
            print(f"error: {error}", file=sys.stderr)
        print(f"usage: [TASKS=...] [METHODS=...] [SEEDS=...] recipes/glue/sweep.sh [--dry-run] [extra fairseq-train "
              f"flags...]\n  tasks:   {' '.join(all_tasks)}\n  methods: {' '.join(all_methods)}", file=sys.stderr)
        if status == 0:
            print("exit 0")
        return status

    if argv[:1] in (["-h"], ["--help"]):
        return usage(0)

    def words(name: str, default: str) -> List[str]:
        return ((env.get(name) or default).splitlines() or [""])[0].split()

    tasks = words("TASKS", " ".join(all_tasks))
    methods = words("METHODS", "ce scl acl_embed acl_grad")
    seeds = words("SEEDS", "1 2 3 4 5")
    if not (tasks and methods and seeds):
        return usage(2)
    bad = next((t for t in tasks if t not in all_tasks), None)
    if bad:
        return usage(2, f"unknown task '{bad}'")
    bad = next((m for m in methods if P.method(m, "*", s["METHODS_TABLE"]) is None), None)
    if bad:
        return usage(2, f"unknown method '{bad}'")
    bad = next((x for x in seeds if not x.isascii() or not x.isdigit()), None)
    if bad:
        return usage(2, f"seed '{bad}' is not a number")
    runs = []
    for t in tasks:
        for m in methods:
            row = P.method(m, t, s["METHODS_TABLE"])
            if P.refusal(all_tasks[t], row):
                runs.append(f"#skipping {t} / {m}: {t} is a regression task and {row.criterion} needs class labels")
                continue
            runs += [f"{t} {m} {seed}" for seed in seeds]
    print(_assign("runs", runs))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    # not argparse: the words after the command are the recipe's, fairseq-train flags included
    argv = list(sys.argv[1:] if argv is None else argv)
    command, repo = (argv or [""])[0], P.REPO
    if argv[1:2] == ["--repo"] and len(argv) > 2:
        repo, argv = argv[2], argv[:1] + argv[3:]
    if command not in ("finetune", "sweep"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    env = dict(os.environ)
    try:
        return finetune(argv[1:], repo, env) if command == "finetune" else sweep(argv[1:], env)
    except (RecipeError, ValueError, OSError) as e:  # a table that cannot be read
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "status", 1)


if __name__ == "__main__":
    sys.exit(main())
