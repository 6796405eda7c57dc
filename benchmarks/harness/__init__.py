"""The benchmarks' harness: what every script under benchmarks/ shares beyond its measurements.

- the parent parser (``parser``): the description from the script's docstring; ``--json PATH`` and ``--force``, an
  existing --json refused before any work; ``--threads N``; each with one spelling and one help text;
- the setup record a script puts in its JSON (``record``: the ``machine``, its CPU kind and the flags that decide
  the kernels, the threads, the ``versions`` of python, torch and onnxruntime) and the run header that prints it
  with the command line (``header``); the threads torch runs on (``set_threads``);
- the one clock, wall and CPU time read together (``now``, ``since``, ``timed``, ``wall``; ``thread_now`` for one
  thread's CPU), and the one round scheduler of the interleaved measurements (``rounds``: rotate or shuffle);
- the one verdict type of a benchmark's targets and its printer (``target``, ``verdict``, ``print_targets``);
- the outputs: the table a script prints, after a note when other processes compete for the cores, and its rows
  as JSON written whole or not at all (``print_table``, ``print_noted_table``, ``report``), and the one writer of
  every record, table and JSON (``write_json``, ``write_text``);
- the one study pipeline of the training studies (``study``): the grid of cells x seeds in a declared order
  (``grid``), each run through the script's run function and skipped when its record exists, every result collected
  from the records (``Study``), the per-cell summary over seeds and the paired differences (``summarize_cells``,
  ``paired_cells``), and the JSON, markdown and PNG written whole (``write_outputs``, ``save_figure``).

The scripts import it by name (``import harness``): the script's folder is on sys.path when it runs by path,
and tests/conftest.py puts it there for the tests. What builds fairseq models for a benchmark stays in common.py.
"""
from .cli import Parser, parser
from .clock import now, rounds, since, thread_now, timed, wall
from .outputs import load_note, print_noted_table, print_table, report, write_json, write_text
from .setup_record import CPU_FLAGS, header, machine, record, set_threads, versions
from .study import Study, grid, paired, paired_cells, save_figure, summarize_cells, write_outputs
from .targets import print_targets, target, verdict

__all__ = ["CPU_FLAGS", "Parser", "Study", "grid", "header", "load_note", "machine", "now", "paired", "paired_cells",
           "parser", "print_noted_table", "print_table", "print_targets", "record", "report", "rounds", "save_figure",
           "set_threads", "since", "summarize_cells", "target", "thread_now", "timed", "verdict", "versions", "wall",
           "write_json", "write_outputs", "write_text"]
