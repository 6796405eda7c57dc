"""Early-exit thresholds calibrated to a budget, and the ``exit_policy.json`` record beside a checkpoint.

``acl-evaluate CHECKPOINT DATA_BIN --output D --calibrate max-drop=0.5`` (or ``min-speedup=1.5``) sweeps the
policy's thresholds on the evaluated split as usual, then :func:`choose` picks one of the swept settings:

- ``max-drop=X``: the largest layer speed-up whose primary metric stays within X points of the last exit's
  (ties: the better metric);
- ``min-speedup=S``: the best primary metric whose layer speed-up is at least S (ties: the larger speed-up).

A budget no swept setting meets raises :class:`Unmet`, naming the closest one. The choice is written to
``exit_policy.json`` beside the checkpoint (:func:`write`); acl-predict, the hub and acl-export apply it when no
policy is given (:func:`acl_runtime.request.resolve`), and only to the checkpoint it was calibrated on (file name
and sha256, :func:`for_checkpoint`). ``policy="none"`` (:data:`NO_POLICY`) asks for the last exit whatever was
calibrated.

Standard library and :mod:`acl_runtime.exits` only: the ONNX runtime resolves its serving policy here too.
"""
import datetime
import errno
import json
import logging
import math
import os
from typing import Dict, List, NamedTuple, Optional

from acl_runtime import exits
from acl_runtime.io import atomic, file_sha256
from acl_runtime.request import NO_POLICY, json_number  # noqa: F401  (NO_POLICY: the last exit's --policy)

logger = logging.getLogger(__name__)

FILE_NAME = "exit_policy.json"
SCHEMA = "acl_fairseq.exit_policy/1"
DEFAULT_POLICY = "entropy"  # METHOD.md "Quality against speed" compares methods along the entropy curve
# budget key -> what it bounds, for --help and errors (the one list of budget kinds)
BUDGETS = {
    "max-drop": "the primary metric may fall at most this many points below the last exit's (a number >= 0)",
    "min-speedup": "the layer speed-up (layers / mean exit layer) must be at least this (a number >= 1)",
}
_LOW = {"max-drop": 0.0, "min-speedup": 1.0}
# metrics are in points (100 x) and speed-ups ratios of small integers: a budget met up to rounding is met
_EPS = 1e-9


class Budget(NamedTuple):
    kind: str  # a key of BUDGETS
    value: float

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


class Unmet(ValueError):
    """No swept setting meets the budget; the message names the closest one."""


class RecordError(ValueError):
    """An ``exit_policy.json`` that cannot be used (unreadable, another schema, a policy out of range)."""


