"""``--task sentence_prediction_acl`` as a drop-in for fairseq's ``sentence_prediction``: validation
keeps every example, replayed batches are marked for the criterion, and the stock task gets clear
start-up messages where it cannot do the same."""
import logging

import pytest

import helpers
from test_criterions import build


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("task") / "data"))["data"]  # 24 valid examples


def _valid_examples(task, multiple):
    """Examples in one validation epoch, batched as the trainer batches them (5 per batch)."""
    itr = task.get_batch_iterator(
        dataset=task.dataset("valid"), max_sentences=5, required_batch_size_multiple=multiple,
        max_positions=64, ignore_invalid_inputs=False, disable_iterator_cache=True,
    ).next_epoch_itr(shuffle=False)
    return sum(len(batch["id"]) for batch in itr)


def test_validation_keeps_every_example_whatever_the_batch_multiple(data):
    plugin, *_ = build(data, "sentence_ce", extra=["--task", "sentence_prediction_acl"])
    stock, *_ = build(data, "sentence_ce")
    assert _valid_examples(plugin, 8) == 24
    assert _valid_examples(stock, 8) == 20  # fairseq drops the last batch (4 is not a multiple of 8)
    assert _valid_examples(stock, 1) == 24
    plugin.load_dataset("train")
    train = plugin.get_batch_iterator(dataset=plugin.dataset("train"), max_sentences=5,
                                      required_batch_size_multiple=8, disable_iterator_cache=True,
                                      ).next_epoch_itr(shuffle=False)
    assert sum(len(b["id"]) for b in train) < 48  # training keeps fairseq's batching unchanged


def test_stock_task_warns_at_start_up_when_validation_would_skip_examples(data, caplog, monkeypatch):
    from acl_fairseq.criterions import base

    monkeypatch.setattr(base, "_WARNED", [])
    with caplog.at_level(logging.WARNING, logger="acl_fairseq"):
        build(data, "sentence_ce", extra=["--required-batch-size-multiple", "8"])
    assert "--required-batch-size-multiple 1" in caplog.text and "sentence_prediction_acl" in caplog.text
    caplog.clear()
    monkeypatch.setattr(base, "_WARNED", [])
    with caplog.at_level(logging.WARNING, logger="acl_fairseq"):
        build(data, "sentence_ce", extra=["--required-batch-size-multiple", "8", "--task", "sentence_prediction_acl"])
        build(data, "sentence_ce")  # the helpers pass --required-batch-size-multiple 1
    assert "required-batch-size-multiple" not in caplog.text


def test_contrast_across_workers_needs_the_plugin_task_and_says_so(data):
    with pytest.raises(ValueError, match="--contrast-across-workers needs --task sentence_prediction_acl"):
        build(data, "acl_embed", extra=["--contrast-across-workers"])
    build(data, "acl_embed", extra=["--contrast-across-workers", "--task", "sentence_prediction_acl"])


@pytest.mark.parametrize("criterion, arch", [("sentence_ce", "roberta"), ("multi_exit_kd", "multi_exit_roberta")])
def test_contrast_across_workers_is_refused_where_there_is_nothing_to_contrast(data, criterion, arch):
    """multi_exit_kd distils each worker's own logits: with the flag its term was scaled by the global batch
    size (the world size too large in the update, while the logged loss looked right)."""
    with pytest.raises(ValueError, match="--contrast-across-workers shares the contrastive set .* drop the flag"):
        build(data, criterion, arch=arch, extra=["--contrast-across-workers", "--task", "sentence_prediction_acl"])


def test_train_step_marks_a_replayed_batch_for_the_criterion(data):
    task, model, crit, sample = build(data, "acl_embed", extra=["--task", "sentence_prediction_acl"])
    seen = []
    forward = crit.forward

    def spy(model, sample, reduce=True):
        seen.append(crit.replayed)
        return forward(model, sample, reduce)

    crit.forward = spy

    class Backward:
        def backward(self, loss):
            loss.backward()

    task.train_step(sample, model, crit, Backward(), 0, ignore_grad=True)
    task.train_step(sample, model, crit, Backward(), 0)
    assert seen == [True, False] and crit.replayed is False


def test_data_dictionary_other_than_the_restore_files_is_refused_at_start_up(data, tmp_path):
    """fairseq accepts two dictionaries of the same size silently: the plugin task stops, naming both."""
    import os
    import shutil

    import torch

    from acl_runtime.conventions import ConventionsError

    restore = tmp_path / "roberta" / "model.pt"
    restore.parent.mkdir()
    torch.save({}, str(restore))  # a readable file; the dictionaries are compared before it is loaded
    shutil.copy(os.path.join(data, "input0", "dict.txt"), restore.parent / "dict.txt")
    extra = ["--task", "sentence_prediction_acl", "--restore-file", str(restore)]
    build(data, "sentence_ce", extra=extra)  # the same dictionary: accepted
    lines = (restore.parent / "dict.txt").read_text().splitlines()
    lines[0], lines[1] = lines[1], lines[0]  # same size, two words swapped
    (restore.parent / "dict.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConventionsError, match=f"data dictionary {data}/input0/dict.txt differs from "
                                               f"{restore.parent}/dict.txt, the dictionary of --restore-file"):
        build(data, "sentence_ce", extra=extra)
