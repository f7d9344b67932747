"""Which pods on failed hardware are evicted, and with whom (scheduler/core/remediation.py).

Real-shaped DGX H100 Node objects with the signals NVSentinel, the DRA driver and HAMi
publish (tests/health/builders.py), pods as users write them with topoplace's placement
record (benchmarks.clusters.make_pod).
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.clusters import make_pod
from scheduler.core.health import (
    REASON_DEVICE_TAINT,
    REASON_GPU_CORDON,
    REASON_GPU_FAULT,
    REASON_NOT_READY,
    REASON_NVSENTINEL,
)
from scheduler.core.params import SchedParams
from scheduler.core.remediation import (
    KIND_GANG,
    KIND_GPU,
    KIND_NODE,
    OPT_OUT_ANNOTATION,
    RemediationParams,
    plan,
)
from scheduler.core.snapshot import build_snapshot
from tests.health.builders import condition, device, dgx, resource_slice, taint

SP = SchedParams()
RP = RemediationParams(mode="evict", after_seconds=60)
PROFILES = ("topoplace",)


def _snap(nodes: list[dict], pods: list[dict], extra: Any = None) -> Any:
    return build_snapshot(nodes, pods, SP, extra)


def _keys(pl: Any) -> list[list[tuple[str, str]]]:
    return [[(f.pod, f.kind) for f in g] for g in pl.groups]


def _cluster(a: dict | None = None) -> list[dict]:
    return [a or dgx("a"), dgx("b"), dgx("c"), dgx("d")]


def test_pods_on_a_failed_node_are_due_after_the_grace_and_no_sooner() -> None:
    xid = dgx("a", conditions=[condition("GpuXidError")])
    pods = [
        make_pod("on-a", 4, node="a", gpu_indices=[0, 1, 2, 3]),
        make_pod("on-b", 4, node="b", gpu_indices=[0, 1, 2, 3]),
    ]
    snap = _snap(_cluster(xid), pods)
    first = plan(snap, RP, SP.health, PROFILES, 1000.0, {})
    assert first.groups == ()  # seen now: not due yet
    assert dict(first.waiting) == {"default/on-a": 1000.0}
    early = plan(snap, RP, SP.health, PROFILES, 1059.0, first.waiting)
    assert early.groups == () and dict(early.waiting) == {"default/on-a": 1000.0}
    due = plan(snap, RP, SP.health, PROFILES, 1060.0, early.waiting)
    ((f,),) = due.groups
    assert (f.pod, f.kind, f.reason, f.node, f.since) == (
        "default/on-a",
        KIND_NODE,
        REASON_GPU_FAULT,
        "a",
        1000.0,
    )
    assert f.uid == pods[0]["metadata"]["uid"]
    # The node recovers: the pod drops out, and its clock starts again if it fails again.
    healed = _snap(_cluster(), pods)
    assert dict(plan(healed, RP, SP.health, PROFILES, 1061.0, due.waiting).waiting) == {}


@pytest.mark.parametrize(
    "node,reason",
    [
        (dgx("a", ready=False), REASON_NOT_READY),
        (dgx("a", labels={"dgxc.nvidia.com/nvsentinel-state": "quarantined"}), REASON_NVSENTINEL),
        (dgx("a", conditions=[condition("SysLogsGPUFallenOff")]), REASON_GPU_FAULT),
    ],
    ids=["not ready", "NVSentinel quarantine", "fatal syslog condition"],
)
def test_node_failures_that_count(node: dict, reason: str) -> None:
    snap = _snap(_cluster(node), [make_pod("p", 8, node="a", gpu_indices=range(8))])
    ((f,),) = plan(snap, RP, SP.health, PROFILES, 0.0, {"default/p": -60.0}).groups
    assert (f.kind, f.reason) == (KIND_NODE, reason)


def test_a_cordon_a_degraded_node_and_pods_not_topoplaces_are_left_alone() -> None:
    nodes = [
        dgx("a", unschedulable=True),  # cordoned: pods keep running
        dgx("b", conditions=[condition("GpuThermalWatch")]),  # degraded, usable
        dgx("c", conditions=[condition("GpuXidError")]),
        dgx("d"),
    ]
    dying = make_pod("dying", 1, node="c", gpu_indices=[0])
    dying["metadata"]["deletionTimestamp"] = "2026-12-02T20:00:00Z"
    opted = make_pod("opted", 1, node="c", gpu_indices=[1])
    opted["metadata"]["annotations"][OPT_OUT_ANNOTATION] = "off"
    pods = [
        make_pod("cordoned", 1, node="a", gpu_indices=[0]),
        make_pod("hot", 1, node="b", gpu_indices=[0]),
        make_pod("other-scheduler", 1, node="c", gpu_indices=[2], scheduler_name="default"),
        make_pod("cpu-only", 0, node="c"),
        dying,
        opted,
        make_pod("mine", 1, node="c", gpu_indices=[3]),
    ]
    pl = plan(_snap(nodes, pods), RP, SP.health, PROFILES, 0.0, {})
    assert list(pl.waiting) == ["default/mine"]
    assert (pl.failed_nodes, pl.gpu_nodes) == (1, 4)


def test_one_tainted_gpu_evicts_only_the_pod_that_holds_it() -> None:
    # NVIDIA's DRA driver taints GPU 3 of node a (XID 79); pods hold GPUs through the
    # device plugin. A per-GPU cordon (HAMi) on node b is an operator's choice, not a fault.
    slices = [
        resource_slice(
            "a",
            [
                device(i, taints=[taint("gpu.nvidia.com/xid", "NoExecute", "79")] if i == 3 else [])
                for i in range(8)
            ],
        )
    ]
    nodes = [dgx("a"), dgx("b", annotations={"hami.io/device-cordon": "5"}), dgx("c")]
    pods = [
        make_pod("pair-ok", 2, node="a", gpu_indices=[0, 1]),
        make_pod("pair-hit", 2, node="a", gpu_indices=[2, 3]),
        make_pod("cordoned-gpu", 1, node="b", gpu_indices=[5]),
    ]
    snap = _snap(nodes, pods, {"resourceslices": slices})
    since = {"default/pair-hit": 0.0, "default/cordoned-gpu": 0.0}
    pl = plan(snap, RP, SP.health, PROFILES, 100.0, since)
    assert _keys(pl) == [[("default/pair-hit", KIND_GPU)]]
    assert pl.groups[0][0].reason == REASON_DEVICE_TAINT
    assert pl.failed_nodes == 0  # the node serves on
    # An operator who treats per-GPU cordons as faults says so.
    both = RemediationParams(mode="evict", gpu_reasons=(REASON_DEVICE_TAINT, REASON_GPU_CORDON))
    pl = plan(snap, both, SP.health, PROFILES, 100.0, since)
    assert _keys(pl) == [[("default/cordoned-gpu", KIND_GPU)], [("default/pair-hit", KIND_GPU)]]


def test_a_failed_member_takes_its_whole_gang_and_nothing_else() -> None:
    xid = dgx("a", conditions=[condition("GpuXidError")])
    pods = [
        make_pod(f"w{i}", 8, node=n, gpu_indices=range(8), gang="train", gang_size=3)
        for i, n in enumerate("acb")
    ] + [make_pod("solo", 8, node="d", gpu_indices=range(8))]
    snap = _snap(_cluster(xid), pods)
    pl = plan(snap, RP, SP.health, PROFILES, 60.0, {"default/w0": 0.0})
    assert _keys(pl) == [
        [("default/w0", KIND_NODE), ("default/w1", KIND_GANG), ("default/w2", KIND_GANG)]
    ]
    assert {f.cause for f in pl.groups[0]} == {"default/w0"}
    assert {f.reason for f in pl.groups[0]} == {REASON_GPU_FAULT}
    assert {f.gang for f in pl.groups[0]} == {"default/train"}
    alone = plan(
        snap,
        RemediationParams(mode="evict", whole_gangs=False),
        SP.health,
        PROFILES,
        60.0,
        {"default/w0": 0.0},
    )
    assert _keys(alone) == [[("default/w0", KIND_NODE)]]


def test_two_failed_members_make_one_group_at_the_first_ones_time() -> None:
    nodes = [
        dgx("a", conditions=[condition("GpuXidError")]),
        dgx("b", ready=False),
        dgx("c"),
        dgx("d"),
        dgx("e"),
    ]
    pods = [
        make_pod(f"w{i}", 8, node=n, gpu_indices=range(8), gang="train", gang_size=3)
        for i, n in enumerate("abc")
    ]
    snap = _snap(nodes, pods)
    # w1's node failed later (not due on its own); the gang goes whole when w0 is due.
    pl = plan(snap, RP, SP.health, PROFILES, 60.0, {"default/w0": 0.0, "default/w1": 50.0})
    assert _keys(pl) == [
        [("default/w0", KIND_NODE), ("default/w1", KIND_NODE), ("default/w2", KIND_GANG)]
    ]
    assert [f.since for f in pl.groups[0]] == [0.0, 50.0, 0.0]


def test_too_many_failed_nodes_at_once_hold_every_eviction() -> None:
    nodes = [dgx(n, ready=n not in "ab") for n in "abc"]
    pods = [make_pod("p", 8, node="a", gpu_indices=range(8))]
    pl = plan(_snap(nodes, pods), RP, SP.health, PROFILES, 100.0, {"default/p": 0.0})
    assert pl.groups == () and "2 of 3 GPU nodes failed" in pl.paused
    assert dict(pl.waiting) == {"default/p": 0.0}  # still tracked: due once the storm passes
    nodes[1] = dgx("b")
    pl = plan(_snap(nodes, pods), RP, SP.health, PROFILES, 100.0, pl.waiting)
    assert not pl.paused and _keys(pl) == [[("default/p", KIND_NODE)]]
    # Two nodes, one failed: half the cluster, and still one failure.
    two = _snap([dgx("a", ready=False), dgx("b")], pods)
    assert _keys(plan(two, RP, SP.health, PROFILES, 100.0, {"default/p": 0.0})) == [
        [("default/p", KIND_NODE)]
    ]


def test_plan_is_deterministic_and_ordered_by_first_failure() -> None:
    nodes = [dgx(n, conditions=[condition("GpuXidError")]) for n in "ab"]
    nodes += [dgx(n) for n in "cdef"]
    pods = [make_pod(f"p{n}", 8, node=n, gpu_indices=range(8)) for n in "ab"]
    snap = _snap(nodes, pods)
    since = {"default/pa": 30.0, "default/pb": 10.0}
    one = plan(snap, RP, SP.health, PROFILES, 100.0, since)
    assert _keys(one) == [[("default/pb", KIND_NODE)], [("default/pa", KIND_NODE)]]
    assert one == plan(snap, RP, SP.health, PROFILES, 100.0, dict(reversed(since.items())))


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"mode": "on"}, "remediation.mode must be one of"),
        ({"after_seconds": -1}, "remediation.after_seconds"),
        ({"max_failed_node_share": 1.5}, "remediation.max_failed_node_share"),
        ({"max_evictions_per_minute": 0}, "max_evictions_per_minute"),
        ({"grace_period_seconds": -5}, "grace_period_seconds"),
        ({"whole_gangs": "yes"}, "whole_gangs"),
        ({"node_reasons": "node not ready"}, "node_reasons"),
        ({"evict_after": 5}, "unknown remediation settings"),
    ],
)
def test_bad_remediation_settings_are_refused_by_name(cfg: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SchedParams.from_config({"remediation": cfg})


def test_settings_load_and_older_policies_only_report() -> None:
    assert SchedParams.from_config({}).remediation.mode == "dry-run"
    p = SchedParams.from_config(
        {"remediation": {"mode": "evict", "after_seconds": 5, "grace_period_seconds": 0}}
    ).remediation
    assert (p.mode, p.after_seconds, p.grace_period_seconds) == ("evict", 5.0, 0)


# ---- pods whose GPUs DRA ResourceClaims hold (objects recorded from v1.33.0) -----------------


def _dra_snap(nodes: list[dict] | None = None, slices: list[dict] | None = None) -> Any:
    from tests.dra import recorded

    extra = recorded.extra()
    if slices is not None:
        extra["resourceslices"] = slices
    return build_snapshot(nodes or recorded.nodes(), recorded.pods(), SP, extra)


def test_a_failed_node_takes_out_the_pods_its_claims_are_reserved_for() -> None:
    from tests.dra import recorded

    nodes = recorded.nodes()
    for n in nodes:
        if n["metadata"]["name"] == "gpu-node-0":
            n["status"]["conditions"].append(condition("GpuXidError"))
    snap = _dra_snap(nodes)
    profiles = ("topology-gpu",)  # the profile the recorded pods were scheduled by
    pl = plan(snap, RP, SP.health, profiles, 0.0, {})
    # claim-pod-a (two-gpus) and claim-pod-c (same-root) run on gpu-node-0; claim-pod-b
    # on gpu-node-1; the gated pod holds nothing
    assert sorted(pl.waiting) == ["default/claim-pod-a", "default/claim-pod-c"]
    assert plan(snap, RP, SP.health, PROFILES, 0.0, {}).waiting == {}  # not topoplace's


def test_a_tainted_device_takes_out_only_the_pod_whose_claim_holds_it() -> None:
    from tests.dra import recorded

    slices = recorded.slices()
    for sl in slices:
        if sl["spec"]["nodeName"] == "gpu-node-1":
            for d in sl["spec"]["devices"]:
                if d["name"] == "gpu-6":  # pinned-seven holds gpu-0..4, 6, 7
                    d["taints"] = [
                        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
                    ]
    pl = plan(
        _dra_snap(slices=slices),
        RP,
        SP.health,
        ("topology-gpu",),
        60.0,
        {"default/claim-pod-b": 0.0},
    )
    assert _keys(pl) == [[("default/claim-pod-b", KIND_GPU)]]
    assert pl.groups[0][0].reason == REASON_DEVICE_TAINT
    # The recorded taint on gpu-5 (NoSchedule) touches no claim: nobody goes for it.
    assert list(plan(_dra_snap(), RP, SP.health, ("topology-gpu",), 0.0, {}).waiting) == []


def test_a_claim_gang_goes_whole_though_its_bind_recorded_no_gang() -> None:
    # topoplace's bind of a claim pod records it without its gang (the claims make the gang
    # whole already); the gang is read from the Pod object.
    from dataclasses import replace

    from scheduler.core.snapshot import with_pod
    from tests.dra import recorded

    nodes = recorded.nodes()
    for n in nodes:
        if n["metadata"]["name"] == "gpu-node-0":
            n["status"]["conditions"].append(condition("GpuXidError"))
    pods = recorded.pods()
    for p in pods:
        if p["metadata"]["name"] in ("claim-pod-a", "claim-pod-b"):
            p["metadata"].setdefault("annotations", {}).update(
                {"topoplace.io/gang": "ft", "topoplace.io/gang-size": "2"}
            )
    snap = build_snapshot(nodes, pods, SP, recorded.extra())
    for key in ("default/claim-pod-a", "default/claim-pod-b"):
        snap = with_pod(snap, replace(snap.pods[key], gang=""))
    pl = plan(snap, RP, SP.health, ("topology-gpu",), 60.0, {"default/claim-pod-a": 0.0})
    # claim-pod-c (gpu-node-0 too) was seen only now: not due yet
    assert _keys(pl) == [[("default/claim-pod-a", KIND_NODE), ("default/claim-pod-b", KIND_GANG)]]
    assert {f.gang for f in pl.groups[0]} == {"default/ft"}


def test_a_bare_yaml_off_switches_remediation_off() -> None:
    import yaml

    cfg = yaml.safe_load("remediation:\n  mode: off\n")  # YAML 1.1: a bare off is false
    assert cfg["remediation"]["mode"] is False
    assert SchedParams.from_config(cfg).remediation.mode == "off"
