"""Preemption topoplace starts for a gang kube-scheduler will not preempt for
(``preemption.start``; ``core.preemption.gang_victims``,
``server.started_preemption.start_gang``, ``kube.preemptor``).

Two DGX H100 nodes (NVSwitch), each with four of its eight GPUs held by a pod of low
priority. A gang of two 4-GPU members that must share one node
(``topoplace.io/topology-required: node``, tensor parallelism over NVLink) arrives at high
priority: each member passes kube-scheduler's filters on both nodes (four GPUs free by its
count), so its DefaultPreemption names no victim and never calls the ``preempt`` verb;
topoplace refuses the gang as a whole. topoplace evicts the pods of the lowest priority
that free one node, plans the gang there when they are gone, and wakes its members.

The filter and preempt verbs go over HTTP (the ASGI app); the evictions and Events go over
real HTTP to :class:`RecordedApiServer`, which stands in for the API server (none runs in
CI) and answers with bodies recorded from kube-apiserver v1.33.0.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from benchmarks.clusters import make_node, make_pod
from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.params import SchedParams
from scheduler.core.preemption import (
    REASON_GANG_NO_FIT,
    REASON_GANG_NO_LOWER,
    REASON_GANG_NOT_NEEDED,
    GangChoice,
    gang_victims,
)
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.runtime.stranded import GRACE_S, gang_record_key
from scheduler.server.extender import Extender
from tests.health.builders import Clock
from tests.helpers import asgi_client
from tests.kube.recorded import RecordedApiServer
from tests.test_disruption import pdb
from tests.test_started_preemption import _answers, _preemptor, _sample

NS = "default"
GANG = f"{NS}/tp"
KEY = gang_record_key(GANG)
ONE_NODE = {"topoplace.io/topology-required": "node"}


def _pod(name: str, gpus: int, priority: int, **kw: Any) -> dict[str, Any]:
    p = make_pod(name, gpus, **kw)
    p["spec"]["priority"] = priority
    return p


def _member(i: int, priority: int = 1000, **spec: Any) -> dict[str, Any]:
    p = _pod(f"tp-{i}", 4, priority, gang="tp", gang_size=2, annotations=ONE_NODE)
    p["spec"].update(spec)
    return p


def _setup(
    fill: list[dict[str, Any]] | None = None,
    preempt: str = "evict",
    budgets: list[dict[str, Any]] | None = None,
    nodes: tuple[str, ...] = ("a", "b"),
) -> tuple[Extender, Clock]:
    params = SchedParams.from_config({"preemption": {"start": preempt}})
    if fill is None:
        fill = [
            _pod("lo-a", 4, 10, node="a", gpu_indices=[0, 1, 2, 3]),
            _pod("lo-b", 4, 20, node="b", gpu_indices=[4, 5, 6, 7]),
        ]
    extra = (
        {BUDGETS_EXTRA: {f"{NS}/{b['metadata']['name']}": b for b in budgets}} if budgets else None
    )
    clock = Clock(100.0)
    cache = ClusterCache.from_objects(
        [make_node(n, 8, "h100") for n in nodes], fill, params, clock=clock, extra=extra
    )
    return Extender(cache, gangs=GangRuntime()), clock


def _filter(c: Any, pod: dict[str, Any], nodes: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    r = c.post("/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": list(nodes)}))
    assert r.status_code == 200
    return r.json()


def test_a_gang_that_needs_one_node_gets_the_lowest_victims_and_is_planned_when_they_go() -> None:
    ext, clock = _setup()
    gang_woken: list[str] = []
    ext.gangs.waker = lambda keys, why: gang_woken.extend(keys)
    c = asgi_client(ext)
    members = [_member(0), _member(1)]
    for m in members:
        res = _filter(c, m)
        assert not res.get("NodeNames")
        assert set(res["FailedNodes"]) == {"a", "b"}
    assert ext.stranded.get(KEY).nodes == ("a", "b")
    woken: list[str] = []
    with RecordedApiServer() as srv:
        _answers(srv, NS, "lo-a")
        pre = _preemptor(srv, ext, woken)
        assert pre.tick() == [] and srv.requests == []  # kube-scheduler's turn first
        clock.t += GRACE_S
        # lo-a (priority 10) frees node a; lo-b (20) stays: the lowest tier that helps
        assert pre.tick() == [(KEY, f"{NS}/lo-a: evicted")]
        clock.t += 1
        assert pre.tick() == []  # lo-a still seen: the gang waits
        sent = [(r["path"], json.loads(r["body"])) for r in srv.requests]
    assert [p for p, _ in sent] == [
        f"/api/v1/namespaces/{NS}/pods/lo-a/eviction",
        f"/apis/events.k8s.io/v1/namespaces/{NS}/events",
    ]
    assert f"on a for gang {GANG}" in sent[1][1]["note"]
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert (answer["by"], answer["gang"]) == ("topoplace", GANG)
    assert answer["members_pending"] == [f"{NS}/tp-0", f"{NS}/tp-1"]
    chosen = answer["chosen"]
    assert [(v["pod"], v["node"]) for v in chosen["victims"]] == [(f"{NS}/lo-a", "a")]
    assert chosen["nodes"] == ["a"] and chosen["gangs_broken"] == []
    # kube-scheduler asks the verb for a member meanwhile (a count refusal elsewhere): none
    body = {
        "Pod": members[0],
        "NodeNameToMetaVictims": {"b": {"Pods": [{"UID": "uid-lo-b"}], "NumPDBViolations": 0}},
    }
    r = c.post("/scheduler/preempt", content=orjson.dumps(body))
    assert r.json() == {"NodeNameToMetaVictims": {}}
    # lo-a goes: the gang is planned on a at once (reserved) and its members woken
    ext.cache.delete_pod(f"{NS}/lo-a")
    with RecordedApiServer() as srv:
        assert _preemptor(srv, ext, woken).tick() == [(KEY, "woken")]
        assert srv.requests == []
    assert woken == []  # not a pod: the gang runtime wakes the members
    assert gang_woken == [f"{NS}/tp-0", f"{NS}/tp-1"]
    assert ext.stranded.get(KEY) is None
    # a lower-priority 4-GPU pod cannot take the freed GPUs meanwhile
    other = _pod("other", 4, 500)
    assert _filter(c, other, ("a",)).get("NodeNames") in (None, [])
    for m in members:
        assert _filter(c, m)["NodeNames"] == ["a"]
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="started") == 1
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="woken") == 1


def test_the_tiers_spare_higher_priorities_and_pods_a_budget_protects() -> None:
    # a: mid (20); b: low (10) a budget protects; c: low (10). Every node would do.
    fill = [
        _pod("mid-a", 4, 20, node="a", gpu_indices=[0, 1, 2, 3]),
        _pod("lo-b", 4, 10, node="b", gpu_indices=[0, 1, 2, 3], labels={"keep": "yes"}),
        _pod("lo-c", 4, 10, node="c", gpu_indices=[0, 1, 2, 3]),
    ]
    keep = pdb("keep", {"matchLabels": {"keep": "yes"}}, allowed=0)

    def choose(fill: list[dict[str, Any]], gang: dict[str, Any]) -> GangChoice | str:
        ext, _ = _setup(fill, budgets=[keep], nodes=("a", "b", "c"))
        req = ext._request(gang, None)
        ext.gangs._members[req.gang] = {req.key: req}  # as its filter leaves it
        return gang_victims(
            ext.cache.snapshot(), req.priority, lambda s: ext.gangs.what_if(ext, s, req)
        )

    got = choose(fill, _member(0))
    assert isinstance(got, GangChoice) and got.tier == 10
    assert [v.pod for v in got.victims] == [f"{NS}/lo-c"]  # not mid-a, not lo-b
    assert [a.node for a in got.placement.assignments] == ["c", "c"]
    # lo-c protected too: the tier of 10 cannot help, mid-a goes
    fill[2]["metadata"]["labels"] = {"keep": "yes"}
    got = choose(fill, _member(0))
    assert isinstance(got, GangChoice) and got.tier == 20
    assert [v.pod for v in got.victims] == [f"{NS}/mid-a"]
    # nothing of lower priority, or nothing that makes room: no victims
    assert choose(fill, _member(0, priority=10)) == REASON_GANG_NO_LOWER
    huge = _pod("huge", 8, 1000, gang="huge", gang_size=3, annotations=ONE_NODE)
    assert choose(fill, huge) == REASON_GANG_NO_FIT


def test_a_victim_in_a_gang_takes_its_gang_down_with_it() -> None:
    fill = [
        _pod("job-0", 4, 10, node="a", gpu_indices=[0, 1, 2, 3], gang="job", gang_size=2),
        _pod("job-1", 4, 10, node="b", gpu_indices=[0, 1, 2, 3], gang="job", gang_size=2),
    ]
    ext, clock = _setup(fill)  # either node will do: a is given back first, b's pod goes
    c = asgi_client(ext)
    for m in (_member(0), _member(1)):
        _filter(c, m)
    with RecordedApiServer() as srv:
        _answers(srv, NS, "job-1")
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [(KEY, f"{NS}/job-1: evicted")]
    view = c.get("/v1/inspect/preemptions").json()
    (answer,) = view["recent"]
    assert answer["chosen"]["gangs_broken"] == [f"{NS}/job"]
    assert answer["chosen"]["gang_members_torn_down"] == [f"{NS}/job-0"]
    (teardown,) = view["pending_teardowns"]
    assert (teardown["gang"], teardown["victim"]) == (f"{NS}/job", f"{NS}/job-1")


@pytest.mark.parametrize("mode", ["dry-run", "off"])
def test_dry_run_and_off_evict_nothing_for_a_gang(mode: str) -> None:
    ext, clock = _setup(preempt=mode)
    c = asgi_client(ext)
    for m in (_member(0), _member(1)):
        _filter(c, m)
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [] and srv.requests == []
    recent = c.get("/v1/inspect/preemptions").json()["recent"]
    if mode == "dry-run":
        (answer,) = recent
        assert answer["dry_run"] and [v["pod"] for v in answer["chosen"]["victims"]] == [
            f"{NS}/lo-a"
        ]
        assert _sample(ext, "topoplace_started_preemptions_total", outcome="dry_run") == 1
    else:
        assert recent == []


def test_a_gang_that_never_preempts_or_has_nothing_lower_evicts_nothing() -> None:
    ext, clock = _setup()
    c = asgi_client(ext)
    _filter(c, _member(0, preemptionPolicy="Never"))
    _filter(c, _member(1))
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [] and srv.requests == []
    assert ext.stranded.get(KEY) is None  # a member never preempts: not preempted for
    # a gang of priority 10 finds nothing lower (lo-a is 10, lo-b 20): no search at all
    ext, clock = _setup()
    c = asgi_client(ext)
    for i in range(2):
        _filter(c, _member(i, priority=10))
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [] and srv.requests == []
    assert c.get("/v1/inspect/preemptions").json()["recent"] == []
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="none") == 1
    assert ext.stranded.get(KEY).tries == 1


def test_a_gang_record_is_forgotten_when_its_members_go() -> None:
    ext, clock = _setup(preempt="dry-run")
    c = asgi_client(ext)
    for m in (_member(0), _member(1)):
        _filter(c, m)
    for i in range(2):
        ext.cache.drop_pending(f"{NS}/tp-{i}")
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == []
    assert ext.stranded.get(KEY) is None


def test_the_gpus_of_another_preemptions_victims_stay_taken_for_a_gang() -> None:
    # a: "going" (low, being deleted: the victim of a pod's preemption in progress) on
    # GPUs 0-3; b: lo-b (low) on 0-3. Counted as gone, "going" leaves a whole for the gang
    # with nothing to evict; held for the pod it goes for, the gang evicts lo-b instead.
    going = _pod("going", 4, 10, node="a", gpu_indices=[0, 1, 2, 3])
    going["metadata"]["deletionTimestamp"] = "2026-12-03T09:00:00Z"
    fill = [going, _pod("lo-b", 4, 10, node="b", gpu_indices=[0, 1, 2, 3])]
    ext, _ = _setup(fill)
    req = ext._request(_member(0), None)
    ext.gangs._members[GANG] = {req.key: req}
    snap = ext.cache.snapshot()

    def plan(s: Any) -> Any:
        return ext.gangs.what_if(ext, s, req)

    assert gang_victims(snap, 1000, plan) == REASON_GANG_NOT_NEEDED
    got = gang_victims(snap, 1000, plan, held={going["metadata"]["uid"]})
    assert isinstance(got, GangChoice) and [v.pod for v in got.victims] == [f"{NS}/lo-b"]


def test_a_failing_gang_policy_is_tried_and_backed_off_not_looped() -> None:
    ext, clock = _setup()
    c = asgi_client(ext)
    for m in (_member(0), _member(1)):
        _filter(c, m)

    def broken_what_if_stub(*_: Any) -> Any:  # stands in for a policy that raises
        raise RuntimeError("solver blew up")

    ext.gangs.what_if = broken_what_if_stub  # type: ignore[method-assign]
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        pre = _preemptor(srv, ext, [])
        assert pre.tick() == [] and srv.requests == []
        assert pre.tick() == []  # tried: not again before another refusal and its backoff
    assert ext.stranded.get(KEY).tries == 1
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert answer["reason"] == "the victim search failed (see the log)"
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="none") == 1


def test_within_a_node_only_the_pods_the_gang_needs_gone_are_victims() -> None:
    # A DGX H100 with one-GPU pods of low priority on GPUs 0, 2, 4 and 6: a gang of two
    # 3-GPU members on one node needs two of them gone. Planned with all four gone, its
    # GPU sets would touch three; given back one at a time, two go.
    fill = [_pod(f"one-{g}", 1, 10, node="a", gpu_indices=[g]) for g in (0, 2, 4, 6)]
    ext, _ = _setup(fill, nodes=("a",))
    gang = _pod("tp3-0", 3, 1000, gang="tp3", gang_size=2, annotations=ONE_NODE)
    req = ext._request(gang, None)
    ext.gangs._members[req.gang] = {req.key: req}
    got = gang_victims(ext.cache.snapshot(), 1000, lambda s: ext.gangs.what_if(ext, s, req))
    assert isinstance(got, GangChoice)
    assert [v.pod for v in got.victims] == [f"{NS}/one-4", f"{NS}/one-6"]
    held = sorted(g for a in got.placement.assignments for g in a.gpus)
    assert held == [1, 3, 4, 5, 6, 7]  # the freed GPUs and the four free ones
