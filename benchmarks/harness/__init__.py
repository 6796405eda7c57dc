"""The benchmarks' harness: what every script under benchmarks/ shares beyond its measurements.

It owns the parent parser (``parser``: the description from the script's docstring; ``--json PATH`` and ``--force``,
an existing --json refused before any work; ``--threads N``, one spelling and one help text); the one clock, wall
and CPU time read together (``now``, ``timed``, ``wall``); the one verdict type of a benchmark's targets and its
printer (``target``, ``verdict``, ``print_targets``); the setup record a script puts in its JSON (``record``: the
``machine``, its CPU kind and the flags that decide the kernels, the threads, the ``versions`` of python, torch and
onnxruntime) and the run header that prints it with the command line (``header``); and the threads torch runs on
(``set_threads``). The scripts import
it by name (``import harness as H``): the script's folder is on sys.path when it runs by path, and tests/conftest.py
puts it there for the tests.
"""
from .cli import Parser, parser
from .clock import now, timed, wall
from .setup_record import CPU_FLAGS, header, machine, record, set_threads, versions
from .targets import print_targets, target, verdict

__all__ = ["CPU_FLAGS", "Parser", "header", "machine", "now", "parser", "print_targets", "record", "set_threads",
           "target", "timed", "verdict", "versions", "wall"]
