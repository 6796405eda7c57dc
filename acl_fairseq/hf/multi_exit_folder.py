"""An HF-trained multi-exit folder as the fairseq run that acl-export reads.

``acl-train-hf``'s ``--output_dir`` (or any ``save_pretrained`` of :class:`acl_hf.MultiExitForSequenceClassification`)
over a BERT or RoBERTa encoder becomes, in a temporary folder, what a fairseq run of the plugin leaves: a checkpoint
of ``multi_exit_roberta`` (task ``sentence_prediction``) and a data folder with its dictionaries and tokenizer record
(no splits). acl-export then reads them as it reads any run, so every format and check is the fairseq path's own.

- The encoder maps as ``acl-convert-hf`` maps one (:func:`acl_fairseq.hf.mapping.map_state_dict`, the vocabulary in
  fairseq's order, the conventions record of :func:`acl_fairseq.hf.convert.make_conventions`); the exit heads keep
  their names (the two trainers name them alike: ``{head_name}_exit{L}``, the last exit ``{head_name}``), and the
  model is built and loaded strictly (:func:`acl_fairseq.hf.convert.fairseq_checkpoint`).
- Labels: ``config.id2label`` in id order (the label dictionary's rows); the tokenizer: the folder's own files.
- Pairs: the task of acl-train-hf's ``result.json`` says whether the model reads one text or a pair; a folder
  without one is recorded as reading either (not checked).

An encoder fairseq's post-norm ``roberta`` arch cannot hold is refused with the reason (:data:`NO_MAPPING`), never
exported approximately: the ONNX graphs are fairseq's layers.
"""
import json
import os
from typing import Dict, List, NamedTuple, Optional, Tuple

from acl_fairseq.checkpoint_safety import CheckpointError  # noqa: F401  (a damaged pytorch_model.bin: named)
from acl_fairseq.hf import mapping
from acl_fairseq.hf.mapping import UnsupportedCheckpointError
from acl_runtime import conventions, glue_tasks, pairing, tokenization
from acl_runtime.io import atomic

MODEL_TYPE = "acl-multi-exit"  # acl_hf.configuration.MODEL_TYPE (acl_fairseq never imports acl_hf: the files tell)
RESULT_FILE = "result.json"  # acl-train-hf's record of the run, with its task
# encoder model_type -> why fairseq's post-norm roberta arch (whose layers the exported graphs are) cannot hold it
NO_MAPPING = {
    "deberta-v2": "DeBERTa-v2/v3's disentangled attention over relative positions (no absolute position table)",
    "deberta": "DeBERTa's disentangled attention over relative positions (no absolute position table)",
    "modernbert": "ModernBERT's pre-LayerNorm layers with rotary positions and local attention",
}


class MultiExitConfig(NamedTuple):
    """What the export reads of the folder's config.json (acl_hf.MultiExitConfig, saved)."""

    encoder: Dict  # the encoder's config, as its own config.json would hold it
    layers: List[int]  # the 1-based layer behind each exit
    exit_pooling: str
    head_activation: Optional[str]  # None: the encoder's default (tanh for BERT and RoBERTa, acl_hf.modeling)
    head_name: str
    id2label: Dict[int, str]

    @property
    def num_labels(self) -> int:
        return len(self.id2label)


