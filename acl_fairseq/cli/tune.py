"""acl-tune: tune one method on one GLUE task with Optuna, every trial a run of the run plan.

    acl-tune SST-2 scl --data-bin data-bin/SST-2-N20-seed1-bin --trials 24 --threads 1
    acl-tune SST-2 scl --data-bin data-bin/SST-2-N20-seed{seed}-bin --evaluate-best --seeds 1 2 3 4 5

A trial draws the method's hyperparameters from recipes/glue/search_spaces.tsv with a seeded TPE sampler,
builds the run with acl_fairseq/runs/plan.py (``build_plan``) and runs it with the recipes' runner; every
validation fairseq-train logs is reported to Optuna's median pruner, which stops the run when it trails. The
objective is the best validation metric of the run (its ``result.json``), measured on a split that the results
never report (acl_fairseq/tuning/data.py). The study lives in an Optuna storage: an SQLite file by default; any
database URL (postgresql://...) lets workers on many machines share it, each running this same command. A study
resumes where it stopped; a worker that dies mid-trial stops its heartbeat, and the next worker marks that trial
FAIL and enqueues its parameters once more. Workers stop when the study holds --trials finished (complete or
pruned) trials. docs/tuning.md has the details.
"""
import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import Dict, List, Optional

from acl_fairseq.runs.model_flags import RecipeError
from acl_fairseq.runs.plan import REPO, build_plan, settings
from acl_fairseq.runs.recipe_tables import tasks
from acl_fairseq.tuning import data as tune_data
from acl_fairseq.tuning import space as tuning_space
from acl_runtime import console

log = logging.getLogger("acl_fairseq.tune")
FINISHED = ("COMPLETE", "PRUNED")


class TrialFailed(Exception):
    """The run did not finish (its driver failed): the trial is FAIL, the worker goes on."""


class Surplus(Exception):
    """Two workers asked for the last trial at the same time: the later one is not run (FAIL, user attr
    ``surplus``), so the study never finishes more than --trials."""


class ValidationReader:
    """The ``| valid |`` records fairseq-train writes to a run's train.log (``--log-format json``), read as the
    log grows: (num_updates, metric) of each validation not read before."""

    def __init__(self, path: str, metric: str, subset: str = "valid"):
        self.path, self.key, self.marker, self.offset = path, f"{subset}_{metric}", f"| {subset} |", 0
        self.subset = subset

    def new(self) -> List[tuple]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        out = []
        for line in data[:end].decode("utf-8", "replace").splitlines():
            if self.marker in line and "{" in line:
                rec = json.loads(line[line.index("{"):])
                if self.key in rec:
                    step = rec.get(f"{self.subset}_num_updates", rec.get("epoch"))
                    out.append((int(float(step)), float(rec[self.key])))
        return out


def storage_for(url: str, heartbeat: int, grace: Optional[int]):
    """Optuna's RDB storage with its heartbeat: a RUNNING trial whose worker has been silent for ``grace`` seconds
    (default 2 heartbeats) is failed by the next worker, and its parameters are enqueued once more."""
    import optuna
    from sqlalchemy.exc import DBAPIError

    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=heartbeat, grace_period=grace,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1))
        # workers started together race to create the schema (SQLite: locked or an existing table; PostgreSQL: a
        # duplicate type): the loser finds it made on the next try
        except DBAPIError:
            if attempt == 4:
                raise
            time.sleep(1 + attempt)


