"""A ResourceSlice whose devices' taints change re-assesses its node alone, and the result
is the snapshot a rebuild from every object gives (recorded v1.33.0 slices, both API
versions). Any other slice change still rebuilds."""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import pytest

from scheduler.core import dra
from scheduler.core.health import REASON_XID_BURST, devices_by_node
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import (
    ClusterSnapshot,
    build_snapshot,
    health_inputs,
    index_slice_update,
)
from scheduler.kube import dra as kdra
from scheduler.kube.watcher import WATCH_LAG_S, KubeWatcher, WatchOptions, slice_rebuild_due
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.health_tracker import HealthTracker
from tests.dra import recorded
from tests.dra.test_watch import _api
from tests.health.builders import HEARTBEAT, Clock, device, resource_slice, taint

PARAMS = SchedParams()


def alone() -> int:
    """The pool holds this slice alone."""
    return 1


NODE = "gpu-node-0"


def _body(sl: dict[str, Any], j: int) -> dict[str, Any]:
    dev = sl["spec"]["devices"][j]
    return dev.get("basic", dev)


def _tainted(sl: dict[str, Any], *taints: tuple[int, str, str]) -> dict[str, Any]:
    """``sl`` as its driver republishes it with device taints (index, key, effect) added."""
    out = copy.deepcopy(sl)
    out["metadata"]["resourceVersion"] = str(int(sl["metadata"]["resourceVersion"]) + 100)
    for j, key, effect in taints:
        _body(out, j).setdefault("taints", []).append({"key": key, "effect": effect})
    return out


def _slice_of(version: str, node: str = NODE) -> dict[str, Any]:
    return next(s for s in recorded.slices(version) if s["spec"]["nodeName"] == node)


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_a_taint_added_or_removed_is_a_taints_only_update(version: str) -> None:
    old = _slice_of(version)
    new = _tainted(old, (3, "gpu.nvidia.com/gpu-lost", "NoExecute"))
    assert dra.taints_only_update(old, new, alone) == NODE
    assert dra.taints_only_update(new, old, alone) == NODE  # cleared again
    assert dra.taints_only_update(old, copy.deepcopy(old), alone) == NODE  # a bare republish


def _remove_device(sl: dict[str, Any]) -> None:
    sl["spec"]["devices"].pop()


def _rename_device(sl: dict[str, Any]) -> None:
    sl["spec"]["devices"][0]["name"] = "gpu-renamed"


def _reindex_device(sl: dict[str, Any]) -> None:
    _body(sl, 0)["attributes"]["index"] = {"int": 7}


def _move_node(sl: dict[str, Any]) -> None:
    sl["spec"]["nodeName"] = "gpu-node-1"


def _slice_count(sl: dict[str, Any]) -> None:
    sl["spec"]["pool"]["resourceSliceCount"] = 2


def _rename_pool(sl: dict[str, Any]) -> None:
    sl["spec"]["pool"]["name"] = "elsewhere"


def _driver(sl: dict[str, Any]) -> None:
    sl["spec"]["driver"] = "other.example.com"


