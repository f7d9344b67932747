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
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from benchmarks.clusters import PRODUCTS, hami_register, make_node

log = logging.getLogger(__name__)

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


STRATEGIC_MERGE = "application/strategic-merge-patch+json"


def heartbeat_patch(now: str) -> dict[str, Any]:
    """The status patch a kubelet's periodic node status update amounts to here: the
    ``Ready`` condition's ``lastHeartbeatTime`` moved to ``now``, its status, reason and
    transition time untouched (a strategic merge patch merges conditions by ``type``)."""
    return {"status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": now}]}}


class Heartbeat:
    """A kubelet's node status heartbeat for ``names``, every ``interval`` seconds, in a
    daemon thread (:meth:`start` / :meth:`stop`; also a context manager).

    Nothing heartbeats on this plane, so a fake node's ``lastHeartbeatTime`` ages from its
    creation, and topoplace grades a Ready node whose heartbeat is older than
    ``heartbeat_stale_seconds`` (360 s) as degraded, as it should for a real node whose
    kubelet stopped posting status (kubelets post at least every 5 minutes). Nodes that
    must look alive for longer need this. Only the heartbeat time is written: a condition a
    test set (Ready False, say) stays as it is. A node that is gone is skipped.
    """

    def __init__(self, api: Any, names: Iterable[str], interval: float = 60.0) -> None:
        self.api = api
        self.names = list(names)
        self.interval = interval
        self.beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """One heartbeat for every node now."""
        body = heartbeat_patch(now_rfc3339())
        for n in self.names:
            self.api.call(
                "PATCH", f"/api/v1/nodes/{n}/status", body, content_type=STRATEGIC_MERGE, ok=(404,)
            )
        self.beats += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except Exception as exc:  # the next tick tries again
                log.warning("node heartbeat failed: %s", exc)

    def start(self) -> Heartbeat:
        """Start the thread (the first beat after ``interval``)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="node-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
