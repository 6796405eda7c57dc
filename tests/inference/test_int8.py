"""``acl-export --quantize int8``: a static int8 copy whose answers depend neither on the batch nor on the CPU kind.

The exported graphs are run here with onnxruntime directly (``benchmarks/_int8_chain.py``), layer by layer over
every exit, so that the checks see every exit's logits. The AVX2 check runs the same chain under
``qemu-x86_64 -cpu EPYC-Rome`` (an AMD EPYC with AVX2 and no AVX-512/VNNI), where onnxruntime picks its AVX2
kernels; on this kind of CPU full-range int8 weights saturate (dynamic int8: logit error 2.66 against 0.03 on a VNNI
machine).
"""
import json
import os
import shutil

import numpy as np
import pytest

import _int8_chain as probe
import helpers
from serve_helpers import exported as serve_export  # noqa: F401  (a fixture: the serving tests' int8 export)


@pytest.fixture(scope="module")
def exported(predict_run, predict_model, serve_export, tmp_path_factory):  # noqa: F811
    """predict_run's tiny multi-exit model through acl-export --format onnx --quantize int8 --metrics-split none
    (the folder the acl-serve tests serve, exported once for both: an export took 10-20 s of make test; read
    only here), and a dynamic copy of the same fp32 graphs (``--quantize int8-dynamic``'s scheme), for contrast."""
    from acl_fairseq.hf import onnx_quantize

    _, data, ckpt = predict_run
    folder = serve_export["folder"]
    m = json.load(open(os.path.join(folder, "manifest.json")))
    assert "int8" in m["quantized"]  # the serving tests' folder is the int8 export this file checks
    dynamic = str(tmp_path_factory.mktemp("int8") / "dynamic")
    os.makedirs(dynamic)
    for rec in m["layers"]:
        onnx_quantize.quantize_graph(os.path.join(folder, rec["file"]), os.path.join(dynamic, rec["file"]),
                         onnx_quantize.SCHEMES["int8-dynamic"])
    texts, _ = helpers.raw_split(data)
    return {"folder": folder, "data": data, "ckpt": ckpt, "texts": texts, "rows": valid_rows(data),
            "dynamic": dynamic, "manifest": m, "hub": predict_model}


def valid_rows(data: str):
    """The validation split's first sentences as the model reads them (``<s>`` + the binarized tokens): text
    like the training split's, whose ranges set the scales (random tokens would leave them)."""
    from fairseq.data import Dictionary, data_utils

    words = Dictionary.load(os.path.join(data, "input0", "dict.txt"))
    split = data_utils.load_indexed_dataset(os.path.join(data, "input0", "valid"), words)
    return [np.array([words.bos()] + split[i].tolist(), dtype=np.int64) for i in range(len(split))]


