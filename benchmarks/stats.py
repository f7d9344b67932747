"""Small statistics shared by the benchmarks' reports."""

from __future__ import annotations

from collections.abc import Sequence


def p99(xs: Sequence[float]) -> float:
    """The 99th percentile by rank (the value at index ``int(0.99 n)`` of the sorted
    values, the last one for fewer than 100 values)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]