@pytest.mark.parametrize("version", recorded.VERSIONS)
@pytest.mark.parametrize(
    "change",
    [_remove_device, _rename_device, _reindex_device, _move_node, _slice_count, _rename_pool],
)
def test_any_other_change_is_not(version: str, change: Any) -> None:
    old = _slice_of(version)
    new = _tainted(old, (1, "k", "NoSchedule"))
    change(new)
    assert dra.taints_only_update(old, new, alone) == ""
    _driver(new)
    assert dra.taints_only_update(old, new, alone) == ""
    assert dra.taints_only_update(old, None, alone) == ""
    assert dra.taints_only_update([], new, alone) == ""


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_a_new_pool_generation_counts_only_for_a_pool_of_one_slice(version: str) -> None:
    old = _slice_of(version)
    assert old["spec"]["pool"].get("resourceSliceCount", 1) == 1
    new = _tainted(old, (0, "k", "NoSchedule"))
    new["spec"]["pool"]["generation"] = old["spec"]["pool"].get("generation", 0) + 1
    assert dra.taints_only_update(old, new, alone) == NODE
    # Another stored slice names the same pool: the generation decides which counts.
    assert dra.taints_only_update(old, new, lambda: 2) == ""


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_the_inventory_after_a_taints_only_update_equals_a_fresh_one(version: str) -> None:
    slices = recorded.slices(version)
    at = next(i for i, s in enumerate(slices) if s["spec"]["nodeName"] == NODE)
    new = _tainted(
        slices[at],
        (2, "gpu.nvidia.com/xid", "NoExecute"),
        (5, "maintenance", "NoSchedule"),
        (6, "soft", "PreferNoSchedule"),  # not blocking: the allocator ignores it
    )
    after = slices[:at] + [new] + slices[at + 1 :]
    inv = dra.inventory(slices)
    got = dra.with_slice_taints(inv, new)
    want = dra.inventory(after)
    assert got == want
    assert [d.taints for d in got.by_node[NODE]][2] == (("gpu.nvidia.com/xid", "", "NoExecute"),)
    assert [bool(d.taints) for d in got.by_node[NODE]] == [i in (2, 5) for i in range(8)]
    # Untouched: the other node's devices are the very same objects.
    other = next(n for n in got.by_node if n != NODE)
    assert got.by_node[other] is inv.by_node[other]


@pytest.mark.parametrize("version", recorded.VERSIONS)
def test_the_device_index_after_an_update_equals_a_fresh_one(version: str) -> None:
    slices = recorded.slices(version)
    health_inputs({dra.SLICES_KEY: slices}, PARAMS)  # indexed: the memo holds this list
    at = next(i for i, s in enumerate(slices) if s["spec"]["nodeName"] == NODE)
    after = list(slices)
    after[at] = _tainted(slices[at], (4, "k", "NoExecute"))
    index_slice_update(slices, after, slices[at], after[at], PARAMS)
    _, got = health_inputs({dra.SLICES_KEY: after}, PARAMS)
    assert dict(got) == devices_by_node(after, PARAMS.health)
    assert got[NODE][4] is after[at]["spec"]["devices"][4]  # read from the new slice


def _same(a: ClusterSnapshot, b: ClusterSnapshot) -> None:
    """Two snapshots hold the same cluster: nodes (health included), pods, arrays, DRA."""
    assert a.nodes == b.nodes
    assert dict(a.pods) == dict(b.pods)
    for f in a.arrays.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(a.arrays, f), getattr(b.arrays, f), err_msg=f)
    assert a.extra[dra.SLICES_KEY] == b.extra[dra.SLICES_KEY]


def _synced(api: Any, clock: Any = None, **options: Any) -> KubeWatcher:
    w = KubeWatcher(
        api,
        ClusterCache(build_snapshot([], [], PARAMS), PARAMS),
        WatchOptions(podgroups=False, **options),
        **({} if clock is None else {"clock": clock}),
    )
    w.sync()
    return w


def _counts(w: KubeWatcher) -> tuple[float, ...]:
    """(rebuilds after the initial list, slice updates applied to one node, slice updates
    that rebuilt), as ``/metrics`` shows them."""
    r = w.metrics.registry

    def get(name: str, labels: dict[str, str]) -> float:
        return r.get_sample_value(name, labels) or 0.0

    return (
        get("topoplace_kube_snapshot_rebuilds_total", {"cause": "resourceslices"}),
        get("topoplace_kube_slice_updates_total", {"path": "node"}),
        get("topoplace_kube_slice_updates_total", {"path": "rebuild"}),
    )


def _event(w: KubeWatcher, obj: dict[str, Any], typ: str = "MODIFIED") -> None:
    api: Any = w.api
    kind = kdra.kinds_for("v1beta2")[0]
    api.watches[kind.name] = deque([[{"type": typ, "object": obj}]])
    w.watch_once(w.streams[kind.name])


