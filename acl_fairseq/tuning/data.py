"""Where acl-tune measures: the validation split a study tunes on, never the split the results report.

- Few-shot data (preprocess/glue.py --few-shot N: protocol.json has ``few_shot``): the protocol's valid split
  (dev examples outside the test half) is the objective's; the results are the test half's.
- Full GLUE data: the results are the dev set's (the binarized ``valid``), so a study carves a seeded,
  label-stratified part of train as its validation split (:func:`carve`) and trains on the rest.
"""
import json
import os
import random
import shutil
from typing import Dict, List, Optional, Sequence

from acl_runtime.io import atomic
from acl_runtime.scl_protocols import stratified_sample

CARVE_RECORD = "carve.json"


def setting_of(data_bin: str) -> str:
    """``fewshot`` for data binarized with --few-shot (its valid split is the protocol's), else ``full``."""
    path = os.path.join(data_bin, "protocol.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if "few_shot" in json.load(f):
                return "fewshot"
    return "full"


def load_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _inputs(data_bin: str) -> List[str]:
    return sorted(d for d in os.listdir(data_bin) if d.startswith("input") and os.path.isdir(os.path.join(data_bin, d)))


def _subset_indexed(src_prefix: str, dst_prefix: str, indices: Sequence[int]) -> None:
    from fairseq.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder

    ds = MMapIndexedDataset(src_prefix)
    builder = MMapIndexedDatasetBuilder(dst_prefix + ".bin", dtype=MMapIndexedDataset.Index(src_prefix + ".idx").dtype)
    for i in indices:
        builder.add_item(ds[i])
    builder.finalize(dst_prefix + ".idx")


def _labels(data_bin: str) -> List[object]:
    """Each training example's stratum: its label id (classification) or one stratum (regression)."""
    label = os.path.join(data_bin, "label")
    if os.path.isfile(os.path.join(label, "train.label")):
        with open(os.path.join(label, "train.label"), encoding="utf-8") as f:
            return [0 for _ in f]
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    return [tuple(x.tolist()) for x in MMapIndexedDataset(os.path.join(label, "train"))]


def _write_carve(data_bin: str, tmp: str, train: List[int], valid: List[int], valid_subsets: Sequence[str]) -> None:
    """The carved folder's files in ``tmp``: the dictionaries, tokenizer files and stats copied, train split in two."""
    for name in os.listdir(data_bin):  # stats.json, the tokenizer files: what acl-evaluate and the plan read
        if os.path.isfile(os.path.join(data_bin, name)) and name != "protocol.json":
            shutil.copy2(os.path.join(data_bin, name), tmp)
    for sub in _inputs(data_bin) + ["label"]:
        os.makedirs(os.path.join(tmp, sub))
        src, dst = os.path.join(data_bin, sub), os.path.join(tmp, sub)
        if os.path.isfile(os.path.join(src, "dict.txt")):
            shutil.copy2(os.path.join(src, "dict.txt"), dst)
        if os.path.isfile(os.path.join(src, "train.label")):  # regression: one score per line
            with open(os.path.join(src, "train.label"), encoding="utf-8") as f:
                lines = f.read().splitlines(keepends=True)
            for split, idx in [("train", train)] + [(v, valid) for v in valid_subsets]:
                with open(os.path.join(dst, f"{split}.label"), "w", encoding="utf-8") as f:
                    f.writelines(lines[i] for i in idx)
            continue
        _subset_indexed(os.path.join(src, "train"), os.path.join(dst, "train"), train)
        for v in valid_subsets:
            _subset_indexed(os.path.join(src, "train"), os.path.join(dst, v), valid)


def carve(data_bin: str, out: str, seed: int, fraction: float, valid_subsets: Sequence[str]) -> Dict[str, object]:
    """Write ``out``: ``data_bin`` with a seeded, label-stratified ``fraction`` of train as every split of
    ``valid_subsets`` and the rest as train; the dictionaries and the tokenizer files copied; no test splits.
    The dev set (the source's valid splits) is left out. Reused when ``out`` was carved the same way; written
    beside ``out`` and renamed into place. Returns the record (carve.json)."""
    if not 0 < fraction < 1:
        raise ValueError(f"--carve-fraction must be in (0, 1), not {fraction}")
    want = {"source": os.path.abspath(data_bin), "seed": seed, "fraction": fraction,
            "valid_subsets": list(valid_subsets)}
    record_path = os.path.join(out, CARVE_RECORD)
    if os.path.isfile(record_path):
        with open(record_path, encoding="utf-8") as f:
            old = json.load(f)
        if {k: old.get(k) for k in want} == want:
            return old
        raise ValueError(f"{out} was carved from another source or seed ({ {k: old.get(k) for k in want} }): pass "
                         "another --study-dir, or remove it")
    strata = _labels(data_bin)
    n_valid = max(1, round(fraction * len(strata)))
    if n_valid >= len(strata):
        raise ValueError(f"{data_bin}: {len(strata)} training examples are too few to carve a validation split")
    # its own stream, like the protocols' (scl_protocols._rng): the same seed draws another sample there
    valid = stratified_sample(strata, n_valid, random.Random(f"{seed}:tune-carve"))
    taken = set(valid)
    train = [i for i in range(len(strata)) if i not in taken]
    record = {**want, "train_examples": len(train), "valid_examples": len(valid), "valid_indices": valid,
              "note": "valid = these lines of the source's train split; the source's dev (valid) is not used"}
    if os.path.isdir(out) and not os.path.isfile(record_path):  # a carve that never finished
        shutil.rmtree(out, ignore_errors=True)
    try:
        # written beside out (a killed carve's temporary is removed by the next), placed whole or not at all
        with atomic.staging_folder(out, force=False) as tmp:
            _write_carve(data_bin, tmp, train, valid, valid_subsets)
            atomic.write_json(os.path.join(tmp, CARVE_RECORD), record)
    except FileExistsError:  # another worker carved it first: the same seed, the same split
        return carve(data_bin, out, seed, fraction, valid_subsets)
    return record


def child_env(threads: Optional[int], environ=os.environ) -> Dict[str, str]:
    env = dict(environ)
    if threads:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(threads)
    return env


def drop_checkpoints(run_dir: str) -> None:
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            if name.startswith("checkpoint") and name.endswith(".pt"):
                os.remove(os.path.join(run_dir, name))
