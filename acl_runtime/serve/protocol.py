"""The Open Inference Protocol v2 request and answer, parsed and built without a web framework (plain Python and
numpy), and what both routes share (:class:`BadRequest`, JSON parsing, the exit parameters, empty texts).

``POST /v2/models/{name}/infer`` takes input tensors ``text`` and optional ``text_pair`` (BYTES), per-request
``parameters`` (``policy``, ``threshold``, ``exit_layer``, ``binary_data_output``), and Triton's binary tensor
extension (what ``tritonclient.http`` sends by default): a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the raw tensors, a BYTES element being a little-endian uint32 length and its bytes. An output may ask
for Triton's classification extension (``"parameters": {"classification": N}``): its N best classes as
``"score:index:label"`` strings. TEI's ``/predict`` is :mod:`acl_runtime.serve.tei`.

Every problem is a :class:`BadRequest`: an HTTP status and one line naming the field at fault and the fix.
"""
import json
import struct
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

Pair = Tuple[str, Optional[str]]
EXIT_PARAMETERS = ("policy", "threshold", "exit_layer")
# Triton request parameters this server cannot honour, and why (refused rather than ignored)
UNSUPPORTED_PARAMETERS = {
    "priority": "this server has one queue, answered in arrival order with early exit; leave priority out",
    "timeout": "the server takes no per-request deadline (it answers or says 503 at once when the queue is full); "
               "set the timeout on the client instead",
}
INPUT_PARAMETERS = ("binary_data_size",)
OUTPUT_PARAMETERS = ("binary_data", "classification")


