# Licensed under the MIT license.
"""Early-exit policies over per-exit logits: one table (:data:`POLICIES`), numpy only (no torch, no model).

A serving runtime without torch applies the very policies that training-time tools apply, so the
decisions are computed on numpy float32 arrays. Torch callers pass tensors as before: they are converted
at the edges (detached, on the CPU) and the results come back as tensors on the input's device.

Every policy decides **per example**, from one number, its ``threshold``: an entropy or confidence level,
or a patience count. Two forms share one step function, so they agree by construction:

- incremental, for the layer-by-layer engine (``inference/early_exit.py``): ``state = init_state(B)``,
  then at each exit ``fire, state = policy_step(policy, logits, state, threshold)``; rows that fire exit
  now, and the caller drops them from ``state`` (``state[keep]``) together with the rest of the batch;
- offline, over all exits at once: ``exit_layer_indices(per_exit_logits, policy, threshold)`` -> (B,).

Policies (METHOD.md "Early-exit inference"), each a row of :data:`POLICIES` with its default threshold,
valid range, acl-evaluate's sweep grid and whether a regression head can run it:
- ``entropy``: exit when ``H(p) / log K < threshold`` (DeeBERT, normalized; entropy from logits in fp32,
  masked -inf logits allowed);
- ``patience``: exit once the prediction has stayed the same for ``threshold`` consecutive exits (PABEE);
  for regression "the same" means ``|pred^m - pred^(m-1)| < delta``; a count ``<= 0`` never fires;
- ``confidence``: exit when ``max_k p_k >= threshold``.

The steps themselves do not check ranges (a threshold above 1 is a valid "always" in a test); the tools
and the hub call :func:`validate` on what a user gives.
"""

import functools
import math
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np

DEFAULT_REGRESSION_DELTA = 0.02  # model units; STS-B targets are score / 5, so 0.1 on the 0-5 scale
_FLOAT32_MIN = np.finfo(np.float32).min  # a float32 scalar: a Python float would make numpy compute in float64

Array = np.ndarray  # or a torch.Tensor, converted at the edges
Step = Callable[..., Tuple[Array, Array]]


# ---- torch callers: converted at the edges ------------------------------------------------------


def _is_torch(x) -> bool:
    return hasattr(x, "detach")  # duck typing: importing torch here would tie the runtime to it


def _torch():
    """The torch module a torch caller has already loaded (this package never imports it: it is torch-free)."""
    return sys.modules["torch"]


def _to_numpy(x) -> np.ndarray:
    """A float32 numpy array of ``x`` (a torch tensor is detached and copied to the CPU)."""
    if _is_torch(x):
        return x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float32)


def _like(value: np.ndarray, ref):
    """``value`` as a torch tensor on ``ref``'s device when ``ref`` is a tensor, else unchanged."""
    if not _is_torch(ref):
        return value
    return _torch().from_numpy(value).to(ref.device)


def _log_softmax(x, xp):
    """``x - logsumexp(x)`` over the last axis with ``xp`` (numpy, or torch to keep autograd); -inf stays -inf."""
    shifted = x - xp.amax(x, axis=-1, keepdims=True)  # shift first: 1e4 + log 2 would round in fp32
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))


def _entropy(x, xp):
    """Entropy of each row of float32 logits ``x`` (B, K), in nats."""
    log_p = _log_softmax(x, xp)
    # clamp so that a -inf logit gives 0 * finfo.min = 0, not 0 * -inf = NaN
    return -xp.sum(xp.exp(log_p) * xp.clip(log_p, _FLOAT32_MIN, None), axis=-1)


def prediction_entropy(logits: Array, normalized: bool = True) -> Array:
    """Entropy of softmax(logits), from logits: ``-(softmax * log_softmax).sum(-1)`` in fp32.

    Args:
        logits: (B, K) numpy array or torch tensor, any float dtype; -inf entries (masked classes) are
            allowed: each adds ``0 * log 0 = 0``, so a row whose logits are all -inf but one has entropy 0,
            never NaN.
        normalized: divide by ``log K`` (the result is then in [0, 1]).

    Returns:
        (B,) float32 whatever the input dtype, of the input's kind (a tensor keeps its device and autograd:
        the same formula runs with torch's operations); 0 when K == 1. Finite for logits of magnitude 1e4
        (a softmax of exactly 0 multiplies a finite log-probability), unlike ``p * log p``.
    """
    if _is_torch(logits):
        x, xp = logits.float(), _torch()
    else:
        x, xp = np.asarray(logits, dtype=np.float32), np
    num_classes = x.shape[-1]
    if num_classes <= 1:
        return xp.zeros_like(x[..., 0])  # one class: H = 0 = log 1
    entropy = _entropy(x, xp)
    return entropy / math.log(num_classes) if normalized else entropy


