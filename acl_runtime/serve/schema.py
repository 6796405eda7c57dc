"""The request bodies of both routes, declared once as msgspec Structs: decoded and validated in one pass (unknown
fields refused, JSON booleans only, nesting bounded by the typed decoder), published as OpenAPI
(:func:`openapi`, ``GET /openapi.json``), and the source of tests/serve_fuzz.py's hypothesis strategies.

What a type cannot say (a tensor's element count against its shape, a pair's two sides, a blank text, the ranges
of the exit parameters and of a deadline) is checked after decoding, in :mod:`acl_runtime.serve.protocol` and
:mod:`acl_runtime.serve.tei` (a deadline by :func:`acl_runtime.request.deadline_seconds`, whose refusals are 400 on
both routes, its field's type errors too). A decoding error becomes one line naming the field (:func:`decode`), a
``NaN`` or ``Infinity`` (which Python's json writes, and JSON lacks) too.
"""
import json
import re
import typing
from typing import Dict, List, Literal, Optional, Union

import msgspec
from msgspec import Meta, Struct

from acl_runtime.request import MAX_DEADLINE_SECONDS
from acl_runtime.serve.errors import BadRequest

Count = typing.Annotated[int, Meta(ge=0)]
Positive = typing.Annotated[int, Meta(ge=1)]
OUTPUTS = ("label", "exit_layer", "probabilities", "truncated")
REFUSED = ("priority",)  # declared so that its refusal can say why (protocol.UNSUPPORTED_PARAMETERS)
DEADLINES = ("parameters.timeout", "deadline_ms")  # the deadline fields: a refusal of one is 400 on either route
# documented, not checked here: request.deadline_seconds is the one rule of every deadline field
Microseconds = typing.Annotated[int, Meta(description="Triton's timeout: the request's deadline in microseconds",
                                          extra_json_schema={"minimum": 1, "maximum": int(MAX_DEADLINE_SECONDS * 1e6)})]
Milliseconds = typing.Annotated[Union[int, float], Meta(
    description="the request's deadline in milliseconds (else the server's --slo-ms)",
    extra_json_schema={"exclusiveMinimum": 0, "maximum": MAX_DEADLINE_SECONDS * 1e3})]


