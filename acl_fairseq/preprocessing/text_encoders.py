"""Tokenizing GLUE text in a process pool, and the fairseq ``dict.txt`` each tokenizer kind needs.

The tokenizers themselves live in :mod:`acl_runtime.tokenization` (one implementation per kind, shared
with prediction); an :class:`EncoderSpec` is the picklable ``(record, base_dir)`` that each worker process
builds its tokenizer from, once. Chunks are kept in order.
"""
import logging
from dataclasses import dataclass
from multiprocessing import Pool
from typing import Callable, Iterator, List, Optional, Sequence

from acl_runtime import tokenization
from acl_runtime.glue_tasks import GlueDataError

logger = logging.getLogger(__name__)

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


@dataclass(frozen=True)
class EncoderSpec:
    """A tokenizer record (:mod:`acl_runtime.tokenization`) and the folder its file names are relative to."""

    record: dict
    base_dir: str

    def build(self) -> Callable[[str], List[str]]:
        return tokenization.build(self.record, self.base_dir)

    def decoder(self) -> Callable[[Sequence[str]], str]:
        """Token strings (as fairseq's ``Dictionary.string`` gives them) -> text; for checks and inspection."""
        return tokenization.build_decoder(self.record, self.base_dir)


_ENCODE: Optional[Callable[[str], List[str]]] = None


def _init_worker(spec: EncoderSpec) -> None:
    global _ENCODE
    _ENCODE = spec.build()


def _encode_chunk(texts: Sequence[str]) -> List[str]:
    lines = []
    for text in texts:
        line = " ".join(_ENCODE(text))
        # fairseq's binarizer reads with universal newlines: a stray \r would split the example in two
        if "\r" in line or "\n" in line:
            line = line.replace("\r", " ").replace("\n", " ")
        lines.append(line)
    return lines


class EncoderPool:
    """``encode_lines(texts)`` yields one token line per text, in order, using ``workers`` processes."""

    def __init__(self, spec: EncoderSpec, workers: int, chunk: int = 500):
        self.chunk = chunk
        self.pool = Pool(workers, initializer=_init_worker, initargs=(spec,)) if workers > 1 else None
        if self.pool is None:
            _init_worker(spec)

    def encode_lines(self, texts: Sequence[str]) -> Iterator[str]:
        chunks = (texts[i : i + self.chunk] for i in range(0, len(texts), self.chunk))
        results = self.pool.imap(_encode_chunk, chunks) if self.pool else map(_encode_chunk, chunks)
        for lines in results:
            yield from lines

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None and self.pool is not None:
            self.pool.terminate()
        else:
            self.close()


def train_sentencepiece(text_file: str, model_prefix: str, vocab_size: int, workers: int, seed: int) -> str:
    """Train a unigram sentencepiece model on ``text_file``; returns ``model_prefix + ".model"``.

    ``hard_vocab_limit=False`` makes ``vocab_size`` an upper bound, so a small task still trains.
    """
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            input=text_file, model_prefix=model_prefix, vocab_size=vocab_size, model_type="unigram",
            character_coverage=1.0, hard_vocab_limit=False, num_threads=workers,
            input_sentence_size=2_000_000, shuffle_input_sentence=True, minloglevel=2,
        )
    except (RuntimeError, OSError) as e:
        raise GlueDataError(
            f"{text_file}: sentencepiece training failed ({e}). Fix: try a smaller --spm-vocab-size"
        ) from None
    return model_prefix + ".model"


def write_sentencepiece_dict(model_path: str, out_path: str) -> int:
    """fairseq ``dict.txt`` listing the model's pieces in id order (control and unknown pieces left out,
    as fairseq's own specials take their place). Returns the number of entries."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    pieces = [
        sp.id_to_piece(i) for i in range(sp.get_piece_size())
        if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in FAIRSEQ_SPECIALS
    ]
    return _write_dict(pieces, out_path)


def write_wordpiece_dict(vocab_path: str, out_path: str) -> int:
    """fairseq ``dict.txt`` listing the vocab's wordpieces in vocab order, BERT's specials left out."""
    specials = set(tokenization.BERT_SPECIALS) | set(FAIRSEQ_SPECIALS)
    pieces = [t for t in tokenization.load_vocab(vocab_path) if t not in specials]
    return _write_dict(pieces, out_path)


def _write_dict(symbols: Sequence[str], out_path: str) -> int:
    with open(out_path, "w", encoding="utf-8") as f:
        for s in symbols:
            f.write(f"{s} 1\n")  # fairseq's "symbol count" format; counts are unused once a dict is given
    return len(symbols)


def check_srcdict(path: str) -> None:
    """Fail early, with the fix, on a dictionary fairseq cannot load."""
    from fairseq.data import Dictionary

    try:
        Dictionary.load(path)
    except FileNotFoundError:
        raise GlueDataError(
            f"{path}: dictionary not found. Fix: pass an existing fairseq dict.txt as --srcdict"
        ) from None
    except (ValueError, RuntimeError) as e:
        raise GlueDataError(f"{path}: not a fairseq dict.txt ({e}). Fix: pass a file of 'symbol count' lines") from None
