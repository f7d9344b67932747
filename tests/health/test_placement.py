"""Placement uses health: unresolvable rejection, risk in scores, GPU-level loss on real
shapes, failure detection between snapshots, and a gang re-planned after a node fails."""

from __future__ import annotations

from itertools import combinations

import pytest

from benchmarks.engine.placers import GangAsk, greedy_gang, hold, registry_placer
from scheduler.core.health import (
    REASON_GPU_FAULT,
    REASON_NOT_READY,
    REASON_NVSENTINEL,
)
from scheduler.core.model import Health, PodRequest, indices_to_mask
from scheduler.core.params import SchedParams
from scheduler.core.schedule import choose_gpus, filter_nodes, place_pod, score_nodes
from scheduler.core.snapshot import build_snapshot, with_node_object
from tests.health.builders import condition, device, dgx, dgx1, resource_slice, taint
from topology.select import ring_bottleneck

SP = SchedParams()


def snap_of(*nodes, extra=None):  # noqa: ANN001, ANN202
    return build_snapshot(list(nodes), [], SP, extra)


UNRESOLVABLE = [
    ("NotReady", dgx("a", ready=False), REASON_NOT_READY),
    (
        "fatal NVSentinel condition",
        dgx("a", conditions=[condition("GpuXidError")]),
        REASON_GPU_FAULT,
    ),
    (
        "NVSentinel quarantine label",
        dgx("a", labels={"dgxc.nvidia.com/nvsentinel-state": "quarantined"}),
        REASON_NVSENTINEL,
    ),
    (
        "fatal condition + cordon: the fault is reported",
        dgx("a", unschedulable=True, conditions=[condition("GpuMemWatch")]),
        REASON_GPU_FAULT,
    ),
]


@pytest.mark.parametrize("desc,node,reason", UNRESOLVABLE, ids=[u[0] for u in UNRESOLVABLE])
def test_filter_rejects_unhealthy_as_unresolvable(desc: str, node: dict, reason: str) -> None:
    snap = snap_of(node, dgx("b"))
    out = filter_nodes(snap, PodRequest("ns/p", gpus=1), None, SP)
    assert out.feasible == ("b",)
    assert out.unresolvable == {"a": reason}
    assert not out.failed
    assert choose_gpus(snap, PodRequest("ns/p", gpus=1), "a", SP).error == reason


RISKY = [
    ("thermal watch (degraded condition)", dgx("a", conditions=[condition("GpuThermalWatch")])),
    ("stale heartbeat", dgx("a")),
    ("XID burst from DRA taints", dgx("a")),
]


