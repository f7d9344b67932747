"""Issue 12, finding 2: one odd node must not take the extender down.

A node topoplace cannot model (more than ``MAX_NODE_GPUS`` GPUs, as time-slicing replicas
or HAMi split counts advertise; unreadable GPU counts or fields; a name shared by two
objects) is kept in the snapshot, logged, counted (``ClusterSnapshot.unmodeled_nodes``),
refused for GPU pods with the constant reason ``REASON_UNMODELED``, and every other node
is served. Before the fix ``nvidia.com/gpu: 80`` made every snapshot build fail with
OverflowError in ``core/snapshot.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from scheduler.core.health import REASON_UNMODELED
from scheduler.core.model import MAX_NODE_GPUS, Health
from scheduler.core.objects import ObjectError, node_gpus, request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.remediation import node_failure
from scheduler.core.schedule import filter_nodes, place_pod
from scheduler.core.snapshot import (
    UNMODELED_DUPLICATE,
    build_snapshot,
    pod_info_for,
    with_node_object,
    with_pod,
)
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.builders import make_node, make_pod
from tests.hardening.objects import GPU, gpu_node, set_path
from tests.helpers import asgi_client, with_reasons

P = SchedParams()
FABRIC = P.fabric


def one_gpu() -> Any:
    return request_from_pod(make_pod("p", 1), FABRIC)


ODD_NODES: list[tuple[str, dict[str, Any]]] = [
    ("time-slicing replicas (80)", gpu_node("odd", "80")),
    ("HAMi split count (640)", gpu_node("odd", 640)),
    ("one more than modelled", gpu_node("odd", str(MAX_NODE_GPUS + 1))),
    ("64 GPUs", gpu_node("odd", "64")),
    ("huge exponent", gpu_node("odd", "1e300000")),
    ("NaN", gpu_node("odd", "NaN")),
    ("negative", gpu_node("odd", "-8")),
    ("fractional", gpu_node("odd", "7.5")),
    ("capacity a list", set_path(make_node("odd", 8), "status.capacity", ["8"])),
    ("status a string", set_path(make_node("odd", 8), "status", "Ready")),
    ("labels a list", set_path(make_node("odd", 8), "metadata.labels", ["a"])),
    ("label value an int", set_path(make_node("odd", 8), "metadata.labels.rack", 7)),
    ("cpu NaN", set_path(make_node("odd", 8), "status.allocatable.cpu", "NaN")),
    ("memory 1e1000000", set_path(make_node("odd", 8), "status.allocatable.memory", "1e1000000")),
]


@pytest.mark.parametrize(("what", "odd"), ODD_NODES, ids=[w for w, _ in ODD_NODES])
def test_an_odd_node_is_refused_with_a_reason_and_the_rest_is_served(
    what: str, odd: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    good = make_node("good", 8)
    with caplog.at_level(logging.WARNING, logger="scheduler.core.snapshot"):
        snap = build_snapshot([odd, good], [], P)
    assert snap.names == ("good", "odd")
    assert snap.unmodeled_nodes == 1 and snap.unmodeled == ("odd",)
    node = snap.node("odd")
    assert node is not None and node.unmodeled and node.gpu_capacity == 0
    assert node.health.state == Health.UNHEALTHY and node.health.reasons == (REASON_UNMODELED,)
    assert any("odd" in r.getMessage() and "cannot model" in r.getMessage() for r in caplog.records)
    out = filter_nodes(snap, one_gpu(), None, P)
    assert out.feasible == ("good",)
    assert out.unresolvable == {"odd": REASON_UNMODELED}
    assert place_pod(snap, one_gpu(), P).assignments[0].node == "good"
    assert snap.node("good").unmodeled == ""  # type: ignore[union-attr]


def test_pods_on_an_odd_node_are_kept_and_cpu_only_pods_are_untouched() -> None:
    odd = gpu_node("odd", "80")
    running = make_pod("ts", 2, node="odd", gpu_indices=[70, 71])  # a time-sliced replica pair
    cpu_only = make_pod("web", 0, node="odd")
    snap = build_snapshot([odd, make_node("good", 8)], [running, cpu_only], P)
    assert {"default/ts", "default/web"} <= set(snap.pods)
    assert snap.pods["default/ts"].gpus == ()  # the model has no GPUs there
    assert snap.node("odd").cpu_used_milli == 16000  # type: ignore[union-attr]
    # The watch delivering the same pod again (pod_info_for + with_pod) does not raise.
    info = pod_info_for(snap, running, "odd")
    assert with_pod(snap, info).pods["default/ts"].gpus == ()
    # A pod asking no GPU is feasible on the odd node: topoplace has nothing to add.
    web = request_from_pod(make_pod("web2", 0), FABRIC)
    assert "odd" in filter_nodes(snap, web, None, P).feasible


def test_a_node_update_turns_it_unmodeled_and_back() -> None:
    snap = build_snapshot([make_node("a", 8), make_node("b", 8)], [make_pod("x", 2, node="b")], P)
    odd = with_node_object(snap, gpu_node("b", "96"), P)
    assert odd.unmodeled == ("b",) and "default/x" in odd.pods
    assert odd.node("a") == snap.node("a")
    assert filter_nodes(odd, one_gpu(), None, P).unresolvable == {"b": REASON_UNMODELED}
    # Not a hardware failure: its pods are not evicted for it.
    assert node_failure(odd.node("b"), P.remediation) == ""  # type: ignore[arg-type]
    back = with_node_object(odd, make_node("b", 8), P)
    # Back with pod x's 2 GPUs still held (the pod never left: its GPUs are not free).
    assert back.unmodeled == () and back.node("b").free_gpus == 6  # type: ignore[union-attr]
    assert back.node("b").used_mask.bit_count() == 2  # type: ignore[union-attr]
    # A brand-new odd node is added the same way.
    added = with_node_object(snap, gpu_node("c", "1e1000000"), P)
    assert added.names == ("a", "b", "c") and added.unmodeled == ("c",)


def test_duplicate_names_and_nameless_objects_do_not_fail_the_build() -> None:
    nodes = [
        make_node("a", 8),
        make_node("a", 4),
        {"metadata": {"labels": {}}},
        {"metadata": {"name": 5}},
        "not a node",
        None,
        make_node("b", 8),
    ]
    snap = build_snapshot(nodes, [], P)  # type: ignore[arg-type]
    assert snap.names == ("a", "b")
    assert snap.node("a").unmodeled == UNMODELED_DUPLICATE  # type: ignore[union-attr]
    with pytest.raises(ObjectError):
        with_node_object(snap, {"metadata": {}}, P)
    with pytest.raises(ObjectError):
        with_node_object(snap, ["not", "a", "node"], P)  # type: ignore[arg-type]


def test_node_gpus_never_raises_and_bounds_per_gpu_work() -> None:
    assert node_gpus(gpu_node("n", "8")) == (8, 8)
    for bad in ("80", "1e300000", "NaN", [1]):
        assert node_gpus(gpu_node("n", bad)) == (0, 0)
    assert node_gpus({"status": "x"}) == (0, 0)  # type: ignore[dict-item]


def test_the_cache_and_the_verbs_serve_a_cluster_with_an_odd_node() -> None:
    """The kube-mode path: the initial list and a watch update through the cache, then the
    filter verb over HTTP."""
    cache = ClusterCache.from_objects(
        [gpu_node("odd", "80"), make_node("good", 8)], [], with_reasons(P)
    )
    cache.upsert_node(gpu_node("odd2", "HAMi"))
    assert cache.snapshot().unmodeled_nodes == 2
    c = asgi_client(Extender(cache))
    pod = make_pod("p", 1)
    body = c.post(
        "/scheduler/filter",
        content=orjson.dumps({"Pod": pod, "NodeNames": ["good", "odd", "odd2"]}),
    ).json()
    assert body["NodeNames"] == ["good"]
    assert body["FailedAndUnresolvableNodes"] == {"odd": REASON_UNMODELED, "odd2": REASON_UNMODELED}
    assert body["Error"] == ""
    # Counted in /metrics and shown in the inspect API.
    metrics = c.get("/metrics").text
    assert "topoplace_unmodeled_nodes 2.0" in metrics
    shown = {n["name"]: n["unmodeled"] for n in c.get("/v1/inspect/nodes").json()["nodes"]}
    assert shown["good"] == "" and shown["odd"] and shown["odd2"]


def test_gpu_capacity_is_read_from_either_field() -> None:
    node = make_node("n", 8)
    del node["status"]["capacity"][GPU]
    assert build_snapshot([node], [], P).node("n").gpu_capacity == 8  # type: ignore[union-attr]
