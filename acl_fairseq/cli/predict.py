"""``acl-predict``: raw text to labels, with early exit, from a trained checkpoint.

    acl-predict CHECKPOINT --data DATA_BIN --input FILE|- [--task RTE | --columns 2,3]
        [--policy entropy --threshold 0.3 | --exit-layer L] [--batch-size 32] [--output FILE|-] [--format jsonl|tsv]

Input: a GLUE TSV (``--task``: the task's text columns, header and layout from
``acl_fairseq.preprocessing.glue_tasks``), a TSV with ``--columns`` (1-based), JSONL (``{"text": ...,
"text_pair": ...}``; ``"id"`` is kept), or plain text, one sentence per line. Output, streamed in input
order: one record per input with its id, label (or score), probabilities and exit layer. Without policy
flags the last exit decides, like an ordinary classifier. A bad row (empty, wrong column count, bad JSON) is
reported with ``file:line`` and skipped, or stops the run with ``--strict``. Inputs longer than the model's
positions are cut and counted. The decisions are those of the layer-by-layer engine acl-evaluate checks, on
the same length-sorted batches (``--chunk-size`` inputs are sorted together; the default holds a GLUE dev
set whole).
"""
import argparse
import itertools
import json
import logging
import os
import sys
import time
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

from acl_fairseq import exits
from acl_fairseq.cli import console

logger = logging.getLogger("acl_fairseq.cli.predict")
FORMATS = ("jsonl", "tsv")


class Row(NamedTuple):
    id: str
    line: int
    texts: Tuple[str, ...]


