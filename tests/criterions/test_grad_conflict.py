"""The ACL-Grad rule on SCL (``sentence_scl --scl-grad``) and ``--log-grad-conflict``: against two separate
backward passes, the obvious reference."""
import sys

import pytest
import torch

import helpers
from test_criterions import _cosine, _grads, _two_pass_reference, build


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("conflict") / "data"))["data"]


def _step(model, crit, sample):
    model.zero_grad()
    loss, _, log = crit(model, sample)
    loss.backward()
    return _grads(model), log


@pytest.mark.parametrize("scope", ["params", "features"])
@pytest.mark.parametrize("feature", ["encoder", "head"])
def test_scl_grad_update_is_ce_alone_on_conflict_and_ce_plus_scl_otherwise(data, scope, feature):
    """The gate sees no ACL-Grad config: its settings are --scl-grad-*; SCL's CE part is (1 - lambda) CE."""
    _, model, crit, sample = build(data, "sentence_scl", extra=["--scl-grad", "--scl-grad-scope", scope,
                                                                 "--scl-feature", feature])
    assert not hasattr(crit.cfg, "acl_grad_threshold")
    model.train()
    g_ce, g_scl = _two_pass_reference(model, crit, sample)
    w = crit.ce_weight
    cos = _cosine(g_ce, g_scl)
    thresholds = [(cos - 1e-3, True), (cos + 1e-3, False)] if scope == "params" else [(-1.0, True), (1.0, False)]
    for threshold, keep in thresholds:
        crit.cfg.scl_grad_threshold = threshold
        got, log = _step(model, crit, sample)
        assert float(log["conflict"]) == (0.0 if keep else 1.0) and float(log["gated_steps"]) == 1.0
        if scope == "params":
            assert abs(float(log["grad_cos"]) - cos) < 1e-4
        for k in g_ce:
            want = w * g_ce[k] + (g_scl.get(k, torch.zeros_like(g_ce[k])) if keep else 0)
            assert torch.allclose(got[k], want, atol=1e-6, rtol=1e-4), k


@pytest.mark.parametrize("name,arch,extra", [
    ("sentence_scl", "roberta", ["--log-grad-conflict"]),
    ("acl_embed", "roberta", ["--log-grad-conflict"]),
    ("acl_cross_layer", "multi_exit_roberta", ["--log-grad-conflict", "--no-acl-grad"]),
])
def test_log_grad_conflict_measures_without_changing_the_update(data, name, arch, extra):
    _, model, crit, sample = build(data, name, arch=arch, extra=extra)
    model.train()
    g_ce, g_aux = _two_pass_reference(model, crit, sample)
    cos = _cosine(g_ce, g_aux)
    threshold = {"sentence_scl": "scl_grad_threshold", "acl_cross_layer": "acl_grad_threshold"}.get(name)
    if threshold:  # a threshold every cosine is below: the rule would drop the term, the measurement keeps it
        setattr(crit.cfg, threshold, 1.0)
    got, log = _step(model, crit, sample)
    assert abs(float(log["grad_cos"]) - cos) < 1e-4 and float(log["gated_steps"]) == 1.0
    assert float(log["conflict"]) == (1.0 if threshold else float(cos < 0))  # the rule's decision, logged only
    for k in g_ce:  # the update is CE + the auxiliary term, whatever the cosine
        want = crit.ce_weight * g_ce[k] + g_aux.get(k, torch.zeros_like(g_ce[k]))
        assert torch.allclose(got[k], want, atol=1e-6, rtol=1e-4), k


def test_without_the_flag_nothing_is_measured(data):
    _, model, crit, sample = build(data, "acl_embed")
    model.train()
    _, log = _step(model, crit, sample)
    assert "grad_cos" not in log


@pytest.mark.parametrize("value", ["1.5", "-2", "nan"])
def test_scl_grad_threshold_outside_minus_one_one_is_refused(data, value):
    with pytest.raises(ValueError, match=r"--scl-grad-threshold must be a finite number in \[-1, 1\]"):
        build(data, "sentence_scl", extra=["--scl-grad", "--scl-grad-threshold", value])


