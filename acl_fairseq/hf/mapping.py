"""Reading a Hugging Face BERT or RoBERTa folder and mapping it onto fairseq RoBERTa, per encoder family.

:mod:`acl_fairseq.hf.convert` (``acl-convert-hf``) builds and writes the checkpoint from what this returns:
the checked ``config.json``, the weights, the vocabulary in fairseq's dictionary order, the architecture
flags and the fairseq state dict. An HF parameter that has no place in fairseq RoBERTa is refused, except
the buffers and task heads of ``IGNORED_PREFIXES``. How the two models line up:

- Dictionary. fairseq puts ``<s> <pad> </s> <unk>`` first (BERT's [CLS] [PAD] [SEP] [UNK]), then
  dict.txt in file order, then ``<mask>`` (appended by the task when it loads dict.txt; BERT's
  [MASK]). Embedding rows are permuted to that order. dict.txt holds WordPiece strings for BERT (what
  fairseq's ``--bpe bert --bpe-vocab-file OUT_DIR/vocab.txt`` emits) and the HF ids as strings for
  RoBERTa (what ``--bpe hf_byte_bpe --bpe-vocab OUT_DIR/vocab.json --bpe-merges OUT_DIR/merges.txt``
  emits), so no GPT-2 ``encoder.json`` / fairseq ``dict.txt`` is needed.
- Positions. fairseq's learned positions start at padding_idx + 1 = 2 (table of max_positions + 2
  rows); BERT's start at 0, HF RoBERTa's at pad_token_id + 1. Token type 0 is folded into every
  position row; BERT's type 1 becomes the parameter ``segment_delta`` (row 1 - row 0), added by the
  model after the first ``</s>``. Pairs are ``<s> A </s> B </s>`` for BERT
  (:func:`acl_runtime.conventions.input_layout`).
- LayerNorm eps is 1e-5 in fairseq (BERT: 1e-12); this is the only numerical difference.
"""
import json
import os
import shutil
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from acl_runtime.io import atomic

if TYPE_CHECKING:
    import torch

SUPPORTED_MODEL_TYPES = ("bert", "roberta")
# HF hidden_act -> fairseq --activation-fn (HF's gelu_new/gelu_fast/gelu_pytorch_tanh are all the tanh form)
ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "tanh": "tanh",
    "gelu_new": "gelu_accurate",
    "gelu_fast": "gelu_accurate",
    "gelu_pytorch_tanh": "gelu_accurate",
}
ROLES = ("cls_token", "pad_token", "sep_token", "unk_token", "mask_token")
DEFAULT_SPECIALS = {  # role -> token, overridden by special_tokens_map.json / tokenizer_config.json
    "bert": dict(zip(ROLES, ["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"])),
    "roberta": dict(zip(ROLES, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])),
}
FAIRSEQ_SPECIAL_ROLES = ROLES[:4]  # become <s> <pad> </s> <unk>, fairseq indices 0-3
TOKENIZER_FILES = {
    "bert": ["vocab.txt"],
    "roberta": ["vocab.json", "merges.txt"],
}
# HF encoder layer module -> fairseq encoder layer module (each with .weight and .bias); acl-export reads it backwards
LAYER_MODULES = (("attention.self.query", "self_attn.q_proj"), ("attention.self.key", "self_attn.k_proj"),
                 ("attention.self.value", "self_attn.v_proj"), ("attention.output.dense", "self_attn.out_proj"),
                 ("attention.output.LayerNorm", "self_attn_layer_norm"), ("intermediate.dense", "fc1"),
                 ("output.dense", "fc2"), ("output.LayerNorm", "final_layer_norm"))
# HF parameters with no fairseq counterpart: buffers and task heads (the pooler is handled apart)
IGNORED_PREFIXES = ("embeddings.position_ids", "embeddings.token_type_ids", "cls.seq_relationship.",
                    "classifier.", "qa_outputs.", "cls.predictions.decoder.", "lm_head.decoder.")


class UnsupportedCheckpointError(ValueError):
    """The HF checkpoint is not an encoder this converter can map exactly onto fairseq RoBERTa."""


