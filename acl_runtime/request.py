"""The one rule of what decides where rows exit, and its error messages: :func:`resolve`, called once at each
command's edge (acl-predict, acl-serve and each of its requests, acl-export, the hub, the engines), and an
:class:`ExitRequest` that the early-exit loop runs without checking it again.

- a policy (a key of ``exits.POLICIES``) runs with its threshold, the table's default when none is given, checked
  against the table's range (``exits.validate``);
- a threshold needs its policy; :data:`NO_POLICY` (the last exit) takes none;
- a policy and a fixed exit layer exclude each other; a fixed exit must be one of the model's exits, and a
  single-exit model takes neither;
- with neither a policy nor an exit layer, the model's serving policy decides (a calibrated ``exit_policy.json``
  or an export's manifest), else the last exit. That default is checked only when it is used, so that a bad one
  never blocks an explicit policy, and its error names its file.

A command calls :func:`resolve` with ``exit_layers=None`` on its flags before the model loads (what the flags
alone get wrong is then a usage error at once) and again with the model's exits once it is loaded.

A request's **deadline** (acl-serve) is read by one rule too, :func:`deadline_seconds`, whichever protocol carries
it (:data:`DEADLINE_FIELDS`: Triton's ``timeout`` parameter in microseconds, ``/predict``'s ``deadline_ms``, the
``X-Deadline-Ms`` header of TEI's routes): a number above 0 and at most :data:`MAX_DEADLINE_SECONDS`, else a
ValueError naming the field. Without one the server's ``--slo-ms`` is the deadline; what a deadline does is the
scheduler's (:mod:`acl_runtime.deadlines`).
"""
import json
import math
import re
from typing import Dict, NamedTuple, Optional, Sequence, Union

from acl_runtime import exits

NO_POLICY = "none"  # a --policy value: the last exit decides, even where a policy was calibrated


class ExitRequest(NamedTuple):
    """What decides where rows exit, resolved and range-checked (:func:`resolve`)."""

    policy: Optional[str] = None  # a key of exits.POLICIES; None: the last exit (or exit_layer) decides
    threshold: Optional[Union[float, int]] = None  # the policy's threshold (None without a policy)
    exit_layer: Optional[int] = None  # every row leaves at this exit
    source: str = "default"  # who asked: "argument", "flag", "request", or the file of a serving policy


LAST_EXIT = ExitRequest()


def resolve(exit_layers: Optional[Sequence[int]], policy: Optional[str] = None, threshold: Optional[float] = None,
            exit_layer: Optional[int] = None, default: Optional[Dict] = None, regression: bool = False,
            source: str = "argument") -> ExitRequest:
    """The request to run, or a ValueError that names what is wrong and the fix. ``exit_layers``: the model's
    exits (1-based layers), or None before the model is loaded (then only what the arguments say alone is
    checked, and ``default`` is not used). ``default``: the model's serving policy, ``{"policy", "threshold",
    "source"}``, or ``{"error", "source"}`` for a record that could not be read (raised where it would decide)."""
    asked_last = policy == NO_POLICY
    if asked_last:
        if threshold is not None:
            raise ValueError(f"--policy {NO_POLICY} (the last exit) takes no threshold")
        policy = None
        default = None  # the last exit, whatever was calibrated
    elif policy is None and threshold is not None:
        raise ValueError(f"a threshold needs its policy: name it ({', '.join(exits.POLICIES)})")
    elif policy is not None and policy not in exits.POLICIES:  # exits.get's message, with what a request takes too
        raise ValueError(f"unknown early-exit policy {policy!r}; expected one of {', '.join(exits.POLICIES)}, or "
                         f"{NO_POLICY} (the last exit)")
    if policy is not None and exit_layer is not None:
        raise ValueError("give either an early-exit policy or a fixed exit layer, not both")
    if exit_layers is None:
        return ExitRequest(policy, None if policy is None else exits.validate(policy, threshold, regression),
                           exit_layer, source)
    if policy is None and exit_layer is None and default is not None:
        if default.get("error"):
            raise ValueError(default["error"])
        if default.get("policy") is not None:
            return _serving_default(list(exit_layers), default, regression)
    if (policy is not None or exit_layer is not None) and len(exit_layers) == 1:
        raise ValueError(
            f"the model has a single exit (layer {exit_layers[0]}): early exit needs a multi-exit model "
            "(multi_exit_roberta trained with several --exit-layers); drop the policy / exit-layer flags")
    if exit_layer is not None and exit_layer not in exit_layers:
        raise ValueError(f"exit layer {exit_layer} is not one of the model's exits {list(exit_layers)}")
    if policy is None and exit_layer is None:
        return ExitRequest(source=source) if asked_last else LAST_EXIT
    return ExitRequest(policy, None if policy is None else exits.validate(policy, threshold, regression), exit_layer,
                       source)


