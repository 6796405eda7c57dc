#!/usr/bin/env python
"""Wall-clock speed-up of layer-by-layer early exit against running every layer, next to ``L / avg``.

    python benchmarks/early_exit_latency.py --model minilm --seq-len 128 --batch-size 32 --json latency.json

Systems: the early-exit engine and the all-layers baseline, alternated, per policy setting, at batch 1 and
batched, on a random-weight multi-exit model whose exits are given graded confidence (a trained checkpoint's
latency: acl-evaluate's latency columns, the same side-by-side timing).
Measure: the wall and CPU speed-ups and their efficiency (speed-up over the layer speed-up). Targets
(:func:`targets`): the worst efficiency at least 0.9 at batch 1, 0.75 batched. The protocol: docs/benchmarks.md.
"""
from typing import Dict, List

import torch

import common
import harness
from acl_runtime import console, exits

HEAD = "sentence_classification_head"
NUM_CLASSES, SEED = 2, 0  # two classes: the exits' confidence is calibrated on their margin
# the printed table: its columns, and the format of each numeric one
COLUMNS = ["policy", "threshold", "batch", "avg_exit_layer", "layer_speedup", "wallclock_speedup", "efficiency",
           "cpu_speedup", "cpu_efficiency", "full_ms_per_example", "exit_ms_per_example"]
FORMATS = {"threshold": "{:.6g}", "avg_exit_layer": "{:.2f}", "layer_speedup": "{:.2f}x",
           "wallclock_speedup": "{:.2f}x", "efficiency": "{:.2f}", "cpu_speedup": "{:.2f}x", "cpu_efficiency": "{:.2f}",
           "full_ms_per_example": "{:.2f}", "exit_ms_per_example": "{:.2f}"}


def parse_args(argv=None):
    p = harness.parser(__doc__, json="write the rows here", threads=1)
    p.add_argument("--model", choices=sorted(common.MODEL_SIZES), default="minilm",
                   help="size of the random-weight multi-exit model")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per random example")
    p.add_argument("--examples", type=int, default=64, help="examples timed per setting and mode")
    p.add_argument("--batch-size", dest="batch", type=int, default=32,
                   help="batch size of the batched mode")
    p.add_argument("--policy", nargs="+", default=["entropy"], choices=list(exits.POLICIES),
                   help="early-exit policies to time (default: %(default)s)")
    console.add_sweep_arguments(p, {"entropy": "chosen so that the average exit layer spans 1..L"})
    p.add_argument("--points", type=int, default=6, help="automatic entropy thresholds: how many settings")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per setting (median reported)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    return args


# ---- model and examples ------------------------------------------------------------------------


def random_model(args, tmp: str):
    size = common.MODEL_SIZES[args.model]
    data = common.make_dict_dir(tmp, size["vocab"], NUM_CLASSES)
    argv = common.train_argv(data, "sentence_ce", "multi_exit_roberta", args.model, args.seq_len,
                             NUM_CLASSES, args.batch, args.device)
    torch.manual_seed(SEED)
    _, _, model, _ = common.build(argv)
    model = model.to(args.device).eval()
    g = torch.Generator().manual_seed(SEED)
    tokens = common.random_tokens(args.examples, args.seq_len, size["vocab"], g).to(args.device)
    return model, list(tokens.split(1)), list(tokens.split(args.batch))


def exit_logits(model, batches: List[torch.Tensor]) -> torch.Tensor:
    """(N, M, K) logits of every exit."""
    from acl_fairseq.inference import early_exit

    return torch.cat([early_exit.early_exit_forward(model, t, HEAD, policy=None).exit_logits.cpu() for t in batches])


@torch.no_grad()
def exit_features(model, batches: List[torch.Tensor]) -> List[torch.Tensor]:
    """M tensors (N, d): each exit's ``u`` (the input of its ``out_proj``) over the examples."""
    parts = []
    for tokens in batches:
        _, extra = model(tokens, features_only=True, classification_head_name=HEAD)
        parts.append([u.float().cpu() for u in extra["exits"].features])
    return [torch.cat(col) for col in zip(*parts)]


