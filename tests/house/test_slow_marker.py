"""The markers' wiring: make test leaves the slow tests out and runs every other test exactly once, in its two
phases (all but the servers on both cores, then the servers alone); make test-fast is a part of it; make test-slow
runs only the slow tests; CI runs make test and make test-slow. Without it make test would take twice its 10
minutes, a test could fall between the phases, or CI would never run the slow tests."""
import configparser
import itertools
import os
import re
import shlex

from _pytest.mark.expression import Expression

from helpers import REPO

MARKERS = ("slow", "fairseq", "server", "alone")


def _pytest_calls(target: str) -> list:
    """Each ``$(PY) -m pytest ARGS`` line of one Makefile target's recipe, as its ARGS."""
    text = open(os.path.join(REPO, "Makefile")).read()
    block = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", text, flags=re.M)
    assert block, f"no {target} target in the Makefile"
    calls = [shlex.split(line) for line in block.group(1).splitlines() if " pytest" in line]
    return [words[words.index("pytest") + 1:] for words in calls]


def _selects(args: list, marks: set) -> bool:
    """Whether a pytest call with ``args`` runs a test carrying ``marks`` (a later -m wins over pytest.ini's)."""
    expression = args[len(args) - 1 - args[::-1].index("-m") + 1] if "-m" in args else _ini_selection()
    return Expression.compile(expression).evaluate(lambda name, **_: name in marks)


def _ini_selection() -> str:
    ini = configparser.ConfigParser()
    ini.read(os.path.join(REPO, "pytest.ini"))
    addopts = shlex.split(ini["pytest"]["addopts"])
    return addopts[addopts.index("-m") + 1]


def _every_marking():
    """Every set of markers a test can carry ("alone" comes with "server": helpers.mark_heavy)."""
    for k in range(len(MARKERS) + 1):
        yield from (set(c) for c in itertools.combinations(MARKERS, k) if "alone" not in c or "server" in c)


def test_the_default_selection_leaves_the_slow_tests_out():
    assert _ini_selection() == "not slow"


def test_make_test_runs_every_test_but_the_slow_ones_exactly_once():
    calls = _pytest_calls("test")
    assert len(calls) == 2 and "-n" in calls[0] and "-n" not in calls[1]  # the second phase runs alone
    for marks in _every_marking():
        runs = sum(_selects(args, marks) for args in calls)
        assert runs == (0 if "slow" in marks else 1), (marks, runs)
        if "slow" not in marks:
            assert _selects(calls[1], marks) == ("alone" in marks), marks


def test_a_marked_test_carries_what_its_mark_implies(tmp_path):
    import pathlib

    from helpers import mark_heavy

    class Item:
        def __init__(self, path, name):
            self.path, self.name, self.marks = pathlib.Path(REPO, "tests", path), name, []

        def add_marker(self, mark):
            self.marks.append(mark)

    table = tmp_path / "heavy.tsv"
    table.write_text("# a comment\ntest\tmark\nserve/test_a.py\talone\nserve/test_b.py::test_y\tfairseq\n")
    items = [Item("serve/test_a.py", "test_x"), Item("serve/test_b.py", "test_y_1"), Item("serve/test_b.py", "test_z"),
             Item("hf/test_a.py", "test_x")]
    mark_heavy(items, str(table))
    assert [i.marks for i in items] == [["server", "alone"], ["fairseq"], [], []]


def test_every_row_of_the_heavy_tests_table_names_a_test_file_there_is():
    from acl_runtime.tables import read_tsv
    from helpers import HEAVY_TESTS

    rows = read_tsv(HEAVY_TESTS, ["test", "mark"])
    assert rows and all(os.path.isfile(os.path.join(REPO, "tests", r["test"].partition("::")[0])) for r in rows)
    assert {r["mark"] for r in rows} <= {"fairseq", "server", "alone"}


def test_make_test_fast_is_a_part_of_make_test_without_fairseq_or_servers():
    (fast,) = _pytest_calls("test-fast")
    for marks in _every_marking():
        assert _selects(fast, marks) == (not marks), marks


def test_make_test_slow_selects_only_the_slow_tests_and_ci_runs_both():
    (slow,) = _pytest_calls("test-slow")
    assert slow[-2:] == ["-m", "slow"]
    ci = [line.split("#")[0].strip() for line in open(os.path.join(REPO, ".ci", "run"))]
    assert "make test" in ci and "make test-slow" in ci
