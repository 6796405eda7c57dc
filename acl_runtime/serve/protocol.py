"""The Open Inference Protocol v2 request and answer, parsed and built without a web framework (plain Python and
numpy), over the declared schema (:mod:`acl_runtime.serve.schema`), and what both routes share (the exit
parameters, a deadline field, blank texts).

``POST /v2/models/{name}/infer`` takes input tensors ``text`` and optional ``text_pair`` (BYTES), per-request
``parameters`` (``policy``, ``threshold``, ``exit_layer``, ``binary_data_output``, and Triton's ``timeout``: the
request's deadline in microseconds), and Triton's binary tensor
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

from acl_runtime import pairing
from acl_runtime import request as request_rule
from acl_runtime.inputs import blank
from acl_runtime.serve import schema
from acl_runtime.serve.errors import BadRequest

Pair = Tuple[str, Optional[str]]
EXIT_PARAMETERS = ("policy", "threshold", "exit_layer")
# Triton request parameters this server cannot honour, and why (refused rather than ignored)
UNSUPPORTED_PARAMETERS = {
    "priority": "this server orders its queues by deadline, not by priority: send \"timeout\" (microseconds) "
                "instead",
}


def deadline(value, field: str) -> Optional[float]:
    """Seconds to the request's deadline from ``field`` as sent (None: not sent, the server's --slo-ms), by the one
    rule of every protocol's deadline (:func:`acl_runtime.request.deadline_seconds`); a bad value is 400."""
    if value is None:
        return None
    try:
        return request_rule.deadline_seconds(value, field)
    except ValueError as e:
        raise BadRequest(400, str(e)) from None


def check_texts(reads, texts: Sequence[Pair], front: str, status: int = 400) -> None:
    """A request's inputs against the texts the model reads per input (``reads``: 1, 2 or None), the rule of
    :mod:`acl_runtime.pairing`, with ``front``'s fix ("predict" or "infer"): what both routes call."""
    try:
        pairing.check(reads, texts, front)
    except pairing.Mismatch as e:
        raise BadRequest(status, str(e)) from None


# ---- Open Inference Protocol v2 ------------------------------------------------------------------


class Output(NamedTuple):
    binary: bool  # answered as binary data after the JSON header
    classes: int  # Triton's classification extension: the N best classes as "score:index:label"; 0: off


class InferRequest(NamedTuple):
    id: Optional[str]
    texts: List[Pair]
    params: Dict  # policy / threshold / exit_layer, type-checked
    outputs: Dict[str, Output]  # requested outputs (all when the request names none)
    deadline: Optional[float] = None  # seconds: Triton's "timeout" parameter (microseconds); None: the server's


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


def _flat(data: list) -> List[str]:
    return [x for item in data for x in (item if isinstance(item, list) else [item])]


def _tensor(spec: schema.InputTensor, tail: bytes, at: int) -> Tuple[List[str], int]:
    """One input tensor: (its strings, bytes of the binary tail it used)."""
    name, shape = spec.name, spec.shape
    if len(shape) == 2 and shape[1] != 1:
        raise BadRequest(400, f"input {name}: shape {json.dumps(shape)}, expected [n] or [n, 1]")
    size = spec.parameters.binary_data_size if spec.parameters is not None else None
    used = 0
    if size is not None:
        if spec.data is not None:
            raise BadRequest(400, f"input {name}: both data and binary_data_size; send one")
        if at + size > len(tail):
            raise BadRequest(400, f"input {name}: binary_data_size {size} does not fit the {len(tail) - at} binary "
                             "bytes left")
        values, used = _bytes_elements(tail[at: at + size], name), size
    elif spec.data is None:
        raise BadRequest(400, f"input {name}: no data and no binary_data_size")
    else:
        values = _flat(spec.data)
    if len(values) != shape[0]:
        raise BadRequest(400, f"input {name}: shape {json.dumps(shape)} but {len(values)} elements")
    for k, v in enumerate(values):
        if blank(v):
            raise BadRequest(400, f"input {name}: element {k} is empty or only spaces or format characters "
                             "(acl-predict skips such a line): send text")
    return values, used


