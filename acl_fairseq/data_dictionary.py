"""The hash of the data dictionary a checkpoint was trained with: recorded in training, checked wherever a
checkpoint meets a data folder.

fairseq reads a binarized folder with any dictionary of the right size, so data binarized with another
``dict.txt`` (the same words in another order) is scored silently, every token reading another word's
embedding. Training records :func:`acl_fairseq.conventions.dictionary_sha256` of ``DATA/input0/dict.txt``
in the model's arguments as ``data_dictionary_sha256``, so every checkpoint of the run carries it: the
plugin task records it for any architecture, ``multi_exit_roberta``'s build for any task (a plain
``roberta`` under the stock ``sentence_prediction`` task records nothing). :func:`check` compares it
with the data folder a checkpoint is used with: in acl-evaluate, acl-predict and the hub
(:func:`check_loaded`), and for ``fairseq-train --restore-file`` under the plugin task
(:func:`recorded_in_file`). A checkpoint that records none is used with a warning.

Torch is imported only by :func:`recorded_in_file`.
"""
import logging
import os
import pickle
from typing import Optional

from acl_fairseq import conventions

KEY = "data_dictionary_sha256"
# set on a model by the builds that record: what its arguments carried before the build (None: nothing, or a
# fresh run). A build records into the arguments of a loaded checkpoint too, so a tool reads this, not KEY.
BUILT_FROM = "checkpoint_data_dictionary_sha256"

logger = logging.getLogger(__name__)


class DictionaryMismatch(conventions.ConventionsError):
    """The data folder's dictionary is not the one the checkpoint was trained with."""


def dict_path(data) -> Optional[str]:
    """``DATA/input0/dict.txt`` of a ``--data`` value (the first folder of a ``:``-separated list)."""
    return os.path.join(str(data).split(os.pathsep)[0], "input0", "dict.txt") if data else None


def recorded(args) -> Optional[str]:
    """The hash in a model's arguments (Namespace, DictConfig or dict), or None."""
    if args is None:
        return None
    return args.get(KEY) if isinstance(args, dict) else getattr(args, KEY, None)


def record(args, data) -> Optional[str]:
    """Put the hash of ``data``'s dictionary into ``args`` unless they carry one already (a loaded
    checkpoint keeps what it was trained with); returns what they carried before."""
    before = recorded(args)
    path = dict_path(data)
    if before is None and path and os.path.isfile(path):
        from omegaconf import OmegaConf, open_dict

        sha = conventions.dictionary_sha256(path)
        if OmegaConf.is_config(args):
            with open_dict(args):
                args[KEY] = sha
        else:
            setattr(args, KEY, sha)
    return before


def check(trained: Optional[str], data, checkpoint: str) -> None:
    """Refuse ``data`` when its dictionary is not the one ``checkpoint`` was trained with (``trained``: the
    hash the checkpoint records); warn when the checkpoint records none."""
    path = dict_path(data)
    if not path or not os.path.isfile(path):
        return  # not a binarized folder: the loader says so
    if trained is None:
        logger.warning(
            "%s records no data dictionary hash (trained before checkpoints carried one, or a plain roberta "
            "under --task sentence_prediction): nothing checks that %s is the dictionary it was trained with",
            checkpoint, path,
        )
        return
    if conventions.dictionary_sha256(path) != trained:
        raise DictionaryMismatch(
            f"the data dictionary {path} is not the one {checkpoint} was trained with (sha256 {trained[:12]}...): "
            "this data was binarized with another vocabulary or word order, so every token would read another "
            "word's embedding; use the data folder the model was trained on, or binarize the data again with "
            "--srcdict set to that folder's input0/dict.txt"
        )


def check_loaded(model, cfg, checkpoint: str) -> None:
    """:func:`check` for a model loaded from ``checkpoint`` with the data folder of ``cfg.task.data``."""
    trained = getattr(model, BUILT_FROM) if hasattr(model, BUILT_FROM) else recorded(cfg.model)
    if trained is None:  # a converted encoder's conventions record names its dictionary too
        record = conventions.from_args(cfg.model)
        trained = record["dictionary_sha256"] if record else None
    check(trained, cfg.task.data, checkpoint)


def recorded_in_file(path: str) -> Optional[str]:
    """The hash a checkpoint file records, without reading its weights (memory-mapped); None when it records
    none or cannot be read that way (an older file format, a damaged file: fairseq's loader reports those)."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError):
        return None  # fairseq's own loader reads it next and reports what is wrong
    if not isinstance(state, dict):
        return None
    cfg = state.get("cfg") or {}
    return recorded(cfg.get("model") if hasattr(cfg, "get") else None) or recorded(state.get("args"))