def read_json(folder: str) -> Optional[Dict]:
    """``folder/config.json``, or None (no such file, or not a JSON object)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def is_multi_exit(folder: str) -> bool:
    """``folder`` is a saved :class:`acl_hf.MultiExitForSequenceClassification`."""
    return os.path.isdir(folder) and (read_json(folder) or {}).get("model_type") == MODEL_TYPE


def load_config(folder: str) -> MultiExitConfig:
    """The folder's configuration, checked for what the fairseq model can hold (one line naming the encoder type and
    why otherwise)."""
    config = read_json(folder)
    encoder = config.get("encoder") or {}
    kind = encoder.get("model_type")
    if kind not in mapping.SUPPORTED_MODEL_TYPES:
        why = NO_MAPPING.get(kind, "fairseq's roberta arch has no place for its weights")
        raise UnsupportedCheckpointError(
            f"{folder}: its encoder is {kind}, which has no fairseq mapping ({why}); the export builds its graphs "
            f"from fairseq's layers, so only {' and '.join(mapping.SUPPORTED_MODEL_TYPES)} encoders export")
    try:
        mapping.check_config(encoder)
    except UnsupportedCheckpointError as e:
        raise UnsupportedCheckpointError(f"{folder}: its {kind} encoder: {e}") from None
    layers = config.get("exit_layers") or list(range(1, encoder["num_hidden_layers"] + 1))
    id2label = {int(k): v for k, v in (config.get("id2label") or {0: "LABEL_0", 1: "LABEL_1"}).items()}
    return MultiExitConfig(encoder, list(layers), config.get("exit_pooling", "cls"), config.get("head_activation"),
                           config.get("head_name", "sentence_classification_head"), id2label)


def head_activation(config: MultiExitConfig) -> str:
    """The heads' activation as fairseq's ``--pooler-activation-fn`` names it."""
    name = config.head_activation or "tanh"
    if name not in mapping.ACTIVATIONS:
        raise UnsupportedCheckpointError(f"the exit heads' activation {name!r} has no fairseq form; expected one of "
                                         f"{sorted(mapping.ACTIVATIONS)}")
    return mapping.ACTIVATIONS[name]


def read_task(folder: str) -> Optional[glue_tasks.TaskSpec]:
    """The GLUE task of acl-train-hf's ``result.json`` in ``folder``, or None."""
    path = os.path.join(folder, RESULT_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        name = json.load(f).get("task")
    return glue_tasks.get_task(name) if name else None


def training_texts(folder: str, glue_dir: Optional[str], quantize: Optional[str]) -> List[tuple]:
    """The training inputs of the GLUE folder ``glue_dir`` an HF-trained ``folder`` was trained on (acl-train-hf's
    ``--data_dir``), read by the task of its ``result.json``: what ``--quantize int8`` calibrates on."""
    if quantize != "int8":
        raise UnsupportedCheckpointError(f"--data {glue_dir}: an HF-trained folder carries its vocabulary and labels, "
                                         "and its GLUE folder is read by --quantize int8 alone: drop --data")
    if glue_dir is None:
        raise UnsupportedCheckpointError("--quantize int8 calibrates on the training split: pass --data GLUE_DIR, the "
                                         "folder acl-train-hf's --data_dir named, or --quantize int8-dynamic")
    task = read_task(folder)
    if task is None:
        raise UnsupportedCheckpointError(f"--data {glue_dir}: {folder} has no {RESULT_FILE} naming its task, so the "
                                         "columns of train.tsv are unknown; pass --quantize int8-dynamic")
    return [example.texts for example in glue_tasks.read_split(glue_dir, "train", task, "train").examples]


def label_words(config: MultiExitConfig) -> Optional[list]:
    """The label dictionary's words in head order (``id2label``); None for a regression head."""
    if config.num_labels == 1:
        return None
    words = [str(config.id2label[i]) for i in range(config.num_labels)]
    bad = [w for w in words if not w or w.split() != [w]]
    if bad or len(set(words)) != len(words):
        raise UnsupportedCheckpointError(f"config.json id2label {config.id2label}: each label must be one distinct "
                                         "word without whitespace (fairseq's label dictionary holds words)")
    return words


def split_state(folder: str, kind: str) -> Tuple[Dict, Dict]:
    """``(encoder tensors without the "encoder." prefix, classification_heads.* tensors)`` of the folder's weights."""
    state = mapping.load_hf_state_dict(folder, kind)
    encoder = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    heads = {k: v for k, v in state.items() if k.startswith("classification_heads.")}
    other = sorted(set(state) - {f"encoder.{k}" for k in encoder} - set(heads))
    if other:
        raise UnsupportedCheckpointError(f"{folder}: weights with no place in multi_exit_roberta: {other[:5]}")
    return encoder, heads


def weights_file(folder: str) -> str:
    """The file that names the folder's weights (the one weights file, or a sharded checkpoint's index)."""
    files = mapping.weight_files(folder)
    if len(files) == 1:
        return files[0]
    return next(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".index.json"))


def order_labels(heads: Dict, words: List[str], data_words: List[str], folder: str) -> Dict:
    """The heads with their out_proj rows in the order of ``data_words`` (a binarized folder's label dictionary,
    which fairseq orders by count) in place of ``words`` (``id2label``'s)."""
    import torch

    if sorted(data_words) != sorted(words):
        raise UnsupportedCheckpointError(f"the data's labels {data_words} are not {folder}'s {words}: pass the data "
                                         "of the task it was trained on")
    rows = torch.tensor([words.index(w) for w in data_words])
    return {k: v[rows] if k.endswith(("out_proj.weight", "out_proj.bias")) else v for k, v in heads.items()}


