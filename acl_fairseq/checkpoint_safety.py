"""Let torch's safe loader (``weights_only=True``, the default since torch 2.6) read fairseq checkpoints.

fairseq 0.12 calls ``torch.load(f, map_location=...)`` without ``weights_only``, so on torch >= 2.6 it
fails on its own checkpoints with ``Unsupported global: argparse.Namespace``. Instead of turning the
safe loader off (passing ``weights_only`` as false, or torch's environment override, which would let a
checkpoint run arbitrary code), we allowlist exactly the plain-data types that fairseq checkpoints
pickle. Anything else, for example a pickle that calls ``os.system``, is still refused by torch
before it is called.
"""
import argparse
import collections
import logging
import typing

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
