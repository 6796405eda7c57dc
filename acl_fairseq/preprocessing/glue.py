"""Preprocess one GLUE task (official TSV folder) into fairseq binarized data for ``--task sentence_prediction``.

    acl-preprocess --task RTE --input glue_data/RTE --output RTE-bin --tokenizer gpt2 --bpe-dir gpt2_bpe
    python preprocess/glue.py ...     (the same, from a checkout)

Output (the layout of fairseq's preprocess_GLUE_tasks.sh):
    OUT/input0/{dict.txt, train.bin/.idx, valid.*, test.*}   first sentence      (MNLI: valid1, test1 too)
    OUT/input1/...                                            second sentence of pair tasks
    OUT/label/{dict.txt, train.*, valid.*}                    classification labels, fairseq-built dict
    OUT/label/{train,valid}.label                             STS-B: plain float scores / 5
    OUT/stats.json  (OUT/protocol.json with --few-shot/--label-noise)
    OUT/vocab.txt, OUT/spm.model or OUT/encoder.json + vocab.bpe: the tokenizer, named by stats.json "tokenizer"
Everything is written to a hidden temporary folder next to OUT and renamed into place only when complete; the
folder is removed on an error, Ctrl-C or SIGTERM. Bad input or settings stop the run with one line naming the
file (and line) and the fix, exit status 2.
stats.json: the tokenizer record (``acl_runtime.tokenization``; file names relative to OUT, no absolute path
anywhere, so OUT can move), examples, label counts and token-length percentiles per split (lengths as the
model sees them, with <s>/</s>), the unknown-token count, and ``over_max_positions``: examples longer than
--max-positions, which fairseq-train must cut (``--shorten-method truncate``) or skip. The data itself is
never truncated.
"""
import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from acl_fairseq.preprocessing import glue_binarize as gb
from acl_fairseq.preprocessing import glue_tokenizers
from acl_runtime import console
from acl_runtime import scl_protocols as scl
from acl_runtime.glue_tasks import TASKS, Example, GlueDataError, TaskSpec, get_task, read_split, regression_scale
from acl_runtime.io import atomic

logger = logging.getLogger(__name__)


@dataclass
class OutSplit:
    name: str  # fairseq split name: train, valid, valid1, test, test1
    source: str  # the .tsv file it comes from
    examples: List[Example]
    labelled: bool


def _nproc() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _add_tokenizer_args(p: argparse.ArgumentParser) -> None:
    """The tokenizer and its dictionary: gpt2 BPE, sentencepiece or wordpiece."""
    from acl_fairseq.preprocessing.gpt2_files import GPT2_BPE_URL, default_bpe_dir

    p.add_argument("--tokenizer", choices=["gpt2", "sentencepiece", "wordpiece"], default="gpt2",
                   help="default: gpt2 (what roberta.base/large use)")
    p.add_argument("--srcdict", help="fairseq dict.txt for the inputs (gpt2 default: BPE_DIR/dict.txt, the one "
                   "roberta.* needs)")
    p.add_argument("--bpe-dir", default=default_bpe_dir(), help="gpt2: folder with encoder.json, vocab.bpe, dict.txt "
                   "(missing files are downloaded; default: $ACL_GPT2_BPE_DIR or %(default)s)")
    p.add_argument("--bpe-url", default=GPT2_BPE_URL,
                   help="gpt2: where missing BPE files are downloaded from (default: %(default)s)")
    p.add_argument("--spm-model", help="sentencepiece: an existing .model (default: train one on the training text)")
    p.add_argument("--spm-vocab-size", type=int, default=8000,
                   help="sentencepiece: vocabulary size (upper bound) when training (default: %(default)s)")
    p.add_argument("--vocab", help="wordpiece: BERT vocab.txt")
    lc = p.add_mutually_exclusive_group()
    lc.add_argument("--lowercase", "--do-lower-case", dest="lowercase", action="store_true", default=None,
                    help="wordpiece: lowercase and strip accents (default: do_lower_case of a tokenizer_config.json "
                    "beside the vocab, else whether the vocab has no A-Z entry)")
    lc.add_argument("--no-lowercase", dest="lowercase", action="store_false", help="wordpiece: keep case")
    p.add_argument("--dict-from", choices=["vocab", "train"], default="vocab", help="sentencepiece/wordpiece without "
                   "--srcdict: dict.txt lists the tokenizer's vocabulary, or is built by fairseq from the training "
                   "tokens (default: %(default)s)")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, help=f"one of {', '.join(TASKS)} (case and dashes ignored)")
    p.add_argument("--input", required=True, help="the GLUE task folder (train.tsv, dev.tsv, test.tsv)")
    p.add_argument("--output", required=True, help="destination folder (fairseq data dir)")
    _add_tokenizer_args(p)
    p.add_argument("--few-shot", type=int, metavar="N", help="SCL protocol: N stratified training examples; dev split "
                   "into test (half) and valid (500 others); replaces the GLUE test split")
    p.add_argument("--label-noise", type=float, metavar="F",
                   help="replace a fraction F of training labels by another label")
    p.add_argument("--seed", type=int, default=1,
                   help="seed for --few-shot, --label-noise and sentencepiece training (default: %(default)s)")
    p.add_argument("--max-positions", type=int, default=512, help="count (in stats.json) examples longer than this, "
                   "in tokens incl. specials (default: %(default)s)")
    p.add_argument("--workers", type=int, default=_nproc(),
                   help="processes for tokenizing and binarizing (default: nproc, here %(default)s)")
    p.add_argument("--skip-test", action="store_true", help="do not read or binarize the GLUE test split(s)")
    p.add_argument("--force", action="store_true", help="replace an existing OUTPUT; it is swapped out only after the "
                   "new output is complete, so a failed run leaves it untouched")
    args = p.parse_args(argv)
    if args.tokenizer == "wordpiece" and not args.vocab:
        p.error("--tokenizer wordpiece needs --vocab vocab.txt")
    if args.tokenizer != "sentencepiece" and args.spm_model:
        p.error("--spm-model goes with --tokenizer sentencepiece")
    if args.few_shot is not None and args.few_shot < 1:
        p.error("--few-shot N needs N >= 1")
    if args.label_noise is not None and not 0.0 <= args.label_noise <= 1.0:
        p.error("--label-noise F needs 0 <= F <= 1")
    if args.workers < 1:
        p.error("--workers must be >= 1")
    return args


