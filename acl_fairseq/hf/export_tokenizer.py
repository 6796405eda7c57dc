"""The tokenizer files of an exported Hugging Face folder: the data folder's tokenizer, re-indexed to the model's rows.

The exported embedding keeps fairseq's row order (``<s> <pad> </s> <unk>``, the data's ``dict.txt``, ``<mask>``),
so the HF vocabulary is written in that order: row i gets the tokenizer's string for dictionary word i. Two
kinds can be expressed exactly for ``AutoTokenizer``:

- ``wordpiece`` (a converted BERT): ``vocab.txt``, ``BertTokenizer`` (BERT's basic tokenization, the same
  lowercasing and accent stripping as :mod:`acl_runtime.tokenization`), ``[CLS] [PAD] [SEP] [UNK]`` on rows 0-3.
- byte-level BPE, ``gpt2`` (fairseq's GPT-2 BPE, whose ``dict.txt`` words are GPT-2 ids) or ``hf_byte_bpe`` (a
  converted RoBERTa, whose words are HF ids): ``vocab.json`` mapping each BPE token to its row, the merges
  unchanged as ``merges.txt``, ``RobertaTokenizer`` (GPT-2's pre-tokenization, no prefix space, as fairseq).

fairseq maps a token that its dictionary lacks to ``<unk>``; an HF vocabulary cannot (a BPE merge needs its
result in the vocabulary, WordPiece would match other pieces instead), so a dictionary that does not hold the
tokenizer's whole vocabulary, or holds words the tokenizer never produces (WordPiece), is refused with the
counts and an example. Other kinds (sentencepiece, whitespace) have no standard HF tokenizer for these models.
"""
import json
import os
import shutil
from typing import Dict, List, Sequence

from acl_runtime import tokenization

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # rows 0-3 of every fairseq dictionary
MASK = "<mask>"
BERT_NAMES = {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]", MASK: "[MASK]"}
ROLES = {"cls_token": "<s>", "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>", "mask_token": MASK}
BPE_KINDS = {"gpt2": ("encoder_json", "vocab_bpe"), "hf_byte_bpe": ("vocab", "merges")}  # kind -> (vocab, merges)
FAMILY_OF_KIND = {"wordpiece": "bert", "gpt2": "roberta", "hf_byte_bpe": "roberta"}
EXAMPLES = 3  # tokens named in a refusal


class ExportError(ValueError):
    """The model or its data cannot be exported exactly; the message says why."""


def family_of(record: dict) -> str:
    """``"bert"`` or ``"roberta"``: the HF tokenizer family that can express this tokenizer record."""
    kind = record["kind"]
    if kind not in FAMILY_OF_KIND:
        raise ExportError(
            f"the data folder's tokenizer is {kind!r}: only wordpiece (a converted BERT) and byte-level BPE "
            f"({', '.join(BPE_KINDS)}: a fairseq or converted RoBERTa) have a standard Hugging Face tokenizer")
    return FAMILY_OF_KIND[kind]


def _shown(items: Sequence[str]) -> str:
    return ", ".join(repr(t) for t in list(items)[:EXAMPLES]) + (", ..." if len(items) > EXAMPLES else "")


def _check_unique(tokens: List[str]) -> None:
    seen: Dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in seen:
            raise ExportError(f"dictionary rows {seen[t]} and {i} both become the token {t!r}: the HF vocabulary "
                              "needs one row per token")
        seen[t] = i


