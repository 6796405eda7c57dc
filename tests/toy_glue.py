"""Tiny GLUE folders in each task's real format (headers, CoLA without one, MRPC's byte-order mark, stray
quotes), the tokenizer files they need, and readers of what preprocess/glue.py writes. Shared by the
preprocessing, predict and export tests."""
import json
import os
import random

from acl_fairseq.preprocessing import glue
from acl_fairseq.preprocessing.gpt2_files import write_local_gpt2_bpe
from acl_runtime import tokenization
from acl_runtime.tokenization import basic_words

WORDS = ("the movie film plot actor was is not very good bad great dull \"funny\" it 's n't a of "
         "café naïve 1999 , . ! ? ( ) -- playing played play who what where did say run").split()
SPECIAL_SENTENCES = ['"quoted at start', 'it \'s a "stray quote', 'ends with a quote "', "Who played the Café scene?"]


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


def _nli(kind, i, a, b, y):  # QNLI / RTE / WNLI: index, s1, s2, label
    return [str(i), a, b] + ([y] if kind != "test" else [])


# task -> (labels, files, header(kind) or None, row(kind, i, a, b, y)); an independent description of GLUE
FORMATS = {
    "CoLA": (("0", "1"), ("train", "dev", "test"),
             lambda k: ["index", "sentence"] if k == "test" else None,
             lambda k, i, a, b, y: [str(i), a] if k == "test" else ["gj04", y, "", a]),
    "SST-2": (("0", "1"), ("train", "dev", "test"),
              lambda k: ["index", "sentence"] if k == "test" else ["sentence", "label"],
              lambda k, i, a, b, y: [str(i), a] if k == "test" else [a + " ", y]),
    "MRPC": (("0", "1"), ("train", "dev", "test"),
             lambda k: ["index" if k == "test" else "Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
             lambda k, i, a, b, y: [str(i) if k == "test" else y, str(1000 + i), str(2000 + i), a, b]),
    "STS-B": (None, ("train", "dev", "test"),
              lambda k: "index genre filename year old_index source1 source2 sentence1 sentence2".split()
              + (["score"] if k != "test" else []),
              lambda k, i, a, b, y: [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b]
              + ([y] if k != "test" else [])),
    "QQP": (("0", "1"), ("train", "dev", "test"),
            lambda k: (["id", "question1", "question2"] if k == "test"
                       else ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]),
            lambda k, i, a, b, y: [str(i), a, b] if k == "test" else [str(i), str(2 * i), str(2 * i + 1), a, b, y]),
    "MNLI": (("contradiction", "entailment", "neutral"),
             ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"),
             lambda k: "index promptID pairID genre s1_bp s2_bp s1_p s2_p sentence1 sentence2".split()
             + {"train": ["label1", "gold_label"],
                "dev": ["label1", "label2", "label3", "label4", "label5", "gold_label"], "test": []}[k],
             lambda k, i, a, b, y: [str(i), "1", "1e", "fiction", "( a )", "( b )", "(ROOT a)", "(ROOT b)", a, b]
             + {"train": [y, y], "dev": [y] * 5 + [y], "test": []}[k]),
    "QNLI": (("entailment", "not_entailment"), ("train", "dev", "test"),
             lambda k: ["index", "question", "sentence"] + (["label"] if k != "test" else []), _nli),
    "RTE": (("entailment", "not_entailment"), ("train", "dev", "test"),
            lambda k: ["index", "sentence1", "sentence2"] + (["label"] if k != "test" else []), _nli),
    "WNLI": (("0", "1"), ("train", "dev", "test"),
             lambda k: ["index", "sentence1", "sentence2"] + (["label"] if k != "test" else []), _nli),
}
PAIR = {"MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"}


