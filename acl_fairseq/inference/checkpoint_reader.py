"""acl-predict's checkpoint path, for :mod:`acl_runtime.predict`: the torch-free runtime finds this module through the
``acl_runtime.checkpoint_reader`` entry point (setup.py) and never imports the plugin itself. An exported OUT/onnx
folder never comes here."""
import os

import torch

from acl_fairseq import checkpoint_safety
from acl_fairseq.inference import hub as hub_mod
from acl_runtime import calibration
from acl_runtime.console import UsageError


def resolve_device(device: str) -> str:
    """'cpu' or 'cuda' for a --device value; asking for CUDA where there is none is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but CUDA is not available here: pass --device cpu or auto")
    return device


def check_readable(checkpoint: str) -> None:
    """A damaged or foreign checkpoint, refused before anything loads (a :class:`UsageError`)."""
    try:
        checkpoint_safety.check_readable(checkpoint)
    except checkpoint_safety.CheckpointError as e:
        raise UsageError(str(e)) from None


def load(checkpoint: str, data: str, tokenizer, device: str):
    """The hub interface of ``checkpoint`` in eval mode on ``device``; a damaged file or a missing tokenizer is a
    :class:`UsageError`."""
    try:
        hub = hub_mod.from_pretrained(os.path.dirname(os.path.abspath(checkpoint)), os.path.basename(checkpoint),
                                      os.path.abspath(data), tokenizer_file=tokenizer)
    except (hub_mod.TokenizerNotFound, checkpoint_safety.CheckpointError,
            checkpoint_safety.DictionaryMismatch, calibration.RecordError) as e:
        raise UsageError(str(e)) from None
    hub.eval()
    if resolve_device(device) == "cuda":
        hub.cuda()
    return hub
