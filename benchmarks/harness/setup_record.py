"""The machine a result was measured on, for every setup record."""
import os
from typing import Dict

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what decides the kernels


def machine() -> Dict:
    """The machine a result was measured on, for every setup record: the CPU kind in words
    (``acl_runtime.machine``), the flags that decide which kernels run, the cores and the load when it started."""
    from acl_runtime.machine import read_cpu_kind

    kind = read_cpu_kind()
    return {"cpu_kind": kind.describe(), "cpu_flags": [f for f in CPU_FLAGS if f in kind.flags],
            "cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}


def set_threads(n: int) -> int:
    """``torch.set_num_threads(n)``, unless ``n`` is 0 (torch's default); returns the threads torch runs on."""
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()
