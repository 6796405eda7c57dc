"""acl_hf: ACL, SCL and the multi-exit model in Hugging Face's Trainer, for any encoder, without fairseq.

Importing it registers :class:`MultiExitConfig` and :class:`MultiExitForSequenceClassification` with ``AutoConfig``
and ``AutoModelForSequenceClassification``, so that ``from_pretrained(folder)`` reloads a saved model without
``trust_remote_code``. The maths is :mod:`acl_torch`'s, the one home the fairseq plugin calls too; this package
imports neither fairseq nor :mod:`acl_fairseq` (docs/architecture.md, docs/hf_trainer.md).
"""
from transformers import AutoConfig, AutoModelForSequenceClassification

from .configuration import MODEL_TYPE, MultiExitConfig
from .modeling import MultiExitForSequenceClassification, MultiExitOutput

AutoConfig.register(MODEL_TYPE, MultiExitConfig, exist_ok=True)
AutoModelForSequenceClassification.register(MultiExitConfig, MultiExitForSequenceClassification, exist_ok=True)

__all__ = ["MultiExitConfig", "MultiExitForSequenceClassification", "MultiExitOutput"]
