"""preprocess/glue.py: GLUE TSV folders -> fairseq binarized data that ``sentence_prediction`` loads.

Every task's format, every tokenizer, the stats and reader quirks, on tiny TSVs in the real formats
(tests/toy_glue.py); the slow test (``-m slow``) runs the real ../shared/glue RTE and CoLA. Bad input and
interrupted runs: test_preprocess_errors.py; the SCL paper's few-shot and label-noise sets:
test_scl_protocols.py.
"""
import json
import os
import shutil
from collections import Counter

import pytest

import helpers
from acl_fairseq.preprocessing.gpt2_files import write_local_gpt2_bpe
from acl_runtime import scl_protocols as scl
from acl_runtime import tokenization
from acl_runtime.tokenization import basic_words, detect_lowercase, load_vocab, vocab_is_uncased
from toy_glue import (
    ALL_TEXT,
    FORMATS,
    PAIR,
    decode_example,
    decoder_for,
    load,
    make_assets,
    make_task,
    make_wordpiece_vocab,
    normalizer,
    run_main,
    stats_of,
    tok_args,
)

# the real GLUE TSVs: ../shared/glue beside the checkout (override with GLUE_DIR)
GLUE_REAL = os.environ.get("GLUE_DIR", os.path.join(helpers.REPO, "..", "shared", "glue"))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


# ------------------------------------------------------------------ every task format loads in sentence_prediction


@pytest.mark.parametrize("task", list(FORMATS))
def test_every_task_loads_in_sentence_prediction(tmp_path, assets, task):
    folder, data = make_task(tmp_path, task)
    out = tmp_path / "bin"
    assert run_main(task, folder, out, *tok_args("wordpiece", assets)) == 0
    labels, files = FORMATS[task][:2]
    regression, pair = labels is None, task in PAIR
    dev_stems = [s for s in files if s.startswith("dev")]
    test_stems = [s for s in files if s.startswith("test")]
    norm, dec = normalizer("wordpiece", out, assets), decoder_for("wordpiece", out, assets)
    names = (["train"] + [scl.nth("valid", k) for k in range(len(dev_stems))]
             + [scl.nth("test", k) for k in range(len(test_stems))])
    for name, stem in zip(names, ["train"] + dev_stems + test_stems):
        t, ds = load(out, name, regression, num_classes=len(labels or (1,)))
        assert len(ds) == len(data[stem]), name
        item, (a, b, y) = ds[0], data[stem][0]
        assert decode_example(t, item, dec, pair) == (norm(a), norm(b) if pair else None)
        if name.startswith("test"):
            assert "target" not in item  # GLUE test labels are private: inputs only
        elif regression:
            assert item["target"] == pytest.approx([float(y) / 5.0], abs=1e-6)  # RawLabelDataset: a list
        else:
            assert t.label_dictionary[item["target"].item() + t.label_dictionary.nspecial] == y
    if regression:
        with open(out / "label" / "train.label") as f:
            assert ([float(x) for x in f.read().split()]
                    == pytest.approx([float(y) / 5 for _, _, y in data["train"]], abs=1e-6))


def test_mnli_valid1_is_dev_mismatched(tmp_path, assets):
    folder, data = make_task(tmp_path, "MNLI", n=(30, 9, 4))
    out = tmp_path / "bin"
    assert run_main("MNLI", folder, out, *tok_args("wordpiece", assets)) == 0
    for split in ("valid", "valid1", "test", "test1"):
        for field in ("input0", "input1"):
            assert (out / field / f"{split}.bin").exists()
    assert (out / "label" / "valid1.bin").exists() and not (out / "label" / "test.bin").exists()
    st = stats_of(out)
    assert st["splits"]["valid1"]["source"] == "dev_mismatched.tsv"
    assert st["splits"]["test1"]["source"] == "test_mismatched.tsv"
    t, ds = load(out, "valid1", num_classes=3)
    assert (decode_example(t, ds[0], decoder_for("wordpiece", out, assets), True)[1]
            == " ".join(basic_words(data["dev_mismatched"][0][1], True)))


# ------------------------------------------------------------------ tokenizers


