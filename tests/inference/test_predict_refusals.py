"""acl-predict's refusals name what was given: a --data folder that is not binarized was a
traceback from fairseq's config after the model loaded, and a --tokenizer file that does not exist was reported as
missing tokenizer information of the data folder."""
import os

import pytest

from acl_runtime import console, predict


def _refused(argv) -> str:
    with pytest.raises(console.UsageError) as e:
        predict.main(argv)
    assert "\n" not in str(e.value) and "Fix:" in str(e.value), str(e.value)
    return str(e.value)


def test_a_data_folder_that_is_not_binarized_is_refused_before_loading(predict_run, tmp_path, monkeypatch):
    _, data, ckpt = predict_run
    monkeypatch.setattr(predict, "load_hub", lambda args: pytest.fail("the model was loaded"))
    (tmp_path / "raw").mkdir()
    message = _refused([ckpt, "--data", str(tmp_path / "raw"), "--input", os.path.join(data, "raw", "valid.input0"),
                        "--output", str(tmp_path / "p.jsonl")])
    assert message.startswith(f"--data {tmp_path / 'raw'}: not a binarized sentence_prediction folder (no input0/)")
    assert not os.path.exists(tmp_path / "p.jsonl")


def test_a_tokenizer_file_that_does_not_exist_is_named(predict_run, tmp_path):
    _, data, ckpt = predict_run
    message = _refused([ckpt, "--data", data, "--tokenizer", str(tmp_path / "stats.json"), "--input",
                        os.path.join(data, "raw", "valid.input0"), "--output", str(tmp_path / "p.jsonl")])
    assert message.startswith(f"--tokenizer {tmp_path / 'stats.json'}: no such file")