def read_config(hf_dir: str) -> dict:
    """config.json, checked for the variants fairseq's post-norm ``roberta`` arch can represent."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise UnsupportedCheckpointError(f"{path} not found: HF_DIR must be a Hugging Face model folder")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    return check_config(config)


def check_config(config: dict) -> dict:
    """``config`` (an encoder's config.json, as a dict) if fairseq's post-norm ``roberta`` arch can represent it,
    else an :class:`UnsupportedCheckpointError` naming the variant."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        prenorm = "prelayernorm" in str(model_type)
        hint = " (a pre-LayerNorm variant; fairseq's roberta arch is post-norm)" if prenorm else ""
        raise UnsupportedCheckpointError(
            f"config.json model_type {model_type!r}{hint} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
        )
    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise UnsupportedCheckpointError(
            f"position_embedding_type {position_type!r} (relative position embeddings) is not supported: "
            "fairseq roberta has absolute learned positions only"
        )
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise UnsupportedCheckpointError("decoder / cross-attention checkpoints are not supported (encoder only)")
    if config.get("hidden_act", "gelu") not in ACTIVATIONS:
        raise UnsupportedCheckpointError(
            f"hidden_act {config.get('hidden_act')!r} is not supported; expected one of {sorted(ACTIVATIONS)}"
        )
    if config["hidden_size"] % config["num_attention_heads"]:
        raise UnsupportedCheckpointError("hidden_size is not a multiple of num_attention_heads")
    if config.get("type_vocab_size", 2) not in (1, 2):
        raise UnsupportedCheckpointError(
            f"type_vocab_size {config.get('type_vocab_size')} is not supported: BERT's sentence pairs use 2 token "
            "types (1 for single-segment encoders); the model holds one segment embedding for the second sentence"
        )
    return config


def load_hf_state_dict(hf_dir: str, model_type: str) -> Dict[str, "torch.Tensor"]:
    """The checkpoint's tensors (safetensors or pytorch_model.bin, sharded or not), with the
    ``bert.`` / ``roberta.`` prefix of task models removed and old gamma/beta names renamed. A pickle
    ``pytorch_model.bin`` goes through the package's one safe loader (:func:`checkpoint_safety.load`): a
    damaged file or a refused global is a one-line :class:`~acl_fairseq.checkpoint_safety.CheckpointError`."""
    from acl_fairseq import checkpoint_safety

    files = weight_files(hf_dir)
    sd = {}
    for path in files:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            sd.update(load_file(path))
        else:
            sd.update(checkpoint_safety.load(path))
    out = {}
    for k, v in sd.items():
        k = k[len(model_type) + 1:] if k.startswith(model_type + ".") else k
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k] = v
    return out


def weight_files(hf_dir: str) -> List[str]:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(hf_dir, name)):
            return [os.path.join(hf_dir, name)]
        index = os.path.join(hf_dir, name + ".index.json")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            return [_shard_path(hf_dir, index, s) for s in shards]
    raise UnsupportedCheckpointError(
        f"no weights in {hf_dir}: expected model.safetensors or pytorch_model.bin (or a sharded *.index.json)"
    )


def _shard_path(hf_dir: str, index: str, entry) -> str:
    """The file of one ``weight_map`` entry of a shard index, which must name a file of ``hf_dir``: an absolute
    path or ``..`` would load weights the folder does not hold. (Links are followed: the HF hub cache links each
    file of a snapshot folder to its blob outside it.)"""
    name = os.path.normpath(entry) if isinstance(entry, str) and entry else ""
    if not name or os.path.isabs(name) or name == os.curdir or name.split(os.sep)[0] == os.pardir:
        raise UnsupportedCheckpointError(
            f"{index}: the shard entry {entry!r} is not a file inside {hf_dir} (an absolute path or '..'): a shard "
            "index names files of its own folder; fix the index or download the model again")
    return os.path.join(hf_dir, name)


def read_vocab(hf_dir: str, model_type: str) -> Tuple[List[str], Dict[str, int]]:
    """``(words, specials)``: ``words[i]`` is the dict.txt word of HF id i, ``specials`` maps the roles
    of :data:`DEFAULT_SPECIALS` to HF ids."""
    for name in TOKENIZER_FILES[model_type]:
        if not os.path.isfile(os.path.join(hf_dir, name)):
            raise UnsupportedCheckpointError(
                f"{name} not found in {hf_dir}: a {model_type} checkpoint needs {TOKENIZER_FILES[model_type]}"
            )
    if model_type == "bert":
        with open(os.path.join(hf_dir, "vocab.txt"), encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]  # as transformers' load_vocab
        words = tokens
    else:
        with open(os.path.join(hf_dir, "vocab.json"), encoding="utf-8") as f:
            ids = json.load(f)
        if sorted(ids.values()) != list(range(len(ids))):
            raise UnsupportedCheckpointError("vocab.json ids are not 0..n-1 without gaps")
        tokens = sorted(ids, key=ids.get)
        words = [str(i) for i in range(len(tokens))]  # what fairseq's hf_byte_bpe emits
    index = {}
    for i, t in enumerate(tokens):
        if t in index:
            raise UnsupportedCheckpointError(f"token {t!r} appears twice in the vocabulary (ids {index[t]}, {i})")
        index[t] = i
    specials = {}
    for role, token in _special_tokens(hf_dir, model_type).items():
        if token not in index:
            raise UnsupportedCheckpointError(f"{role} {token!r} is not in the vocabulary")
        specials[role] = index[token]
    return words, specials


