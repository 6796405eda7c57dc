"""The ONNX export (acl_fairseq.hf.onnx_export) and the torch-free ONNX Runtime engine (acl_runtime).

Two tiny trained models: the toy task's multi_exit_roberta ([CLS] pooling, whitespace tokens, RoBERTa's pair
format) and a converted random BERT fine-tuned with mean pooling and exits on layers 2 and 3 only (WordPiece,
one separator, the segment embedding). Their exit heads are sharpened (out_proj times SHARPEN) and their biases
centred on the test texts so that the examples spread over the exits and over both labels, and a 1e-5
tolerance means something. Every comparison of ids and logits runs single sentences and pairs, of predictions
pairs (the models read pairs: a lone text is refused, acl_runtime.pairing); the torch side is the
layer-by-layer engine (acl_fairseq.inference.early_exit) through the hub.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import exit_parity
import helpers
from acl_fairseq.hf import onnx_export
from acl_fairseq.inference import early_exit, hub
from acl_runtime import engine as runtime
from acl_runtime import exits

SHARPEN = 8.0
ATOL = 1e-5
ODD = ["", "   the   movie  ", "The Movie WAS Great !", "café naïve déjà-vu", " ".join(["good"] * 80)]


def _balanced(model, texts) -> None:
    """Sharpen every exit head (out_proj times SHARPEN) and shift its bias so that half of ``texts`` get
    each label at every exit (a tiny model barely trained says one label for all)."""
    heads = [model.model.classification_heads[n] for n in model.model.exit_head_names(model.head_name)]
    with torch.no_grad():
        for head in heads:
            head.out_proj.weight.mul_(SHARPEN)
            head.out_proj.bias.mul_(SHARPEN)
        per_exit = torch_all_exits(model, texts)
        for m, head in enumerate(heads):  # an even count: the median lies between two examples
            head.out_proj.bias[0] -= float(np.median(per_exit[:, m, 0] - per_exit[:, m, 1]))


def _export(ckpt: str, data: str, out: str, texts, quantize=None):
    model = hub.from_pretrained(os.path.dirname(ckpt), os.path.basename(ckpt), data).eval()
    _balanced(model, texts)
    os.makedirs(out)
    onnx_export.write_onnx(model, out, quantize=quantize)
    return model, runtime.Engine(out, threads=1)


def _texts(pairs):
    """Pairs, the first sentence of each alone, and odd inputs (empty, spacing, case, accents, too long): an even
    count."""
    pairs = list(pairs)
    texts = pairs + [a for a, _ in pairs] + ODD + [(ODD[3], ODD[2]), (ODD[4], ODD[4])]
    return texts if len(texts) % 2 == 0 else texts[:-1]


@pytest.fixture(scope="module")
def toy(cls_pair_run, tmp_path_factory):
    """conftest's tiny multi-exit model on toy pairs (shared with test_calibrate.py), exported with its int8 copy."""
    root = tmp_path_factory.mktemp("onnx_toy")
    data, ckpt = cls_pair_run
    raw = os.path.join(data, "raw")
    texts = _texts(zip(*(open(os.path.join(raw, f"valid.input{i}")).read().splitlines() for i in (0, 1))))
    model, eng = _export(ckpt, data, str(root / "onnx"), texts, quantize="int8")
    return {"hub": model, "engine": eng, "out": str(root / "onnx"), "texts": texts, "data": data, "ckpt": ckpt}


@pytest.fixture(scope="module")
def bert(tiny_bert_mean, tmp_path_factory):
    """conftest's converted BERT with mean pooling (only read), exported."""
    root = tmp_path_factory.mktemp("onnx_bert")
    bert = tiny_bert_mean
    written = bert["written"]
    texts = _texts([(a, b) for a, b, _ in written["train"] + written["dev"]])
    model, eng = _export(bert["ckpt"], bert["data"], str(root / "onnx"), texts)
    return {"hub": model, "engine": eng, "out": str(root / "onnx"), "texts": texts}


@pytest.fixture(params=["toy", "bert"])
def exported(request):
    return request.getfixturevalue(request.param)


# ---- the torch side ---------------------------------------------------------------------------------


def _split(x) -> tuple:
    return (x,) if isinstance(x, str) else tuple(x)


