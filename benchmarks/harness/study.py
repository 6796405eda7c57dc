"""One study pipeline: the grid of cells x seeds, each run through the script's run function (skipped when its
record exists: benchmarks/_records.py), every result read back from the records, the per-cell summary over seeds
with the paired differences of chosen (cell, base) pairs (benchmarks/_paired.py), and the outputs written whole. A
study script keeps only what it measures: its run function, its cells, its pairs and its table and plot.
"""
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import _records
from acl_runtime.io import atomic
from acl_torch.glue_metrics import mean_std

from .clock import now, since
from .outputs import write_json, write_text

ORDERS = ("seed-major", "cell-major")


def log(msg: str) -> None:
    """A progress line on stderr, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def grid(cells: Sequence[Any], seeds: Sequence[int], order: str = "seed-major",
         block: Optional[Callable[[Any], Hashable]] = None) -> List[Tuple[Any, int]]:
    """Every (cell, seed) in the declared order: ``seed-major`` runs every cell of seed 1, then of seed 2 ... (so
    every cell has the same seeds when the study stops early), ``cell-major`` every seed of one cell first. With
    ``block``, the cells of one block (its key, blocks in the order they first appear) run before the next block's,
    in that order within the block (fewshot.py: one N after the other)."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    blocks: Dict[Hashable, List[Any]] = {}
    for c in cells:
        blocks.setdefault(block(c) if block else None, []).append(c)
    if order == "seed-major":
        return [(c, s) for cs in blocks.values() for s in seeds for c in cs]
    return [(c, s) for cs in blocks.values() for c in cs for s in seeds]


@dataclass
class Study:
    """The runs of one study: WORK/<name>/... while they train, RECORDS/<name>/... once finished; a run is finished
    when its folder (or its record) holds ``result``."""
    name: str
    work: str
    records: Optional[str]
    result: str = _records.RESULT
    log: Callable[[str], None] = field(default=log, repr=False)

    def root(self, *parts: str) -> str:
        """WORK/<name>/<parts>: where the study's runs train."""
        return os.path.join(self.work, self.name, *parts)

    def result_or_train(self, run_dir: str, train: Callable[[], object],
                        check: Optional[Callable[[str], None]] = None) -> Tuple[str, dict]:
        """One run, trained only when neither its folder nor its record holds the result (_records.result_or_train):
        the folder holding the result, and the result."""
        return _records.result_or_train(run_dir, self.work, self.records, train, check, result=self.result)

    def run(self, plan: Sequence[Tuple[Any, int]], run_one: Callable[[Any, int], Any],
            label: Callable[[Any, int], str] = lambda c, s: f"{c} seed {s}") -> List[Any]:
        """``run_one(cell, seed)`` for every (cell, seed) of the plan, in order, each after its progress line
        ``[i/n] LABEL (elapsed Ns)``; returns what each returned. ``run_one`` skips a finished run through
        ``result_or_train``."""
        t0, out = now(), []
        for i, (cell, seed) in enumerate(plan, 1):
            self.log(f"[{i}/{len(plan)}] {label(cell, seed)} (elapsed {since(t0)[0]:.0f}s)")
            out.append(run_one(cell, seed))
        return out

    def sync(self) -> int:
        """Record every finished run of WORK/<name> (a run trained again replaces its record): how many were
        written."""
        written = _records.sync(self.work, self.name, self.records, result=self.result)
        self.log(f"records: {written} written from {self.root()} into {self.records}")
        return written

    def collect(self, key: Optional[Callable[[dict], Any]] = None) -> List[dict]:
        """Every finished run: the work folder's are recorded first (``sync``), then all are read from the records,
        so a run whose work folder is gone still counts; sorted by ``key`` when given."""
        self.sync()
        runs = []
        for folder, dirs, files in os.walk(os.path.join(self.records, self.name)):
            dirs.sort()
            if self.result in files:
                runs.append(_records.load(folder, self.result))
        return sorted(runs, key=key) if key else runs


