"""The fairseq plugin as fairseq-train runs it: the multi-exit model, the task sentence_prediction_acl, the
optimizer, bf16 and --compile, monitoring, checkpoints (files, safety, the data dictionary's hash) and the end-to-end
criterion runs."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_acceleration.py": "fairseq",
    "test_checkpoint_files.py": "fairseq",
    "test_checkpoint_safety.py": "fairseq",
    "test_data_dictionary.py": "fairseq",
    "test_models.py": "fairseq",
    "test_monitoring.py": "fairseq",
    "test_optim.py": "fairseq",
    "test_task.py": "fairseq",
    "test_train_smoke.py": "fairseq",
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "training", MARKS)
