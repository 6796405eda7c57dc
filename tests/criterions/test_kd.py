"""multi_exit_kd: the self-distillation baseline against a plain KL loop, and as fairseq builds it."""
import math

import pytest
import torch

import helpers
from acl_torch import losses
from test_criterions import build


def kd_loop(student, teacher, temperature):
    """The obvious reference: T^2 * mean_i sum_k p_ik (log p_ik - log q_ik), one example at a time."""
    total = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist()):
        zs = [v / temperature for v in s_row]
        zt = [v / temperature for v in t_row]
        ls = math.log(sum(math.exp(v) for v in zs))
        lt = math.log(sum(math.exp(v) for v in zt))
        total += sum(math.exp(b - lt) * ((b - lt) - (a - ls)) for a, b in zip(zs, zt))
    return temperature ** 2 * total / len(student)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_self_distillation_equals_a_plain_kl_loop(dtype, temperature):
    g = torch.Generator().manual_seed(3)
    student = torch.randn(7, 4, generator=g, dtype=dtype) * 3
    teacher = torch.randn(7, 4, generator=g, dtype=dtype) * 3
    got = losses.self_distillation_loss(student, teacher, temperature)
    assert got.dtype == dtype
    assert got.item() == pytest.approx(kd_loop(student, teacher, temperature), rel=1e-5)


def test_self_distillation_is_zero_on_the_teacher_and_stops_its_gradient():
    teacher = torch.randn(5, 3, requires_grad=True)
    student = teacher.detach().clone().requires_grad_(True)
    loss = losses.self_distillation_loss(student, teacher, 2.0)
    assert abs(loss.item()) < 1e-6
    (losses.self_distillation_loss(student + 1.0 * torch.eye(5, 3), teacher, 2.0)).backward()
    assert teacher.grad is None and student.grad is not None and student.grad.abs().sum() > 0


def test_self_distillation_is_finite_for_huge_logits_and_refuses_bad_temperatures():
    student = torch.tensor([[1e4, -1e4], [-1e4, 1e4]])
    teacher = torch.tensor([[-1e4, 1e4], [-1e4, 1e4]])
    assert torch.isfinite(losses.self_distillation_loss(student, teacher, 1.0))
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            losses.self_distillation_loss(student, teacher, bad)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("kd") / "data"))["data"]


def test_multi_exit_kd_is_weighted_ce_plus_mu_times_the_mean_student_kl(data):
    from acl_fairseq.heads import collect_exit_outputs

    _, model, crit, sample = build(data, "multi_exit_kd", arch="multi_exit_roberta",
                                   extra=["--kd-weight", "0.7", "--kd-temperature", "3"])
    model.eval()
    loss, n, log = crit(model, sample)
    exits = collect_exit_outputs(model, sample["net_input"], "sentence_classification_head")
    target = sample["target"].view(-1)
    ce = [torch.nn.functional.cross_entropy(z.float(), target, reduction="sum").item() for z in exits.logits]
    ce_total = (1 * ce[0] + 2 * ce[1] + 3 * ce[2]) / 6  # layer weighting over exits 1-3
    kd = sum(kd_loop(z.detach(), exits.logits[-1].detach(), 3.0) for z in exits.logits[:-1]) / 2
    assert n == 8
    assert log["ce_loss"].item() == pytest.approx(ce_total, rel=1e-5)
    assert log["kd_loss"].item() == pytest.approx(kd * n, rel=1e-4)  # logged in the sum convention
    assert loss.item() == pytest.approx(ce_total + 0.7 * kd * n, rel=1e-4)


def test_multi_exit_kd_gradient_never_reaches_the_teacher_through_the_kd_term(data):
    _, model, crit, sample = build(data, "multi_exit_kd", arch="multi_exit_roberta", extra=["--kd-weight", "1"])
    model.eval()
    zero = build(data, "multi_exit_kd", arch="multi_exit_roberta", extra=["--kd-weight", "0"])[2]
    last = model.classification_heads["sentence_classification_head"].out_proj.weight
    grads = []
    for c in (crit, zero):
        model.zero_grad()
        c(model, sample)[0].backward()
        grads.append(last.grad.clone())
    assert torch.equal(grads[0], grads[1])  # the last exit's head sees CE only


@pytest.mark.parametrize("extra,match", [
    (["--kd-weight", "-1"], "--kd-weight must be a finite number >= 0"),
    (["--kd-weight", "nan"], "--kd-weight must be a finite number >= 0"),
    (["--kd-temperature", "0"], "--kd-temperature must be > 0"),
])
def test_multi_exit_kd_refuses_values_outside_their_meaning(data, extra, match):
    with pytest.raises(ValueError, match=match):
        build(data, "multi_exit_kd", arch="multi_exit_roberta", extra=extra)


def test_multi_exit_kd_needs_several_exits_and_class_labels(data, tmp_path):
    _, model, crit, sample = build(data, "multi_exit_kd", arch="roberta")
    with pytest.raises(ValueError, match="multi-exit"):
        crit(model, sample)
    reg = helpers.make_data(str(tmp_path / "reg"), regression=True)["data"]
    with pytest.raises(ValueError, match="sentence_ce"):
        build(reg, "multi_exit_kd", arch="multi_exit_roberta", extra=["--regression-target"], num_classes=1)
