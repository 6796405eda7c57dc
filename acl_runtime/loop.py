"""The early-exit loop, written once for every backend: numpy only (no torch, no onnxruntime here).

A backend is a model cut at its layers (:class:`Backend`): ``embed(ids, mask) -> state``, then
``layer(i, state, mask) -> (state, logits or None)`` for layer ``i`` (1-based; logits (B, K) float32 where the
layer has an exit), and ``take(state, rows, length)`` to keep some rows and cut the padding columns beyond
``length``. The torch model (:class:`acl_fairseq.inference.early_exit.TorchBackend`) and the exported ONNX
graphs (:class:`acl_runtime.engine.OrtBackend`) are the two backends; :func:`run_batch` is the one
loop over them: at each exit the step of :mod:`acl_runtime.exits` (the one policy table), and the rows that fire
leave the batch before the next layer. The loop keeps no state between calls: a row's answer depends on its
ids and the request only, which a scheduler that calls ``layer`` on rows gathered from several batches needs.

What a user asks for (policy, threshold, exit layer, and where it came from: a flag, an argument, a request,
``exit_policy.json``, an export's manifest) is resolved and validated once, at the edge, into an
:class:`ExitRequest` (:func:`acl_runtime.request.resolve`); the loop runs it without checking it again.
:class:`EarlyExitPredictor` is that edge and the rest both front ends share: length-sorted batches, results in
input order, one :class:`Prediction` type.
"""
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from acl_runtime import exits, pairing
from acl_runtime import request as request_rule
from acl_runtime.request import LAST_EXIT, ExitRequest  # noqa: F401  (the loop's input)

Text = Union[str, Tuple[str, str], List[str]]
State = Any  # a backend's hidden states (T x B x C): a numpy array, or a torch tensor on the model's device


class Prediction(NamedTuple):
    label: Union[str, float]  # the label name, or the regression score (x5 for STS-B, as the GLUE files)
    probabilities: Optional[Dict[str, float]]  # label name -> probability (None for regression)
    exit_layer: int  # 1-based encoder layer of the exit that decided
    truncated: bool  # the input was longer than the model's positions and was cut


class Backend(Protocol):
    exit_layers: List[int]  # 1-based layers with an exit, increasing
    num_classes: int
    pad: int  # the padding id the embeddings read as padding

    def embed(self, ids: Any, mask: np.ndarray) -> State:
        """ids (B, T) right-padded, mask (B, T) bool (True: padding) -> the embedded states."""

    def layer(self, i: int, state: State, mask: np.ndarray) -> Tuple[State, Optional[np.ndarray]]:
        """Encoder layer ``i`` (1-based); with its exit's logits (B, K) float32 when it has one, else None."""

    def take(self, state: State, rows: np.ndarray, length: int) -> State:
        """The rows ``rows`` of ``state``, cut to its first ``length`` positions."""

    def join(self, states: Sequence[State], width: int) -> State:
        """States of rows from several batches as one batch: each padded to ``width`` positions (the padding is
        masked, so its values do not matter), stacked along the batch. For the scheduler
        (:mod:`acl_runtime.scheduler`); ``run_batch`` does not need it."""


class BatchOutput(NamedTuple):
    logits: np.ndarray  # (B, K) float32: the exit each row left at
    exit_index: np.ndarray  # (B,) 0-based index into the exits
    exit_layer: np.ndarray  # (B,) 1-based layer of that exit
    layers_computed: np.ndarray  # (B,) layers run for each row
    exit_logits: np.ndarray  # (B, M, K) float32: every exit computed for the row, NaN after its exit


def _keep_rows(backend: Backend, state: Any, mask: np.ndarray, keep: np.ndarray):
    """``(state, mask)`` of the rows ``keep`` only, cut to their longest row (right padding: columns past it are
    padding in every kept row)."""
    mask = mask[keep]
    length = int((~mask).sum(1).max())
    return backend.take(state, keep, length), np.ascontiguousarray(mask[:, :length])


