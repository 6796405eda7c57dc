"""README's claim bullets come from the committed tables (benchmarks/claims.py), and every paired difference carries
its 95% interval with the one wording of benchmarks/_paired.py."""
import json
import math
import os

import pytest

import _paired as PD
import claims
import fewshot
import hf_parity
import quality
from _quality_tables import TASKS, gate_pairs, quality_pairs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "benchmarks", "results")
RUNS = os.path.join(RESULTS, "runs", "quality", "runs")


def test_interval_is_student_t_with_n_minus_1_degrees_of_freedom():
    iv = PD.interval([1.0, 2.0, 3.0])
    # mean 2, std 1, t(0.975, 2) = 4.3027: 2 ± 4.3027 / sqrt(3)
    assert iv["mean"] == 2.0 and iv["hi"] - 2.0 == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)
    assert (iv["n"], iv["ahead"], iv["behind"]) == (3, 3, 0)
    assert PD.verdict(iv) == "within noise (n = 3)"  # every seed ahead, and still within noise
    assert PD.verdict(PD.interval([1.0, 1.1, 0.9])) == "ahead"
    assert PD.verdict(PD.interval([-1.0, -1.1, -0.9])) == "behind"
    one = PD.interval([2.5])
    assert one["lo"] is None and PD.verdict(one) == "within noise (n = 1)" and PD.interval_text(one) == "+2.50"
    assert PD.cell([]) == "-"
    assert PD.cell([-1.0, -1.1, -0.9]) == "−1.00 [−1.25, −0.75] (0 of 3 seeds ahead): behind"
    assert PD.signed(-0.001) == "+0.00"  # no negative zero
    with pytest.raises(ValueError):
        PD.interval([])


def test_headline_says_ahead_or_behind_only_where_an_interval_excludes_0():
    assert claims._headline({"a": "within noise (n = 3)"}, "X", "X: not shown") == "X: not shown"
    assert claims._headline({"a": "ahead", "b": "within noise (n = 3)"}, "X", "n") == \
        "X: ahead on a; within noise elsewhere"
    assert claims._headline({"a": "ahead", "b": "behind"}, "X", "n") == "X: ahead on a; behind on b"


def test_readme_claims_block_is_what_the_committed_tables_say():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert claims.replace_rows(claims.replace_block(readme, claims.bullets(RESULTS)), RESULTS) == readme, \
        "README's claims differ from the tables: run python benchmarks/claims.py"
    block = readme[readme.index(claims.BEGIN):readme.index(claims.END)]
    assert block.count("\n- **") == 6 and "within noise (n = 3)" in block and "What tuning changed" in block
    docs = os.path.join(REPO, "docs", "benchmarks.md")
    with open(docs, encoding="utf-8") as f:
        assert claims.regenerated(docs, RESULTS, readme=False) == f.read(), "docs/benchmarks.md's claims differ"
    rows = [line for line in readme.splitlines() if line.startswith(tuple(claims.ROWS))]
    assert len(rows) == len(claims.ROWS) and all("[" in row and "]" in row for row in rows)  # intervals in each


def test_committed_tables_are_what_the_records_give(tmp_path):
    with open(os.path.join(RESULTS, "quality_paired.json"), encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(quality_pairs(RUNS)))
    with open(os.path.join(RESULTS, "quality_gate.json"), encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(gate_pairs(RUNS, TASKS, quality.GATED)))
    with open(os.path.join(RESULTS, "fewshot.json"), encoding="utf-8") as f:
        table = json.load(f)
    runs = fewshot.collect(str(tmp_path), os.path.join(RESULTS, "runs"))  # an empty work folder: records only
    assert table == json.loads(json.dumps(fewshot.summarize(runs, table["protocol"])))
    with open(os.path.join(RESULTS, "fewshot.md"), encoding="utf-8") as f:
        assert f.read() == fewshot.markdown(table)
    with open(os.path.join(RESULTS, "hf_parity.json"), encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(hf_parity.summarize(hf_parity.collect(os.path.join(RESULTS,
                                                                                                        "runs")))))
    for axis, name in (("layers", "quality_speedup.json"), ("flops", "quality_speedup_flops.json")):
        with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
            table = json.load(f)
        assert table == json.loads(json.dumps({t: quality.speedup_profiles(RUNS, t, axis=axis) for t in table}))


def test_check_flags_a_hand_edited_claim(tmp_path):
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    edited = tmp_path / "README.md"
    # a hand edit in the claims block, and one in a results row
    edited.write_text(readme.replace("within noise (n = 3)", "ahead", 1).replace("at N = 20 (ahead)", "at N = 20"),
                      encoding="utf-8")
    docs = tmp_path / "benchmarks.md"
    with open(os.path.join(REPO, "docs", "benchmarks.md"), encoding="utf-8") as f:
        docs.write_text(f.read(), encoding="utf-8")
    flags = ["--readme", str(edited), "--docs", str(docs)]
    assert claims.main(flags + ["--check"]) == 1
    assert claims.main(flags) == 0  # rewritten from the tables
    assert edited.read_text(encoding="utf-8") == readme and claims.main(flags + ["--check"]) == 0
    with pytest.raises(ValueError, match="claims:begin"):
        claims.replace_block("no markers", "x")
    with pytest.raises(ValueError, match="one results row"):
        claims.replace_rows("no rows", RESULTS)


def test_every_committed_load_and_serving_record_keeps_the_verdicts_its_results_give():
    """The verdicts stored in benchmarks/results/serve_load*.json and serve_speed.json are what the code computes
    from the same records' results (load/stats.py, load/pair.py, serve_speed.targets): a change to the verdict
    code that would judge a committed record otherwise fails here."""
    import glob

    import serve_speed
    from load import pair, stats

    paths = sorted(glob.glob(os.path.join(RESULTS, "serve_load*.json")))
    assert len(paths) >= 7
    for path in paths:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        got = stats.verdicts(record["results"], record["setup"]["sentences"]) + pair.verdicts(
            record.get("interleaved", []))
        assert json.loads(json.dumps(got)) == record["verdicts"], path
    with open(os.path.join(RESULTS, "serve_speed.json"), encoding="utf-8") as f:
        record = json.load(f)
    got = serve_speed.targets(record["rows"], max(record["setup"]["batch_sizes"]))
    assert json.loads(json.dumps(got)) == record["targets"]