def test_a_taint_event_reassesses_one_node_as_a_rebuild_would() -> None:
    """The watch applies a device-taint update without a rebuild, and gets the snapshot a
    rebuild from the same objects gives: the tainted GPU is out of the node's usable set,
    the claims' holdings stay, the other node is untouched."""
    w = _synced(_api())
    cache = w.cache
    assert (
        w.metrics.registry.get_sample_value(
            "topoplace_kube_snapshot_rebuilds_total", {"cause": "sync"}
        )
        == 1
    )
    before = cache.snapshot()
    new = _tainted(_slice_of("v1beta2"), (7, "gpu.nvidia.com/gpu-lost", "NoSchedule"))
    _event(w, new)
    assert _counts(w) == (0, 1, 0)
    got = cache.snapshot()
    n0, n0_before = got.node(NODE), before.node(NODE)
    assert n0 is not None and n0_before is not None
    assert n0.health.bad_mask == 1 << 7
    assert n0.used_mask == n0_before.used_mask == 0b1111
    assert got.node("gpu-node-1") is before.node("gpu-node-1")
    with w._lock:
        w._rebuild("test")  # the same objects, read whole
    _same(got, cache.snapshot())
    assert cache.dra_inventory(got) == dra.inventory(got.extra[dra.SLICES_KEY])
    # ... and cleared: the GPU is usable again, still without a rebuild.
    _event(w, _slice_of("v1beta2"))
    assert _counts(w) == (0, 2, 0)
    assert cache.snapshot().node(NODE).health.bad_mask == 0  # type: ignore[union-attr]


def test_other_slice_events_rebuild_once_their_burst_is_in() -> None:
    """A slice change that is not a taint update waits ``slice_rebuild_delay_s`` for the
    rest of its burst; one rebuild then applies every change, a taint update that came
    meanwhile included, and equals a rebuild from the same objects."""
    clock = Clock(1000.0)
    w = _synced(_api(), clock)
    assert w.pending_slices_due() is None
    smaller = _slice_of("v1beta2")
    smaller["spec"]["devices"].pop()  # a GPU fell off the bus
    _event(w, smaller)
    assert _counts(w) == (0, 0, 1)
    assert w.cache.snapshot().node(NODE).gpu_capacity == 8  # type: ignore[union-attr]
    assert w.pending_slices_due() == 1000.5
    pending = "topoplace_kube_slices_pending"
    assert w.metrics.registry.get_sample_value(pending) == 1
    assert not w.rebuild_stale_slices()  # not due yet
    clock.t += 0.2
    _event(w, _slice_of("v1beta2", "gpu-node-1"), "DELETED")
    added = resource_slice("gpu-node-1", [device(j) for j in range(8)])
    _event(w, added, "ADDED")
    # A taint update while others wait joins them (the snapshot's slices are behind).
    _event(w, _tainted(smaller, (2, "gpu.nvidia.com/xid", "NoExecute")))
    assert _counts(w) == (0, 0, 4)
    assert w.pending_slices_due() == 1000.5  # from the first change of the burst
    clock.t = 1000.5
    assert w.rebuild_stale_slices()
    assert _counts(w) == (1, 0, 4)
    assert w.pending_slices_due() is None
    assert w.metrics.registry.get_sample_value(pending) == 0
    got = w.cache.snapshot()
    n0 = got.node(NODE)
    assert n0 is not None and n0.gpu_capacity == 7 and n0.health.bad_mask == 1 << 2
    assert got.node("gpu-node-1").gpu_capacity == 8  # type: ignore[union-attr]
    with w._lock:
        w._rebuild("test")  # the same objects, read whole
    _same(got, w.cache.snapshot())
    seconds = w.metrics.registry.get_sample_value("topoplace_kube_snapshot_rebuild_seconds")
    assert seconds is not None and 0 < seconds < 10
    # With nothing pending, a taint update takes the one-node path again ...
    _event(w, _tainted(smaller, (3, "gpu.nvidia.com/xid", "NoExecute")))
    assert _counts(w) == (1, 1, 4)
    assert w.cache.snapshot().node(NODE).health.bad_mask == 1 << 3  # type: ignore[union-attr]
    # ... and a change after a quiet spell is rebuilt at once.
    clock.t += 1.0
    _event(w, _slice_of("v1beta2"))  # the GPU is back
    assert _counts(w) == (2, 1, 5)
    assert w.cache.snapshot().node(NODE).gpu_capacity == 8  # type: ignore[union-attr]
    assert w.pending_slices_due() is None


