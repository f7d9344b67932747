"""Gangs through the extender verbs: plan on the first member, reserve, one planned node per
member, bind from the reservation, refusals that hold nothing, re-planning after expiry or
breakage, inspection, metrics and restart recovery."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scheduler.core.gang import parse_reservation_key, recover_plans
from scheduler.core.model import PLACEMENT_ANNOTATION, RESERVATION_PREFIX
from scheduler.core.params import SchedParams
from scheduler.core.schedule import REASON_NOT_ENOUGH_FREE
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import (
    REASON_GANG_UNPLACEABLE,
    REASON_NOT_IN_PLAN,
    GangRuntime,
    describe_plans,
)
from scheduler.server.extender import Extender
from tests.builders import cluster, dgx_su, gang_pod, make_pod, nvl72_rack
from tests.helpers import asgi_client, with_reasons

P = SchedParams()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FailingBinder:
    def __init__(self, fail: set[str]) -> None:
        self.fail = fail

    def bind(self, pod: Any, node: str, annotations: Any) -> str:
        return "conflict: the node is gone" if pod["metadata"]["name"] in self.fail else ""


def make_ext(nodes, pods=(), binder=None, extra=None, clock=None, params=P):
    n, p = cluster(nodes, pods)
    cache = ClusterCache.from_objects(n, p, params, clock=clock or Clock(), extra=extra)
    return Extender(cache, binder=binder, gangs=GangRuntime()), [x["metadata"]["name"] for x in n]


def filt(ext: Extender, pod, names) -> dict:
    return ext.filter({"Pod": pod, "NodeNames": names})


def bind(ext: Extender, pod, node: str) -> str:
    m = pod["metadata"]
    return ext.bind(
        {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    )["Error"]


def reservations(ext: Extender) -> dict[str, Any]:
    return {k: p for k, p in ext.cache.snapshot().pods.items() if k.startswith(RESERVATION_PREFIX)}


def events(ext: Extender) -> dict[str, float]:
    out = {}
    for metric in ext.metrics.gang_events.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                out[s.labels["event"]] = s.value
    return out


def members(n: int, gpus: int = 4, size: int | None = None, **kw) -> list[dict]:
    return [
        gang_pod(f"w-{i}", gpus, "train", size if size is not None else n, **kw) for i in range(n)
    ]


def test_first_member_plans_and_reserves_the_whole_gang() -> None:
    racks = nvl72_rack("rack-a", used={0: [0, 1, 2, 3]}) + nvl72_rack("rack-b")
    ext, names = make_ext(racks)
    ws = members(16, required="nvlink-domain")
    r = filt(ext, ws[0], names)
    assert len(r["NodeNames"]) == 1
    node = r["NodeNames"][0]
    assert node.startswith("rack-a")
    assert r["FailedNodes"] == {} and r["FailedAndUnresolvableNodes"] == {}  # a node offered
    # With every verdict sent (extender.reasons_when_placed), the others are outside the plan.
    verbose, _ = make_ext(racks, params=with_reasons(P))
    v = filt(verbose, ws[0], names)
    assert v["NodeNames"] == [node]
    assert set(v["FailedNodes"]) == set(names) - {node}
    assert set(v["FailedNodes"].values()) == {REASON_NOT_IN_PLAN}
    held = reservations(ext)
    assert len(held) == 16
    assert {parse_reservation_key(k)[0] for k in held} == {"default/train"}
    assert all(p.assumed and p.gpus == (0, 1, 2, 3) for p in held.values())
    assert all(ext.cache.expiry_of(k) == ext.cache.now() + P.gang.plan_ttl_seconds for k in held)
    # No other pod can take the reserved GPUs: a lone 4-GPU pod only fits rack-b's spare trays.
    lone = make_pod("lone", 4)
    out = filt(ext, lone, names)
    assert out["NodeNames"] and not set(out["NodeNames"]) & {p.node for p in held.values()}
    assert filt(verbose, lone, names)["FailedNodes"][node] == REASON_NOT_ENOUGH_FREE
    assert events(ext) == {"planned": 1.0}


def test_members_bind_to_their_planned_nodes() -> None:
    ext, names = make_ext(dgx_su("su-a", nodes=6, used={0: [0, 1, 2, 3]}))
    ws = members(4, gpus=4, required="leaf")
    planned = {}
    for w in ws:
        r = filt(ext, w, names)
        (node,) = r["NodeNames"]
        scores = ext.prioritize({"Pod": w, "NodeNames": names})
        assert {s["Host"]: s["Score"] for s in scores} == {
            n: (10 if n == node else 0) for n in names
        }
        # Asking again gives the same node (idempotent).
        assert filt(ext, w, names)["NodeNames"] == [node]
        assert bind(ext, w, node) == ""
        planned[w["metadata"]["name"]] = node
    snap = ext.cache.snapshot()
    assert not reservations(ext)
    plan_ids = set()
    for w in ws:
        key = f"default/{w['metadata']['name']}"
        held = snap.pods[key]
        assert held.node == planned[w["metadata"]["name"]] and not held.assumed
        rec = orjson.loads(held.raw["metadata"]["annotations"][PLACEMENT_ANNOTATION])
        assert rec["gang"] == "default/train" and rec["node"] == held.node
        plan_ids.add(rec["plan"])
    assert len(plan_ids) == 1
    # Four 4-GPU members pair up on two nodes: no new hole is left behind.
    assert len(set(planned.values())) == 2
    assert events(ext) == {"planned": 1.0, "bound": 4.0}
    d = describe_plans(ext)["default/train"]
    assert d["state"] == "complete" and all(s["state"] == "bound" for s in d["slots"])


def test_bind_to_another_node_is_refused() -> None:
    ext, names = make_ext(dgx_su("su-a", nodes=3))
    ws = members(2, gpus=8)
    node = filt(ext, ws[0], names)["NodeNames"][0]
    other = next(n for n in names if n != node)
    assert bind(ext, ws[0], other) == REASON_NOT_IN_PLAN
    assert bind(ext, ws[0], node) == ""


def test_refused_gang_holds_nothing_and_explains_itself() -> None:
    ext, names = make_ext(nvl72_rack("rack-a", used={i: [0] for i in range(7)}))
    ws = members(16, required="nvlink-domain")
    for w in ws[:3]:
        r = filt(ext, w, names)
        assert r["NodeNames"] == []
        assert r["FailedNodes"] == {n: REASON_GANG_UNPLACEABLE for n in names}
        assert r["FailedAndUnresolvableNodes"] == {}
    assert not reservations(ext)
    d = describe_plans(ext)["default/train"]
    assert d["state"] == "refused"
    assert d["reason"] == (
        "needs 16 nodes with 4 free healthy GPUs inside one nvlink-domain; "
        "the whole cluster has room for 11 now"
    )
    # The refusal is remembered: three members, one solve.
    assert events(ext) == {"refused": 1.0}
    assert bind(ext, ws[0], names[0]) != ""
    assert not any(not p.assumed for k, p in ext.cache.snapshot().pods.items() if "w-" in k)


def test_expired_plan_is_dropped_and_replanned_whole() -> None:
    clock = Clock()
    ext, names = make_ext(dgx_su("su-a", nodes=4), clock=clock)
    ws = members(3, gpus=8)
    filt(ext, ws[0], names)
    assert len(reservations(ext)) == 3
    clock.t += P.gang.plan_ttl_seconds + 1
    r = filt(ext, ws[1], names)
    assert len(r["NodeNames"]) == 1
    assert len(reservations(ext)) == 3
    ev = events(ext)
    assert ev["expired"] == 1.0 and ev["replanned"] == 1.0
    # After the plan expired the stale slot cannot be bound.
    clock.t += P.gang.plan_ttl_seconds + 1
    node = ext.gangs.describe_plans(ext)["default/train"]["slots"][0]["node"]
    assert bind(ext, ws[0], node) != ""


def test_failed_bind_breaks_the_plan_and_bound_members_stay() -> None:
    ext, names = make_ext(
        dgx_su("su-a", nodes=4) + dgx_su("su-b", nodes=8, spine="spine-1"),
        binder=FailingBinder({"w-1"}),
    )
    ws = members(3, gpus=8, required="leaf")
    n0 = filt(ext, ws[0], names)["NodeNames"][0]
    assert bind(ext, ws[0], n0) == ""
    n1 = filt(ext, ws[1], names)["NodeNames"][0]
    assert bind(ext, ws[1], n1) != ""
    # The plan is gone with its reservations; w-0 keeps its GPUs.
    assert not reservations(ext)
    assert "default/train" not in ext.cache.plans
    assert ext.cache.snapshot().pods["default/w-0"].node == n0
    ext.binder = FailingBinder(set())
    r = filt(ext, ws[2], names)
    (n2,) = r["NodeNames"]
    # Re-planned whole with w-0 fixed: same leaf as w-0.
    assert n2[:4] == n0[:4]
    assert events(ext)["replanned"] == 1.0


def test_node_turning_unhealthy_breaks_the_plan() -> None:
    ext, names = make_ext(dgx_su("su-a", nodes=6))
    ws = members(3, gpus=8)
    filt(ext, ws[0], names)
    plan = ext.cache.plans["default/train"]
    victim = next(s.node for s in plan.slots.values() if s.member != "default/w-0")
    node_obj = next(n.raw for n in ext.cache.snapshot().nodes if n.name == victim)
    sick = {
        **node_obj,
        "status": {**node_obj["status"], "conditions": [{"type": "Ready", "status": "False"}]},
    }
    ext.cache.upsert_node(sick)
    filt(ext, ws[1], names)
    plan = ext.cache.plans["default/train"]
    assert victim not in {s.node for s in plan.slots.values()}
    assert events(ext)["replanned"] == 1.0


def test_deleted_member_breaks_the_plan() -> None:
    ext, names = make_ext(dgx_su("su-a", nodes=6))
    ws = members(2, gpus=8, size=0)
    filt(ext, ws[0], names)
    filt(ext, ws[1], names)  # no declared size: the second member re-plans the gang (2 slots)
    assert len(reservations(ext)) == 2
    ext.cache.delete_pod("default/w-1")
    filt(ext, ws[0], names)
    assert len(reservations(ext)) == 1


def test_podgroup_min_member_sizes_the_plan() -> None:
    podgroup = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minMember": 5},
    }
    ext, names = make_ext(dgx_su("su-a", nodes=8), extra={"podgroups": {"default/train": podgroup}})
    w = gang_pod("w-0", 8, "train", key="coscheduling")
    filt(ext, w, names)
    assert len(reservations(ext)) == 5


def test_member_of_a_new_role_replans_with_its_slot() -> None:
    ext, names = make_ext(dgx_su("su-a", nodes=4))
    w0 = gang_pod("w-0", 8, "mpi", 3, role="worker")
    w1 = gang_pod("w-1", 8, "mpi", 3, role="worker")
    launcher = gang_pod("launcher", 0, "mpi", 3, role="launcher", cpu="2", memory="4Gi")
    filt(ext, w0, names)
    assert len(reservations(ext)) == 3  # planned as 3 workers from the first member
    r = filt(ext, launcher, names)
    assert len(r["NodeNames"]) == 1
    plan = ext.cache.plans["default/mpi"]
    roles = sorted(s.role for s in plan.slots.values())
    assert roles == ["launcher", "worker", "worker"]
    assert filt(ext, w1, names)["NodeNames"]
    for pod in (w0, w1, launcher):
        node = filt(ext, pod, names)["NodeNames"][0]
        assert bind(ext, pod, node) == ""
    assert ext.cache.snapshot().pods["default/launcher"].gpus == ()


def test_plans_survive_a_restart() -> None:
    ext, names = make_ext(dgx_su("su-a", nodes=4))
    ws = members(3, gpus=8, size=4)
    for w in ws:
        node = filt(ext, w, names)["NodeNames"][0]
        assert bind(ext, w, node) == ""
    listing = ext.snapshot_list()
    nodes = [i for i in listing["items"] if i["kind"] == "Node"]
    pods = [i for i in listing["items"] if i["kind"] == "Pod"]
    cache2 = ClusterCache.from_objects(nodes, pods, P, clock=Clock())
    found = recover_plans(cache2.snapshot())
    rp = found["default/train"]
    assert [m.pod for m in rp.members] == ["default/w-0", "default/w-1", "default/w-2"]
    assert len(rp.plan_ids) == 1
    ext2 = Extender(cache2, gangs=GangRuntime())
    assert ext2.gangs.recover(ext2) == 1
    assert describe_plans(ext2)["default/train"]["details"]["status"] == "recovered"
    # The fourth member is planned with the three bound ones fixed.
    w3 = gang_pod("w-3", 8, "train", 4)
    (node,) = filt(ext2, w3, names)["NodeNames"]
    assert node not in {m.node for m in rp.members}
    assert bind(ext2, w3, node) == ""


def test_inspect_placements_over_http() -> None:
    ext, names = make_ext(dgx_su("su-a", nodes=4))
    filt(ext, members(2, gpus=8)[0], names)
    client = asgi_client(ext)
    body = client.get("/v1/inspect/placements").json()
    plan = body["gangs"]["default/train"]
    assert plan["state"] == "live" and len(plan["slots"]) == 2
    assert plan["details"]["status"] == "optimal"
    assert 0 < plan["expires_in_s"] <= P.gang.plan_ttl_seconds


@pytest.mark.parametrize("policy", ["first-fit", "kueue-bestfit"])
def test_runtime_with_a_baseline_policy(policy: str) -> None:
    n, p = cluster(dgx_su("su-a", nodes=4))
    cache = ClusterCache.from_objects(n, p, P, clock=Clock())
    ext = Extender(cache, gangs=GangRuntime(policy))
    names = [x["metadata"]["name"] for x in n]
    w = members(2, gpus=8)
    node = filt(ext, w[0], names)["NodeNames"][0]
    assert bind(ext, w[0], node) == ""
    assert describe_plans(ext)["default/train"]["policy"] == policy


def test_replanning_from_recovery_then_kube_scheduler_calls() -> None:
    # After a restart, recovery plans gangs with pending members by calling the handler's
    # filter directly (no Extender.filter before it); kube-scheduler's later calls for the
    # same and other members must follow that plan, not break it.
    ext, names = make_ext(dgx_su("su-a", nodes=6))
    ws = members(3, gpus=8)
    from scheduler.core.objects import request_from_pod

    req = request_from_pod(ws[0], P.fabric)
    out = ext.gangs.filter(ext, ws[0], req, names)
    assert out is not None and len(out.feasible) == 1
    plan_id = ext.cache.plans["default/train"].plan_id
    for w in (ws[1], ws[0], ws[2]):
        node = filt(ext, w, names)["NodeNames"][0]
        assert bind(ext, w, node) == ""
    assert describe_plans(ext)["default/train"]["plan"] == plan_id
    assert events(ext) == {"planned": 1.0, "bound": 3.0}


def test_a_gang_name_reused_after_completion_is_planned_not_replanned() -> None:
    ext, names = make_ext(dgx_su("su-r", nodes=4))
    for round_ in range(2):
        ws = members(2, gpus=8)
        for w in ws:
            (node,) = filt(ext, w, names)["NodeNames"]
            assert bind(ext, w, node) == ""
        for w in ws:
            ext.cache.delete_pod(f"default/{w['metadata']['name']}")
        assert events(ext).get("planned") == round_ + 1.0
    assert "replanned" not in events(ext)
