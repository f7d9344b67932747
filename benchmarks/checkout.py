"""``--source DIR``: run an in-process benchmark against another checkout's ``scheduler``
(e.g. an export of an earlier revision, for a before / after comparison on one machine).

The benchmark must import ``scheduler`` only after :func:`import_scheduler`, inside its
functions, not at module level.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_source_option(ap: argparse.ArgumentParser) -> None:
    """The ``--source`` option."""
    ap.add_argument("--source", default=None, help="import scheduler from this checkout")


def import_scheduler(source: str | None) -> Path:
    """Import ``scheduler`` from ``source`` (put first on ``sys.path``) when given, else as
    installed; the directory it was imported from, for the benchmark's conditions line."""
    if source:
        sys.path.insert(0, str(Path(source).resolve()))
    import scheduler

    return Path(scheduler.__file__).resolve().parent.parent
