"""Same maths, two trainers: a tiny random RoBERTa converted to fairseq (acl-convert-hf), the same exit heads in
both, the same batch: every criterion's loss and every parameter's gradient from ``AclTrainer.compute_loss`` equal
the fairseq criterion's, and ACL-Grad's drop decisions are identical.

In fp32 the losses agree to 1e-6 relative; the gradients to 1e-4, what two encoder implementations (fairseq's
attention and HF's SDPA, summing in other orders) leave (measured up to 7.4e-5, on a layer norm's weight under SCL, on
2 cores of a Xeon with AMX). In fp64 the encoders' rounding is gone (fairseq's gelu, which rounds through fp32, is
swapped for torch's here) and what is left is the task loss's log-softmax, which runs in fp32 by design in both
(:func:`acl_torch.objective.task_loss`): one-ulp flips, every gradient within 5e-6 relative (measured 9.8e-7). A
gradient that is zero in exact arithmetic (the attention keys' bias: softmax ignores a per-row shift) is compared to
the model's gradient scale, not to its own rounding noise."""
import argparse
import os
from types import SimpleNamespace

import pytest
import torch

import tiny_hf

pytest.importorskip("fairseq")

NUM_CLASSES = 3
# (criterion, its options in both spellings): every criterion, both gate scopes, the measuring gate, SCL's gate
CASES = [
    ("sentence_ce", {}),
    ("sentence_scl", {}),
    ("sentence_scl", {"scl_grad": True, "scl_feature": "head"}),
    ("acl_embed", {"log_grad_conflict": True}),
    ("acl_grad", {"acl_grad_scope": "params"}),
    ("acl_grad", {"acl_grad_scope": "features", "acl_anchors": "samples"}),
    ("acl_grad", {"acl_grad_scope": "params", "acl_grad_threshold": 0.9}),  # drops the ACL term
    ("acl_cross_layer", {"acl_cl_temperature": 0.2}),
    ("multi_exit_kd", {"kd_temperature": 3.0}),
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(HF folder, fairseq folder): a tiny random RoBERTa and its conversion."""
    from acl_fairseq.hf import convert as convert_hf

    root = tmp_path_factory.mktemp("hf_equiv")
    hf_dir, fs_dir = str(root / "hf"), str(root / "fs")
    tiny_hf.write_roberta(hf_dir)
    convert_hf.convert(hf_dir, fs_dir)
    return hf_dir, fs_dir


def fairseq_model(fs_dir):
    """The converted encoder as the plugin's multi_exit_roberta, an exit after every layer."""
    from fairseq import checkpoint_utils
    from fairseq.data import Dictionary

    from acl_fairseq.models.multi_exit_roberta import MultiExitRobertaModel

    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(fs_dir, "model.pt"))
    flags = open(os.path.join(fs_dir, "model_args.txt")).read().split()
    args = argparse.Namespace(dropout=0.0, attention_dropout=0.0, pooler_dropout=0.0, **{
        k.lstrip("-").replace("-", "_"): int(v) if v.isdigit() else v for k, v in zip(flags[::2], flags[1::2])})
    args.conventions, args.exit_layers = fs_dir, None
    dictionary = Dictionary.load(os.path.join(fs_dir, "dict.txt"))
    dictionary.add_symbol("<mask>")
    torch.manual_seed(0)
    model = MultiExitRobertaModel.build_model(args, argparse.Namespace(source_dictionary=dictionary))
    model.register_classification_head("sentence_classification_head", num_classes=NUM_CLASSES)
    model.load_state_dict(state["model"], strict=True)
    for layer in model.encoder.sentence_encoder.layers:  # fairseq's gelu runs in fp32 whatever the input: exact here
        assert layer.activation_fn.__name__ == "gelu"
        layer.activation_fn = torch.nn.functional.gelu
    return model, dictionary


def hf_model(hf_dir, fs_model):
    """The HF encoder with the fairseq model's heads, copied by name (the two trainers name them alike)."""
    from acl_hf import MultiExitForSequenceClassification

    model = MultiExitForSequenceClassification.from_encoder_pretrained(hf_dir, NUM_CLASSES, head_dropout=0.0)
    assert model.head_names() == list(fs_model.classification_heads.keys())
    for name in model.head_names():
        model.classification_heads[name].load_state_dict(fs_model.classification_heads[name].state_dict())
    # the conversion folds token type 0 into the position rows, rounded to fp32: the HF side takes the folded rows
    # and a zero, frozen token type, so that both hold the same numbers (fp64 then shows the maths alone) and the
    # same parameters (the params scope's cosine is over every trainable parameter)
    embeddings = model.encoder.embeddings
    offset = model.config.encoder.pad_token_id + 1
    with torch.no_grad():
        embeddings.token_type_embeddings.weight.zero_()
        embeddings.token_type_embeddings.weight.requires_grad_(False)
        folded = fs_model.encoder.sentence_encoder.embed_positions.weight[2:]
        embeddings.position_embeddings.weight[offset: offset + folded.shape[0]] = folded
    return model


