"""The fairseq plugin as fairseq-train runs it: the multi-exit model, the task sentence_prediction_acl, the
optimizer, bf16 and --compile, monitoring, checkpoints (files, safety, the data dictionary's hash) and the end-to-end
criterion runs."""
from helpers import mark_heavy

# tests that train or start processes without a session model (keeps them out of make test-fast)
MARKS = {}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "training", MARKS)
