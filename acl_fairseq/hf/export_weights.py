"""fairseq (multi-exit) RoBERTa -> a Hugging Face ``*ForSequenceClassification`` state dict and config.

The inverse of :mod:`acl_fairseq.hf.mapping`, for a fine-tuned classifier:

- Rows. The embedding keeps fairseq's dictionary order; :mod:`acl_fairseq.hf.export_tokenizer` writes the
  vocabulary in that order, so no row moves.
- Positions. RoBERTa: the table as it is (HF RoBERTa counts positions from ``pad_token_id + 1`` = 2, as
  fairseq does), token type 0 a zero row. BERT: HF rows 0.. are fairseq rows 2.., token type 0 a zero row
  (fairseq folded type 0 into the positions) and type 1 ``segment_delta``, so that type 1 - type 0 is what
  the model adds after the first ``</s>``; re-importing with acl-convert-hf gives the same tensors back.
- LayerNorm eps 1e-5, what fairseq computed with.
- The last exit is the classifier. fairseq's head is dropout, dense, tanh, dropout, out_proj on the ``<s>``
  state: BERT's pooler (dense + tanh), dropout, classifier; RoBERTa's head has the same shape. An exit
  below the top layer leaves the layers above it unused: they are not exported (``num_hidden_layers`` is the
  last exit's layer).
- The other exits' heads go to ``exit_heads.safetensors`` as ``exit{layer}.dense.*`` / ``exit{layer}.out_proj.*``,
  each read on ``hidden_states[layer][:, 0]`` (HF's ``output_hidden_states``, embeddings first).

What HF's heads cannot compute is refused (:class:`ExportError`): mean pooling, a head activation other than
tanh, a pre-LayerNorm encoder, a head whose inner size differs from the hidden size.
"""
from typing import Dict, List, Optional, Tuple

import torch

from acl_fairseq.hf.export_tokenizer import ExportError
from acl_fairseq.hf.mapping import ACTIVATIONS, LAYER_MODULES

HF_ACTIVATION = {"gelu": "gelu", "gelu_accurate": "gelu_new", "relu": "relu", "tanh": "tanh"}  # fairseq -> HF
assert set(HF_ACTIVATION.values()) <= set(ACTIVATIONS) and all(ACTIVATIONS[v] == k for k, v in HF_ACTIVATION.items())
LAYER_NORM_EPS = 1e-5  # fairseq's LayerNorm
CLASSES = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification"}
SE = "encoder.sentence_encoder."


def check_model_args(margs, pooling: str) -> None:
    """Refuse what HF's encoder and standard heads cannot compute; ``margs``: the checkpoint's model args.
    Needs no weights, so the CLI calls it before loading the model."""
    get = margs.get if isinstance(margs, dict) else lambda k, d=None: getattr(margs, k, d)
    if pooling != "cls":
        raise ExportError(
            f"the exits pool with --exit-pooling {pooling}: HF's sequence classifiers read the first token "
            "([CLS] / <s>) only, so a standard head would compute something else; export a model trained with "
            "--exit-pooling cls")
    checks = [
        (get("pooler_activation_fn", "tanh") == "tanh",
         f"--pooler-activation-fn {get('pooler_activation_fn')}: HF's BERT pooler and RoBERTa head use tanh"),
        (not get("encoder_normalize_before", False), "--encoder-normalize-before (pre-LayerNorm): HF BERT/RoBERTa "
         "are post-LayerNorm"),
        (get("layernorm_embedding", True), "no embedding LayerNorm (--layernorm-embedding off): HF has one"),
        (get("no_scale_embedding", True), "scaled embeddings: HF does not scale them"),
        (get("activation_fn", "gelu") in HF_ACTIVATION,
         f"--activation-fn {get('activation_fn')} has no HF hidden_act; one of {sorted(HF_ACTIVATION)} has"),
        (not get("spectral_norm_classification_head", False), "a spectral-norm classification head"),
    ]
    for ok, reason in checks:
        if not ok:
            raise ExportError(f"cannot export as a standard HF model: {reason}")


