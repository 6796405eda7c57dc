# Licensed under the MIT license.
"""Evaluate a fine-tuned (multi-exit) RoBERTa checkpoint: per-exit GLUE metrics and an early-exit sweep.

``acl-evaluate CHECKPOINT DATA_BIN --output DIR`` writes ``DIR/early_exit.json``, ``DIR/early_exit.csv``
and ``DIR/early_exit.png`` and prints a table; the record names the checkpoint, data and prediction files relative
to ``DIR``. Per setting (policy x threshold): the task metric(s), average
exit layer, layer speed-up ``L / avg``, saved fraction ``1 - avg / L``, and wall-clock latency per example
against running all layers, at batch size 1 and batched (median of repeats, measured side by side), and FLOPs per
example with the FLOPs speed-up against the baseline (all layers, the final exit's head only): each example counted
at its own length, the exits' heads it ran included, the embeddings not (lookups: 0 FLOPs), 2 FLOPs per
multiply-add as ``torch.utils.flop_counter`` counts (:mod:`acl_fairseq.inference.flops`). Quality
numbers come from one full pass (every exit's logits, then the policies offline:
``exits.exit_layer_indices``); latency from the layer-by-layer engine (``early_exit.py``, timed by
``latency.py``), whose decisions are checked against the offline ones (``engine_agreement``).
``--test-split`` also writes GLUE leaderboard files (final exit). ``--calibrate max-drop=0.5`` (or
``min-speedup=1.5``) also chooses a threshold on the split and writes ``exit_policy.json`` beside the checkpoint
(:mod:`acl_fairseq.cli.calibrate`).
Works for plain ``roberta`` checkpoints too (one exit), and for an HF-trained multi-exit folder (acl-train-hf's
output over a BERT encoder) with DATA_BIN binarized in its vocabulary (:func:`main`).
"""

import argparse
import json
import logging
import os
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import torch

from acl_fairseq.cli import calibrate, evaluate_checks
from acl_fairseq.inference import early_exit, flops, latency, report
from acl_fairseq.inference import hub as hub_mod
from acl_fairseq.inference.scoring import collect_exit_logits, make_batches, score
from acl_runtime import console, exits, glue_tasks
from acl_torch import glue_metrics

logger = logging.getLogger("acl_fairseq.cli.evaluate")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acl-evaluate", description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="fairseq checkpoint file (e.g. checkpoints/checkpoint_best.pt), or an HF-trained "
                   "multi-exit folder (acl-train-hf's --output_dir)")
    p.add_argument("data_bin", help="binarized sentence_prediction data dir (input0/, label/, ...)")
    p.add_argument("--output", required=True, metavar="DIR", help="where early_exit.json/.csv/.png are written")
    p.add_argument("--split", default="valid", help="split to score (valid; valid1 = MNLI mismatched)")
    p.add_argument(
        "--task",
        "--task-name",
        dest="task_name",
        help="GLUE task (RTE, CoLA, STS-B, ...) for metric choice and file "
        "names; default: DATA_BIN's folder name without '-bin' if it is a GLUE task",
    )
    p.add_argument(
        "--policy",
        nargs="+",
        default=list(exits.POLICIES),
        choices=list(exits.POLICIES),
        help="early-exit policies to sweep (regression runs "
        + ", ".join(n for n, row in exits.POLICIES.items() if row.regression_ok)
        + " only)",
    )
    console.add_sweep_arguments(p)
    p.add_argument(
        "--regression-delta",
        type=float,
        default=exits.DEFAULT_REGRESSION_DELTA,
        help="patience on regression: predictions 'agree' when closer than this (model units)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (evaluation and batched timing)")
    p.add_argument("--max-examples", type=int, help="score only the first N examples of the split (default: all)")
    p.add_argument(
        "--timing-examples",
        type=int,
        default=64,
        help="examples timed per setting (first N of the split); 0 disables timing",
    )
    p.add_argument("--timing-repeats", type=int, default=3, help="timing repeats; the median is reported")
    p.add_argument(
        "--classification-head-name",
        help="head to evaluate; default: the checkpoint's "
        "criterion.classification_head_name (sentence_classification_head)",
    )
    p.add_argument("--tensorboard-logdir", help="also log the results to TensorBoard (tensorboardX) here")
    p.add_argument(
        "--test-split",
        nargs="+",
        help="unlabeled split(s) to predict in GLUE leaderboard "
        "format (MNLI: test test1 -> MNLI-m.tsv MNLI-mm.tsv); needs --predictions-dir",
    )
    p.add_argument("--predictions-dir", help="where the GLUE prediction files (index<TAB>prediction) go")
    p.add_argument("--user-dir", help="extra fairseq plugin dir to import (acl_fairseq itself always is)")
    calibrate.add_arguments(p)
    console.add_device_argument(p)
    return p


