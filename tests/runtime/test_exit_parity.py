"""tests/exit_parity.py, the rule every parity test that compares two engines' exits uses: a row may differ only
where its decision lies within the engines' measured difference of the threshold."""
import numpy as np
import pytest

import exit_parity

# two exits, two classes; row 0 is far from any threshold, row 1's first-exit top probability is 0.75 exactly
REF = np.array([[[4.0, -4.0], [5.0, -5.0]], [[np.log(3.0), 0.0], [2.0, 0.0]]], dtype=np.float32)


def _run(per_exit, threshold):
    """(logits, layers) of the confidence policy over ``per_exit`` (the first exit whose top probability reaches
    the threshold, else the last)."""
    top = exit_parity.decision_values("confidence", per_exit)
    layer = np.where(top[:, 0] >= threshold, 0, 1)
    return per_exit[np.arange(len(per_exit)), layer], layer + 1


def test_a_row_at_the_threshold_may_flip_within_the_measured_difference():
    other = REF + np.float32(2e-6) * np.array([[[0, 0], [0, 0]], [[-1, 0], [0, 0]]], dtype=np.float32)
    ref_out, other_out = _run(REF, 0.75), _run(other, 0.75)
    assert ref_out[1].tolist() == [1, 1] and other_out[1].tolist() == [1, 2]  # row 1 flipped
    assert exit_parity.assert_same_exits("confidence", 0.75, REF, other, ref_out, other_out, 1e-5) == [1]


def test_a_flip_beyond_the_measured_difference_fails():
    other = REF.copy()
    other[0, 0] = [-4.0, 4.0]  # row 0's label moves at exit 1, far from any tie, and its exit with it at 0.99
    ref_out, other_out = _run(REF, 0.99), _run(other, 0.99)
    tiny = REF + np.float32(1e-7)
    with pytest.raises(AssertionError, match="example 0"):  # measured on engines that agree: no reach at all
        exit_parity.assert_same_exits("confidence", 0.99, REF, tiny, ref_out, other_out, 1e-5)


def test_the_reach_grows_with_the_engines_measured_difference():
    near, far = REF + np.float32(1e-6), REF.copy()
    far[:, :, 0] += np.float32(1e-3)
    assert exit_parity.flip_tolerance("entropy", REF, far) > 100 * exit_parity.flip_tolerance("entropy", REF, near)
    assert exit_parity.flip_tolerance("entropy", REF, REF) == exit_parity.FLOOR


def test_agreeing_rows_must_agree_in_their_logits_too():
    ref_out = _run(REF, 0.5)
    moved = (ref_out[0] + np.float32(1e-3), ref_out[1])
    with pytest.raises(AssertionError, match="example 0"):
        exit_parity.assert_same_exits("confidence", 0.5, REF, REF, ref_out, moved, 1e-5)