def run_batch(backend: Backend, ids: Any, mask: np.ndarray, request: ExitRequest = LAST_EXIT,
              regression: bool = False, delta: float = exits.DEFAULT_REGRESSION_DELTA) -> BatchOutput:
    """One right-padded batch through ``backend``, each row leaving where ``request`` says. ``mask``: (B, T) bool,
    True at padding. ``request`` is not range-checked here (the edge did it; a threshold above 1 is a valid
    "never" in a test); an exit layer the model lacks is a ValueError."""
    layers = list(backend.exit_layers)
    num_exits = len(layers)
    if request.exit_layer is not None:
        if request.exit_layer not in layers:
            raise ValueError(f"exit layer {request.exit_layer} is not one of the model's exits {layers}")
        layers = layers[: layers.index(request.exit_layer) + 1]
    mask = np.asarray(mask, dtype=bool)
    batch_size = mask.shape[0]
    exit_logits = np.full((batch_size, num_exits, backend.num_classes), np.nan, dtype=np.float32)
    exit_index = np.full(batch_size, len(layers) - 1, dtype=np.int64)
    computed = np.zeros(batch_size, dtype=np.int64)
    rows = np.arange(batch_size)  # original row of each row still running
    policy_state = exits.init_state(batch_size)
    exit_at = {layer: m for m, layer in enumerate(layers)}
    state = backend.embed(ids, mask)
    for i in range(1, layers[-1] + 1):
        state, logits = backend.layer(i, state, mask)
        computed[rows] += 1
        m = exit_at.get(i)
        if m is None:
            continue
        exit_logits[rows, m] = logits
        if request.policy is None or m == len(layers) - 1:
            continue
        fire, policy_state = exits.policy_step(request.policy, logits, policy_state, request.threshold,
                                               regression=regression, delta=delta)
        exit_index[rows[fire]] = m
        keep = np.flatnonzero(~fire)
        if keep.size == 0:
            break
        state, mask = _keep_rows(backend, state, mask, keep)
        rows, policy_state = rows[keep], policy_state[keep]
    final = exit_logits[np.arange(batch_size), exit_index]
    return BatchOutput(final, exit_index, np.asarray(layers)[exit_index], computed, exit_logits)


class Batch(tuple):
    """``(positions, ids (B, T))``, unpacked as a pair, with ``lengths`` (B,): row ``r`` is its first
    ``lengths[r]`` ids, the columns after them padding."""

    lengths: np.ndarray

    def __new__(cls, rows: List[int], src: Any, lengths: np.ndarray):
        batch = super().__new__(cls, (rows, src))
        batch.lengths = np.asarray(lengths, dtype=np.int64)
        return batch


def padding_mask(lengths: Sequence[int], width: int) -> np.ndarray:
    """(B, width) bool, True at the columns beyond each row's length: padding known from lengths, not from ids."""
    return np.arange(width)[None, :] >= np.asarray(lengths, dtype=np.int64)[:, None]


def right_padded_lengths(ids: Any, pad: int) -> np.ndarray:
    """Row lengths of a right-padded batch made elsewhere (without lengths): up to the last id that is not
    ``pad``, so a padding id inside a row is counted as the row's, never taken for its end."""
    real = np.asarray(ids) != pad
    width = real.shape[1]
    return np.where(real.any(1), width - np.argmax(real[:, ::-1], axis=1), 0).astype(np.int64)


def make_batches(token_lists: Sequence[Sequence[int]], batch_size: int, pad: int) -> List[Batch]:
    """Batches (:class:`Batch`): inputs sorted by (length, position), as acl-evaluate sorts a split, cut into batches
    and right-padded with ``pad``. A row holding ``pad`` is refused: the models' embeddings (fairseq's positions,
    the exported graph's mask) would take it for padding, whatever the lengths say; text never makes one
    (:func:`acl_runtime.tokenization.dictionary_ids`)."""
    order = sorted(range(len(token_lists)), key=lambda i: (len(token_lists[i]), i))
    out = []
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        lengths = np.asarray([len(token_lists[i]) for i in rows], dtype=np.int64)
        src = np.full((len(rows), int(lengths.max())), pad, dtype=np.int64)
        for r, i in enumerate(rows):
            src[r, : lengths[r]] = np.asarray(token_lists[i])
        inside = np.flatnonzero(((src == pad) & ~padding_mask(lengths, src.shape[1])).any(1))
        if inside.size:
            raise ValueError(f"input {rows[int(inside[0])]} holds the padding id {pad} among its tokens: a model "
                             "cannot tell it from padding; encode text with encode(), which never makes one")
        out.append(Batch(rows, src, lengths))
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


