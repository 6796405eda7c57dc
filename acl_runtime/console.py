"""What the command-line tools (acl-evaluate, acl-predict, acl-convert-hf, acl-preprocess) share: one logging
set-up, one device flag, the early-exit thresholds' range check, one way to fail on bad input (exit
status 2) and to clean up on SIGTERM."""
import argparse
import logging
import os
import signal
import sys
from typing import Dict, List, Optional

from acl_runtime import exits, request

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


def positive_int(text: str) -> int:
    """argparse ``type`` for a count: a whole number of at least 1, else argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive whole number")
    return value


class UsageError(SystemExit):
    """Bad input or settings, found before (or instead of) any work: one line for the user, exit status 2
    (argparse's). The message names the file or flag and the fix; :func:`run` prints it without a traceback."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


def run(prog: str, main, refusals: tuple = ()) -> None:
    """Call ``main()`` as the command ``prog``, every command's one start-up and exit-code policy: a
    :class:`UsageError` (or an exception of ``refusals``: the command's own bad-input errors) becomes
    ``prog: error: ...`` and exit status 2; Ctrl-C exits 130 and SIGTERM 143, both after the ``finally`` clean-ups
    (:func:`exit_on_sigterm`); a reader that goes away (``acl-predict ... | head``) ends the command quietly with a
    shell's SIGPIPE status, 141, as Unix filters end; an int that ``main`` returns is the exit status."""
    exit_on_sigterm()
    try:
        status = main()
    except (UsageError, *refusals) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # Python's recipe: point stdout at devnull so that the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    if isinstance(status, int) and status:
        sys.exit(status)


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


def threshold_type(policy: str):
    """argparse ``type=`` for one policy's threshold: the range of ``exits.POLICIES`` (a usage error, exit 2)."""

    def parse(text: str):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{policy} threshold {text!r} is not a number") from None
        try:
            return exits.validate(policy, value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = f"{policy} threshold"  # argparse names the type in some of its messages
    return parse


def check_request_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, fill_default: bool = False) -> None:
    """``--policy``, ``--threshold`` and ``--exit-layer`` (where the command has it) through
    :func:`acl_runtime.request.resolve` before anything loads: parser.error (exit 2) for what the flags alone get
    wrong; a threshold comes back range-checked (``fill_default``: the policy's default when none was given, for a
    benchmark that records the threshold it ran)."""
    try:
        resolved = request.resolve(None, args.policy, args.threshold, getattr(args, "exit_layer", None))
    except ValueError as e:
        parser.error(str(e))
    if args.threshold is not None or fill_default:
        args.threshold = resolved.threshold


def add_sweep_arguments(parser: argparse.ArgumentParser, default_text: Optional[Dict[str, str]] = None) -> None:
    """One flag per row of ``exits.POLICIES`` (``row.flag``): the thresholds to sweep, range-checked.
    ``default_text``: policy -> what the caller does instead of the table's grid when the flag is absent."""
    for row in exits.POLICIES.values():
        default = (default_text or {}).get(row.name, row.grid_text)
        parser.add_argument(row.flag, dest=f"sweep_{row.name}", nargs="+", type=threshold_type(row.name), metavar="T",
                            help=f"{row.name} policy thresholds to sweep: {row.rule}; each {row.range_text} "
                            f"(default: {default})")


def sweep_values(args: argparse.Namespace, policy: str, num_exits: int) -> List:
    """The thresholds of ``policy`` to sweep: its flag's, else the table's grid for ``num_exits`` exits."""
    given = getattr(args, f"sweep_{policy}")
    return given if given is not None else exits.POLICIES[policy].sweep(num_exits)
