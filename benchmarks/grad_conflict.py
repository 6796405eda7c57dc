#!/usr/bin/env python3
"""The ACL paper's pilot, reproduced: how often do the gradients of CE and of a contrastive term conflict?

Systems: ``RUNS``, MiniLM fine-tuned on RTE with CE+SCL and with CE+ACL-Embed through fairseq's Trainer. Measure:
before every update (every ``--measure-every``-th), on its batch and weights, the cosine between the CE gradient and
each auxiliary term's (``PAIRS``) in each of ``SCOPES``; each run's cosines recorded under
RESULTS/runs/grad_conflict (harness.study). Targets: the pilot's (75-105 degrees, ~20% of batches above 90), held
beside each pair's angle distribution and share of conflicts in RESULTS/grad_conflict.json/.md/.png. How it
measures: docs/benchmarks.md, "grad_conflict.py".

    python benchmarks/grad_conflict.py [--runs scl acl_embed] [--seeds 1] [--epochs 2] [--threads 1]
        [--work runs/bench] [--results benchmarks/results] [--collect-only] [--toy]
"""
import math
import os
import sys
import tempfile
from typing import Dict, List

import _glue_runs
import _records
import harness

STEPS = "steps.json"  # a run's per-update cosines: the run is finished once it is written
PAIRS = ("ce_vs_scl", "ce_vs_acl", "ce_vs_acl_samples")
SCOPES = ("params", "encoder", "features")
# trained with -> criterion and flags (METHOD.md's defaults, recipes/glue/methods.tsv)
RUNS = {
    "scl": ["--criterion", "sentence_scl", "--scl-weight", "0.9", "--scl-temperature", "0.3",
            "--scl-feature", "encoder"],
    "acl_embed": ["--criterion", "acl_embed", "--acl-weight", "1.0", "--acl-temperature", "0.5",
                  "--acl-anchors", "all"],
}
SCL_TEMPERATURE, ACL_TEMPERATURE = 0.3, 0.5
# the params scope's cosine skips a parameter that only one loss reaches (gradients.gradient_cosine: the classification
# head for SCL on the encoder state), so "all parameters" would overstate what it covers
PARAMS_SCOPE = "the parameters both losses reach"
TOY_MODEL = ["--encoder-layers", "2", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "24",
             "--encoder-attention-heads", "2", "--max-positions", "64"]


def portable_args(argv: List[str], roots: Dict[str, str]) -> List[str]:
    """``argv`` with each absolute path written under the first of ``roots`` (name -> folder) holding it, so that a
    committed record names no folder of the machine it ran on: ``REPO/acl_fairseq``, ``WORK/minilm/model.pt``."""
    out = []
    for a in argv:
        for name, root in roots.items():
            if os.path.isabs(a) and (a == root or a.startswith(root.rstrip(os.sep) + os.sep)):
                a = name + a[len(root.rstrip(os.sep)):]
                break
        out.append(a)
    return out


def train_argv(data: str, save_dir: str, run: str, seed: int, epochs: int, updates: int, enc) -> List[str]:
    """fairseq-train's arguments for one run: the recipe driver's RTE schedule for the converted MiniLM."""
    from acl_runtime import conventions

    if enc is None:  # --toy: a tiny random encoder
        model = [*TOY_MODEL, "--exit-layers", "2", "--exit-pooling", "cls"]
        restore, layout = [], conventions.input_layout()
    else:
        record = conventions.read(os.path.join(enc.dir, conventions.FILE_NAME))
        model = [*enc.model_args, "--exit-layers", str(enc.num_layers), "--exit-pooling", "cls",
                 "--conventions", enc.dir]
        restore, layout = ["--restore-file", os.path.join(enc.dir, "model.pt"), "--reset-optimizer",
                           "--reset-dataloader", "--reset-meters"], conventions.input_layout(record)
    return [data, "--user-dir", os.path.join(_glue_runs.REPO, "acl_fairseq"), "--task", "sentence_prediction_acl",
            *layout.fairseq_flags(), "--num-classes", "2", "--batch-size", "16", "--required-batch-size-multiple", "1",
            "--arch", "multi_exit_roberta", *model, *RUNS[run], *restore,
            "--dropout", "0.1", "--attention-dropout", "0.1", "--weight-decay", "0.1", "--optimizer", "adamw_torch",
            "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-06", "--clip-norm", "0.0", "--lr-scheduler",
            "polynomial_decay", "--lr", "2e-05", "--total-num-update", str(updates), "--max-update", str(updates),
            "--warmup-updates", str(max(1, round(0.06 * updates))), "--max-epoch", str(epochs), "--seed", str(seed),
            "--save-dir", save_dir, "--cpu", "--num-workers", "0", "--no-save"]


