"""acl_runtime.glue_tasks: the one guess of a binarized folder's GLUE task, which acl-evaluate and the hub (acl-export's
metrics, the regression scale) both read."""
import json

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
