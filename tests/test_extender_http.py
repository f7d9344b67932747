"""The extender over HTTP against the shared wire fixtures and captured kube-scheduler bodies."""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest

from benchmarks.clusters import as_list, make_node, make_pod
from scheduler.cli.demo import ServerThread
from scheduler.core.objects import request_from_pod
from scheduler.core.params import ExtenderParams, SchedParams
from scheduler.core.schedule import (
    REASON_CORDONED,
    REASON_NOT_ENOUGH_FREE,
    REASON_UNKNOWN_NODE,
    place_pod,
)
from scheduler.runtime.cache import ClusterCache
from scheduler.server.app import create_app
from scheduler.server.extender import ERR_UNKNOWN_POD, Extender
from tests.helpers import asgi_client, fixture, fixture_cache, with_reasons

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@pytest.fixture
def ext() -> Extender:
    """The fixtures' cluster, with the failed nodes' reasons sent even when a node is
    offered (``extender.reasons_when_placed``), so that every verdict can be read."""
    return Extender(fixture_cache(with_reasons()))


@pytest.fixture
def client(ext: Extender):
    return asgi_client(ext)


def _four_gpu_pod_alone() -> dict:
    """The fixture's pending pod without its gang markers (a lone 4-GPU pod)."""
    args = fixture("filter_args_nodenames.json")
    pod = copy.deepcopy(args["Pod"])
    pod["metadata"]["labels"].pop("scheduling.x-k8s.io/pod-group", None)
    for k in ("scheduling.k8s.io/group-name", "pod-group-name"):
        pod["metadata"]["annotations"].pop(k, None)
    return pod


def test_filter_nodenames_matches_fixture_verdicts(client) -> None:
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    r = client.post("/scheduler/filter", content=orjson.dumps(args))
    assert r.status_code == 200
    body = r.json()
    assert set(body) == FILTER_KEYS
    expected = fixture("filter_result_example.json")
    assert body["NodeNames"] == expected["NodeNames"] == ["dgx-h100-01"]
    assert body["Nodes"] is None
    assert set(body["FailedNodes"]) == set(expected["FailedNodes"]) == {"dgx-h100-04"}
    assert body["FailedNodes"]["dgx-h100-04"] == REASON_NOT_ENOUGH_FREE
    assert set(body["FailedAndUnresolvableNodes"]) == set(expected["FailedAndUnresolvableNodes"])
    assert body["FailedAndUnresolvableNodes"]["dgx-h100-02"] == "node not ready"
    assert body["FailedAndUnresolvableNodes"]["dgx-h100-03"] == REASON_CORDONED
    assert body["Error"] == ""


@pytest.mark.parametrize("payload", ["filter_args_nodenames.json", "filter_args_nodes.json"])
def test_a_reply_that_offers_a_node_leaves_the_reasons_out_by_default(payload: str) -> None:
    # Shipped default (extender.reasons_when_placed off): kube-scheduler reads the failed
    # nodes' reasons only for a pod it cannot place, so a reply offering a node sends none;
    # /metrics still counts every verdict, by reason.
    ext = Extender(fixture_cache())
    c = asgi_client(ext)
    args = fixture(payload)
    args["Pod"] = _four_gpu_pod_alone()
    body = c.post("/scheduler/filter", content=orjson.dumps(args)).json()
    offered = body["NodeNames"] or [n["metadata"]["name"] for n in body["Nodes"]["items"]]
    assert offered == ["dgx-h100-01"]
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
    metrics = c.get("/metrics").text
    assert 'topoplace_filter_nodes_total{result="feasible"} 1.0' in metrics
    assert 'topoplace_filter_nodes_total{result="unresolvable"} 2.0' in metrics
    assert 'topoplace_filter_nodes_total{result="failed"} 1.0' in metrics
    assert f'topoplace_filter_failures_total{{reason="{REASON_CORDONED}"}} 1.0' in metrics
    # A pod no node can take gets every reason: kube-scheduler's "0/4 nodes are
    # available" message and its choice of preemption candidates come from them.
    if args.get("NodeNames"):
        args["NodeNames"] = [n for n in args["NodeNames"] if n != "dgx-h100-01"]
    else:
        items = args["Nodes"]["items"]
        args["Nodes"]["items"] = [n for n in items if n["metadata"]["name"] != "dgx-h100-01"]
    body = c.post("/scheduler/filter", content=orjson.dumps(args)).json()
    assert not (body["NodeNames"] or (body["Nodes"] or {}).get("items"))
    assert body["FailedAndUnresolvableNodes"] == {
        "dgx-h100-02": "node not ready",
        "dgx-h100-03": REASON_CORDONED,
    }
    assert body["FailedNodes"] == {"dgx-h100-04": REASON_NOT_ENOUGH_FREE}


