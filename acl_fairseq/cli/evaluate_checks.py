"""acl-evaluate's checks made before the model loads: each refusal one line with exit status 2, before the work."""
import argparse
import os

from acl_runtime import console, paths


def precheck(parser: argparse.ArgumentParser, args) -> None:
    """What can be refused before the model loads, each in one line with exit status 2 (a traceback after the
    model loaded, or after the whole sweep for an unwritable --output, before): flags out of range, a split the
    data folder lacks, an output folder this process cannot write in."""
    for flag, value, least in (("--batch-size", args.batch_size, 1), ("--timing-repeats", args.timing_repeats, 1),
                               ("--timing-examples", args.timing_examples, 0),
                               ("--max-examples", 1 if args.max_examples is None else args.max_examples, 1)):
        if value < least:
            parser.error(f"{flag} must be at least {least}, got {value}")
    if args.test_split and not args.predictions_dir:
        parser.error("--test-split needs --predictions-dir")
    paths.check(args.checkpoint, (paths.CHECKPOINT,), "acl-evaluate")  # a folder, an export: what to pass
    input0 = os.path.join(args.data_bin, "input0")
    if os.path.isdir(input0):  # else load_model names what is missing
        have = sorted(name[: -len(".idx")] for name in os.listdir(input0) if name.endswith(".idx"))
        for flag, split in [("--split", args.split)] + [("--test-split", s) for s in args.test_split or []]:
            if split not in have:
                raise console.UsageError(f"{flag} {split}: {input0} has no such split (it has {', '.join(have)}). "
                                         "Fix: pass one of those, or binarize that split into the folder")
    for flag, folder in (("--output", args.output), ("--predictions-dir", args.predictions_dir)):
        if folder:
            check_writable_folder(flag, folder)


def check_writable_folder(flag: str, folder: str) -> None:
    """Refuse ``folder`` unless this process can create it (or files in it), without creating anything
    (:func:`atomic.probe_folder`: permission bits say nothing for root, nor for a read-only mount)."""
    from acl_runtime.io import atomic

    try:
        atomic.probe_folder(folder)
    except OSError as e:
        raise console.UsageError(f"{flag} {folder}: cannot write there ({e.strerror or e}). Fix: choose a folder "
                                 "you can write to") from None
