"""Snapshot building, transitions and the cache state machine, on real-shaped objects."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from benchmarks.clusters import make_node, make_pod
from scheduler.core.model import NodeInfo, PodInfo, PodRequest
from scheduler.core.objects import ObjectError, placement_of, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.schedule import (
    REASON_LINK_NEVER,
    REASON_LINK_NOW,
    REASON_NOT_ENOUGH_FREE,
    REASON_TOO_FEW_HEALTHY,
    filter_nodes,
    place_pod,
    score_nodes,
)
from scheduler.core.snapshot import (
    ClusterSnapshot,
    DoubleBookingError,
    build_snapshot,
    with_pod,
    without_pod,
)
from scheduler.runtime.cache import ClusterCache

P = SchedParams()


class ManualClock:
    """A clock the test advances by hand (stands in for time.monotonic)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("text", "milli", "base"),
    [
        ("500m", 500, 1),
        ("48", 48000, 48),
        ("1.5", 1500, 2),
        ("512Gi", 512 * 2**30 * 1000, 512 * 2**30),
        ("1e3", 10**6, 1000),
        ("2k", 2 * 10**6, 2000),
    ],
    ids=[
        "millicores",
        "cores",
        "fractional cores rounded up",
        "binary suffix",
        "exponent",
        "decimal suffix",
    ],
)
def test_quantities(text: str, milli: int, base: int) -> None:
    assert cpu_milli(text) == milli
    assert quantity_int(text) == base


def test_quantity_garbage_defaults() -> None:
    assert quantity_int("lots", 7) == 7 and cpu_milli(None, 3) == 3


def test_bound_pods_hold_their_recorded_gpus_and_others_are_inferred() -> None:
    nodes = [make_node("h1", 8, "h100", machine="DGX-H100")]
    pods = [
        make_pod("known", 2, node="h1", gpu_indices=[0, 5]),
        make_pod("unknown", 3, node="h1"),  # bound by another scheduler, no record
        make_pod("done", 8, node="h1", phase="Succeeded"),
        make_pod("pending", 8),
    ]
    snap = build_snapshot(nodes, pods, P)
    assert snap.pods["default/known"].gpus == (0, 5)
    assert snap.pods["default/known"].gpu_indices_known
    inferred = snap.pods["default/unknown"]
    assert inferred.gpus == (1, 2, 3) and not inferred.gpu_indices_known
    assert set(snap.pods) == {"default/known", "default/unknown"}
    node = snap.node("h1")
    assert node is not None and node.free_gpus == 3 and node.free_mask == 0b11010000
    assert int(snap.arrays.free[0]) == 3


def test_conflicting_records_are_reinferred_not_double_booked() -> None:
    nodes = [make_node("h1", 8, "h100")]
    pods = [
        make_pod("a", 2, node="h1", gpu_indices=[0, 1]),
        make_pod("b", 2, node="h1", gpu_indices=[1, 2]),
    ]
    snap = build_snapshot(nodes, pods, P)
    a, b = snap.pods["default/a"].gpus, snap.pods["default/b"].gpus
    assert a == (0, 1) and not set(a) & set(b) and len(b) == 2


def test_transitions_do_not_mutate_and_refuse_double_booking() -> None:
    snap = build_snapshot([make_node("h1", 8, "h100")], [], P)
    free_before = snap.arrays.free.copy()
    s2 = with_pod(snap, PodInfo("ns/a", "u", "h1", (0, 1)))
    assert snap.node("h1").used_mask == 0 and np.array_equal(snap.arrays.free, free_before)
    assert s2.node("h1").used_mask == 0b11 and int(s2.arrays.free[0]) == 6
    with pytest.raises(DoubleBookingError):
        with_pod(s2, PodInfo("ns/b", "u2", "h1", (1, 2)))
    with pytest.raises(DoubleBookingError):
        with_pod(s2, PodInfo("ns/c", "u3", "h1", (9,)))
    s3 = without_pod(s2, "ns/a")
    assert s3.node("h1").used_mask == 0 and without_pod(s3, "ns/a") is s3
    with pytest.raises(ValueError):
        snap.arrays.free[0] = 1  # arrays are read-only