class _Strict(Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


# ---- Open Inference Protocol v2 ------------------------------------------------------------------


class InputParameters(_Strict):
    binary_data_size: Optional[Count] = None  # Triton's binary extension: this tensor's bytes after the JSON


class InputTensor(_Strict):
    name: Literal["text", "text_pair"]
    datatype: Literal["BYTES"]
    shape: typing.Annotated[List[Count], Meta(min_length=1, max_length=2)]  # [n] or [n, 1]
    data: Optional[List[Union[str, List[str]]]] = None
    parameters: Optional[InputParameters] = None


class OutputParameters(_Strict):
    binary_data: Optional[bool] = None
    classification: Optional[Positive] = None  # Triton's classification extension: the N best classes


class RequestedOutput(_Strict):
    name: Literal[OUTPUTS]
    parameters: Optional[OutputParameters] = None


class InferParameters(_Strict):
    policy: Optional[str] = None
    threshold: Optional[Union[int, float]] = None  # kept as sent: refusals quote it as acl-predict does
    exit_layer: Optional[int] = None
    binary_data_output: bool = False
    priority: Optional[int] = None  # Triton's; declared so that the refusal can say why (protocol.py)
    timeout: Optional[Microseconds] = None  # Triton's: microseconds, the request's deadline (request.py's rule)


class InferRequest(_Strict):
    inputs: List[InputTensor]
    id: Optional[str] = None
    outputs: Optional[List[RequestedOutput]] = None
    parameters: Optional[InferParameters] = None


# ---- TEI's /predict and the Inference API's parameters -------------------------------------------------------


class TaskParameters(_Strict):
    top_k: Optional[Positive] = None
    function_to_apply: Optional[Literal["softmax", "sigmoid", "none"]] = None


class PredictRequest(_Strict):
    inputs: Union[str, List[Union[str, List[str]]]]
    truncate: bool = False
    raw_scores: bool = False
    truncation_direction: Literal["right", "Right"] = "right"  # the end of a text is cut
    policy: Optional[str] = None
    threshold: Optional[Union[int, float]] = None  # kept as sent: refusals quote it as acl-predict does
    exit_layer: Optional[int] = None
    deadline_ms: Optional[Milliseconds] = None  # the request's deadline (request.py's rule); header X-Deadline-Ms
    parameters: Optional[TaskParameters] = None


_DECODERS = {t: msgspec.json.Decoder(t) for t in (InferRequest, PredictRequest)}
_AT = re.compile(r" - at `\$(.*)`$")


def decode(body: bytes, kind: type, status: int = 400):
    """``body`` as a ``kind`` Struct; a refusal of one line naming the field at fault, with what it takes."""
    try:
        return _DECODERS[kind].decode(body)
    except msgspec.ValidationError as e:
        message = _message(str(e), kind)
        raise BadRequest(400 if message.split(":")[0] in DEADLINES else status, message) from None
    except msgspec.DecodeError as e:
        named = _not_a_json_number(body)
        if named:
            raise BadRequest(400, named) from None
        raise BadRequest(400, f"the body is not valid JSON ({e}); send a JSON object") from None
    except RecursionError:
        raise BadRequest(status, "the body's JSON is nested too deeply; requests here are at most a few levels "
                         "deep") from None


def _not_a_json_number(body: bytes) -> Optional[str]:
    """A body that is JSON but for a ``NaN``, ``Infinity`` or ``-Infinity`` (what Python's json writes for a float
    that is not a number): one line naming the first such field; None for any other malformed body."""
    found = []

    def constant(name):
        found.append(name)
        return _NotANumber(name)

    try:
        tree = json.loads(body, parse_constant=constant)
    except (ValueError, RecursionError):
        return None
    if not found:
        return None
    path = _path_to(tree, lambda x: isinstance(x, _NotANumber)) or ""
    return f"{path or 'the body'}: {found[0]} is not a JSON number (JSON has no {found[0]}): send a number"


class _NotANumber(str):
    pass


def _path_to(tree, hit, path: str = "") -> Optional[str]:
    if hit(tree):
        return path
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in items:
        inner = _path_to(value, hit, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip("."))
        if inner is not None:
            return inner
    return None


def _message(text: str, kind: type) -> str:
    found = _AT.search(text)
    path = found.group(1).lstrip(".") if found else ""
    text = text[: found.start()] if found else text
    text = text[0].lower() + text[1:]
    text = text.replace("`", "'").replace("'object'", "a JSON object").replace("'array'", "a list")
    text = re.sub(r"'([^']*\|[^']*)'", lambda m: "'" + m.group(1).replace("array", "list") + "'", text)
    at = _type_at(kind, path)
    if text.startswith("object contains unknown field") and isinstance(at, type) and issubclass(at, Struct):
        taken = [f for f in at.__struct_fields__ if f not in REFUSED]
        text = f"{text.replace('object contains ', '')}: it takes {', '.join(taken)}"
    elif text.startswith("invalid enum value") and typing.get_origin(at) is Literal:
        text += f": it takes {', '.join(map(str, typing.get_args(at)))}"
    return f"{path or 'the body'}: {text}"


def _type_at(kind, path: str):
    """The declared type at ``path`` ("inputs[0].parameters") of ``kind``, Optional unwrapped."""
    current = kind
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        current = _unwrap(current)
        if part.startswith("["):
            current = _element(current)
        elif isinstance(current, type) and issubclass(current, Struct):
            current = typing.get_type_hints(current, include_extras=True).get(part)
        else:
            return None
    return _unwrap(current)


def _element(t):
    """The element type of a list type, or of the first list among a Union's options."""
    for option in typing.get_args(t) if typing.get_origin(t) is Union else (t,):
        option = _unwrap(option)
        if typing.get_origin(option) is list:
            return typing.get_args(option)[0]
    return None


def _unwrap(t):
    if typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    if typing.get_origin(t) is Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return t


def openapi(version: str) -> Dict:
    """An OpenAPI 3.1 document of the two inference routes, their request bodies from the Structs above."""
    (infer, predict), components = msgspec.json.schema_components(
        [InferRequest, PredictRequest], ref_template="#/components/schemas/{name}")
    error = {"type": "object", "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}},
             "required": ["error"]}
    components["Error"] = error

    def post(summary: str, body: Dict, ok: str, statuses) -> Dict:
        responses = {"200": {"description": ok}}
        responses.update({str(s): {"description": d, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Error"}}}} for s, d in statuses})
        return {"post": {"summary": summary, "requestBody": {"required": True, "content": {
            "application/json": {"schema": body}}}, "responses": responses}}

    common = [(400, "a bad body, named"), (413, "over --max-body-bytes or --max-queue"), (415, "an unknown "
              "Content-Encoding"), (500, "internal error and a request id"), (503, "the queue is full: Retry-After")]
    tei_post = post("TEI's classifier route", predict, "per input, every label and its score",
                    common + [(422, "a wrong shape or type (TEI's Validation)")])
    return {"openapi": "3.1.0", "info": {"title": "acl-serve", "version": version},
            "paths": {"/v2/models/{name}/infer": post("Open Inference Protocol v2 inference", infer,
                                                      "the requested outputs", common + [(404, "unknown model")]),
                      "/predict": tei_post, "/": tei_post},
            "components": {"schemas": components}}
