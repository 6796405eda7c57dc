"""TensorBoard embedding-projector snapshots of ACL's geometry: validation representations u^m of
a fixed sample, plus the label embeddings (rows of ``out_proj.weight``) of the same exit.

One snapshot tag per exit (``exit{L}``), written with tensorboardX's ``SummaryWriter.add_embedding``
(``<logdir>/<step:05d>/exit{L}/tensors.tsv`` and ``metadata.tsv``, listed in
``<logdir>/projector_config.pbtxt``). Every point has the metadata columns ``kind`` (``sample`` or
``label embedding``), ``gold`` and ``predicted`` label names, ``exit_layer`` and ``id`` (the dataset
index of a sample, so that one sentence can be followed across snapshots; ``-`` for label rows).
Vectors are L2-normalized: ACL and the ``align_*`` scalars measure cosines, so the unit sphere is
the geometry that matters (and the norms of u and of label embeddings differ by orders of magnitude).
A healthy ACL run shows, across steps, the samples of each class gathering around their label
embedding, and shallow exits' clouds looking like the last exit's.

The pure parts (index choice, rows) are here; :mod:`acl_fairseq.tasks.sentence_prediction_acl` calls
them at the start of a validation. Cost per snapshot: one eval forward of ``n`` samples (about
``n / valid size`` of a validation pass) and ``M`` TSV files of ``(n + K) x d`` numbers as text,
about 8.5 bytes a number: ~1.7 MB per exit for n = 256, d = 768, ~10 MB per snapshot of a 6-exit
base model -- keep ``--projector-every`` sparse on long runs.
"""
import logging
import os
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .heads import collect_exit_outputs

logger = logging.getLogger(__name__)

METADATA_HEADER = ["kind", "gold", "predicted", "exit_layer", "id"]
SAMPLE, LABEL_EMBEDDING = "sample", "label embedding"
DECIMALS = 5  # of the written coordinates


class Snapshot(NamedTuple):
    tag: str  # exit{L}
    mat: np.ndarray  # (n + K, d) unit rows rounded to DECIMALS: n samples then K label embeddings
    metadata: List[List[str]]  # n + K rows of METADATA_HEADER columns


def resolve_logdir(projector_logdir: Optional[str], tensorboard_logdir: Optional[str]) -> str:
    """``projector_logdir``, else ``<tensorboard_logdir>/projector``; a clear error when neither is set.

    Unresolved OmegaConf interpolations (``"${...}"``, e.g. a task config built outside fairseq-train)
    count as unset.
    """

    def is_set(value):
        return isinstance(value, str) and value != "" and not value.startswith("${")

    if is_set(projector_logdir):
        return projector_logdir
    if is_set(tensorboard_logdir):
        return os.path.join(tensorboard_logdir, "projector")
    raise ValueError(
        "--projector-every > 0 writes TensorBoard projector snapshots but no log dir is known: pass "
        "--tensorboard-logdir DIR (snapshots go to DIR/projector) or --projector-logdir DIR, or set "
        "--projector-every 0"
    )


def choose_indices(dataset_size: int, num_samples: int, seed: int) -> List[int]:
    """A seeded sample of ``min(num_samples, dataset_size)`` distinct dataset indices, sorted.

    Uses its own RandomState, so it neither reads nor moves fairseq's global random streams.
    """
    if num_samples <= 0:
        raise ValueError(f"--projector-samples must be positive, got {num_samples}")
    n = min(num_samples, dataset_size)
    rng = np.random.RandomState(seed)
    return sorted(int(i) for i in rng.choice(dataset_size, size=n, replace=False))


def _clean(value) -> str:
    """A metadata cell: TSV-safe (no tabs or newlines), never empty."""
    text = str(value).replace("\t", " ").replace("\n", " ").strip()
    return text or "-"


def _name(names: Sequence[str], index: int) -> str:
    return names[index] if 0 <= index < len(names) else str(index)


