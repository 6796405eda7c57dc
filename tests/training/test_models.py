"""multi_exit_roberta: registration, heads, forward outputs, options, and checkpoint loading."""

import argparse
import logging
import os

import pytest
import torch
import torch.nn.functional as F

import helpers
from acl_fairseq import heads as heads_mod
from acl_fairseq.models import multi_exit_roberta as mer
from acl_runtime import conventions

HEAD = "sentence_classification_head"
TINY_MULTI = helpers.TINY_ROBERTA  # the tiny shape for --arch multi_exit_roberta (no tiny preset is registered)


def build(data, arch="multi_exit_roberta", extra=(), seed=0):
    """(task, model in eval mode, args) built in-process exactly as fairseq-train builds them, from ``seed``."""
    from fairseq import options, tasks

    argv = [
        data,
        "--user-dir",
        helpers.USER_DIR,
        "--task",
        "sentence_prediction",
        "--arch",
        arch,
        "--criterion",
        "sentence_prediction",
        "--num-classes",
        "2",
        *conventions.input_layout().fairseq_flags(),
        *TINY_MULTI,
        *extra,
    ]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    model = task.build_model(args)  # registers the classification head(s), as the task does
    return task, model.eval(), args


def padded_batch(task, n=8):
    task.load_dataset("valid")
    ds = task.dataset("valid")
    batch = ds.collater([ds[i] for i in range(n)])
    assert batch["net_input"]["src_tokens"].eq(task.source_dictionary.pad()).any(), "want padding"
    return batch


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("data")))["data"]


def test_architectures_are_registered_with_encoder_shapes():
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    for arch in (
        "multi_exit_roberta",
        "multi_exit_roberta_base",
        "multi_exit_roberta_large",
    ):
        assert ARCH_MODEL_REGISTRY[arch] is mer.MultiExitRobertaModel
    # the spec's presets and nothing else (test sizes are flags, tests/helpers.py TINY_SHAPE)
    assert {a for a, m in ARCH_MODEL_REGISTRY.items() if m is mer.MultiExitRobertaModel} == {
        "multi_exit_roberta",
        "multi_exit_roberta_base",
        "multi_exit_roberta_large",
    }
    shapes = {
        "multi_exit_roberta_base": (12, 768, 3072, 12),
        "multi_exit_roberta_large": (24, 1024, 4096, 16),
    }
    for arch, shape in shapes.items():
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[arch](args)
        assert (
            args.encoder_layers,
            args.encoder_embed_dim,
            args.encoder_ffn_embed_dim,
            args.encoder_attention_heads,
        ) == shape
        assert args.exit_layers is None and args.exit_pooling == "cls"


def test_one_head_per_exit_and_the_last_under_the_plain_name(data):
    _, model, _ = build(data)
    assert model.exit_layers == [1, 2, 3]
    assert list(model.classification_heads) == [f"{HEAD}_exit1", f"{HEAD}_exit2", HEAD]
    assert model.exit_head_names("x") == ["x_exit1", "x_exit2", "x"]


def test_forward_returns_last_exit_logits_and_every_exit(data):
    task, model, _ = build(data)
    batch = padded_batch(task)
    logits, extra = model(**batch["net_input"], features_only=True, classification_head_name=HEAD)
    out = extra["exits"]
    assert isinstance(out, heads_mod.ExitOutputs)
    assert out.layers == [1, 2, 3]
    assert torch.equal(logits, out.logits[-1])
    assert [tuple(t.shape) for t in out.logits] == [(8, 2)] * 3
    assert [tuple(t.shape) for t in out.features] == [(8, 12)] * 3
    assert [tuple(t.shape) for t in out.pooled] == [(8, 12)] * 3
    for name, w in zip(model.exit_head_names(HEAD), out.label_embeddings):
        assert w is model.classification_heads[name].out_proj.weight
    T = batch["net_input"]["src_tokens"].size(1)
    assert len(extra["inner_states"]) == 4 and extra["inner_states"][1].shape == (T, 8, 12)  # T x B x C
    # exit m reads the <s> state of layer m
    for m in (1, 2):
        head = model.classification_heads[f"{HEAD}_exit{m}"]
        assert torch.allclose(out.logits[m - 1], head(extra["inner_states"][m].transpose(0, 1)), atol=1e-6)
    assert torch.allclose(
        logits, model.classification_heads[HEAD](model.encoder.extract_features(batch["net_input"]["src_tokens"])[0])
    )


