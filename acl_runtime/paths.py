"""What a path given to a command is, and what to pass instead: the one place that reads a mistaken path.

Every command that takes a model calls :func:`check` with the kinds it reads: a fairseq checkpoint (a ``.pt``
file: acl-predict, acl-evaluate, acl-export) or an exported ONNX folder (``OUT/onnx`` with its
``manifest.json``: acl-predict, acl-serve). What else it may be is told apart here (a run's checkpoint folder,
an export's ``manifest.json``, acl-export's ``OUT``, a Hugging Face folder) and refused in one line that names
the path to pass instead.
"""
import glob
import os
from typing import Sequence, Tuple

from acl_runtime.console import UsageError

MANIFEST = "manifest.json"  # an exported folder's manifest (acl_runtime.manifest.MANIFEST is this name)
CHECKPOINT, ONNX = "checkpoint", "onnx"
WANTS = {CHECKPOINT: "a checkpoint file (a run's checkpoint_best.pt)",
         ONNX: "a folder that acl-export --format onnx wrote (OUT/onnx)"}


def classify(path: str) -> Tuple[str, str]:
    """``(kind, the path it points to)``: ``checkpoint`` (a file), ``onnx`` (an exported folder), ``manifest``
    (its manifest.json: the folder), ``export`` (acl-export's OUT: OUT/onnx), ``run`` (a folder of checkpoints:
    its checkpoint_best.pt, else its newest .pt), ``hf`` (a transformers folder), ``folder``, ``missing``."""
    if not os.path.exists(path):
        return "missing", path
    if os.path.isfile(path):
        if os.path.basename(path) == MANIFEST:
            return "manifest", os.path.dirname(path) or "."
        return CHECKPOINT, path
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return ONNX, path
    if os.path.isfile(os.path.join(path, "onnx", MANIFEST)):
        return "export", os.path.join(path, "onnx")
    best = os.path.join(path, "checkpoint_best.pt")
    found = [best] if os.path.isfile(best) else sorted(glob.glob(os.path.join(path, "*.pt")), key=os.path.getmtime)
    if found:
        return "run", found[-1]
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf", path
    return "folder", path


def check(path: str, accepts: Sequence[str], prog: str) -> str:
    """The kind of ``path`` (one of ``accepts``: :data:`CHECKPOINT`, :data:`ONNX`), else a :class:`UsageError`
    saying what it is and what to pass."""
    kind, target = classify(path)
    if kind in accepts:
        return kind
    wants = " or ".join(WANTS[k] for k in accepts)

    def export_it(checkpoint: str) -> str:
        return f"acl-export {checkpoint} --data DATA --output OUT --format onnx writes one; then {prog} OUT/onnx"

    if kind == "missing":
        raise UsageError(f"{path}: no such file or folder. Fix: pass {wants}")
    if kind == "manifest" and ONNX in accepts:
        raise UsageError(f"{path} is an export's manifest. Fix: pass its folder, {target}")
    if kind == "export" and ONNX in accepts:
        raise UsageError(f"{path} is acl-export's OUT folder. Fix: pass {target}")
    if kind == "run" and CHECKPOINT in accepts:
        raise UsageError(f"{path} is a folder of checkpoints. Fix: pass the file, {target}")
    if kind == "run":
        raise UsageError(f"{path} is a folder of checkpoints; {prog} reads {wants}: {export_it(target)}")
    if kind == CHECKPOINT:
        raise UsageError(f"{path} is a file; {prog} reads {wants}: {export_it(path)}")
    if kind in (ONNX, "manifest", "export"):
        raise UsageError(f"{path} is an exported ONNX model; {prog} reads {wants}: pass the checkpoint it was "
                         "exported from")
    if kind == "hf":
        raise UsageError(f"{path} is a Hugging Face folder (config.json); {prog} reads {wants}. Fix: pass that "
                         "(acl-convert-hf turns a Hugging Face encoder into a checkpoint to train)")
    raise UsageError(f"{path} is a folder with neither a checkpoint (.pt) nor {MANIFEST}. Fix: pass {wants}")
