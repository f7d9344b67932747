"""Shared helpers for the topology tests: data paths and a literal go-gpuallocator oracle.

The oracle re-states NVIDIA/go-gpuallocator's BestEffortPolicy (gpuallocator/besteffort_policy.go
@ 876e7b7609bb839919e4eb06ce00607db76e907e) the slow, obvious way: enumerate every padded
partition in Go's order and scan with Go's comparisons. topology.select computes the same answer
with a memoized recursion; the tests compare the two on every mask of the 8-GPU shapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations
from pathlib import Path

import pytest

from topology.links import allocator_pair_weight
from topology.shape import GpuShape

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO.parent / "shared" / "data" / "topologies"


def topology_file(name: str) -> Path:
    """Path of a real matrix in ../shared/data/topologies, skipping the test if absent."""
    path = TOPOLOGIES / name
    if not path.is_file():
        pytest.skip(f"shared topology data not present: {path}")
    return path


def bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def mask_of(gpus: Sequence[int]) -> int:
    out = 0
    for g in gpus:
        out |= 1 << g
    return out


Pad = None  # Go's nil placeholder device


def _go_partitions(devices: list[int | None], size: int) -> Iterator[list[list[int | None]]]:
    """Go's iterateGPUPartitions: first device + lexicographic combinations of the rest."""
    if size <= 0 or size > len(devices):
        return
    if size == 1:
        for d in devices:
            yield [[d]]
        return
    padded = devices + [Pad] * (-len(devices) % size)
    padding = padded.count(Pad)

    def walk(devs: list[int | None], accum: list[list[int | None]]) -> Iterator[list[list]]:
        if len(devs) == size:
            yield [*accum, devs]
            return
        for combo in combinations(range(1, len(devs)), size - 1):
            chosen = [devs[0]] + [devs[i] for i in combo]
            p = chosen.count(Pad)
            if p not in (0, padding):
                continue
            # Go removes every device "contained" in the set; nil equals nil, so a set holding
            # padding removes all of it (it always holds all of it).
            remaining = [d for d in devs if d not in chosen]
            yield from walk(remaining, [*accum, chosen])

    yield from walk(padded, [])


def go_best_effort(
    shape: GpuShape, available: Sequence[int], required: Sequence[int], size: int
) -> list[int | None]:
    """BestEffortPolicy.Allocate, literally. Returns Go's slice (may contain None = nil)."""
    if size <= 0 or len(available) < size or len(required) > size:
        return []
    if len(required) > len(available):
        return []

    def pair(a: int | None, b: int | None) -> int:
        if a is None or b is None or a == b:
            return 0
        return allocator_pair_weight(shape.nvlinks[a][b], shape.pcie[a][b])

    def set_score(s: Sequence[int | None]) -> int:
        return sum(pair(a, b) for a, b in combinations(s, 2))

    def holds_all(s: Sequence[int | None]) -> bool:
        return all(r in s for r in required)

    best: list[list[int | None]] | None = None
    best_score = 0
    for candidate in _go_partitions(sorted(available), size):
        if not any(holds_all(s) and Pad not in s for s in candidate):
            continue
        score = sum(set_score(s) for s in candidate)
        if score > best_score or best is None:
            best, best_score = candidate, score
    if best is None:
        return []
    filtered = [s for s in best if holds_all(s)]
    if not filtered:
        return []
    chosen = filtered[0]
    for s in filtered[1:]:
        if set_score(s) > set_score(chosen):
            chosen = s
    return chosen
