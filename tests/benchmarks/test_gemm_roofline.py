"""benchmarks/gemm_roofline.py: one served layer in torch and onnxruntime beside its matrix products alone."""
import json

import pytest


@pytest.mark.slow  # builds a MiniLM-sized fairseq model and exports a layer: about 20 s
def test_the_roofline_times_one_checked_layer_and_derives_its_bound(tmp_path):
    import gemm_roofline

    rows = gemm_roofline.main(["--batch", "2", "--seq-len", "5", "--square", "64", "--repeats", "2",
                               "--json", str(tmp_path / "r.json")])
    assert [(r["what"], r["engine"]) for r in rows] == [(w, e) for w in ("layer", "gemms", "sgemm")
                                                        for e in ("torch", "onnxruntime")]
    at = {(r["what"], r["engine"]): r for r in rows}
    for engine in ("torch", "onnxruntime"):
        layer = at[("layer", engine)]
        assert layer["gemm_share"] == pytest.approx(at[("gemms", engine)]["cpu_ms"] / layer["cpu_ms"])
        assert layer["bound_vs_torch"] == pytest.approx(at[("layer", "torch")]["cpu_ms"] /
                                                        at[("gemms", engine)]["cpu_ms"])
        assert at[("sgemm", engine)]["vs_sgemm"] == 1.0 and all(r["gflops"] > 0 for r in rows)
    assert at[("layer", "onnxruntime")]["vs_torch"] == pytest.approx(
        at[("layer", "torch")]["cpu_ms"] / at[("layer", "onnxruntime")]["cpu_ms"])
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(rows))


@pytest.mark.slow  # the same model and export
def test_a_layer_export_that_differs_from_torch_is_refused(monkeypatch, tmp_path):
    import gemm_roofline

    real = gemm_roofline.export_layer

    def broken(layer, x, mask, path):  # the graph of a layer whose weights moved after the torch side was built
        import onnx
        from onnx import numpy_helper

        real(layer, x, mask, path)
        model = onnx.load(path)
        init = next(i for i in model.graph.initializer if len(i.dims) == 2 and i.data_type == onnx.TensorProto.FLOAT)
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
        onnx.save(model, path)

    monkeypatch.setattr(gemm_roofline, "export_layer", broken)
    with pytest.raises(SystemExit, match="the exported layer differs from torch's"):
        gemm_roofline.main(["--batch", "2", "--seq-len", "5", "--square", "64", "--repeats", "1",
                            "--json", str(tmp_path / "r.json")])
