"""A rebuild of the cache from objects (``ClusterCache.replace_all``: the initial list, a
relist, a ResourceSlice change) while filter and bind go on.

A rebuild reads the watch's stores, and the watch has not yet shown what topoplace itself
did a moment ago: GPUs assumed or nominated for a pod, and pods topoplace bound whose
Binding the API accepted (confirmed) but whose MODIFIED event has not arrived. The rebuilt
snapshot must keep holding all of them, or a filter could hand out their GPUs again. The
rebuild builds the new snapshot without the cache's lock, so filter and bind are not held
up for the seconds it takes on a large cluster; what they hold when it is ready is carried
over.
"""

from __future__ import annotations

import threading
from typing import Any

import orjson

import scheduler.runtime.cache as cache_mod
from benchmarks.clusters import dgx_h100_nodes, make_pod
from scheduler.core.model import indices_to_mask
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server import wire
from scheduler.server.extender import Extender
from tests.sharing.builders import RecordingBinder

P = SchedParams()


def _filter_and_bind(cache: ClusterCache, ext: Extender, pod: dict[str, Any]) -> str:
    """``pod`` through filter and bind as kube-scheduler sends them; the node bound."""
    cache.upsert_pod(pod)
    cache.remember_pending(pod)
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(cache.snapshot().names)})
    (node,) = orjson.loads(ext.filter_json(wire.RawBody(body), body))["NodeNames"]
    m = pod["metadata"]
    args = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    assert ext.bind(args) == {"Error": ""}
    return str(node)


def _pod(name: str, gpus: int) -> dict[str, Any]:
    pod = make_pod(name, gpus, namespace="ml")
    pod["metadata"]["uid"] = f"uid-{name}"
    pod["metadata"]["resourceVersion"] = "100"
    return pod


def test_a_pod_bound_but_not_yet_watched_keeps_its_gpus_through_a_rebuild() -> None:
    """topoplace bound ``a`` (the API accepted the Binding: the record is confirmed) and
    the watch has not shown it bound yet; then the cache is rebuilt from the stores,
    where ``a`` is still pending. Its GPUs stay held, and the next pod gets others."""
    nodes = dgx_h100_nodes(1)
    cache = ClusterCache.from_objects(nodes, [], P)
    ext = Extender(cache, RecordingBinder(), gangs=GangRuntime())
    a = _pod("a", 4)
    node = _filter_and_bind(cache, ext, a)
    held = cache.snapshot().pods["ml/a"]
    assert not held.assumed and len(held.gpus) == 4  # confirmed by the bind
    cache.replace_all(nodes, [a])  # the store: ``a`` as created, without spec.nodeName
    after = cache.snapshot()
    assert after.pods["ml/a"].gpus == held.gpus
    assert after.node(node).used_mask == indices_to_mask(held.gpus)  # type: ignore[union-attr]
    b = _pod("b", 4)
    _filter_and_bind(cache, ext, b)
    assert set(cache.snapshot().pods["ml/b"].gpus).isdisjoint(held.gpus)
    # Once the watch has shown ``a`` bound, a rebuild takes it from the store as usual ...
    bound_a = _bound(a, node)
    cache.upsert_pod(bound_a)
    b_gpus = cache.snapshot().pods["ml/b"].gpus
    cache.replace_all(nodes, [bound_a, b])  # ``b`` bound, not yet watched: kept too
    assert cache.snapshot().pods["ml/a"].gpus == held.gpus
    assert cache.snapshot().pods["ml/b"].gpus == b_gpus
    # An event older than the Binding (``b`` pending, e.g. a status update) keeps it ...
    cache.upsert_pod(b)
    assert cache.snapshot().pods["ml/b"].gpus == b_gpus
    # ... a pod of the same name that is another pod (a new uid) does not,
    other_b = _pod("b", 4)
    other_b["metadata"]["uid"] = "uid-b-again"
    cache.replace_all(nodes, [bound_a, other_b])
    assert "ml/b" not in cache.snapshot().pods
    # ... nor does a pod the list no longer has (deleted while the watch was away),
    _filter_and_bind(cache, ext, b)
    assert "ml/b" in cache.snapshot().pods
    cache.replace_all(nodes, [bound_a])
    assert "ml/b" not in cache.snapshot().pods
    # ... nor one the watch shows deleted.
    _filter_and_bind(cache, ext, b)
    cache.delete_pod("ml/b")
    cache.replace_all(nodes, [bound_a, b])
    assert "ml/b" not in cache.snapshot().pods
    assert cache._bound_unseen == {}


