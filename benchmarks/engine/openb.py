"""Load the Alibaba "openb" GPU-cluster traces (cluster-trace-gpu-v2023) used by the FGD paper.

Files (see ``../shared/data/alibaba-gpu-v2023/README.md``):
    * ``openb_node_list_gpu_node.csv`` (``sn,cpu_milli,memory_mib,gpu,model``): 1,213 GPU nodes,
      6,212 GPUs. The FGD artifact simulates exactly these nodes.
    * ``openb_pod_list_<workload>.csv`` (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,
      gpu_spec,...``; the ``multigpu*`` files carry only the first five columns).

Conversion follows the artifact's CSV-to-pod step: ``gpu_milli`` above 1000 is clipped to 1000,
GPU fields are ignored for tasks with ``num_gpu == 0`` and ``gpu_spec`` is split on ``|``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from scheduler.core.sharing import MILLI, SharingNode, SharingTask

DEFAULT_DATA_DIR = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "alibaba-gpu-v2023"
)
"""``<repo>/../shared/data/alibaba-gpu-v2023``."""

PAPER_WORKLOADS: tuple[str, ...] = (
    "default",
    "cpu050",
    "cpu100",
    "gpushare40",
    "gpushare60",
    "gpuspec10",
    "gpuspec20",
    "multigpu20",
    "multigpu30",
)
"""The paper's workloads whose traces are shared with us."""

NODE_FILE = "openb_node_list_gpu_node.csv"


def data_dir(path: str | Path | None = None) -> Path:
    """The trace directory: ``path`` or the default shared location."""
    return Path(path) if path is not None else DEFAULT_DATA_DIR


def pod_file(workload: str, path: str | Path | None = None) -> Path:
    """Path of the pod list of ``workload`` (``"default"`` or ``"openb_pod_list_default"``)."""
    name = workload if workload.startswith("openb_pod_list_") else f"openb_pod_list_{workload}"
    return data_dir(path) / f"{name}.csv"


def load_nodes(path: str | Path | None = None, node_file: str = NODE_FILE) -> list[SharingNode]:
    """Idle nodes of the openb GPU cluster, sorted by name.

    Raises:
        FileNotFoundError: If the node list is absent.
    """
    nodes = []
    with (data_dir(path) / node_file).open(newline="") as f:
        for row in csv.DictReader(f):
            nodes.append(
                SharingNode.empty(
                    name=row["sn"],
                    gpu_model=row.get("model") or "",
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    num_gpu=int(row["gpu"]),
                )
            )
    nodes.sort(key=lambda n: n.name)
    return nodes


def task_from_row(row: dict[str, str]) -> SharingTask:
    """One pod-list row as a task (artifact conversion rules)."""
    num_gpu = int(row.get("num_gpu") or 0)
    gpu_milli = int(row.get("gpu_milli") or 0) if num_gpu else 0
    gpu_milli = min(max(gpu_milli, 0), MILLI)
    spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s) if num_gpu else ()
    return SharingTask(
        name=row["name"],
        cpu_milli=int(row["cpu_milli"]),
        memory_mib=int(row.get("memory_mib") or 0),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_spec=spec,
    )


def load_tasks(workload: str, path: str | Path | None = None) -> list[SharingTask]:
    """Tasks of ``workload`` in file order.

    Raises:
        FileNotFoundError: If the pod list is absent.
    """
    with pod_file(workload, path).open(newline="") as f:
        return [task_from_row(row) for row in csv.DictReader(f)]


def load_task_times(workload: str, path: str | Path | None = None) -> dict[str, tuple[int, int]]:
    """``name -> (creation_time, deletion_time)`` for traces that record them (else empty)."""
    out: dict[str, tuple[int, int]] = {}
    with pod_file(workload, path).open(newline="") as f:
        for row in csv.DictReader(f):
            c, d = row.get("creation_time"), row.get("deletion_time")
            if c and d:
                out[row["name"]] = (int(float(c)), int(float(d)))
    return out


def total_gpus(nodes: list[SharingNode]) -> int:
    """Number of GPUs in ``nodes``."""
    return sum(n.num_gpu for n in nodes)
