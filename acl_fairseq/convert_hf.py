"""Import a Hugging Face BERT or RoBERTa encoder into fairseq RoBERTa format, offline.

    acl-convert-hf HF_DIR OUT_DIR [--num-classes N]      (or python -m acl_fairseq.convert_hf)

writes ``OUT_DIR/model.pt`` (a fairseq checkpoint for ``--restore-file``), ``dict.txt``,
``model_args.txt`` (the fairseq-train architecture flags, one line), ``conventions.json`` (the input
conventions of the encoder family, :mod:`acl_fairseq.conventions`: pass ``--conventions OUT_DIR``) and
copies of the tokenizer files. A BERT (type_vocab_size 2) restores only into ``multi_exit_roberta``
(with ``--exit-layers N`` it is a single-exit classifier), which holds its segment embedding; fairseq's
``roberta`` has none and refuses the file rather than drop it. How the two models line up:

- Dictionary. fairseq puts ``<s> <pad> </s> <unk>`` first (BERT's [CLS] [PAD] [SEP] [UNK]), then
  dict.txt in file order, then ``<mask>`` (appended by the task when it loads dict.txt; BERT's
  [MASK]). Embedding rows are permuted to that order. dict.txt holds WordPiece strings for BERT (what
  fairseq's ``--bpe bert --bpe-vocab-file OUT_DIR/vocab.txt`` emits) and the HF ids as strings for
  RoBERTa (what ``--bpe hf_byte_bpe --bpe-vocab OUT_DIR/vocab.json --bpe-merges OUT_DIR/merges.txt``
  emits), so no GPT-2 ``encoder.json`` / fairseq ``dict.txt`` is needed.
- Positions. fairseq's learned positions start at padding_idx + 1 = 2 (table of max_positions + 2
  rows); BERT's start at 0, HF RoBERTa's at pad_token_id + 1. Token type 0 is folded into every
  position row; BERT's type 1 becomes the parameter ``segment_delta`` (row 1 - row 0), added by the
  model after the first ``</s>``. Pairs are ``<s> A </s> B </s>`` for BERT (no ``--separator-token``).
- LayerNorm eps is 1e-5 in fairseq (BERT: 1e-12); this is the only numerical difference.
- Pooler. BERT's pooler (dense + tanh) equals the dense layer of fairseq's classification head
  (dropout, dense, ``--pooler-activation-fn tanh``, dropout, out_proj). It is always stored beside
  the model, under the checkpoint key ``"hf_pooler"`` (fairseq ignores that key). With
  ``--num-classes N`` it also becomes the dense layer of a head ``--classification-head-name``
  (with a fresh out_proj) inside the model: a run with the same name and N keeps it; fairseq deletes
  (with a warning) a stored head whose size or name does not match, so the file restores either way.
  ``multi_exit_roberta`` gives its last exit the plain head name, so that exit gets the pooler.
"""
import argparse
import json
import logging
import os
import shutil
import sys
import warnings
from typing import Dict, List, Optional, Tuple

from acl_fairseq import conventions, tokenization

logger = logging.getLogger(__name__)

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
OPTIONAL_TOKENIZER_FILES = ["tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"]
# HF parameters with no fairseq counterpart: buffers and task heads (the pooler is handled apart)
IGNORED_PREFIXES = ("embeddings.position_ids", "embeddings.token_type_ids", "cls.seq_relationship.",
                    "classifier.", "qa_outputs.", "cls.predictions.decoder.", "lm_head.decoder.")
POOLER_KEY = "hf_pooler"
FRESH_BUFFER = "encoder.sentence_encoder.version"  # a buffer fairseq fills itself


class UnsupportedCheckpointError(ValueError):
    """The HF checkpoint is not an encoder this converter can map exactly onto fairseq RoBERTa."""


