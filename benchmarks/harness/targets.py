"""The one verdict type of the benchmarks' targets, and its printer. A target is a measured value held against a
bound, ``at_least`` (value >= bound) or at most; a bound of None reports the value without a verdict."""
from typing import Dict, List, Optional


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
