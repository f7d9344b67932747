"""DRA objects recorded from a real v1.33.0 control plane, folded into the GPU ledger."""

from __future__ import annotations

import copy

import pytest

from scheduler.cli.clusterfile import parse_cluster
from scheduler.core import dra
from scheduler.core.health import REASON_DEVICE_TAINT
from scheduler.core.model import Health
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.dra import recorded

PARAMS = SchedParams()


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_inventory_reads_both_served_versions(version: str) -> None:
    inv = dra.inventory(recorded.slices(version))
    assert dict(inv.gpus) == {"gpu-node-0": 8, "gpu-node-1": 8}
    assert inv.exact_order == {"gpu-node-0", "gpu-node-1"}
    devs = inv.by_node["gpu-node-1"]
    assert [d.name for d in devs] == [f"gpu-{i}" for i in range(8)]
    assert [d.gpu for d in devs] == list(range(8))
    assert all(d.whole_gpu and d.uuid.startswith("GPU-") for d in devs)
    assert devs[5].taints == (("gpu.nvidia.com/xid", "79", "NoSchedule"),)
    assert [d for d in devs if d.taints] == [devs[5]]
    assert devs[2].attribute("resource.kubernetes.io/pcieRoot") == "pci0000:20"
    assert devs[2].attribute("gpu.nvidia.com/index") == 2  # driver-qualified finds plain


def test_both_versions_give_the_same_facts() -> None:
    a, b = (dra.inventory(recorded.slices(v)) for v in recorded.VERSIONS)
    for node in a.by_node:
        fa = [(d.id, d.gpu, d.kind, d.uuid, d.taints) for d in a.by_node[node]]
        fb = [(d.id, d.gpu, d.kind, d.uuid, d.taints) for d in b.by_node[node]]
        assert fa == fb
    ca, cb = (recorded.claims(v) for v in recorded.VERSIONS)
    assert {k: dra.claim_spec(c) for k, c in ca.items()} == {
        k: dra.claim_spec(c) for k, c in cb.items()
    }


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_allocated_claims_hold_their_gpus_whoever_allocated_them(version: str) -> None:
    inv = dra.inventory(recorded.slices(version))
    held = {k: dra.claim_holding(c, inv) for k, c in recorded.claims(version).items()}
    assert held == {
        "default/two-gpus": ("gpu-node-0", (0, 1)),
        "default/same-root": ("gpu-node-0", (2, 3)),
        "default/pinned-seven": ("gpu-node-1", (0, 1, 2, 3, 4, 6, 7)),
        "default/pending-four": None,
    }
    c = recorded.claims(version)["default/two-gpus"]
    assert dra.allocation_node(c) == "gpu-node-0"
    assert dra.DELETE_PROTECTION in c["metadata"]["finalizers"]


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_snapshot_ledger_counts_dra_gpus_usage_and_taints(version: str) -> None:
    snap = build_snapshot(recorded.nodes(), recorded.pods(), PARAMS, recorded.extra(version))
    n0, n1 = snap.node("gpu-node-0"), snap.node("gpu-node-1")
    assert n0 is not None and n1 is not None
    # The nodes advertise no nvidia.com/gpu: capacity comes from the slices.
    assert (n0.gpu_capacity, n1.gpu_capacity) == (8, 8)
    assert n0.shape.name == "dgx-h100"  # GFD labels resolve the shape for the DRA count
    assert n0.used_mask == 0b1111
    assert n1.used_mask == 0b11011111
    # The tainted device: GPU 5 bad, node degraded (graded, not removed).
    assert n1.health.bad_mask == 1 << 5
    assert n1.health.state == Health.DEGRADED
    assert REASON_DEVICE_TAINT in n1.health.reasons
    assert n0.health.bad_mask == 0
    free = dict(zip(snap.names, snap.arrays.free.tolist(), strict=True))
    assert free == {"gpu-node-0": 4, "gpu-node-1": 0}
    keys = {k for k in snap.pods if k.startswith(dra.HOLDER_PREFIX)}
    assert keys == {
        "resourceclaim:default/two-gpus",
        "resourceclaim:default/same-root",
        "resourceclaim:default/pinned-seven",
    }


def test_without_dra_objects_the_nodes_have_no_gpus() -> None:
    snap = build_snapshot(recorded.nodes(), recorded.pods(), PARAMS)
    assert [n.gpu_capacity for n in snap.nodes] == [0, 0]


def test_a_second_claim_naming_a_held_device_is_not_double_counted() -> None:
    extra = recorded.extra()
    forged = {**extra[dra.CLAIMS_KEY]["default/two-gpus"]}
    forged["metadata"] = {**forged["metadata"], "name": "zz-forged", "uid": "x"}
    extra[dra.CLAIMS_KEY]["default/zz-forged"] = forged
    snap = build_snapshot(recorded.nodes(), recorded.pods(), PARAMS, extra)
    assert "resourceclaim:default/zz-forged" not in snap.pods
    assert snap.node("gpu-node-0").used_mask == 0b1111  # type: ignore[union-attr]


def _as_list() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            *recorded.nodes(),
            *recorded.pods(),
            *dra.objects_of(recorded.extra()),
        ],
    }


