"""The early-exit engine on ONNX Runtime: an exported ``OUT/onnx`` folder, raw text in, predictions out.

    from acl_runtime.engine import Engine
    engine = Engine("OUT/onnx")                    # precision="int8" for the quantized copy
    engine.predict_early_exit(["a sentence", ("a premise", "a hypothesis")], policy="entropy", threshold=0.3)

Needs onnxruntime, numpy and tokenizers only: neither torch nor fairseq is imported. It runs what acl-predict
runs on a checkpoint, through the same code: the loop and the edge of :mod:`acl_runtime.loop` (batches
sorted by length, the policy step of :mod:`acl_runtime.exits` at each exit, exited rows leaving the batch, one
``Prediction`` type), here over :class:`OrtBackend` (the embeddings graph and one graph per layer) instead of
the torch model; the ids are the hub's (the manifest's input layout). Without a policy (and without an exit
layer) the manifest's serving policy decides (acl-export's ``--policy``, else the ``exit_policy.json``
calibrated for the checkpoint), else the last exit; ``policy="none"`` is always the last exit.
"""
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from acl_runtime import conventions, exits, loop, pairing, tokenization
from acl_runtime import manifest as checks
from acl_runtime.loop import BatchOutput

MANIFEST, PRECISIONS = checks.MANIFEST, checks.PRECISIONS  # the contract: acl_runtime.manifest
# onnxruntime's graph optimizations every session runs without, at its default level (all) otherwise.
# SkipLayerNormFusion joins each residual Add and the LayerNormalization after it into one SkipLayerNormalization,
# whose CPU kernel took longer than the two ops it replaces: unfused, a MiniLM layer is 5 to 11% faster at batch 1
# and 32, fp32 and int8, its probabilities within 1.2e-7 (benchmarks/ort_fusions.py; docs/serve.md)
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


class RuntimeMissing(ImportError):
    """onnxruntime (or tokenizers) is not installed."""


def _import(name: str):
    try:
        return __import__(name)
    except ImportError as e:
        raise RuntimeMissing(f"the ONNX runtime needs the {name} package ({e}); install the pinned version: "
                             f"pip install $(grep -E '^{name}==' requirements.txt) (see requirements.txt)") from None


def read_manifest(folder: str) -> dict:
    """``manifest.json``, parsed and its parts checked against each other (:mod:`acl_runtime.manifest`)."""
    manifest = checks.read(folder)
    checks.check(folder, manifest)
    return manifest


def _listed_file(folder: str, name: str) -> str:
    """The path of a file the manifest lists (inside the folder); a missing one means a folder copied in part."""
    path = checks.inside(folder, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found, though {MANIFEST} lists it: the folder was copied in part; "
                                "copy all of it, or export it again")
    return path


def _graph_files(folder: str, m: dict, precision: str) -> dict:
    """``{"embeddings": file, "layers": {fp32 file: file}}`` of ``precision`` as the manifest ``m`` lists them."""
    try:
        files = {"embeddings": m["embeddings"], "layers": {r["file"]: r["file"] for r in m["layers"]}}
        if precision != "fp32":
            if precision not in m["quantized"]:
                raise ValueError(f"{folder} has no {precision} copy: export it with --quantize {precision}")
            files = m["quantized"][precision]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{os.path.join(folder, MANIFEST)}: no valid {e} entry: export the folder again") from None
    return files


def _session(ort, options, folder: str, name: str):
    """An ONNX Runtime CPU session of the folder's listed graph ``name``; a graph it cannot load is a ValueError."""
    path = _listed_file(folder, name)
    try:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=DISABLED_OPTIMIZERS)
    except Exception as e:  # onnxruntime's own errors (pybind classes: InvalidProtobuf, Fail, ...)
        raise ValueError(f"{path}: ONNX Runtime cannot load it ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); export the folder again") from None


def _read_tokenizer(tokenizers, path: str):
    try:
        return tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the tokenizers package's own error (a bare Exception: "EOF while parsing ...")
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path}: not a readable tokenizers file ({reason}); export the folder again") from None


class OrtBackend:
    """The exported graphs as a backend of :func:`acl_runtime.loop.run_batch`: ``embed.onnx``, then
    ``layerN.onnx`` (``(x, padding_mask) -> x``, and the exit's logits where the layer has one). States are
    numpy arrays T x B x C."""

    def __init__(self, embeddings, layers: List, exit_layers: List[int], num_classes: int, pad: int = 1):
        self.embeddings, self.sessions = embeddings, layers
        self.exit_layers, self.num_classes, self.pad = exit_layers, num_classes, pad

    def embed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        # the graph computes the same padding mask (ids == pad) itself
        return self.embeddings.run(None, {"src_tokens": np.ascontiguousarray(ids, dtype=np.int64)})[0]

    def layer(self, i: int, x: np.ndarray, mask: np.ndarray) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        outputs = self.sessions[i - 1].run(None, {"x": x, "padding_mask": mask})
        return outputs[0], (outputs[1] if len(outputs) > 1 else None)

    def take(self, x: np.ndarray, rows: np.ndarray, length: int) -> np.ndarray:
        return np.ascontiguousarray(x[:length, rows])

    def join(self, states: List[np.ndarray], width: int) -> np.ndarray:
        out = np.zeros((width, sum(x.shape[1] for x in states), states[0].shape[2]), dtype=states[0].dtype)
        b = 0
        for x in states:
            out[: x.shape[0], b: b + x.shape[1]] = x
            b += x.shape[1]
        return out


