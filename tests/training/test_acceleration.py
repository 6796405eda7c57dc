"""--autocast-bf16 and --compile on the task sentence_prediction_acl, and the CPU-kind detection behind them
(acl_torch/acceleration.py), on a tiny model and toy data.

The compiled-versus-eager checks here use the ``aot_eager`` backend (dynamo's graph capture and AOT
autograd, no code generation: seconds); the ``inductor`` version of the same check is marked slow.
"""
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

import helpers
from acl_torch import acceleration

# /proc/cpuinfo lines of three machine kinds
ZEN4 = ("vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2500.000\n"
        "flags\t\t: fpu sse avx2 fma avx512f avx512bw avx512_vnni avx512_bf16\n\nprocessor\t: 1\n")
SAPPHIRE = ("vendor_id\t: GenuineIntel\nmodel name\t: Intel Xeon Platinum 8480\ncpu MHz\t\t: 2000.0\n"
            "flags\t\t: avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n")
ROME = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B12\ncpu MHz\t\t: 2250.0\nflags\t\t: avx2 fma\n"
BROADWELL = ("vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz\n"
             "flags\t\t: fpu sse avx avx2 fma\n")
BROADWELL_KIND = "Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz, AVX2 only, no bf16 instructions"
READ = acceleration.read_cpu_kind  # the parser itself (the fixtures below replace the module's name)
# every registered criterion, with the model it needs
CASES = [("sentence_ce", "roberta", []), ("sentence_scl", "roberta", []), ("acl_embed", "roberta", []),
         ("acl_grad", "roberta", ["--acl-grad-scope", "params"]),
         ("acl_grad", "roberta", ["--acl-grad-scope", "features"]),
         ("acl_cross_layer", "multi_exit_roberta", []), ("multi_exit_kd", "multi_exit_roberta", [])]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("accel") / "data"), n_train=64)["data"]


@pytest.fixture
def bf16_cpu(monkeypatch):
    """This test runs as on a CPU with avx512_bf16, whatever runs it (the tiny model is cheap even emulated)."""
    monkeypatch.setattr(acceleration, "read_cpu_kind", lambda text=None: READ(ZEN4))


def build(data, criterion, arch="roberta", extra=(), seed=0):
    """(task, model, criterion) as fairseq-train builds them under the task sentence_prediction_acl."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = helpers.train_args(data, "/nonexistent", criterion=criterion, arch=arch, extra=list(extra),
                              task="sentence_prediction_acl")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    torch.manual_seed(seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, task, model, task.build_criterion(cfg.criterion)


def batches(task, n, size=8, split="train"):
    """``n`` mini-batches of the toy split in order (wrapping round), of varying lengths with padding."""
    task.load_dataset(split)
    ds = task.dataset(split)
    return [ds.collater([ds[(i * size + j) % len(ds)] for j in range(size)]) for i in range(n)]


def train(cfg, task, model, crit, samples):
    """Trainer.train_step's work per sample; returns [(loss, conflict or None)] per update."""
    from fairseq import optim

    opt = optim.build_optimizer(cfg.optimizer, [p for p in model.parameters() if p.requires_grad])
    model.train()
    out = []
    for update, sample in enumerate(samples):
        opt.zero_grad()
        loss, size, log = task.train_step(sample, model, crit, opt, update)
        opt.multiply_grads(1.0 / size)
        opt.step()
        out.append((float(loss), float(log["conflict"]) if "conflict" in log else None))
    return out


def test_cpu_kind_names_its_bf16_unit_from_the_flags():
    zen4, spr, rome = (acceleration.read_cpu_kind(t) for t in (ZEN4, SAPPHIRE, ROME))
    assert zen4.describe() == "AMD EPYC, AVX-512 + avx512_bf16, no AMX" and zen4.bf16_unit == "avx512_bf16"
    assert spr.describe() == "Intel Xeon Platinum 8480, AMX (amx_bf16)" and spr.bf16_unit == "amx"
    assert rome.describe() == "AMD EPYC 7B12, AVX2 only, no bf16 instructions" and rome.bf16_unit is None
    assert acceleration.read_cpu_kind("").bf16_unit is None