def parse_infer(body: bytes, header_length: Optional[str], output_names: Sequence[str]) -> InferRequest:
    """An OIP v2 inference request (JSON, or JSON plus binary tensors), decoded against
    :class:`acl_runtime.serve.schema.InferRequest`, then checked for what a type cannot say."""
    head, tail = split_binary(body, header_length)
    req = schema.decode(head, schema.InferRequest)
    if not req.inputs:
        raise BadRequest(400, "\"inputs\" must be a non-empty list of tensors (a BYTES tensor named text)")
    tensors, at = {}, 0
    for spec in req.inputs:
        values, used = _tensor(spec, tail, at)
        if spec.name in tensors:
            raise BadRequest(400, f"input {spec.name} is given twice")
        tensors[spec.name], at = values, at + used
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
    params = req.parameters or schema.InferParameters()
    for name, why in UNSUPPORTED_PARAMETERS.items():
        if getattr(params, name) is not None:
            raise BadRequest(400, f"parameter {name!r} is not supported: {why}")
    exit_params = {k: getattr(params, k) for k in EXIT_PARAMETERS if getattr(params, k) is not None}
    return InferRequest(req.id, list(zip(texts, pairs or [None] * len(texts))), exit_params,
                        _outputs(req.outputs, params.binary_data_output, output_names),
                        deadline(params.timeout, "parameters.timeout"))


def _outputs(specs: Optional[List[schema.RequestedOutput]], binary_default: bool,
             names: Sequence[str]) -> Dict[str, Output]:
    if specs is None:
        return {n: Output(binary_default, 0) for n in names}
    if not specs:
        raise BadRequest(400, "\"outputs\", when given, must be a non-empty list of {\"name\": ...}")
    out = {}
    for spec in specs:
        if spec.name not in names:
            raise BadRequest(400, f"unknown output {spec.name!r}: this model gives {', '.join(names)}")
        if spec.name in out:  # as a duplicate input is: two answers for one name cannot both be given
            raise BadRequest(400, f"output {spec.name!r} is asked for twice: ask for each output once")
        params = spec.parameters or schema.OutputParameters()
        binary = binary_default if params.binary_data is None else params.binary_data
        if params.classification and spec.name != "probabilities":
            raise BadRequest(400, f"output {spec.name}: classification applies to the class scores only; ask it "
                             "on probabilities")
        out[spec.name] = Output(binary, params.classification or 0)
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
                   parameters: Dict, labels: Sequence[str] = (),
                   output_parameters: Optional[Dict[str, Dict]] = None) -> Tuple[bytes, Optional[int]]:
    """(body, JSON header length or None): the requested outputs, as JSON data or binary tensors after the JSON;
    ``output_parameters``: an output's own ``parameters`` (the exit layer's ``exit_reason``)."""
    outputs, tail = [], []
    for name, spec in request.outputs.items():
        datatype, values = tensors[name]
        if spec.classes:
            datatype, values = "BYTES", classification(values, spec.classes, labels)
        out = {"name": name, "datatype": datatype, "shape": list(values.shape)}
        if (output_parameters or {}).get(name):
            out["parameters"] = dict(output_parameters[name])
        if spec.binary:
            raw = _binary(values, datatype)
            out.setdefault("parameters", {})["binary_data_size"] = len(raw)
            tail.append(raw)
        else:
            out["data"] = values.ravel().tolist()
        outputs.append(out)
    answer = {"model_name": model, "model_version": version, "parameters": parameters, "outputs": outputs}
    if request.id is not None:
        answer["id"] = request.id
    head = json.dumps(answer).encode("utf-8")
    return (head + b"".join(tail), len(head)) if tail else (head, None)
