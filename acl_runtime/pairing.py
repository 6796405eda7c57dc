"""How many texts a model reads per input (1: a sentence, 2: a sentence pair), and the one check of inputs against
it, with the fix each front end gives.

A model trained on a binarized folder with ``input1/`` reads pairs, one without reads single texts
(:func:`from_data`: the hub's reading of its ``--data``); an export records it in its manifest
(:data:`MANIFEST_KEY`). Fed a pair, a single-sentence model answered without a word, and wrongly: it read the two
texts as one, joined by a separator (TEI's ``{"inputs": ["a", "b"]}`` is one pair, not two texts). :func:`check`
refuses that at every place inputs are read: the Python API (``predict_early_exit``, ``predict_texts``:
:class:`acl_runtime.loop.EarlyExitPredictor`), acl-predict, and acl-serve's two routes (``/predict``, OIP infer).

A lone text on a pair model is refused too: it was read as ``<s> A </s>``, the first side alone, and answered as
if it were a pair (RTE's premise without its hypothesis). A manifest written before the field existed records
nothing: its inputs are not checked (the graphs take token ids, which do not say), as before.
"""
import json
import os
from typing import Dict, Iterable, Optional, Sequence, Tuple, Union

MANIFEST_KEY = "texts_per_input"
WHAT = {1: "one text", 2: "a pair of texts"}
# (front end, texts the model reads per input) -> how to send them
FIXES: Dict[Tuple[str, int], str] = {
    ("python", 1): "pass each input as one string",
    ("acl-predict", 1): "read one text per row: --columns N (one column), the --task the model was trained on, or "
                        "JSONL without text_pair",
    ("predict", 1): 'send a batch as [["a"], ["b"]]',
    ("infer", 1): 'send the texts in the "text" tensor alone, without "text_pair"',
    ("python", 2): "pass each input as a (text, text_pair) tuple",
    ("acl-predict", 2): "read two texts per row: --columns N,M, the --task the model was trained on, or JSONL with "
                        "text and text_pair",
    ("predict", 2): 'send each input as a pair: ["a", "b"] for one, [["a", "b"], ["c", "d"]] for a batch',
    ("infer", 2): 'send a "text_pair" tensor beside "text", one entry per text',
}


class Mismatch(ValueError):
    """Inputs of another kind than the model reads (one text or a pair)."""


def from_data(data_dir: Optional[str]) -> Optional[int]:
    """What a binarized folder's model reads: its stats.json's :data:`MANIFEST_KEY` where it records one (an
    HF-trained folder read as a run, whose data folder holds ``input1/`` for the pair layout: None when its task is
    unknown, and then nothing is checked), else 2 for a folder with ``input1/`` (pairs), 1 for one with
    ``input0/`` only; None otherwise (an encoder without a task's data: not checked)."""
    if not data_dir or not os.path.isdir(os.path.join(data_dir, "input0")):
        return None
    stats = os.path.join(data_dir, "stats.json")
    if os.path.isfile(stats):
        with open(stats, encoding="utf-8") as f:
            record = json.load(f)
        if MANIFEST_KEY in record:
            return from_manifest(record)
    return 2 if os.path.isdir(os.path.join(data_dir, "input1")) else 1


def from_manifest(manifest: Dict) -> Optional[int]:
    """The manifest's record, or None for a folder exported before it was recorded (then nothing is checked)."""
    value = manifest.get(MANIFEST_KEY)
    if value is None:
        return None
    if value not in WHAT or isinstance(value, bool):
        raise ValueError(f"{MANIFEST_KEY} is {value!r}, not 1 or 2; export the folder again")
    return value


def count(item: Union[str, Sequence[Optional[str]]]) -> int:
    """The texts of one input: a string is one; a tuple or list its entries that are not None."""
    if isinstance(item, str):
        return 1
    return sum(x is not None for x in item)


def check(reads: Optional[int], inputs: Iterable, front: str, where: Optional[Sequence[str]] = None) -> None:
    """Refuse (:class:`Mismatch`) the first of ``inputs`` that holds another number of texts than a model of
    ``reads`` texts per input reads, with ``front``'s fix (a front end of :data:`FIXES`). ``where``: each input's
    name in the message (``file:line``), default ``input K``. ``reads`` None: nothing is known, nothing is
    checked."""
    if reads is None:
        return
    for k, item in enumerate(inputs):
        n = count(item)
        if n != reads:
            name = where[k] if where is not None else f"input {k}"
            raise Mismatch(f"{name} holds {WHAT.get(n, f'{n} texts')}, but this model reads {WHAT[reads]} per "
                           f"input: {FIXES[front, reads]}")
