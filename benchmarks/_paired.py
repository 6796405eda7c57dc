"""Paired differences over seeds: the mean, its 95% interval (Student t, n - 1 degrees of freedom), the seeds ahead,
and the one wording every table and claim uses: "ahead" or "behind" only where the interval excludes 0, else
"within noise (n = k)"."""
import math
import statistics
from typing import Sequence

from scipy import stats

LEVEL = 0.95


def interval(diffs: Sequence[float]) -> dict:
    """{"n", "mean", "lo", "hi", "ahead", "behind"} of paired differences; lo and hi are None below two seeds."""
    d = [float(x) for x in diffs]
    if not d:
        raise ValueError("no paired differences")
    mean = statistics.mean(d)
    lo = hi = None
    if len(d) > 1:
        half = stats.t.ppf(0.5 + LEVEL / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        lo, hi = mean - half, mean + half
    return {"n": len(d), "mean": mean, "lo": lo, "hi": hi, "ahead": sum(x > 0 for x in d),
            "behind": sum(x < 0 for x in d)}


def verdict(iv: dict) -> str:
    """"ahead" / "behind" where the interval excludes 0, else "within noise (n = k)"."""
    if iv["lo"] is not None and iv["lo"] > 0:
        return "ahead"
    if iv["hi"] is not None and iv["hi"] < 0:
        return "behind"
    return f"within noise (n = {iv['n']})"


def signed(x: float, digits: int = 2) -> str:
    """+1.25 / −1.25 (a minus sign, as the prose writes it); 0 prints +0.00."""
    text = f"{x:+.{digits}f}"
    return text.replace("-", "−") if x < 0 and text.strip("+-0.") else text.replace("-", "+")


def interval_text(iv: dict, digits: int = 2) -> str:
    """"+1.56 [−2.60, +5.72]"; the mean alone below two seeds."""
    if iv["lo"] is None:
        return signed(iv["mean"], digits)
    return f"{signed(iv['mean'], digits)} [{signed(iv['lo'], digits)}, {signed(iv['hi'], digits)}]"


def cell(diffs: Sequence[float], digits: int = 2) -> str:
    """A table cell: mean [95% interval], seeds ahead, and the verdict: "+1.56 [−2.60, +5.72] (2 of 3 seeds ahead):
    within noise (n = 3)"; "-" without pairs."""
    if not diffs:
        return "-"
    iv = interval(diffs)
    return f"{interval_text(iv, digits)} ({iv['ahead']} of {iv['n']} seeds ahead): {verdict(iv)}"


HEADER = ("mean paired difference [95% interval, Student t with n − 1 degrees of freedom], the seeds where the "
          "first is ahead, and the verdict: ahead or behind only where the interval excludes 0")
