"""kube mode: the reflector discovers, lists and watches DRA objects (recorded v1.33.0)."""

from __future__ import annotations

from collections import deque

from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.kube import dra as kdra
from scheduler.kube.client import NODES, PODS
from scheduler.kube.watcher import KubeWatcher, WatchOptions
from scheduler.runtime.cache import ClusterCache
from tests.dra import recorded
from tests.kube.recorded import RecordedApiFake

PARAMS = SchedParams()


def _api(served: tuple[str, ...] = ("v1beta1", "v1beta2")) -> RecordedApiFake:
    api = RecordedApiFake()
    api.lists[NODES.name] = recorded.load("nodes.json")
    api.lists[PODS.name] = recorded.load("pods.json")
    for v in served:
        api.resources[(dra.GROUP, v)] = recorded.load(f"apiresources.{v}.json")
        slices, claims, classes = kdra.kinds_for(v)
        api.lists[slices.name] = recorded.load(f"resourceslices.{v}.json")
        api.lists[claims.name] = recorded.load(f"resourceclaims.{v}.json")
        api.lists[classes.name] = recorded.load(f"deviceclasses.{v}.json")
    return api


def _watcher(api: RecordedApiFake) -> KubeWatcher:
    cache = ClusterCache(build_snapshot([], [], PARAMS), PARAMS)
    return KubeWatcher(api, cache, WatchOptions(podgroups=False))


def test_discovery_picks_the_newest_served_version() -> None:
    assert kdra.served_version(_api()) == "v1beta2"
    assert kdra.served_version(_api(("v1beta1",))) == "v1beta1"
    assert kdra.served_version(_api(())) is None
    assert kdra.discover(_api(())) == ()


def test_sync_folds_dra_objects_into_the_ledger() -> None:
    api = _api()
    w = _watcher(api)
    w.sync()
    assert api.calls["list:resourceslices.resource.k8s.io"] == 1
    assert [k.name for k in w.kinds][2:] == [
        "resourceslices.resource.k8s.io",
        "resourceclaims.resource.k8s.io",
        "deviceclasses.resource.k8s.io",
    ]
    snap = w.cache.snapshot()
    assert [n.gpu_capacity for n in snap.nodes] == [8, 8]
    assert [n.used_mask for n in snap.nodes] == [0b1111, 0b11011111]
    assert snap.node("gpu-node-1").health.bad_mask == 1 << 5  # type: ignore[union-attr]
    assert sorted(snap.extra[dra.CLASSES_KEY]) == ["gpu.nvidia.com"]
    assert len(snap.extra[dra.SLICES_KEY]) == 2


def test_a_server_without_dra_is_watched_as_before() -> None:
    api = _api(())
    w = _watcher(api)
    w.sync()
    assert [k.name for k in w.kinds] == ["nodes", "pods"]
    assert [n.gpu_capacity for n in w.cache.snapshot().nodes] == [0, 0]


def test_claim_watch_events_update_the_holding() -> None:
    api = _api()
    w = _watcher(api)
    w.sync()
    claims = kdra.kinds_for("v1beta2")[1]
    api.watches[claims.name] = deque([recorded.watch_events()])
    n = w.watch_once(w.streams[claims.name])
    assert n == 3
    snap = w.cache.snapshot()
    assert snap.node("gpu-node-0").used_mask == 0b111111  # type: ignore[union-attr]
    assert snap.pods["resourceclaim:default/watched-two"].gpus == (4, 5)
    assert (
        w.streams[claims.name].rv
        == recorded.watch_events()[-1]["object"]["metadata"]["resourceVersion"]
    )


def test_slice_event_reassesses_nodes() -> None:
    api = _api()
    w = _watcher(api)
    w.sync()
    slices = kdra.kinds_for("v1beta2")[0]
    sl = next(s for s in recorded.slices() if s["spec"]["nodeName"] == "gpu-node-0")
    sl["spec"]["devices"][7]["taints"] = [
        {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}
    ]
    api.watches[slices.name] = deque([[{"type": "MODIFIED", "object": sl}]])
    w.watch_once(w.streams[slices.name])
    n0 = w.cache.snapshot().node("gpu-node-0")
    assert n0 is not None and n0.health.bad_mask == 1 << 7
    assert n0.used_mask == 0b1111  # the claims still hold their GPUs after the rebuild
