"""Every exit's logits over a binarized split and their GLUE metrics: what acl-evaluate scores and the model card
reports (:mod:`acl_fairseq.cli.evaluate`, :mod:`acl_fairseq.hf.model_card`)."""
from typing import Dict, List

import torch

from acl_fairseq.inference import early_exit
from acl_runtime import glue_tasks
from acl_torch import glue_metrics


def make_batches(dataset, ids: List[int], batch_size: int) -> List[Dict]:
    """Collated batches of ``ids``, sorted by length to limit padding."""
    order = sorted(ids, key=lambda i: (int(dataset.num_tokens(i)), i))
    return [dataset.collater([dataset[i] for i in order[s : s + batch_size]]) for s in range(0, len(order), batch_size)]


def _to(batch: Dict, device) -> torch.Tensor:
    return batch["net_input"]["src_tokens"].to(device)


def collect_exit_logits(model, batches: List[Dict], head_name: str):
    """Every exit's logits over ``batches``: (ids (N,), logits (N, M, K), targets (N, ...) or None)."""
    device = next(model.parameters()).device
    ids, logits, targets = [], [], []
    for batch in batches:
        out = early_exit.early_exit_forward(model, _to(batch, device), head_name, policy=None)
        ids.append(batch["id"])
        logits.append(out.exit_logits.cpu())
        targets.append(batch.get("target"))
    has_target = all(t is not None for t in targets)
    return torch.cat(ids), torch.cat(logits), (torch.cat(targets) if has_target else None)


def score(logits: torch.Tensor, targets: torch.Tensor, ctx: Dict) -> Dict[str, float]:
    """The task's GLUE metrics of (N, K) logits (classification: argmax; regression: the value)."""
    if ctx["regression"]:
        found = glue_metrics.regression_metrics(logits[:, 0].tolist(), targets.view(-1).tolist())
    else:
        found = glue_metrics.classification_metrics(
            logits.argmax(-1).tolist(), targets.view(-1).tolist(), ctx["positive"]
        )
    known = glue_tasks.tasks().get(ctx["task_name"])
    return {k: found[k] for k in known.metrics if k in found} if known else found
