"""The maths and the criteria: every loss against its slow reference (tests/loss_references.py), every
criterion's total and gradient against METHOD.md, ACL-Grad's gate (gradients, mixed precision, across ranks), the
self-distillation baseline, and the properties the mutation runs found unchecked. `make mutation` selects its
tests from this folder (pyproject.toml)."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_criterions.py": "fairseq",
    "test_criterion_totals.py": "fairseq",
    "test_criterion_wiring.py": "fairseq",
    "test_criterion_properties.py": "fairseq",
    "test_grad_conflict.py": "fairseq",
    "test_kd.py": "fairseq",
    "test_precision.py": "fairseq",
    "test_distributed.py": "fairseq",
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "criterions", MARKS)