class BadRequest(Exception):
    """A request refused: ``status`` (4xx) and a one-line ``message``; ``kind`` is TEI's ``error_type``."""

    def __init__(self, status: int, message: str, kind: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def parse_json(body: bytes, status: int = 400):
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadRequest(400, f"the body is not valid JSON ({e}); send a JSON object") from None
    except RecursionError:  # Python's parser recurses once per level: a body of 100000 '[' exhausts the stack
        raise BadRequest(status, "the body's JSON is nested too deeply; requests here are at most a few levels "
                         "deep") from None


def is_bool(value) -> bool:
    return isinstance(value, bool)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def an_object(value, where: str, status: int = 400) -> Dict:
    """``value`` if it is a JSON object (absent: empty), else a refusal naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(status, f"{where} must be a JSON object, got {type(value).__name__} "
                         f"{json.dumps(value)[:40]}")
    return value


def refuse_unknown(keys, known: Sequence[str], where: str, status: int = 400) -> None:
    unknown = sorted(set(keys) - set(known))
    if unknown:
        raise BadRequest(status, f"unknown {where} {unknown[0]!r}: it takes {', '.join(known)}")


def exit_parameters(params, status: int = 400) -> Dict:
    """``policy``, ``threshold`` and ``exit_layer`` of a request, type-checked (their ranges are the engine's
    to check, as acl-predict's flags are)."""
    out = {}
    if params.get("policy") is not None:
        if not isinstance(params["policy"], str):
            raise BadRequest(status, f"parameter policy {json.dumps(params['policy'])}: expected a string such as "
                             "\"entropy\"")
        out["policy"] = params["policy"]
    for name, kinds, example in (("threshold", (int, float), "0.3"), ("exit_layer", (int,), "2")):
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise BadRequest(status, f"parameter {name} {json.dumps(value)}: expected a number such as {example}")
        out[name] = value
    return out


def blank(text: str) -> bool:
    """Empty or only spaces: acl-predict skips such a line (acl_runtime.inputs), so the server refuses it."""
    return not text.strip()


# ---- Open Inference Protocol v2 ------------------------------------------------------------------


class Output(NamedTuple):
    binary: bool  # answered as binary data after the JSON header
    classes: int  # Triton's classification extension: the N best classes as "score:index:label"; 0: off


class InferRequest(NamedTuple):
    id: Optional[str]
    texts: List[Pair]
    params: Dict  # policy / threshold / exit_layer, type-checked
    outputs: Dict[str, Output]  # requested outputs (all when the request names none)


def split_binary(body: bytes, header_length: Optional[str]) -> Tuple[bytes, bytes]:
    """(JSON header, binary tail) of a body with Triton's ``Inference-Header-Content-Length``."""
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(body):
        raise BadRequest(400, f"Inference-Header-Content-Length {header_length!r} is not a length within the "
                         f"{len(body)}-byte body")
    return body[:n], body[n:]


def _bytes_elements(raw: bytes, name: str) -> List[str]:
    """A BYTES tensor in the binary extension's layout: uint32 LE length, then that many bytes, repeated."""
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise BadRequest(400, f"input {name}: binary BYTES data ends inside an element's length")
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise BadRequest(400, f"input {name}: binary BYTES element of {n} bytes runs past the data")
        out.append(_utf8(raw[at + 4: at + 4 + n], name))
        at += 4 + n
    return out


def _utf8(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(400, f"input {name}: an element is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _flat(data, name: str) -> list:
    if not isinstance(data, list):
        raise BadRequest(400, f"input {name}: data must be a list of strings, got {type(data).__name__}")
    out = []
    for x in data:
        out.extend(_flat(x, name) if isinstance(x, list) else [x])
    return out


def _tensor(spec, tail: bytes, at: int, known: Sequence[str]) -> Tuple[str, List[str], int]:
    """One input tensor: (name, its strings, bytes of the tail it used)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise BadRequest(400, "each input must be an object with a name, datatype, shape and data")
    name = spec["name"]
    if name not in known:
        raise BadRequest(400, f"unknown input {name!r}: this model takes {', '.join(known)}")
    refuse_unknown(spec, ("name", "datatype", "shape", "data", "parameters"), f"field of input {name}")
    if spec.get("datatype") != "BYTES":
        raise BadRequest(400, f"input {name}: datatype {spec.get('datatype')!r}, expected \"BYTES\" (text)")
    shape = spec.get("shape")
    if (not isinstance(shape, list) or not shape or len(shape) > 2 or not all(is_int(d) and d >= 0 for d in shape)
            or (len(shape) == 2 and shape[1] != 1)):
        raise BadRequest(400, f"input {name}: shape {json.dumps(shape)}, expected [n] or [n, 1]")
    params = an_object(spec.get("parameters"), f"input {name}'s parameters")
    refuse_unknown(params, INPUT_PARAMETERS, f"parameter of input {name}")
    size = params.get("binary_data_size")
    used = 0
    if size is not None:
        if "data" in spec:
            raise BadRequest(400, f"input {name}: both data and binary_data_size; send one")
        if not is_int(size) or size < 0 or at + size > len(tail):
            raise BadRequest(400, f"input {name}: binary_data_size {json.dumps(size)} does not fit the "
                             f"{len(tail) - at} binary bytes left")
        values, used = _bytes_elements(tail[at: at + size], name), size
    else:
        values = _flat(spec.get("data"), name)
        if not all(isinstance(v, str) for v in values):
            raise BadRequest(400, f"input {name}: every element must be a string")
    if len(values) != shape[0]:
        raise BadRequest(400, f"input {name}: shape {json.dumps(shape)} but {len(values)} elements")
    for k, v in enumerate(values):
        if blank(v):
            raise BadRequest(400, f"input {name}: element {k} is empty or only spaces (acl-predict skips such a "
                             "line): send text")
    return name, values, used


def parse_infer(body: bytes, header_length: Optional[str], output_names: Sequence[str]) -> InferRequest:
    """An OIP v2 inference request (JSON, or JSON plus binary tensors)."""
    head, tail = split_binary(body, header_length)
    req = parse_json(head)
    if not isinstance(req, dict):
        raise BadRequest(400, "the body must be a JSON object with \"inputs\"")
    refuse_unknown(req, ("id", "inputs", "outputs", "parameters"), "field")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest(400, "\"inputs\" must be a non-empty list of tensors (a BYTES tensor named text)")
    tensors, at = {}, 0
    for spec in inputs:
        name, values, used = _tensor(spec, tail, at, ("text", "text_pair"))
        if name in tensors:
            raise BadRequest(400, f"input {name} is given twice")
        tensors[name], at = values, at + used
    if at != len(tail):
        raise BadRequest(400, f"{len(tail) - at} bytes are left after the last binary tensor: each input's "
                         "binary_data_size must account for the whole binary part")
    if "text" not in tensors:
        raise BadRequest(400, "the input tensor \"text\" is missing (text_pair alone is not an input)")
    texts = tensors["text"]
    if not texts:
        raise BadRequest(400, "input text is empty: send at least one string", "Empty")
    pairs = tensors.get("text_pair")
    if pairs is not None and len(pairs) != len(texts):
        raise BadRequest(400, f"text has {len(texts)} elements but text_pair {len(pairs)}: one pair per text")
    params = an_object(req.get("parameters"), "\"parameters\"")
    for name, why in UNSUPPORTED_PARAMETERS.items():
        if name in params:
            raise BadRequest(400, f"parameter {name!r} is not supported: {why}")
    refuse_unknown(params, EXIT_PARAMETERS + ("binary_data_output",), "parameter")
    binary = params.get("binary_data_output", False)
    if not is_bool(binary):
        raise BadRequest(400, f"parameter binary_data_output {json.dumps(binary)}: expected true or false (a JSON "
                         "boolean)")
    req_id = req.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise BadRequest(400, "\"id\" must be a string")
    return InferRequest(req_id, list(zip(texts, pairs or [None] * len(texts))), exit_parameters(params),
                        _outputs(req.get("outputs"), binary, output_names))


def _outputs(specs, binary_default: bool, names: Sequence[str]) -> Dict[str, Output]:
    if specs is None:
        return {n: Output(binary_default, 0) for n in names}
    if not isinstance(specs, list) or not specs:
        raise BadRequest(400, "\"outputs\", when given, must be a non-empty list of {\"name\": ...}")
    out = {}
    for spec in specs:
        name = spec.get("name") if isinstance(spec, dict) else None
        if name not in names:
            raise BadRequest(400, f"unknown output {name!r}: this model gives {', '.join(names)}")
        refuse_unknown(spec, ("name", "parameters"), f"field of output {name}")
        params = an_object(spec.get("parameters"), f"output {name}'s parameters")
        refuse_unknown(params, OUTPUT_PARAMETERS, f"parameter of output {name}")
        binary = params.get("binary_data", binary_default)
        if not is_bool(binary):
            raise BadRequest(400, f"output {name}: binary_data {json.dumps(binary)}, expected true or false")
        classes = params.get("classification", 0)
        if not is_int(classes) or classes < 0:
            raise BadRequest(400, f"output {name}: classification {json.dumps(classes)}, expected a whole number "
                             "of classes >= 1")
        if classes and name != "probabilities":
            raise BadRequest(400, f"output {name}: classification applies to the class scores only; ask it on "
                             "probabilities")
        out[name] = Output(binary, classes)
    return out


def classification(probabilities: np.ndarray, count: int, labels: Sequence[str]) -> np.ndarray:
    """Triton's classification extension: per row its ``count`` best classes (at most K), best first, as
    ``"score:index:label"`` (a BYTES tensor of shape (n, count))."""
    count = min(count, probabilities.shape[1])
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :count]
    return np.asarray([[f"{row[i]:f}:{i}:{labels[i]}" for i in best] for row, best in zip(probabilities, order)],
                      dtype=object).reshape(len(probabilities), count)


def _binary(values: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in (str(v).encode("utf-8") for v in values.ravel()))
    dtypes = {"INT64": "<i8", "FP32": "<f4", "BOOL": "?"}
    return np.ascontiguousarray(values, dtype=dtypes[datatype]).tobytes()


def infer_response(model: str, version: str, request: InferRequest, tensors: Dict[str, Tuple[str, np.ndarray]],
                   parameters: Dict, labels: Sequence[str] = ()) -> Tuple[bytes, Optional[int]]:
    """(body, JSON header length or None): the requested outputs, as JSON data or binary tensors after the JSON."""
    outputs, tail = [], []
    for name, spec in request.outputs.items():
        datatype, values = tensors[name]
        if spec.classes:
            datatype, values = "BYTES", classification(values, spec.classes, labels)
        out = {"name": name, "datatype": datatype, "shape": list(values.shape)}
        if spec.binary:
            raw = _binary(values, datatype)
            out["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        else:
            out["data"] = values.ravel().tolist()
        outputs.append(out)
    answer = {"model_name": model, "model_version": version, "parameters": parameters, "outputs": outputs}
    if request.id is not None:
        answer["id"] = request.id
    head = json.dumps(answer).encode("utf-8")
    return (head + b"".join(tail), len(head)) if tail else (head, None)
