"""The checks an exported ``OUT/onnx`` folder passes before anything runs.

:func:`read` parses ``manifest.json``; :func:`check` checks its parts against each other (every key there, the
layer list against the exits, the labels against ``num_classes``, paths inside the folder); :func:`verify_files`
checks every file the engine opens against the sha256 the export recorded (another export's ``tokenizer.json``,
two words' ids swapped, swapped layer graphs, an ``embed.onnx`` of another model: each refused, naming the file);
:func:`check_graphs` checks the graphs' own inputs and outputs (names, hidden size, ``num_classes``), that the
embeddings hold every id the tokenizer can give, and the layout the embeddings graph knows (its padding id, its
position table against ``max_positions``). Each refusal is a ValueError of one line naming
``manifest.json`` or the file, which acl-predict prints with exit status 2. A folder exported before the sha256
were recorded loads with one warning. numpy only (the engine hands the sessions and the tokenizer in).
"""
import json
import logging
import os
from typing import Dict, List, Optional

import numpy as np

from acl_runtime import paths
from acl_runtime.io import file_sha256

logger = logging.getLogger(__name__)
# the exported folder's contract, imported by its writer (acl_fairseq.hf.onnx_export) and its readers (the engine,
# acl-predict, acl-serve): the file's name, its schema, the precisions a folder can hold, its required fields
MANIFEST = paths.MANIFEST  # the name's literal sits in acl_runtime.paths, which tells folders apart by it
SCHEMA = "acl_fairseq.onnx/1"
PRECISIONS = ("fp32", "int8")  # fp32: the exported graphs; int8: the copy acl-export --quantize writes
REQUIRED = ("embeddings", "layers", "exit_layers", "num_layers", "num_classes", "tokenizer", "labels",
            "regression", "regression_scale", "input_layout", "quantized")
LAYOUT_KEYS = ("init", "separator_token", "eos", "segment_embedding", "pad", "unk", "max_positions")


def read(folder: str) -> dict:
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        kind, target = paths.classify(folder)  # the one reading of a mistaken path
        if kind == "export":
            raise FileNotFoundError(f"{path} not found: {folder} is acl-export's OUT; pass {target}")
        raise FileNotFoundError(f"{path} not found: not an exported ONNX folder (acl-export CHECKPOINT --data DATA "
                                "--output OUT --format onnx writes one, in OUT/onnx)")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e}): export the folder again") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        schema = manifest.get("schema") if isinstance(manifest, dict) else None
        raise ValueError(f"{path}: schema {schema!r}, expected {SCHEMA!r}")
    return manifest


def _bad(folder: str, what: str) -> ValueError:
    return ValueError(f"{os.path.join(folder, MANIFEST)}: {what}; export the folder again")


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def inside(folder: str, name) -> str:
    """The path of a file the manifest names, which must stay inside ``folder``: no absolute path, no ``..``,
    no link leading out."""
    if not isinstance(name, str) or not name or os.path.isabs(name) or "\\" in name or \
            ".." in name.split("/"):
        raise _bad(folder, f"the file name {name!r} is not a path inside the folder")
    path = os.path.join(folder, name)
    root = os.path.realpath(folder)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise _bad(folder, f"{name!r} leads outside the folder")
    return path


def _check_layers(folder: str, layers, exit_layers: list) -> None:
    """The ``layers`` records: every layer up to the last exit, in order, with the exits where exit_layers says."""
    if not isinstance(layers, list) or not all(isinstance(r, dict) and {"layer", "file", "exit"} <= set(r)
                                               for r in layers):
        raise _bad(folder, "layers is not a list of {layer, file, exit} records")
    numbers = [r["layer"] for r in layers]
    if numbers != list(range(1, exit_layers[-1] + 1)):
        raise _bad(folder, f"layers lists layers {numbers}, but the exits {exit_layers} need layers "
                           f"1..{exit_layers[-1]}")
    exits_listed = [r["layer"] for r in layers if r["exit"] is not None]
    indices = [r["exit"] for r in layers if r["exit"] is not None]
    if exits_listed != exit_layers or indices != list(range(len(exit_layers))):
        raise _bad(folder, f"layers has exits on layers {exits_listed} (indices {indices}), but exit_layers is "
                           f"{exit_layers}")


