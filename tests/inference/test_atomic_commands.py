"""Every command writes through acl_runtime.io.atomic, here the last writers that did not:
acl-preprocess's GPT-2 BPE downloads and local BPE files, and acl-convert-hf's folder. A failure or a signal while
writing leaves the previous file or none, never half of one, and what a killed run left is removed by the next. And
acl-convert-hf refuses an OUT_DIR it cannot write, or a class count below 1, in one line before converting."""
import os
import subprocess

import pytest
import torch

from acl_fairseq.hf import convert as convert_hf
from acl_fairseq.preprocessing import gpt2_files
from acl_runtime.io import atomic
from tiny_hf import write_bert


class Fault(Exception):
    """A signal at one instant of a write."""


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _server(tmp_path):
    """A folder of the three GPT-2 files and its file:// URL (urllib reads it as it reads fairseq's server)."""
    src = tmp_path / "server"
    src.mkdir()
    for name in gpt2_files.GPT2_FILES:
        (src / name).write_bytes(name.encode() * 100_000)  # several 1 MiB blocks
    return src, f"file://{src}/"


def test_a_download_is_whole_or_absent_and_a_killed_ones_temporary_is_removed(tmp_path, monkeypatch):
    src, url = _server(tmp_path)
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    stale = bpe / f".encoder.json.tmp-{_dead_pid()}-0a1b2c3d"  # a download killed mid-way (SIGKILL)
    stale.write_bytes(b"half")
    real_step = atomic._step

    def fault_on_vocab(name):
        if name == "written" and any(e.startswith(".vocab.bpe.tmp-") for e in os.listdir(bpe)):
            raise Fault()
        real_step(name)

    monkeypatch.setattr(atomic, "_step", fault_on_vocab)
    with pytest.raises(Fault):
        gpt2_files.ensure_gpt2_bpe(str(bpe), url)
    assert sorted(os.listdir(bpe)) == ["encoder.json"]  # vocab.bpe absent, not half; no temporary left
    assert (bpe / "encoder.json").read_bytes() == (src / "encoder.json").read_bytes()
    monkeypatch.setattr(atomic, "_step", real_step)
    paths = gpt2_files.ensure_gpt2_bpe(str(bpe), url)
    assert sorted(os.listdir(bpe)) == sorted(gpt2_files.GPT2_FILES)
    assert all(open(p, "rb").read() == (src / n).read_bytes() for n, p in paths.items())


def test_local_bpe_files_leave_no_temporary_folder_in_the_bpe_dir(tmp_path, monkeypatch):
    """They were built in a tempfile folder inside the BPE folder, which a SIGKILL left there for good."""
    made = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: made.append(str(p)) or real_mkdir(p, *a, **k))
    paths = gpt2_files.write_local_gpt2_bpe(str(tmp_path / "bpe"), ["the music was not bad"] * 3, num_merges=20)
    assert made == [str(tmp_path / "bpe")] and sorted(os.listdir(tmp_path / "bpe")) == sorted(paths)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("atomic_hf")
    write_bert(str(root / "hf"))
    return str(root / "hf")


def test_a_conversion_failing_while_saving_keeps_the_previous_model(hf_dir, tmp_path, monkeypatch):
    out = tmp_path / "fs"
    convert_hf.convert(hf_dir, str(out))
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    real_save = torch.save

    def half_then_fault(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        with open(f, "r+b") as g:
            g.truncate(os.path.getsize(f) // 2)
        raise Fault()

    monkeypatch.setattr(torch, "save", half_then_fault)
    with pytest.raises(Fault):
        convert_hf.convert(hf_dir, str(out), num_classes=3)
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before  # no half model.pt, no temporary


def test_every_file_of_a_conversion_goes_through_io_atomic(hf_dir, tmp_path, monkeypatch):
    """README.txt, dict.txt, model_args.txt, model.pt, conventions.json and the tokenizer copies: each renamed
    into place whole (atomic._step "written" once per file)."""
    written = []
    real_step = atomic._step
    monkeypatch.setattr(atomic, "_step", lambda name: written.append(name) or real_step(name))
    result = convert_hf.convert(hf_dir, str(tmp_path / "fs"))
    assert written.count("written") == len(result["files"]) == len(os.listdir(tmp_path / "fs"))


def _one_line_exit_2(exc, capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.splitlines()[-1].startswith("acl-convert-hf: error: "), err
    return err.splitlines()[-1]


def test_an_out_dir_that_cannot_be_written_is_refused_before_converting(hf_dir, tmp_path, capsys, monkeypatch):
    """It was a PermissionError traceback when the first file was written, after the model was read and mapped."""
    monkeypatch.setattr(convert_hf, "convert", lambda *a, **k: pytest.fail("converted"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exc:
        convert_hf.cli_main([hf_dir, str(tmp_path / "file" / "fs")])
    assert _one_line_exit_2(exc, capsys) == (f"acl-convert-hf: error: OUT_DIR {tmp_path}/file/fs: cannot write there "
                                             "(a file is in the way). Fix: choose a folder you can write to")


@pytest.mark.parametrize("classes", ["0", "-3"])
def test_a_class_count_below_one_is_refused(hf_dir, tmp_path, capsys, classes):
    """-3 was a traceback from torch (a negative dimension), 0 a head with no classes."""
    with pytest.raises(SystemExit) as exc:
        convert_hf.cli_main([hf_dir, str(tmp_path / "fs"), "--num-classes", classes])
    assert _one_line_exit_2(exc, capsys).endswith(f"--num-classes must be at least 1, got {classes}")
    assert not os.path.exists(tmp_path / "fs")
