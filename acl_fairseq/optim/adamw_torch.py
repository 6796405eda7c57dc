"""``--optimizer adamw_torch``: fairseq's ``adam`` update, computed by ``torch.optim.AdamW``'s fused or
multi-tensor kernels instead of fairseq's per-parameter Python loop (what ``adam`` falls back to
without apex or fairseq's fused_adam_cuda).

Same flags and defaults as ``--optimizer adam``: ``--adam-betas '(0.9,0.98)' --adam-eps 1e-6
--weight-decay 0.1 --lr ...`` mean the same, and the parameters follow ``adam``'s to float rounding
(tests/training/test_optim.py bounds the difference). The two differ in where eps goes:
fairseq divides by ``sqrt(v) + eps`` and folds ``sqrt(1 - beta2^t)`` into the step size, torch
divides by ``sqrt(v) / sqrt(1 - beta2^t) + eps``. The same update follows from giving torch
``eps / sqrt(1 - beta2^t)`` at step t, which this optimizer does before every step, per parameter
step count. Both apply decoupled weight decay ``p -= lr * wd * p`` to the weights before the Adam
update.

Resuming a checkpoint written with ``--optimizer adam`` needs ``--reset-optimizer`` in fp32: fairseq
compares the optimizer class names (``FairseqAdam`` vs ``FairseqAdamWTorch``) and refuses. Under
``--fp16``/``--bf16`` both are saved as ``FP16Optimizer``, fairseq loads adam's state here, and
training goes on as adam would have (same state keys; the integer steps become torch's step tensors).
``--memory-efficient-fp16`` is refused: torch would keep fp16 moments and update fp16 weights.
"""
import inspect
import logging
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed as dist
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

logger = logging.getLogger(__name__)

IMPLEMENTATION_CHOICES = ChoiceEnum(["auto", "fused", "foreach", "for-loop"])
# fused AdamW kernels: CUDA's is torch's main one; CPU's matches fairseq's adam as closely as foreach
# does (tests/training/test_optim.py) and is the fastest there (for-loop beats foreach on CPU)
_FUSED_DEVICES = ("cuda", "cpu")
# (fused, foreach) arguments of torch.optim.AdamW
_FLAGS = {"fused": (True, False), "foreach": (False, True), "for-loop": (False, False)}

# torch wraps each optimizer class's ``step`` once, to run step hooks and profiling
# (Optimizer._patch_step_function). This class's own step is wrapped, so it calls AdamW's unwrapped:
# the wrapped one would run the hooks a second time.
_ADAMW_STEP = inspect.unwrap(torch.optim.AdamW.step, stop=lambda f: not getattr(f, "hooked", False))


@dataclass
class FairseqAdamWTorchConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(
        default=1e-8,
        metadata={"help": "epsilon for Adam optimizer, added to sqrt(v) before bias correction as in --optimizer adam"},
    )
    weight_decay: float = field(
        default=0.0, metadata={"help": "decoupled weight decay (p -= lr * wd * p), as in --optimizer adam"}
    )
    adamw_implementation: IMPLEMENTATION_CHOICES = field(
        default="auto",
        metadata={
            "help": "torch.optim.AdamW kernel: 'fused' (one kernel for all tensors), 'foreach' "
            "(multi-tensor ops), 'for-loop' (one tensor at a time); 'auto' = fused where every "
            "parameter is a floating-point tensor on CUDA or CPU, else foreach. To resume a checkpoint "
            "of --optimizer adam in fp32, add --reset-optimizer (fairseq refuses another optimizer)"
        },
    )
    # not options of their own: read to refuse memory-efficient mixed precision at build time
    memory_efficient_fp16: bool = II("common.memory_efficient_fp16")
    memory_efficient_bf16: bool = II("common.memory_efficient_bf16")
    lr: List[float] = II("optimization.lr")