def test_filter_full_nodes_returns_node_objects(client) -> None:
    args = fixture("filter_args_nodes.json")
    args["Pod"] = _four_gpu_pod_alone()
    body = client.post("/scheduler/filter", content=orjson.dumps(args)).json()
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["dgx-h100-01"]
    # The node object is passed back whole, as kube-scheduler expects.
    assert body["Nodes"]["items"][0] == args["Nodes"]["items"][0]
    assert set(body["FailedAndUnresolvableNodes"]) == {"dgx-h100-02", "dgx-h100-03"}


def test_filter_accepts_lowercase_keys(client) -> None:
    args = fixture("filter_args_nodenames.json")
    lower = {"pod": _four_gpu_pod_alone(), "nodes": None, "nodenames": args["NodeNames"]}
    body = client.post("/scheduler/filter", content=orjson.dumps(lower)).json()
    assert body["NodeNames"] == ["dgx-h100-01"]


def test_filter_reasons_are_constant_strings(client) -> None:
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    body = client.post("/scheduler/filter", content=orjson.dumps(args)).json()
    for reason in [*body["FailedNodes"].values(), *body["FailedAndUnresolvableNodes"].values()]:
        assert "dgx" not in reason and not any(ch.isdigit() for ch in reason)


def test_unknown_node_is_failed_not_dropped(client) -> None:
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    args["NodeNames"] = ["dgx-h100-01", "ghost-node"]
    body = client.post("/scheduler/filter", content=orjson.dumps(args)).json()
    assert body["NodeNames"] == ["dgx-h100-01"]
    assert body["FailedNodes"] == {"ghost-node": REASON_UNKNOWN_NODE}


def test_pod_without_gpus_passes_untouched(client) -> None:
    pod = make_pod("web-0", 0)
    names = ["dgx-h100-01", "dgx-h100-02", "ghost"]
    body = client.post(
        "/scheduler/filter", content=orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
    ).json()
    assert body["NodeNames"] == names
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}


def test_prioritize_prefers_exact_fit(client) -> None:
    args = fixture("prioritize_args_nodenames.json")
    r = client.post("/scheduler/prioritize", content=orjson.dumps(args))
    assert r.status_code == 200
    scores = {e["Host"]: e["Score"] for e in r.json()}
    assert all(set(e) == {"Host", "Score"} for e in r.json())
    assert set(scores) == set(args["NodeNames"])
    assert all(0 <= s <= 10 for s in scores.values())
    # dgx-h100-04 has exactly the 2 free GPUs the pod asks for; 01 would be fragmented.
    assert scores["dgx-h100-04"] == 10
    assert scores["dgx-h100-04"] > scores["dgx-h100-01"]
    again = {
        e["Host"]: e["Score"]
        for e in client.post("/scheduler/prioritize", content=orjson.dumps(args)).json()
    }
    assert again == scores