def test_cache_assume_forget_confirm_expire() -> None:
    clock = ManualClock()
    cache = ClusterCache.from_objects([make_node("h1", 8, "h100")], [], P, clock=clock)
    cache.assume(PodInfo("ns/a", "u", "h1", (0, 1)), ttl=30)
    cache.assume(PodInfo("ns/b", "u", "h1", (2,)))
    assert cache.snapshot().node("h1").free_gpus == 5
    assert cache.expire() == []
    clock.t += 31
    assert cache.expire() == ["ns/a"]
    assert cache.snapshot().node("h1").free_gpus == 7
    assert cache.confirm("ns/b") and not cache.snapshot().pods["ns/b"].assumed
    assert cache.forget("ns/b") is False  # bound pods are not forgotten
    assert cache.forget("ns/zzz") is False  # idempotent on unknown keys
    cache.delete_pod("ns/b")
    assert cache.snapshot().node("h1").free_gpus == 8


def test_cache_follows_api_events() -> None:
    node = make_node("h1", 8, "h100")
    cache = ClusterCache.from_objects([node], [], P)
    pod = make_pod("w", 4, node="h1", gpu_indices=[4, 5, 6, 7])
    cache.upsert_pod(pod)
    assert cache.snapshot().pods["default/w"].gpus == (4, 5, 6, 7)
    done = copy.deepcopy(pod)
    done["status"]["phase"] = "Succeeded"
    cache.upsert_pod(done)
    assert "default/w" not in cache.snapshot().pods
    sick = copy.deepcopy(node)
    sick["status"]["conditions"][0]["status"] = "False"
    cache.upsert_node(sick)
    assert cache.snapshot().node("h1").health.reasons == ("node not ready",)
    cache.upsert_node(make_node("h2", 4, "gb200"))
    assert cache.snapshot().names == ("h1", "h2")
    cache.delete_node("h1")
    assert cache.snapshot().names == ("h2",)


def test_filter_reasons_table() -> None:
    nodes = [
        make_node("v100-free", 8, "v100", machine="DGX-1"),
        make_node("v100-busy", 8, "v100", machine="DGX-1"),
        make_node("gb200", 4, "gb200"),
        make_node("pcie-unknown", 8, "l40s"),
        make_node("sick", 8, "h100", conditions=[{"type": "GpuXidError", "status": "True"}]),
    ]
    pods = [make_pod("busy", 6, node="v100-busy", gpu_indices=[0, 1, 2, 3, 4, 5])]
    snap = build_snapshot(nodes, pods, P)

    def req(gpus: int, link: str = "") -> PodRequest:
        return PodRequest(key="ns/p", gpus=gpus, min_link=link)

    out = filter_nodes(snap, req(8), None, P)
    assert set(out.feasible) == {"v100-free", "pcie-unknown"}
    assert out.failed == {"v100-busy": REASON_NOT_ENOUGH_FREE}
    assert out.unresolvable["gb200"] == REASON_TOO_FEW_HEALTHY
    assert out.unresolvable["sick"] == "GPU fault condition"
    # An NVLink ring over 8 GPUs exists on a DGX-1 (hybrid cube-mesh), never on a node
    # whose topology is unknown.
    out = filter_nodes(snap, req(8, "nvlink"), None, P)
    assert out.feasible == ("v100-free",)
    assert out.unresolvable["pcie-unknown"] == REASON_LINK_NEVER
    # 2 free GPUs on v100-busy: indices 6 and 7 are NVLinked on a DGX-1 V100.
    out = filter_nodes(snap, req(2, "nvlink"), ["v100-busy"], P)
    assert out.feasible == ("v100-busy",)
    busy2 = build_snapshot(
        nodes, [make_pod("busy", 6, node="v100-busy", gpu_indices=[0, 1, 2, 3, 5, 7])], P
    )
    out = filter_nodes(busy2, req(2, "nvlink"), ["v100-busy"], P)
    # Free GPUs 4 and 6: on the DGX-1 V100 cube-mesh 4-6 are NVLinked (NV1), so feasible.
    assert out.feasible == ("v100-busy",)
    busy3 = build_snapshot(
        nodes, [make_pod("busy", 6, node="v100-busy", gpu_indices=[1, 2, 3, 4, 5, 6])], P
    )
    # Free GPUs 0 and 7: no NVLink between them on a DGX-1 -> not now.
    out = filter_nodes(busy3, req(2, "nvlink"), ["v100-busy"], P)
    assert out.failed == {"v100-busy": REASON_LINK_NOW}