def _bound(pod: dict[str, Any], node: str) -> dict[str, Any]:
    out = orjson.loads(orjson.dumps(pod))
    out["spec"]["nodeName"] = node
    out["metadata"]["resourceVersion"] = "200"
    return out


def test_filter_and_bind_go_on_while_a_rebuild_builds(monkeypatch) -> None:
    """While the new snapshot is being built (seconds at 5,000 nodes), a filter and a bind
    on another thread are answered at once, from the current snapshot; the GPUs they hold
    are held in the rebuilt one, and the next pod gets others."""
    nodes = dgx_h100_nodes(1)
    cache = ClusterCache.from_objects(nodes, [], P)
    ext = Extender(cache, RecordingBinder(), gangs=GangRuntime())
    real = cache_mod.build_snapshot
    during: list[str] = []

    def building(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        verbs = threading.Thread(target=lambda: during.append(_filter_and_bind(cache, ext, c)))
        verbs.start()
        verbs.join(timeout=10)
        assert not verbs.is_alive(), "filter and bind waited for the rebuild"
        return out

    c = _pod("c", 4)
    monkeypatch.setattr(cache_mod, "build_snapshot", building)
    cache.replace_all(nodes, [c])
    monkeypatch.setattr(cache_mod, "build_snapshot", real)
    assert during  # bound during the build
    held = cache.snapshot().pods["ml/c"]
    assert len(held.gpus) == 4 and not held.assumed
    d = _pod("d", 4)
    _filter_and_bind(cache, ext, d)
    assert set(cache.snapshot().pods["ml/d"].gpus).isdisjoint(held.gpus)


def test_a_refresh_that_overlaps_a_rebuild_does_not_undo_it(monkeypatch) -> None:
    """The health refresh assesses nodes without the lock. If a rebuild with other
    ResourceSlices (here: GPU 3 of n1 tainted by its DRA driver) lands meanwhile, what the
    refresh assessed from the old slices is dropped, not applied over the rebuilt nodes;
    the next refresh reads the new slices."""
    from scheduler.core import dra
    from tests.health.builders import HEARTBEAT, device, dgx, resource_slice, taint, tracked_cache

    nodes = [dgx("n1"), dgx("n2")]
    old = [resource_slice("n1", [device(j) for j in range(8)])]
    tainted = [device(j) for j in range(8)]
    tainted[3] = device(3, taints=[taint("gpu.nvidia.com/xid", "NoExecute", "79")])
    new = [resource_slice("n1", tainted)]
    cache, _, clock = tracked_cache(nodes, extra={dra.SLICES_KEY: old})
    assert cache.snapshot().node("n1").health.bad_mask == 0  # type: ignore[union-attr]
    clock.t = HEARTBEAT + 86_400  # a day without heartbeats: every verdict changes
    real = cache._current
    rebuilt: list[bool] = []

    def racing(*args: Any) -> Any:
        if not rebuilt:
            rebuilt.append(True)
            cache.replace_all(nodes, [], {dra.SLICES_KEY: new})
        return real(*args)

    monkeypatch.setattr(cache, "_current", racing)
    assert cache.refresh_nodes() == 0
    n1 = cache.snapshot().node("n1")
    assert n1 is not None and n1.health.bad_mask == 1 << 3  # as rebuilt
    monkeypatch.setattr(cache, "_current", real)
    clock.t += 60
    cache.refresh_nodes()
    n1 = cache.snapshot().node("n1")
    assert n1 is not None and n1.health.bad_mask == 1 << 3
    assert n1.health.state.name != "HEALTHY"  # the stale heartbeat, seen by both
