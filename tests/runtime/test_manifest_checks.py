"""An exported ONNX folder proves its parts: the manifest records each
file's sha256 and the checkpoint's, and the runtime refuses a changed file, a path outside the folder, a
manifest whose parts disagree and graphs that disagree with it, each in one line naming the file, exit status 2
through acl-predict. A folder exported before the sha256 loads with one warning. A bad serving policy (the
manifest's, or an exit_policy.json beside a checkpoint) never blocks an explicit --policy."""
import json
import logging
import os
import shutil

import numpy as np
import pytest

from acl_runtime import engine as runtime
from acl_runtime import manifest as checks
from acl_runtime import predict


@pytest.fixture(scope="module")
def exported(predict_run, predict_onnx):
    """conftest's export, shared with other files: every test here changes a copy (``folder``)."""
    _, data, ckpt = predict_run
    return {"folder": predict_onnx, "ckpt": ckpt, "data": data}


@pytest.fixture
def folder(exported, tmp_path):
    """A copy of the export to change."""
    return shutil.copytree(exported["folder"], tmp_path / "onnx")


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def _edit(folder, **changes):
    m = _manifest(folder)
    for key, value in changes.items():
        if value is KeyError:
            del m[key]
        else:
            m[key] = value
    (folder / "manifest.json").write_text(json.dumps(m))


def _legacy(folder):
    """The folder as acl-export wrote it before the sha256 were recorded."""
    _edit(folder, sha256=KeyError, checkpoint_sha256=KeyError)


def _refused(folder, tmp_path, *flags):
    """acl-predict on ``folder``: exit status 2 and one line, returned."""
    src = tmp_path / "in.txt"
    src.write_text("the movie was good\n")
    with pytest.raises(SystemExit) as e:
        predict.main([str(folder), "--input", str(src), "--output", str(tmp_path / "p.jsonl"), *flags])
    message = str(e.value)
    assert e.value.code == 2 and len(message.splitlines()) == 1, message
    return message


def test_the_manifest_records_each_files_sha256_and_the_checkpoints(exported):
    folder = exported["folder"]
    m = json.load(open(os.path.join(folder, "manifest.json")))
    files = sorted(os.path.relpath(os.path.join(r, n), folder) for r, _, ns in os.walk(folder) for n in ns)
    assert sorted(m["sha256"]) == [f for f in files if f != "manifest.json"]
    assert all(m["sha256"][f] == checks.file_sha256(os.path.join(folder, f)) for f in m["sha256"])
    assert m["checkpoint_sha256"] == checks.file_sha256(exported["ckpt"])


def _swap_two_words(folder):
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    a, b = [w for w in vocab if w.isalpha()][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(tok))


def test_a_tokenizer_with_two_ids_swapped_is_refused_naming_it(folder, tmp_path):
    _swap_two_words(folder)
    message = _refused(folder, tmp_path)
    assert f"{folder / 'tokenizer.json'}: its sha256 is not the one manifest.json records" in message


def test_swapped_layer_graphs_are_refused_naming_one(folder, tmp_path):
    os.rename(folder / "layer1.onnx", folder / "swap")
    os.rename(folder / "layer2.onnx", folder / "layer1.onnx")
    os.rename(folder / "swap", folder / "layer2.onnx")
    assert f"{folder / 'layer1.onnx'}: its sha256 is not the one" in _refused(folder, tmp_path)


@pytest.mark.parametrize("name", ["../x.json", "/etc/hostname", "sub/../../x.json"])
def test_a_path_outside_the_folder_is_refused(folder, tmp_path, name):
    shutil.copy(folder / "tokenizer.json", tmp_path / "x.json")
    _edit(folder, tokenizer=name)
    assert f"the file name {name!r} is not a path inside the folder" in _refused(folder, tmp_path)


def test_a_link_leading_outside_the_folder_is_refused(folder, tmp_path):
    shutil.copy(folder / "tokenizer.json", tmp_path / "x.json")
    os.symlink(tmp_path / "x.json", folder / "t.json")
    _edit(folder, tokenizer="t.json")
    assert "'t.json' leads outside the folder" in _refused(folder, tmp_path)


def _exits_past_the_model(m):
    return {"exit_layers": m["exit_layers"][:-1] + [m["num_layers"] + 1]}


