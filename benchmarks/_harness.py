"""What every benchmark shares beyond its measurements: one clock (wall and CPU), one verdict type for its targets
and one way to print them. A target is a measured value held against a bound, ``at_least`` (value >= bound) or
at most; a bound of None reports the value without a verdict."""
import os
import time
from typing import Callable, Dict, List, Optional, Tuple


def target(text: str, value: float, bound: Optional[float], at_least: bool = True, **extra) -> Dict:
    """One verdict as the JSON records keep it: ``target``, ``value``, ``bound``, ``at_least``, ``pass`` (None
    without a bound), and any ``extra`` fields (``config``, ``cpu_value``: the same measured in CPU time)."""
    passed = None if bound is None else bool(value >= bound if at_least else value <= bound)
    return {**extra, "target": text, "value": value, "bound": bound, "at_least": at_least, "pass": passed}


def verdict(t: Dict) -> str:
    return "-" if t["pass"] is None else ("pass" if t["pass"] else "MISS")


def print_targets(found: List[Dict], title: str = "# targets") -> None:
    """One line per target: its name (after its ``config`` when it has one), value, bound and verdict, and its CPU-time
    value where it has one."""
    if not found:
        return
    print(title)
    names = [(f"{t['config']}: " if t.get("config") else "") + t["target"] for t in found]
    width = max(map(len, names))
    for name, t in zip(names, found):
        bound = "" if t["bound"] is None else f"{'>=' if t['at_least'] else '<='} {t['bound']}"
        cpu = "" if t.get("cpu_value") is None else f"   (cpu {t['cpu_value']:.3f})"
        print(f"  {name.ljust(width)}  {t['value']:8.3f} {bound:<8}  {verdict(t)}{cpu}")


def now() -> Tuple[float, float]:
    """(wall, process CPU) seconds, the one clock: the CPU time hardly moves when other jobs share the cores, the
    wall clock does, so the benchmarks keep both."""
    return time.perf_counter(), time.process_time()


def timed(fn: Callable):
    """``(wall seconds, CPU seconds, fn())``."""
    w, c = now()
    out = fn()
    w2, c2 = now()
    return w2 - w, c2 - c, out


def wall(fn: Callable):
    """``(wall seconds, fn())``."""
    seconds, _, out = timed(fn)
    return seconds, out


CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what decides the kernels


def machine() -> Dict:
    """The machine a result was measured on, for every setup record: the CPU kind in words
    (``acl_runtime.machine``), the flags that decide which kernels run, the cores and the load when it started."""
    from acl_runtime.machine import read_cpu_kind

    kind = read_cpu_kind()
    return {"cpu_kind": kind.describe(), "cpu_flags": [f for f in CPU_FLAGS if f in kind.flags],
            "cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}
