"""The recipe tables (recipes/glue/*.tsv): tab-separated, '#' comment lines, blank lines ignored, a header line.

The one reader of them (the recipes' shell scripts read none: the run plan decides). Errors name the file and line.
"""
from typing import Dict, List, Optional, Sequence


def read_tsv(path: str, columns: Optional[Sequence[str]] = None) -> List[Dict[str, str]]:
    """The data rows of a table as dicts keyed by its header. ``columns``: the header it must have."""
    header, rows = None, []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split("\t")
            if header is None:
                header = fields
                if columns is not None and header != list(columns):
                    raise ValueError(f"{path}:{lineno}: the header must be {list(columns)} (tab-separated), "
                                     f"got {header}")
                continue
            if len(fields) != len(header):
                raise ValueError(f"{path}:{lineno}: {len(fields)} fields, the header has {len(header)}: "
                                 "separate the fields with tabs")
            rows.append(dict(zip(header, fields)))
    if header is None:
        raise ValueError(f"{path}: no header line")
    return rows