def sentences():
    words = [w for w in tiny_hf.ROBERTA_VOCAB if w.startswith("Ġ")]
    rows = [["<s>"] + [words[(3 * i + j) % len(words)] for j in range(2 + i % 5)] + ["</s>"] for i in range(9)]
    return rows, torch.tensor([i % NUM_CLASSES for i in range(9)])


def fairseq_criterion(name, options):
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
    from fairseq.data import Dictionary

    labels = Dictionary()
    for k in range(NUM_CLASSES):
        labels.add_symbol(str(k))
    task = SimpleNamespace(label_dictionary=labels, cfg=SimpleNamespace(num_classes=NUM_CLASSES),
                           marks_replayed_batches=True, validates_every_example=True)
    cfg = CRITERION_DATACLASS_REGISTRY[name]()
    cfg.required_batch_size_multiple = 1
    for key, value in options.items():
        setattr(cfg, key, value)
    return CRITERION_REGISTRY[name](cfg, task)


def hf_grads_as_fairseq(hf, fs, hf_ids):
    """The HF model's gradients in fairseq's names and layout (acl-convert-hf's mapping, token types apart)."""
    from acl_fairseq.hf import mapping

    grads = {k[len("encoder."):]: p.grad for k, p in hf.named_parameters() if k.startswith("encoder.")}
    assert grads.pop("embeddings.token_type_embeddings.weight") is None  # frozen (see hf_model)
    config = hf.config.encoder.to_dict()
    mapped, _ = mapping.map_state_dict(grads, config, hf_ids)
    mapped = {k: v for k, v in mapped.items() if not k.startswith("encoder.lm_head")}
    mapped.update({k: p.grad for k, p in hf.named_parameters() if k.startswith("classification_heads.")})
    return mapped


def relative(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype,grad_tol", [(torch.float32, 1e-4),
                                            pytest.param(torch.float64, 5e-6, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name,options", CASES)
def test_the_hf_trainer_s_loss_gradients_and_decisions_equal_the_fairseq_criterion_s(pair, tmp_path, name, options,
                                                                                     dtype, grad_tol):
    from transformers import TrainingArguments

    from acl_hf.arguments import CriterionArguments
    from acl_hf.trainer import AclTrainer

    hf_dir, fs_dir = pair
    fs, dictionary = fairseq_model(fs_dir)
    hf = hf_model(hf_dir, fs)
    fs, hf = fs.to(dtype), hf.to(dtype)
    rows, labels = sentences()
    hf_ids, toks, mask, _ = tiny_hf.batch(tiny_hf.ROBERTA_VOCAB, rows)
    src = torch.tensor([tiny_hf.fairseq_ids(dictionary, tiny_hf.ROBERTA_VOCAB, row) for row in toks])
    n = len(rows)

    crit = fairseq_criterion(name, options)
    fs.train()
    fs_loss, sample_size, log = crit(fs, {"net_input": {"src_tokens": src}, "target": labels, "ntokens": 0})
    assert sample_size == n
    fs_loss.backward()

    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none")
    trainer = AclTrainer(model=hf, args=args, criterion=CriterionArguments(criterion=name, **options))
    hf.train()
    loss = trainer.compute_loss(hf, {"input_ids": hf_ids, "attention_mask": mask, "labels": labels},
                                num_items_in_batch=torch.tensor(n))
    loss.backward()

    assert relative(loss.detach(), fs_loss.detach() / n) < 1e-6
    assert relative(trainer._sums["ce_loss"], log["ce_loss"]) < 1e-6
    for key in (k for k in log if k.endswith("_loss") and k != "ce_loss"):
        assert relative(trainer._sums[key], log[key]) < 1e-6, key
    for key in ("conflict", "gated_steps"):  # the gate's decision, where the criterion has one
        assert (key in log) == (key in trainer._gate_log)
        if key in log:
            assert float(trainer._gate_log[key]) == float(log[key]), key
    if "grad_cos" in log:
        assert abs(float(trainer._gate_log["grad_cos"]) - float(log["grad_cos"])) < 1e-5
    if options.get("acl_grad_threshold") == 0.9:
        assert float(log["conflict"]) == 1.0  # the case that drops the term did drop it

    fs_grads = {k: p.grad for k, p in fs.named_parameters() if p.grad is not None}
    fs_of_hf = tiny_hf.fairseq_ids(dictionary, tiny_hf.ROBERTA_VOCAB, tiny_hf.ROBERTA_VOCAB)
    assert sorted(fs_of_hf) == list(range(len(fs_of_hf)))  # fairseq's first rows are the HF tokens, reordered
    hf_of_fs = sorted(range(len(fs_of_hf)), key=fs_of_hf.__getitem__)
    mapped = hf_grads_as_fairseq(hf, fs, hf_of_fs)
    want = {key: fs_grads[key][: g.shape[0]] / n for key, g in mapped.items()}
    scale = float(torch.stack([w.double().norm() for w in want.values()]).median())
    worst = {key: float((g.double() - want[key].double()).norm() / max(float(want[key].double().norm()), scale))
             for key, g in mapped.items()}
    assert set(mapped) <= set(fs_grads) and len(mapped) >= 40
    assert max(worst.values()) < grad_tol, sorted(worst.items(), key=lambda kv: -kv[1])[:3]