def cosines(model, criterion, sample) -> Dict[str, Dict[str, float]]:
    """{pair: {scope: cos}} of one batch at the current weights (dropout active, as in training)."""
    from acl_fairseq.heads import collect_exit_outputs
    from acl_torch import gradients, losses

    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    exits = collect_exit_outputs(model, sample["net_input"], criterion.head_name)
    targets = sample["target"].view(-1)
    c, u, w = exits.pooled[-1], exits.features[-1], exits.label_embeddings[-1]
    terms = {
        "ce": criterion._task_loss(exits.logits[-1], targets),
        "scl": losses.supcon_loss(c, targets, SCL_TEMPERATURE),
        "acl": losses.acl_embed_loss(u, targets, w, ACL_TEMPERATURE, anchors="all"),
        "acl_samples": losses.supcon_loss(u, targets, ACL_TEMPERATURE),
    }
    inputs = [p for _, p in named] + [c, u]
    grads = {k: torch_grad(v, inputs) for k, v in terms.items()}
    encoder = [i for i, (n, _) in enumerate(named) if n.startswith("encoder.")]
    out = {}
    for pair, feature in (("scl", len(named)), ("acl", len(named) + 1), ("acl_samples", len(named) + 1)):
        g_ce, g_aux = grads["ce"], grads[pair]
        out[f"ce_vs_{pair}"] = {
            "params": float(gradients.gradient_cosine(g_ce[: len(named)], g_aux[: len(named)])),
            "encoder": float(gradients.gradient_cosine([g_ce[i] for i in encoder], [g_aux[i] for i in encoder])),
            "features": float(gradients.gradient_cosine([g_ce[feature]], [g_aux[feature]])),
        }
    return out


def torch_grad(loss, inputs):
    import torch

    return torch.autograd.grad(loss, inputs, retain_graph=True, allow_unused=True)


def train_and_measure(argv: List[str], measure_every: int = 1, log_every: int = 20) -> List[dict]:
    """One fairseq training run (Trainer, the criterion's own update), measuring before every ``measure_every``-th
    update (1: every update, the pilot's protocol)."""
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    _, epoch_itr = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    steps, t0 = [], harness.now()
    max_epoch, max_update = cfg.optimization.max_epoch, cfg.optimization.max_update
    while epoch_itr.next_epoch_idx <= max_epoch and trainer.get_num_updates() < max_update:
        itr = epoch_itr.next_epoch_itr(shuffle=True)
        trainer.begin_epoch(epoch_itr.epoch)
        for sample in itr:
            measure = trainer.get_num_updates() % measure_every == 0
            if measure:
                cos = cosines(model, criterion, sample if cfg.common.cpu else utils.move_to_cuda(sample))
            trainer.train_step([sample])
            if not measure:
                continue
            steps.append({"update": trainer.get_num_updates(), "epoch": epoch_itr.epoch, **cos})
            if len(steps) % log_every == 0:
                _glue_runs.log(f"update {len(steps)}: " + ", ".join(f"{p} {cos[p]['params']:+.3f}" for p in PAIRS)
                               + f" ({harness.since(t0)[0]:.0f}s)")
            if trainer.get_num_updates() >= max_update:
                break
        trainer.lr_step(epoch_itr.epoch)
    return steps


