"""Let torch's safe loader (``weights_only=True``, the default since torch 2.6) read fairseq checkpoints.

fairseq 0.12 calls ``torch.load(f, map_location=...)`` without ``weights_only``, so on torch >= 2.6 it
fails on its own checkpoints with ``Unsupported global: argparse.Namespace``. Instead of turning the
safe loader off (passing ``weights_only`` as false, or torch's environment override, which would let a
checkpoint run arbitrary code), we allowlist exactly the plain-data types that fairseq checkpoints
pickle. Anything else, for example a pickle that calls ``os.system``, is still refused by torch
before it is called.

:func:`check_readable` refuses an empty or cut-short checkpoint before anything loads it, and :func:`reading`
turns what torch raises on the rest into the same one-line :class:`CheckpointError`; a pickle that asks for a
global outside the allowlist is reported as refused, naming that global. :func:`load` is the one safe loader,
both checks around ``torch.load(weights_only=True)``, memory-mapped where the file's format allows it: every
checkpoint the package reads goes through it. :func:`read_cfg` (the one config reader, legacy argparse-era
checkpoints included: acl-export, the data dictionary hash), :func:`load_model_and_task` (acl-evaluate,
acl-predict, the hub: fairseq's model build from the state :func:`load` read, never fairseq's loader), the
plugin task's check of ``--restore-file`` and a resumed ``checkpoint_last.pt``, and acl-convert-hf's
``pytorch_model.bin``.

The data dictionary a checkpoint was trained with. fairseq reads a binarized folder with any dictionary of
the right size, so data binarized with another ``dict.txt`` (the same words in another order) is scored
silently, every token reading another word's embedding. Training records
:func:`acl_runtime.conventions.dictionary_sha256` of ``DATA/input0/dict.txt`` in the model's arguments as
``data_dictionary_sha256``, so every checkpoint of the run carries it: the plugin task records it for any
architecture, ``multi_exit_roberta``'s build for any task (a plain ``roberta`` under the stock
``sentence_prediction`` task records nothing). :func:`check_dictionary` compares it with the data folder a
checkpoint is used with: in acl-evaluate, acl-predict and the hub (:func:`check_loaded_dictionary`), and for
``fairseq-train --restore-file`` under the plugin task (:func:`dictionary_in_file`). A checkpoint that
records none is used with a warning.
"""
import argparse
import collections
import contextlib
import logging
import os
import pickle
import re
import typing
import zipfile

import torch

from acl_runtime import conventions

logger = logging.getLogger(__name__)


