#!/usr/bin/env python3
"""Training-step speed, side by side: the plugin's step against a Hugging Face loop's and the Trainer's.

Systems: HF's hand-written step (benchmarks/_hf_loop.py's ``train_step``) in ``--hf-modes``; the plugin's
``Trainer.train_step`` work (``common.Variant``) for each criterion of ``PLUGIN`` in ``--modes``; transformers'
Trainer (the plain one's CE, AclTrainer with each criterion: benchmarks/_trainer_step.py) in ``--trainer-modes``;
every mode one of eager, compiled, bf16, compiled-bf16. Measure: the median step over interleaved rounds (wall and
CPU), its ratios to HF eager, to the same side's CE and to the Trainer, the compile time and when it pays, GFLOP/s
and the fraction of the cores' peak, the peak memory. Targets: ``verdicts``. How it measures: docs/benchmarks.md,
"hf_speed.py".

    python benchmarks/hf_speed.py [--shapes 16x128 32x64] [--threads 1 2] [--modes eager compiled bf16 compiled-bf16]
        [--hf-modes eager compiled bf16] [--repeats 7] [--device cpu|cuda] [--json PATH]
"""
import json
import os
from typing import Dict, List, Optional

import torch

import _glue_runs
import _hf_loop as hf_loop
import _trainer_step
import common
import harness
from acl_fairseq.inference import flops
from acl_runtime import conventions
from acl_torch import acceleration
from acl_torch.exit_heads import POOLING_MODES
from acl_torch.machine import read_cpu_kind

# (criterion, scope, exits, extra flags): the plugin's systems, and in the Trainer's names AclTrainer's
PLUGIN = [
    ("sentence_ce", None, "top", []),
    ("sentence_ce", None, "all", ["--exit-weighting", "layer"]),  # the all-exit criteria's CE reference
    ("sentence_scl", None, "top", ["--scl-weight", "0.9", "--scl-temperature", "0.3", "--scl-feature", "encoder"]),
    ("acl_embed", None, "top", []),
    ("acl_grad", "features", "top", ["--acl-grad-scope", "features"]),
    ("acl_grad", "params", "top", ["--acl-grad-scope", "params"]),
    ("acl_cross_layer", "features", "all", ["--acl-grad-scope", "features"]),
    ("multi_exit_kd", None, "all", ["--kd-weight", "1.0", "--kd-temperature", "2.0", "--exit-weighting", "layer"]),
]
MODES = _trainer_step.MODES
OPTIM = ["--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.1", "--dropout", "0.1",
         "--attention-dropout", "0.1"]


