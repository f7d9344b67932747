"""Benchmark of the topology package: table build time and lookup latency.

Run::

    python -m benchmarks.topology_bench [--lookups 20000] [--seed 7] [--sample16 64]

Prints, per catalog shape and policy:

* **build**: time to answer every (free mask, size) pair from cold caches. Shapes with up to
  8 GPUs build their whole table on first use (2^n masks x n sizes, plus one bottleneck row
  per mask). 16-GPU shapes are memoized lazily per (mask, size); for them the benchmark
  answers ``--sample16`` seeded random masks x every size and reports the total and the cost
  per entry (the full 2^16 x 16 table is never built in production either).
* **lookup**: latency of a warm ``best_set`` / ``best_bottlenecks`` call over ``--lookups``
  seeded random (mask, size) queries, median and p99 in microseconds. Each call is timed
  individually with ``time.perf_counter_ns``; the timer's own overhead (median of empty
  back-to-back reads) is subtracted.

Also times a warm ``resolve_node_shape`` hit. Conditions (interpreter, CPU, numpy) are
printed first so figures can be compared.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lookups", type=int, default=20_000, help="warm calls timed per row")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sample16", type=int, default=64, help="random masks for 16-GPU shapes")
    args = parser.parse_args(argv)

    overhead = _timer_overhead_ns()
    print("conditions:")
    print(f"  python {platform.python_version()} ({platform.python_implementation()}),")
    print(f"  {platform.platform()}, {os.cpu_count()} CPUs, {platform.processor() or 'cpu?'}")
    print(f"  numpy {np.__version__}; seed {args.seed}; {args.lookups} warm lookups per row;")
    print(f"  timer overhead {overhead} ns subtracted; single thread; caches cleared per build")
    print()
    header = (
        f"{'shape':<22} {'policy':<19} {'GPUs':>4} {'build':>10} {'entries':>8} "
        f"{'us/entry':>9} {'best_set med/p99 us':>20} {'bottlenecks med/p99 us':>23}"
    )
    print(header)
    print("-" * len(header))
    for name, shape in CATALOG.items():
        for policy in POLICIES:
            rng = random.Random(args.seed)
            seconds, entries = _build(shape, policy, args.sample16, rng)
            n = shape.num_gpus
            if n <= 8:
                masks = [rng.getrandbits(n) for _ in range(args.lookups)]
            else:  # warm entries only: reuse the sampled masks
                rng2 = random.Random(args.seed)
                pool = [rng2.getrandbits(n) for _ in range(args.sample16)]
                masks = [rng.choice(pool) for _ in range(args.lookups)]
            queries = [(m, rng.randint(1, n)) for m in masks]
            bs = _time_calls(lambda m, s, sh=shape, p=policy: best_set(sh, m, s, p), queries)
            bb = _time_calls(lambda m, s, sh=shape, p=policy: best_bottlenecks(sh, m, p), queries)
            bs_med, bs_p99 = _percentiles(bs, overhead)
            bb_med, bb_p99 = _percentiles(bb, overhead)
            build = f"{seconds * 1000:.1f} ms"
            label = "sampled" if n > 8 else "full"
            print(
                f"{name:<22} {policy:<19} {n:>4} {build:>10} {entries:>8} "
                f"{seconds * 1e6 / max(entries, 1):>9.1f} "
                f"{f'{bs_med:.2f} / {bs_p99:.2f}':>20} {f'{bb_med:.2f} / {bb_p99:.2f}':>23}"
                + ("" if label == "full" else f"  ({args.sample16} masks x {n} sizes)")
            )
    print()
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
            print(
                f"{name} {policy}: all {shape.num_gpus} GPUs free, every size from cold: "
                f"{total * 1000:.0f} ms total, worst size {worst_size} = {worst * 1000:.0f} ms"
            )
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
    annotations: dict[str, str] = {}
    resolve_node_shape(labels, annotations, 8)
    samples = _time_calls(
        lambda m, s: resolve_node_shape(labels, annotations, 8), [(0, 0)] * 20_000
    )
    med, p99 = _percentiles(samples, overhead)
    print()
    print(f"resolve_node_shape warm hit: median {med:.2f} us, p99 {p99:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
