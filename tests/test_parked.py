"""Single GPU pods that only topoplace refused come back when GPUs they can use free
(``scheduler.runtime.parked``): through the real ``Extender`` and ``ClusterCache`` on real
DGX H100 node objects; the waker records what it would patch (kube mode patches an
annotation through the API, which cannot run here)."""

from __future__ import annotations

from typing import Any

import orjson

from benchmarks.clusters import dgx_h100_nodes, make_pod
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.runtime.parked import WAKE_BACKOFF_SECONDS
from scheduler.server import wire
from scheduler.server.extender import Extender
from tests.health.builders import Clock
from tests.sharing.builders import RecordingBinder

P = SchedParams()


class RecordingWakerNoApi:
    """Stands in for ``PodWaker.wake`` (an annotation patch through the API)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str]] = []

    def __call__(self, keys: list[str], why: str) -> None:
        self.calls.append((list(keys), why))


def _setup(pods: list[dict[str, Any]] = (), nodes: int = 1) -> tuple[Any, ...]:  # type: ignore[assignment]
    clock = Clock(1000.0)
    objs = dgx_h100_nodes(nodes)
    cache = ClusterCache(build_snapshot(objs, list(pods), P), P, clock)
    ext = Extender(cache, RecordingBinder(), gangs=GangRuntime())
    waker = RecordingWakerNoApi()
    ext.parked.waker = waker
    return cache, ext, waker, clock, [o["metadata"]["name"] for o in objs]


def _filter(
    cache: ClusterCache, ext: Extender, pod: dict[str, Any], names: list[str] | None = None
) -> list[str]:
    """``pod`` through filter, offered ``names`` (every node by default): what it passed."""
    cache.upsert_pod(pod)
    offered = list(cache.snapshot().names) if names is None else names
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": offered})
    return list(orjson.loads(ext.filter_json(wire.RawBody(body), body))["NodeNames"] or [])


def test_a_pod_refused_for_gpus_is_woken_once_they_free() -> None:
    """A (8 GPUs) is refused while X holds 4 of the node's 8; X goes; the next poll wakes
    A, once (the backoff holds a second wake); offered a node, A is no longer parked."""
    (node,) = dgx_h100_nodes(1)
    name = node["metadata"]["name"]
    x = make_pod("x", 4, namespace="ml", node=name, gpu_indices=[0, 1, 2, 3])
    cache, ext, waker, clock, _ = _setup([x])
    a = make_pod("a", 8, namespace="ml")
    assert _filter(cache, ext, a) == []
    parked = ext.parked.get("ml/a")
    assert parked is not None and (parked.gpus, parked.candidates) == (8, 0b1)
    assert ext.parked.poll(cache) == [] and waker.calls == []  # nothing freed yet
    cache.delete_pod("ml/x")
    assert ext.parked.poll(cache) == ["ml/a"]
    assert waker.calls == [(["ml/a"], "GPUs freed since the refusal")]
    clock.t += WAKE_BACKOFF_SECONDS[0] - 0.1
    assert ext.parked.poll(cache) == []  # woken, not yet retried: no second wake so soon
    assert _filter(cache, ext, a) == [name]
    assert ext.parked.get("ml/a") is None and len(ext.parked) == 0


def test_gpus_only_topoplace_held_wake_the_pod_when_they_go() -> None:
    """Y's nomination (filter chose GPUs, no bind came) is topoplace's own hold: no cluster
    event tells kube-scheduler when it lapses. A, refused meanwhile, is woken once the
    janitor has expired it."""
    cache, ext, waker, clock, names = _setup()
    assert _filter(cache, ext, make_pod("y", 8, namespace="ml")) == names
    a = make_pod("a", 8, namespace="ml")
    assert _filter(cache, ext, a) == []
    assert ext.parked.poll(cache) == []
    clock.t += P.extender.nomination_ttl_seconds + 1
    assert cache.expire() == ["ml/y"]
    assert ext.parked.poll(cache) == ["ml/a"]


def test_wakes_follow_the_refusal_order_and_the_free_gpus() -> None:
    """Three 8-GPU pods refused on a full node: when it frees, the first refused is woken
    (8 free GPUs take one of them); the others wait for more."""
    (node,) = dgx_h100_nodes(1)
    name = node["metadata"]["name"]
    x = make_pod("x", 8, namespace="ml", node=name, gpu_indices=list(range(8)))
    cache, ext, waker, clock, _ = _setup([x])
    for p in ("p1", "p2", "p3"):
        assert _filter(cache, ext, make_pod(p, 8, namespace="ml")) == []
    # p1 is retried by kube-scheduler and refused again: it keeps its place.
    assert _filter(cache, ext, make_pod("p1", 8, namespace="ml")) == []
    cache.delete_pod("ml/x")
    assert ext.parked.poll(cache) == ["ml/p1"]
    assert len(ext.parked) == 3


def test_a_pod_refused_with_gpus_free_is_not_parked() -> None:
    """A pod refused while a node had GPUs enough (here: its nodeSelector matches no node)
    is not parked: GPUs are not what it waits for."""
    (node,) = dgx_h100_nodes(1)
    name = node["metadata"]["name"]
    x = make_pod("x", 4, namespace="ml", node=name, gpu_indices=[0, 1, 2, 3])
    cache, ext, waker, clock, _ = _setup([x])
    picky = make_pod("picky", 2, namespace="ml", node_selector={"pool": "nowhere"})
    assert _filter(cache, ext, picky) == []
    assert ext.parked.get("ml/picky") is None
    cache.delete_pod("ml/x")
    assert ext.parked.poll(cache) == [] and waker.calls == []


def test_only_gpus_on_the_pods_candidates_wake_it() -> None:
    """kube-scheduler offered A one node (the others failed its in-tree filters): GPUs
    freed on another node do not wake A; freed on its candidate, they do, also after nodes
    came and went (positions in the snapshot moved)."""
    objs = dgx_h100_nodes(3)
    n0, n1, n2 = (o["metadata"]["name"] for o in objs)
    full = [
        make_pod(f"x{i}", 8, namespace="ml", node=n, gpu_indices=list(range(8)))
        for i, n in enumerate((n0, n1, n2))
    ]
    cache, ext, waker, clock, _ = _setup(full, nodes=3)
    a = make_pod("a", 8, namespace="ml")
    assert _filter(cache, ext, a, [n1]) == []
    cache.delete_pod("ml/x0")
    assert ext.parked.poll(cache) == []  # n0 is not A's
    cache.delete_node(n0)  # positions move: n1 is now first
    extra = dgx_h100_nodes(4)[3]
    cache.upsert_node(extra)  # and a node A was not offered comes (8 free GPUs)
    assert ext.parked.poll(cache) == []
    cache.delete_pod("ml/x1")
    assert ext.parked.poll(cache) == ["ml/a"]


def test_pods_bound_or_gone_are_dropped_and_nothing_is_kept_without_a_waker() -> None:
    (node,) = dgx_h100_nodes(1)
    name = node["metadata"]["name"]
    x = make_pod("x", 8, namespace="ml", node=name, gpu_indices=list(range(8)))
    cache, ext, waker, clock, _ = _setup([x])
    assert _filter(cache, ext, make_pod("a", 8, namespace="ml")) == []
    cache.delete_pod("ml/a")  # deleted while parked: no longer pending
    assert ext.parked.poll(cache) == [] and len(ext.parked) == 0
    ext.parked.waker = None  # serve --cluster: nobody parks pods
    assert _filter(cache, ext, make_pod("b", 8, namespace="ml")) == []
    assert len(ext.parked) == 0


def test_metrics_show_the_parked_pods() -> None:
    """``/metrics`` over real HTTP (the ASGI app through httpx): one refused pod parked."""
    import asyncio

    import httpx

    from scheduler.server.app import create_app

    (node,) = dgx_h100_nodes(1)
    name = node["metadata"]["name"]
    x = make_pod("x", 8, namespace="ml", node=name, gpu_indices=list(range(8)))
    cache, ext, waker, clock, _ = _setup([x])
    assert _filter(cache, ext, make_pod("a", 8, namespace="ml")) == []

    async def scrape() -> str:
        transport = httpx.ASGITransport(app=create_app(ext))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get("/metrics")).text

    text = asyncio.run(scrape())
    assert "topoplace_parked_pods 1.0" in text


def test_pods_refused_while_the_cache_was_behind_are_woken_once_it_caught_up() -> None:
    """Whatever refused them: pods refused since the cache fell behind (here: a
    nodeSelector no node matches, which no GPU count explains) are woken when the watch
    says it caught up, those refused before are not, and a pod woken so and refused
    again waits out a backoff before the next such wake."""
    cache, ext, waker, clock, _ = _setup()
    early = make_pod("early", 2, namespace="ml", node_selector={"pool": "nowhere"})
    assert _filter(cache, ext, early) == []
    clock.t += 10
    since = clock.t
    late = make_pod("late", 2, namespace="ml", node_selector={"pool": "nowhere"})
    assert _filter(cache, ext, late) == []
    fits = make_pod("fits", 1, namespace="ml")
    assert _filter(cache, ext, fits) != []  # offered a node: nothing to wake
    assert ext.parked.wake_refused_since(since, cache, "caught up") == ["ml/late"]
    assert waker.calls == [(["ml/late"], "caught up")]
    assert _filter(cache, ext, late) == []  # refused again, right away
    assert ext.parked.wake_refused_since(since, cache, "caught up") == []  # backoff
    clock.t += WAKE_BACKOFF_SECONDS[0]
    assert ext.parked.wake_refused_since(since, cache, "caught up") == ["ml/late"]
    cache.delete_pod("ml/late")
    clock.t += WAKE_BACKOFF_SECONDS[-1]
    assert ext.parked.wake_refused_since(since, cache, "caught up") == []  # gone


def test_a_share_pod_refused_while_a_nomination_held_its_gpu_is_woken_when_it_lapses() -> None:
    """A fractional (HAMi) pod is not parked for GPUs, but a hold of topoplace's own that
    lapses frees memory no API event announces: the pods refused while it held (within
    the longest hold's TTL) are woken at the next poll, once."""
    from tests.sharing.builders import hami_node, share_pod

    clock = Clock(1000.0)
    cache = ClusterCache(build_snapshot([hami_node("t4-0", gpus=1)], [], P), P, clock)
    ext = Extender(cache, RecordingBinder(), gangs=GangRuntime())
    waker = RecordingWakerNoApi()
    ext.parked.waker = waker
    assert ext.parked.poll(cache) == []  # the first poll learns the count of lapsed holds
    big = share_pod("big", mem=15000, cores=50)
    assert _filter(cache, ext, big) == ["t4-0"]  # nominated: the GPU's memory is held
    small = share_pod("small", mem=4000, cores=20)
    assert _filter(cache, ext, small) == []
    assert ext.parked.get("infer/small") is None  # not parked for GPUs
    assert ext.parked.poll(cache) == []  # nothing lapsed
    clock.t += P.extender.nomination_ttl_seconds + 1
    assert cache.expire() == ["infer/big"]
    assert ext.parked.poll(cache) == ["infer/small"]
    assert waker.calls[-1] == (["infer/small"], "held resources lapsed")
    assert ext.parked.poll(cache) == []  # once


def test_one_window_wakes_at_most_max_wakes_pods_the_longest_refused_first(monkeypatch) -> None:
    import scheduler.runtime.parked as parked_mod

    monkeypatch.setattr(parked_mod, "MAX_WAKES", 2)
    cache, ext, waker, clock, _ = _setup()
    for i in range(4):
        clock.t += 1
        pod = make_pod(f"w{i}", 2, namespace="ml", node_selector={"pool": "nowhere"})
        assert _filter(cache, ext, pod) == []
    assert ext.parked.wake_refused_since(0.0, cache, "caught up") == ["ml/w0", "ml/w1"]
    assert ext.parked.wake_refused_since(0.0, cache, "caught up") == ["ml/w2", "ml/w3"]


def test_refusals_of_pods_that_went_are_forgotten_not_kept_to_the_cap() -> None:
    """The refusal store held every pod refused and never offered a node since, up to
    10,000: a pod refused and then deleted stayed, as a wake window only looked at
    refusals inside it. Now a window drops every gone pod it passes, and a poll forgets
    refusals older than ``REFUSED_KEPT_S`` (kube-scheduler retries a pending pod well
    within it, so a pod still pending is refused again and stays)."""
    from scheduler.runtime.parked import REFUSED_KEPT_S

    cache, ext, waker, clock, _ = _setup()
    for name in ("gone-early", "gone-late", "waiting"):
        clock.t += 1
        pod = make_pod(name, 2, namespace="ml", node_selector={"pool": "nowhere"})
        assert _filter(cache, ext, pod) == []
    assert ext.parked.sizes()["refused_at"] == (3, ext.parked.limit)
    cache.delete_pod("ml/gone-early")
    cache.delete_pod("ml/gone-late")
    # a window that begins after every refusal still drops the pods that went
    assert ext.parked.wake_refused_since(clock.t + 1, cache, "caught up") == []
    assert ext.parked.sizes()["refused_at"][0] == 1
    # the pod still pending is refused again within REFUSED_KEPT_S: it stays
    clock.t += REFUSED_KEPT_S - 1
    waiting = cache.pending("ml/waiting")
    assert waiting is not None and _filter(cache, ext, dict(waiting)) == []
    clock.t += 2
    ext.parked.poll(cache)
    assert ext.parked.sizes()["refused_at"][0] == 1
    # not refused again for longer than REFUSED_KEPT_S: forgotten at the next poll
    clock.t += REFUSED_KEPT_S + 1
    ext.parked.poll(cache)
    assert ext.parked.sizes()["refused_at"][0] == 0
    assert waker.calls == []