# ---- loading -----------------------------------------------------------------------------------


def load_model(checkpoint: str, data_bin: str, user_dir: Optional[str], device: str = "auto"):
    """(model in eval mode on its device, task, cfg): :func:`hub.open_checkpoint`, the one opening of a checkpoint
    and its error policy (a :class:`console.UsageError`), of a binarized sentence_prediction folder."""
    from fairseq import utils

    if not os.path.isdir(os.path.join(data_bin, "input0")):
        raise console.UsageError(f"{data_bin} is not a binarized sentence_prediction folder (no input0/): pass the "
                                 "folder acl-preprocess wrote")
    if user_dir:
        utils.import_user_module(argparse.Namespace(user_dir=user_dir))
    model, cfg, task = hub_mod.open_checkpoint(checkpoint, data_bin, device)
    return model, task, cfg


def sweep(args, num_exits: int, regression: bool) -> List[tuple]:
    """(policy, threshold) settings in sweep order: each policy's flag, else its grid in ``exits.POLICIES``."""
    policies = [p for p in args.policy if exits.POLICIES[p].regression_ok or not regression]
    if regression and len(policies) < len(args.policy):
        logger.warning("regression target: %s need class probabilities, running %s only",
                       "/".join(p for p in args.policy if p not in policies), "/".join(policies) or "nothing")
    return [(p, v) for p in policies for v in console.sweep_values(args, p, num_exits)]


def setting_quality(exit_logits, targets, layers, num_layers, policy, threshold, ctx):
    """Quality and layer accounting of one setting, from every exit's logits (offline policy).

    Returns ``(setting dict, exit index (N,))``."""
    per_exit = list(exit_logits.unbind(1))
    idx = exits.exit_layer_indices(per_exit, policy, threshold, regression=ctx["regression"], delta=ctx["delta"])
    avg = float(torch.tensor(layers, dtype=torch.float)[idx].mean())
    counts = torch.bincount(idx, minlength=len(layers)).tolist()
    return {
        "policy": policy,
        "threshold": threshold,
        "metrics": score(exits.gather_exit_logits(per_exit, idx), targets, ctx),
        "avg_exit_layer": avg,
        "layer_speedup": num_layers / avg,
        "saved_fraction": 1.0 - avg / num_layers,
        "exit_fractions": [c / len(idx) for c in counts],
    }, idx


def model_shape(model, head_name: str) -> flops.Shape:
    """The sizes the FLOPs count needs, read from the model's first layer and its exit heads."""
    layers, heads, _ = early_exit.exit_plan(model, head_name)
    first = model.encoder.sentence_encoder.layers[0]
    return flops.Shape(dim=first.fc1.in_features, ffn_dim=first.fc1.out_features,
                       head_dim=heads[0].dense.out_features, num_classes=heads[0].out_proj.out_features,
                       exit_layers=layers)


def add_flops(setting: Dict, idx: torch.Tensor, lengths: List[int], shape: flops.Shape) -> None:
    """FLOPs per example of a setting (each example at its length and exit) and the speed-up over the baseline."""
    setting["flops_per_example"] = flops.mean_flops(shape, lengths, idx.tolist())
    setting["flops_speedup"] = flops.mean_full_flops(shape, lengths) / setting["flops_per_example"]


# ---- GLUE test predictions ---------------------------------------------------------------------


def format_predictions(logits: torch.Tensor, label_dictionary, regression: bool,
                       scale: Optional[float] = None) -> List[str]:
    """GLUE leaderboard values: label names (through the label dictionary), or regression scores: the target
    (in [0, 1]) clipped and times the task's ``scale`` (STS-B: 5, GLUE's 0-5), the raw value without one."""
    if regression:
        return [f"{min(max(float(v), 0.0), 1.0) * scale:.3f}" if scale else f"{float(v):.3f}" for v in logits[:, 0]]
    return [label_dictionary[int(k) + label_dictionary.nspecial] for k in logits.argmax(-1)]


def prediction_file_names(task_name: Optional[str], splits: List[str]) -> List[str]:
    """GLUE file names for the test splits, the task row's leaderboard names (``RTE.tsv``; MNLI ``MNLI-m.tsv``
    then ``MNLI-mm.tsv``); ``<task>-<split>.tsv`` beyond them and for other tasks."""
    stem = task_name or "predictions"
    names = [f"{stem}.tsv" if i == 0 else f"{stem}-{s}.tsv" for i, s in enumerate(splits)]
    known = glue_tasks.tasks().get(task_name)
    if known:
        names[: len(known.leaderboard)] = known.leaderboard[: len(splits)]
    return names


