"""A replica pod through the extender's HTTP API (the ASGI app over httpx): filter picks the
time-slicing node with the fewest free replicas that fit, bind writes a Binding with no
hand-off (the kubelet picks the device) and the replicas are held; a whole-GPU pod that did
not opt in is refused on the replica nodes with the reason."""

from __future__ import annotations

from typing import Any

import orjson

from benchmarks.clusters import make_node, make_pod, replica_node
from scheduler.core.params import SchedParams
from scheduler.core.replicas import REASON_REPLICAS_NOW
from scheduler.core.schedule import REASON_REPLICA_NODE
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.helpers import asgi_client, with_reasons
from tests.sharing.builders import RecordingBinder

NAMES = ["dgx-0", "ts-a", "ts-b"]
TS = {"nvidia.com/gpu.sharing-strategy": "time-slicing"}


def _setup() -> tuple[Any, Extender, RecordingBinder]:
    nodes = [
        make_node("dgx-0", 8, "h100"),
        replica_node("ts-a", 4, "t4", replicas=8),  # 32 replicas
        replica_node("ts-b", 1, "t4", replicas=8),  # 8 replicas
    ]
    binder = RecordingBinder()
    # Every verdict is sent, also when a node is offered (extender.reasons_when_placed).
    ext = Extender(ClusterCache.from_objects(nodes, [], with_reasons(SchedParams())), binder)
    return asgi_client(ext), ext, binder


def _bind_body(pod: dict[str, Any], node: str) -> bytes:
    m = pod["metadata"]
    return orjson.dumps(
        {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    )


def test_filter_and_bind_a_replica_pod_over_http() -> None:
    client, ext, binder = _setup()
    pod = make_pod("infer-0", 3, namespace="serve", node_selector=TS, cpu="2", memory="8Gi")
    r = client.post("/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": NAMES}))
    assert r.status_code == 200
    body = r.json()
    assert body["NodeNames"] == ["ts-b"] and body["Error"] == ""
    assert body["FailedAndUnresolvableNodes"] == {
        "dgx-0": "node does not match the pod's nodeSelector"
    }
    p = client.post(
        "/scheduler/prioritize", content=orjson.dumps({"Pod": pod, "NodeNames": ["ts-a", "ts-b"]})
    )
    assert p.json() == [{"Host": "ts-a", "Score": 0}, {"Host": "ts-b", "Score": 10}]
    b = client.post("/scheduler/bind", content=_bind_body(pod, "ts-b"))
    assert b.status_code == 200 and b.json() == {"Error": ""}
    assert binder.calls == [("infer-0", "ts-b", {})]
    snap = ext.cache.snapshot()
    assert (snap.node("ts-b").replicas_used, snap.node("ts-b").replicas_free) == (3, 5)
    assert snap.pods["serve/infer-0"].replicas == 3 and snap.pods["serve/infer-0"].gpus == ()
    # 6 replicas no longer fit on ts-b: ts-a takes them.
    big = make_pod("infer-1", 6, namespace="serve", node_selector=TS)
    r = client.post("/scheduler/filter", content=orjson.dumps({"Pod": big, "NodeNames": NAMES}))
    assert r.json()["NodeNames"] == ["ts-a"]
    # A bind straight to the full node is refused and holds nothing.
    ext.cache.release_nomination("serve/infer-1")
    b = client.post("/scheduler/bind", content=_bind_body(big, "ts-b"))
    assert b.json() == {"Error": REASON_REPLICAS_NOW}
    assert ext.cache.snapshot().node("ts-b").replicas_used == 3


def test_whole_gpu_pod_is_refused_on_replica_nodes_over_http() -> None:
    client, _, _ = _setup()
    pod = make_pod("train-0", 1, namespace="ml")
    r = client.post("/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": NAMES}))
    body = r.json()
    assert body["NodeNames"] == ["dgx-0"]
    assert body["FailedAndUnresolvableNodes"] == {
        "ts-a": REASON_REPLICA_NODE,
        "ts-b": REASON_REPLICA_NODE,
    }
    b = client.post("/scheduler/bind", content=_bind_body(pod, "ts-a"))
    assert b.json() == {"Error": REASON_REPLICA_NODE}