def read_config(hf_dir: str) -> dict:
    """config.json, checked for the variants fairseq's post-norm ``roberta`` arch can represent."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise UnsupportedCheckpointError(f"{path} not found: HF_DIR must be a Hugging Face model folder")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
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
    ``bert.`` / ``roberta.`` prefix of task models removed and old gamma/beta names renamed."""
    import torch

    files = _weight_files(hf_dir)
    sd = {}
    for path in files:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            sd.update(load_file(path))
        else:
            sd.update(torch.load(path, map_location="cpu", weights_only=True))
    out = {}
    for k, v in sd.items():
        k = k[len(model_type) + 1:] if k.startswith(model_type + ".") else k
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k] = v
    return out


def _weight_files(hf_dir: str) -> List[str]:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(hf_dir, name)):
            return [os.path.join(hf_dir, name)]
        index = os.path.join(hf_dir, name + ".index.json")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            return [os.path.join(hf_dir, s) for s in shards]
    raise UnsupportedCheckpointError(
        f"no weights in {hf_dir}: expected model.safetensors or pytorch_model.bin (or a sharded *.index.json)"
    )


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

    # fairseq row padding_idx + 1 + i <- HF row offset + i, plus token type 0 (no segments in fairseq)
    if "embeddings.position_embeddings.weight" not in hf:
        raise UnsupportedCheckpointError(
            "the checkpoint has no absolute position embeddings (embeddings.position_embeddings.weight): "
            "fairseq roberta needs a learned absolute position table"
        )
    hf_pos = take("embeddings.position_embeddings.weight")
    start, n = _position_offset(config), hf_pos.size(0) - _position_offset(config)
    pos = hf_pos.new_zeros(n + 2, hf_pos.size(1))
    pos[2:] = hf_pos[start:]
    token_type = hf.pop("embeddings.token_type_embeddings.weight", None)
    if token_type is not None:
        pos[2:] += token_type[0]
        if has_segment(config):
            out["segment_delta"] = token_type[1] - token_type[0]
    out[se + "embed_positions.weight"] = pos
    _move(hf, out, "embeddings.LayerNorm", se + "layernorm_embedding")

    for i in range(config["num_hidden_layers"]):
        src, dst = f"encoder.layer.{i}.", f"{se}layers.{i}."
        for a, b in [("attention.self.query", "self_attn.q_proj"), ("attention.self.key", "self_attn.k_proj"),
                     ("attention.self.value", "self_attn.v_proj"), ("attention.output.dense", "self_attn.out_proj"),
                     ("attention.output.LayerNorm", "self_attn_layer_norm"), ("intermediate.dense", "fc1"),
                     ("output.dense", "fc2"), ("output.LayerNorm", "final_layer_norm")]:
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


def has_segment(config: dict) -> bool:
    """BERT with two token types; RoBERTa never uses a second type (its tokenizer gives none)."""
    return config["model_type"] == "bert" and config.get("type_vocab_size", 2) == 2


def head_dropout(config: dict) -> Optional[float]:
    """The dropout HF's sequence classifiers put before their head: classifier_dropout, else hidden."""
    value = config.get("classifier_dropout")
    return float(value if value is not None else config.get("hidden_dropout_prob", 0.1))


