"""``acl-export``: a trained (multi-exit) checkpoint out of fairseq, for serving.

    acl-export CHECKPOINT --data DATA_BIN --output OUT [--format hf] [--policy entropy --threshold 0.3] [--force]
    acl-export HF_FOLDER --output OUT --format onnx [--quantize int8 --data GLUE_DIR]   # acl-train-hf's output

The early-exit policy recorded for serving (OUT/hf's ``early_exit.json``, OUT/onnx's manifest, which
``acl-predict OUT/onnx`` applies when given no policy) is ``--policy``/``--threshold``; without them, the one
``acl-evaluate --calibrate`` wrote for this checkpoint (``exit_policy.json`` beside it, copied as ``calibration``);
without that, or with ``--policy none``, none: the last exit decides.

``--format hf`` writes ``OUT/hf/``: a standard ``BertForSequenceClassification`` (a model fine-tuned from a
converted BERT) or ``RobertaForSequenceClassification`` (a fairseq or converted RoBERTa) folder that
``transformers.pipeline("text-classification", model="OUT/hf")`` loads: ``config.json`` (labels from the data
folder's label dictionary, LayerNorm eps 1e-5 as fairseq trained), ``model.safetensors`` (the last exit as the
classifier), the tokenizer files, ``exit_heads.safetensors`` and ``early_exit.json`` (the other exits, the
policy, the input layout) and a model card ``README.md`` (training command, labels, per-exit validation
metrics). How weights, positions and the segment embedding map: :mod:`acl_fairseq.hf.export_weights`; the
tokenizer: :mod:`acl_fairseq.hf.export_tokenizer`. What HF cannot compute exactly (mean-pooled exits, a
tokenizer kind without an HF equivalent, ...) is refused with the reason, never exported approximately.

OUT is built in a temporary folder beside it and renamed into place at the end; it is removed on an error,
Ctrl-C or SIGTERM. An existing OUT is refused without ``--force``. Every refusal is one line and exit status
2, made before the model loads where it can be (flags, an OUT that cannot be written, the data folder, the
checkpoint); a disk that fills or a folder that turns read-only during the export is one line too, and Ctrl-C
exits 130. A regression model (STS-B) needs no ``label/dict.txt``.

An HF-trained multi-exit folder (acl-train-hf's output, a BERT or RoBERTa encoder) needs no binarized ``--data`` (its
GLUE folder is ``--data`` for ``--quantize int8`` alone): it becomes the fairseq run it would have been
(:mod:`acl_fairseq.hf.multi_exit_folder`, in a temporary folder: labels from ``id2label``, the vocabulary from its
tokenizer) and is exported to ONNX by the same code (it is a transformers folder already); another encoder is refused
naming why.
"""
import argparse
import errno
import logging
import os
import shutil
import signal
import sys
import tempfile
from typing import Callable, Dict, List, Optional

from acl_fairseq.hf import export_tokenizer
from acl_fairseq.hf.export_tokenizer import ExportError
from acl_runtime import calibration, console, glue_tasks, paths, request, tokenization
from acl_runtime.console import UsageError
from acl_runtime.io import atomic

logger = logging.getLogger("acl_fairseq.hf.export")
PROG = "acl-export"


def write_hf(ctx: "Context", out_dir: str) -> List[str]:
    from acl_fairseq.hf import hf_folder

    return hf_folder.write(ctx, out_dir)


def write_onnx(ctx: "Context", out_dir: str) -> List[str]:
    from acl_fairseq.hf import onnx_export

    return onnx_export.write(ctx, out_dir)


# format -> writer(ctx, folder); one folder OUT/<format> each
FORMATS: Dict[str, Callable] = {"hf": write_hf, "onnx": write_onnx}
# --quantize: onnx_quantize.SCHEMES' names (not imported here: flags are checked before onnx loads)
QUANTIZE = ("int8", "int8-dynamic")


