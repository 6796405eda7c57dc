"""The benchmarks: the harness, every script at a toy size, their records and outputs, and README's claims
recomputed from the committed records. No timing is asserted here."""
from helpers import mark_heavy

# tests that train or start processes without a session model (keeps them out of make test-fast)
MARKS = {}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "benchmarks", MARKS)