def test_bind_records_gpus_and_next_filter_sees_them(client, ext: Extender) -> None:
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    client.post("/scheduler/filter", content=orjson.dumps(args))
    bind = fixture("bind_args.json")
    r = client.post("/scheduler/bind", content=orjson.dumps(bind))
    assert r.json() == fixture("bind_result_ok.json") == {"Error": ""}
    placements = client.get("/v1/inspect/placements").json()["placements"]
    mine = [p for p in placements if p["pod"] == "ml-train/llama3-70b-ft-worker-0-8kq2w"]
    assert len(mine) == 1 and mine[0]["node"] == "dgx-h100-01" and mine[0]["state"] == "bound"
    assert len(mine[0]["gpus"]) == 4
    assert ext.cache.snapshot().node("dgx-h100-01").free_gpus == 4
    # A second 4-GPU pod still fits; a third does not.
    for i, expect in ((1, ["dgx-h100-01"]), (2, [])):
        pod = copy.deepcopy(args["Pod"])
        pod["metadata"]["name"] = f"worker-{i}"
        pod["metadata"]["uid"] = f"uid-{i}"
        body = client.post("/scheduler/filter", content=orjson.dumps({**args, "Pod": pod})).json()
        assert body["NodeNames"] == expect
        if expect:
            b = client.post(
                "/scheduler/bind",
                content=orjson.dumps(
                    {
                        "PodName": f"worker-{i}",
                        "PodNamespace": "ml-train",
                        "PodUID": f"uid-{i}",
                        "Node": "dgx-h100-01",
                    }
                ),
            ).json()
            assert b == {"Error": ""}
        else:
            assert body["FailedNodes"]["dgx-h100-01"] == REASON_NOT_ENOUGH_FREE
    held = [
        p["gpus"]
        for p in client.get("/v1/inspect/placements").json()["placements"]
        if p["node"] == "dgx-h100-01"
    ]
    flat = [g for gs in held for g in gs]
    assert sorted(flat) == list(range(8))


def test_bind_is_idempotent_and_refuses_other_node(client) -> None:
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    client.post("/scheduler/filter", content=orjson.dumps(args))
    bind = fixture("bind_args.json")
    assert client.post("/scheduler/bind", content=orjson.dumps(bind)).json() == {"Error": ""}
    assert client.post("/scheduler/bind", content=orjson.dumps(bind)).json() == {"Error": ""}
    other = {**bind, "Node": "dgx-h100-04"}
    assert client.post("/scheduler/bind", content=orjson.dumps(other)).json()["Error"]


def test_bind_unknown_pod_and_full_node_answer_error(client) -> None:
    r = client.post(
        "/scheduler/bind",
        content=orjson.dumps(
            {"PodName": "nobody", "PodNamespace": "x", "PodUID": "u", "Node": "dgx-h100-01"}
        ),
    ).json()
    assert r["Error"] == ERR_UNKNOWN_POD
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    client.post("/scheduler/filter", content=orjson.dumps(args))
    full = {**fixture("bind_args.json"), "Node": "dgx-h100-04"}  # only 2 GPUs free there
    r = client.post("/scheduler/bind", content=orjson.dumps(full)).json()
    assert r["Error"] == REASON_NOT_ENOUGH_FREE
    # Nothing was held by the refused bind.
    assert all(
        p["pod"] != "ml-train/llama3-70b-ft-worker-0-8kq2w"
        for p in client.get("/v1/inspect/placements").json()["placements"]
    )


def test_bind_uid_mismatch_refused(client) -> None:
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    client.post("/scheduler/filter", content=orjson.dumps(args))
    r = client.post(
        "/scheduler/bind", content=orjson.dumps({**fixture("bind_args.json"), "PodUID": "other"})
    ).json()
    assert "UID" in r["Error"]


@pytest.mark.parametrize("args_file", ["preempt_args.json", "preempt_args_full.json"])
def test_preempt_passes_victims_through(client, args_file: str) -> None:
    r = client.post("/scheduler/preempt", content=orjson.dumps(fixture(args_file)))
    assert r.status_code == 200
    assert r.json() == fixture("preempt_result.json")


def _with_victims(key: str, victims: Any) -> dict[str, Any]:
    """The preempt fixture with its ``key`` map (``NodeNameToMetaVictims`` or
    ``NodeNameToVictims``) replaced by ``victims``, the other map dropped."""
    args = fixture("preempt_args.json")
    args.pop("NodeNameToVictims", None)
    args.pop("NodeNameToMetaVictims", None)
    args[key] = victims
    return args


