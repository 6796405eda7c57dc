"""The benchmarks' harness: what every script under benchmarks/ shares beyond its measurements.

- the parent parser (``parser``): the description from the script's docstring; ``--json PATH`` and ``--force``, an
  existing --json refused before any work; ``--threads N``; each with one spelling and one help text;
- the setup record a script puts in its JSON (``record``: the ``machine``, its CPU kind and the flags that decide
  the kernels, the threads, the ``versions`` of python, torch and onnxruntime) and the run header that prints it
  with the command line (``header``); the threads torch runs on (``set_threads``);
- the one clock, wall and CPU time read together (``now``, ``timed``, ``wall``);
- the one verdict type of a benchmark's targets and its printer (``target``, ``verdict``, ``print_targets``);
- the outputs: the table a script prints, after a note when other processes compete for the cores, and its rows
  as JSON written whole or not at all (``print_table``, ``print_noted_table``, ``report``).

The scripts import it by name (``import harness as H``): the script's folder is on sys.path when it runs by path,
and tests/conftest.py puts it there for the tests. What builds fairseq models for a benchmark stays in common.py.
"""
from .cli import Parser, parser
from .clock import now, timed, wall
from .outputs import load_note, print_noted_table, print_table, report
from .setup_record import CPU_FLAGS, header, machine, record, set_threads, versions
from .targets import print_targets, target, verdict

__all__ = ["CPU_FLAGS", "Parser", "header", "load_note", "machine", "now", "parser", "print_noted_table", "print_table",
           "print_targets", "record", "report", "set_threads", "target", "timed", "verdict", "versions", "wall"]