def fairseq_checkpoint_types() -> typing.List[object]:
    """The types found in fairseq checkpoints beside tensors and builtin containers.

    - ``argparse.Namespace``: ``args`` of argparse-era checkpoints (the official roberta.base/large)
      and of every 0.12 checkpoint trained from the command line.
    - omegaconf containers and value nodes: ``cfg`` of hydra-era checkpoints when stored unconverted.
    - ``collections.defaultdict``, ``typing.Any``, ``int``, ``dict``, ``list``: what omegaconf's metadata refers to.
    - numpy scalars, dtypes and arrays: best-metric values and meter states fairseq saves in
      ``extra_state``.
    """
    import numpy as np
    from omegaconf import DictConfig, ListConfig, base, nodes

    value_nodes = [
        getattr(nodes, name)
        for name in ("AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode", "BytesNode")
        if hasattr(nodes, name)
    ]
    np_dtype_classes = [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    return [
        argparse.Namespace,
        DictConfig,
        ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        *value_nodes,
        collections.defaultdict,
        collections.OrderedDict,
        typing.Any,
        int,
        float,
        dict,
        list,
        np.ndarray,
        np.dtype,
        np.core.multiarray.scalar,
        np.core.multiarray._reconstruct,
        *np_dtype_classes,
    ]


def allow_fairseq_checkpoints() -> None:
    """Add the fairseq checkpoint types to torch's weights-only allowlist (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 has no allowlist (and does not default to the safe loader)
        return
    add(fairseq_checkpoint_types())


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read; the message names the file and the fix."""


_REFETCH = ("Fix: copy or download it again (an interrupted copy, a full disk or a killed save leaves a file cut "
            "short), or pass another checkpoint")


def check_readable(path: str, flag: typing.Optional[str] = None, fix: str = _REFETCH) -> None:
    """Refuse ``path`` (given as ``flag``, named in the message) unless it looks like a whole torch checkpoint,
    without loading it.

    torch's zip format (torch >= 1.6) ends with the archive's central directory, so a file cut short lacks
    it: opening the archive reads only that directory, not the tensors. A legacy (pre-zip) file is a pickle
    stream and can only be checked for being non-empty here; :func:`reading` covers its truncation. ``fix``
    ends the message of an empty or cut-short file."""
    where = f"{path} ({flag})" if flag else path
    if not os.path.isfile(path):
        raise CheckpointError(f"{where}: no such file. Fix: pass the path of a .pt file")
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointError(f"{where}: empty file (0 bytes), not a checkpoint. {fix}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PK\x03\x04":
        try:
            zipfile.ZipFile(path).close()
        except (zipfile.BadZipFile, OSError):
            raise CheckpointError(f"{where}: truncated or damaged checkpoint ({size} bytes, and the archive's "
                                  f"closing directory is missing). {fix}") from None
    elif magic[:1] != b"\x80":  # a legacy torch file starts with a pickle protocol mark
        raise CheckpointError(f"{where}: not a torch checkpoint (it starts with {magic!r}). "
                              "Fix: pass a .pt file written by fairseq-train or acl-convert-hf")


_UNSAFE_FIX = ("Fix: use a checkpoint from a source you trust, saved as plain data (tensors, containers, "
               "fairseq's own types); never load it with weights_only turned off")


def _refused(path: str, error: Exception) -> typing.Optional[CheckpointError]:
    """The error for what torch's safe loader refused to unpickle, or None when ``error`` is not that.

    torch names the refused global in its message (``GLOBAL posix.system``); anything else it refuses (an
    opcode torch never writes, a plain ``pickle.dump`` file) is named by its own words."""
    text = str(error)
    if "Weights only load failed" not in text:
        return None
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return CheckpointError(f"{path}: refused as unsafe: it asks to load the global {found.group(1)}, which is "
                               f"not plain data and could run code; torch's safe loader stopped before calling it. "
                               f"{_UNSAFE_FIX}")
    found = re.search(r"WeightsUnpickler error: *\n*([^\n]+)", text)
    why = found.group(1).strip() if found else "a pickle it cannot read as plain data"
    return CheckpointError(f"{path}: refused by torch's safe loader ({why}): not a file torch.save wrote from plain "
                           f"data. {_UNSAFE_FIX}")


@contextlib.contextmanager
def reading(path: str):
    """Around a load of ``path``: torch's errors for a damaged file become a :class:`CheckpointError`, and a
    pickle refused as unsafe says so, naming the global it asked for (never "damaged": it is whole)."""
    try:
        yield
    except pickle.UnpicklingError as e:
        refused = _refused(path, e)
        if refused is not None:
            raise refused from None
        raise CheckpointError(f"{path}: truncated or damaged checkpoint (UnpicklingError: {e}). {_REFETCH}") from None
    except (EOFError, OSError) as e:
        why = f"{type(e).__name__}: {e}".rstrip(": ")
        raise CheckpointError(f"{path}: truncated or damaged checkpoint ({why}). {_REFETCH}") from None
    except RuntimeError as e:
        # torch's wording for a cut-short zip archive or legacy file; any other RuntimeError is not ours to name
        if not any(k in str(e) for k in ("PytorchStreamReader", "unexpected EOF", "corrupted")):
            raise
        why = str(e).split(". ")[0]
        raise CheckpointError(f"{path}: truncated or damaged checkpoint ({why}). {_REFETCH}") from None


def is_zip_format(path: str) -> bool:
    """Whether ``path`` is in torch's zip format (torch >= 1.6), the only one ``torch.load`` can memory-map."""
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def load(path: str, mmap: bool = False, flag: typing.Optional[str] = None, fix: str = _REFETCH):
    """``torch.load(path, weights_only=True)`` on the CPU, after :func:`check_readable` (``flag`` and ``fix`` as
    there) and inside :func:`reading`: every failure is one :class:`CheckpointError` naming the file (and the
    refused global of an unsafe pickle). ``mmap``: map the tensors instead of reading them (to read a cfg without
    the weights), where the format allows it; a legacy (pre-zip) file, which fairseq and the hub read alike, is
    read whole."""
    check_readable(path, flag, fix)
    with reading(path):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip_format(path))


def _fairseq_checkpoint(path: str, state) -> dict:
    """``state`` when it is a fairseq checkpoint (a dict with a cfg or argparse args), else a CheckpointError."""
    if not isinstance(state, dict) or (state.get("cfg") is None and state.get("args") is None):
        what = "a dict without cfg or args" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise CheckpointError(f"{path} is not a fairseq checkpoint (it holds {what}, not a dict with a cfg); pass a "
                              "checkpoint written by fairseq-train")
    return state


def read_cfg(path: str) -> dict:
    """The cfg a checkpoint records, through :func:`load` (memory-mapped where the format allows it): fairseq's
    ``cfg``, or for an argparse-era checkpoint (``args`` only) its sections built from those arguments, as fairseq
    builds them. The one config reader: a CheckpointError for a file that is not a fairseq checkpoint."""
    state = _fairseq_checkpoint(path, load(path, mmap=True))
    cfg = state.get("cfg") or {}
    if not cfg and state.get("args") is not None:
        args = vars(state["args"])
        cfg = {"model": state["args"], "task": args, "criterion": args, "optimization": args, "optimizer": args,
               "lr_scheduler": args, "dataset": args, "common": args}
    return dict(cfg)


def fairseq_state(path: str, arg_overrides: typing.Optional[dict] = None, flag: typing.Optional[str] = None) -> dict:
    """What fairseq's ``checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)`` returns (the overrides set,
    the cfg made an OmegaConf, old checkpoints upgraded), read through :func:`load`: torch's safe loader with the
    allowlist, every failure one :class:`CheckpointError` naming the file (an unsafe pickle's global included)."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import overwrite_args_by_name
    from omegaconf import OmegaConf

    state = _fairseq_checkpoint(path, load(path, flag=flag))
    if state.get("args") is not None:
        for name, value in (arg_overrides or {}).items():
            setattr(state["args"], name, value)
    if state.get("cfg") is not None:
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
        if arg_overrides:
            overwrite_args_by_name(state["cfg"], arg_overrides)
    return checkpoint_utils._upgrade_state_dict(state)


def load_model_and_task(path: str, arg_overrides: typing.Optional[dict] = None):
    """``([model], cfg, task)`` of a checkpoint, as fairseq's ``load_model_ensemble_and_task([path], arg_overrides)``
    gives them, from the state :func:`fairseq_state` read: the one checkpoint loader of acl-evaluate, acl-predict
    and the hub. fairseq's own loader is never reached, so nothing reads the file outside :func:`load`."""
    from fairseq import checkpoint_utils

    state = fairseq_state(path, arg_overrides)
    data = (arg_overrides or {}).get("data")
    if data:  # another task's dictionary: one line before fairseq builds the model, not its size-mismatch traceback
        check_state_dictionary(state, data, path)
    try:
        return checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=arg_overrides, state=state)
    except RuntimeError as e:
        found = _EMBED_MISMATCH.search(str(e))
        if not data or not found:
            raise
        raise DictionaryMismatch(
            f"the data dictionary {dictionary_path(data)} gives {found.group(2)} embedding rows, {path} has "
            f"{found.group(1)}: the data was binarized with another vocabulary (another task's folder?); use the data "
            "folder the model was trained on") from None


