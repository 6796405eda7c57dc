"""acl-export's refusals and failures: one line and exit status 2 (130 on Ctrl-C), never a traceback, and nothing
left behind; a regression model and a legacy-format checkpoint are exported, not refused.

Most cases run on the tiny toy model of conftest.py (whitespace tokens: ONNX only) with the format's writer
replaced, so that the failure happens where a real export's would, after the model has loaded.
"""
import errno
import json
import os

import pytest
import torch

import helpers
from acl_fairseq.hf import export, onnx_tokenizer


@pytest.fixture
def model(predict_run):
    """(checkpoint, data) of the session's tiny trained model."""
    _, data, ckpt = predict_run
    return ckpt, data


def _export_refused(argv, capsys, *words):
    err = helpers.refusal(export.main, argv, export.PROG)
    assert all(w in err for w in words), err
    return err


@pytest.mark.parametrize("flags, words", [
    (["--format", "onnx", "onnx"], ["--format onnx is given 2 times"]),
    (["--batch-size", "0"], ["--batch-size 0", ">= 1"]),
    (["--metrics-split", "nosuch"], ["--metrics-split nosuch", "nosuch.bin not found", "train, valid", "none"]),
])
def test_bad_flags_are_one_line_before_the_model_loads(model, tmp_path, capsys, monkeypatch, flags, words):
    ckpt, data = model
    monkeypatch.setattr(export, "load_hub", lambda args: pytest.fail("the model was loaded"))
    _export_refused([ckpt, "--data", data, "--output", str(tmp_path / "out"), *flags], capsys, *words)
    assert os.listdir(tmp_path) == []


