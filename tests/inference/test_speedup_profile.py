"""Quality at fixed layer speed-ups and the area under the curve (METHOD.md "Quality against speed")."""
import pytest

from acl_fairseq.inference import report


def result(points, last=90.0):
    """A hand-made early_exit.json: entropy settings at the given (speed-up, accuracy) points."""
    return {
        "num_layers": 6,
        "per_exit": [{"layer": 6, "metrics": {"accuracy": last}}],
        "settings": [{"policy": "entropy", "threshold": i / 10, "layer_speedup": x, "metrics": {"accuracy": y}}
                     for i, (x, y) in enumerate(points)]
        + [{"policy": "confidence", "threshold": 0.9, "layer_speedup": 2.0, "metrics": {"accuracy": 0.0}}],
    }


def test_values_are_interpolated_between_neighbouring_thresholds():
    profile = report.speedup_profile(result([(1.2, 88.0), (2.0, 80.0), (3.5, 50.0)]))
    assert profile["metric"] == "accuracy" and profile["policy"] == "entropy"
    assert profile["at"]["1.5"] == pytest.approx(88.0 + (80.0 - 88.0) * 0.3 / 0.8)
    assert profile["at"]["2"] == pytest.approx(80.0)
    assert profile["at"]["3"] == pytest.approx(80.0 - 30.0 * 1.0 / 1.5)  # 60
    # trapezoids 1-1.2, 1.2-2, 2-3 (the last ends on the interpolated 60), over the width 2
    area = (0.2 * (90 + 88) / 2 + 0.8 * (88 + 80) / 2 + 1.0 * (80 + 60) / 2) / 2
    assert profile["area"] == pytest.approx(area)


def test_a_curve_that_stops_short_reports_nothing_beyond_it():
    profile = report.speedup_profile(result([(1.4, 88.0), (1.8, 85.0)]))
    assert profile["at"]["1.5"] == pytest.approx(88.0 - 3.0 * 0.1 / 0.4)
    assert profile["at"]["2"] is None and profile["at"]["3"] is None and profile["area"] is None


def test_a_constant_curve_has_that_constant_as_its_area_and_other_policies_are_ignored():
    profile = report.speedup_profile(result([(1.5, 70.0), (3.0, 70.0)], last=70.0))
    assert profile["at"] == {"1.5": 70.0, "2": 70.0, "3": 70.0}
    assert profile["area"] == pytest.approx(70.0)


def test_settings_with_equal_speed_ups_are_averaged():
    curve = report.quality_curve(result([(2.0, 80.0), (2.0, 70.0), (3.0, 60.0)]))
    assert curve == [(1.0, 90.0), (2.0, 75.0), (3.0, 60.0)]
