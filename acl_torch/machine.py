"""What kind of CPU this is, read from ``/proc/cpuinfo`` (or any text in its format): the one home of the CPU-kind
detection that ``--autocast-bf16`` and acl-train-hf's ``--bf16`` refuse by (:mod:`acl_torch.acceleration`) and that
every benchmark row and training record names (the benchmarks' setup record, acl_fairseq/runs/result.py).
Standard library only: the runner's last step reads it under ``python -S``, without torch."""
from typing import FrozenSet, NamedTuple, Optional

CPUINFO = "/proc/cpuinfo"


class CpuKind(NamedTuple):
    vendor: str  # vendor_id: GenuineIntel, AuthenticAMD ("" on Arm)
    model: str  # model name
    flags: FrozenSet[str]  # the "flags" (x86) or "Features" (Arm) line
    mhz: Optional[float]  # "cpu MHz": the clock the kernel reports (the peak figures' clock)

    @property
    def bf16_unit(self) -> Optional[str]:
        """What runs bf16 matrix products natively: "amx", "avx512_bf16", "arm_bf16", or None (emulated)."""
        if "amx_bf16" in self.flags:
            return "amx"
        if "avx512_bf16" in self.flags:
            return "avx512_bf16"
        if "bf16" in self.flags and "avx2" not in self.flags:  # Arm's Features line
            return "arm_bf16"
        return None

    def describe(self) -> str:
        """e.g. "AMD EPYC, AVX-512 + avx512_bf16, no AMX" (the name every benchmark row carries)."""
        f = self.flags
        if "amx_bf16" in f:
            isa = "AMX (amx_bf16)"
        elif "avx512f" in f:
            isa = "AVX-512 + avx512_bf16, no AMX" if "avx512_bf16" in f else "AVX-512, no bf16 instructions, no AMX"
        elif "avx2" in f:
            isa = "AVX2 only, no bf16 instructions"
        elif "bf16" in f:
            isa = "Arm with bf16"
        else:
            isa = "no AVX2, no bf16 instructions"
        return f"{self.model or self.vendor or 'unknown CPU'}, {isa}"


CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what decides the kernels


def read_cpu_kind(text: Optional[str] = None) -> CpuKind:
    """The first processor of ``text`` (default: this machine's ``/proc/cpuinfo``; "" where unreadable)."""
    if text is None:
        try:
            with open(CPUINFO, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor block is enough: every core of a socket is alike
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    try:
        mhz = float(fields["cpu mhz"])
    except (KeyError, ValueError):
        mhz = None
    flags = frozenset((fields.get("flags") or fields.get("features") or "").split())
    return CpuKind(fields.get("vendor_id", ""), fields.get("model name", ""), flags, mhz)
