"""Replica nodes on the one ledger (property test, through the extender's filter and bind).

Random sequences of replica pods (opted in by nodeSelector, node affinity or
``nvidia.com/gpu.shared``), whole-GPU pods that did not opt in, gang members and deletions,
on a cluster of time-slicing, MPS and exclusive nodes. After every step: no replica node
holds more replicas than it has, its counter equals the sum over the pods on it, no pod
holds a GPU index on a replica node, and no pod that did not opt in (or a gang member) sits
on a replica node. Adversarial binds straight to a replica node (bind without filter) must
be refused the same way. A rebuild from the bound pods alone (a restart) gives the same
counters.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.clusters import make_node, make_pod, replica_node
from scheduler.core.objects import gang_of
from scheduler.core.params import SchedParams
from scheduler.core.replicas import opts_in
from scheduler.core.snapshot import build_snapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender

PARAMS = SchedParams()
NAMES = ["dgx-0", "mps-0", "ts-0", "ts-1"]


class RecordingBinder:
    """Stands in for the API server: records the node and annotations of every Binding."""

    def __init__(self) -> None:
        self.bound: dict[str, dict[str, Any]] = {}

    def bind(self, pod: Any, node: str, annotations: Any) -> str:
        obj = copy.deepcopy(dict(pod))
        obj["spec"]["nodeName"] = node
        obj["metadata"]["annotations"] = {**obj["metadata"]["annotations"], **annotations}
        obj["status"] = {"phase": "Running"}
        self.bound[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj
        return ""


def _nodes() -> list[dict[str, Any]]:
    return [
        make_node("dgx-0", 4, "h100"),
        replica_node("mps-0", 2, "h100", replicas=3, strategy="mps"),
        replica_node("ts-0", 2, "a100", replicas=4),
        replica_node("ts-1", 3, "t4", replicas=5, renamed=True),
    ]


def _pod(i: int, kind: str, n: int) -> dict[str, Any]:
    name = f"p{i}"
    if kind == "selector":
        return make_pod(name, n, node_selector={"nvidia.com/gpu.sharing-strategy": "time-slicing"})
    if kind == "product":
        return make_pod(
            name, n, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"}
        )
    if kind == "affinity":
        pod = make_pod(name, n)
        expr = {"key": "nvidia.com/gpu.replicas", "operator": "In", "values": ["3", "4", "5"]}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [expr]}]
                }
            }
        }
        return pod
    if kind == "shared":
        pod = make_pod(name, 0)
        pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu.shared": str(n)}
        return pod
    if kind == "gang":
        return make_pod(
            name,
            n,
            gang=f"g{i}",
            gang_size=1,
            node_selector={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
        )
    return make_pod(name, n)  # whole GPUs, no opt-in


def _check(ext: Extender) -> None:
    snap = ext.cache.snapshot()
    for node in snap.nodes:
        pods = [p for p in snap.pods.values() if p.node == node.name]
        if node.replicas:
            held = sum(p.replicas for p in pods)
            assert held == node.replicas_used <= node.replica_capacity
            assert all(not p.gpus for p in pods)
            for p in pods:
                assert opts_in(p.raw), f"{p.key} on {node.name} without opt-in"
                assert not p.gang and not gang_of(p.raw)[0], f"gang member {p.key} on {node.name}"
        else:
            assert all(p.replicas == 0 for p in pods)


STEP = st.tuples(
    st.sampled_from(["filter", "filter", "filter", "bind", "delete"]),
    st.sampled_from(["selector", "product", "affinity", "shared", "gang", "whole", "whole"]),
    st.integers(1, 7),
    st.sampled_from(NAMES),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, min_size=1, max_size=30))
def test_replicas_never_overcommitted_and_never_given_without_opt_in(steps) -> None:
    binder = RecordingBinder()
    ext = Extender(ClusterCache.from_objects(_nodes(), [], PARAMS), binder)
    for i, (op, kind, n, target) in enumerate(steps):
        if op == "delete":
            if binder.bound:
                key = sorted(binder.bound)[i % len(binder.bound)]
                del binder.bound[key]
                ext.cache.delete_pod(key)
            _check(ext)
            continue
        pod = _pod(i, kind, n)
        m = pod["metadata"]
        if op == "filter":
            r = orjson.loads(ext.filter_json({"Pod": pod, "NodeNames": NAMES}))
            assert len(r["NodeNames"] or []) <= 1  # decide_in_filter: the choice alone
            node = (r["NodeNames"] or [None])[0]
        else:  # bind straight to a node kube-scheduler never got from filter
            ext.cache.remember_pending(pod)
            node = target
        if node is not None:
            b = ext.bind(
                {
                    "PodName": m["name"],
                    "PodNamespace": m["namespace"],
                    "PodUID": m["uid"],
                    "Node": node,
                }
            )
            if op == "filter":
                assert b == {"Error": ""}
            if b == {"Error": ""}:
                ext.cache.upsert_pod(binder.bound[f"{m['namespace']}/{m['name']}"])
        _check(ext)
    # A restart: the ledger rebuilt from the bound pods alone.
    again = build_snapshot(_nodes(), list(binder.bound.values()), PARAMS)
    live = ext.cache.snapshot()
    for node in again.nodes:
        assert node.replicas_used == live.node(node.name).replicas_used
        assert node.used_mask == live.node(node.name).used_mask
