# Licensed under the MIT license.
"""Early-exit policies over per-exit logits: pure tensor functions (torch only, no model, no state).

Every policy decides **per example**. Two forms share one step function, so they agree by
construction:

- incremental, for the layer-by-layer engine (``early_exit.py``): ``state = init_state(B)``, then at
  each exit ``fire, state = policy_step(policy, logits, state, value)``; rows that fire exit now, and
  the caller drops them from ``state`` (``state[keep]``) together with the rest of the batch;
- offline, over all exits at once: ``exit_layer_indices(per_exit_logits, policy, value)`` -> (B,).

Policies (METHOD.md "Early-exit inference"):
- ``entropy``: exit when ``H(p) / log K < value`` (DeeBERT, normalized; entropy from logits in fp32,
  masked -inf logits allowed);
- ``patience``: exit once the prediction has stayed the same for ``value`` consecutive exits (PABEE);
  for regression "the same" means ``|pred^m - pred^(m-1)| < delta``; ``value <= 0`` never fires;
- ``confidence``: exit when ``max_k p_k >= value``.
"""

import math
from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

POLICIES = ("entropy", "patience", "confidence")
DEFAULT_REGRESSION_DELTA = 0.02  # model units; STS-B targets are score / 5, so 0.1 on the 0-5 scale


def prediction_entropy(logits: Tensor, normalized: bool = True) -> Tensor:
    """Entropy of softmax(logits), from logits: ``-(softmax * log_softmax).sum(-1)`` in fp32.

    Args:
        logits: (B, K), any float dtype; -inf entries (masked classes) are allowed: each adds
            ``0 * log 0 = 0``, so a row whose logits are all -inf but one has entropy 0, never NaN.
        normalized: divide by ``log K`` (the result is then in [0, 1]).

    Returns:
        (B,) float32 whatever the input dtype; 0 when K == 1. Finite for logits of magnitude 1e4
        (a softmax of exactly 0 multiplies a finite log-probability), unlike ``p * log p``.
    """
    x = logits.float()
    num_classes = x.shape[-1]
    if num_classes <= 1:
        return x.new_zeros(x.shape[:-1])  # one class: H = 0 = log 1
    # clamp so that a -inf logit gives 0 * finfo.min = 0, not 0 * -inf = NaN
    log_p = F.log_softmax(x, dim=-1).clamp_min(torch.finfo(torch.float32).min)
    entropy = -(F.softmax(x, dim=-1) * log_p).sum(dim=-1)  # (B,)
    return entropy / math.log(num_classes) if normalized else entropy


def entropy_exits(logits: Tensor, threshold: float) -> Tensor:
    """(B,) bool: rows whose normalized entropy is below ``threshold``. logits: (B, K)."""
    return prediction_entropy(logits, normalized=True) < threshold


def confidence_exits(logits: Tensor, threshold: float) -> Tensor:
    """(B,) bool: rows whose top softmax probability is at least ``threshold``. logits: (B, K)."""
    return F.softmax(logits.float(), dim=-1).max(dim=-1).values >= threshold


def init_state(batch_size: int, device=None) -> Tensor:
    """Running state of a batch before its first exit: (B, 2) float32 ``[previous prediction, run]``.

    ``run`` counts consecutive exits whose prediction matched the previous exit's (PABEE's counter).
    The previous prediction starts as NaN, which matches nothing.
    """
    state = torch.zeros(batch_size, 2, dtype=torch.float32, device=device)
    state[:, 0] = float("nan")
    return state


def patience_step(
    logits: Tensor, state: Tensor, patience: int, regression: bool = False, delta: float = DEFAULT_REGRESSION_DELTA
) -> Tuple[Tensor, Tensor]:
    """One exit of PABEE. logits: (B, K) (K = 1 for regression); state: (B, 2) from :func:`init_state`.

    Returns ``(fire (B,) bool, new state (B, 2))``; ``patience <= 0`` never fires.
    """
    logits = logits.float()
    pred = logits[:, 0] if regression else logits.argmax(dim=-1).float()
    prev, run = state[:, 0], state[:, 1]
    same = (pred - prev).abs() < delta if regression else pred == prev  # NaN previous: False
    run = torch.where(same, run + 1, torch.zeros_like(run))
    fire = run >= patience if patience > 0 else torch.zeros_like(same)
    return fire, torch.stack([pred, run], dim=-1)


def policy_step(
    policy: str,
    logits: Tensor,
    state: Tensor,
    value: float,
    regression: bool = False,
    delta: float = DEFAULT_REGRESSION_DELTA,
) -> Tuple[Tensor, Tensor]:
    """Incremental form: which rows exit at this exit. logits: (B, K); state: (B, 2).

    Returns ``(fire (B,) bool, state (B, 2))``; ``state`` only matters to ``patience``.
    """
    if policy == "patience":
        return patience_step(logits, state, int(value), regression=regression, delta=delta)
    if policy == "entropy":
        return entropy_exits(logits, value), state
    if policy == "confidence":
        return confidence_exits(logits, value), state
    raise ValueError(f"unknown early-exit policy {policy!r}; expected one of {POLICIES}")


def exit_layer_indices(
    per_exit_logits: List[Tensor],
    policy: str,
    value: float,
    regression: bool = False,
    delta: float = DEFAULT_REGRESSION_DELTA,
) -> Tensor:
    """Offline form: the exit each example leaves at. per_exit_logits: M tensors (B, K).

    Returns (B,) long, 0-based indices into the exits; ``M - 1`` (the last exit) where nothing fires.
    """
    num_exits = len(per_exit_logits)
    batch_size = per_exit_logits[0].size(0)
    device = per_exit_logits[0].device
    chosen = torch.full((batch_size,), num_exits - 1, dtype=torch.long, device=device)
    decided = torch.zeros(batch_size, dtype=torch.bool, device=device)
    state = init_state(batch_size, device)
    for m, logits in enumerate(per_exit_logits):
        fire, state = policy_step(policy, logits, state, value, regression=regression, delta=delta)
        newly = fire & ~decided
        chosen[newly] = m
        decided |= fire
    return chosen


def gather_exit_logits(per_exit_logits: List[Tensor], exit_index: Tensor) -> Tensor:
    """The logits of the exit each example left at. per_exit_logits: M x (B, K); exit_index: (B,)."""
    stacked = torch.stack(per_exit_logits, dim=1)  # B x M x K
    return stacked[torch.arange(stacked.size(0), device=stacked.device), exit_index]


def entropy_exit_layer(per_exit_logits: List[Tensor], threshold: float) -> Tensor:
    """(B,) 0-based exit index of the entropy policy (see :func:`exit_layer_indices`)."""
    return exit_layer_indices(per_exit_logits, "entropy", threshold)


def patience_exit_layer(
    per_exit_logits: List[Tensor], patience: int, regression: bool = False, delta: float = DEFAULT_REGRESSION_DELTA
) -> Tensor:
    """(B,) 0-based exit index of the patience policy (see :func:`exit_layer_indices`)."""
    return exit_layer_indices(per_exit_logits, "patience", patience, regression=regression, delta=delta)


def confidence_exit_layer(per_exit_logits: List[Tensor], threshold: float) -> Tensor:
    """(B,) 0-based exit index of the confidence policy (see :func:`exit_layer_indices`)."""
    return exit_layer_indices(per_exit_logits, "confidence", threshold)
