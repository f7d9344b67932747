"""Fake GPU nodes: Node objects as a kubelet and a GPU stack would register them, for a
plane without kubelets.

Three ways a node shows its GPUs, as real clusters do:

* ``device-plugin``: ``nvidia.com/gpu`` capacity (NVIDIA's device plugin), GFD labels;
* ``hami``: HAMi's device plugin: ``nvidia.com/gpu`` counts split replicas and the node
  carries ``hami.io/node-nvidia-register`` (one entry per physical GPU);
* ``dra``: no ``nvidia.com/gpu`` at all; the GPUs are ResourceSlice devices
  (:mod:`benchmarks.cluster.dra` publishes them).

Topology labels (``nvidia.com/gpu.clique``, ``network.topology.nvidia.com/leaf|spine``)
are set where asked. The objects come from :func:`benchmarks.clusters.make_node` (the
builder the demo cluster and the tests use), without a ``uid`` (the API server gives one)
and with heartbeat and transition times of ``now``.

Nobody heartbeats and no node lifecycle controller runs on this plane, so the nodes stay
Ready; the ``not-ready`` taint the TaintNodesByCondition admission plugin adds at creation
is lifted by :meth:`benchmarks.live.kubeapi.Api.create_ready_node`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from benchmarks.clusters import PRODUCTS, hami_register, make_node

Sharing = Literal["device-plugin", "hami", "dra"]
SHARINGS: tuple[str, ...] = ("device-plugin", "hami", "dra")
MANAGED_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "topoplace-cluster"


def now_rfc3339() -> str:
    """The current UTC time as Kubernetes writes it (seconds, ``Z``)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_node(
    name: str,
    *,
    gpus: int = 8,
    product: str = "h100",
    sharing: Sharing = "device-plugin",
    hami_split: int = 10,
    clique: str | None = None,
    leaf: str | None = None,
    spine: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    now: str | None = None,
) -> dict[str, Any]:
    """One Node object, Ready, untainted, ready to POST.

    Args:
        name: node name.
        gpus: physical GPUs.
        product: a key of :data:`benchmarks.clusters.PRODUCTS` or a GFD product string.
        sharing: how the GPUs are advertised (see the module docstring).
        hami_split: HAMi's ``deviceSplitCount`` (replicas per GPU) for ``hami``.
        clique / leaf / spine: NVLink clique and fabric labels.
        labels / annotations: added last (they win).
        now: heartbeat and transition time (default: the current time).

    Raises:
        ValueError: an unknown ``sharing`` or a negative count.
    """
    if sharing not in SHARINGS:
        raise ValueError(f"sharing {sharing!r} is not one of {', '.join(SHARINGS)}")
    if gpus < 0 or hami_split < 1:
        raise ValueError("gpus must be >= 0 and hami_split >= 1")
    node = make_node(
        name,
        gpus,
        product,
        clique=clique,
        leaf=leaf,
        spine=spine,
        zone=None,
        labels={MANAGED_LABEL: MANAGED_BY, **(labels or {})},
        annotations=annotations,
    )
    del node["metadata"]["uid"]
    when = now or now_rfc3339()
    for cond in node["status"]["conditions"]:
        cond["lastHeartbeatTime"] = cond["lastTransitionTime"] = when
        cond["message"] = "fake node: no kubelet"
    status = node["status"]
    for part in ("capacity", "allocatable"):
        status[part]["ephemeral-storage"] = "1Ti"
        if sharing == "dra":
            del status[part]["nvidia.com/gpu"]
        elif sharing == "hami":
            status[part]["nvidia.com/gpu"] = str(gpus * hami_split)
    if sharing == "hami":
        prod, mem, _ = PRODUCTS.get(product, (product, 81920, ""))
        node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = hami_register(
            name, gpus, mem, prod, split=hami_split
        )
    status["addresses"] = [{"type": "Hostname", "address": name}]
    status["nodeInfo"] = {
        "architecture": node["metadata"]["labels"]["kubernetes.io/arch"],
        "operatingSystem": "linux",
        "kubeletVersion": "fake",
        "containerRuntimeVersion": "fake://0",
        "kernelVersion": "",
        "osImage": "fake",
        "machineID": "",
        "systemUUID": "",
        "bootID": "",
        "kubeProxyVersion": "",
    }
    return node


def fabric(i: int, nodes_per_leaf: int = 2, leaves_per_spine: int = 2) -> dict[str, str]:
    """Leaf and spine of the ``i``-th node of a regular fabric (``leaf-<k>``, ``spine-<k>``)."""
    leaf = i // max(1, nodes_per_leaf)
    return {"leaf": f"leaf-{leaf}", "spine": f"spine-{leaf // max(1, leaves_per_spine)}"}


def gpu_nodes(
    count: int,
    *,
    prefix: str = "gpu-node-",
    nodes_per_leaf: int = 2,
    leaves_per_spine: int = 2,
    **kw: Any,
) -> list[dict[str, Any]]:
    """``count`` nodes ``<prefix>0..`` on a regular leaf/spine fabric; ``kw`` as
    :func:`gpu_node` (the same for all)."""
    return [
        gpu_node(f"{prefix}{i}", **{**fabric(i, nodes_per_leaf, leaves_per_spine), **kw})
        for i in range(count)
    ]


def create_nodes(api: Any, nodes: Iterable[Mapping[str, Any]], workers: int = 8) -> list[str]:
    """Create (or refresh) ``nodes`` through ``api`` (a :class:`benchmarks.live.kubeapi.Api`),
    Ready and without the not-ready taint; their names."""
    objs = [dict(n) for n in nodes]
    api.create_nodes(objs, workers=workers)
    return [n["metadata"]["name"] for n in objs]
