"""The chaos runner's invariant checker (benchmarks/live/invariants.py) on real-shaped
objects: each invariant with a snapshot that breaks it and a clean one.

Nodes and pods come from the project's builders (``benchmarks.clusters``); the DRA cases
use the objects recorded from a v1.36.2 plane (``tests/fixtures/kube/dra-1.36``); HAMi
annotations are written by the project's own ``hami_annotations``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.clusters import hami_node, hami_pod, make_node, make_pod
from benchmarks.live.invariants import (
    DRA_HELD_TWICE,
    GANG_PARTLY_BOUND,
    GPU_HELD_TWICE,
    HAMI_OVER_CAPACITY,
    NO_RECORD,
    RECORD_DISAGREES,
    ApiState,
    check,
    counts,
    ledger_diff,
    rebuilt_ledger,
    topoplace_ledger,
)
from scheduler.core.fractional import GpuShare, hami_annotations, whole_hami_containers
from scheduler.core.objects import PlanRecord, placement_value
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot

DRA = Path(__file__).resolve().parents[1] / "fixtures" / "kube" / "dra-1.36"
NOW = 1_800_000_000.0


def _items(name: str) -> list[dict[str, Any]]:
    return json.loads((DRA / name).read_text())["items"]


def kinds(state: ApiState) -> dict[str, int]:
    return {k: n for k, n in counts(check(state)).items() if n}


def whole(name: str, node: str, gpus: list[int], **kw: Any) -> dict[str, Any]:
    return make_pod(name, len(gpus), node=node, gpu_indices=gpus, **kw)


# ---- whole GPUs ---------------------------------------------------------------------------


def test_two_records_on_one_gpu_is_a_violation() -> None:
    nodes = (make_node("n0"),)
    state = ApiState(nodes, (whole("a", "n0", [0, 1]), whole("b", "n0", [1, 2])), at=NOW)
    got = check(state)
    assert [(v.kind, v.subject) for v in got] == [(GPU_HELD_TWICE, "n0/gpu-1")]
    assert "default/a" in got[0].detail and "default/b" in got[0].detail


def test_disjoint_records_and_a_finished_pod_are_clean() -> None:
    nodes = (make_node("n0"),)
    done = whole("done", "n0", [0, 1], phase="Succeeded")  # holds nothing any more
    state = ApiState(nodes, (whole("a", "n0", [0, 1]), whole("b", "n0", [2, 3]), done), at=NOW)
    assert check(state) == []


# ---- records ------------------------------------------------------------------------------


def test_bound_pod_of_the_profile_without_record() -> None:
    nodes = (make_node("n0"),)
    bare = make_pod("bare", 2, node="n0")  # bound, topoplace's profile, no record
    got = check(ApiState(nodes, (bare,), at=NOW))
    assert [(v.kind, v.subject) for v in got] == [(NO_RECORD, "default/bare")]


def test_other_profiles_and_pending_pods_need_no_record() -> None:
    nodes = (make_node("n0"),)
    other = make_pod("other", 2, node="n0", scheduler_name="default-scheduler")
    pending = make_pod("pending", 2)
    assert check(ApiState(nodes, (other, pending, whole("ok", "n0", [4, 5])), at=NOW)) == []


def test_record_naming_another_node_or_count() -> None:
    nodes = (make_node("n0"), make_node("n1"))
    moved = make_pod("moved", 1, node="n1")
    moved["metadata"]["annotations"]["topoplace.io/placement"] = placement_value("n0", (3,))
    short = make_pod("short", 4, node="n0", gpu_indices=[0, 1])
    got = {(v.kind, v.subject) for v in check(ApiState(nodes, (moved, short), at=NOW))}
    assert got == {(RECORD_DISAGREES, "default/moved"), (RECORD_DISAGREES, "default/short")}


def test_records_on_a_node_with_odd_labels_for_now_are_not_out_of_range() -> None:
    """A node whose GPU Feature Discovery labels turned odd (the chaos runner's node-labels
    fault) is one the project cannot model for a while; the pods bound there still hold
    their GPUs. Their records are not 'GPUs the node does not have'; two records on one GPU
    there still are a violation."""
    odd = make_node("n0")
    odd["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "abc"
    snap = build_snapshot((odd,), (), SchedParams())
    assert snap.nodes[0].unmodeled and snap.nodes[0].gpu_capacity == 0
    pods = (whole("a", "n0", [0, 1, 2, 3]), whole("b", "n0", [4, 5, 6, 7]))
    assert kinds(ApiState((odd,), pods, at=NOW)) == {}
    clash = (whole("a", "n0", [0, 1, 2, 3]), whole("b", "n0", [3, 4]))
    assert kinds(ApiState((odd,), clash, at=NOW)) == {GPU_HELD_TWICE: 1}


# ---- HAMi ---------------------------------------------------------------------------------


def _hami_state(mems: list[int]) -> ApiState:
    """Share pods on GPU 0 of an 80 GiB H100 HAMi node, annotated as topoplace's share
    bind writes them."""
    node = hami_node("h0", gpus=2)
    info = build_snapshot([node], [], SchedParams()).nodes[0]
    pods = []
    for i, mem in enumerate(mems):
        p = hami_pod(f"s{i}", mem, 30, node="h0")
        p["metadata"]["annotations"].update(hami_annotations(info, [[GpuShare(0, mem, 300)]], 1))
        pods.append(p)
    return ApiState((node,), tuple(pods), at=NOW)


def test_hami_memory_over_the_device() -> None:
    got = check(_hami_state([40000, 40000, 10000]))  # 90000 MiB > 81559 MiB
    assert [(v.kind, v.subject) for v in got] == [(HAMI_OVER_CAPACITY, "h0/gpu-0")]
    assert "90000/" in got[0].detail


def test_hami_shares_within_the_device() -> None:
    assert check(_hami_state([40000, 40000])) == []


def test_whole_gpu_on_hami_node_told_other_devices() -> None:
    """A whole-GPU pod's record says GPUs 0,1; the HAMi hand-off names GPU 1 only."""
    node = hami_node("h0", gpus=4)
    info = build_snapshot([node], [], SchedParams()).nodes[0]
    good = whole("good", "h0", [2, 3])
    good["metadata"]["annotations"].update(
        hami_annotations(info, whole_hami_containers(info, good, [2, 3]), 1)
    )
    bad = whole("bad", "h0", [0, 1])
    bad["metadata"]["annotations"].update(
        hami_annotations(info, whole_hami_containers(info, bad, [1]), 1)
    )
    got = check(ApiState((node,), (good, bad), at=NOW))
    assert [(v.kind, v.subject) for v in got] == [(RECORD_DISAGREES, "default/bad")]
    assert check(ApiState((node,), (good,), at=NOW)) == []


