# Licensed under the MIT license.
"""Training at the machine's speed: what the CPU's matrix units are, bf16 autocast, and torch.compile.

The CPU kind (:func:`acl_torch.machine.read_cpu_kind`, from ``/proc/cpuinfo`` or any text in its format) is what
``--autocast-bf16`` refuses by and what the benchmarks name on every row. bf16 is
native where the CPU has AMX (``amx_bf16``: tile matrix units, Sapphire Rapids and later),
``avx512_bf16`` (bf16 dot products in AVX-512 registers: Cooper Lake, Zen 4) or Arm's ``bf16``; on any
other CPU (AVX2-only EPYCs and Xeons) torch emulates it, about 40x slower than fp32, so it is refused.

``--compile`` (:func:`compile_model`): ``torch.compile`` of the encoder (and, on ``multi_exit_roberta``,
of its exit heads, in one graph with it), probed at start-up so that a missing C++ compiler or an
unsupported backend says so in one line and trains eagerly; a graph that fails later falls back to
eager (dynamo's ``suppress_errors``). Graphs are counted (:class:`CompileStats`); shapes become
dynamic after the first recompile, so fairseq's length-bucketed batches cost a bounded number of them.
"""
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

from acl_torch.machine import CpuKind, read_cpu_kind  # noqa: F401  (the CPU kind's home)

logger = logging.getLogger(__name__)


def bf16_problem(device_type: str, kind: Optional[CpuKind] = None) -> Optional[str]:
    """None where bf16 autocast is native on ``device_type``, else why not (one line, naming the CPU kind or the
    GPU): a CPU without AMX, avx512_bf16 or Arm bf16, or a CUDA GPU before Ampere. One home for the rule that
    ``--autocast-bf16`` (and the Hugging Face path's ``--bf16``) refuses by and the benchmarks leave their bf16
    modes out by."""
    if device_type == "cuda":
        if not torch.cuda.is_bf16_supported():
            return (f"{torch.cuda.get_device_name()} has no native bf16 (Ampere or later has); train in fp32 or "
                    "with --fp16")
        return None
    kind = kind or read_cpu_kind()
    if kind.bf16_unit is None:
        return (f"this CPU ({kind.describe()}) has no native bf16 (needs amx_bf16 or avx512_bf16 in /proc/cpuinfo); "
                "torch would emulate it, ~40x slower than fp32: drop the flag")
    return None


def check_bf16(device_type: str, kind: Optional[CpuKind] = None, flag: str = "--autocast-bf16") -> str:
    """One line naming where bf16 autocast runs; raises ``ValueError`` (one line, :func:`bf16_problem`, naming
    ``flag``: the Hugging Face path's ``--bf16``) where bf16 would be emulated."""
    problem = bf16_problem(device_type, kind)
    if problem:
        raise ValueError(f"{flag}: {problem}")
    if device_type == "cuda":
        return f"bf16 autocast on {torch.cuda.get_device_name()}"
    return f"bf16 autocast on the CPU ({(kind or read_cpu_kind()).describe()})"


def peak_gflops(kind: CpuKind, dtype: torch.dtype, threads: int = 1) -> Tuple[Optional[float], str]:
    """``(GFLOP/s, how)``: the matrix-product peak of ``threads`` cores in ``dtype``, from the CPU's flags and
    its reported clock (``cpu MHz``; turbo can exceed it, so a measured fraction may pass 1). None where the
    dtype has no native unit. FLOPs per core and cycle: 2 FMA pipes x vector lanes x 2; AMD's AVX-512
    without avx512_vp2intersect (Zen 4) runs 512-bit vectors on 256-bit pipes; avx512_bf16 doubles the fp32
    rate (a dot of bf16 pairs per fp32 lane); AMX does 1024 bf16 FLOPs a cycle (Intel's figure)."""
    f, amd = kind.flags, kind.vendor == "AuthenticAMD"
    if "avx512f" in f:
        fp32, width = (32, "2 x 256-bit FMA (Zen 4 AVX-512)") if amd and "avx512_vp2intersect" not in f \
            else (64, "2 x 512-bit FMA")
    elif "avx2" in f and "fma" in f:
        fp32, width = 32, "2 x 256-bit FMA"
    else:
        fp32, width = 8, "SSE, 2 x 128-bit"
    if dtype == torch.float32:
        per_cycle, how = fp32, f"fp32 {fp32} FLOP/cycle/core ({width})"
    elif dtype == torch.bfloat16 and kind.bf16_unit == "amx":
        per_cycle, how = 1024, "bf16 1024 FLOP/cycle/core (AMX)"
    elif dtype == torch.bfloat16 and kind.bf16_unit == "avx512_bf16":
        per_cycle, how = 2 * fp32, f"bf16 {2 * fp32} FLOP/cycle/core (avx512_bf16 on {width})"
    else:
        return None, f"no native {dtype} unit"
    if not kind.mhz:
        return None, how + ", clock unknown"
    return per_cycle * kind.mhz * 1e-3 * threads, f"{how} x {kind.mhz:.0f} MHz (cpu MHz) x {threads} thread(s)"