def percentile(values: List[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def describe(cos: List[float]) -> Dict[str, float]:
    angles = [math.degrees(math.acos(max(-1.0, min(1.0, c)))) for c in cos if math.isfinite(c)]
    finite = [c for c in cos if math.isfinite(c)]
    return {"batches": len(angles), "frac_conflict": sum(c < 0 for c in finite) / len(finite),
            "angle_p5": percentile(angles, 5), "angle_median": percentile(angles, 50),
            "angle_p95": percentile(angles, 95), "cos_mean": sum(finite) / len(finite)}


def summarize(steps: List[dict]) -> Dict[str, Dict[str, Dict[str, Dict[str, float]]]]:
    """{pair: {scope: {"all" | "early" | "late": statistics}}}; early/late: the first and second half of the
    updates."""
    half = len(steps) // 2
    parts = {"all": steps, "early": steps[:half], "late": steps[half:]}
    return {pair: {scope: {name: describe([s[pair][scope] for s in part]) for name, part in parts.items() if part}
                   for scope in SCOPES} for pair in PAIRS}


def plot(results: Dict[str, dict], steps: Dict[str, List[dict]], path: str) -> None:
    """One panel per run: histograms of the params-scope angle of each pair, with 90 degrees marked."""
    plt = harness.pyplot()
    # one angle axis for every run, so that the panels compare at a glance
    fig, axes = plt.subplots(1, len(steps), figsize=(5.5 * len(steps), 3.8), squeeze=False, sharex=True)
    for ax, (run, run_steps) in zip(axes[0], steps.items()):
        by_pair = {pair: [math.degrees(math.acos(max(-1.0, min(1.0, s[pair]["params"])))) for s in run_steps]
                   for pair in PAIRS}
        every = [a for angles in by_pair.values() for a in angles]
        low, high = 2 * math.floor(min(every + [90.0]) / 2) - 2, 2 * math.ceil(max(every + [90.0]) / 2) + 2
        for pair, angles in by_pair.items():  # 2-degree bins over the range the angles span (90 included)
            stats = results[run][pair]["params"]["all"]
            ax.hist(angles, bins=int(high - low) // 2, range=(low, high), alpha=0.55,
                    label=f"{pair}: median {stats['angle_median']:.1f}°, {100 * stats['frac_conflict']:.0f}% > 90°")
        ax.axvline(90, color="k", lw=0.8, ls="--")
        ax.set_title(f"trained with {run}: angle to g_CE, {PARAMS_SCOPE}", fontsize=10)
        ax.set_xlabel("angle (degrees)")
        ax.set_ylabel("batches")
        ax.legend(fontsize=7)
    fig.tight_layout()
    harness.save_figure(fig, path, dpi=110)


def markdown(results: Dict[str, dict]) -> str:
    rows = ["| trained with | pair | scope | batches | cos < 0 | angle p5 | median | p95 | median early → late |",
            "|---|---|---|---|---|---|---|---|---|"]
    for run, res in results.items():
        for pair in PAIRS:
            for scope in SCOPES:
                s = res[pair][scope]
                a = s["all"]
                trend = f"{s['early']['angle_median']:.1f}° → {s['late']['angle_median']:.1f}°" if "early" in s else "-"
                rows.append(f"| {run} | {pair} | {scope} | {a['batches']} | {100 * a['frac_conflict']:.0f}% | "
                            f"{a['angle_p5']:.1f}° | {a['angle_median']:.1f}° | {a['angle_p95']:.1f}° | {trend} |")
    return "\n".join(rows) + "\n"


def run_dir_name(run: str, seed: int) -> str:
    return f"{run}_seed{seed}"


def measuring(measure_every: int) -> str:
    """How often the log says a run measures (``--measure-every``)."""
    n = measure_every
    return "before every update" if n == 1 else f"before one update in {n} (updates 1, {n + 1}, {2 * n + 1}, ...)"


def prepare(args):
    """(data folder, encoder or None, updates of the schedule) of the real pilot or of --toy."""
    if args.toy:
        data = os.path.join(args.work, "grad_conflict_toy", "data")
        if not os.path.isfile(os.path.join(data, "label", "dict.txt")):  # the demo's generator, run as a script
            _glue_runs.run([sys.executable, os.path.join(_glue_runs.REPO, "scripts", "toy_data.py"), data,
                            "--n-train", "64",
                            "--n-valid", "16"])
        return data, None, args.epochs * 4
    import _converted

    enc = _glue_runs.Encoder(_glue_runs.minilm(args.hf_dir, args.work).dir, pooling="cls")
    return _converted.binarize("RTE", args.work, enc), enc, args.epochs * math.ceil(_converted.TRAIN_SIZES["RTE"] / 16)


def build_parser():
    p = harness.parser(__doc__, threads=1)
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS), help="what each run trains with")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="training seeds (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="epochs over RTE's 2490 examples (default: %(default)s)")
    p.add_argument("--measure-every", type=int, default=1, help="measure before every N-th update (default: "
                   "%(default)s, every update; each measurement costs four extra backward passes)")
    _glue_runs.study_flags(p)
    p.add_argument("--toy", action="store_true", help="a tiny random model on generated data, a few updates")
    return p


