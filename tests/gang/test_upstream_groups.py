"""Gangs declared through Kubernetes' own PodGroup (``scheduling.k8s.io/v1alpha2``, 1.36:
the pod's ``spec.schedulingGroup``) and Grove's PodGang (``scheduler.grove.io/v1alpha1``:
label ``grove.io/podgang``): membership, declared size and topology, in the core and
through the extender's filter. The objects follow the shapes of k8s.io/api v0.36.2
(``scheduling/v1alpha2/types.go``) and Grove's published scheduler API reference."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.gang import (
    declared_size,
    group_topology,
    podgroup_min_member,
    podgroup_topology,
)
from scheduler.core.model import RESERVATION_PREFIX, TopologyConstraint
from scheduler.core.objects import gang_of, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender
from tests.builders import cluster, dgx_su, gang_pod, make_node, snapshot_of

P = SchedParams()
FABRIC = P.fabric


def k8s_podgroup(
    name: str, min_count: int | None, topology_key: str = "", namespace: str = "default"
) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1alpha2`` PodGroup as the API server returns it."""
    policy: dict[str, Any] = (
        {"basic": {}} if min_count is None else {"gang": {"minCount": min_count}}
    )
    spec: dict[str, Any] = {"schedulingPolicy": policy}
    if topology_key:
        spec["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec,
        "status": {},
    }


def grove_podgang(
    name: str, groups: dict[str, int], required: str = "", preferred: str = ""
) -> dict[str, Any]:
    """A Grove PodGang: one PodGroup per PodClique with its ``minReplicas``."""
    spec: dict[str, Any] = {
        "podgroups": [
            {
                "name": f"{name}-{clique}",
                "podReferences": [
                    {"namespace": "default", "name": f"{name}-{clique}-{i}"} for i in range(n)
                ],
                "minReplicas": n,
            }
            for clique, n in groups.items()
        ]
    }
    pack = {k: v for k, v in (("required", required), ("preferred", preferred)) if v}
    if pack:
        spec["topologyConstraint"] = {"packConstraint": pack}
    return {
        "apiVersion": "scheduler.grove.io/v1alpha1",
        "kind": "PodGang",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("key", "expect"),
    [("kubernetes", "team/train"), ("grove", "team/train")],
    ids=["spec.schedulingGroup", "grove.io/podgang label"],
)
def test_membership(key: str, expect: str) -> None:
    pod = gang_pod("w-0", 8, "train", namespace="team", key=key)
    assert request_from_pod(pod, FABRIC).gang == expect
    assert gang_of(pod)[0] == expect


def test_topoplace_annotation_wins_over_the_pod_group_field() -> None:
    pod = gang_pod("w-0", 8, "mine", key="topoplace")
    pod["spec"]["schedulingGroup"] = {"podGroupName": "theirs"}
    assert gang_of(pod)[0] == "default/mine"


def test_malformed_scheduling_group_is_no_gang() -> None:
    pod = gang_pod("w-0", 8, "x", key="kubernetes")
    pod["spec"]["schedulingGroup"] = ["not", "an", "object"]
    assert gang_of(pod) == ("", 0)
    pod["spec"]["schedulingGroup"] = {"podGroupName": 7}
    assert request_from_pod(pod, FABRIC).gang == ""


@pytest.mark.parametrize(
    ("obj", "size"),
    [
        (k8s_podgroup("g", 4), 4),
        (k8s_podgroup("g", None), 0),  # basic policy: no gang
        (grove_podgang("g", {"prefill": 2, "decode": 3}), 5),
        (grove_podgang("g", {"prefill": 0}), 0),
        ({"spec": {"podgroups": [{"name": "a"}]}}, 0),  # minReplicas missing: no size
        ({"spec": {"schedulingPolicy": {"gang": {"minCount": "many"}}}}, 0),
        ({"spec": {"schedulingPolicy": {"gang": {"minCount": 2**31}}}}, 0),
    ],
    ids=["gang minCount", "basic", "grove sum", "grove zero", "grove missing", "text", "int32+1"],
)
def test_declared_sizes(obj: dict[str, Any], size: int) -> None:
    assert podgroup_min_member(obj) == size


def test_declared_size_and_topology_from_the_snapshot() -> None:
    pod = gang_pod("w-0", 8, "train", key="kubernetes")
    groups = {"default/train": k8s_podgroup("train", 6, "network.topology.nvidia.com/leaf")}
    snap = snapshot_of([make_node("n0")], extra={"podgroups": groups})
    req = request_from_pod(pod, FABRIC)
    assert declared_size(req, snap) == 6
    assert group_topology(req, snap, FABRIC) == TopologyConstraint(required="leaf")
    # Grove: required and preferred keys; a key naming no fabric level is ignored.
    gang = grove_podgang("train", {"w": 2}, required="nvidia.com/gpu.clique", preferred="bogus")
    assert podgroup_topology(gang) == ("nvidia.com/gpu.clique", "bogus")
    snap = snapshot_of([make_node("n0")], extra={"podgroups": {"default/train": gang}})
    assert group_topology(req, snap, FABRIC) == TopologyConstraint(required="nvlink-domain")
    assert group_topology(req, snapshot_of([make_node("n0")]), FABRIC) is None


def _ext(nodes: list[dict[str, Any]], extra: dict[str, Any]) -> tuple[Extender, list[str]]:
    n, p = cluster(nodes, [])
    cache = ClusterCache.from_objects(n, p, P, extra=extra)
    return Extender(cache, gangs=GangRuntime()), [x["metadata"]["name"] for x in n]


def _reserved_nodes(ext: Extender) -> list[str]:
    pods = ext.cache.snapshot().pods
    return sorted(p.node for k, p in pods.items() if k.startswith(RESERVATION_PREFIX))


def test_grove_podgang_sizes_the_plan_through_filter() -> None:
    extra = {"podgroups": {"default/svc": grove_podgang("svc", {"prefill": 1, "decode": 2})}}
    ext, names = _ext(dgx_su("su-a", nodes=4), extra)
    r = ext.filter({"Pod": gang_pod("svc-prefill-0", 8, "svc", key="grove"), "NodeNames": names})
    assert len(r["NodeNames"]) == 1
    assert len(_reserved_nodes(ext)) == 3  # the whole gang is planned at its first member


def test_kubernetes_podgroup_topology_keeps_the_gang_on_one_node() -> None:
    # Two DGX H100 nodes with 4 GPUs free each plus two empty nodes elsewhere: 4 members of 2
    # GPUs must share one node (topology key kubernetes.io/hostname), so the plan takes one
    # node's 8 GPUs, not the two half-free nodes the packing score would otherwise prefer.
    nodes = dgx_su("su-a", nodes=2, used={0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}) + dgx_su(
        "su-b", nodes=2
    )
    extra = {"podgroups": {"default/tp": k8s_podgroup("tp", 4, "kubernetes.io/hostname")}}
    ext, names = _ext(nodes, extra)
    pod = gang_pod("tp-0", 2, "tp", key="kubernetes")
    assert len(ext.filter({"Pod": pod, "NodeNames": names})["NodeNames"]) == 1
    reserved = _reserved_nodes(ext)
    assert len(reserved) == 4 and len(set(reserved)) == 1, reserved
    # Without the PodGroup's constraint the same gang is free to split.
    extra_free = {"podgroups": {"default/tp": k8s_podgroup("tp", 4)}}
    ext2, _ = _ext(nodes, extra_free)
    ext2.filter({"Pod": pod, "NodeNames": names})
    assert sorted(set(_reserved_nodes(ext2))) == ["su-a-n00", "su-a-n01"]
