"""Tests of acl_torch.losses against the slow references in tests/loss_references.py (Python loops, and
``supcon_core``, the SupCon core per anchor written the obvious way), and their properties."""
import math

import pytest
import torch
import torch.nn.functional as F

from acl_torch import losses
from acl_torch.losses import (
    acl_embed_loss,
    cross_layer_acl_loss,
    exit_weights,
    supcon_loss,
    weighted_exit_sum,
)
from loss_references import (
    CASES,
    TEMPERATURES,
    as_float,
    make_case,
    ref_acl_embed_loss,
    ref_cross_layer_loss,
    ref_supcon_loss,
    ref_supcon_per_anchor,
    supcon_core,
)

FLOAT_DTYPES = [torch.float32, torch.float64]
HALF_DTYPES = [torch.float16, torch.bfloat16]
TOL = dict(atol=1e-5, rtol=1e-5)


def _approx():
    return dict(abs=TOL["atol"], rel=TOL["rtol"])


# ----------------------------------------------------------------------------------------------
# Agreement with the loop references
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tau", TEMPERATURES)
def test_supcon_loss_matches_loop_reference(dtype, case, tau):
    feats, labels, _, _ = make_case(case, dtype)
    got = supcon_loss(feats, labels, tau)
    assert got.dtype == dtype and got.dim() == 0
    assert as_float(got) == pytest.approx(ref_supcon_loss(feats, labels, tau), **_approx())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("anchors", ["all", "samples"])
@pytest.mark.parametrize("tau", TEMPERATURES)
def test_acl_embed_loss_matches_loop_reference(dtype, case, anchors, tau):
    feats, labels, emb, _ = make_case(case, dtype)
    got = acl_embed_loss(feats, labels, emb, tau, anchors=anchors)
    want = ref_acl_embed_loss(feats, labels, emb, tau, anchors)
    assert as_float(got) == pytest.approx(want, **_approx())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tau", TEMPERATURES)
def test_cross_layer_acl_loss_matches_loop_reference(dtype, case, tau):
    student, labels, emb, teacher = make_case(case, dtype)
    got = cross_layer_acl_loss(student, teacher, labels, emb, tau)
    want = ref_cross_layer_loss(student, teacher, labels, emb, tau)
    assert as_float(got) == pytest.approx(want, **_approx())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_supcon_core_matches_loop_reference_with_partial_self_mask(dtype):
    g = torch.Generator().manual_seed(3)
    a = F.normalize(torch.randn(5, 4, generator=g, dtype=torch.float64), dim=-1).to(dtype)
    b = F.normalize(torch.randn(7, 4, generator=g, dtype=torch.float64), dim=-1).to(dtype)
    a_y, b_y = torch.tensor([0, 1, 2, 0, 3]), torch.tensor([0, 0, 1, 2, 2, 1, 0])
    self_mask = torch.zeros(5, 7, dtype=torch.bool)
    self_mask[0, 0] = self_mask[1, 2] = self_mask[2, 6] = True
    per, valid = supcon_core(a, b, a_y, b_y, 0.3, self_mask)
    pairs = {tuple(ix) for ix in self_mask.nonzero().tolist()}
    want = ref_supcon_per_anchor(a.double().tolist(), b.double().tolist(), a_y.tolist(),
                                  b_y.tolist(), 0.3, pairs)
    assert valid.tolist() == [w is not None for w in want] == [True, True, True, True, False]
    assert per[4].item() == 0.0  # label 3 has no candidate: exactly 0
    for got_p, want_p in zip(per.tolist(), want):
        assert got_p == pytest.approx(want_p if want_p is not None else 0.0, **_approx())


# ----------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------
def test_supcon_loss_passes_gradcheck():
    feats, labels, _, _ = make_case("singleton_class", torch.float64)
    feats.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: supcon_loss(f, labels, 0.3), (feats,))


@pytest.mark.parametrize("anchors", ["all", "samples"])
def test_acl_embed_loss_passes_gradcheck(anchors):
    feats, labels, emb, _ = make_case("absent_class", torch.float64)
    feats.requires_grad_(True)
    emb.requires_grad_(True)
    fn = lambda f, e: acl_embed_loss(f, labels, e, 0.5, anchors=anchors)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (feats, emb))


def test_cross_layer_acl_loss_passes_gradcheck():
    student, labels, emb, teacher = make_case("singleton_class", torch.float64)
    student.requires_grad_(True)
    fn = lambda s: cross_layer_acl_loss(s, teacher, labels, emb, 0.5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (student,))


