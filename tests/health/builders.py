"""Builders shared by the health tests (real-shaped Node and ResourceSlice objects)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.clusters import make_node
from scheduler.core.health import parse_time
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.health_tracker import HealthTracker

HEARTBEAT = parse_time("2026-11-29T20:00:00Z")
"""``lastHeartbeatTime`` that ``make_node`` writes on the Ready condition."""
assert HEARTBEAT is not None

UUIDS = tuple(f"GPU-4f9c0c5e-0000-4000-8000-00000000000{i}" for i in range(8))


def dgx(name: str = "n1", **kw: Any) -> dict[str, Any]:
    """A DGX H100 node (8 GPUs, GFD labels resolve the catalog shape ``dgx-h100``)."""
    kw.setdefault("machine", "DGX-H100")
    return make_node(name, 8, "h100", **kw)


def dgx1(name: str = "v1", **kw: Any) -> dict[str, Any]:
    """A DGX-1 V100 node (hybrid cube-mesh, catalog shape ``dgx1-v100``)."""
    return make_node(name, 8, "v100", machine="DGX-1", **kw)


def condition(ctype: str, status: str = "True", when: str = "2026-11-29T19:55:00Z") -> dict:
    """A node condition as NVSentinel's platform connector writes it."""
    return {
        "type": ctype,
        "status": status,
        "reason": f"{ctype}IsNotHealthy" if status == "True" else f"{ctype}IsHealthy",
        "message": "ErrorCode:79 GPU has fallen off the bus" if status == "True" else "",
        "lastHeartbeatTime": when,
        "lastTransitionTime": when,
    }


def device(
    index: int | None,
    *,
    uuid: str | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    name: str | None = None,
    beta: bool = False,
    mig_parent: int | None = None,
) -> dict[str, Any]:
    """A DRA device of NVIDIA's gpu-kubelet-plugin (v1 layout, or v1beta1 ``basic``)."""
    attrs: dict[str, Any] = {
        "type": {"string": "mig" if mig_parent is not None else "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "architecture": {"string": "Hopper"},
    }
    if index is not None:
        attrs["index"] = {"int": index}
    if uuid is not None:
        attrs["uuid"] = {"string": uuid}
    if mig_parent is not None:
        attrs["parentIndex"] = {"int": mig_parent}
    body: dict[str, Any] = {"attributes": attrs}
    if taints:
        body["taints"] = [dict(t) for t in taints]
    dev_name = name or (f"gpu-{index}" if index is not None else "gpu-x")
    if beta:
        return {"name": dev_name, "basic": body}
    return {"name": dev_name, **body}


def taint(key: str, effect: str = "NoSchedule", value: str = "", added: str | None = None) -> dict:
    """A DRA device taint (KEP-5055)."""
    t = {"key": key, "value": value, "effect": effect}
    if added:
        t["timeAdded"] = added
    return t


def resource_slice(node: str, devices: Sequence[Mapping[str, Any]], driver: str = "gpu.nvidia.com"):
    """A ResourceSlice publishing ``devices`` of ``node``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-slice"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


class Clock:
    """A settable clock (seconds) for the health tracker."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def tracked_cache(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]] = (),
    at: float = HEARTBEAT + 30,
    extra: Mapping[str, Any] | None = None,
    params: SchedParams | None = None,
) -> tuple[ClusterCache, HealthTracker, Clock]:
    """A cache over ``nodes`` and ``pods`` (as a cluster file loads them: no history yet)
    with a health tracker on a clock set to ``at``: (cache, tracker, clock)."""
    sp = params or SchedParams()
    clock = Clock(at)
    tracker = HealthTracker(sp.health, clock=clock)
    snap = ClusterCache.from_objects(nodes, pods, sp, extra=extra).snapshot()
    return ClusterCache(snap, sp, health_tracker=tracker), tracker, clock
