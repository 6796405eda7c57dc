"""AclTrainer under the Trainer's features: gradient accumulation's contract (HF_PATH pitfall 1), the gate under a
loss scaler and without one (pitfall 3), bf16's refusal, and the criterion options against the fairseq criteria's."""
import dataclasses
import os

import pytest
import torch

import hf_encoders

pytest.importorskip("transformers")


def _trainer(tmp_path, model, criterion="sentence_ce", n=32, **args_kw):
    from transformers import TrainingArguments

    from acl_hf.arguments import CriterionArguments
    from acl_hf.trainer import AclTrainer

    crit_kw = args_kw.pop("criterion_kw", {})
    defaults = dict(max_steps=1, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
                    optim="sgd", learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=0.0,
                    weight_decay=0.0, logging_steps=1, seed=3)
    args = TrainingArguments(str(tmp_path / "out"), **{**defaults, **args_kw})
    return AclTrainer(model=model, args=args, train_dataset=hf_encoders.ToySet(n),
                      criterion=CriterionArguments(criterion=criterion, **crit_kw))


def _update(tmp_path, criterion, batch, accumulation, **kw):
    """One optimizer step of plain SGD at lr 1: the parameters' change is minus the step's gradient."""
    model = hf_encoders.multi_exit("bert", seed=0)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    trainer = _trainer(tmp_path / f"{batch}x{accumulation}", model, criterion, per_device_train_batch_size=batch,
                       gradient_accumulation_steps=accumulation, **kw)
    trainer.train()
    return {k: before[k] - p.detach() for k, p in model.named_parameters()}, trainer


@pytest.mark.parametrize("criterion", ["sentence_ce", "multi_exit_kd"])
def test_accumulating_four_batches_of_eight_gives_the_batch_of_thirty_two_s_gradient(tmp_path, criterion):
    """Per-example losses: the accumulated step is the large batch's step (not 4x, not 1/4)."""
    g32, _ = _update(tmp_path, criterion, 32, 1)
    g8, _ = _update(tmp_path, criterion, 8, 4)
    for key in g32:
        scale = float(g32[key].norm())
        assert float((g8[key] - g32[key]).norm()) <= 1e-4 * max(scale, 1e-3), key  # fp32 sums in other orders
    assert max(float(g.abs().max()) for g in g32.values()) > 1e-3  # something moved


def test_an_accumulated_contrastive_step_is_the_sum_of_its_micro_batches_objectives_over_the_step_s_examples(
        tmp_path, monkeypatch):
    """ACL over micro-batches contrasts within each (as fairseq's --update-freq does) and each micro-batch's gate
    decides for itself: the step's gradient is the sum of the four micro-batch objectives' gradients over 32."""
    from acl_hf import trainer as trainer_module
    from acl_torch import objective

    seen = []  # the micro-batches the step read, in order
    original = trainer_module.AclTrainer.compute_loss

    def recording(self, model, inputs, *args, **kwargs):
        seen.append({k: v.clone() for k, v in inputs.items()})
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(trainer_module.AclTrainer, "compute_loss", recording)
    g8, trainer = _update(tmp_path, "acl_grad", 8, 4, criterion_kw={"acl_grad_threshold": -1.0})
    assert [len(b["labels"]) for b in seen] == [8, 8, 8, 8]
    model = hf_encoders.multi_exit("bert", seed=0).train()
    for batch in seen:
        labels = batch.pop("labels")
        out = model(**batch, output_exit_features=True)
        parts = objective.objective(trainer.terms, model.exit_outputs(out), labels, params=model.parameters,
                                    training=True, loss_scaler=False)
        (parts.loss / 32).backward()
    for key, p in model.named_parameters():
        assert torch.allclose(g8[key], p.grad, rtol=1e-4, atol=1e-6), key
    logged = [h for h in trainer.state.log_history if "grad_cos" in h][0]
    assert logged["conflict_rate"] == 0.0  # threshold -1 keeps every micro-batch's term


def _inf_on_first_backward(model):
    """The last head's dense output gets an inf gradient in the first backward only."""
    seen = []

    def hook(_module, _args, output):
        if not seen and output.requires_grad:
            seen.append(1)
            output.register_hook(lambda g: torch.full_like(g, float("inf")))

    return model.classification_heads["sentence_classification_head"].dense.register_forward_hook(hook)