def _pairs(texts) -> list:
    """The pairs among ``texts``: what the models' predictions read."""
    return [t for t in texts if not isinstance(t, str)]


def torch_all_exits(model, texts):
    """(B, M, K) float32 logits of every exit in input order, from the torch engine without a policy."""
    tokens = [model.encode(*_split(t)) for t in texts]
    out = [None] * len(texts)
    for rows, src in model.make_batches(tokens, 8):
        per_exit = early_exit.early_exit_forward(model.model, src, model.head_name, None).exit_logits
        for r, i in enumerate(rows):
            out[i] = per_exit[r].numpy()
    return np.stack(out)


def splitting_threshold(policy: str, per_exit: np.ndarray) -> float:
    """A threshold that sends about half the examples out at the first exit: the midpoint of two neighbouring
    first-exit values more than 2 * ATOL apart (so that no example sits on it). The tiny model's entropies crowd
    just below 1, several equal to float rounding: a threshold between two of those would leave their exits to the
    rounding of whichever kernels ran (onnxruntime's fused SkipLayerNormalization or not)."""
    if policy == "patience":
        return 1
    values = np.sort(exit_parity.decision_values(policy, per_exit)[:, 0])
    low = high = len(values) // 2
    while high < len(values) - 1 and values[high] - values[low - 1] <= 2 * ATOL:
        high += 1
    return float((values[low - 1] + values[high]) / 2)


# ---- tests ------------------------------------------------------------------------------------------


def test_ids_are_the_hubs_for_every_text(exported):
    model, eng = exported["hub"], exported["engine"]
    for text in exported["texts"]:
        ids, truncated = model.encode_with_info(*_split(text))
        assert eng.encode_with_info(*_split(text)) == (ids.tolist(), truncated), text
    assert any(eng.encode_with_info(*_split(t))[1] for t in exported["texts"])  # the long ones are cut


def test_manifest_records_exits_pooling_labels_and_layout(toy, bert):
    t, b = toy["engine"].manifest, bert["engine"].manifest
    assert (t["exit_layers"], t["pooling"], t["labels"], t["tokenizer_kind"]) == ([1, 2, 3], "cls", ["0", "1"],
                                                                                 "whitespace")
    assert (b["exit_layers"], b["pooling"], b["tokenizer_kind"]) == ([2, 3], "mean", "wordpiece")
    assert [(r["layer"], r["exit"]) for r in b["layers"]] == [(1, None), (2, 0), (3, 1)]  # layer 1 runs, no exit
    assert sorted(b["labels"]) == ["entailment", "not_entailment"]
    assert t["input_layout"]["separator_token"] == 2 and t["input_layout"]["segment_embedding"] is False
    assert b["input_layout"]["separator_token"] is None and b["input_layout"]["segment_embedding"] is True
    assert (t["input_layout"]["pair_format"], b["input_layout"]["pair_format"]) == ("double", "single")
    assert t["policy_defaults"] == {name: row.default for name, row in exits.POLICIES.items()}
    assert set(t["quantized"]["int8"]["layers"].values()) == {f"int8/layer{n}.onnx" for n in (1, 2, 3)}


@pytest.mark.parametrize("policy", [None, "entropy", "confidence", "patience"])
def test_ort_engine_equals_the_torch_engine(exported, policy):
    model, eng, texts = exported["hub"], exported["engine"], exported["texts"]
    per_exit = torch_all_exits(model, texts)
    threshold = splitting_threshold(policy, per_exit) if policy else None
    tokens = [model.encode(*_split(t)) for t in texts]
    t_logits, t_layers = model.predict_tokens_early_exit(tokens, policy, threshold, batch_size=8)
    o_logits, o_layers = eng.run_batches(eng.make_batches([t.tolist() for t in tokens], 8), len(tokens), policy,
                                         threshold)
    ort_all = exit_parity.all_exits(eng, [t.tolist() for t in tokens], 8)
    exit_parity.assert_same_exits(policy, threshold, per_exit, ort_all, (t_logits.numpy(), t_layers.numpy()),
                                  (o_logits, o_layers), ATOL)
    if policy is not None and (policy != "patience" or len(eng.exit_layers) > 2):  # patience 1 fires at exit 2 first
        assert len(set(o_layers.tolist())) > 1, "the threshold should split the examples between exits"
    assert len(set(o_logits.argmax(-1).tolist())) == 2, "both labels should occur"