_EMBED_MISMATCH = re.compile(r"size mismatch for \S*embed_tokens\.weight: copying a param with shape "
                             r"torch\.Size\(\[(\d+), \d+\]\) from checkpoint, the shape in current model is "
                             r"torch\.Size\(\[(\d+), \d+\]\)")


def check_state_dictionary(state: dict, data: str, checkpoint: str) -> None:
    """:func:`check_dictionary` for a checkpoint's state read but not built (its cfg's recorded hash, or a
    converted encoder's conventions record), so that fairseq never loads weights into embeddings of another
    dictionary."""
    cfg = state.get("cfg") or {}
    model_cfg = cfg.get("model") if hasattr(cfg, "get") else None
    if model_cfg is None and state.get("args") is not None:
        model_cfg = state["args"]
    trained = recorded_dictionary(model_cfg)
    if trained is None and model_cfg is not None:
        record = conventions.from_args(model_cfg)
        trained = record["dictionary_sha256"] if record else None
    if trained is not None:  # none recorded: check_loaded_dictionary warns after the build
        check_dictionary(trained, data, checkpoint)


# ---- the data dictionary a checkpoint was trained with ------------------------------------------------

DICTIONARY_KEY = "data_dictionary_sha256"
# set on a model by the builds that record: what its arguments carried before the build (None: nothing, or a
# fresh run). A build records into the arguments of a loaded checkpoint too, so a tool reads this, not DICTIONARY_KEY.
DICTIONARY_BUILT_FROM = "checkpoint_data_dictionary_sha256"


