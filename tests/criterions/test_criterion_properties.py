"""Properties that `make mutation` found unchecked: each test here failed on a mutant that survived the
criterion and loss tests (docs/tests.md, "Mutation score", lists them)."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

import helpers
from acl_torch import losses
from test_criterions import _cosine, _two_pass_reference, build


@pytest.fixture(scope="module")
def data3(tmp_path_factory):
    # three classes: on the two-class toy data ACL-Embed's cosine with CE is negative at initialisation,
    # here it is positive (0.63), so a threshold of 0 and one of 1 decide differently
    return helpers.make_data(str(tmp_path_factory.mktemp("kills") / "data"), num_classes=3)["data"]


# ---- losses.py ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_self_distillation_of_half_precision_logits_is_computed_in_float32(dtype):
    torch.manual_seed(0)
    student, teacher = (torch.randn(6, 5) * 4).to(dtype), (torch.randn(6, 5) * 4).to(dtype)
    got = losses.self_distillation_loss(student, teacher, 2.0)
    assert got.dtype == torch.float32
    # the same float32 operations on the same (representable) values: bit-identical
    assert float(got) == float(losses.self_distillation_loss(student.float(), teacher.float(), 2.0))


@pytest.mark.parametrize("student_dtype,teacher_dtype",
                         [(torch.float64, torch.float32), (torch.float32, torch.float64)])
def test_self_distillation_with_one_float64_side_is_computed_in_float64(student_dtype, teacher_dtype):
    torch.manual_seed(0)
    student, teacher = torch.randn(6, 5, dtype=student_dtype), torch.randn(6, 5, dtype=teacher_dtype)
    got = losses.self_distillation_loss(student, teacher, 2.0)
    assert got.dtype == torch.float64
    assert float(got) == float(losses.self_distillation_loss(student.double(), teacher.double(), 2.0))


def _wide(x: torch.Tensor, yes: bool) -> torch.Tensor:
    return x.double() if yes else x


# one exit (one call) and two exits of one shape (one batched product): the two paths of each function
@pytest.mark.parametrize("n_exits", [1, 2])
@pytest.mark.parametrize("wide", ["students", "teacher", "label_embeddings"])
def test_cross_layer_losses_are_float64_when_any_input_is(n_exits, wide):
    torch.manual_seed(0)
    students = [_wide(torch.randn(6, 4), wide == "students") for _ in range(n_exits)]
    teacher, emb = _wide(torch.randn(6, 4), wide == "teacher"), _wide(torch.randn(3, 4), wide == "label_embeddings")
    labels = torch.tensor([0, 1, 2, 0, 1, 1])
    got = losses.cross_layer_acl_losses(students, teacher, labels, emb, 0.5)
    want = losses.cross_layer_acl_losses([s.double() for s in students], teacher.double(), labels, emb.double(), 0.5)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("n_exits", [1, 2])
@pytest.mark.parametrize("wide", ["features", "label_embeddings"])
def test_acl_embed_losses_are_float64_when_any_input_is(n_exits, wide):
    torch.manual_seed(0)
    feats = [_wide(torch.randn(6, 4), wide == "features" and m == 0) for m in range(n_exits)]
    embs = [_wide(torch.randn(3, 4), wide == "label_embeddings" and m == 0) for m in range(n_exits)]
    labels = torch.tensor([0, 1, 2, 0, 1, 1])
    got = losses.acl_embed_losses(feats, labels, embs, 0.5)
    want = losses.acl_embed_losses([f.double() for f in feats], labels, [w.double() for w in embs], 0.5)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


class _FactoryDevices(TorchFunctionMode):
    """Records the ``device`` argument of every tensor factory called inside it."""

    FACTORIES = (torch.arange, torch.eye, torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor)

    def __init__(self):
        super().__init__()
        self.devices = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FACTORIES:
            self.devices.append(kwargs.get("device"))
        return func(*args, **kwargs)


def test_the_contrastive_losses_create_their_tensors_on_the_inputs_device():
    # STYLE.md: the device comes from the inputs. Without a GPU a factory that falls back to the CPU computes
    # the same values, so the factories' device argument is what a CPU run can check
    torch.manual_seed(0)
    feats, labels, emb = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 1]), torch.randn(3, 4)
    with _FactoryDevices() as mode:
        losses.supcon_loss(feats, labels, 0.5)
        losses.acl_embed_losses([feats, feats], labels, [emb, emb], 0.5)
        losses.cross_layer_acl_losses([feats, feats], feats, labels, emb, 0.5)
    assert mode.devices and all(d == feats.device for d in mode.devices), mode.devices


def test_each_row_is_normalized_on_its_own_scale_in_a_batch_mixing_magnitudes():
    # norm(v) is scale-invariant per row: rows of 1e-25 and of 1e25 side by side in float32 give the loss of the
    # same directions at scale 1 (one scale for the whole batch would flush the small rows to zero)
    torch.manual_seed(0)
    unit, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 1])
    mixed = unit * torch.tensor([1e-25, 1e25, 1e-25, 1e25, 1.0, 1e-25])[:, None]
    torch.testing.assert_close(losses.supcon_loss(mixed, labels, 0.5), losses.supcon_loss(unit, labels, 0.5))


def test_a_bad_anchor_mode_is_refused_naming_the_argument():
    feats, labels, emb = torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), torch.randn(2, 3)
    with pytest.raises(ValueError, match=r"^anchors must be one of \('all', 'samples'\), got 'labels'$"):
        losses.acl_embed_loss(feats, labels, emb, 0.5, anchors="labels")


def test_a_bad_exit_weighting_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"^scheme must be one of \('layer', 'uniform'\), got 'depth'$"):
        losses.exit_weights([1, 2], "depth")


@pytest.mark.parametrize("scheme", ["layer", "uniform"])
def test_exit_weights_are_float32_whatever_the_default_dtype(scheme):
    # its documented dtype: float64 weights would promote a float32 model's CE and ACL terms to float64
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = losses.exit_weights([1, 3], scheme)
    finally:
        torch.set_default_dtype(before)
    assert got.dtype == torch.float32


# ---- the criteria -------------------------------------------------------------------------------
def test_acl_embed_logs_a_conflict_only_when_the_cosine_is_below_zero(data3):
    # METHOD.md: --log-grad-conflict on acl_embed measures the rule at threshold 0 (the flag has no threshold)
    _, model, crit, sample = build(data3, "acl_embed", extra=["--log-grad-conflict"], num_classes=3)
    model.train()
    cos = _cosine(*_two_pass_reference(model, crit, sample))
    assert 0.1 < cos < 0.9  # a threshold of 0 keeps the term, a threshold of 1 would drop it
    model.zero_grad()
    loss, _, log = crit(model, sample)
    loss.backward()  # the gate fills in the logged cosine and decision during the backward
    assert float(log["grad_cos"]) == pytest.approx(cos, abs=1e-4)
    assert float(log["conflict"]) == 0.0


@pytest.mark.parametrize("name,flags", [("sentence_scl", ["--scl-grad"]), ("acl_grad", [])])
@pytest.mark.parametrize("global_decision", [False, True])
def test_the_global_decision_flag_takes_the_decision_on_all_reduced_gradients(data3, monkeypatch, name, flags,
                                                                               global_decision):
    # one process posing as rank 0 of 2 whose all-reduce is the identity: the flag must route the gate's
    # gradients through it (test_distributed.py runs real ranks, outside make mutation's selection)
    from acl_torch import distributed

    calls = []
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "all_reduce_sum", lambda ts: calls.append(len(ts)) or [
        None if t is None else t.detach().float().clone() for t in ts])
    flag = {"sentence_scl": "--scl-grad-global-decision", "acl_grad": "--acl-grad-global-decision"}[name]
    extra = [*flags, *([flag] if global_decision else [])]
    _, model, crit, sample = build(data3, name, extra=extra, num_classes=3)
    model.train()
    loss, _, log = crit(model, sample)
    loss.backward()
    assert float(log["gated_steps"]) == 1.0
    assert bool(calls) == global_decision
