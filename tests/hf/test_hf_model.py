"""MultiExitForSequenceClassification over every supported encoder: it trains, saves, reloads through the Auto
classes without trust_remote_code and answers the same; its heads carry the fairseq model's names; early exit stops
the encoder with the runtime's policies."""
import json
import os

import pytest
import torch

import hf_encoders

pytest.importorskip("transformers")


def _train(model, tmp_path, criterion="acl_grad", steps=5, **criterion_kw):
    from transformers import TrainingArguments

    from acl_hf.arguments import CriterionArguments
    from acl_hf.trainer import AclTrainer

    args = TrainingArguments(str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=8, use_cpu=True,
                             report_to="none", logging_steps=steps, save_strategy="no", disable_tqdm=True,
                             learning_rate=1e-3)
    trainer = AclTrainer(model=model, args=args, train_dataset=hf_encoders.ToySet(32),
                         criterion=CriterionArguments(criterion=criterion, **criterion_kw))
    trainer.train()
    return trainer


def _reload_answers_the_same(model, tmp_path):
    from transformers import AutoModelForSequenceClassification

    import acl_hf  # noqa: F401  (registers the config and the model with the Auto classes)

    folder = str(tmp_path / "saved")
    model.save_pretrained(folder)
    again = AutoModelForSequenceClassification.from_pretrained(folder)
    assert type(again) is type(model)
    again.save_pretrained(str(tmp_path / "again"))
    configs = [json.load(open(os.path.join(d, "config.json"))) for d in (folder, str(tmp_path / "again"))]
    assert configs[0] == configs[1] and configs[0]["model_type"] == "acl-multi-exit"
    batch = torch.utils.data.default_collate([hf_encoders.ToySet(6, seed=1)[i] for i in range(6)])
    model.eval()
    again.eval()
    with torch.no_grad():
        a, b = model(**batch), again(**batch)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    assert all(torch.equal(x, y) for x, y in zip(a.exit_logits, b.exit_logits))
    return again


@pytest.mark.parametrize("encoder", hf_encoders.ENCODERS)
def test_every_encoder_trains_saves_reloads_and_answers_the_same(encoder, tmp_path):
    model = hf_encoders.multi_exit(encoder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _train(model, tmp_path)
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("classification_heads.") for k in moved) and any(k.startswith("encoder.") for k in moved)
    logged = [h for h in trainer.state.log_history if "loss" in h][-1]
    assert {"ce_loss", "acl_loss", "accuracy", "accuracy_exit1", "grad_cos", "conflict_rate"} <= set(logged)
    _reload_answers_the_same(model, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("criterion", ["sentence_ce", "sentence_scl", "acl_embed", "acl_cross_layer",
                                       "multi_exit_kd"])
@pytest.mark.parametrize("encoder", hf_encoders.ENCODERS)
def test_every_encoder_trains_with_every_multi_exit_criterion(encoder, criterion, tmp_path):
    model = hf_encoders.multi_exit(encoder)
    trainer = _train(model, tmp_path, criterion=criterion)
    assert trainer.state.global_step == 5
    _reload_answers_the_same(model, tmp_path)


def test_the_heads_carry_the_fairseq_model_s_names_and_no_pooler_is_left():
    model = hf_encoders.multi_exit("bert", exit_layers=[1, 3])
    heads = sorted({k.rsplit(".", 2)[0] for k in model.state_dict() if k.startswith("classification_heads.")})
    assert heads == ["classification_heads.sentence_classification_head",
                     "classification_heads.sentence_classification_head_exit1"]
    assert not [k for k in model.state_dict() if "pooler" in k]
    head = model.classification_heads["sentence_classification_head"]
    assert [n for n, _ in head.named_parameters()] == ["dense.weight", "dense.bias", "out_proj.weight",
                                                       "out_proj.bias"]
    # torch's nn.Linear initialisation, as fairseq's registered heads have: uniform within 1/sqrt(fan_in)
    bound = 1 / head.dense.in_features ** 0.5
    assert float(head.dense.bias.abs().max()) <= bound and float(head.dense.bias.abs().max()) > bound / 2


def test_a_pre_ln_encoder_has_a_norm_per_shallow_exit_and_inputs_follow_the_encoder_s_signature():
    modern, bert, distil = (hf_encoders.multi_exit(kind) for kind in ("modernbert", "bert", "distilbert"))
    assert sorted(modern.exit_norms) == ["1", "2"] and len(bert.exit_norms) == 0
    assert "token_type_ids" not in modern._encoder_inputs and "token_type_ids" not in distil._encoder_inputs
    assert "token_type_ids" in bert._encoder_inputs
    batch = torch.utils.data.default_collate([hf_encoders.ToySet(4)[i] for i in range(4)])
    out = modern(**batch)  # token_type_ids given, not passed on
    assert out.loss is not None and len(out.exit_logits) == 3
    with torch.no_grad():  # the norm is on the shallow exit's path
        modern.exit_norms["1"].weight.mul_(3.0)
    assert not torch.equal(modern(**batch).exit_logits[0], out.exit_logits[0])
    assert torch.equal(modern(**batch).exit_logits[2], out.exit_logits[2])


def test_bad_exit_layers_and_pooling_are_refused_in_one_line():
    with pytest.raises(Exception, match=r"exit_layers must be increasing 1-based layers in 1\.\.3"):
        hf_encoders.multi_exit("bert", exit_layers=[2, 4])
    with pytest.raises(Exception, match="exit_pooling must be one of"):
        hf_encoders.multi_exit("bert", exit_pooling="max")


def test_early_exit_stops_the_encoder_once_every_row_has_left():
    model = hf_encoders.multi_exit("roberta").eval()
    batch = torch.utils.data.default_collate([hf_encoders.ToySet(5)[i] for i in range(5)])
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    layers = model.encoder.encoder.layer
    calls = []
    handles = [m.register_forward_hook(lambda *_a, i=i: calls.append(i)) for i, m in enumerate(layers)]
    full = model(**inputs)
    out = model.predict_early_exit("entropy", 1.0, **inputs)  # H/log K < 1 fires for any real prediction
    assert out.exit_layer.tolist() == [1] * 5 and len(out.exit_logits) == 1
    assert calls == [0, 1, 2, 0]  # the full forward, then one layer
    assert torch.allclose(out.logits, full.exit_logits[0], atol=1e-6)
    calls.clear()
    never = model.predict_early_exit("entropy", 0.0, **inputs)  # nothing fires: the last exit, every layer ran
    assert never.exit_layer.tolist() == [3] * 5 and calls == [0, 1, 2]
    assert torch.allclose(never.logits, full.logits, atol=1e-6)
    for h in handles:
        h.remove()
    with pytest.raises(ValueError, match="out of range"):
        model.predict_early_exit("confidence", 1.5, **inputs)


def test_the_plain_trainer_trains_the_model_on_its_own_loss(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = hf_encoders.multi_exit("bert")
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=8, use_cpu=True,
                             report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=hf_encoders.ToySet(16))
    result = trainer.train()
    assert result.global_step == 2 and result.training_loss > 0
