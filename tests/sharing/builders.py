"""Real-shaped GPU-sharing objects: HAMi-registered nodes, HAMi / gpushare / KAI pods.

The HAMi register is what HAMi's device plugin writes (``MarshalNodeDevices``: a JSON list,
Go ``omitempty``, so index 0 and false values are left out); pods carry their requests as
container limits, exactly as users write them for HAMi and gpushare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from benchmarks.clusters import make_node
from scheduler.core.fractional import HAMI_REGISTER

T4_MIB = 15360
A100_MIB = 40960


def register(
    node: str,
    gpus: int,
    memory_mib: int = T4_MIB,
    gpu_type: str = "NVIDIA-Tesla T4",
    split: int = 10,
    unhealthy: Sequence[int] = (),
) -> str:
    """A ``hami.io/node-nvidia-register`` value as HAMi writes it (JSON, omitempty)."""
    devs = []
    for i in range(gpus):
        d: dict[str, Any] = {
            "id": f"GPU-{node}-{i:02d}",
            "count": split,
            "devmem": memory_mib,
            "devcore": 100,
            "type": gpu_type,
            "mode": "hami-core",
        }
        if i:
            d["index"] = i  # omitempty: index 0 is left out
        if i >= gpus // 2:
            d["numa"] = 1
        if i not in unhealthy:
            d["health"] = True
        devs.append(d)
    return orjson.dumps(devs).decode()


def hami_node(
    name: str,
    gpus: int = 4,
    memory_mib: int = T4_MIB,
    product: str = "t4",
    split: int = 10,
    unhealthy: Sequence[int] = (),
    **kw: Any,
) -> dict[str, Any]:
    """A GPU node running HAMi's device plugin: ``nvidia.com/gpu`` advertised as
    ``gpus * split`` replicas, and the register annotation."""
    ann = dict(kw.pop("annotations", None) or {})
    ann[HAMI_REGISTER] = register(name, gpus, memory_mib, split=split, unhealthy=unhealthy)
    node = make_node(name, gpus, product, annotations=ann, **kw)
    node["status"]["capacity"]["nvidia.com/gpu"] = str(gpus * split)
    node["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus * split)
    return node


def gpushare_node(name: str, gpus: int = 2, gib_per_gpu: int = 16, **kw: Any) -> dict[str, Any]:
    """A node running gpushare's device plugin (``aliyun.com/gpu-mem`` in GiB)."""
    node = make_node(name, gpus, "t4", **kw)
    for k in ("capacity", "allocatable"):
        node["status"][k]["aliyun.com/gpu-mem"] = str(gpus * gib_per_gpu)
        node["status"][k]["aliyun.com/gpu-count"] = str(gpus)
    return node


def share_pod(
    name: str,
    mem: int | str | None = 4000,
    cores: int | str | None = 30,
    count: int | str | None = 1,
    *,
    percent: int | str | None = None,
    namespace: str = "infer",
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
    cpu: str = "2",
    containers: int = 1,
    scheduler_name: str = "topoplace",
) -> dict[str, Any]:
    """A HAMi fractional pod: ``nvidia.com/gpu`` + ``gpumem`` (MiB) / ``gpumem-percentage``
    / ``gpucores`` as container limits (the first container; others ask for nothing)."""
    limits: dict[str, Any] = {}
    if count is not None:
        limits["nvidia.com/gpu"] = str(count) if isinstance(count, int) else count
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem) if isinstance(mem, int) else mem
    if percent is not None:
        limits["nvidia.com/gpumem-percentage"] = str(percent)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores) if isinstance(cores, int) else cores
    ctrs = [
        {
            "name": "server",
            "image": "vllm/vllm-openai:v0.6.3",
            "resources": {"requests": {"cpu": cpu, "memory": "8Gi"}, "limits": limits},
        }
    ]
    for i in range(1, containers):
        ctrs.append(
            {
                "name": f"sidecar-{i}",
                "image": "busybox:1.36",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }
        )
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": {"schedulerName": scheduler_name, "containers": ctrs},
        "status": {"phase": "Pending"},
    }
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"
    return pod


def hami_bound(
    name: str, gpu: int, mem: int, node: str = "infer-a", priority: int = 0, cores: int = 30
) -> dict[str, Any]:
    """A HAMi pod bound on ``node`` with ``mem`` MiB of its GPU ``gpu``, as HAMi's scheduler
    records it (``vgpu-devices-allocated``, ``bind-phase: success``), at ``priority``."""
    p = share_pod(
        name,
        mem=mem,
        cores=cores,
        node=node,
        annotations={
            "hami.io/vgpu-devices-allocated": f"GPU-{node}-{gpu:02d},NVIDIA,{mem},{cores}:;",
            "hami.io/bind-phase": "success",
        },
    )
    p["spec"]["priority"] = priority
    return p


def aliyun_pod(name: str, gib: int | str = 4, node: str | None = None, **kw: Any) -> dict[str, Any]:
    """A gpushare pod: ``aliyun.com/gpu-mem`` units (GiB) as a container limit."""
    pod = share_pod(name, None, None, None, node=node, **kw)
    pod["spec"]["containers"][0]["resources"]["limits"] = {
        "aliyun.com/gpu-mem": str(gib) if isinstance(gib, int) else gib
    }
    return pod


class RecordingBinder:
    """Records every Binding: (pod name, node, annotations) (stands in for the API server)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str]]] = []

    def bind(self, pod: Any, node: str, annotations: Any) -> str:
        self.calls.append((pod["metadata"]["name"], node, dict(annotations)))
        return ""
