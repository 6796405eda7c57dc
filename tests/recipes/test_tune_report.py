"""benchmarks/_tune_report.py: the few-shot tuning study's report, from acl-tune --evaluate-best's best.json files:
the pairs by seed, their intervals, and the studies not yet run named."""
import json

import pytest

import _tune_report as tune_report


def _best(root, n, method, default, tuned, params):
    folder = root / f"N{n}" / method
    folder.mkdir(parents=True)
    (folder / "best.json").write_text(json.dumps({
        "trials_finished": 24, "best_trial": 3, "best_valid": 60.0, "best_params": params,
        "default": {"values": {str(s): v for s, v in enumerate(default, 1)}},
        "tuned": {"values": {str(s): v for s, v in enumerate(tuned, 1)}}}))


def test_report_pairs_by_seed_and_names_what_is_missing(tmp_path):
    _best(tmp_path, 20, "ce", [50, 52, 54], [51, 53, 55], {"lr": "1e-04"})
    _best(tmp_path, 20, "scl", [55, 50, 60], [56, 57, 59], {"lr": "2e-04", "lambda": "0.5", "tau": "0.1"})
    record = tune_report.collect(str(tmp_path), [20, 100], ["ce", "scl", "acl_embed"])
    assert record["missing"] == ["N=20 acl_embed", "N=100 ce", "N=100 scl", "N=100 acl_embed"]
    ce = record["studies"]["20"]["ce"]["tuned_minus_default"]
    assert ce["diffs"] == [1, 1, 1] and ce["lo"] == ce["hi"] == 1 and ce["verdict"] == "ahead"
    (tuned,) = [p for p in record["pairs"]["20"] if p["setting"] == "tuned"]
    assert (tuned["first"], tuned["second"], tuned["seeds"]) == ("scl", "ce", [1, 2, 3])
    assert tuned["diffs"] == [5, 4, 4] and tuned["mean"] == pytest.approx(13 / 3)
    (default,) = [p for p in record["pairs"]["20"] if p["setting"] == "default"]
    assert default["diffs"] == [5, -2, 6] and default["verdict"] == "within noise (n = 3)"
    table = tune_report.markdown(record)
    assert "| 20 | scl − ce | +4.33 [" in table and "lambda 0.5, tau 0.1 (24)" in table
    assert "| +1.00 [+1.00, +1.00] (3 of 3 seeds ahead): ahead |" in table  # ce's tuned − default
    assert "(2 of 3 seeds ahead): within noise (n = 3) |" in table  # scl − ce at the default
    bullet, row = tune_report.bullet(record), tune_report.row(record)
    assert "scl − ce at N = 20 from within noise (n = 3) to ahead" in bullet
    assert "ce +1.00 [+1.00, +1.00] (ahead; 3 of 3 seeds ahead)" in row
    assert "Not yet run: N=20 acl_embed, N=100 ce" in table
    assert sorted(p.name for p in tmp_path.iterdir()) == ["N20"]


def test_a_study_reported_before_keeps_its_summary_when_its_folder_is_gone(tmp_path):
    """A report over N = 100 on a machine without N = 20's folders keeps N = 20 from the earlier record."""
    earlier = tmp_path / "earlier"
    _best(earlier, 20, "ce", [50, 52, 54], [51, 53, 55], {"lr": "1e-04"})
    _best(earlier, 20, "scl", [55, 50, 60], [56, 57, 59], {"lr": "2e-04"})
    previous = tune_report.collect(str(earlier), [20], ["ce", "scl"])
    now = tmp_path / "now"
    _best(now, 100, "ce", [70, 71, 72], [72, 73, 74], {"lr": "2e-04"})
    record = tune_report.collect(str(now), [100], ["ce", "scl"], previous=previous)
    assert record["studies"]["20"] == previous["studies"]["20"]
    assert record["pairs"]["20"] == previous["pairs"]["20"]
    assert record["studies"]["100"]["ce"]["tuned_minus_default"]["diffs"] == [2, 2, 2]
    assert record["missing"] == ["N=100 scl"]
    # a folder that is here wins over the earlier summary
    _best(now, 20, "ce", [40, 40, 40], [41, 41, 41], {"lr": "3e-04"})
    again = tune_report.collect(str(now), [100], ["ce", "scl"], previous=previous)
    assert again["studies"]["20"]["ce"]["best_params"] == {"lr": "3e-04"}
