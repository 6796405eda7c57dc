"""acl_fairseq: ACL and SCL fine-tuning criteria and a multi-exit RoBERTa, as a fairseq --user-dir plugin.

fairseq imports ``tasks/`` and ``models/`` of a user dir by itself but not ``criterions/``, so this
file imports all three explicitly, with what else fairseq looks up in its registries: the ``adamw_torch``
optimizer (``optim/``) and the ``acl_wordpiece`` BPE (``bpe.py``, what a converted BERT's hub tokenizes
with). Importing it also allowlists the types that fairseq checkpoints pickle, so that ``torch.load``'s
default ``weights_only=True`` (torch >= 2.6) can read them. The tools (``evaluate``, ``predict``, ``hub``,
``convert_hf``, ``preprocessing/``, ...) are imported by their commands only, never at training time.
"""
from . import checkpoint_safety  # noqa: F401  (first: before anything loads a checkpoint)

checkpoint_safety.allow_fairseq_checkpoints()

from . import bpe, criterions, models, optim, tasks  # noqa: E402,F401