def _check_outputs(folder: str, m: dict) -> None:
    """A regression model has one output; a classifier names each of its num_classes once."""
    num_classes = m["num_classes"]
    if m["regression"]:
        if num_classes != 1:
            raise _bad(folder, f"a regression model has 1 output, not num_classes {num_classes}")
    else:
        labels = m["labels"]
        if not isinstance(labels, list) or len(labels) != num_classes or \
                not all(isinstance(x, str) and x for x in labels) or len(set(labels)) != len(labels):
            raise _bad(folder, f"labels is {json.dumps(labels)[:80]}, not {num_classes} distinct names "
                               f"(num_classes)")


def _check_layout_keys(folder: str, layout) -> None:
    """input_layout names every key a graph needs; max_positions and pad are whole numbers."""
    absent = [k for k in LAYOUT_KEYS if not isinstance(layout, dict) or k not in layout]
    if absent:
        raise _bad(folder, f"input_layout has no {', '.join(absent)}")
    if not _int(layout["max_positions"]) or layout["max_positions"] < 2 or not _int(layout["pad"]):
        raise _bad(folder, "input_layout's max_positions or pad is not a whole number")


def check(folder: str, m: dict) -> None:
    """The manifest's parts against each other, before any file is opened."""
    missing = [k for k in REQUIRED if k not in m]
    if missing:
        raise _bad(folder, f"key {', '.join(map(repr, missing))} missing")
    num_layers, num_classes, exit_layers = m["num_layers"], m["num_classes"], m["exit_layers"]
    if not _int(num_layers) or num_layers < 1:
        raise _bad(folder, f"num_layers is {json.dumps(num_layers)}, not a whole number >= 1")
    if not _int(num_classes) or num_classes < 1:
        raise _bad(folder, f"num_classes is {json.dumps(num_classes)}, not a whole number >= 1")
    if not isinstance(m["regression"], bool):
        raise _bad(folder, f"regression is {json.dumps(m['regression'])}, not true or false")
    if not isinstance(exit_layers, list) or not exit_layers or not all(_int(x) for x in exit_layers) or \
            exit_layers != sorted(set(exit_layers)) or exit_layers[0] < 1 or exit_layers[-1] > num_layers:
        raise _bad(folder, f"exit_layers is {json.dumps(exit_layers)}, not increasing layers of 1..{num_layers}")
    _check_layers(folder, m["layers"], exit_layers)
    _check_outputs(folder, m)
    _check_layout_keys(folder, m["input_layout"])
    for name in files(folder, m, None):
        inside(folder, name)


def files(folder: str, m: dict, precision: Optional[str]) -> List[str]:
    """The file names the engine opens for ``precision`` (None: every precision's), the tokenizer included."""
    quantized = m["quantized"]
    if not isinstance(quantized, dict):
        raise _bad(folder, "quantized is not a record")
    names = [m["embeddings"], m["tokenizer"]] + [r["file"] for r in m["layers"]]
    for name, copy in quantized.items():
        if precision in (None, name):
            if not isinstance(copy, dict) or not isinstance(copy.get("layers"), dict):
                raise _bad(folder, f"quantized {name!r} has no layers record")
            names += [copy.get("embeddings")] + list(copy["layers"].values())
    return list(dict.fromkeys(names))


def verify_files(folder: str, m: dict, names: List[str]) -> None:
    """Each of ``names`` against the sha256 the export recorded; a folder without them: one warning."""
    recorded = m.get("sha256")
    if recorded is None:
        logger.warning("%s records no sha256 (exported before they were recorded): its files are not checked; "
                       "export it again to have them checked", os.path.join(folder, MANIFEST))
        return
    if not isinstance(recorded, dict):
        raise _bad(folder, "sha256 is not a record of file -> sha256")
    for name in names:
        if name not in recorded:
            raise _bad(folder, f"no sha256 for {name}")
        path = inside(folder, name)
        if file_sha256(path) != recorded[name]:
            raise ValueError(f"{path}: its sha256 is not the one {MANIFEST} records: the file was changed, or comes "
                             "from another export; copy the whole folder again, or export it again")


def _shape(arg) -> list:
    return list(arg.shape) if arg.shape is not None else []