def snapshot_rows(
    layer: int,
    features: torch.Tensor,
    label_embeddings: torch.Tensor,
    logits: torch.Tensor,
    targets: Optional[torch.Tensor],
    ids: Sequence[int],
    label_names: Sequence[str],
    regression: bool = False,
) -> Snapshot:
    """The projector points of one exit: the ``n`` samples' u (features (n, d)), then the ``K`` label
    embeddings (label_embeddings (K, d)), all L2-normalized, with their metadata rows.

    ``logits`` (n, K) give the predicted label; ``targets`` (n,) the gold one (None: unlabeled split).
    With ``regression`` the gold and predicted cells hold scores and the single row of the head is
    named ``score``.
    """
    u = F.normalize(features.detach().float().cpu(), dim=-1, eps=1e-12)
    w = F.normalize(label_embeddings.detach().float().cpu(), dim=-1, eps=1e-12)
    logits = logits.detach().float().cpu()
    meta: List[List[str]] = []
    if regression:
        preds = [f"{v:.3f}" for v in logits.view(len(ids), -1)[:, 0].tolist()]
        golds = ["-"] * len(ids)
        if targets is not None:
            golds = [f"{v:.3f}" for v in targets.float().view(len(ids), -1)[:, 0].tolist()]
        label_rows = ["score"] * w.size(0)
    else:
        preds = [_name(label_names, i) for i in logits.argmax(-1).tolist()]
        golds = [_name(label_names, i) for i in targets.view(-1).tolist()] if targets is not None else ["-"] * len(ids)
        label_rows = [_name(label_names, k) for k in range(w.size(0))]
    for gold, pred, i in zip(golds, preds, ids):
        meta.append([SAMPLE, _clean(gold), _clean(pred), str(layer), str(i)])
    for name in label_rows:
        meta.append([LABEL_EMBEDDING, _clean(name), _clean(name), str(layer), "-"])
    # 5 decimals of a unit vector are plenty; float64 so that the text is "0.10144", not 17 digits
    mat = np.round(torch.cat([u, w], 0).double().numpy(), DECIMALS)
    return Snapshot(tag=f"exit{layer}", mat=mat, metadata=meta)


def _run_batches(model, dataset, indices: Sequence[int], head_name: str, batch_size: int):
    """``(features, logits, targets, ids, last output)``: per batch, every exit's features and logits (float32, on
    the CPU), the targets where the data has them, and the dataset indices in the collated order."""
    from fairseq import utils

    device = next(model.parameters()).device
    feats: List[List[torch.Tensor]] = []
    logits: List[List[torch.Tensor]] = []
    targets: List[torch.Tensor] = []
    ids: List[int] = []
    for start in range(0, len(indices), batch_size):
        sample = dataset.collater([dataset[i] for i in indices[start : start + batch_size]])
        sample = utils.apply_to_sample(lambda t: t.to(device), sample)
        out = collect_exit_outputs(model, sample["net_input"], head_name)
        feats.append([f.float().cpu() for f in out.features])
        logits.append([lg.float().cpu() for lg in out.logits])
        if sample.get("target") is not None:
            targets.append(sample["target"].cpu())
        ids.extend(sample["id"].tolist())  # dataset indices, in the collated order
    return feats, logits, targets, ids, out


@torch.no_grad()
def compute_snapshots(
    model,
    dataset,
    indices: Sequence[int],
    head_name: str,
    label_names: Sequence[str],
    regression: bool = False,
    batch_size: int = 32,
) -> List[Snapshot]:
    """Run ``model`` in eval mode (then restore its mode) on ``dataset[indices]`` in batches of
    ``batch_size`` via :func:`collect_exit_outputs`; one :class:`Snapshot` per exit."""
    if len(indices) == 0:
        return []
    was_training = model.training
    model.eval()
    try:
        feats, logits, targets, ids, out = _run_batches(model, dataset, indices, head_name, batch_size)
        label_embeddings, layers = out.label_embeddings, out.layers
    finally:
        model.train(was_training)
    target = torch.cat(targets, 0) if len(targets) == len(feats) and targets else None
    return [
        snapshot_rows(
            layer,
            torch.cat([f[m] for f in feats], 0),
            label_embeddings[m],
            torch.cat([lg[m] for lg in logits], 0),
            target,
            ids,
            label_names,
            regression,
        )
        for m, layer in enumerate(layers)
    ]


def write_snapshots(writer, snapshots: Sequence[Snapshot], global_step: int) -> None:
    """``writer.add_embedding`` per exit (tag ``exit{L}``) at ``global_step`` (a tensorboardX SummaryWriter)."""
    for snap in snapshots:
        writer.add_embedding(
            snap.mat, metadata=snap.metadata, global_step=global_step, tag=snap.tag, metadata_header=METADATA_HEADER
        )
    writer.flush()


def read_snapshot(logdir: str, step: int, tag: str) -> Dict[str, list]:
    """Read one snapshot back (tests, notebooks): ``{"tensors": [[float]], "metadata": [dict]}``."""
    base = os.path.join(logdir, f"{step:05d}", tag)
    with open(os.path.join(base, "tensors.tsv")) as f:
        tensors = [[float(x) for x in line.rstrip("\n").split("\t")] for line in f if line.strip()]
    with open(os.path.join(base, "metadata.tsv"), encoding="utf8") as f:
        lines = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    header, body = lines[0], lines[1:]
    return {"tensors": tensors, "metadata": [dict(zip(header, row)) for row in body]}
