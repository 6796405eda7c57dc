"""acl_runtime, the torch-free bottom: exit policies, the exit-request rule, the early-exit loop and the refill
scheduler, tokenization and the input layout, atomic files, the console, the ONNX folder's manifest, and the rule
that two engines' exits are compared by (tests/exit_parity.py)."""
from helpers import mark_heavy

# tests that train or start processes without a session model (keeps them out of make test-fast)
MARKS = {}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "runtime", MARKS)