def test_under_a_loss_scaler_an_overflowed_step_is_skipped_not_raised_by_the_gate(tmp_path):
    """fp16 on a GPU runs a GradScaler: the gate passes the inf on, the scaler skips the step and lowers the scale.
    accelerate builds no scaler on a CPU, so one is given here, where the GPU's would be."""
    model = hf_encoders.multi_exit("bert")
    trainer = _trainer(tmp_path, model, "acl_grad", fp16=True, max_steps=2, per_device_train_batch_size=8,
                       learning_rate=0.1)
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    _inf_on_first_backward(model)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    steps = []
    trainer.add_callback(type("Snap", (__import__("transformers").TrainerCallback,), {
        "on_step_end": lambda self, args, state, control, **kw: steps.append(
            {k: p.detach().clone() for k, p in model.named_parameters()})})())
    trainer.train()
    assert all(torch.equal(before[k], steps[0][k]) for k in before)  # the overflowed step changed nothing
    assert any(not torch.equal(steps[0][k], steps[1][k]) for k in before)  # the next one trained
    assert trainer.accelerator.scaler.get_scale() == 2.0 ** 9
    first = [h for h in trainer.state.log_history if "acl_grad_overflow" in h][0]
    assert first["acl_grad_overflow"] == 1.0


def test_without_a_loss_scaler_an_inf_gradient_is_raised_in_one_line_with_the_trainer_s_flags(tmp_path):
    model = hf_encoders.multi_exit("bert")
    trainer = _trainer(tmp_path, model, "acl_grad", per_device_train_batch_size=8)
    assert trainer.accelerator.scaler is None
    _inf_on_first_backward(model)
    with pytest.raises(FloatingPointError, match=r"ACL-Grad at step 0: .*inf/NaN.*--learning_rate, set --max_grad"):
        trainer.train()


