#!/usr/bin/env python
"""Time SST-2 preprocessing: ``preprocess/glue.py`` against fairseq's own pipeline, on this machine.

Systems: this tool, and fairseq's ``examples/roberta/preprocess_GLUE_tasks.sh`` for SST-2 step by step, the same
GPT-2 BPE files (``--bpe-dir``, else a byte-level BPE learned from SST-2's training text) and workers. Measure: the
median wall and CPU seconds over ``--repeats`` alternating runs, fairseq's stages. Targets: both write
byte-identical files (exit 1 otherwise). How it measures: docs/benchmarks.md, "preprocess_speed.py".

    python benchmarks/preprocess_speed.py --json bench.json
"""
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

import harness
from acl_fairseq.preprocessing.gpt2_files import GPT2_FILES, write_local_gpt2_bpe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMPARED = ["input0/train.bin", "input0/train.idx", "input0/valid.bin", "input0/test.bin", "input0/dict.txt",
            "label/dict.txt", "label/train.bin", "label/valid.bin"]


def bpe_files(bpe_dir, work, merges, glue_dir):
    if bpe_dir and all(os.path.isfile(os.path.join(bpe_dir, f)) for f in GPT2_FILES):
        return bpe_dir, "given"
    local = os.path.join(work, f"gpt2_bpe_local_{merges}")
    if not all(os.path.isfile(os.path.join(local, f)) for f in GPT2_FILES):
        with open(os.path.join(glue_dir, "train.tsv"), encoding="utf-8") as f:
            texts = [line.split("\t")[0] for line in f.read().split("\n")[1:] if line]
        seconds, _ = harness.wall(lambda: write_local_gpt2_bpe(local, texts, merges))
        print(f"[bench] learned {merges} BPE merges from SST-2 train in {seconds:.1f}s -> {local}")
    return local, f"local byte-level BPE, {merges} merges"