class Context:
    """What every format writer reads: the arguments, the loaded hub model and the checkpoint's cfg."""

    def __init__(self, args, hub, cfg):
        self.args, self.hub, self.cfg = args, hub, cfg


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0].strip("`: ").split(": ", 1)[-1],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("checkpoint", help="fine-tuned checkpoint (checkpoint_best.pt of a run), or a folder of an "
                   "HF-trained multi-exit model (acl-train-hf's --output_dir)")
    p.add_argument("--data", help="the binarized folder the model was trained on (its dictionaries, label names and "
                   "tokenizer record: preprocess/glue.py's stats.json with the tokenizer files); required with a "
                   "checkpoint. With an HF folder (which carries its own): the GLUE folder it was trained on "
                   "(acl-train-hf's --data_dir), read by --quantize int8 alone, to calibrate on its train.tsv")
    p.add_argument("--output", required=True, metavar="OUT", help="output folder; each format goes to OUT/<format>/")
    p.add_argument("--format", nargs="+", choices=tuple(FORMATS), default=["hf"],
                   help="what to write (default: %(default)s): hf = a transformers folder, onnx = graphs that "
                   "acl-predict OUT/onnx and acl_runtime run with ONNX Runtime, without torch")
    p.add_argument("--quantize", choices=QUANTIZE, help="onnx: also write an int8 copy of each layer (acl-predict "
                   "--precision int8). int8: static scales calibrated on 512 rows of DATA's training split, so a "
                   "row's answer does not depend on its batch; int8-dynamic: activations scaled per call, so a row's "
                   "answer can change with the rows that share its batch (for data without a training split)")
    p.add_argument("--policy", choices=calibration.policy_choices(), help="early-exit policy recorded for serving "
                   f"(default: the calibrated one in {calibration.FILE_NAME} beside the checkpoint, else none; none: "
                   "the last exit decides, whatever was calibrated)")
    p.add_argument("--threshold", type=float,
                   help="the policy's threshold, in its range (default: the policy's default in exits.POLICIES)")
    p.add_argument("--metrics-split", default="valid", help="split whose per-exit metrics go in the model card "
                   "(default: %(default)s; 'none' skips them; an HF folder has no binarized split: none)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size of the metrics pass (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace existing OUT/<format>/ folders (the rest of "
                   "OUT is left alone)")
    p.add_argument("--tokenizer", help="stats.json or conventions.json naming the tokenizer, when --data has none")
    return p


def check_flags(args) -> None:
    """The flags alone, before any file is read."""
    for fmt in set(args.format):
        if args.format.count(fmt) > 1:
            raise UsageError(f"--format {fmt} is given {args.format.count(fmt)} times: name each format once")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size}: the metrics pass needs a whole number >= 1")
    if args.quantize and "onnx" not in args.format:
        raise UsageError("--quantize applies to --format onnx: add it")


def check_out(args) -> None:
    """OUT: a folder (or a path that can become one) this process can write in, without the formats' folders
    unless ``--force``. Writing is tried (a probe file, removed at once): permission bits say nothing for root,
    nor for a read-only or immutable mount."""
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise UsageError(f"--output {args.output} is a file: give a folder (each format goes to OUT/<format>/)")
    for fmt in args.format:
        if os.path.exists(os.path.join(args.output, fmt)) and not args.force:
            raise UsageError(f"{os.path.join(args.output, fmt)} exists; pass --force to replace it")
    try:  # the nearest existing folder is where the first write happens
        atomic.probe_folder(args.output)
    except NotADirectoryError as e:
        raise UsageError(f"--output {args.output}: {e.filename} is a file, not a folder; pass another --output") \
            from None
    except OSError as e:
        folder = os.path.dirname(e.filename) if e.filename else args.output
        raise UsageError(f"--output {args.output}: cannot write in {folder} ({e.strerror or e}); pass an --output "
                         "you can write to") from None


def check_data(args, cfg: Dict) -> None:
    """The binarized folder: its dictionaries (no label dictionary for a regression model: STS-B's data has
    none)."""
    task = cfg.get("task")
    regression = bool(task.get("regression_target") if hasattr(task, "get") else
                      getattr(task, "regression_target", False))
    for sub in ("input0",) if regression else ("input0", "label"):
        if not os.path.isfile(os.path.join(args.data, sub, "dict.txt")):
            raise UsageError(f"{os.path.join(args.data, sub, 'dict.txt')} not found: --data must be the binarized "
                             "folder the model was trained on")


def format_problems(args, cfg: Dict) -> Dict[str, List[str]]:
    """Why each format (every one acl-export writes, asked for or not) cannot be written from this checkpoint,
    data and flags: ``{format: [reasons]}``, an empty list where it can."""
    problems: Dict[str, List[str]] = {fmt: [] for fmt in FORMATS}
    split, input0 = args.metrics_split, os.path.join(args.data, "input0")
    if args.quantize == "int8" and not getattr(args, "calibration_texts", None) and \
            not os.path.isfile(os.path.join(input0, "train.bin")):
        problems["onnx"].append(f"--quantize int8 calibrates on the training split, and "
                                f"{os.path.join(input0, 'train.bin')} is missing: pass the --data folder the model "
                                "was trained on, or --quantize int8-dynamic (batch-dependent)")
    if split != "none" and not os.path.isfile(os.path.join(input0, f"{split}.bin")):
        found = sorted(n[: -len(".bin")] for n in os.listdir(input0) if n.endswith(".bin"))
        problems["hf"].append(f"--metrics-split {split}: {os.path.join(input0, split + '.bin')} not found; pass one "
                              f"of the folder's splits ({', '.join(found) or 'none binarized'}) or none")
    try:
        record = tokenization.read(args.data)
    except ValueError as e:  # a malformed stats.json: no format can be written
        raise UsageError(str(e)) from None
    from acl_fairseq.hf import export_weights

    model_args = cfg.get("model")
    get = model_args.get if isinstance(model_args, dict) else lambda k, d=None: getattr(model_args, k, d)
    try:  # what HF's standard classifier cannot express (the ONNX graphs run any exit)
        if record is not None:
            export_tokenizer.family_of(record)
        export_weights.check_model_args(model_args, get("exit_pooling", "cls") or "cls")
    except ExportError as e:
        problems["hf"].append(str(e))
    return problems