def test_autocast_bf16_is_refused_in_one_line_naming_an_avx2_cpu():
    with pytest.raises(ValueError, match=r"AMD EPYC 7B12, AVX2 only") as e:
        acceleration.check_bf16("cpu", acceleration.read_cpu_kind(ROME))
    assert "\n" not in str(e.value) and "~40x slower" in str(e.value)
    assert "avx512_bf16" in acceleration.check_bf16("cpu", acceleration.read_cpu_kind(ZEN4))


def test_the_parser_refuses_autocast_bf16_on_an_avx2_cpu_in_one_line_and_exit_2(data, monkeypatch, capsys):
    """Without CUDA the device is this CPU: fairseq-train's parser refuses the flag as it refuses a bad value."""
    monkeypatch.setattr(acceleration, "read_cpu_kind", lambda text=None: READ(ROME))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as refused:
        build(data, "sentence_ce", extra=["--autocast-bf16"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"{os.path.basename(sys.argv[0])}: error: --autocast-bf16: this CPU (AMD EPYC 7B12, AVX2 "
                          "only"), err


def test_the_task_refuses_autocast_bf16_that_its_parser_could_not_judge(data, monkeypatch, caplog):
    """With CUDA the parser cannot know the device (--cpu may follow): the task's __init__ refuses, in one line."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = helpers.train_args(data, "/nonexistent", task="sentence_prediction_acl")  # the flag set below
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), input_args=argv))
    cfg.task.autocast_bf16 = True
    monkeypatch.setattr(acceleration, "read_cpu_kind", lambda text=None: READ(ROME))
    with pytest.raises(SystemExit) as refused:
        tasks.setup_task(cfg.task)
    assert refused.value.code == 2 and refused.value.__context__ is None or refused.value.__suppress_context__
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "this CPU (AMD EPYC 7B12, AVX2 only" in errors[0]


def test_peak_flops_follow_the_flags_and_the_clock():
    zen4, spr, rome = (acceleration.read_cpu_kind(t) for t in (ZEN4, SAPPHIRE, ROME))
    assert acceleration.peak_gflops(zen4, torch.float32)[0] == pytest.approx(32 * 2.5)  # 256-bit pipes
    assert acceleration.peak_gflops(zen4, torch.bfloat16, threads=2)[0] == pytest.approx(2 * 64 * 2.5)
    assert acceleration.peak_gflops(spr, torch.bfloat16)[0] == pytest.approx(1024 * 2.0)
    assert acceleration.peak_gflops(spr, torch.float32)[0] == pytest.approx(64 * 2.0)
    assert acceleration.peak_gflops(rome, torch.bfloat16)[0] is None  # emulated: no peak to compare with


@pytest.mark.parametrize("name,arch,extra", CASES, ids=lambda v: "-".join(v) if isinstance(v, list) else str(v))
def test_autocast_bf16_step_runs_in_bf16_with_fp32_weights_and_gradients(data, bf16_cpu, name, arch, extra):
    samples = batches(build(data, name, arch)[1], 2)
    ref = train(*build(data, name, arch, extra), samples)
    cfg, task, model, crit = build(data, name, arch, extra + ["--autocast-bf16"])
    seen = []
    hook = model.encoder.sentence_encoder.layers[0].fc1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    got = train(cfg, task, model, crit, samples)
    hook.remove()
    assert seen and all(d == torch.bfloat16 for d in seen)  # the forward ran in bf16 ...
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in model.parameters() if p.grad is not None)  # ... the weights and updates in fp32
    for (loss, _), (loss_ref, _) in zip(got, ref):
        assert loss == pytest.approx(loss_ref, rel=0.05) and loss != loss_ref


@pytest.mark.parametrize("scope", ["params", "features"])
def test_autocast_bf16_gate_decides_on_fp32_gradients(data, bf16_cpu, scope):
    """The ACL-Grad gate's cosine is taken outside autocast, from fp32 gradients, with no loss scaler."""
    cfg, task, model, crit = build(data, "acl_grad", extra=["--autocast-bf16", "--acl-grad-scope", scope])
    sample = batches(task, 1)[0]
    assert isinstance(task._precision(crit), acceleration.AutocastCriterion)
    loss, _, log = task.train_step(sample, model, crit, _sgd(model), 0)
    assert float(log["gated_steps"]) == 1.0 and -1.0 <= float(log["grad_cos"]) <= 1.0
    assert float(log["acl_grad_overflow"]) == 0.0 and loss.dtype == torch.float32


def _sgd(model):
    from fairseq.optim import FairseqOptimizer

    opt = FairseqOptimizer(None)
    opt._optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return opt


def test_fairseq_train_with_autocast_bf16_and_acl_grad(tmp_path, data):
    """Through fairseq-train --user-dir acl_fairseq (on this CPU where it has native bf16, else its refusal)."""
    proc = helpers.train(data, str(tmp_path / "ckpt"), criterion="acl_grad", task="sentence_prediction_acl",
                         extra=["--autocast-bf16"], check=False)
    out = proc.stdout + proc.stderr
    if acceleration.read_cpu_kind().bf16_unit is None:
        assert proc.returncode == 2 and "has no native bf16" in out and "Traceback" not in out
        return
    assert proc.returncode == 0, out[-4000:]
    assert "bf16 autocast on the CPU" in out and (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_compiled_training_equals_eager_for_30_updates(data):
    check_compiled_equals_eager(data, "acl_grad", "multi_exit_roberta", ["--acl-grad-scope", "params"], "aot_eager")


def check_compiled_equals_eager(data, name, arch, extra, backend):
    """30 updates from the same weights and batches: losses within 1e-4 relative at every update, the same
    ACL-Grad decisions, and each model's weights load into the other kind and give its outputs."""
    cfg, task, eager, crit = build(data, name, arch, extra)
    samples = batches(task, 30)
    ref = train(cfg, task, eager, crit, samples)
    cfg_c, task_c, compiled, crit_c = build(data, name, arch, extra + ["--compile", "--compile-backend", backend])
    assert task_c.compiled is not None
    got = train(cfg_c, task_c, compiled, crit_c, samples)
    for update, ((loss, conflict), (loss_ref, conflict_ref)) in enumerate(zip(got, ref)):
        assert abs(loss - loss_ref) <= 1e-4 * abs(loss_ref), f"update {update + 1}: {loss} vs eager {loss_ref}"
        assert conflict == conflict_ref, f"update {update + 1}: ACL-Grad decided otherwise compiled"
    assert task_c.compiled.graphs > 0
    # checkpoints are interchangeable: the same keys; each kind's weights give the other kind's outputs
    assert list(compiled.state_dict()) == list(eager.state_dict())
    _, _, fresh_eager, _ = build(data, name, arch, extra, seed=1)
    _, _, fresh_compiled, _ = build(data, name, arch, extra + ["--compile", "--compile-backend", backend], seed=1)
    fresh_eager.load_state_dict(compiled.state_dict())
    fresh_compiled.load_state_dict(eager.state_dict())
    probe = samples[0]["net_input"]["src_tokens"]
    for a, b in ((fresh_eager, compiled), (fresh_compiled, eager)):
        a.eval(), b.eval()
        with torch.no_grad():
            ya, yb = (m(probe, classification_head_name="sentence_classification_head")[0] for m in (a, b))
        assert torch.allclose(ya, yb, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name,extra,backend", [("acl_grad", ["--acl-grad-scope", "params"], "inductor"),
                                                ("sentence_ce", [], "inductor"),
                                                ("acl_cross_layer", ["--acl-grad-scope", "features"], "aot_eager")])
def test_compiled_training_equals_eager_for_30_updates_slow_cases(data, name, extra, backend):
    """The same check with generated C++ code (inductor: about a minute each, most of it compiling), and on the
    cross-layer criterion's features scope."""
    check_compiled_equals_eager(data, name, "multi_exit_roberta", extra, backend)


@pytest.mark.slow  # make test's 10 minutes: torch.compile over several batch lengths: about 7 s
def test_compile_recompiles_stay_bounded_over_batch_lengths(data, caplog):
    """Only the first two batch shapes compile (the second makes the shapes dynamic); every later length
    reuses those graphs, and each compiling update says so in one log line."""
    cfg, task, model, crit = build(data, "sentence_ce", "multi_exit_roberta",
                                   ["--compile", "--compile-backend", "aot_eager"])
    samples = batches(task, 12, size=5)
    shapes = [tuple(s["net_input"]["src_tokens"].shape) for s in samples]
    second = next(i for i, shape in enumerate(shapes) if shape != shapes[0])
    counts = []
    with caplog.at_level(logging.INFO, logger="acl_fairseq.tasks.sentence_prediction_acl"):
        for sample in samples:
            before = task.compiled.graphs
            train(cfg, task, model, crit, [sample])
            counts.append(task.compiled.graphs - before)
    assert len(set(shapes[second:])) >= 4 and counts[0] > 0 and counts[second] > 0
    assert sum(counts[second + 1:]) == 0, f"graphs compiled per update: {counts} for shapes {shapes}"
    assert sum("graph(s) compiled by update" in r.getMessage() for r in caplog.records) == 2


def test_compile_that_cannot_work_says_so_in_one_line_and_trains_eagerly(data, caplog):
    with caplog.at_level(logging.WARNING, logger="acl_torch.acceleration"):
        cfg, task, model, crit = build(data, "acl_embed", "multi_exit_roberta",
                                       ["--compile", "--compile-backend", "no_such_backend"])
    assert task.compiled is None
    lines = [r.getMessage() for r in caplog.records if "--compile" in r.getMessage()]
    assert len(lines) == 1 and "training eagerly" in lines[0] and "\n" not in lines[0]
    assert len(train(cfg, task, model, crit, batches(task, 2))) == 2


# slow: two fairseq-train ranks through scripts/ddp_cpu.sh (about 10 s idle), as test_distributed.py's launcher test
@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--autocast-bf16"], ["--compile", "--compile-backend", "aot_eager"]],
                         ids=["bf16", "compiled"])
