"""The vectorized filter/prioritize path against per-node oracles and the general path.

``filter_codes`` and ``score_positions`` decide thousands of nodes with array operations,
and ``replies.NameTable`` serializes the answer from node positions. Each is checked here
against an independent per-node computation written from the node objects (not from the
arrays), on the demo cluster (unhealthy, cordoned, NotReady and degraded nodes) and on a
synthetic mixed fleet, with random requests and random candidate lists (shuffled, partial,
with unknown names).
"""

from __future__ import annotations

import math
import random

import numpy as np
import orjson
import pytest

from benchmarks.clusters import demo_cluster, make_pod, synthetic_cluster
from scheduler.core.linkclass import class_rank, feasible_sizes
from scheduler.core.model import Health
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.schedule import (
    CODE_CORDONED,
    CODE_LINK_NEVER,
    CODE_LINK_NOW,
    CODE_NO_GPUS,
    CODE_NODE_SELECTOR,
    CODE_NOT_ENOUGH_FREE,
    CODE_TOO_FEW_HEALTHY,
    CODE_UNHEALTHY,
    CODE_UNKNOWN,
    FEASIBLE,
    MAX_SCORE,
    filter_codes,
    name_positions,
    score_positions,
)
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.server import wire
from scheduler.server.extender import Extender
from scheduler.server.replies import NameTable
from topology.select import best_bottlenecks

LINKS = ("", "", "nvlink", "pxb", "sys")


def _cache(cluster: dict) -> ClusterCache:
    nodes = [o for o in cluster["items"] if o["kind"] == "Node"]
    pods = [o for o in cluster["items"] if o["kind"] == "Pod"]
    return ClusterCache.from_objects(nodes, pods, SchedParams())


@pytest.fixture(scope="module", params=["demo", "synthetic"])
def cache(request: pytest.FixtureRequest) -> ClusterCache:
    if request.param == "demo":
        return _cache(demo_cluster())
    return _cache(synthetic_cluster(300, seed=5))


def _links_ok(shape, mask: int, k: int, link: str) -> bool:
    return bool((feasible_sizes(shape, mask)[class_rank(link)] >> k) & 1)


def oracle_code(snap: ClusterSnapshot, name: str, req) -> int:
    """The filter verdict of one node, in precedence order, from the node object."""
    node = snap.node(name)
    k = req.gpus
    if node is None:
        return CODE_UNKNOWN
    if node.health.state >= Health.UNHEALTHY:
        return CODE_UNHEALTHY
    if node.health.unschedulable:
        return CODE_CORDONED
    if node.gpu_capacity == 0:
        return CODE_NO_GPUS
    if node.usable_mask.bit_count() < k:
        return CODE_TOO_FEW_HEALTHY
    big = k > snap.arrays.max_gpus
    if req.min_link and not big and not _links_ok(node.shape, node.usable_mask, k, req.min_link):
        return CODE_LINK_NEVER
    if node.free_mask.bit_count() < k:
        return CODE_NOT_ENOUGH_FREE
    if req.min_link and not big and not _links_ok(node.shape, node.free_mask, k, req.min_link):
        return CODE_LINK_NOW
    if any(node.labels.get(key) != v for key, v in req.node_selector.items()):
        return CODE_NODE_SELECTOR
    return FEASIBLE


def oracle_scores(snap: ClusterSnapshot, names: list[str], req, params: SchedParams) -> list[int]:
    """Scores per node from the node objects: the documented formula, one node at a time.

    Topology is relative to the best set any schedulable node of the snapshot could give
    (not only the candidates); the engine's choice (highest value, ties by lowest name)
    alone scores 10, the others floor(10 * value) capped at 9."""
    k = req.gpus
    width = snap.arrays.max_gpus

    def usable(node) -> bool:
        return (
            node is not None
            and node.health.state < Health.UNHEALTHY
            and not node.health.unschedulable
            and node.free_mask.bit_count() >= k
        )

    def bottleneck(node) -> float:
        table = best_bottlenecks(node.shape, node.free_mask, params.selection_policy)
        return table[k] if k < len(table) else 0.0

    top = 0.0
    if 2 <= k <= width:
        top = max((bottleneck(n) for n in snap.nodes if usable(n) and n.gpu_capacity), default=0.0)
    w = params.weights
    total = w.topology + w.health + w.packing
    raw: dict[int, float] = {}
    for i, name in enumerate(names):
        node = snap.node(name)
        if not usable(node) or (
            req.min_link
            and k <= width
            and not _links_ok(node.shape, node.free_mask, k, req.min_link)
        ):
            continue
        topo = bottleneck(node) / top if (2 <= k <= width and top > 0) else 1.0
        health = 1.0 - node.health.risk
        packing = k / node.free_mask.bit_count()
        raw[i] = (w.topology * topo + w.health * health + w.packing * packing) / total
    out = [0] * len(names)
    for i, r in raw.items():
        out[i] = min(MAX_SCORE - 1, max(0, math.floor(r * MAX_SCORE + 1e-9)))
    if raw:
        best = max(raw.values())
        out[min((i for i, r in raw.items() if r == best), key=lambda i: names[i])] = MAX_SCORE
    return out