def check_graphs(folder: str, m: dict, names: Dict, embeddings, layers: List, tokenizer) -> None:
    """The sessions' own inputs and outputs against the manifest: names, one hidden size, ``num_classes`` logits
    exactly on the exit layers; and the embeddings hold every id the tokenizer and the layout can give (probed:
    an id beyond the table is an error in the graph's Gather)."""
    def io(session):
        return [a.name for a in session.get_inputs()], {a.name: _shape(a) for a in session.get_outputs()}

    inputs, outputs = io(embeddings)
    if inputs != ["src_tokens"] or set(outputs) != {"x", "padding_mask"}:
        raise ValueError(f"{os.path.join(folder, names['embeddings'])}: inputs {inputs} and outputs "
                         f"{sorted(outputs)}, not the embeddings graph's; export the folder again")
    width = outputs["x"][-1] if outputs["x"] else None
    for record, session in zip(m["layers"], layers):
        path = os.path.join(folder, names["layers"][record["file"]])
        inputs, outputs = io(session)
        expected = {"x_out", "logits"} if record["exit"] is not None else {"x_out"}
        if sorted(inputs) != ["padding_mask", "x"] or set(outputs) != expected:
            raise ValueError(f"{path}: inputs {inputs} and outputs {sorted(outputs)}, but layer {record['layer']} "
                             f"{'has an exit' if record['exit'] is not None else 'has no exit'} in {MANIFEST}; "
                             "export the folder again")
        size = outputs["x_out"][-1] if outputs["x_out"] else None
        if _int(width) and _int(size) and size != width:
            raise ValueError(f"{path}: hidden size {size}, but {names['embeddings']} gives {width}: the graphs come "
                             "from different models; export the folder again")
        classes = outputs.get("logits", [None])[-1] if outputs.get("logits") else None
        if _int(classes) and classes != m["num_classes"]:
            raise ValueError(f"{path}: {classes} logits, but {MANIFEST} says num_classes {m['num_classes']}; "
                             "export the folder again")
    layout = m["input_layout"]
    ids = [v for v in tokenizer.get_vocab(with_added_tokens=True).values()]
    ids += [layout[k] for k in ("init", "separator_token", "eos", "pad", "unk") if _int(layout[k])]
    top = max(ids)
    try:
        embeddings.run(None, {"src_tokens": np.array([[min(ids), top]], dtype=np.int64)}, _quiet_run())
    except Exception as e:  # onnxruntime's own error classes (pybind)
        raise ValueError(f"{os.path.join(folder, names['embeddings'])} cannot embed id {top} of "
                         f"{m['tokenizer']} ({type(e).__name__}): the embeddings and the tokenizer come from "
                         "different models; export the folder again") from None
    _check_layout(folder, m, names["embeddings"], embeddings, next(i for i in sorted(ids) if i != layout["pad"]))


def _check_layout(folder: str, m: dict, embed_name: str, embeddings, token: int) -> None:
    """What the embeddings graph knows of the input layout: its padding id (the ``padding_mask`` it computes) and
    its position table (probed at ``max_positions`` real tokens); a manifest changed by hand disagrees."""
    layout, path = m["input_layout"], os.path.join(folder, MANIFEST)
    pad, positions = layout["pad"], layout["max_positions"]
    (mask,) = embeddings.run(["padding_mask"], {"src_tokens": np.array([[token, pad]], dtype=np.int64)})
    if np.asarray(mask).tolist() != [[False, True]]:
        raise ValueError(f"{path}: input_layout's pad {pad} is not the padding id of {embed_name} (the graph does "
                         "not mask it): the manifest was changed; export the folder again")
    try:
        embeddings.run(["x"], {"src_tokens": np.full((1, positions), token, dtype=np.int64)}, _quiet_run())
    except Exception as e:  # onnxruntime's own error classes (pybind): the position table's Gather
        raise ValueError(f"{path}: input_layout's max_positions {positions}, but {embed_name}'s position table holds "
                         f"fewer ({type(e).__name__} at {positions} tokens): the manifest was changed; export the "
                         "folder again") from None


def _quiet_run():
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # the probe's expected failure is reported by us, in one line
    return options