def test_slice_rebuild_delay_zero_rebuilds_at_once() -> None:
    w = _synced(_api(), slice_rebuild_delay_s=0)
    smaller = _slice_of("v1beta2")
    smaller["spec"]["devices"].pop()
    _event(w, smaller)
    assert _counts(w) == (1, 0, 1)
    assert w.cache.snapshot().node(NODE).gpu_capacity == 7  # type: ignore[union-attr]
    assert w.pending_slices_due() is None


def test_slice_rebuilds_keep_to_their_share_of_the_time() -> None:
    """A change after a quiet spell rebuilds at once; one close after a rebuild waits for
    its burst (``delay``) and, after a rebuild of ``d`` seconds, for ``d x (1 / share -
    1)``: at 0.25, a 2.6-s rebuild of 5,000 nodes is followed by 7.8 s without one."""
    never = float("-inf")
    assert slice_rebuild_due(100.0, None, 0.5, never, 0.0, 0.25) == 100.0  # quiet: now
    assert slice_rebuild_due(100.0, None, 0.5, 99.0, 0.1, 0.25) == 100.0  # 1 s since
    assert slice_rebuild_due(100.0, None, 0.5, 99.8, 0.1, 0.25) == 100.5  # a burst
    assert slice_rebuild_due(100.0, None, 0.5, 99.0, 2.6, 0.25) == pytest.approx(99.0 + 7.8)
    # Pending since 99.9: due from then, whatever the latest change.
    assert slice_rebuild_due(100.2, 99.9, 0.5, 90.0, 0.1, 0.25) == pytest.approx(100.4)
    assert slice_rebuild_due(100.2, 99.9, 0.5, 99.0, 2.6, 0.25) == pytest.approx(106.8)
    assert slice_rebuild_due(100.0, None, 0.5, 99.8, 2.6, 1.0) == 100.5  # no share kept


def test_the_rebuild_thread_applies_pending_changes_when_due() -> None:
    """The watcher's rebuild thread, on the real clock: a pending change is in the cache
    once the delay is over, and ``stop`` ends the thread."""
    w = _synced(_api(), slice_rebuild_delay_s=1.0)
    thread = threading.Thread(target=w._rebuild_loop, daemon=True)
    thread.start()
    try:
        smaller = _slice_of("v1beta2")
        smaller["spec"]["devices"].pop()
        _event(w, smaller)  # within a second of the initial list's rebuild: pending
        assert _counts(w) == (0, 0, 1)
        deadline = time.monotonic() + 10
        while _counts(w)[0] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _counts(w) == (1, 0, 1)
        assert w.cache.snapshot().node(NODE).gpu_capacity == 7  # type: ignore[union-attr]
    finally:
        w.stop()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_xid_taints_on_the_fast_path_count_as_on_a_rebuild() -> None:
    """Three non-fatal XID taints, each replacing the last on the node's slice: the node's
    history shows the burst after the third, whether each update went through the one-node
    path or a full rebuild (two caches, two trackers, one clock)."""
    clock = Clock(HEARTBEAT + 30)
    nodes = recorded.nodes()
    devs = [device(j) for j in range(8)]
    first = resource_slice(NODE, devs)
    caches = []
    for _ in range(2):
        tracker = HealthTracker(PARAMS.health, clock=clock)
        c = ClusterCache(build_snapshot([], [], PARAMS), PARAMS, health_tracker=tracker)
        c.replace_all(nodes, [], {dra.SLICES_KEY: [first]})
        caches.append(c)
    fast, full = caches
    for i in range(3):
        clock.t += 60
        xid = taint("gpu.nvidia.com/xid", "None", "94", f"2026-11-29T19:5{i}:00Z")
        sl = resource_slice(NODE, [device(j, taints=[xid] if j == i else []) for j in range(8)])
        assert dra.taints_only_update(first, sl, alone) == NODE
        assert fast.apply_slice_taints(sl, NODE)
        full.replace_all(nodes, [], {dra.SLICES_KEY: [sl]})
        got = fast.snapshot().node(NODE)
        assert got == full.snapshot().node(NODE)
        assert (REASON_XID_BURST in got.health.reasons) == (i == 2), (i, got.health)
    clock.t += 30
    fast.refresh_nodes()
    full.refresh_nodes()
    assert fast.snapshot().node(NODE) == full.snapshot().node(NODE)
    assert REASON_XID_BURST in fast.snapshot().node(NODE).health.reasons


