#!/usr/bin/env python
"""One serving process of benchmarks/serve_speed.py: load one engine, classify the sentences of a file, print
its peak resident memory as JSON.

    python benchmarks/load/serve_child.py ort --folder OUT/onnx --precision int8 --input FILE [--policy P --threshold T]
    python benchmarks/load/serve_child.py torch --checkpoint CKPT --data DATA --input FILE [...]

``ort`` imports only :mod:`acl_runtime` (onnxruntime, numpy, tokenizers); torch and fairseq are made
unimportable first (this venv has them, and ``import acl_fairseq`` would load them to register the plugin), so
its peak is what a deployment without them costs; ``torch`` loads the same model through the hub (torch and
fairseq). The peak is this process's resident high-water mark after the whole file is classified: ``VmHWM`` of
/proc/self/status, which belongs to the process's own address space. Not ``ru_maxrss``: Linux carries it across
fork and exec, so a child started by a 500 MB parent reports at least the parent's size. Elsewhere
``ru_maxrss`` it is, and ``rss_method`` says which. The JSON also says whether torch or fairseq ended up imported,
so that a runtime-only figure that is not one shows.
:func:`peak_rss` starts the three processes for serve_speed.py.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from typing import Dict, List


class _Block:
    """A meta-path finder that makes torch and fairseq unimportable, as on a machine without them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "fairseq"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def classify_ort(args):
    sys.meta_path.insert(0, _Block())
    from acl_runtime.engine import Engine

    engine = Engine(args.folder, precision=args.precision, threads=args.threads)
    return engine.predict_early_exit(args.sentences, policy=args.policy, threshold=args.threshold,
                                     batch_size=args.batch_size)


def classify_torch(args):
    import torch

    from acl_fairseq.inference import hub

    torch.set_num_threads(args.threads)
    model = hub.from_checkpoint(args.checkpoint, args.data)
    return model.predict_early_exit(args.sentences, policy=args.policy, threshold=args.threshold,
                                    batch_size=args.batch_size)


def peak_rss(ckpt: str, data: str, folder: str, sentences: List[str], policy: str, threshold: float,
             batch_size: int, threads: int) -> Dict:
    """engine (torch, ort-fp32, ort-int8) -> this script's record from a process of its own, each classifying
    ``sentences`` with early exit."""
    import acl_fairseq

    child = os.path.abspath(__file__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(acl_fairseq.__file__)))  # this acl_fairseq, not another
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    out = {}
    with tempfile.TemporaryDirectory(prefix="serve_speed_") as tmp:
        path = os.path.join(tmp, "sentences.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(sentences) + "\n")
        common_flags = ["--input", path, "--policy", policy, "--threshold", str(threshold),
                        "--batch-size", str(batch_size), "--threads", str(threads)]
        cmds = {"torch": ["torch", "--checkpoint", ckpt, "--data", data],
                "ort-fp32": ["ort", "--folder", folder, "--precision", "fp32"],
                "ort-int8": ["ort", "--folder", folder, "--precision", "int8"]}
        for engine, cmd in cmds.items():
            proc = subprocess.run([sys.executable, child, *cmd, *common_flags], capture_output=True, text=True, env=env)
            if proc.returncode:
                raise RuntimeError(f"serve_speed: the {engine} process failed ({proc.returncode}):\n"
                                   f"{proc.stderr[-3000:]}")
            out[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def peak_mb():
    """(peak resident MiB of this process, method)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024, "VmHWM"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "ru_maxrss"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("engine", choices=["ort", "torch"], help="the runtime alone, or torch + fairseq through the hub")
    p.add_argument("--input", required=True, help="sentences, one per line")
    p.add_argument("--folder", help="ort: the exported ONNX folder")
    p.add_argument("--precision", default="fp32", help="ort: fp32 or int8")
    p.add_argument("--checkpoint", help="torch: the checkpoint")
    p.add_argument("--data", help="torch: its binarized data folder")
    p.add_argument("--policy", help="early-exit policy (none: all layers)")
    p.add_argument("--threshold", type=float, help="its threshold")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    with open(args.input, encoding="utf-8") as f:
        args.sentences = f.read().splitlines()
    preds = classify_ort(args) if args.engine == "ort" else classify_torch(args)
    peak, method = peak_mb()
    print(json.dumps({"engine": args.engine, "precision": args.precision if args.engine == "ort" else "fp32",
                      "peak_rss_mb": peak, "rss_method": method,
                      "torch_loaded": "torch" in sys.modules, "fairseq_loaded": "fairseq" in sys.modules,
                      "labels": [p.label for p in preds]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