# --------------------------------------------------------------------------- splits and protocols


def plan_splits(args, spec: TaskSpec) -> Tuple[List[OutSplit], Dict, List[Example]]:
    """Read the TSVs and apply the protocols. Returns (output splits, protocol record, full train examples)."""
    train = read_split(args.input, "train", spec, "train")
    devs = [read_split(args.input, stem, spec, "dev") for stem in spec.dev]
    record: Dict = {"seed": args.seed}
    if spec.filter_malformed:
        record["filtered_malformed_rows"] = {"train.tsv": train.filtered,
                                             **{os.path.basename(d.path): d.filtered for d in devs}}
    if args.few_shot is not None:
        out = _few_shot_splits(args, spec, train.examples, devs)
        record["few_shot"] = args.few_shot
    else:
        out = [OutSplit("train", "train.tsv", train.examples, True)]
        out += [OutSplit(scl.nth("valid", k), os.path.basename(d.path), d.examples, True) for k, d in enumerate(devs)]
        for k, stem in enumerate(() if args.skip_test else spec.test):
            test = read_split(args.input, stem, spec, "test")
            out.append(OutSplit(scl.nth("test", k), os.path.basename(test.path), test.examples, False))
    if args.label_noise is not None:
        record["label_noise"] = _apply_label_noise(args, spec, out[0])
    if args.few_shot is not None:
        record["source_lines"] = {s.name: {"file": s.source, "lines": [e.line for e in s.examples]} for s in out}
    for s in out:
        if not s.examples:
            raise GlueDataError(
                f"{s.source}: the {s.name} split would be empty. Fix: use a larger dev set or --few-shot N"
            )
    order = {"train": 0, "valid": 1, "test": 2}
    out.sort(key=lambda s: (order[s.name.rstrip("0123456789")], s.name))  # fairseq's valid, valid1, test, test1
    return out, record, train.examples


def _few_shot_splits(args, spec: TaskSpec, train: List[Example], devs) -> List[OutSplit]:
    """N stratified training examples; each dev file k -> valid{k} (500) and test{k} (half), with labels."""
    return [OutSplit(s.name, s.source, s.examples, True)
            for s in scl.few_shot_splits(spec, train, devs, args.few_shot, args.seed)]


def _apply_label_noise(args, spec: TaskSpec, train: OutSplit) -> Dict:
    if spec.regression:
        raise GlueDataError(
            f"--label-noise swaps class labels; {spec.name} is a regression task. Fix: drop --label-noise"
        )
    labels, flipped = scl.add_label_noise([e.label for e in train.examples], args.label_noise, spec.labels, args.seed)
    train.examples = [e._replace(label=y) for e, y in zip(train.examples, labels)]
    return {"fraction": args.label_noise, "changed": len(flipped),
            "changed_lines": [train.examples[i].line for i in flipped]}