def write_test_predictions(model, task, args, head_name: str, ctx: Dict) -> List[str]:
    """Predict each ``--test-split`` with the final exit; returns the files written."""
    from acl_runtime.io import atomic

    os.makedirs(args.predictions_dir, exist_ok=True)
    written = []
    for split, name in zip(args.test_split, prediction_file_names(ctx["task_name"], args.test_split)):
        task.load_dataset(split)
        dataset = task.dataset(split)
        batches = make_batches(dataset, list(range(len(dataset))), args.batch_size)
        ids, exit_logits, _ = collect_exit_logits(model, batches, head_name)
        order = ids.argsort()
        known = glue_tasks.tasks().get(ctx["task_name"])
        values = format_predictions(exit_logits[order, -1], task.label_dictionary, ctx["regression"],
                                    known.regression_scale if known else None)
        path = os.path.join(args.predictions_dir, name)
        with atomic.writing(path) as f:
            f.write("index\tprediction\n")
            f.writelines(f"{int(i)}\t{v}\n" for i, v in zip(ids[order], values))
        written.append(path)
    return written


# ---- main --------------------------------------------------------------------------------------


def run_sweep(model, dataset, scored, args, head_name: str, layers: List[int], ctx: Dict) -> List[Dict]:
    """Every (policy, threshold) setting: quality offline, then latency with the layer-by-layer engine."""
    ids, exit_logits, targets = scored
    pos_of_id = {int(i): p for p, i in enumerate(ids)}
    n_time = min(args.timing_examples, len(ids))
    timing_batches = {
        "batch1": make_batches(dataset, list(range(n_time)), 1),
        "batched": make_batches(dataset, list(range(n_time)), args.batch_size),
    }
    num_layers = len(model.encoder.sentence_encoder.layers)
    lengths = [int(dataset.num_tokens(int(i))) for i in ids]
    shape = model_shape(model, head_name)
    settings = []
    for policy, threshold in sweep(args, len(layers), ctx["regression"]):
        setting, idx = setting_quality(exit_logits, targets, layers, num_layers, policy, threshold, ctx)
        add_flops(setting, idx, lengths, shape)
        latency.add_timing(model, setting, idx, timing_batches, head_name, pos_of_id, ctx)
        logger.info(
            "%s %s: %s, %.2fx fewer layers", policy, threshold, json.dumps(setting["metrics"]), setting["layer_speedup"]
        )
        settings.append(setting)
    return settings


def evaluate(args) -> Dict:
    """Run the whole evaluation; returns the result dict that is written to early_exit.json."""
    model, task, cfg = load_model(args.checkpoint, args.data_bin, args.user_dir, args.device)
    head_name, layers = exit_head(model, cfg, args)
    ctx = metric_context(args, task)
    dataset, n, scored = score_split(model, task, args, head_name)
    result = build_record(args, model, dataset, (n, scored), head_name, layers, ctx)
    if any(s["policy"] == "entropy" for s in result["settings"]):
        result["speedup_profile"] = report.speedup_profile(result, "entropy")
        logger.info("entropy curve: %s at layer speed-ups %s, mean over 1x-3x %s",
                    result["primary_metric"], result["speedup_profile"]["at"], result["speedup_profile"]["area"])
    if args.test_split:
        result["predictions"] = [record_path(p, args.output)
                                 for p in write_test_predictions(model, task, args, head_name, ctx)]
    return result


def exit_head(model, cfg, args) -> Tuple[str, List[int]]:
    """(head name, its exit layers): ``--classification-head-name``, else the checkpoint's criterion's, else the
    default head; a head the checkpoint lacks is named, with the ones it has."""
    head_name = args.classification_head_name or getattr(cfg.criterion, "classification_head_name", None)
    head_name = head_name or "sentence_classification_head"
    try:
        return head_name, early_exit.exit_plan(model, head_name)[0]
    except ValueError as e:
        raise console.UsageError(f"{e}. Fix: pass one of those as --classification-head-name") from None


def metric_context(args, task) -> Dict:
    """What scoring needs to know of the task: its name, regression or not, the positive class, the patience."""
    regression = bool(task.cfg.regression_target)
    return {
        "task_name": args.task_name or glue_tasks.task_of_data(args.data_bin),
        "regression": regression,
        "positive": None if regression else glue_metrics.positive_index(task.label_dictionary),
        "delta": args.regression_delta,
        "repeats": args.timing_repeats,
    }


def score_split(model, task, args, head_name: str):
    """(dataset, examples scored, (ids, every exit's logits, targets)) of ``--split``: a split without labels
    is refused."""
    task.load_dataset(args.split)
    dataset = task.dataset(args.split)
    n = len(dataset) if args.max_examples is None else min(args.max_examples, len(dataset))
    scored = collect_exit_logits(model, make_batches(dataset, list(range(n)), args.batch_size), head_name)
    if scored[2] is None:
        raise console.UsageError(f"--split {args.split} has no labels. Fix: score a labeled split, and predict "
                                 "this one with --test-split")
    return dataset, n, scored


