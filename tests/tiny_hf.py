"""Tiny random HF BERT and RoBERTa encoders on the toy task's words, the converted model loaded back, and
batches in both id spaces. Sizes are odd and distinct (hidden 20, 4 heads, ffn 37, 3 layers, 40 positions)
and every parameter, LayerNorms included, is drawn at random, so a swapped or unmapped tensor shows. The
special tokens sit at unusual ids so that the re-ordering into fairseq's dictionary is exercised.
Shared by the conversion, tokenization, parity, predict, export and ONNX tests."""
import argparse
import json
import os

import torch
import transformers  # noqa: E402  (test-only dependency, pinned in requirements.txt)

from toy_data import FILLERS, INTENSIFIERS, NEGATIONS, NEGATIVE, POSITIVE, SUBJECTS

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


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
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
    randomize(model)
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
    randomize(model, seed=1)
    model.save_pretrained(hf_dir)
    with open(os.path.join(hf_dir, "vocab.json"), "w") as f:
        json.dump({t: i for i, t in enumerate(ROBERTA_VOCAB)}, f)
    with open(os.path.join(hf_dir, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return model.eval()


def load_fairseq(out_dir: str, num_classes=None, head="sentence_classification_head"):
    """The model model.pt names (fairseq's ``roberta``, or ``multi_exit_roberta`` for a BERT with its
    segment embedding), built from model_args.txt plus conventions.json and loaded strictly through
    fairseq's own checkpoint reader and ``load_state_dict`` (which runs upgrade_state_dict_named)."""
    from fairseq import checkpoint_utils
    from fairseq.data import Dictionary
    from fairseq.models.roberta import RobertaModel

    from acl_fairseq.models.multi_exit_roberta import MultiExitRobertaModel

    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(out_dir, "model.pt"))
    flags = open(os.path.join(out_dir, "model_args.txt")).read().split()
    args = argparse.Namespace(dropout=0.0, attention_dropout=0.0, **{
        k.lstrip("-").replace("-", "_"): int(v) if v.isdigit() else v for k, v in zip(flags[::2], flags[1::2])
    })
    model_cls = RobertaModel
    if state["cfg"]["model"]["arch"] == "multi_exit_roberta":
        model_cls = MultiExitRobertaModel
        args.conventions, args.exit_layers = out_dir, str(args.encoder_layers)
    dictionary = Dictionary.load(os.path.join(out_dir, "dict.txt"))
    dictionary.add_symbol("<mask>")  # as the sentence_prediction / masked_lm tasks do
    model = model_cls.build_model(args, argparse.Namespace(source_dictionary=dictionary))
    if num_classes is not None:
        model.register_classification_head(head, num_classes=num_classes)
    model.load_state_dict(state["model"], strict=True)
    return model.eval(), dictionary, state


def fairseq_ids(dictionary, vocab, hf_tokens):
    """HF token strings -> fairseq ids, through the written dict (BERT: WordPiece words, RoBERTa: HF ids)."""
    roberta = vocab is ROBERTA_VOCAB
    return [dictionary.index(FAIRSEQ_NAME.get(t, str(vocab.index(t)) if roberta else t)) for t in hf_tokens]


def batch(vocab, sentences):
    """Right-padded (HF ids, token strings, attention mask, token types) for token lists of different
    lengths; token type 1 on ``B [SEP]`` of ``[CLS] A [SEP] B [SEP]``, as BERT's tokenizer gives."""
    pad = "[PAD]" if "[PAD]" in vocab else "<pad>"
    width = max(map(len, sentences))
    toks = [s + [pad] * (width - len(s)) for s in sentences]
    ids = torch.tensor([[vocab.index(t) for t in row] for row in toks])
    types = torch.tensor([[int(t != pad and "[SEP]" in row[:i]) for i, t in enumerate(row)] for row in toks])
    return ids, toks, (ids != vocab.index(pad)).long(), types


def bert_sentences():
    body = [TOY_WORDS[i % len(TOY_WORDS)] for i in range(38)]
    return [["[CLS]"] + body + ["[SEP]"],  # full length: the last position row is used
            ["[CLS]", "the", "plot", "was", "[MASK]", "##s", "[SEP]"],
            ["[CLS]", "[UNK]", "[SEP]", "good", "[SEP]"]]  # a pair: token type 1 on "good [SEP]"


def bert_pairs():
    """Sentence pairs as BERT builds them: [CLS] A [SEP] B [SEP], one at full length."""
    a, b = [TOY_WORDS[i % len(TOY_WORDS)] for i in range(20)], [TOY_WORDS[(3 * i) % len(TOY_WORDS)] for i in range(17)]
    return [["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"],
            ["[CLS]", "the", "plot", "[SEP]", "was", "[MASK]", "##s", "[SEP]"],
            ["[CLS]", "[UNK]", "[SEP]", "good", "[SEP]"]]


def compare(hf, out_dir, vocab, sentences, lm=True):
    """Max abs differences (hidden states, LM logits) over the non-padding positions."""
    model, dictionary, _ = load_fairseq(out_dir)
    hf_ids, toks, mask, types = batch(vocab, sentences)
    src = torch.tensor([fairseq_ids(dictionary, vocab, row) for row in toks])
    hf_to_fs = [fairseq_ids(dictionary, vocab, [t])[0] for t in vocab]
    with torch.no_grad():
        hf_out = hf(input_ids=hf_ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
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


def bert_on_toy_rte(root, num_classes=None, model_flags=()):
    """A tiny BERT converted (into ``root/fs``), the toy RTE folder in GLUE's format binarized with its
    WordPiece and dictionary (``root/bin``), and two updates of multi-exit fine-tuning (exits 2 and 3) with
    the BERT conventions (``root/ckpt``). Returns the paths and the toy folder's examples."""
    import helpers
    import toy_glue
    from acl_fairseq.hf import convert as convert_hf

    root = str(root)
    write_bert(os.path.join(root, "hf"))
    enc = os.path.join(root, "fs")
    convert_hf.convert(os.path.join(root, "hf"), enc, num_classes=num_classes)
    folder, written = toy_glue.make_task(os.path.join(root, "glue"), "RTE")
    data = os.path.join(root, "bin")
    toy_glue.run_main("RTE", folder, data, "--tokenizer", "wordpiece", "--vocab", os.path.join(enc, "vocab.txt"),
                      "--srcdict", os.path.join(enc, "dict.txt"), "--lowercase")
    flags = open(os.path.join(enc, "model_args.txt")).read().split()
    helpers.train(data, os.path.join(root, "ckpt"), criterion="sentence_prediction", arch="multi_exit_roberta",
                  model_args=flags + ["--exit-layers", "2,3", "--conventions", enc, *model_flags],
                  extra=["--max-update", "2", "--restore-file", os.path.join(enc, "model.pt"), "--reset-optimizer"])
    return {"encoder": enc, "folder": folder, "written": written, "data": data,
            "ckpt": os.path.join(root, "ckpt", "checkpoint_last.pt")}