def _special_tokens(hf_dir: str, model_type: str) -> Dict[str, str]:
    out = dict(DEFAULT_SPECIALS[model_type])
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # the latter wins, as in transformers
        path = os.path.join(hf_dir, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                conf = json.load(f)
            for role in out:
                value = conf.get(role)
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str):
                    out[role] = value
    return out


def fairseq_order(words: List[str], specials: Dict[str, int]) -> Tuple[List[str], List[int]]:
    """``(dict_words, hf_ids)``: the dict.txt words in file order, and the HF id behind each row of
    the fairseq embedding (``<s> <pad> </s> <unk>``, dict.txt, ``<mask>``)."""
    from fairseq.data import Dictionary

    reserved = set(Dictionary().symbols) | {"<mask>"}
    first = [specials[r] for r in FAIRSEQ_SPECIAL_ROLES]
    taken = set(first) | {specials["mask_token"]}
    if len(taken) != len(FAIRSEQ_SPECIAL_ROLES) + 1:
        raise UnsupportedCheckpointError(f"special tokens share ids: {specials}")
    dict_ids = [i for i in range(len(words)) if i not in taken]
    for i in dict_ids:
        w = words[i]
        if w in reserved or not w or w.split() != [w]:
            raise UnsupportedCheckpointError(
                f"vocabulary entry {w!r} (id {i}) cannot be a dict.txt word: empty, holds whitespace or "
                f"is one of fairseq's reserved {sorted(reserved)}"
            )
    return [words[i] for i in dict_ids], first + dict_ids + [specials["mask_token"]]


def model_args(config: dict) -> List[str]:
    """fairseq-train architecture flags for this encoder (everything else keeps roberta's defaults)."""
    args = [
        "--encoder-layers", str(config["num_hidden_layers"]),
        "--encoder-embed-dim", str(config["hidden_size"]),
        "--encoder-ffn-embed-dim", str(config["intermediate_size"]),
        "--encoder-attention-heads", str(config["num_attention_heads"]),
        "--max-positions", str(config["max_position_embeddings"] - _position_offset(config)),
    ]
    activation = ACTIVATIONS[config.get("hidden_act", "gelu")]
    return args + (["--activation-fn", activation] if activation != "gelu" else [])


def _position_offset(config: dict) -> int:
    """Row of the HF position table used by the first token (HF RoBERTa counts from pad + 1)."""
    return config.get("pad_token_id", 1) + 1 if config["model_type"] == "roberta" else 0


def _positions(hf: Dict, config: dict, se: str) -> Dict:
    """fairseq's position table (and ``segment_delta`` where segments are kept), taken out of ``hf``: fairseq row
    padding_idx + 1 + i <- HF row offset + i, plus token type 0 (no segments in fairseq)."""
    if "embeddings.position_embeddings.weight" not in hf:
        raise UnsupportedCheckpointError(
            "the checkpoint has no absolute position embeddings (embeddings.position_embeddings.weight): "
            "fairseq roberta needs a learned absolute position table"
        )
    out = {}
    hf_pos = hf.pop("embeddings.position_embeddings.weight")
    start, n = _position_offset(config), hf_pos.size(0) - _position_offset(config)
    pos = hf_pos.new_zeros(n + 2, hf_pos.size(1))
    pos[2:] = hf_pos[start:]
    token_type = hf.pop("embeddings.token_type_embeddings.weight", None)
    if token_type is not None:
        pos[2:] += token_type[0]
        if has_segment(config):
            out["segment_delta"] = token_type[1] - token_type[0]
    out[se + "embed_positions.weight"] = pos
    return out


def map_state_dict(hf: Dict, config: dict, hf_ids: List[int]) -> Tuple[Dict, Optional[Dict]]:
    """``(fairseq encoder state dict, pooler or None)``; raises on HF parameters it cannot place."""
    import torch

    hf = dict(hf)
    take = hf.pop
    se = "encoder.sentence_encoder."
    rows = torch.tensor(hf_ids)
    word = hf["embeddings.word_embeddings.weight"]
    if int(rows.max()) >= word.size(0):
        raise UnsupportedCheckpointError(
            f"vocabulary ({max(hf_ids) + 1} ids) is larger than the embedding ({word.size(0)} rows)"
        )
    out = {se + "embed_tokens.weight": take("embeddings.word_embeddings.weight")[rows]}

    out.update(_positions(hf, config, se))
    _move(hf, out, "embeddings.LayerNorm", se + "layernorm_embedding")

    for i in range(config["num_hidden_layers"]):
        src, dst = f"encoder.layer.{i}.", f"{se}layers.{i}."
        for a, b in LAYER_MODULES:
            _move(hf, out, src + a, dst + b)

    # masked-LM head, when the checkpoint has one (its decoder weight is tied to the embeddings)
    for prefix, dense, norm in [("cls.predictions.", "transform.dense", "transform.LayerNorm"),
                                ("lm_head.", "dense", "layer_norm")]:
        if prefix + "bias" in hf:
            _move(hf, out, prefix + dense, "encoder.lm_head.dense")
            _move(hf, out, prefix + norm, "encoder.lm_head.layer_norm")
            out["encoder.lm_head.bias"] = take(prefix + "bias")[rows]

    pooler = None
    if "pooler.dense.weight" in hf:
        pooler = {"dense.weight": take("pooler.dense.weight"), "dense.bias": take("pooler.dense.bias")}
    leftover = [k for k in hf if not k.startswith(IGNORED_PREFIXES)]
    if leftover:
        raise UnsupportedCheckpointError(f"HF parameters with no place in fairseq roberta: {leftover[:8]}")
    return out, pooler


