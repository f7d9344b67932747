"""Gang plans persisted in members' placement records and replayed after a restart.

Issue 7: killing the extender mid-gang and starting it again must neither lose the gang's
plan nor give its GPUs to anyone else, including GPUs promised to members whose pods do
not exist yet.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

import orjson
import pytest

from scheduler.core.gang import (
    PROBLEM_GPUS_HELD,
    PROBLEM_NODE_GONE,
    PROBLEM_NODE_UNHEALTHY,
    PROBLEM_OUTSIDE_PLAN,
    GangRole,
    RecoveredPlan,
    plan_of_record,
    recover_plans,
    recovery_request,
)
from scheduler.core.model import PLACEMENT_ANNOTATION, PLACEMENT_VERSION
from scheduler.core.objects import (
    PLAN_SLOTS_MAX_BYTES,
    PlanRecord,
    placement_of,
    placement_value,
    request_from_pod,
)
from scheduler.core.schedule import Assignment, filter_nodes
from scheduler.kube.recovery import recover
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime, describe_plans
from scheduler.server.extender import Extender
from tests.builders import cluster, dgx_su, gang_pod, make_pod
from tests.gang.test_extender_gangs import (
    Clock,
    P,
    bind,
    events,
    filt,
    members,
    reservations,
)

WALL = 1_700_000_000.0
ANNOTATION_LIMIT = 256 * 1024  # Kubernetes: total size of an object's annotations


def record_of(pod: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION])


# ---- the record -----------------------------------------------------------------------------


def test_plan_record_round_trip() -> None:
    slots = [("worker", "n1", (0, 1, 2, 3)), ("worker", "n2", (4, 5, 6, 7)), ("launcher", "n3", ())]
    plan = PlanRecord.of("abc123", slots, "topoplace", WALL, 60.0)
    assert plan.plan_id == "abc123" and plan.slots[2] == ("launcher", "n3", ())
    with pytest.raises(AttributeError):
        plan.ttl = 1.0  # type: ignore[misc]
    raw = placement_value("n1", (0, 1, 2, 3), "ns/g", plan)
    rec = orjson.loads(raw)
    assert rec == {
        "v": PLACEMENT_VERSION,
        "node": "n1",
        "gpus": [0, 1, 2, 3],
        "gang": "ns/g",
        "plan": "abc123",
        "policy": "topoplace",
        "created": WALL,
        "ttl": 60.0,
        "slots": [
            ["worker", "n1", [0, 1, 2, 3]],
            ["worker", "n2", [4, 5, 6, 7]],
            ["launcher", "n3", []],
        ],
    }
    pod = {"metadata": {"annotations": {PLACEMENT_ANNOTATION: raw}}}
    got = placement_of(pod)
    assert got is not None and got["gpus"] == [0, 1, 2, 3]
    table = plan_of_record(got)
    assert table is not None
    assert (table.plan_id, table.policy, table.created, table.ttl) == (
        "abc123",
        "topoplace",
        WALL,
        60.0,
    )
    assert table.slots == tuple(slots)
    # A plain plan id writes the record as before: no plan table.
    plain = orjson.loads(placement_value("n1", (0,), "ns/g", PlanRecord("abc123")))
    assert set(plain) == {"v", "node", "gpus", "gang", "plan"}
    assert plan_of_record(plain) is None


@pytest.mark.parametrize(
    "slots",
    [
        "not a list",
        [["worker", "n1"]],
        [["worker", "n1", [-1]]],
        [["worker", "", [0]]],
        [["worker", "n1", [True]]],
        [[1, "n1", [0]]],
        [],
    ],
)
def test_malformed_slot_tables_are_ignored_not_fatal(slots: Any) -> None:
    rec = {"v": 1, "node": "n1", "gpus": [0], "gang": "ns/g", "plan": "p", "slots": slots}
    pod = {"metadata": {"annotations": {PLACEMENT_ANNOTATION: orjson.dumps(rec).decode()}}}
    assert placement_of(pod) is not None  # the pod's own GPUs are still known
    assert plan_of_record(rec) is None


def test_record_of_a_512_member_gang_stays_well_under_the_annotation_limit() -> None:
    # 512 x 8-GPU members on 512 nodes with long, real-looking names: the worst case of a
    # one-member-per-node gang.
    slots = [
        (
            "8gpu-96cpu-1843Gi",
            f"gpu-h100-rack{i // 16:03d}-slot{i % 16:02d}.cluster.example.com",
            tuple(range(8)),
        )
        for i in range(512)
    ]
    raw = placement_value(
        slots[0][1],
        tuple(range(8)),
        "ml-team/llm-pretrain-512",
        PlanRecord.of("0123456789ab", slots, "topoplace", WALL, 60),
    )
    size = len(raw.encode())
    assert size < 64 * 1024 < ANNOTATION_LIMIT  # ~48 KiB
    table = plan_of_record(orjson.loads(raw))
    assert table is not None and len(table.slots) == 512
    # 512 x 1-GPU members packed 8 per node: smaller still.
    small = [("1gpu", f"node-{i // 8:04d}", (i % 8,)) for i in range(512)]
    assert (
        len(placement_value("node-0000", (0,), "g", PlanRecord.of("p", small)).encode()) < 32 * 1024
    )


def test_a_plan_too_large_for_the_record_is_left_out() -> None:
    slots = [
        ("worker", f"node-with-a-rather-long-name-{i:06d}", tuple(range(8))) for i in range(4096)
    ]
    rec = orjson.loads(placement_value("n", (0,), "g", PlanRecord.of("p", slots, "x", WALL, 60)))
    assert "slots" not in rec and rec["slots_omitted"] == 4096
    assert len(orjson.dumps(rec)) < PLAN_SLOTS_MAX_BYTES
    assert plan_of_record(rec) is None


# ---- writing it -------------------------------------------------------------------------------


def runtime_ext(nodes: list[dict[str, Any]]) -> tuple[Extender, list[str]]:
    """An extender whose gang runtime stamps plans with the wall clock :data:`WALL`."""
    n, p = cluster(nodes)
    cache = ClusterCache.from_objects(n, p, P, clock=Clock())
    ext = Extender(cache, gangs=GangRuntime(wall_clock=lambda: WALL))
    return ext, [x["metadata"]["name"] for x in n]


def first_member_bound(nodes: int = 5, size: int = 4) -> tuple[Extender, list[str], list[dict]]:
    """A gang of ``size`` x 8 GPUs on an SU of ``nodes``; only w-0 exists and is bound."""
    ext, names = runtime_ext(dgx_su("su-a", nodes=nodes))
    ws = members(size, gpus=8, size=size)
    node = filt(ext, ws[0], names)["NodeNames"][0]
    assert bind(ext, ws[0], node) == ""
    return ext, names, ws


def test_every_member_writes_the_whole_plan_with_one_plan_id() -> None:
    ext, names, ws = first_member_bound()
    plan = ext.cache.plans["default/train"]
    rec = record_of(ext.cache.snapshot().pods["default/w-0"].raw)
    assert rec["plan"] == plan.plan_id and rec["policy"] == plan.policy
    assert (rec["created"], rec["ttl"]) == (WALL, P.gang.plan_ttl_seconds)
    assert sorted((n, g) for _, n, g in rec["slots"]) == sorted(
        (s.node, list(s.gpus)) for s in plan.slots.values()
    )
    assert len(rec["slots"]) == 4
    for w in ws[1:]:
        node = filt(ext, w, names)["NodeNames"][0]
        assert bind(ext, w, node) == ""
    recs = [record_of(p.raw) for k, p in ext.cache.snapshot().pods.items() if "/w-" in k]
    assert len(recs) == 4
    assert {r["plan"] for r in recs} == {rec["plan"]}
    assert all(r["slots"] == rec["slots"] for r in recs)


def restart(
    ext: Extender,
    *,
    drop_nodes: Collection[str] = (),
    extra_pods: Sequence[dict[str, Any]] = (),
    sick: Collection[str] = (),
    clock: Clock | None = None,
) -> Extender:
    """A new extender from what the API keeps: ``ext``'s Nodes and Pods (reservations are
    in memory only and die), with nodes removed, made NotReady, or pods added."""
    listing = ext.snapshot_list()
    nodes = [
        i
        for i in listing["items"]
        if i["kind"] == "Node" and i["metadata"]["name"] not in drop_nodes
    ]
    for n in nodes:
        if n["metadata"]["name"] in sick:
            n["status"] = {**n["status"], "conditions": [{"type": "Ready", "status": "False"}]}
    pods = [i for i in listing["items"] if i["kind"] == "Pod"] + list(extra_pods)
    cache = ClusterCache.from_objects(nodes, pods, P, clock=clock or Clock())
    return Extender(cache, gangs=GangRuntime(wall_clock=lambda: WALL + 100))


# ---- replaying it ---------------------------------------------------------------------------


def test_unbound_slots_are_recovered_from_the_only_bound_member() -> None:
    ext, names, ws = first_member_bound()
    before = ext.cache.plans["default/train"]
    promised = {(s.node, s.gpus) for s in before.slots.values() if s.member != "default/w-0"}
    ext2 = restart(ext)
    assert not reservations(ext2)
    found = recover_plans(ext2.cache.snapshot())["default/train"]
    assert found.replayable and found.plan_id == before.plan_id
    assert [s.member for s in found.slots if s.member] == ["default/w-0"]
    assert ext2.gangs.recover(ext2) == 1
    held = reservations(ext2)
    assert {(p.node, p.gpus) for p in held.values()} == promised
    plan = ext2.cache.plans["default/train"]
    assert plan.plan_id == before.plan_id and plan.details["recovery"] == "replayed"
    assert describe_plans(ext2)["default/train"]["state"] == "live"
    assert events(ext2) == {"recovered": 1.0}
    # A rival finds only the node the plan left free.
    rival = make_pod("rival", 8)
    spare = set(names) - {n for n, _ in promised} - {ext2.cache.snapshot().pods["default/w-0"].node}
    assert filt(ext2, rival, names)["NodeNames"] == sorted(spare)
    # The members that did not exist before the restart get exactly their promised slots
    # and carry the same plan id.
    for w in ws[1:]:
        (node,) = filt(ext2, w, names)["NodeNames"]
        assert bind(ext2, w, node) == ""
    snap = ext2.cache.snapshot()
    got = {(snap.pods[f"default/w-{i}"].node, snap.pods[f"default/w-{i}"].gpus) for i in (1, 2, 3)}
    assert got == promised
    assert {record_of(snap.pods[f"default/w-{i}"].raw)["plan"] for i in range(4)} == {
        before.plan_id
    }
    assert not reservations(ext2)
    assert "default/train" not in ext2.cache.plans  # complete


def test_recovered_reservations_are_released_after_one_ttl() -> None:
    ext, names, ws = first_member_bound()
    clock = Clock()
    ext2 = restart(ext, clock=clock)
    clock.t += 3600  # restarted long after the plan was made: the TTL counts from recovery
    ext2.gangs.recover(ext2)
    held = reservations(ext2)
    assert len(held) == 3
    assert all(ext2.cache.expiry_of(k) == clock.t + P.gang.plan_ttl_seconds for k in held)
    clock.t += P.gang.plan_ttl_seconds - 1
    assert ext2.cache.expire() == []
    clock.t += 1
    assert sorted(ext2.cache.expire()) == sorted(held)
    assert not reservations(ext2)
    # The GPUs are free again: a rival fits on the formerly promised nodes.
    rival = request_from_pod(make_pod("rival", 8), P.fabric)
    free = filter_nodes(ext2.cache.snapshot(), rival, names, P).feasible
    assert {p.node for p in held.values()} <= set(free)
    # A member arriving late finds the plan expired and the gang is planned again whole.
    (node,) = filt(ext2, ws[1], names)["NodeNames"]
    assert events(ext2)["expired"] == 1.0
    assert bind(ext2, ws[1], node) == ""


def test_the_recorded_ttl_is_used_on_recovery() -> None:
    ext, names, ws = first_member_bound()
    pods = [i for i in ext.snapshot_list()["items"] if i["kind"] == "Pod"]
    w0 = next(p for p in pods if p["metadata"]["name"] == "w-0")
    rec = orjson.loads(w0["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    rec["ttl"] = 15.0
    w0["metadata"]["annotations"][PLACEMENT_ANNOTATION] = orjson.dumps(rec).decode()
    nodes = [i for i in ext.snapshot_list()["items"] if i["kind"] == "Node"]
    cache = ClusterCache.from_objects(nodes, pods, P, clock=Clock())
    ext2 = Extender(cache, gangs=GangRuntime())
    ext2.gangs.recover(ext2)
    assert {ext2.cache.expiry_of(k) for k in reservations(ext2)} == {ext2.cache.now() + 15.0}


def test_a_slot_whose_gpus_another_pod_now_holds_makes_the_gang_replan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ext, names, ws = first_member_bound(nodes=6)
    plan = ext.cache.plans["default/train"]
    taken = next(
        s for s in sorted(plan.slots.values(), key=lambda s: s.slot) if s.member != "default/w-0"
    )
    # While topoplace was down another scheduler bound a pod holding two of those GPUs.
    intruder = make_pod(
        "intruder", 2, namespace="other", node=taken.node, gpu_indices=taken.gpus[:2]
    )
    ext2 = restart(ext, extra_pods=[intruder])
    rp = recover_plans(ext2.cache.snapshot())["default/train"]
    assert not rp.replayable
    assert [p for p in rp.problems] == [
        f"{s.slot}: {PROBLEM_GPUS_HELD}" for s in rp.slots if s.node == taken.node
    ]
    with caplog.at_level(logging.WARNING, logger="scheduler.runtime.gangs"):
        assert ext2.gangs.recover(ext2) == 1
    assert "cannot be replayed" in caplog.text
    new = ext2.cache.plans["default/train"]
    assert new.details["recovery"] == "replanned" and new.plan_id != plan.plan_id
    held = reservations(ext2)
    assert len(held) == 3
    snap = ext2.cache.snapshot()
    # Never double-booked: the intruder's GPUs are not in any reservation, w-0 stays put.
    for r in held.values():
        if r.node == taken.node:
            assert not set(r.gpus) & set(taken.gpus[:2])
    assert snap.pods["default/w-0"].node == ext.cache.snapshot().pods["default/w-0"].node
    assert new.members["default/w-0"] in new.slots
    assert events(ext2)["replanned"] == 1.0
    # The members follow the new plan.
    for w in ws[1:]:
        (node,) = filt(ext2, w, names)["NodeNames"]
        assert bind(ext2, w, node) == ""
    assert not reservations(ext2)


def test_a_vanished_node_makes_the_gang_replan_around_the_bound_member() -> None:
    ext, names, ws = first_member_bound(nodes=6)
    plan = ext.cache.plans["default/train"]
    w0_node = plan.slots[plan.members["default/w-0"]].node
    gone = sorted(s.node for s in plan.slots.values() if s.node != w0_node)[0]
    ext2 = restart(ext, drop_nodes={gone})
    rp = recover_plans(ext2.cache.snapshot())["default/train"]
    assert [p.split(": ")[1] for p in rp.problems] == [PROBLEM_NODE_GONE]
    ext2.gangs.recover(ext2)
    held = reservations(ext2)
    assert len(held) == 3 and gone not in {p.node for p in held.values()}
    assert w0_node not in {p.node for p in held.values()}
    new = ext2.cache.plans["default/train"]
    assert new.slots[new.members["default/w-0"]].node == w0_node


def test_an_unhealthy_node_makes_the_gang_replan() -> None:
    ext, names, ws = first_member_bound(nodes=6)
    plan = ext.cache.plans["default/train"]
    w0_node = plan.slots[plan.members["default/w-0"]].node
    sick = sorted(s.node for s in plan.slots.values() if s.node != w0_node)[-1]
    ext2 = restart(ext, sick={sick})
    rp = recover_plans(ext2.cache.snapshot())["default/train"]
    assert [p.split(": ")[1] for p in rp.problems] == [PROBLEM_NODE_UNHEALTHY]
    ext2.gangs.recover(ext2)
    assert sick not in {p.node for p in reservations(ext2).values()}
    assert len(reservations(ext2)) == 3


def test_a_gang_that_no_longer_fits_keeps_its_bound_member_and_holds_nothing() -> None:
    ext, names, ws = first_member_bound(nodes=4)
    plan = ext.cache.plans["default/train"]
    w0_node = plan.slots[plan.members["default/w-0"]].node
    gone = sorted(s.node for s in plan.slots.values() if s.node != w0_node)[0]
    ext2 = restart(ext, drop_nodes={gone})  # 3 nodes left for a gang of 4 whole nodes
    assert ext2.gangs.recover(ext2) == 1
    assert not reservations(ext2)
    left = ext2.cache.plans["default/train"]
    assert left.details["recovery"] == "bound only"
    assert ext2.cache.snapshot().pods["default/w-0"].node == w0_node


def test_v1_records_without_a_plan_table_still_recover_bound_members() -> None:
    ext, names, ws = first_member_bound()
    pods = [i for i in ext.snapshot_list()["items"] if i["kind"] == "Pod"]
    w0 = next(p for p in pods if p["metadata"]["name"] == "w-0")
    rec = orjson.loads(w0["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    old = {k: rec[k] for k in ("v", "node", "gpus", "gang", "plan")}  # as written before
    w0["metadata"]["annotations"][PLACEMENT_ANNOTATION] = orjson.dumps(old).decode()
    nodes = [i for i in ext.snapshot_list()["items"] if i["kind"] == "Node"]
    cache = ClusterCache.from_objects(nodes, pods, P, clock=Clock())
    held = cache.snapshot().pods["default/w-0"]
    assert held.gpu_indices_known and list(held.gpus) == old["gpus"]
    rp = recover_plans(cache.snapshot())["default/train"]
    assert rp.table is None and rp.slots == () and not rp.replayable
    assert rp.plan_id == old["plan"]
    ext2 = Extender(cache, gangs=GangRuntime())
    assert ext2.gangs.recover(ext2) == 1
    plan = ext2.cache.plans["default/train"]
    assert plan.details["recovery"] == "bound only" and not reservations(ext2)
    # The missing members are planned (whole, w-0 fixed) when they come, as before.
    (node,) = filt(ext2, ws[1], names)["NodeNames"]
    assert node != held.node and len(reservations(ext2)) == 3


def test_records_that_disagree_follow_the_plan_holding_most_members(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ext, names, ws = first_member_bound()
    for w in ws[1:3]:
        (node,) = filt(ext, w, names)["NodeNames"]
        assert bind(ext, w, node) == ""
    good = ext.cache.plans["default/train"].plan_id
    pods = [i for i in ext.snapshot_list()["items"] if i["kind"] == "Pod"]
    w2 = next(p for p in pods if p["metadata"]["name"] == "w-2")
    rec = orjson.loads(w2["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    # A stale record of another plan, newer, that knows only w-2's slot.
    rec.update(
        plan="stale", created=WALL + 50, slots=[[rec["slots"][0][0], rec["node"], rec["gpus"]]]
    )
    w2["metadata"]["annotations"][PLACEMENT_ANNOTATION] = orjson.dumps(rec).decode()
    nodes = [i for i in ext.snapshot_list()["items"] if i["kind"] == "Node"]
    cache = ClusterCache.from_objects(nodes, pods, P, clock=Clock())
    rp = recover_plans(cache.snapshot())["default/train"]
    assert rp.plan_ids == tuple(sorted((good, "stale"))) and rp.plan_id == good
    assert rp.replayable and len(rp.open_slots) == 1
    ext2 = Extender(cache, gangs=GangRuntime())
    with caplog.at_level(logging.WARNING, logger="scheduler.runtime.gangs"):
        ext2.gangs.recover(ext2)
    assert "2 plan ids" in caplog.text
    assert len(reservations(ext2)) == 1


def test_a_bound_member_outside_the_recorded_plan_makes_the_gang_replan() -> None:
    ext, names, ws = first_member_bound(nodes=6)
    plan = ext.cache.plans["default/train"]
    used = {s.node for s in plan.slots.values()}
    other = next(n for n in sorted(names) if n not in used)
    # w-1 was bound elsewhere (by hand, or by an older plan whose records were lost).
    stray = gang_pod("w-1", 8, "train", 4, node=other, gpu_indices=range(8))
    stray["metadata"]["annotations"][PLACEMENT_ANNOTATION] = placement_value(
        other, tuple(range(8)), "default/train", PlanRecord(plan.plan_id)
    )
    ext2 = restart(ext, extra_pods=[stray])
    rp = recover_plans(ext2.cache.snapshot())["default/train"]
    assert rp.outside == ("default/w-1",)
    assert f"default/w-1: {PROBLEM_OUTSIDE_PLAN}" in rp.problems
    ext2.gangs.recover(ext2)
    new = ext2.cache.plans["default/train"]
    assert {"default/w-0", "default/w-1"} <= set(new.members)
    assert len(reservations(ext2)) == 2


def test_kube_recovery_replays_then_pending_members_claim_their_slots() -> None:
    ext, names, ws = first_member_bound()
    promised = {
        s.node for s in ext.cache.plans["default/train"].slots.values() if s.member != "default/w-0"
    }
    ext2 = restart(ext)
    report = recover(ext2, [ws[1]], ())
    assert (report.gangs, report.replanned) == (1, 1)
    plan = ext2.cache.plans["default/train"]
    assert plan.details["recovery"] == "replayed"
    assert plan.slots[plan.members["default/w-1"]].node in promised
    assert len(reservations(ext2)) == 3


# ---- the pure re-plan request -------------------------------------------------------------------


def test_recovery_request_keeps_recorded_roles_and_bound_shapes() -> None:
    w0 = request_from_pod(gang_pod("w-0", 8, "mpi", 4, role="worker"), P.fabric)
    from scheduler.core.gang import RecoveredSlot

    rp = RecoveredPlan(
        "default/mpi",
        (Assignment("default/w-0", "n0", tuple(range(8))),),
        ("p",),
        None,
        (
            RecoveredSlot("worker-0", "worker", "n0", tuple(range(8)), "default/w-0"),
            RecoveredSlot("worker-1", "worker", "n1", tuple(range(8)), "", PROBLEM_NODE_GONE),
            RecoveredSlot("worker-2", "worker", "n2", tuple(range(8))),
            RecoveredSlot("launcher-0", "launcher", "n2", ()),
        ),
    )
    greq = recovery_request(rp, [w0])
    assert greq is not None
    assert [(r.name, r.count, r.gpus) for r in greq.roles] == [("launcher", 1, 0), ("worker", 2, 8)]
    worker = next(r for r in greq.roles if r.name == "worker")
    assert worker == GangRole(
        "worker", 2, 8, w0.cpu_milli, w0.memory_bytes, "", worker.node_selector
    )
    assert [f.pod for f in greq.fixed] == ["default/w-0"]
    # A declared size wins over the table; no member left to place: None.
    assert recovery_request(rp, [w0], size=2).size == 1  # type: ignore[union-attr]
    assert recovery_request(rp, [w0], size=1) is None
    assert recovery_request(rp, []) is None