def make_task(root, task, n=(24, 12, 6), seed=0, weights=None):
    """Write a GLUE-format folder ``root/task``; returns ``(folder, {file stem: [(a, b, y), ...]})``."""
    labels, files, header, row = FORMATS[task]
    rng = random.Random(seed)
    folder = os.path.join(str(root), task)
    os.makedirs(folder, exist_ok=True)
    written = {}
    for stem in files:
        kind = "train" if stem == "train" else ("dev" if stem.startswith("dev") else "test")
        count = n[0] if kind == "train" else (n[1] if kind == "dev" else n[2])
        examples = []
        for i in range(count):
            a = SPECIAL_SENTENCES[i] if i < len(SPECIAL_SENTENCES) else sentence(rng)
            b = sentence(rng)
            y = f"{rng.uniform(0, 5):.3f}" if labels is None else (
                rng.choices(labels, weights=weights)[0] if weights else labels[i % len(labels)])
            examples.append((a, b, y))
        lines = (([header(kind)] if header(kind) else [])
                 + [row(kind, i, a, b, y) for i, (a, b, y) in enumerate(examples)])
        text = "\n".join("\t".join(f) for f in lines)
        if not (task == "CoLA" and stem == "dev"):  # CoLA dev.tsv has no final newline
            text += "\n"
        with open(os.path.join(folder, stem + ".tsv"), "w", encoding="utf-8-sig" if task == "MRPC" else "utf-8") as f:
            f.write(text)  # utf-8-sig: MRPC files start with a byte-order mark
        written[stem] = examples
    return folder, written


def make_wordpiece_vocab(path, texts, uncased=True):
    words = sorted({w for t in texts for w in basic_words(t, uncased)} - {"playing", "played"})
    chars = sorted({c for w in words for c in w})
    vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + chars + ["##" + c for c in chars]
             + ["##ing", "##ed"])
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(dict.fromkeys(vocab)) + "\n")
    return path


ALL_TEXT = WORDS + SPECIAL_SENTENCES


def make_assets(folder):
    """A small GPT-2 BPE and a WordPiece vocabulary that cover every word the tiny tasks use."""
    bpe_dir = os.path.join(str(folder), "gpt2_bpe")
    write_local_gpt2_bpe(bpe_dir, [" ".join(ALL_TEXT)] * 3 + ALL_TEXT, num_merges=60)
    return {"vocab": make_wordpiece_vocab(os.path.join(str(folder), "vocab.txt"), ALL_TEXT), "bpe_dir": bpe_dir}


def tok_args(tokenizer, assets):
    return {
        "gpt2": ["--tokenizer", "gpt2", "--bpe-dir", assets["bpe_dir"]],
        "sentencepiece": ["--tokenizer", "sentencepiece", "--spm-vocab-size", "120"],
        "wordpiece": ["--tokenizer", "wordpiece", "--vocab", assets["vocab"]],
    }[tokenizer]


def run_main(task, folder, out, *extra, workers=1):
    argv = ["--task", task, "--input", folder, "--output", str(out), "--workers", str(workers), *extra]
    return glue.main(argv)


def load(data, split, regression=False, num_classes=2):
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    cfg = SentencePredictionConfig(
        data=str(data), num_classes=1 if regression else num_classes, init_token=0, separator_token=2, no_shuffle=True,
        regression_target=regression, classification_head_name="sentence_classification_head", seed=1,
    )
    task = SentencePredictionTask.setup_task(cfg)
    task.load_dataset(split)
    return task, task.datasets[split]


def decode_example(task, item, decoder, pair):
    """``<s> a </s> [</s> b </s>]`` -> (text a, text b or None)."""
    src = item["net_input.src_tokens"].tolist()
    assert src[0] == 0 and src[-1] == 2
    end_a = src.index(2, 1)
    d = task.source_dictionary
    a = decoder(d.string(src[1:end_a]).split())
    b = decoder(d.string(src[end_a + 2 : -1]).split()) if pair else None
    assert pair or end_a == len(src) - 1
    return a, b


def normalizer(tokenizer, out, assets):
    if tokenizer == "gpt2":
        return str.strip
    if tokenizer == "wordpiece":
        return lambda t: " ".join(basic_words(t, True))
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    return lambda t: sp.decode(sp.encode(t))


def decoder_for(tokenizer, out, assets=None):
    """The decoder of the tokenizer the output folder records (its own copies of the files)."""
    record = tokenization.read(str(out))
    assert record["kind"] == tokenizer
    return tokenization.build_decoder(record, str(out))


def stats_of(out):
    with open(os.path.join(out, "stats.json")) as f:
        return json.load(f)
