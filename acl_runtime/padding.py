"""Less padding: what a layer call costs in its positions, and a wave split by length where the split pays (numpy
only).

A backend call runs every row of its batch at the batch's width (its longest row): the padding is computed and
thrown away. A wave of unlike lengths is cheaper as several calls of like lengths when what the padding costs is
more than what the extra calls cost. Both costs are the running server's own:

- :class:`CallCost` fits ``seconds = fixed + per_position x positions`` (positions: rows x width) to the layer
  calls the scheduler makes, the older ones weighing less (``decay`` a call); it says nothing (``None``) until it
  has seen enough calls of different sizes for the fit to be meaningful (the start's measured calls of every batch
  size count: :meth:`CallCost.seed`), keeps its last line while the recent calls are too alike to fit another,
  and does not count a call whose time is not a finite number of seconds;
- :func:`split_by_length` cuts rows sorted by length into contiguous groups (at most ``max_batch`` rows each)
  whose modelled cost, ``sum(fixed + per_position x rows x width)``, is the least (dynamic programming over the
  sorted rows: the best split into contiguous groups of a sorted list is the best split of any kind, since a group
  costs its longest row's width). Run shortest first, every row of a split wave is answered no later than the
  unsplit wave would answer it under the same model: the groups' cost adds up to at most the wave's.

Measured (docs/serve.md, "Less padding"): the padded share of every layer's positions, and throughput, with and
without the split.
"""
import math
from typing import List, Optional, Sequence, Tuple


class CallCost:
    """An online least-squares line through ``(positions, seconds)`` of the layer calls, exponentially forgetting
    (each new call's weight 1, the older ones' times ``decay``). ``line()``: ``(fixed, per_position)`` seconds, or
    None before ``min_calls`` calls, or while the positions seen vary too little for a slope
    (``min_spread``: their weighted standard deviation over their mean) unless a line was fitted before, or while
    the slope is not positive."""

    def __init__(self, decay: float = 0.995, min_calls: int = 16, min_spread: float = 0.25):
        if not 0 < decay <= 1:
            raise ValueError(f"decay {decay} must be in (0, 1]")
        self.decay, self.min_calls, self.min_spread = decay, min_calls, min_spread
        self.calls = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._last: Optional[Tuple[float, float]] = None

    def observe(self, positions: int, seconds: float) -> None:
        if positions <= 0 or not (math.isfinite(seconds) and seconds >= 0):
            return  # a clock's nonsense never decides a split
        d = self.decay
        self._w, self._x, self._y = d * self._w + 1, d * self._x + positions, d * self._y + seconds
        self._xx, self._xy = d * self._xx + positions * positions, d * self._xy + positions * seconds
        self.calls += 1

    def seed(self, table, width: int) -> None:
        """Observe the calls a :class:`acl_runtime.deadlines.CostTable` measured at start (every layer at every
        batch size bucket, on rows of ``width`` tokens): a line before the first request."""
        for seconds in table.seconds[1:]:  # the layers; the embeddings cost otherwise
            for rows, cell in zip(table.buckets, seconds):
                if cell is not None:
                    self.observe(rows * width, cell)

    def line(self) -> Optional[Tuple[float, float]]:
        """The line; while the recent calls vary too little in size to fit one (a steady load of like waves), the
        last line fitted."""
        if self.calls < self.min_calls:
            return None
        mean = self._x / self._w
        var = self._xx / self._w - mean * mean
        if var <= 0 or math.sqrt(var) < self.min_spread * mean:
            return self._last
        slope = (self._xy / self._w - mean * self._y / self._w) / var
        self._last = (max(0.0, self._y / self._w - slope * mean), slope) if slope > 0 else None
        return self._last


def split_by_length(lengths: Sequence[int], max_batch: int, fixed: float, per_position: float) -> List[List[int]]:
    """Groups of positions into ``lengths`` (each group's positions in order of length, then position; the groups
    shortest first), at most ``max_batch`` each, that minimize ``sum(fixed + per_position x len(group) x
    longest)``. Equal costs keep fewer groups."""
    if max_batch < 1:
        raise ValueError(f"max_batch {max_batch} must be at least 1")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    best = [0.0] + [math.inf] * n  # best[j]: the least cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        width = lengths[order[j - 1]]
        for i in range(max(0, j - max_batch), j):  # the last group: sorted rows i .. j-1
            cost = best[i] + fixed + per_position * (j - i) * width
            if cost < best[j]:  # the first (largest) last group on a tie
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]: j])
        j = cut[j]
    return groups[::-1]
