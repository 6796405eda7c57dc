"""The flags the load benchmarks share (serve_load.py, serve_deadlines.py), each with one spelling and one help text:
the server they start, the early-exit policy it serves, the model and sentences, the client's bounds, the answers'
tolerance, and the outputs (a smoke run's ``--json`` kept out of benchmarks/results, ``--plot`` beside the JSON)."""
import os

import _glue_runs
from _serving import add_model_flags, check_model_flags
from acl_runtime import console, exits

from . import server


def add(p) -> None:
    """The shared flags, onto the script's parser (harness.parser, with --json)."""
    p.add_argument("--toy", action="store_true", help="serve_speed.py's toy model (tests); needs its own --json")
    p.add_argument("--server", default=server.tool("acl-serve"), help="the acl-serve executable (default: %(default)s)")
    p.add_argument("--policy", default="entropy", choices=list(exits.POLICIES), help="early-exit policy")
    p.add_argument("--threshold", type=float, help="its threshold (default: the policy table's, 0.3 for entropy)")
    p.add_argument("--max-batch", type=int, default=32, help="the server's --max-batch (serve_load: and the "
                   "reference engine's batch)")
    p.add_argument("--max-queue", type=int, default=512, help="the server's --max-queue (rows; default %(default)s)")
    p.add_argument("--drain-seconds", type=float, default=30.0, help="answers later than this are lost")
    p.add_argument("--atol", type=float, default=1e-5, help="probabilities equal to acl-predict's within this")
    p.add_argument("--seed", type=int, default=1, help="the arrivals, the sentence order (serve_load: the batch-1 "
                   "subset)")
    p.add_argument("--examples", type=int, default=0, help="first N dev sentences (0: all; serve_load --quick: 128)")
    p.add_argument("--ready-seconds", type=float, default=120.0, help="start-up bound of the server")
    p.add_argument("--stop-seconds", type=float, default=30.0, help="SIGTERM bound of the server")
    add_model_flags(p)
    p.add_argument("--export", action="store_true", help="export the model again (fp32 and int8) even if "
                   "neither the checkpoint nor the exporter's code has changed")
    p.add_argument("--plot", help="default: the --json path with .png")


def check(p, args, stem: str, smoke: bool, smoke_flags: str) -> None:
    """After parsing: the policy's threshold filled in and range-checked; a smoke run (``smoke``: ``smoke_flags``
    given) needs a --json outside benchmarks/results, else it defaults to benchmarks/results/STEM.json; --plot
    beside it; an existing --json refused without --force; the model flags and the server checked."""
    console.check_request_flags(p, args, fill_default=True)
    results = os.path.abspath(os.path.join(_glue_runs.REPO, "benchmarks", "results"))
    if smoke and (not args.json or os.path.abspath(args.json).startswith(results + os.sep)):
        p.error(f"{smoke_flags} need their own --json outside benchmarks/results: a smoke run's numbers must not "
                "replace the real ones")
    args.json = args.json or os.path.join(results, f"{stem}.json")
    args.plot = args.plot or os.path.splitext(args.json)[0] + ".png"
    p.refuse_existing(args)
    check_model_flags(p, args)
    if not os.path.exists(args.server):
        p.error(f"--server {args.server}: not found; install acl-serve (pip install -e .[serve]) or name it")
