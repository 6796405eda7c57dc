"""GLUE metrics as GLUE names them, from predictions or from summable statistics.

fairseq 0.12's criterion reports only accuracy. F1 and Matthews correlation need a *positive class*:
fairseq's label dictionary is sorted by frequency, so index 0 is not always label "0" (on SST-2 it is
"1"). :func:`positive_index` maps through the dictionary instead of assuming an order.

The count-based forms (:func:`f1_from_counts`, :func:`mcc_from_counts`, :func:`pearson_from_sums`)
let criteria log summable statistics and derive the metric in ``reduce_metrics``. :func:`mean_std` is the one mean
and sample standard deviation over seeds that every results table prints. Standard library only: a table's
collector (recipes/collect_results.py) needs neither torch nor fairseq.
"""
import math
import statistics
from typing import Dict, List, Optional, Sequence

POSITIVE_LABELS = ("1", "entailment")


def positive_index(label_dictionary, positive_label: Optional[str] = None) -> Optional[int]:
    """Class index (target space, i.e. dictionary index minus ``nspecial``) of the positive label.

    Returns None when the task is not binary or no positive label is found.
    """
    return positive_of(label_names(label_dictionary), positive_label)


def positive_of(names: Sequence[str], positive_label: Optional[str] = None) -> Optional[int]:
    """The index of the positive label among the class ``names`` (in class-index order), or None when the task is
    not binary or none of them is a positive label."""
    names = list(names)
    if len(names) != 2:
        return None
    for name in (positive_label,) if positive_label else POSITIVE_LABELS:
        if name in names:
            return names.index(name)
    return None


def label_names(label_dictionary) -> list:
    """Real label strings in target-index order (skips specials and ``madeupword`` padding)."""
    names = [label_dictionary[i] for i in range(label_dictionary.nspecial, len(label_dictionary))]
    return [n for n in names if not n.startswith("madeupword") and n != "<mask>"]


def f1_from_counts(tp: float, fp: float, fn: float) -> float:
    """F1 of the positive class, in percent (0 when undefined)."""
    denom = 2 * tp + fp + fn
    return 100.0 * 2 * tp / denom if denom > 0 else 0.0


def mcc_from_counts(tp: float, fp: float, fn: float, tn: float) -> float:
    """Matthews correlation in percent (GLUE's CoLA metric; 0 when undefined, as sklearn does)."""
    denom = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 100.0 * (tp * tn - fp * fn) / denom if denom > 0 else 0.0


def pearson_from_sums(n: float, sx: float, sy: float, sxx: float, syy: float, sxy: float) -> float:
    """Pearson correlation in percent from the six sufficient statistics."""
    cov = n * sxy - sx * sy
    var = (n * sxx - sx * sx) * (n * syy - sy * sy)
    return 100.0 * cov / math.sqrt(var) if var > 0 else 0.0


def classification_metrics(pred: Sequence[int], gold: Sequence[int], positive: Optional[int]) -> Dict[str, float]:
    """accuracy, and with a positive class also f1 and mcc, all in percent."""
    n = len(gold)
    out = {"accuracy": 100.0 * sum(int(p == g) for p, g in zip(pred, gold)) / max(n, 1)}
    if positive is not None:
        tp = sum(int(p == positive and g == positive) for p, g in zip(pred, gold))
        fp = sum(int(p == positive and g != positive) for p, g in zip(pred, gold))
        fn = sum(int(p != positive and g == positive) for p, g in zip(pred, gold))
        tn = n - tp - fp - fn
        out["f1"] = f1_from_counts(tp, fp, fn)
        out["mcc"] = mcc_from_counts(tp, fp, fn, tn)
    return out


def regression_metrics(pred: Sequence[float], gold: Sequence[float]) -> Dict[str, float]:
    """pearson and spearman in percent (STS-B)."""
    from scipy.stats import pearsonr, spearmanr

    if len(gold) < 2:
        return {"pearson": 0.0, "spearman": 0.0}
    p = float(pearsonr(pred, gold)[0]) if len(set(pred)) > 1 else 0.0
    s = float(spearmanr(pred, gold)[0]) if len(set(pred)) > 1 else 0.0
    return {"pearson": 100.0 * p, "spearman": 100.0 * s}


def mean_std(values: List[float]):
    """Mean and sample standard deviation over seeds: (None, None) for no values, std None for one."""
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)