def _all_losses(feats, labels, emb, teacher):
    return {
        "supcon": supcon_loss(feats, labels, 0.1),
        "acl_embed_all": acl_embed_loss(feats, labels, emb, 0.1, "all"),
        "acl_embed_samples": acl_embed_loss(feats, labels, emb, 0.1, "samples"),
        "cross_layer": cross_layer_acl_loss(feats, teacher, labels, emb, 0.1),
    }


@pytest.mark.parametrize("scale", [1e-3, 1e4, 1e20, 1e-20])
def test_losses_are_scale_invariant_with_finite_grads_for_extreme_features(scale):
    """1e20 and 1e-20: ||v||^2 overflows (and underflows) float32, so rows are rescaled first."""
    feats, labels, emb, teacher = make_case("random_wide", torch.float32)
    want = _all_losses(feats, labels, emb, teacher)
    big = (feats * scale).requires_grad_(True)
    big_emb = (emb * scale).requires_grad_(True)
    got = _all_losses(big, labels, big_emb, teacher * scale)
    for name in want:
        assert torch.isfinite(got[name]), name
        torch.testing.assert_close(got[name], want[name], atol=1e-4, rtol=1e-4)
        big.grad = big_emb.grad = None
        got[name].backward(retain_graph=True)
        assert torch.isfinite(big.grad).all(), name
        if big_emb.grad is not None:
            assert torch.isfinite(big_emb.grad).all(), name


@pytest.mark.parametrize("half", HALF_DTYPES)
def test_half_precision_inputs_give_fp32_losses_and_finite_grads(half):
    feats, labels, emb, teacher = make_case("random_wide", torch.float32)
    feats_h = (feats * 1e4).to(half).requires_grad_(True)
    emb_h = (emb * 1e4).to(half).requires_grad_(True)
    got = _all_losses(feats_h, labels, emb_h, (teacher * 1e4).to(half))
    # the same rounded inputs, upcast by hand, are the fp32 reference
    want = _all_losses(feats_h.float(), labels, emb_h.float(), (teacher * 1e4).to(half).float())
    for name in got:
        assert got[name].dtype == torch.float32, name
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-5)
        feats_h.grad = emb_h.grad = None
        got[name].backward(retain_graph=True)
        assert feats_h.grad.dtype == half and torch.isfinite(feats_h.grad).all(), name


def test_zero_feature_vector_gives_finite_loss_and_grads():
    feats, labels, emb, teacher = make_case("random_wide", torch.float32)
    feats[2] = 0.0
    emb[1] = 0.0
    feats.requires_grad_(True)
    emb.requires_grad_(True)
    for name, loss in _all_losses(feats, labels, emb, teacher).items():
        feats.grad = emb.grad = None
        loss.backward()
        assert torch.isfinite(loss), name
        assert torch.isfinite(feats.grad).all(), name


# ----------------------------------------------------------------------------------------------
# Anchors without positives
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", ["n1", "all_distinct_labels"])
def test_supcon_without_positive_is_exact_zero_and_backprops(dtype, case):
    feats, labels, _, _ = make_case(case, dtype)
    feats.requires_grad_(True)
    loss = supcon_loss(feats, labels, 0.1)
    assert loss.item() == 0.0 and loss.dtype == dtype
    assert loss.requires_grad
    loss.backward()
    assert feats.grad is not None
    assert torch.equal(feats.grad, torch.zeros_like(feats.grad))


def test_no_positive_anchor_is_excluded_from_the_mean():
    # label 2 is a singleton: its anchor has no positive and must not dilute the mean
    feats, labels, _, _ = make_case("singleton_class", torch.float64)
    z = F.normalize(feats, dim=-1)
    per, valid = supcon_core(z, z, labels, labels, 0.3, torch.eye(6, dtype=torch.bool))
    assert valid.tolist() == [True, True, True, True, True, False]
    assert per[5].item() == 0.0
    torch.testing.assert_close(supcon_loss(feats, labels, 0.3), per[valid].mean())
    # reduce-sum equals the per-anchor sum
    torch.testing.assert_close(supcon_loss(feats, labels, 0.3) * valid.sum(), per.sum())


def test_acl_embed_absent_class_embedding_is_not_a_valid_anchor():
    feats, labels, emb, _ = make_case("absent_class", torch.float64)  # K = 4, labels in {0, 1}
    aug = F.normalize(torch.cat([feats, emb]), dim=-1)
    aug_y = torch.cat([labels, torch.arange(4)])
    _, valid = supcon_core(aug, aug, aug_y, aug_y, 0.5, torch.eye(9, dtype=torch.bool))
    assert valid.tolist() == [True] * 5 + [True, True, False, False]