def test_an_unknown_slice_changes_nothing() -> None:
    cache = ClusterCache(
        build_snapshot(recorded.nodes(), recorded.pods(), PARAMS, recorded.extra()), PARAMS
    )
    before = cache.snapshot()
    stranger = _slice_of("v1beta2")
    stranger["metadata"]["name"] = "not-stored"
    assert not cache.apply_slice_taints(stranger, NODE)
    assert cache.snapshot() is before


def test_slices_kept_out_of_name_order_are_found_too() -> None:
    """A snapshot whose slices are not sorted by name (built from a file as written)
    still finds the updated slice, and equals one built from the updated objects."""
    extra = recorded.extra()
    extra[dra.SLICES_KEY] = list(reversed(extra[dra.SLICES_KEY]))
    cache = ClusterCache(build_snapshot(recorded.nodes(), recorded.pods(), PARAMS, extra), PARAMS)
    new = _tainted(_slice_of("v1beta2"), (0, "k", "NoExecute"))
    assert cache.apply_slice_taints(new, NODE)
    after = [
        new if s["metadata"]["name"] == new["metadata"]["name"] else s
        for s in extra[dra.SLICES_KEY]
    ]
    assert [s["metadata"]["name"] for s in after] == [
        s["metadata"]["name"] for s in cache.snapshot().extra[dra.SLICES_KEY]
    ]
    _same(
        cache.snapshot(),
        build_snapshot(recorded.nodes(), recorded.pods(), PARAMS, {**extra, dra.SLICES_KEY: after}),
    )
    assert cache.snapshot().node(NODE).health.bad_mask == 1


def test_a_failed_rebuild_leaves_the_slice_changes_pending(monkeypatch) -> None:
    clock = Clock(1000.0)
    w = _synced(_api(), clock)
    smaller = _slice_of("v1beta2")
    smaller["spec"]["devices"].pop()
    _event(w, smaller)
    clock.t = 1000.5
    real = w.cache.replace_all

    def broken(*args: Any, **kw: Any) -> None:
        raise RuntimeError("a bug in rebuilding")

    monkeypatch.setattr(w.cache, "replace_all", broken)
    with pytest.raises(RuntimeError):
        w.rebuild_stale_slices()
    assert w.pending_slices_due() == 1000.5  # still pending
    monkeypatch.setattr(w.cache, "replace_all", real)
    assert w.rebuild_stale_slices()
    assert w.cache.snapshot().node(NODE).gpu_capacity == 7  # type: ignore[union-attr]