def wordpiece_vocab(symbols: List[str], vocab_path: str) -> List[str]:
    """The ``vocab.txt`` lines (row order) for a WordPiece tokenizer whose vocabulary is ``vocab_path``."""
    vocab = [t for t in tokenization.load_vocab(vocab_path) if t not in tokenization.BERT_SPECIALS]
    tokens = [BERT_NAMES.get(s, s) for s in symbols]
    words = set(tokens) - set(BERT_NAMES.values())
    missing = [t for t in vocab if t not in words]
    extra = sorted(words - set(vocab))
    if missing or extra:
        what = (f"lacks {len(missing)} of the {len(vocab)} wordpieces of {vocab_path} ({_shown(missing)}), which "
                "fairseq reads as <unk>" if missing else f"holds {len(extra)} words that are not wordpieces of "
                f"{vocab_path} ({_shown(extra)}), which HF's WordPiece would match")
        raise ExportError(f"the data dictionary {what}: no HF vocabulary tokenizes the same way; binarize the data "
                          "with the encoder's own dict.txt (acl-preprocess --srcdict)")
    _check_unique(tokens)
    return tokens


def bpe_vocab(symbols: List[str], encoder: Dict[str, int]) -> Dict[str, int]:
    """``vocab.json`` (token -> row) for a byte-level BPE whose ``encoder`` maps tokens to the ids that the
    dictionary's words spell (fairseq's GPT-2 ids, or a converted RoBERTa's HF ids)."""
    by_id = {i: t for t, i in encoder.items()}
    specials = set(FAIRSEQ_SPECIALS) | {MASK}
    tokens = []
    for s in symbols:
        if s in specials:
            tokens.append(s)
        elif s.isdigit() and int(s) in by_id:
            tokens.append(by_id[int(s)])
        elif s.isdigit():
            raise ExportError(f"dictionary word {s!r} is not an id of the BPE vocabulary ({len(encoder)} tokens): "
                              "the data was binarized with another BPE")
        else:
            tokens.append(s)  # fairseq's padding words (madeupword0000): no merge produces them
    used = set(tokens)
    missing = [t for t in encoder if t not in used and t not in specials]
    if missing:
        raise ExportError(
            f"the data dictionary lacks {len(missing)} of the {len(encoder)} BPE tokens ({_shown(missing)}), which "
            "fairseq reads as <unk>: an HF byte-level BPE needs every merge result in its vocabulary; binarize the "
            "data with the full dictionary (RoBERTa's dict.txt, or the converted encoder's)")
    _check_unique(tokens)
    return {t: i for i, t in enumerate(tokens)}


def write(record: dict, base_dir: str, symbols: List[str], max_positions: int, out_dir: str) -> List[str]:
    """Write the tokenizer files for dictionary ``symbols`` (row order) into ``out_dir``; returns their names."""
    paths = dict(zip(tokenization.FILES[record["kind"]], tokenization.files_of(record, base_dir)))
    for path in paths.values():
        if not os.path.isfile(path):
            raise ExportError(f"{record['kind']} tokenizer file {path} not found (named by the data folder's "
                              "tokenizer record)")
    family = family_of(record)
    config = {"model_max_length": max_positions, "clean_up_tokenization_spaces": False}
    if family == "bert":
        lines = wordpiece_vocab(symbols, paths["vocab"])
        with open(os.path.join(out_dir, "vocab.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        names = {role: BERT_NAMES[s] for role, s in ROLES.items()}
        # BertTokenizer's defaults: accents stripped exactly when lowercasing, CJK spaced, as tokenization.py
        config.update(tokenizer_class="BertTokenizer", do_lower_case=record["lowercase"], strip_accents=None,
                      tokenize_chinese_chars=True, **names)
        files = ["vocab.txt"]
    else:
        vocab_role, merges_role = BPE_KINDS[record["kind"]]
        with open(paths[vocab_role], encoding="utf-8") as f:
            encoder = json.load(f)
        with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(bpe_vocab(symbols, encoder), f, ensure_ascii=False)
        shutil.copyfile(paths[merges_role], os.path.join(out_dir, "merges.txt"))
        names = dict(ROLES, bos_token="<s>", eos_token="</s>")
        config.update(tokenizer_class="RobertaTokenizer", add_prefix_space=False, trim_offsets=True,
                      errors="replace", **names)
        files = ["vocab.json", "merges.txt"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(names, f, indent=2)
    return files + ["tokenizer_config.json", "special_tokens_map.json"]
