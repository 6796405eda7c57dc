"""One text or a pair per input: a model fed the other kind answered without a word (a pair on a single-sentence
model read as one text joined by a separator; a lone text on a pair model read as the first side alone and
answered as a pair). The data folder says which (input1/ or not), the export records it, and every place inputs
are read refuses the other kind, in both directions, with the fix: the Python API, acl-predict, /predict and OIP
infer. A manifest written before the field existed is read as before, unchecked."""
import json
import os
import shutil

import pytest

from acl_runtime import console, pairing, predict
from serve_helpers import call, oip_body, serving


def test_the_rule_names_the_input_what_the_model_reads_and_the_fix():
    pairing.check(1, ["a", ("b", None), ["c"]], "python")
    pairing.check(2, [("a", "b"), ["c", "d"]], "python")
    pairing.check(None, ["a", ("b", "c")], "python")  # unknown: not checked
    for lone in ("e", ("e", None), ["e"]):  # a lone text on a pair model, in each form
        with pytest.raises(pairing.Mismatch, match=r"^input 1 holds one text, but this model reads a pair of texts "
                                                   r"per input: pass each input as a \(text, text_pair\) tuple$"):
            pairing.check(2, [("a", "b"), lone], "python")
    with pytest.raises(pairing.Mismatch, match=r"^input 0 holds one text, but this model reads a pair of texts per "
                                               r"input: send each input as a pair: \[\"a\", \"b\"\] for one"):
        pairing.check(2, ["a"], "predict")
    with pytest.raises(pairing.Mismatch, match=r"^f.tsv:2 holds one text, but this model reads a pair of texts per "
                                               r"input: read two texts per row: --columns N,M"):
        pairing.check(2, [("a", "b"), ("c",)], "acl-predict", ["f.tsv:1", "f.tsv:2"])
    with pytest.raises(pairing.Mismatch, match=r"^input 1 holds a pair of texts, but this model reads one text per "
                                               r"input: send a batch as \[\[\"a\"\], \[\"b\"\]\]$"):
        pairing.check(1, ["a", ("b", "c")], "predict")
    with pytest.raises(pairing.Mismatch, match=r"^f.tsv:3 holds a pair of texts, but this model reads one text per "
                                               r"input: read one text per row: --columns N"):
        pairing.check(1, ["a", ("b", "c")], "acl-predict", ["f.tsv:2", "f.tsv:3"])
    assert pairing.from_manifest({}) is None
    with pytest.raises(ValueError, match="texts_per_input is 3"):
        pairing.from_manifest({"texts_per_input": 3})


def test_the_data_folder_says_how_many_texts(predict_run, regression_run, tmp_path):
    assert pairing.from_data(predict_run[1]) == 2
    assert pairing.from_data(regression_run[1]) == 1
    assert pairing.from_data(str(tmp_path)) is None


def test_the_python_api_refuses_a_pair_on_a_single_text_model(predict_model, regression_run):
    from acl_fairseq.inference import hub

    assert predict_model.texts_per_input == 2
    assert len(predict_model.predict_early_exit([("a b", "c d"), ("c d", "a b")])) == 2
    ckpt, data = regression_run
    single = hub.from_pretrained(os.path.dirname(ckpt), os.path.basename(ckpt), data).eval()
    assert single.texts_per_input == 1
    assert len(single.predict_early_exit(["a b", "c d"])) == 2
    with pytest.raises(pairing.Mismatch, match="input 1 holds a pair of texts, but this model reads one text per "
                                               "input: pass each input as one string"):
        single.predict_early_exit(["a b", ("a b", "c d")])


def test_the_python_api_refuses_a_lone_text_on_a_pair_model(predict_model, predict_onnx):
    """It was read as the first side alone and answered as if it were a pair: by the hub and by the ONNX engine,
    through predict_early_exit and predict_texts (what acl-predict calls)."""
    from acl_runtime.engine import Engine

    fix = r"input 1 holds one text, but this model reads a pair of texts per input: pass each input as a \(text, " \
          r"text_pair\) tuple"
    for model in (predict_model, Engine(predict_onnx)):
        assert model.texts_per_input == 2
        with pytest.raises(pairing.Mismatch, match=fix):
            model.predict_early_exit([("a b", "c d"), "a b"])
        with pytest.raises(pairing.Mismatch, match=fix):
            model.predict_texts([("a b", "c d"), ("a b",)], model.resolve_request(None, None, None))


def test_acl_predict_refuses_a_lone_text_on_a_pair_model(predict_run, predict_onnx, tmp_path):
    """A one-column file read without --task, by the checkpoint and by its ONNX folder: exit 2, file:line and the
    fix, no output; the fix's --columns reads the pairs."""
    _, data, ckpt = predict_run
    src, out = tmp_path / "lone.txt", tmp_path / "p.jsonl"
    src.write_text("the movie was good\nthe plot\n")
    for model in ([ckpt, "--data", data], [predict_onnx]):
        with pytest.raises(SystemExit) as e:
            predict.main([*model, "--input", str(src), "--output", str(out)])
        assert e.value.code == 2 and str(e.value) == (
            f"{src}:1 holds one text, but this model reads a pair of texts per input: read two texts per row: "
            "--columns N,M, the --task the model was trained on, or JSONL with text and text_pair")
        assert not out.exists()
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a b\tc d\n")
    summary = predict.main([predict_onnx, "--input", str(pairs), "--columns", "1,2", "--output", str(out)])
    assert summary["examples"] == 1 and out.exists()


