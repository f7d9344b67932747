"""The ``preempt`` verb over HTTP (ASGI app over httpx): kube-scheduler's
``ExtenderPreemptionArgs`` in the shape of ``../shared/fixtures/extender/preempt_args.json``
(``NodeNameToMetaVictims``, nodeCacheCapable), topoplace's answer out, and what it records.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from benchmarks.clusters import make_node, make_pod
from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender
from tests.helpers import asgi_client, fixture, fixture_cache, with_reasons
from tests.test_disruption import pdb


def _pod(name: str, gpus: int, priority: int = 0, **kw: Any) -> dict[str, Any]:
    p = make_pod(name, gpus, **kw)
    p["spec"]["priority"] = priority
    return p


def _args(pod: dict[str, Any], proposal: dict[str, list[dict[str, Any]]]) -> bytes:
    body = copy.deepcopy(fixture("preempt_args.json"))
    body["Pod"] = pod
    body["NodeNameToMetaVictims"] = {
        n: {"Pods": [{"UID": v["metadata"]["uid"]} for v in vs], "NumPDBViolations": 0}
        for n, vs in proposal.items()
    }
    return orjson.dumps(body)


def _count(ext: Extender, name: str, **labels: str) -> float:
    return ext.metrics.registry.get_sample_value(name, labels) or 0.0


def test_the_fixture_preemption_names_its_one_victim() -> None:
    ext = Extender(fixture_cache(with_reasons()))
    c = asgi_client(ext)
    r = c.post("/scheduler/preempt", content=orjson.dumps(fixture("preempt_args.json")))
    assert r.status_code == 200
    assert r.json() == fixture("preempt_result.json")
    # decided by topoplace, not passed through
    assert _count(ext, "topoplace_preemptions_total", outcome="chosen") == 1
    assert _count(ext, "topoplace_preemptions_total", outcome="passed") == 0
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert answer["chosen"]["node"] == "dgx-h100-04"
    assert [v["pod"] for v in answer["chosen"]["victims"]] == [
        "ml-batch/hparam-sweep-trial-17-0-6wq8r"
    ]


def _gang_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [make_node(n, 8, "h100") for n in ("a", "b", "c")]
    pods = [
        _pod("g-0", 4, node="a", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=2),
        _pod("g-1", 4, node="b", gpu_indices=[0, 1, 2, 3], gang="g", gang_size=2),
        _pod("lone", 4, node="a", gpu_indices=[4, 5, 6, 7]),
        _pod("top", 4, 900, node="b", gpu_indices=[4, 5, 6, 7]),
        _pod("top-c", 8, 900, node="c", gpu_indices=list(range(8))),
    ]
    return nodes, pods


def test_a_lone_pod_is_preempted_instead_of_the_gang_member_kube_scheduler_proposed() -> None:
    nodes, pods = _gang_cluster()
    ext = Extender(ClusterCache.from_objects(nodes, pods, SchedParams()), gangs=GangRuntime())
    c = asgi_client(ext)
    pending = _pod("infer", 4, 100)
    r = c.post("/scheduler/preempt", content=_args(pending, {"a": [pods[0]], "b": [pods[1]]}))
    assert r.json() == {
        "NodeNameToMetaVictims": {
            "a": {"Pods": [{"UID": pods[2]["metadata"]["uid"]}], "NumPDBViolations": 0}
        }
    }
    assert _count(ext, "topoplace_preemption_victims_total", gang="no") == 1
    view = c.get("/v1/inspect/preemptions").json()
    assert view["pending_teardowns"] == []
    assert view["recent"][0]["proposed"] == {"a": 1, "b": 1}


def test_breaking_a_gang_is_recorded_for_its_teardown() -> None:
    nodes, pods = _gang_cluster()
    pods[2]["spec"]["priority"] = 500  # the lone pod now outranks the gang
    ext = Extender(ClusterCache.from_objects(nodes, pods, SchedParams()), gangs=GangRuntime())
    c = asgi_client(ext)
    r = c.post("/scheduler/preempt", content=_args(_pod("infer", 4, 100), {"a": [pods[2]]}))
    victims = r.json()["NodeNameToMetaVictims"]
    assert victims == {"a": {"Pods": [{"UID": pods[0]["metadata"]["uid"]}], "NumPDBViolations": 0}}
    (pending,) = c.get("/v1/inspect/preemptions").json()["pending_teardowns"]
    assert (pending["gang"], pending["victim"], pending["members"]) == (
        "default/g",
        "default/g-0",
        1,
    )
    (b,) = ext.preemptions.broken()
    assert b.members == frozenset({pods[1]["metadata"]["uid"]})
    assert b.preemptor == "default/infer"


def test_a_gang_member_preempts_only_if_its_whole_gang_then_fits() -> None:
    nodes, pods = _gang_cluster()
    ext = Extender(ClusterCache.from_objects(nodes, pods, SchedParams()), gangs=GangRuntime())
    c = asgi_client(ext)
    # Three 8-GPU members at priority 100: with every lower pod gone only a (8 GPUs) is
    # free enough, b keeps "top", c keeps "top-c": the gang cannot fit, nothing is evicted.
    member = _pod("big-0", 8, 100, gang="big", gang_size=3)
    r = c.post("/scheduler/preempt", content=_args(member, {"a": [pods[0], pods[2]]}))
    assert r.json() == {"NodeNameToMetaVictims": {}}
    assert _count(ext, "topoplace_preemptions_total", outcome="none") == 1
    reason = c.get("/v1/inspect/preemptions").json()["recent"][0]["reason"]
    assert reason.startswith("the gang does not fit even with every lower-priority pod gone")
    # Two 4-GPU members fit (a's 8 GPUs once g-0 and lone go): the member preempts on a.
    duo = _pod("duo-0", 4, 100, gang="duo", gang_size=2)
    r = c.post("/scheduler/preempt", content=_args(duo, {"a": [pods[2]], "b": [pods[1]]}))
    (node,) = r.json()["NodeNameToMetaVictims"]
    assert node == "a"


def test_pods_topoplace_does_not_place_whole_get_kube_schedulers_victims_back() -> None:
    nodes, pods = _gang_cluster()
    ext = Extender(ClusterCache.from_objects(nodes, pods, SchedParams()), gangs=GangRuntime())
    c = asgi_client(ext)
    cpu_only = _pod("web", 0, 100)
    r = c.post("/scheduler/preempt", content=_args(cpu_only, {"a": [pods[0]]}))
    assert r.json() == {
        "NodeNameToMetaVictims": {
            "a": {"Pods": [{"UID": pods[0]["metadata"]["uid"]}], "NumPDBViolations": 0}
        }
    }
    assert _count(ext, "topoplace_preemptions_total", outcome="passed") == 1
    bad = c.post("/scheduler/preempt", content=b'{"Pod": 3}')
    assert bad.status_code == 400


def test_a_pod_preempts_again_only_once_its_last_preemption_no_longer_stands() -> None:
    # kube-scheduler sees its victims go before topoplace's watch does and may run the
    # pod's preemption again: no second node loses pods while the first victims are seen,
    # nor while the node they freed has room for the pod.
    nodes, pods = _gang_cluster()
    cache = ClusterCache.from_objects(nodes, pods, SchedParams())
    ext = Extender(cache, gangs=GangRuntime())
    c = asgi_client(ext)
    pending = _pod("infer", 4, 100)
    first = c.post("/scheduler/preempt", content=_args(pending, {"a": [pods[0]]})).json()
    assert list(first["NodeNameToMetaVictims"]) == ["a"]
    again = c.post("/scheduler/preempt", content=_args(pending, {"b": [pods[1]]})).json()
    assert again == {"NodeNameToMetaVictims": {}}
    assert _count(ext, "topoplace_preemptions_total", outcome="waiting") == 1
    # another pod is not held back
    other = c.post("/scheduler/preempt", content=_args(_pod("x", 4, 100), {"a": [pods[0]]}))
    assert list(other.json()["NodeNameToMetaVictims"]) == ["a"]
    # topoplace sees the victim go: the node has room for the pod now, still nothing more
    rest = [p for p in pods if p["metadata"]["name"] != "lone"]
    cache.replace_all(nodes, rest)
    third = c.post("/scheduler/preempt", content=_args(pending, {"b": [pods[1]]})).json()
    assert third == {"NodeNameToMetaVictims": {}}
    assert _count(ext, "topoplace_preemptions_total", outcome="waiting") == 2
    # another pod took the room meanwhile: the pod may preempt again
    taker = _pod("taker", 4, 900, node="a", gpu_indices=[4, 5, 6, 7])
    cache.replace_all(nodes, [*rest, taker])
    fourth = c.post("/scheduler/preempt", content=_args(pending, {"b": [pods[1]]})).json()
    assert list(fourth["NodeNameToMetaVictims"]) == ["b"]


def test_the_answer_counts_the_budget_violations_of_topoplaces_own_victims() -> None:
    # A PodDisruptionBudget (no disruption allowed) covers both pods on a. kube-scheduler's
    # dry run reports 0; one of them has to go (the lone pod, the gang member is given
    # back first), and topoplace's answer says 1.
    nodes, pods = _gang_cluster()
    for p in pods[0], pods[2]:
        p["metadata"]["labels"] = {"app": "llm"}
    budget = pdb("llm", {"matchLabels": {"app": "llm"}})
    cache = ClusterCache.from_objects(
        nodes, pods, SchedParams(), extra={BUDGETS_EXTRA: {"default/llm": budget}}
    )
    ext = Extender(cache, gangs=GangRuntime())
    c = asgi_client(ext)
    r = c.post("/scheduler/preempt", content=_args(_pod("infer", 4, 100), {"a": [pods[2]]}))
    assert r.json() == {
        "NodeNameToMetaVictims": {
            "a": {"Pods": [{"UID": pods[2]["metadata"]["uid"]}], "NumPDBViolations": 1}
        }
    }
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert answer["chosen"]["pdb_violations"] == 1
    assert _count(ext, "topoplace_preemption_budget_violations_total") == 1
    # the budget round-trips through the snapshot export
    items = c.get("/v1/inspect/snapshot").json()["items"]
    assert [i for i in items if i["kind"] == "PodDisruptionBudget"] == [budget]