def _requests(rng: random.Random, labels: list[dict]) -> list:
    reqs = []
    for i in range(40):
        ann = {}
        link = rng.choice(LINKS)
        if link:
            ann["topoplace.io/min-link"] = link
        selector = None
        if i % 7 == 0 and labels:
            key, value = rng.choice(sorted(rng.choice(labels).items()))
            selector = {key: value}
        pod = make_pod(
            f"p{i}", rng.choice([1, 1, 2, 3, 4, 6, 8, 9]), annotations=ann, node_selector=selector
        )
        reqs.append((pod, request_from_pod(pod, SchedParams().fabric)))
    return reqs


def _candidates(rng: random.Random, names: list[str], unknown: bool) -> list[str]:
    picked = rng.sample(names, rng.randint(1, len(names)))
    if unknown:
        picked.insert(rng.randrange(len(picked) + 1), f"ghost-{rng.randint(0, 9)}")
    return picked


def test_filter_codes_and_scores_match_per_node_oracles(cache: ClusterCache) -> None:
    rng = random.Random(11)
    snap = cache.snapshot()
    names = list(snap.names)
    labels = [n.labels for n in snap.nodes if n.labels]
    seen_codes: set[int] = set()
    for _pod, req in _requests(rng, labels):
        for trial in range(3):
            cand = _candidates(rng, names, unknown=trial == 2)
            pos = name_positions(snap, cand)
            codes = filter_codes(snap, req, pos, cache.params).tolist()
            assert codes == [oracle_code(snap, n, req) for n in cand]
            seen_codes.update(codes)
            scores = score_positions(snap, req, pos, cache.params).tolist()
            assert scores == oracle_scores(snap, cand, req, cache.params)
    # The random requests exercised the verdicts this cluster can produce.
    assert {FEASIBLE, CODE_UNKNOWN, CODE_NOT_ENOUGH_FREE} <= seen_codes
    if any(n.health.state >= Health.UNHEALTHY for n in snap.nodes):
        assert {CODE_UNHEALTHY, CODE_CORDONED, CODE_TOO_FEW_HEALTHY} <= seen_codes


def test_fast_replies_equal_the_general_path(cache: ClusterCache) -> None:
    """filter_json / prioritize_json (positions -> bytes) mean exactly what filter /
    prioritize (dict per node, orjson) say, for every request and candidate list."""
    ext = Extender(cache)
    rng = random.Random(23)
    snap = cache.snapshot()
    names = list(snap.names)
    labels = [n.labels for n in snap.nodes if n.labels]
    for pod, _req in _requests(rng, labels):
        pod = {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}
        for trial in range(2):
            args = {"Pod": pod, "Nodes": None, "NodeNames": _candidates(rng, names, trial == 1)}
            assert orjson.loads(ext.filter_json(args)) == ext.filter(args)
            assert orjson.loads(ext.prioritize_json(args)) == ext.prioritize(args)