def test_acl_embed_every_sample_has_its_label_embedding_as_positive():
    feats, labels, emb, _ = make_case("all_distinct_labels", torch.float64)
    loss = acl_embed_loss(feats, labels, emb, 0.5, anchors="samples")
    assert loss.item() > 0  # without label embeddings these anchors would have no positive


def test_cross_layer_counts_teachers_view_of_same_example_as_positive():
    # orthonormal examples, all labels distinct, teacher == student, l_k = u_k: anchor i has exactly
    # two positives (teacher's u_i and l_i) scoring 1/tau, and 2(N-1) negatives scoring 0
    n, tau = 4, 0.2
    student = torch.eye(n, dtype=torch.float64) * 3.0
    labels = torch.arange(n)
    got = cross_layer_acl_loss(student, student.clone(), labels, student.clone(), tau)
    want = math.log(2 * math.exp(1 / tau) + 2 * (n - 1)) - 1 / tau
    assert got.item() == pytest.approx(want, abs=1e-9)


# ----------------------------------------------------------------------------------------------
# Invariants
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_losses_are_invariant_to_batch_permutation(dtype):
    feats, labels, emb, teacher = make_case("random_wide", dtype, seed=5)
    perm = torch.randperm(feats.shape[0], generator=torch.Generator().manual_seed(1))
    want = _all_losses(feats, labels, emb, teacher)
    got = _all_losses(feats[perm], labels[perm], emb, teacher[perm])
    for name in want:
        torch.testing.assert_close(got[name], want[name], **TOL)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("tau", [0.05, 0.3, 1.0])
def test_supcon_equals_info_nce_when_single_positive(dtype, tau):
    n = 7
    g = torch.Generator().manual_seed(11)
    views = torch.randn(2 * n, 5, generator=g, dtype=torch.float64).to(dtype)
    labels = torch.cat([torch.arange(n), torch.arange(n)])  # each anchor's only positive: its twin
    # SimCLR's NT-Xent, written independently: cross-entropy over all other rows
    z = views / views.norm(dim=1, keepdim=True)
    sim = (z @ z.t() / tau).masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    targets = (torch.arange(2 * n) + n) % (2 * n)
    info_nce = F.cross_entropy(sim, targets)
    torch.testing.assert_close(supcon_loss(views, labels, tau), info_nce, **TOL)


