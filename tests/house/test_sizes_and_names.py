"""Files a reader can hold (docs/architecture.md, "Sizes and names"): no function over 40 lines and no module over
400 but the listed ones, each with its reason, and no one-letter module alias but ``torch.nn.functional as F``."""
import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
CODE = ["acl_fairseq", "acl_runtime", "acl_torch", "acl_hf", "benchmarks", "preprocess", "recipes", "scripts"]
MOST_LINES, MOST_MODULE_LINES, MOST_LONG_FUNCTIONS = 40, 400, 8
ARGPARSE = "an argparse builder: a list of flags, read top to bottom"
LONG_FUNCTIONS = {  # path::function -> why it stays longer than 40 lines
    "acl_fairseq/cli/evaluate.py::build_parser": ARGPARSE,
    "acl_runtime/serve/cli.py::build_parser": ARGPARSE,
    "benchmarks/serve_load.py::parse_args": ARGPARSE,
}
LONG_MODULES: dict = {}


def _python_files(roots):
    for root in roots:
        yield from sorted((REPO / root).rglob("*.py"))


def _functions(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def test_no_function_over_40_lines_but_the_listed_ones():
    long = {f"{path.relative_to(REPO)}::{name}": lines for path in _python_files(CODE)
            for name, lines in _functions(path) if lines > MOST_LINES}
    assert not set(long) - set(LONG_FUNCTIONS), {k: long[k] for k in set(long) - set(LONG_FUNCTIONS)}
    # a listed function that got shorter leaves the list, so that the list says what is left
    assert not set(LONG_FUNCTIONS) - set(long), sorted(set(LONG_FUNCTIONS) - set(long))
    assert len(LONG_FUNCTIONS) <= MOST_LONG_FUNCTIONS


def test_no_module_over_400_lines_but_the_listed_ones():
    long = {str(path.relative_to(REPO)) for path in _python_files(CODE + ["tests"])
            if len(path.read_text(encoding="utf-8").splitlines()) > MOST_MODULE_LINES}
    assert long == set(LONG_MODULES), (sorted(long - set(LONG_MODULES)), sorted(set(LONG_MODULES) - long))


def _one_letter_aliases(path):
    """``path:line: module as X`` of each one-letter alias but torch.nn.functional as F."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                full = f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom) else alias.name
                if alias.asname and len(alias.asname) == 1 and (alias.asname, full) != ("F", "torch.nn.functional"):
                    yield f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno}: " \
                          f"{full} as {alias.asname}"


def test_no_one_letter_module_alias_but_torch_functional_as_f():
    found = [hit for path in _python_files(CODE + ["tests"]) for hit in _one_letter_aliases(path)]
    assert not found, found


def test_the_checks_see_what_they_check(tmp_path):
    """The walks find a long function and an alias where they are: a walk that found nothing would pass anything."""
    path = tmp_path / "m.py"
    path.write_text("import numpy as N\nimport torch.nn.functional as F\nfrom acl_runtime import exits as E\n\n\n"
                    "def f():\n" + "    x = 1\n" * 40)
    assert dict(_functions(path)) == {"f": 41}
    assert [hit.split(": ")[1] for hit in _one_letter_aliases(path)] == ["numpy as N", "acl_runtime.exits as E"]
    assert sum(1 for _ in _python_files(["acl_runtime"])) > 20