def test_two_rank_fairseq_train_with_bf16_or_compiled(tmp_path, flags):
    """acl_cross_layer with ACL-Grad's global decision over two DDP ranks, to the end of training."""
    import os
    import subprocess
    import sys

    from test_distributed import _free_port

    data = helpers.make_data(str(tmp_path / "data"), n_train=20)["data"]
    args = helpers.train_args(data, str(tmp_path / "ckpt"), criterion="acl_cross_layer", arch="multi_exit_roberta",
                              extra=["--acl-grad-global-decision", *flags], task="sentence_prediction_acl")
    cmd = ["bash", os.path.join(helpers.REPO, "scripts", "ddp_cpu.sh"), "--port", str(_free_port()), "--log-dir",
           str(tmp_path / "logs"), "2", "--", sys.executable, "-m", "fairseq_cli.train", *args]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=helpers.REPO, timeout=300)
    out = proc.stdout + proc.stderr
    if "--autocast-bf16" in flags and acceleration.read_cpu_kind().bf16_unit is None:
        assert proc.returncode != 0 and "has no native bf16" in out  # the refusal, on every rank
        return
    assert proc.returncode == 0, out[-5000:]
    assert "all 2 ranks finished" in proc.stderr and '"num_updates": "2"' in out
    assert ("bf16 autocast on the CPU" in out) if "--autocast-bf16" in flags else ("graph(s) compiled by update" in out)


