"""The SCL paper's data protocols in preprocess/glue.py: few-shot training subsets and label noise."""
import json
from collections import Counter

import pytest

from acl_runtime import scl_protocols as scl
from toy_glue import load, make_assets, make_task, run_main, stats_of, tok_args


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


# ------------------------------------------------------------------ SCL protocols


def test_few_shot_split_unit():
    dev = ["a"] * 700 + ["b"] * 300 + ["c"] * 100
    valid, test = scl.dev_split(dev, seed=3)
    assert len(test) == 550 and len(valid) == 500 and not set(valid) & set(test)
    for part, n in ((test, 550), (valid, 500)):
        got = Counter(dev[i] for i in part)
        for lab, c in Counter(dev).items():
            assert abs(got[lab] - n * c / len(dev)) <= 1  # keeps the dev label distribution
    small = ["x"] * 7 + ["y"] * 4
    v, t = scl.dev_split(small, seed=0)
    assert len(t) == 5 and sorted(v + t) == list(range(11))  # fewer than 500 left: all of them
    train = ["a"] * 90 + ["b"] * 9 + ["c"] * 1
    idx = scl.few_shot_train(train, 20, seed=1)
    assert len(idx) == 20 and Counter(train[i] for i in idx) == {"a": 17, "b": 2, "c": 1}  # every label kept
    assert idx == scl.few_shot_train(train, 20, seed=1) != scl.few_shot_train(train, 20, seed=2)


def test_label_noise_unit():
    labels = ["0", "1"] * 50
    noisy, changed = scl.add_label_noise(labels, 0.3, ("0", "1"), seed=4)
    assert len(changed) == 30 and [i for i in range(100) if noisy[i] != labels[i]] == changed
    assert scl.add_label_noise(labels, 0.3, ("0", "1"), seed=4) == (noisy, changed)
    three, ch = scl.add_label_noise(["a", "b", "c"] * 10, 0.5, ("a", "b", "c"), seed=0)
    assert len(ch) == 15 and all(three[i] != ["a", "b", "c"][i % 3] for i in ch)


def test_few_shot_end_to_end(tmp_path, assets):
    folder, data = make_task(tmp_path, "SST-2", n=(300, 1100, 5), weights=(3, 1))
    args = (*tok_args("wordpiece", assets), "--few-shot", "20")
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        assert run_main("SST-2", folder, tmp_path / name, *args, "--seed", seed) == 0
    st = stats_of(tmp_path / "a")
    assert [st["splits"][s]["examples"] for s in ("train", "valid", "test")] == [20, 500, 550]
    dev_counts = Counter(y for _, _, y in data["dev"])
    for s, n in (("test", 550), ("valid", 500)):
        for lab, c in dev_counts.items():
            assert abs(st["splits"][s]["label_counts"][lab] - n * c / 1100) <= 1
    with open(tmp_path / "a" / "protocol.json") as f:
        lines = {k: set(v["lines"]) for k, v in json.load(f)["source_lines"].items()}
    assert not lines["valid"] & lines["test"] and len(lines["valid"] | lines["test"]) == 1050
    t, ds = load(tmp_path / "a", "test")  # test comes from dev, so it has labels
    row = min(lines["test"])  # first test example = lowest dev line (order kept); line 1 is the header
    assert t.label_dictionary[ds[0]["target"].item() + 4] == data["dev"][row - 2][2]
    for rel in ("input0/train.bin", "input0/test.bin", "label/valid.bin", "protocol.json"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()  # same seed: same data
    assert (tmp_path / "a" / "protocol.json").read_bytes() != (tmp_path / "c" / "protocol.json").read_bytes()


def test_label_noise_end_to_end(tmp_path, assets):
    folder, data = make_task(tmp_path, "RTE", n=(40, 8, 4))
    out = tmp_path / "bin"
    assert run_main("RTE", folder, out, *tok_args("wordpiece", assets), "--label-noise", "0.25", "--seed", "7") == 0
    t, ds = load(out, "train")
    got = [t.label_dictionary[ds[i]["target"].item() + 4] for i in range(len(ds))]
    changed = [i for i, (_, _, y) in enumerate(data["train"]) if got[i] != y]
    assert len(changed) == 10 and stats_of(out)["protocol"]["label_noise"]["changed"] == 10
    with open(out / "protocol.json") as f:
        assert json.load(f)["label_noise"]["changed_lines"] == [i + 2 for i in changed]


def test_few_shot_too_small_for_labels(tmp_path, assets, capsys):
    folder, _ = make_task(tmp_path, "MNLI", n=(30, 9, 3))
    assert run_main("MNLI", folder, tmp_path / "bin", *tok_args("wordpiece", assets), "--few-shot", "2") == 2
    assert "never occurs in the training split" in capsys.readouterr().err