@pytest.mark.parametrize("change, words", [
    (_exits_past_the_model, ["exit_layers is", "not increasing layers of 1..3"]),
    (lambda m: {"exit_layers": m["exit_layers"][:-1]}, ["layers lists layers [1, 2, 3], but the exits [1, 2]"]),
    (lambda m: {"layers": [dict(r, exit=None) if r["layer"] == 2 else r for r in m["layers"]]},
     ["layers has exits on layers [1, 3]", "but exit_layers is [1, 2, 3]"]),
    (lambda m: {"num_classes": 3, "labels": m["labels"] + ["x"]}, ["layer1.onnx: 2 logits", "num_classes 3"]),
    (lambda m: {"num_classes": 3}, ["labels is", "not 3 distinct names"]),
    (lambda m: {"labels": None}, ["labels is null, not 2 distinct names"]),
    (lambda m: {"labels": m["labels"][:1]}, ["not 2 distinct names"]),
    (lambda m: {"exit_layers": KeyError, "num_classes": KeyError}, ["key 'exit_layers', 'num_classes' missing"]),
    (lambda m: {"input_layout": {k: v for k, v in m["input_layout"].items() if k != "max_positions"}},
     ["input_layout has no max_positions"]),
])
def test_a_manifest_whose_parts_disagree_is_one_line_before_anything_runs(folder, tmp_path, change, words):
    _legacy(folder)  # the checks hold without the sha256 too
    _edit(folder, **change(_manifest(folder)))
    message = _refused(folder, tmp_path)
    assert message.startswith(str(folder)) and all(w in message for w in words), message


def test_a_cut_short_tokenizer_is_one_line(folder, tmp_path):
    _legacy(folder)
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text[: len(text) // 2])
    message = _refused(folder, tmp_path)
    assert f"{folder / 'tokenizer.json'}: not a readable tokenizers file (" in message and "EOF" in message


def _small_embeddings(path, rows, width):
    """An embeddings graph with the exported one's inputs and outputs over a table of ``rows`` ids: another
    model's."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((rows, width), np.float32), "table")
    pad = numpy_helper.from_array(np.array(1, np.int64), "pad")
    nodes = [helper.make_node("Gather", ["table", "src_tokens"], ["bt"]),
             helper.make_node("Transpose", ["bt"], ["x"], perm=[1, 0, 2]),
             helper.make_node("Equal", ["src_tokens", "pad"], ["padding_mask"])]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("src_tokens", TensorProto.INT64,
                                                                             ["b", "t"])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "b", width]),
                               helper.make_tensor_value_info("padding_mask", TensorProto.BOOL, ["b", "t"])],
                              [table, pad])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))


def test_an_embed_graph_of_another_model_is_refused(folder, tmp_path):
    width = runtime.Engine(str(folder)).backend.embed(np.array([[0, 5]]), None).shape[-1]
    _small_embeddings(folder / "embed.onnx", 6, width)
    assert f"{folder / 'embed.onnx'}: its sha256 is not the one" in _refused(folder, tmp_path)
    _legacy(folder)  # without the sha256: the graph's own table is too small for the tokenizer's ids
    message = _refused(folder, tmp_path)
    assert f"{folder / 'embed.onnx'} cannot embed id" in message and "different models" in message, message


def test_a_folder_exported_before_the_sha256_loads_with_one_warning(folder, tmp_path, caplog):
    _legacy(folder)
    with caplog.at_level(logging.WARNING):
        engine = runtime.Engine(str(folder))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "records no sha256" in warnings[0], warnings
    assert len(engine.predict_early_exit([("the movie", "was good")])) == 1


def test_a_bad_manifest_policy_blocks_no_explicit_policy_and_names_its_file(folder, tmp_path):
    """Case 13: the manifest's threshold 5 refused even --policy entropy --threshold 0.3, and its error named no
    file."""
    _legacy(folder)
    _edit(folder, policy="entropy", threshold=5)
    engine = runtime.Engine(str(folder))
    assert len(engine.predict_early_exit([("a", "b"), ("b", "a")], policy="entropy", threshold=0.3)) == 2
    assert engine.resolve_request("entropy", 0.3).threshold == 0.3
    message = _refused(folder, tmp_path)
    assert message.startswith(f"{folder / 'manifest.json'}: its serving policy \"entropy\" with threshold 5 cannot "
                              "run"), message
    _edit(folder, threshold=True)  # a bool is not a threshold of 1
    assert "threshold true cannot run" in _refused(folder, tmp_path)


def test_a_bad_exit_policy_json_blocks_no_explicit_policy(exported, tmp_path):
    ckpt = tmp_path / "ckpt" / "checkpoint_best.pt"
    ckpt.parent.mkdir()
    shutil.copy(exported["ckpt"], ckpt)
    (ckpt.parent / "exit_policy.json").write_text('{"schema": "acl_fairseq.exit_policy/1", "policy": "entropy", '
                                                  '"threshold": 5}')
    src = tmp_path / "in.tsv"
    src.write_text("the movie\twas good\n")
    common = [str(ckpt), "--data", exported["data"], "--input", str(src), "--columns", "1,2", "--device", "cpu"]
    predict.main(common + ["--output", str(tmp_path / "p.jsonl"), "--policy", "entropy", "--threshold", "0.3"])
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 1
    with pytest.raises(SystemExit) as e:
        predict.main(common + ["--output", str(tmp_path / "q.jsonl")])
    assert e.value.code == 2 and str(ckpt.parent / "exit_policy.json") in str(e.value)
    assert "entropy threshold 5 is out of range" in str(e.value), str(e.value)
