"""Reference outputs of the pre-engine command lines (``golden-cli/``) and how outputs are
compared: CSVs with their measured columns dropped, the rest byte for byte."""

from __future__ import annotations

import csv
import io
from pathlib import Path

GOLDEN_CLI = Path(__file__).resolve().parent / "golden-cli"
"""``results.csv`` of each scenario's command line on a tiny configuration (measured columns
dropped), made by the pre-engine loops at 16f44c8."""


def csv_without(path: Path, column: str | None) -> str:
    """The CSV with one column dropped, re-serialised (the rest byte for byte)."""
    rows = list(csv.reader(path.open(newline="")))
    keep = [i for i, name in enumerate(rows[0]) if name != column]
    buf = io.StringIO()
    csv.writer(buf).writerows([[r[i] for i in keep] for r in rows])
    return buf.getvalue()
