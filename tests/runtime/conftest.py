"""acl_runtime, the torch-free bottom: exit policies, the exit-request rule, the early-exit loop and the refill
scheduler, tokenization and the input layout, atomic files, the console, the ONNX folder's manifest, and the rule
that two engines' exits are compared by (tests/exit_parity.py)."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_runtime_imports.py::test_importing_the_plugin": "fairseq",
    "test_tokenization.py::test_hub_": "fairseq",
    "test_tokenization.py::test_checkpoint_bpe": "fairseq",
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "runtime", MARKS)
