"""CP-SAT gang placement on real-shaped clusters, with hand-checked optimal answers.

Clusters: GB200 NVL72 racks (18 x 4-GPU trays, ``nvidia.com/gpu.clique: <rackUUID>.1``,
one leaf per rack), DGX H100 scalable units (32 x 8-GPU nodes per leaf) and mixes, built
with the keyword builders of ``tests/builders.py``. Each row says what the right answer is
and why.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.gang import GangRequest, GangRole, plan_gangs, simple_gang, with_fixed
from scheduler.core.model import TopologyConstraint
from scheduler.core.params import SchedParams
from scheduler.core.policies.registry import get_policy
from scheduler.core.schedule import Assignment, PlacementResult
from tests.builders import dgx_su, make_node, nvl72_rack, snapshot_of

P = SchedParams()
TOPOPLACE = get_policy("topoplace")


def plan(
    nodes, gang: GangRequest, params: SchedParams = P, pods=(), policy=TOPOPLACE
) -> PlacementResult:
    return policy(snapshot_of(nodes, pods, params), gang, params)


def nodes_of(res: PlacementResult) -> set[str]:
    return {a.node for a in res.assignments}


def prefixes(res: PlacementResult, n: int) -> set[str]:
    return {a.node[:n] for a in res.assignments}


# ---- GB200 NVL72 ------------------------------------------------------------------------


def test_nvl72_fills_the_partly_used_rack_first() -> None:
    # rack-a: 3 trays busy (15 free); rack-b: untouched. 12 trays fit either: rack-a keeps
    # rack-b whole for a gang that needs a full rack.
    nodes = nvl72_rack("rack-a", used={0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1]}) + nvl72_rack(
        "rack-b"
    )
    res = plan(nodes, simple_gang("ml/train", 12, 4, required="nvlink-domain"))
    assert res.ok, res.reason
    assert prefixes(res, 6) == {"rack-a"}
    assert "rack-a-t00" not in nodes_of(res) and "rack-a-t02" not in nodes_of(res)
    d = res.details
    assert d["status"] == "optimal" and d["gap"] == 0
    assert d["domains_used"]["nvlink-domain"] == 1 == d["lower_bound"]["nvlink-domain"]
    assert d["collective_bandwidth_gbps"] == 900.0
    assert all(a.gpus == (0, 1, 2, 3) for a in res.assignments)


def test_nvl72_moves_to_the_whole_rack_when_the_partial_one_is_too_small() -> None:
    nodes = nvl72_rack("rack-a", used={i: [0] for i in range(4)}) + nvl72_rack("rack-b")
    res = plan(nodes, simple_gang("ml/train", 16, 4, required="nvlink-domain"))
    assert res.ok and prefixes(res, 6) == {"rack-b"} and len(nodes_of(res)) == 16


def test_nvl72_refusal_names_the_largest_domain() -> None:
    # 7 busy trays in rack-a (11 free), 9 in rack-b (9 free): 16 trays fit in neither.
    nodes = nvl72_rack("rack-a", used={i: [0, 1, 2, 3] for i in range(7)}) + nvl72_rack(
        "rack-b", used={i: [3] for i in range(9)}
    )
    res = plan(nodes, simple_gang("ml/train", 16, 4, required="nvlink-domain"))
    assert not res.ok and not res.assignments
    assert res.reason == (
        "needs 16 nodes with 4 free healthy GPUs inside one nvlink-domain; "
        "the largest such domain has 11"
    )
    assert res.details["status"] == "infeasible"


def test_nvl72_unhealthy_trays_are_never_used_and_are_reported() -> None:
    rack = nvl72_rack("rack-a")
    for t in (4, 5):
        rack[t]["status"]["conditions"].append({"type": "GpuXidError", "status": "True"})
    res = plan(rack, simple_gang("ml/train", 16, 4, required="nvlink-domain"))
    assert res.ok and {"rack-a-t04", "rack-a-t05"}.isdisjoint(nodes_of(res))
    res = plan(rack, simple_gang("ml/train", 17, 4, required="nvlink-domain"))
    assert not res.ok
    assert res.reason == (
        "needs 17 nodes with 4 free healthy GPUs inside one nvlink-domain; "
        "the whole cluster has room for 16 now (2 nodes unhealthy)"
    )


def test_nvl72_exclusive_to_one_multi_node_nvlink_workload() -> None:
    # Gang "other" holds 2 GPUs on trays t00 and t01 of rack-a: two trays of one NVLink
    # domain, i.e. a multi-node NVLink workload (detected from the snapshot). A new
    # nvlink-domain gang must not share those trays even though 2 GPUs are free there.
    from tests.builders import gang_pod

    other = [
        gang_pod(f"o-{i}", 2, "other", 2, node=f"rack-a-t{i:02d}", gpu_indices=[0, 1])
        for i in range(2)
    ]
    rack = nvl72_rack("rack-a", trays=4)
    g = simple_gang("ml/new", 6, 2, required="nvlink-domain")
    res = plan(rack, g, pods=other)
    assert not res.ok
    assert "2 nodes serve another multi-node NVLink workload" in res.reason
    # Without the NVLink requirement the same GPUs are fine.
    res = plan(rack, simple_gang("ml/new", 6, 2), pods=other)
    assert res.ok
    # A single-tray workload is not multi-node: its tray stays usable (7 x 2 GPUs need it).
    lone = [gang_pod("lone", 2, "lone", 1, node="rack-a-t00", gpu_indices=[0, 1])]
    res = plan(rack, simple_gang("ml/new", 7, 2, required="nvlink-domain"), pods=lone)
    assert res.ok and "rack-a-t00" in nodes_of(res)


def test_nvl72_keeps_a_whole_rack_for_the_gang_that_needs_it() -> None:
    # rack-a is whole; rack-b has 10 free trays. A small unconstrained gang (planned first)
    # goes to rack-b so the full-rack gang still fits; first-fit (name order) blocks it.
    nodes = nvl72_rack("rack-a") + nvl72_rack("rack-b", used={i: [0, 1, 2, 3] for i in range(8)})
    small = replace(simple_gang("ml/small", 8, 4), priority=10)
    big = simple_gang("ml/big", 18, 4, required="nvlink-domain")
    snap = snapshot_of(nodes)
    ours = plan_gangs(snap, [small, big], P, "topoplace")
    assert all(r.ok for r in ours)
    assert prefixes(ours[0], 6) == {"rack-b"} and prefixes(ours[1], 6) == {"rack-a"}
    naive = plan_gangs(snap, [small, big], P, "first-fit")
    assert naive[0].ok and not naive[1].ok


# ---- DGX H100 scalable units ------------------------------------------------------------


def dgx_three_leaves():
    # leaf su-a (spine-0): 30 free nodes; su-b (spine-0): 20 free; su-c (spine-1): untouched.
    return (
        dgx_su("su-a", used={i: list(range(8)) for i in range(2)}, spine="spine-0")
        + dgx_su("su-b", used={i: list(range(8)) for i in range(12)}, spine="spine-0")
        + dgx_su("su-c", spine="spine-1")
    )


def test_dgx_two_leaves_under_one_spine() -> None:
    # 40 nodes need two leaves (exact bound 2); su-a + su-b share spine-0 (1 spine) and are
    # both partly used; su-c would add a spine. Optimal: su-a and su-b only.
    res = plan(dgx_three_leaves(), simple_gang("ml/pretrain", 40, 8))
    assert res.ok
    assert prefixes(res, 4) == {"su-a", "su-b"}
    d = res.details
    assert d["domains_used"]["leaf"] == 2 == d["lower_bound"]["leaf"]
    assert d["domains_used"]["spine"] == 1 == d["lower_bound"]["spine"]
    assert d["status"] == "optimal" and d["at_lower_bound"]
    assert d["collective_bandwidth_gbps"] == 25.0


def test_dgx_one_leaf_when_it_fits() -> None:
    res = plan(dgx_three_leaves(), simple_gang("ml/ft", 20, 8))
    # 20 nodes fit one leaf: su-a (30 free, partly used) or su-b (exactly 20, partly used);
    # su-c (untouched) costs a fresh leaf and spine. Either partly used leaf is optimal.
    assert res.ok and len(prefixes(res, 4)) == 1 and prefixes(res, 4) <= {"su-a", "su-b"}
    assert res.details["collective_bandwidth_gbps"] == 50.0


def test_dgx_required_leaf_refusal() -> None:
    res = plan(dgx_three_leaves(), simple_gang("ml/pretrain", 40, 8, required="leaf"))
    assert not res.ok
    assert res.reason == (
        "needs 40 nodes with 8 free healthy GPUs inside one leaf; the largest such domain has 32"
    )


def test_dgx_prefers_healthy_nodes() -> None:
    # One leaf of 8 nodes, 2 degraded (thermal): 6 members take the 6 healthy nodes; the
    # 7th member must use a degraded one.
    nodes = dgx_su("su-a", nodes=8, degraded=[1, 5])
    res = plan(nodes, simple_gang("ml/ft", 6, 8))
    assert res.ok and {"su-a-n01", "su-a-n05"}.isdisjoint(nodes_of(res))
    res = plan(nodes, simple_gang("ml/ft", 7, 8))
    assert res.ok and len({"su-a-n01", "su-a-n05"} & nodes_of(res)) == 1


def test_dgx_small_pods_fill_holes_before_whole_nodes() -> None:
    # Two nodes with 4 GPUs busy (4 free each) and two whole nodes: two 4-GPU members go to
    # the holes, keeping the whole nodes whole.
    nodes = dgx_su("su-a", nodes=4, used={0: [0, 1, 2, 3], 2: [4, 5, 6, 7]})
    res = plan(nodes, simple_gang("ml/infer", 2, 4))
    assert res.ok and nodes_of(res) == {"su-a-n00", "su-a-n02"}
    got = {a.node: a.gpus for a in res.assignments}
    assert got["su-a-n00"] == (4, 5, 6, 7) and got["su-a-n02"] == (0, 1, 2, 3)


def test_required_node_level() -> None:
    nodes = dgx_su("su-a", nodes=3, used={0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3]})
    res = plan(nodes, simple_gang("ml/tp", 2, 4, required="node"))
    assert not res.ok
    assert res.reason == "needs all 2 pods x 4 GPUs on one node; the best node has room for 1"
    nodes = dgx_su("su-a", nodes=3, used={0: [0, 1, 2, 3]})
    res = plan(nodes, simple_gang("ml/tp", 2, 4, required="node"))
    assert res.ok and len(nodes_of(res)) == 1 and nodes_of(res) != {"su-a-n00"}
    gpus = sorted(g for a in res.assignments for g in a.gpus)
    assert gpus == list(range(8))


@pytest.mark.parametrize("big_first", [True, False], ids=["big leaf first", "big leaf last"])
def test_spare_nodes_left_in_the_chosen_domain(big_first: bool) -> None:
    # Two untouched leaves, 10 and 8 nodes. With 2 spares wanted, 8 members go to the
    # 10-node leaf so that 2 nodes stay free next to them for hot replacement.
    big, small = ("su-a", "su-b") if big_first else ("su-b", "su-a")
    nodes = dgx_su(big, nodes=10) + dgx_su(small, nodes=8, spine="spine-0")
    params = replace(P, gang=replace(P.gang, spare_nodes=2))
    res = plan(nodes, simple_gang("ml/ft", 8, 8, required="leaf"), params)
    assert res.ok and prefixes(res, 4) == {big}
    assert res.details["weights"]["spare"] > 0


@pytest.mark.parametrize("how", ["label", "label reversed", "weight map"])
def test_node_cost(how: str) -> None:
    params = P
    if how == "label":
        cheap = dgx_su("su-a", nodes=4, labels={"topoplace.io/cost": "1"})
        dear = dgx_su("su-b", nodes=4, labels={"topoplace.io/cost": "3"})
    elif how == "label reversed":
        cheap = dgx_su("su-b", nodes=4, labels={"topoplace.io/cost": "1"})
        dear = dgx_su("su-a", nodes=4, labels={"topoplace.io/cost": "3"})
    else:
        cheap = [
            make_node(f"h200-{i}", 8, "h200", leaf="leaf-b", spine="spine-0") for i in range(4)
        ]
        dear = dgx_su("su-b", nodes=4)
        params = replace(
            P,
            gang=replace(
                P.gang, weights={"cost.NVIDIA-H100-80GB-HBM3": 3.0, "cost.NVIDIA-H200": 1.0}
            ),
        )
    res = plan(cheap + dear, simple_gang("ml/ft", 4, 8, required="leaf"), params)
    assert res.ok and {a.node for a in res.assignments} == {n["metadata"]["name"] for n in cheap}


def test_preferred_level_is_soft() -> None:
    nodes = dgx_three_leaves()
    res = plan(nodes, simple_gang("ml/pretrain", 40, 8, preferred="leaf"))
    assert res.ok and prefixes(res, 4) == {"su-a", "su-b"}


def test_launcher_and_workers_share_the_required_domain() -> None:
    gang = GangRequest(
        key="ml/mpi",
        roles=(
            GangRole("launcher", 1, 0, cpu_milli=4000, memory_bytes=8 << 30),
            GangRole("worker", 8, 8, cpu_milli=64000, memory_bytes=512 << 30),
        ),
        topology=TopologyConstraint(required="leaf"),
    )
    nodes = dgx_su("su-a", nodes=6) + dgx_su("su-b", nodes=12, spine="spine-1")
    res = plan(nodes, gang)
    assert res.ok
    assert prefixes(res, 4) == {"su-b"}
    by_pod = {a.pod: a for a in res.assignments}
    assert by_pod["ml/mpi#launcher-0"].gpus == ()
    assert sum(1 for a in res.assignments if len(a.gpus) == 8) == 8


def test_members_already_bound_pin_the_required_domain() -> None:
    # Two members are bound in su-b; the remaining six must join them in su-b even though
    # su-a has more room.
    nodes = dgx_su("su-a", nodes=16) + dgx_su(
        "su-b", nodes=8, used={0: list(range(8)), 1: list(range(8))}
    )
    fixed = [
        Assignment("ml/w-0", "su-b-n00", tuple(range(8))),
        Assignment("ml/w-1", "su-b-n01", tuple(range(8))),
    ]
    gang = with_fixed(simple_gang("ml/train", 6, 8, required="leaf"), fixed)
    res = plan(nodes, gang)
    assert res.ok and prefixes(res, 4) == {"su-b"}
    assert res.details["domains_used"]["leaf"] == 1


def test_mixed_cluster_uses_the_right_hardware() -> None:
    # 8-GPU members cannot use 4-GPU trays; 4-GPU members requiring an NVLink domain cannot
    # use DGX nodes for more than one member each.
    nodes = nvl72_rack("rack-a", trays=8) + dgx_su("su-a", nodes=4)
    res = plan(nodes, simple_gang("ml/a", 4, 8))
    assert res.ok and prefixes(res, 4) == {"su-a"}
    res = plan(nodes, simple_gang("ml/b", 8, 4, required="nvlink-domain"))
    assert res.ok and prefixes(res, 6) == {"rack-a"}
    res = plan(nodes, simple_gang("ml/c", 2, 4, required="nvlink-domain"))
    # Two members fit one NVL72 domain, or one DGX node (its own NVLink domain).
    assert res.ok and res.details["domains_used"]["nvlink-domain"] == 1


def test_solver_record() -> None:
    res = plan(dgx_three_leaves(), simple_gang("ml/ft", 20, 8))
    d = res.details
    for key in (
        "status",
        "objective",
        "bound",
        "gap",
        "solve_time_ms",
        "domains_used",
        "lower_bound",
        "collective_bandwidth_gbps",
        "weights",
        "solver",
    ):
        assert key in d, key
    assert d["solver"]["seed"] == P.gang.seed and d["solver"]["workers"] == P.gang.workers
    assert d["weights"]["compactness"] > 0