def for_data(folder: str, data_bin: str, out: str) -> str:
    """``out/model.pt`` of the HF multi-exit ``folder`` for the binarized ``data_bin`` (acl-preprocess with the
    folder's vocabulary: ``--tokenizer wordpiece --vocab vocab.txt``), its classes in the data's label order."""
    from acl_fairseq.preprocessing.glue_binarize import label_dictionary_order

    path = os.path.join(data_bin, "label", "dict.txt")
    return materialize(folder, out, labels=label_dictionary_order(path) if os.path.isfile(path) else None)[0]


def _write_data(data: str, source: str, encoder: dict, task, labels: Optional[List[str]],
                dict_words: List[str]) -> dict:
    """The data folder fairseq loads the model over: dictionaries, the tokenizer's files and stats.json; returns
    the conventions record of the encoder and its tokenizer."""
    from acl_fairseq.hf import convert

    subs = ["input0"] + (["input1"] if task is None or task.pair else []) + ([] if labels is None else ["label"])
    for sub in subs:
        os.makedirs(os.path.join(data, sub))
        atomic.write_text(os.path.join(data, sub, "dict.txt"),
                          "".join(f"{w} 1\n" for w in (labels if sub == "label" else dict_words)))
    record = convert.make_conventions(encoder, source, conventions.dictionary_sha256(
        os.path.join(data, "input0", "dict.txt")))
    for name in tokenization.FILES[record["tokenizer"]["kind"]]:
        file = os.path.join(source, record["tokenizer"]["files"][name])
        atomic.write_through(os.path.join(data, os.path.basename(file)), lambda tmp, file=file: _copy(file, tmp))
    atomic.write_json(os.path.join(data, "stats.json"),  # no task: input1/ for the pair layout, either input read
                      {"task": task.name if task else None, "tokenizer": record["tokenizer"],
                       pairing.MANIFEST_KEY: len(task.inputs) if task else None})
    return record


def _model_flags(config, record: dict, labels: Optional[List[str]]) -> List[str]:
    """fairseq-train's task, criterion, arch and model flags that rebuild the multi-exit model of ``config``."""
    encoder = config.encoder
    layers = ",".join(str(layer) for layer in config.layers)
    return ["--task", "sentence_prediction", "--criterion", "sentence_prediction",
            "--classification-head-name", config.head_name, "--num-classes", str(config.num_labels),
            "--arch", "multi_exit_roberta", "--exit-layers", layers, "--exit-pooling", config.exit_pooling,
            "--conventions", json.dumps(record), "--pooler-activation-fn", head_activation(config),
            "--layer-norm-eps", repr(float(encoder.get("layer_norm_eps", 1e-12))),
            *conventions.input_layout(record).fairseq_flags(), *mapping.model_args(encoder),
            *(["--regression-target"] if labels is None else [])]


def materialize(folder: str, out: str, seed: int = 1, labels: Optional[List[str]] = None) -> Tuple[str, str]:
    """Write ``out/model.pt`` and the data folder ``out/data`` of the HF multi-exit ``folder``; returns their paths.
    ``labels``: the class order to give the heads (:func:`order_labels`; default ``id2label``'s). An
    :class:`UnsupportedCheckpointError` names what cannot be mapped."""
    import torch

    from acl_fairseq.hf import convert

    config = load_config(folder)
    encoder = config.encoder
    kind = encoder["model_type"]
    source = mapping.tokenizer_folder(folder, kind, os.path.join(out, "tokenizer"))
    words, specials = mapping.read_vocab(source, kind)
    dict_words, hf_ids = mapping.fairseq_order(words, specials)
    encoder_sd, heads = split_state(folder, kind)
    state, _ = mapping.map_state_dict(encoder_sd, encoder, hf_ids)  # no pooler: the multi-exit model drops it
    state.update(heads)
    words, task = label_words(config), read_task(folder)
    if labels is not None and words is not None:
        state.update(order_labels(heads, words, labels, folder))
    labels = words if labels is None else labels

    data = os.path.join(out, "data")
    record = _write_data(data, source, encoder, task, labels, dict_words)
    cli = [data, *_model_flags(config, record, labels)]
    checkpoint = convert.fairseq_checkpoint(cli, dict_words, state, seed, record, (config.head_name, config.num_labels),
                                            fresh=("encoder.lm_head.", convert.FRESH_BUFFER))
    path = os.path.join(out, "model.pt")
    atomic.write_through(path, lambda tmp: torch.save(checkpoint, tmp))
    return path, data


def _copy(source: str, target: str) -> None:
    import shutil

    shutil.copyfile(source, target)
