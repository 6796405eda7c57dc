"""acl-tune's parts, without a worker: the search space table and its sampler (acl_fairseq.tuning.space), the
reader of a run's validations (acl_fairseq.cli.tune), and the study's carved validation split
(acl_fairseq.tuning.data). The studies themselves: test_tune.py."""
import os
import shutil
import subprocess
import sys

import optuna  # (pinned in requirements.txt: a missing optuna is a broken set-up, not a skip)
import pytest

import helpers
from acl_fairseq.cli.tune import ValidationReader
from acl_fairseq.tuning import data as tune_data
from acl_fairseq.tuning import space as tune_space


def test_search_space_rows_pick_the_most_specific(tmp_path):
    space = {p.name: p for p in tune_space.search_space("scl", "SST-2", "fewshot")}
    assert set(space) == {"lr", "lambda", "tau"}
    assert space["lambda"].values == ("0.1", "0.3", "0.5", "0.7", "0.9", "1.0")
    assert space["tau"].values == ("0.1", "0.3", "0.5", "0.7") and space["tau"].target == "--scl-temperature"
    assert space["lr"].target == "LR" and "1e-04" in space["lr"].values
    assert tune_space.search_space("scl", "SST-2", "full")[0].values == ("1e-05", "2e-05", "3e-05")
    assert [p.name for p in tune_space.search_space("ce", "RTE", "full")] == ["lr"]
    overrides, extra = tune_space.plan_arguments(list(space.values()), {"lr": "1e-04", "lambda": "0.5", "tau": "0.1"})
    assert overrides == {"LR": "1e-04"} and extra == ["--scl-weight", "0.5", "--scl-temperature", "0.1"]
    table = tmp_path / "t.tsv"
    table.write_text("\t".join(tune_space.COLUMNS) + "\nscl\t*\t*\tlambda\tscl_weight\tchoice\t0.1\tx\n")
    with pytest.raises(ValueError, match="row 1 .*target must be"):
        tune_space.search_space("scl", "SST-2", "full", str(table))
    table.write_text("\t".join(tune_space.COLUMNS) + "\nscl\t*\t*\tlambda\t--scl-weight\tlog\t0:1\tx\n")
    with pytest.raises(ValueError, match="bad log range"):
        tune_space.search_space("scl", "SST-2", "full", str(table))


def test_sampler_draws_per_trial_number_not_per_worker():
    space = tune_space.search_space("acl_embed", "SST-2", "fewshot")

    def draws(numbers_before):
        study = optuna.create_study(sampler=tune_space.make_sampler(7, 10), direction="maximize")
        for _ in range(numbers_before):
            study.enqueue_trial({"lr": "3e-05", "lambda": 1.0, "tau": "0.5"})
            study.optimize(lambda t: [p.suggest(t) for p in space] and 0.0, n_trials=1)
        t = study.ask()
        return t.number, {p.name: p.suggest(t) for p in space}

    assert draws(2) == draws(2)
    assert draws(2)[1] != draws(3)[1]


def test_validation_reader_reads_records_as_the_log_grows(tmp_path):
    path = tmp_path / "train.log"
    reader = ValidationReader(str(path), "accuracy")
    assert reader.new() == []
    path.write_text('x | INFO | valid | {"epoch": 1, "valid_accuracy": "70.5", "valid_num_updates": "10"}\n'
                    'x | INFO | train | {"epoch": 1, "train_accuracy": "99"}\n'
                    'x | INFO | valid | {"epoch": 2, "valid_accuracy": "71"')
    assert reader.new() == [(10, 70.5)]
    with open(path, "a") as f:
        f.write(', "valid_num_updates": "20"}\n')
    assert reader.new() == [(20, 71.0)]


def test_carve_is_seeded_stratified_and_leaves_dev_out(tmp_path):
    data = helpers.make_data(str(tmp_path / "toy"))["data"]
    rec = tune_data.carve(data, str(tmp_path / "c1"), seed=3, fraction=0.25, valid_subsets=["valid"])
    again = tune_data.carve(data, str(tmp_path / "c2"), seed=3, fraction=0.25, valid_subsets=["valid"])
    other = tune_data.carve(data, str(tmp_path / "c3"), seed=4, fraction=0.25, valid_subsets=["valid"])
    assert rec["valid_indices"] == again["valid_indices"] != other["valid_indices"]
    assert (rec["train_examples"], rec["valid_examples"]) == (36, 12)
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    src = MMapIndexedDataset(os.path.join(data, "input0", "train"))
    got = MMapIndexedDataset(str(tmp_path / "c1" / "input0" / "valid"))
    assert [got[i].tolist() for i in range(len(got))] == [src[i].tolist() for i in rec["valid_indices"]]
    def counts(prefix):
        ds = MMapIndexedDataset(prefix)
        out = {}
        for i in range(len(ds)):
            out[tuple(ds[i].tolist())] = out.get(tuple(ds[i].tolist()), 0) + 1
        return out

    whole, carved = counts(os.path.join(data, "label", "train")), counts(str(tmp_path / "c1" / "label" / "valid"))
    assert set(carved) == set(whole) and len(whole) == 2
    for label, n in whole.items():  # each label's share of train, to within one example
        assert abs(carved[label] - 12 * n / 48) < 1
    assert not os.path.exists(tmp_path / "c1" / "input0" / "test.idx")
    with pytest.raises(ValueError, match="another source or seed"):
        tune_data.carve(data, str(tmp_path / "c1"), seed=5, fraction=0.25, valid_subsets=["valid"])


def test_a_killed_carve_leaves_nothing_the_next_one_trips_on(tmp_path, monkeypatch):
    """Carved in a temporary beside the folder and placed whole: a SIGKILLed carve's temporary (its process gone)
    is removed by the next carve, and a folder a concurrent worker placed first is read, not overwritten."""
    data = helpers.make_data(str(tmp_path / "toy"))["data"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".c1.tmp-{int(dead.stdout)}-dead"
    (stale / "input0").mkdir(parents=True)
    rec = tune_data.carve(data, str(tmp_path / "c1"), seed=3, fraction=0.25, valid_subsets=["valid"])
    assert not stale.exists() and (tmp_path / "c1" / "carve.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c1", "toy"]
    from acl_runtime.io import atomic

    real = atomic.staging_folder

    def placed_first(dest, force=True):  # another worker places the same carve while this one writes
        shutil.copytree(tmp_path / "c1", tmp_path / "c2")
        return real(dest, force)

    monkeypatch.setattr(atomic, "staging_folder", placed_first)
    again = tune_data.carve(data, str(tmp_path / "c2"), seed=3, fraction=0.25, valid_subsets=["valid"])
    assert again["valid_indices"] == rec["valid_indices"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c1", "c2", "toy"]
