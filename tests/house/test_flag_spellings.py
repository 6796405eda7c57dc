"""One spelling per flag (docs/architecture.md, "Sizes and names"): every console script of setup.py names its
output ``--output`` (acl-predict's and acl-preprocess's spelling, acl-export's and acl-evaluate's since), and the
int8 benchmarks name qemu's CPU model ``--qemu-cpu`` (``--cpu`` is fairseq-train's "no GPU")."""
import argparse
import importlib
import re

import pytest

from helpers import REPO

OLD_OUTPUT_SPELLINGS = {"--out", "--out-dir"}  # acl-train-hf's --output_dir is transformers' own (TrainingArguments)


class _Parsed(Exception):
    """Raised by the parse the entry point starts: carries its parser, before anything else runs."""


def _entry_points():
    text = open(f"{REPO}/setup.py", encoding="utf-8").read()
    return re.findall(r'"(acl-[a-z-]+)=([\w.]+):(\w+)"', text)


def _flags(entry, monkeypatch) -> set:
    """Every option string of the parser ``entry`` builds, read as it starts to parse (its own, or HF's)."""
    def caught(self, *args, **kwargs):
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", caught)
    monkeypatch.setattr("sys.argv", ["prog"])
    with pytest.raises(_Parsed) as got:
        entry()
    return {s for action in got.value.args[0]._actions for s in action.option_strings}


def test_the_entry_points_are_read():
    assert {name for name, _, _ in _entry_points()} >= {"acl-evaluate", "acl-export", "acl-predict",
                                                         "acl-preprocess", "acl-serve"}


@pytest.mark.parametrize("name,module,function", _entry_points(), ids=lambda v: v if v.startswith("acl-") else "")
def test_a_console_scripts_output_is_spelled_output(name, module, function, monkeypatch):
    flags = _flags(getattr(importlib.import_module(module), function), monkeypatch)
    assert "--help" in flags  # the parser was reached
    assert not flags & OLD_OUTPUT_SPELLINGS, f"{name}: {sorted(flags & OLD_OUTPUT_SPELLINGS)}: spell it --output"


@pytest.mark.parametrize("name,entry", [("int8_portability", "main"), ("int8_static", "parse_args")])
def test_the_int8_benchmarks_name_qemus_cpu_model_qemu_cpu(name, entry, monkeypatch):
    flags = _flags(getattr(importlib.import_module(name), entry), monkeypatch)
    assert "--qemu-cpu" in flags and "--cpu" not in flags


def test_evaluate_and_export_write_where_output_says():
    from acl_fairseq.cli import evaluate
    from acl_fairseq.hf import export

    assert evaluate.build_parser().parse_args(["c.pt", "d", "--output", "o"]).output == "o"
    assert export.build_parser().parse_args(["c.pt", "--output", "o"]).output == "o"


def test_the_results_collector_writes_where_output_says(monkeypatch):
    """recipes/collect_results.py (the runs' table, called by the recipe runner and benchmarks/quality.py) too."""
    from test_collect_results import load_collector

    collector = load_collector()
    flags = _flags(lambda: collector.main([]), monkeypatch)
    assert "--output" in flags and not flags & OLD_OUTPUT_SPELLINGS
