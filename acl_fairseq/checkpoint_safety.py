"""Let torch's safe loader (``weights_only=True``, the default since torch 2.6) read fairseq checkpoints.

fairseq 0.12 calls ``torch.load(f, map_location=...)`` without ``weights_only``, so on torch >= 2.6 it
fails on its own checkpoints with ``Unsupported global: argparse.Namespace``. Instead of turning the
safe loader off (passing ``weights_only`` as false, or torch's environment override, which would let a
checkpoint run arbitrary code), we allowlist exactly the plain-data types that fairseq checkpoints
pickle. Anything else, for example a pickle that calls ``os.system``, is still refused by torch
before it is called.

:func:`check_readable` refuses an empty or cut-short checkpoint before anything loads it (the tools, and
the plugin task for ``--restore-file`` and a resumed ``checkpoint_last.pt``), and :func:`reading` turns
what torch raises on the rest into the same one-line :class:`CheckpointError`.
"""
import argparse
import collections
import contextlib
import logging
import os
import pickle
import typing
import zipfile

import torch

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


@contextlib.contextmanager
def reading(path: str):
    """Around a load of ``path``: torch's errors for a damaged file become a :class:`CheckpointError`."""
    try:
        yield
    except (EOFError, pickle.UnpicklingError, OSError) as e:
        why = f"{type(e).__name__}: {e}".rstrip(": ")
        raise CheckpointError(f"{path}: truncated or damaged checkpoint ({why}). {_REFETCH}") from None
    except RuntimeError as e:
        # torch's wording for a cut-short zip archive or legacy file; any other RuntimeError is not ours to name
        if not any(k in str(e) for k in ("PytorchStreamReader", "unexpected EOF", "corrupted")):
            raise
        why = str(e).split(". ")[0]
        raise CheckpointError(f"{path}: truncated or damaged checkpoint ({why}). {_REFETCH}") from None
