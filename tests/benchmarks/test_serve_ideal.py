"""benchmarks/serve_ideal.py's simulator (benchmarks/_ideal_sim.py) on cases with a known answer: a request alone
costs its front end and its layers at batch 1 exactly, in every schedule; two requests arriving together are one
batch that shrinks as they exit; an M/D/1 queue's mean latency is Pollaczek-Khinchine's; the cost model
reproduces the two references it is calibrated on; the script end to end on the committed records."""
import json
import random

import pytest

import _ideal_sim as ideal_sim
import serve_ideal

COST = ideal_sim.CostModel(layers=3, call_s=1e-3, token_1_s=1e-4, token_32_s=5e-5, outside_s=2e-3)


@pytest.mark.parametrize("front", ideal_sim.FRONTS)
@pytest.mark.parametrize("schedule", ideal_sim.SCHEDULES)
def test_a_request_alone_costs_its_front_end_and_its_layers_at_batch_one(schedule, front):
    lengths, exits = [5, 9, 12, 7], [1, 3, 2, 3]
    arrivals = [1.0, 2.0, 3.0, 4.0]  # each long gone before the next: every request alone
    latency = ideal_sim.simulate(schedule, COST, lengths, exits, arrivals, max_batch=4, front=front)
    assert latency == pytest.approx([COST.alone(n, e) for n, e in zip(lengths, exits)], rel=1e-9)
    assert COST.alone(5, 1) == pytest.approx(2e-3 + 1e-3 + 1e-4 * 5)


def test_two_requests_arriving_together_are_one_wave_answered_at_its_end():
    """Both in at 0; the model's thread does both front ends (4 ms), then one wave: layer 1 on both (width 9), the
    first exits; layers 2 and 3 on the second alone (width 9: its own length). A wave (run_batch, as the server's
    light-load wave and --no-refill run it) answers its rows when it ends, the early one too."""
    latency = ideal_sim.simulate("fifo-wave", COST, [5, 9], [1, 3], [0.0, 0.0], max_batch=4, front="serial")
    both = COST.call(2, 9)
    assert both == pytest.approx(1e-3 + COST.per_token(2) * 18)
    assert latency == pytest.approx([4e-3 + both + 2 * COST.call(1, 9)] * 2, rel=1e-9)
    # layer by layer, the first is answered as it exits
    assert ideal_sim.simulate("edf", COST, [5, 9], [1, 3], [0.0, 0.0], max_batch=4)[0] == pytest.approx(4e-3 + both)
    # beside: the first is queued at 2 ms and runs alone (1.5 ms); the second, ready at 4 ms, then runs alone
    beside = ideal_sim.simulate("fifo-wave", COST, [5, 9], [1, 3], [0.0, 0.0], max_batch=4, front="beside")
    assert beside == pytest.approx([2e-3 + COST.call(1, 5), 4e-3 + 3 * COST.call(1, 9)], rel=1e-9)


def test_an_m_d_1_queue_has_pollaczek_khinchines_mean_latency():
    """One layer, one row a call, a constant 1 ms: at load 0.5 the mean wait is 0.5 / (2 x 0.5) ms, the latency
    1.5 ms; at 0.8, 2 ms of wait."""
    one = ideal_sim.CostModel(layers=1, call_s=1e-3, token_1_s=1e-15, token_32_s=1e-15, outside_s=0.0)
    for load, want in [(0.5, 1.5e-3), (0.8, 3e-3)]:
        arrivals = ideal_sim.poisson_arrivals(load / 1e-3, 3000, random.Random(3))
        latency = ideal_sim.simulate("fifo-wave", one, [2] * len(arrivals), [1] * len(arrivals), arrivals, max_batch=1)
        assert sum(latency) / len(latency) == pytest.approx(want, rel=0.05)


