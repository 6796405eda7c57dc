"""``acl-predict``: raw text to labels, with early exit, from a trained checkpoint.

    acl-predict CHECKPOINT --data DATA_BIN --input FILE|- [--task RTE | --columns 2,3]
        [--policy entropy --threshold 0.3 | --exit-layer L] [--batch-size 32] [--output FILE|-] [--format jsonl|tsv]

Input: a GLUE TSV (``--task``: the task's text columns, header and layout from
``acl_runtime.glue_tasks``), a TSV with ``--columns`` (1-based), JSONL (``{"text": ...,
"text_pair": ..., "id": ...}``), or plain text, one sentence per line. Output, streamed in input order: one
record per input with its id, label (or score), probabilities and exit layer. Without policy flags the
calibrated policy decides when ``acl-evaluate --calibrate`` wrote an exit_policy.json for this checkpoint beside
it (an OUT/onnx folder: its manifest's serving policy), and stderr says so; else, or with ``--policy none``, the
last exit decides, like an ordinary classifier. A bad row (not UTF-8, empty, wrong column count, bad JSON, a null
text) is reported with ``file:line`` and skipped, or stops the run with ``--strict``. Rows of two texts on a model
trained on single texts stop the run with exit status 2 (``acl_runtime.pairing``). The input is
read as a stream (``acl_runtime.inputs``): a large file or a pipe needs no more memory than a chunk. Inputs longer
than the model's positions are cut and counted. The decisions are those of the layer-by-layer engine
acl-evaluate checks, on the same length-sorted batches (``--chunk-size`` inputs are sorted together; the
default holds a GLUE dev set whole).
"""
import argparse
import itertools
import json
import logging
import os
import sys
import textwrap
import time
from typing import List, Optional, Sequence

from acl_runtime import calibration, console, exits, inputs, manifest, pairing, paths
from acl_runtime.console import UsageError, positive_int
from acl_runtime.inputs import BadRow, Row
from acl_runtime.io import atomic

logger = logging.getLogger("acl_runtime.predict")
FORMATS = ("jsonl", "tsv")
EXIT_STATUSES = ("Exit status: 0 when every row was read (bad rows skipped are counted and listed on stderr); "
                 "1 with --strict at the first bad row; 2 for a usage or input error (a missing, binary or "
                 "unreadable file, a damaged checkpoint, an --output that cannot be written), found before "
                 "the model loads where it can be. An --output FILE is complete or absent: it is written to "
                 "FILE.tmpPID and renamed at the end, and removed on any error, Ctrl-C (130) or SIGTERM (143); one "
                 "left by a killed run goes at the next run.")


def _add_input_args(p: argparse.ArgumentParser) -> None:
    """Where the inputs are and how they are read."""
    p.add_argument("--input", required=True, help="input file, or - for standard input")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--task", help="the input is a GLUE TSV of this task (RTE, SST-2, ...): columns and header "
                     "as the GLUE files have them")
    fmt.add_argument("--columns", type=inputs.parse_columns,
                     help="the input is a TSV: the 1-based text column(s), e.g. 2 or 2,3 (a pair)")
    p.add_argument("--input-format", choices=inputs.KINDS, default="auto",
                   help="auto: tsv with --task/--columns; jsonl for *.jsonl and *.ndjson, or where the first line "
                   "is a JSON object with a 'text' (stdin too); else text (one sentence per line)")
    p.add_argument("--header", action="store_true", help="with --columns: the first line is a header")


def _add_exit_args(p: argparse.ArgumentParser) -> None:
    """Where each input leaves the model: a policy and its threshold, or one exit layer."""
    p.add_argument("--policy", choices=calibration.policy_choices(), help="early-exit policy (multi-exit models "
                   f"only). Default: the calibrated one in {calibration.FILE_NAME} beside the checkpoint (acl-evaluate "
                   "--calibrate; for an OUT/onnx folder its manifest's serving policy), else none; none: the last "
                   "exit decides, whatever was calibrated")
    p.add_argument("--threshold", type=float, help="the --policy's threshold (it needs --policy): entropy/confidence "
                   "level or patience count. " + "; ".join(f"{r.name}: {r.rule}, {r.range_text}, default {r.default:g}"
                                         for r in exits.POLICIES.values()))
    p.add_argument("--exit-layer", type=int, help="every input leaves at this exit (one of the model's layers)")


