"""The architecture, model flags and input layout of a recipe run (:func:`decide`, called by the run plan,
acl_fairseq/runs/plan.py), and the input-layout flags of anything else.

    python -m acl_fairseq.runs.model_flags flags [--conventions PATH]

``flags`` prints the ``sentence_prediction`` task flags of an encoder's input layout on one line (RoBERTa's
without ``--conventions``; the record's with it): what ``scripts/demo.sh`` and users of plain fairseq-train
pass.

Standard library only, and torch-free at import: the driver runs it with ``python -S`` so that importing the
plugin does not load fairseq (seconds per run).
"""
import argparse
import json
import os
import sys
from typing import List, NamedTuple, Optional, Sequence, Tuple

from acl_runtime import conventions


class RecipeError(Exception):
    """A setting of the driver that cannot work; ``status`` is the exit status (2: a usage error)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


class Decision(NamedTuple):
    arch: str
    task_flags: List[str]  # the input layout's flags, after --task
    model_flags: List[str]  # --arch ARCH and the model flags


def layout_record(path: Optional[str]) -> Optional[dict]:
    """The conventions record at ``path`` (a conventions.json or its folder), read for its layout only."""
    if not path:
        return None
    if os.path.isdir(path):
        path = os.path.join(path, conventions.FILE_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        conventions.input_layout(record)  # refuses an unknown pair format
    except (OSError, ValueError, AttributeError) as e:
        raise RecipeError(f"cannot read the pair format from {path}: {e}") from None
    return record


def task_flags(conventions_path: Optional[str] = None) -> List[str]:
    """The task flags that build inputs as the encoder at ``conventions_path`` (None: RoBERTa) expects."""
    return conventions.input_layout(layout_record(conventions_path)).fairseq_flags()


def read_model_args(model_args: str, checkpoint: Optional[str]) -> Tuple[List[str], Optional[str]]:
    """``(flags, file)``: MODEL_ARGS, else the first line of the converter's model_args.txt beside the
    checkpoint (acl-convert-hf), else none."""
    if model_args.strip():
        return model_args.split(), None
    path = os.path.join(os.path.dirname(checkpoint), "model_args.txt") if checkpoint else None
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.readline().split(), path
    return [], None


def last_value(flags: Sequence[str], name: str) -> Optional[str]:
    """The value of the last ``name`` among ``flags`` (argparse keeps the last one)."""
    idx = [i for i, a in enumerate(flags[:-1]) if a == name]
    return flags[idx[-1] + 1] if idx else None


def choose_arch(model: str, exits: str, from_file: bool, converted: bool) -> str:
    """The method's architecture: multi-exit methods and converted encoders (whose conventions only
    multi_exit_roberta holds) get multi_exit_roberta; sizes from model_args.txt take the generic arch."""
    size = "" if from_file else model
    if exits == "multi" or converted:
        return f"multi_exit_roberta_{size}" if size else "multi_exit_roberta"
    return "roberta_large" if size == "large" else "roberta"  # fairseq's "roberta" is the base size


def decide(model: str, exits: str, method: str, arch: str = "", model_args: str = "",
           checkpoint: Optional[str] = None, exit_layers: str = "", exit_pooling: str = "") -> Decision:
    """The architecture, model flags and input layout of one recipe run (see finetune.sh's settings)."""
    flags, args_file = read_model_args(model_args, checkpoint)
    if "--arch" in flags or any(a.startswith("--arch=") for a in flags):
        raise RecipeError(f"model flags {args_file or 'MODEL_ARGS'} hold --arch, which the method chooses: "
                          "remove it (or set ARCH)")
    beside = os.path.join(os.path.dirname(checkpoint), conventions.FILE_NAME) if checkpoint else None
    converted = beside if beside and os.path.isfile(beside) else None
    arch = arch or choose_arch(model, exits, args_file is not None, converted is not None)
    multi_arch = arch.startswith("multi_exit_roberta")
    if exits == "multi" and not multi_arch:
        raise RecipeError(f"method '{method}' needs a multi-exit architecture (multi_exit_roberta*), "
                          f"not ARCH={arch}", 2)
    if multi_arch:
        if exits == "single" and "--exit-layers" not in flags:  # one exit, on the top layer
            exit_layers = exit_layers or last_value(flags, "--encoder-layers") or ""
        flags += ["--exit-layers", exit_layers] if exit_layers else []
        flags += ["--exit-pooling", exit_pooling] if exit_pooling else []
        if converted and "--conventions" not in flags:
            flags += ["--conventions", converted]
    # the layout follows the record the model is built with (an explicit --conventions wins)
    record_path = (last_value(flags, "--conventions") if multi_arch else None) or converted
    return Decision(arch, task_flags(record_path), ["--arch", arch, *flags])


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m acl_fairseq.runs.model_flags",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    flags = sub.add_parser("flags", help="print the fairseq-train task flags of an input layout on one line")
    flags.add_argument("--conventions", metavar="PATH", help="a converted encoder's conventions.json or its "
                       "folder (acl-convert-hf); default: fairseq's RoBERTa layout")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        print(" ".join(task_flags(args.conventions)))
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
