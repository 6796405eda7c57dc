#!/usr/bin/env python
"""A small built-in sentence classification task, generated offline, where depth matters.

    python scripts/toy_data.py OUT_DIR [--n-train 4000] [--n-valid 500] [--pair] [--regression]

Sentences like ``the plot was not very dull , honestly`` carry sentiment words whose polarity is
flipped by a negation a few tokens earlier, and by intensifiers/fillers in between, so a bag of words
(what a shallow exit sees first) is not enough: the model must combine tokens. Used by ``make demo``
(scripts/demo.sh) and by the tests (which want a learnable task, not noise; tests/conftest.py puts this
folder on their path). Demo and test code, so not part of the plugin package.

Writes fairseq's raw layout (``{split}.input0``, optional ``{split}.input1``, ``{split}.label``) and
binarizes it with fairseq's own ``fairseq-preprocess`` into ``input0/``, ``input1/`` and ``label/``, with a
``stats.json`` whose ``"tokenizer"`` record (:mod:`acl_runtime.tokenization`, kind ``whitespace``) says how
raw text becomes these tokens, as ``preprocess/glue.py`` writes for GLUE.
"""
import json
import logging
import os
import random
from typing import Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

POSITIVE = ["good", "great", "fine", "brilliant", "lovely", "clever", "warm", "fresh"]
NEGATIVE = ["bad", "dull", "awful", "boring", "weak", "clumsy", "cold", "stale"]
SUBJECTS = ["the movie", "the plot", "the acting", "the ending", "the music", "the script"]
INTENSIFIERS = ["", "very", "really", "quite", "truly"]
FILLERS = ["", ", honestly", ", i think", "overall", ", to be fair"]
NEGATIONS = ["not", "never", "hardly"]


def _clause(rng: random.Random) -> Tuple[str, int]:
    """``subject was [negations] [intensifier] word``; each negation flips the polarity (parity)."""
    positive = rng.random() < 0.5
    word = rng.choice(POSITIVE if positive else NEGATIVE)
    n_neg = rng.choices([0, 1, 2, 3], weights=[0.35, 0.35, 0.2, 0.1])[0]
    negs = " ".join(rng.choice(NEGATIONS) for _ in range(n_neg))
    parts = [rng.choice(SUBJECTS), "was", negs, rng.choice(INTENSIFIERS), word]
    return " ".join(p for p in parts if p), int(positive) ^ (n_neg % 2)


def _sentence(rng: random.Random) -> Tuple[str, int]:
    """One or two clauses joined by "but": the last clause's sentiment is the label (1 positive).

    The words alone do not decide it: negations flip by parity, and which clause counts depends on
    where "but" stands, so shallow exits must compose tokens to reach the deep ones' accuracy.
    """
    text, label = _clause(rng)
    if rng.random() < 0.5:
        second, label = _clause(rng)
        text = f"{text} but {second}"
    filler = rng.choice(FILLERS)
    return (f"{text} {filler}" if filler else text), label


def make_examples(
    n: int, seed: int, num_classes: int = 2, pair: bool = False, regression: bool = False
) -> List[Tuple[str, Optional[str], str]]:
    """``n`` examples ``(text_a, text_b or None, label string)``.

    ``num_classes`` > 2 combines sentiment with "has an intensifier" into more classes so that
    multi-class code paths get exercised; ``regression`` gives a float score in [0, 1]; ``pair``
    adds a second sentence whose sentiment joins the label (agree / disagree).
    """
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, ya = _sentence(rng)
        b, yb = _sentence(rng) if pair else (None, 0)
        y = int(ya == yb) if pair else ya
        if regression:
            label = f"{(y + 0.25 * rng.random()) / 1.25:.4f}"
        else:
            intensified = any(w in a.split() for w in INTENSIFIERS if w)
            label = str((2 * y + int(intensified)) % num_classes if num_classes > 2 else y)
        out.append((a, b, label))
    return out


