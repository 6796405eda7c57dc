"""Properties of the criteria's wiring (the shared forward, the gate) that `make mutation` found unchecked by the
criterion and loss tests: each test here failed on a mutant that survived them (docs/tests.md, "Mutation score");
and the shared base's independence from the gate."""
import pytest
import torch

import helpers
from acl_fairseq.criterions import gating
from acl_torch import objective
from test_criterion_totals import model_outputs, setup, total_loop
from test_criterions import build


@pytest.fixture(scope="module")
def data3(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("wiring") / "data"), num_classes=3)["data"]


def _gated_linear(loss_scaler: bool, scope: str = "params"):
    """A gate over a tiny linear layer: (gated loss, its log, the layer)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    out = layer(torch.randn(4, 3))
    ce, aux = out[:, 0].sum(), (out * torch.randn(4, 2)).sum()
    loss, log = gating.gate(layer, None, ce, aux, scope, 0.0, loss_scaler=loss_scaler)
    return loss, log, layer


def test_without_a_loss_scaler_a_non_finite_gradient_raises():
    loss, _, _ = _gated_linear(loss_scaler=False)
    with pytest.raises(FloatingPointError):
        (loss * float("inf")).backward()


def test_with_a_loss_scaler_a_non_finite_gradient_is_passed_on_and_counted_as_an_overflow_only():
    # fairseq's loss scaler skips the step: the gate must not raise, and the step is no decision
    loss, log, layer = _gated_linear(loss_scaler=True)
    (loss * float("inf")).backward()
    assert not torch.isfinite(layer.weight.grad).all()
    assert float(log["acl_grad_overflow"]) == 1.0
    assert float(log["gated_steps"]) == 0.0 and float(log["grad_cos"]) == 0.0


@pytest.mark.parametrize("loss_scaler", [False, True])
def test_a_finite_gradient_is_a_decision_and_no_overflow(loss_scaler):
    loss, log, _ = _gated_linear(loss_scaler=loss_scaler)
    loss.backward()
    assert float(log["acl_grad_overflow"]) == 0.0
    assert float(log["gated_steps"]) == 1.0 and float(log["grad_cos"]) != 0.0


def test_by_default_the_gate_applies_the_rule_and_has_no_loss_scaler():
    # gate()'s defaults are the plain fp32 run's: a threshold above any cosine drops the term, an overflow raises
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    out = layer(torch.randn(4, 3))
    ce, aux = out[:, 0].sum(), (out * torch.randn(4, 2)).sum()
    want = torch.autograd.grad(ce, [layer.weight, layer.bias], retain_graph=True)
    loss, log = gating.gate(layer, None, ce, aux, "params", 1.01)
    loss.backward(retain_graph=True)
    assert float(log["conflict"]) == 1.0
    torch.testing.assert_close([layer.weight.grad, layer.bias.grad], list(want), rtol=0, atol=0)
    out = layer(torch.randn(4, 3))  # the gate's backward freed the first graph
    loss, _ = gating.gate(layer, None, out[:, 0].sum(), out.sum(), "params", 1.01)
    with pytest.raises(FloatingPointError):
        (loss * float("inf")).backward()



def test_by_default_each_rank_decides_on_its_own_gradients(monkeypatch):
    # the global decision is opt-in (--acl-grad-global-decision): gate() alone all-reduces nothing
    from acl_torch import distributed

    calls = []
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "all_reduce_sum", lambda ts: calls.append(len(ts)) or list(ts))
    loss, log, _ = _gated_linear(loss_scaler=False)
    loss.backward()
    assert float(log["gated_steps"]) == 1.0 and not calls

@pytest.mark.parametrize("scope", ["params", "features"])
def test_a_term_that_reaches_nothing_leaves_ce_alone_and_is_no_decision(scope):
    # a global decision's rank without rows for the term still enters the gate, with an aux of no graph
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    u = layer(torch.randn(4, 3))
    ce, aux = u[:, 0].sum(), torch.zeros(())
    features = [u] if scope == "features" else None
    want = torch.autograd.grad(ce, [layer.weight, layer.bias], retain_graph=True, allow_unused=True)
    loss, log = gating.gate(layer, None, ce, aux, scope, 0.0, features=features)
    loss.backward()
    assert float(log["gated_steps"]) == 0.0 and float(log["conflict"]) == 0.0
    torch.testing.assert_close([layer.weight.grad, layer.bias.grad], list(want), rtol=0, atol=0)



@pytest.mark.parametrize("dtype,raises", [(torch.float16, False), (torch.float32, True)])
def test_the_criteria_s_gate_passes_an_overflow_on_for_an_fp16_model_only(dtype, raises):
    # gating.combine, as the criteria call it, tells the gate whether fairseq's loss scaler will skip the step
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2).to(dtype)
    out = layer(torch.randn(4, 3).to(dtype)).float()
    ce, aux = out[:, 0].sum(), (out * torch.randn(4, 2)).sum()
    loss, log = gating.combine(layer, None, ce, aux, gating.GateConfig("params", 0.0))
    if raises:
        with pytest.raises(FloatingPointError):
            (loss * float("inf")).backward()
    else:
        (loss * float("inf")).backward()
        assert float(log["acl_grad_overflow"]) == 1.0

def test_an_auxiliary_part_without_a_gradient_is_added_as_it_is_and_a_bad_scope_is_refused():
    # nothing for the gate to decide (the auxiliary part needs no gradient, no global decision): the total is ce + aux
    layer = torch.nn.Linear(3, 2)
    ce, aux = layer(torch.randn(4, 3))[:, 0].sum(), torch.tensor(0.75)
    loss, log = gating.combine(layer.train(), None, ce, aux, gating.GateConfig("params", 0.0))
    assert float(loss) == pytest.approx(float(ce) + 0.75) and log == {}
    assert objective.AclEmbedTerms.acl_gate(None, apply=False).scope == "params"  # ACL-Embed: over all parameters
    with pytest.raises(ValueError, match="scope 'param' is not one of params, features"):
        gating.GateConfig("param", 0.0)


class _Frozen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2), requires_grad=False)


@pytest.mark.parametrize("dtype,autocast,scaler", [
    (torch.float32, None, False), (torch.float16, None, True), (torch.bfloat16, None, False),
    (torch.float32, torch.float16, True), (torch.float32, torch.bfloat16, False)])
def test_a_loss_scaler_is_assumed_for_fp16_weights_or_fp16_autocast_only(dtype, autocast, scaler):
    # fairseq scales the loss for --fp16/--memory-efficient-fp16 (fp16 weights) and --amp (fp16 autocast)
    layer = torch.nn.Linear(3, 2).to(dtype)
    if autocast is None:
        assert gating.has_loss_scaler(layer) is scaler
    else:
        with torch.autocast("cpu", dtype=autocast):
            assert gating.has_loss_scaler(layer) is scaler
    assert gating.has_loss_scaler(_Frozen()) is False  # nothing trains: nothing to scale


# ---- ExitCriterionBase.forward ------------------------------------------------------------------
def test_a_batch_of_one_sentence_still_has_its_acl_term(data3):
    # one sample still contrasts against the label embeddings: its ACL term is not zero, and its total is
    # METHOD.md's (the criterion's loss and its logged loss, reference from test_criterion_totals)
    name, model, crit, sample, layers, cfg = setup(data3, "embed-single")
    ds = crit.task.dataset("valid")
    one = ds.collater([ds[0]])
    model.eval()
    loss, n, log = crit(model, one)
    ex = model_outputs(model, one, layers)
    y = one["target"].view(-1)
    want = total_loop(name, cfg, ex, y)
    assert n == 1 and float(log["acl_loss"]) > 1e-3
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(log["loss"]) == pytest.approx(want, rel=1e-5)


def test_the_logging_output_counts_the_batch_and_holds_the_ce_sum(data3):
    # fairseq's trainer reads ntokens, nsentences and sample_size by name (throughput, batch size, gradient scale)
    name, model, crit, sample, layers, cfg = setup(data3, "ce-multi-layer")
    model.eval()
    loss, n, log = crit(model, sample)
    assert log["ntokens"] == sample["ntokens"] and log["nsentences"] == log["sample_size"] == n == 8
    want = total_loop(name, cfg, model_outputs(model, sample, layers), sample["target"].view(-1))
    assert float(log["ce_loss"]) == pytest.approx(want, rel=1e-5) and float(log["loss"]) == float(loss)


def test_alignment_scalars_are_logged_in_validation_only(data3):
    # they cost a K x d product per exit; METHOD.md logs them on validation
    _, model, crit, sample = build(data3, "sentence_ce", arch="multi_exit_roberta", num_classes=3)
    model.train()
    _, _, log = crit(model, sample)
    assert not [k for k in log if k.startswith("align_")]
    model.eval()
    _, _, log = crit(model, sample)
    assert {"align_own_exit1", "align_other_exit3", "align_to_last_exit2"} <= set(log)


def test_contrast_across_workers_gathers_the_real_rows_of_every_rank_and_none_of_a_replay(data3, monkeypatch):
    # one process posing as rank 0 of 2 (test_distributed.py runs real ranks, outside make mutation's selection)
    from acl_torch import distributed

    seen = []
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "gather_for_contrast",
                        lambda exits, targets, real=True: seen.append(real) or (exits, targets, targets.numel()))
    _, model, crit, sample = build(data3, "acl_embed", extra=["--contrast-across-workers", "--task",
                                                              "sentence_prediction_acl"], num_classes=3)
    model.train()
    crit(model, sample)
    with crit.replaying(True):
        crit(model, sample)
    crit(model, sample)
    assert seen == [True, False, True]


def test_without_contrast_across_workers_a_rank_of_two_contrasts_its_own_batch_only(data3, monkeypatch):
    # the global set is opt-in: without the flag a 2-rank run gathers nothing and gives one process's loss
    from acl_torch import distributed

    _, model, crit, sample = build(data3, "acl_embed", num_classes=3)
    model.train()
    alone, _, _ = crit(model, sample)
    seen = []
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "gather_for_contrast",
                        lambda exits, targets, real=True: seen.append(real) or (exits, targets, 2 * targets.numel()))
    loss, _, _ = crit(model, sample)
    assert not seen and float(loss) == float(alone)


def test_a_gated_criterion_whose_global_contrastive_set_is_empty_trains_on_ce_alone(data3, monkeypatch):
    # every rank replaying at once leaves no row to contrast: the gate still gets a zero tensor for the term
    from acl_torch import distributed
    from acl_torch.exit_heads import ExitOutputs

    def nobody(exits, targets, real=True):
        rows = ExitOutputs(logits=exits.logits, features=[u[:0] for u in exits.features],
                           pooled=[c[:0] for c in exits.pooled], label_embeddings=exits.label_embeddings,
                           layers=exits.layers)
        return rows, targets[:0], 0

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "gather_for_contrast", nobody)
    _, model, crit, sample = build(data3, "acl_grad", extra=["--contrast-across-workers", "--task",
                                                             "sentence_prediction_acl"], num_classes=3)
    model.train()
    loss, _, log = crit(model, sample)
    loss.backward()
    assert float(loss) == float(log["loss"]) == pytest.approx(float(log["ce_loss"]), rel=1e-6)


def test_a_regression_batch_keeps_its_predictions_for_spearman_in_validation_only(tmp_path):
    # Spearman needs every validation prediction; training would carry them per batch for nothing
    reg = helpers.make_data(str(tmp_path / "reg"), regression=True)["data"]
    _, model, crit, sample = build(reg, "sentence_ce", extra=["--regression-target"], num_classes=1)
    model.train()
    assert not {"_pred", "_targ"} & set(crit(model, sample)[2])
    model.eval()
    assert {"_pred", "_targ"} <= set(crit(model, sample)[2])


# ---- ExitCriterionBase.__init__ -----------------------------------------------------------------
@pytest.mark.parametrize("multiple,task,warns", [(1, [], False), (2, [], True), (8, [], True),
                                                 (2, ["--task", "sentence_prediction_acl"], False)])
def test_the_stock_task_warns_once_when_validation_would_drop_examples(data3, caplog, monkeypatch, multiple, task,
                                                                       warns):
    # fairseq drops a last validation batch that is not a multiple of --required-batch-size-multiple
    import logging

    from acl_fairseq.criterions import base

    monkeypatch.setattr(base, "_WARNED", [])
    with caplog.at_level(logging.WARNING, logger="acl_fairseq"):
        for _ in range(2):
            build(data3, "sentence_ce", extra=["--required-batch-size-multiple", str(multiple), *task], num_classes=3)
    assert caplog.text.count("--required-batch-size-multiple 1") == int(warns)


def test_contrast_across_workers_on_the_stock_task_is_refused_naming_the_plugin_task(data3):
    # the stock task never says which batches fairseq replays, so their rows would be contrasted
    with pytest.raises(ValueError, match="^--contrast-across-workers needs --task sentence_prediction_acl"):
        build(data3, "acl_embed", extra=["--contrast-across-workers"], num_classes=3)


@pytest.mark.parametrize("name,flags,said", [
    ("acl_embed", ["--regression-target"], "^AclEmbedCriterion needs class labels"),
    ("multi_exit_kd", ["--contrast-across-workers", "--task", "sentence_prediction_acl"],
     "^--contrast-across-workers .*; MultiExitKdCriterion has none: drop the flag"),
])
def test_a_refusal_at_construction_names_the_criterion(tmp_path, name, flags, said):
    data = helpers.make_data(str(tmp_path / "d"), regression="--regression-target" in flags)["data"]
    with pytest.raises(ValueError, match=said):
        build(data, name, arch="multi_exit_roberta", extra=flags, num_classes=1 if "--regression-target" in flags
              else 2)


# ---- acl_embed --------------------------------------------------------------------------------------
def test_acl_embed_on_a_float64_model_equals_the_reference(data3):
    # the exit weights follow the per-exit losses' dtype (float64 here, float32 otherwise)
    name, model, crit, sample, layers, cfg = setup(data3, "embed-multi-samples")
    model.double().eval()
    loss, _, _ = crit(model, sample)
    want = total_loop(name, cfg, model_outputs(model, sample, layers), sample["target"].view(-1))
    assert float(loss) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("n_features,n_embeddings", [(2, 1), (1, 2), (0, 0)])
def test_acl_embed_losses_refuses_feature_and_label_embedding_sets_that_do_not_pair(n_features, n_embeddings):
    from acl_torch import losses

    labels = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="feature sets"):
        losses.acl_embed_losses([torch.randn(4, 3)] * n_features, labels, [torch.randn(2, 3)] * n_embeddings, 0.5)


def test_acl_embed_losses_of_exits_with_different_label_counts_are_computed_one_by_one():
    # label-embedding sets of different shapes cannot be stacked: each exit gets its own call, as documented
    from acl_torch import losses

    torch.manual_seed(0)
    feats, labels = [torch.randn(6, 4), torch.randn(6, 4)], torch.tensor([0, 1, 1, 0, 1, 0])
    embs = [torch.randn(3, 4), torch.randn(2, 4)]
    want = torch.stack([losses.acl_embed_loss(u, labels, w, 0.5) for u, w in zip(feats, embs)])
    torch.testing.assert_close(losses.acl_embed_losses(feats, labels, embs, 0.5), want)


# ---- ExitCriterionBase._task_loss ---------------------------------------------------------------
def test_the_regression_loss_is_the_sum_of_squared_errors_over_the_exits(tmp_path):
    # fairseq's sum convention: MSE summed over the batch (the optimizer divides by sample_size)
    reg = helpers.make_data(str(tmp_path / "reg"), regression=True)["data"]
    _, model, crit, sample = build(reg, "sentence_ce", arch="multi_exit_roberta", extra=["--regression-target"],
                                   num_classes=1)
    model.eval()
    loss, n, _ = crit(model, sample)
    ex = model_outputs(model, sample, [1, 2, 3])
    y = sample["target"].view(-1).double()
    want = sum(w * float(((z.view(-1).double() - y) ** 2).sum()) for w, z in zip([1 / 6, 2 / 6, 3 / 6], ex.logits))
    assert n == 8 and float(loss) == pytest.approx(want, rel=1e-5)


def test_the_cross_entropy_of_fp16_logits_is_computed_in_float32(data3):
    # --fp16 logits: log-softmax in half would round the loss (and its gradient) to half precision
    name, model, crit, sample, layers, cfg = setup(data3, "ce-single")
    model.half().eval()
    loss, _, _ = crit(model, sample)
    ex = model_outputs(model, sample, layers)
    want = total_loop(name, cfg, ex, sample["target"].view(-1))  # from the same half logits, in float64
    assert loss.dtype == torch.float32 and float(loss) == pytest.approx(want, rel=1e-6)


# ---- weighted_exit_sum ------------------------------------------------------------------------------
def test_weighted_exit_sum_weights_each_exit_s_values_elementwise_in_the_wider_dtype():
    from acl_torch import losses

    a, b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)
    got = losses.weighted_exit_sum([a, b + 1e-12], torch.tensor([0.25, 0.75]))
    assert got.dtype == torch.float64 and got.shape == (3,)
    torch.testing.assert_close(got, 0.25 * a + 0.75 * (b + 1e-12), rtol=1e-15, atol=0)
    weights64 = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    wide = losses.weighted_exit_sum([torch.tensor(1.0), torch.tensor(2.0)], weights64)
    assert wide.dtype == torch.float64 and float(wide) == pytest.approx(5 / 3, rel=1e-15)


def test_weighted_exit_sum_moves_the_weights_to_the_values_device():
    # the weights come from exit_weights on the CPU; a CPU run sees the move on the meta device
    from acl_torch import losses

    got = losses.weighted_exit_sum([torch.ones((), device="meta")] * 2, losses.exit_weights([1, 2]))
    assert got.device.type == "meta"


def test_the_base_class_knows_nothing_of_acl_grad():
    """criterions/base.py neither imports the gate nor reads ACL-Grad's flags: a criterion that wants the gate
    overrides ``combine`` (as acl_grad.py does) without inheriting AclGradConfig."""
    import ast
    import pathlib

    source = pathlib.Path(helpers.USER_DIR, "criterions", "base.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            imported |= {node.module or ""} | {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
    assert not {m for m in imported if "gating" in m}, imported
    assert "acl_grad_" not in source
