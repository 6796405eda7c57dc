"""Text -> token strings (the words of a fairseq ``dict.txt``): the one implementation of each tokenizer kind.

Preprocessing (``preprocess/glue.py``), the toy data, converted checkpoints and prediction all describe
their tokenizer with one small record, and :func:`build` turns a record into the tokenizer, so raw text
at prediction time is split exactly as the training data was. Record (JSON; file names relative to the
folder the record lives in, so the folder can move)::

    {"kind": "wordpiece",     "files": {"vocab": "vocab.txt"}, "lowercase": true}
    {"kind": "gpt2",          "files": {"encoder_json": "encoder.json", "vocab_bpe": "vocab.bpe"}, "lowercase": false}
    {"kind": "sentencepiece", "files": {"model": "spm.model"}, "lowercase": false}
    {"kind": "hf_byte_bpe",   "files": {"vocab": "vocab.json", "merges": "merges.txt"}, "lowercase": false}
    {"kind": "whitespace",    "files": {}, "lowercase": false}

Tokens per kind:
  * ``gpt2``: fairseq's ``gpt2_bpe_utils.get_encoder``; BPE ids written as strings, exactly what
    ``multiprocessing_bpe_encoder.py`` writes (the official ``dict.txt`` maps them);
  * ``sentencepiece``: the model's pieces (``▁the``);
  * ``wordpiece``: BERT wordpieces (``play ##ing``) by the ``tokenizers`` package, configured as
    google-research/bert's ``tokenization.py`` (see :func:`_wordpiece`);
  * ``hf_byte_bpe``: HF ids as strings, what fairseq's ``--bpe hf_byte_bpe`` emits (same class, same
    ``add_prefix_space=False``), i.e. a converted HF RoBERTa's ``dict.txt`` words;
  * ``whitespace``: the words between Python's whitespace characters (what ``str.split()`` and
    fairseq-preprocess's ``\\s+`` split on), lowercased by ``tokenizers``' ``Lowercase`` when the record
    says so. Both are ``tokenizers`` parts (:func:`whitespace_parts`), the very ones the exported
    ``tokenizer.json`` holds, so the checkpoint and the ONNX folder split and lowercase every string alike.

Ids (:func:`dictionary_ids`): a token the dictionary holds maps to its row, except fairseq's special words
(``<s> <pad> </s> <unk> <mask>``): text that spells one is text, an unknown word (``<unk>``), never that
token's id, so no row ever holds a padding or separator id that its text typed. Text longer than
:func:`byte_budget` is cut before it is tokenized (:func:`clip`), so a huge line costs no more than the budget.
"""
import json
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

KINDS = ("gpt2", "sentencepiece", "wordpiece", "hf_byte_bpe", "whitespace")
FILES = {  # kind -> the roles its "files" must name, in this order
    "gpt2": ("encoder_json", "vocab_bpe"),
    "sentencepiece": ("model",),
    "wordpiece": ("vocab",),
    "hf_byte_bpe": ("vocab", "merges"),
    "whitespace": (),
}
LOWERCASE_KINDS = ("wordpiece", "whitespace")  # the others have casing inside their vocabulary
FIELDS = ("kind", "files", "lowercase")
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDPIECE_UNK = "[UNK]"
WORDPIECE_MAX_CHARS = 100  # longer words become one [UNK], as in BERT
WORDPIECE_PREFIX = "##"
# Python's whitespace (str.isspace): Unicode's White_Space plus U+001C-U+001F, which str.split() and
# fairseq-preprocess split on and Rust's (tokenizers' WhitespaceSplit) does not
PY_WHITESPACE = "".join(chr(c) for c in range(0x3001) if chr(c).isspace())
SPECIAL_WORDS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # fairseq's; a text spelling one is an unknown word
# a generous bound on the UTF-8 bytes of text one token stands for: only words longer than this (one [UNK] or
# <unk> each) make the cut drop text that would have been tokenized within max_positions
BYTES_PER_TOKEN = 1024

Tokenize = Callable[[str], List[str]]