@pytest.mark.parametrize("n", [2, 5, 9])
def test_supcon_at_high_temperature_tends_to_log_of_other_count(n):
    feats = torch.randn(n, 4, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    labels = torch.zeros(n, dtype=torch.long)
    # tau -> inf: every pair scores the same, so log p = -log(n - 1) for every positive
    assert supcon_loss(feats, labels, 1e8).item() == pytest.approx(math.log(n - 1), abs=1e-6)


def test_supcon_on_perfect_clusters_decreases_with_temperature_to_log_positive_count():
    # identical members per class, classes orthogonal: the positives take all the mass as tau -> 0
    feats = torch.eye(3, dtype=torch.float64)[[0, 0, 0, 1, 1, 2, 2, 2, 2]]
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    values = [supcon_loss(feats, labels, tau).item() for tau in (1.0, 0.5, 0.1, 0.01)]
    assert values == sorted(values, reverse=True)
    n_pos = [2, 2, 2, 1, 1, 3, 3, 3, 3]
    assert values[-1] == pytest.approx(sum(math.log(p) for p in n_pos) / 9, abs=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_supcon_core_depends_on_similarities_over_temperature_only(dtype):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 3, generator=g, dtype=torch.float64).to(dtype)
    b = torch.randn(6, 3, generator=g, dtype=torch.float64).to(dtype)
    a_y, b_y = torch.tensor([0, 1, 1, 2]), torch.tensor([1, 0, 2, 2, 1, 0])
    per, valid = supcon_core(a, b, a_y, b_y, 0.2)
    per_scaled, valid_scaled = supcon_core(a * 3.0, b, a_y, b_y, 0.6)
    torch.testing.assert_close(per, per_scaled, **TOL)
    assert torch.equal(valid, valid_scaled)


def test_cross_layer_teacher_gets_no_gradient():
    student, labels, emb, teacher = make_case("random_wide", torch.float64)
    student.requires_grad_(True)
    teacher.requires_grad_(True)
    emb.requires_grad_(True)
    cross_layer_acl_loss(student, teacher, labels, emb, 0.5).backward()
    assert teacher.grad is None and emb.grad is None
    assert student.grad is not None and student.grad.abs().sum() > 0


def test_cross_layer_shared_tensor_gets_student_gradient_only():
    x, labels, emb, _ = make_case("random_wide", torch.float64)
    x.requires_grad_(True)
    cross_layer_acl_loss(x, x, labels, emb, 0.5).backward()
    shared_grad = x.grad.clone()
    x.grad = None
    cross_layer_acl_loss(x, x.detach().clone(), labels, emb, 0.5).backward()
    torch.testing.assert_close(shared_grad, x.grad)


def test_invalid_arguments_raise_value_error():
    feats, labels, emb, _ = make_case("random_wide", torch.float32)
    with pytest.raises(ValueError):
        acl_embed_loss(feats, labels, emb, 0.5, anchors="labels")
    with pytest.raises(ValueError):
        supcon_loss(feats, labels, 0.0)
    # every public function checks its arguments once at entry (the fused core itself checks nothing)
    with pytest.raises(ValueError, match="anchors must be one of"):
        losses.acl_embed_losses([feats, feats], labels, [emb, emb], 0.5, anchors="labels")
    for tau in (0.0, -0.1):
        for call in (lambda tau=tau: acl_embed_loss(feats, labels, emb, tau),
                     lambda tau=tau: losses.acl_embed_losses([feats], labels, [emb], tau),
                     lambda tau=tau: cross_layer_acl_loss(feats, feats, labels, emb, tau),
                     lambda tau=tau: losses.cross_layer_acl_losses([feats, feats], feats, labels, emb, tau)):
            with pytest.raises(ValueError, match="temperature must be > 0"):
                call()


# ----------------------------------------------------------------------------------------------
# Multi-exit weighting
# ----------------------------------------------------------------------------------------------
def test_exit_weights_layer_scheme_is_proportional_to_layer_index():
    torch.testing.assert_close(exit_weights([1, 2, 3]), torch.tensor([1 / 6, 2 / 6, 3 / 6]))
    torch.testing.assert_close(exit_weights([2, 4], "layer"), torch.tensor([1 / 3, 2 / 3]))
    w = exit_weights(range(1, 13))
    assert w.dtype == torch.float32 and w.sum().item() == pytest.approx(1.0)


def test_exit_weights_uniform_scheme_is_equal():
    torch.testing.assert_close(exit_weights([1, 2, 3], "uniform"), torch.full((3,), 1 / 3))
    torch.testing.assert_close(exit_weights([2, 4], "uniform"), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(exit_weights([6], "layer"), torch.tensor([1.0]))


@pytest.mark.parametrize("layers,scheme", [([], "layer"), ([1, 2], "linear"), ([0, 1], "layer")])
def test_exit_weights_rejects_bad_arguments(layers, scheme):
    with pytest.raises(ValueError):
        exit_weights(layers, scheme)


def test_weighted_exit_sum_matches_manual_sum():
    values = [torch.tensor(2.0), torch.tensor(4.0, dtype=torch.float64), torch.tensor(-1.0)]
    w = exit_weights([1, 2, 3])
    got = weighted_exit_sum(values, w)
    assert got.item() == pytest.approx(2.0 / 6 + 8.0 / 6 - 3.0 / 6)
    with pytest.raises(ValueError):
        weighted_exit_sum(values[:2], w)


def test_weighted_exit_sum_backpropagates_to_each_exit():
    values = [torch.tensor(1.0, requires_grad=True) for _ in range(3)]
    weighted_exit_sum(values, exit_weights([1, 2, 3])).backward()
    assert [v.grad.item() for v in values] == pytest.approx([1 / 6, 2 / 6, 3 / 6])


@pytest.mark.parametrize("anchors", ["all", "samples"])
def test_batched_exit_losses_equal_one_call_per_exit(anchors):
    torch.manual_seed(5)
    n, k, d, m = 9, 3, 7, 4
    labels = torch.randint(0, k, (n,))
    feats = [torch.randn(n, d, dtype=torch.float64, requires_grad=True) for _ in range(m)]
    embs = [torch.randn(k, d, dtype=torch.float64, requires_grad=True) for _ in range(m)]
    batched = losses.acl_embed_losses(feats, labels, embs, 0.4, anchors=anchors)
    single = torch.stack([losses.acl_embed_loss(f, labels, e, 0.4, anchors=anchors) for f, e in zip(feats, embs)])
    assert torch.allclose(batched, single, atol=1e-10)
    g1 = torch.autograd.grad(batched.sum(), feats + embs)
    g2 = torch.autograd.grad(single.sum(), feats + embs)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(g1, g2))

    cl_batched = losses.cross_layer_acl_losses(feats[:-1], feats[-1], labels, embs[-1], 0.4)
    cl_single = torch.stack([losses.cross_layer_acl_loss(f, feats[-1], labels, embs[-1], 0.4) for f in feats[:-1]])
    assert torch.allclose(cl_batched, cl_single, atol=1e-10)
