"""Keyword builders for real-shaped test clusters (kube ``st.MakePod()`` style).

Nodes come from :func:`benchmarks.clusters.make_node` (GFD labels, NVLink clique label,
Topograph fabric labels, Ready conditions, capacity/allocatable); these builders add what
tests need on top:

* ``used=[...]``: GPU indices already held on the node. They are carried by a marker
  annotation and turned into a bound filler pod (with a placement record) by
  :func:`cluster` / :func:`snapshot_of`, exactly as a running pod would hold them.
* ``degraded=True``: an NVSentinel ``GpuThermalWatch`` condition (node usable, with risk).
* rack and scalable-unit helpers: :func:`nvl72_rack` (18 x 4-GPU GB200 trays labelled
  ``nvidia.com/gpu.clique: <rackUUID>.<n>``), :func:`dgx_su` (32 DGX H100 per leaf).
* :func:`gang_pod`: a pending gang member with the annotations users write.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks.clusters import make_node as _make_node
from benchmarks.clusters import make_pod
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import ClusterSnapshot, build_snapshot

USED_MARKER = "test.topoplace.io/used-gpus"

__all__ = [
    "USED_MARKER",
    "cluster",
    "dgx_su",
    "gang_pod",
    "make_node",
    "make_pod",
    "nvl72_rack",
    "rack_uuid",
    "snapshot_of",
]


def rack_uuid(rack: str) -> str:
    """A stable ClusterUUID for a rack name."""
    return str(uuid.UUID(hashlib.sha1(f"rack/{rack}".encode()).hexdigest()[:32]))


def make_node(
    name: str,
    gpus: int = 8,
    product: str = "h100",
    *,
    clique: str | None = None,
    leaf: str | None = None,
    spine: str | None = None,
    used: Sequence[int] = (),
    degraded: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    """A real-shaped GPU Node; ``used`` GPUs are held by a filler pod (see module doc)."""
    conditions = list(kw.pop("conditions", ()))
    if degraded:
        conditions.append(
            {
                "type": "GpuThermalWatch",
                "status": "True",
                "reason": "GpuThermalWatchIsNotHealthy",
                "message": "GPU temperature above slowdown threshold",
            }
        )
    node = _make_node(
        name, gpus, product, clique=clique, leaf=leaf, spine=spine, conditions=conditions, **kw
    )
    if used:
        node["metadata"]["annotations"][USED_MARKER] = ",".join(str(g) for g in sorted(used))
    return node


def nvl72_rack(
    rack: str,
    *,
    trays: int = 18,
    leaf: str | None = None,
    spine: str | None = "spine-0",
    clique_id: int = 1,
    used: Mapping[int, Sequence[int]] | None = None,
    degraded: Iterable[int] = (),
    **kw: Any,
) -> list[dict[str, Any]]:
    """One GB200 NVL72 rack: ``trays`` 4-GPU trays named ``<rack>-t<nn>`` in one clique."""
    uid = rack_uuid(rack)
    bad = set(degraded)
    return [
        make_node(
            f"{rack}-t{t:02d}",
            4,
            "gb200",
            clique=f"{uid}.{clique_id}",
            leaf=leaf or f"leaf-{rack}",
            spine=spine,
            machine="GB200-NVL72",
            cpu="144",
            memory="884Gi",
            used=(used or {}).get(t, ()),
            degraded=t in bad,
            **kw,
        )
        for t in range(trays)
    ]


def dgx_su(
    su: str,
    *,
    nodes: int = 32,
    leaf: str | None = None,
    spine: str | None = "spine-0",
    used: Mapping[int, Sequence[int]] | None = None,
    degraded: Iterable[int] = (),
    **kw: Any,
) -> list[dict[str, Any]]:
    """A DGX H100 scalable unit: ``nodes`` 8-GPU nodes ``<su>-n<nn>`` on one leaf."""
    bad = set(degraded)
    return [
        make_node(
            f"{su}-n{i:02d}",
            8,
            "h100",
            leaf=leaf or f"leaf-{su}",
            spine=spine,
            machine="DGX-H100",
            used=(used or {}).get(i, ()),
            degraded=i in bad,
            **kw,
        )
        for i in range(nodes)
    ]


def _fillers(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    pods = []
    for n in nodes:
        raw = (n.get("metadata", {}).get("annotations") or {}).get(USED_MARKER)
        if not raw:
            continue
        gpus = [int(x) for x in raw.split(",") if x.strip()]
        name = n["metadata"]["name"]
        pods.append(
            make_pod(
                f"used-{name}",
                len(gpus),
                namespace="busy",
                node=name,
                gpu_indices=gpus,
                cpu="1",
                memory="1Gi",
            )
        )
    return pods


def cluster(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(nodes, pods) with a bound filler pod for every node's ``used`` GPUs."""
    nodes = [dict(n) for n in nodes]
    return nodes, _fillers(nodes) + [dict(p) for p in pods]


def snapshot_of(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    params: SchedParams | None = None,
    extra: Mapping[str, Any] | None = None,
) -> ClusterSnapshot:
    """A snapshot of the nodes (with their ``used`` GPUs held) and pods."""
    n, p = cluster(nodes, pods)
    return build_snapshot(n, p, params or SchedParams(), extra)


def gang_pod(
    name: str,
    gpus: int,
    gang: str,
    size: int | None = None,
    *,
    namespace: str = "default",
    required: str | None = None,
    preferred: str | None = None,
    role: str | None = None,
    key: str = "topoplace",
    cpu: str = "8",
    memory: str = "64Gi",
    node: str | None = None,
    gpu_indices: Sequence[int] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A gang member as users write it.

    ``key`` picks the membership convention: ``topoplace`` (``topoplace.io/gang`` +
    ``gang-size``), ``coscheduling`` (label ``scheduling.x-k8s.io/pod-group``), ``volcano``
    (annotation ``scheduling.k8s.io/group-name``), ``kai`` (label ``pod-group-name``),
    ``kubernetes`` (``spec.schedulingGroup.podGroupName``, Kubernetes' own PodGroup, 1.36) or
    ``grove`` (label ``grove.io/podgang``).
    """
    ann = dict(annotations or {})
    lab = dict(labels or {})
    in_spec = key == "kubernetes"
    if in_spec:
        pass
    elif key == "grove":
        lab["grove.io/podgang"] = gang
    elif key == "topoplace":
        ann["topoplace.io/gang"] = gang
    elif key == "coscheduling":
        lab["scheduling.x-k8s.io/pod-group"] = gang
    elif key == "volcano":
        ann["scheduling.k8s.io/group-name"] = gang
    elif key == "kai":
        lab["pod-group-name"] = gang
    else:
        raise ValueError(f"unknown gang key convention {key!r}")
    if size:
        ann["topoplace.io/gang-size"] = str(size)
    if required:
        ann["topoplace.io/topology-required"] = required
    if preferred:
        ann["topoplace.io/topology-preferred"] = preferred
    if role:
        ann["topoplace.io/role"] = role
    pod = make_pod(
        name,
        gpus,
        namespace=namespace,
        annotations=ann,
        labels=lab,
        cpu=cpu,
        memory=memory,
        node=node,
        gpu_indices=gpu_indices,
    )
    if in_spec:
        pod["spec"]["schedulingGroup"] = {"podGroupName": gang}
    return pod
