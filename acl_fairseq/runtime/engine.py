"""The early-exit engine on ONNX Runtime: an exported ``OUT/onnx`` folder, raw text in, predictions out.

    from acl_fairseq.runtime import Engine
    engine = Engine("OUT/onnx")                    # precision="int8" for the quantized copy
    engine.predict_early_exit(["a sentence", ("a premise", "a hypothesis")], policy="entropy", threshold=0.3)

Needs onnxruntime, numpy and tokenizers only: neither torch nor fairseq is imported. It runs what acl-predict
runs on a checkpoint (:mod:`acl_fairseq.inference.early_exit` through the hub): the same ids (the manifest's
input layout), inputs sorted by (length, position) and cut into right-padded batches, then the embeddings and
one graph per layer; at each exit the policy step of :mod:`acl_fairseq.exits` (the one policy table), and the
rows that fire leave the batch (padding columns nobody needs any more are cut) before the next layer. Results
come back in input order, with the same fields as the hub's ``Prediction``. Without a policy (and without an
exit layer) the manifest's serving policy decides (acl-export's ``--policy``, else the ``exit_policy.json``
calibrated for the checkpoint), else the last exit; ``policy="none"`` is always the last exit.
"""
import json
import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from acl_fairseq import conventions, exits
from acl_fairseq.inference import calibration

MANIFEST = "manifest.json"
SCHEMA = "acl_fairseq.onnx/1"
PRECISIONS = ("fp32", "int8")

Text = Union[str, Tuple[str, str], List[str]]


class Prediction(NamedTuple):  # the fields of acl_fairseq.inference.hub.Prediction, which needs torch
    label: Union[str, float]
    probabilities: Optional[Dict[str, float]]
    exit_layer: int
    truncated: bool


class RuntimeMissing(ImportError):
    """onnxruntime (or tokenizers) is not installed."""


class BatchOutput(NamedTuple):
    logits: np.ndarray  # (B, K) float32: the exit each row left at
    exit_index: np.ndarray  # (B,) 0-based index into the exits
    exit_layer: np.ndarray  # (B,) 1-based layer of that exit
    layers_computed: np.ndarray  # (B,) layers run for each row


def _import(name: str):
    try:
        return __import__(name)
    except ImportError as e:
        raise RuntimeMissing(f"the ONNX runtime needs the {name} package ({e}); install the pinned version: "
                             f"pip install $(grep -E '^{name}==' requirements.txt) (see requirements.txt)") from None


def read_manifest(folder: str) -> dict:
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        if os.path.isfile(os.path.join(folder, "onnx", MANIFEST)):
            raise FileNotFoundError(f"{path} not found: {folder} is acl-export's OUT; pass "
                                    f"{os.path.join(folder, 'onnx')}")
        raise FileNotFoundError(f"{path} not found: not an exported ONNX folder (acl-export CHECKPOINT --data DATA "
                                "--out OUT --format onnx writes one, in OUT/onnx)")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e}): export the folder again") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        schema = manifest.get("schema") if isinstance(manifest, dict) else None
        raise ValueError(f"{path}: schema {schema!r}, expected {SCHEMA!r}")
    return manifest


