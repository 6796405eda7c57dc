# Licensed under the MIT license.
"""Tables, CSV, plots and TensorBoard logs of early-exit results (``early_exit.json`` dicts).

A result has ``per_exit`` (static exits: the metric of always leaving at exit m) and ``settings``
(one per policy x threshold). Plots draw quality against the layer speed-up ``L / avg exit layer``;
:func:`plot_overlay` overlays several runs (e.g. methods), with the mean and spread over seeds.
"""

import csv
import math
import statistics
from typing import Dict, List, Optional

from acl_torch.glue_metrics import mean_std

TIMING_FIELDS = [
    "latency_full_batch1_s",
    "latency_exit_batch1_s",
    "wallclock_speedup_batch1",
    "latency_full_batched_s",
    "latency_exit_batched_s",
    "wallclock_speedup_batched",
]
LAYER_FIELDS = ["avg_exit_layer", "layer_speedup", "saved_fraction"]
FLOPS_FIELDS = ["flops_per_example", "flops_speedup"]  # absent from results written before acl-evaluate counted them


def metric_names(result: Dict) -> List[str]:
    """The metric names of a result, primary first."""
    return list(result["per_exit"][-1]["metrics"])


def rows(result: Dict) -> List[Dict]:
    """Flat rows: one ``static`` row per exit (threshold = its layer), then one per setting."""
    num_layers = result["num_layers"]
    out = []
    for e in result["per_exit"]:
        row = {"policy": "static", "threshold": e["layer"], **e["metrics"], "avg_exit_layer": e["layer"]}
        row.update(layer_speedup=num_layers / e["layer"], saved_fraction=1 - e["layer"] / num_layers,
                   **{k: e.get(k) for k in FLOPS_FIELDS})
        out.append(row)
    for s in result["settings"]:
        out.append(
            {
                "policy": s["policy"],
                "threshold": s["threshold"],
                **s["metrics"],
                **{k: s.get(k) for k in LAYER_FIELDS + FLOPS_FIELDS + TIMING_FIELDS},
            }
        )
    return out


def columns(result: Dict) -> List[str]:
    return ["policy", "threshold"] + metric_names(result) + LAYER_FIELDS + FLOPS_FIELDS + TIMING_FIELDS