def test_bf16_on_a_cpu_without_bf16_units_is_refused_in_one_line(tmp_path, monkeypatch):
    from acl_torch import acceleration
    from acl_torch.machine import CpuKind

    avx2 = CpuKind("AuthenticAMD", "AMD EPYC 7B12", frozenset({"avx2", "fma"}), 2250.0)
    monkeypatch.setattr(acceleration, "read_cpu_kind", lambda: avx2)
    with pytest.raises(ValueError, match=r"^--bf16: this CPU \(AMD EPYC 7B12.*has no native bf16") as err:
        _trainer(tmp_path, hf_encoders.multi_exit("bert"), bf16=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("criterion,options,message", [
    ("acl_embed", {"acl_temperature": 0.0}, "--acl_temperature must be > 0"),
    ("sentence_scl", {"scl_weight": 2.0}, r"--scl_weight must be a finite number in \[0, 1\]"),
    ("acl_grad", {"acl_grad_threshold": float("nan")}, r"--acl_grad_threshold must be a finite number"),
    ("acl_nonsense", {}, "--criterion must be one of sentence_ce, sentence_scl"),
])
def test_bad_criterion_options_are_refused_in_one_line(tmp_path, criterion, options, message):
    with pytest.raises(ValueError, match=message):
        _trainer(tmp_path, hf_encoders.multi_exit("bert"), criterion, criterion_kw=options)


def test_the_features_scope_is_refused_under_torch_compile(tmp_path):
    """A compiled model returns u and the logits as separate graph outputs: CE's gradient with respect to u is None,
    and the rule would decide nothing (measured: grad_cos never logged). The params scope trains compiled."""
    with pytest.raises(ValueError, match="features scope cannot run with --torch_compile"):
        _trainer(tmp_path, hf_encoders.multi_exit("bert"), "acl_grad", torch_compile=True,
                 criterion_kw={"acl_grad_scope": "features"})
    with pytest.raises(ValueError, match="features scope cannot run with --torch_compile"):
        _trainer(tmp_path, hf_encoders.multi_exit("bert"), "sentence_scl", torch_compile=True,
                 criterion_kw={"scl_grad": True, "scl_grad_scope": "features"})


def test_multi_exit_criteria_need_two_exits_and_contrastive_ones_class_labels(tmp_path):
    with pytest.raises(ValueError, match="needs at least two exits"):
        _trainer(tmp_path, hf_encoders.multi_exit("bert", exit_layers=[3]), "acl_cross_layer")
    with pytest.raises(ValueError, match="needs class labels.*use --criterion sentence_ce"):
        _trainer(tmp_path, hf_encoders.multi_exit("bert", num_labels=1), "acl_grad")


def test_the_options_and_defaults_are_the_fairseq_criteria_s():
    pytest.importorskip("fairseq")
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY

    import acl_fairseq  # noqa: F401
    from acl_hf.arguments import CriterionArguments
    from acl_torch import objective

    ours = {f.name: f.default for f in dataclasses.fields(CriterionArguments) if f.name != "criterion"}
    theirs = {}
    for name in objective.TERMS:
        for f in dataclasses.fields(CRITERION_DATACLASS_REGISTRY[name]):
            theirs.setdefault(f.name, f.default)
    # the base config's fields are fairseq's (the head's name, the metric switches) or the model's (exit_weighting),
    # except the one shared option of every contrastive criterion
    base = {f.name for f in dataclasses.fields(CRITERION_DATACLASS_REGISTRY["sentence_ce"])}
    assert {k for k in theirs if k not in base} | {"contrast_across_workers"} == set(ours)
    assert {k: theirs[k] for k in ours} == ours


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_step(tmp_path, name, nproc, batch, criterion, *options):
    import subprocess
    import sys

    import helpers

    out = tmp_path / name
    out.mkdir()
    script = os.path.join(helpers.REPO, "tests", "hf_ddp_step.py")
    launch = [sys.executable, script] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
        str(_free_port()), script]
    proc = subprocess.run([*launch, str(out / "step.pt"), str(batch), criterion, *options], capture_output=True,
                          text=True, timeout=600, cwd=helpers.REPO,
                          env=dict(os.environ, PYTHONPATH=helpers.REPO, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out / "step.pt")


@pytest.mark.slow
@pytest.mark.parametrize("criterion,options", [
    ("acl_grad", ["contrast_across_workers=true", "acl_grad_global_decision=true"]),
    ("sentence_scl", ["contrast_across_workers=true", "scl_grad=true", "scl_grad_scope=features",
                      "scl_grad_global_decision=true"]),
])
def test_two_gloo_ranks_give_one_process_s_update_on_the_joined_batch(tmp_path, criterion, options):
    """torchrun, 2 CPU ranks x 8 with the contrastive set gathered (acl_torch.distributed.gather_for_contrast, the
    fairseq path's) and the gate deciding on the summed gradients: the update, the logged objective and the decision
    are one process's on the 16 examples."""
    one = _ddp_step(tmp_path, "one", 1, 16, criterion, *options)
    two = _ddp_step(tmp_path, "two", 2, 8, criterion, *options)
    assert (one["world"], two["world"]) == (1, 2)
    scale = float(torch.stack([d.norm() for d in one["delta"].values()]).median())
    for key, delta in one["delta"].items():  # fp32 sums in other orders (measured up to 4e-5 of a small head's)
        gap = float((two["delta"][key] - delta).norm())
        assert gap <= 1e-4 * max(float(delta.norm()), scale), key
    assert two["log"]["loss"] == pytest.approx(one["log"]["loss"], rel=1e-5)
    for key in ("ce_loss", "grad_cos", "conflict_rate"):
        assert two["log"][key] == pytest.approx(one["log"][key], abs=1e-3), key


def test_tensorboard_gets_the_fairseq_task_s_tags_under_train(tmp_path, monkeypatch):
    """report_to tensorboard: every loss term, every exit's accuracy, the gate's cosine and firing rate, under the
    names the fairseq task logs (test_train_smoke.py reads the same names from fairseq-train's event files)."""
    import helpers

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # transformers 5's place for it
    model = hf_encoders.multi_exit("bert")
    trainer = _trainer(tmp_path, model, "acl_cross_layer", max_steps=2, per_device_train_batch_size=8,
                       report_to="tensorboard", learning_rate=1e-3)
    trainer.train()
    tags = set().union(*(run.keys() for run in helpers.read_scalars(str(tmp_path / "tb")).values()))
    want = {"train/" + t for t in ("loss", "ce_loss", "acl_loss", "acl_cl_loss", "accuracy", "accuracy_exit1",
                                   "accuracy_exit2", "accuracy_exit3", "grad_cos", "conflict_rate",
                                   "acl_grad_overflow")}
    assert want <= tags, want - tags


def test_bf16_autocast_trains_with_the_gate_deciding_in_fp32(tmp_path):
    """--bf16 on a CPU with bf16 units (this one has AMX; elsewhere the refusal above applies): the model runs under
    bf16 autocast, the objective and the gate's cosine in fp32 outside it, and every step is decided."""
    from acl_torch.machine import read_cpu_kind

    if read_cpu_kind().bf16_unit is None:
        pytest.skip("this CPU has no bf16 units: --bf16 is refused here (tested above)")
    model = hf_encoders.multi_exit("bert")
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    trainer = _trainer(tmp_path, model, "acl_grad", bf16=True, max_steps=2, per_device_train_batch_size=8,
                       learning_rate=1e-3, optim="adamw_torch")
    trainer.train()
    logged = [h for h in trainer.state.log_history if "grad_cos" in h]
    assert len(logged) == 2 and all(-1.0 <= h["grad_cos"] <= 1.0 for h in logged)
    assert any(not torch.equal(before[k], p.detach()) for k, p in model.named_parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast, not bf16 weights