def test_whole_gpu_and_share_on_one_hami_device() -> None:
    node = hami_node("h0", gpus=2)
    info = build_snapshot([node], [], SchedParams()).nodes[0]
    w = whole("w", "h0", [0])
    w["metadata"]["annotations"].update(
        hami_annotations(info, whole_hami_containers(info, w, [0]), 1)
    )
    s = hami_pod("s", 10000, 20, node="h0")
    s["metadata"]["annotations"].update(hami_annotations(info, [[GpuShare(0, 10000, 200)]], 1))
    got = check(ApiState((node,), (w, s), at=NOW))
    assert [(v.kind, v.subject) for v in got] == [(HAMI_OVER_CAPACITY, "h0/gpu-0")]


# ---- DRA ----------------------------------------------------------------------------------


def _dra_state(claims: list[dict[str, Any]]) -> ApiState:
    return ApiState(
        tuple(_items("nodes.json")),
        tuple(_items("pods.json")),
        tuple(claims),
        tuple(_items("resourceslices.v1.json")),
        at=NOW,
    )


def test_recorded_dra_plane_is_clean() -> None:
    """Claims allocated by the real kube-scheduler (and topoplace's gate allocator), as
    recorded: no device twice, no GPU twice."""
    assert kinds(_dra_state(_items("resourceclaims.v1.json"))) == {}


def test_a_device_in_two_claims() -> None:
    claims = _items("resourceclaims.v1.json")
    twin = copy.deepcopy(next(c for c in claims if c["metadata"]["name"] == "two-gpus"))
    twin["metadata"]["name"] = "two-gpus-twin"
    twin["status"]["reservedFor"][0]["name"] = "twin-pod"
    got = kinds(_dra_state([*claims, twin]))
    assert got == {DRA_HELD_TWICE: 2, GPU_HELD_TWICE: 2}


def _twin_state(gated: bool, reserved: bool) -> ApiState:
    """The recorded plane plus claim ``twin`` allocated the devices of ``two-gpus`` (held by
    its bound pod) for a pending pod ``twin-pod``, gated or not, reserved for it or not."""
    from benchmarks.clusters import claim_pod

    claims = _items("resourceclaims.v1.json")
    twin = copy.deepcopy(next(c for c in claims if c["metadata"]["name"] == "two-gpus"))
    twin["metadata"]["name"] = "twin"
    if reserved:
        twin["status"]["reservedFor"][0]["name"] = "twin-pod"
    else:
        del twin["status"]["reservedFor"]
    pod = claim_pod("twin-pod", "twin", namespace=twin["metadata"]["namespace"])
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": "topoplace.io/allocate"}]
    return ApiState(
        tuple(_items("nodes.json")),
        (*_items("pods.json"), pod),
        (*claims, twin),
        tuple(_items("resourceslices.v1.json")),
        at=NOW,
    )