def write_csv(result: Dict, path: str) -> None:
    """One CSV row per static exit and per setting; missing timings are empty cells."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns(result), extrasaction="ignore")
        writer.writeheader()
        for row in rows(result):
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if (abs(value) < 1e-2 and value != 0) or abs(value) >= 1e6 else f"{value:.2f}"
    return str(value)


def format_table(result: Dict) -> str:
    """A fixed-width text table of :func:`rows` with a one-line header naming task and split."""
    cols = columns(result)
    short = [c.replace("latency_", "").replace("wallclock_speedup", "wall_x").replace("flops_speedup", "flops_x")
             .replace("flops_per_example", "flops") for c in cols]
    short = [c[:-2] if c.endswith("_s") else c for c in short]  # the unit is in the header line
    body = [[_cell(r.get(c)) for c in cols] for r in rows(result)]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(short)]
    lines = [
        f"task {result.get('task')} / {result.get('split')}: {result['num_layers']} layers, "
        f"exits {result['exit_layers']}, {result.get('num_examples')} examples; latencies in s/example"
        + (f"; flops per example: {result['flops']['convention']}" if "flops" in result else "")
    ]
    lines.append("  ".join(h.rjust(w) for h, w in zip(short, widths)))
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def _curve(result: Dict, policy: str, metric: str):
    """(speed-ups, metric values, thresholds) of one policy, by increasing speed-up."""
    picked = sorted((s for s in result["settings"] if s["policy"] == policy), key=lambda s: s["layer_speedup"])
    return (
        [s["layer_speedup"] for s in picked],
        [s["metrics"][metric] for s in picked],
        [s["threshold"] for s in picked],
    )


def plot_result(result: Dict, path: str) -> None:
    """Quality vs layer speed-up per policy (left) and vs batched wall-clock speed-up (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = metric_names(result)[0]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    static = rows(result)[: len(result["per_exit"])]
    axes[0].plot([r["layer_speedup"] for r in static], [r[metric] for r in static], "k:o", label="static exit")
    for policy in sorted({s["policy"] for s in result["settings"]}):
        x, y, _ = _curve(result, policy, metric)
        axes[0].plot(x, y, "-o", label=policy)
        wall = [
            (s["wallclock_speedup_batched"], s["metrics"][metric])
            for s in result["settings"]
            if s["policy"] == policy and s.get("wallclock_speedup_batched")
        ]
        if wall:
            axes[1].plot(*zip(*sorted(wall)), "-o", label=policy)
    for ax, xlabel in zip(axes, ["layer speed-up L / avg exit layer (x)", "wall-clock speed-up, batched (x)"]):
        ax.axhline(result["per_exit"][-1]["metrics"][metric], color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(f"{result.get('task') or 'task'} / {result.get('split')}: early exit")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


SPEEDUPS = (1.5, 2.0, 3.0)  # METHOD.md "Quality against speed": the fixed layer speed-ups reported
AREA_UPTO = 3.0  # the area runs from 1x to this speed-up


def quality_curve(result: Dict, policy: str = "entropy", metric: Optional[str] = None) -> List[tuple]:
    """``(layer speed-up, metric)`` points of one policy, starting from all layers at 1x, by speed-up.

    Settings that give the same speed-up are averaged, so the curve is a function of the speed-up.
    """
    metric = metric or metric_names(result)[0]
    points: Dict[float, List[float]] = {1.0: [result["per_exit"][-1]["metrics"][metric]]}
    for s in result["settings"]:
        if s["policy"] == policy:
            points.setdefault(round(s["layer_speedup"], 12), []).append(s["metrics"][metric])
    return sorted((x, statistics.mean(ys)) for x, ys in points.items())


def interpolate(curve: List[tuple], x: float) -> Optional[float]:
    """The curve's value at ``x``, linear between its neighbouring points; None outside it (no extrapolation)."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[0][1] if len(curve) == 1 and curve[0][0] == x else None


def speedup_profile(result: Dict, policy: str = "entropy", metric: Optional[str] = None) -> Dict:
    """The metric at the fixed layer speed-ups (:data:`SPEEDUPS`) and its mean over 1x..:data:`AREA_UPTO`.

    ``{"policy", "metric", "at": {"1.5": value or None, ...}, "area": value or None}``; ``area`` is the
    trapezoid area under the curve from 1x to 3x divided by the width (a mean metric), None when the
    curve does not reach 3x. A curve that stops short of a speed-up reports None there.
    """
    metric = metric or metric_names(result)[0]
    curve = quality_curve(result, policy, metric)
    at = {f"{x:g}": interpolate(curve, x) for x in SPEEDUPS}
    area = None
    if curve[-1][0] >= AREA_UPTO:
        xs = [x for x, _ in curve if x < AREA_UPTO] + [AREA_UPTO]
        ys = [interpolate(curve, x) for x in xs]
        area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])) / (AREA_UPTO - 1.0)
    return {"policy": policy, "metric": metric, "at": at, "area": area}


def _mean_spread(values: List[float]):
    mean, std = mean_std(values)
    return mean, std or 0.0  # a single run plots without an error bar


def overlay_points(results: List[Dict], policy: str, metric: str) -> List[Dict]:
    """Per threshold shared by the runs: mean and standard deviation of speed-up and metric."""
    by_threshold: Dict[float, List[Dict]] = {}
    for result in results:
        for s in result["settings"]:
            if s["policy"] == policy:
                by_threshold.setdefault(s["threshold"], []).append(s)
    points = []
    for threshold, group in by_threshold.items():
        x, x_sd = _mean_spread([s["layer_speedup"] for s in group])
        y, y_sd = _mean_spread([s["metrics"][metric] for s in group])
        points.append({"threshold": threshold, "x": x, "x_sd": x_sd, "y": y, "y_sd": y_sd, "n": len(group)})
    return sorted(points, key=lambda p: p["x"])


def plot_overlay(result_groups: Dict[str, List[Dict]], path: str, metric: Optional[str] = None) -> None:
    """Overlay several runs' quality-vs-speed-up curves: one panel per policy, one curve per group
    (e.g. per method), each point the mean over the group's runs (seeds) with 1-sd error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_results = [r for group in result_groups.values() for r in group]
    metric = metric or metric_names(all_results[0])[0]
    policies = sorted({s["policy"] for r in all_results for s in r["settings"]})
    fig, axes = plt.subplots(1, max(len(policies), 1), figsize=(5 * max(len(policies), 1), 4), squeeze=False)
    for ax, policy in zip(axes[0], policies):
        for name, group in result_groups.items():
            pts = overlay_points(group, policy, metric)
            if pts:
                ax.errorbar(
                    [p["x"] for p in pts],
                    [p["y"] for p in pts],
                    xerr=[p["x_sd"] for p in pts],
                    yerr=[p["y_sd"] for p in pts],
                    fmt="-o",
                    capsize=3,
                    label=f"{name} (n={len(group)})",
                )
        ax.set_title(policy)
        ax.set_xlabel("layer speed-up L / avg exit layer (x)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def log_tensorboard(result: Dict, logdir: str) -> None:
    """Scalars under ``logdir``: ``per_exit/<metric>`` at step = layer; ``<policy>/<field>`` at step =
    the setting's position in the sweep; plus the table as text."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir)
    for e in result["per_exit"]:
        for name, value in e["metrics"].items():
            writer.add_scalar(f"per_exit/{name}", value, e["layer"])
    step: Dict[str, int] = {}
    for s in result["settings"]:
        i = step[s["policy"]] = step.get(s["policy"], -1) + 1
        fields = LAYER_FIELDS + FLOPS_FIELDS + TIMING_FIELDS
        scalars = {**s["metrics"], "threshold": s["threshold"], **{k: s.get(k) for k in fields}}
        for name, value in scalars.items():
            if value is not None and math.isfinite(value):
                writer.add_scalar(f"{s['policy']}/{name}", value, i)
    writer.add_text("early_exit/table", "    " + format_table(result).replace("\n", "\n    "), 0)
    writer.close()
