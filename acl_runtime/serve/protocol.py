"""The two request formats acl-serve speaks, parsed and answered without a web framework (plain Python and numpy).

- Open Inference Protocol v2 (KServe, Triton, Seldon): ``POST /v2/models/{name}/infer`` with input tensors ``text``
  and optional ``text_pair`` (BYTES), per-request ``parameters`` (``policy``, ``threshold``, ``exit_layer``), and
  Triton's binary tensor extension (what ``tritonclient.http`` sends by default): a JSON header of
  ``Inference-Header-Content-Length`` bytes followed by the raw tensors, a BYTES element being a little-endian
  uint32 length and its bytes.
- text-embeddings-inference's ``POST /predict``: ``{"inputs": "text" | ["a", "b"] (one pair) | [["text"],
  ["premise", "hypothesis"], ...] (a batch)}``, TEI's own reading (router/src/http/types.rs ``PredictInput``).

Every problem is a :class:`BadRequest`: an HTTP status and one line naming what is wrong and the fix.
"""
import json
import struct
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

Pair = Tuple[str, Optional[str]]
EXIT_PARAMETERS = ("policy", "threshold", "exit_layer")


class BadRequest(Exception):
    """A request refused: ``status`` (4xx) and a one-line ``message``; ``kind`` is TEI's ``error_type``."""

    def __init__(self, status: int, message: str, kind: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def parse_json(body: bytes):
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise BadRequest(400, f"the body is not valid JSON ({e}); send a JSON object") from None


def exit_parameters(params) -> Dict:
    """``policy``, ``threshold`` and ``exit_layer`` of a request, type-checked (their ranges are the engine's
    to check, as acl-predict's flags are)."""
    out = {}
    if params.get("policy") is not None:
        if not isinstance(params["policy"], str):
            raise BadRequest(400, f"parameter policy {json.dumps(params['policy'])}: expected a string such as "
                             "\"entropy\"")
        out["policy"] = params["policy"]
    for name, kinds, example in (("threshold", (int, float), "0.3"), ("exit_layer", (int,), "2")):
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise BadRequest(400, f"parameter {name} {json.dumps(value)}: expected a number such as {example}")
        out[name] = value
    return out


# ---- Open Inference Protocol v2 ------------------------------------------------------------------


class InferRequest(NamedTuple):
    id: Optional[str]
    texts: List[Pair]
    params: Dict  # policy / threshold / exit_layer, type-checked
    outputs: Dict[str, bool]  # requested output -> as binary data (all outputs when the request names none)


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
    if spec.get("datatype") != "BYTES":
        raise BadRequest(400, f"input {name}: datatype {spec.get('datatype')!r}, expected \"BYTES\" (text)")
    shape = spec.get("shape")
    if (not isinstance(shape, list) or not shape or len(shape) > 2 or
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape) or
            (len(shape) == 2 and shape[1] != 1)):
        raise BadRequest(400, f"input {name}: shape {json.dumps(shape)}, expected [n] or [n, 1]")
    size = (spec.get("parameters") or {}).get("binary_data_size")
    used = 0
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or at + size > len(tail):
            raise BadRequest(400, f"input {name}: binary_data_size {json.dumps(size)} does not fit the "
                             f"{len(tail) - at} binary bytes left")
        values, used = _bytes_elements(tail[at: at + size], name), size
    else:
        values = _flat(spec.get("data"), name)
        if not all(isinstance(v, str) for v in values):
            raise BadRequest(400, f"input {name}: every element must be a string")
    if len(values) != shape[0]:
        raise BadRequest(400, f"input {name}: shape {json.dumps(shape)} but {len(values)} elements")
    return name, values, used


def parse_infer(body: bytes, header_length: Optional[str], output_names: Sequence[str]) -> InferRequest:
    """An OIP v2 inference request (JSON, or JSON plus binary tensors)."""
    head, tail = split_binary(body, header_length)
    req = parse_json(head)
    if not isinstance(req, dict):
        raise BadRequest(400, "the body must be a JSON object with \"inputs\"")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest(400, "\"inputs\" must be a non-empty list of tensors (a BYTES tensor named text)")
    tensors, at = {}, 0
    for spec in inputs:
        name, values, used = _tensor(spec, tail, at, ("text", "text_pair"))
        if name in tensors:
            raise BadRequest(400, f"input {name} is given twice")
        tensors[name], at = values, at + used
    if "text" not in tensors:
        raise BadRequest(400, "the input tensor \"text\" is missing (text_pair alone is not an input)")
    texts = tensors["text"]
    if not texts:
        raise BadRequest(400, "input text is empty: send at least one string", "Empty")
    pairs = tensors.get("text_pair")
    if pairs is not None and len(pairs) != len(texts):
        raise BadRequest(400, f"text has {len(texts)} elements but text_pair {len(pairs)}: one pair per text")
    params = req.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest(400, "\"parameters\" must be an object")
    unknown = sorted(set(params) - set(EXIT_PARAMETERS) - {"binary_data_output"})
    if unknown:
        raise BadRequest(400, f"unknown parameter {unknown[0]!r}: this model takes {', '.join(EXIT_PARAMETERS)}")
    req_id = req.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise BadRequest(400, "\"id\" must be a string")
    return InferRequest(req_id, list(zip(texts, pairs or [None] * len(texts))), exit_parameters(params),
                        _outputs(req.get("outputs"), bool(params.get("binary_data_output")), output_names))


