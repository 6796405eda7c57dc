"""The house: docs and records agree with the code, the packages' layers, the markers and CI's skip policy, the
set-up scripts (pip wrapper, system packages), and the background builder of the session's models."""
from helpers import mark_heavy

# tests that train or start processes without a session model (keeps them out of make test-fast)
MARKS = {}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "house", MARKS)