def refuse_formats(asked: List[str], problems: Dict[str, List[str]]) -> None:
    """Every asked format that cannot be written, why, and what can be: one line before anything is written."""
    bad = [fmt for fmt in asked if problems[fmt]]
    if not bad:
        return
    why = "; ".join(f"--format {fmt} cannot be written: {'; '.join(problems[fmt])}" for fmt in bad)
    works = [fmt for fmt in FORMATS if not problems[fmt]]
    fix = (f"--format {' '.join(works)} can: pass it alone" if works else "no format can be written with these flags")
    if "hf" in bad:
        fix += " (hf needs a model fine-tuned from a converted BERT or RoBERTa: docs/hf_import.md)"
    raise UsageError(f"{why}. Nothing was written. Fix: {fix}")


def precheck(args) -> Dict:
    """Everything that can be checked before the model is built; returns the checkpoint's cfg."""
    check_flags(args)
    check_out(args)
    paths.check(args.checkpoint, (paths.CHECKPOINT,), PROG)  # a run's folder, an export, a missing file: what instead
    cfg = read_cfg(args.checkpoint)
    check_data(args, cfg)
    try:  # what the flags alone get wrong (acl_runtime.request), before the model loads
        request.resolve(None, args.policy, args.threshold)
    except ValueError as e:
        raise UsageError(str(e)) from None
    refuse_formats(args.format, format_problems(args, cfg))  # every format checked before any is written
    return cfg


def read_cfg(checkpoint: str) -> Dict:
    """The checkpoint's cfg through the package's one config reader (:func:`checkpoint_safety.read_cfg`: its safe
    loader, memory-mapped where the file's format allows it; a legacy file, which acl-predict and acl-evaluate
    read, is read whole)."""
    import acl_fairseq  # noqa: F401  (allowlists fairseq's checkpoint types for the safe loader)
    from acl_fairseq import checkpoint_safety

    try:
        return checkpoint_safety.read_cfg(checkpoint)
    except checkpoint_safety.CheckpointError as e:  # a truncated, foreign or unsafe file: named, with the fix
        raise UsageError(str(e)) from None


def load_hub(args):
    from acl_fairseq.inference import hub as hub_mod

    return hub_mod.from_checkpoint(args.checkpoint, args.data, args.tokenizer)  # its refusals are UsageErrors


def serving_policy(args, hub) -> None:
    """Settle ``args.policy``/``args.threshold`` (None: the last exit) and ``args.calibration`` (the
    exit_policy.json record they came from, or None), which every format writer records."""
    args.calibration = None
    if args.policy is None and hub.calibrated is not None and hub.calibrated.get("error"):
        raise UsageError(hub.calibrated["error"])  # an unreadable exit_policy.json decides only without --policy
    if args.policy is None and hub.calibrated is not None:
        args.calibration = {k: v for k, v in hub.calibrated.items() if k != "source"}
        print(f"{PROG}: recording the calibrated policy {hub.calibrated['policy']} {hub.calibrated['threshold']:g} "
              f"from {hub.calibrated['source']} (--policy {calibration.NO_POLICY}: the last exit)", file=sys.stderr)
    try:  # the one resolution of the run: the flags, else the calibrated record, checked against the model's exits
        resolved = hub.resolve_request(args.policy, args.threshold, None, source="flag")
    except ValueError as e:  # a policy on a single-exit model
        raise UsageError(str(e)) from None
    args.policy, args.threshold = resolved.policy, resolved.threshold