@pytest.mark.parametrize(
    ("key", "victims", "needle"),
    [
        ("NodeNameToMetaVictims", {"dgx-h100-04": {"Pods": 5}}, "Pods must be a list"),
        ("NodeNameToMetaVictims", {"dgx-h100-04": {"Pods": True}}, "Pods must be a list"),
        ("NodeNameToMetaVictims", {"dgx-h100-04": {"Pods": 0}}, "Pods must be a list"),
        ("NodeNameToMetaVictims", {"dgx-h100-04": {"Pods": {"UID": "u"}}}, "Pods must be a list"),
        ("NodeNameToVictims", {"dgx-h100-04": {"Pods": 7}}, "Pods must be a list"),
        ("NodeNameToVictims", {"dgx-h100-04": {"Pods": [{"metadata": [1]}]}}, "metadata"),
        ("NodeNameToMetaVictims", {"dgx-h100-04": {"Pods": [{"UID": {"a": 1}}]}}, "UID"),
        ("NodeNameToMetaVictims", [{"Pods": []}], "victims map must be an object"),
        ("NodeNameToVictims", "dgx-h100-04", "victims map must be an object"),
        ("NodeNameToMetaVictims", {"dgx-h100-04": [1]}, "victims entry must be an object"),
    ],
)
def test_preempt_malformed_victims_is_a_clear_400(
    client, caplog, key: str, victims: Any, needle: str
) -> None:
    """Victims that are not lists of objects (issue #38): 400 with the reason, as every
    other malformed body, never a 200 over a traceback."""
    with caplog.at_level(logging.ERROR, logger="scheduler.server.app"):
        r = client.post("/scheduler/preempt", content=orjson.dumps(_with_victims(key, victims)))
    assert r.status_code == 400
    assert needle in r.json()["error"]
    assert not [rec for rec in caplog.records if rec.exc_info], "a traceback was logged"


def test_preempt_null_pods_is_an_empty_list() -> None:
    """``Pods: null`` is what Go sends for a nil slice: answered as ``Pods: []`` is (each
    on a fresh extender: an answer is remembered), not refused."""
    answers = []
    for pods in (None, []):
        args = _with_victims("NodeNameToMetaVictims", {"dgx-h100-04": {"Pods": pods}})
        c = asgi_client(Extender(fixture_cache(with_reasons())))
        r = c.post("/scheduler/preempt", content=orjson.dumps(args))
        assert r.status_code == 200
        answers.append(r.json())
    assert answers[0] == answers[1]
    assert set(answers[0]["NodeNameToMetaVictims"]) <= {"dgx-h100-04"}


def test_captured_kube_scheduler_bodies() -> None:
    """Bodies a real kube-scheduler v1.28.7 sent (nodeCacheCapable false, 8 H100 nodes)."""
    f = fixture("captured-kube-scheduler-v1.28.7/filter.json")
    nodes = f["Nodes"]["items"]
    # Every node can take the pod: without decide_in_filter all of them pass ...
    open_params = replace(SchedParams(), extender=ExtenderParams(decide_in_filter=False))
    open_ext = Extender(ClusterCache.from_objects(nodes, [], open_params))
    body = asgi_client(open_ext).post("/scheduler/filter", content=orjson.dumps(f)).json()
    assert sorted(n["metadata"]["name"] for n in body["Nodes"]["items"]) == sorted(
        n["metadata"]["name"] for n in nodes
    )
    # ... with it (the default), only the engine's choice does, as a whole Node object.
    ext = Extender(ClusterCache.from_objects(nodes, [], SchedParams()))
    c = asgi_client(ext)
    body = c.post("/scheduler/filter", content=orjson.dumps(f)).json()
    engine = place_pod(
        ext.cache.snapshot(), request_from_pod(f["Pod"], SchedParams().fabric), SchedParams()
    )
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == [engine.assignments[0].node]
    assert body["Nodes"]["items"][0] == next(
        n for n in nodes if n["metadata"]["name"] == engine.assignments[0].node
    )
    p = fixture("captured-kube-scheduler-v1.28.7/prioritize.json")
    scores = c.post("/scheduler/prioritize", content=orjson.dumps(p)).json()
    assert len(scores) == len(p["Nodes"]["items"]) and all(0 <= s["Score"] <= 10 for s in scores)
    b = fixture("captured-kube-scheduler-v1.28.7/bind.json")
    assert c.post("/scheduler/bind", content=orjson.dumps(b)).json() == {"Error": ""}
    held = ext.cache.snapshot().pods["default/smoke-gpu-1"]
    assert held.node == b["Node"] and len(held.gpus) == 1


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"Nodes": null, "NodeNames": ["a"]}', 400, "Pod"),
        (b'{"Pod": {}, "NodeNames": "a"}', 400, "NodeNames"),
        (b'{"Pod": {}, "Nodes": {"items": [1]}}', 400, "Nodes"),
        (b"", 400, "malformed JSON"),
    ],
    ids=["garbage", "array", "missing Pod", "NodeNames not a list", "bad Nodes items", "empty"],
)
def test_bad_filter_input_is_a_clear_400(client, body: bytes, status: int, needle: str) -> None:
    r = client.post("/scheduler/filter", content=body)
    assert r.status_code == status
    assert needle in r.json()["error"]