@pytest.mark.parametrize("desc,node", RISKY, ids=[r[0] for r in RISKY])
def test_prioritize_subtracts_risk(desc: str, node: dict) -> None:
    devs = [
        device(i, taints=[taint("gpu.nvidia.com/xid", "None", "94", "2026-11-29T19:55:00Z")])
        for i in range(3)
    ]
    extra = (
        {"now": "2026-11-29T20:10:00Z"} if "heartbeat" in desc else {"now": "2026-11-29T20:01:00Z"}
    )
    if "XID" in desc:
        extra["resourceslices"] = [resource_slice("a", devs)]
    fresh = dgx("b")
    fresh["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-29T20:09:00Z"
    snap = snap_of(node, fresh, extra=extra)
    assert snap.node("b").health.risk == 0
    a = snap.node("a").health
    assert a.state == Health.DEGRADED and a.risk > 0
    req = PodRequest("ns/p", gpus=8)
    assert set(filter_nodes(snap, req, None, SP).feasible) == {"a", "b"}  # usable
    scores = dict(score_nodes(snap, req, None, SP))
    assert scores["a"] < scores["b"]
    assert place_pod(snap, req, SP).assignments[0].node == "b"  # although "a" sorts first


def _best_ring(shape, usable: int, k: int) -> float:  # noqa: ANN001
    idx = [i for i in range(shape.num_gpus) if usable >> i & 1]
    return max(ring_bottleneck(shape, c) for c in combinations(idx, k))


GPU_LOSS = [
    (
        "DGX-1 V100, GPU 3 cordoned by HAMi",
        dgx1("n", annotations={"hami.io/device-cordon": "3"}),
        None,
        {3},
        "dgx1-v100",
    ),
    (
        "DGX-1 V100, GPU 0 lost (DRA gpu-lost)",
        dgx1("n"),
        [device(0, taints=[taint("gpu.nvidia.com/gpu-lost")])],
        {0},
        "dgx1-v100",
    ),
    (
        "DGX-1 V100, GPU 6 unhealthy (Volcano ids)",
        dgx1("n", annotations={"volcano.sh/gpu-unhealthy-ids": "6"}),
        None,
        {6},
        "dgx1-v100",
    ),
    (
        "DGX-1 V100, allocatable 7 (device plugin)",
        dgx1("n", allocatable_gpus=7),
        None,
        {7},
        "dgx1-v100",
    ),
    (
        "DGX H100, GPU 5 lost (DRA xid NoSchedule)",
        dgx("n"),
        [device(5, taints=[taint("gpu.nvidia.com/xid", "NoSchedule", "48")])],
        {5},
        "dgx-h100",
    ),
    (
        "DGX H100, GPU 1 cordoned by HAMi",
        dgx("n", annotations={"hami.io/device-cordon": "1"}),
        None,
        {1},
        "dgx-h100",
    ),
]


@pytest.mark.parametrize("desc,node,devs,lost,shape", GPU_LOSS, ids=[g[0] for g in GPU_LOSS])
@pytest.mark.parametrize("policy", ["nvidia-best-effort", "topoplace"])
def test_gpu_level_loss_keeps_the_node_and_picks_good_gpus(
    desc, node, devs, lost, shape, policy
) -> None:  # noqa: ANN001
    """A 7-healthy-GPU node serves a 4-GPU pod on healthy GPUs forming the best ring left."""
    params = SchedParams(selection_policy=policy)
    extra = {"resourceslices": [resource_slice("n", devs)]} if devs else None
    snap = build_snapshot([node], [], params, extra)
    n = snap.node("n")
    assert n.shape.name == shape and n.shape_source == "gfd"
    assert n.health.state == Health.DEGRADED
    assert n.health.bad_mask == indices_to_mask(lost)
    res = place_pod(snap, PodRequest("ns/p", gpus=4), params)
    assert res.ok and res.assignments[0].node == "n"
    gpus = res.assignments[0].gpus
    assert len(gpus) == 4 and not set(gpus) & lost
    best = _best_ring(n.shape, n.usable_mask, 4)
    assert ring_bottleneck(n.shape, gpus) == pytest.approx(best)
    # ... and it is an all-NVLink set: a min-link pod is served too.
    assert place_pod(snap, PodRequest("ns/q", gpus=4, min_link="nvlink"), params).ok
    # An 8-GPU pod cannot fit any more: unresolvable "too few healthy GPUs", not "unhealthy".
    out = filter_nodes(snap, PodRequest("ns/big", gpus=8), None, params)
    assert "n" in out.unresolvable and not out.feasible


def test_dgx1_with_gpu3_lost_gets_the_other_nvlink_quad() -> None:
    snap = snap_of(dgx1("n", annotations={"hami.io/device-cordon": "3"}))
    assert place_pod(snap, PodRequest("ns/p", gpus=4), SP).assignments[0].gpus == (4, 5, 6, 7)


def _gang_cluster() -> list[dict]:
    return [dgx(f"h{i}", leaf="leaf-1" if i < 4 else "leaf-2", spine="s1") for i in range(6)]


def _placers():  # noqa: ANN202
    out = [("greedy place_pod", greedy_gang)]
    cp = registry_placer("topoplace")
    if cp is not None:
        out.append(("registry topoplace", cp))
    return out


@pytest.mark.parametrize("name,placer", _placers(), ids=[p[0] for p in _placers()])
def test_gang_planned_node_fails_before_bind_replanned_elsewhere(name, placer) -> None:  # noqa: ANN001
    """Plan a 4 x 8-GPU gang; one planned node fails in the next snapshot; plan again."""
    nodes = _gang_cluster()
    snap = build_snapshot(nodes, [], SP)
    ask = GangAsk("ns/train", 4, 8)
    first = placer(snap, ask, SP)
    assert first.ok and len(first.assignments) == 4
    victim = first.assignments[1].node
    # The node fails before the members bind: the next snapshot shows the fault.
    failed = with_node_object(snap, dgx(victim, conditions=[condition("GpuXidError")]), SP)
    assert failed.node(victim).health.state >= Health.UNHEALTHY
    again = placer(failed, ask, SP)
    assert again.ok and len(again.assignments) == 4
    used = [a.node for a in again.assignments]
    assert victim not in used
    assert len(set(used)) == 4  # 8-GPU members: one per node, nothing double-booked
    held = hold(failed, ask.key, again.assignments)  # raises on any double booking
    assert sum(len(p.gpus) for p in held.pods.values()) == 32
    # With two nodes down, a 4-node gang on 6 nodes still fits; with three it does not.
    two = with_node_object(failed, dgx(used[0], ready=False), SP)
    assert placer(two, ask, SP).ok
    three = with_node_object(
        two, dgx(used[1], labels={"dgxc.nvidia.com/nvsentinel-state": "draining"}), SP
    )
    assert not placer(three, ask, SP).ok


@pytest.mark.parametrize("name,placer", _placers(), ids=[p[0] for p in _placers()])
def test_gang_members_never_get_a_lost_gpu(name, placer) -> None:  # noqa: ANN001
    """Two DGX-1 nodes each with GPU 3 lost: 2 x 4-GPU members need one node each and
    must both avoid GPU 3; a third member cannot fit."""
    nodes = [
        dgx1(n, annotations={"hami.io/device-cordon": "3"}, leaf="l1", spine="s1")
        for n in ("v1", "v2")
    ]
    snap = build_snapshot(nodes, [], SP)
    res = placer(snap, GangAsk("ns/g", 2, 4), SP)
    assert res.ok
    assert sorted(a.node for a in res.assignments) == ["v1", "v2"]
    assert all(3 not in a.gpus for a in res.assignments)
    assert not placer(snap, GangAsk("ns/g3", 3, 4), SP).ok
