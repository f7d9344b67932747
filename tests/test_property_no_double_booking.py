"""Property: random filter/bind/delete sequences never double-book a GPU.

Hypothesis draws a small cluster of real shapes (DGX-1 V100, DGX H100, GB200 trays, a
PCIe server with unknown topology, some nodes unhealthy or with a cordoned GPU) and a
sequence of operations; every answer must be well-formed and, after every step, each GPU
is held by at most one pod, only healthy GPUs are handed out, and the cache agrees with
a from-scratch rebuild of its own snapshot listing.
"""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.clusters import make_node, make_pod
from scheduler.core.model import indices_to_mask
from scheduler.core.params import ExtenderParams, SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.helpers import asgi_client

SHAPES = [
    ("v100", 8, "DGX-1"),
    ("h100", 8, "DGX-H100"),
    ("gb200", 4, "GB200-NVL72"),
    ("l40s", 8, None),
]


@st.composite
def clusters(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(1, 5))
    nodes = []
    for i in range(n):
        product, gpus, machine = draw(st.sampled_from(SHAPES))
        ann = {}
        if draw(st.booleans()) and draw(st.booleans()):
            ann["hami.io/device-cordon"] = str(draw(st.integers(0, gpus - 1)))
        nodes.append(
            make_node(
                f"node-{i}",
                gpus,
                product,
                machine=machine,
                ready=draw(st.integers(0, 5)) > 0,
                annotations=ann,
            )
        )
    return nodes


# A pod's request is a function of its id: one name never asks for two different things.
GPUS = (1, 2, 1, 4, 8, 1, 2, 4, 1, 2, 8, 1)
LINKS = ("", "", "nvlink")
ops = st.lists(
    st.tuples(
        st.sampled_from(["filter_bind", "filter_bind", "bind_only", "delete"]), st.integers(0, 11)
    ),
    min_size=1,
    max_size=25,
)


def _check_invariants(ext: Extender) -> None:
    snap = ext.cache.snapshot()
    per_node: dict[str, int] = {}
    for p in snap.pods.values():
        m = indices_to_mask(p.gpus)
        assert not per_node.get(p.node, 0) & m, f"GPU double-booked on {p.node}"
        per_node[p.node] = per_node.get(p.node, 0) | m
    for n in snap.nodes:
        assert n.used_mask == per_node.get(n.name, 0)
        assert n.free_mask & n.used_mask == 0
        assert n.free_mask & n.health.bad_mask == 0
        assert int(snap.arrays.free[snap.index[n.name]]) == n.free_gpus


@pytest.mark.parametrize("decide_in_filter", [True, False])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), steps=ops)
def test_random_sequences_never_double_book(
    decide_in_filter: bool, nodes: list[dict], steps: list
) -> None:
    # Every verdict is sent (reasons_when_placed), so that each node's can be checked.
    params = replace(
        SchedParams(),
        extender=ExtenderParams(decide_in_filter=decide_in_filter, reasons_when_placed=True),
    )
    ext = Extender(ClusterCache.from_objects(nodes, [], params))
    c = asgi_client(ext)
    names = [n["metadata"]["name"] for n in nodes] + ["ghost"]
    bad_gpus = {n.name: n.health.bad_mask for n in ext.cache.snapshot().nodes}
    for op, pid in steps:
        gpus, link = GPUS[pid], LINKS[pid % 3]
        pod = make_pod(
            f"p{pid}", gpus, annotations={"topoplace.io/min-link": link} if link else None
        )
        m = pod["metadata"]
        if op == "delete":
            ext.cache.delete_pod(f"default/p{pid}")
            _check_invariants(ext)
            continue
        node = names[pid % len(names)]
        if op == "filter_bind":
            r = c.post("/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": names}))
            assert r.status_code == 200
            body = r.json()
            assert set(body) == {
                "Nodes",
                "NodeNames",
                "FailedNodes",
                "FailedAndUnresolvableNodes",
                "Error",
            }
            feasible = body["NodeNames"]
            listed = (
                set(feasible) | set(body["FailedNodes"]) | set(body["FailedAndUnresolvableNodes"])
            )
            if decide_in_filter:
                # Only the engine's choice passes; the other feasible nodes are left out.
                assert len(feasible) <= 1 and listed <= set(names)
                if feasible:
                    assert ext.cache.snapshot().pods[f"default/p{pid}"].node == feasible[0]
            else:
                assert listed == set(names), "every node gets a verdict"
            assert not set(feasible) & set(body["FailedNodes"])
            if feasible:
                node = feasible[pid % len(feasible)]
                if len(feasible) > 1:
                    scores = c.post(
                        "/scheduler/prioritize",
                        content=orjson.dumps({"Pod": pod, "NodeNames": feasible}),
                    ).json()
                    assert [s["Host"] for s in scores] == feasible
                    assert all(0 <= s["Score"] <= 10 for s in scores)
        r = c.post(
            "/scheduler/bind",
            content=orjson.dumps(
                {"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": node}
            ),
        )
        assert r.status_code == 200 and set(r.json()) == {"Error"}
        if r.json()["Error"] == "":
            held = ext.cache.snapshot().pods[f"default/p{pid}"]
            assert held.node == node and len(held.gpus) == gpus
            assert not indices_to_mask(held.gpus) & bad_gpus[node]
        _check_invariants(ext)
    listing = ext.snapshot_list()
    again = ClusterCache.from_objects(
        [i for i in listing["items"] if i["kind"] == "Node"],
        [i for i in listing["items"] if i["kind"] == "Pod"],
        SchedParams(),
    ).snapshot()
    assert {k: (p.node, p.gpus) for k, p in again.pods.items()} == {
        k: (p.node, p.gpus) for k, p in ext.cache.snapshot().pods.items()
    }