def cpu_seconds():
    """user + system time of all finished child processes (and their waited-for children)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"[bench] failed: {cmd if isinstance(cmd, str) else ' '.join(cmd)}\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def ours(glue_dir, out, bpe, workers, python):
    if os.path.exists(out):
        shutil.rmtree(out)
    t0, c0 = harness.now()[0], cpu_seconds()
    run([python, os.path.join(REPO, "preprocess", "glue.py"), "--task", "SST-2", "--input", glue_dir, "--output", out,
         "--tokenizer", "gpt2", "--bpe-dir", bpe, "--workers", str(workers)])
    return {"total": harness.now()[0] - t0, "cpu": cpu_seconds() - c0}


def fairseq_pipeline(glue_dir, out, bpe, workers, python):
    """preprocess_GLUE_tasks.sh for SST-2, step by step (each step timed)."""
    if os.path.exists(out):
        shutil.rmtree(out)
    raw = os.path.join(out, "raw")
    os.makedirs(raw)
    times, t0, c0 = {}, harness.now()[0], cpu_seconds()
    extract = " && ".join(
        f"tail -n +2 '{glue_dir}/{s}.tsv' > '{raw}/{s}.tsv.temp' && "
        + (f"cut -f1 '{raw}/{s}.tsv.temp' > '{raw}/{s}.raw.input0' && cut -f2 '{raw}/{s}.tsv.temp' > '{raw}/{s}.label'"
           if s != "test" else f"cut -f2 '{raw}/{s}.tsv.temp' > '{raw}/{s}.raw.input0'")
        for s in ("train", "dev", "test")
    )
    run(["bash", "-c", "set -euo pipefail; " + extract])
    times["extract"], t = harness.now()[0] - t0, harness.now()[0]
    for s in ("train", "dev", "test"):
        run([python, "-m", "fairseq.examples.roberta.multiprocessing_bpe_encoder",
             "--encoder-json", f"{bpe}/encoder.json", "--vocab-bpe", f"{bpe}/vocab.bpe",
             "--inputs", f"{raw}/{s}.raw.input0", "--outputs", f"{raw}/{s}.input0",
             "--workers", str(workers), "--keep-empty"])
    times["bpe"], t = harness.now()[0] - t, harness.now()[0]
    preprocess = [os.path.join(os.path.dirname(python), "fairseq-preprocess")]
    if not os.path.exists(preprocess[0]):
        preprocess = [python, "-m", "fairseq_cli.preprocess"]
    run(preprocess + ["--only-source", "--trainpref", f"{raw}/train.input0", "--validpref", f"{raw}/dev.input0",
                      "--testpref", f"{raw}/test.input0", "--destdir", f"{out}/input0", "--workers", str(workers),
                      "--srcdict", f"{bpe}/dict.txt"])
    run(preprocess + ["--only-source", "--trainpref", f"{raw}/train.label", "--validpref", f"{raw}/dev.label",
                      "--destdir", f"{out}/label", "--workers", str(workers)])
    times["binarize"] = harness.now()[0] - t
    times["total"] = harness.now()[0] - t0
    times["cpu"] = cpu_seconds() - c0
    return times


def identical(a, b):
    def read(root, rel):
        with open(os.path.join(root, rel), "rb") as f:
            return f.read()

    return {rel: read(a, rel) == read(b, rel) for rel in COMPARED}


def _summary(args, runs: dict, n: dict, bpe_kind: str, same: dict) -> dict:
    """The result record: each pipeline's wall and CPU seconds per repeat and their medians, fairseq's stages, the
    ratios, and whether both pipelines wrote the same files."""
    med = {k: statistics.median(x["total"] for x in v) for k, v in runs.items()}
    cpu = {k: statistics.median(x["cpu"] for x in v) for k, v in runs.items()}
    stages = {s: statistics.median(x[s] for x in runs["fairseq"]) for s in ("extract", "bpe", "binarize")}
    return {
        "task": "SST-2", "examples": n, "bpe": bpe_kind, "workers": args.workers, "repeats": args.repeats,
        "machine": {**harness.record(), "platform": platform.platform()},
        "seconds": {k: [round(x["total"], 2) for x in v] for k, v in runs.items()},
        "median_seconds": {k: round(v, 2) for k, v in med.items()},
        "median_cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},  # user+sys, less sensitive to a busy machine
        "load_average_1min": os.getloadavg()[0],
        "fairseq_stage_median_seconds": {k: round(v, 2) for k, v in stages.items()},
        "speedup_fairseq_over_ours": round(med["fairseq"] / med["ours"], 2),
        "cpu_ratio_fairseq_over_ours": round(cpu["fairseq"] / cpu["ours"], 2),
        "outputs_identical": all(same.values()), "compared_files": same,
    }


def _print_summary(args, result: dict) -> None:
    med, cpu = result["median_seconds"], result["median_cpu_seconds"]
    print(f"\nSST-2 ({result['examples']}), GPT-2 BPE: {result['bpe']}, {args.workers} workers, median of "
          f"{args.repeats}")
    print(f"{'pipeline':<44} {'median s':>9} {'cpu s':>7}  runs (wall s)")
    for key, label in (("ours", "preprocess/glue.py"), ("fairseq", "fairseq (bpe encoder + fairseq-preprocess)")):
        print(f"{label:<44} {med[key]:>9.2f} {cpu[key]:>7.2f}  {result['seconds'][key]}")
    print("  fairseq stages: " + ", ".join(f"{k} {v:.2f}s" for k, v in result["fairseq_stage_median_seconds"].items()))
    print(f"speed-up (fairseq / ours): {result['speedup_fairseq_over_ours']}x wall, "
          f"{result['cpu_ratio_fairseq_over_ours']}x cpu; "
          f"outputs identical: {result['outputs_identical']}; load average {result['load_average_1min']:.1f}")


def main(argv=None):
    p = harness.parser(__doc__, json="write the results here")
    p.add_argument(
        "--glue-dir",
        default=os.path.join(os.environ.get("GLUE_DIR", os.path.join(REPO, "..", "shared", "glue")), "SST-2"),
        help="the GLUE SST-2 folder (default: $GLUE_DIR/SST-2, GLUE_DIR defaulting to ../shared/glue beside the "
        "checkout)",
    )
    p.add_argument("--bpe-dir",
                   help="folder with the official encoder.json, vocab.bpe, dict.txt (default: learn locally)")
    p.add_argument("--merges", type=int, default=5000, help="merges of the locally learned BPE")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="workers for both pipelines")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="preprocess_bench_") as work:
        bpe, bpe_kind = bpe_files(args.bpe_dir, work, args.merges, args.glue_dir)
        runs = {"ours": [], "fairseq": []}
        for r in range(args.repeats):
            runs["ours"].append(ours(args.glue_dir, os.path.join(work, "ours"), bpe, args.workers, python))
            runs["fairseq"].append(fairseq_pipeline(args.glue_dir, os.path.join(work, "fairseq"), bpe, args.workers,
                                                    python))
            print(f"[bench] repeat {r + 1}/{args.repeats}: ours {runs['ours'][-1]['total']:.1f}s, "
                  f"fairseq {runs['fairseq'][-1]['total']:.1f}s")
        same = identical(os.path.join(work, "ours"), os.path.join(work, "fairseq"))
        with open(os.path.join(work, "ours", "stats.json")) as f:
            n = {k: v["examples"] for k, v in json.load(f)["splits"].items()}

    result = _summary(args, runs, n, bpe_kind, same)
    _print_summary(args, result)
    if args.json:
        harness.write_json(args.json, result)
    return 0 if result["outputs_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
