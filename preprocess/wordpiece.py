"""BERT's WordPiece tokenization in pure Python (google-research/bert ``tokenization.py`` semantics).

``BasicTokenizer`` cleans the text, splits CJK characters and punctuation, and with ``lowercase``
lowercases and strips accents; ``WordPiece.tokenize`` then applies greedy longest-match-first over a
``vocab.txt``, giving strings like ``play ##ing``. Same output as the ``tokenizers`` package's
``BertWordPieceTokenizer(add_special_tokens=False)`` (checked in the tests when that package is there).
"""
import unicodedata
from typing import Dict, List

BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def load_vocab(path: str) -> Dict[str, int]:
    """``vocab.txt``: one wordpiece per line, its id is the line number."""
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
    import json
    import os

    config = os.path.join(os.path.dirname(os.path.abspath(vocab_path)), "tokenizer_config.json")
    if os.path.exists(config):
        with open(config, encoding="utf-8") as f:
            value = json.load(f).get("do_lower_case")
        if isinstance(value, bool):
            return value
    return vocab_is_uncased(vocab)


def _is_whitespace(c: str) -> bool:
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def _is_control(c: str) -> bool:
    return c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf")


def _is_punctuation(c: str) -> bool:
    cp = ord(c)
    # all non-letter/number ASCII counts as punctuation, as in BERT ("$", "^", "`")
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def basic_tokenize(text: str, lowercase: bool) -> List[str]:
    """Clean, split CJK and punctuation, optionally lowercase and strip accents; return the words."""
    chars = []
    for c in text:
        cp = ord(c)
        if cp == 0 or cp == 0xFFFD or _is_control(c):
            continue
        if _is_cjk(cp):
            chars.append(f" {c} ")
        else:
            chars.append(" " if _is_whitespace(c) else c)
    words = []
    for word in "".join(chars).split():
        if lowercase:
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        current: List[str] = []
        for c in word:
            if _is_punctuation(c):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(c)
            else:
                current.append(c)
        if current:
            words.append("".join(current))
    return words


class WordPiece:
    def __init__(self, vocab, lowercase: bool, unk: str = "[UNK]", max_chars_per_word: int = 100):
        self.vocab = set(vocab)
        self.lowercase = lowercase
        self.unk = unk
        self.max_chars = max_chars_per_word
        self.cache: Dict[str, List[str]] = {}

    def word_pieces(self, word: str) -> List[str]:
        """Greedy longest-match-first; a word with any unmatched part becomes one ``[UNK]``."""
        if len(word) > self.max_chars:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return [self.unk]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> List[str]:
        out: List[str] = []
        for word in basic_tokenize(text, self.lowercase):
            if word not in self.cache:
                self.cache[word] = self.word_pieces(word)
            out.extend(self.cache[word])
        return out


def detokenize(pieces: List[str]) -> str:
    """``["play", "##ing", "."]`` -> ``"playing ."`` (words joined by single spaces)."""
    return " ".join(pieces).replace(" ##", "")