def test_scores_prefer_better_links_then_exact_fit() -> None:
    nodes = [
        make_node("a-h100", 8, "h100", machine="DGX-H100"),
        make_node("b-pcie", 8, "l40s", topology="pcie-8gpu-2socket"),
    ]
    snap = build_snapshot(nodes, [], P)
    scores = dict(score_nodes(snap, PodRequest(key="x/y", gpus=4), None, P))
    assert scores["a-h100"] > scores["b-pcie"]
    assert all(0 <= s <= 10 for s in scores.values())
    result = place_pod(snap, PodRequest(key="x/y", gpus=4), P)
    assert result.ok and result.assignments[0].node == "a-h100"
    assert len(result.assignments[0].gpus) == 4


def test_request_parsing_reads_gangs_and_rejects_bad_annotations() -> None:
    pod = make_pod(
        "w-0",
        8,
        namespace="ml",
        labels={"scheduling.x-k8s.io/pod-group": "llama"},
        annotations={
            "kueue.x-k8s.io/podset-required-topology": "network.topology.nvidia.com/leaf",
            "topoplace.io/gang-size": "16",
        },
    )
    r = request_from_pod(pod, P.fabric)
    assert (r.gang, r.gang_size, r.gpus, r.topology.required) == ("ml/llama", 16, 8, "leaf")
    bad = make_pod(
        "w-1", 8, annotations={"topoplace.io/gang": "g", "topoplace.io/topology-required": "galaxy"}
    )
    with pytest.raises(ObjectError, match="unknown topology level"):
        request_from_pod(bad, P.fabric)
    init = make_pod("i", 2)
    init["spec"]["initContainers"] = [
        {"name": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
    ]
    assert request_from_pod(init, P.fabric).gpus == 4


def test_placement_record_validation() -> None:
    pod = make_pod("p", 2, node="n", gpu_indices=[1, 0])
    assert placement_of(pod)["gpus"] == [0, 1]
    pod["metadata"]["annotations"]["topoplace.io/placement"] = '{"v": 99, "gpus": [0]}'
    assert placement_of(pod) is None
    pod["metadata"]["annotations"]["topoplace.io/placement"] = "not json"
    assert placement_of(pod) is None


def test_params_reject_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown policy sections"):
        SchedParams.from_config({"scoring": {}, "turbo": True})
    with pytest.raises(ValueError, match="unknown scoring weights"):
        SchedParams.from_config({"scoring": {"weights": {"speed": 1}}})
    p = SchedParams.from_config(
        {"scoring": {"weights": {"topology": 1, "health": 0, "packing": 0}}}
    )
    assert p.weights.topology == 1.0


def test_shipped_policy_loads() -> None:
    from scheduler.cli.clusterfile import load_policy

    p = SchedParams.from_config(load_policy(None))
    assert p.selection_policy == "nvidia-best-effort" and p.gang.seed == 7


def test_name_positions_memo_never_returns_stale_positions() -> None:
    nodes = [make_node(f"n{i}", 8, "h100") for i in range(4)]
    snap = build_snapshot(nodes, [make_pod("x", 8, node="n1", gpu_indices=range(8))], P)
    req = PodRequest(key="a/b", gpus=8)
    names = ["n0", "n1", "n2", "n3"]
    assert filter_nodes(snap, req, names, P).feasible == ("n0", "n2", "n3")
    names[0] = "ghost"  # the caller mutates its list after the call
    out = filter_nodes(snap, req, names, P)
    assert out.feasible == ("n2", "n3") and out.failed["ghost"] == "node unknown to topoplace"
    # Same names, a snapshot with one node fewer: positions are recomputed.
    smaller = build_snapshot(nodes[1:], [], P)
    out = filter_nodes(smaller, req, ["n1", "n2", "n3"], P)
    assert out.feasible == ("n1", "n2", "n3")
    out = filter_nodes(smaller, req, ["n0", "n1", "n2", "n3"], P)
    assert out.failed == {"n0": "node unknown to topoplace"}


def test_transitions_match_a_fresh_build_and_share_unchanged_arrays() -> None:
    """Placing and removing pods updates the node arrays row by row (arrays whose rows
    keep their bytes are shared, and a row set back gives back the earlier arrays), a pod
    removed right after it was added gives back the snapshot it was added to (a new
    generation), and the same pod added again reuses the nodes and arrays; after every
    step nodes, pods and arrays equal those built from scratch."""
    from benchmarks.clusters import synthetic_cluster
    from scheduler.core.snapshot import _arrays

    objs = synthetic_cluster(60, seed=3)["items"]
    snap = build_snapshot(
        [o for o in objs if o["kind"] == "Node"], [o for o in objs if o["kind"] == "Pod"], P
    )
    names = snap.names
    steps = []

    def check(s, generation: int) -> None:
        fresh = _arrays(s.nodes, s.policy)
        for f in fresh.__dataclass_fields__:
            a, b = getattr(s.arrays, f), getattr(fresh, f)
            assert a.dtype == b.dtype and np.array_equal(a, b), f
            assert not a.flags.writeable
        for node in s.nodes:  # usage = what the pods on it hold
            held = [p for p in s.pods.values() if p.node == node.name]
            mask = 0
            for p in held:
                mask |= sum(1 << g for g in p.gpus)
            assert node.used_mask == mask, node.name
            assert node.cpu_used_milli == sum(p.cpu_milli for p in held)
        assert s.generation == generation

    for i in range(40):
        node = snap.nodes[(7 * i) % len(names)]
        free = [g for g in range(node.gpu_capacity) if not (node.used_mask >> g) & 1]
        key = f"t/p{i % 5}"
        g = snap.generation
        if key in snap.pods:
            snap = without_pod(snap, key)
            check(snap, g + 1)
        elif free:
            pod = PodInfo(key, "", node.name, tuple(free[:2]), cpu_milli=1000, memory_bytes=2**30)
            before = snap
            snap = with_pod(snap, pod)
            check(snap, g + 1)
            again = without_pod(snap, key)  # removed at once: what it was added to
            assert again.nodes is before.nodes and again.arrays is before.arrays
            assert dict(again.pods) == dict(before.pods) and list(again.pods) == list(before.pods)
            check(again, g + 2)
            back = with_pod(again, pod)  # the same usage again: the same nodes and arrays
            assert back.arrays is snap.arrays and back.nodes is snap.nodes
            check(back, g + 3)
            one = with_pod(again, PodInfo(key, "", node.name, tuple(free[:1])))
            assert int(one.arrays.free[snap.index[node.name]]) == len(free) - 1  # not memoized
            check(one, g + 3)
            other = with_pod(snap, PodInfo("t/other", "", node.name, (), cpu_milli=500))
            assert without_pod(other, key).node(node.name).cpu_used_milli == 500 + (
                before.node(node.name).cpu_used_milli
            )  # another snapshot: computed, not recalled
        steps.append(snap.arrays)
    shared = [a.capacity is b.capacity for a, b in zip(steps, steps[1:], strict=False)]
    assert all(shared)  # a pod never changes a node's capacity: never copied
    assert any(a.free is not b.free for a, b in zip(steps, steps[1:], strict=False))


def test_a_memoized_placement_needs_the_very_same_nodes() -> None:
    """Pods holding only CPU leave the node arrays' bytes as they were, so two snapshots
    with different CPU use can share one arrays object; adding a pod to either still
    counts that snapshot's own CPU use."""
    from benchmarks.clusters import synthetic_cluster

    objs = synthetic_cluster(20, seed=4)["items"]
    base = build_snapshot([o for o in objs if o["kind"] == "Node"], [], P)
    node = base.nodes[0].name
    gpu_pod = PodInfo("t/gpu", "", node, (0,), cpu_milli=100)
    first = with_pod(base, gpu_pod)
    s1 = with_pod(base, PodInfo("t/a", "", node, (), cpu_milli=500))
    s2 = with_pod(s1, PodInfo("t/b", "", node, (), cpu_milli=700))
    assert s2.node(node).cpu_used_milli == 1200
    second = with_pod(s2, gpu_pod)
    assert first.node(node).cpu_used_milli == 100
    assert second.node(node).cpu_used_milli == 1300
    assert np.array_equal(first.arrays.free, second.arrays.free)


def test_row_bytes_are_what_numpy_stores_whatever_packer_was_memoized() -> None:
    """Transitions compare a node's new array row with the stored one as bytes, packed
    with ``struct`` by a packer memoized per (dtype, row shape) (``snapshot._as_stored``).
    The bytes must be exactly numpy's for every array and row of a real snapshot, and for
    arrays that share a row shape but not a dtype (or a dtype but not a row shape) in any
    order: a memo keyed on less would pack one with the other's layout."""
    from scheduler.core import snapshot

    nodes = [
        make_node("a-0", 8, "h100", machine="DGX-H100"),
        make_node("b-0", 4, "a100", unschedulable=True),
        make_node("c-0", 8, "v100", machine="DGX-1", ready=False),
    ]
    snap = build_snapshot(nodes, [make_pod("p", 2, node="a-0", gpu_indices=[0, 1])], P)
    columns = [getattr(snap.arrays, f) for f in snapshot._ARRAY_FIELDS]
    width = snap.arrays.max_gpus
    for i, node in enumerate(snap.nodes):
        row = snapshot._row(node, snap.policy, width)
        for a, v in zip(columns, row, strict=True):
            assert snapshot._as_stored(a, v) == np.asarray(v, dtype=a.dtype).tobytes()
            assert snapshot._as_stored(a, v) == a[i].tobytes()  # the row as stored
    values = [3, 1, 0, 7, 2, 5]
    layouts = [
        np.zeros((2, 6), np.int64),
        np.zeros((2, 6), np.int32),
        np.zeros((2, 6), np.float64),
        np.zeros((2, 3), np.int64),
        np.zeros((2, 6), np.int8),
        np.zeros((2, 6), np.bool_),
    ]
    for order in (layouts, layouts[::-1]):
        snapshot._PACKERS.clear()
        for a in order:
            v = values[: a.shape[1]]
            assert snapshot._as_stored(a, v) == np.asarray(v, dtype=a.dtype).tobytes()
    for a, v in ((np.zeros(2, np.int32), 7), (np.zeros(2, np.float64), 0.3)):
        assert snapshot._as_stored(a, v) == np.asarray(v, dtype=a.dtype).tobytes()
    # Values struct does not pack as they are (a float in an int column, a short row) go
    # through numpy.
    assert snapshot._as_stored(np.zeros(2, np.int32), 7.0) == np.int32(7).tobytes()
    short = np.zeros((2, 6), np.int64)
    assert snapshot._as_stored(short, [1, 2]) == np.asarray([1, 2], np.int64).tobytes()


def test_a_node_with_new_usage_is_the_node_replace_gives() -> None:
    """``snapshot._with_usage`` rebuilds a NodeInfo from its fields with new usage; every
    other field (the raw object too) must be the node's own, as ``dataclasses.replace``
    keeps them."""
    import dataclasses

    from scheduler.core import snapshot

    snap = build_snapshot(
        [make_node("a-0", 8, "h100", machine="DGX-H100", unschedulable=True)],
        [make_pod("p", 2, node="a-0", gpu_indices=[0, 1], cpu="3")],
        P,
    )
    node = snap.nodes[0]
    got = snapshot._with_usage(node, 0b1100, 7, 9, ((1, 2, 3),), 4)
    want = dataclasses.replace(
        node,
        used_mask=0b1100,
        cpu_used_milli=7,
        memory_used_bytes=9,
        share_used=((1, 2, 3),),
        replicas_used=4,
    )
    assert got == want
    for f in dataclasses.fields(node):
        assert getattr(got, f.name) is getattr(want, f.name) or f.name in (
            "used_mask",
            "cpu_used_milli",
            "memory_used_bytes",
        ), f.name
    assert got.raw is node.raw and got.labels is node.labels


# ---- a node remodeled over the usage the snapshot holds (the health refresh) ---------------


def _usage_snapshot() -> tuple[ClusterSnapshot, SchedParams]:
    """A whole-GPU node, a HAMi node and a time-slicing node, each holding bound pods."""
    from benchmarks.clusters import replica_node
    from tests.sharing.builders import hami_node, share_pod

    params = SchedParams()
    nodes = [
        make_node("dgx-0", 8, "h100"),
        hami_node("hami-0", gpus=4),
        replica_node("ts-0", gpus=2, replicas=4),
    ]
    pods = [
        make_pod("whole", 2, node="dgx-0", gpu_indices=[0, 1]),
        share_pod("share", node="hami-0"),
        make_pod(
            "rep",
            1,
            node="ts-0",
            node_selector={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
        ),
    ]
    return build_snapshot(nodes, pods, params), params


def test_holds_usage_of_is_the_equality_of_the_node_it_would_build() -> None:
    """``holds_usage_of(held, base, h)`` answers ``replace(with_usage_of(base, held),
    health=h) == held`` without building that node, for every model field changed, a
    different verdict, and usage the base cannot carry (GPUs beyond its count, an empty
    share ledger, replicas on a node without them)."""
    from dataclasses import fields, replace

    from scheduler.core.model import Health, NodeHealth
    from scheduler.core.snapshot import _MODEL_FIELDS, holds_usage_of, modeled_node, with_usage_of

    snap, params = _usage_snapshot()
    held_by = {n.name: n for n in snap.nodes}
    assert held_by["dgx-0"].used_mask == 0b11
    assert held_by["hami-0"].share_used and held_by["ts-0"].replicas_used == 1
    other_health = NodeHealth(Health.DEGRADED, reasons=("test",))
    changes = {
        "name": "x",
        "labels": {"a": "b"},
        "annotations": {"a": "b"},
        "shape_source": "zzz",
        "gpu_capacity": 1,
        "gpu_allocatable": 1,
        "fabric_path": ("elsewhere",),
        "cpu_milli": 1,
        "memory_bytes": 1,
        "unmodeled": "why",
        "devices": (),
        "sharing": "gpushare",
        "replicas": 0,
        "replica_gpus": 99,
        "replica_capacity": 99,
        "replica_strategy": "mps",
    }
    # every compared field but usage and health is a model field, and each is changed here
    assert set(_MODEL_FIELDS) == {
        f.name
        for f in fields(NodeInfo)
        if f.compare
        and f.name
        not in {
            "used_mask",
            "cpu_used_milli",
            "memory_used_bytes",
            "share_used",
            "replicas_used",
            "health",
        }
    }
    assert set(_MODEL_FIELDS) - {"shape"} == set(changes)
    checked = 0
    for held in snap.nodes:
        base = modeled_node(held.raw, params, None, {})
        shapes = [n.shape for n in snap.nodes if n.shape != base.shape]
        assert shapes  # another hardware shape: the model field ``shape`` changed
        bases = [base, replace(base, shape=shapes[0])] + [
            replace(base, **{k: v}) for k, v in changes.items()
        ]
        helds = [
            held,
            replace(held, used_mask=held.used_mask | (1 << 40)),
            replace(held, share_used=((0, 0, 0),) * held.gpu_capacity),
            replace(held, replicas_used=3),
        ]
        for b in bases:
            for h in helds:
                for verdict in (h.health, other_health):
                    built = replace(with_usage_of(b, h), health=verdict)
                    assert holds_usage_of(h, b, verdict) == (built == h), (held.name, b, h)
                    checked += built == h
    assert checked >= 3  # each node as the snapshot holds it is recognised