def parse_budget(text: str) -> Budget:
    """``max-drop=0.5`` or ``min-speedup=1.5``; a ValueError naming the problem for anything else."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"budget {text!r} has no '=': write " + " or ".join(f"{k}=N" for k in BUDGETS))
    key = key.strip()
    if key not in BUDGETS:
        raise ValueError(f"unknown budget {key!r}: expected " + " or ".join(f"{k}=N" for k in BUDGETS))
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"budget {key}={value!r}: not a number") from None
    if not math.isfinite(number) or number < _LOW[key]:
        raise ValueError(f"budget {key}={value.strip()}: must be a finite number >= {_LOW[key]:g}")
    return Budget(key, number)


# ---- the choice --------------------------------------------------------------------------------


def _finite(setting: Dict, metric: str) -> bool:
    values = (setting["metrics"].get(metric), setting.get("layer_speedup"))
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _describe(setting: Dict, metric: str) -> str:
    return f"{setting['threshold']:g} at {setting['metrics'][metric]:.4g} ({setting['layer_speedup']:.2f}x)"


def choose(result: Dict, budget: Budget, policy: str = DEFAULT_POLICY) -> Dict:
    """The setting of ``policy`` in ``result["settings"]`` (acl-evaluate's result) that ``budget`` picks, on
    ``result["primary_metric"]`` against the last exit's (``result["per_exit"][-1]``). Settings whose metric or
    speed-up is not finite never count. :class:`Unmet` when none meets the budget."""
    if len(result["per_exit"]) < 2:
        raise Unmet("the model has a single exit: there is no early exit to calibrate")
    metric = result["primary_metric"]
    reference = result["per_exit"][-1]["metrics"][metric]
    if not math.isfinite(reference):
        raise Unmet(f"the last exit's {metric} is {reference}: nothing to calibrate against")
    settings = [s for s in result["settings"] if s["policy"] == policy]
    if not settings:
        swept = sorted({s["policy"] for s in result["settings"]})
        raise Unmet(f"no {policy} settings in the sweep (swept: {', '.join(swept) or 'none'}): sweep it, or "
                    "calibrate another policy (--calibrate-policy)")
    usable = [s for s in settings if _finite(s, metric)]
    if not usable:
        raise Unmet(f"every {policy} setting has a non-finite {metric} or speed-up")
    by_speed = lambda s: (s["layer_speedup"], s["metrics"][metric])  # noqa: E731
    by_metric = lambda s: (s["metrics"][metric], s["layer_speedup"])  # noqa: E731
    if budget.kind == "max-drop":
        met = [s for s in usable if s["metrics"][metric] >= reference - budget.value - _EPS]
        if not met:
            closest = max(usable, key=by_metric)
            raise Unmet(f"no {policy} threshold keeps {metric} within {budget.value:g} of {reference:.4g}; the "
                        f"closest: {_describe(closest, metric)}")
        return max(met, key=by_speed)
    met = [s for s in usable if s["layer_speedup"] >= budget.value - _EPS]
    if not met:
        closest = max(usable, key=by_speed)
        raise Unmet(f"no {policy} threshold reaches a layer speed-up of {budget.value:g}x; the closest: "
                    f"{_describe(closest, metric)}")
    return max(met, key=by_metric)


# ---- the record beside the checkpoint ----------------------------------------------------------


def path_beside(checkpoint: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(checkpoint)), FILE_NAME)


def make_record(result: Dict, setting: Dict, budget: Budget, checkpoint: str) -> Dict:
    metric = result["primary_metric"]
    return {
        "schema": SCHEMA,
        "policy": setting["policy"],
        "threshold": setting["threshold"],
        "budget": str(budget),
        "metric": metric,
        "value": setting["metrics"][metric],
        "last_exit_value": result["per_exit"][-1]["metrics"][metric],
        "layer_speedup": setting["layer_speedup"],
        "avg_exit_layer": setting["avg_exit_layer"],
        "task": result.get("task"),
        "split": result["split"],
        "num_examples": result["num_examples"],
        "checkpoint": os.path.basename(checkpoint),
        "checkpoint_sha256": file_sha256(checkpoint),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write(record: Dict, path: str, force: bool) -> None:
    """Write ``record`` to ``path`` atomically (a temporary file renamed over it); an existing file only with
    ``force`` (a FileExistsError otherwise)."""
    if os.path.exists(path) and not force:
        raise FileExistsError(f"{path} exists; pass --force to replace it")
    atomic.write_json(path, record, indent=2)


def check_writable(path: str) -> None:
    """An OSError naming the reason when the record cannot be written at ``path``: a folder there, or a folder
    this process cannot create a file in. Tried with a probe file (removed at once), because permission bits say
    nothing for root, nor for a read-only or immutable mount: acl-evaluate asks before its sweep, not after."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "a folder is in the way", path)
    atomic.probe_writable(path)


def read(path: str) -> Dict:
    """The record at ``path``, checked: its schema, a policy of ``exits.POLICIES`` and a threshold in its range
    (a JSON number: :func:`json_number`)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if record.get("schema") != SCHEMA:
            raise ValueError(f"schema {record.get('schema')!r}, expected {SCHEMA!r}")
        record["threshold"] = exits.validate(record["policy"], json_number(record["threshold"], "threshold"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise RecordError(f"{path}: not a readable calibration record ({type(e).__name__}: {e}); run "
                         "acl-evaluate --calibrate again, or remove it") from None
    return record


def for_checkpoint(checkpoint: str) -> Optional[Dict]:
    """The record beside ``checkpoint`` when it was calibrated on this very file, else None (a record made for
    another file, or for an earlier version of this one, is named in a warning and not used). A record that
    cannot be read comes back as ``{"policy": None, "error", "source"}``: the error is raised where the record
    would decide (:func:`acl_runtime.request.resolve`), never where an explicit policy is given."""
    path = path_beside(checkpoint)
    if not os.path.isfile(path):
        return None
    try:
        record = read(path)
    except RecordError as e:
        return {"policy": None, "threshold": None, "error": str(e), "source": path}
    if record.get("checkpoint") != os.path.basename(checkpoint) or \
            record.get("checkpoint_sha256") != file_sha256(checkpoint):
        logger.warning("%s was calibrated on another checkpoint (%s, sha256 %s...), not %s: not used; run "
                       "acl-evaluate --calibrate on this one", path, record.get("checkpoint"),
                       str(record.get("checkpoint_sha256"))[:12], checkpoint)
        return None
    return dict(record, source=path)


def policy_choices() -> List[str]:
    """``--policy`` choices of the tools that apply a calibrated policy: the table's, and :data:`NO_POLICY`."""
    return list(exits.POLICIES) + [NO_POLICY]