def check_label_coverage(splits: List[OutSplit], spec: TaskSpec) -> None:
    """fairseq's label dict is built from train labels: a label seen only in valid/test would become <unk>."""
    if spec.regression:
        return
    known = {e.label for e in splits[0].examples}
    for s in splits[1:]:
        for e in s.examples if s.labelled else ():
            if e.label not in known:
                raise GlueDataError(
                    f"{s.source}:{e.line}: label {e.label!r} never occurs in the training split "
                    f"({len(splits[0].examples)} examples), so fairseq's label dictionary cannot encode it. "
                    "Fix: use more training data (a larger --few-shot N)"
                )


# --------------------------------------------------------------------------- writing and binarizing


def write_token_files(splits: List[OutSplit], n_inputs: int, enc, work: str, workers: int) -> None:
    from acl_fairseq.preprocessing.text_encoders import EncoderPool

    with EncoderPool(enc, workers) as pool:
        for s in splits:
            for j in range(n_inputs):
                t0, n = time.time(), len(s.examples)
                marks = {n * k // 4 for k in (1, 2, 3)} if n > 20000 else set()  # progress on large splits only
                with open(os.path.join(work, f"{s.name}.input{j}"), "w", encoding="utf-8") as f:
                    for i, line in enumerate(pool.encode_lines([e.texts[j] for e in s.examples]), 1):
                        f.write(line + "\n")
                        if i in marks:
                            logger.info(f"  {s.name}.input{j}: {i}/{n} lines tokenized")
                logger.info(f"{s.name}.input{j}: {n} lines tokenized in {time.time() - t0:.1f}s ({s.source})")


def binarize(splits: List[OutSplit], n_inputs: int, spec: TaskSpec, srcdict: Optional[str], tmp: str, work: str,
             workers: int):
    train = splits[0]
    valid = [s for s in splits if s.name.startswith("valid")]
    test = [s for s in splits if s.name.startswith("test")]
    bw = gb.binarize_workers(len(train.examples), workers)
    if srcdict is None:
        srcdict = os.path.join(work, "dict.txt")
        gb.build_dict_from_data([os.path.join(work, f"train.input{j}") for j in range(n_inputs)], srcdict, workers)
    for j in range(n_inputs):
        pref = lambda s, j=j: os.path.join(work, f"{s.name}.input{j}")  # noqa: E731
        gb.fairseq_preprocess(os.path.join(tmp, f"input{j}"), pref(train), [pref(s) for s in valid],
                              [pref(s) for s in test], srcdict, bw)
    labelled = [s for s in splits if s.labelled]
    if spec.regression:  # fairseq: awk '{print $1 / 5.0}' into label/<split>.label, not binarized
        scale = regression_scale(spec.name)  # the task row's (STS-B: 5)
        os.makedirs(os.path.join(tmp, "label"))
        for s in labelled:
            with open(os.path.join(tmp, "label", f"{s.name}.label"), "w") as f:
                f.writelines("%.6g\n" % (float(e.label) / scale) for e in s.examples)
        return
    for s in labelled:
        with open(os.path.join(work, f"{s.name}.label"), "w", encoding="utf-8") as f:
            f.writelines(e.label + "\n" for e in s.examples)
    lab = lambda s: os.path.join(work, f"{s.name}.label")  # noqa: E731
    gb.fairseq_preprocess(
        os.path.join(tmp, "label"), lab(train), [lab(s) for s in valid if s.labelled],
        [lab(s) for s in test if s.labelled], None, 1
    )


def collect_stats(splits: List[OutSplit], n_inputs: int, spec: TaskSpec, tmp: str, args, info: Dict,
                  record: Dict) -> Dict:
    from fairseq.data import Dictionary

    dict_size = len(Dictionary.load(os.path.join(tmp, "input0", "dict.txt")))
    stats: Dict = {"task": spec.name, **info, "dict_size": dict_size, "max_positions": args.max_positions}
    if spec.regression:
        stats["labels"] = f"regression: label/<split>.label holds score / {regression_scale(spec.name):g}"
    else:
        stats["label_dictionary"] = gb.label_dictionary_order(os.path.join(tmp, "label", "dict.txt"))
    if "filtered_malformed_rows" in record:  # QQP, as fairseq's awk NF==6 filter
        stats["filtered_malformed_rows"] = {**record["filtered_malformed_rows"],
                                            "why": "wrong field count, dropped as fairseq does"}
    stats["protocol"] = {k: record[k] for k in ("seed", "few_shot") if k in record}
    if "label_noise" in record:
        stats["protocol"]["label_noise"] = {k: v for k, v in record["label_noise"].items() if k != "changed_lines"}
    stats["splits"] = {}
    for s in splits:
        st = {"source": s.source, "labelled": s.labelled}
        st.update(gb.split_stats(tmp, s.name, n_inputs, dict_size, args.max_positions, len(s.examples)))
        if s.labelled and spec.regression:
            scores = [float(e.label) for e in s.examples]
            st["score_range"] = [min(scores), max(scores)]
        elif s.labelled:
            st["label_counts"] = dict(sorted(Counter(e.label for e in s.examples).items()))
        stats["splits"][s.name] = st
    return stats


# --------------------------------------------------------------------------- main


def _output_path(args, spec) -> str:
    """The absolute --output, refused when --input is missing, it exists without --force or fairseq cannot
    take its path."""
    if not os.path.isdir(args.input):
        raise GlueDataError(
            f"{args.input}: no such folder. Fix: pass --input GLUE_DIR/{spec.name} (the unpacked GLUE task folder)"
        )
    out = os.path.abspath(args.output)
    if os.path.exists(out) and not args.force:
        raise GlueDataError(f"{out}: output exists. Fix: pass --force to replace it (the old output is swapped out "
                            "only after the new one is complete) or choose another --output")
    if "," in os.path.dirname(out):
        raise GlueDataError(
            f"{out}: the output path contains a comma, which fairseq-preprocess cannot take. Fix: rename it"
        )
    return out


def _build(args, spec, out: str, tmp: str, work: str) -> dict:
    """Read, tokenize and binarize the splits into ``tmp`` (text in ``work``); returns stats.json's content."""
    _make_work_folder(out, work)  # first: an --output that cannot be written fails before the splits are read
    splits, record, train_full = plan_splits(args, spec)
    check_label_coverage(splits, spec)
    enc, srcdict, info = glue_tokenizers.setup_tokenizer(args, tmp, work, train_full)
    n_inputs = len(spec.inputs)
    write_token_files(splits, n_inputs, enc, work, args.workers)
    t1 = time.time()
    binarize(splits, n_inputs, spec, srcdict, tmp, work, args.workers)
    logger.info(f"binarized with fairseq-preprocess in {time.time() - t1:.1f}s")
    shutil.rmtree(work)
    stats = collect_stats(splits, n_inputs, spec, tmp, args, info, record)
    if "few_shot" in record or "label_noise" in record:
        _write_json(os.path.join(tmp, "protocol.json"), record)
    return stats


def run(args) -> str:
    spec = get_task(args.task)
    out = _output_path(args, spec)
    t0 = time.time()
    atomic.clean_stale(os.path.dirname(out), os.path.basename(out))  # what a killed run (SIGKILL) left
    tmp = atomic.temp_path(out)
    try:  # removes tmp on any error, on Ctrl-C and on SIGTERM (cli_main turns it into SystemExit)
        stats = _build(args, spec, out, tmp, os.path.join(tmp, ".text"))
        stats["seconds"] = round(time.time() - t0, 2)
        _write_json(os.path.join(tmp, "stats.json"), stats)
        _publish(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    summary = ", ".join(f"{k} {v['examples']}" for k, v in stats["splits"].items())
    logger.info(f"wrote {out} ({summary}) in {stats['seconds']}s")
    return out


def _make_work_folder(out: str, work: str) -> None:
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        os.makedirs(work)
    except OSError as e:
        raise GlueDataError(f"{out}: cannot write there ({e.strerror}: {e.filename}). Fix: choose an --output in a "
                            "folder you can write to") from None


def _write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def _publish(tmp: str, out: str) -> None:
    """Put the finished ``tmp`` at ``out``: swap, then delete the old one (a signal at any instant leaves one)."""
    atomic.replace_folder(tmp, out)


def main(argv=None) -> int:
    args = parse_args(argv)
    console.setup_logging()
    try:
        run(args)
    except GlueDataError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2  # bad input or settings, as argparse's usage errors
    return 0


def cli_main() -> None:
    """``acl-preprocess`` (and ``python preprocess/glue.py``)."""
    console.run("acl-preprocess", main)  # the hidden temporary folder is removed on SIGTERM as on Ctrl-C
