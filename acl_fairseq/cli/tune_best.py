"""acl-tune --evaluate-best: the best trial's setting and the method's default, trained on the same seeds and
scored where the results are reported, side by side (STUDY_DIR/best.json, best.md).

Full GLUE data: the runs train on the whole train split and are scored on dev (the run's ``result.json``, as the
recipes report). Few-shot data: each seed's own folder (``{seed}`` in --data-bin), the checkpoint kept by valid
accuracy, scored on the protocol's test half with acl-evaluate. Finished runs are not trained again, so an
interrupted evaluation resumes.
"""
import json
import logging
import math
import os
import statistics
import subprocess
from typing import Dict, List, Optional

from acl_fairseq.runs import runner
from acl_fairseq.runs.plan import build_plan
from acl_fairseq.tuning import data as tune_data
from acl_fairseq.tuning import space as tuning_space
from acl_runtime.io import atomic

log = logging.getLogger("acl_fairseq.tune")
TEST_RESULT = "test_result.json"


def t_interval(diffs: List[float]) -> Optional[List[float]]:
    """The 95 % interval of the mean paired difference, Student's t with n - 1 degrees of freedom (None: n < 2)."""
    if len(diffs) < 2:
        return None
    from scipy import stats

    half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    mean = statistics.mean(diffs)
    return [mean - half, mean + half]


def _run(cmd: List[str], env: Dict[str, str], cwd: str, log_path: str, what: str) -> None:
    with open(log_path, "ab") as out:
        rc = subprocess.run(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"acl-tune: {what} exited with status {rc}; see {log_path}")


def score(plan, setting: str, metric: str, env: Dict[str, str], keep: bool) -> float:
    """Train the plan unless its run finished, then its score where the results are reported."""
    rd = plan.run_dir
    os.makedirs(rd, exist_ok=True)
    driver_log = os.path.join(rd, "driver.log")
    if plan.stops:
        raise SystemExit("acl-tune: " + "; ".join(plan.stops))
    if not plan.finished:
        log.info("training %s", rd)
        with open(driver_log, "ab") as out:  # the runner in-process, its output in driver.log
            if runner.run(plan, env, stdout=out) != 0:
                raise SystemExit(f"acl-tune: the run failed; see {driver_log}")
    if setting == "full":
        return float(tune_data.load_json(os.path.join(rd, "result.json"))["best_value"])
    path = os.path.join(rd, TEST_RESULT)
    if not os.path.isfile(path):
        ckpt = os.path.join(rd, "checkpoint_best.pt")
        if not os.path.isfile(ckpt):
            raise SystemExit(f"acl-tune: {rd} finished without checkpoint_best.pt and has no {TEST_RESULT}: move the "
                             "run folder away so that it is trained again")
        out = os.path.join(rd, "eval_test")
        _run([plan.settings["ACL_EVALUATE"], ckpt, plan.data_bin, "--output", out, "--split", "test", "--task-name",
              plan.task.name, "--timing-examples", "0", "--device", plan.device], env, plan.repo, driver_log,
             "acl-evaluate --split test")
        metrics = tune_data.load_json(os.path.join(out, "early_exit.json"))["per_exit"][-1]["metrics"]
        atomic.write_text(path, json.dumps({"split": "test", "metric": metric, "value": float(metrics[metric]),
                                                 "metrics": metrics}, indent=1))
    if not keep:
        tune_data.drop_checkpoints(rd)
    return float(tune_data.load_json(path)["value"])