def _serving_default(exit_layers, default: Dict, regression: bool) -> ExitRequest:
    """The model's serving policy as the request, checked as an explicit one is; its error names its file."""
    where, policy, threshold = default.get("source", "the serving policy"), default["policy"], default.get("threshold")
    try:
        if threshold is not None:
            json_number(threshold, "its threshold")
        checked = resolve(exit_layers, policy, threshold, regression=regression)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: its serving policy {json.dumps(policy)} with threshold {json.dumps(threshold)} "
                         f"cannot run: {e}; pass --policy (or --policy {NO_POLICY}), or write it again") from None
    return checked._replace(source=where)


def json_number(value, what: str):
    """``value`` read from a JSON file where a number is expected, else a ValueError: ``true`` is not 1 (Python
    counts a bool as an int), nor is ``"0.3"`` or ``null`` a threshold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {json.dumps(value)}, not a number")
    return value


# ---- a request's deadline --------------------------------------------------------------------------------------

# where each protocol carries a request's deadline: (its unit, units a second)
DEADLINE_FIELDS = {
    "parameters.timeout": ("microseconds", 1e6),  # OIP: Triton's request parameter, a whole number, as Triton reads it
    "deadline_ms": ("milliseconds", 1e3),  # /predict's (and /'s) body
    "X-Deadline-Ms": ("milliseconds", 1e3),  # the header of TEI's routes, for clients that send TEI's body as is
}
MAX_DEADLINE_SECONDS = 86400.0  # a day: anything longer never decides anything, and 1e30 is a typo or an overflow
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def deadline_seconds(value, field: str) -> float:
    """Seconds from a request's arrival to its deadline, from ``field`` of :data:`DEADLINE_FIELDS` as the request
    sent it (a JSON number, or a header's text), or a ValueError naming the field: the one rule of every
    protocol's deadline. Refused: anything but a number (a bool, a string in JSON, ``NaN``, ``inf``), 0 or
    less, more than :data:`MAX_DEADLINE_SECONDS` (an overflow too, whatever its size)."""
    unit, per_second = DEADLINE_FIELDS[field]
    limit = MAX_DEADLINE_SECONDS * per_second
    shown = json.dumps(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else repr(value)
    number = None
    if isinstance(value, str) and field.startswith("X-"):  # a header: text
        text = value.strip()
        number = float(text) if _DECIMAL.fullmatch(text) else None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value
    if number is None or (isinstance(number, float) and math.isnan(number)):
        raise ValueError(f"{field}: {_short(shown)} is not a number: send the deadline as {unit} above 0 (at most "
                         f"{limit:.0f}), or leave it out for the server's --slo-ms")
    if not 0 < number <= limit:  # an int of any size compares exactly (no float overflow); inf is above
        raise ValueError(f"{field}: {_short(shown)} is out of range: a deadline is {unit} above 0 and at most "
                         f"{limit:.0f} (a day); leave it out for the server's --slo-ms")
    return number / per_second


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