def build_parser() -> argparse.ArgumentParser:
    epilog = "\n\n".join([__doc__.split("\n\n", 2)[2].rstrip(), textwrap.fill(inputs.ID_RULE, 108),
                          textwrap.fill(EXIT_STATUSES, 108)])
    p = argparse.ArgumentParser(prog="acl-predict", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog)
    p.add_argument("checkpoint", help="fine-tuned checkpoint (checkpoint_best.pt of a run), or a folder that "
                   "acl-export --format onnx wrote (OUT/onnx: run by ONNX Runtime, without torch)")
    p.add_argument("--data", help="the binarized folder the model was trained on (dictionaries and the tokenizer "
                   "record: preprocess/glue.py's stats.json, or a converted encoder's folder); required with a "
                   "checkpoint, not with an OUT/onnx folder (it carries its own)")
    p.add_argument("--precision", choices=manifest.PRECISIONS, default="fp32", help="with an OUT/onnx folder: its fp32 "
                   "graphs or the int8 copy that acl-export --quantize int8 wrote (default: %(default)s)")
    _add_input_args(p)
    _add_exit_args(p)
    p.add_argument("--batch-size", type=positive_int, default=32, help="inputs per batch (default: %(default)s)")
    p.add_argument("--chunk-size", type=positive_int, default=8192, help="inputs read and length-sorted together "
                   "before batching; output is written per chunk, in input order (default: %(default)s)")
    p.add_argument("--output", default="-", help="output file (written whole or not at all), or - for standard "
                   "output (default)")
    p.add_argument("--format", choices=FORMATS, default="jsonl", help="output records (default: %(default)s; "
                   "tsv: a tab, line break or backslash in an id is written \\t, \\n, \\r, \\\\)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output")
    p.add_argument("--strict", action="store_true", help="stop at the first bad input row (exit status 1, no "
                   "--output file left) instead of skipping it")
    p.add_argument("--tokenizer", help="stats.json or conventions.json naming the tokenizer, when --data has none")
    console.add_device_argument(p)
    return p




# ---- output ------------------------------------------------------------------------------------


TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def tsv_field(text: str) -> str:
    """A JSONL id may hold a tab or a line break: escaped as \\t, \\n, \\r (and \\ as \\\\, PostgreSQL's text
    format), so that every record stays one line of the same columns."""
    return text.translate(TSV_ESCAPES)


class Writer:
    """Records streamed to stdout (or a device such as /dev/null), or to a temporary file beside ``path`` that
    is renamed over it at the end (atomic). Opened before the model loads, so a bad ``--output`` fails at once."""

    def __init__(self, path: str, fmt: str, force: bool):
        self.path, self.fmt, self.names, self.pending = path, fmt, [], None
        if path == "-":
            self.f = sys.stdout
            return
        check_output(path, force)
        if os.path.exists(path) and not os.path.isfile(path):  # a device or FIFO: nothing to replace atomically
            self.f = open(path, "w", encoding="utf-8")
            return
        try:
            # the package's one atomic write; the temporary keeps the name scripts (and tests) watch for
            self.pending = atomic.Pending(path, tmp=f"{path}.tmp{os.getpid()}")
            self.f = self.pending.file
        except OSError as e:
            folder = os.path.dirname(os.path.abspath(path))
            raise UsageError(f"--output {path}: cannot write in {folder} ({e.strerror}). Fix: choose a folder you "
                             "can write to") from None

    def begin(self, label_names: Sequence[str]) -> None:
        self.names = list(label_names)
        if self.fmt == "tsv":
            self.f.write("\t".join(["id", "label", "exit_layer"] + [f"p_{n}" for n in self.names]) + "\n")

    def write(self, row: Row, pred) -> None:
        if self.fmt == "jsonl":
            rec = {"id": row.id, "label": pred.label, "probabilities": pred.probabilities,
                   "exit_layer": pred.exit_layer, "truncated": pred.truncated}
            self.f.write(json.dumps(rec) + "\n")
        else:
            probs = [f"{pred.probabilities[n]:.6f}" for n in self.names] if pred.probabilities else []
            label = pred.label if isinstance(pred.label, str) else f"{pred.label:.4f}"
            self.f.write("\t".join([tsv_field(row.id), label, str(pred.exit_layer)] + probs) + "\n")
        self.f.flush()

    def close(self, ok: bool) -> None:
        if self.f is sys.stdout:
            return
        if self.pending is None:
            self.f.close()
        elif ok:
            self.pending.commit()
        else:
            self.pending.discard()