def _kill(proc: subprocess.Popen) -> None:
    """Stop the driver and everything it started (its own process group: bash, fairseq-train, tee)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


class Objective:
    """One trial: draw, plan, run, report every validation, return the run's best validation metric."""

    def __init__(self, args, space, data_bin: str, metric: str, overrides: Dict[str, str]):
        self.args, self.space, self.data_bin, self.metric, self.overrides = args, space, data_bin, metric, overrides

    def _check_surplus(self, trial) -> None:
        from optuna.trial import TrialState

        before = [t for t in trial.study.get_trials(deepcopy=False)
                  if t.number < trial.number and t.state != TrialState.FAIL]
        if len(before) >= self.args.trials:
            trial.set_user_attr("surplus", True)
            raise Surplus(f"trial {trial.number}: the study already holds {self.args.trials} trials; not run")

    def _repeat(self, trial) -> Optional[float]:
        """A setting drawn again is not run again (a small categorical space, such as ce's four learning rates, is
        drawn many times in 24 trials): a run is a function of its setting and its seed (one thread on a CPU),
        so an earlier finished trial's validations are reported once more, in order, to the pruner of now.
        Pruned on the way: pruned again. Not pruned: the earlier run's value, if it finished; else the
        run is made (the pruner that stopped it then no longer would)."""
        import optuna

        same = [t for t in trial.study.get_trials(deepcopy=False)
                if t.number < trial.number and t.state.name in FINISHED and t.params == trial.params]
        for t in sorted(same, key=lambda t: t.state.name != "COMPLETE")[:1]:  # a run that finished, if any
            for step, value in sorted(t.intermediate_values.items()):
                trial.report(value, step)
                if trial.should_prune():
                    self._mark_repeat(trial, t)
                    log.info("trial %d: trial %d's setting again; pruned at update %d as a repeat", trial.number,
                             t.number, step)
                    raise optuna.TrialPruned(f"repeats trial {t.number}, pruned at update {step}")
            if t.state.name == "COMPLETE":
                self._mark_repeat(trial, t)
                log.info("trial %d: trial %d's setting again; its value %g, not run again", trial.number, t.number,
                         t.value)
                return float(t.value)
            return None
        return None

    @staticmethod
    def _mark_repeat(trial, earlier) -> None:
        trial.set_user_attr("repeat_of", earlier.number)
        trial.set_user_attr("run_dir", earlier.user_attrs.get("run_dir"))

    def __call__(self, trial) -> float:
        self._check_surplus(trial)
        values = {p.name: p.suggest(trial) for p in self.space}
        repeated = self._repeat(trial)
        if repeated is not None:
            return repeated
        root = os.path.join(self.args.study_dir, "trials", f"trial{trial.number:04d}")
        plan = self._plan(trial, values, root)
        os.makedirs(plan.run_dir, exist_ok=True)
        reader = ValidationReader(os.path.join(plan.run_dir, "train.log"), self.metric, plan.task.valid_subsets[0])
        with open(os.path.join(root, "driver.log"), "ab") as out:
            # the runner as a process: the trial reads the log while the run writes it and stops it when pruned
            proc = subprocess.Popen(plan.driver(), env={**tune_data.child_env(self.args.threads), **plan.environment()},
                                    cwd=plan.repo, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        trial.set_user_attr("pgid", proc.pid)
        try:
            self._follow(trial, proc, reader)
            if proc.returncode != 0:
                raise TrialFailed(f"the run exited with status {proc.returncode}: see {root}/driver.log")
            result = tune_data.load_json(os.path.join(plan.run_dir, "result.json"))
            return float(result["best_value"])
        finally:
            _kill(proc)
            if not self.args.keep_checkpoints:
                tune_data.drop_checkpoints(plan.run_dir)

    def _plan(self, trial, values: Dict[str, str], root: str):
        """The trial's run plan, its values over the study's settings; a refused plan fails the trial."""
        overrides, extra = tuning_space.plan_arguments(self.space, values)
        try:
            plan = build_plan(self.args.task, self.args.method, self.args.seed, {
                **self.overrides, **overrides, "DATA_BIN": self.data_bin, "OUT_ROOT": root, "FRESH": "1",
                "FORCE": "1"}, extra=[*self.args.extra, *extra])
        except RecipeError as e:
            raise TrialFailed(f"the plan refused: {e}") from None
        if plan.stops:
            raise TrialFailed("; ".join(plan.stops))
        trial.set_user_attr("run_dir", plan.run_dir)
        trial.set_user_attr("host", os.uname().nodename)
        trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")  # which acl-tune process ran it
        log.info("trial %d: %s -> %s", trial.number, " ".join(f"{k}={v}" for k, v in values.items()), plan.run_dir)
        return plan

    def _follow(self, trial, proc, reader: "ValidationReader") -> None:
        """Report each validation of the running run to Optuna until the run ends; stop it when pruned."""
        import optuna

        while True:
            running = proc.poll() is None
            for step, value in reader.new():
                trial.report(value, step)
                log.info("trial %d: update %d, valid %s %.4g", trial.number, step, self.metric, value)
                if trial.should_prune():
                    _kill(proc)
                    raise optuna.TrialPruned(f"valid {self.metric} {value:g} at update {step} is below the median")
            if not running:
                return
            time.sleep(self.args.poll)


def run_worker(study, objective: Objective, n: int, poll: float, max_failures: int) -> int:
    """Run trials until the study holds ``n`` finished ones; wait while the last ones run elsewhere. Returns
    0, or 1 after ``max_failures`` failed trials of this worker."""
    import optuna
    from optuna.trial import TrialState

    failures, ran = 0, []
    while True:
        optuna.storages.fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        done = sum(t.state.name in FINISHED for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        waiting = sum(t.state == TrialState.WAITING for t in trials)
        if done >= n:
            log.info("study %s: %d of %d trials finished; best %s", study.study_name, done, n, _best(study))
            return 0
        if done + running >= n and not waiting:  # the last trials run elsewhere; one may yet fail
            time.sleep(poll)
            continue
        ran.clear()
        study.optimize(objective, n_trials=1, catch=(TrialFailed, Surplus),
                       callbacks=[lambda s, t: ran.append(t)])
        if ran and ran[0].state == TrialState.FAIL and not ran[0].user_attrs.get("surplus"):
            failures += 1
            if failures >= max_failures:
                log.error("%d failed trials in this worker: stopping (see the trials' driver.log)", failures)
                return 1
        log.info("study %s: %d of %d trials finished", study.study_name,
                 sum(t.state.name in FINISHED for t in study.get_trials(deepcopy=False)), n)


def _best(study) -> str:
    try:
        t = study.best_trial
    except ValueError:
        return "none yet"
    return f"trial {t.number}, {t.value:g} with {t.params}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acl-tune", description=__doc__.split("\n\n")[0],
                                epilog="Flags after -- go to fairseq-train, before the tuned ones. docs/tuning.md")
    p.add_argument("task", help="a GLUE task of recipes/glue/hparams.tsv")
    p.add_argument("method", help="a method of recipes/glue/methods.tsv")
    p.add_argument("--data-bin", help="the task's binarized data (default: the plan's DATA_BIN); '{seed}' in the "
                                      "path is the seed (few-shot data: one folder per seed)")
    p.add_argument("--study-dir", help="trials, carved data, results (default runs/tune/TASK/METHOD)")
    p.add_argument("--storage", help="an Optuna database URL shared by the workers (default: sqlite:///"
                                     "STUDY_DIR/study.db); postgresql://user@host/db for workers on many machines")
    p.add_argument("--study-name", help="default TASK-METHOD-SETTING")
    p.add_argument("--trials", type=int, default=24, help="finished (complete or pruned) trials the study holds "
                                                          "when the workers stop (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="the trials' run seed, the sampler's seed and the carve's "
                                                       "(default %(default)s)")
    p.add_argument("--space-table", default=tuning_space.SPACE_TABLE, help="the search spaces (default %(default)s)")
    p.add_argument("--carve-fraction", type=float, default=0.1,
                   help="full GLUE data: the part of train that becomes the study's validation split (default "
                        "%(default)s); few-shot data uses its protocol's valid split")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a run plan setting for every run (recipes/README.md: MAX_EPOCH=3, ROBERTA_PATH=..., ...)")
    p.add_argument("--pruner-startup", type=int, default=5, help="trials before the median pruner prunes (%(default)s)")
    p.add_argument("--pruner-warmup", type=int, default=0,
                   help="updates of a run before it can be pruned (default %(default)s)")
    p.add_argument("--sampler-startup", type=int, default=10, help="random trials before TPE models (%(default)s)")
    p.add_argument("--heartbeat", type=int, default=60, help="seconds between a worker's heartbeats (%(default)s)")
    p.add_argument("--grace", type=int, help="seconds without a heartbeat before a trial is failed (default 2 beats)")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between reads of a run's log (%(default)s)")
    p.add_argument("--max-failures", type=int, default=3, help="failed trials before this worker stops (%(default)s)")
    p.add_argument("--threads", type=int, help="threads per run (OMP_NUM_THREADS): 1 when runs share a machine")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep every trial's checkpoints")
    p.add_argument("--evaluate-best", action="store_true",
                   help="run no trials: train the best trial's setting and the default on --seeds, score them where "
                        "the results are reported (dev; few-shot: the test half) and write STUDY_DIR/best.{json,md}")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="--evaluate-best's seeds")
    return p