def test_the_console_script_prints_a_refusal_once(model, tmp_path):
    ckpt, data = model
    proc = helpers.run_tool("acl-export", [ckpt, "--data", data, "--output", str(tmp_path / "out"), "--format", "onnx",
                                           "onnx"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "acl-export: error: --format onnx is given 2 times: name each format once"], proc.stderr


def test_an_out_that_cannot_be_written_is_refused_before_the_model_loads(model, tmp_path, capsys, monkeypatch):
    """A read-only folder (as root, which ignores permission bits: /sys, see helpers.unwritable_folder), and a file
    where a folder of OUT's path is expected. (An immutable folder fails the same write probe; not made here.)"""
    ckpt, data = model
    monkeypatch.setattr(export, "load_hub", lambda args: pytest.fail("the model was loaded"))
    read_only = helpers.unwritable_folder(tmp_path)
    for out in (read_only, os.path.join(read_only, "new")):
        _export_refused([ckpt, "--data", data, "--output", out, "--format", "onnx"], capsys,
                        f"--output {out}: cannot write in {read_only}", "pass an --output you can write to")
        assert not os.path.exists(os.path.join(read_only, "new"))
    (tmp_path / "notes.txt").write_text("a file")
    out = str(tmp_path / "notes.txt" / "out")
    _export_refused([ckpt, "--data", data, "--output", out, "--format", "onnx"], capsys,
                    "notes.txt is a file, not a folder")


def _failing_writer(raise_):
    def write(ctx, folder):
        with open(os.path.join(folder, "layer0.onnx"), "wb") as f:
            f.write(b"part of a graph")
        raise_(os.path.join(folder, "layer1.onnx"))
    return write


def _full(path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def _read_only(path):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)


@pytest.mark.parametrize("raise_, words", [(_full, ["No space left on device", "free some space"]),
                                           (_read_only, ["Read-only file system", "an --output you can write to"])])
def test_a_write_failing_during_the_export_is_one_line_and_keeps_the_previous_export(model, tmp_path, capsys,
                                                                                     monkeypatch, raise_, words):
    ckpt, data = model
    out = tmp_path / "out"
    (out / "onnx").mkdir(parents=True)
    (out / "onnx" / "manifest.json").write_text("the previous export")
    monkeypatch.setitem(export.FORMATS, "onnx", _failing_writer(raise_))
    argv = [ckpt, "--data", data, "--format", "onnx"]
    _export_refused(argv + ["--output", str(out), "--force"], capsys, "layer1.onnx", *words,
                    f"nothing was placed in {out}")
    assert os.listdir(out) == ["onnx"] and (out / "onnx" / "manifest.json").read_text() == "the previous export"
    fresh = tmp_path / "fresh"
    _export_refused(argv + ["--output", str(fresh)], capsys, *words)
    assert not fresh.exists() and sorted(os.listdir(tmp_path)) == ["out"]  # an OUT made by the export goes with it


def _ctrl_c(path):
    raise KeyboardInterrupt


def _wrapped_ctrl_c(path):  # torch's exporter wraps what interrupts it
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as e:
        raise RuntimeError("TorchExportError: Failed to export the model ... submit a PR to PyTorch") from e


@pytest.mark.parametrize("raise_", [_ctrl_c, _wrapped_ctrl_c])
def test_ctrl_c_during_the_export_is_one_line_exit_130_and_leaves_nothing(model, tmp_path, capsys, monkeypatch,
                                                                          raise_):
    ckpt, data = model
    monkeypatch.setitem(export.FORMATS, "onnx", _failing_writer(raise_))
    with pytest.raises(SystemExit) as exc:
        export.main([ckpt, "--data", data, "--output", str(tmp_path / "out"), "--format", "onnx"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 130 and err.splitlines() == [f"acl-export: interrupted: nothing was placed in "
                                                           f"{tmp_path / 'out'} (the temporary folder is removed)"]
    assert os.listdir(tmp_path) == []


def test_a_legacy_format_checkpoint_passes_the_precheck(model, tmp_path, capsys):
    """torch's pre-zip format, which acl-predict and acl-evaluate read: the cfg is read whole instead of mmap'd."""
    ckpt, data = model
    legacy = tmp_path / "legacy.pt"
    torch.save(torch.load(ckpt, weights_only=True, map_location="cpu"), legacy, _use_new_zipfile_serialization=False)
    args = export.build_parser().parse_args([str(legacy), "--data", data, "--output", str(tmp_path / "out"), "--format",
                                             "onnx"])
    cfg = export.precheck(args)
    assert cfg["model"].arch == "multi_exit_roberta" and capsys.readouterr().err == ""


@pytest.mark.slow  # make test's 10 minutes: an export served over HTTP, about 7 s (test_serve_models serves one)
def test_a_regression_model_exports_and_serves_its_values(regression_run, tmp_path):
    from acl_fairseq.inference import hub
    from acl_runtime import engine

    ckpt, data = regression_run
    out = tmp_path / "out"
    export.main([ckpt, "--data", data, "--output", str(out), "--format", "onnx"])
    manifest = json.load(open(out / "onnx" / "manifest.json"))
    assert manifest["regression"] is True and manifest["labels"] is None
    texts = helpers.raw_split(data)[0][:6]
    model = hub.from_pretrained(os.path.dirname(ckpt), os.path.basename(ckpt), data).eval()
    expected = [p.label for p in model.predict_early_exit(texts)]
    got = [p.label for p in engine.Engine(str(out / "onnx")).predict_early_exit(texts)]
    assert len(set(round(v, 4) for v in expected)) > 1  # values, not one constant
    assert got == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("kind,files", [("gpt2", {"encoder_json": "e.json", "vocab_bpe": "v.bpe"}),
                                        ("sentencepiece", {"model": "m.model"})])
def test_a_tokenizer_kind_without_an_exact_file_is_refused(kind, files):
    with pytest.raises(onnx_tokenizer.ExportError, match=f"tokenizer is '{kind}': the ONNX export writes wordpiece, "
                       "hf_byte_bpe and whitespace tokenizers only"):
        onnx_tokenizer.build_json({"kind": kind, "files": files, "lowercase": False}, ".", None)