def test_bind_bad_input_400(client) -> None:
    r = client.post("/scheduler/bind", content=b'{"PodName": 3, "Node": "x"}')
    assert r.status_code == 400 and "PodName" in r.json()["error"].replace("podname", "PodName")
    r = client.post("/scheduler/bind", content=b'{"PodNamespace": "x"}')
    assert r.status_code == 400


def test_verbs_answer_post_only_and_other_paths_reach_fastapi(client) -> None:
    r = client.get("/scheduler/filter")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]
    assert client.post("/scheduler/nope", content=b"{}").status_code == 404
    assert client.get("/version").status_code == 200
    # A custom prefix moves the verbs with it.
    other = asgi_client(Extender(fixture_cache()), url_prefix="/ext/v1")
    args = fixture("prioritize_args_nodenames.json")
    assert other.post("/ext/v1/prioritize", content=orjson.dumps(args)).status_code == 200
    assert other.post("/scheduler/prioritize", content=orjson.dumps(args)).status_code == 404


def test_oversized_body_is_413() -> None:
    ext = Extender(fixture_cache())
    c = asgi_client(ext, max_body_bytes=1024)
    r = c.post(
        "/scheduler/filter", content=b'{"Pod": {}, "NodeNames": [' + b'"n",' * 400 + b'"n"]}'
    )
    assert r.status_code == 413
    assert "larger than 1024" in r.json()["error"]
    # The server still answers afterwards.
    assert c.get("/healthz").status_code == 200


