#!/usr/bin/env python
"""Time one full training step (forward, backward, Adam step) of every criterion, side by side.

Each variant (criterion x ``--acl-grad-scope`` x model kind) is built as ``fairseq-train`` builds it
(task, model, criterion from the parsed command line; fairseq's Adam through ``optim.build_optimizer``)
and one step is what ``Trainer.train_step`` does on one worker: ``task.train_step`` (criterion forward
and ``optimizer.backward``), ``multiply_grads(1 / sample_size)``, ``clip_grad_norm`` (the norm is
computed even when ``--clip-norm`` is 0), ``optimizer.step``, ``zero_grad`` and the criterion's
``reduce_metrics``. The batch is random tokens of ``--batch`` x ``--seq-len`` (no padding), labels
cycling through the classes.

Variants of one model kind share the model and optimizer (timing does not depend on the weights'
values), so the process holds one single-exit and one multi-exit model. After ``--warmup`` rounds, each
of ``--repeats`` rounds runs every variant once in a shuffled order; ``median_step_s`` is the median
over rounds and ``ratio_to_ce`` the median over rounds of the time divided by ``sentence_ce``'s time on
the same model kind in the same round (multi-exit rows against multi-exit ``sentence_ce``);
``median_step_cpu_s`` / ``ratio_to_ce_cpu`` are the same from the process CPU time, which stays
steady on a machine shared with other jobs. ``--threads`` defaults to 1 (idle OpenMP threads of an
oversubscribed machine stall at random and inflate both clocks); ``--threads 0`` keeps torch's default. Then a
few extra steps per variant measure ``peak_mem_mb`` (see ``common.PeakMemory``: on CPU the rise of the
resident high-water mark over one step, on CUDA ``max_memory_allocated``).

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
    p.add_argument("--inner", type=int, default=1, help="steps per timed sample (the mean is the sample)")
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
    out = []
    for v in VARIANTS:
        if args.no_multi_exit and v[2] == "multi":
            continue
        if args.criteria and v[0] != "sentence_ce" and v[0] not in args.criteria:
            continue
        out.append(v)
    return out


def build_variants(args, data_dir) -> List[common.Variant]:
    from fairseq import optim

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
            cfg, task, model, criterion = common.build(argv)
            model = model.to(args.device)
            if args.fp16:  # as fairseq's Trainer builds it for --fp16
                model = model.half()
            params = [p for p in model.parameters() if p.requires_grad]
            if args.fp16:
                opt = optim.FP16Optimizer.build_optimizer(cfg, params)
            else:
                opt = optim.build_optimizer(cfg.optimizer, params)
            shared[kind] = (model, opt)
        else:
            cfg, task, criterion = common.build_criterion(argv)
        model, optimizer = shared[kind]
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

    def sample_time(v):
        wall, cpu = timer(lambda: [v.step() for _ in range(args.inner)])
        return wall / args.inner, cpu / args.inner

    run.memory_method = common.interleaved_rounds(variants, sample_time, args.repeats, args.warmup,
                                                  args.mem_repeats, args.device, args.seed)

    base = {v.kind: v for v in variants if v.name == "sentence_ce"}
    rows = []
    for v in variants:
        ratios = [t / b for t, b in zip(v.times, base[v.kind].times)]
        cpu_ratios = [t / b for t, b in zip(v.cpu_times, base[v.kind].cpu_times)]
        rows.append({
            "criterion": v.name,
            "scope": v.scope,
            "model": args.model if v.kind == "single" else f"{args.model}_multi_exit",
            "arch": ARCH[v.kind],
            "batch": args.batch,
            "seq_len": args.seq_len,
            "median_step_s": common.median(v.times),
            "ratio_to_ce": common.median(ratios),
            "peak_mem_mb": common.median(v.mem) if v.mem else None,
            "median_step_cpu_s": common.median(v.cpu_times),
            "ratio_to_ce_cpu": common.median(cpu_ratios),
            "device": args.device,
            "precision": "fp16" if args.fp16 else "fp32",
            "overflows": v.overflows,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
        })
    return rows


def main(argv=None):
    args = parse_args(argv)
    rows = run(args)
    harness.header("step_time", model=args.model, batch=args.batch, seq_len=args.seq_len, device=args.device,
                   precision="fp16" if args.fp16 else "fp32", repeats=args.repeats, warmup=args.warmup,
                   inner=args.inner)
    print(f"# {common.describe_memory(run.memory_method)}")
    harness.report(rows, COLUMNS, FORMATS, args.json)
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
