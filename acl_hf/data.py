"""A GLUE task folder for the Trainer: the official TSVs (or a folder of the same format) read through the project's
reader (:mod:`acl_runtime.glue_tasks`, the one the fairseq recipes preprocess with), or the SCL paper's few-shot
splits of them (:mod:`acl_runtime.scl_protocols`, drawn as acl-preprocess draws them), tokenised with the model's
tokenizer, and GLUE's metrics through ``compute_metrics`` (:mod:`acl_torch.glue_metrics`, the plugin's).

The dev splits are named as fairseq names them (``valid``; MNLI's matched and mismatched ``valid`` and ``valid1``),
so that the metrics carry the same subset names in ``result.json``. Labels are class indices in the task's label
order (``TaskSpec.labels``); STS-B's score is divided by the task's regression scale (5), as fairseq's target is.
"""
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from acl_runtime import glue_tasks, scl_protocols
from acl_torch import glue_metrics


class GlueSplit(torch.utils.data.Dataset):
    """One split, tokenised once: a list of ``{"input_ids", "attention_mask", ["token_type_ids"], "labels"}``."""

    def __init__(self, rows: List[Dict]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Dict:
        return self.rows[i]


def label_names(spec: glue_tasks.TaskSpec) -> Optional[List[str]]:
    """The class names in class-index order (None for a regression task)."""
    return None if spec.regression else list(spec.labels)


def read(data_dir: str, spec: glue_tasks.TaskSpec, stem: str, kind: str, tokenizer, max_seq_length: int,
         max_samples: Optional[int] = None) -> GlueSplit:
    """``data_dir/stem.tsv`` as a ``kind`` split of ``spec``, its first ``max_samples`` examples (run_glue.py's
    ``--max_train_samples``), tokenised to at most ``max_seq_length`` tokens."""
    return tokenise(glue_tasks.read_split(data_dir, stem, spec, kind).examples, spec, tokenizer, max_seq_length,
                    max_samples)


def tokenise(examples: List[glue_tasks.Example], spec: glue_tasks.TaskSpec, tokenizer, max_seq_length: int,
             max_samples: Optional[int] = None) -> GlueSplit:
    """Labelled examples as a split: the first ``max_samples``, tokenised to at most ``max_seq_length`` tokens."""
    if max_samples is not None:
        examples = examples[:max_samples]
    scale = glue_tasks.regression_scale(spec.name) if spec.regression else None
    names = label_names(spec)
    rows = []
    for ex in examples:
        encoded = tokenizer(*ex.texts, truncation=True, max_length=max_seq_length)
        row = {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        row["labels"] = float(ex.label) / scale if scale else names.index(ex.label)
        rows.append(row)
    return GlueSplit(rows)


def few_shot(data_dir: str, spec: glue_tasks.TaskSpec, n: int, seed: int, tokenizer, max_seq_length: int,
             max_eval_samples: Optional[int] = None) -> Tuple[GlueSplit, Dict[str, GlueSplit], Dict[str, int]]:
    """The SCL paper's few-shot splits, drawn as ``acl-preprocess --few-shot N --seed S`` draws them
    (:func:`acl_runtime.scl_protocols.few_shot_splits`): the training split, the evaluation splits by fairseq's
    names (``valid``, ``test``; MNLI's ``valid1``, ``test1`` too: valid first, the one that selects), and the
    examples in each."""
    train = glue_tasks.read_split(data_dir, "train", spec, "train")
    devs = [glue_tasks.read_split(data_dir, stem, spec, "dev") for stem in spec.dev]
    splits = scl_protocols.few_shot_splits(spec, train.examples, devs, n, seed)
    order = sorted(splits[1:], key=lambda s: (not s.name.startswith("valid"), s.name))
    evals = {s.name: tokenise(s.examples, spec, tokenizer, max_seq_length, max_eval_samples) for s in order}
    sizes = {s.name: len(s.examples) for s in splits}
    return tokenise(splits[0].examples, spec, tokenizer, max_seq_length), evals, sizes


def dev_subsets(spec: glue_tasks.TaskSpec) -> Dict[str, str]:
    """fairseq's subset name of each dev file: ``{"valid": "dev"}``; MNLI ``{"valid": "dev_matched", "valid1":
    "dev_mismatched"}``."""
    return {("valid" if i == 0 else f"valid{i}"): stem for i, stem in enumerate(spec.dev)}


def metrics_function(spec: glue_tasks.TaskSpec, layers: List[int]):
    """``compute_metrics`` for the Trainer: GLUE's metrics of the last exit (percent, as the fairseq task logs them)
    and every exit's ``accuracy_exit{L}`` (classification)."""
    positive = None if spec.regression else glue_metrics.positive_of(spec.labels)

    def compute(eval_pred) -> Dict[str, float]:
        predictions, gold = eval_pred.predictions, np.asarray(eval_pred.label_ids)
        logits, exit_logits = (predictions[0], predictions[1]) if isinstance(predictions, tuple) else (predictions,
                                                                                                       None)
        if spec.regression:
            return glue_metrics.regression_metrics(np.asarray(logits).reshape(-1).tolist(), gold.tolist())
        out = glue_metrics.classification_metrics(np.argmax(logits, -1).tolist(), gold.tolist(), positive)
        if exit_logits is not None and len(layers) > 1:
            for layer, z in zip(layers, exit_logits):
                out[f"accuracy_exit{layer}"] = 100.0 * float(np.mean(np.argmax(z, -1) == gold))
        return out

    return compute
