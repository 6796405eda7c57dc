"""acl-evaluate's early-exit table from an HF-trained folder (acl-train-hf's output): the folder read as the checkpoint
it would be, on its GLUE folder binarized in its vocabulary (acl-preprocess --tokenizer wordpiece --vocab), its
classes put in the data's label order; every exit's metrics and an entropy setting's exits are the HF model's own."""
import os
import shutil

import numpy as np
import pytest

from test_hf_serving import early_exit, hf_exit_logits, trained  # noqa: F401  (trained: a fixture)
from test_hf_train_cli import tiny  # noqa: F401  (a fixture, which trained uses)

pytest.importorskip("fairseq")


def test_acl_evaluate_scores_an_hf_folder_as_the_hf_model_does(trained, tiny, tmp_path):  # noqa: F811
    from acl_fairseq.cli import evaluate
    from acl_fairseq.preprocessing import glue
    from acl_fairseq.preprocessing.glue_binarize import label_dictionary_order
    from acl_runtime import glue_tasks

    model, tokenizer, _, folder = trained
    glue_dir, data_bin = tmp_path / "SST-2", str(tmp_path / "SST-2-bin")
    shutil.copytree(tiny[1], glue_dir)
    with open(glue_dir / "train.tsv", "a") as f:  # one more positive: fairseq's label dictionary puts "1" first
        f.write("lovely acting , good film\t1\n")
    glue.main(["--task", "SST-2", "--input", str(glue_dir), "--output", data_bin, "--tokenizer", "wordpiece", "--vocab",
               os.path.join(tiny[0], "vocab.txt"), "--skip-test", "--workers", "1"])
    order = label_dictionary_order(os.path.join(data_bin, "label", "dict.txt"))
    assert order == ["1", "0"]  # not id2label's: the heads' rows are reordered
    result = evaluate.main([folder, data_bin, "--output", str(tmp_path / "eval"), "--timing-repeats", "1"])
    assert result["checkpoint"] == os.path.relpath(folder, tmp_path / "eval")

    examples = glue_tasks.read_split(tiny[1], "dev", glue_tasks.get_task("SST-2"), "dev").examples
    texts, labels = [e.texts[0] for e in examples], np.array([int(e.label) for e in examples])
    logits = hf_exit_logits(model, tokenizer, texts)
    assert [e["layer"] for e in result["per_exit"]] == model.layers
    for m, row in enumerate(result["per_exit"]):
        assert row["metrics"]["accuracy"] == pytest.approx(100 * float((logits[:, m].argmax(1) == labels).mean()))
    entropy = [s for s in result["settings"] if s["policy"] == "entropy"]
    for setting in entropy:
        want = early_exit(model, tokenizer, texts, setting["threshold"])
        assert setting["avg_exit_layer"] == pytest.approx(np.mean([layer for layer, _ in want]))
        assert setting["metrics"]["accuracy"] == pytest.approx(
            100 * float((np.array([p.argmax() for _, p in want]) == labels).mean()))


def test_calibrate_is_refused_on_an_hf_folder(tmp_path, capsys):
    import hf_encoders
    from acl_fairseq.cli import evaluate

    folder = tmp_path / "bert"
    hf_encoders.multi_exit("bert").save_pretrained(str(folder))
    with pytest.raises(SystemExit) as exc:
        evaluate.main([str(folder), str(tmp_path), "--output", str(tmp_path / "eval"), "--calibrate", "max-drop=0.5"])
    assert exc.value.code == 2 and "--calibrate" in capsys.readouterr().err
