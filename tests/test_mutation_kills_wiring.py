"""Properties of the criteria's wiring (the shared forward, the gate) that `make mutation` found unchecked by the
criterion and loss tests: each test here failed on a mutant that survived them (docs/tests.md, "Mutation score")."""
import pytest
import torch

from acl_fairseq.criterions import gating


def _gated_linear(loss_scaler: bool, scope: str = "params"):
    """A gate over a tiny linear layer: (gated loss, its log, the layer)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    out = layer(torch.randn(4, 3))
    ce, aux = out[:, 0].sum(), (out * torch.randn(4, 2)).sum()
    loss, log = gating.gate(layer, None, ce, aux, scope, 0.0, loss_scaler=loss_scaler)
    return loss, log, layer


def test_without_a_loss_scaler_a_non_finite_gradient_raises():
    loss, _, _ = _gated_linear(loss_scaler=False)
    with pytest.raises(FloatingPointError):
        (loss * float("inf")).backward()


def test_with_a_loss_scaler_a_non_finite_gradient_is_passed_on_and_counted_as_an_overflow_only():
    # fairseq's loss scaler skips the step: the gate must not raise, and the step is no decision
    loss, log, layer = _gated_linear(loss_scaler=True)
    (loss * float("inf")).backward()
    assert not torch.isfinite(layer.weight.grad).all()
    assert float(log["acl_grad_overflow"]) == 1.0
    assert float(log["gated_steps"]) == 0.0 and float(log["grad_cos"]) == 0.0


@pytest.mark.parametrize("loss_scaler", [False, True])
def test_a_finite_gradient_is_a_decision_and_no_overflow(loss_scaler):
    loss, log, _ = _gated_linear(loss_scaler=loss_scaler)
    loss.backward()
    assert float(log["acl_grad_overflow"]) == 0.0
    assert float(log["gated_steps"]) == 1.0 and float(log["grad_cos"]) != 0.0