def write_raw(prefix: str, examples: Sequence[Tuple[str, Optional[str], str]]) -> None:
    """Write ``prefix.input0`` (``prefix.input1``) and ``prefix.label``, one example per line."""
    with open(prefix + ".input0", "w") as f0, open(prefix + ".label", "w") as fl:
        for a, _, y in examples:
            f0.write(a + "\n")
            fl.write(y + "\n")
    if examples and examples[0][1] is not None:
        with open(prefix + ".input1", "w") as f1:
            for _, b, _ in examples:
                f1.write(b + "\n")


def binarize(raw_dir: str, out_dir: str, splits: Sequence[str], regression: bool = False, workers: int = 1) -> None:
    """Binarize raw splits with fairseq-preprocess (whitespace tokens) into ``out_dir``.

    Inputs share one dictionary built on the training split; labels get their own (frequency sorted,
    like fairseq's GLUE recipe), or stay plain float text for regression.
    """
    from fairseq_cli import preprocess

    def run(field: str, srcdict: Optional[str]) -> None:
        args = ["--only-source", "--destdir", os.path.join(out_dir, field), "--workers", str(workers)]
        args += ["--trainpref", os.path.join(raw_dir, f"{splits[0]}.{field}")]
        if len(splits) > 1:
            args += ["--validpref", ",".join(os.path.join(raw_dir, f"{s}.{field}") for s in splits[1:])]
        if srcdict:
            args += ["--srcdict", srcdict]
        parser = preprocess.options.get_preprocessing_parser()
        preprocess.main(parser.parse_args(args))

    run("input0", None)
    if os.path.exists(os.path.join(raw_dir, f"{splits[0]}.input1")):
        run("input1", os.path.join(out_dir, "input0", "dict.txt"))
    if regression:
        os.makedirs(os.path.join(out_dir, "label"), exist_ok=True)
        for i, s in enumerate(splits):
            name = "train" if i == 0 else ("valid" if i == 1 else f"valid{i - 1}")
            with open(os.path.join(raw_dir, f"{s}.label")) as src:
                with open(os.path.join(out_dir, "label", f"{name}.label"), "w") as dst:
                    dst.write(src.read())
    else:
        run("label", None)
    write_stats(out_dir)


def write_stats(out_dir: str) -> None:
    """``out_dir/stats.json`` with the tokenizer record: the text is already split on spaces."""
    from acl_runtime.tokenization import make_record

    with open(os.path.join(out_dir, "stats.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer": make_record("whitespace", {})}, f, indent=1)
        f.write("\n")


def make_toy_dataset(
    out_dir: str,
    n_train: int = 256,
    n_valid: int = 64,
    seed: int = 0,
    num_classes: int = 2,
    pair: bool = False,
    regression: bool = False,
) -> Dict[str, object]:
    """Generate and binarize the toy task into ``out_dir`` (``out_dir/raw`` keeps the text)."""
    raw = os.path.join(out_dir, "raw")
    os.makedirs(raw, exist_ok=True)
    kw = dict(num_classes=num_classes, pair=pair, regression=regression)
    write_raw(os.path.join(raw, "train"), make_examples(n_train, seed, **kw))
    write_raw(os.path.join(raw, "valid"), make_examples(n_valid, seed + 1, **kw))
    binarize(raw, out_dir, ["train", "valid"], regression=regression)
    return {"data": out_dir, "num_classes": 1 if regression else num_classes}


def cli_main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write the built-in toy sentiment task, binarized for fairseq.")
    parser.add_argument("out_dir", help="output folder (gets raw/, input0/, label/ and input1/ for --pair)")
    parser.add_argument("--n-train", type=int, default=4000, help="training examples")
    parser.add_argument("--n-valid", type=int, default=500, help="validation examples")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the generator")
    parser.add_argument("--num-classes", type=int, default=2, help="2 = sentiment; >2 adds intensifier classes")
    parser.add_argument("--pair", action="store_true", help="sentence pairs (label: same sentiment or not)")
    parser.add_argument("--regression", action="store_true", help="float scores in [0, 1] instead of classes")
    a = parser.parse_args()
    info = make_toy_dataset(a.out_dir, a.n_train, a.n_valid, a.seed, a.num_classes, a.pair, a.regression)
    print(f"toy task written to {info['data']} ({a.n_train} train / {a.n_valid} valid examples)")


if __name__ == "__main__":
    cli_main()