@contextmanager
def autocast_bf16(device_type: str):
    """Forward passes in bf16 where autocast casts (matrix products, convolutions); the rest, the weights,
    gradients and optimizer stay fp32 (no loss scale: bf16 has fp32's range)."""
    with torch.autocast(device_type, dtype=torch.bfloat16):
        yield


class AutocastCriterion:
    """A criterion whose calls (the forward pass) run under :func:`autocast_bf16`; the backward the task runs
    afterwards is outside it, so ACL-Grad's gate takes its gradients and cosine in fp32 as ever."""

    def __init__(self, criterion, device_type: str):
        self.criterion, self.device_type = criterion, device_type

    def __call__(self, model, sample, *args, **kwargs):
        with autocast_bf16(self.device_type):
            return self.criterion(model, sample, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.criterion, name)


@dataclass
class CompileStats:
    """What ``--compile`` compiled: graphs (first compiles, recompiles and the pieces around graph breaks)
    and the seconds the backend took for them (backward graphs compile at the first backward, outside it)."""

    backend: str
    graphs: int = 0
    seconds: float = 0.0
    modules: List[str] = field(default_factory=list)

    def counting(self, inner):
        def backend(gm, example_inputs):
            start = time.perf_counter()
            compiled = inner(gm, example_inputs)
            self.graphs += 1
            self.seconds += time.perf_counter() - start
            return compiled

        return backend


def _probe(x):
    return torch.tanh(x) * 2.0 + 1.0


def compile_problem(backend: str) -> Optional[str]:
    """None where ``backend`` compiles and runs a small function with a backward here, else the reason (one
    line): a missing C++ compiler, an unknown backend, a torch without dynamo for this Python."""
    try:
        import torch._dynamo

        x = torch.ones(3, requires_grad=True)
        torch._dynamo.reset()
        torch.compile(_probe, backend=backend)(x).sum().backward()
        return None
    except Exception as e:  # any failure means: train eagerly, and say why
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return f"{type(e).__name__}: {first}"
    finally:
        try:
            torch._dynamo.reset()
        except Exception:
            pass


def compile_model(model, backend: str = "inductor") -> Optional[CompileStats]:
    """Compile ``model``'s encoder in place (``nn.Module.compile``: parameters and state-dict keys unchanged,
    so checkpoints load either way); on a model that returns its exits itself (``multi_exit_roberta``) the
    whole model, heads included. None, after one warning line, where this machine cannot compile."""
    problem = compile_problem(backend)
    if problem is not None:
        logger.warning("--compile: torch.compile (backend %s) does not work here (%s); training eagerly",
                       backend, problem)
        return None
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that fails to compile mid-run runs eagerly
    # ACL-Grad takes two gradients of one graph (retain_graph): its saved buffers must not be donated
    torch._functorch.config.donated_buffer = False
    stats = CompileStats(backend)
    target = model if hasattr(model, "exit_outputs") else model.encoder
    target.compile(backend=stats.counting(torch._dynamo.lookup_backend(backend)))
    stats.modules.append(type(target).__name__)
    logger.info("--compile: %s compiled with backend %s (graphs are compiled at first use; at most %d per "
                "frame, then it runs eagerly)", stats.modules[0], backend, recompile_limit())
    return stats


def recompile_limit() -> int:
    import torch._dynamo

    cfg = torch._dynamo.config
    return int(getattr(cfg, "recompile_limit", getattr(cfg, "cache_size_limit", 8)))