class BadRow(ValueError):
    """An input row that cannot be predicted; the message starts with ``file:line``."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="acl-predict", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("checkpoint", help="fine-tuned checkpoint (checkpoint_best.pt of a run)")
    p.add_argument("--data", required=True, help="the binarized folder the model was trained on (dictionaries "
                   "and the tokenizer record: preprocess/glue.py's stats.json, or a converted encoder's folder)")
    p.add_argument("--input", required=True, help="input file, or - for standard input")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--task", help="the input is a GLUE TSV of this task (RTE, SST-2, ...): columns and header "
                     "as the GLUE files have them")
    fmt.add_argument("--columns", help="the input is a TSV: the 1-based text column(s), e.g. 2 or 2,3 (a pair)")
    p.add_argument("--input-format", choices=("auto", "tsv", "jsonl", "text"), default="auto",
                   help="auto: tsv with --task/--columns, jsonl for *.jsonl, else text (one sentence per line)")
    p.add_argument("--header", action="store_true", help="with --columns: the first line is a header")
    p.add_argument("--policy", choices=list(exits.POLICIES), help="early-exit policy (multi-exit models only)")
    p.add_argument("--threshold", type=float, help="the policy's threshold: entropy/confidence level or patience "
                   "count. " + "; ".join(f"{r.name}: {r.rule}, {r.range_text}, default {r.default:g}"
                                         for r in exits.POLICIES.values()))
    p.add_argument("--exit-layer", type=int, help="every input leaves at this exit (one of the model's layers)")
    p.add_argument("--batch-size", type=int, default=32, help="inputs per batch (default: %(default)s)")
    p.add_argument("--chunk-size", type=int, default=8192, help="inputs read and length-sorted together before "
                   "batching; output is written per chunk, in input order (default: %(default)s)")
    p.add_argument("--output", default="-", help="output file, or - for standard output (default)")
    p.add_argument("--format", choices=FORMATS, default="jsonl", help="output records (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output")
    p.add_argument("--strict", action="store_true", help="stop at the first bad input row instead of skipping it")
    p.add_argument("--tokenizer", help="stats.json or conventions.json naming the tokenizer, when --data has none")
    console.add_device_argument(p)
    return p


# ---- input -------------------------------------------------------------------------------------


def _lines(path: str) -> Iterator[Tuple[int, str]]:
    f = sys.stdin if path == "-" else open(path, encoding="utf-8-sig")
    try:
        for lineno, line in enumerate(f, start=1):
            yield lineno, line.rstrip("\r\n")
    finally:
        if f is not sys.stdin:
            f.close()


def read_rows(args) -> Iterator[object]:
    """Rows of the input, or :class:`BadRow` errors in their place (the caller skips or stops)."""
    name = "<stdin>" if args.input == "-" else args.input
    kind = args.input_format
    if kind == "auto":
        kind = "tsv" if (args.task or args.columns) else "jsonl" if name.endswith(".jsonl") else "text"
    columns, header, ncols = None, args.header, None
    if args.task:
        columns, header, ncols = glue_layout(args.task, args.input)
    elif args.columns:
        columns = [int(c) - 1 for c in args.columns.split(",")]
    elif kind == "tsv":
        raise SystemExit("acl-predict: error: a TSV input needs --task or --columns")
    for lineno, line in _lines(args.input):
        if header and lineno == 1:
            continue
        where = f"{name}:{lineno}"
        if not line.strip():
            yield BadRow(f"{where}: empty line, skipped")
            continue
        if kind == "jsonl":
            try:
                obj = json.loads(line)
                texts = (obj["text"],) + ((obj["text_pair"],) if obj.get("text_pair") is not None else ())
            except (ValueError, KeyError, TypeError) as e:
                yield BadRow(f"{where}: not a JSON object with a 'text' field ({e}), skipped")
                continue
            yield Row(str(obj.get("id", lineno)), lineno, tuple(map(str, texts)))
        elif kind == "tsv":
            fields = line.split("\t")
            if (ncols and len(fields) != ncols) or len(fields) <= max(columns):
                yield BadRow(f"{where}: {len(fields)} tab-separated fields, expected "
                             f"{ncols or max(columns) + 1}{' or more' if not ncols else ''}, skipped")
                continue
            texts = tuple(fields[c].strip() for c in columns)
            if not all(texts):
                yield BadRow(f"{where}: an empty text field, skipped")
                continue
            yield Row(fields[0] if args.task and header else str(lineno), lineno, texts)
        else:
            yield Row(str(lineno), lineno, (line.strip(),))


def glue_layout(task: str, path: str) -> Tuple[List[int], bool, Optional[int]]:
    """(text columns, header?, field count) of a GLUE file of ``task``: train/dev or test layout,
    told apart by the header (test files have no label column)."""
    from acl_fairseq.preprocessing.glue_tasks import get_task

    spec = get_task(task)
    first = next(_lines(path), (1, ""))[1].split("\t") if path != "-" else None
    if first is None:
        return list(spec.inputs), spec.header, None
    if spec.label_header is None or not spec.header:  # CoLA: header-less train/dev, a header on test
        if spec.ncols and len(first) == spec.ncols:
            return list(spec.inputs), False, spec.ncols
        return list(spec.test_inputs), True, None
    is_dev = spec.label_header in [f.strip() for f in first]
    return list(spec.inputs if is_dev else spec.test_inputs), True, len(first)


# ---- output ------------------------------------------------------------------------------------


class Writer:
    """Records streamed to stdout, or to a temporary file renamed over ``path`` at the end (atomic)."""

    def __init__(self, path: str, fmt: str, label_names: Sequence[str], force: bool):
        if path != "-" and os.path.exists(path) and not force:
            raise SystemExit(f"acl-predict: error: {path} exists; pass --force to overwrite it")
        self.path, self.fmt, self.names = path, fmt, list(label_names)
        self.tmp = None if path == "-" else f"{path}.tmp{os.getpid()}"
        self.f = sys.stdout if path == "-" else open(self.tmp, "w", encoding="utf-8")
        if fmt == "tsv":
            self.f.write("\t".join(["id", "label", "exit_layer"] + [f"p_{n}" for n in self.names]) + "\n")

    def write(self, row: Row, pred) -> None:
        if self.fmt == "jsonl":
            rec = {"id": row.id, "label": pred.label, "probabilities": pred.probabilities,
                   "exit_layer": pred.exit_layer, "truncated": pred.truncated}
            self.f.write(json.dumps(rec) + "\n")
        else:
            probs = [f"{pred.probabilities[n]:.6f}" for n in self.names] if pred.probabilities else []
            label = pred.label if isinstance(pred.label, str) else f"{pred.label:.4f}"
            self.f.write("\t".join([row.id, label, str(pred.exit_layer)] + probs) + "\n")
        self.f.flush()

    def close(self, ok: bool) -> None:
        if self.f is sys.stdout:
            return
        self.f.close()
        if ok:
            os.replace(self.tmp, self.path)
        else:
            os.remove(self.tmp)


# ---- main --------------------------------------------------------------------------------------


def predict(args, hub) -> dict:
    """Predict every row; returns the closing summary."""
    from tqdm import tqdm

    policy, exit_layer = args.policy, args.exit_layer
    threshold = hub.check_policy(policy, exit_layer, args.threshold)  # the table's default when none is given
    writer = Writer(args.output, args.format, [] if hub.regression else hub.label_names(), args.force)
    done, skipped, truncated, layer_sum, seconds = 0, 0, 0, 0, 0.0
    ok = False
    bar = tqdm(desc="acl-predict", unit=" inputs", disable=None if args.input != "-" else True, file=sys.stderr)
    try:
        chunk: List[Row] = []
        for item in itertools.chain(read_rows(args), [None]):  # None: flush the last chunk
            if isinstance(item, BadRow):
                if args.strict:
                    raise SystemExit(f"acl-predict: error: {item} (--strict)".replace(", skipped", ""))
                logger.warning("%s", item)
                skipped += 1
                continue
            if item is not None:
                chunk.append(item)
            if chunk and (item is None or len(chunk) >= args.chunk_size):
                t0 = time.perf_counter()
                preds = hub.predict_early_exit([r.texts for r in chunk], policy, threshold, exit_layer,
                                               args.batch_size)
                seconds += time.perf_counter() - t0
                for row, pred in zip(chunk, preds):
                    writer.write(row, pred)
                    layer_sum += pred.exit_layer
                    truncated += pred.truncated
                done += len(chunk)
                bar.update(len(chunk))
                chunk = []
        ok = True
    finally:
        bar.close()
        writer.close(ok)
    num_layers = len(hub.model.encoder.sentence_encoder.layers)
    mean_layer = layer_sum / done if done else None
    return {"examples": done, "skipped": skipped, "truncated": truncated, "seconds": seconds,
            "examples_per_s": done / seconds if seconds else None, "mean_exit_layer": mean_layer,
            "layer_speedup": num_layers / mean_layer if mean_layer else None, "policy": policy,
            "threshold": threshold if policy else None, "exit_layer": exit_layer}


def main(argv: Optional[List[str]] = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.policy is not None and args.threshold is not None:  # its range depends on --policy: checked here
        args.threshold = console.check_threshold(parser, args.policy, args.threshold)
    if args.input != "-" and not os.path.isfile(args.input):
        raise SystemExit(f"acl-predict: error: input file not found: {args.input}")
    if not os.path.isfile(args.checkpoint):
        raise SystemExit(f"acl-predict: error: checkpoint file not found: {args.checkpoint}")
    if args.output != "-" and os.path.exists(args.output) and not args.force:
        raise SystemExit(f"acl-predict: error: {args.output} exists; pass --force to overwrite it")
    from acl_fairseq.inference import hub as hub_mod

    try:
        hub = hub_mod.from_pretrained(os.path.dirname(os.path.abspath(args.checkpoint)),
                                      os.path.basename(args.checkpoint), os.path.abspath(args.data),
                                      tokenizer_file=args.tokenizer)
    except hub_mod.TokenizerNotFound as e:
        raise SystemExit(f"acl-predict: error: {e}") from None
    hub.eval()
    if console.resolve_device(args.device) == "cuda":
        hub.cuda()
    try:
        summary = predict(args, hub)
    except ValueError as e:  # a policy the model cannot run, a bad exit layer
        raise SystemExit(f"acl-predict: error: {e}") from None
    speed = f"{summary['examples_per_s']:.1f} examples/s" if summary["examples_per_s"] else "no examples"
    layers = (f", mean exit layer {summary['mean_exit_layer']:.2f} (layer speed-up {summary['layer_speedup']:.2f}x)"
              if summary["mean_exit_layer"] else "")
    print(f"acl-predict: {summary['examples']} predicted, {summary['skipped']} skipped, {summary['truncated']} "
          f"truncated; {speed}{layers}", file=sys.stderr)
    return summary


def cli_main() -> None:
    console.setup_logging("WARNING")
    main()


if __name__ == "__main__":
    cli_main()
