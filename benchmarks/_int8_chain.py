"""ONNX Runtime as the benchmarks open it: a one-thread session (:func:`session`, the ops it runs after its
optimizer: :func:`session_ops`), an engine with other sessions swapped in (:func:`swap_sessions`), and an exported
OUT/onnx folder's chain of graphs run directly, every exit's logits kept: on this CPU (:func:`run_rows`) or under
``qemu-x86_64 -cpu CPU`` (:func:`run_emulated`, this file as the child), for the ONNX benchmarks (int8_portability.py,
int8_static.py, ort_fusions.py, gemm_roofline.py) and tests/inference/test_int8.py.

    python benchmarks/_int8_chain.py DIR --folder OUT/onnx --precision int8 --batch-size 8 [--layer-dir D]

(the child: DIR/rows.npz in, DIR/logits.npy out)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Dict, Iterator, List

import numpy as np

LEVELS = {"none": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}


def options(level: str = "all", profile: str = None):
    """One-thread session options at ``level``, warnings off; ``profile``: ORT's profiler on, its files' prefix."""
    import onnxruntime as ort

    out = ort.SessionOptions()
    out.intra_op_num_threads = out.inter_op_num_threads = 1
    out.log_severity_level = 3
    out.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    if profile:
        out.enable_profiling, out.profile_file_prefix = True, profile
    return out


def session(path: str, level: str = "all", profile: str = None, disabled=()):
    """A one-thread CPU session of ``path`` at ``level``, without the optimizers named in ``disabled`` (the engine's:
    ``acl_runtime.engine.DISABLED_OPTIMIZERS``)."""
    import onnxruntime as ort

    return ort.InferenceSession(path, options(level, profile), providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def session_ops(path: str, level: str, disabled=()) -> Counter:
    """The op types of the graph the session runs, after its optimizer (saved once to a temporary file)."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="session_ops_") as tmp:
        opts = options(level)
        opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled))
        return Counter(n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node)


def swap_sessions(eng, embeddings, layers):
    """``eng`` (an ``acl_runtime.engine.Engine``) running ``embeddings`` and ``layers`` instead of its own sessions."""
    from acl_runtime.engine import OrtBackend

    eng.layers = layers
    eng.backend = OrtBackend(embeddings, layers, eng.exit_layers, eng.manifest["num_classes"], eng.pad)
    return eng


def manifest(folder: str) -> Dict:
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def token_rows(folder: str, n: int, seed: int = 0) -> List[np.ndarray]:
    """``n`` rows ``<s> w ... </s>`` of random ordinary token ids (4-30 long) of the folder's vocabulary."""
    m = manifest(folder)
    with open(os.path.join(folder, m["tokenizer"]), encoding="utf-8") as f:
        vocab = len(json.load(f)["model"]["vocab"])
    layout, rng = m["input_layout"], np.random.default_rng(seed)
    first = max(layout["pad"], layout["unk"], layout["eos"], layout["init"]) + 1
    rows = []
    for _ in range(n):
        ids = rng.integers(first, vocab, int(rng.integers(4, 31)))
        ids[0], ids[-1] = layout["init"], layout["eos"]
        rows.append(ids.astype(np.int64))
    return rows


def sessions(folder: str, precision: str, layer_dir: str = None, exact: bool = False):
    """``exact``: no graph optimization, so that a QDQ graph runs as written (QuantizeLinear, DequantizeLinear, float
    MatMul): the quantized model's arithmetic without any CPU's integer kernel, which is what no kind may change."""
    level = "none" if exact else "all"
    m = manifest(folder)
    files = {r["file"]: r["file"] for r in m["layers"]}
    if precision != "fp32":
        files = m["quantized"][precision]["layers"]
    embed = session(os.path.join(folder, m["embeddings"]), level)
    base = layer_dir or folder
    layers = [session(os.path.join(base, files[r["file"]] if layer_dir is None else r["file"]), level)
              for r in m["layers"]]
    return m, embed, layers


def padded(rows: List[np.ndarray], batch: int, pad: int) -> Iterator[np.ndarray]:
    """``rows`` ``batch`` at a time, each call's rows padded with ``pad`` to its longest."""
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids = np.full((len(chunk), max(len(r) for r in chunk)), pad, dtype=np.int64)
        for i, r in enumerate(chunk):
            ids[i, :len(r)] = r
        yield ids


def run_rows(folder: str, rows: List[np.ndarray], batch: int, precision: str = "fp32",
             layer_dir: str = None, exact: bool = False) -> np.ndarray:
    """Every exit's logits (N, exits, K) of ``rows``, ``batch`` rows a call, padded to the longest of each call.
    ``layer_dir``: take the layer graphs (by their fp32 file names) from there instead; ``exact``: see
    :func:`sessions`."""
    m, embed, layers = sessions(folder, precision, layer_dir, exact)
    out = []
    for ids in padded(rows, batch, m["input_layout"]["pad"]):
        x, mask = embed.run(None, {"src_tokens": ids})
        logits = []
        for rec, session in zip(m["layers"], layers):
            result = session.run(None, {"x": x, "padding_mask": mask})
            x = result[0]
            if rec["exit"] is not None:
                logits.append(result[1])
        out.append(np.stack(logits, 1))
    return np.concatenate(out)


def run_emulated(folder: str, rows: List[np.ndarray], batch: int, precision: str = "fp32", cpu: str = "EPYC-Rome",
                 layer_dir: str = None) -> np.ndarray:
    """:func:`run_rows` in a child process under ``qemu-x86_64 -cpu CPU``."""
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(os.path.join(tmp, "rows.npz"), *rows)
        argv = ["qemu-x86_64", "-cpu", cpu, sys.executable, os.path.abspath(__file__), tmp, "--folder", folder,
                "--precision", precision, "--batch-size", str(batch)]
        argv += ["--layer-dir", layer_dir] if layer_dir else []
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"emulated run failed ({done.returncode}): {done.stderr[-2000:]}")
        return np.load(os.path.join(tmp, "logits.npy"))


def child(argv=None) -> None:
    """One chain, run in the emulated process: DIR/rows.npz in, DIR/logits.npy out."""
    p = argparse.ArgumentParser(description="run one chain (under qemu) and save its logits")
    p.add_argument("dir")
    p.add_argument("--folder", required=True)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--layer-dir")
    args = p.parse_args(argv)
    data = np.load(os.path.join(args.dir, "rows.npz"))
    rows = [data[f"arr_{i}"] for i in range(len(data.files))]
    np.save(os.path.join(args.dir, "logits.npy"), run_rows(args.folder, rows, args.batch_size, args.precision,
                                                             args.layer_dir))


if __name__ == "__main__":
    child()
