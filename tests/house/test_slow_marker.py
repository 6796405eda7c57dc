"""The slow marker's wiring: make test leaves the slow tests out (pytest.ini), make test-slow runs only them, and
CI runs both. Without it make test would take twice its 10 minutes, or CI would never run the slow tests."""
import configparser
import os
import re
import shlex

from helpers import REPO


def _pytest_args(target: str) -> list:
    """The arguments after ``pytest`` in one Makefile target's recipe (``$(PY) -m pytest ARGS``)."""
    text = open(os.path.join(REPO, "Makefile")).read()
    block = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", text, flags=re.M)
    assert block, f"no {target} target in the Makefile"
    words = shlex.split(block.group(1))
    return words[words.index("pytest") + 1:]


def test_the_default_selection_leaves_the_slow_tests_out():
    ini = configparser.ConfigParser()
    ini.read(os.path.join(REPO, "pytest.ini"))
    addopts = shlex.split(ini["pytest"]["addopts"])
    assert addopts[addopts.index("-m") + 1] == "not slow", addopts
    assert "-m" not in _pytest_args("test")  # make test keeps pytest.ini's selection


def test_make_test_slow_selects_only_the_slow_tests_and_ci_runs_both():
    # a later -m wins over pytest.ini's addopts, which pytest puts first
    assert _pytest_args("test-slow")[-2:] == ["-m", "slow"]
    ci = [line.split("#")[0].strip() for line in open(os.path.join(REPO, ".ci", "run"))]
    assert "make test" in ci and "make test-slow" in ci