@register_optimizer("adamw_torch", dataclass=FairseqAdamWTorchConfig)
class FairseqAdamWTorch(FairseqOptimizer):
    """fairseq's ``adam`` (the AdamW variant) on ``torch.optim.AdamW``'s kernels; see the module doc."""

    def __init__(self, cfg: FairseqAdamWTorchConfig, params):
        super().__init__(cfg)
        for flag in ("memory_efficient_fp16", "memory_efficient_bf16"):
            if _config_flag(cfg, flag):
                raise ValueError(
                    f"--optimizer adamw_torch does not support --{flag.replace('_', '-')}: torch's AdamW "
                    "would keep its moments in fp16/bf16 and update the half-precision weights directly, "
                    "losing small updates. Use --fp16 (or --bf16) instead: fairseq then keeps an fp32 copy "
                    "of the weights, which this optimizer updates."
                )
        params = list(params)
        self.implementation = _resolve(str(cfg.adamw_implementation), params)
        fused, foreach = _FLAGS[self.implementation]
        self._optimizer = BiasCorrectedEpsAdamW(params, **self.optimizer_config, fused=fused, foreach=foreach)
        logger.info("adamw_torch: torch.optim.AdamW (%s) with fairseq adam's eps", self.implementation)

    @property
    def optimizer_config(self) -> Dict[str, Any]:
        """The kwargs that override those stored in checkpoints (fairseq's ``adam`` has the same four)."""
        betas = self.cfg.adam_betas
        return {
            "lr": self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr,
            "betas": tuple(eval(betas) if isinstance(betas, str) else OmegaConf.to_container(betas)),
            "eps": self.cfg.adam_eps,
            "weight_decay": self.cfg.weight_decay,
        }

    @property
    def supports_flat_params(self) -> bool:
        return True  # element-wise: one flat fp32 tensor takes the same steps as the tensors it holds

    @property
    def supports_memory_efficient_fp16(self) -> bool:
        return False  # see the ValueError above

    def average_params(self):
        """Average the moments across workers (BMUF), as fairseq's ``adam`` does."""
        total = float(dist.get_world_size())
        for state in self.optimizer.state_dict()["state"].values():
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] /= total
                dist.all_reduce(state[key], op=dist.ReduceOp.SUM)


class BiasCorrectedEpsAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` taking the steps of fairseq's Adam: eps added before the bias correction.

    Each step runs torch's AdamW with every group's eps replaced by ``eps / sqrt(1 - beta2^t)``, t the
    step a parameter is about to take. Parameters of one group can be at different steps (those
    without a gradient are skipped, as in fairseq), so a group is split by step count for the step.
    The groups, and so ``state_dict()``, keep the eps the user gave.
    """

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self._steps: Dict[torch.Tensor, int] = {}  # state["step"] as Python ints: no device sync per step

    def __setstate__(self, state):
        super().__setstate__(state)  # also what load_state_dict ends with
        self._steps = {}
        self._keep_own_kernel()

    def step(self, closure=None):
        loss = None
        if closure is not None:  # before the split: the closure is what sets the gradients
            with torch.enable_grad():
                loss = closure()
        cohorts = self._cohorts()
        groups, self.param_groups = self.param_groups, [group for group, _ in cohorts]
        try:
            _ADAMW_STEP(self, None)
        except BaseException:
            self._steps = {}  # some states may have stepped: read them again
            raise
        finally:
            self.param_groups = groups
        for group, t in cohorts:
            for p in group["params"]:
                self._steps[p] = t
        return loss

    def _cohorts(self) -> List[Tuple[dict, int]]:
        """Copies of the groups, one per (group, step about to be taken), with the corrected eps."""
        cohorts = []
        for group in self.param_groups:
            by_step: Dict[int, list] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_step.setdefault(self._steps_taken(p) + 1, []).append(p)
            beta2 = float(group["betas"][1])
            for t, params in by_step.items():
                eps = group["eps"] / math.sqrt(1.0 - beta2**t)
                cohorts.append((dict(group, params=params, eps=eps), t))
        return cohorts

    def _steps_taken(self, p: torch.Tensor) -> int:
        if p not in self._steps:
            state = self.state.get(p)
            self._steps[p] = int(state["step"]) if state else 0
        return self._steps[p]

    def _keep_own_kernel(self):
        """After a load: keep the kernel chosen for this device, with its steps where it needs them.

        A state dict carries the settings of the run that wrote it (foreach from a CPU run, fused
        from a GPU one, none from fairseq's adam, whose steps are ints).
        """
        for group in self.param_groups:
            group["fused"], group["foreach"] = self.defaults["fused"], self.defaults["foreach"]
            on_device = group["fused"] or group["capturable"]
            for p in group["params"]:
                state = self.state.get(p)
                if state and "step" in state:
                    device = p.device if on_device else torch.device("cpu")
                    state["step"] = torch.as_tensor(state["step"], dtype=torch.float32, device=device)


def _resolve(choice: str, params: List[torch.Tensor]) -> str:
    if choice != "auto":
        return choice
    fusable = all(p.is_floating_point() and p.device.type in _FUSED_DEVICES for p in params)
    return "fused" if fusable else "foreach"


def _config_flag(cfg, key: str) -> bool:
    """True only when set: a config built outside fairseq-train leaves the interpolation unresolved."""
    try:
        return getattr(cfg, key, False) is True
    except Exception:  # omegaconf's InterpolationResolutionError and relatives
        return False
