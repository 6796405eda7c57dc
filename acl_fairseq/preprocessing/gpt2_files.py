"""The GPT-2 BPE files RoBERTa needs (``encoder.json``, ``vocab.bpe``, ``dict.txt``): fetch or build.

``ensure_gpt2_bpe`` downloads any missing file from fairseq's server (as preprocess_GLUE_tasks.sh does
with ``wget -N``), into ``--bpe-dir``, atomically (:mod:`acl_runtime.io.atomic`: whole or absent, and what a killed
download left is removed by the next one); files already there are never fetched again.
``write_local_gpt2_bpe`` learns a small byte-level BPE from some text with the ``tokenizers`` trainer and
writes it in the same three-file format, for tests and benchmarks on machines that cannot reach the
official files. It is NOT roberta.base's vocabulary: a model pretrained with the official files needs the
official files.
"""
import json
import logging
import os
import urllib.error
import urllib.request
from collections import Counter
from typing import Dict, Iterable, List, Tuple

from acl_runtime.glue_tasks import GlueDataError
from acl_runtime.io import atomic

logger = logging.getLogger(__name__)

GPT2_BPE_URL = "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/"
GPT2_FILES = ("encoder.json", "vocab.bpe", "dict.txt")


def default_bpe_dir() -> str:
    return (os.environ.get("ACL_GPT2_BPE_DIR")
            or os.path.join(os.path.expanduser("~"), ".cache", "acl_fairseq", "gpt2_bpe"))


def ensure_gpt2_bpe(bpe_dir: str, base_url: str = GPT2_BPE_URL, timeout: float = 60.0) -> Dict[str, str]:
    """Paths of the three files in ``bpe_dir``, downloading the missing ones from ``base_url``."""
    os.makedirs(bpe_dir, exist_ok=True)
    paths = {name: os.path.join(bpe_dir, name) for name in GPT2_FILES}
    for name, path in paths.items():
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            continue
        url = base_url.rstrip("/") + "/" + name
        logger.info(f"downloading {url} -> {path}")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp, atomic.writing(path, "wb") as out:
                for block in iter(lambda: resp.read(1 << 20), b""):
                    out.write(block)
        except (urllib.error.URLError, OSError, ValueError) as e:
            urls = " ".join(base_url.rstrip("/") + "/" + n for n in GPT2_FILES)
            raise GlueDataError(
                f"{path}: GPT-2 BPE file missing and the download from {url} failed ({getattr(e, 'reason', e)}); "
                f"offline? Fix: on a machine with network access fetch {urls} into one folder, copy it here "
                "and pass --bpe-dir FOLDER"
            ) from None
    return paths


def _trained_bpe(texts: Iterable[str], num_merges: int):
    """A ``tokenizers`` byte-level BPE learned from ``texts``: GPT-2's pre-tokenization regex and byte-to-symbol
    map (``pre_tokenizers.ByteLevel``, as fairseq's ``gpt2_bpe_utils``), all 256 byte symbols, then up to
    ``num_merges`` merges, most frequent pair first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 adds no leading space
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + num_merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tokenizer.train_from_iterator([t.strip() for t in texts], trainer)
    return tokenizer


def train_byte_level_bpe(texts: Iterable[str], num_merges: int) -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    """Learn ``num_merges`` byte-level BPE merges (most frequent pair first), with the ``tokenizers`` trainer.

    Returns ``(encoder, merges)``: the encoder maps all 256 byte symbols and every merged symbol to ids.
    """
    model = json.loads(_trained_bpe(texts, num_merges).to_str())["model"]
    # merges are "a b" strings in older tokenizers releases, [a, b] pairs in newer ones
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


def write_local_gpt2_bpe(out_dir: str, texts: List[str], num_merges: int = 2000) -> Dict[str, str]:
    """Write ``encoder.json``, ``vocab.bpe`` and a fairseq ``dict.txt`` learned from ``texts``.

    ``dict.txt`` lists every encoder id (as a string, like the official one) by frequency on ``texts``.
    """
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in GPT2_FILES}
    encoder, merges = train_byte_level_bpe(texts, num_merges)
    # GPT-2's formats: the encoder as JSON, the merges one "a b" per line after a header line (which fairseq's
    # get_encoder skips, as it drops what follows the last line end)
    atomic.write_text(paths["encoder.json"], json.dumps(encoder, ensure_ascii=False))
    atomic.write_text(paths["vocab.bpe"], "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    bpe = get_encoder(paths["encoder.json"], paths["vocab.bpe"])
    freq = Counter(i for t in texts for i in bpe.encode(t.strip()))
    atomic.write_text(paths["dict.txt"], "".join(f"{i} {freq[i]}\n"
                                                 for i in sorted(bpe.encoder.values(), key=lambda i: (-freq[i], i))))
    return paths