def parse_args(argv=None):
    """(parser, args): acl-tune's flags before ``--``, fairseq-train's after it (``args.extra``)."""
    p = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    if args.trials < 1 or args.max_failures < 1 or (args.threads is not None and args.threads < 1):
        p.error("--trials, --max-failures and --threads must be at least 1")
    try:
        args.overrides = dict(s.split("=", 1) for s in args.set)
    except ValueError:
        p.error("--set takes NAME=VALUE")
    return p, args


def _check_request(p, args):
    """The settings and the task's row; the plan's refusals come first, before any data is read."""
    try:
        s = settings(overrides=args.overrides)
        task = tasks(s["HPARAMS_TABLE"]).get(args.task)
        if task is None:
            raise RecipeError(f"unknown task '{args.task}'", 2)
        build_plan(args.task, args.method, args.seed, args.overrides)
    except RecipeError as e:
        p.error(str(e))
    return s, task


def _open_study(p, args, setting: str, template: str):
    """The Optuna study in --storage, made (or found again) for this task, method, setting and seed."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    url = args.storage or f"sqlite:///{os.path.join(args.study_dir, 'study.db')}"
    name = args.study_name or f"{args.task}-{args.method}-{setting}"
    try:
        storage = storage_for(url, args.heartbeat, args.grace)
    except (SQLAlchemyError, ImportError) as e:
        p.error(f"cannot open the storage {url}: {str(e).splitlines()[0]}")
    study = optuna.create_study(
        study_name=name, storage=storage, direction="maximize", load_if_exists=True,
        sampler=tuning_space.make_sampler(args.seed, args.sampler_startup),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=args.pruner_startup, n_warmup_steps=args.pruner_warmup))
    about = {"task": args.task, "method": args.method, "setting": setting, "seed": args.seed,
             "data_bin": os.path.abspath(template)}
    if study.user_attrs and {k: study.user_attrs.get(k) for k in about} != about:
        p.error(f"study '{name}' in {url} was made for {study.user_attrs}, not {about}: pass another --study-name")
    for k, v in about.items():
        study.set_user_attr(k, v)
    return study, name, url


def _carve(p, args, data_bin: str, task) -> str:
    """Full GLUE data: the study's own validation split carved from train; returns the carved folder."""
    carved = os.path.join(args.study_dir, f"data-seed{args.seed}")
    try:
        rec = tune_data.carve(data_bin, carved, args.seed, args.carve_fraction, task.valid_subsets)
    except ValueError as e:
        p.error(str(e))
    log.info("objective on %d training examples carved from %s (seed %d); training on the other %d",
             rec["valid_examples"], data_bin, args.seed, rec["train_examples"])
    return carved


