"""``--optimizer adamw_torch`` (acl_fairseq/optim/adamw_torch.py) takes fairseq ``adam``'s steps, in
fp32 and under fairseq's FP16Optimizer, refuses --memory-efficient-fp16, saves and resumes (also from
adam's state), and trains through fairseq-train.

Both optimizers get the same gradients; per element they span 1e-6..10, so that eps matters for some
of them (the uncorrected torch AdamW must fail the same comparison)."""
import functools
import io
import json
import math
import re

import pytest
import torch
from fairseq import checkpoint_utils, optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import helpers

STEPS = 10
# max |a - b| / max |b| per tensor, over STEPS steps. Why it holds on any IEEE machine (u = 2**-24, float32's
# unit roundoff): the gradients do not depend on the weights, so no rounding is fed back; a step rounds each
# weight at its own size at most twice in fairseq's adam (decay, update) and 2.5 times in torch's (the
# decay factor too), <= 4.5 u|p| apart; the update's own roundings are at lr size, 1e-3 of |p|; a weight
# moves <= 0.04 in 10 steps against per-tensor maxima >= 0.27, so |p| <= 1.2 max|b|: 4.5 * 1.2 < 6.
# Measured 1.7e-7 (2.5e-7 and 3.3e-7 from a float64 run of fairseq's adam); the uncorrected eps, 2.7e-3.
TOL = 6 * STEPS * 2.0**-24
LRS = [1e-3 * (1 + 0.3 * math.sin(k)) for k in range(STEPS)]  # the schedule moves every step
INTERMITTENT = 4  # index of a parameter with a gradient on even steps only (so step counts differ)


@functools.lru_cache(maxsize=None)  # parsing fairseq's flags costs ~0.5 s; nothing here mutates a config
def _cfg(optimizer, *flags):
    argv = helpers.train_args(
        "/nonexistent", "/nonexistent",
        extra=["--optimizer", optimizer, "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6",
               "--weight-decay", "0.1", *flags],
    )
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), input_args=argv))