# ---- the step functions: numpy (B, K) float32 logits and (B, 2) state in, (fire, state) out ---------


def step_function(fn: Step) -> Step:
    """Let a numpy step take torch tensors too: ``(fire, state)`` then come back as tensors on the logits'
    device. Every step has the signature ``(logits, state, threshold, regression, delta)``."""

    @functools.wraps(fn)
    def step(logits, state, threshold, regression: bool = False, delta: float = DEFAULT_REGRESSION_DELTA):
        fire, new_state = fn(_to_numpy(logits), _to_numpy(state), threshold, regression, delta)
        return _like(np.asarray(fire, dtype=bool), logits), _like(new_state, logits)

    return step


def init_state(batch_size: int, device=None) -> Array:
    """Running state of a batch before its first exit: (B, 2) float32 ``[previous prediction, run]``.

    ``run`` counts consecutive exits whose prediction matched the previous exit's (PABEE's counter).
    The previous prediction starts as NaN, which matches nothing. A numpy array, or a torch tensor on
    ``device`` when one is given.
    """
    state = np.zeros((batch_size, 2), dtype=np.float32)
    state[:, 0] = np.nan
    if device is None:
        return state
    return _torch().from_numpy(state).to(device)


@step_function
def entropy_step(logits, state, threshold, regression=False, delta=DEFAULT_REGRESSION_DELTA):
    """Rows whose normalized entropy is below ``threshold``; the state passes through."""
    return prediction_entropy(logits) < threshold, state


@step_function
def confidence_step(logits, state, threshold, regression=False, delta=DEFAULT_REGRESSION_DELTA):
    """Rows whose top softmax probability is at least ``threshold``; the state passes through."""
    return np.exp(_log_softmax(logits, np)).max(axis=-1) >= threshold, state


@step_function
def patience_step(logits, state, patience, regression=False, delta=DEFAULT_REGRESSION_DELTA):
    """One exit of PABEE. logits: (B, K) (K = 1 for regression); state: (B, 2) from :func:`init_state`.

    Returns ``(fire (B,) bool, new state (B, 2))``; ``patience <= 0`` never fires.
    """
    patience = int(patience)  # a count (2.5 means 2, as before the table checked ranges)
    pred = logits[:, 0] if regression else logits.argmax(axis=-1).astype(np.float32)
    prev, run = state[:, 0], state[:, 1]
    with np.errstate(invalid="ignore"):  # a NaN previous prediction (the first exit) matches nothing
        same = np.abs(pred - prev) < delta if regression else pred == prev
    run = np.where(same, run + 1, 0).astype(np.float32)
    fire = run >= patience if patience > 0 else np.zeros_like(same)
    return fire, np.stack([pred, run], axis=-1)


# ---- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """One early-exit policy: what the tools (acl-evaluate, acl-predict, the hub, the latency benchmark)
    need to run, check, default and sweep it."""

    name: str
    step: Step  # (logits, state, threshold, regression, delta) -> (fire, state); see step_function
    rule: str  # when a row exits, in words, for help texts
    default: float  # the threshold of acl-predict and the hub when none is given
    low: float  # valid thresholds: [low, high]; NaN never
    high: float
    integer: bool = False  # the threshold is a count: whole numbers only
    grid: Optional[Tuple[float, ...]] = None  # acl-evaluate's sweep; None: every count 1 .. exits - 1
    regression_ok: bool = False  # runs on a regression head (one output, no class probabilities)
    sweep_flag: Optional[str] = None  # acl-evaluate's flag for the sweep; default --NAME-thresholds

    @property
    def range_text(self) -> str:
        if self.integer and self.low == 1 and math.isinf(self.high):
            return "a positive integer (1, 2, ...)"
        kind = "an integer in " if self.integer else ""
        return f"{kind}[{self.low:g}, {self.high:g}]"

    @property
    def flag(self) -> str:
        return self.sweep_flag or f"--{self.name}-thresholds"

    @property
    def grid_text(self) -> str:
        return " ".join(f"{v:g}" for v in self.grid) if self.grid is not None else "1 .. (number of exits - 1)"

    def sweep(self, num_exits: int) -> List[float]:
        """acl-evaluate's default settings on a model with ``num_exits`` exits."""
        return list(self.grid) if self.grid is not None else list(range(1, num_exits))


POLICIES: Dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("entropy", entropy_step, "exit when the normalized entropy H/log K is below it", 0.3, 0.0, 1.0,
               grid=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8), sweep_flag="--thresholds"),
        Policy("patience", patience_step, "exit once the prediction stayed the same for that many consecutive "
               "exits", 2, 1, math.inf, integer=True, regression_ok=True, sweep_flag="--patience-values"),
        Policy("confidence", confidence_step, "exit when the top class probability is at least it", 0.9, 0.0, 1.0,
               grid=(0.99, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6)),
    )
}