@pytest.mark.parametrize(
    "names",
    [
        ["a"],
        ["node-1", "node-22", "node-333"],
        ['we"ird\\name', "tab\there", "ünïcode-ноду", "emoji-🚀", "x" * 40],
    ],
)
def test_name_table_serializes_like_orjson(names: list[str]) -> None:
    table = NameTable(names)
    rng = np.random.default_rng(3)
    for _ in range(10):
        pos = rng.integers(0, len(names), rng.integers(0, 2 * len(names) + 1))
        picked = [names[i] for i in pos]
        assert orjson.loads(table.array(pos)) == picked
        scores = rng.integers(0, MAX_SCORE + 1, len(pos))
        assert orjson.loads(table.host_priorities(pos, scores)) == [
            {"Host": n, "Score": int(s)} for n, s in zip(picked, scores, strict=True)
        ]
        members = table.entries(pos, orjson.dumps("why: 5%"))
        if len(pos):
            assert orjson.loads(b"{" + members[1:] + b"}") == dict.fromkeys(picked, "why: 5%")


def test_name_table_refuses_wasteful_padding() -> None:
    """One very long name among short ones would pad every record: refused, and the
    extender falls back to per-node serialization with the same answer."""
    names = [f"n{i}" for i in range(2000)] + ["x" * 250]
    with pytest.raises(ValueError):
        NameTable(names)
    NameTable([f"node-{i:05d}" for i in range(2000)] + ["node-99999-a"])  # near-uniform: fine


def _body(pod_name: str, names: list[str]) -> bytes:
    pod = make_pod(pod_name, 4)
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def test_names_memo_recognises_a_list_by_its_bytes() -> None:
    memo = wire.NamesMemo()
    names = [f"node-{i}" for i in range(50)]
    first = _body("a", names)
    _, got, _ = wire.extender_args(orjson.loads(first), first, memo)
    assert got == names
    # Another pod, same candidates: the list remembered from the first body comes back.
    second = _body("b", list(names))
    _, again, _ = wire.extender_args(orjson.loads(second), second, memo)
    assert again is got
    # One name different (same length): not recognised.
    for changed in ([*names[:-1], "node-x"], [*names[:10], "node-1x", *names[11:]]):
        other = _body("c", changed)
        _, fresh, _ = wire.extender_args(orjson.loads(other), other, memo)
        assert fresh == changed and fresh is not got


@pytest.mark.parametrize(
    "body",
    [
        # duplicate top-level keys: the last one wins, as orjson decides
        b'{"Pod":{},"NodeNames":["x"],"NodeNames":["a","b"]}',
        b'{"NodeNames":["x"],"Pod":{},"NodeNames":["a","b"]}',
        b'{"Pod":{},"nodenames":["x"],"NodeNames":["a","b"]}',
        b'{"Pod":{},"NodeNames":["a","b"],"nodenames":["x"]}',
        # a key named NodeNames inside the pod, spaces around the colon, trailing space
        b'{"Pod":{"NodeNames":["a","b"]},"NodeNames":["z"]}',
        b'{"Pod":{"NodeNames":["q"]},"NodeNames" : ["a","b"]}',
        b'{"Pod":{},"NodeNames":["a","b"]} ',
        b'{"NodeNames":["a","b"],"Pod":{"NodeNames":["a","b"]}}',
        b'{"Pod":{},"Nodes":null,"NodeNames":["a","b"]}',
        b'{"NodeNames":["zzz"],"Pod":{"x":{"NodeNames":["q"]}}}',
    ],
)
def test_names_memo_never_changes_what_the_body_says(body: bytes) -> None:
    """Whatever was remembered before, the names returned are the body's own."""
    memo = wire.NamesMemo()
    primers = [
        b'{"Pod":{},"NodeNames":["a","b"]}',
        b'{"Pod":{},"NodeNames":["z"]}',
        b'{"Pod":{"k":1},"NodeNames" : ["a","b"]}',
        b'{"Pod":{},"NodeNames":["a","b"]} ',
        # top-level names first, a nested NodeNames last: the tail says nothing about them
        b'{"NodeNames":["a"],"Pod":{"x":{"NodeNames":["q"]}}}',
    ]
    for primer in primers:
        wire.extender_args(orjson.loads(primer), primer, memo)
    obj = orjson.loads(body)
    assert wire.extender_args(obj, body, memo)[1] == wire.extender_args(obj)[1]
    assert wire.extender_args(obj, body, memo)[1] == wire.extender_args(obj)[1]  # remembered


def test_names_memo_still_rejects_non_strings() -> None:
    memo = wire.NamesMemo()
    good = b'{"Pod":{},"NodeNames":["a",1]}'
    for _ in range(2):
        with pytest.raises(wire.WireError):
            wire.extender_args(orjson.loads(good), good, memo)