def read_histograms(logdir):
    """{(run, tag): [(step, count, sum, min, max)]} from the event files under ``logdir``."""
    import os

    from tensorboardX.proto import event_pb2

    out = {}
    for root, _, files in os.walk(logdir):
        for name in (f for f in files if "tfevents" in f):
            for record in helpers._records(os.path.join(root, name)):
                ev = event_pb2.Event.FromString(record)
                for v in ev.summary.value:
                    if v.HasField("histo"):
                        h = v.histo
                        out.setdefault((os.path.relpath(root, logdir), v.tag), []).append(
                            (ev.step, h.num, h.sum, h.min, h.max))
    return out


@pytest.mark.slow  # a two-epoch fairseq-train run (make test-slow, CI)
def test_the_task_writes_each_epochs_per_update_cosines_as_a_tensorboard_histogram(data, tmp_path):
    tb = tmp_path / "tb"
    helpers.train(data, str(tmp_path / "ck"), criterion="sentence_scl", task="sentence_prediction_acl", max_epoch=2,
                  extra=["--log-grad-conflict", "--tensorboard-logdir", str(tb)])
    hist = read_histograms(str(tb))[("train", "grad_cos_per_update")]
    scalars = helpers.read_scalars(str(tb))["train"]["grad_cos"]  # fairseq's epoch means of the same cosines
    assert [h[0] for h in hist] == [1, 2] and all(h[1] == 6 for h in hist)  # 48 examples / batch 8, per epoch
    for (_, num, total, low, high), mean in zip(hist, scalars):
        assert -1 <= low <= high <= 1 and abs(total / num - mean) < 1e-3


def test_acl_grads_help_says_why_its_rule_rarely_fires_and_where_it_can(monkeypatch, capsys):
    # in process: the console script itself runs in test_train_smoke.py; a subprocess here cost 4-8 s
    from acl_fairseq.cli import help as acl_help

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() points sys.argv at the plugin for fairseq's parser
    acl_help.main(["--criterion", "acl_grad"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the rule rarely fires" in text and "benchmarks/grad_conflict.py" in text and "--scl-grad" in text


def test_features_scope_on_a_stock_roberta_sees_ce_through_the_heads_own_slice(data):
    """The stock head slices the <s> row itself: the gate's cosine w.r.t. that row must include CE's gradient
    (it was always 0 before, so the rule never decided anything at --scl-grad-scope features)."""
    import torch.nn.functional as F

    from acl_torch import losses

    _, model, crit, sample = build(data, "sentence_scl", extra=["--log-grad-conflict", "--scl-grad-scope", "features",
                                                                 "--pooler-dropout", "0"])
    model.train()
    head = model.classification_heads[crit.head_name]
    states = model(**sample["net_input"], features_only=True)[0].detach().requires_grad_()  # the head's input
    targets = sample["target"].view(-1)
    g_ce = torch.autograd.grad(F.cross_entropy(head(states), targets, reduction="sum"), states)[0][:, 0]
    g_scl = torch.autograd.grad(losses.supcon_loss(states[:, 0], targets, crit.cfg.scl_temperature), states)[0][:, 0]
    want = float(F.cosine_similarity(g_ce.flatten(), g_scl.flatten(), dim=0))
    _, log = _step(model, crit, sample)
    assert abs(want) > 1e-3 and abs(float(log["grad_cos"]) - want) < 1e-4, (float(log["grad_cos"]), want)


@pytest.mark.parametrize("scope", ["params", "features"])
def test_a_batch_without_a_positive_pair_is_not_a_decision(data, scope):
    """SupCon is an exact 0 without a positive pair (here one example): its gradient has no direction, so
    the step is neither counted nor a conflict, whatever the threshold, and the update is CE's."""
    task, model, crit, sample = build(data, "sentence_scl", extra=["--scl-grad", "--scl-grad-scope", scope,
                                                                    "--scl-grad-threshold", "0.5"])
    ds = task.dataset("valid")
    one = ds.collater([ds[0]])
    model.train()
    g_ce, _ = _two_pass_reference(model, crit, one)
    got, log = _step(model, crit, one)
    assert float(log["gated_steps"]) == 0.0 and float(log["conflict"]) == 0.0 and float(log["grad_cos"]) == 0.0
    for k in g_ce:
        assert torch.allclose(got[k], crit.ce_weight * g_ce[k], atol=1e-6, rtol=1e-4), k
    _, log = _step(model, crit, sample)  # a batch with pairs is still decided
    assert float(log["gated_steps"]) == 1.0
