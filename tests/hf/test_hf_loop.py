"""benchmarks/hf_loop.py on a tiny random BERT and tiny GLUE-like files (seconds, no network)."""
import json
import math
import os
import random

import numpy as np
import pytest
import torch

import _converted
import _hf_loop  # benchmarks/_hf_loop.py (benchmarks/ is on the path: conftest.py)
import hf_loop

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORDS = "the a cat dog sat ran on mat big small red blue is was not very happy sad man woman".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(hf_dir, glue_dir) with a 2-layer hidden-16 BERT, RTE (24 train / 8 dev) and STS-B (20 / 8)."""
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("hf_loop")
    hf_dir = root / "bert"
    vocab = SPECIALS + WORDS + [".", ","]
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=20, max_position_embeddings=64)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(str(hf_dir))
    (hf_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    assert (hf_dir / "model.safetensors").is_file()

    rng = random.Random(0)
    glue = root / "glue"
    for task, n_train, n_dev in [("RTE", 24, 8), ("STS-B", 20, 8)]:
        (glue / task).mkdir(parents=True)
        for split, n in [("train", n_train), ("dev", n_dev)]:
            if task == "RTE":
                rows = ["index\tsentence1\tsentence2\tlabel"] + [
                    f"{i}\t{_sentence(rng, rng.randint(3, 9))}\t{_sentence(rng, rng.randint(2, 5))}\t"
                    f"{rng.choice(['entailment', 'not_entailment'])}" for i in range(n)]
            else:
                rows = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"] + [
                    f"{i}\tmain\tf\t2012\t{i:04d}\tnone\tnone\t{_sentence(rng, rng.randint(3, 7))}\t"
                    f"{_sentence(rng, rng.randint(3, 7))}\t{rng.uniform(0, 5):.3f}" for i in range(n)]
            (glue / task / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return str(hf_dir), str(glue)


def _cfg(hf_dir, **kw):
    base = dict(task="RTE", hf_dir=hf_dir, seed=1, lr=1e-3, epochs=2, batch_size=4, max_len=32, threads=1)
    return _hf_loop.HFConfig(**{**base, **kw})


def _tokens(tok, ids):
    return tok.convert_ids_to_tokens(ids)


def test_pair_formats_and_token_types(tiny):
    hf_dir, _ = tiny
    tok = _hf_loop.load_tokenizer(hf_dir)
    pair = [("The cat sat.", "A dog ran")]
    ids, types = _hf_loop.encode(tok, pair, _cfg(hf_dir, pair_format="single"))[0]
    assert _tokens(tok, ids) == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "dog", "ran", "[SEP]"]
    assert types == [0] * 6 + [1] * 4  # type 1 on B and its [SEP]
    ids, types = _hf_loop.encode(tok, pair, _cfg(hf_dir, pair_format="double"))[0]
    assert _tokens(tok, ids) == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "[SEP]", "a", "dog", "ran", "[SEP]"]
    assert types == [0] * 6 + [1] * 5  # the separator fairseq prepends to B belongs to B
    ids, types = _hf_loop.encode(tok, pair, _cfg(hf_dir, pair_format="double", token_types=False))[0]
    assert len(ids) == 11 and types == [0] * 11
    ids, types = _hf_loop.encode(tok, ["Big red CAT"], _cfg(hf_dir))[0]
    assert _tokens(tok, ids) == ["[CLS]", "big", "red", "cat", "[SEP]"] and types == [0] * 5

    batch = _hf_loop.encode_batch(tok, [("the cat", "a dog"), ("the big red cat sat", "a dog")], _cfg(hf_dir))
    assert batch["input_ids"].shape == (2, 10)
    assert batch["attention_mask"].tolist() == [[1] * 7 + [0] * 3, [1] * 10]
    assert batch["input_ids"][0, 7:].tolist() == [tok.pad_token_id] * 3 == [0] * 3
    assert batch["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]


def test_truncation_longest_first_vs_tail(tiny):
    hf_dir, _ = tiny
    tok = _hf_loop.load_tokenizer(hf_dir)
    pair = [("the big red cat sat on the mat very happy", "a dog")]  # A 10 tokens, B 2
    ids, types = _hf_loop.encode(tok, pair, _cfg(hf_dir, max_len=8, truncation="longest_first"))[0]
    assert _tokens(tok, ids) == ["[CLS]", "the", "big", "red", "[SEP]", "a", "dog", "[SEP]"]  # only A trimmed
    assert types == [0] * 5 + [1] * 3
    ids, _ = _hf_loop.encode(tok, pair, _cfg(hf_dir, max_len=8, truncation="tail"))[0]
    assert _tokens(tok, ids) == ["[CLS]", "the", "big", "red", "cat", "sat", "on", "the"]  # fairseq: cut the end
    ids, types = _hf_loop.encode(tok, pair, _cfg(hf_dir, max_len=8, truncation="longest_first",
                                                 pair_format="double"))[0]
    assert _tokens(tok, ids) == ["[CLS]", "the", "big", "[SEP]", "[SEP]", "a", "dog", "[SEP]"]
    ids, _ = _hf_loop.encode(tok, pair, _cfg(hf_dir, max_len=64, truncation="tail"))[0]
    assert len(ids) == 15  # nothing cut below max_len


def test_warmup_rounding_matches_the_recipes():
    # the recipes' run plan: 6 % rounded up, (TOTAL_UPDATES * 6 + 99) / 100 in integers as finetune.sh had it
    from acl_fairseq.runs import plan

    assert all(_hf_loop.warmup_updates(t, 0.06) == (t * 6 + 99) // 100 == plan.warmup_updates(t)
               for t in range(1, 5000))
    config = _hf_loop.HFConfig(task="RTE")
    assert config.warmup == plan.WARMUP_FRACTION and config.adam_eps == 1e-06


def test_lr_schedule_warmup_then_linear_decay_to_zero():
    model = torch.nn.Linear(3, 2)
    cfg = _hf_loop.HFConfig(task="RTE", lr=1.0, warmup=0.2)
    opt, sched = _hf_loop.make_optimizer_and_schedule(model, cfg, total_updates=10)  # 2 warm-up updates
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    expected = [0.0, 0.5, 1.0] + [(10 - n) / 8 for n in range(3, 10)]  # fairseq's first update runs at lr 0
    assert seen == pytest.approx(expected)
    assert opt.param_groups[0]["lr"] == 0.0


def test_weight_decay_on_every_parameter(tiny):
    hf_dir, _ = tiny
    model = _hf_loop.HFClassifier(hf_dir, num_classes=2)
    cfg = _hf_loop.HFConfig(task="RTE", lr=0.01, warmup=0.0, weight_decay=0.1)
    opt, _ = _hf_loop.make_optimizer_and_schedule(model, cfg, total_updates=10)
    params = dict(model.named_parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == len(params)
    assert all(g["weight_decay"] == 0.1 for g in opt.param_groups)
    before = {k: p.detach().clone() for k, p in params.items()}
    for p in params.values():
        p.grad = torch.zeros_like(p)  # Adam's step is then 0: what moves is the decay alone
    opt.step()
    shrunk = [k for k, p in params.items() if torch.allclose(p, before[k] * (1 - 0.01 * 0.1), rtol=0, atol=1e-9)
              and not torch.equal(p, before[k])]
    assert any("LayerNorm.weight" in k for k in shrunk) and any(k.endswith(".bias") for k in shrunk)
    nonzero = [k for k, v in before.items() if v.abs().sum() > 0]
    assert sorted(shrunk) == sorted(nonzero)


def test_fold_token_types_keeps_the_forward_and_trains_the_converters_parameters(tiny):
    hf_dir, _ = tiny
    models = []
    for fold in (False, True):
        torch.manual_seed(0)  # the same head
        models.append(_hf_loop.HFClassifier(hf_dir, 2, "cls", 0.0, 0.0, 0.0, fold_token_types=fold))
    plain, folded = models
    ids = torch.randint(5, 25, (3, 8))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 1]),
             "token_type_ids": torch.tensor([[0] * 4 + [1] * 4] * 3)}
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert torch.allclose(plain(*args), folded(*args), atol=1e-6)
    emb, ref = folded.encoder.embeddings, plain.encoder.embeddings
    rows = ref.token_type_embeddings.weight
    assert torch.allclose(emb.position_embeddings.weight, ref.position_embeddings.weight + rows[0])  # the converter's
    assert torch.allclose(emb.token_type_embeddings.weight[1], rows[1] - rows[0])  # segment_delta

    cfg = _cfg(hf_dir, lr=1e-2, warmup=0.0)
    for model in models:
        opt, sched = _hf_loop.make_optimizer_and_schedule(model, cfg, total_updates=10)
        for _ in range(3):
            _hf_loop.train_step(model, batch, opt, sched, cfg, regression=False)
    types = emb.token_type_embeddings.weight
    assert torch.equal(types[0], torch.zeros_like(types[0])) and not torch.equal(types[1], rows[1] - rows[0])
    # what differs is the update, not the model: position 0 of segment 0 as each system now embeds it
    moved = (emb.position_embeddings.weight[0] + types[0]) - (ref.position_embeddings.weight[0] + rows[0])
    assert moved.abs().max() > 1e-4


def test_load_examples_targets(tiny):
    _, glue = tiny
    texts, targets = _hf_loop.load_examples("STS-B", glue, "train")
    with open(os.path.join(glue, "STS-B", "train.tsv")) as f:
        first = f.read().splitlines()[1].split("\t")
    assert texts[0] == (first[7], first[8]) and targets[0] == pytest.approx(float(first[9]) / 5)
    texts, targets = _hf_loop.load_examples("RTE", glue, "dev")
    assert len(texts) == 8 and set(targets) <= {0, 1} and isinstance(texts[0], tuple)


def test_train_subset_is_quality_py_rule(tiny):
    _, glue = tiny
    texts, _ = _hf_loop.load_examples("RTE", glue, "train")
    with open(os.path.join(glue, "RTE", "train.tsv"), encoding="utf-8") as f:  # as benchmarks/quality.py reads it
        header, *rows = f.read().splitlines()
    keep = sorted(random.Random(1).sample(range(len(rows)), 10))
    picked = [texts[i] for i in _converted.subset_indices(len(texts), 10, 1)]  # what _hf_loop.train_hf keeps
    assert picked == [tuple(rows[i].split("\t")[1:3]) for i in keep]


def _check_result(res, cfg, n_train, metric_keys):
    assert len(res["per_epoch"]) == 2 and res["updates"] == 2 * math.ceil(n_train / cfg.batch_size)
    assert res["best"] == res["per_epoch"][res["best_epoch"] - 1]
    assert set(res["best"]) == set(metric_keys)
    assert all(math.isfinite(v) for m in res["per_epoch"] for v in m.values())
    assert res["train_seconds"] > 0 and res["train_samples_per_s"] > 0
    assert res["config"]["task"] == cfg.task and res["n_train"] == n_train


def test_train_hf_rte_and_stsb(tiny):
    hf_dir, glue = tiny
    cfg = _cfg(hf_dir, pair_format="double", token_types=False, truncation="tail", batching="fixed")
    _check_result(_hf_loop.train_hf(cfg, glue), cfg, 24, {"accuracy", "f1", "mcc"})
    cfg = _cfg(hf_dir, task="STS-B", pooling="cls", clip_norm=1.0, train_subset=15)
    res = _hf_loop.train_hf(cfg, glue)
    _check_result(res, cfg, 15, {"pearson", "spearman"})
    assert res["primary_metric"] == "pearson"


def test_same_seed_same_result(tiny):
    hf_dir, glue = tiny
    runs = [_hf_loop.train_hf(_cfg(hf_dir, seed=s), glue) for s in (3, 3, 4)]
    key = lambda r: (r["train_loss"], r["per_epoch"])  # noqa: E731
    assert key(runs[0]) == key(runs[1])
    assert runs[0]["train_loss"] != runs[2]["train_loss"]


def test_cli_writes_json_and_refuses_overwrite(tiny, tmp_path, capsys):
    hf_dir, glue = tiny
    out = tmp_path / "res.json"
    argv = ["--task", "RTE", "--hf-dir", hf_dir, "--glue-dir", glue, "--epochs", "1", "--batch-size", "4",
            "--max-updates", "2", "--dev-limit", "5", "--no-token-types", "--adam-betas", "0.9", "0.999",
            "--threads", "1", "--out", str(out)]
    assert hf_loop.main(argv) == 0
    res = json.loads(out.read_text())
    assert res["updates"] == 2 and res["n_dev"] == 5 and res["total_updates"] == 6
    assert res["config"]["token_types"] is False and res["config"]["adam_betas"] == [0.9, 0.999]
    with pytest.raises(SystemExit):
        hf_loop.main(argv)
    assert "--force" in capsys.readouterr().err
    assert hf_loop.main(argv + ["--force", "--seed", "2"]) == 0
    assert json.loads(out.read_text())["config"]["seed"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["res.json"]  # no temporary left behind


def _three_epochs(mode, lengths):
    batches = _hf_loop.epoch_batches(lengths, _cfg("unused", batching=mode), np.random.RandomState(0))
    return [[tuple(sorted(b.tolist())) for b in next(batches)] for _ in range(3)]


def test_batching_modes():
    lengths = np.random.RandomState(1).randint(5, 60, size=40)
    for mode in _hf_loop.BATCHING_MODES:
        for epoch in _three_epochs(mode, lengths):
            assert sorted(i for b in epoch for i in b) == list(range(40))  # every example once per epoch
    fixed, bucket, shuffle = (_three_epochs(m, lengths) for m in ("fixed", "bucket", "shuffle"))
    for made_once in (fixed, bucket):  # the same batches every epoch, in another order
        assert all(sorted(e) == sorted(made_once[0]) for e in made_once) and made_once[0] != made_once[1]
    assert sorted(shuffle[0]) != sorted(shuffle[1])
    spans = lambda epoch: sorted((min(lengths[list(b)]), max(lengths[list(b)])) for b in epoch)  # noqa: E731
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans(bucket[0]), spans(bucket[0])[1:]))  # length-sorted
    assert not all(hi <= lo for (_, hi), (lo, _) in zip(spans(fixed[0]), spans(fixed[0])[1:]))


def test_fairseq_sentence_prediction_orders_by_permutation_only():
    """Why "fixed" is fairseq's: sentence_prediction wraps its data in SortDataset(sort_order=[shuffle]), whose
    order ignores the lengths, and batch_by_size cuts that order into batches once."""
    from fairseq.data import ListDataset, SortDataset

    lengths = np.random.RandomState(1).randint(5, 60, size=40)
    perm = np.random.RandomState(2).permutation(40)
    order = SortDataset(ListDataset(list(range(40)), sizes=lengths), sort_order=[perm]).ordered_indices()
    assert order.tolist() == np.argsort(perm).tolist()
    assert order.tolist() != np.argsort(lengths, kind="stable").tolist()