class _Terminated(Exception):
    """SIGTERM, turned into an exception so that the temporary folder is removed on the way out."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def write_atomically(out: str, force: bool, build: Callable[[str], None]) -> None:
    """Run ``build(tmp)`` on a fresh folder inside ``out``, then put each folder it wrote at ``out/<name>``,
    replacing only those (:func:`acl_runtime.io.atomic.replace_folder`: swap, then delete, so that a signal at any
    instant leaves the previous export or the new one): whatever else ``out`` holds (the run's checkpoint, another
    format) is left alone, as HF's ``save_pretrained`` leaves it. On an error or SIGTERM nothing is placed, and an
    ``out`` made here goes. Temporaries of killed runs (``.export.tmp-PID-*``) are removed first."""
    created = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    for name in ("export", *FORMATS):  # what killed runs left: .export.tmp-*, .onnx.old-* put back
        atomic.clean_stale(out, name)
    tmp = atomic.temp_path(os.path.join(out, "export"))
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        os.mkdir(tmp)
        build(tmp)
        names = sorted(os.listdir(tmp))
        for name in names:  # checked before anything is replaced
            if os.path.exists(os.path.join(out, name)) and not force:  # appeared while we worked
                raise UsageError(f"{os.path.join(out, name)} exists; pass --force to replace it")
        for name in names:
            atomic.replace_folder(os.path.join(tmp, name), os.path.join(out, name))
        shutil.rmtree(tmp, ignore_errors=True)
    except _Terminated:
        _discard(tmp, out, created)
        raise SystemExit(128 + signal.SIGTERM) from None
    except BaseException:
        _discard(tmp, out, created)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _discard(tmp: str, out: str, created: bool) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    if created:
        try:
            os.rmdir(out)  # only if empty: nothing was placed in it
        except OSError:
            pass


def export(args) -> Dict:
    """Check, load, write every format; returns ``{format: [files]}``."""
    from acl_fairseq.hf import multi_exit_folder

    if not multi_exit_folder.is_multi_exit(args.checkpoint):
        if args.data is None:
            raise UsageError("--data is required with a checkpoint: pass the binarized folder the model was trained on")
        return export_run(args)
    if "hf" in args.format:
        raise UsageError(f"--format hf: {args.checkpoint} is a transformers folder already (import acl_hf, then "
                         "AutoModelForSequenceClassification loads it); pass --format onnx")
    args.metrics_split = "none"
    check_flags(args)
    check_out(args)
    with tempfile.TemporaryDirectory(prefix="acl-export-hf-") as tmp:
        try:
            if args.data is not None or args.quantize == "int8":  # its GLUE folder: what static int8 calibrates on
                args.calibration_texts = multi_exit_folder.training_texts(args.checkpoint, args.data, args.quantize)
            args.weights = multi_exit_folder.weights_file(args.checkpoint)
            args.checkpoint, args.data = multi_exit_folder.materialize(args.checkpoint, tmp)
        except (multi_exit_folder.UnsupportedCheckpointError, multi_exit_folder.CheckpointError,
                glue_tasks.GlueDataError) as e:  # named, with the fix
            raise UsageError(str(e)) from None
        return export_run(args)


def export_run(args) -> Dict:
    """:func:`export` of a fairseq run's checkpoint and data folder."""
    cfg = precheck(args)
    hub = load_hub(args)
    serving_policy(args, hub)
    ctx = Context(args, hub, cfg)
    written: Dict[str, List[str]] = {}

    def build(tmp: str) -> None:
        for fmt in args.format:
            folder = os.path.join(tmp, fmt)
            os.makedirs(folder)
            written[fmt] = FORMATS[fmt](ctx, folder)

    try:
        write_atomically(args.output, args.force, build)
    except ExportError as e:
        raise UsageError(str(e)) from None
    except OSError as e:  # the disk filled, or OUT turned read-only, after the checks: nothing was placed
        raise UsageError(_os_error(e, args.output)) from None
    return written


def _os_error(e: OSError, out: str) -> str:
    where = e.filename or out
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space or pass an --output on another disk"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "pass an --output you can write to"
    else:
        fix = "fix that and export again"
    return f"{where}: {e.strerror or e} while writing the export; nothing was placed in {out}: {fix}"


def _interrupted(error: BaseException) -> bool:
    """Ctrl-C, even where a library wrapped it into its own error (torch's exporter raises TorchExportError
    from the KeyboardInterrupt)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def main(argv: Optional[List[str]] = None) -> Dict:
    args = build_parser().parse_args(argv)
    try:
        written = export(args)
    except (KeyboardInterrupt, Exception) as e:
        if not _interrupted(e):
            raise
        print(f"{PROG}: interrupted: nothing was placed in {args.output} (the temporary folder is removed)",
              file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
    for fmt, files in written.items():
        print(f"{PROG}: wrote {os.path.join(args.output, fmt)}: {', '.join(files)}", file=sys.stderr)
    return written


def cli_main() -> None:
    console.setup_logging("WARNING")
    for name in ("onnxscript", "torch.onnx"):  # the exporter's notes on every graph (skipped foldings)
        logging.getLogger(name).setLevel(logging.ERROR)
    console.run(PROG, main)


if __name__ == "__main__":
    cli_main()