def make_conventions(config: dict, hf_dir: str, dict_sha256: str) -> dict:
    """The :mod:`acl_fairseq.conventions` record of this encoder."""
    if config["model_type"] == "bert":
        lowercase = True  # transformers' BertTokenizer default
        path = os.path.join(hf_dir, "tokenizer_config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                lowercase = bool(json.load(f).get("do_lower_case", True))
        tokenizer = tokenization.make_record("wordpiece", {"vocab": "vocab.txt"}, lowercase)
    else:
        tokenizer = tokenization.make_record("hf_byte_bpe", {"vocab": "vocab.json", "merges": "merges.txt"})
    return conventions.validate({
        "schema": conventions.SCHEMA, "family": config["model_type"],
        "pair_format": "single" if config["model_type"] == "bert" else "double",
        "segment_embedding": has_segment(config), "head_dropout": head_dropout(config),
        "tokenizer": tokenizer, "dictionary_sha256": dict_sha256,
    })


def hub_bpe(tokenizer: dict) -> dict:
    """``cfg.bpe`` of the checkpoint: what fairseq's hub (``RobertaModel.from_pretrained(OUT, "model.pt",
    OUT)``) tokenizes with, offline. File names are kept relative to the data folder through the
    unresolved ``${task.data}``, which the hub sets to the folder it loads from, so the folder can move."""
    if tokenizer["kind"] == "wordpiece":  # acl_fairseq.bpe: the same implementation preprocessing uses
        return {"_name": "acl_wordpiece", "wordpiece_vocab": tokenizer["files"]["vocab"],
                "wordpiece_cased": not tokenizer["lowercase"], "data": "${task.data}"}
    return {"_name": "hf_byte_bpe", "bpe_vocab": "${task.data}/" + tokenizer["files"]["vocab"],
            "bpe_merges": "${task.data}/" + tokenizer["files"]["merges"], "bpe_add_prefix_space": False}


def _move(hf: Dict, out: Dict, src: str, dst: str) -> None:
    for p in ("weight", "bias"):
        out[f"{dst}.{p}"] = hf.pop(f"{src}.{p}")


def build_checkpoint(config, flags, dict_words, encoder_sd, pooler, num_classes, head_name, seed,
                     record: dict) -> Dict:
    """A fairseq checkpoint dict. The fairseq model is built here and loaded strictly, so the file is
    known to restore; parameters the HF checkpoint lacks (the LM head, a new out_proj) keep
    fairseq's own initialisation under ``seed``. A BERT with a segment embedding is built as a
    single-exit ``multi_exit_roberta`` (the only model that holds it), anything else as ``roberta``."""
    import torch
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.models.roberta import RobertaModel
    from omegaconf import OmegaConf

    from acl_fairseq.models.multi_exit_roberta import MultiExitRobertaModel

    parser = options.get_training_parser()
    arch = ["--arch", "roberta"]
    if record["segment_embedding"]:
        arch = ["--arch", "multi_exit_roberta", "--exit-layers", str(config["num_hidden_layers"]),
                "--conventions", json.dumps(record)]
    cli = [".", "--task", "masked_lm", "--criterion", "masked_lm", *arch, *flags,
           "--tokens-per-sample", flags[flags.index("--max-positions") + 1], "--seed", str(seed)]
    args = options.parse_args_and_arch(parser, input_args=cli)
    dictionary = Dictionary()
    for w in dict_words + ["<mask>"]:
        dictionary.add_symbol(w)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model_cls = MultiExitRobertaModel if record["segment_embedding"] else RobertaModel
        model = model_cls.build_model(args, argparse.Namespace(source_dictionary=dictionary))
        if num_classes is not None:
            if pooler is None:
                raise UnsupportedCheckpointError("--num-classes needs a checkpoint with a pooler (pooler.dense)")
            model.register_classification_head(head_name, num_classes=num_classes)
    state = dict(encoder_sd)
    if num_classes is not None:
        state.update({f"classification_heads.{head_name}.{k}": v for k, v in pooler.items()})
    missing, unexpected = torch.nn.Module.load_state_dict(model, state, strict=False)
    fresh = [k for k in missing if k.startswith(("encoder.lm_head.", "classification_heads.", FRESH_BUFFER))]
    if unexpected or len(fresh) != len(missing):
        raise RuntimeError(f"conversion bug: missing {sorted(set(missing) - set(fresh))}, unexpected {unexpected}")
    if fresh:
        logger.info("kept fairseq's initialisation for %s", ", ".join(k for k in fresh if k != FRESH_BUFFER))
    with warnings.catch_warnings():  # hydra's "strict flag is deprecated", raised inside fairseq
        warnings.simplefilter("ignore")
        cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    # fairseq keeps a legacy (argparse) model's cfg as a Namespace; a dict keeps the file loadable by
    # torch.load(weights_only=True) without any allowlist, and fairseq builds the model from it alike
    cfg["model"] = dict(vars(cfg["model"]))
    cfg["bpe"] = hub_bpe(record["tokenizer"])
    return {
        "args": None,
        "cfg": cfg,
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "optimizer_name": "none",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
        POOLER_KEY: {k: v.float().contiguous() for k, v in pooler.items()} if pooler else None,
        "hf_config": config,
    }


def convert(hf_dir: str, out_dir: str, num_classes: Optional[int] = None,
            head_name: str = "sentence_classification_head", seed: int = 1) -> Dict[str, object]:
    """Convert ``hf_dir`` into ``out_dir``; returns ``{"model_args": [...], "files": [...]}``."""
    import torch

    config = read_config(hf_dir)
    model_type = config["model_type"]
    words, specials = read_vocab(hf_dir, model_type)
    if model_type == "roberta" and specials["pad_token"] != config.get("pad_token_id", 1):
        raise UnsupportedCheckpointError(
            f"config pad_token_id {config.get('pad_token_id')} differs from the tokenizer's {specials['pad_token']}"
        )
    dict_words, hf_ids = fairseq_order(words, specials)
    encoder_sd, pooler = map_state_dict(load_hf_state_dict(hf_dir, model_type), config, hf_ids)
    flags = model_args(config)
    os.makedirs(out_dir, exist_ok=True)
    dict_path = os.path.join(out_dir, "dict.txt")
    with open(dict_path, "w", encoding="utf-8") as f:
        f.writelines(f"{w} 1\n" for w in dict_words)
    record = make_conventions(config, hf_dir, conventions.dictionary_sha256(dict_path))
    checkpoint = build_checkpoint(config, flags, dict_words, encoder_sd, pooler, num_classes, head_name, seed, record)

    torch.save(checkpoint, os.path.join(out_dir, "model.pt"))
    with open(os.path.join(out_dir, "model_args.txt"), "w", encoding="utf-8") as f:
        f.write(" ".join(flags) + "\n")
    conventions.write(os.path.join(out_dir, conventions.FILE_NAME), record)
    files = ["model.pt", "dict.txt", "model_args.txt", conventions.FILE_NAME]
    for name in TOKENIZER_FILES[model_type] + OPTIONAL_TOKENIZER_FILES:
        if os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copyfile(os.path.join(hf_dir, name), os.path.join(out_dir, name))
            files.append(name)
    logger.info("wrote %s to %s; architecture flags: %s", ", ".join(files), out_dir, " ".join(flags))
    return {"model_args": flags, "files": files}


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acl-convert-hf",
        description="Convert a Hugging Face BERT/RoBERTa checkpoint folder into fairseq RoBERTa format "
        "(OUT_DIR/model.pt, dict.txt, model_args.txt, tokenizer files) for fairseq-train --restore-file.",
        epilog="Then: fairseq-train ... --arch multi_exit_roberta $(cat OUT_DIR/model_args.txt) --conventions "
        "OUT_DIR --restore-file OUT_DIR/model.pt --reset-optimizer --reset-dataloader --reset-meters, with data "
        "binarized with --srcdict OUT_DIR/dict.txt (no --separator-token for a BERT: the conventions set it). "
        "recipes/glue/finetune.sh does all of this from ROBERTA_PATH=OUT_DIR/model.pt.",
    )
    parser.add_argument("hf_dir", metavar="HF_DIR", help="folder with config.json, model.safetensors or "
                        "pytorch_model.bin, and vocab.txt (BERT) or vocab.json + merges.txt (RoBERTa)")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="output folder (created if missing)")
    parser.add_argument("--num-classes", type=int, default=None,
                        help="also store a classification head with this many classes whose dense layer is "
                        "BERT's pooler (kept by fairseq-train only with the same --num-classes and head name); "
                        "default: no head, the pooler is stored under the checkpoint key 'hf_pooler' only")
    parser.add_argument("--classification-head-name", default="sentence_classification_head",
                        help="name of that head (fairseq's --classification-head-name)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed for the parameters the HF checkpoint lacks (LM head, head out_proj)")
    return parser


def cli_main(argv: Optional[List[str]] = None) -> None:
    args = get_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    logging.getLogger("hydra").setLevel(logging.WARNING)
    try:
        convert(args.hf_dir, args.out_dir, args.num_classes, args.classification_head_name, args.seed)
    except UnsupportedCheckpointError as e:
        sys.exit(f"acl-convert-hf: error: {e}")


if __name__ == "__main__":
    cli_main()