def test_health_ready_version_metrics(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert "version" in client.get("/version").json()
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    client.post("/scheduler/filter", content=orjson.dumps(args))
    client.post("/scheduler/filter", content=b"nope")
    text = client.get("/metrics").text
    assert 'topoplace_requests_total{code="200",verb="filter"} 1.0' in text
    assert 'topoplace_requests_total{code="400",verb="filter"} 1.0' in text
    assert 'topoplace_filter_failures_total{reason="node cordoned"} 1.0' in text
    assert "topoplace_request_seconds_bucket" in text
    assert "topoplace_nodes 4.0" in text


def test_readyz_false_until_ready() -> None:
    ready = threading.Event()
    ext = Extender(fixture_cache(), ready=ready.is_set)
    c = asgi_client(ext)
    assert c.get("/readyz").status_code == 503
    ready.set()
    assert c.get("/readyz").status_code == 200


def test_snapshot_round_trips(client, ext: Extender) -> None:
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    client.post("/scheduler/filter", content=orjson.dumps(args))
    client.post("/scheduler/bind", content=orjson.dumps(fixture("bind_args.json")))
    listing = client.get("/v1/inspect/snapshot").json()
    assert listing["kind"] == "List"
    nodes = [i for i in listing["items"] if i["kind"] == "Node"]
    pods = [i for i in listing["items"] if i["kind"] == "Pod"]
    again = ClusterCache.from_objects(nodes, pods, SchedParams()).snapshot()
    before = ext.cache.snapshot()
    assert [(n.name, n.used_mask) for n in again.nodes] == [
        (n.name, n.used_mask) for n in before.nodes
    ]


def test_concurrent_binds_over_real_http_never_double_book() -> None:
    """16 one-GPU pods race for 8 GPUs on one node through a real uvicorn server."""
    cache = ClusterCache.from_objects([make_node("solo", 8, "h100")], [], SchedParams())
    ext = Extender(cache)
    pods = [make_pod(f"p{i}", 1) for i in range(16)]
    with ServerThread(create_app(ext)) as srv, httpx.Client(base_url=srv.url) as c:
        for p in pods:
            c.post("/scheduler/filter", content=orjson.dumps({"Pod": p, "NodeNames": ["solo"]}))
        results: list[str] = []

        def bind(p: dict) -> None:
            with httpx.Client(base_url=srv.url) as cc:
                m = p["metadata"]
                r = cc.post(
                    "/scheduler/bind",
                    content=orjson.dumps(
                        {
                            "PodName": m["name"],
                            "PodNamespace": "default",
                            "PodUID": m["uid"],
                            "Node": "solo",
                        }
                    ),
                )
                results.append(r.json()["Error"])

        threads = [threading.Thread(target=bind, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(results).count("") == 8
    assert results.count(REASON_NOT_ENOUGH_FREE) == 8
    held = [g for p in ext.cache.snapshot().pods.values() for g in p.gpus]
    assert sorted(held) == list(range(8))


def test_demo_cluster_file_has_the_promised_cases() -> None:
    from scheduler.cli.clusterfile import demo_cluster_path, load_cluster

    nodes, pods, _ = load_cluster(demo_cluster_path())
    assert 24 <= len(nodes) <= 28
    ext = Extender(ClusterCache.from_objects(nodes, pods, SchedParams()))
    snap = ext.cache.snapshot()
    states = {n.name: n.health for n in snap.nodes}
    assert states["dgx-h100-03"].reasons[0] == "node not ready"
    assert states["dgx-h100-04"].unschedulable
    assert states["gb200-r000-t05"].reasons[0] == "GPU fault condition"
    assert states["dgx1-v100-02"].bad_mask == 1 << 3
    assert snap.node("pcie-l40s-02").shape_source == "assumed"
    assert (
        sum(1 for n in snap.nodes if n.labels.get("nvidia.com/gpu.product") == "NVIDIA-GB200") == 18
    )
    assert len(snap.pods) == 5  # the Succeeded pod holds nothing


def test_demo_cluster_yaml_matches_builder() -> None:
    """config/clusters/demo.yaml is generated by benchmarks.clusters.demo_cluster()."""
    import yaml

    from benchmarks.clusters import demo_cluster
    from scheduler.cli.clusterfile import demo_cluster_path

    assert yaml.safe_load(demo_cluster_path().read_text()) == demo_cluster()


def test_assumed_topology_is_never_better_than_sys() -> None:
    """A node with unknown interconnect is usable but fails an NVLink requirement."""
    node = make_node("mystery", 8, "l40s")
    ext = Extender(ClusterCache.from_objects([node], [], SchedParams()))
    c = asgi_client(ext)
    plain = make_pod("a", 2)
    body = c.post(
        "/scheduler/filter", content=orjson.dumps({"Pod": plain, "NodeNames": ["mystery"]})
    ).json()
    assert body["NodeNames"] == ["mystery"]
    nv = make_pod("b", 2, annotations={"topoplace.io/min-link": "nvlink"})
    body = c.post(
        "/scheduler/filter", content=orjson.dumps({"Pod": nv, "NodeNames": ["mystery"]})
    ).json()
    assert body["NodeNames"] == []
    assert "mystery" in body["FailedAndUnresolvableNodes"]
    assert "topoplace_nodes_assumed_topology 1.0" in c.get("/metrics").text


def test_invalid_min_link_is_an_error_not_a_crash() -> None:
    ext = Extender(ClusterCache.from_objects([make_node("n", 8)], [], SchedParams()))
    c = asgi_client(ext)
    pod = make_pod("a", 2, annotations={"topoplace.io/min-link": "warp-drive"})
    body = c.post(
        "/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["n"]})
    ).json()
    assert body["Error"].startswith("invalid pod: unknown link class")


def test_cluster_list_helper_is_a_list() -> None:
    assert as_list([])["kind"] == "List"


def test_fixture_gang_member_keeps_hardware_reasons() -> None:
    """The fixture pod carries all three pod-group markers: with the gang runtime, its
    one-member plan decides the node while broken nodes keep their "never" reasons."""
    from scheduler.runtime.gangs import GangRuntime

    ext = Extender(fixture_cache(with_reasons()), gangs=GangRuntime())
    c = asgi_client(ext)
    body = c.post(
        "/scheduler/filter", content=orjson.dumps(fixture("filter_args_nodenames.json"))
    ).json()
    assert body["NodeNames"] == ["dgx-h100-01"]
    assert body["FailedAndUnresolvableNodes"] == {
        "dgx-h100-02": "node not ready",
        "dgx-h100-03": REASON_CORDONED,
    }
    assert set(body["FailedNodes"]) == {"dgx-h100-04"}
    assert c.post("/scheduler/bind", content=orjson.dumps(fixture("bind_args.json"))).json() == {
        "Error": ""
    }
    placed = ext.cache.snapshot().pods["ml-train/llama3-70b-ft-worker-0-8kq2w"]
    assert (
        placed.gang == "ml-train/llama3-70b-ft"
        and placed.node == "dgx-h100-01"
        and len(placed.gpus) == 4
    )
    ann = placed.raw["metadata"]["annotations"]["topoplace.io/placement"]
    rec = orjson.loads(ann)
    assert rec["v"] == 1 and rec["gang"] == "ml-train/llama3-70b-ft" and rec["plan"]


def test_prioritize_json_fast_path_equals_general_path() -> None:
    """The pre-serialized reply matches the dict-per-node reply byte for byte in meaning,
    including unknown and odd host names (escaped)."""
    ext = Extender(fixture_cache())
    args = fixture("prioritize_args_nodenames.json")
    args["NodeNames"] = [*args["NodeNames"], "ghost", 'we"ird\\name', "dgx-h100-02"]
    fast = orjson.loads(ext.prioritize_json(args))
    assert fast == ext.prioritize(args)
    assert fast[-3:] == [
        {"Host": "ghost", "Score": 0},
        {"Host": 'we"ird\\name', "Score": 0},
        {"Host": "dgx-h100-02", "Score": 0},
    ]
    assert orjson.loads(ext.prioritize_json(args)) == fast  # cached prefixes give the same reply


def test_bind_reuses_the_request_filter_read(client, ext: Extender, monkeypatch) -> None:
    """Bind takes the request filter read from the same pod object instead of reading the
    pod again; a pod bind has not seen in a filter is still read (and bound)."""
    import scheduler.server.extender as extender_mod

    reads: list[str] = []

    def counting(pod, fabric=None):
        reads.append(pod["metadata"]["name"])
        return request_from_pod(pod, fabric)

    monkeypatch.setattr(extender_mod, "request_from_pod", counting)
    args = fixture("filter_args_nodenames.json")
    args["Pod"] = _four_gpu_pod_alone()
    name = args["Pod"]["metadata"]["name"]
    client.post("/scheduler/filter", content=orjson.dumps(args))
    assert reads == [name]
    r = client.post("/scheduler/bind", content=orjson.dumps(fixture("bind_args.json")))
    assert r.json() == {"Error": ""} and reads == [name]
    (p,) = [
        p
        for p in client.get("/v1/inspect/placements").json()["placements"]
        if p["pod"] == f"ml-train/{name}"
    ]
    assert p["node"] == "dgx-h100-01" and len(p["gpus"]) == 4
    # Held without a filter's request (as the watch stores it): bind reads it itself.
    other = copy.deepcopy(args["Pod"])
    other["metadata"].update(name="late", uid="uid-late")
    ext.cache.remember_pending(other)
    bind = {"PodName": "late", "PodNamespace": "ml-train", "PodUID": "uid-late"}
    r = client.post("/scheduler/bind", content=orjson.dumps({**bind, "Node": "dgx-h100-01"}))
    assert r.json() == {"Error": ""} and reads == [name, "late"]