def summarize_cells(runs: Sequence[dict], keys: Sequence[str], cells: Iterable[tuple], metrics: Sequence[str],
                    lists: Sequence[str] = ()) -> List[dict]:
    """One summary per declared cell (its values of ``keys``, in the declared order; a cell without runs is left
    out): the number of seeds, the seeds, then for every metric its mean, sample std and per-seed values
    (``<metric>_mean``, ``<metric>_std``, ``<metric>``), then the per-seed values of ``lists``. Runs of a cell keep
    the order they come in."""
    out = []
    for cell in cells:
        rs = [r for r in runs if tuple(r[k] for k in keys) == tuple(cell)]
        if not rs:
            continue
        row: Dict[str, Any] = {**dict(zip(keys, cell)), "num_seeds": len(rs), "seeds": [r["seed"] for r in rs]}
        for m in metrics:
            values = [r[m] for r in rs]
            row[f"{m}_mean"], row[f"{m}_std"] = mean_std(values)
            row[m] = values
        for f in lists:
            row[f] = [r[f] for r in rs]
        out.append(row)
    return out


def paired(a: dict, b: dict, metric: str) -> Optional[dict]:
    """Cell summary A minus B on ``metric`` over the seeds both have (same seed = same sample and initialisation):
    {"seeds", "diffs", "mean", "std", "ci95", "ahead", "verdict"}, None without a common seed."""
    import _paired  # here: scipy only when a study summarizes

    common = sorted(set(a["seeds"]) & set(b["seeds"]))
    if not common:
        return None
    d = [a[metric][a["seeds"].index(s)] - b[metric][b["seeds"].index(s)] for s in common]
    m, sd = mean_std(d)
    iv = _paired.interval(d)
    return {"seeds": common, "diffs": d, "mean": m, "std": sd, "ci95": [iv["lo"], iv["hi"]], "ahead": iv["ahead"],
            "verdict": _paired.verdict(iv)}


def paired_cells(cells: Sequence[dict], keys: Sequence[str], vary: str, base: str, metric: str,
                 only: Optional[Sequence[str]] = None, diffs: str = "diffs") -> List[dict]:
    """For every cell (in order) whose ``vary`` is not ``base`` (and is one of ``only`` when given), the paired
    difference to the cell equal to it on the other ``keys`` with ``vary`` = ``base``: its keys, "base", then
    ``paired``'s fields with the per-seed differences named ``diffs``. Cells without a base or a common seed are
    left out."""
    out = []
    for c in cells:
        if c[vary] == base or (only is not None and c[vary] not in only):
            continue
        b = next((x for x in cells if x[vary] == base and all(x[k] == c[k] for k in keys if k != vary)), None)
        p = paired(c, b, metric) if b else None
        if p:
            d = p.pop("diffs")
            out.append({**{k: c[k] for k in keys}, "base": base, **p, diffs: d})
    return out


def pyplot():
    """matplotlib.pyplot drawing off screen (Agg), its logger at WARNING (fairseq's imports leave the root logger at
    DEBUG), for the studies' figures."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, dpi: int = 120) -> None:
    """A matplotlib figure as PNG, written whole or not at all; the figure is closed."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        atomic.write_through(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
    finally:
        plt.close(fig)


def write_outputs(results: str, stem: str, summary: dict, markdown: str,
                  plot: Optional[Callable[[dict, str], None]] = None) -> List[str]:
    """RESULTS/<stem>.json (the summary), <stem>.md and, with ``plot(summary, path)``, <stem>.png, each written
    whole or not at all: the paths written."""
    paths = [os.path.join(results, f"{stem}.json"), os.path.join(results, f"{stem}.md")]
    write_json(paths[0], summary, indent=2)
    write_text(paths[1], markdown)
    if plot is not None:
        paths.append(os.path.join(results, f"{stem}.png"))
        plot(summary, paths[2])
    return paths
