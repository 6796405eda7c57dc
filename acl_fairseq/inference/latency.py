# Licensed under the MIT license.
"""Wall-clock latency of layer-by-layer early exit against running every layer, measured side by side.

The two systems are the engine of :mod:`acl_fairseq.inference.early_exit` (``early_exit_forward``, which stops
computing for the rows that exit) and the all-layers baseline (``full_forward``: fairseq's encoder, then
the final exit), run over the same token batches in every round. ``acl-evaluate`` fills its report's
latency fields from :func:`add_timing`; ``benchmarks/early_exit_latency.py`` reads the rounds of
:func:`side_by_side` itself.
"""

import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch

from acl_fairseq.inference import early_exit
from acl_runtime import exits

Clock = Tuple[float, float]  # (wall seconds, process CPU seconds)


def clock(fn: Callable[[], None], device: torch.device) -> Clock:
    """``(wall, CPU)`` seconds of ``fn()``, the device synchronized before and after. The process CPU time
    (every thread's) hardly moves when other jobs share the cores, where the wall clock does."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync()
    return time.perf_counter() - wall, time.process_time() - cpu


def side_by_side(
    model,
    batches: List[torch.Tensor],
    head_name: str,
    policy: str,
    threshold: float,
    repeats: int,
    regression: bool = False,
    delta: float = exits.DEFAULT_REGRESSION_DELTA,
    alternate: bool = False,
) -> Dict[str, List[Clock]]:
    """``{"full": [...], "exit": [...]}``: one :data:`Clock` per round of a pass over all ``batches`` (token
    tensors on the model's device), all layers and early exit, after one untimed warm-up of each on the first
    batch. Each round runs all layers first; with ``alternate``, the order swaps every round (early exit first
    in round 0), so that neither always runs on a warmer cache."""
    device = next(model.parameters()).device

    def run_full():
        for tokens in batches:
            early_exit.full_forward(model, tokens, head_name)

    def run_exit():
        for tokens in batches:
            early_exit.early_exit_forward(model, tokens, head_name, policy, threshold, regression, delta)

    early_exit.full_forward(model, batches[0], head_name)  # warm-up (allocator, kernels)
    early_exit.early_exit_forward(model, batches[0], head_name, policy, threshold, regression, delta)
    out: Dict[str, List[Clock]] = {"full": [], "exit": []}
    for r in range(repeats):
        if alternate and r % 2 == 0:
            out["exit"].append(clock(run_exit, device))
            out["full"].append(clock(run_full, device))
        else:
            out["full"].append(clock(run_full, device))
            out["exit"].append(clock(run_exit, device))
    return out


def _tokens(batches: List[Dict], device) -> List[torch.Tensor]:
    return [batch["net_input"]["src_tokens"].to(device) for batch in batches]


def time_side_by_side(model, batches: List[Dict], head_name: str, policy: str, threshold: float, ctx: Dict):
    """Median wall-clock seconds per example of (all layers, early exit) over collated ``batches``."""
    n = sum(len(b["id"]) for b in batches)
    tokens = _tokens(batches, next(model.parameters()).device)
    rounds = side_by_side(model, tokens, head_name, policy, threshold, ctx["repeats"], ctx["regression"], ctx["delta"])
    return tuple(statistics.median(wall for wall, _ in rounds[k]) / n for k in ("full", "exit"))


def engine_agreement(model, batches, head_name, setting, offline_index, pos_of_id, ctx) -> float:
    """Fraction of timed examples where the layer-by-layer engine exits where the offline policy does."""
    device = next(model.parameters()).device
    same, total = 0, 0
    for batch, tokens in zip(batches, _tokens(batches, device)):
        out = early_exit.early_exit_forward(
            model, tokens, head_name, setting["policy"], setting["threshold"], ctx["regression"], ctx["delta"]
        )
        offline = offline_index[[pos_of_id[int(i)] for i in batch["id"]]]
        same += int((out.exit_index.cpu() == offline).sum())
        total += len(offline)
    return same / max(total, 1)


def add_timing(model, setting: Dict, offline_index, timing_batches: Dict, head_name: str, pos_of_id: Dict, ctx: Dict):
    """Fill the latency fields of ``setting`` (None when timing is off)."""
    for mode in ("batch1", "batched"):
        full = exit_ = None
        if timing_batches[mode]:
            full, exit_ = time_side_by_side(
                model, timing_batches[mode], head_name, setting["policy"], setting["threshold"], ctx
            )
        setting[f"latency_full_{mode}_s"] = full
        setting[f"latency_exit_{mode}_s"] = exit_
        setting[f"wallclock_speedup_{mode}"] = full / exit_ if full and exit_ else None
    batched = timing_batches["batched"]
    setting["engine_agreement"] = (
        engine_agreement(model, batched, head_name, setting, offline_index, pos_of_id, ctx) if batched else None
    )
