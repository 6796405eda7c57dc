"""The benchmarks' harness: what every script under benchmarks/ shares beyond its measurements.

It owns the parent parser (``parser``: the description from the script's docstring; ``--json PATH`` and ``--force``,
an existing --json refused before any work; ``--threads N``, one spelling and one help text); the one clock, wall
and CPU time read together (``now``, ``timed``, ``wall``); the one verdict type of a benchmark's targets and its
printer (``target``, ``verdict``, ``print_targets``); and the machine part of every setup record (``machine``: the
CPU kind and the flags that decide the kernels) and the threads torch runs on (``set_threads``). The scripts import
it by name (``import harness as H``): the script's folder is on sys.path when it runs by path, and tests/conftest.py
puts it there for the tests.
"""
from .cli import Parser, parser
from .clock import now, timed, wall
from .setup_record import CPU_FLAGS, machine, set_threads
from .targets import print_targets, target, verdict

__all__ = ["CPU_FLAGS", "Parser", "machine", "now", "parser", "print_targets", "set_threads", "target", "timed",
           "verdict", "wall"]
