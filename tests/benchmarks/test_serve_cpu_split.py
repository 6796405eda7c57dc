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