@pytest.mark.parametrize("tokenizer", ["gpt2", "sentencepiece", "wordpiece"])
def test_tokenizer_roundtrip(tmp_path, assets, tokenizer):
    folder, data = make_task(tmp_path, "RTE", n=(40, 10, 5))
    assert run_main("RTE", folder, tmp_path / "bin", *tok_args(tokenizer, assets)) == 0
    text = (tmp_path / "bin" / "stats.json").read_text()
    assert str(tmp_path) not in text and not _abs_paths(json.loads(text))  # nothing ties the folder to its place
    out = tmp_path / "moved" / "RTE-bin"
    shutil.move(str(tmp_path / "bin"), str(out))
    record = stats_of(out)["tokenizer"]
    assert record == tokenization.make_record(tokenizer, {
        "gpt2": {"encoder_json": "encoder.json", "vocab_bpe": "vocab.bpe"}, "sentencepiece": {"model": "spm.model"},
        "wordpiece": {"vocab": "vocab.txt"}}[tokenizer], lowercase=tokenizer == "wordpiece")
    assert all(os.path.isfile(p) for p in tokenization.files_of(record, str(out)))  # copied into the folder
    norm, dec = normalizer(tokenizer, out, assets), decoder_for(tokenizer, out, assets)
    for split, stem in (("train", "train"), ("valid", "dev"), ("test", "test")):
        t, ds = load(out, split)
        for i in (0, 1, 4):
            a, b, _ = data[stem][i]
            assert decode_example(t, ds[i], dec, True) == (norm(a), norm(b))
    assert stats_of(out)["splits"]["train"]["unk_tokens"] == 0


def _abs_paths(value):
    if isinstance(value, dict):
        return [p for v in value.values() for p in _abs_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _abs_paths(v)]
    return [value] if isinstance(value, str) and os.path.isabs(value) else []


def test_gpt2_ids_are_fairseqs_bpe_ids(tmp_path, assets):
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    folder, data = make_task(tmp_path, "SST-2")
    out = tmp_path / "bin"
    assert run_main("SST-2", folder, out, *tok_args("gpt2", assets)) == 0
    bpe = get_encoder(os.path.join(assets["bpe_dir"], "encoder.json"), os.path.join(assets["bpe_dir"], "vocab.bpe"))
    t, ds = load(out, "train")
    for i, (a, _, _) in enumerate(data["train"]):
        # what multiprocessing_bpe_encoder.py + fairseq-preprocess --srcdict dict.txt produce
        expect = t.source_dictionary.encode_line(" ".join(map(str, bpe.encode(a.strip()))), append_eos=True,
                                                 add_if_not_exist=False)
        assert ds[i]["net_input.src_tokens"][1:].tolist() == expect.tolist()
    with open(out / "input0" / "dict.txt") as f, open(os.path.join(assets["bpe_dir"], "dict.txt")) as g:
        assert f.read() == g.read()  # the BPE dir's dict.txt, as RoBERTa needs
    for name in ("encoder.json", "vocab.bpe"):  # the folder carries its BPE files
        assert (out / name).read_bytes() == open(os.path.join(assets["bpe_dir"], name), "rb").read()
    tok = tokenization.build(stats_of(out)["tokenizer"], str(out))
    assert tok(data["train"][0][0].strip()) == [str(i) for i in bpe.encode(data["train"][0][0].strip())]


def test_gpt2_files_downloaded_when_missing(tmp_path, assets):
    folder, _ = make_task(tmp_path, "CoLA")
    empty = tmp_path / "fetched"
    url = "file://" + assets["bpe_dir"] + "/"
    assert run_main("CoLA", folder, tmp_path / "bin", "--tokenizer", "gpt2", "--bpe-dir", str(empty),
                    "--bpe-url", url) == 0
    assert sorted(os.listdir(empty)) == ["dict.txt", "encoder.json", "vocab.bpe"]