class EarlyExitPredictor:
    """Raw text in, :class:`Prediction` out, for a front end that provides: ``backend``, ``exit_layers``,
    ``num_layers``, ``regression``, ``regression_scale``, ``serving_policy`` (what runs when no policy is given:
    ``{"policy", "threshold", "source"}`` or None), ``pad``, ``encode_with_info(a, b=None) -> (ids, truncated)``
    and ``label_names()``. The hub (torch) and the ONNX Runtime engine are two. ``texts_per_input`` (1, 2, or
    None where unknown): what an input may hold (:mod:`acl_runtime.pairing`)."""

    texts_per_input: Optional[int] = None

    def resolve_request(self, policy: Optional[str] = None, threshold: Optional[float] = None,
                        exit_layer: Optional[int] = None, source: str = "argument") -> ExitRequest:
        """:func:`acl_runtime.request.resolve` with this model's exits and serving policy."""
        return request_rule.resolve(self.exit_layers, policy, threshold, exit_layer, self.serving_policy,
                                    self.regression, source)

    def make_batches(self, token_lists: Sequence[Sequence[int]], batch_size: int = 32):
        return make_batches(token_lists, batch_size, self.pad)

    def run_request(self, batches, n: int, request: ExitRequest) -> Tuple[np.ndarray, np.ndarray]:
        """``(logits (n, K) of the deciding exit, exit layer (n,))`` in input order, numpy."""
        logits = np.zeros((n, self.backend.num_classes), dtype=np.float32)
        layers = np.zeros(n, dtype=np.int64)
        for batch in batches:
            rows, src = batch
            lengths = getattr(batch, "lengths", None)
            lengths = right_padded_lengths(src, self.pad) if lengths is None else lengths
            out = run_batch(self.backend, src, padding_mask(lengths, src.shape[1]), request, self.regression)
            logits[rows], layers[rows] = out.logits, out.exit_layer
        return logits, layers

    def run_batches(self, batches, n: int, policy: Optional[str] = None, threshold: Optional[float] = None,
                    exit_layer: Optional[int] = None):
        """``(logits (n, K) of the deciding exit, exit layer (n,))`` in input order (no calibrated default)."""
        return self.run_request(batches, n, request_rule.resolve(self.exit_layers, policy, threshold, exit_layer,
                                                                 regression=self.regression))

    def predict_texts(self, inputs: Sequence[Text], request: ExitRequest, batch_size: int = 32) -> List[Prediction]:
        """One :class:`Prediction` per input (a string or an (a, b) pair) under a resolved ``request``; pairs on a
        single-text model are a :class:`acl_runtime.pairing.Mismatch` (a ValueError)."""
        pairing.check(self.texts_per_input, inputs, "python")
        encoded = [self.encode_with_info(*((x,) if isinstance(x, str) else tuple(x))) for x in inputs]
        logits, layers = self.run_request(self.make_batches([t for t, _ in encoded], batch_size), len(encoded),
                                          request)
        return self.to_predictions(logits, layers, [tr for _, tr in encoded])

    def predict_early_exit(self, inputs: Sequence[Text], policy: Optional[str] = None,
                           threshold: Optional[float] = None, exit_layer: Optional[int] = None,
                           batch_size: int = 32) -> List[Prediction]:
        """One :class:`Prediction` per input (a string or an (a, b) pair). Without a policy or exit layer the
        serving policy decides (the calibrated ``exit_policy.json`` of a checkpoint, an export's manifest), else
        the last exit; ``policy="none"`` is always the last exit. ``policy`` is one of ``exits.POLICIES`` and
        ``threshold`` its threshold (default: the table's), refused with a ValueError naming the range."""
        return self.predict_texts(inputs, self.resolve_request(policy, threshold, exit_layer), batch_size)

    def to_predictions(self, logits, layers, truncated: Sequence[bool]) -> List[Prediction]:
        logits, layers = np.asarray(logits, dtype=np.float32), np.asarray(layers)
        if self.regression:
            return [Prediction(self.regression_scale * float(row[0]), None, int(layer), bool(tr))
                    for row, layer, tr in zip(logits, layers, truncated)]
        names = self.label_names()
        return [Prediction(names[int(p.argmax())], dict(zip(names, map(float, p))), int(layer), bool(tr))
                for p, layer, tr in zip(softmax(logits), layers, truncated)]
