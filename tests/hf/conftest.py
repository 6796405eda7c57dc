"""Hugging Face's side: acl-convert-hf (HF encoders into fairseq), acl-export --format hf, a converted model in
fairseq-train, and training parity with Hugging Face update by update. Tiny random HF models: tests/tiny_hf.py."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_convert_hf.py": "fairseq",
    "test_export.py": "fairseq",
    "test_converted_training.py": "fairseq",
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "hf", MARKS)
