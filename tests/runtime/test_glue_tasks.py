"""acl_runtime.glue_tasks: the one guess of a binarized folder's GLUE task, which acl-evaluate and the hub (acl-export's
metrics, the regression scale) both read."""
import json

import pytest

from acl_runtime import glue_tasks


def test_the_task_of_a_data_folder_is_its_stats_record_else_a_glue_folder_name(tmp_path):
    recorded = tmp_path / "whatever-bin"
    recorded.mkdir()
    (recorded / "stats.json").write_text(json.dumps({"task": "STS-B"}))
    assert glue_tasks.task_of_data(str(recorded)) == "STS-B"  # the record beats the folder's name
    for name, task in (("RTE-bin", "RTE"), ("CoLA", "CoLA"), ("SST-2-bin/", "SST-2"), ("my-task-bin", None),
                       ("RTE-bin-old", None)):
        folder = tmp_path / name.rstrip("/")
        folder.mkdir(exist_ok=True)
        assert glue_tasks.task_of_data(str(tmp_path / name)) == task, name
    unrecorded = tmp_path / "QNLI-bin"
    unrecorded.mkdir()
    (unrecorded / "stats.json").write_text(json.dumps({"splits": {}}))  # an older record without the task
    assert glue_tasks.task_of_data(str(unrecorded)) == "QNLI"
    assert glue_tasks.task_of_data(None) is None and glue_tasks.task_of_data("") is None


def _table(tmp_path, monkeypatch, old: str, new: str) -> None:
    rows = open(glue_tasks.TABLE).read()
    assert old in rows
    (tmp_path / "tasks.tsv").write_text(rows.replace(old, new))
    monkeypatch.setattr(glue_tasks, "TABLE", str(tmp_path / "tasks.tsv"))


def test_a_score_out_of_the_rows_range_is_refused(tmp_path, monkeypatch):
    """STS-B's scores are checked against its row's score_range (0 to 5), not a literal: edit the row, and the
    reader of the GLUE files follows it."""
    (tmp_path / "train.tsv").write_text("\t".join(f"c{i}" for i in range(9)) + "\tscore\n"
                                        + "\t".join("x" * 7) + "\ta\tb\t4.5\n")
    split = glue_tasks.read_split(str(tmp_path), "train", glue_tasks.get_task("STS-B"), "train")
    assert split.examples[0].label == "4.5"
    _table(tmp_path, monkeypatch, "\tdev.tsv\t0\t0,5", "\tdev.tsv\t0\t0,4")
    with pytest.raises(glue_tasks.GlueDataError, match=r"train.tsv:2: STS-B score '4.5' is not a number in \[0, 4\]"):
        glue_tasks.read_split(str(tmp_path), "train", glue_tasks.get_task("STS-B"), "train")


def test_a_tasks_file_format_is_its_row(tmp_path, monkeypatch):
    """The columns, labels and header a GLUE file is read with come from the task's row."""
    (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tverdict\n0\ta\tb\tyes\n")
    with pytest.raises(glue_tasks.GlueDataError, match="header column 4 is 'verdict', expected 'label' for RTE"):
        glue_tasks.read_split(str(tmp_path), "train", glue_tasks.get_task("RTE"), "train")
    _table(tmp_path, monkeypatch, "\tentailment,not_entailment\t1,2\tlabel\t1\t-\tdev.tsv\t0\t-\nWNLI",
           "\tyes,no\t1,2\tverdict\t1\t-\tdev.tsv\t0\t-\nWNLI")
    split = glue_tasks.read_split(str(tmp_path), "train", glue_tasks.get_task("RTE"), "train")
    assert [(e.texts, e.label) for e in split.examples] == [(("a", "b"), "yes")]


def test_a_row_whose_labels_contradict_its_regression_flag_is_named(tmp_path):
    rows = open(glue_tasks.TABLE).read().replace("\t7,8\t9\t-\t-\t7,8\t", "\t7,8\t9\t-\t0,1\t7,8\t")
    (tmp_path / "tasks.tsv").write_text(rows)
    with pytest.raises(glue_tasks.GlueDataError, match="STS-B has regression 1 and labels '0,1'"):
        glue_tasks.tasks(str(tmp_path / "tasks.tsv"))
