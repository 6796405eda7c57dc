"""The benchmarks: the harness, every script at a toy size, their records and outputs, and README's claims
recomputed from the committed records. No timing is asserted here."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_benchmarks.py": "fairseq",
    "test_records.py": "fairseq",
    "test_serve_load.py": "alone",
    "test_serve_hey.py": "alone",
    "test_serve_speed.py": "server",
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "benchmarks", MARKS)
