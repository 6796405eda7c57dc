"""benchmarks/serve_cpu_split.py's parts of the CPU outside the model, and its refusals (the load run itself is
measured by hand: docs/serve.md; its --json refusal: test_benchmark_outputs.py)."""
import cProfile
import time

import pytest

import serve_cpu_split as cpu_split


@pytest.mark.parametrize("filename,name,part", [
    ("~", "<method 'poll' of 'select.epoll' objects>", "waiting (left out)"),
    ("~", "<built-in method onnxruntime.capi.onnxruntime_pybind11_state.run>", "model (left out)"),
    ("~", "<method 'encode_batch' of 'tokenizers.Tokenizer' objects>", "tokenization"),
    ("/x/acl_runtime/engine.py", "encode_many", "tokenization"),
    ("/x/site-packages/h11/_connection.py", "next_event", "HTTP (uvicorn, h11)"),
    ("/x/site-packages/starlette/routing.py", "matches", "Starlette"),
    ("/x/site-packages/prometheus_client/metrics.py", "labels", "metrics"),
    ("/x/acl_runtime/scheduler.py", "step", "scheduler"),
    ("/x/acl_runtime/serve/app.py", "infer", "handlers"),
    ("~", "<built-in method builtins.isinstance>", cpu_split.OTHER),
])
def test_each_function_falls_in_its_part(filename, name, part):
    assert cpu_split.part_of(filename, name) == part


def test_the_split_leaves_the_waits_out_and_its_shares_add_up(tmp_path):
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    sum(isinstance(i, int) for i in range(20000))
    prof.disable()
    path = str(tmp_path / "p.prof")
    prof.dump_stats(path)
    parts = cpu_split.split([path], requests=10)
    assert not any(k.endswith("(left out)") for k in parts)
    assert sum(v["share"] for v in parts.values()) == pytest.approx(1.0)
    assert parts[cpu_split.OTHER]["ms_per_request"] > 0


def test_the_model_threads_time_splits_into_calls_and_the_time_between_them_on_and_off_the_cpu():
    shares = cpu_split.model_thread({"step_wall_s": 10.0, "step_cpu_s": 7.5}, model_wall=8.0, model_cpu=7.0)
    assert shares == pytest.approx({"calls_on_cpu": 0.7, "calls_off_cpu": 0.1, "between_on_cpu": 0.05,
                                    "between_off_cpu": 0.15})
    assert sum(shares.values()) == pytest.approx(1.0)
    run = {"padded_share": {"0": 0.2, "1": 0.4}, "model_thread": shares, "requests_per_s": 5.0,
           "outside_ms_per_request": 1.0, "model_ms_per_request": 3.0, "outside_share": 0.25}
    assert cpu_split.figure(run, "padded_share") == pytest.approx(0.3)
    assert cpu_split.figure(run, "model_thread_off_cpu") == pytest.approx(0.25)
    two = cpu_split.medians({"on": [run, dict(run, requests_per_s=7.0), dict(run, requests_per_s=1.0)]})
    assert two["on"]["requests_per_s"] == 5.0


def test_steps_are_clocked_only_inside_and_the_scheduler_is_left_as_it_was():
    from acl_runtime.scheduler import Scheduler
    from test_loop import MeanBackend

    plain = Scheduler.step
    sched = Scheduler(MeanBackend(), max_batch=4, max_queue=8)
    with cpu_split.step_clock({}) as totals:
        sched.submit([[5, 6, 7]])
        while sched.step():
            pass
    assert Scheduler.step is plain and totals["step_wall_s"] > 0 and totals["step_cpu_s"] > 0