def test_local_gpt2_bpe_files_round_trip_through_fairseqs_gpt2_reader(tmp_path):
    """The tokenizers trainer's files as encoder.json / vocab.bpe: fairseq's reader skips only the '#version'
    header (every merge kept, in order), encodes as tokenizers does, and decodes back to the text."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    from tokenizers import ByteLevelBPETokenizer

    from acl_fairseq.preprocessing.gpt2_files import train_byte_level_bpe

    texts = [" ".join(ALL_TEXT)] * 3 + ALL_TEXT
    paths = write_local_gpt2_bpe(str(tmp_path), texts, num_merges=60)
    assert open(paths["vocab.bpe"], encoding="utf-8").readline().startswith("#version")
    bpe = get_encoder(paths["encoder.json"], paths["vocab.bpe"])
    encoder, merges = train_byte_level_bpe(texts, 60)
    assert len(merges) == 60 and list(bpe.bpe_ranks) == merges
    assert bpe.encoder == encoder and len(encoder) == 256 + 60
    ref = ByteLevelBPETokenizer(paths["encoder.json"], paths["vocab.bpe"])
    for text in ALL_TEXT + ["naïve Straße 中文 (what) -- where", "  two  spaces "]:
        ids = bpe.encode(text)
        assert ids == ref.encode(text).ids and bpe.decode(ids) == text, text
    assert sorted(int(line.split()[0]) for line in open(paths["dict.txt"])) == sorted(encoder.values())


def test_gpt2_offline_says_what_to_do(tmp_path, capsys):
    folder, _ = make_task(tmp_path, "CoLA")
    rc = run_main("CoLA", folder, tmp_path / "bin", "--tokenizer", "gpt2", "--bpe-dir", str(tmp_path / "b"),
                  "--bpe-url", "http://127.0.0.1:9/")
    err = capsys.readouterr().err
    assert rc == 2 and "download" in err and "--bpe-dir" in err and "encoder.json" in err
    assert os.listdir(tmp_path / "b") == [] and sorted(os.listdir(tmp_path)) == ["CoLA", "b"]  # no output, no temp


def test_wordpiece_matches_bert_semantics(tmp_path):
    make_wordpiece_vocab(str(tmp_path / "v.txt"), ALL_TEXT + ["straße 中文 x"])
    tokenize = tokenization.build(tokenization.make_record("wordpiece", {"vocab": "v.txt"}, True), str(tmp_path))
    assert tokenize("Playing, PLAYED!") == ["play", "##ing", ",", "play", "##ed", "!"]
    assert (tokenize("Naïve café\u200b\x00 中文 " + "x" * 101 + " zebra")
            == ["naive", "cafe", "中", "文", "[UNK]", "[UNK]"])
    assert tokenize("[CLS] a") == ["[UNK]", "c", "##l", "##s", "[UNK]", "a"]  # specials in the text are plain words
    import tokenizers  # a runtime dependency (requirements.txt)
    ref = tokenizers.BertWordPieceTokenizer(str(tmp_path / "v.txt"), lowercase=True)
    for text in ALL_TEXT + ["Playing, PLAYED!", "Naïve café\u200b 中文 " + "x" * 101, "don't (say) \"what\"--who?"]:
        assert tokenize(text) == ref.encode(text, add_special_tokens=False).tokens, text
    cased = tokenization.build(tokenization.make_record("wordpiece", {"vocab": "v.txt"}, False), str(tmp_path))
    assert cased("Naïve played") == ["[UNK]", "play", "##ed"]  # case and accents kept: not in this uncased vocab


def test_wordpiece_case_detected_from_vocab(tmp_path, assets):
    cased = make_wordpiece_vocab(str(tmp_path / "cased.txt"), ALL_TEXT, uncased=False)
    assert vocab_is_uncased(load_vocab(assets["vocab"])) and not vocab_is_uncased(load_vocab(cased))
    # uncased vocabularies keep symbols that str.isupper() calls upper case (MiniLM's has "ℝ")
    assert vocab_is_uncased({"[CLS]": 0, "ℝ": 1, "##ℝ": 2, "Σ": 3, "word": 4})
    cfg_dir = tmp_path / "hf"
    cfg_dir.mkdir()
    (cfg_dir / "vocab.txt").write_text("[CLS]\nWord\n")
    (cfg_dir / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    assert detect_lowercase(str(cfg_dir / "vocab.txt"), load_vocab(str(cfg_dir / "vocab.txt"))) is True
    folder, _ = make_task(tmp_path, "SST-2")
    assert run_main("SST-2", folder, tmp_path / "c", "--tokenizer", "wordpiece", "--vocab", cased) == 0
    assert stats_of(tmp_path / "c")["tokenizer"]["lowercase"] is False
    assert run_main("SST-2", folder, tmp_path / "u", "--tokenizer", "wordpiece", "--vocab", cased,
                    "--do-lower-case") == 0
    assert stats_of(tmp_path / "u")["tokenizer"]["lowercase"] is True


def test_wordpiece_with_converted_dict(tmp_path, assets):
    """An acl-convert-hf style dict.txt (BERT's specials left to fairseq's <s> <pad> </s> <unk>)."""
    words = [w for w in load_vocab(assets["vocab"]) if not w.startswith("[")]
    srcdict = tmp_path / "dict.txt"
    srcdict.write_text("".join(f"{w} 1\n" for w in reversed(words)))
    folder, data = make_task(tmp_path, "RTE")
    out = tmp_path / "bin"
    assert run_main("RTE", folder, out, *tok_args("wordpiece", assets), "--srcdict", str(srcdict)) == 0
    assert (out / "input0" / "dict.txt").read_text() == srcdict.read_text()
    t, ds = load(out, "train")
    assert (decode_example(t, ds[1], decoder_for("wordpiece", out, assets), True)[0]
            == " ".join(basic_words(data["train"][1][0], True)))


@pytest.mark.parametrize("dict_from", ["vocab", "train"])
def test_sentencepiece_dict_sources(tmp_path, dict_from):
    folder, _ = make_task(tmp_path, "MRPC", n=(40, 8, 4))
    out = tmp_path / "bin"
    assert run_main("MRPC", folder, out, "--tokenizer", "sentencepiece", "--spm-vocab-size", "100",
                    "--dict-from", dict_from) == 0
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    symbols = [line.split()[0] for line in (out / "input0" / "dict.txt").read_text().splitlines()]
    if dict_from == "vocab":
        assert symbols == [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                           if not (sp.is_control(i) or sp.is_unknown(i))]
    else:
        assert (len(symbols) + 4) % 8 == 0  # fairseq-built: with its 4 specials, padded to a multiple of 8
    out2 = tmp_path / "bin2"  # reuse the trained model: same ids
    assert run_main("MRPC", folder, out2, "--tokenizer", "sentencepiece", "--spm-model", str(out / "spm.model"),
                    "--dict-from", dict_from) == 0
    assert (out / "input0" / "train.bin").read_bytes() == (out2 / "input0" / "train.bin").read_bytes()


def test_two_workers_give_identical_output(tmp_path, assets):
    folder, _ = make_task(tmp_path, "QNLI", n=(1200, 30, 10))
    for w in (1, 2):
        assert run_main("QNLI", folder, tmp_path / f"w{w}", *tok_args("gpt2", assets), workers=w) == 0
    for rel in ("input0/train.bin", "input1/train.idx", "input1/valid.bin", "label/train.bin", "label/dict.txt"):
        assert (tmp_path / "w1" / rel).read_bytes() == (tmp_path / "w2" / rel).read_bytes(), rel


# ------------------------------------------------------------------ quirks, stats


def test_stats_file(tmp_path, assets):
    folder, data = make_task(tmp_path, "SST-2", n=(30, 10, 5), weights=(2, 1))
    out = tmp_path / "bin"
    assert run_main("SST-2", folder, out, *tok_args("wordpiece", assets), "--max-positions", "10") == 0
    st = stats_of(out)
    assert st["task"] == "SST-2" and st["max_positions"] == 10 and st["splits"]["train"]["over_max_positions"] > 0
    counts = Counter(y for _, _, y in data["train"])
    # by frequency
    assert st["label_dictionary"] == [y for y, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    for split, stem in (("train", "train"), ("valid", "dev"), ("test", "test")):
        s = st["splits"][split]
        _, ds = load(out, split)
        lengths = sorted(len(ds[i]["net_input.src_tokens"]) for i in range(len(ds)))
        assert s["examples"] == len(data[stem]) and s["length_tokens"]["max"] == lengths[-1]
        assert s["over_max_positions"] == sum(n > 10 for n in lengths)
        assert set(s["length_tokens"]) == {"p50", "p90", "p95", "p99", "max"}
        assert s.get("label_counts") == (dict(Counter(y for _, _, y in data[stem])) if split != "test" else None)


def test_qqp_malformed_rows_filtered_and_counted(tmp_path, assets):
    folder, data = make_task(tmp_path, "QQP", n=(20, 6, 3))
    with open(os.path.join(folder, "train.tsv"), "a") as f:
        f.write("99\t1\t2\tquestion without answer\n" "100\t1\t2\ta\tb\t1\textra\n")
    out = tmp_path / "bin"
    assert run_main("QQP", folder, out, *tok_args("wordpiece", assets)) == 0
    st = stats_of(out)
    assert st["filtered_malformed_rows"]["train.tsv"] == 2 and st["filtered_malformed_rows"]["dev.tsv"] == 0
    assert st["splits"]["train"]["examples"] == 20


def test_reader_quirks(tmp_path):
    from acl_runtime.glue_tasks import TASKS, read_split

    d = tmp_path / "t"
    d.mkdir()
    (d / "train.tsv").write_bytes(b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"
                                  b"1\t1\t2\t\"a \"\"b\t c\"\r\n\n")
    s = read_split(str(d), "train", TASKS["MRPC"], "train")
    assert [e.texts for e in s.examples] == [('"a ""b', 'c"')] and s.examples[0].line == 2  # BOM, CRLF, quotes kept
    (d / "dev.tsv").write_text("gj04\t1\t\tA \u2028line sep\ngj04\t0\t*\tlast")  # no final newline
    assert ([e.texts[0] for e in read_split(str(d), "dev", TASKS["CoLA"], "dev").examples]
            == ["A \u2028line sep", "last"])


# ------------------------------------------------------------------ real data (slow)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(GLUE_REAL), reason=helpers.NO_REAL_GLUE)
def test_real_rte_and_cola(tmp_path):
    rte = tmp_path / "RTE-bin"
    assert run_main("RTE", f"{GLUE_REAL}/RTE", rte, "--tokenizer", "sentencepiece", "--spm-vocab-size", "4000",
                    workers=2) == 0
    st = stats_of(rte)
    assert {k: v["examples"] for k, v in st["splits"].items()} == {"train": 2490, "valid": 277, "test": 3000}
    assert st["splits"]["train"]["unk_tokens"] == 0
    t, ds = load(rte, "valid")
    dec = decoder_for("sentencepiece", rte)
    assert decode_example(t, ds[0], dec, True)[1] == "Christopher Reeve had an accident."
    assert t.label_dictionary[ds[0]["target"].item() + 4] == "not_entailment"

    with open(f"{GLUE_REAL}/CoLA/train.tsv", encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t")[3] for line in f]
    vocab = make_wordpiece_vocab(str(tmp_path / "vocab.txt"), texts, uncased=False)
    cola = tmp_path / "CoLA-bin"
    assert run_main("CoLA", f"{GLUE_REAL}/CoLA", cola, "--tokenizer", "wordpiece", "--vocab", vocab, workers=2) == 0
    st = stats_of(cola)
    assert {k: v["examples"] for k, v in st["splits"].items()} == {"train": 8551, "valid": 1043, "test": 1063}
    t, ds = load(cola, "valid")
    dec = decoder_for("wordpiece", cola)
    # no final newline
    assert decode_example(t, ds[len(ds) - 1], dec, False)[0] == "John talked to Bill about himself ."

    few = tmp_path / "RTE-few"
    assert run_main("RTE", f"{GLUE_REAL}/RTE", few, "--tokenizer", "sentencepiece",
                    "--spm-model", str(rte / "spm.model"), "--few-shot", "100", "--label-noise", "0.1", "--seed", "3",
                    workers=2) == 0
    st = stats_of(few)
    assert {k: v["examples"] for k, v in st["splits"].items()} == {"train": 100, "valid": 139, "test": 138}
    assert st["protocol"]["label_noise"]["changed"] == 10


def test_the_regression_scale_is_the_task_rows(tmp_path, assets, monkeypatch):
    """STS-B's labels are divided by its row's regression_scale (5), not by a literal: edit the row, and the
    binarized labels and stats.json follow it."""
    from acl_runtime import glue_tasks

    rows = open(glue_tasks.TABLE).read().replace("\tpearson,spearman\t5\tSTS-B.tsv", "\tpearson,spearman\t4\tSTS-B.tsv")
    table = tmp_path / "tasks.tsv"
    table.write_text(rows)
    monkeypatch.setattr(glue_tasks, "TABLE", str(table))
    folder, data = make_task(tmp_path, "STS-B")
    out = tmp_path / "bin"
    assert run_main("STS-B", folder, out, *tok_args("wordpiece", assets)) == 0
    with open(out / "label" / "train.label") as f:
        assert [float(x) for x in f.read().split()] == pytest.approx([float(y) / 4 for _, _, y in data["train"]],
                                                                     abs=1e-6)
    assert stats_of(out)["labels"] == "regression: label/<split>.label holds score / 4"
