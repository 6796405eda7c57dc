# Every target creates/checks the virtual environment first (scripts/setup_env.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: env demo test test-slow lint clean

env:
	@bash scripts/setup_env.sh

demo: env
	@bash scripts/demo.sh

test: env
	@$(PY) -m pytest -q

test-slow: env
	@$(PY) -m pytest -q -m slow

# ruff (lint and import order, settings in pyproject.toml); installed by scripts/setup_env.sh
lint: env
	@$(VENV)/bin/ruff check .

clean:
	rm -rf demo_out
