"""The GPT-2 BPE files RoBERTa needs (``encoder.json``, ``vocab.bpe``, ``dict.txt``): fetch or build.

``ensure_gpt2_bpe`` downloads any missing file from fairseq's server (as preprocess_GLUE_tasks.sh does
with ``wget -N``), into ``--bpe-dir``, atomically; files already there are never fetched again.
``write_local_gpt2_bpe`` builds a small byte-level BPE in the same three-file format from some text,
for tests and benchmarks on machines that cannot reach the official files. It is NOT roberta.base's
vocabulary: a model pretrained with the official files needs the official files.
"""
import heapq
import json
import logging
import os
import urllib.error
import urllib.request
from collections import Counter
from typing import Dict, Iterable, List, Tuple

from acl_fairseq.preprocessing.glue_tasks import GlueDataError

logger = logging.getLogger(__name__)

GPT2_BPE_URL = "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/"
GPT2_FILES = ("encoder.json", "vocab.bpe", "dict.txt")
# the pre-tokenization regex of GPT-2 (fairseq/data/encoders/gpt2_bpe_utils.py)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def default_bpe_dir() -> str:
    return os.environ.get("ACL_GPT2_BPE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "acl_fairseq", "gpt2_bpe")


def ensure_gpt2_bpe(bpe_dir: str, base_url: str = GPT2_BPE_URL, timeout: float = 60.0) -> Dict[str, str]:
    """Paths of the three files in ``bpe_dir``, downloading the missing ones from ``base_url``."""
    os.makedirs(bpe_dir, exist_ok=True)
    paths = {name: os.path.join(bpe_dir, name) for name in GPT2_FILES}
    for name, path in paths.items():
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            continue
        url = base_url.rstrip("/") + "/" + name
        logger.info(f"downloading {url} -> {path}")
        part = f"{path}.part{os.getpid()}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
                while True:
                    block = resp.read(1 << 20)
                    if not block:
                        break
                    out.write(block)
            os.replace(part, path)  # never leave a half-downloaded file under the real name
        except (urllib.error.URLError, OSError, ValueError) as e:
            if os.path.exists(part):
                os.remove(part)
            urls = " ".join(base_url.rstrip("/") + "/" + n for n in GPT2_FILES)
            raise GlueDataError(
                f"{path}: GPT-2 BPE file missing and the download from {url} failed ({getattr(e, 'reason', e)}); "
                f"offline? Fix: on a machine with network access fetch {urls} into one folder, copy it here "
                "and pass --bpe-dir FOLDER"
            ) from None
    return paths


def _words(texts: Iterable[str]) -> Counter:
    import regex

    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    byte_encoder, pat = bytes_to_unicode(), regex.compile(GPT2_PATTERN)
    words: Counter = Counter()
    for text in texts:
        for tok in pat.findall(text.strip()):
            words["".join(byte_encoder[b] for b in tok.encode("utf-8"))] += 1
    return words


def train_byte_level_bpe(texts: Iterable[str], num_merges: int) -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    """Learn ``num_merges`` byte-level BPE merges (most frequent pair first, ties by pair order).

    Returns ``(encoder, merges)``: the encoder maps all 256 byte symbols and every merged symbol to ids.
    Pair counts are updated incrementally (a heap with lazy deletion), so SST-2 takes seconds.
    """
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    word_freq = _words(texts)
    words = [list(w) for w in word_freq]
    freqs = list(word_freq.values())
    counts: Counter = Counter()
    where: Dict[Tuple[str, str], set] = {}
    for i, w in enumerate(words):
        for pair in zip(w, w[1:]):
            counts[pair] += freqs[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    merges: List[Tuple[str, str]] = []
    while heap and len(merges) < num_merges:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg or -neg <= 0:
            continue  # stale heap entry
        merges.append(pair)
        touched: Counter = Counter()
        for i in where.pop(pair, ()):
            w, f = words[i], freqs[i]
            for p in zip(w, w[1:]):
                counts[p] -= f
                touched[p] += 1
            words[i] = w = _merge(w, pair)
            for p in zip(w, w[1:]):
                counts[p] += f
                where.setdefault(p, set()).add(i)
                touched[p] += 1
        for p in touched:
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
        counts.pop(pair, None)
    symbols = list(bytes_to_unicode().values()) + [a + b for a, b in merges]
    encoder: Dict[str, int] = {}
    for s in symbols:
        encoder.setdefault(s, len(encoder))
    return encoder, merges


def _merge(word: List[str], pair: Tuple[str, str]) -> List[str]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def write_local_gpt2_bpe(out_dir: str, texts: List[str], num_merges: int = 2000) -> Dict[str, str]:
    """Write ``encoder.json``, ``vocab.bpe`` and a fairseq ``dict.txt`` learned from ``texts``.

    ``dict.txt`` lists every encoder id (as a string, like the official one) by frequency on ``texts``.
    """
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    os.makedirs(out_dir, exist_ok=True)
    encoder, merges = train_byte_level_bpe(texts, num_merges)
    paths = {name: os.path.join(out_dir, name) for name in GPT2_FILES}
    with open(paths["encoder.json"], "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False)
    with open(paths["vocab.bpe"], "w", encoding="utf-8") as f:
        # get_encoder drops the first line (a version header) and the last (empty after the final newline)
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    bpe = get_encoder(paths["encoder.json"], paths["vocab.bpe"])
    freq = Counter(i for t in texts for i in bpe.encode(t.strip()))
    with open(paths["dict.txt"], "w", encoding="utf-8") as f:
        for i in sorted(encoder.values(), key=lambda i: (-freq[i], i)):
            f.write(f"{i} {freq[i]}\n")
    return paths
