"""The house: docs and records agree with the code, the packages' layers, the markers and CI's skip policy, the
set-up scripts (pip wrapper, system packages), and the background builder of the session's models."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_ci_skip_policy.py::test_every_skip": "server",
    "test_ci_skip_policy.py::test_a_pytest_run": "server",
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "house", MARKS)
