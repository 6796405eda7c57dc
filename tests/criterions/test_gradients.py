"""Tests of acl_torch.gradients: the gradient cosine of ACL-Grad's decision and its keep rule."""
import threading

import pytest
import torch
import torch.nn.functional as F

from acl_torch import gradients
from acl_torch.gradients import acl_grad_keep, gradient_cosine

TOL = dict(atol=1e-5, rtol=1e-5)


def _grad_lists(seed: int):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,), (2, 2, 2), (7,), (1,)]
    a = [torch.randn(s, generator=g) for s in shapes]
    b = [torch.randn(s, generator=g) for s in shapes]
    a[1] = None  # reached by loss b only
    b[3] = None  # reached by loss a only
    return a, b


def test_gradient_cosine_matches_cosine_of_concatenation_skipping_none():
    a, b = _grad_lists(0)
    both = [i for i in range(len(a)) if a[i] is not None and b[i] is not None]
    flat_a = torch.cat([a[i].reshape(-1) for i in both])
    flat_b = torch.cat([b[i].reshape(-1) for i in both])
    want = F.cosine_similarity(flat_a, flat_b, dim=0)
    got = gradient_cosine(a, b)
    assert got.dtype == torch.float32 and got.dim() == 0
    torch.testing.assert_close(got, want, **TOL)


def test_gradient_cosine_of_aligned_and_opposite_gradients():
    a, _ = _grad_lists(1)
    assert gradient_cosine(a, a).item() == pytest.approx(1.0, abs=1e-6)
    neg = [None if x is None else -2.0 * x for x in a]
    assert gradient_cosine(a, neg).item() == pytest.approx(-1.0, abs=1e-6)


def test_gradient_cosine_is_zero_for_zero_norm_or_no_shared_parameter():
    a, b = _grad_lists(2)
    zeros = [None if x is None else torch.zeros_like(x) for x in b]
    assert gradient_cosine(a, zeros).item() == 0.0
    assert gradient_cosine([a[0], None], [None, b[1]]).item() == 0.0
    assert gradient_cosine([], []).dtype == torch.float32


def test_gradient_cosine_upcasts_half_gradients():
    a, b = _grad_lists(3)
    a16 = [None if x is None else (x * 1e4).half() for x in a]
    b16 = [None if x is None else (x * 1e4).half() for x in b]
    got = gradient_cosine(a16, b16)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    want = gradient_cosine([None if x is None else x.float() for x in a16],
                           [None if x is None else x.float() for x in b16])
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError):
        gradient_cosine(a, b[:-1])


@pytest.mark.parametrize("scale", [1e20, 1e-25])
def test_gradient_cosine_is_exact_for_huge_and_tiny_finite_gradients(scale):
    """|g|^2 overflows float32 above ~1.8e19 (NaN cosine) and underflows below ~1e-19."""
    a, b = _grad_lists(4)
    want = gradient_cosine(a, b)
    a_s = [None if x is None else x * scale for x in a]
    b_s = [None if x is None else x * (scale * 3.0) for x in b]
    got = gradient_cosine(a_s, b_s)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_gradient_cosine_of_inf_or_nan_gradients_is_nan_never_a_number():
    a, b = _grad_lists(5)
    for bad in (float("inf"), float("nan")):
        b_bad = [None if x is None else x.clone() for x in b]
        b_bad[0].view(-1)[0] = bad
        assert torch.isnan(gradient_cosine(a, b_bad))
        assert torch.isnan(gradient_cosine(b_bad, a))


def test_a_nan_cosine_keeps_so_that_the_overflow_reaches_the_optimizer():
    """Never a silent drop: NaN >= threshold is False, which used to discard the term quietly."""
    assert bool(acl_grad_keep(torch.tensor(float("nan")), 0.0))
    assert bool(acl_grad_keep(torch.tensor(float("nan")), 2.0))


@pytest.mark.parametrize("cosine,threshold,keep", [
    (0.0, 0.0, True), (0.3, 0.0, True), (-0.1, 0.0, False),
    (0.5, 0.5, True), (0.49, 0.5, False), (-0.2, -0.3, True),
])
def test_acl_grad_keeps_iff_cosine_at_or_above_threshold(cosine, threshold, keep):
    got = acl_grad_keep(torch.tensor(cosine), threshold)
    assert got.dtype == torch.bool and bool(got) is keep



def _all_reduce_in_threads(parts_a, parts_b):
    """gradient_cosine on each part in its own thread, the reductions done across the threads as an
    all-reduce would do them across workers; returns every part's result."""
    n = len(parts_a)
    barrier, slots, results = threading.Barrier(n, timeout=60), [None] * n, [None] * n

    def reducer(op):
        def reduce(rank, x):
            slots[rank] = x
            barrier.wait()
            out = op(torch.stack(slots), dim=0)
            barrier.wait()  # every part has read the slots before the next reduction writes them
            return out
        return reduce

    def run(rank):
        results[rank] = gradient_cosine(
            parts_a[rank], parts_b[rank],
            sum_over=lambda x: reducer(torch.sum)(rank, x),
            max_over=lambda x: reducer(lambda t, dim: t.amax(dim=dim))(rank, x),
        )

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("scale", [1.0, 1e20, 1e-25])
def test_gradient_cosine_of_disjoint_parts_with_reduced_sums_equals_the_whole(scale):
    """The global decision's path (criterions.gating, features scope): each worker holds some rows'
    gradients and all-reduces the sums (and, where they overflow or underflow, the scales)."""
    a, b = _grad_lists(6)
    a = [None if x is None else x * scale for x in a]
    b = [None if x is None else x * (scale * 3.0) for x in b]
    want = gradient_cosine(a, b)
    if scale != 1.0:
        assert gradients.sums_need_rescaling(gradients.gradient_sums(a, b))  # the rescaled path runs
    # two workers: parameters 0 and 2 split by rows, the rest held by worker 0 only (None elsewhere)
    part = [[x[:1] if i in (0, 2) and x is not None else x for i, x in enumerate(g)] for g in (a, b)]
    other = [[x[1:] if i in (0, 2) and x is not None else None for i, x in enumerate(g)] for g in (a, b)]
    got = _all_reduce_in_threads([part[0], other[0]], [part[1], other[1]])
    for g in got:
        torch.testing.assert_close(g, want, atol=1e-6, rtol=1e-5)
    assert got[0].item() == got[1].item()  # every worker takes the same decision
