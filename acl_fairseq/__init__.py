"""acl_fairseq: ACL and SCL fine-tuning criteria and a multi-exit RoBERTa, as a fairseq --user-dir plugin.

The layout follows what runs when:

- training (what ``--user-dir acl_fairseq`` loads): ``criterions/``, ``models/``, ``tasks/``, ``optim/``
  and their helpers at the top level: the maths (``losses``, ``exits``, ``gradients``, ``alignment``), the
  exits' heads (``heads``), ``distributed``, the encoder's input conventions and layout (``conventions``,
  ``tokenization``, ``bpe``), ``glue_metrics``, ``projector`` and ``checkpoint_safety``;
- tools, imported by their commands only: ``cli/`` (acl-evaluate, acl-predict, acl-help), ``inference/``
  (the early-exit engine and the hub), ``hf/`` (acl-convert-hf), ``preprocessing/`` (acl-preprocess).

fairseq imports ``tasks/`` and ``models/`` of a user dir by itself but not ``criterions/``, so this file
imports them explicitly, with what else fairseq looks up in its registries: the ``adamw_torch`` optimizer
and the ``acl_wordpiece`` BPE (what a converted BERT's hub tokenizes with). Importing it also allowlists
the types that fairseq checkpoints pickle, so that ``torch.load``'s default ``weights_only=True``
(torch >= 2.6) can read them. Without torch and fairseq (a serving runtime) nothing is registered, and the
modules that need neither (``conventions``, which builds a model's inputs) still import.
"""
import os as _os
import sys as _sys


def _serving_only() -> bool:
    """acl-predict on an exported OUT/onnx folder, and acl-serve always (its --help, and its workers: multiprocessing
    gives them the parent's argv before this import), run on onnxruntime alone: registering with fairseq would
    import torch and fairseq (5 s and 300 MB) that they never use."""
    argv = _sys.argv
    command = _os.path.basename(argv[0] if argv else "")
    return command == "acl-serve" or (command == "acl-predict" and any(
        _os.path.isfile(_os.path.join(a, "manifest.json")) for a in argv[1:] if not a.startswith("-")))


try:
    if _serving_only():
        raise ModuleNotFoundError("a serving command registers nothing", name="fairseq")
    import fairseq  # noqa: F401
except ModuleNotFoundError as e:  # a runtime without torch or fairseq: nothing to register
    if e.name not in ("fairseq", "torch"):
        raise
else:
    from . import checkpoint_safety  # (first: before anything loads a checkpoint)

    checkpoint_safety.allow_fairseq_checkpoints()

    from . import bpe, criterions, models, optim, tasks  # noqa: F401
