"""fewshot.py --trainer hf: the few-shot protocol through acl-train-hf (Hugging Face's Trainer), each run beside the
fairseq run of the same N, method and seed, at the fairseq runs' settings; what differs: docs/benchmarks.md,
"fewshot.py"."""
import math
import os
import shlex
import sys
from typing import Dict, List

import _fewshot
import _glue_runs
import _records
import harness
from acl_fairseq.runs import recipe_tables

METHODS_TABLE = os.path.join(_glue_runs.REPO, "recipes", "glue", "methods.tsv")


def criterion_flags(method: str) -> List[str]:
    """``--criterion NAME`` and the method's options from methods.tsv (its SST-2 row, as the runs' plan reads it), in
    acl-train-hf's spelling."""
    row = recipe_tables.method(method, "SST-2")
    if row is None:
        raise ValueError(f"{METHODS_TABLE}: no method {method!r}")
    return ["--criterion", row.criterion] + ["--" + f[2:].replace("-", "_") if f.startswith("--") else f
                                             for f in row.flags]


def command(hf_dir: str, glue_dir: str, enc: "_glue_runs.Encoder", n: int, method: str, seed: int, rd: str,
            sch: Dict[str, object]) -> List[str]:
    per_epoch = math.ceil(n / sch["batch"])
    updates = per_epoch * sch["epochs"]
    return [sys.executable, "-m", "acl_hf.train", "--model_name_or_path", hf_dir, "--task_name", "SST-2",
            "--data_dir", glue_dir, "--few_shot", str(n), "--seed", str(seed), "--output_dir", rd,
            *criterion_flags(method), "--method", method, "--exit_layers", str(enc.num_layers),
            "--exit_pooling", enc.pooling, "--max_seq_length", "512",
            "--per_device_train_batch_size", str(sch["batch"]), "--per_device_eval_batch_size", "64",
            "--num_train_epochs", str(sch["epochs"]), "--learning_rate", str(sch["lr"]),
            "--lr_scheduler_type", "linear", "--warmup_steps", str(math.ceil(0.06 * updates)),
            "--weight_decay", "0.1", "--adam_beta1", "0.9", "--adam_beta2", "0.98", "--adam_epsilon", "1e-6",
            "--optim", "adamw_torch", "--max_grad_norm", "0", "--eval_strategy", "steps",
            "--eval_steps", str(per_epoch * sch["every"]), "--save_strategy", "no", "--logging_steps",
            str(per_epoch), "--report_to", "none", "--use_cpu", "--disable_tqdm", "true"]


def train(hf_dir: str, glue_dir: str, enc: "_glue_runs.Encoder", n: int, method: str, seed: int, rd: str,
          sch: Dict[str, object], threads: int, keep: bool) -> dict:
    """One run into ``rd``: acl-train-hf's result.json, then the benchmark's result with the test half's accuracy at
    the validation that selected the model."""
    argv = command(hf_dir, glue_dir, enc, n, method, seed, rd, sch)
    harness.write_text(os.path.join(rd, "command.sh"), "#!/usr/bin/env bash\n" + shlex.join(argv) + "\n")
    t0 = harness.now()
    _glue_runs.run(argv, env={"OMP_NUM_THREADS": str(threads), "PYTHONPATH": _glue_runs.REPO},
                   log_path=os.path.join(rd, "train.log"))  # a failure raises with the log's tail
    res = _records.load(rd)
    out = _fewshot.result(n, method, seed, res["split_sizes"], res["test_metrics"]["test"],
                          res["best_valid"]["valid"], res["best_num_updates"], sch, harness.since(t0)[0], trainer="hf")
    if not keep:  # the weights, and the Trainer's log (its numbers that the tables read are in ``out``)
        for name in os.listdir(rd):
            if name.endswith((".safetensors", ".bin")) or name == res["train_log"]:
                os.remove(os.path.join(rd, name))
    return out
