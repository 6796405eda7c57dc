"""Hugging Face's side: acl-convert-hf (HF encoders into fairseq), acl-export --format hf, a converted model in
fairseq-train, and training parity with Hugging Face update by update. Tiny random HF models: tests/tiny_hf.py."""
from helpers import mark_heavy

# tests that train or start processes without a session model (keeps them out of make test-fast)
MARKS = {}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "hf", MARKS)