def test_cluster_file_carries_dra_objects() -> None:
    import orjson

    nodes, pods, extra = parse_cluster(orjson.dumps(_as_list()).decode())
    assert sorted(extra) == [dra.CLASSES_KEY, dra.CLAIMS_KEY, dra.SLICES_KEY]
    assert list(extra[dra.CLAIMS_KEY]) == sorted(recorded.claims())
    snap = build_snapshot(nodes, pods, PARAMS, extra)
    assert snap.node("gpu-node-0").used_mask == 0b1111  # type: ignore[union-attr]


def test_inspect_snapshot_round_trips_dra_objects_and_hides_holdings() -> None:
    import orjson

    cache = ClusterCache.from_objects(
        recorded.nodes(), recorded.pods(), PARAMS, extra=recorded.extra()
    )
    lst = Extender(cache).snapshot_list()
    kinds = [i["kind"] for i in lst["items"]]
    assert kinds.count("ResourceClaim") == 4 and kinds.count("ResourceSlice") == 2
    assert kinds.count("DeviceClass") == 1
    names = {i["metadata"]["name"] for i in lst["items"] if i["kind"] == "Pod"}
    assert not any(n.startswith(dra.HOLDER_PREFIX) for n in names)
    nodes, pods, extra = parse_cluster(orjson.dumps(lst).decode())
    again = build_snapshot(nodes, pods, PARAMS, extra)
    assert [n.used_mask for n in again.nodes] == [n.used_mask for n in cache.snapshot().nodes]


def test_cache_applies_claim_events_incrementally() -> None:
    extra = recorded.extra()
    cache = ClusterCache.from_objects(recorded.nodes(), recorded.pods(), PARAMS, extra=extra)
    events = recorded.watch_events()
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "MODIFIED"]
    used = []
    for e in events:
        cache.apply_claim(dra.object_key(e["object"]), e["object"])
        used.append(cache.snapshot().node("gpu-node-0").used_mask)  # type: ignore[union-attr]
    # Not allocated, finalizer only, then allocated gpu-4 and gpu-5 (first fit).
    assert used == [0b1111, 0b1111, 0b111111]
    assert cache.snapshot().pods["resourceclaim:default/watched-two"].gpus == (4, 5)
    cache.apply_claim("default/watched-two", None)
    assert cache.snapshot().node("gpu-node-0").used_mask == 0b1111  # type: ignore[union-attr]
    assert "default/watched-two" not in cache.snapshot().extra[dra.CLAIMS_KEY]


@pytest.mark.parametrize("how", ["allocation cleared", "claim deleted"])
def test_a_claim_refused_for_a_held_device_holds_it_once_the_holder_lets_go(how: str) -> None:
    """Two allocators raced for one device and the watch shows both allocations (live:
    topoplace's and kube-scheduler's, before topoplace yields): the second cannot hold
    GPUs the first holds. When the first lets go, the second holds them at once; before,
    it held nothing until the next rebuild, and topoplace handed the same device out
    again and again (seen in the live race test)."""
    cache = ClusterCache.from_objects(
        recorded.nodes(), recorded.pods(), PARAMS, extra=recorded.extra()
    )
    first = recorded.claims()["default/two-gpus"]  # gpu-node-0, GPUs 0 and 1
    rival = copy.deepcopy(first)
    rival["metadata"].update(name="rival", uid="rival-uid")
    cache.apply_claim("default/rival", rival)
    assert "resourceclaim:default/rival" not in cache.snapshot().pods
    if how == "claim deleted":
        cache.apply_claim("default/two-gpus", None)
    else:
        released = copy.deepcopy(first)
        del released["status"]["allocation"]
        cache.apply_claim("default/two-gpus", released)
    snap = cache.snapshot()
    assert "resourceclaim:default/two-gpus" not in snap.pods
    assert snap.pods["resourceclaim:default/rival"].gpus == (0, 1)
    assert snap.node("gpu-node-0").used_mask == 0b1111  # type: ignore[union-attr]


def test_after_a_rebuild_a_claim_left_unheld_holds_once_the_first_lets_go() -> None:
    """A rebuild counts a device named by two claims once, for the first by key; the other
    is remembered as waiting and holds the GPUs as soon as the first is deleted."""
    extra = recorded.extra()
    rival = copy.deepcopy(extra[dra.CLAIMS_KEY]["default/two-gpus"])
    rival["metadata"].update(name="zz-rival", uid="rival-uid")
    extra[dra.CLAIMS_KEY]["default/zz-rival"] = rival
    cache = ClusterCache.from_objects([], [], PARAMS)
    cache.replace_all(recorded.nodes(), recorded.pods(), extra)
    assert "resourceclaim:default/zz-rival" not in cache.snapshot().pods
    cache.apply_claim("default/two-gpus", None)
    assert cache.snapshot().pods["resourceclaim:default/zz-rival"].gpus == (0, 1)
    # A claim that waits is forgotten once it goes itself: nothing is held for it later.
    cache.apply_claim("default/zz-rival", None)
    cache.apply_claim("default/same-root", None)
    assert cache.snapshot().node("gpu-node-0").used_mask == 0  # type: ignore[union-attr]