def test_acl_predict_refuses_pairs_on_a_single_text_model(regression_run, tmp_path):
    ckpt, data = regression_run
    src = tmp_path / "pairs.tsv"
    src.write_text("a b\tc d\n")
    with pytest.raises(console.UsageError) as e:
        predict.main([ckpt, "--data", data, "--input", str(src), "--columns", "1,2", "--output",
                      str(tmp_path / "p.jsonl")])
    assert e.value.code == 2 and str(e.value).startswith(
        f"{src}:1 holds a pair of texts, but this model reads one text per input: read one text per row: --columns N")
    assert not os.path.exists(tmp_path / "p.jsonl")


@pytest.fixture(scope="module")
def single_onnx(regression_run, tmp_path_factory):
    from acl_fairseq.hf import export

    ckpt, data = regression_run
    out = tmp_path_factory.mktemp("single") / "out"
    export.main([ckpt, "--data", data, "--output", str(out), "--format", "onnx"])
    return str(out / "onnx")


def test_the_export_records_it_and_both_routes_refuse_a_pair(single_onnx):
    with open(os.path.join(single_onnx, "manifest.json")) as f:
        assert json.load(f)["texts_per_input"] == 1
    with serving(single_onnx) as (url, _):
        status, _, body = call(url + "/predict", {"inputs": ["a b", "c d"]})
        assert status == 422 and body["error"] == ('input 0 holds a pair of texts, but this model reads one text per '
                                                   'input: send a batch as [["a"], ["b"]]'), body
        status, _, body = call(url + "/predict", {"inputs": [["a b"], ["c d"]]})
        assert status == 200 and len(body) == 2, body
        status, _, body = call(url + "/predict", {"inputs": "a b"})  # TEI's form of one text: one list
        assert status == 200 and isinstance(body[0], dict) and {e["label"] for e in body} == {"score"}, body
        status, _, body = call(url + "/v2/models/acl/infer", oip_body([("a b", "c d")]))
        assert status == 400 and body["error"].endswith('send the texts in the "text" tensor alone, without '
                                                        '"text_pair"'), body
        status, _, body = call(url + "/v2/models/acl/infer", oip_body(["a b"]))
        assert status == 200, body


def test_an_old_manifest_without_the_record_is_read_unchecked(single_onnx, tmp_path):
    from acl_runtime.engine import Engine

    old = str(tmp_path / "onnx")
    shutil.copytree(single_onnx, old)
    path = os.path.join(old, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    del m["texts_per_input"]
    with open(path, "w") as f:
        json.dump(m, f)
    engine = Engine(old)
    assert engine.texts_per_input is None
    assert len(engine.predict_early_exit([("a b", "c d"), "e"])) == 2
    with pytest.raises(pairing.Mismatch):
        Engine(single_onnx).predict_early_exit([("a b", "c d")])



def test_the_export_records_it_and_both_routes_refuse_a_lone_text_on_a_pair_model(predict_onnx):
    """A lone string on /predict, a "text" tensor without "text_pair" on OIP infer: refused with the route's fix,
    where they were answered from the first side alone; the form the fix names is answered."""
    with open(os.path.join(predict_onnx, "manifest.json")) as f:
        assert json.load(f)["texts_per_input"] == 2
    with serving(predict_onnx) as (url, _):
        for lone, where in (("a b", "input 0"), ([["a b"]], "input 0"), ([["a b", "c d"], ["a b"]], "input 1")):
            status, _, body = call(url + "/predict", {"inputs": lone})
            assert status == 422 and body["error"] == (
                f'{where} holds one text, but this model reads a pair of texts per input: send each input as a '
                'pair: ["a", "b"] for one, [["a", "b"], ["c", "d"]] for a batch'), body
        for pairs in (["a b", "c d"], [["a b", "c d"], ["c d", "a b"]]):  # the fix's two forms
            status, _, body = call(url + "/predict", {"inputs": pairs})
            assert status == 200, body
        assert len(body) == 2
        status, _, body = call(url + "/v2/models/acl/infer", oip_body(["a b", "c d"]))
        assert status == 400 and body["error"] == ('input 0 holds one text, but this model reads a pair of texts '
                                                   'per input: send a "text_pair" tensor beside "text", one entry '
                                                   'per text'), body
        status, _, body = call(url + "/v2/models/acl/infer", oip_body([("a b", "c d"), ("c d", "a b")]))
        assert status == 200 and len(body["outputs"][0]["data"]) == 2, body