class Engine(loop.EarlyExitPredictor):
    """An exported folder loaded into ONNX Runtime sessions (one per graph): the ONNX Runtime front end of
    :class:`acl_runtime.loop.EarlyExitPredictor` (``predict_early_exit``, ``run_batches``,
    ``resolve_request``, ``check_policy``), the hub being the other."""

    def __init__(self, folder: str, precision: str = "fp32", threads: Optional[int] = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        ort, tokenizers = _import("onnxruntime"), _import("tokenizers")
        self.folder, self.precision = folder, precision
        self.manifest = m = read_manifest(folder)
        files = _graph_files(folder, m, precision)
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = options.inter_op_num_threads = threads
        embeddings = _session(ort, options, folder, files["embeddings"])
        self.layers = [_session(ort, options, folder, files["layers"][r["file"]]) for r in m["layers"]]
        tokenizer_path = _listed_file(folder, m["tokenizer"])
        checks.verify_files(folder, m, [files["embeddings"], m["tokenizer"]] +
                            [files["layers"][r["file"]] for r in m["layers"]])
        self.tokenizer = _read_tokenizer(tokenizers, tokenizer_path)
        checks.check_graphs(folder, m, files, embeddings, self.layers, self.tokenizer)
        self.layout = m["input_layout"]
        self.input_layout = conventions.InputLayout(**{k: self.layout[k] for k in conventions.InputLayout._fields})
        self.exit_layers: List[int] = list(m["exit_layers"])
        self.num_layers: int = m["num_layers"]
        self.regression: bool = m["regression"]
        try:  # 1 or 2; None for a folder exported before it was recorded: its inputs are not checked
            self.texts_per_input = pairing.from_manifest(m)
        except ValueError as e:
            raise ValueError(f"{os.path.join(folder, MANIFEST)}: {e}") from None
        self.pad: int = self.layout["pad"]
        self.regression_scale: float = m["regression_scale"]
        self.backend = OrtBackend(embeddings, self.layers, self.exit_layers, m["num_classes"], self.pad)
        self.policy, self.threshold = m.get("policy"), m.get("threshold")
        # what predict_early_exit runs when no policy is given (the hub's `calibrated`, from the manifest)
        self.serving_policy: Optional[Dict] = None
        if self.policy is not None:  # range-checked when it is used (resolve_request), so --policy is never blocked
            self.serving_policy = {**(m.get("calibration") or {}), "policy": self.policy,
                                   "threshold": self.threshold, "source": os.path.join(folder, MANIFEST)}

    # ---- inputs ----------------------------------------------------------------------------------

    def encode_with_info(self, a: str, b: Optional[str] = None) -> Tuple[List[int], bool]:
        """``(ids, truncated)`` built as the hub builds them: each text cut at its byte budget
        (:func:`acl_runtime.tokenization.clip`), then init token, A, ``</s>``, [separator, B, ``</s>``], cut at
        the model's positions (ending with ``</s>``) when too long."""
        return self.encode_many([(a, b)], batch=False)[0]

    def encode_many(self, inputs: Sequence[Tuple[str, Optional[str]]],
                    batch: bool = True) -> List[Tuple[List[int], bool]]:
        """:meth:`encode_with_info` of every ``(a, b)`` input (``b`` None for one text), their texts tokenized in
        one ``encode_batch`` call (one crossing into the tokenizer, the GIL released while it runs) rather than
        one ``encode`` a text: the same ids and truncation flags. ``batch=False``: one ``encode`` a text (one
        input's one or two texts: ``encode_batch`` of a pair on tokenizers' thread pool took 8-16% more CPU)."""
        max_positions = self.layout["max_positions"]
        clipped = [[tokenization.clip(x, max_positions) for x in ((a,) if b is None else (a, b))] for a, b in inputs]
        flat = [text for row in clipped for text, _ in row]
        if batch and flat:
            encodings = iter(self.tokenizer.encode_batch(flat, add_special_tokens=False))
        else:
            encodings = (self.tokenizer.encode(text, add_special_tokens=False) for text in flat)
        out = []
        for row in clipped:
            words = [self._text_ids(next(encodings).ids) for _ in row]
            ids, truncated = self.input_layout.fit(self.input_layout.build(*words), max_positions)
            out.append((ids, truncated or any(cut for _, cut in row)))
        return out

    def _text_ids(self, ids: List[int]) -> List[int]:
        """The tokenizer file's ids of a text, a special token's id read as ``<unk>``: a folder exported before
        text was text (acl_runtime.tokenization.dictionary_ids) maps a typed ``<pad>`` or ``</s>`` to its row."""
        layout = self.input_layout
        specials = {self.pad, layout.eos, layout.init, layout.separator_token}
        if specials.isdisjoint(ids):
            return ids
        unk = self.tokenizer.token_to_id(self.tokenizer.model.unk_token)
        return [unk if i in specials else i for i in ids]

    def run_batch(self, src: np.ndarray, policy: Optional[str] = None, threshold: float = 0.0,
                  exit_layer: Optional[int] = None, delta: float = exits.DEFAULT_REGRESSION_DELTA) -> BatchOutput:
        """:func:`acl_runtime.loop.run_batch` on one right-padded batch (B, T) of ids."""
        mask = loop.padding_mask(loop.right_padded_lengths(src, self.pad), src.shape[1])
        return loop.run_batch(self.backend, src, mask, loop.ExitRequest(policy, threshold, exit_layer),
                              self.regression, delta)

    def label_names(self) -> List[str]:
        return list(self.manifest["labels"] or [])
