#!/usr/bin/env python3
"""The optimizer step alone: fairseq's ``--optimizer adam`` against ``--optimizer adamw_torch``, each kernel.

Systems: fairseq adam and adamw_torch fused, foreach and for-loop, on the parameters of a model as fairseq-train
builds it, as separate tensors and as the one flat fp32 tensor ``--fp16`` hands the optimizer. Measure: the median
step over interleaved shuffled rounds (random fixed gradients) and its speed-up over fairseq adam. Targets: none,
a figure for docs/optimizer.md.

    python benchmarks/optimizer_time.py [--model minilm] [--repeats 9] [--threads 1] [--json PATH]
"""

import torch

import common
import harness

KW = dict(lr=1e-5, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)


def _systems(shapes: list, numel: int) -> dict:
    """{(layout, optimizer): (optimizer over random parameters and gradients, its step times)}: the model's
    parameter shapes as separate tensors, and as one flat tensor."""
    from fairseq.optim.adam import Adam

    from acl_fairseq.optim.adamw_torch import BiasCorrectedEpsAdamW

    makers = {
        "fairseq adam": lambda ps: Adam(ps, **KW),
        "adamw_torch fused": lambda ps: BiasCorrectedEpsAdamW(ps, **KW, fused=True),
        "adamw_torch foreach": lambda ps: BiasCorrectedEpsAdamW(ps, **KW, foreach=True),
        "adamw_torch for-loop": lambda ps: BiasCorrectedEpsAdamW(ps, **KW, foreach=False),
    }
    gen = torch.Generator().manual_seed(0)
    systems = {}
    for layout, layout_shapes in (("tensors", shapes), ("flat", [(numel,)])):
        for name, make in makers.items():
            if layout == "flat" and name.endswith("for-loop"):
                continue  # one tensor: the same as foreach
            ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in layout_shapes]
            for q in ps:
                q.grad = torch.randn(q.shape, generator=gen)
            systems[(layout, name)] = (make(ps), [])
    return systems


def main(argv=None):
    p = harness.parser(__doc__, json="write the rows here", threads=1)
    p.add_argument("--model", choices=sorted(common.MODEL_SIZES), default="minilm")
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    harness.set_threads(args.threads)
    with common.temp_dir("acl_opt_") as tmp:
        data = common.make_dict_dir(tmp, common.MODEL_SIZES[args.model]["vocab"], 2)
        _, _, model, _ = common.build(common.train_argv(data, "sentence_ce", "roberta", args.model, 128, 2, 16, "cpu"))
    shapes = [tuple(q.shape) for q in model.parameters() if q.requires_grad]
    numel = sum(torch.Size(s).numel() for s in shapes)
    systems = _systems(shapes, numel)
    for r, order in harness.rounds(list(systems), args.repeats + 1, "shuffle", seed=0):
        for key in order:
            opt, times = systems[key]
            seconds, _ = harness.wall(opt.step)
            if r:  # the first round warms up
                times.append(seconds)
    rows = []
    for (layout, name), (_, times) in systems.items():
        base = systems[(layout, "fairseq adam")][1]
        rows.append({"layout": layout, "optimizer": name, "tensors": len(shapes) if layout == "tensors" else 1,
                     "params_m": numel / 1e6, "median_step_ms": 1e3 * common.median(times),
                     "speedup_vs_adam": common.median_ratio(base, times),
                     "threads": torch.get_num_threads(), "repeats": args.repeats})
    harness.header("optimizer_time", model=args.model, tensors=len(shapes), parameters=f"{numel / 1e6:.1f}M")
    harness.report(rows, ["layout", "optimizer", "tensors", "median_step_ms", "speedup_vs_adam"],
                   {"median_step_ms": "{:.1f}", "speedup_vs_adam": "{:.2f}x"}, args.json)
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
