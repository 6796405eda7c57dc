"""text-embeddings-inference's classifier route (``POST /predict``, and ``POST /`` as TEI serves a classifier),
parsed and answered without a web framework, with the Hugging Face Inference API's task parameters.

- TEI's ``PredictRequest`` (router/src/http/types.rs): ``{"inputs": "text" | ["a", "b"] (one pair) |
  [["text"], ["premise", "hypothesis"], ...] (a batch), "truncate", "raw_scores", "truncation_direction"}``, plus
  this server's exit parameters (``policy``, ``threshold``, ``exit_layer``) and the request's deadline
  (``deadline_ms``, or the ``X-Deadline-Ms`` header for a client that sends TEI's body as is) at the top level.
  Answered as TEI answers: per input every label with its score, highest first, each entry with its input's exit
  layer and why it left there (``exit_reason``).
- ``"parameters": {"top_k": K, "function_to_apply": "softmax" | "sigmoid" | "none"}``: the Inference API's
  text-classification task, what ``huggingface_hub.InferenceClient.text_classification`` sends (always, ``{}``
  when it names neither). Such a request is answered in that API's shape, a list per input even for one text,
  which is what the client reads.
"""
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from acl_runtime.inputs import blank
from acl_runtime.serve import schema
from acl_runtime.serve.errors import BadRequest
from acl_runtime.serve.protocol import EXIT_PARAMETERS, Pair, deadline

SHAPES = ('"text", ["premise", "hypothesis"] (one pair), or a batch [["text"], ["premise", "hypothesis"], '
          '...]')


class PredictRequest(NamedTuple):
    texts: List[Pair]
    batch: bool  # answer a list of lists (TEI's batch form, or the Inference API's shape) or one list
    function: str  # softmax (probabilities), sigmoid, or none (the deciding exit's logits)
    top_k: Optional[int]
    params: Dict
    deadline: Optional[float] = None  # seconds: deadline_ms or the X-Deadline-Ms header; None: the server's


def _sequence(item, k: int) -> Pair:
    if not isinstance(item, list) or not 1 <= len(item) <= 2 or not all(isinstance(s, str) for s in item):
        raise BadRequest(422, f"inputs[{k}] must be [\"text\"] or [\"premise\", \"hypothesis\"]; inputs takes "
                         + SHAPES)
    return (item[0], item[1] if len(item) == 2 else None)


def _inputs(inputs) -> tuple:
    """(texts, batch) as TEI's ``PredictInput`` reads ``inputs``."""
    if isinstance(inputs, str):
        return [(inputs, None)], False
    if isinstance(inputs, list) and inputs and all(isinstance(s, str) for s in inputs):
        if len(inputs) > 2:
            raise BadRequest(422, f"inputs is a list of {len(inputs)} strings: a list of strings is one pair "
                             "(TEI); send a batch as [[\"text\"], [\"text\"], ...]")
        return [_sequence(inputs, 0)], False
    if isinstance(inputs, list) and inputs:
        return [_sequence(item, k) for k, item in enumerate(inputs)], True
    if isinstance(inputs, list):
        raise BadRequest(400, "inputs is an empty list: send at least one text", "Empty")
    raise BadRequest(422, f"inputs is {type(inputs).__name__}: it takes " + SHAPES)


def parse_predict(body: bytes, deadline_header: Optional[str] = None) -> PredictRequest:
    """TEI's ``PredictRequest`` (``truncate`` is accepted and implied: a text over the model's positions is always
    cut and flagged), this server's exit parameters, and the Inference API's ``parameters``: decoded against
    :class:`acl_runtime.serve.schema.PredictRequest`, then TEI's reading of ``inputs``. ``deadline_header``: the
    ``X-Deadline-Ms`` header's value."""
    req = schema.decode(body, schema.PredictRequest, 422)
    texts, batch = _inputs(req.inputs)
    for k, pair in enumerate(texts):
        if any(t is not None and blank(t) for t in pair):
            where = f"inputs[{k}]" if batch else "inputs"
            raise BadRequest(422, f"{where} holds a text that is empty or only spaces or format characters "
                             "(acl-predict skips such a line): send text")
    task = req.parameters
    function = task.function_to_apply if task is not None else None
    if function is not None and req.raw_scores:
        raise BadRequest(422, "raw_scores and parameters.function_to_apply both say what the scores are: send one")
    exit_params = {k: getattr(req, k) for k in EXIT_PARAMETERS if getattr(req, k) is not None}
    if req.deadline_ms is not None and deadline_header is not None:
        raise BadRequest(400, "deadline_ms and the X-Deadline-Ms header both give the request's deadline: send one")
    seconds = deadline(req.deadline_ms, "deadline_ms") if deadline_header is None else \
        deadline(deadline_header, "X-Deadline-Ms")
    return PredictRequest(texts, batch or task is not None, function or ("none" if req.raw_scores else "softmax"),
                          task.top_k if task is not None else None, exit_params, seconds)


def scores(request: PredictRequest, logits: np.ndarray) -> np.ndarray:
    """The scores the request asked for, from the deciding exits' logits (n, K)."""
    logits = np.asarray(logits, dtype=np.float64)
    if request.function == "none":
        return logits
    if request.function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def predict_response(request: PredictRequest, label_names: Sequence[str], scores: np.ndarray,
                     exit_layers: np.ndarray, truncated: Sequence[bool], reasons: Sequence[str]) -> list:
    """Per input, every label (or the ``top_k`` best) with its score, highest first (TEI's ``Prediction``), each
    entry also carrying the input's ``exit_layer``, ``exit_reason`` (acl_runtime.deadlines.REASONS) and
    ``truncated``; a list of those lists for a batch."""
    answers = []
    for row, layer, cut, reason in zip(scores, exit_layers, truncated, reasons):
        order = np.argsort(-row, kind="stable")[: request.top_k]
        answers.append([{"label": label_names[int(i)], "score": float(row[i]), "exit_layer": int(layer),
                         "exit_reason": str(reason), "truncated": bool(cut)} for i in order])
    return answers if request.batch else answers[0]