DictionaryMismatch = conventions.DictionaryMismatch  # raised by the one check, conventions.check_data_dictionary
dictionary_path = conventions.data_dictionary_path


def recorded_dictionary(args) -> typing.Optional[str]:
    """The hash in a model's arguments (Namespace, DictConfig or dict), or None."""
    if args is None:
        return None
    return args.get(DICTIONARY_KEY) if isinstance(args, dict) else getattr(args, DICTIONARY_KEY, None)


def record_dictionary(args, data) -> typing.Optional[str]:
    """Put the hash of ``data``'s dictionary into ``args`` unless they carry one already (a loaded
    checkpoint keeps what it was trained with); returns what they carried before."""
    before = recorded_dictionary(args)
    path = dictionary_path(data)
    if before is None and path and os.path.isfile(path):
        from omegaconf import OmegaConf, open_dict

        sha = conventions.dictionary_sha256(path)
        if OmegaConf.is_config(args):
            with open_dict(args):
                args[DICTIONARY_KEY] = sha
        else:
            setattr(args, DICTIONARY_KEY, sha)
    return before


def check_dictionary(trained: typing.Optional[str], data, checkpoint: str) -> None:
    """Refuse ``data`` when its dictionary is not the one ``checkpoint`` was trained with (``trained``: the
    hash the checkpoint records), through :func:`conventions.check_data_dictionary`; warn when the checkpoint
    records none."""
    path = dictionary_path(data)
    if not path or not os.path.isfile(path):
        return  # not a binarized folder: the loader says so
    if trained is None:
        logger.warning(
            "%s records no data dictionary hash (trained before checkpoints carried one, or a plain roberta "
            "under --task sentence_prediction): nothing checks that %s is the dictionary it was trained with",
            checkpoint, path,
        )
        return
    conventions.check_data_dictionary(
        trained, data, f"is not the one {checkpoint} was trained with (sha256 {trained[:12]}...)",
        "this data was binarized with another vocabulary or word order, so every token would read another word's "
        "embedding; use the data folder the model was trained on, or binarize the data again with --srcdict set to "
        "that folder's input0/dict.txt")


def check_loaded_dictionary(model, cfg, checkpoint: str) -> None:
    """:func:`check_dictionary` for a model loaded from ``checkpoint`` with the data folder of ``cfg.task.data``."""
    if hasattr(model, DICTIONARY_BUILT_FROM):
        trained = getattr(model, DICTIONARY_BUILT_FROM)
    else:
        trained = recorded_dictionary(cfg.model)
    if trained is None:  # a converted encoder's conventions record names its dictionary too
        record = conventions.from_args(cfg.model)
        trained = record["dictionary_sha256"] if record else None
    check_dictionary(trained, cfg.task.data, checkpoint)


def dictionary_in_file(path: str) -> typing.Optional[str]:
    """The hash a checkpoint file records, through :func:`load` (memory-mapped where the format allows it); None
    when it records none or cannot be read (a damaged or refused file: fairseq's loader reports those next)."""
    try:
        cfg = read_cfg(path)
    except (CheckpointError, RuntimeError):
        return None  # fairseq's own loader reads it next and reports what is wrong
    return recorded_dictionary(cfg.get("model"))
