"""The maths and the criteria: every loss against its slow reference (tests/loss_references.py), every
criterion's total and gradient against METHOD.md, ACL-Grad's gate (gradients, mixed precision, across ranks), the
self-distillation baseline, and the properties the mutation runs found unchecked. `make mutation` selects its
tests from this folder (pyproject.toml)."""