def test_the_watch_says_when_the_cache_caught_up_on_slice_changes() -> None:
    """``on_caught_up`` gets the time (the cache's clock, less ``WATCH_LAG_S``) of the
    first slice change a rebuild took in, once that rebuild is done: for a burst, after
    its rebuild; for a change after a quiet spell, at once. The one-node taint path is
    never behind."""
    clock = Clock(1000.0)
    cache = ClusterCache(build_snapshot([], [], PARAMS), PARAMS, clock)
    w = KubeWatcher(_api(), cache, WatchOptions(podgroups=False), clock=clock)
    w.sync()
    calls: list[float] = []
    w.on_caught_up = calls.append
    _event(w, _tainted(_slice_of("v1beta2"), (1, "k", "NoSchedule")))
    assert _counts(w) == (0, 1, 0) and calls == []
    clock.t = 1000.2
    smaller = _slice_of("v1beta2")
    smaller["spec"]["devices"].pop()
    _event(w, smaller)
    clock.t = 1000.4
    _event(w, _slice_of("v1beta2", "gpu-node-1"), "DELETED")
    assert _counts(w) == (0, 1, 2) and calls == []  # pending: the cache is behind
    clock.t = 1000.7
    assert w.rebuild_stale_slices()
    assert calls == [pytest.approx(1000.2 - WATCH_LAG_S)]
    clock.t = 1010.0
    _event(w, _slice_of("v1beta2"))  # after a quiet spell: rebuilt at once
    assert _counts(w) == (2, 1, 3)
    assert calls[1:] == [pytest.approx(1010.0 - WATCH_LAG_S)]


def test_an_inventory_takes_again_the_devices_of_the_slices_it_read() -> None:
    """A rebuild after one slice changed reads that slice alone: the devices of the other,
    the very same objects, are taken from the previous inventory; the result equals an
    inventory read from scratch."""
    slices = recorded.slices()
    first = dra.inventory(slices)
    changed = copy.deepcopy(slices[1])
    changed["spec"]["devices"].pop()
    now = [slices[0], changed]
    again = dra.inventory(now, previous=first)
    fresh = dra.inventory(copy.deepcopy(now))
    assert again == fresh
    assert again.by_node["gpu-node-0"] == fresh.by_node["gpu-node-0"]
    kept, before = again.by_node["gpu-node-0"], first.by_node["gpu-node-0"]
    assert all(a is b for a, b in zip(kept, before, strict=True))
    read, before = again.by_node["gpu-node-1"], first.by_node["gpu-node-1"]
    assert len(read) == len(before) - 1
    assert not any(a is b for a, b in zip(read, before[:-1], strict=True))


def test_health_reads_the_devices_the_allocator_uses() -> None:
    """The health path reads a pool's devices as kube-scheduler's allocator and the DRA
    inventory do: the newest generation only (a driver's stale slice, tainted, still
    listed, marks no GPU unhealthy) and only a complete pool (a pool of two slices with
    one published gives no GPUs)."""
    tainted = resource_slice(NODE, [device(j) for j in range(8)])
    tainted["spec"]["devices"][3] = device(3, taints=[taint("gpu.nvidia.com/xid")])
    fresh = resource_slice(NODE, [device(j) for j in range(8)])
    fresh["metadata"]["name"] = "gpu-node-0-gen2"
    fresh["spec"]["pool"]["generation"] = 2
    half = resource_slice("gpu-node-1", [device(j) for j in range(8)])
    half["spec"]["pool"]["resourceSliceCount"] = 2
    slices = [tainted, fresh, half]
    assert devices_by_node([tainted], PARAMS.health)[NODE][3]["taints"]  # alone, it counts
    got = devices_by_node(slices, PARAMS.health)
    assert list(got) == [NODE]
    assert list(got[NODE]) == fresh["spec"]["devices"]
    inv = dra.inventory(slices)
    assert sorted(inv.by_node) == [NODE]
    assert [d.name for d in inv.by_node[NODE]] == [d["name"] for d in got[NODE]]
    assert not any(d.taints for d in inv.by_node[NODE])
