"""Only kube-scheduler's own requests make topoplace bind (issue 12, finding 3): a bind for a
pod of another scheduler, an already bound pod, a node topoplace's filter refuses now (cordon,
health, nodeSelector, room), or a node without the CPU/memory is refused with a reason and
holds nothing; every bind and refusal is one JSON log line; gang reservations a filter call
can make are bounded per namespace. Real HTTP through the ASGI app."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest

from benchmarks.clusters import dgx_h100_nodes, make_node, make_pod
from scheduler.core.params import GangParams, SchedParams
from scheduler.core.schedule import REASON_CORDONED, REASON_NODE_SELECTOR, REASON_NOT_ENOUGH_FREE
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import REASON_GANG_UNPLACEABLE, GangRuntime
from scheduler.server.extender import (
    ERR_ALREADY_BOUND,
    ERR_NO_ROOM_CPU_MEMORY,
    ERR_NOT_OUR_PROFILE,
    ERR_UNKNOWN_POD,
    Extender,
)
from tests.builders import gang_pod
from tests.helpers import asgi_client
from tests.test_live_decision import http_bind as _bind
from tests.test_live_decision import http_filter as _filter

P = SchedParams()


def _ext(nodes: list[dict], pods: list[dict] = (), params: SchedParams = P, **kw: Any) -> Extender:
    return Extender(
        ClusterCache.from_objects(nodes, list(pods), params), profiles={"topoplace"}, **kw
    )


def _held(ext: Extender) -> dict[str, Any]:
    return dict(ext.cache.snapshot().pods)


def test_pod_of_another_scheduler_is_not_bound() -> None:
    nodes = dgx_h100_nodes(2)
    ext = _ext(nodes)
    c = asgi_client(ext)
    pod = make_pod("foreign", 2, scheduler_name="default-scheduler")
    body = _filter(c, pod, [n["metadata"]["name"] for n in nodes])
    assert len(body["NodeNames"]) == 2  # filtered, but nothing decided or held for it
    assert _bind(c, pod, nodes[0]["metadata"]["name"]) == ERR_NOT_OUR_PROFILE
    assert not _held(ext) and ext.cache.nominations() == 0


def test_bound_pod_and_unknown_pod_are_refused() -> None:
    nodes = dgx_h100_nodes(2)
    names = [n["metadata"]["name"] for n in nodes]
    already = make_pod("already", 1, node=names[1], gpu_indices=[0])
    stranger = make_pod("stranger", 1)
    pods = {"already": already, "stranger": stranger}
    ext = _ext(
        nodes,
        params=P,
        fetch_pod=lambda ns, name: pods["already"] if name == "already" else None,
    )
    c = asgi_client(ext)
    assert _bind(c, already, names[0]) == "pod is already bound to another node"
    assert _bind(c, already, names[1]) == ERR_ALREADY_BOUND
    assert _bind(c, stranger, names[0]) == ERR_UNKNOWN_POD
    assert not _held(ext)


def test_node_that_filter_refuses_now_is_refused_at_bind() -> None:
    cordoned = make_node("cordoned", 8, unschedulable=True)
    labelled = make_node("labelled", 8, labels={"pool": "a"})
    full = make_node("full", 8)
    occupant = make_pod("occupant", 8, node="full", gpu_indices=range(8))
    ext = _ext([cordoned, labelled, full], [occupant])
    c = asgi_client(ext)
    pod = make_pod("p", 2, node_selector={"pool": "b"})
    _filter(c, pod, ["cordoned", "labelled", "full"])  # seen, nothing feasible
    assert _bind(c, pod, "cordoned") == REASON_CORDONED
    assert _bind(c, pod, "labelled") == REASON_NODE_SELECTOR
    plain = make_pod("q", 2)
    _filter(c, plain, ["full"])
    assert _bind(c, plain, "full") == REASON_NOT_ENOUGH_FREE
    assert set(_held(ext)) == {"default/occupant"}


def test_pod_asking_for_more_cpu_than_the_node_has_is_refused() -> None:
    nodes = dgx_h100_nodes(1)
    name = nodes[0]["metadata"]["name"]
    ext = _ext(nodes)
    c = asgi_client(ext)
    greedy = make_pod("greedy", 1, cpu="100000")
    (chosen,) = _filter(c, greedy, [name])["NodeNames"]  # topoplace filters GPUs only
    assert _bind(c, greedy, chosen) == ERR_NO_ROOM_CPU_MEMORY
    assert not _held(ext)  # the nomination was released with the refusal


def test_every_bind_and_refusal_is_one_json_line(caplog: pytest.LogCaptureFixture) -> None:
    nodes = dgx_h100_nodes(1)
    name = nodes[0]["metadata"]["name"]
    ext = _ext(nodes)
    c = asgi_client(ext)
    good, foreign = make_pod("good", 2), make_pod("x", 1, scheduler_name="other")
    _filter(c, good, [name])
    _filter(c, foreign, [name])
    with caplog.at_level(logging.INFO, logger="topoplace.bind"):
        assert _bind(c, good, name) == ""
        assert _bind(c, foreign, name) == ERR_NOT_OUR_PROFILE
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "topoplace.bind"]
    assert [(x["pod"], x["result"], x["reason"]) for x in lines] == [
        ("default/good", "bound", ""),
        ("default/x", "refused", ERR_NOT_OUR_PROFILE),
    ]
    assert lines[0]["node"] == name and len(lines[0]["gpus"]) == 2
    assert set(lines[0]) == {"event", "pod", "uid", "node", "gpus", "result", "reason", "caller"}
    # The HTTP layer names the caller (httpx's ASGI transport reports 127.0.0.1:123).
    assert lines[0]["caller"] == lines[1]["caller"] == "127.0.0.1:123"


def test_gang_reservations_are_bounded_per_namespace() -> None:
    params = replace(P, gang=GangParams(max_reserved_gpus_per_namespace=16))
    nodes = dgx_h100_nodes(6)
    names = [n["metadata"]["name"] for n in nodes]
    ext = Extender(
        ClusterCache.from_objects(nodes, [], params), gangs=GangRuntime(), profiles={"topoplace"}
    )
    c = asgi_client(ext)
    big = gang_pod("big-0", 8, "big", 3, namespace="team-a")  # 24 GPUs > 16
    r = _filter(c, big, names)
    assert r["NodeNames"] == [] and set(r["FailedNodes"].values()) == {REASON_GANG_UNPLACEABLE}
    ok = gang_pod("ok-0", 8, "ok", 2, namespace="team-a")  # 16 GPUs: fits the bound
    assert len(_filter(c, ok, names)["NodeNames"]) == 1
    more = gang_pod("more-0", 8, "more", 1, namespace="team-a")  # 16 held + 8 > 16
    assert _filter(c, more, names)["NodeNames"] == []
    other = gang_pod("b-0", 8, "b", 2, namespace="team-b")  # another namespace: its own bound
    assert len(_filter(c, other, names)["NodeNames"]) == 1
    reserved = [k for k in _held(ext) if k.startswith("gang-reservation:")]
    assert sorted(k.split("#")[0] for k in reserved) == [
        "gang-reservation:team-a/ok",
        "gang-reservation:team-a/ok",
        "gang-reservation:team-b/b",
        "gang-reservation:team-b/b",
    ]


def test_max_reserved_gpus_per_namespace_is_validated() -> None:
    with pytest.raises(ValueError, match="max_reserved_gpus_per_namespace"):
        SchedParams.from_config({"gang": {"max_reserved_gpus_per_namespace": -1}})
    assert (
        SchedParams.from_config(
            {"gang": {"max_reserved_gpus_per_namespace": 0}}
        ).gang.max_reserved_gpus_per_namespace
        == 0
    )


def test_kube_mode_binds_only_for_the_configured_profiles() -> None:
    """kube mode's extender takes its profiles from TOPOPLACE_SCHEDULER_NAMES, defaulting to
    the shipped configuration's ``topoplace``."""
    from scheduler.kube.runner import build_kube_runtime, options_from_env
    from scheduler.kube.watcher import WatchOptions
    from tests.test_kube_adapter import fake_api

    def profiles(env: dict[str, str]) -> frozenset[str] | None:
        opts = replace(
            options_from_env(env), watch=WatchOptions(podgroups=False), expire_interval_s=0
        )
        rt = build_kube_runtime(fake_api(podgroups=False), P, options=opts, gangs=None)
        return rt.extender.profiles

    assert profiles({}) == {"topoplace"}
    assert profiles({"TOPOPLACE_SCHEDULER_NAMES": "topoplace, gpu-batch"}) == {
        "topoplace",
        "gpu-batch",
    }


