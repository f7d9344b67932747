"""Filter and prioritize replies serialized straight from node positions.

A reply names thousands of nodes, and building it one Python object per node costs more
than the decision itself. :class:`NameTable` keeps every snapshot node's JSON-encoded
name as a fixed-width record of bytes (``,"node-a"`` padded with spaces) in numpy arrays,
built once per node set. A reply is then a gather of records by position: C-speed work,
no per-node Python.

The padding is JSON whitespace between tokens (``["a"   ,"b"]``, ``{"a"   :"x"}``), so
every reply is valid JSON that any decoder, Go's included, reads exactly as the compact
form. The table refuses node sets whose names differ so much in length that padding
would inflate replies (see :data:`MAX_PADDING`); the caller then serializes per node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import orjson

from scheduler.core.schedule import MAX_SCORE

MAX_PADDING = 1.5
"""Refuse a table whose padded size exceeds this multiple of the compact size."""

_BYTE = {c: ord(c) for c in "[]{},:"}


class NameTable:
    """Fixed-width serialized names of one snapshot node set, by position.

    Records are numpy ``void`` items, so a gather by position is one ``take`` over
    contiguous memory.

    Args:
        names: node names in snapshot order.

    Raises:
        ValueError: the names' lengths vary too much for fixed-width records.
    """

    def __init__(self, names: Sequence[str]) -> None:
        encoded = [orjson.dumps(n) for n in names]
        width = 1 + max(map(len, encoded), default=2)
        compact = sum(map(len, encoded)) + len(encoded)
        if len(encoded) * width > MAX_PADDING * compact + 4096:
            raise ValueError("node names too uneven in length for fixed-width records")
        self.width = width
        self.names = _records(b"," + e for e in encoded)
        """Item i: ``,"<name i>"`` then spaces."""
        # Score s right-aligned in two characters: " 7" is valid JSON (leading whitespace).
        tails = [f',"Score":{s:>2}}}'.encode() for s in range(MAX_SCORE + 1)]
        self.hosts = _records(b',{"Host":' + e.ljust(width - 1) + t for t in tails for e in encoded)
        """Item s n + i: ``,{"Host":"<name i>"   ,"Score": s}`` (n nodes). Score-major, so
        the nodes of one score are read in order from one block."""

    def array(self, pos: np.ndarray) -> bytes:
        """JSON array of the names at ``pos``."""
        return _enclose(self.names, pos, b"[]")

    def entries(self, pos: np.ndarray, value: bytes) -> bytes:
        """Object members ``,"<name>":<value>`` for the names at ``pos``, each with a
        leading comma (the caller drops the first)."""
        suffix = b":" + value
        rows = np.empty(len(pos), dtype=[("name", self.names.dtype), ("value", f"V{len(suffix)}")])
        rows["name"] = self.names.take(pos)
        rows["value"] = np.void(suffix)
        return rows.tobytes()

    def host_priorities(self, pos: np.ndarray, scores: np.ndarray) -> bytes:
        """``HostPriorityList`` JSON: ``{"Host": name, "Score": score}`` per position."""
        return _enclose(self.hosts, scores * len(self.names) + pos, b"[]")

    def filter_result(
        self, feasible: np.ndarray, failures: Iterable[tuple[bool, str, np.ndarray]]
    ) -> bytes:
        """``ExtenderFilterResult`` JSON with ``NodeNames`` (every field present).

        Args:
            feasible: positions of the nodes that pass.
            failures: (unresolvable, reason, positions) per group of failing nodes.
        """
        failed: list[bytes] = []
        unres: list[bytes] = []
        for never, reason, at in failures:
            (unres if never else failed).append(self.entries(at, orjson.dumps(reason)))
        return b"".join(
            (
                b'{"Nodes":null,"NodeNames":',
                self.array(feasible),
                b',"FailedNodes":',
                _object(failed),
                b',"FailedAndUnresolvableNodes":',
                _object(unres),
                b',"Error":""}',
            )
        )


def _records(items: Iterable[bytes]) -> np.ndarray:
    """Byte strings as one array of fixed-width ``void`` items, right-padded with spaces."""
    items = list(items)
    width = max(map(len, items), default=1)
    return np.frombuffer(b"".join(i.ljust(width) for i in items), dtype=f"V{width}")


def _enclose(table: np.ndarray, pos: np.ndarray, brackets: bytes) -> bytes:
    """Items of ``table`` at ``pos`` (each led by a comma) as one bracketed JSON value:
    the first item's comma becomes the opening bracket."""
    if not len(pos):
        return brackets
    width = table.dtype.itemsize
    out = np.empty(len(pos) * width + 1, dtype=np.uint8)
    np.take(table, pos, out=out[:-1].view(table.dtype))
    out[0] = brackets[0]
    out[-1] = brackets[1]
    return out.tobytes()


def _object(members: list[bytes]) -> bytes:
    """A JSON object from comma-led member runs."""
    if not members:
        return b"{}"
    return b"{" + b"".join(members)[1:] + b"}"
