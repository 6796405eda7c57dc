# Every target creates/checks the virtual environment first (scripts/setup_env.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: env demo test test-fast test-slow lint mutation clean

env:
	@bash scripts/setup_env.sh

demo: env
	@bash scripts/demo.sh

# two phases: every test on both cores (pytest-xdist; tests/prebuilt.py trains the session's models once for both
# workers), but those with real processes under signals or load, which run after it alone, as their timing bounds
# were set on a machine with a core to spare (marker alone: tests/heavy_tests.tsv)
test: env
	@$(PY) -m pytest -q -n 2 -m "not slow and not alone"
	@$(PY) -m pytest -q -m "not slow and alone"

# the edit loop: no fairseq model trained or built, no server or other long-lived process (markers fairseq and server:
# tests/conftest.py and tests/heavy_tests.tsv), under a minute on 2 cores
test-fast: env
	@$(PY) -m pytest -q -n 2 -m "not slow and not fairseq and not server"

test-slow: env
	@$(PY) -m pytest -q -m slow

# ruff (lint and import order, settings in pyproject.toml); installed by scripts/setup_env.sh
lint: env
	@$(VENV)/bin/ruff check .

# Mutation score of the criteria and the losses (docs/tests.md, "Mutation score"); not part of `make test`.
# mutmut is pinned in requirements-mutation.txt and installed here only. A fresh run each time (mutants/ is
# its working copy), one worker, niced: two hours or more on 2 shared cores. The summary ends the output.
mutation: env
	@$(PY) -m pip install --disable-pip-version-check -q -r requirements-mutation.txt
	rm -rf mutants
	COVERAGE_RCFILE=$(CURDIR)/mutation.coveragerc OMP_NUM_THREADS=1 nice -n 19 $(VENV)/bin/mutmut run --max-children 1
	@$(VENV)/bin/mutmut results
	@$(VENV)/bin/mutmut export-cicd-stats && cat mutants/mutmut-cicd-stats.json

clean:
	rm -rf demo_out