def validate(record: dict, where: str = "tokenizer") -> dict:
    """``record`` if it follows the schema above, else a ValueError naming the field."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object with {list(FIELDS)}, got {type(record).__name__} {record!r}")
    missing = [f for f in FIELDS if f not in record]
    unknown = sorted(set(record) - set(FIELDS))
    if missing or unknown:
        raise ValueError(f"{where}: " + "; ".join(
            ([f"missing field(s) {missing}"] if missing else []) + ([f"unknown field(s) {unknown}"] if unknown else []))
            + f" (expected {list(FIELDS)})")
    kind = record["kind"]
    if kind not in KINDS:
        raise ValueError(f"{where}: kind {kind!r} must be one of {KINDS}")
    files = record["files"]
    if not isinstance(files, dict) or set(files) != set(FILES[kind]):
        raise ValueError(
            f"{where}: files {files!r} must be an object naming exactly {list(FILES[kind])} for kind {kind!r}"
        )
    for role, name in files.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: files.{role} {name!r} must be a file name")
        if os.path.isabs(name) or name.startswith(("/", "\\")) or name[1:2] == ":":  # POSIX, UNC or drive
            raise ValueError(f"{where}: files.{role} {name!r} must be relative to the record's folder, not absolute")
    if not isinstance(record["lowercase"], bool):
        raise ValueError(f"{where}: lowercase {record['lowercase']!r} must be true or false")
    if record["lowercase"] and kind not in LOWERCASE_KINDS:
        raise ValueError(f"{where}: lowercase true is only defined for {LOWERCASE_KINDS}, not {kind!r}")
    return record


def make_record(kind: str, files: Dict[str, str], lowercase: bool = False) -> dict:
    return validate({"kind": kind, "files": dict(files), "lowercase": bool(lowercase)}, f"tokenizer record ({kind})")


def files_of(record: dict, base_dir: str) -> List[str]:
    """Absolute paths of the record's files, in the kind's order (for error messages and copies)."""
    validate(record)
    return [os.path.abspath(os.path.join(base_dir, record["files"][role])) for role in FILES[record["kind"]]]


def read(data_bin: str) -> Optional[dict]:
    """The ``"tokenizer"`` record of ``data_bin/stats.json``; None when there is no stats.json or it
    holds no record (data binarized before records existed kept only the kind's name there)."""
    path = os.path.join(data_bin, "stats.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        try:
            stats = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    record = stats.get("tokenizer") if isinstance(stats, dict) else None
    return validate(record, f"{path}: tokenizer") if isinstance(record, dict) else None


def upgrade_legacy(record: dict) -> dict:
    """The record of a ``conventions.json`` written before this schema (``{"kind": "wordpiece",
    "vocab": "vocab.txt", "lowercase": b}`` / ``{"kind": "hf_byte_bpe", "vocab": ..., "merges": ...}``),
    in today's form; anything else is returned as it is. Checkpoints carry such records."""
    if not isinstance(record, dict) or "files" in record or record.get("kind") not in ("wordpiece", "hf_byte_bpe"):
        return record
    roles = FILES[record["kind"]]
    if not all(isinstance(record.get(r), str) for r in roles) or set(record) - {"kind", "lowercase", *roles}:
        return record
    return {"kind": record["kind"], "files": {r: record[r] for r in roles}, "lowercase": record.get("lowercase", False)}


def _paths(record: dict, base_dir: str) -> Dict[str, str]:
    paths = dict(zip(FILES[record["kind"]], files_of(record, base_dir)))
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"{record['kind']} tokenizer file(s) missing: {', '.join(missing)} (the record's "
                                f"files are relative to {os.path.abspath(base_dir)}; keep them beside it)")
    return paths


def build(record: dict, base_dir: str) -> Tokenize:
    """``text -> token strings``, the tokenizer built once here. ``base_dir``: the record's folder.

    The returned closure is not picklable: a process pool passes ``(record, base_dir)`` and each worker
    calls ``build`` itself (``acl_fairseq/preprocessing/text_encoders.py``)."""
    validate(record)
    kind, paths = record["kind"], _paths(record, base_dir)
    if kind == "gpt2":
        bpe = _gpt2(paths)
        return lambda text: [str(i) for i in bpe.encode(text)]
    if kind == "sentencepiece":
        sp = _sentencepiece(paths)
        return lambda text: sp.encode(text, out_type=str)
    if kind == "wordpiece":
        tok = _wordpiece(paths["vocab"], record["lowercase"])
        return lambda text: tok.encode(text, add_special_tokens=False).tokens
    if kind == "hf_byte_bpe":
        bpe = _hf_byte_bpe(paths)
        return lambda text: [str(i) for i in bpe.encode(text).ids]
    normalizer, pre = whitespace_parts(record["lowercase"])
    if normalizer is None:
        return lambda text: [w for w, _ in pre.pre_tokenize_str(text)]
    return lambda text: [w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))]


