"""Every registered gang policy passes the same conformance tests.

Never double-books a GPU, all or nothing, does not mutate its inputs, deterministic, and
respects the hard constraints (healthy schedulable nodes only, capacity, required level,
NVLink exclusivity). Table-driven scenarios plus a small Hypothesis property over random
real-shaped clusters.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.gang import (
    GangRequest,
    GangRole,
    plan_gangs,
    simple_gang,
    with_reservations,
)
from scheduler.core.model import Health, TopologyConstraint, indices_to_mask
from scheduler.core.params import SchedParams
from scheduler.core.policies.registry import distinct_policies, get_policy, policy_names
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot
from tests.builders import dgx_su, gang_pod, make_node, nvl72_rack, snapshot_of

P = SchedParams()
POLICIES = distinct_policies()


def _scenarios() -> list[tuple[str, list, list, GangRequest]]:
    rack = nvl72_rack("rack-a", used={0: [0, 1], 3: [0, 1, 2, 3]}, degraded=[5])
    rack[7]["status"]["conditions"].append({"type": "GpuXidError", "status": "True"})
    rack2 = nvl72_rack("rack-b", trays=10)
    su = dgx_su("su-a", nodes=12, used={1: [0, 1, 2, 3], 2: list(range(8))}, degraded=[4])
    su2 = dgx_su("su-b", nodes=6, spine="spine-1", unschedulable=False)
    su2[0]["spec"]["unschedulable"] = True
    other = [
        gang_pod(f"o-{i}", 2, "other", 2, node=f"rack-b-t0{i}", gpu_indices=[0, 1])
        for i in range(2)
    ]
    mpi = GangRequest(
        key="ml/mpi",
        roles=(
            GangRole("launcher", 1, 0, cpu_milli=2000, memory_bytes=4 << 30),
            GangRole("worker", 6, 8, cpu_milli=32000),
        ),
        topology=TopologyConstraint(required="leaf"),
    )
    return [
        ("nvl72 required", rack + rack2, [], simple_gang("ml/a", 14, 4, required="nvlink-domain")),
        (
            "nvl72 2-gpu pods",
            rack + rack2,
            other,
            simple_gang("ml/b", 12, 2, required="nvlink-domain"),
        ),
        ("nvl72 too big", rack, [], simple_gang("ml/c", 19, 4, required="nvlink-domain")),
        ("dgx unconstrained", su + su2, [], simple_gang("ml/d", 12, 8)),
        ("dgx half nodes", su + su2, [], simple_gang("ml/e", 9, 4, preferred="leaf")),
        ("dgx required leaf refused", su + su2, [], simple_gang("ml/f", 13, 8, required="leaf")),
        ("dgx one node", su + su2, [], simple_gang("ml/g", 2, 4, required="node")),
        ("mixed launcher", su + su2 + rack, [], mpi),
        ("mixed spine", su + su2 + rack2, [], simple_gang("ml/h", 16, 4, preferred="spine")),
    ]


SCENARIOS = _scenarios()


def _check_placement(snap: ClusterSnapshot, gang: GangRequest, res: PlacementResult) -> None:
    if not res.ok:
        assert res.assignments == ()
        assert res.reason
        return
    # All or nothing: one assignment per member, each member once.
    pods = [a.pod for a in res.assignments]
    assert len(pods) == gang.size == len(set(pods))
    assert sorted(pods) == sorted(p for _, _, p in gang.slots())
    roles = {p: r for _, r, p in gang.slots()}
    taken: dict[str, int] = {}
    for a in res.assignments:
        node = snap.node(a.node)
        assert node is not None
        i = snap.index[a.node]
        # Health: never an unhealthy or cordoned node.
        assert int(snap.arrays.state[i]) < int(Health.UNHEALTHY)
        assert not bool(snap.arrays.unschedulable[i])
        # Capacity: exactly the member's GPU count, free and healthy, never twice.
        assert len(a.gpus) == roles[a.pod].gpus
        mask = indices_to_mask(a.gpus)
        assert mask & ~node.free_mask == 0
        assert mask & taken.get(a.node, 0) == 0
        taken[a.node] = taken.get(a.node, 0) | mask
    # The snapshot accepts every reservation (no double booking).
    with_reservations(snap, gang, res)
    # Required level: one domain.
    req = gang.topology.required
    if req == "node":
        assert len({a.node for a in res.assignments}) == 1
    elif req:
        li = P.fabric.level_index(req)
        doms = {snap.node(a.node).fabric_path[li] for a in res.assignments}
        assert len(doms) == 1
        if None in doms:
            assert len({a.node for a in res.assignments}) == 1


def _fingerprint(snap: ClusterSnapshot) -> tuple:
    a = snap.arrays
    return (
        snap.generation,
        tuple(sorted(snap.pods)),
        tuple(n.used_mask for n in snap.nodes),
        *(getattr(a, f).tobytes() for f in a.__dataclass_fields__),
    )


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(
    ("case", "nodes", "pods", "gang"), SCENARIOS, ids=[s[0] for s in SCENARIOS]
)
def test_policy_conformance(name: str, case: str, nodes, pods, gang: GangRequest) -> None:
    policy = POLICIES[name]
    nodes_copy = copy.deepcopy(nodes)
    snap = snapshot_of(nodes, pods, P)
    before = _fingerprint(snap)
    gang_before = gang.slots()
    res = policy(snap, gang, P)
    # No mutation of the snapshot, the gang (frozen), or the objects it was built from.
    assert _fingerprint(snap) == before
    assert gang.slots() == gang_before
    assert nodes == nodes_copy
    _check_placement(snap, gang, res)
    assert res.details.get("policy") in policy_names()
    # Deterministic.
    again = policy(snap, gang, P)
    assert (
        again.ok == res.ok and again.assignments == res.assignments and again.reason == res.reason
    )


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_refusals_agree_on_impossible_gangs(name: str) -> None:
    snap = snapshot_of(nvl72_rack("rack-a", trays=6), [], P)
    res = POLICIES[name](snap, simple_gang("ml/x", 7, 4, required="nvlink-domain"), P)
    assert not res.ok and "needs 7 nodes with 4 free healthy GPUs" in res.reason


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_nvlink_exclusivity(name: str) -> None:
    other = [
        gang_pod(f"o-{i}", 2, "other", 2, node=f"rack-a-t0{i}", gpu_indices=[0, 1])
        for i in range(2)
    ]
    snap = snapshot_of(nvl72_rack("rack-a", trays=6), other, P)
    res = POLICIES[name](snap, simple_gang("ml/x", 8, 2, required="nvlink-domain"), P)
    assert res.ok
    assert {a.node for a in res.assignments}.isdisjoint({"rack-a-t00", "rack-a-t01"})


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_plan_gangs_never_double_books(name: str) -> None:
    snap = snapshot_of(dgx_su("su-a", nodes=6) + nvl72_rack("rack-a", trays=6), [], P)
    gangs = [
        simple_gang("ml/a", 4, 4),
        simple_gang("ml/b", 3, 8, required="leaf"),
        simple_gang("ml/c", 6, 2, required="nvlink-domain"),
        simple_gang("ml/d", 5, 4),
    ]
    results = plan_gangs(snap, gangs, P, name)
    s = snap
    for g, r in zip(gangs, results, strict=True):
        if r.ok:
            _check_placement(s, g, r)
            s = with_reservations(s, g, r)
    assert snap.generation == 0 and not any(k.startswith("gang-reservation:") for k in snap.pods)


def test_registry_lists_and_rejects() -> None:
    names = policy_names()
    for n in (
        "topoplace",
        "cpsat",
        "first-fit",
        "kai-binpack",
        "kueue-bestfit",
        "kueue-balanced",
        "greedy-topology",
    ):
        assert n in names
    assert get_policy("cpsat") is get_policy("topoplace")
    with pytest.raises(ValueError, match="registered: .*first-fit"):
        get_policy("nope")


# ---- property: random real-shaped clusters ----------------------------------------------

SHAPES = [("h100", 8, "DGX-H100"), ("gb200", 4, "GB200-NVL72"), ("v100", 8, "DGX-1")]


@st.composite
def cluster_and_gang(draw: st.DrawFn):
    nodes = []
    pods = []
    for i in range(draw(st.integers(1, 8))):
        product, gpus, machine = draw(st.sampled_from(SHAPES))
        rack = draw(st.sampled_from(["r0", "r1"]))
        used = draw(st.lists(st.integers(0, gpus - 1), unique=True, max_size=gpus))
        nodes.append(
            make_node(
                f"n{i}",
                gpus,
                product,
                machine=machine,
                clique=f"{rack}uuid.1" if product == "gb200" else None,
                leaf=f"leaf-{draw(st.integers(0, 2))}",
                spine="spine-0",
                ready=draw(st.integers(0, 6)) > 0,
                used=used,
            )
        )
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    count = draw(st.integers(1, 6))
    level = draw(st.sampled_from(["", "", "nvlink-domain", "leaf", "node"]))
    return nodes, pods, simple_gang("ml/p", count, gpus, required=level)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_and_gang())
def test_property_every_policy_is_safe(data) -> None:
    nodes, pods, gang = data
    snap = snapshot_of(nodes, pods, P)
    before = _fingerprint(snap)
    outcomes = {}
    for name, policy in POLICIES.items():
        res = policy(snap, gang, P)
        _check_placement(snap, gang, res)
        outcomes[name] = res.ok
    assert _fingerprint(snap) == before
    # CP-SAT is complete: if any policy places the gang, it does too.
    if any(outcomes.values()):
        assert outcomes["topoplace"], outcomes
    assert np.all(snap.arrays.free >= 0)
