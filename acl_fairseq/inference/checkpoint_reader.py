"""acl-predict's checkpoint path, for :mod:`acl_runtime.predict`: the torch-free runtime finds this module through the
``acl_runtime.checkpoint_reader`` entry point (setup.py) and never imports the plugin itself. An exported OUT/onnx
folder never comes here."""
from acl_fairseq import checkpoint_safety
from acl_fairseq.inference import hub as hub_mod
from acl_runtime.console import UsageError


def check_readable(checkpoint: str) -> None:
    """A damaged or foreign checkpoint, refused before anything loads (a :class:`UsageError`)."""
    try:
        checkpoint_safety.check_readable(checkpoint)
    except checkpoint_safety.CheckpointError as e:
        raise UsageError(str(e)) from None


def load(checkpoint: str, data: str, tokenizer, device: str):
    """The hub interface of ``checkpoint`` in eval mode on ``device`` (:func:`hub.from_checkpoint`, its one opening
    and error policy: a :class:`UsageError`)."""
    return hub_mod.from_checkpoint(checkpoint, data, tokenizer, device)