def _params(dtype=torch.float32):
    """Two odd-shaped nn.Linear layers (weights and 1-D biases) plus a parameter used now and then."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(13, 7), torch.nn.Linear(7, 5)]
    params = [p for layer in layers for p in layer.parameters()] + [torch.nn.Parameter(torch.randn(3, 11))]
    return [torch.nn.Parameter(p.detach().to(dtype)) for p in params]


def _grads(params, step, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    out = []
    for i, p in enumerate(params):
        if i == INTERMITTENT and step % 2:
            out.append(None)
            continue
        scale = 10.0 ** (torch.rand(p.shape, generator=g) * 7 - 6)  # 1e-6 .. 10
        out.append((torch.randn(p.shape, generator=g) * scale).to(dtype))
    return out


def _run(opt, params, steps=range(STEPS)):
    for k in steps:
        opt.set_lr(LRS[k])
        for p, g in zip(params, _grads(params, k)):
            p.grad = g
        opt.step()
    return params


def _rel(a, b):
    return max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item() for x, y in zip(a, b))


@pytest.fixture(scope="module")
def adam_10():
    params = _params()
    return _run(optim.build_optimizer(_cfg("adam").optimizer, params), params)


@pytest.mark.parametrize("implementation", ["fused", "foreach", "for-loop"])
def test_matches_fairseqs_adam_in_fp32(adam_10, implementation):
    cfg = _cfg("adamw_torch", "--adamw-implementation", implementation)
    params = _params()
    opt = optim.build_optimizer(cfg.optimizer, params)
    assert type(opt).__name__ == "FairseqAdamWTorch" and opt.implementation == implementation
    assert _rel(_run(opt, params), adam_10) < TOL
    assert opt.param_groups[0]["eps"] == 1e-6  # the user's eps, not the step's corrected one


def test_auto_picks_fused_on_cpu_and_eps_correction_is_what_makes_it_match(adam_10):
    opt = optim.build_optimizer(_cfg("adamw_torch").optimizer, _params())
    assert opt.implementation == "fused" and opt.param_groups[0]["fused"]
    params = _params()
    plain = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1, fused=True)
    for k in range(STEPS):
        plain.param_groups[0]["lr"] = LRS[k]
        for p, g in zip(params, _grads(params, k)):
            p.grad = g
        plain.step()
    assert _rel(params, adam_10) > 10 * TOL


def test_optimizer_config_is_adams():
    ours = optim.build_optimizer(_cfg("adamw_torch").optimizer, _params())
    theirs = optim.build_optimizer(_cfg("adam").optimizer, _params())
    assert ours.optimizer_config == theirs.optimizer_config == {
        "lr": 1e-3, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.1,
    }
    assert ours.supports_flat_params and not ours.supports_memory_efficient_fp16


def _fp16_pair(monkeypatch, flat):
    """fairseq's FP16Optimizer around adam and around adamw_torch, on the same half-precision weights.

    Flat master weights are built on torch.cuda.current_device(); on CPU they work when that is the
    CPU tensors' device index (None).
    """
    flags = ["--fp16"] + ([] if flat else ["--fp16-no-flatten-grads"])
    if flat:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    out = []
    for name in ("adam", "adamw_torch"):
        params = _params(torch.float16)
        opt = optim.FP16Optimizer.build_optimizer(_cfg(name, *flags), params)
        assert opt.has_flat_params == flat
        out.append((opt, params))
    return out


def _run_fp16(opt, params, steps=range(STEPS)):
    """The trainer's order: zero_grad, scaled backward of the same fp16 gradients, step."""
    for k in steps:
        opt.set_lr(LRS[k])
        opt.zero_grad()
        grads = _grads(params, k, torch.float16)
        opt.backward(sum((p.float() * g.float()).sum() for p, g in zip(params, grads) if g is not None))
        opt.step()


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-tensor"])
def test_matches_fairseqs_adam_under_fp16_optimizer(monkeypatch, flat):
    (adam, p_adam), (ours, p_ours) = _fp16_pair(monkeypatch, flat)
    _run_fp16(adam, p_adam)
    _run_fp16(ours, p_ours)
    assert _rel(ours.fp32_optimizer.params, adam.fp32_optimizer.params) < TOL  # fp32 master weights
    assert _rel(p_ours, p_adam) < 1e-3  # the fp16 copies: at most a rounding flip apart
    assert ours.fp32_optimizer.implementation == "fused"


@pytest.mark.parametrize("flag", ["--memory-efficient-fp16", "--memory-efficient-bf16"])
def test_memory_efficient_half_precision_is_refused_naming_fp16(flag):
    cfg = _cfg("adamw_torch", flag)
    with pytest.raises(ValueError, match=rf"adamw_torch does not support {flag}.*Use --fp16"):
        optim.MemoryEfficientFP16Optimizer.build_optimizer(cfg, _params(torch.float16))


def _saved_and_loaded(state_dict):
    """Through torch.save and the safe loader, as a checkpoint travels."""
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("saved_by", ["fused", "for-loop"])
def test_state_dict_round_trip_equals_ten_straight_steps(saved_by):
    straight = _params()
    _run(optim.build_optimizer(_cfg("adamw_torch").optimizer, straight), straight)

    params = _params()
    first = optim.build_optimizer(_cfg("adamw_torch", "--adamw-implementation", saved_by).optimizer, params)
    _run(first, params, range(5))
    state = _saved_and_loaded(first.state_dict())
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in params]
    second = optim.build_optimizer(_cfg("adamw_torch").optimizer, resumed)
    second.load_state_dict(state, {})
    assert second.param_groups[0]["fused"] and not second.param_groups[0]["foreach"]  # this run's kernel
    _run(second, resumed, range(5, STEPS))
    if saved_by == "fused":
        assert all(torch.equal(a, b) for a, b in zip(resumed, straight))
    else:
        assert _rel(resumed, straight) < TOL
    steps = [int(second.optimizer.state[p]["step"]) for p in resumed]
    assert steps == [10, 10, 10, 10, 5]


