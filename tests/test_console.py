"""The tools' shared logging set-up and device flag."""
import argparse
import logging

import pytest
import torch

from acl_fairseq.inference import checkpoint_reader
from acl_runtime import console


def parser():
    p = argparse.ArgumentParser()
    console.add_device_argument(p)
    return p


def test_device_flag_defaults_to_auto_and_keeps_the_deprecated_cpu_switch():
    assert parser().parse_args([]).device == "auto"
    assert parser().parse_args(["--device", "cuda"]).device == "cuda"
    assert parser().parse_args(["--cpu"]).device == "cpu"  # the old spelling still works
    with pytest.raises(SystemExit):
        parser().parse_args(["--device", "gpu"])


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert checkpoint_reader.resolve_device("auto") == "cpu" and checkpoint_reader.resolve_device("cpu") == "cpu"
    with pytest.raises(console.UsageError, match="CUDA is not available here") as e:  # prog: error: ..., exit 2
        checkpoint_reader.resolve_device("cuda")
    assert e.value.code == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert checkpoint_reader.resolve_device("auto") == "cuda"


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