def test_fixed_exit_layer_and_predictions_match_the_hub(exported):
    model, eng, texts = exported["hub"], exported["engine"], _pairs(exported["texts"])
    for exit_layer in eng.exit_layers[:-1]:
        theirs = model.predict_early_exit(texts, exit_layer=exit_layer)
        ours = eng.predict_early_exit(texts, exit_layer=exit_layer)
        assert [(p.label, p.exit_layer, p.truncated) for p in ours] == [(p.label, p.exit_layer, p.truncated)
                                                                        for p in theirs]
        for p, q in zip(ours, theirs):
            assert p.probabilities == pytest.approx(q.probabilities, abs=ATOL)


def test_batch_one_equals_batched(exported):
    eng, texts = exported["engine"], exported["texts"]
    per_exit = torch_all_exits(exported["hub"], texts)
    threshold = splitting_threshold("entropy", per_exit)
    tokens = [eng.encode_with_info(*_split(t))[0] for t in texts]
    one, many = (eng.run_batches(eng.make_batches(tokens, b), len(tokens), "entropy", threshold) for b in (1, 16))
    exit_parity.assert_same_exits("entropy", threshold, exit_parity.all_exits(eng, tokens, 1),
                                  exit_parity.all_exits(eng, tokens, 16), one, many, ATOL)
    assert len(set(one[1].tolist())) > 1


def test_the_serving_policy_is_range_checked_and_defaults_from_the_table(toy):
    assert onnx_export.serving_policy(toy["hub"], "entropy", None) == {"policy": "entropy", "threshold": 0.3}
    assert onnx_export.serving_policy(toy["hub"], None, None) == {"policy": None, "threshold": None}
    with pytest.raises(ValueError, match=r"entropy threshold 1.5 is out of range: it takes \[0, 1\]"):
        onnx_export.serving_policy(toy["hub"], "entropy", 1.5)


def test_policy_checks_are_the_hubs(toy):
    eng, model = toy["engine"], toy["hub"]
    for policy, threshold, exit_layer in [("entropy", 1.5, None), ("patience", 0, None), ("entropy", None, 2),
                                          (None, None, 7)]:
        with pytest.raises(ValueError) as ours:
            eng.resolve_request(policy, threshold, exit_layer)
        with pytest.raises(ValueError) as theirs:
            model.resolve_request(policy, threshold, exit_layer)
        assert str(ours.value) == str(theirs.value)
    assert eng.resolve_request("confidence").threshold == exits.POLICIES["confidence"].default


def test_int8_copy_is_selectable_and_close(toy):
    fp32, texts = toy["engine"], toy["texts"]
    int8 = runtime.Engine(toy["out"], "int8", threads=1)
    assert int8.layers[0]._model_path.endswith(os.path.join("int8", "layer1.onnx"))
    tokens = [fp32.encode_with_info(*_split(t))[0] for t in texts]
    a, _ = fp32.run_batches(fp32.make_batches(tokens, 8), len(tokens))
    b, _ = int8.run_batches(int8.make_batches(tokens, 8), len(tokens))
    diff = np.abs(a - b).max()
    # quantized (not the fp32 files), and still the same model: int8 errs by ~0.1% of the sharpened logits'
    # scale (about 20 before centring). How often its labels agree is measured on a trained model, not here:
    # the centred tiny heads put every example near the boundary
    assert 0 < diff < 0.1, diff
    with pytest.raises(ValueError, match="no int8 copy: export it with --quantize int8"):
        runtime.Engine(_without_int8(toy["out"]), "int8")


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_engines_sessions_keep_the_residual_add_and_layernorm_apart(toy, precision, tmp_path, monkeypatch):
    """onnxruntime's SkipLayerNormalization, its fusion of the two, was slower on a MiniLM layer than the ops it
    replaces (benchmarks/ort_fusions.py: 5 to 11%): the engine's sessions run without that fusion, and with the
    others of their level (the q/k scale folded into FusedMatMul, int8's QDQ into integer MatMuls)."""
    import onnx
    import onnxruntime

    made, original = [], onnxruntime.InferenceSession

    def saving_session(path, options, **kwargs):  # every session the engine opens saves the graph it runs
        options.optimized_model_filepath = str(tmp_path / f"{len(made)}.onnx")
        made.append(options.optimized_model_filepath)
        return original(path, options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", saving_session)
    eng = runtime.Engine(toy["out"], precision, threads=1)
    assert len(made) == 1 + len(eng.layers)
    for path in made[1:]:
        ops = [n.op_type for n in onnx.load(path).graph.node]
        assert "SkipLayerNormalization" not in ops and ops.count("LayerNormalization") >= 2, (path, ops)
        assert "FusedMatMul" in ops or "MatMulIntegerToFloat" in ops, (path, ops)


def _without_int8(folder: str) -> str:
    """A copy of ``folder`` whose manifest lists no quantized copy."""
    import shutil

    copy = folder + "_fp32_only"
    if not os.path.isdir(copy):
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("int8"))
        manifest = runtime.read_manifest(copy)
        manifest["quantized"] = {}
        with open(os.path.join(copy, runtime.MANIFEST), "w") as f:
            json.dump(manifest, f)
    return copy


