#!/usr/bin/env python3
"""Token lengths of the GLUE dev sets as the quality benchmark's encoder reads them, for FLOPs from run records.

    python benchmarks/dev_lengths.py [--tasks SST-2 CoLA] [--glue-dir ../shared/glue] [--encoder runs/bench/minilm]
        [--json benchmarks/results/dev_lengths.json] [--force]

Writes per task the length histogram (word pieces + 2), and the encoder's shape from its model_args.txt. The FLOPs
of a setting are then estimated as if an example's exit did not depend on its length; why and how:
docs/benchmarks.md.
"""
import collections
import json
import os
import sys
from typing import Dict

import _glue_runs
import _quality_tables
import harness
from acl_runtime import tokenization

TASKS = ("SST-2", "CoLA")  # single-sentence tasks: their text columns and headers are the task table's


def histogram(glue_dir: str, task: str, tokenize) -> Dict[int, int]:
    texts, _ = _glue_runs.dev_rows(task, glue_dir)
    return dict(sorted(collections.Counter(len(tokenize(text)) + 2 for text in texts).items()))


def encoder_shape(encoder: str) -> dict:
    with open(os.path.join(encoder, "model_args.txt")) as f:
        words = f.read().split()
    arg = dict(zip(words[::2], words[1::2]))
    dim = int(arg["--encoder-embed-dim"])
    return {"dim": dim, "ffn_dim": int(arg["--encoder-ffn-embed-dim"]), "head_dim": dim}


def main(argv=None) -> int:
    p = harness.parser(__doc__, json=f"write the lengths here (default: {_quality_tables.LENGTHS_RECORD})")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--glue-dir", default=_glue_runs.GLUE_DIR)
    p.add_argument("--encoder", default=os.path.join(_glue_runs.REPO, "runs", "bench", "minilm"),
                   help="the converted encoder of benchmarks/quality.py (its conventions.json tokenizer record and "
                        "model_args.txt)")
    args = p.parse_args(argv)
    args.json = args.json or _quality_tables.LENGTHS_RECORD
    p.refuse_existing(args)
    with open(os.path.join(args.encoder, "conventions.json"), encoding="utf-8") as f:
        record = json.load(f)["tokenizer"]  # the record acl-convert-hf wrote, the data's tokenizer
    tokenize = tokenization.build(record, args.encoder)
    out = {t: {"source": f"{t}/dev.tsv, word pieces of the encoder + 2", "shape": encoder_shape(args.encoder),
               "histogram": histogram(args.glue_dir, t, tokenize)} for t in args.tasks}
    harness.write_json(args.json, out)
    print(f"wrote {args.json}: " + ", ".join(f"{t} {sum(v['histogram'].values())} examples" for t, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
