"""Time-slicing / MPS replica nodes: recognised from GFD labels, counted per node on the one
ledger, placed only for pods that opt in, rebuilt from bound pods on restart."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import orjson
import pytest

from benchmarks.clusters import make_node, make_pod, replica_node
from scheduler.core.objects import node_from_object, replica_request, request_from_pod
from scheduler.core.params import SchedParams, SharingParams
from scheduler.core.replicas import (
    MAX_NODE_REPLICAS,
    REASON_NOT_REPLICA_NODE,
    REASON_REPLICA_LINK,
    REASON_REPLICAS_NEVER,
    REASON_REPLICAS_NOW,
    opts_in,
)
from scheduler.core.schedule import (
    REASON_NODE_SELECTOR,
    REASON_REPLICA_NODE,
    filter_nodes,
    place_pod,
)
from scheduler.core.snapshot import (
    BLOCKED_SHARED,
    DoubleBookingError,
    build_snapshot,
    pod_info_for,
    with_node_object,
    with_pod,
    without_pod,
)
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.sharing.builders import RecordingBinder

PARAMS = SchedParams()
TS = {"nvidia.com/gpu.sharing-strategy": "time-slicing"}
MPS = {"nvidia.com/gpu.sharing-strategy": "mps"}
NAMES = ["dgx-0", "mps-0", "ts-0", "ts-1"]


def replica_pod(name: str, n: int = 1, *, selector: dict[str, str] | None = None, **kw: Any):
    """A pod asking ``n`` of ``nvidia.com/gpu`` that opts in by nodeSelector."""
    return make_pod(name, n, node_selector=TS if selector is None else selector, **kw)


def _node(obj: dict[str, Any]):
    return node_from_object(obj, PARAMS.fabric, PARAMS.health)


# ---- the node model ------------------------------------------------------------------------


def test_time_slicing_node_from_gfd_labels() -> None:
    n = _node(replica_node("ts-0", 8, "h100", replicas=10))
    assert (n.replicas, n.replica_gpus, n.replica_capacity) == (10, 8, 80)
    assert n.replica_strategy == "time-slicing" and not n.unmodeled
    # No GPUs in the whole-GPU model: the kubelet picks the device.
    assert (n.gpu_capacity, n.used_mask, n.shape_source) == (0, 0, "replicas")


def test_mps_node_renamed_resource_and_unhealthy_replicas() -> None:
    n = _node(replica_node("mps-0", 4, "a100", 4, "mps", renamed=True, allocatable_replicas=12))
    assert (n.replicas, n.replica_gpus, n.replica_capacity, n.replica_strategy) == (4, 4, 12, "mps")


def test_more_than_62_replicas_is_modelled_now() -> None:
    # 8 x 10 = 80 nvidia.com/gpu was "unmodeled" before: more than 62 GPUs.
    obj = replica_node("ts-0", 8, replicas=10)
    assert obj["status"]["capacity"]["nvidia.com/gpu"] == "80"
    assert not _node(obj).unmodeled


def test_exclusive_gfd_nodes_are_not_replica_nodes() -> None:
    n = _node(make_node("dgx-0", 8, "h100"))  # sharing-strategy=none, no replicas label
    assert n.replicas == 0 and n.gpu_capacity == 8
    one = replica_node("ts-1", 4, replicas=1)  # one replica per GPU: exclusive GPUs
    one["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    n = _node(one)
    assert n.replicas == 0 and n.gpu_capacity == 4


def test_old_gfd_without_strategy_label() -> None:
    obj = replica_node("ts-0", 2, replicas=4)
    del obj["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"]
    n = _node(obj)
    assert (n.replicas, n.replica_capacity, n.replica_strategy) == (4, 8, "")
    del obj["metadata"]["labels"]["nvidia.com/gpu.count"]
    assert _node(obj).replica_gpus == 2  # advertised replicas / replicas per GPU


@pytest.mark.parametrize(
    ("labels", "capacity"),
    [
        ({"nvidia.com/gpu.replicas": "1e400"}, None),
        ({"nvidia.com/gpu.replicas": "10.5"}, None),
        ({"nvidia.com/gpu.replicas": "-3"}, None),
        ({"nvidia.com/gpu.replicas": "9" * 70}, None),
        ({"nvidia.com/gpu.replicas": "100000"}, None),
        ({"nvidia.com/gpu.sharing-strategy": "sometimes"}, None),
        ({"nvidia.com/gpu.sharing-strategy": "none"}, None),  # none with 10 replicas
        ({"nvidia.com/gpu.count": "NaN"}, None),
        ({"nvidia.com/gpu.count": "63"}, None),
        ({}, "81"),  # more replicas than count x replicas
        ({}, "1e18"),
    ],
)
def test_hostile_replica_labels_are_refused_never_a_crash(labels, capacity) -> None:
    obj = replica_node("ts-0", 8, replicas=10)
    obj["metadata"]["labels"].update(labels)
    if capacity is not None:
        obj["status"]["capacity"]["nvidia.com/gpu"] = capacity
    n = _node(obj)
    assert n.unmodeled and n.gpu_capacity == 0 and n.replicas == 0
    # The rest of the cluster is served; GPU pods are refused there with a reason.
    snap = build_snapshot([obj, make_node("dgx-0", 8)], [], PARAMS)
    out = filter_nodes(snap, request_from_pod(make_pod("p", 1), PARAMS.fabric), None, PARAMS)
    assert out.feasible == ("dgx-0",) and "ts-0" in out.unresolvable


def test_strategy_without_replicas_label_is_refused() -> None:
    obj = replica_node("ts-0", 8, replicas=10)
    del obj["metadata"]["labels"]["nvidia.com/gpu.replicas"]
    assert "without nvidia.com/gpu.replicas" in _node(obj).unmodeled


# ---- opt-in --------------------------------------------------------------------------------


def test_opt_in_forms() -> None:
    assert opts_in(replica_pod("a"))
    assert opts_in(replica_pod("a", selector={"nvidia.com/gpu.sharing-strategy": "mps"}))
    assert opts_in(replica_pod("a", selector={"nvidia.com/gpu.replicas": "10"}))
    assert opts_in(
        replica_pod("a", selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"})
    )
    plain = make_pod("b", 1)
    assert not opts_in(plain)
    assert not opts_in(make_pod("b", 1, node_selector={"nvidia.com/gpu.sharing-strategy": "none"}))
    assert not opts_in(make_pod("b", 1, node_selector={"nvidia.com/gpu.replicas": "1"}))
    shared = copy.deepcopy(plain)
    res = shared["spec"]["containers"][0]["resources"]
    res["limits"] = {"nvidia.com/gpu.shared": "2"}
    del res["requests"]["nvidia.com/gpu"]
    assert opts_in(shared) and replica_request(shared) == 2
    aff = copy.deepcopy(plain)
    term = {
        "matchExpressions": [
            {
                "key": "nvidia.com/gpu.sharing-strategy",
                "operator": "In",
                "values": ["time-slicing", "mps"],
            }
        ]
    }
    aff["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    assert opts_in(aff)
    # A second term that also admits exclusive nodes: the pod did not opt in.
    terms = aff["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    terms["nodeSelectorTerms"].append(
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "Exists"}]}
    )
    assert not opts_in(aff)
    for junk in (None, 5, {"spec": 5}, {"spec": {"nodeSelector": [1], "affinity": "x"}}):
        assert not opts_in(junk)  # type: ignore[arg-type]


# ---- ledger --------------------------------------------------------------------------------


def _cluster(pods: list[dict[str, Any]] = ()) -> Any:  # type: ignore[assignment]
    nodes = [
        make_node("dgx-0", 8, "h100"),
        replica_node("ts-0", 2, "a100", replicas=4),
        replica_node("ts-1", 4, "a100", replicas=4),
        replica_node("mps-0", 2, "h100", replicas=2, strategy="mps"),
    ]
    return build_snapshot(nodes, list(pods), PARAMS)


def test_ledger_counts_replicas_and_never_overcommits() -> None:
    snap = _cluster()
    p = pod_info_for(snap, replica_pod("a", 9), "ts-0")
    assert p.replicas == 9 and p.gpus == ()
    with pytest.raises(DoubleBookingError, match="overcommitted"):
        with_pod(snap, p)  # 2 GPUs x 4 replicas = 8
    p = pod_info_for(snap, replica_pod("a", 6), "ts-0")
    snap = with_pod(snap, p)
    assert snap.node("ts-0").replicas_used == 6 and snap.node("ts-0").replicas_free == 2
    with pytest.raises(DoubleBookingError):
        with_pod(snap, pod_info_for(snap, replica_pod("b", 3), "ts-0"))
    snap = with_pod(snap, pod_info_for(snap, replica_pod("b", 2), "ts-0"))
    assert snap.node("ts-0").replicas_free == 0
    # Replacing a pod with itself does not count it twice.
    snap = with_pod(snap, pod_info_for(snap, replica_pod("b", 2), "ts-0"))
    assert snap.node("ts-0").replicas_used == 8
    snap = without_pod(snap, "default/a")
    assert snap.node("ts-0").replicas_used == 2
    with pytest.raises(DoubleBookingError, match="does not share"):
        with_pod(snap, replace(pod_info_for(snap, replica_pod("c"), "ts-0"), node="dgx-0"))
    # A whole-GPU index on a replica node is refused (it has none in the model).
    with pytest.raises(DoubleBookingError):
        with_pod(snap, replace(pod_info_for(snap, make_pod("w", 1), "dgx-0"), node="ts-1"))


def test_restart_rebuilds_usage_from_bound_pods() -> None:
    bound = [
        replica_pod("a", 3, node="ts-1"),
        replica_pod("b", 2, node="ts-1"),
        replica_pod("c", 1, node="mps-0"),
        make_pod("d", 2, node="dgx-0", gpu_indices=[0, 1]),
        replica_pod("done", 4, node="ts-1", phase="Succeeded"),
    ]
    snap = _cluster(bound)
    assert snap.node("ts-1").replicas_used == 5 and snap.node("ts-1").replicas_free == 11
    assert snap.node("mps-0").replicas_used == 1 and snap.node("ts-0").replicas_used == 0
    assert snap.node("dgx-0").used_mask == 0b11
    assert snap.pods["default/a"].replicas == 3 and snap.pods["default/d"].replicas == 0
    # A node update keeps the count; a smaller allocatable leaves fewer free replicas.
    obj = replica_node("ts-1", 4, "a100", replicas=4, allocatable_replicas=6)
    snap = with_node_object(snap, obj, PARAMS)
    assert (snap.node("ts-1").replicas_used, snap.node("ts-1").replicas_free) == (5, 1)


# ---- placement -----------------------------------------------------------------------------


def test_whole_gpu_pods_and_gangs_never_land_on_replica_nodes() -> None:
    snap = _cluster()
    assert list(snap.arrays.blocked) == [0, BLOCKED_SHARED, BLOCKED_SHARED, BLOCKED_SHARED]
    out = filter_nodes(snap, request_from_pod(make_pod("w", 1), PARAMS.fabric), NAMES, PARAMS)
    assert out.feasible == ("dgx-0",)
    assert out.unresolvable == {n: REASON_REPLICA_NODE for n in NAMES[1:]}
    full = with_pod(snap, pod_info_for(snap, make_pod("big", 8), "dgx-0"))
    res = place_pod(full, request_from_pod(make_pod("w", 1), PARAMS.fabric), PARAMS)
    assert not res.ok and set(res.unresolvable) == set(NAMES[1:])


def _ext(replicas: str = "opt-in", **kw: Any) -> tuple[Extender, list]:
    params = replace(PARAMS, sharing=SharingParams(replicas=replicas))
    nodes = [
        make_node("dgx-0", 8, "h100"),
        replica_node("ts-0", 2, "a100", replicas=4),
        replica_node("ts-1", 4, "a100", replicas=4),
        replica_node("mps-0", 2, "h100", replicas=2, strategy="mps", **kw),
    ]
    cache = ClusterCache.from_objects(nodes, [], params)
    binder = RecordingBinder()
    return Extender(cache, binder), binder.calls


def _filter(ext: Extender, pod: dict[str, Any], names: list[str] = NAMES) -> dict[str, Any]:
    return orjson.loads(ext.filter_json({"Pod": pod, "NodeNames": names}))


def _bind(ext: Extender, pod: dict[str, Any], node: str) -> dict[str, str]:
    m = pod["metadata"]
    return ext.bind(
        {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    )


def test_extender_packs_replicas_fewest_free_first_ties_by_name() -> None:
    ext, calls = _ext()
    sel = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED"}
    # ts-0 (8 replicas) before ts-1 (16): fewest free replicas that fit.
    r = _filter(ext, replica_pod("a", 3, selector=sel), ["ts-1", "ts-0"])
    assert r["NodeNames"] == ["ts-0"] and r["Error"] == ""
    assert _bind(ext, replica_pod("a", 3, selector=sel), "ts-0") == {"Error": ""}
    assert calls[-1] == ("a", "ts-0", {})  # no hand-off: the kubelet picks the device
    # 5 left on ts-0: a 6-replica pod goes to ts-1, a 5-replica pod fills ts-0.
    assert _filter(ext, replica_pod("b", 6), ["ts-1", "ts-0"])["NodeNames"] == ["ts-1"]
    _bind(ext, replica_pod("b", 6), "ts-1")
    assert _filter(ext, replica_pod("c", 5), ["ts-0", "ts-1"])["NodeNames"] == ["ts-0"]
    _bind(ext, replica_pod("c", 5), "ts-0")
    r = _filter(ext, replica_pod("d", 11), ["ts-0", "ts-1", "dgx-0"])
    assert r["NodeNames"] == []
    assert r["FailedNodes"] == {"ts-1": REASON_REPLICAS_NOW}  # 10 free of 16
    assert r["FailedAndUnresolvableNodes"] == {
        "ts-0": REASON_REPLICAS_NEVER,  # 8 replicas in all
        "dgx-0": REASON_NODE_SELECTOR,
    }
    r = _filter(ext, replica_pod("d", 1, selector={}), ["dgx-0"])  # opts in otherwise?
    assert r["NodeNames"] == ["dgx-0"]  # no: an ordinary whole-GPU pod
    shared = replica_pod("s", 0, selector={})
    shared["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu.shared": "1"}
    r = _filter(ext, shared, ["dgx-0"])
    assert r["FailedAndUnresolvableNodes"] == {"dgx-0": REASON_NOT_REPLICA_NODE}
    r = _filter(ext, replica_pod("e", 17), ["ts-1"])  # 16 in all
    assert r["FailedAndUnresolvableNodes"] == {"ts-1": REASON_REPLICAS_NEVER}
    snap = ext.cache.snapshot()
    assert (snap.node("ts-0").replicas_used, snap.node("ts-1").replicas_used) == (8, 6)
    # Equal free replicas: the lower name.
    ext2, _ = _ext()
    ext2.cache.remember_pending(replica_pod("f", 8))
    assert _bind(ext2, replica_pod("f", 8), "ts-1") == {"Error": ""}  # 8 free on both now
    assert _filter(ext2, replica_pod("g", 1), ["ts-1", "ts-0"])["NodeNames"] == ["ts-0"]


def test_extender_refuses_exclusive_pods_and_honours_the_knob() -> None:
    ext, _ = _ext()
    r = _filter(ext, make_pod("w", 1))
    assert r["NodeNames"] == ["dgx-0"]
    assert r["FailedAndUnresolvableNodes"] == {}  # a node is offered: no reasons sent
    r = _filter(ext, make_pod("w", 1), NAMES[1:])
    assert r["NodeNames"] == []
    assert r["FailedAndUnresolvableNodes"] == {n: REASON_REPLICA_NODE for n in NAMES[1:]}
    gang = replica_pod("g", 1, gang="train", gang_size=2)
    r = _filter(ext, gang, ["ts-0"])
    assert r["NodeNames"] == [] and r["FailedAndUnresolvableNodes"] == {"ts-0": REASON_REPLICA_NODE}
    linked = replica_pod("l", 2, annotations={"topoplace.io/min-link": "nvlink"})
    assert _filter(ext, linked, ["ts-0"])["FailedAndUnresolvableNodes"] == {
        "ts-0": REASON_REPLICA_LINK
    }
    off, _ = _ext("off")
    r = _filter(off, replica_pod("a", 1), ["ts-0", "dgx-0"])
    assert r["FailedAndUnresolvableNodes"] == {
        "ts-0": REASON_REPLICA_NODE,
        "dgx-0": REASON_NODE_SELECTOR,
    }
    cordoned, _ = _ext(unschedulable=True)
    r = _filter(cordoned, replica_pod("a", 1), ["mps-0"])
    assert r["FailedAndUnresolvableNodes"] == {"mps-0": "node cordoned"}


def test_extender_invalid_replica_request_is_an_error_not_a_crash() -> None:
    ext, _ = _ext()
    pod = replica_pod("x", 1)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu.shared": "1e99"}}
    r = _filter(ext, pod)
    assert r["Error"].startswith("invalid pod:") and r["NodeNames"] is None
    assert MAX_NODE_REPLICAS == 62 * 1024


def test_bind_without_filter_checks_room_and_prioritize_scores() -> None:
    ext, _ = _ext()
    ext.cache.remember_pending(replica_pod("a", 4, selector=MPS))
    assert _bind(ext, replica_pod("a", 4, selector=MPS), "mps-0") == {"Error": ""}
    ext.cache.remember_pending(replica_pod("b", 1, selector=MPS))
    assert _bind(ext, replica_pod("b", 1, selector=MPS), "mps-0") == {"Error": REASON_REPLICAS_NOW}
    assert ext.cache.snapshot().node("mps-0").replicas_used == 4
    pod = replica_pod("c", 2, selector={"nvidia.com/gpu.replicas": "4"})
    scores = orjson.loads(ext.prioritize_json({"Pod": pod, "NodeNames": ["ts-1", "ts-0", "mps-0"]}))
    assert scores == [
        {"Host": "ts-1", "Score": 1},
        {"Host": "ts-0", "Score": 10},
        {"Host": "mps-0", "Score": 0},
    ]
