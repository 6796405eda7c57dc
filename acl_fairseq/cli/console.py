"""What the command-line tools (acl-evaluate, acl-predict, acl-convert-hf, acl-preprocess) share: one logging
set-up and one device flag."""
import argparse
import logging
import os
import sys

LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq's own
DEVICES = ("auto", "cpu", "cuda")


def setup_logging(default_level: str = "INFO") -> None:
    """Log to stderr at $LOGLEVEL (else ``default_level``). force: importing fairseq already configured the root
    logger (at DEBUG, in its wav2vec module)."""
    logging.basicConfig(format=LOG_FORMAT, level=os.environ.get("LOGLEVEL", default_level).upper(), stream=sys.stderr,
                        force=True)
    logging.getLogger("hydra").setLevel(logging.WARNING)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where the model runs (auto: CUDA when available; default: %(default)s)")
    parser.add_argument("--cpu", dest="device", action="store_const", const="cpu", help="deprecated: --device cpu")


def resolve_device(device: str) -> str:
    """'cpu' or 'cuda' for a --device value; asking for CUDA where there is none is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but CUDA is not available here (use --device cpu or auto)")
    return device