def get(policy: str) -> Policy:
    """The table's row of ``policy``; ValueError naming the choices for another name."""
    if policy not in POLICIES:
        raise ValueError(f"unknown early-exit policy {policy!r}; expected one of {', '.join(POLICIES)}")
    return POLICIES[policy]


def validate(policy: str, threshold: Optional[float] = None, regression: bool = False) -> Union[float, int]:
    """The threshold to run ``policy`` with (its default when ``threshold`` is None), checked against the
    table: ValueError naming the valid range for NaN or a value outside it, and for a policy a regression
    head cannot run. Counts come back as ``int``."""
    row = get(policy)
    if regression and not row.regression_ok:
        allowed = ", ".join(p.name for p in POLICIES.values() if p.regression_ok)
        raise ValueError(f"the {policy} policy needs class probabilities: a regression head runs {allowed} only "
                         "(predictions agree when closer than delta, --regression-delta)")
    if threshold is None:
        return row.default
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"{policy} threshold {threshold!r} is not a number; it takes {row.range_text}") from None
    whole = math.isfinite(value) and value == int(value)
    if math.isnan(value) or not row.low <= value <= row.high or (row.integer and not whole):
        raise ValueError(f"{policy} threshold {threshold!r} is out of range: it takes {row.range_text} "
                         f"({row.rule})")
    return int(value) if row.integer else value


# ---- the two forms ------------------------------------------------------------------------------


def policy_step(
    policy: str,
    logits: Array,
    state: Array,
    threshold: float,
    regression: bool = False,
    delta: float = DEFAULT_REGRESSION_DELTA,
) -> Tuple[Array, Array]:
    """Incremental form: which rows exit at this exit. logits: (B, K); state: (B, 2).

    Returns ``(fire (B,) bool, state (B, 2))``, of the logits' kind; ``state`` only matters to ``patience``.
    A NaN threshold is refused (it would decide silently: never, or always).
    """
    step = get(policy).step
    if math.isnan(float(threshold)):
        raise ValueError(f"{policy} threshold is NaN; it takes {POLICIES[policy].range_text}")
    return step(logits, state, threshold, regression, delta)


def exit_layer_indices(
    per_exit_logits: List[Array],
    policy: str,
    threshold: float,
    regression: bool = False,
    delta: float = DEFAULT_REGRESSION_DELTA,
) -> Array:
    """Offline form: the exit each example leaves at. per_exit_logits: M arrays or tensors (B, K).

    Returns (B,) int64 (a long tensor on the logits' device for tensors), 0-based indices into the exits;
    ``M - 1`` (the last exit) where nothing fires.
    """
    arrays = [_to_numpy(x) for x in per_exit_logits]
    batch_size = arrays[0].shape[0]
    chosen = np.full(batch_size, len(arrays) - 1, dtype=np.int64)
    decided = np.zeros(batch_size, dtype=bool)
    state = init_state(batch_size)
    for m, logits in enumerate(arrays):
        fire, state = policy_step(policy, logits, state, threshold, regression=regression, delta=delta)
        chosen[fire & ~decided] = m
        decided |= fire
    return _like(chosen, per_exit_logits[0])


def gather_exit_logits(per_exit_logits: List[Array], exit_index: Array) -> Array:
    """The logits of the exit each example left at. per_exit_logits: M x (B, K); exit_index: (B,).
    Tensors stay tensors (dtype and device kept)."""
    if _is_torch(per_exit_logits[0]):
        torch = _torch()
        stacked = torch.stack(per_exit_logits, dim=1)  # B x M x K
        return stacked[torch.arange(stacked.size(0), device=stacked.device), exit_index]
    stacked = np.stack(per_exit_logits, axis=1)  # B x M x K
    return stacked[np.arange(stacked.shape[0]), np.asarray(exit_index)]


# ---- one policy by name, over all exits (STYLE.md's names) -------------------------------------


def entropy_exit_layer(per_exit_logits: List[Array], threshold: float) -> Array:
    """(B,) 0-based exit index of the entropy policy (see :func:`exit_layer_indices`)."""
    return exit_layer_indices(per_exit_logits, "entropy", threshold)


def patience_exit_layer(
    per_exit_logits: List[Array], patience: int, regression: bool = False, delta: float = DEFAULT_REGRESSION_DELTA
) -> Array:
    """(B,) 0-based exit index of the patience policy (see :func:`exit_layer_indices`)."""
    return exit_layer_indices(per_exit_logits, "patience", patience, regression=regression, delta=delta)


def confidence_exit_layer(per_exit_logits: List[Array], threshold: float) -> Array:
    """(B,) 0-based exit index of the confidence policy (see :func:`exit_layer_indices`)."""
    return exit_layer_indices(per_exit_logits, "confidence", threshold)