def _head(sd: Dict, name: str, hidden: int) -> Dict[str, torch.Tensor]:
    prefix = f"classification_heads.{name}."
    head = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    if set(head) != {"dense.weight", "dense.bias", "out_proj.weight", "out_proj.bias"}:
        raise ExportError(f"classification head {name!r} has parameters {sorted(head)}, not fairseq's "
                          "dense + out_proj")
    if tuple(head["dense.weight"].shape) != (hidden, hidden):
        raise ExportError(f"classification head {name!r} has inner size {head['dense.weight'].size(0)}: HF's "
                          f"heads need the hidden size {hidden}")
    return head


def state_dict(model, family: str, head_names: List[str], exit_layers: List[int]) -> Tuple[Dict, Dict]:
    """``(HF state dict, exit heads)``. ``head_names`` / ``exit_layers``: the exits in layer order."""
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    hidden = sd[SE + "embed_tokens.weight"].size(1)
    base = "bert." if family == "bert" else "roberta."
    pos = sd[SE + "embed_positions.weight"]
    out = {base + "embeddings.word_embeddings.weight": sd[SE + "embed_tokens.weight"]}
    token_type = torch.zeros(2 if family == "bert" else 1, hidden)
    if family == "bert":
        pos = pos[2:]  # fairseq counts from padding_idx + 1 = 2, BERT from 0
        if "segment_delta" in sd:
            token_type[1] = sd["segment_delta"]
    out[base + "embeddings.position_embeddings.weight"] = pos.clone()
    out[base + "embeddings.token_type_embeddings.weight"] = token_type
    for p in ("weight", "bias"):
        out[f"{base}embeddings.LayerNorm.{p}"] = sd[f"{SE}layernorm_embedding.{p}"]
    for i in range(exit_layers[-1]):
        for hf_name, fs_name in LAYER_MODULES:
            for p in ("weight", "bias"):
                out[f"{base}encoder.layer.{i}.{hf_name}.{p}"] = sd[f"{SE}layers.{i}.{fs_name}.{p}"]
    last = _head(sd, head_names[-1], hidden)
    if family == "bert":
        out.update({"bert.pooler.dense.weight": last["dense.weight"], "bert.pooler.dense.bias": last["dense.bias"],
                    "classifier.weight": last["out_proj.weight"], "classifier.bias": last["out_proj.bias"]})
    else:
        out.update({"classifier." + k: v for k, v in last.items()})
    exit_heads = {f"exit{layer}.{k}": v for name, layer in zip(head_names[:-1], exit_layers[:-1])
                  for k, v in _head(sd, name, hidden).items()}
    return out, exit_heads


def config(model, family: str, exit_layers: List[int], label_names: Optional[List[str]], head_dropout: float) -> Dict:
    """config.json of the exported classifier (``label_names`` None: a regression head)."""
    margs = model.args if hasattr(model, "args") else model.cfg
    get = margs.get if isinstance(margs, dict) else lambda k, d=None: getattr(margs, k, d)
    enc = model.encoder.sentence_encoder
    layer0 = enc.layers[0]
    rows = enc.embed_positions.weight.size(0)
    out = {
        "architectures": [CLASSES[family]],
        "model_type": family,
        "vocab_size": enc.embed_tokens.weight.size(0),
        "hidden_size": enc.embed_tokens.weight.size(1),
        "num_hidden_layers": exit_layers[-1],
        "num_attention_heads": layer0.self_attn.num_heads,
        "intermediate_size": layer0.fc1.out_features,
        "hidden_act": HF_ACTIVATION[get("activation_fn", "gelu")],
        "hidden_dropout_prob": float(get("dropout", 0.1)),
        "attention_probs_dropout_prob": float(get("attention_dropout", 0.1)),
        "classifier_dropout": head_dropout,
        "max_position_embeddings": rows - 2 if family == "bert" else rows,
        "type_vocab_size": 2 if family == "bert" else 1,
        "layer_norm_eps": LAYER_NORM_EPS,
        "pad_token_id": enc.padding_idx,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "position_embedding_type": "absolute",
        "initializer_range": 0.02,
        "dtype": "float32",
    }
    if label_names is None:
        out.update(num_labels=1, problem_type="regression", id2label={"0": "score"}, label2id={"score": 0})
    else:
        if len(set(label_names)) != len(label_names):
            raise ExportError(f"label names repeat: {label_names}")
        out.update(problem_type="single_label_classification",
                   id2label={str(i): n for i, n in enumerate(label_names)},
                   label2id={n: i for i, n in enumerate(label_names)})
    return out