def test_loading_adams_state_under_fp16_goes_on_as_adam(monkeypatch):
    """Under --fp16 fairseq saves both as FP16Optimizer and loads adam's state into adamw_torch."""
    (adam, p_adam), (ours, p_ours) = _fp16_pair(monkeypatch, flat=True)
    _run_fp16(adam, p_adam, range(5))
    state = _saved_and_loaded(adam.state_dict())
    assert isinstance(next(iter(state["state"].values()))["step"], int)  # adam's steps are ints
    for p, q in zip(p_ours, p_adam):
        p.data.copy_(q.data)
    ours.fp32_params[None].data.copy_(adam.fp32_params[None].data)
    ours.load_state_dict(state, {})
    assert torch.is_tensor(ours.optimizer.state[ours.fp32_params[None]]["step"])
    _run_fp16(adam, p_adam, range(5, STEPS))
    _run_fp16(ours, p_ours, range(5, STEPS))
    assert _rel(ours.fp32_optimizer.params, adam.fp32_optimizer.params) < TOL


# --- fairseq-train ---------------------------------------------------------------------------

TRAIN = ["--optimizer", "adamw_torch", "--clip-norm", "1.0", "--update-freq", "2",
         "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("optim") / "data"))["data"]


def _losses(log):
    return [float(json.loads(line.split("train_inner | ", 1)[1])["loss"])
            for line in log.splitlines() if "train_inner | {" in line]


def _checkpoint(path):
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    steps = {int(s["step"]) for s in state["last_optimizer_state"]["state"].values()}
    return state, steps


# slow: two fairseq-train runs, about 14 s idle (32 s on a loaded machine); make test keeps the state round
# trip in process (test_state_dict_round_trip_equals_ten_straight_steps), the optimizer as fairseq builds it,
# and test_train_smoke.py's resume from checkpoint_last.pt
@pytest.mark.slow
def test_fairseq_train_then_resume(tmp_path, data):
    ck = tmp_path / "ck"
    first = helpers.train(data, str(ck), extra=TRAIN, max_epoch=1)  # 48 examples / (8 x 2) = 3 updates
    log = first.stdout + first.stderr
    assert "adamw_torch: torch.optim.AdamW (fused)" in log
    losses = _losses(log)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), losses
    state, steps = _checkpoint(ck / "checkpoint_last.pt")
    assert state["cfg"]["optimizer"]["_name"] == "adamw_torch"
    assert state["optimizer_history"][-1]["optimizer_name"] == "FairseqAdamWTorch"
    assert state["optimizer_history"][-1]["num_updates"] == 3 and steps == {3}
    assert state["last_optimizer_state"]["param_groups"][0]["eps"] == 1e-6

    resumed = helpers.train(data, str(ck), extra=TRAIN, max_epoch=2)
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint \S*checkpoint_last.pt \(epoch 2 @ 3 updates\)", log), log[-3000:]
    assert all(math.isfinite(x) for x in _losses(log)) and '"num_updates": "6"' in log
    state, steps = _checkpoint(ck / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 6 and steps == {6}


@pytest.mark.slow  # fairseq-train runs / model loads: kept out of make test's 10 minutes
def test_resuming_an_adam_checkpoint_in_fp32_is_refused_by_fairseq(tmp_path, data):
    ck = str(tmp_path / "ck")
    helpers.train(data, ck, extra=["--max-update", "1"])  # helpers' default optimizer: adam
    refused = helpers.train(data, ck, extra=[*TRAIN, "--max-update", "2"], check=False)
    assert refused.returncode != 0
    assert "Optimizer does not match; please reset the optimizer (--reset-optimizer). FairseqAdam vs " \
           "FairseqAdamWTorch" in refused.stderr, refused.stderr[-3000:]
    # (with --reset-optimizer fairseq skips the optimizer state, and also restarts num_updates at 0)