def test_the_int8_copy_is_static_with_7_bit_per_channel_weights_so_avx2_kernels_cannot_saturate(exported):
    """u8 x s8 kernels without VNNI add two products in 16 bits: 2 * 255 * 127 = 64770 overflows int16,
    2 * 255 * 64 = 32640 fits. Every activation scale is a constant of the graph (nothing is measured per call)."""
    import onnx
    from onnx import numpy_helper

    int8 = exported["manifest"]["quantized"]["int8"]
    method = int8["method"]
    assert (method["kind"], method["batch_dependent"], method["reduce_range"]) == ("static", False, True)
    assert method["calibration"] == {"split": "train", "rows": 48, "seed": 0, "batch": 1}  # the toy train split
    for name in int8["layers"].values():
        graph = onnx.load(os.path.join(exported["folder"], name)).graph
        ops = [n.op_type for n in graph.node]
        assert "DynamicQuantizeLinear" not in ops and ops.count("QuantizeLinear") >= 4, name
        weights = [numpy_helper.to_array(t) for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
        assert weights and max(int(abs(w.astype(int)).max()) for w in weights) == 64, name
        # one scale per output channel: with one per matrix, 7 bits cost MiniLM 2.9 points of SST-2 (0.1 per channel)
        scales = [numpy_helper.to_array(t) for t in graph.initializer if t.name.endswith("_scale")]
        assert any(s.ndim == 1 and s.size > 1 for s in scales), name


def test_layernorm_softmax_gelu_and_the_exit_heads_stay_float(exported):
    import onnx

    folder = exported["folder"]
    for fp32_name, name in exported["manifest"]["quantized"]["int8"]["layers"].items():
        graph = onnx.load(os.path.join(folder, name)).graph
        produced_by = {o: n.op_type for n in graph.node for o in n.output}
        for node in graph.node:
            if node.op_type not in ("MatMul", "Gemm", "QuantizeLinear", "DequantizeLinear"):
                # a float op reads float tensors, never a dequantized copy (the residual Adds beside the
                # projections read x itself, not x rounded to 8 bits)
                assert all(produced_by.get(i) != "DequantizeLinear" for i in node.input), (name, node.name)
        float_ops = [n.op_type for n in onnx.load(os.path.join(folder, fp32_name)).graph.node]
        ops = [n.op_type for n in graph.node]
        for op in ("LayerNormalization", "Softmax"):
            assert ops.count(op) == float_ops.count(op), (name, op)
        assert ops.count("BiasGelu") == float_ops.count("Erf") and "Erf" not in ops, name  # the GELU, fused
        heads = {t.name: t.data_type for t in graph.initializer if t.name.startswith("head.")}
        assert heads and set(heads.values()) == {onnx.TensorProto.FLOAT}, (name, heads)


def test_the_int8_gelu_is_one_biasgelu_op_with_the_unfused_copys_answers(exported, tmp_path):
    """The export fuses each layer's float GELU chain and fc1's bias Add (Add, Div, Erf, Add, Mul, Mul: six passes
    over the FFN activation between two integer MatMuls) into one com.microsoft ``BiasGelu``, which onnxruntime's
    session optimizer does not do (benchmarks/ort_fusions.py: 2 to 5% of a static MiniLM layer at batch 32). The same
    scheme and calibration without the fusion gives the same logits at every exit, to float rounding."""
    import onnx

    from acl_fairseq.hf import onnx_quantize

    folder, m = exported["folder"], exported["manifest"]
    assert m["quantized"]["int8"]["method"]["fused"] == ["BiasGelu"]
    feeds = onnx_quantize.layer_feeds(folder, m, onnx_quantize.calibration_rows(exported["hub"]))
    for rec in m["layers"]:
        onnx_quantize.quantize_graph(os.path.join(folder, rec["file"]), str(tmp_path / rec["file"]),
                                     onnx_quantize.SCHEMES["int8"], feeds[rec["file"]], fuse=False)
        assert "BiasGelu" not in [n.op_type for n in onnx.load(str(tmp_path / rec["file"])).graph.node]
    rows = exported["rows"]
    fused = probe.run_rows(folder, rows, 8, "int8")
    unfused = probe.run_rows(folder, rows, 8, "fp32", str(tmp_path))
    assert np.abs(fused - unfused).max() <= 1e-5 * max(1.0, np.abs(unfused).max())


def test_a_rows_int8_answer_does_not_depend_on_its_batch_and_the_dynamic_copys_does(exported):
    """Static scales: a row's logits at batch 1 equal those it gets among 3, 8 or 24 other rows (other padding
    lengths) to float rounding. The same check fails for dynamic int8, whose activation scales are each call's."""
    rows, folder = exported["rows"], exported["folder"]
    scale = np.abs(probe.run_rows(folder, rows, 1, "fp32")).max()
    static, dynamic = [], []
    for which, moved in (("int8", static), ("dynamic", dynamic)):
        layers = os.path.join(folder, "int8") if which == "int8" else exported["dynamic"]
        alone = probe.run_rows(folder, rows, 1, "fp32", layers)
        for batch in (3, 8, 24):
            moved.append(np.abs(alone - probe.run_rows(folder, rows, batch, "fp32", layers)).max())
    bound = 1e-5 * max(1.0, scale)
    assert max(static) <= bound, (static, bound)
    assert max(dynamic) > 100 * bound, (dynamic, bound)  # the check has teeth


def test_int8_is_close_to_fp32_and_not_the_fp32_files(exported):
    fp32 = probe.run_rows(exported["folder"], exported["rows"], 8, "fp32")
    int8 = probe.run_rows(exported["folder"], exported["rows"], 8, "int8")
    diff = np.abs(fp32 - int8).max()
    scale = np.abs(fp32).max()
    # quantized (not the fp32 graphs), within 5% of the logits' scale
    assert 0 < diff < 0.05 * scale, (diff, scale)


def test_calibration_rows_are_a_seeded_sample_of_the_training_split_as_the_task_builds_it(exported):
    from acl_fairseq.hf import onnx_quantize

    hub = exported["hub"]
    first, again = onnx_quantize.calibration_rows(hub, 20), onnx_quantize.calibration_rows(hub, 20)
    assert len(first) == 20 and all(np.array_equal(a, b) for a, b in zip(first, again))
    split = hub.task.dataset("train")
    every = {tuple(split[i]["net_input.src_tokens"].tolist()) for i in range(len(split))}
    assert all(tuple(r.tolist()) in every for r in first)
    assert all(r[0] == hub.task.source_dictionary.bos() for r in first)  # the task's <s>, pairs joined as trained
    assert len(onnx_quantize.calibration_rows(hub)) == len(split) == 48  # fewer rows than CALIBRATION_ROWS: all of them


def test_int8_without_a_training_split_is_refused_before_the_model_loads(exported, tmp_path, capsys):
    from acl_fairseq.hf import export

    data = tmp_path / "data"
    shutil.copytree(exported["data"], data, ignore=shutil.ignore_patterns("train.*"))
    argv = [exported["ckpt"], "--data", str(data), "--output", str(tmp_path / "out"), "--format", "onnx", "--quantize",
            "int8", "--metrics-split", "none"]
    err = helpers.refusal(export.main, argv, export.PROG)
    assert "int8-dynamic" in err, err
    assert os.path.join(str(data), "input0", "train.bin") in err and not (tmp_path / "out").exists()


def test_the_dynamic_option_states_its_batch_dependence(capsys):
    from acl_fairseq.hf import export, onnx_quantize

    with pytest.raises(SystemExit):
        export.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "int8-dynamic: activations scaled per call, so a row's answer can change with the rows that share its " \
           "batch" in text
    schemes = onnx_quantize.SCHEMES
    assert schemes["int8-dynamic"]["batch_dependent"] is True and schemes["int8"]["batch_dependent"] is False
    assert export.QUANTIZE == tuple(onnx_quantize.SCHEMES)


def test_acl_predict_int8_labels_agree_with_fp32(exported, tmp_path):
    from acl_runtime import predict

    src = tmp_path / "in.tsv"
    src.write_text("".join(f"{a}\t{b}\n" for a, b in exported["texts"]))
    records = {}
    for precision in ("fp32", "int8"):
        predict.main([exported["folder"], "--input", str(src), "--columns", "1,2", "--output",
                      str(tmp_path / f"{precision}.jsonl"), "--precision", precision, "--policy", "none"])
        records[precision] = [json.loads(x) for x in (tmp_path / f"{precision}.jsonl").read_text().splitlines()]
    fp32, int8 = records["fp32"], records["int8"]
    assert [r["id"] for r in fp32] == [r["id"] for r in int8] and len(fp32) == len(exported["texts"])
    gap = [abs(r["probabilities"][k] - s["probabilities"][k]) for r, s in zip(fp32, int8) for k in r["probabilities"]]
    assert 0 < max(gap) < 0.05, max(gap)
    for r, s in zip(fp32, int8):  # a label may flip only where fp32 itself is within the int8 error of a tie
        if r["label"] != s["label"]:
            assert abs(float(np.diff(list(r["probabilities"].values())))) < 2 * max(gap)
    agree = sum(r["label"] == s["label"] for r, s in zip(fp32, int8)) / len(fp32)
    assert agree >= 0.9, agree


@pytest.mark.slow  # two chains under CPU emulation: about 2 minutes
def test_int8_answers_are_the_same_on_an_avx2_only_cpu_and_8_bit_weights_would_not_be(exported, tmp_path):
    """The shipped copy gives its exact arithmetic (the QDQ graph run as written, in float: no CPU's integer kernel)
    on this CPU and under emulated AVX2 alike; the same scheme with full-range 8-bit weights does not under AVX2
    (its pair sums saturate there), which is why the copy holds on both kinds. The reference is the exact
    arithmetic, not this CPU: on an AVX2-only host both chains saturate alike, and qemu 7.2 (Debian 12) cannot
    emulate AVX-512 or VNNI, so a comparison of two emulated CPU models would see one kind twice."""
    from acl_fairseq.hf import onnx_quantize

    if shutil.which("qemu-x86_64") is None:
        helpers.skip_needed("qemu-x86_64", "scripts/system_packages.sh installs Debian's qemu-user")
    folder, rows = exported["folder"], exported["rows"]
    full = str(tmp_path / "full")
    os.makedirs(full)
    feeds = onnx_quantize.layer_feeds(folder, exported["manifest"], onnx_quantize.calibration_rows(exported["hub"]))
    for rec in exported["manifest"]["layers"]:
        onnx_quantize.quantize_graph(os.path.join(folder, rec["file"]), os.path.join(full, rec["file"]),
                         {**onnx_quantize.SCHEMES["int8"], "reduce_range": False}, feeds[rec["file"]])
    scale = max(1.0, np.abs(probe.run_rows(folder, rows, 8, "fp32")).max())
    exact = probe.run_rows(folder, rows, 8, "int8", exact=True)
    native = probe.run_rows(folder, rows, 8, "int8")
    emulated = probe.run_emulated(folder, rows, 8, "int8", cpu="EPYC-Rome")
    # the same answers to float rounding, on this CPU and on AVX2
    assert np.abs(native - exact).max() < 1e-4 * scale
    assert np.abs(emulated - exact).max() < 1e-4 * scale
    # full-range weights fail that check on AVX2: their pair sums saturate there (the arithmetic is deterministic)
    saturated = np.abs(probe.run_rows(folder, rows, 8, "fp32", full, exact=True) -
                       probe.run_emulated(folder, rows, 8, "fp32", "EPYC-Rome", full)).max()
    assert saturated > 1e-4 * scale, saturated


def test_acl_export_writes_the_folder_that_acl_predict_runs(serve_export, tmp_path):  # noqa: F811
    """acl-export --format onnx --quantize int8 end to end (the serving tests' export, made by export.main): OUT/onnx
    with its int8 copy, run by acl-predict."""
    from acl_runtime import predict

    folder = serve_export["folder"]
    assert sorted(os.listdir(os.path.dirname(folder))) == ["onnx"] and os.path.isdir(os.path.join(folder, "int8"))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in serve_export["texts"]))
    for precision in ("fp32", "int8"):
        predict.main([folder, "--input", str(src), "--output", str(tmp_path / f"{precision}.jsonl"),
                      "--precision", precision])
    fp32, int8 = ([json.loads(line) for line in (tmp_path / f"{p}.jsonl").read_text().splitlines()]
                  for p in ("fp32", "int8"))
    assert len(fp32) == len(int8) > 0 and [r["id"] for r in fp32] == [r["id"] for r in int8]
    # the same answers but where fp32 itself is within int8's error of a tie (tests/inference/test_int8.py measures
    # more)
    for r, q in zip(fp32, int8):
        p, pq = (np.array(list(x["probabilities"].values())) for x in (r, q))
        assert np.abs(p - pq).max() < 0.1 and (r["label"] == q["label"] or np.ptp(p) < 0.2), (r, q)
