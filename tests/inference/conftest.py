"""From a trained checkpoint to answers: acl-predict and acl-evaluate, the ONNX export and its int8 copy against
the torch engine, calibrated thresholds, FLOPs, and the commands' refusals and atomic outputs."""
from helpers import mark_heavy

# tests that train or start processes without a session model (keeps them out of make test-fast)
MARKS = {}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "inference", MARKS)
