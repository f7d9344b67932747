"""Which pods topoplace preempts for a pending GPU pod (scheduler/core/preemption.py), and
the teardown of the gangs a preemption breaks (remediation.teardown_groups).

Real-shaped Node objects: DGX-1 V100 (the hybrid cube-mesh of
``../shared/data/topologies/dgx1_v100_hybrid_cube_mesh.txt``, where only some GPU sets are
fully NVLink-connected) and DGX H100; pods as users write them (benchmarks.clusters.make_pod)
with the ``spec.priority`` the Priority admission plugin writes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from benchmarks.clusters import make_node, make_pod
from scheduler.core.linkclass import class_rank, feasible_sizes
from scheduler.core.model import PodRequest, indices_to_mask
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.preemption import (
    REASON_NO_LOWER,
    REASON_NOT_NEEDED,
    select_victims,
    without_lower,
)
from scheduler.core.remediation import KIND_PREEMPTED, Broken, teardown_groups
from scheduler.core.schedule import REASON_LINK_NEVER, REASON_NOT_ENOUGH_FREE
from scheduler.core.snapshot import build_snapshot
from tests.health.builders import condition, dgx, dgx1

SP = SchedParams()


def _pod(name: str, gpus: int, priority: int = 0, **kw: Any) -> dict[str, Any]:
    p = make_pod(name, gpus, **kw)
    p["spec"]["priority"] = priority
    return p


def _req(name: str, gpus: int, priority: int, **kw: Any) -> PodRequest:
    return request_from_pod(_pod(name, gpus, priority, **kw), SP.fabric)


def _uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def _victims(decision: Any) -> list[str]:
    return [v.pod.split("/")[1] for v in decision.chosen.victims]


def test_victims_give_the_pod_an_nvlink_set_where_kube_scheduler_counts_gpus() -> None:
    # Eight one-GPU pods of equal priority on a DGX-1; a 4-GPU pod that needs NVLink on
    # every ring hop. kube-scheduler's dry run takes the four youngest pods, here on GPUs
    # 0, 3, 5, 6: no NVLink ring (the cube-mesh quads are 0-3 and 4-7).
    pods = [_pod(f"one-{g}", 1, node="v1", gpu_indices=[g]) for g in range(8)]
    snap = build_snapshot([dgx1("v1")], pods, SP)
    shape = snap.node("v1").shape
    nvlink = class_rank("nvlink")
    assert not (feasible_sizes(shape, indices_to_mask([0, 3, 5, 6]))[nvlink] >> 4) & 1
    req = _req("train", 4, 1000, annotations={"topoplace.io/min-link": "nvlink"})
    kube = {"v1": {_uid(pods[g]) for g in (0, 3, 5, 6)}}
    d = select_victims(snap, req, kube, SP)
    assert d.chosen is not None and d.chosen.node == "v1"
    freed = [int(v.split("-")[1]) for v in _victims(d)]
    assert len(freed) == 4
    assert (feasible_sizes(shape, indices_to_mask(freed))[nvlink] >> 4) & 1
    assert sorted(d.chosen.gpus) == sorted(freed)
    assert d.chosen.bottleneck_gbps > 0
    # Equal pods are offered back by name: 0..3 go back (the quad 4-7 stays free), then
    # none of 4..7 can. kube-scheduler's own picks do not matter, only the cluster does.
    assert sorted(freed) == [4, 5, 6, 7]
    other = {"v1": {_uid(pods[g]) for g in (1, 2, 4, 7)}}
    assert select_victims(snap, req, other, SP) == d


def test_a_lone_pod_goes_before_a_gang_member_of_the_same_priority() -> None:
    pods = [
        _pod("g-0", 4, node="a", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=2),
        _pod("g-1", 4, node="b", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=2),
        _pod("lone", 4, node="a", gpu_indices=[4, 5, 6, 7]),
        _pod("busy-b", 4, 500, node="b", gpu_indices=[4, 5, 6, 7]),
    ]
    snap = build_snapshot([dgx("a"), dgx("b")], pods, SP)
    req = _req("infer", 4, 100)
    # kube-scheduler would take the gang member on a (the older pod is kept first)
    d = select_victims(snap, req, {"a": {_uid(pods[0])}, "b": {_uid(pods[1])}}, SP)
    assert d.chosen.node == "a" and _victims(d) == ["lone"]
    assert d.chosen.gangs_broken == () and d.chosen.gpus_disrupted == 4
    # On b only the gang member may go (busy-b outranks the pod): 8 GPUs disrupted.
    (b,) = [o for o in d.options if o.node == "b"]
    assert [v.pod for v in b.victims] == ["default/g-1"]
    assert b.gangs_broken == ("default/g",) and b.gang_members == ("default/g-0",)
    assert b.gpus_disrupted == 8


def test_lower_priority_goes_first_even_if_it_breaks_a_gang() -> None:
    pods = [
        _pod("g-0", 4, 0, node="a", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=2),
        _pod("g-1", 4, 0, node="b", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=2),
        _pod("mid", 4, 50, node="a", gpu_indices=[4, 5, 6, 7]),
    ]
    snap = build_snapshot([dgx("a"), dgx("b")], pods, SP)
    d = select_victims(snap, _req("infer", 4, 100), {"a": {_uid(pods[2])}}, SP)
    assert _victims(d) == ["g-0"]
    assert d.chosen.gang_members == ("default/g-1",)


def test_nodes_where_preemption_cannot_help_are_refused_with_the_reason() -> None:
    pods = [
        _pod("high", 6, 1000, node="a", gpu_indices=[0, 1, 2, 3, 4, 5]),
        _pod("low", 2, 0, node="a", gpu_indices=[6, 7]),
        _pod("high-b", 8, 1000, node="b", gpu_indices=list(range(8))),
        _pod("low-c", 2, 0, node="c", gpu_indices=[0, 1]),
    ]
    sick = dgx("d", conditions=[condition("GpuXidError")])
    snap = build_snapshot([dgx("a"), dgx("b"), dgx("c"), sick], pods, SP)
    req = _req("train", 4, 500)
    d = select_victims(
        snap, req, {"a": {_uid(pods[1])}, "b": set(), "c": {_uid(pods[3])}, "d": set()}, SP
    )
    assert d.refused["a"] == REASON_NOT_ENOUGH_FREE  # the 6 GPUs above it stay
    assert d.refused["b"] == REASON_NO_LOWER
    assert d.refused["c"] == REASON_NOT_NEEDED  # 6 GPUs free: nothing to evict there
    assert d.refused["d"] == snap.node("d").health.reasons[0]
    assert d.chosen is None and d.options == ()


def test_a_link_that_no_set_can_meet_refuses_the_node() -> None:
    # An 8 x L40S PCIe server has no NVLink: evicting there would never serve the pod,
    # though kube-scheduler, counting GPUs, proposes it.
    pods = [_pod(f"one-{g}", 1, node="pcie", gpu_indices=[g]) for g in range(8)]
    snap = build_snapshot([make_node("pcie", 8, "l40s")], pods, SP)
    req = _req("big", 2, 1000, annotations={"topoplace.io/min-link": "nvlink"})
    d = select_victims(snap, req, {"pcie": {_uid(p) for p in pods[:2]}}, SP)
    assert d.chosen is None and d.refused["pcie"] == REASON_LINK_NEVER


def test_the_cheapest_node_wins_then_the_better_gpu_set() -> None:
    pods = [
        _pod("x-a", 2, 10, node="a", gpu_indices=[0, 1]),
        _pod("fill-a", 6, 1000, node="a", gpu_indices=[2, 3, 4, 5, 6, 7]),
        _pod("x-b", 2, 5, node="b", gpu_indices=[0, 1]),
        _pod("fill-b", 6, 1000, node="b", gpu_indices=[2, 3, 4, 5, 6, 7]),
    ]
    snap = build_snapshot([dgx("a"), dgx("b")], pods, SP)
    req = _req("p", 2, 100)
    d = select_victims(snap, req, {"a": {_uid(pods[0])}, "b": {_uid(pods[2])}}, SP)
    assert d.chosen.node == "b"  # its victim's priority is lower
    assert [o.node for o in d.options] == ["b", "a"]
    # Only within: a gang member keeps to its gang's placement.
    only_a = select_victims(snap, req, {"a": {_uid(pods[0])}, "b": {_uid(pods[2])}}, SP, {"a"})
    assert only_a.chosen.node == "a" and "b" in only_a.refused


def test_kube_victims_without_gpus_stay_victims_and_cpu_counts() -> None:
    # A CPU-only pod kube-scheduler evicts (it needs the CPU) stays among the victims.
    cpu_hog = _pod("cpu-hog", 0, 0, node="a", cpu="200")
    gpu_pod = _pod("gpu", 4, 0, node="a", gpu_indices=[0, 1, 2, 3])
    full = _pod("full", 4, 1000, node="a", gpu_indices=[4, 5, 6, 7])
    snap = build_snapshot([dgx("a")], [cpu_hog, gpu_pod, full], SP)
    req = _req("p", 4, 100, cpu="100")
    d = select_victims(snap, req, {"a": {_uid(cpu_hog), _uid(gpu_pod)}}, SP)
    assert sorted(_victims(d)) == ["cpu-hog", "gpu"]


def test_pods_being_deleted_count_as_gone_and_holds_are_never_victims() -> None:
    leaving = _pod("leaving", 4, 0, node="a", gpu_indices=[0, 1, 2, 3])
    leaving["metadata"]["deletionTimestamp"] = "2026-12-02T22:00:00Z"
    stay = _pod("stay", 4, 0, node="a", gpu_indices=[4, 5, 6, 7])
    snap = build_snapshot([dgx("a")], [leaving, stay], SP)
    d = select_victims(snap, _req("p", 4, 100), {"a": {_uid(stay)}}, SP)
    assert d.chosen is None and d.refused["a"] == REASON_NOT_NEEDED
    d8 = select_victims(snap, _req("p8", 8, 100), {"a": {_uid(stay)}}, SP)
    assert _victims(d8) == ["stay"]  # not "leaving": it is going anyway
    # An assumed hold (a gang reservation, a bind in flight) is not a pod to preempt.
    held = replace(snap.pods["default/stay"], assumed=True)
    snap2 = replace(snap, pods={**snap.pods, "default/stay": held})
    assert select_victims(snap2, _req("p8", 8, 100), {"a": set()}, SP).chosen is None


def test_the_same_question_gets_the_same_answer() -> None:
    pods = [_pod(f"one-{g}", 1, g % 3, node="v1", gpu_indices=[g]) for g in range(8)]
    snap = build_snapshot([dgx1("v1"), dgx1("v2")], pods, SP)
    req = _req("train", 4, 1000, annotations={"topoplace.io/min-link": "nvlink"})
    kube = {"v1": {_uid(p) for p in pods[:4]}}
    first = select_victims(snap, req, kube, SP)
    assert all(select_victims(snap, req, kube, SP) == first for _ in range(3))
    # No pod of priority 2 (GPUs 2, 5) goes: they are offered back first.
    assert sorted(v.priority for v in first.chosen.victims) == [0, 0, 1, 1]


def test_without_lower_keeps_higher_and_assumed_pods() -> None:
    pods = [
        _pod("low", 4, 0, node="a", gpu_indices=[0, 1, 2, 3]),
        _pod("high", 4, 900, node="a", gpu_indices=[4, 5, 6, 7]),
    ]
    snap = build_snapshot([dgx("a")], pods, SP)
    assert sorted(without_lower(snap, 500).pods) == ["default/high"]
    assert sorted(without_lower(snap, 0).pods) == ["default/high", "default/low"]


@pytest.mark.parametrize("victim_state", ["present", "terminating", "gone"])
def test_teardown_waits_for_the_victim_then_evicts_the_recorded_members(
    victim_state: str,
) -> None:
    pods = [
        _pod("g-0", 4, node="a", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=3),
        _pod("g-1", 4, node="b", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=3),
        _pod("g-2", 4, node="c", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=3),
    ]
    record = Broken("default/g", "default/g-0", _uid(pods[0]), frozenset(map(_uid, pods[1:])))
    if victim_state == "terminating":
        pods[0]["metadata"]["deletionTimestamp"] = "2026-12-02T22:00:00Z"
    elif victim_state == "gone":
        pods = pods[1:]
    # g-2 was recreated under its name after the preemption: a new UID, not torn down.
    pods[-1]["metadata"]["uid"] = "recreated-uid"
    snap = build_snapshot([dgx("a"), dgx("b"), dgx("c")], pods, SP)
    out = teardown_groups(snap, [record], ("topoplace",))
    if victim_state == "present":
        assert out == ()
        return
    ((group, rec),) = out
    assert rec is record
    assert [(f.pod, f.kind, f.cause, f.gang) for f in group] == [
        ("default/g-1", KIND_PREEMPTED, "default/g-0", "default/g")
    ]


def test_the_gpus_are_freed_by_as_few_pods_as_can_free_them() -> None:
    # One 4-GPU pod and four 1-GPU pods, all of one priority: a 4-GPU pod takes the one.
    pods = [_pod("four", 4, node="a", gpu_indices=[0, 1, 2, 3])] + [
        _pod(f"one-{g}", 1, node="a", gpu_indices=[g]) for g in range(4, 8)
    ]
    snap = build_snapshot([dgx("a")], pods, SP)
    d = select_victims(snap, _req("p", 4, 100), {"a": {_uid(p) for p in pods[1:]}}, SP)
    assert _victims(d) == ["four"]
