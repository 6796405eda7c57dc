"""The tools' shared logging set-up and device flag."""
import argparse
import logging

import pytest
import torch

from acl_fairseq.inference import hub
from acl_runtime import console


def parser():
    p = argparse.ArgumentParser()
    console.add_device_argument(p)
    return p


def test_device_flag_defaults_to_auto_and_has_one_spelling():
    assert parser().parse_args([]).device == "auto"
    assert parser().parse_args(["--device", "cuda"]).device == "cuda"
    for argv in (["--device", "gpu"], ["--cpu"]):  # --cpu: the old spelling, gone before a release
        with pytest.raises(SystemExit):
            parser().parse_args(argv)


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hub.resolve_device("auto") == "cpu" and hub.resolve_device("cpu") == "cpu"
    with pytest.raises(console.UsageError, match="CUDA is not available here") as e:  # prog: error: ..., exit 2
        hub.resolve_device("cuda")
    assert e.value.code == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hub.resolve_device("auto") == "cuda"


def test_setup_logging_reads_loglevel_and_replaces_an_earlier_configuration(monkeypatch):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logging.basicConfig(level=logging.DEBUG, force=True)  # what importing fairseq does
        monkeypatch.setenv("LOGLEVEL", "error")
        console.setup_logging("INFO")
        assert root.level == logging.ERROR and root.handlers[0].formatter._fmt == console.LOG_FORMAT
        monkeypatch.delenv("LOGLEVEL")
        console.setup_logging("WARNING")
        assert root.level == logging.WARNING and logging.getLogger("hydra").level == logging.WARNING
    finally:
        root.handlers[:], root.level = saved[0], saved[1]


def test_one_exit_policy_bad_input_2_interrupt_130_a_returned_status_kept(capsys):
    def interrupted():
        raise KeyboardInterrupt

    def refused():
        raise FileNotFoundError("x.pt not found")

    for main, refusals, code in [(interrupted, (), 130), (refused, (FileNotFoundError,), 2), (lambda: 3, (), 3)]:
        with pytest.raises(SystemExit) as e:
            console.run("acl-x", main, refusals)
        assert e.value.code == code
    assert "acl-x: interrupted" in capsys.readouterr().err
    console.run("acl-x", lambda: 0)  # 0 and None: a normal end
    with pytest.raises(FileNotFoundError):  # not one of the command's refusals: a traceback, as a bug should
        console.run("acl-x", refused)


def test_every_command_starts_through_the_one_policy():
    """Each console script's cli_main calls console.run (acl-serve's and acl-predict's included)."""
    import ast
    import importlib
    from importlib.metadata import entry_points

    scripts = [e for e in entry_points(group="console_scripts") if e.value.startswith(("acl_fairseq", "acl_runtime"))]
    assert len(scripts) >= 8
    for e in scripts:
        module = importlib.import_module(e.value.split(":")[0])
        tree = ast.parse(open(module.__file__).read())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == e.value.split(":")[1])
        calls = {ast.unparse(c.func) for c in ast.walk(fn) if isinstance(c, ast.Call)}
        assert "console.run" in calls, (e.name, calls)