def test_without_a_head_forward_is_robertas(data):
    task, model, _ = build(data)
    tokens = padded_batch(task)["net_input"]["src_tokens"]
    x, extra = model(tokens)
    assert x.shape == (*tokens.shape, len(task.source_dictionary)) and extra["inner_states"] is None


def test_collect_exit_outputs_reads_the_models_exits(data):
    task, model, _ = build(data)
    batch = padded_batch(task)
    out = heads_mod.collect_exit_outputs(model, batch["net_input"], HEAD)
    assert len(out.logits) == 3 and out.layers == [1, 2, 3]


def test_stock_sentence_prediction_criterion_trains_the_last_exit(data):
    task, model, args = build(data)
    sample = padded_batch(task)
    criterion = task.build_criterion(args)
    loss, sample_size, log = criterion(model, sample)
    logits, _ = model(**sample["net_input"], classification_head_name=HEAD)
    expected = F.cross_entropy(logits.float(), sample["target"].view(-1), reduction="sum")
    assert sample_size == 8 and torch.allclose(loss, expected)


def test_exit_layers_option_selects_layers(data):
    task, model, _ = build(data, extra=["--exit-layers", "1,3"])
    assert model.exit_layers == [1, 3]
    assert list(model.classification_heads) == [f"{HEAD}_exit1", HEAD]
    batch = padded_batch(task)
    _, extra = model(**batch["net_input"], classification_head_name=HEAD)
    assert extra["exits"].layers == [1, 3]
    head = model.classification_heads[f"{HEAD}_exit1"]
    assert torch.allclose(extra["exits"].logits[0], head(extra["inner_states"][1].transpose(0, 1)), atol=1e-6)


def test_exit_pooling_mean_averages_non_padding_states(data):
    task, model, _ = build(data, extra=["--exit-pooling", "mean"])
    batch = padded_batch(task)
    tokens = batch["net_input"]["src_tokens"]
    _, extra = model(**batch["net_input"], classification_head_name=HEAD)
    for m, pooled in enumerate(extra["exits"].pooled, start=1):
        states = extra["inner_states"][m].transpose(0, 1)  # T x B x C -> B x T x C
        for b in range(tokens.size(0)):
            real = tokens[b].ne(task.source_dictionary.pad())
            assert torch.allclose(pooled[b], states[b][real].mean(0), atol=1e-6)


@pytest.mark.parametrize("spec", ["0,2", "1,4", "a,b"])
def test_bad_exit_layers_are_rejected(spec):
    with pytest.raises(ValueError, match="--exit-layers"):
        mer.parse_exit_layers(spec, 3)


def test_plain_roberta_state_dict_loads_with_fresh_exit_heads(data, caplog):
    _, plain, _ = build(data, arch="roberta", extra=helpers.TINY_ROBERTA, seed=0)
    _, model, _ = build(data, seed=1)
    state = plain.state_dict()
    # another seed, so that a loader which dropped a tensor would leave it visibly different (constant
    # initialisations, such as LayerNorm's ones and zero biases, are the same whatever the seed)
    before = model.state_dict()
    random_init = [k for k, v in state.items() if v.is_floating_point() and v.unique().numel() > 1]
    assert len(random_init) > 10 and not any(torch.equal(before[k], state[k]) for k in random_init)
    with caplog.at_level(logging.INFO, logger="acl_fairseq.models.multi_exit_roberta"):
        model.load_state_dict(state, strict=True)
    assert f"newly initialised: {HEAD}_exit1, {HEAD}_exit2" in caplog.text
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())  # encoder and the final head


def test_checkpoint_heads_are_registered_when_loading_without_the_task(data):
    _, trained, _ = build(data, extra=["--exit-layers", "2,3"], seed=0)
    _, fresh, args = build(data, extra=["--exit-layers", "2,3"], seed=1)  # other weights than trained's
    fresh.classification_heads.clear()
    fresh.args.load_checkpoint_heads = True  # what hub loading sets
    state = trained.state_dict()
    fresh.load_state_dict(state, strict=True)
    assert sorted(fresh.classification_heads) == sorted([f"{HEAD}_exit2", HEAD])
    loaded = fresh.state_dict()
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], v) for k, v in state.items())


