"""``OUT/onnx/tokenizer.json``: the data folder's tokenizer as a ``tokenizers`` file whose ids are fairseq's.

The hub turns text into ids in two steps: :mod:`acl_runtime.tokenization` gives token strings, then the
fairseq dictionary maps each string to its row (``<unk>`` for a string it lacks). The file written here does
both in one ``Tokenizer.encode(text, add_special_tokens=False).ids``, so the runtime needs neither the
dictionary nor this package's tokenizer code:

- ``wordpiece`` (a converted BERT): the same normalizer, pre-tokenizer and WordPiece model as
  ``tokenization._wordpiece``, over the whole ``vocab.txt`` (so the greedy longest match splits words exactly
  as in training), each piece mapped to its dictionary row; pieces the dictionary lacks map to ``<unk>``'s row.
  Several pieces then share one id, which ``tokenizers`` cannot save itself (it writes one piece per id), so the
  vocabulary is written into the JSON here;
- ``hf_byte_bpe`` (a converted or HF-trained RoBERTa): the hub's own byte-level BPE (``tokenization``'s, the same
  pre-tokenizer and merges), its vocabulary re-indexed to the dictionary's rows as ``acl-export --format hf`` re-indexes
  it (:func:`acl_fairseq.hf.export_tokenizer.bpe_vocab`, which refuses a dictionary that lacks a token);
- ``whitespace`` (pre-tokenized text, the toy data): ``tokenization.whitespace_parts``, the very split and
  lowercasing the checkpoint's tokenizer runs, each word looked up in the dictionary.

In both, a word that spells one of fairseq's special tokens (``<pad>``, ``</s>``, ...) maps to ``<unk>``'s row,
as :func:`acl_runtime.tokenization.dictionary_ids` maps it on the checkpoint: text is text.

The special tokens (``<s>``, separators, ``</s>``) are not added by the file: the runtime adds them from the
manifest's input layout, as the hub does. Other kinds are refused with the reason.
"""
import json
from typing import Dict, Optional

from acl_fairseq.hf.export_tokenizer import ExportError  # noqa: F401  (one error class for acl-export)
from acl_runtime import tokenization

FILE_NAME = "tokenizer.json"
KINDS = ("wordpiece", "hf_byte_bpe", "whitespace")


def wordpiece_vocab(record: dict, base_dir: str, dictionary) -> Dict[str, int]:
    """Every WordPiece of the record's ``vocab.txt`` -> its fairseq row (``<unk>``'s when the dictionary lacks it)."""
    vocab_path = tokenization.files_of(record, base_dir)[0]
    pieces = list(tokenization.load_vocab(vocab_path)) + [tokenization.WORDPIECE_UNK]
    return dict(zip(pieces, tokenization.dictionary_ids(dictionary, pieces)))


def build_json(record: dict, base_dir: str, dictionary) -> str:
    """The tokenizer file's text for ``record`` (a :mod:`acl_runtime.tokenization` record) and ``dictionary``."""
    from tokenizers import Tokenizer, models

    kind = record["kind"]
    if kind == "wordpiece":
        vocab = wordpiece_vocab(record, base_dir, dictionary)
        tok = Tokenizer(models.WordPiece(vocab, unk_token=tokenization.WORDPIECE_UNK,
                                         max_input_chars_per_word=tokenization.WORDPIECE_MAX_CHARS,
                                         continuing_subword_prefix=tokenization.WORDPIECE_PREFIX))
        tok.normalizer, tok.pre_tokenizer = tokenization._bert_basic(record["lowercase"])
        spec = json.loads(tok.to_str())
        spec["model"]["vocab"] = vocab  # to_str keeps one piece per id; the pieces that share <unk>'s row too
        return json.dumps(spec, ensure_ascii=False)
    if kind == "hf_byte_bpe":
        from acl_fairseq.hf import export_tokenizer

        paths = dict(zip(tokenization.FILES[kind], tokenization.files_of(record, base_dir)))
        with open(paths["vocab"], encoding="utf-8") as f:
            vocab = export_tokenizer.bpe_vocab(dictionary.symbols, json.load(f))
        spec = json.loads(tokenization._hf_byte_bpe(paths).to_str())
        spec["model"]["vocab"] = vocab  # the merges name tokens, not ids: they stand
        return json.dumps(spec, ensure_ascii=False)
    if kind == "whitespace":
        specials = tokenization.special_words(dictionary) - {dictionary.unk_word}  # absent: they read as <unk>
        # a repeated word keeps its first row
        vocab = {w: dictionary.index(w) for w in dictionary.symbols if w not in specials}
        tok = Tokenizer(models.WordLevel(vocab, unk_token=dictionary.unk_word))
        normalizer, tok.pre_tokenizer = tokenization.whitespace_parts(record["lowercase"])
        if normalizer is not None:
            tok.normalizer = normalizer
        return tok.to_str()
    raise ExportError(
        f"the data folder's tokenizer is {kind!r}: the ONNX export writes {', '.join(KINDS[:-1])} and {KINDS[-1]} "
        f"tokenizers only ({kind} has no exact tokenizers-file form here yet); export --format hf, or serve with "
        "acl-predict")


def write(hub, path: str, tokenizer_file: Optional[str] = None) -> str:
    """Write the tokenizer of a loaded hub model to ``path``; returns its kind."""
    from acl_fairseq.inference import hub as hub_mod

    _, record, base = hub_mod.load_tokenizer(hub.cfg.task.data, hub.conventions, tokenizer_file)
    text = build_json(record, base, hub.task.source_dictionary)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return record["kind"]
