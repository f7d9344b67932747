"""HTTP-level: a gang is planned, a planned node fails before bind, the whole gang lands
elsewhere (extender app over the ASGI transport, gang runtime of ``scheduler/runtime/gangs.py``)."""

from __future__ import annotations

import orjson
import pytest

from benchmarks.clusters import make_pod
from scheduler.core.model import RESERVATION_PREFIX
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.health.builders import condition, dgx
from tests.helpers import asgi_client

gangs = pytest.importorskip("scheduler.runtime.gangs")

SP = SchedParams()
NAMES = [f"h{i}" for i in range(6)]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def member(i: int) -> dict:
    return make_pod(f"w-{i}", 8, namespace="train", gang="llm", gang_size=4)


def post(client, verb: str, body: dict) -> dict:  # noqa: ANN001
    r = client.request("POST", f"/scheduler/{verb}", content=orjson.dumps(body))
    assert r.status_code == 200, r.text
    return r.json()


def test_gang_replanned_elsewhere_when_a_planned_node_fails_before_bind() -> None:
    nodes = [dgx(n, leaf="leaf-1" if i < 3 else "leaf-2", spine="s1") for i, n in enumerate(NAMES)]
    cache = ClusterCache.from_objects(nodes, [], SP, clock=Clock())
    ext = Extender(cache, gangs=gangs.GangRuntime())
    client = asgi_client(ext)
    ws = [member(i) for i in range(4)]

    first = post(client, "filter", {"Pod": ws[0], "NodeNames": NAMES})
    (node0,) = first["NodeNames"]
    reserved = {
        p.node for k, p in cache.snapshot().pods.items() if k.startswith(RESERVATION_PREFIX)
    }
    assert len(reserved) == 4 and node0 in reserved
    victim = sorted(reserved - {node0})[0]

    # The victim turns unhealthy (NVSentinel fatal condition) before any member binds.
    cache.upsert_node(dgx(victim, conditions=[condition("GpuXidError")], leaf="leaf-x", spine="s1"))

    placed: dict[str, str] = {}
    for w in ws:
        body = post(client, "filter", {"Pod": w, "NodeNames": NAMES})
        assert body["Error"] == ""
        (node,) = body["NodeNames"]
        m = w["metadata"]
        err = post(
            client,
            "bind",
            {
                "PodName": m["name"],
                "PodNamespace": m["namespace"],
                "PodUID": m["uid"],
                "Node": node,
            },
        )["Error"]
        assert err == ""
        placed[m["name"]] = node

    assert victim not in placed.values()
    assert len(set(placed.values())) == 4  # 8-GPU members: one node each, no double booking
    snap = cache.snapshot()
    assert not [k for k in snap.pods if k.startswith(RESERVATION_PREFIX)]
    held = [snap.pods[f"train/w-{i}"] for i in range(4)]
    assert all(len(p.gpus) == 8 and p.node != victim for p in held)
