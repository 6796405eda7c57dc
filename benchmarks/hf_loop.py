#!/usr/bin/env python3
"""A plain Hugging Face transformers fine-tuning loop for GLUE: the reference the plugin is compared with.

Systems: BERT from an HF folder (default: the packaged MiniLM) with RobertaClassificationHead's layout, AdamW and
fairseq's polynomial_decay at the defaults the recipes' run plan gives fairseq-train, each known difference a flag.
Measure: the dev metrics after every epoch, the best epoch, training samples/s, into ``--out``. Targets: none here;
hf_parity.py holds it against the plugin's runs, hf_speed.py times its :func:`train_step`. The defaults and why:
docs/benchmarks.md, "hf_loop.py".

    python benchmarks/hf_loop.py --task RTE --seed 1 --lr 3e-5 --epochs 3 --out result.json
"""
import argparse
import dataclasses
import os
import sys
from dataclasses import MISSING

import _glue_runs
import harness
from _hf_loop import HFConfig, train_hf


def build_parser() -> argparse.ArgumentParser:
    p = harness.parser(__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(HFConfig):
        kw = dict(f.metadata, **({"required": True} if f.default is MISSING else {"default": f.default}))
        if isinstance(f.default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw.setdefault("type", type(f.default) if f.default is not MISSING else str)
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kw)
    p.add_argument("--glue-dir", default=_glue_runs.GLUE_DIR,
                   help="folder of the GLUE task folders (TASK/train.tsv, dev.tsv)")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = vars(p.parse_args(argv))
    out, force, glue_dir = args.pop("out"), args.pop("force"), args.pop("glue_dir")
    if os.path.exists(out) and not force:
        p.error(f"{out} exists; pass --force to overwrite it")
    cfg = HFConfig(**{**args, "adam_betas": tuple(args["adam_betas"]), "hf_dir": _glue_runs.hf_folder(args["hf_dir"])})
    import transformers

    transformers.logging.set_verbosity_error()  # the load report lists the unused BERT pooler, on purpose
    transformers.logging.disable_progress_bar()
    result = train_hf(cfg, glue_dir)
    harness.write_json(out, result)
    _glue_runs.log(f"best dev {result['primary_metric']} {result['best'][result['primary_metric']]:.2f} at epoch "
                   f"{result['best_epoch']} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
