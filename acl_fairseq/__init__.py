"""acl_fairseq: ACL and SCL fine-tuning criteria and a multi-exit RoBERTa, as a fairseq --user-dir plugin.

The layout follows what runs when (docs/architecture.md):

- training (what ``--user-dir acl_fairseq`` loads): ``criterions/``, ``models/``, ``tasks/``, ``optim/``
  and their helpers at the top level: a fairseq model read as the exits' shape (``heads``), ``bpe``,
  ``projector`` and ``checkpoint_safety``; the maths they run (losses, the gate, the gather, GLUE's metrics) is
  :mod:`acl_torch`'s, which the Hugging Face path calls too;
- tools, imported by their commands only: ``cli/`` (acl-evaluate, acl-help, acl-tune), ``inference/`` (the
  torch early-exit engine and the hub), ``hf/`` (acl-convert-hf, acl-export), ``preprocessing/`` (acl-preprocess).

What needs neither torch nor fairseq (the early-exit policies, the input layout and tokenizers, the ONNX
runtime, acl-predict and acl-serve) is the package :mod:`acl_runtime`, which this one imports and which never
imports it back.

fairseq imports ``tasks/`` and ``models/`` of a user dir by itself but not ``criterions/``, so this file
imports them explicitly, with what else fairseq looks up in its registries: the ``adamw_torch`` optimizer
and the ``acl_wordpiece`` BPE (what a converted BERT's hub tokenizes with). Importing it also allowlists
the types that fairseq checkpoints pickle, so that ``torch.load``'s default ``weights_only=True``
(torch >= 2.6) can read them. Where fairseq is not installed nothing is registered.
"""
try:
    import fairseq  # noqa: F401
except ModuleNotFoundError as e:  # an install without torch or fairseq: nothing to register
    if e.name not in ("fairseq", "torch"):
        raise
else:
    from . import checkpoint_safety  # (first: before anything loads a checkpoint)

    checkpoint_safety.allow_fairseq_checkpoints()

    from . import bpe, criterions, models, optim, tasks  # noqa: F401