def markdown(summary: dict) -> str:
    seeds = summary["seeds"]
    head = f"| setting | {' | '.join(f'seed {s}' for s in seeds)} | mean ± std |"
    lines = [head, "|---|" + "---|" * (len(seeds) + 1)]
    for name in ("default", "tuned"):
        row = summary[name]
        lines.append(f"| {name} | " + " | ".join(f"{row['values'][str(s)]:.2f}" for s in seeds)
                     + f" | {row['mean']:.2f}" + (f" ± {row['std']:.2f}" if row["std"] is not None else "") + " |")
    d = summary["tuned_minus_default"]
    ci = d["ci95"]
    lines.append("| tuned − default | " + " | ".join(f"{v:+.2f}" for v in d["values"]) + f" | {d['mean']:+.2f}"
                 + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "") + f", ahead in {d['ahead']}/{len(seeds)} |")
    lines += ["", f"{summary['task']} / {summary['method']}: {summary['metric']} on {summary['scored_on']}, "
              f"n = {len(seeds)} seeds, paired by seed; the interval is the 95 % t interval (n − 1 df) of the mean "
              "difference. " + ("Ahead" if ci and ci[0] > 0 else "Behind" if ci and ci[1] < 0 else "Within noise")
              + f" (n = {len(seeds)}).",
              f"Tuned: trial {summary['best_trial']} of {summary['trials_finished']} finished "
              f"(valid {summary['best_valid']:.2f} on the study's validation split): "
              + ", ".join(f"{k} = {v}" for k, v in summary["best_params"].items())
              + ". Default: recipes/glue/methods.tsv and the plan's settings."]
    return "\n".join(lines) + "\n"


def _score_both(args, template: str, setting: str, task, overrides: dict, extra: list) -> Dict[str, Dict[str, float]]:
    """{"default"|"tuned": {seed: score}}: the method's default setting and the best trial's, trained on --seeds."""
    env = tune_data.child_env(args.threads)
    values: Dict[str, Dict[str, float]] = {}
    for name, (ov, ex) in (("default", ({}, [])), ("tuned", (overrides, extra))):
        values[name] = {}
        for seed in args.seeds:
            plan = build_plan(args.task, args.method, seed, {
                **args.overrides, **ov, "DATA_BIN": template.replace("{seed}", str(seed)),
                "OUT_ROOT": os.path.join(args.study_dir, "best", name)}, extra=[*args.extra, *ex])
            values[name][str(seed)] = score(plan, setting, task.best_metric, env, args.keep_checkpoints)
            log.info("%s seed %d: %s %.2f", name, seed, task.best_metric, values[name][str(seed)])
    return values


def evaluate_best(args, study, space, template: str, setting: str, task) -> int:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    if not any(t.state == TrialState.COMPLETE for t in trials):
        log.error("study %s has no complete trial yet: run acl-tune without --evaluate-best first", study.study_name)
        return 1
    if finished < args.trials:
        log.warning("study %s holds %d of --trials %d finished trials: evaluating the best so far",
                    study.study_name, finished, args.trials)
    best = study.best_trial
    overrides, extra = tuning_space.plan_arguments(space, best.params)
    values = _score_both(args, template, setting, task, overrides, extra)
    diffs = [values["tuned"][str(s)] - values["default"][str(s)] for s in args.seeds]
    summary = {
        "task": args.task, "method": args.method, "setting": setting, "metric": task.best_metric,
        "scored_on": "dev (the data's valid split, as the recipes report)" if setting == "full" else
        "the few-shot protocol's test half (acl-evaluate --split test)",
        "seeds": args.seeds, "study": study.study_name, "best_trial": best.number, "best_valid": best.value,
        "best_params": best.params, "trials_finished": finished,
        "tuned_plan": {"overrides": overrides, "extra": extra},
        **{name: {"values": v, "mean": statistics.mean(v.values()),
                  "std": statistics.stdev(v.values()) if len(v) > 1 else None} for name, v in values.items()},
        "tuned_minus_default": {"values": diffs, "mean": statistics.mean(diffs), "ci95": t_interval(diffs),
                                "ahead": sum(d > 0 for d in diffs)},
    }
    atomic.write_json(os.path.join(args.study_dir, "best.json"), summary)
    md = markdown(summary)
    atomic.write_text(os.path.join(args.study_dir, "best.md"), md)
    print(md, end="")
    return 0
