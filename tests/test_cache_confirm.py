"""The watch's confirmation of topoplace's own bind (``ClusterCache._confirms``): the record
it keeps must be exactly what rebuilding it from the watched Pod (``pod_info_for``) gives.

Every pod is bound through the real ``Extender`` (filter, then bind with a binder that
records the Binding, standing in for the API server), then the API's view of it is built
as the API server shows it after the Binding (``spec.nodeName``, the annotations merged,
a new resourceVersion, the ``PodScheduled`` condition, managed fields gone) and applied
with ``upsert_pod`` twice: on the cache as it is, and on an identical cache whose
shortcut is off. Records and snapshots must be equal.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from benchmarks.clusters import dgx_h100_nodes, make_pod
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import pod_info_for
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server import wire
from scheduler.server.extender import Extender
from tests.builders import gang_pod
from tests.sharing.builders import RecordingBinder

P = SchedParams()


class NoShortcutCache(ClusterCache):
    """The cache with the confirmation shortcut off: every bound pod is rebuilt."""

    def _confirms(self, old: Any, obj: Any, node: str) -> bool:
        return False


def _pods() -> list[dict[str, Any]]:
    pods = [make_pod(f"w{i}", g, namespace="ml") for i, g in enumerate((1, 2, 4, 8, 1, 3))]
    with_init = make_pod("init", 2, namespace="ml")
    with_init["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}
    ]
    applied = make_pod("applied", 1, namespace="ml")
    applied["metadata"].setdefault("annotations", {})[
        "kubectl.kubernetes.io/last-applied-configuration"
    ] = orjson.dumps(applied["spec"]).decode()
    applied["metadata"].setdefault("labels", {})["app"] = "infer"
    gang = [gang_pod(f"g{i}", 4, "train", 2, namespace="ml") for i in range(2)]
    out = [*pods, with_init, applied, *gang]
    for i, p in enumerate(out):
        p["metadata"]["uid"] = f"uid-{i}"
        p["metadata"]["resourceVersion"] = str(100 + i)
    return out


def _as_the_api_shows_it(pod: dict[str, Any], node: str, annotations: dict[str, str]) -> dict:
    """The Pod after the Binding: nodeName set, the Binding's annotations merged over the
    pod's own, a new resourceVersion, PodScheduled true, no managed fields."""
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    m = out["metadata"]
    m["annotations"] = {**(m.get("annotations") or {}), **annotations}
    m["resourceVersion"] = str(int(m["resourceVersion"]) + 1000)
    m.pop("managedFields", None)
    out["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
    }
    return out


class EventDuringBindBinder(RecordingBinder):
    """Stands in for the API server: while the Binding is "in flight" the watch's MODIFIED
    event of the bound pod reaches the cache first (the race of a live run: the API server
    sends the event and the answer at once), built by ``_as_the_api_shows_it`` from the
    pod as created and changed by ``mutate``."""

    def __init__(self, cache: ClusterCache, pods: dict[str, dict], mutate: Any = None) -> None:
        super().__init__()
        self.cache, self.pods, self.mutate = cache, pods, mutate
        self.seen: list[tuple[str, bool, Any, Any]] = []

    def bind(self, pod: Any, node: str, annotations: Any) -> str:
        super().bind(pod, node, annotations)
        name = pod["metadata"]["name"]
        obj = _as_the_api_shows_it(self.pods[name], node, dict(annotations))
        if self.mutate is not None:
            node = self.mutate(obj, self.cache)
        key = f"ml/{name}"
        before = self.cache.snapshot()
        held = before.pods[key]
        assert held.assumed
        shortcut = self.cache._confirms(held, obj, node)
        rebuilt = pod_info_for(before, obj, node, params=P)
        self.cache.upsert_pod(obj)
        self.seen.append((key, shortcut, rebuilt, obj))
        return ""


def _bind_all(cache: ClusterCache, mutate: Any = None) -> EventDuringBindBinder:
    pods = _pods()
    binder = EventDuringBindBinder(cache, {p["metadata"]["name"]: p for p in pods}, mutate)
    ext = Extender(cache, binder, gangs=GangRuntime())
    names = list(cache.snapshot().names)
    for pod in pods if mutate is None else pods[:1]:
        cache.upsert_pod(pod)
        cache.remember_pending(pod)
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        (node,) = orjson.loads(ext.filter_json(wire.RawBody(body), body))["NodeNames"]
        m = pod["metadata"]
        args = {"PodName": m["name"], "PodNamespace": "ml", "PodUID": m["uid"], "Node": node}
        assert ext.bind(args) == {"Error": ""}
    return binder


def _caches() -> tuple[ClusterCache, ClusterCache]:
    nodes = dgx_h100_nodes(6)
    return ClusterCache.from_objects(nodes, [], P), NoShortcutCache.from_objects(nodes, [], P)


def test_confirming_an_own_bind_keeps_exactly_the_record_a_rebuild_gives() -> None:
    fast, slow = _caches()
    seen_fast, seen_slow = _bind_all(fast).seen, _bind_all(slow).seen
    assert len(seen_fast) == len(_pods())
    for (key, shortcut, rebuilt, obj), (key2, _, rebuilt2, _) in zip(
        seen_fast, seen_slow, strict=True
    ):
        assert key == key2 and shortcut, key  # every own bind takes the shortcut
        kept = fast.snapshot().pods[key]
        assert kept == rebuilt == rebuilt2 == slow.snapshot().pods[key]
        assert kept.raw is obj and not kept.assumed
        assert kept.gpus and kept.gpu_indices_known
    a, b = fast.snapshot(), slow.snapshot()
    assert a.nodes == b.nodes and dict(a.pods) == dict(b.pods)
    for f in a.arrays.__dataclass_fields__:
        assert (getattr(a.arrays, f) == getattr(b.arrays, f)).all(), f


def _resized(obj: dict, cache: ClusterCache) -> str:
    obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "31"
    return obj["spec"]["nodeName"]


def _other_placement(obj: dict, cache: ClusterCache) -> str:
    node = obj["spec"]["nodeName"]
    rec = {"v": 1, "node": node, "gpus": [7]}
    obj["metadata"]["annotations"]["topoplace.io/placement"] = orjson.dumps(rec).decode()
    return node


def _other_uid(obj: dict, cache: ClusterCache) -> str:
    obj["metadata"]["uid"] = "someone-else"
    return obj["spec"]["nodeName"]


def _relabelled(obj: dict, cache: ClusterCache) -> str:
    obj["metadata"]["labels"] = {"pod-group.scheduling.sigs.k8s.io": "other"}
    return obj["spec"]["nodeName"]


def _other_node(obj: dict, cache: ClusterCache) -> str:
    node = next(n for n in cache.snapshot().names if n != obj["spec"]["nodeName"])
    obj["spec"]["nodeName"] = node
    return node


@pytest.mark.parametrize(
    "mutate", [_resized, _other_placement, _other_uid, _relabelled, _other_node]
)
def test_a_pod_that_differs_from_the_assumption_is_rebuilt(mutate: Any) -> None:
    fast, _ = _caches()
    ((key, shortcut, rebuilt, obj),) = _bind_all(fast, mutate).seen
    assert not shortcut
    kept = fast.snapshot().pods[key]
    assert kept == rebuilt and kept.raw is obj and not kept.assumed
    if mutate is _resized:
        assert kept.cpu_milli == 31000
    if mutate is _other_placement:
        assert kept.gpus == (7,)