def test_provisional_gated_allocation_clashing_is_not_a_violation_until_ungated() -> None:
    """topoplace's allocation for a still-gated pod, reserved for nobody, that clashes with
    kube-scheduler's (it gives it back before lifting the gate) holds nothing; the same
    clash once the gate is gone, or with the claim reserved, is a violation."""
    assert kinds(_twin_state(gated=True, reserved=False)) == {}
    assert kinds(_twin_state(gated=False, reserved=False)) == {DRA_HELD_TWICE: 2, GPU_HELD_TWICE: 2}
    assert kinds(_twin_state(gated=True, reserved=True)) == {DRA_HELD_TWICE: 2, GPU_HELD_TWICE: 2}


def test_claim_and_record_disagree() -> None:
    """The gated nvidia.com/gpu path: the pod's record says GPUs 0..3, its claim holds 4..7."""
    claims = _items("resourceclaims.v1.json")
    pods = _items("pods.json")
    gated = next(p for p in pods if p["metadata"]["name"] == "gated-four-pod")
    gated["metadata"].setdefault("annotations", {})["topoplace.io/placement"] = placement_value(
        "gpu-node-0", (0, 1, 2, 3)
    )
    state = ApiState(
        tuple(_items("nodes.json")),
        tuple(pods),
        tuple(claims),
        tuple(_items("resourceslices.v1.json")),
        at=NOW,
    )
    got = check(state)
    assert (RECORD_DISAGREES, "default/gated-four-pod") in {(v.kind, v.subject) for v in got}
    # and the record's GPUs 0..3 collide with two-gpus (0,1) and same-root (2,3)
    assert {v.subject for v in got if v.kind == GPU_HELD_TWICE} == {
        f"gpu-node-0/gpu-{g}" for g in range(4)
    }


# ---- gangs --------------------------------------------------------------------------------


def _gang(bound: int, created: float, size: int = 4) -> ApiState:
    nodes = tuple(make_node(f"n{i}") for i in range(size))
    plan = PlanRecord.of(
        "p1", [("", f"n{i}", list(range(8))) for i in range(size)], "gang", created, 30.0
    )
    pods = []
    for i in range(size):
        p = make_pod(f"g-{i}", 8, gang="g", gang_size=size)
        if i < bound:
            p["spec"]["nodeName"] = f"n{i}"
            p["metadata"]["annotations"]["topoplace.io/placement"] = placement_value(
                f"n{i}", tuple(range(8)), "default/g", plan
            )
        pods.append(p)
    return ApiState(nodes, tuple(pods), at=NOW)


@pytest.mark.parametrize(
    ("bound", "age", "broken"),
    [
        (2, 60.0, True),  # 2 of 4 bound, plan 60 s old, TTL 30 s + 5 s grace
        (2, 20.0, False),  # still within its TTL
        (4, 600.0, False),  # complete
        (0, 600.0, False),  # nothing bound
    ],
)
def test_gang_partly_bound_beyond_ttl(bound: int, age: float, broken: bool) -> None:
    got = check(_gang(bound, NOW - age))
    assert [(v.kind, v.subject) for v in got] == (
        [(GANG_PARTLY_BOUND, "default/g")] if broken else []
    )


# ---- ledgers ------------------------------------------------------------------------------


def test_rebuilt_ledger_and_diff() -> None:
    nodes = (make_node("n0"),)
    state = ApiState(nodes, (whole("a", "n0", [0, 1]), make_pod("p", 1)), at=NOW)
    rebuilt = rebuilt_ledger(state)
    assert rebuilt == {"default/a": ("n0", (0, 1), ())}
    served = {
        "placements": [
            {"pod": "default/a", "node": "n0", "gpus": [1, 0], "shares": [], "state": "bound"},
            {"pod": "default/p", "node": "n0", "gpus": [2], "shares": [], "state": "assumed"},
        ]
    }
    assert ledger_diff(topoplace_ledger(served), rebuilt) == []
    served["placements"][0]["gpus"] = [0, 2]
    assert ledger_diff(topoplace_ledger(served), rebuilt) == [
        "default/a: topoplace ('n0', (0, 2), ()) api-server ('n0', (0, 1), ())"
    ]