def whitespace_parts(lowercase: bool):
    """``(normalizer or None, pre_tokenizer)`` of the ``whitespace`` kind, for :func:`build` and the exported
    ``tokenizer.json`` alike: split on :data:`PY_WHITESPACE` (runs removed), lowercase with ``tokenizers``'
    ``Lowercase`` (it differs from ``str.lower`` on 55 code points newer than Python 3.11's Unicode tables and
    lowercases a word-final capital sigma to σ, not ς)."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    pattern = "[" + "".join("\\x{%X}" % ord(c) for c in PY_WHITESPACE) + "]+"
    pre = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    return (normalizers.Lowercase() if lowercase else None), pre


def special_words(dictionary) -> set:
    """The words of ``dictionary`` that name fairseq's special tokens, not text."""
    return {w for w in SPECIAL_WORDS if w in dictionary.indices}


def dictionary_ids(dictionary, tokens: Sequence[str]) -> List[int]:
    """Rows of ``tokens`` in a fairseq ``dictionary``: ``<unk>``'s for a word it lacks and for a special word
    (text that spells ``<pad>`` is text, not padding)."""
    specials, unk = special_words(dictionary), dictionary.unk()
    return [unk if t in specials else dictionary.index(t) for t in tokens]


def byte_budget(max_positions: int) -> int:
    """The UTF-8 bytes of one text kept for a model of ``max_positions`` positions (:func:`clip`)."""
    return BYTES_PER_TOKEN * max_positions


def clip(text: str, max_positions: int) -> Tuple[str, bool]:
    """``(text, cut)``: ``text`` stripped and cut to :func:`byte_budget` UTF-8 bytes (at a character boundary)
    before anything tokenizes it, so memory per row stays bounded; a lone surrogate (possible in JSON) becomes
    U+FFFD, since no tokenizer takes it."""
    budget = byte_budget(max_positions)
    text = text.strip()
    head = text[: budget + 1]  # a character is at least one byte: enough to tell whether it fits
    try:
        data = head.encode("utf-8")
    except UnicodeEncodeError:
        head = re.sub("[\ud800-\udfff]", "\ufffd", head)
        data = head.encode("utf-8")
    if len(text) <= budget and len(data) <= budget:
        return head, False
    return data[:budget].decode("utf-8", "ignore"), True  # "ignore": the character the cut split


def build_decoder(record: dict, base_dir: str) -> Callable[[Sequence[str]], str]:
    """Token strings (as fairseq's ``Dictionary.string`` gives them) -> text; for checks and inspection.
    WordPiece and whitespace give the words joined by single spaces (casing and spacing are not kept)."""
    validate(record)
    kind, paths = record["kind"], _paths(record, base_dir)
    if kind == "gpt2":
        bpe = _gpt2(paths)
        return lambda toks: bpe.decode([int(t) for t in toks])
    if kind == "sentencepiece":
        sp = _sentencepiece(paths)
        return lambda toks: sp.decode_pieces(list(toks))
    if kind == "hf_byte_bpe":
        bpe = _hf_byte_bpe(paths)
        return lambda toks: bpe.decode([int(t) for t in toks])
    if kind == "wordpiece":
        return detokenize
    return lambda toks: " ".join(toks)


# Tokenizers that live in the training stack, by record kind: fairseq's GPT-2 BPE ("gpt2"), which the plugin
# registers when it imports (acl_fairseq/bpe.py). An exported OUT/onnx folder never needs them: its
# tokenizer.json carries the same BPE for the ``tokenizers`` library.
TRAINING_STACK: Dict[str, Callable[[Dict[str, str]], object]] = {}


def _gpt2(paths):
    if "gpt2" not in TRAINING_STACK:
        raise ValueError("a gpt2 tokenizer record needs fairseq's GPT-2 BPE: import acl_fairseq in an install with "
                         "torch and fairseq, or export the model (acl-export --format onnx) for a torch-free runtime")
    return TRAINING_STACK["gpt2"](paths)