def exit_metrics(model, dataset, scored, head_name: str, layers: List[int], ctx: Dict) -> Tuple[List[Dict], float]:
    """(each exit's metrics and FLOPs per example with the speed-up over all layers, all layers' FLOPs)."""
    shape, lengths = model_shape(model, head_name), [int(dataset.num_tokens(int(i))) for i in scored[0]]
    full = flops.mean_full_flops(shape, lengths)
    per_exit = [{"layer": layer, "metrics": score(scored[1][:, m], scored[2], ctx),
                 "flops_per_example": flops.mean_full_flops(shape, lengths, m),
                 "flops_speedup": full / flops.mean_full_flops(shape, lengths, m)} for m, layer in enumerate(layers)]
    return per_exit, full


def build_record(args, model, dataset, counted, head_name: str, layers: List[int], ctx: Dict) -> Dict:
    """early_exit.json's fields: what was scored, each exit, the sweep's settings, the FLOPs and timing set-up;
    ``counted`` is (examples scored, :func:`score_split`'s scores)."""
    n, scored = counted
    per_exit, full = exit_metrics(model, dataset, scored, head_name, layers, ctx)
    return {
        "task": ctx["task_name"],
        "split": args.split,
        "checkpoint": record_path(getattr(args, "source", None) or args.checkpoint, args.output),
        "data": record_path(args.data_bin, args.output),
        "head_name": head_name,
        "regression": ctx["regression"],
        "num_examples": n,
        "num_layers": len(model.encoder.sentence_encoder.layers),
        "exit_layers": layers,
        "primary_metric": next(iter(per_exit[-1]["metrics"])),
        "per_exit": per_exit,
        "settings": run_sweep(model, dataset, scored, args, head_name, layers, ctx),
        "flops": {"convention": flops.CONVENTION, "full_per_example": full},
        "timing": {
            "examples": min(args.timing_examples, n),
            "repeats": args.timing_repeats,
            "batch_size": args.batch_size,
            "device": str(next(model.parameters()).device),
            "unit": "seconds per example",
        },
    }


def record_path(path: str, output: str) -> str:
    """``path`` as early_exit.json records it: relative to the record's own folder (``--output``), so that a
    record names no folder of the machine it ran on and still leads to its files once moved with its run."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(output))


def main(argv: Optional[List[str]] = None) -> Dict:
    """An HF-trained multi-exit folder is read as the checkpoint it would be (:mod:`acl_fairseq.hf.multi_exit_folder`,
    written into a temporary folder, its classes in DATA_BIN's label order), with DATA_BIN binarized in its
    vocabulary (acl-preprocess --tokenizer wordpiece --vocab its vocab.txt)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from acl_fairseq.hf import multi_exit_folder

    if not multi_exit_folder.is_multi_exit(args.checkpoint):
        return run(parser, args)
    if args.calibrate is not None:
        parser.error("--calibrate writes exit_policy.json beside a checkpoint, and an HF-trained folder is none: "
                     "pass the policy to acl-export (--policy, --threshold)")
    with tempfile.TemporaryDirectory(prefix="acl-evaluate-hf-") as tmp:
        args.source = args.checkpoint
        try:
            args.checkpoint = multi_exit_folder.for_data(args.checkpoint, args.data_bin, tmp)
        except (multi_exit_folder.UnsupportedCheckpointError, multi_exit_folder.CheckpointError) as e:
            raise console.UsageError(str(e)) from None
        return run(parser, args)


def run(parser: argparse.ArgumentParser, args) -> Dict:
    evaluate_checks.precheck(parser, args)
    calibrate.precheck(parser, args)
    result = evaluate(args)
    from acl_runtime.io import atomic

    os.makedirs(args.output, exist_ok=True)
    # each output whole or absent (the package's one atomic write), as acl-predict's --output
    atomic.write_json(os.path.join(args.output, "early_exit.json"), result, indent=2)
    atomic.write_through(os.path.join(args.output, "early_exit.csv"), lambda tmp: report.write_csv(result, tmp))
    atomic.write_through(os.path.join(args.output, "early_exit.png"), lambda tmp: report.plot_result(result, tmp))
    if args.tensorboard_logdir:
        report.log_tensorboard(result, args.tensorboard_logdir)
    print(report.format_table(result))
    if args.calibrate is not None:  # after the outputs: an unmet budget still leaves the sweep to look at
        result["calibration"] = calibrate.apply(args, result)
        print(f"acl-evaluate: {calibrate.summary(result['calibration'])}", file=sys.stderr)
    return result


def cli_main() -> None:
    console.setup_logging()
    # a wrong path, a damaged file, data of another dictionary, an unmet --calibrate budget (UsageErrors), a file
    # missing on the way: one line, exit 2
    console.run("acl-evaluate", main, (FileNotFoundError,))


if __name__ == "__main__":
    cli_main()
