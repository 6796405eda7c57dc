"""What the command-line tools (acl-evaluate, acl-predict, acl-convert-hf, acl-preprocess) share: one logging
set-up, one device flag, one way to fail on bad input (exit status 2) and to clean up on SIGTERM."""
import argparse
import logging
import os
import signal
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


class UsageError(SystemExit):
    """Bad input or settings, found before (or instead of) any work: one line for the user, exit status 2
    (argparse's). The message names the file or flag and the fix; :func:`run` prints it without a traceback."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


def run(prog: str, main) -> None:
    """Call ``main()`` as the command ``prog``: a :class:`UsageError` becomes ``prog: error: ...`` and exit status
    2, and SIGTERM cleans up like Ctrl-C does (see :func:`exit_on_sigterm`)."""
    exit_on_sigterm()
    try:
        main()
    except UsageError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)


def exit_on_sigterm() -> None:
    """Turn SIGTERM (what ``kill``, ``timeout`` and schedulers send) into ``SystemExit(143)``, so that the
    ``finally`` blocks that remove temporary outputs run, as they do on Ctrl-C.

    Worker processes forked later inherit the handler; in them it restores the default and re-sends the
    signal, so a pool being terminated ends at once instead of raising inside a task. A second SIGTERM during
    the clean-up ends the process at once (the default action)."""
    owner = os.getpid()

    def handler(signum, frame):
        signal.signal(signum, signal.SIG_DFL)
        if os.getpid() != owner:
            os.kill(os.getpid(), signum)
            return
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
