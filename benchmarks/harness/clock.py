"""The one clock of the benchmarks: wall and process CPU time, read together."""
import time
from typing import Callable, Tuple


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
