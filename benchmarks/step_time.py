#!/usr/bin/env python
"""Time one training step (forward, backward, Adam step) of every criterion against CE's, side by side.

Systems: ``VARIANTS``, each criterion x ``--acl-grad-scope`` x model kind (single exit, multi-exit), built as
fairseq-train builds them; one step is ``Trainer.train_step``'s work on one worker. Measure: the median step time
(wall and process CPU) over interleaved rounds in a shuffled order, its ratio to ``sentence_ce`` on the same model
kind in the same round, and a step's peak memory (``common.PeakMemory``). Targets: the cost over CE, ``TARGETS``.
How it measures: docs/benchmarks.md, "step_time.py".

    python benchmarks/step_time.py --model minilm --batch-size 16 --seq-len 128 --json step_time.json
"""
from typing import Dict, List

import torch

import common
import harness

# (criterion, scope, kind, extra flags); scope None = ungated, "off" = --no-acl-grad
VARIANTS = [
    ("sentence_ce", None, "single", []),
    ("sentence_scl", None, "single", []),
    ("acl_embed", None, "single", []),
    ("acl_grad", "features", "single", ["--acl-grad-scope", "features"]),
    ("acl_grad", "params", "single", ["--acl-grad-scope", "params"]),
    ("sentence_ce", None, "multi", []),
    ("acl_cross_layer", "off", "multi", ["--no-acl-grad"]),
    ("acl_cross_layer", "features", "multi", ["--acl-grad-scope", "features"]),
    ("acl_cross_layer", "params", "multi", ["--acl-grad-scope", "params"]),
]
ARCH = {"single": "roberta", "multi": "multi_exit_roberta"}
# the printed table: its columns, and the format of each numeric one
COLUMNS = ["model", "criterion", "scope", "median_step_s", "ratio_to_ce", "median_step_cpu_s", "ratio_to_ce_cpu",
           "peak_mem_mb", "overflows"]
# (criterion, scope) -> the most its step may cost over CE's on the same model (docs/benchmarks.md)
TARGETS = {("acl_embed", None): 1.05, ("acl_grad", "features"): 1.05, ("acl_grad", "params"): 1.8,
           ("acl_cross_layer", "features"): 1.10, ("acl_cross_layer", "params"): 1.10}
FORMATS = {"median_step_s": "{:.4f}", "ratio_to_ce": "{:.3f}x", "median_step_cpu_s": "{:.4f}",
           "ratio_to_ce_cpu": "{:.3f}x", "peak_mem_mb": "{:.1f}"}


def parse_args(argv=None):
    p = harness.parser(__doc__, json="write the rows here", threads=1)
    p.add_argument("--model", choices=sorted(common.MODEL_SIZES), default="minilm")
    p.add_argument("--batch-size", dest="batch", type=int, default=16,
                   help="sentences per step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--num-classes", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (each runs every variant once)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--mem-repeats", type=int, default=2, help="steps per variant measuring peak memory (0: skip)")
    p.add_argument("--criteria", nargs="+", help="only these criteria (sentence_ce is always kept as the base)")
    p.add_argument("--no-multi-exit", action="store_true", help="skip the multi-exit rows")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--fp16", action="store_true",
                   help="train as fairseq-train --fp16 does: fp16 weights, fairseq's FP16Optimizer with its "
                   "dynamic loss scale (an overflowed step is skipped and counted in 'overflows'); on CPU "
                   "with --fp16-no-flatten-grads, since flat fp16 gradients need CUDA")
    p.add_argument("--seed", type=int, default=0, help="order shuffling and data")
    args = p.parse_args(argv)
    return args


def selected_variants(args) -> List[tuple]:
    """VARIANTS without the multi-exit rows (``--no-multi-exit``) and the criteria not asked for (CE always)."""
    return [v for v in VARIANTS if not (args.no_multi_exit and v[2] == "multi")
            and (not args.criteria or v[0] == "sentence_ce" or v[0] in args.criteria)]


def build_variants(args, data_dir) -> List[common.Variant]:
    """Every variant, those of one model kind sharing its model and optimizer (fairseq's FP16Optimizer with --fp16)."""
    size = common.MODEL_SIZES[args.model]
    sample = common.random_sample(args.batch, args.seq_len, size["vocab"], args.num_classes, args.device, args.seed)
    shared: Dict[str, tuple] = {}
    variants = []
    precision = []
    if args.fp16:
        precision = ["--fp16"] + (["--fp16-no-flatten-grads"] if args.device == "cpu" else [])
    for name, scope, kind, extra in selected_variants(args):
        argv = common.train_argv(data_dir, name, ARCH[kind], args.model, args.seq_len, args.num_classes,
                                 args.batch, args.device, extra + precision)
        if kind not in shared:
            torch.manual_seed(args.seed)
            model, optimizer, criterion, task = shared[kind] = common.build_trainable(argv, args.device, args.fp16)
        else:
            (model, optimizer, _, _), (_, task, criterion) = shared[kind], common.build_criterion(argv)
        variants.append(common.Variant(name, scope, kind, task, model, criterion.to(args.device), optimizer, sample))
    return variants


def run(args) -> List[Dict]:
    harness.set_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here")
    with common.temp_dir("acl_bench_") as tmp:
        data_dir = common.make_dict_dir(tmp, common.MODEL_SIZES[args.model]["vocab"], args.num_classes)
        variants = build_variants(args, data_dir)
    timer = common.step_clock(args.device)
    run.memory_method = common.interleaved_rounds(variants, lambda v: timer(v.step), args.repeats, args.warmup,
                                                  args.mem_repeats, args.device, args.seed)
    base = {v.kind: v for v in variants if v.name == "sentence_ce"}
    return [{"criterion": v.name, "scope": v.scope,
             "model": args.model if v.kind == "single" else f"{args.model}_multi_exit", "arch": ARCH[v.kind],
             "batch": args.batch, "seq_len": args.seq_len, "median_step_s": common.median(v.times),
             "ratio_to_ce": common.median_ratio(v.times, base[v.kind].times),
             "peak_mem_mb": common.median(v.mem) if v.mem else None,
             "median_step_cpu_s": common.median(v.cpu_times),
             "ratio_to_ce_cpu": common.median_ratio(v.cpu_times, base[v.kind].cpu_times),
             "device": args.device, "precision": "fp16" if args.fp16 else "fp32", "overflows": v.overflows,
             "repeats": args.repeats, "threads": torch.get_num_threads()} for v in variants]


def targets(rows: List[Dict]) -> List[Dict]:
    """Each row of ``TARGETS`` held against its bound (wall-clock ratio; the CPU-time one beside it)."""
    return [harness.target(f"{r['criterion']}{'/' + r['scope'] if r['scope'] else ''} over CE", r["ratio_to_ce"],
                           TARGETS[r["criterion"], r["scope"]], at_least=False, config=r["model"],
                           cpu_value=r["ratio_to_ce_cpu"]) for r in rows if (r["criterion"], r["scope"]) in TARGETS]


def main(argv=None):
    args = parse_args(argv)
    rows = run(args)
    harness.header("step_time", model=args.model, batch=args.batch, seq_len=args.seq_len, device=args.device,
                   precision="fp16" if args.fp16 else "fp32", repeats=args.repeats, warmup=args.warmup)
    print(f"# {common.describe_memory(run.memory_method)}")
    harness.report(rows, COLUMNS, FORMATS, args.json)
    harness.print_targets(targets(rows))
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
