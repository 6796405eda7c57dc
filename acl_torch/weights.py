"""The meaningful range of each loss weight, and of ACL-Grad's cosine threshold, checked when a criterion is built.

Outside its range a weight flips or drops a term instead of weighting it: an SCL lambda of 2 gives CE the
weight -1, a negative ACL weight rewards pulling samples away from their own label, a cosine threshold
above 1 discards the ACL term on every step. Temperatures have their own check
(:func:`acl_torch.losses.check_temperature`).
"""
import math

# criterion config field -> (lowest, highest) allowed value; one table for every criterion
WEIGHT_RANGES = {
    "scl_weight": (0.0, 1.0),
    "acl_weight": (0.0, math.inf),
    "acl_cl_weight": (0.0, math.inf),
    "kd_weight": (0.0, math.inf),
    "acl_grad_threshold": (-1.0, 1.0),
    "scl_grad_threshold": (-1.0, 1.0),
}


def check_weights(cfg, spell=lambda key: "--" + key.replace("_", "-")) -> None:
    """Raise ValueError naming the option (as ``spell`` writes it; fairseq's flag by default) when a
    :data:`WEIGHT_RANGES` field of ``cfg`` lies outside its range (NaN and infinities are outside every range);
    fields that ``cfg`` lacks or leaves unset are skipped."""
    for key, (low, high) in WEIGHT_RANGES.items():
        value = getattr(cfg, key, None)
        if value is None:
            continue
        if not (math.isfinite(value) and low <= value <= high):
            allowed = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
            raise ValueError(f"{spell(key)} must be a finite number {allowed}, got {value}")