@torch.no_grad()
def calibrate_exits(model, batches: List[torch.Tensor], final_margin: float = 4.0) -> List[float]:
    """Give a random-weight model's exits graded, example-dependent confidence.

    Exit m's ``out_proj`` is set so that its logit margin (class 0 minus class 1) is
    ``alpha_m * z_i``, where ``z_i`` is example i's standardized score on the first principal
    direction of that exit's features ``u^m`` and ``alpha_m`` grows linearly with the exit
    (``final_margin`` at the last exit; other classes get logit 0). So some examples are confident
    early and others late, like a trained model's, and a threshold spreads one batch over several
    exits. Returns the ``alpha_m``.
    """
    from acl_fairseq.inference import early_exit

    _, heads, _ = early_exit.exit_plan(model, HEAD)
    feats = exit_features(model, batches)
    alphas = []
    for m, (head, u) in enumerate(zip(heads, feats)):
        mean = u.mean(0)
        centered = u - mean
        direction = torch.linalg.svd(centered, full_matrices=False).Vh[0] if u.size(0) > 1 else torch.zeros_like(mean)
        scale = float((centered @ direction).std()) if u.size(0) > 1 else 0.0
        if not scale > 0:  # degenerate features: a fixed random direction
            g = torch.Generator().manual_seed(m)
            direction = torch.nn.functional.normalize(torch.randn(u.size(1), generator=g), dim=0)
            scale = max(float((centered @ direction).std()) if u.size(0) > 1 else 1.0, 1e-6)
        alpha = final_margin * (m + 1) / len(heads)
        w = torch.zeros_like(head.out_proj.weight)
        b = torch.zeros_like(head.out_proj.bias)
        half = alpha / 2 / scale
        w[0], w[1] = (direction * half).to(w), (-direction * half).to(w)
        b[0], b[1] = -half * float(mean @ direction), half * float(mean @ direction)
        head.out_proj.weight.copy_(w)
        head.out_proj.bias.copy_(b)
        alphas.append(alpha)
    return alphas


def avg_exit_layer(logits: torch.Tensor, layers: List[int], policy: str, threshold: float) -> float:
    idx = exits.exit_layer_indices(list(logits.unbind(1)), policy, threshold)
    return float(torch.tensor(layers, dtype=torch.float)[idx].mean())


def auto_thresholds(logits: torch.Tensor, layers: List[int], points: int) -> List[float]:
    """Entropy thresholds whose offline average exit layer is closest to ``points`` targets spread
    evenly over ``[layers[0], layers[-1]]`` (duplicates dropped)."""
    first, last = layers[0], layers[-1]
    targets = [first + (last - first) * i / max(points - 1, 1) for i in range(points)]
    out = []
    for target in targets:
        if target <= first:
            t = 1.0 + 1e-6  # every normalized entropy is <= 1: everything leaves at the first exit
        elif target >= last:
            t = 0.0  # nothing fires
        else:
            lo, hi = 0.0, 1.0 + 1e-6  # avg falls as the threshold grows
            for _ in range(50):
                mid = (lo + hi) / 2
                if avg_exit_layer(logits, layers, "entropy", mid) > target:
                    lo = mid
                else:
                    hi = mid
            t = min((lo, hi), key=lambda v: abs(avg_exit_layer(logits, layers, "entropy", v) - target))
        t = round(t, 6)
        if t not in out:
            out.append(t)
    return out


# ---- timing ------------------------------------------------------------------------------------


