"""Early-exit policies (acl_runtime/exits.py): pure tensor functions, decisions per example."""

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from acl_runtime import exits


def logits_for(predictions, margin=5.0, num_classes=2):
    """(B, K) logits whose argmax is ``predictions`` with a softmax margin."""
    out = torch.zeros(len(predictions), num_classes)
    out[torch.arange(len(predictions)), torch.tensor(predictions)] = margin
    return out


def test_entropy_of_one_hot_like_logits_is_zero_not_nan():
    logits = torch.tensor([[1e4, -1e4], [-1e4, 1e4], [1e4, 0.0]])
    for dtype in (torch.float32, torch.float16, torch.float64):
        h = exits.prediction_entropy(logits.to(dtype))
        assert h.dtype == torch.float32
        assert torch.isfinite(h).all()
        assert torch.allclose(h, torch.zeros(3))


def test_entropy_is_finite_for_huge_logits_in_many_classes():
    logits = torch.tensor([[1e4, -1e4, 3.0, 1e4], [0.0, 0.0, 0.0, -1e4]])
    h = exits.prediction_entropy(logits)
    assert torch.isfinite(h).all()
    assert h[0] == pytest.approx(math.log(2) / math.log(4), abs=1e-6)  # two tied classes
    assert h[1] == pytest.approx(math.log(3) / math.log(4), abs=1e-6)


@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_entropy_matches_the_definition(num_classes):
    torch.manual_seed(0)
    logits = torch.randn(7, num_classes, dtype=torch.float64) * 3
    p = logits.softmax(-1)
    reference = -(p * p.log()).sum(-1)
    raw = exits.prediction_entropy(logits, normalized=False)
    assert torch.allclose(raw.double(), reference, atol=1e-6)
    assert torch.allclose(exits.prediction_entropy(logits).double(), reference / math.log(num_classes), atol=1e-6)
    assert exits.prediction_entropy(torch.zeros(1, num_classes)).item() == pytest.approx(1.0)


def test_prediction_entropy_of_one_hot_like_logits_is_zero_not_nan():
    logits = torch.tensor([[1e4, 0.0, 0.0], [0.0, -1e4, 1e4], [-1e4, 1e4, -1e4]])
    ent = exits.prediction_entropy(logits)
    assert ent.shape == (3,) and not torch.isnan(ent).any()
    torch.testing.assert_close(ent, torch.zeros(3))


def test_prediction_entropy_of_uniform_logits_is_one():
    torch.testing.assert_close(exits.prediction_entropy(torch.full((4, 5), 3.0)), torch.ones(4))
    torch.testing.assert_close(exits.prediction_entropy(torch.zeros(2, 2)), torch.ones(2))


def test_prediction_entropy_with_one_class_is_zero():
    torch.testing.assert_close(exits.prediction_entropy(torch.tensor([[7.0], [-1e4]])), torch.zeros(2))


