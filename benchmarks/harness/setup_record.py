"""The setup record of a run, and the run header that prints it: the machine a result was measured on (the CPU kind
and the flags that decide the kernels), the threads, and the versions of python, torch and onnxruntime."""
import os
import platform
import sys
from typing import Dict

from acl_torch.machine import CPU_FLAGS

from . import cli

LIBRARIES = ("torch", "onnxruntime")


def machine() -> Dict:
    """The machine a result was measured on, for every setup record: the CPU kind in words
    (``acl_torch.machine``), the flags that decide which kernels run, the cores and the load when it started."""
    from acl_torch.machine import read_cpu_kind

    kind = read_cpu_kind()
    return {"cpu_kind": kind.describe(), "cpu_flags": [f for f in CPU_FLAGS if f in kind.flags],
            "cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}


def versions() -> Dict[str, str]:
    """python's version, and torch's and onnxruntime's where installed: the module's own ``__version__`` when the
    script has imported it, else the installed distribution's, read without importing it (a script that runs no
    torch does not pay for its import)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        module = sys.modules.get(name)
        try:
            out[name] = module.__version__ if module is not None else metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def record(threads=None, **settings) -> Dict:
    """The setup record a script puts in its JSON: ``settings``, :func:`machine`, ``threads`` (torch's own count
    when the script runs torch and names none) and :func:`versions`."""
    if threads is None and "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    return {**settings, **machine(), "threads": threads, **versions()}


def header(title: str, threads=None, **shown) -> Dict:
    """Print the run header, one ``# TITLE: ...`` line: ``shown`` as key=value, the CPU kind and its flags, the
    threads, the versions and the command line the parent parser read; return the :func:`record` of ``shown``."""
    rec = record(threads, **shown)
    parts = [" ".join(f"{k}={v}" for k, v in shown.items()),
             f"cpu {rec['cpu_kind']} ({','.join(rec['cpu_flags']) or 'no avx2'}), threads={rec['threads']}",
             " ".join(f"{k}={rec[k]}" for k in ("python", *LIBRARIES) if k in rec), cli.last_command()]
    print(f"# {title}: " + "; ".join(p for p in parts if p))
    return rec


def set_threads(n: int) -> int:
    """``torch.set_num_threads(n)``, unless ``n`` is 0 (torch's default); returns the threads torch runs on."""
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()
