"""fewshot.py's default trainer: one run of the few-shot protocol through the recipe driver (preprocess/glue.py
--few-shot N --seed S, recipes/glue/finetune.sh), its best checkpoint scored on the labelled test half by
``acl-evaluate --split test``."""
import json
import os

import _fewshot
import _glue_runs
import harness


def train(args, enc: _glue_runs.Encoder, n: int, method: str, seed: int, root: str, rd: str,
          sch: dict) -> dict:
    """Preprocess (once per N, seed), train in ``rd`` under ``root`` and score on test; returns the run's record."""
    db = _glue_runs.preprocess(_fewshot.TASK, args.glue_dir, _fewshot.data_bin(args.work, n, seed), enc,
                               ["--few-shot", str(n), "--seed", str(seed)])
    env = _glue_runs.driver_env(enc, db, root, seed, False, _glue_runs.schedule(sch["lr"], sch["batch"],
                                                                                sch["epochs"], n))
    env["OMP_NUM_THREADS"] = str(args.threads)
    if args.bf16:
        env["BF16"] = "1"  # the recipes' switch: --autocast-bf16 on every fairseq-train run
    t0 = harness.now()
    res = _glue_runs.finetune(_fewshot.TASK, method, env, ["--validate-interval", str(sch["every"]),
                                                           "--save-interval",
                                         str(sch["every"]), "--no-last-checkpoints", "--no-save-optimizer-state"])
    ev = _glue_runs.evaluate_split(rd, db, "test", _fewshot.TASK)
    with open(os.path.join(db, "stats.json")) as f:
        sizes = {k: v["examples"] for k, v in json.load(f)["splits"].items()}
    return _fewshot.result(n, method, seed, sizes, ev["per_exit"][-1]["metrics"], res["best_valid"]["valid"],
                           res.get("best_num_updates"), sch, harness.since(t0)[0])
