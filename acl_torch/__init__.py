"""acl_torch: the torch maths of ACL, SCL and the multi-exit model, the one home that both trainers call.

The fairseq plugin (:mod:`acl_fairseq`) and the Hugging Face Trainer path (:mod:`acl_hf`) sit side by side on top of
this package; it imports torch and :mod:`acl_runtime` only, never fairseq, transformers or either trainer
(docs/architecture.md). :mod:`acl_torch.objective` turns every exit's outputs and the targets into a criterion's loss.
"""
