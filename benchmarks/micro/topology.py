"""Benchmark of the topology package: table build time and lookup latency.

``topoplace bench topology [--lookups 20000] [--seeds 7] [--sample16 64]``; per catalog
shape and policy:

* **build**: time to answer every (free mask, size) pair from cold caches. Shapes with up to
  8 GPUs build their whole table on first use (2^n masks x n sizes, plus one bottleneck row
  per mask). 16-GPU shapes are memoized lazily per (mask, size); for them the benchmark
  answers ``--sample16`` seeded random masks x every size and reports the total and the cost
  per entry (the full 2^16 x 16 table is never built in production either).
* **lookup**: latency of a warm ``best_set`` / ``best_bottlenecks`` call over ``--lookups``
  seeded random (mask, size) queries, median and p99 in microseconds. Each call is timed
  individually with ``time.perf_counter_ns``; the timer's own overhead (median of empty
  back-to-back reads) is subtracted.

Also times a warm ``resolve_node_shape`` hit. Conditions (interpreter, CPU, numpy) go
with the figures.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.registry import Figures
from topology.select import POLICIES, best_bottlenecks, best_set, clear_caches
from topology.shape import CATALOG, GpuShape, resolve_node_shape


def _timer_overhead_ns(samples: int = 20_000) -> int:
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(samples):
        a = clock()
        b = clock()
        deltas.append(b - a)
    return int(statistics.median(deltas))


def _percentiles(samples_ns: Sequence[int], overhead: int) -> tuple[float, float]:
    values = sorted(max(s - overhead, 0) for s in samples_ns)
    median = statistics.median(values) / 1000
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))] / 1000
    return median, p99


def _time_calls(fn: Callable[[int, int], object], queries: Sequence[tuple[int, int]]) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for mask, size in queries:
        a = clock()
        fn(mask, size)
        b = clock()
        out.append(b - a)
    return out


def _build(shape: GpuShape, policy: str, sample16: int, rng: random.Random) -> tuple[float, int]:
    """Cold build; returns (seconds, entries answered)."""
    clear_caches()
    n = shape.num_gpus
    start = time.perf_counter()
    if n <= 8:
        best_set(shape, shape.full_mask(), 1, policy)  # builds every mask x size + rows
        entries = (1 << n) * n
    else:
        masks = [rng.getrandbits(n) for _ in range(sample16)]
        entries = 0
        for mask in masks:
            for size in range(1, n + 1):
                best_set(shape, mask, size, policy)
                entries += 1
            best_bottlenecks(shape, mask, policy)
    return time.perf_counter() - start, entries


def add_arguments(ap: Any) -> None:
    """``--lookups``, ``--sample16`` (the runner's ``--seeds``: the first seeds the masks,
    default 7)."""
    ap.add_argument("--lookups", type=int, default=20_000, help="warm calls timed per row")
    ap.add_argument("--sample16", type=int, default=64, help="random masks for 16-GPU shapes")


def run(args: argparse.Namespace) -> Figures:
    """One row per catalog shape and policy (build, lookups), then per 16-GPU shape the
    cold full-mask answers, then the warm ``resolve_node_shape`` hit."""
    from benchmarks.registry import parse_seeds

    seed = parse_seeds(args.seeds)[0] if args.seeds else 7
    overhead = _timer_overhead_ns()
    rows: list[tuple[Any, ...]] = []
    for name, shape in CATALOG.items():
        for policy in POLICIES:
            rng = random.Random(seed)
            seconds, entries = _build(shape, policy, args.sample16, rng)
            n = shape.num_gpus
            if n <= 8:
                masks = [rng.getrandbits(n) for _ in range(args.lookups)]
            else:  # warm entries only: reuse the sampled masks
                rng2 = random.Random(seed)
                pool = [rng2.getrandbits(n) for _ in range(args.sample16)]
                masks = [rng.choice(pool) for _ in range(args.lookups)]
            queries = [(m, rng.randint(1, n)) for m in masks]
            bs = _time_calls(lambda m, s, sh=shape, p=policy: best_set(sh, m, s, p), queries)
            bb = _time_calls(lambda m, s, sh=shape, p=policy: best_bottlenecks(sh, m, p), queries)
            bs_med, bs_p99 = _percentiles(bs, overhead)
            bb_med, bb_p99 = _percentiles(bb, overhead)
            table = "full" if n <= 8 else f"sampled ({args.sample16} masks x {n} sizes)"
            rows.append((name, policy, n, table, seconds * 1000, entries,
                         seconds * 1e6 / max(entries, 1), bs_med, bs_p99, bb_med, bb_p99))  # fmt: skip
    notes = []
    for name, shape in CATALOG.items():
        if shape.num_gpus <= 8:
            continue
        for policy in POLICIES:
            clear_caches()
            sizes = []
            for size in range(1, shape.num_gpus + 1):
                start = time.perf_counter()
                best_set(shape, shape.full_mask(), size, policy)
                sizes.append((time.perf_counter() - start, size))
            worst, worst_size = max(sizes)
            total = sum(t for t, _ in sizes)
            notes.append(
                f"{name} {policy}: all {shape.num_gpus} GPUs free, every size from cold: "
                f"{total * 1000:.0f} ms total, worst size {worst_size} = {worst * 1000:.0f} ms."
            )
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
    annotations: dict[str, str] = {}
    resolve_node_shape(labels, annotations, 8)
    samples = _time_calls(
        lambda m, s: resolve_node_shape(labels, annotations, 8), [(0, 0)] * 20_000
    )
    med, p99 = _percentiles(samples, overhead)
    notes.append(f"resolve_node_shape warm hit: median {med:.2f} us, p99 {p99:.2f} us.")
    return Figures(
        "GPU-set tables per node shape and policy: cold build, warm lookups (us)",
        (
            "shape",
            "policy",
            "GPUs",
            "table",
            "build ms",
            "entries",
            "us/entry",
            "best_set median us",
            "best_set p99 us",
            "bottlenecks median us",
            "bottlenecks p99 us",
        ),  # fmt: skip
        rows,
        {
            "seed": seed,
            "warm lookups per row": args.lookups,
            "timer overhead subtracted ns": overhead,
            "numpy": np.__version__,
            "threads": 1,
            "python": f"{platform.python_version()} ({platform.python_implementation()})",
        },  # fmt: skip
        tuple(notes),
    )
