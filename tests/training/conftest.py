"""The fairseq plugin as fairseq-train runs it: the multi-exit model, the task sentence_prediction_acl, the
optimizer, bf16 and --compile, monitoring, checkpoints (files, safety, the data dictionary's hash) and the end-to-end
criterion runs."""
