#!/usr/bin/env python3
"""Raw text to predictions, end to end: SST-2 dev sentences through the hub interface (acl_fairseq.inference.hub) of
a multi-exit MiniLM, at batch 1 and 32, with and without early exit; tokenization, batching and the model
timed apart.

    python benchmarks/predict_speed.py [--checkpoint CKPT --data DATA_BIN] [--threshold 0.3]
        [--batch-sizes 1 32] [--repeats 3] [--examples N] [--input LINES] [--json benchmarks/results/predict_speed.json]

Systems: all layers and early exit, alternated each repeat. Measure: sentences/s, each stage's median time, the
preparation's share, the wall speed-up against the layer speed-up. Targets (:func:`targets`), at the largest batch:
early exit turns at least 0.9 of the saved layers into saved time; tokenization plus batching at most 10%. The
protocol: docs/benchmarks.md.
"""
import statistics
from typing import Dict, List

import _serving
import common
import harness
from acl_runtime import console, exits


def measure(hub, sentences, batch_size, policy, threshold, repeats) -> List[Dict]:
    """Rows for all layers (policy None) and early exit, stages timed apart, modes alternated."""
    times = {mode: {"tokenize": [], "batch": [], "model": []} for mode in ("all layers", "early exit")}
    layers = {}
    for _ in range(repeats):
        for mode, pol in (("all layers", None), ("early exit", policy)):
            t_tok, encoded = harness.wall(lambda: [hub.encode_with_info(s)[0] for s in sentences])
            t_batch, batches = harness.wall(lambda encoded=encoded: hub.make_batches(encoded, batch_size))
            t_model, (_, exit_layers) = harness.wall(lambda batches=batches, encoded=encoded, pol=pol:
                                              hub.run_batches(batches, len(encoded), pol,
                                                              None if pol is None else threshold))
            for k, v in (("tokenize", t_tok), ("batch", t_batch), ("model", t_model)):
                times[mode][k].append(v)
            layers[mode] = float(exit_layers.float().mean())
    num_layers = len(hub.model.encoder.sentence_encoder.layers)
    rows = []
    full_model = statistics.median(times["all layers"]["model"])
    for mode, t in times.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        total = sum(med.values())
        row = {"batch_size": batch_size, "mode": mode, "threshold": threshold if mode == "early exit" else None,
               "sentences_per_s": len(sentences) / total, "tokenize_s": med["tokenize"], "batch_s": med["batch"],
               "model_s": med["model"], "prep_share": (med["tokenize"] + med["batch"]) / total,
               "mean_exit_layer": layers[mode], "layer_speedup": num_layers / layers[mode],
               "wall_speedup": full_model / med["model"], "examples": len(sentences), "repeats": repeats}
        row["wall_over_layer_speedup"] = row["wall_speedup"] / row["layer_speedup"]
        rows.append(row)
    return rows


def targets(rows: List[Dict]) -> List[Dict]:
    """At the largest batch: early exit turns at least 0.9 of the saved layers into saved time, and tokenization
    plus batching stay at most 10% of the time."""
    batch = max(r["batch_size"] for r in rows)
    exit_row, = (r for r in rows if r["batch_size"] == batch and r["mode"] == "early exit")
    return [harness.target(f"early-exit efficiency, batch {batch}", exit_row["wall_over_layer_speedup"], 0.9),
            harness.target(f"tokenize + batch share, batch {batch}", max(r["prep_share"] for r in rows
                                                                         if r["batch_size"] == batch), 0.1, False)]


def read_lines(path: str, n: int) -> List[str]:
    """The first ``n`` lines of ``path`` (0: all), one sentence a line."""
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n") for line in f]
    return rows[:n] if n else rows


def main(argv=None) -> List[Dict]:
    p = harness.parser(__doc__, json="write the rows here", threads=1)
    _serving.add_model_flags(p)
    p.add_argument("--policy", default="entropy", choices=list(exits.POLICIES), help="early-exit policy")
    p.add_argument("--threshold", type=float, help="its threshold (entropy/confidence level or patience count; "
                   "default: the policy's, 0.3 for entropy)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--examples", type=int, default=0, help="first N dev sentences (0: all 872)")
    p.add_argument("--input", help="sentences, one per line, instead of SST-2 dev (a model trained on other data)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    console.check_request_flags(p, args, fill_default=True)
    _serving.check_model_flags(p, args)
    harness.set_threads(args.threads)
    ckpt, data = _serving.trained_checkpoint(args)
    from acl_fairseq.inference import hub as hub_mod

    hub = hub_mod.from_checkpoint(ckpt, data)
    sentences = _serving.sst2_dev(args.examples)[0] if not args.input else read_lines(args.input, args.examples)
    rows = []
    for b in args.batch_sizes:
        rows += measure(hub, sentences, b, args.policy, args.threshold, args.repeats)
    harness.header("predict_speed", sentences=f"{len(sentences)} of {args.input or 'SST-2 dev'}", policy=args.policy,
                   threshold=args.threshold, checkpoint=ckpt)
    harness.report(rows, ["batch_size", "mode", "sentences_per_s", "tokenize_s", "batch_s", "model_s", "prep_share",
                          "mean_exit_layer", "layer_speedup", "wall_speedup", "wall_over_layer_speedup"],
                   {"sentences_per_s": "{:.1f}", "tokenize_s": "{:.3f}", "batch_s": "{:.3f}", "model_s": "{:.3f}",
                    "prep_share": "{:.1%}", "mean_exit_layer": "{:.2f}", "layer_speedup": "{:.2f}x",
                    "wall_speedup": "{:.2f}x", "wall_over_layer_speedup": "{:.2f}"}, args.json)
    harness.print_targets(targets(rows))
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