BLOCK = ("import sys\n"
         "class Block:\n"
         "    def find_spec(self, name, path=None, target=None):\n"
         "        if name.split('.')[0] in {blocked!r}:\n"
         "            raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)\n"
         "sys.meta_path.insert(0, Block())\n")


def test_runtime_runs_where_torch_and_fairseq_cannot_be_imported(toy):
    eng, texts = toy["engine"], toy["texts"][:6]
    code = BLOCK.format(blocked=("torch", "fairseq")) + (
        "import json\n"
        "from acl_runtime.engine import Engine\n"
        f"preds = Engine({toy['out']!r}).predict_early_exit({texts!r}, policy='patience', threshold=1)\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'fairseq')]\n"
        "print(json.dumps([[p.label, p.exit_layer] for p in preds]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=helpers.REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = [[p.label, p.exit_layer] for p in eng.predict_early_exit(texts, policy="patience", threshold=1)]
    assert json.loads(proc.stdout) == expected


def _acl_predict_in_a_subprocess(toy, tmp_path, prelude: str):
    """acl-predict OUT/onnx on the toy's pairs in a fresh interpreter: (records, top-level torch/fairseq modules
    loaded at exit)."""
    texts = [t for t in _pairs(toy["texts"]) if all(s.strip() for s in t)]
    (tmp_path / "in.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in texts))
    argv = ["acl-predict", toy["out"], "--input", str(tmp_path / "in.tsv"), "--columns", "1,2", "--policy",
            "patience", "--threshold", "1"]
    code = prelude + (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'fairseq'}),"
        " file=sys.stderr))\n"
        f"sys.argv = {argv!r}\n"
        "from acl_runtime.predict import cli_main\n"
        "cli_main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=helpers.REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = [[p.label, p.exit_layer] for p in toy["engine"].predict_early_exit(texts, "patience", 1)]
    assert [[r["label"], r["exit_layer"]] for r in map(json.loads, proc.stdout.splitlines())] == expected
    return proc.stderr.split("LOADED ")[-1].strip()


def test_acl_predict_on_the_folder_runs_where_torch_and_fairseq_cannot_be_imported(toy, tmp_path):
    """The command, not only the engine: check_files imported checkpoint_safety (torch) before it looked at the
    path, so a serving install died with ModuleNotFoundError (scripts/check_serving_env.sh: torch absent)."""
    assert _acl_predict_in_a_subprocess(toy, tmp_path, BLOCK.format(blocked=("torch", "fairseq"))) == "[]"


def test_acl_predict_on_the_folder_imports_neither_torch_nor_fairseq_where_installed(toy, tmp_path):
    assert _acl_predict_in_a_subprocess(toy, tmp_path, "") == "[]"



def test_missing_onnxruntime_is_refused_with_the_install_line(toy, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what an environment without it raises on import
    with pytest.raises(runtime.RuntimeMissing, match=r"needs the onnxruntime package .*pip install"):
        runtime.Engine(toy["out"])


def test_not_an_exported_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json not found: not an exported ONNX folder"):
        runtime.Engine(str(tmp_path))


def test_a_folder_copied_in_part_or_the_wrong_level_is_a_one_line_error(toy, tmp_path):
    """A missing graph or tokenizer file, an unreadable graph, acl-export's OUT instead of OUT/onnx: acl-predict
    says which file and what to do, exit status 2 (a missing int8 graph was an onnxruntime traceback)."""
    import shutil

    from acl_runtime import predict

    src = tmp_path / "in.txt"
    src.write_text("the movie was good\n")
    out = tmp_path / "OUT"
    shutil.copytree(toy["out"], out / "onnx")
    int8 = next(iter(json.load(open(out / "onnx" / "manifest.json"))["quantized"]["int8"]["layers"].values()))

    def refused(folder, *flags):
        with pytest.raises(SystemExit) as e:
            predict.main([str(folder), "--input", str(src), "--output", str(tmp_path / "p.jsonl"), *flags])
        assert e.value.code == 2 and len(str(e.value).splitlines()) == 1, str(e.value)
        return str(e.value)

    assert f"pass {out / 'onnx'}" in refused(out)
    os.remove(out / "onnx" / int8)
    assert f"{out / 'onnx' / int8} not found, though manifest.json lists it" in refused(out / "onnx", "--precision",
                                                                                        "int8")
    tokenizer = json.load(open(out / "onnx" / "manifest.json"))["tokenizer"]
    os.remove(out / "onnx" / tokenizer)
    assert f"{out / 'onnx' / tokenizer} not found" in refused(out / "onnx")
    shutil.copy(os.path.join(toy["out"], tokenizer), out / "onnx" / tokenizer)
    first = json.load(open(out / "onnx" / "manifest.json"))["embeddings"]
    (out / "onnx" / first).write_bytes(b"not a graph")
    assert "ONNX Runtime cannot load it" in refused(out / "onnx")


def test_acl_predict_on_the_folder_writes_the_hubs_records(toy, tmp_path):
    """acl-predict OUT/onnx against the hub acl-predict runs on the checkpoint (the same model in memory)."""
    from acl_runtime import predict

    pairs = _pairs(toy["texts"])[:12]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in pairs))
    predict.main([toy["out"], "--input", str(src), "--policy", "patience", "--threshold", "1", "--output",
                  str(tmp_path / "out.jsonl")])
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = toy["hub"].predict_early_exit(pairs, policy="patience", threshold=1)
    assert [(r["label"], r["exit_layer"]) for r in records] == [(p.label, p.exit_layer) for p in expected]
    for r, p in zip(records, expected):
        assert r["probabilities"] == pytest.approx(p.probabilities, abs=ATOL)


