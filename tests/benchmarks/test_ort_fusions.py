"""benchmarks/ort_fusions.py --toy: the whole benchmark end to end on the tiny toy model (trained, exported with
int8, every system timed, the layer and served-path profiles), and what it must find on any model: the fusions
change no answer, and the static copies' answers do not depend on the batch."""
import json

import pytest

import ort_fusions

pytestmark = pytest.mark.slow  # the toy model's training and export, then every system once


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ort_fusions")
    out = str(root / "ort_fusions.json")
    ort_fusions.main(["--toy", "--work", str(root / "work"), "--json", out, "--repeats", "1", "--batch1", "8",
                      "--calibration", "16", "--examples", "40"])
    with open(out) as f:
        return json.load(f)


def test_toy_run_times_every_system_and_profiles_the_served_path(toy_run):
    rows = {r["system"]: r for r in toy_run["rows"]}
    assert list(rows) == [s["name"] for s in ort_fusions.systems()]
    assert all(r["b1_ms"] > 0 and r["b32_ms"] > 0 and r["call_us"] > 0 for r in rows.values())
    assert "BiasGelu" in rows["int8 static+BiasGelu, level all"]["new_ops"]
    assert toy_run["bert_optimizer_fusions"].get("BiasGelu") == 1
    served = {s["precision"]: s for s in toy_run["served_profiles"]}
    assert set(served) == {"fp32", "int8"} and served["int8"]["ops_s"].get("BiasGelu", 0) > 0
    assert all(s["calls"] > 0 and s["kernel_s"] <= s["model_run_s"] for s in served.values())
    setup = toy_run["setup"]
    assert setup["toy"] and setup["threads"] == 1 and "cpu_kind" in setup and setup["examples"] == 40


def test_fusions_keep_the_answers_and_static_int8_is_batch_invariant(toy_run):
    for r in toy_run["rows"]:
        if "dynamic" in r["system"]:
            continue
        # a row's logits alone and in a batch of 32 alike
        assert r["b1_vs_b32"] <= 1e-5, r
        # probabilities within 1e-5 of the reference, but for int8 at level basic: its QDQ graph is run as written
        # (float MatMuls on dequantized tensors), not by the integer kernels that levels extended and all choose
        if r["system"] != "int8 static, level basic":
            assert r["d_prob"] <= 1e-5, r