def test_a_pod_that_fills_the_node_cpu_exactly_binds_after_its_nomination() -> None:
    """The nomination already counts the pod's CPU and memory on the chosen node: the bind
    check must not count them twice (openb pods ask for most of a node's CPU)."""
    node = make_node("exact", 8, cpu="64", memory="256Gi")
    ext = _ext([node])
    c = asgi_client(ext)
    pod = make_pod("fills", 1, cpu="64", memory="256Gi")
    assert _filter(c, pod, ["exact"])["NodeNames"] == ["exact"]
    assert _bind(c, pod, "exact") == ""
    over = make_pod("over", 1, cpu="1")
    assert _filter(c, over, ["exact"])["NodeNames"] == ["exact"]  # topoplace filters GPUs only
    assert _bind(c, over, "exact") == ERR_NO_ROOM_CPU_MEMORY


def test_inspected_snapshot_leaks_no_secrets_and_still_loads_back() -> None:
    """Issue 12, finding 6: /v1/inspect/snapshot returned whole pod specs with inline env."""
    nodes = dgx_h100_nodes(2)
    pod = make_pod("app", 2, node=nodes[0]["metadata"]["name"], gpu_indices=[0, 1])
    c0 = pod["spec"]["containers"][0]
    c0["env"] = [{"name": "DB_PASSWORD", "value": "hunter2"}]
    c0["command"] = ["sh", "-c", "login --token s3cr3t"]
    pod["spec"]["volumes"] = [{"name": "creds", "secret": {"secretName": "db-creds"}}]
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = (
        '{"spec": {"containers": [{"env": [{"value": "hunter2"}]}]}}'
    )
    ext = _ext(nodes, [pod])
    body = asgi_client(ext).get("/v1/inspect/snapshot")
    assert body.status_code == 200
    text = body.text
    for secret in ("hunter2", "s3cr3t", "db-creds", "last-applied-configuration"):
        assert secret not in text
    listing = body.json()
    (item,) = [i for i in listing["items"] if i["kind"] == "Pod"]
    assert item["spec"]["containers"][0]["resources"] == c0["resources"]
    again = ClusterCache.from_objects(
        [i for i in listing["items"] if i["kind"] == "Node"],
        [i for i in listing["items"] if i["kind"] == "Pod"],
        P,
    ).snapshot()
    assert again.pods["default/app"].gpus == (0, 1)
    assert again.pods["default/app"].node == nodes[0]["metadata"]["name"]


def test_kube_mode_bind_goes_through_the_http_layer_with_its_caller() -> None:
    """kube mode's extender (readiness and drain around bind) takes the caller the HTTP
    layer passes; a refusal still answers over HTTP (found by the live suite)."""
    from scheduler.kube.runner import KubeExtender

    nodes = dgx_h100_nodes(1)
    ext = KubeExtender(ClusterCache.from_objects(nodes, [], P), profiles={"topoplace"})
    c = asgi_client(ext)
    foreign = make_pod("x", 1, scheduler_name="other")
    _filter(c, foreign, [nodes[0]["metadata"]["name"]])
    assert _bind(c, foreign, nodes[0]["metadata"]["name"]) == ERR_NOT_OUR_PROFILE