def main(argv=None) -> int:
    from acl_runtime.console import setup_logging

    p, args = parse_args(argv)
    setup_logging()
    # SIGTERM as Ctrl-C: the running trial's run is stopped and the trial is marked FAIL, not left RUNNING
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s, task = _check_request(p, args)
    template = args.data_bin or s["DATA_BIN"] or os.path.join(s["DATA_ROOT"] or os.path.join(REPO, "data-bin"),
                                                              f"{args.task}-bin")
    data_bin = template.replace("{seed}", str(args.seed))
    if not os.path.isdir(data_bin):
        p.error(f"binarized data not found: {data_bin} (--data-bin)")
    setting = tune_data.setting_of(data_bin)
    try:
        space = tuning_space.search_space(args.method, args.task, setting, args.space_table)
    except (ValueError, OSError) as e:
        p.error(str(e))
    args.study_dir = os.path.abspath(args.study_dir or os.path.join(REPO, "runs", "tune", args.task, args.method))
    os.makedirs(args.study_dir, exist_ok=True)
    study, name, url = _open_study(p, args, setting, template)
    log.info("study %s (%s): %s on %s, %s setting; space %s", name, url.split("@")[-1], args.method, args.task,
             setting, ", ".join(f"{q.name} -> {q.target} ({q.kind} {','.join(q.values)})" for q in space))
    if args.evaluate_best:
        from acl_fairseq.cli.tune_best import evaluate_best

        return evaluate_best(args, study, space, template, setting, task)
    if setting == "full":
        data_bin = _carve(p, args, data_bin, task)
    objective = Objective(args, space, data_bin, task.best_metric, args.overrides)
    return run_worker(study, objective, args.trials, args.poll, args.max_failures)


def cli_main() -> None:
    console.run("acl-tune", main)  # Ctrl-C: 130; the study resumes on the next run


if __name__ == "__main__":
    cli_main()