@pytest.mark.slow  # its own model and export (make test-slow, CI)
def test_a_pre_norm_encoder_gets_its_final_layer_norm(toy, tmp_path):
    """The toy checkpoint turned pre-norm (--encoder-normalize-before, a random final LayerNorm): the top exit
    reads the normalized states, in both engines."""
    state = torch.load(toy["ckpt"], weights_only=True, map_location="cpu")
    state["cfg"]["model"].encoder_normalize_before = True
    gen = torch.Generator().manual_seed(0)
    dim = state["model"]["encoder.sentence_encoder.embed_tokens.weight"].shape[1]
    for name in ("weight", "bias"):
        state["model"][f"encoder.sentence_encoder.layer_norm.{name}"] = 1.0 * (name == "weight") + torch.randn(
            dim, generator=gen)
    torch.save(state, tmp_path / "prenorm.pt")
    model, eng = _export(str(tmp_path / "prenorm.pt"), toy["data"], str(tmp_path / "onnx"), toy["texts"])
    assert model.model.encoder.sentence_encoder.layer_norm is not None
    texts = toy["texts"]
    per_exit = torch_all_exits(model, texts)
    threshold = splitting_threshold("entropy", per_exit)
    tokens = [model.encode(*_split(t)) for t in texts]
    t_logits, t_layers = model.predict_tokens_early_exit(tokens, "entropy", threshold, batch_size=8)
    o_logits, o_layers = eng.run_batches(eng.make_batches([t.tolist() for t in tokens], 8), len(tokens), "entropy",
                                         threshold)
    ort_all = exit_parity.all_exits(eng, [t.tolist() for t in tokens], 8)
    exit_parity.assert_same_exits("entropy", threshold, per_exit, ort_all, (t_logits.numpy(), t_layers.numpy()),
                                  (o_logits, o_layers), ATOL)
    assert 3 in o_layers.tolist()
