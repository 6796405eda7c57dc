"""The parent parser of every benchmark script: the description from the script's docstring, and the flags the
scripts share, each with one spelling and one help text: ``--json PATH`` with ``--force`` (an existing --json is
refused before any work unless --force is given) and ``--threads N``."""
import argparse
import os
import shlex
import sys
from typing import Optional, Sequence, Union

JSON_HELP = "write the results here"
FORCE_HELP = "replace an existing --json"
THREADS_HELP = ("threads of each measured engine or run: torch.set_num_threads, ONNX Runtime's intra-op threads, a "
                "training run's OMP_NUM_THREADS, as the script runs them (0: the library's default; default: "
                "%(default)s). On a CPU shared with other jobs keep 1: idle OpenMP threads stall at random (steps "
                "10-100x slower), which ruins ratios")

# the command line of the last parse, for the run header (harness.header)
_last = {"command": None}


def last_command() -> Optional[str]:
    """``python benchmarks/SCRIPT.py ARGS`` as the parent parser last read it (None before any parse)."""
    return _last["command"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that refuses an existing ``--json`` without ``--force`` as it parses (when it was made with
    them) and keeps the command line for the run header."""

    json_flags = False

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        out = super().parse_args(argv, namespace)
        _last["command"] = " ".join(["python", f"benchmarks/{self.prog}", *map(shlex.quote, argv)])
        self.refuse_existing(out)
        return out

    def refuse_existing(self, args) -> None:
        """Stop, as the argument error it is, when ``args.json`` holds earlier results and ``--force`` is not given
        (parse_args does this; a script that fills in a default --json after parsing calls it again)."""
        path = getattr(args, "json", None)
        if self.json_flags and path and os.path.exists(path) and not getattr(args, "force", False):
            self.error(f"{path} exists: pass --force to replace it")


def parser(doc: str, *, json: Union[str, bool, None] = None, threads: Union[int, Sequence[int], None] = None,
           epilog: bool = False, **kwargs) -> Parser:
    """The parser of a benchmark script whose docstring is ``doc``: its first paragraph is the description, and with
    ``epilog`` the paragraphs after the second are printed below the flags as written.

    ``json``: add ``--json PATH`` (this help text; True: the common one) and ``--force``. ``threads``: add
    ``--threads N`` with this default (a list: several values, one run each). Other keywords go to ArgumentParser."""
    caller = sys._getframe(1).f_globals.get("__file__")
    kwargs.setdefault("prog", os.path.basename(caller) if caller else None)
    if epilog:
        kwargs.update(epilog=doc.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    p = Parser(description=doc.split("\n\n")[0], **kwargs)
    if threads is not None:
        several = not isinstance(threads, int)
        p.add_argument("--threads", type=int, default=list(threads) if several else threads,
                       nargs="+" if several else None, metavar="N",
                       help=THREADS_HELP + (". Several: one run each" if several else ""))
    if json:
        p.json_flags = True
        p.add_argument("--json", metavar="PATH", help=JSON_HELP if json is True else json)
        p.add_argument("--force", action="store_true", help=FORCE_HELP)
    return p
