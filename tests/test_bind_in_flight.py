"""A bind kube-scheduler gave up on (its ``httpTimeout``) may still be written: while it is,
filter offers that node alone and keeps the hold the write carries, and a bind to another
node is refused. Before, a retried filter decided afresh and replaced the hold, freeing the
GPUs (or GPU shares) the write was giving the pod, and other pods were placed on them: the
live fractional benchmark saw 12 GPUs overcommitted when binds took over 5 s.

In process, with a binder whose write waits until the test lets it finish (a stand-in for a
slow API server: ``SlowApiWriteMock``)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from benchmarks.clusters import make_node, make_pod
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import ERR_BIND_IN_FLIGHT, Extender
from tests.sharing.builders import hami_node, share_pod

NAMES = ["h100-a", "h100-b", "t4-a", "t4-b"]


class SlowApiWriteMock:
    """The Binding write, held until ``release`` is set; ``fail`` makes it fail."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.fail = ""
        self.started: list[tuple[str, str]] = []

    def bind(self, pod: Any, node: str, annotations: Any) -> str:  # pragma: no cover
        raise AssertionError("the event-loop write is used")

    async def bind_async(self, pod: Any, node: str, annotations: Any) -> str:
        self.started.append((pod["metadata"]["name"], node))
        await self.release.wait()
        return self.fail


def _ext() -> tuple[Extender, SlowApiWriteMock]:
    nodes = [make_node("h100-a", 8, "h100"), make_node("h100-b", 8, "h100")]
    nodes += [hami_node("t4-a", 4), hami_node("t4-b", 4)]
    binder = SlowApiWriteMock()
    return Extender(ClusterCache.from_objects(nodes, [], SchedParams()), binder), binder


def _filter(ext: Extender, pod: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(ext.filter_json({"Pod": pod, "NodeNames": NAMES}))


def _bind(ext: Extender, pod: dict[str, Any], node: str) -> Any:
    m = pod["metadata"]
    body = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    return ext.bind_async(body)


def _held(ext: Extender, pod: dict[str, Any]) -> tuple[Any, ...]:
    p = ext.cache.snapshot().pods[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"]
    return p.node, p.gpus, p.shares, p.assumed


def test_a_retried_filter_keeps_the_hold_of_a_bind_in_flight() -> None:
    async def run() -> None:
        ext, api = _ext()
        p = make_pod("p", 2)
        (node,) = _filter(ext, p)["NodeNames"]
        first = asyncio.ensure_future(_bind(ext, p, node))
        await asyncio.sleep(0)
        assert api.started == [("p", node)]
        held = _held(ext, p)
        assert held[3] is True and len(held[1]) == 2
        # kube-scheduler timed the bind out and schedules the pod again.
        again = _filter(ext, p)
        assert again["NodeNames"] == [node] and again["Error"] == ""
        assert _held(ext, p) == held  # the same GPUs, not a new decision
        # Another pod is not given the GPUs the write carries.
        q = make_pod("q", 6)
        (qnode,) = _filter(ext, q)["NodeNames"]
        if qnode == node:
            assert not set(_held(ext, q)[1]) & set(held[1])
        # A bind of the pod to another node is refused; the hold stays.
        other = next(n for n in ("h100-a", "h100-b") if n != node)
        res = await _bind(ext, p, other)
        assert res["Error"].startswith(ERR_BIND_IN_FLIGHT) and _held(ext, p) == held
        # The write lands: the pod is bound with its GPUs.
        api.release.set()
        assert (await first)["Error"] == ""
        assert _held(ext, p) == (node, held[1], (), False)
        assert ext.cache.binding("default/p") is None

    asyncio.run(run())


def test_a_retried_filter_keeps_the_shares_of_a_fractional_bind_in_flight() -> None:
    async def run() -> None:
        ext, api = _ext()
        p = share_pod("s", mem=6000, cores=40)
        (node,) = _filter(ext, p)["NodeNames"]
        first = asyncio.ensure_future(_bind(ext, p, node))
        await asyncio.sleep(0)
        held = _held(ext, p)
        assert held[2] and held[3] is True
        assert _filter(ext, p)["NodeNames"] == [node] and _held(ext, p) == held
        # The GPU the shares are on keeps them: a pod asking the rest of its memory and
        # compute cannot share it (T4: 15,360 MiB; 6,000 + 10,000 > 15,360).
        big = share_pod("big", mem=10000, cores=70)
        r = _filter(ext, big)
        if r["NodeNames"] == [node]:
            assert {s.gpu for s in _held(ext, big)[2]}.isdisjoint({s.gpu for s in held[2]})
        api.release.set()
        assert (await first)["Error"] == ""
        assert _held(ext, p) == (node, (), held[2], False)

    asyncio.run(run())


def test_after_a_failed_write_the_pod_is_decided_afresh() -> None:
    async def run() -> None:
        ext, api = _ext()
        api.fail = "binding failed: the API server answered 500"
        api.release.set()
        p = make_pod("p", 8)
        (node,) = _filter(ext, p)["NodeNames"]
        assert (await _bind(ext, p, node))["Error"] == api.fail
        assert ext.cache.binding("default/p") is None
        assert "default/p" not in ext.cache.snapshot().pods
        again = _filter(ext, p)
        assert again["NodeNames"] == [node] and again["FailedNodes"] == {}
        assert _held(ext, p)[3] is True  # nominated afresh for its next bind

    asyncio.run(run())