def check_output(path: str, force: bool) -> None:
    """Refuse an ``--output`` that cannot be written, before any work."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--output {path} is a folder. Fix: name a file, e.g. {os.path.join(path, 'pred.jsonl')}")
    if os.path.isfile(path) and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it, or choose another --output")
    if not os.path.isdir(folder):
        raise UsageError(f"--output {path}: the folder {folder} does not exist. Fix: create it, or choose another "
                         "--output")


# ---- main --------------------------------------------------------------------------------------


def predict(args, hub, source: inputs.Input, writer: Writer) -> dict:
    """Predict every row of ``source`` into ``writer``; returns the closing summary."""
    request = resolve_policy(args, hub)
    writer.begin([] if hub.regression else hub.label_names())
    done, skipped, truncated, layer_sum, seconds = 0, 0, 0, 0, 0.0
    bar = _progress(args.input == "-")
    try:
        chunk: List[Row] = []
        for item in itertools.chain(source.rows(), [None]):  # None: flush the last chunk
            if isinstance(item, BadRow):
                if args.strict:
                    raise SystemExit(f"acl-predict: error: {item} (--strict)".replace(", skipped", ""))
                logger.warning("%s", item)
                skipped += 1
                continue
            if item is not None:
                chunk.append(item)
            if chunk and (item is None or len(chunk) >= args.chunk_size):
                # a pair on a single-text model, a lone text on a pair model: refused, exit 2 (acl_runtime.pairing)
                pairing.check(hub.texts_per_input, [r.texts for r in chunk], "acl-predict",
                              [f"{source.name}:{r.line}" for r in chunk])
                t0 = time.perf_counter()
                preds = hub.predict_texts([r.texts for r in chunk], request, args.batch_size)
                seconds += time.perf_counter() - t0
                for row, pred in zip(chunk, preds):
                    pred = pred._replace(truncated=True) if row.cut else pred
                    writer.write(row, pred)
                    layer_sum += pred.exit_layer
                    truncated += pred.truncated
                done += len(chunk)
                bar.update(len(chunk))
                chunk = []
    finally:
        bar.close()
    num_layers = hub.num_layers
    mean_layer = layer_sum / done if done else None
    return {"examples": done, "skipped": skipped, "truncated": truncated, "seconds": seconds,
            "examples_per_s": done / seconds if seconds else None, "mean_exit_layer": mean_layer,
            "layer_speedup": num_layers / mean_layer if mean_layer else None, "policy": request.policy,
            "threshold": request.threshold, "exit_layer": request.exit_layer}


def _progress(disable: bool):
    """tqdm's bar on a terminal's stderr; none elsewhere, as tqdm's ``disable=None`` decides, without importing
    tqdm (a third of acl-predict OUT/onnx's start-up), and none where tqdm is not installed (pip install .[serve])."""
    if disable or not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(desc="acl-predict", unit=" inputs", file=sys.stderr)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def resolve_policy(args, hub):
    """The :class:`acl_runtime.loop.ExitRequest` to run, resolved once for the whole input: the flags,
    else the model's calibrated (serving) policy, named on stderr, else the last exit; the threshold is the
    table's default when a policy is given without one."""
    request = hub.resolve_request(args.policy, args.threshold, args.exit_layer, source="flag")
    if args.policy is None and request.policy is not None:
        kind = "calibrated" if hub.serving_policy.get("budget") else "serving"
        print(f"acl-predict: using the {kind} policy {request.policy} {request.threshold:g} from {request.source} "
              f"(--policy {calibration.NO_POLICY}: the last exit)", file=sys.stderr)
    return request


CHECKPOINT_READER = "acl_runtime.checkpoint_reader"  # entry-point group: the training install's checkpoint reader


def checkpoint_reader():
    """The module that reads a fairseq checkpoint (``acl_fairseq.inference.checkpoint_reader`` in a full install),
    found through the :data:`CHECKPOINT_READER` entry point: this package never imports the plugin or torch."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=CHECKPOINT_READER))
    if not found:
        raise UsageError("a checkpoint needs the training install (torch, fairseq and acl_fairseq); this one serves "
                         "exported OUT/onnx folders only: pass such a folder, or install the project with torch")
    try:
        return found[0].load()
    except ModuleNotFoundError as e:
        raise UsageError(f"a checkpoint needs {e.name}, which is not installed here: pass an exported OUT/onnx "
                         "folder (acl-export --format onnx), or install torch and fairseq (README, Set-up)") from None


def load_hub(args):
    """The model behind ``args.checkpoint``, on ``--device``; a damaged file or a missing tokenizer is a
    :class:`UsageError`."""
    return checkpoint_reader().load(args.checkpoint, args.data, args.tokenizer, args.device)


def load_engine(args):
    """An exported OUT/onnx folder in the ONNX Runtime engine (numpy, onnxruntime, tokenizers: no torch)."""
    from acl_runtime import engine

    try:
        return engine.Engine(args.checkpoint, args.precision)
    except (OSError, ValueError, engine.RuntimeMissing) as e:
        raise UsageError(str(e)) from None


def check_files(args) -> None:
    """What can be refused before anything is opened or loaded."""
    if args.input != "-":  # a file, or what a shell hands over: /dev/stdin, <(zcat dev.tsv.gz), a named pipe
        if not os.path.exists(args.input):
            raise UsageError(f"input file not found: {args.input}")
        if os.path.isdir(args.input) or not os.access(args.input, os.R_OK):
            raise UsageError(f"--input {args.input}: {'a folder' if os.path.isdir(args.input) else 'not readable'}, "
                             "not a file. Fix: give a file, or - for standard input")
    # a checkpoint file or an exported OUT/onnx folder (whose manifest the engine checks); else what to pass
    if paths.check(args.checkpoint, (paths.CHECKPOINT, paths.ONNX), "acl-predict") == paths.ONNX:
        return
    if args.data is None:
        raise UsageError("--data is required with a checkpoint: the binarized folder the model was trained on")
    if not os.path.isdir(os.path.join(args.data, "input0")):  # fairseq's error would be a traceback, after loading
        raise UsageError(f"--data {args.data}: not a binarized sentence_prediction folder (no input0/). Fix: pass "
                         "the folder the model was trained on (fairseq-preprocess or acl-preprocess output)")
    checkpoint_reader().check_readable(args.checkpoint)  # torch: only for a checkpoint, never for OUT/onnx


def main(argv: Optional[List[str]] = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    console.check_request_flags(parser, args)
    check_files(args)
    source = inputs.Input(args.input, args.input_format, args.task, args.columns, args.header)
    writer, ok = None, False
    try:
        writer = Writer(args.output, args.format, args.force)
        hub = load_engine(args) if os.path.isdir(args.checkpoint) else load_hub(args)
        # the reader keeps of each text what the model reads (the hub's positions, the ONNX folder's layout)
        source.limit(getattr(hub, "max_positions", None) or hub.layout["max_positions"])
        try:
            summary = predict(args, hub, source, writer)
        except ValueError as e:  # a policy the model cannot run, a bad exit layer
            raise UsageError(str(e)) from None
        ok = True
    finally:  # also on Ctrl-C and SIGTERM (console.run): no partial --output, no temporary left
        if writer is not None:
            writer.close(ok)
        source.close()
    speed = f"{summary['examples_per_s']:.1f} examples/s" if summary["examples_per_s"] else "no examples"
    layers = (f", mean exit layer {summary['mean_exit_layer']:.2f} (layer speed-up {summary['layer_speedup']:.2f}x)"
              if summary["mean_exit_layer"] else "")
    print(f"acl-predict: {summary['examples']} predicted, {summary['skipped']} skipped, {summary['truncated']} "
          f"truncated; {speed}{layers}", file=sys.stderr)
    return summary


def cli_main() -> None:
    console.setup_logging("WARNING")
    console.run("acl-predict", main)


if __name__ == "__main__":
    cli_main()