def classifier_head(hf: Dict, model_type: str) -> Optional[Dict]:
    """A sequence classifier's head as fairseq's classification head (``dense.*``, ``out_proj.*``), or None.

    BERT: the pooler (dense + tanh) then ``classifier``; RoBERTa: ``classifier.dense`` (+ tanh) then
    ``classifier.out_proj``: both are fairseq's dropout, dense, tanh, dropout, out_proj on the first token."""
    names = {"bert": {"dense": "pooler.dense", "out_proj": "classifier"},
             "roberta": {"dense": "classifier.dense", "out_proj": "classifier.out_proj"}}[model_type]
    keys = {f"{a}.{p}": f"{b}.{p}" for a, b in names.items() for p in ("weight", "bias")}
    if not all(k in hf for k in keys.values()):
        return None
    return {ours: hf[theirs] for ours, theirs in keys.items()}


def has_segment(config: dict) -> bool:
    """BERT with two token types; RoBERTa never uses a second type (its tokenizer gives none)."""
    return config["model_type"] == "bert" and config.get("type_vocab_size", 2) == 2


def head_dropout(config: dict) -> Optional[float]:
    """The dropout HF's sequence classifiers put before their head: classifier_dropout, else hidden."""
    value = config.get("classifier_dropout")
    return float(value if value is not None else config.get("hidden_dropout_prob", 0.1))


def _move(hf: Dict, out: Dict, src: str, dst: str) -> None:
    for p in ("weight", "bias"):
        out[f"{dst}.{p}"] = hf.pop(f"{src}.{p}")


def tokenizer_folder(folder: str, kind: str, out: str) -> str:
    """A folder with the tokenizer files acl-convert-hf reads for ``kind`` (:data:`TOKENIZER_FILES`):
    ``folder`` itself when it holds them, else ``out``, where they are written from the folder's ``tokenizer.json``
    (what transformers 5 saves alone), beside a copy of its tokenizer_config.json and special_tokens_map.json."""
    if all(os.path.isfile(os.path.join(folder, n)) for n in TOKENIZER_FILES[kind]):
        return folder
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise UnsupportedCheckpointError(f"{folder} holds neither {' nor '.join(TOKENIZER_FILES[kind])} nor "
                                         "tokenizer.json: save the tokenizer with the model (acl-train-hf does)")
    with open(path, encoding="utf-8") as f:
        tokenizer = json.load(f)
    model = tokenizer["model"]
    wants = {"bert": "WordPiece", "roberta": "BPE"}[kind]
    if model.get("type") != wants:
        raise UnsupportedCheckpointError(f"{path}: a {model.get('type')} tokenizer; a {kind} encoder's is {wants}")
    vocab = model["vocab"]
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise UnsupportedCheckpointError(f"{path}: the vocabulary's ids are not 0..{len(vocab) - 1} without gaps")
    os.makedirs(out)
    if os.path.isfile(os.path.join(folder, "special_tokens_map.json")):
        shutil.copyfile(os.path.join(folder, "special_tokens_map.json"), os.path.join(out, "special_tokens_map.json"))
    settings = {}
    if os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            settings = json.load(f)
    if kind == "bert":
        atomic.write_text(os.path.join(out, "vocab.txt"), "".join(t + "\n" for t in sorted(vocab, key=vocab.get)))
        normalizer = tokenizer.get("normalizer") or {}
        if normalizer.get("type") == "BertNormalizer":  # the casing the tokenizer ran with, whatever the config says
            settings["do_lower_case"] = bool(normalizer.get("lowercase", True))
    else:
        atomic.write_json(os.path.join(out, "vocab.json"), vocab)
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        atomic.write_text(os.path.join(out, "merges.txt"), "".join(m + "\n" for m in ["#version: 0.2"] + merges))
    atomic.write_json(os.path.join(out, "tokenizer_config.json"), settings)
    return out