def _sentencepiece(paths):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=paths["model"])


def _hf_byte_bpe(paths):
    from tokenizers import ByteLevelBPETokenizer

    return ByteLevelBPETokenizer(paths["vocab"], paths["merges"], add_prefix_space=False)  # fairseq's default


# --------------------------------------------------------------------------- WordPiece


def load_vocab(path: str) -> Dict[str, int]:
    """``vocab.txt``: one wordpiece per line, its id is the line number; empty lines and repeats skipped."""
    vocab: Dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            token = line.rstrip("\n").rstrip("\r")
            if token and token not in vocab:
                vocab[token] = i
    return vocab


def vocab_is_uncased(vocab) -> bool:
    """True when no entry (bracketed specials like ``[CLS]`` aside) has an ASCII upper-case letter.

    Only A-Z count: uncased BERT vocabularies keep a few symbols that ``str.isupper`` calls upper
    case (``ℝ``, some Greek letters), while a cased vocabulary has thousands of capitalised words.
    """
    return not any("A" <= c <= "Z" for tok in vocab if not (tok.startswith("[") and tok.endswith("]")) for c in tok)


def detect_lowercase(vocab_path: str, vocab) -> bool:
    """``do_lower_case`` from a ``tokenizer_config.json`` beside the vocab (what the model was trained
    with) if there is one, else :func:`vocab_is_uncased`."""
    config = os.path.join(os.path.dirname(os.path.abspath(vocab_path)), "tokenizer_config.json")
    if os.path.exists(config):
        with open(config, encoding="utf-8") as f:
            value = json.load(f).get("do_lower_case")
        if isinstance(value, bool):
            return value
    return vocab_is_uncased(vocab)


def _bert_basic(lowercase: bool):
    """BERT's BasicTokenizer as ``tokenizers`` parts: drop control characters, whitespace to spaces,
    spaces around CJK ideographs, with ``lowercase`` also lowercase and strip accents (NFD, marks
    dropped); then split on whitespace and punctuation (all non-alphanumeric ASCII counts)."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                            strip_accents=lowercase, lowercase=lowercase)
    return normalizer, pre_tokenizers.BertPreTokenizer()


def _wordpiece(vocab_path: str, lowercase: bool):
    """Greedy longest-match-first WordPiece; a word with any unmatched part is one ``[UNK]``.

    The vocab is read here (not by ``WordPiece.from_file``, which strips trailing whitespace of entries),
    and no special tokens are registered: ``[CLS]`` in the text is split like any other bracketed word.
    Measured against the pure-Python implementation this replaced (every code point inside and around a
    word, both casings, MiniLM's vocab): identical except ~500 code points whose category or case differs
    between the Unicode tables of ``tokenizers`` and of Python (mostly characters newer than Unicode 9),
    private-use characters (dropped here, kept there), CJK U+2B820-U+2B91F (not spaced here) and a
    word-final capital sigma (σ here, ς there). None occur in the GLUE data: its output is byte-identical
    (tests/data/wordpiece_glue_sha256.json)."""
    from tokenizers import Tokenizer, models

    vocab = load_vocab(vocab_path)
    vocab.setdefault(WORDPIECE_UNK, max(vocab.values(), default=-1) + 1)  # the model must be able to name it
    tok = Tokenizer(models.WordPiece(vocab, unk_token=WORDPIECE_UNK, max_input_chars_per_word=WORDPIECE_MAX_CHARS,
                                     continuing_subword_prefix=WORDPIECE_PREFIX))
    tok.normalizer, tok.pre_tokenizer = _bert_basic(lowercase)
    return tok


def basic_words(text: str, lowercase: bool) -> List[str]:
    """The words WordPiece splits further (BERT's basic tokenization); what a decoded wordpiece line reads."""
    normalizer, pre = _bert_basic(lowercase)
    return [w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))]


def detokenize(pieces: Sequence[str]) -> str:
    """``["play", "##ing", "."]`` -> ``"playing ."`` (words joined by single spaces)."""
    return " ".join(pieces).replace(" " + WORDPIECE_PREFIX, "")
