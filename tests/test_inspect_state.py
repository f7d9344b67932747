"""``GET /v1/inspect/state``: the sizes of every store the serving process keeps between
requests, through the real app over HTTP (ASGI), on real DGX H100 node objects."""

from __future__ import annotations

import orjson

from benchmarks.clusters import dgx_h100_nodes, make_pod
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.runtime.cache import PENDING_MAX_ENTRIES, ClusterCache
from scheduler.runtime.gangs import DONE_KEPT, GangRuntime
from scheduler.runtime.parked import MAX_PARKED
from scheduler.server.extender import Extender
from tests.health.builders import Clock
from tests.helpers import asgi_client
from tests.sharing.builders import RecordingBinder

P = SchedParams()


def _filter(c, pod: dict, names: list[str]) -> list[str]:
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
    r = c.post("/scheduler/filter", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    return list(r.json()["NodeNames"] or [])


def test_state_shows_each_store_with_its_cap_and_follows_the_pods() -> None:
    clock = Clock(1000.0)
    nodes = dgx_h100_nodes(2)
    names = [n["metadata"]["name"] for n in nodes]
    cache = ClusterCache(build_snapshot(nodes, [], P), P, clock)
    ext = Extender(cache, RecordingBinder(), gangs=GangRuntime())
    ext.parked.waker = lambda keys, why: None  # remembers refusals (kube mode patches)
    c = asgi_client(ext, url_prefix="/scheduler")
    stores = c.get("/v1/inspect/state").json()["stores"]
    assert set(stores) == {
        "cache",
        "dra",
        "parked",
        "stranded",
        "preemptions",
        "gangs",
        "decisions",
        "share_fits",
    }
    assert stores["cache"]["pending"] == {"size": 0, "cap": PENDING_MAX_ENTRIES}
    assert stores["gangs"]["done"] == {"size": 0, "cap": DONE_KEPT}
    assert stores["parked"]["refused_at"] == {"size": 0, "cap": MAX_PARKED}
    assert all(s["size"] == 0 for part in stores.values() for s in part.values())

    fits = make_pod("fits", 2, namespace="ml")
    cache.upsert_pod(fits)
    assert len(_filter(c, fits, names)) == 1  # nominated on the node it was given
    nowhere = make_pod("nowhere", 2, namespace="ml", node_selector={"pool": "nowhere"})
    cache.upsert_pod(nowhere)
    assert _filter(c, nowhere, names) == []
    stores = c.get("/v1/inspect/state").json()["stores"]
    cache_sizes = {k: v["size"] for k, v in stores["cache"].items()}
    assert cache_sizes["nominated"] == 1 and cache_sizes["expiry"] == 1
    assert cache_sizes["pending"] == 2 and cache_sizes["pods"] == 1  # the nomination holds
    assert stores["parked"]["refused_at"]["size"] == 1
    assert stores["decisions"]["records"]["size"] == 2

    cache.delete_pod("ml/fits")  # its nomination and pending record go with it
    clock.t += P.extender.nomination_ttl_seconds + 1
    cache.expire()
    cache.delete_pod("ml/nowhere")
    ext.parked.wake_refused_since(clock.t, cache, "caught up")
    stores = c.get("/v1/inspect/state").json()["stores"]
    assert {k: v["size"] for k, v in stores["cache"].items()} == dict.fromkeys(cache_sizes, 0)
    assert stores["parked"]["refused_at"]["size"] == 0
