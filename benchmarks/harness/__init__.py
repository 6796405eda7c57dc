"""The benchmarks' harness: what every script under benchmarks/ shares beyond its measurements, each piece in one
home (docs/benchmarks.md, "How they measure"): the parent parser (``cli``), the setup record and run header
(``setup_record``), the one clock and round scheduler (``clock``; ``thread_now`` for one thread's CPU), the one
verdict type (``targets``), the printed table and the one writer of every record, table and JSON (``outputs``), and
the training studies' pipeline (``study``). The scripts import it by name (``import harness``); what builds fairseq
models stays in common.py.
"""
from .cli import Parser, parser
from .clock import now, rounds, since, thread_now, timed, wall
from .outputs import load_note, print_noted_table, print_table, report, write_json, write_text
from .setup_record import CPU_FLAGS, header, machine, record, set_threads, versions
from .study import Study, grid, paired, paired_cells, pyplot, save_figure, summarize_cells, write_outputs
from .targets import print_targets, target, verdict

__all__ = ["CPU_FLAGS", "Parser", "Study", "grid", "header", "load_note", "machine", "now", "paired", "paired_cells",
           "parser", "print_noted_table", "print_table", "print_targets", "pyplot", "record", "report", "rounds",
           "save_figure", "set_threads", "since", "summarize_cells", "target", "thread_now", "timed", "verdict",
           "versions", "wall", "write_json", "write_outputs", "write_text"]