# ---- through fairseq-train --user-dir (subprocess) --------------------------------------------
# slow: two fairseq-train runs, about 12 s idle (28 s on a loaded machine); make test keeps the same loading in
# process (test_plain_roberta_state_dict_loads_with_fresh_exit_heads, ..._heads_are_registered_when_loading_...)
# and test_train_smoke.py's runs through fairseq-train


@pytest.fixture(scope="module")
def restored(data, tmp_path_factory):
    """A plain roberta checkpoint, and the multi-exit run restored from it (lr 0: weights unchanged)."""
    root = tmp_path_factory.mktemp("restore")
    plain_dir, multi_dir = str(root / "plain"), str(root / "multi")
    helpers.train(data, plain_dir, criterion="sentence_prediction", arch="roberta")
    plain_ckpt = os.path.join(plain_dir, "checkpoint_last.pt")
    proc = helpers.train(
        data,
        multi_dir,
        criterion="sentence_prediction",
        arch="multi_exit_roberta",
        model_args=TINY_MULTI,
        extra=[
            "--restore-file",
            plain_ckpt,
            "--reset-optimizer",
            "--reset-dataloader",
            "--reset-meters",
            "--lr",
            "0",
            "--exit-layers",
            "1,3",
        ],
    )
    return plain_ckpt, os.path.join(multi_dir, "checkpoint_last.pt"), proc.stdout + proc.stderr


@pytest.mark.slow
def test_fairseq_train_restores_plain_roberta_with_identical_encoder(restored):
    plain_ckpt, multi_ckpt, log = restored
    assert f"Loaded checkpoint {plain_ckpt}" in log
    assert f"newly initialised: {HEAD}_exit1" in log
    plain, multi = torch.load(plain_ckpt)["model"], torch.load(multi_ckpt)["model"]
    assert all(torch.equal(multi[k], v) for k, v in plain.items())  # encoder, and the final head kept
    assert sorted(set(multi) - set(plain)) == sorted(
        f"classification_heads.{HEAD}_exit1.{p}"
        for p in ("dense.weight", "dense.bias", "out_proj.weight", "out_proj.bias")
    )


@pytest.mark.slow
def test_multi_exit_checkpoint_loads_back_with_every_exit(restored, data):
    from fairseq.models.roberta import RobertaModel

    _, multi_ckpt, _ = restored
    hub = RobertaModel.from_pretrained(
        os.path.dirname(multi_ckpt),
        checkpoint_file="checkpoint_last.pt",
        data_name_or_path=data,
        bpe=None,
        user_dir=helpers.USER_DIR,
    )
    model = hub.model.eval()
    assert isinstance(model, mer.MultiExitRobertaModel) and model.exit_layers == [1, 3]
    saved = torch.load(multi_ckpt)["model"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    tokens = torch.tensor([[0, 5, 6, 7, 2]])
    logits, extra = model(tokens, classification_head_name=HEAD)
    assert len(extra["exits"].logits) == 2
    assert torch.allclose(hub.predict(HEAD, tokens), F.log_softmax(logits, -1))  # stock hub API = last exit


def test_a_single_top_exit_keeps_no_per_layer_states(data):
    """What a single-exit run of the multi-exit model pays: no T x B x C copy per layer."""
    task, model, _ = build(data, extra=["--exit-layers", "3"])
    tokens = padded_batch(task)["net_input"]["src_tokens"]
    logits, extra = model(tokens, classification_head_name=HEAD)
    assert extra["inner_states"] is None
    again, extra = model(tokens, classification_head_name=HEAD, return_all_hiddens=True)
    assert len(extra["inner_states"]) == 4 and torch.equal(logits, again)
    _, extra = build(data, extra=["--exit-layers", "2,3"])[1](tokens, classification_head_name=HEAD)
    assert len(extra["inner_states"]) == 4  # a lower exit reads its layer