def time_setting(model, batches: List[torch.Tensor], policy: str, threshold: float, repeats: int,
                 num_layers: int) -> Dict:
    """The package's side-by-side rounds (``acl_fairseq.inference.latency``, as acl-evaluate times), the order of
    the two systems swapped every round: the setting's mean exit layer, the layers it saves, the wall clock and CPU
    time it saves (medians of the per-round ratios) and each time speed-up's share of the layer speed-up (its
    efficiency)."""
    from acl_fairseq.inference import early_exit, latency

    rounds = latency.side_by_side(model, batches, HEAD, policy, threshold, repeats, alternate=True)
    (t_full, c_full), (t_exit, c_exit) = (zip(*rounds[k]) for k in ("full", "exit"))
    outs = [early_exit.early_exit_forward(model, t, HEAD, policy, threshold) for t in batches]
    n = sum(t.size(0) for t in batches)
    avg_exit_layer = float(torch.cat([o.exit_layer for o in outs]).float().mean())
    layer_speedup = num_layers / avg_exit_layer
    wall = common.median([b / e for b, e in zip(t_full, t_exit)])
    cpu = common.median([b / e for b, e in zip(c_full, c_exit)])
    return {"avg_exit_layer": avg_exit_layer, "layer_speedup": layer_speedup, "wallclock_speedup": wall,
            "efficiency": wall / layer_speedup, "cpu_speedup": cpu, "cpu_efficiency": cpu / layer_speedup,
            "full_ms_per_example": 1000 * common.median(t_full) / n,
            "exit_ms_per_example": 1000 * common.median(t_exit) / n}


def settings(args, logits: torch.Tensor, layers: List[int]) -> List[tuple]:
    """(policy, threshold) pairs: the flags', else the table's grids (automatic thresholds for entropy)."""
    out = []
    for policy in args.policy:
        if policy == "entropy" and args.sweep_entropy is None:
            values = auto_thresholds(logits, layers, args.points)
        else:  # a count of M exits or more never fires: nothing to time
            values = [v for v in console.sweep_values(args, policy, len(layers))
                      if not exits.POLICIES[policy].integer or v < len(layers)]
        out += [(policy, v) for v in values]
    return out


def run(args) -> List[Dict]:
    from acl_fairseq.inference import early_exit

    harness.set_threads(args.threads)
    with common.temp_dir("acl_bench_") as tmp:
        model, single, batched = random_model(args, tmp)
    calibrate_exits(model, batched)
    name = f"{args.model}_multi_exit_random"
    layers, _, _ = early_exit.exit_plan(model, HEAD)
    num_layers = layers[-1]
    logits = exit_logits(model, batched)
    rows = []
    for policy, threshold in settings(args, logits, layers):
        for bs, batches in ((1, single), (args.batch, batched)):
            rows.append({"policy": policy, "threshold": threshold, "batch": bs,
                         **time_setting(model, batches, policy, threshold, args.repeats, num_layers),
                         "model": name, "num_layers": num_layers,
                         "seq_len": args.seq_len,
                         "examples": sum(t.size(0) for t in batches), "device": args.device,
                         "threads": torch.get_num_threads()})
    return rows


def targets(rows: List[Dict]) -> List[Dict]:
    """The worst efficiency over the settings: at least 0.9 at batch 1 and 0.75 batched."""
    found = []
    for batched, bound in ((False, 0.9), (True, 0.75)):
        values = [r["efficiency"] for r in rows if (r["batch"] > 1) == batched]
        if values:
            found.append(harness.target(f"early-exit efficiency, {'batched' if batched else 'batch 1'} (worst)",
                                        min(values), bound))
    return found


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    rows = run(args)
    harness.header("early_exit_latency", model=rows[0]["model"] if rows else "-", seq_len=args.seq_len,
                   examples=args.examples,
                   batch=f"1,{args.batch}", device=args.device, repeats=args.repeats)
    print("# efficiency = wallclock_speedup / layer_speedup")
    harness.report(rows, COLUMNS, FORMATS, args.json)
    harness.print_targets(targets(rows))
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