def test_prediction_entropy_matches_loop_reference():
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = []
    for row in logits.tolist():
        z = sum(math.exp(x) for x in row)
        want.append(-sum(math.exp(x) / z * math.log(math.exp(x) / z) for x in row) / math.log(4))
    # float32 out (the early-exit contract) for float64 in: compared at float32's precision
    torch.testing.assert_close(exits.prediction_entropy(logits).double(), torch.tensor(want, dtype=torch.float64),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_prediction_entropy_upcasts_half_and_has_finite_grads(half):
    logits = (torch.randn(5, 3, generator=torch.Generator().manual_seed(0)) * 1e4).to(half)
    logits.requires_grad_(True)
    ent = exits.prediction_entropy(logits)
    assert ent.dtype == torch.float32 and torch.isfinite(ent).all()
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_prediction_entropy_with_masked_minus_inf_logits_is_finite():
    logits = torch.tensor([[0.0, 0.0, float("-inf")], [5.0, float("-inf"), float("-inf")]])
    ent = exits.prediction_entropy(logits)
    torch.testing.assert_close(ent, torch.tensor([math.log(2) / math.log(3), 0.0]))


def test_entropy_exit_fires_on_the_finite_entropy_of_masked_minus_inf_logits():
    """A masked class (-inf logit) adds 0 * log 0 = 0 to the entropy the early-exit path compares:
    NaN there would never be below the threshold, so such a row would never exit."""
    inf = float("inf")
    masked = torch.tensor([[3.0, -inf, -inf], [0.0, 0.0, -inf], [-inf, 1e4, -inf]])
    h = exits.prediction_entropy(masked)
    torch.testing.assert_close(h, torch.tensor([0.0, math.log(2) / math.log(3), 0.0]))
    raw = exits.prediction_entropy(masked, normalized=False)
    torch.testing.assert_close(raw, torch.tensor([0.0, math.log(2), 0.0]))
    per_exit = [masked, torch.zeros(3, 3)]
    assert exits.entropy_step(masked, exits.init_state(3), 0.1)[0].tolist() == [True, False, True]
    assert exits.entropy_exit_layer(per_exit, 0.1).tolist() == [0, 1, 0]
    assert exits.exit_layer_indices(per_exit, "entropy", 0.7).tolist() == [0, 0, 0]
    fire, _ = exits.policy_step("entropy", masked, exits.init_state(3), 0.1)  # the engine's incremental form
    assert fire.tolist() == [True, False, True]


def test_entropy_exit_is_decided_per_example():
    confident, unsure = [8.0, -8.0], [0.1, 0.0]
    per_exit = [
        torch.tensor([confident, unsure, unsure]),
        torch.tensor([unsure, confident, unsure]),
        torch.tensor([unsure, unsure, unsure]),
    ]
    assert exits.exit_layer_indices(per_exit, "entropy", 0.1).tolist() == [0, 1, 2]
    assert exits.entropy_exit_layer(per_exit, 0.1).tolist() == [0, 1, 2]


def test_confidence_exit_is_decided_per_example():
    per_exit = [torch.tensor([[3.0, 0.0], [0.2, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 3.0]])]
    assert exits.confidence_exit_layer(per_exit, 0.9).tolist() == [0, 1]
    assert exits.confidence_step(per_exit[0], exits.init_state(2), 0.9)[0].tolist() == [True, False]


def test_patience_counts_consecutive_agreeing_exits():
    # rows: always 1; 0 then 1 1 0; alternating (never agrees twice in a row)
    preds = [[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 1]]  # exit-major: preds[m][row]
    per_exit = [logits_for(p) for p in preds]
    assert exits.patience_exit_layer(per_exit, 1).tolist() == [1, 2, 3]
    assert exits.patience_exit_layer(per_exit, 2).tolist() == [2, 3, 3]
    assert exits.patience_exit_layer(per_exit, 3).tolist() == [3, 3, 3]


def test_patience_zero_means_the_last_exit():
    per_exit = [logits_for([1, 0])] * 4
    assert exits.patience_exit_layer(per_exit, 0).tolist() == [3, 3]


def test_patience_on_regression_uses_delta():
    values = [[0.50, 0.10], [0.51, 0.30], [0.515, 0.60]]  # row 0 settles, row 1 keeps moving
    per_exit = [torch.tensor(v).unsqueeze(1) for v in values]
    assert exits.patience_exit_layer(per_exit, 1, regression=True, delta=0.02).tolist() == [1, 2]
    assert exits.patience_exit_layer(per_exit, 2, regression=True, delta=0.02).tolist() == [2, 2]
    assert exits.patience_exit_layer(per_exit, 1, regression=True, delta=0.5).tolist() == [1, 1]


@pytest.mark.parametrize("policy,never,always", [("entropy", 0.0, 1.01), ("confidence", 1.01, 0.0)])
def test_threshold_that_never_fires_gives_last_exit_and_always_fires_gives_first(policy, never, always):
    torch.manual_seed(0)
    per_exit = [torch.randn(6, 3) for _ in range(4)]
    assert exits.exit_layer_indices(per_exit, policy, never).tolist() == [3] * 6
    assert exits.exit_layer_indices(per_exit, policy, always).tolist() == [0] * 6


@pytest.mark.parametrize("policy,value", [("entropy", 0.3), ("confidence", 0.9), ("patience", 1), ("patience", 2)])
def test_incremental_form_with_leaving_rows_matches_offline_form(policy, value):
    torch.manual_seed(1)
    per_exit = [torch.randn(32, 3) * 2 for _ in range(5)]
    offline = exits.exit_layer_indices(per_exit, policy, value)
    # what the layer-by-layer engine does: rows that fire leave the batch and the state
    chosen = torch.full((32,), 4)
    rows, state = torch.arange(32), exits.init_state(32)
    for m, logits in enumerate(per_exit[:-1]):
        fire, state = exits.policy_step(policy, logits[rows], state, value)
        chosen[rows[fire]] = m
        rows, state = rows[~fire], state[~fire]
    assert torch.equal(chosen, offline)
    assert 0 < (offline < 4).sum() < 32, "the test should mix early and late exits"


def test_gather_exit_logits_picks_each_examples_exit():
    per_exit = [torch.full((3, 2), float(m)) for m in range(3)]
    picked = exits.gather_exit_logits(per_exit, torch.tensor([2, 0, 1]))
    assert picked[:, 0].tolist() == [2.0, 0.0, 1.0]


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown early-exit policy"):
        exits.exit_layer_indices([torch.zeros(1, 2)], "entropie", 0.1)


# ---- the table: ranges, defaults, grids, and the numpy form every runtime shares -----------------------------

OUT_OF_RANGE = [("entropy", 1.5), ("entropy", -0.1), ("entropy", float("nan")), ("entropy", float("inf")),
                ("confidence", 2.0), ("confidence", -1.0), ("confidence", float("nan")),
                ("patience", 0), ("patience", -1), ("patience", 2.5), ("patience", float("nan")),
                ("patience", float("inf"))]
RANGE_TEXT = {"entropy": r"\[0, 1\]", "confidence": r"\[0, 1\]", "patience": r"a positive integer \(1, 2, \.\.\.\)"}


@pytest.mark.parametrize("policy,threshold", OUT_OF_RANGE)
def test_validate_refuses_nan_and_out_of_range_naming_the_range(policy, threshold):
    with pytest.raises(ValueError, match=f"{policy} threshold .*it takes {RANGE_TEXT[policy]}"):
        exits.validate(policy, threshold)


def test_validate_keeps_the_ends_returns_counts_as_int_and_defaults():
    assert exits.validate("entropy", 0.0) == 0.0 and exits.validate("entropy", 1.0) == 1.0
    assert exits.validate("confidence", 1) == 1.0 and exits.validate("confidence", 0.0) == 0.0
    count = exits.validate("patience", 2.0)
    assert count == 2 and isinstance(count, int)
    assert {p: exits.validate(p) for p in exits.POLICIES} == {"entropy": 0.3, "patience": 2, "confidence": 0.9}
    with pytest.raises(ValueError, match="unknown early-exit policy 'entropie'; expected one of entropy, patience"):
        exits.validate("entropie", 0.3)


def test_regression_runs_patience_only_with_delta():
    assert exits.validate("patience", 3, regression=True) == 3
    for policy in ("entropy", "confidence"):
        with pytest.raises(ValueError, match="needs class probabilities: a regression head runs patience only.*delta"):
            exits.validate(policy, 0.5, regression=True)


def test_a_nan_threshold_never_decides_silently():
    with pytest.raises(ValueError, match="threshold is NaN"):
        exits.exit_layer_indices([torch.zeros(2, 2)], "confidence", float("nan"))


@pytest.mark.parametrize("name", list(exits.POLICIES))
def test_every_row_of_the_table_is_consistent_and_numpy_equals_torch(name):
    """What any policy added to the table must satisfy: its default and grid are in its own range, and the
    numpy form (the serving runtime's) decides as the torch callers' form does, offline and incrementally."""
    row = exits.POLICIES[name]
    assert row.name == name and row.rule and row.flag.startswith("--")
    for value in [row.default] + row.sweep(5):
        assert exits.validate(name, value) == value
    g = torch.Generator().manual_seed(2)
    per_exit = [torch.randn(40, 3, generator=g) * 2 for _ in range(5)]
    mixed = 0
    for threshold in row.sweep(5):
        offline = exits.exit_layer_indices(per_exit, name, threshold)
        assert offline.dtype == torch.long
        mixed += bool(0 < (offline < 4).sum() < 40)
        as_numpy = exits.exit_layer_indices([x.numpy() for x in per_exit], name, threshold)
        assert isinstance(as_numpy, np.ndarray) and as_numpy.tolist() == offline.tolist()
        fire, state = exits.policy_step(name, per_exit[0].half(), exits.init_state(40, "cpu"), threshold)
        assert fire.dtype == torch.bool and state.dtype == torch.float32 and state.shape == (40, 2)
    assert mixed, "some threshold of the grid should split the examples between exits"


def test_torch_callers_get_tensors_of_todays_dtype_back():
    logits = [torch.randn(4, 3, dtype=torch.float16) for _ in range(2)]
    picked = exits.gather_exit_logits(logits, torch.tensor([1, 0, 1, 0]))
    assert picked.dtype == torch.float16 and torch.equal(picked[1], logits[0][1])
    assert exits.prediction_entropy(logits[0]).dtype == torch.float32
    h = exits.prediction_entropy(logits[0].numpy())
    assert isinstance(h, np.ndarray) and h.dtype == np.float32
    np.testing.assert_allclose(h, exits.prediction_entropy(logits[0]).numpy(), atol=1e-6)
    assert isinstance(exits.init_state(3), np.ndarray) and np.isnan(exits.init_state(3)[:, 0]).all()


def test_exits_runs_without_torch():
    """A serving runtime (ONNX Runtime, no torch) applies the same table: exits.py needs numpy only."""
    code = textwrap.dedent("""
        import sys
        sys.modules.update(torch=None, fairseq=None)  # any import of them now fails, as if not installed
        import numpy as np
        from acl_runtime import exits
        per_exit = [np.array([[3.0, 0.0], [0.1, 0.0]]), np.array([[0.0, 3.0], [0.0, 3.0]])]
        print(exits.exit_layer_indices(per_exit, "confidence", exits.validate("confidence")).tolist())
        print(exits.exit_layer_indices(per_exit, "patience", 1).tolist())
        print(exits.prediction_entropy(np.array([[1e4, -1e4, float("-inf")]])).tolist() == [0.0])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["[0, 1]", "[1, 1]", "True"], proc.stdout
