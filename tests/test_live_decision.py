"""The live decision is the engine's decision: filter narrows kube-scheduler's candidates to
the engine's choice and holds its GPUs for the bind (a nomination); prioritize ranks that
choice alone at the top; the offline engine (``place_pod``) makes the same choices in the
same order. Real HTTP through the ASGI app, real-shaped Node and Pod objects."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import orjson
import pytest

from benchmarks.clusters import dgx_h100_nodes, make_node, make_pod
from scheduler.core.model import PodInfo
from scheduler.core.objects import request_from_pod
from scheduler.core.params import ExtenderParams, SchedParams
from scheduler.core.schedule import (
    MAX_SCORE,
    name_positions,
    place_pod,
    rank_positions,
    score_positions,
)
from scheduler.core.snapshot import build_snapshot, with_pod
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.gang.test_extender_gangs import Clock
from tests.helpers import asgi_client

P = SchedParams()


def _ext(nodes: list[dict], params: SchedParams = P, clock: Clock | None = None) -> Extender:
    cache = ClusterCache.from_objects(nodes, [], params)
    if clock is not None:
        cache = ClusterCache(cache.snapshot(), params, clock)
    return Extender(cache)


def http_filter(c, pod: dict, names: list[str]) -> dict:
    """POST /scheduler/filter for ``pod`` over ``names``; the parsed reply."""
    r = c.post("/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": names}))
    assert r.status_code == 200
    return r.json()


def http_bind(c, pod: dict, node: str) -> str:
    """POST /scheduler/bind of ``pod`` to ``node``; the reply's Error."""
    m = pod["metadata"]
    body = {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    r = c.post("/scheduler/bind", content=orjson.dumps(body))
    assert r.status_code == 200
    return r.json()["Error"]


def _schedule(c, pod: dict, names: list[str]) -> str:
    """What kube-scheduler does with one feasible node: bind there."""
    body = http_filter(c, pod, names)
    assert len(body["NodeNames"]) == 1, body
    node = body["NodeNames"][0]
    assert http_bind(c, pod, node) == ""
    return node


def test_sixteen_one_gpu_pods_fill_two_nodes_not_sixteen() -> None:
    nodes = dgx_h100_nodes(8)
    names = [n["metadata"]["name"] for n in nodes]
    ext = _ext(nodes)
    c = asgi_client(ext)
    placed = [_schedule(c, make_pod(f"one-{i:02d}", 1), names) for i in range(16)]
    assert placed == [names[0]] * 8 + [names[1]] * 8
    snap = ext.cache.snapshot()
    assert sorted(snap.pods[f"default/one-{i:02d}"].gpus for i in range(8)) == [
        (g,) for g in range(8)
    ]
    assert ext.cache.nominations() == 0  # every nomination became a bound placement


def test_live_sequence_equals_the_offline_engine() -> None:
    """A mixed arrival sequence through filter+bind lands exactly where ``place_pod`` on
    successive snapshots puts it (same nodes, same GPUs)."""
    nodes = dgx_h100_nodes(6) + [make_node(f"a100-{i}", 8, "a100") for i in range(3)]
    names = [n["metadata"]["name"] for n in nodes]
    sizes = [8, 1, 2, 1, 4, 1, 1, 8, 2, 2, 1, 4, 1, 3, 1, 1, 2, 8, 1, 1]
    pods = [make_pod(f"p{i:02d}", g) for i, g in enumerate(sizes)]
    ext = _ext(nodes)
    c = asgi_client(ext)
    live = []
    for pod in pods:
        node = _schedule(c, pod, names)
        live.append((node, ext.cache.snapshot().pods[f"default/{pod['metadata']['name']}"].gpus))
    snap = build_snapshot(nodes, [], P)
    offline = []
    for pod in pods:
        req = request_from_pod(pod, P.fabric)
        res = place_pod(snap, req, P)
        (a,) = res.assignments
        offline.append((a.node, a.gpus))
        snap = with_pod(snap, PodInfo(req.key, "", a.node, a.gpus))
    assert live == offline


def test_filter_nominates_and_the_next_filter_sees_it() -> None:
    """Bind is asynchronous: the next pod's filter arrives before the previous bind. The
    nomination already holds the GPUs, so the two decisions never collide."""
    nodes = dgx_h100_nodes(2)
    names = [n["metadata"]["name"] for n in nodes]
    ext = _ext(nodes)
    c = asgi_client(ext)
    a, b = make_pod("a", 6), make_pod("b", 4)
    (na,) = http_filter(c, a, names)["NodeNames"]
    held = ext.cache.snapshot().pods["default/a"]
    assert held.assumed and len(held.gpus) == 6 and ext.cache.nominations() == 1
    (nb,) = http_filter(c, b, names)["NodeNames"]
    assert nb != na  # 2 GPUs left on a's node: b (4) must go elsewhere
    assert http_bind(c, b, nb) == "" and http_bind(c, a, na) == ""
    snap = ext.cache.snapshot()
    assert snap.pods["default/a"].gpus == held.gpus  # the bind took the nominated GPUs
    assert not snap.pods["default/a"].assumed and ext.cache.nominations() == 0


def test_bind_elsewhere_releases_the_nomination() -> None:
    nodes = dgx_h100_nodes(2)
    names = [n["metadata"]["name"] for n in nodes]
    ext = _ext(nodes)
    c = asgi_client(ext)
    pod = make_pod("x", 8)
    (chosen,) = http_filter(c, pod, names)["NodeNames"]
    other = next(n for n in names if n != chosen)
    assert http_bind(c, pod, other) == ""
    snap = ext.cache.snapshot()
    assert snap.pods["default/x"].node == other
    assert snap.node(chosen).free_gpus == 8 and snap.node(other).free_gpus == 0


def test_retried_filter_and_ttl_release_the_nomination() -> None:
    nodes = dgx_h100_nodes(2)
    names = [n["metadata"]["name"] for n in nodes]
    clock = Clock()
    params = replace(P, extender=ExtenderParams(nomination_ttl_seconds=5.0))
    ext = _ext(nodes, params, clock)
    c = asgi_client(ext)
    pod = make_pod("y", 8)
    (first,) = http_filter(c, pod, names)["NodeNames"]
    # A retry of the same pod decides afresh: its own earlier hold does not push it away.
    assert http_filter(c, pod, names)["NodeNames"] == [first]
    assert sum(n.free_gpus for n in ext.cache.snapshot().nodes) == 8
    clock.t += 5.0  # kube-scheduler never bound it (a later plugin failed, the pod went away)
    http_filter(c, make_pod("z", 1), names)
    snap = ext.cache.snapshot()
    assert "default/y" not in snap.pods and ext.cache.nominations() == 1  # only z's


def test_deleting_a_pending_pod_releases_its_nomination() -> None:
    nodes = dgx_h100_nodes(1)
    ext = _ext(nodes)
    c = asgi_client(ext)
    http_filter(c, make_pod("gone", 8), [nodes[0]["metadata"]["name"]])
    ext.cache.delete_pod("default/gone")
    assert ext.cache.snapshot().nodes[0].free_gpus == 8 and ext.cache.nominations() == 0


def test_decide_in_filter_off_returns_every_feasible_node() -> None:
    nodes = dgx_h100_nodes(4)
    names = [n["metadata"]["name"] for n in nodes]
    ext = _ext(nodes, replace(P, extender=ExtenderParams(decide_in_filter=False)))
    body = http_filter(asgi_client(ext), make_pod("open", 2), names)
    assert body["NodeNames"] == names and ext.cache.nominations() == 0


def test_prioritize_ranks_used_nodes_strictly_and_gives_the_choice_alone_ten() -> None:
    """Nodes with 0, 1, 2 and 3 GPUs used used to tie at 6 (the 0..10 integer); now the
    engine ranks them strictly and only its choice gets 10."""
    nodes = dgx_h100_nodes(4)
    names = [n["metadata"]["name"] for n in nodes]
    pods = [
        make_pod(f"u{i}-{j}", 1, node=names[i], gpu_indices=[j]) for i in range(4) for j in range(i)
    ]
    snap = build_snapshot(nodes, pods, P)
    req = request_from_pod(make_pod("new", 1), P.fabric)
    pos = name_positions(snap, names)
    rank = rank_positions(snap, req, pos, P)
    assert np.all(np.diff(rank) > 0)  # more used (fewer free) ranks strictly higher
    scores = score_positions(snap, req, pos, P).tolist()
    assert scores[3] == MAX_SCORE and max(scores[:3]) < MAX_SCORE
    assert scores == sorted(scores)
    # Over HTTP, the same scores.
    ext = Extender(ClusterCache.from_objects(nodes, pods, P))
    r = asgi_client(ext).post(
        "/scheduler/prioritize",
        content=orjson.dumps({"Pod": make_pod("new", 1), "NodeNames": names}),
    )
    assert [h["Score"] for h in r.json()] == scores


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({"decide_in_filter": "yes"}, "decide_in_filter must be true or false"),
        ({"nomination_ttl_seconds": 0}, r"nomination_ttl_seconds must be in \(0, 3600\]"),
        ({"nomination_ttl_seconds": "soon"}, "nomination_ttl_seconds must be a number"),
        ({"ttl": 3}, "unknown extender settings"),
        ({"reasons_when_placed": 1}, "reasons_when_placed must be true or false"),
    ],
)
def test_extender_policy_section_is_validated(section: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SchedParams.from_config({"extender": section})
    ok = SchedParams.from_config(
        {"extender": {"decide_in_filter": False, "nomination_ttl_seconds": 12}}
    )
    assert ok.extender == ExtenderParams(decide_in_filter=False, nomination_ttl_seconds=12.0)
    assert not ok.extender.reasons_when_placed
    on = SchedParams.from_config({"extender": {"reasons_when_placed": True}})
    assert on.extender.reasons_when_placed


def test_ties_go_to_the_lowest_name_whatever_the_snapshot_order() -> None:
    nodes = list(reversed(dgx_h100_nodes(5)))  # snapshot positions in reverse name order
    snap = build_snapshot(nodes, [], P)
    req = request_from_pod(make_pod("t", 2), P.fabric)
    (a,) = place_pod(snap, req, P).assignments
    assert a.node == "dgx-h100-00000"
    pos = name_positions(snap, ["dgx-h100-00003", "dgx-h100-00001", "dgx-h100-00004"])
    scores = score_positions(snap, req, pos, P).tolist()
    assert scores[1] == MAX_SCORE and scores[0] < MAX_SCORE and scores[2] < MAX_SCORE


def test_bind_and_watch_confirmation_reuse_the_node_arrays() -> None:
    """A nomination turning into a bind, and the watch confirming that bind, change only
    the pod's record: no copy of the node arrays (the per-pod cost at 5,000 nodes)."""
    nodes = dgx_h100_nodes(3)
    names = [n["metadata"]["name"] for n in nodes]
    ext = _ext(nodes)
    c = asgi_client(ext)
    pod = make_pod("r", 2)
    (node,) = http_filter(c, pod, names)["NodeNames"]
    arrays = ext.cache.snapshot().arrays
    assert http_bind(c, pod, node) == ""
    assert ext.cache.snapshot().arrays is arrays
    bound = dict(ext.cache.snapshot().pods["default/r"].raw)
    ext.cache.upsert_pod(bound)  # the watch's MODIFIED event with spec.nodeName set
    snap = ext.cache.snapshot()
    assert snap.arrays is arrays and not snap.pods["default/r"].assumed
    assert snap.node(node).free_gpus == 6
