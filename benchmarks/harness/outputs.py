"""The benchmarks' outputs: the table a script prints (after a note when other processes compete for the cores), its
rows as JSON, and the one writer of every record, table and JSON a benchmark leaves (``write_json``,
``write_text``): written whole or not at all (``acl_runtime.io.atomic``), a reader or a run stopped halfway never
leaves half."""
import os
from typing import Dict, List, Optional, Sequence

from acl_runtime.io import atomic


def write_text(path: str, text: str) -> None:
    """``text`` into ``path`` whole or not at all, its folder made."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic.write_text(path, text)


def write_json(path: str, obj, indent: Optional[int] = 1, sort_keys: bool = False) -> None:
    """``obj`` as JSON (and a newline) into ``path`` whole or not at all, its folder made."""
    import json

    write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def load_note() -> str:
    """A warning line when other processes compete for the cores (then read the CPU-time columns)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cores = os.cpu_count() or 1
    if load < 0.75 * cores:
        return ""
    return (f"# note: load average {load:.1f} on {cores} cores: wall-clock columns are noisy; keep "
            "--threads 1 and read the CPU-time columns")


def print_table(rows: List[Dict], columns: Sequence[str], formats: Dict[str, str]) -> None:
    cells = [[("-" if r.get(c) is None else formats.get(c, "{}").format(r[c])) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def print_noted_table(rows: List[Dict], columns: Sequence[str], formats: Dict[str, str]) -> None:
    """The table, after the load note when other processes compete for the cores."""
    note = load_note()
    if note:
        print(note)
    print_table(rows, columns, formats)


def report(rows: List[Dict], columns: Sequence[str], formats: Dict[str, str], json_path: Optional[str]) -> None:
    """The benchmarks' common ending: the optional note, the table, and the rows as JSON (written atomically), each
    row naming the CPU kind it was measured on."""
    from acl_torch.machine import read_cpu_kind

    kind = read_cpu_kind().describe()
    print(f"# cpu: {kind}")
    print_noted_table(rows, columns, formats)
    if json_path:
        write_json(json_path, [{**r, "cpu_kind": r.get("cpu_kind", kind)} for r in rows])