def test_the_cost_model_reproduces_the_references_it_is_calibrated_on():
    lengths = [4, 9, 12, 20, 25, 25, 31, 40] * 20
    cost = ideal_sim.calibrate(6, 1.6e-4, 9.4e-3, 145.0, lengths, 1.5e-3)
    mean = sum(lengths) / len(lengths)
    assert 6 * cost.call(1, mean) == pytest.approx(9.4e-3)
    batched = 6 * sum(cost.call(len(b), max(b)) for b in ideal_sim.sorted_batches(lengths, 32))
    assert len(lengths) / batched == pytest.approx(145.0)
    assert cost.per_token(64) == cost.per_token(32) == cost.token_32_s and cost.per_token(1) == cost.token_1_s
    with pytest.raises(ValueError, match="no time per token"):
        ideal_sim.calibrate(6, 5e-3, 9.4e-3, 145.0, lengths, 0.0)


def test_exits_are_drawn_to_the_recorded_shares_and_lengths_from_the_histogram():
    exits = ideal_sim.draw_exits([1.0, 0.75, 0.5, 0.25], 100, random.Random(0))
    assert sorted(exits) == [1] * 25 + [2] * 25 + [3] * 25 + [4] * 25
    assert ideal_sim.lengths_from({"10": 2, "3": 1}) == [3, 10, 10]


def test_the_script_on_the_committed_records(tmp_path, capsys):
    out = tmp_path / "ideal.json"
    result = serve_ideal.main(["--configs", "refill fp32 w1", "--seeds", "1", "--requests", "60",
                               "--schedules", "fifo-wave", "edf", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == result["rows"]
    rows = result["rows"]
    assert {r["fraction"] for r in rows} == {0.25, 0.5, 1.0} and {r["front"] for r in rows} == set(ideal_sim.FRONTS)
    for fraction in (0.25, 0.5, 1.0):
        for front in ideal_sim.FRONTS:
            at = [r for r in rows if r["fraction"] == fraction and r["front"] == front]
            best = next(r for r in at if r["schedule"].startswith("best"))
            assert best["p99_ms"] == min(r["p99_ms"] for r in at)
            assert best["measured_over_best"] == pytest.approx(best["measured_p99_ms"] / best["p99_ms"])
    ref = result["references"]["refill fp32 w1"]
    assert sum(ref["reach"]) == pytest.approx(4.55, abs=0.05) and ref["alone_p50_ms"] < ref["alone_p99_ms"]
    assert "serve_ideal" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        serve_ideal.main(["--configs", "refill fp32 w2", "--seeds", "1", "--requests", "10"])


def test_the_measured_p99_is_judged_against_the_simulated_best_and_against_3x_alone_where_reachable():
    row = dict(config="c", front="beside", schedule="best (edf)", p99_ms=40.0, measured_p99_ms=48.0,
               measured_over_best=1.2)
    refs = {"c": {"alone_p99_ms": 15.0}}
    rows = [dict(row, fraction=f) for f in (0.25, 0.5, 1.0)] + [dict(row, fraction=0.5, front="serial"),
                                                                 dict(row, fraction=0.5, schedule="edf")]
    found = serve_ideal.targets(rows, refs)
    assert len(found) == 4  # 25% and 50% (1.0 is not judged), beside's best only
    within, alone = found[0], found[1]
    assert within["pass"] and within["bound"] == 1.25 and "edf" in within["target"]
    assert alone["pass"] is False and alone["value"] == pytest.approx(48.0 / 15.0)  # 40 <= 45: reachable, judged
    far = serve_ideal.targets([dict(row, fraction=0.75, p99_ms=50.0, measured_over_best=1.3)], refs)
    assert far[0]["pass"] is False and far[1]["pass"] is None and "not judged" in far[1]["target"]
    measured = serve_ideal.targets([dict(row, fraction=0.5)], {"c": {"alone_p99_ms": 15.0,
                                                                    "measured_alone_p99_ms": 12.0}})
    assert measured[1]["value"] == pytest.approx(48.0 / 12.0)  # the engine's measured p99 alone comes first