def _outputs(specs, binary_default: bool, names: Sequence[str]) -> Dict[str, bool]:
    if specs is None:
        return {n: binary_default for n in names}
    if not isinstance(specs, list) or not specs:
        raise BadRequest(400, "\"outputs\", when given, must be a non-empty list of {\"name\": ...}")
    out = {}
    for spec in specs:
        name = spec.get("name") if isinstance(spec, dict) else None
        if name not in names:
            raise BadRequest(400, f"unknown output {name!r}: this model gives {', '.join(names)}")
        out[name] = bool((spec.get("parameters") or {}).get("binary_data", binary_default))
    return out


def _binary(values: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in (str(v).encode("utf-8") for v in values.ravel()))
    dtypes = {"INT64": "<i8", "FP32": "<f4", "BOOL": "?"}
    return np.ascontiguousarray(values, dtype=dtypes[datatype]).tobytes()


def infer_response(model: str, version: str, request: InferRequest, tensors: Dict[str, Tuple[str, np.ndarray]],
                   parameters: Dict) -> Tuple[bytes, Optional[int]]:
    """(body, JSON header length or None): the requested outputs, as JSON data or binary tensors after the JSON."""
    outputs, tail = [], []
    for name, binary in request.outputs.items():
        datatype, values = tensors[name]
        out = {"name": name, "datatype": datatype, "shape": list(values.shape)}
        if binary:
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


# ---- text-embeddings-inference's /predict ---------------------------------------------------------------------


class PredictRequest(NamedTuple):
    texts: List[Pair]
    batch: bool  # answer a list of lists (TEI's batch form) or one list
    raw_scores: bool
    params: Dict


TEI_SHAPES = ('"text", ["premise", "hypothesis"] (one pair), or a batch [["text"], ["premise", "hypothesis"], '
              '...]')


def _sequence(item, k: int) -> Pair:
    if not isinstance(item, list) or not 1 <= len(item) <= 2 or not all(isinstance(s, str) for s in item):
        raise BadRequest(422, f"inputs[{k}] must be [\"text\"] or [\"premise\", \"hypothesis\"]; inputs takes "
                         + TEI_SHAPES)
    return (item[0], item[1] if len(item) == 2 else None)


def parse_predict(body: bytes) -> PredictRequest:
    """TEI's ``PredictRequest``: ``inputs``, ``truncate`` and ``raw_scores`` (``truncate`` is accepted and
    implied: a text over the model's positions is always cut and flagged), plus this server's exit parameters
    (``policy``, ``threshold``, ``exit_layer``) at the top level."""
    req = parse_json(body)
    if not isinstance(req, dict) or "inputs" not in req:
        raise BadRequest(422, "the body must be a JSON object with \"inputs\": " + TEI_SHAPES)
    unknown = sorted(set(req) - {"inputs", "truncate", "raw_scores", "truncation_direction"} - set(EXIT_PARAMETERS))
    if unknown:
        raise BadRequest(422, f"unknown field {unknown[0]!r}: /predict takes inputs, truncate, raw_scores, "
                         + ", ".join(EXIT_PARAMETERS))
    for flag in ("truncate", "raw_scores"):
        if not isinstance(req.get(flag, False), bool):
            raise BadRequest(422, f"{flag} must be true or false")
    if req.get("truncation_direction", "right") not in ("right", "Right"):
        raise BadRequest(422, "truncation_direction: only \"right\" (the end of the text is cut)")
    inputs = req["inputs"]
    if isinstance(inputs, str):
        texts, batch = [(inputs, None)], False
    elif isinstance(inputs, list) and inputs and all(isinstance(s, str) for s in inputs):
        if len(inputs) > 2:
            raise BadRequest(422, f"inputs is a list of {len(inputs)} strings: a list of strings is one pair "
                             "(TEI); send a batch as [[\"text\"], [\"text\"], ...]")
        texts, batch = [_sequence(inputs, 0)], False
    elif isinstance(inputs, list) and inputs:
        texts, batch = [_sequence(item, k) for k, item in enumerate(inputs)], True
    elif isinstance(inputs, list):
        raise BadRequest(400, "inputs is an empty list: send at least one text", "Empty")
    else:
        raise BadRequest(422, f"inputs is {type(inputs).__name__}: it takes " + TEI_SHAPES)
    return PredictRequest(texts, batch, req.get("raw_scores", False), exit_parameters(req))


def predict_response(request: PredictRequest, label_names: Sequence[str], scores: np.ndarray,
                     exit_layers: np.ndarray, truncated: Sequence[bool]) -> list:
    """Per input, every label with its score, highest first (TEI's ``Prediction``), each entry also carrying the
    input's ``exit_layer`` and ``truncated``; a list of those lists for a batch."""
    answers = []
    for row, layer, cut in zip(scores, exit_layers, truncated):
        order = np.argsort(-row, kind="stable")
        answers.append([{"label": label_names[int(i)], "score": float(row[i]), "exit_layer": int(layer),
                         "truncated": bool(cut)} for i in order])
    return answers if request.batch else answers[0]