def _train(args, prepared, rd: str, run: str, seed: int) -> None:
    """Train and measure one (run, seed) into ``rd``/steps.json, its fairseq-train arguments portable."""
    data, enc, updates = prepared
    _glue_runs.log(f"train: RTE with {run}, seed {seed}, {updates} updates, measuring "
                   f"{measuring(args.measure_every)}")
    with tempfile.TemporaryDirectory(prefix="acl_grad_conflict_") as tmp:
        argv_run = train_argv(data, tmp, run, seed, args.epochs, updates, enc)
        steps = train_and_measure(argv_run, args.measure_every)
    portable = portable_args(argv_run[1:], {"SAVE_DIR": tmp, "WORK": os.path.abspath(args.work),
                                            "REPO": _glue_runs.REPO})
    harness.write_json(os.path.join(rd, STEPS), {"run": run, "seed": seed, "toy": args.toy, "epochs": args.epochs,
                                                 "measure_every": args.measure_every,
                                                 "fairseq_train_args": portable, "steps": steps}, indent=None)


def _run_missing(args, study: harness.Study) -> None:
    """Train and measure every (run, seed) whose folder or record holds no steps.json yet."""
    prepared = prepare(args)

    def run_one(run, seed):
        rd = study.root(run_dir_name(run, seed))
        study.result_or_train(rd, lambda: _train(args, prepared, rd, run, seed),
                              lambda done: _glue_runs.log(f"recorded: {run} seed {seed} ({done})"))

    study.run(harness.grid(args.runs, args.seeds, "cell-major"), run_one)


def _recorded_steps(args, records: str) -> Dict[str, list]:
    """{run folder name: its measured steps} of every (run, seed) recorded under ``records``."""
    found = {run_dir_name(r, s): _records.load(os.path.join(records, "grad_conflict", run_dir_name(r, s)), STEPS)
             for r in args.runs for s in args.seeds}
    return {name: rec["steps"] for name, rec in found.items() if rec}


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.measure_every < 1:
        p.error(f"--measure-every must be a positive whole number, got {args.measure_every}")
    if args.toy and os.path.abspath(args.results) == os.path.abspath(_glue_runs.RESULTS):
        p.error("--toy writes its own tables: pass --results DIR (it would replace the committed ones)")

    harness.set_threads(args.threads)
    records = _records.records_root(args.results)
    if not args.collect_only:
        _run_missing(args, harness.Study("grad_conflict", args.work, records, result=STEPS, log=_glue_runs.log))
    steps = _recorded_steps(args, records)
    if not steps:
        _glue_runs.log("no finished runs")
        return 1
    results = {run: summarize(s) for run, s in steps.items()}
    table = markdown(results)
    harness.write_json(os.path.join(args.results, "grad_conflict.json"),
                       {"task": "RTE" if not args.toy else "toy", "pairs": PAIRS, "scopes": SCOPES, "results": results})
    harness.write_text(os.path.join(args.results, "grad_conflict.md"), "Gradient conflict per mini-batch "
                          "(`python benchmarks/grad_conflict.py`), the paper's pilot: 75°-105°, ~20% above 90° "
                          "(CE vs SCL).\n\n" + table)
    plot(results, steps, os.path.join(args.results, "grad_conflict.png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