def test_a_checkpoint_saved_before_these_flags_loads_for_use(tmp_path, plugin_task_run):
    """A checkpoint whose task config lacks autocast_bf16, compile, compile_backend and cpu (saved before they
    existed) loads with the task's defaults: nothing compiled, no autocast. (A copy of conftest's run under the
    plugin task, whose config has those fields.)"""
    import shutil

    from fairseq import checkpoint_utils

    data, run = plugin_task_run
    path = str(tmp_path / "checkpoint_last.pt")
    shutil.copy(run / "checkpoint_last.pt", path)
    state = torch.load(path, weights_only=True)  # the plugin allowlists what fairseq checkpoints pickle
    for key in ("autocast_bf16", "compile", "compile_backend", "cpu"):
        del state["cfg"]["task"][key]
    torch.save(state, path)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    assert task.compiled is None and task._precision("crit") == "crit" and task.device_type == "cpu"
    assert not hasattr(models[0], "_compiled_call_impl") or models[0]._compiled_call_impl is None


def test_fairseq_train_refuses_autocast_bf16_on_an_avx2_cpu_in_one_line_and_gpu_check_reads_the_kind(tmp_path, data):
    """fairseq-train --autocast-bf16 on a CPU without bf16 units (an AVX2-only Xeon's /proc/cpuinfo, read by the
    child): exit 2 and one line on stderr naming the CPU kind, before fairseq logs anything (it was a 25-line
    traceback, then an ERROR line after fairseq's warnings and its configuration); and
    benchmarks/gpu_check.sh's step 5, run on that output, prints the whole CPU kind (it printed the traceback's
    source line, then cut a model name at its first parenthesis: "this CPU (Intel(R)")."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(BROADWELL)
    child = ("import runpy, sys; from acl_torch import machine; machine.CPUINFO = sys.argv.pop(1); "
             "runpy.run_module('fairseq_cli.train', run_name='__main__', alter_sys=True)")
    args = helpers.train_args(data, str(tmp_path / "ckpt"), task="sentence_prediction_acl", extra=["--autocast-bf16"])
    no_gpu = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the device is this CPU, as on a host without CUDA
    proc = helpers._run([sys.executable, "-c", child, str(cpuinfo), *args], "fairseq-train", no_gpu, False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, out[-3000:]
    assert proc.stderr.startswith(f"train.py: error: --autocast-bf16: this CPU ({BROADWELL_KIND}) has no native bf16")
    assert proc.stderr.endswith("torch would emulate it, ~40x slower than fp32: drop the flag\n")
    assert not (tmp_path / "ckpt").exists()
    # gpu_check.sh's bf16 step, as written there, with a fairseq-train that replays this run's output and status,
    # then the task's refusal (--cpu on a GPU host: the parser cannot judge, the task's __init__ logs it)
    script = open(os.path.join(helpers.REPO, "benchmarks", "gpu_check.sh"), encoding="utf-8").read()
    step = re.search(r'\nrc=0; "\$PY" -m fairseq_cli.train .*?--autocast-bf16 .*?\nfi\n', script, re.S)
    assert step, "gpu_check.sh's bf16 step is not where this test reads it"
    logged = (f"2026-01-01 00:00:00 | ERROR | acl_fairseq.tasks.sentence_prediction_acl | --autocast-bf16: this CPU "
              f"({BROADWELL_KIND}) has no native bf16 (needs amx_bf16 or avx512_bf16 in /proc/cpuinfo)\n")
    for output in (out, "2026-01-01 00:00:00 | INFO | fairseq_cli.train | {'_name': None}\n" + logged):
        saved = tmp_path / "saved.log"
        saved.write_text(output)
        replay = tmp_path / "replay"
        replay.write_text(f"#!/bin/sh\ncat {saved} >&2\nexit {proc.returncode}\n")
        replay.chmod(0o755)
        shown = subprocess.run(["bash", "-c", f"set -euo pipefail; OUT={tmp_path}; PY={replay}; train=(); "
                                f"{step.group(0)}"], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.strip() == (f"[gpu_check] 5/5 bf16 refused as it should be here: this CPU "
                                        f"({BROADWELL_KIND})"), output