def pair_batch(batch: int, seq_len: int, vocab: int, seed: int, cls: int = 101, sep: int = 102):
    """(fairseq sample, HF batch) of the same random pairs: fairseq ids 0 <s>, 2 </s>; HF [CLS] [SEP]."""
    g = torch.Generator().manual_seed(seed)
    sample = common.random_sample(batch, seq_len, vocab, 2, "cpu", seed)
    sample["net_input"]["src_tokens"][:, seq_len // 2] = 2  # the end of sentence A
    ids = torch.randint(min(104, vocab // 2), vocab, (batch, seq_len), generator=g)  # past BERT's specials
    ids[:, 0], ids[:, seq_len // 2], ids[:, -1] = cls, sep, sep
    types = torch.zeros_like(ids)
    types[:, seq_len // 2 + 1:] = 1
    hf = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": types,
          "labels": sample["target"].clone()}
    return sample, hf


def write_conventions(data_dir: str) -> str:
    """A BERT record for the throw-away dictionary (segment embedding on, single separator)."""
    path = os.path.join(data_dir, conventions.FILE_NAME)
    conventions.write(path, {
        "schema": conventions.SCHEMA, "family": "bert", "pair_format": "single", "segment_embedding": True,
        "head_dropout": 0.1, "tokenizer": {"kind": "wordpiece", "files": {"vocab": "vocab.txt"}, "lowercase": True},
        "dictionary_sha256": conventions.dictionary_sha256(os.path.join(data_dir, "input0", "dict.txt"))})
    return path


class HFSystem:
    """HF's step on the MiniLM weights (the timing does not depend on them, but HF loads them this way), in one
    mode: compiled in place (``nn.Module.compile``), and/or its forward and loss under bf16 autocast (what HF's
    Trainer does with ``bf16=True``; the backward and AdamW outside it)."""

    def __init__(self, hf_dir: str, batch: Dict, device: str, pooling: str, mode: str, backend: str):
        self.cfg = hf_loop.HFConfig(task="RTE", hf_dir=hf_dir, pooling=pooling, lr=2e-5)
        self.mode, (compiled, self.bf16) = mode, MODES[mode]
        self.label_text = "hf"
        torch.manual_seed(0)
        self.model = hf_loop.HFClassifier(hf_dir, 2, pooling).to(device)
        self.optimizer, self.scheduler = hf_loop.make_optimizer_and_schedule(self.model, self.cfg, 10 ** 6)
        if compiled:
            self.model.compile(backend=backend)
        self.device_type = torch.device(device).type
        self.batch = {k: v.to(device) for k, v in batch.items()}
        self.times, self.cpu_times, self.mem = [], [], []

    def step(self):
        model = _Autocast(self.model, self.device_type) if self.bf16 else self.model
        hf_loop.train_step(model, self.batch, self.optimizer, self.scheduler, self.cfg, regression=False)


class _Autocast(torch.nn.Module):
    """HF's forward under bf16 autocast, logits back in fp32 for the loss (as inside HF's autocast context)."""

    def __init__(self, inner, device_type):
        super().__init__()
        self.inner, self.device_type = inner, device_type

    def forward(self, *args):
        with acceleration.autocast_bf16(self.device_type):
            return self.inner(*args).float()


def chosen(criteria: Optional[List[str]]) -> List[tuple]:
    """PLUGIN's rows for ``--criteria`` (all without it): CE always, with all exits only beside an all-exit one."""
    rows = [r for r in PLUGIN if not criteria or r[0] in criteria or r[0] == "sentence_ce"]
    multi = any(exits == "all" and name != "sentence_ce" for name, _, exits, _ in rows)
    return [r for r in rows if multi or not (r[0] == "sentence_ce" and r[2] == "all")]


def build_plugin(args, data_dir, record, sample, layers, pooling) -> List[common.Variant]:
    """Every criterion in every plugin mode, through the task sentence_prediction_acl's own flags
    (--compile, --autocast-bf16). A mode's bf16 twin shares its model: autocast is per call."""
    out, shared = [], {}
    device_sample = {**sample, "net_input": {k: t.to(args.device) for k, t in sample["net_input"].items()},
                     "target": sample["target"].to(args.device)}
    for mode in args.modes:
        compiled, bf16 = MODES[mode]
        flags = ["--task", "sentence_prediction_acl"] + (["--compile", "--compile-backend", args.compile_backend]
                                                          if compiled else []) + (["--autocast-bf16"] if bf16 else [])
        for name, scope, exits, extra in chosen(args.criteria):
            exit_flags = ["--exit-layers", str(layers)] if exits == "top" else []
            argv = common.train_argv(data_dir, name, "multi_exit_roberta", "hf", args.seq_len, 2, args.batch,
                                     args.device, extra + OPTIM + exit_flags + flags + [
                                         "--exit-pooling", pooling, "--conventions", record],
                                     record=conventions.read(record))  # BERT's layout: one separator
            key = (exits, compiled)
            if key not in shared:
                torch.manual_seed(0)
                model, opt, criterion, task = shared[key] = common.build_trainable(argv, args.device)
            else:
                (model, opt, _, _), (_, task, criterion) = shared[key], common.build_criterion(argv)
            v = common.Variant(name, scope, "multi" if exits == "all" else "single", task, model,
                                  criterion.to(args.device), opt, device_sample)
            v.mode, v.bf16 = mode, bf16
            v.label_text = f"plugin/{name}" + (f"/{scope}" if scope else "") + ("/all exits" if exits == "all" else "")
            out.append(v)
    return out


def step_flops(size: Dict, batch: int, seq_len: int, exits: int) -> int:
    """A training step's matrix-product FLOPs: forward x 3 (the backward takes twice the forward's)."""
    head = 2 * (size["dim"] * size["dim"] + size["dim"] * 2)
    return 3 * batch * (size["layers"] * flops.layer_flops(seq_len, size["dim"], size["ffn"]) + exits * head)


def run_shape(args, batch: int, seq_len: int) -> List[Dict]:
    args.batch, args.seq_len = batch, seq_len
    hf_dir = _glue_runs.hf_folder(args.hf_dir)
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    size = common.MODEL_SIZES["hf"] = dict(  # the plugin side takes the HF encoder's shape
        layers=config["num_hidden_layers"], dim=config["hidden_size"], ffn=config["intermediate_size"],
        heads=config["num_attention_heads"], vocab=config["vocab_size"])
    with open(os.path.join(hf_dir, "vocab.txt"), encoding="utf-8") as f:
        words = f.read().split("\n")
    sample, hf_batch = pair_batch(batch, seq_len, size["vocab"], args.seed, words.index("[CLS]"), words.index("[SEP]"))
    with common.temp_dir("acl_hf_speed_") as tmp:
        data_dir = common.make_dict_dir(tmp, size["vocab"], 2)
        plugin = build_plugin(args, data_dir, write_conventions(data_dir), sample, size["layers"], args.pooling)
        hf = [HFSystem(hf_dir, hf_batch, args.device, args.pooling, m, args.compile_backend) for m in args.hf_modes]
        systems = hf + plugin + _trainer_step.build(args, hf_dir, hf_batch, tmp, chosen(args.criteria))
    if args.profile:
        profile(systems, args.profile, args.profile_systems)
    if args.repeats < 1:  # a profile only
        return []
    timer = common.step_clock(args.device)
    first = {id(s): timer(s.step)[0] for s in systems}  # one step each, alone: the compiles happen here
    run_shape.memory_method = common.interleaved_rounds(systems, lambda s: timer(s.step), args.repeats,
                                                        args.warmup, args.mem_repeats, args.device, args.seed)
    return rows_of(args, systems, first, size, batch, seq_len)


def rows_of(args, systems, first, size, batch, seq_len) -> List[Dict]:
    kind = read_cpu_kind()
    threads = torch.get_num_threads()
    base = systems[0]  # HF eager fp32
    by_key = {(s.label_text, s.mode): s for s in systems}
    ce = {(side(s.label_text), s.mode, all_exits(s.label_text)): s for s in systems
          if s.label_text.startswith("plugin/sentence_ce") or s.label_text == "trainer" or
          s.label_text == "acl_hf/sentence_ce/all exits"}
    trainer = by_key.get(("trainer", "eager"))
    rows = []
    for s in systems:
        med = common.median(s.times)
        compiled, bf16 = MODES[s.mode]
        eager_twin = by_key.get((s.label_text, "bf16" if bf16 else "eager"))
        compile_s = max(first[id(s)] - med, 0.0) if compiled else None
        pays_after = None
        if compiled and eager_twin is not None and common.median(eager_twin.times) > med:
            pays_after = compile_s / (common.median(eager_twin.times) - med)
        exits = size["layers"] if all_exits(s.label_text) else 1
        gflops = step_flops(size, batch, seq_len, exits) / med / 1e9
        peak, _ = acceleration.peak_gflops(kind, torch.bfloat16 if bf16 else torch.float32, threads)
        rows.append({
            "system": s.label_text, "mode": s.mode, "batch": batch, "seq_len": seq_len,
            "median_step_s": med, "samples_per_s": batch / med,
            "ratio_to_hf": common.median_ratio(base.times, s.times),
            "ratio_to_hf_cpu": common.median_ratio(base.cpu_times, s.cpu_times),
            "ratio_to_ce": (common.median_ratio(s.times, ce[key].times)
                            if (key := (side(s.label_text), s.mode, all_exits(s.label_text))) in ce else None),
            "ratio_to_ce_cpu": common.median_ratio(s.cpu_times, ce[key].cpu_times) if key in ce else None,
            "ratio_to_trainer": trainer and common.median_ratio(trainer.times, s.times),
            "compile_s": compile_s, "pays_after": pays_after,
            "gflops": gflops, "peak_frac": gflops / peak if peak else None,
            "peak_mem_mb": common.median(s.mem) if s.mem else None,
            "mem_ratio_to_hf": (common.median(s.mem) / common.median(base.mem)) if s.mem and base.mem and
            common.median(base.mem) > 0 else None,
            "device": args.device, "threads": threads, "repeats": args.repeats, "cpu_kind": kind.describe(),
            "bf16_unit": kind.bf16_unit,
        })
    return rows


def side(label: str) -> str:
    """Which trainer a system is: ``hf`` (the hand-written loop), ``plugin`` (fairseq) or ``trainer`` (transformers'
    Trainer: the plain one, ``trainer``, and AclTrainer, ``acl_hf/...``, share their CE references)."""
    return "trainer" if label == "trainer" or label.startswith("acl_hf/") else label.split("/")[0]


def all_exits(label: str) -> bool:
    """A system trained with an exit after every layer (its cost over CE is against CE with the same exits)."""
    return label.endswith("all exits")


def verdicts(rows: List[Dict], command: str) -> List[Dict]:
    """The targets (harness.target), per shape and thread count: the plugin's CE step at least as fast as the better
    of HF eager/compiled in fp32; on AMX, its fastest step 1.5x HF eager fp32 and 1.0x HF bf16 (elsewhere reported,
    with no verdict); each criterion's cost over its side's CE."""
    out = []
    for b, t, th in sorted({(r["batch"], r["seq_len"], r["threads"]) for r in rows}):
        g = [r for r in rows if (r["batch"], r["seq_len"], r["threads"]) == (b, t, th)]
        at, amx = f"{b}x{t}, {th} thread(s), {g[0]['cpu_kind']}", g[0]["bf16_unit"] == "amx"
        hf = {r["mode"]: r["median_step_s"] for r in g if r["system"] == "hf"}
        ce = {r["mode"]: r["median_step_s"] for r in g if r["system"] == "plugin/sentence_ce"}
        fp32_hf, fp32_ce = ([side[m] for m in ("eager", "compiled") if m in side] for side in (hf, ce))
        if fp32_hf and fp32_ce:
            out.append(harness.target("fp32: plugin sentence_ce over the better of HF eager/compiled",
                                      min(fp32_hf) / min(fp32_ce), 1.0, config=at))
        if ce and "eager" in hf and "bf16" in hf:
            why = "bf16 accuracy not checked here" if amx else f"not measured on AMX: run `{command}` on a CPU " \
                "with amx_bf16"
            out += [harness.target(f"AMX: fastest plugin sentence_ce over {name} ({why})", ref / min(ce.values()),
                                   goal if amx else None, config=at)
                    for name, ref, goal in (("HF eager fp32", hf["eager"], 1.5), ("HF bf16", hf["bf16"], 1.0))]
        for r in g:
            if r["ratio_to_ce"] is None or r["system"].startswith("plugin/sentence_ce") or r["system"] in (
                    "trainer", "acl_hf/sentence_ce/all exits"):
                continue
            trainer = side(r["system"]) == "trainer"
            goal = 1.8 if r["system"].endswith("/params") else 1.05 if trainer else 1.1
            base = ("AclTrainer's CE with every exit" if all_exits(r["system"]) else "the plain Trainer's CE"
                    ) if trainer else "CE"
            out.append(harness.target(f"cost over {base}: {r['system']} {r['mode']}", r["ratio_to_ce"], goal,
                                      at_least=False, config=at, cpu_value=r.get("ratio_to_ce_cpu")))
    return out


def profile(systems, top: int, labels: Optional[List[str]] = None) -> None:
    """torch.profiler over one step of each system (after a warm-up step): the ops that take the time.
    ``labels``: "system:mode" of the systems to profile (default: the first HF and the first plugin one)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    chosen = [s for s in systems if f"{s.label_text}:{s.mode}" in labels] if labels else [
        next(s for s in systems if s.label_text == "hf"), next(s for s in systems if s.label_text != "hf")]
    for s in chosen:
        s.step()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            s.step()
        print(f"\n# profile of one step: {s.label_text} ({s.mode})")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def parse_args(argv=None):
    p = harness.parser(__doc__, json="write the rows here", threads=[1])
    p.add_argument("--shapes", nargs="+", default=["16x128", "32x64"], help="BATCHxSEQ_LEN shapes to time")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (each runs every system once)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--mem-repeats", type=int, default=2, help="steps per system measuring peak memory (0: skip)")
    p.add_argument("--criteria", nargs="+", help="only these plugin criteria (sentence_ce is always kept)")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="the plugin's modes")
    p.add_argument("--hf-modes", nargs="+", choices=list(MODES), default=["eager", "compiled", "bf16"],
                   help="HF's modes (eager is always kept: the ratios' base)")
    p.add_argument("--trainer-modes", nargs="*", choices=list(MODES), default=["eager", "bf16"],
                   help="modes of transformers' Trainer side (the plain Trainer's CE and AclTrainer with each "
                   "criterion, benchmarks/_trainer_step.py); none: leave that side out")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled modes")
    p.add_argument("--pooling", choices=POOLING_MODES, default="cls", help="what the head reads, both sides")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--hf-dir", help="HF BERT folder (default: the packaged MiniLM)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="first print torch.profiler's N most expensive ops of one step of some systems")
    p.add_argument("--profile-systems", nargs="+", metavar="SYSTEM:MODE",
                   help="which systems --profile profiles, e.g. plugin/sentence_ce:bf16 (default: HF eager and the "
                   "first plugin system)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.hf_modes = ["eager"] + [m for m in args.hf_modes if m != "eager"]
    return args


def leave_out(args, needs: int, what: str, problem_of) -> None:
    """Drop the modes that need ``MODES[mode][needs]`` (0: compiling, 1: native bf16) from both sides where
    ``problem_of()`` names why they cannot run here: said in one line, the rest timed (eager always stays)."""
    if not any(MODES[m][needs] for m in args.modes + args.hf_modes + args.trainer_modes):
        return
    problem = problem_of()
    if problem:
        print(f"# {what} left out: {problem}")
        args.modes = [m for m in args.modes if not MODES[m][needs]] or ["eager"]
        args.hf_modes = [m for m in args.hf_modes if not MODES[m][needs]] or ["eager"]
        args.trainer_modes = [m for m in args.trainer_modes if not MODES[m][needs]] or (
            ["eager"] if args.trainer_modes else [])


def compile_reason(backend: str) -> Optional[str]:
    problem = acceleration.compile_problem(backend)
    return problem and f"torch.compile (backend {backend}) does not work here ({problem})"


def main(argv=None) -> List[Dict]:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here")
    device = torch.device(args.device).type
    leave_out(args, 1, "bf16 modes", lambda: acceleration.bf16_problem(device))
    leave_out(args, 0, "compiled modes", lambda: compile_reason(args.compile_backend))
    rows = []
    for threads in args.threads:
        harness.set_threads(threads)
        for shape in args.shapes:
            b, t = (int(x) for x in shape.lower().split("x"))
            rows += run_shape(args, b, t)
    harness.header("hf_speed", device=args.device, repeats=args.repeats, pooling=args.pooling,
                   backend=args.compile_backend, threads=args.threads)
    if rows:
        print(f"# {common.describe_memory(run_shape.memory_method)}")
    harness.report(rows, ["system", "mode", "batch", "seq_len", "threads", "median_step_s", "ratio_to_hf",
                          "ratio_to_hf_cpu", "ratio_to_trainer", "ratio_to_ce", "ratio_to_ce_cpu", "compile_s",
                          "pays_after", "gflops", "peak_frac", "peak_mem_mb"],
                   {"median_step_s": "{:.4f}", "ratio_to_hf": "{:.3f}x", "ratio_to_trainer": "{:.3f}x",
                    "ratio_to_hf_cpu": "{:.3f}x",
                    "ratio_to_ce": "{:.3f}x", "ratio_to_ce_cpu": "{:.3f}x", "compile_s": "{:.1f}",
                    "pays_after": "{:.0f}", "gflops": "{:.1f}",
                    "peak_frac": "{:.2f}", "peak_mem_mb": "{:.1f}"}, args.json)
    harness.print_targets(verdicts(rows, "python benchmarks/hf_speed.py --criteria sentence_ce --shapes 16x128 32x64"))
    kind = read_cpu_kind()
    for threads in sorted({r["threads"] for r in rows}):
        print(f"# peak: {acceleration.peak_gflops(kind, torch.float32, threads)[1]}; "
              f"{acceleration.peak_gflops(kind, torch.bfloat16, threads)[1]}")
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
