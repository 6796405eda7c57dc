"""The one clock of the benchmarks: wall and process CPU time, read together; and the one round scheduler of the
interleaved measurements."""
import gc
import random
import time
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar

T = TypeVar("T")
ORDERS = ("rotate", "shuffle")


def now() -> Tuple[float, float]:
    """(wall, process CPU) seconds, the one clock: the CPU time hardly moves when other jobs share the cores, the
    wall clock does, so the benchmarks keep both."""
    return time.perf_counter(), time.process_time()


def thread_now() -> Tuple[float, float]:
    """(wall, this thread's CPU) seconds: :func:`now` for a measure that runs in one thread among others (a
    server's model thread)."""
    return time.perf_counter(), time.thread_time()


def since(start: Tuple[float, float]) -> Tuple[float, float]:
    """(wall, CPU) seconds since ``start``, a reading of :func:`now`."""
    wall, cpu = now()
    return wall - start[0], cpu - start[1]


def timed(fn: Callable, sync: Optional[Callable[[], None]] = None, no_gc: bool = False):
    """``(wall seconds, CPU seconds, fn())``. ``sync``: called before and after (a device's synchronize, so that
    its queued work counts); ``no_gc``: collect first and keep the garbage collector off while ``fn`` runs."""
    if no_gc:
        gc.collect()
        gc.disable()
    try:
        if sync:
            sync()
        start = now()
        out = fn()
        if sync:
            sync()
        wall, cpu = since(start)
    finally:
        if no_gc:
            gc.enable()
    return wall, cpu, out


def wall(fn: Callable):
    """``(wall seconds, fn())``."""
    seconds, _, out = timed(fn)
    return seconds, out


def rounds(systems: Sequence[T], repeats: int, order: str = "rotate", seed: int = 0) -> Iterator[Tuple[int, List[T]]]:
    """``(round, systems in this round's order)`` for ``repeats`` rounds, each running every system once, so that
    no system always runs first or on a warmer cache: ``rotate`` starts round r at system r (mod n), ``shuffle``
    draws each round's order from ``random.Random(seed)``."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    rng, items = random.Random(seed), list(systems)
    for r in range(repeats):
        if order == "rotate":
            k = r % len(items) if items else 0
            yield r, items[k:] + items[:k]
        else:
            now_order = list(items)
            rng.shuffle(now_order)
            yield r, now_order
