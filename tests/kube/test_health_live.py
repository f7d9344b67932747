"""Health signals that kube-scheduler cannot read, through the real kube-scheduler.

kube-scheduler alone honours Ready (through the not-ready taint), cordons and the
allocatable count. A node whose GPU health monitor reports a fatal XID condition, that
NVSentinel has quarantined, or whose kubelet stopped posting status while it still looks
Ready is, to kube-scheduler, a node like any other. These tests publish those signals on
real Node objects and check where the real kube-scheduler, with topoplace as its
extender, binds pods. The same signals are replayed at scale, with faults, by
``python -m benchmarks.live.faults``.
"""

from __future__ import annotations

import datetime
from typing import Any

from tests.kube.conftest import Topoplace, make_gpu_node
from tests.kube.test_live import bound, clean, gpu_pod, wait_for  # noqa: F401 (clean: autouse)

NVSENTINEL_STATE = "dgxc.nvidia.com/nvsentinel-state"


def _stamp(ago_s: float = 0.0) -> str:
    t = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=ago_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _ready(heartbeat_ago_s: float = 0.0) -> dict[str, str]:
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "topoplace integration test node",
        "lastHeartbeatTime": _stamp(heartbeat_ago_s),
        "lastTransitionTime": _stamp(3600),
    }


def xid_condition() -> dict[str, str]:
    """NVSentinel's fatal XID condition, as its platform connector writes it, from now."""
    return {
        "type": "GpuXidError",
        "status": "True",
        "reason": "GpuXidErrorIsNotHealthy",
        "message": "ErrorCode:79 GPU has fallen off the bus",
        "lastHeartbeatTime": _stamp(),
        "lastTransitionTime": _stamp(),
    }


def fail_node(core: Any, node: str) -> None:
    """``node`` Ready, with NVSentinel's fatal XID condition (a GPU fell off the bus)."""
    core.patch_node_status(node, {"status": {"conditions": [_ready(), xid_condition()]}})


def _health(tp: Topoplace) -> dict[str, str]:
    return {n["name"]: n["health"] for n in tp.get("/v1/inspect/nodes")["nodes"]}


def test_signals_kube_scheduler_cannot_read_keep_pods_away(
    core: Any,
    namespace: str,
    topoplace: Topoplace,
    gpu_nodes: list[str],
    scheduler_name: str,
    run_id: str,
) -> None:
    # Nodes of its own, deleted after: topoplace remembers a failure for a while (a node
    # that recovered is degraded until it settles), and the suite's nodes must stay healthy.
    label = f"{run_id}-health"
    nodes = [f"tp-it-{run_id}-health-{i}" for i in range(4)]
    for n in nodes:
        make_gpu_node(core, n, label)
    xid, quarantined, stalled, good = nodes
    try:
        fail_node(core, xid)
        core.patch_node(quarantined, {"metadata": {"labels": {NVSENTINEL_STATE: "quarantined"}}})
        core.patch_node_status(stalled, {"status": {"conditions": [_ready(heartbeat_ago_s=1500)]}})
        want = {xid: "unhealthy", quarantined: "unhealthy", stalled: "degraded", good: "healthy"}
        seen: dict[str, str] = {}

        def graded() -> bool:
            seen.update({n: h for n, h in _health(topoplace).items() if n in want})
            return seen == want

        try:
            wait_for(graded, 30, "topoplace to grade the nodes")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: want {want}, topoplace says {seen}") from None
        # To kube-scheduler all four nodes are Ready, uncordoned and have 8 free GPUs.
        small = [f"small-{i}" for i in range(4)]
        for name in small:
            core.create_namespaced_pod(namespace, gpu_pod(name, 1, scheduler_name, label))
            wait_for(lambda name=name: bound(core, namespace, [name]), 30, f"{name} bound")
        got = bound(core, namespace, small)
        assert {p.spec.node_name for p in got.values()} == {good}, {
            n: p.spec.node_name for n, p in got.items()
        }
        # Eight GPUs fit nowhere healthy now: the degraded node is usable, the others are not.
        core.create_namespaced_pod(namespace, gpu_pod("big", 8, scheduler_name, label))
        big = wait_for(lambda: bound(core, namespace, ["big"]), 30, "big bound")
        assert big["big"].spec.node_name == stalled
        # A second whole-node pod has no node: the two unhealthy ones stay refused.
        core.create_namespaced_pod(namespace, gpu_pod("big-2", 8, scheduler_name, label))

        def refused() -> Any:
            p = core.read_namespaced_pod("big-2", namespace)
            c = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
            return c is not None and c.status == "False" and c

        cond = wait_for(refused, 30, "big-2 refused")
        assert not core.read_namespaced_pod("big-2", namespace).spec.node_name
        assert "0/" in (cond.message or "")
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        for n in nodes:
            core.delete_node(n)
        wait_for(lambda: not set(nodes) & set(_health(topoplace)), 30, "the nodes gone")
