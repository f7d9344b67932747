"""Seeded synthetic GPU-sharing clusters and workloads, and openb-format trace directories
(for tests that must not depend on ``../shared/data``)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scheduler.core.sharing import SharingNode, SharingTask


def synthetic_cluster() -> list[SharingNode]:
    """12 nodes of 1/2/4/8 GPUs, models T4 / V100M16 / G2."""
    nodes = []
    for i in range(12):
        g = (1, 2, 4, 8)[i % 4]
        model = ("T4", "V100M16", "G2")[i % 3]
        nodes.append(SharingNode.empty(f"n{i:02d}", model, 16_000 * g, 65_536 * g, g))
    return nodes


def synthetic_tasks(n: int = 120) -> list[SharingTask]:
    """CPU-only, GPU-sharing, one-GPU (some with a model constraint) and multi-GPU tasks."""
    rng = np.random.default_rng(11)
    tasks = []
    for i in range(n):
        kind = rng.choice(["cpu", "share", "one", "multi"], p=[0.15, 0.45, 0.3, 0.1])
        cpu = int(rng.choice([1000, 2000, 4000, 8000]))
        mem = int(rng.choice([1024, 4096, 16384]))
        if kind == "cpu":
            tasks.append(SharingTask(f"t{i:03d}", cpu, mem))
        elif kind == "share":
            milli = int(rng.choice([100, 250, 300, 500, 700]))
            tasks.append(SharingTask(f"t{i:03d}", cpu, mem, 1, milli))
        elif kind == "one":
            spec = ("V100M16", "G2") if rng.random() < 0.2 else ()
            tasks.append(SharingTask(f"t{i:03d}", cpu, mem, 1, 1000, spec))
        else:
            tasks.append(SharingTask(f"t{i:03d}", cpu, mem, int(rng.choice([2, 4])), 1000))
    return tasks


def write_openb(
    data: Path, nodes: Sequence[SharingNode], tasks: Sequence[SharingTask], workload: str
) -> Path:
    """``nodes`` and ``tasks`` as an openb-format trace directory (returns ``data``)."""
    data.mkdir(parents=True, exist_ok=True)
    with (data / "openb_node_list_gpu_node.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for n in nodes:
            w.writerow(
                [n.name, n.cpu_milli_capacity, n.memory_mib_capacity, n.num_gpu, n.gpu_model]
            )
    with (data / f"openb_pod_list_{workload}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        for t in tasks:
            w.writerow(
                [t.name, t.cpu_milli, t.memory_mib, t.num_gpu, t.gpu_milli, "|".join(t.gpu_spec)]
            )
    return data


def tiny_openb(root: Path) -> Path:
    """A tiny openb-format trace directory ``<root>/openb-tiny``: 12 nodes, workload ``tiny``
    of 120 tasks (synthetic, seeded)."""
    nodes = [
        SharingNode.empty(
            f"node-{i:02d}",
            ("T4", "V100M16", "G2")[i % 3],
            16_000 * g,
            65_536 * g,
            g,
        )
        for i, g in ((i, (1, 2, 4, 8)[i % 4]) for i in range(12))
    ]
    rng = np.random.default_rng(11)
    tasks = []
    for i in range(120):
        kind = rng.choice(["cpu", "share", "one", "multi"], p=[0.15, 0.45, 0.3, 0.1])
        cpu, mem = int(rng.choice([1000, 2000, 4000])), int(rng.choice([1024, 4096]))
        gpus, milli = {"cpu": (0, 0), "share": (1, int(rng.choice([250, 500]))),
                       "one": (1, 1000), "multi": (int(rng.choice([2, 4])), 1000)}[kind]  # fmt: skip
        spec = ("V100M16", "G2") if kind == "one" and rng.random() < 0.2 else ()
        tasks.append(SharingTask(f"pod-{i:03d}", cpu, mem, gpus, milli, spec))
    return write_openb(root / "openb-tiny", nodes, tasks, "tiny")