def _listed_file(folder: str, name: str) -> str:
    """The path of a file the manifest lists; a missing one means a folder copied in part."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found, though {MANIFEST} lists it: the folder was copied in part; "
                                "copy all of it, or export it again")
    return path


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


class Engine:
    """An exported folder loaded into ONNX Runtime sessions (one per graph)."""

    def __init__(self, folder: str, precision: str = "fp32", threads: Optional[int] = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        ort, tokenizers = _import("onnxruntime"), _import("tokenizers")
        self.folder, self.precision = folder, precision
        self.manifest = m = read_manifest(folder)
        try:
            files = {"embeddings": m["embeddings"], "layers": {r["file"]: r["file"] for r in m["layers"]}}
            if precision != "fp32":
                if precision not in m["quantized"]:
                    raise ValueError(f"{folder} has no {precision} copy: export it with --quantize {precision}")
                files = m["quantized"][precision]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{os.path.join(folder, MANIFEST)}: no valid {e} entry: export the folder again") from None
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = options.inter_op_num_threads = threads

        def session(name):
            path = _listed_file(folder, name)
            try:
                return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            except Exception as e:  # onnxruntime's own errors (pybind classes: InvalidProtobuf, Fail, ...)
                raise ValueError(f"{path}: ONNX Runtime cannot load it ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}); export the folder again") from None

        self.embed = session(files["embeddings"])
        self.layers = [session(files["layers"][r["file"]]) for r in m["layers"]]
        self.tokenizer = tokenizers.Tokenizer.from_file(_listed_file(folder, m["tokenizer"]))
        self.layout = m["input_layout"]
        self.input_layout = conventions.InputLayout(**{k: self.layout[k] for k in conventions.InputLayout._fields})
        self.exit_layers: List[int] = list(m["exit_layers"])
        self.num_layers: int = m["num_layers"]
        self.regression: bool = m["regression"]
        self.policy, self.threshold = m.get("policy"), m.get("threshold")
        # what predict_early_exit runs when no policy is given (the hub's `calibrated`, from the manifest)
        self.serving_policy: Optional[Dict] = None
        if self.policy is not None:
            self.serving_policy = {**(m.get("calibration") or {}), "policy": self.policy,
                                   "threshold": exits.validate(self.policy, self.threshold),
                                   "source": os.path.join(folder, MANIFEST)}

    # ---- inputs ----------------------------------------------------------------------------------

    def _ids(self, text: str) -> List[int]:
        return self.tokenizer.encode(text.strip(), add_special_tokens=False).ids

    def encode_with_info(self, a: str, b: Optional[str] = None) -> Tuple[List[int], bool]:
        """``(ids, truncated)`` built as the hub builds them: init token, A, ``</s>``, [separator, B, ``</s>``],
        cut at the model's positions (ending with ``</s>``) when too long."""
        ids = self.input_layout.build(self._ids(a), None if b is None else self._ids(b))
        return self.input_layout.fit(ids, self.layout["max_positions"])

    def make_batches(self, token_lists: Sequence[Sequence[int]], batch_size: int = 32):
        """``[(positions, src (B, T) int64)]``: sorted by (length, position), right-padded (the hub's batches)."""
        order = sorted(range(len(token_lists)), key=lambda i: (len(token_lists[i]), i))
        out = []
        for start in range(0, len(order), batch_size):
            rows = order[start: start + batch_size]
            src = np.full((len(rows), max(len(token_lists[i]) for i in rows)), self.layout["pad"], dtype=np.int64)
            for r, i in enumerate(rows):
                src[r, : len(token_lists[i])] = token_lists[i]
            out.append((rows, src))
        return out

    # ---- the engine ------------------------------------------------------------------------------

    def check_policy(self, policy: Optional[str], exit_layer: Optional[int],
                     threshold: Optional[float] = None) -> Optional[Union[float, int]]:
        """``exits.check_request`` for this model: the threshold to run with (the policy's default when None)."""
        return exits.check_request(self.exit_layers, policy, exit_layer, threshold, regression=self.regression)

    def run_batch(self, src: np.ndarray, policy: Optional[str] = None, threshold: float = 0.0,
                  exit_layer: Optional[int] = None, delta: float = exits.DEFAULT_REGRESSION_DELTA) -> BatchOutput:
        """``early_exit.early_exit_forward`` on one right-padded batch (B, T) of ids."""
        layers = self.exit_layers
        if exit_layer is not None:
            layers = layers[: layers.index(exit_layer) + 1]
        batch_size = src.shape[0]
        x, padding_mask = self.embed.run(None, {"src_tokens": np.ascontiguousarray(src, dtype=np.int64)})
        exit_logits = np.full((batch_size, self.manifest["num_classes"]), np.nan, dtype=np.float32)
        exit_index = np.full(batch_size, len(layers) - 1, dtype=np.int64)
        computed = np.zeros(batch_size, dtype=np.int64)
        rows = np.arange(batch_size)  # original row of each row still running
        state = exits.init_state(batch_size)
        exit_at = {layer: m for m, layer in enumerate(layers)}
        for layer_no, sess in enumerate(self.layers[: layers[-1]], start=1):
            outputs = sess.run(None, {"x": x, "padding_mask": padding_mask})
            x = outputs[0]
            computed[rows] += 1
            m = exit_at.get(layer_no)
            if m is None:
                continue
            logits = outputs[1]
            exit_logits[rows] = logits  # the latest exit each row reached: in the end, the one it left at
            if policy is None or m == len(layers) - 1:
                continue
            fire, state = exits.policy_step(policy, logits, state, threshold, regression=self.regression,
                                            delta=delta)
            exit_index[rows[fire]] = m
            keep = np.flatnonzero(~fire)
            if keep.size == 0:
                break
            x, padding_mask, rows, state = _keep_rows(x, padding_mask, rows, state, keep)
        exit_layer_of = np.asarray(layers)[exit_index]
        return BatchOutput(exit_logits, exit_index, exit_layer_of, computed)

    def run_batches(self, batches, n: int, policy: Optional[str] = None, threshold: Optional[float] = None,
                    exit_layer: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """``(logits (n, K) of the deciding exit, exit layer (n,))`` in input order."""
        threshold = self.check_policy(policy, exit_layer, threshold)
        logits = np.zeros((n, self.manifest["num_classes"]), dtype=np.float32)
        layers = np.zeros(n, dtype=np.int64)
        for rows, src in batches:
            out = self.run_batch(src, policy, threshold, exit_layer)
            logits[rows], layers[rows] = out.logits, out.exit_layer
        return logits, layers

    def predict_early_exit(self, inputs: Sequence[Text], policy: Optional[str] = None,
                           threshold: Optional[float] = None, exit_layer: Optional[int] = None,
                           batch_size: int = 32) -> List[Prediction]:
        """One :class:`Prediction` per input (a string or an (a, b) pair), as the hub's method of this name; no
        policy: the serving policy when the manifest has one (:func:`acl_fairseq.inference.calibration.resolve`)."""
        policy, threshold = calibration.resolve(policy, threshold, exit_layer, self.serving_policy)
        self.check_policy(policy, exit_layer, threshold)  # before any batch is built
        encoded = [self.encode_with_info(*((x,) if isinstance(x, str) else tuple(x))) for x in inputs]
        logits, layers = self.run_batches(self.make_batches([t for t, _ in encoded], batch_size), len(encoded),
                                          policy, threshold, exit_layer)
        return self.to_predictions(logits, layers, [tr for _, tr in encoded])

    def label_names(self) -> List[str]:
        return list(self.manifest["labels"] or [])

    def to_predictions(self, logits: np.ndarray, layers: np.ndarray, truncated: Sequence[bool]) -> List[Prediction]:
        if self.regression:
            scale = self.manifest["regression_scale"]
            return [Prediction(scale * float(row[0]), None, int(layer), bool(tr))
                    for row, layer, tr in zip(logits, layers, truncated)]
        names = self.label_names()
        return [Prediction(names[int(p.argmax())], dict(zip(names, map(float, p))), int(layer), bool(tr))
                for p, layer, tr in zip(softmax(logits), layers, truncated)]


def _keep_rows(x: np.ndarray, padding_mask: np.ndarray, rows: np.ndarray, state: np.ndarray, keep: np.ndarray):
    """Select the rows still running (x: T x B x C) and cut padding columns none of them uses."""
    padding_mask = padding_mask[keep]
    length = int((~padding_mask).sum(1).max())  # right padding: columns >= length are all padding
    x = np.ascontiguousarray(x[:length, keep])
    return x, np.ascontiguousarray(padding_mask[:, :length]), rows[keep], state[keep]
