"""Preemption topoplace starts for a pod kube-scheduler will not preempt for
(``preemption.start``; scheduler/runtime/stranded.py, scheduler/server/started_preemption.py,
scheduler/kube/preemptor.py).

Mostly one HAMi node of two T4s (15,360 MiB) split four ways: four pods hold four of its
eight replicas but leave 1,360 MiB on each GPU. A pod asking 10,000 MiB passes
kube-scheduler's replica count, so its DefaultPreemption finds no victim to name and never
calls the ``preempt`` verb; topoplace's filter refuses it, and topoplace preempts itself.
The same for a whole-GPU pod that needs NVLink on a DGX-1 V100 (the hybrid cube-mesh of
``../shared/data/topologies/dgx1_v100_hybrid_cube_mesh.txt``) whose free GPUs form no
NVLink ring.

The filter and bind go over HTTP (the ASGI app); the evictions and Events go over real HTTP
to :class:`RecordedApiServer`, which stands in for the API server (none runs in CI) and
answers with bodies recorded from kube-apiserver v1.33.0.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.params import SchedParams
from scheduler.kube.metrics import KubeMetrics
from scheduler.kube.preemptor import EVENT_REASON, Preemptor
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.stranded import GIVE_UP_S, GRACE_S, MAX_PREEMPTIONS, StrandedPods
from scheduler.server.extender import Extender
from scheduler.server.started_preemption import REASON_NEVER
from tests.health.builders import Clock
from tests.helpers import asgi_client
from tests.kube.recorded import RecordedApiServer, recorded
from tests.sharing.builders import hami_bound, hami_node, share_pod

NS = "infer"
NODE = "infer-a"
EVENTS = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"
# name -> (GPU, MiB): 14,000 MiB used on each GPU, four replicas of eight free.
FILL = {"a0": (0, 2000), "b0": (0, 12000), "c1": (1, 8000), "d1": (1, 6000)}


def _eviction(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}/eviction"


def _budget(*names: str) -> dict[str, Any]:
    """A PodDisruptionBudget over pods labelled ``keep: "yes"`` allowing no disruption, and
    those pods labelled."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"keep": "yes"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": len(names), "expectedPods": 1},
    }


def _setup(
    preempt: str = "evict", keep: tuple[str, ...] = ()
) -> tuple[Extender, Clock, list[dict[str, Any]]]:
    params = SchedParams.from_config({"preemption": {"start": preempt}})
    pods = [hami_bound(n, g, m, NODE, priority=10) for n, (g, m) in FILL.items()]
    for p in pods:
        if p["metadata"]["name"] in keep:
            p["metadata"]["labels"] = {"keep": "yes"}
    extra = {BUDGETS_EXTRA: {f"{NS}/keep": _budget(*keep)}} if keep else None
    clock = Clock(100.0)  # the cache's clock, advanced by hand
    cache = ClusterCache.from_objects(
        [hami_node(NODE, 2, split=4)], pods, params, clock=clock, extra=extra
    )
    return Extender(cache), clock, pods


def _urgent(name: str = "urgent", mem: int = 10000, **spec: Any) -> dict[str, Any]:
    p = share_pod(name, mem=mem, cores=30)
    p["spec"].update(priority=1000, **spec)
    return p


def _filter(c: Any, pod: dict[str, Any]) -> dict[str, Any]:
    r = c.post("/scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": [NODE]}))
    assert r.status_code == 200
    return r.json()


def _sample(ext: Extender, name: str, **labels: str) -> float:
    v = ext.metrics.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def _answers(srv: RecordedApiServer, ns: str, *names: str) -> None:
    """The recorded 201s for the evictions of ``names`` in ``ns`` and for their Events."""
    for name in names:
        srv.add(
            "POST",
            f"/api/v1/namespaces/{ns}/pods/{name}/eviction",
            201,
            "eviction_201_created.json",
        )
    srv.add("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", 201, "event_201_created.json")


_ADAPTER_METRICS: dict[int, KubeMetrics] = {}


def _preemptor(srv: RecordedApiServer, ext: Extender, woken: list[str]) -> Preemptor:
    """The adapter over ``srv``, its metrics in the extender's registry (registered once)."""
    reg = ext.metrics.registry
    km = _ADAPTER_METRICS.get(id(reg))
    if km is None:
        km = _ADAPTER_METRICS[id(reg)] = KubeMetrics(reg)
    return Preemptor(srv.api(), ext, km, lambda keys, why: woken.extend(keys))


def test_the_pod_kube_scheduler_sees_room_for_gets_victims_freeing_one_gpu_and_binds() -> None:
    ext, clock, pods = _setup()
    c = asgi_client(ext)
    urgent = _urgent()
    res = _filter(c, urgent)
    assert not res.get("NodeNames")
    assert res["FailedNodes"][NODE] == "not enough free GPU memory or compute on any GPU"
    assert ext.stranded.get(f"{NS}/urgent").nodes == (NODE,)
    woken: list[str] = []
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    with RecordedApiServer() as srv:
        _answers(srv, NS, "b0")
        pre = _preemptor(srv, ext, woken)
        # within the grace kube-scheduler's own preemption would come: nothing yet
        assert pre.tick() == [] and srv.requests == []
        clock.t += GRACE_S
        assert pre.tick() == [(f"{NS}/urgent", f"{NS}/b0: evicted")]
        # b0 is still seen (the watch has not delivered its deletion): nothing more
        clock.t += 1
        assert pre.tick() == [] and woken == []
        sent = [(r["path"], json.loads(r["body"])) for r in srv.requests]
    assert [p for p, _ in sent] == [_eviction("b0"), EVENTS]
    want = recorded("eviction_request_sent.json")
    want["metadata"] = {"name": "b0", "namespace": NS}
    want["deleteOptions"] = {"preconditions": {"uid": uid["b0"]}}  # the pod's own grace
    assert sent[0][1] == want
    event = sent[1][1]
    assert (event["reason"], event["action"], event["type"]) == (EVENT_REASON, "Evict", "Warning")
    assert event["reportingController"] == "topoplace.io/preemption"
    assert event["regarding"]["uid"] == uid["b0"] and f"for {NS}/urgent" in event["note"]
    view = c.get("/v1/inspect/preemptions").json()
    (answer,) = view["recent"]
    assert answer["by"] == "topoplace" and answer["share"] == "hami"
    assert [v["pod"] for v in answer["chosen"]["victims"]] == [f"{NS}/b0"]
    assert answer["chosen"]["gpus"] == [0]
    assert view["stranded"] == [
        {
            "pod": f"{NS}/urgent",
            "nodes": 1,
            "refused_at": 100.0,
            "tries": 0,
            "preemptions": 1,
            "node": NODE,
            "victims": 1,
        }
    ]
    # kube-scheduler asks the preempt verb meanwhile (another cycle): it names nothing more
    body = {"Pod": urgent, "NodeNameToMetaVictims": {NODE: {"Pods": [{"UID": uid["a0"]}]}}}
    assert c.post("/scheduler/preempt", content=orjson.dumps(body)).json() == {
        "NodeNameToMetaVictims": {}
    }
    # b0 goes: its shares are held for the pod, which is woken
    ext.cache.delete_pod(f"{NS}/b0")
    with RecordedApiServer() as srv:
        assert _preemptor(srv, ext, woken).tick() == [(f"{NS}/urgent", "woken")]
    assert woken == [f"{NS}/urgent"] and ext.cache.nominations() == 1
    held = ext.cache.snapshot().pods[f"{NS}/urgent"]
    assert [(s.gpu, s.memory_mib) for s in held.shares] == [(0, 10000)]
    # a pod of lower priority asking the same memory does not get it meanwhile
    other = _urgent("other")
    assert not _filter(c, other).get("NodeNames")
    # the retried pod is offered the node and binds on GPU 0
    assert _filter(c, urgent)["NodeNames"] == [NODE]
    bind = {"PodName": "urgent", "PodNamespace": NS, "PodUID": urgent["metadata"]["uid"]}
    r = c.post("/scheduler/bind", content=orjson.dumps({**bind, "Node": NODE}))
    assert r.json() == {"Error": ""}
    bound = ext.cache.snapshot().pods[f"{NS}/urgent"]
    assert bound.node == NODE and [s.gpu for s in bound.shares] == [0]
    assert ext.stranded.get(f"{NS}/urgent") is None
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="started") == 1
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="woken") == 1
    assert (
        _sample(
            ext,
            "topoplace_remediation_evictions_total",
            kind="started-preemption",
            outcome="evicted",
        )
        == 1
    )


def test_a_budget_that_every_choice_would_violate_keeps_every_pod() -> None:
    # b0 and c1 protected: freeing GPU 0 takes b0, freeing GPU 1 takes c1 (and d1).
    # kube-scheduler's rule would take the fewest violations; a second preemptor evicting
    # through the Eviction API takes none.
    ext, clock, _ = _setup(keep=("b0", "c1"))
    c = asgi_client(ext)
    _filter(c, _urgent())
    with RecordedApiServer() as srv:
        pre = _preemptor(srv, ext, [])
        clock.t += GRACE_S
        assert pre.tick() == [] and srv.requests == []
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert answer["chosen"] is None and answer["options"] == 1  # the node, at one violation
    assert answer["reason"] == "every choice evicts against a PodDisruptionBudget"
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="none") == 1
    # not tried again until it is refused again, then after its backoff
    clock.t += 60
    assert ext.stranded.due(clock()) == []
    _filter(c, _urgent())
    assert ext.stranded.due(clock()) == []
    clock.t += GRACE_S + 1
    assert ext.stranded.due(clock()) == [f"{NS}/urgent"]


def test_a_budget_over_one_pod_sends_the_preemption_to_the_other_gpu() -> None:
    ext, clock, _ = _setup(keep=("b0",))
    c = asgi_client(ext)
    _filter(c, _urgent())
    with RecordedApiServer() as srv:
        _answers(srv, NS, "c1", "d1")
        clock.t += GRACE_S
        done = _preemptor(srv, ext, []).tick()
    assert done == [(f"{NS}/urgent", f"{NS}/c1: evicted"), (f"{NS}/urgent", f"{NS}/d1: evicted")]


@pytest.mark.parametrize("mode", ["dry-run", "off"])
def test_dry_run_and_off_evict_nothing(mode: str) -> None:
    ext, clock, _ = _setup(preempt=mode)
    c = asgi_client(ext)
    _filter(c, _urgent())
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [] and srv.requests == []
    dry = _sample(ext, "topoplace_started_preemptions_total", outcome="dry_run")
    assert dry == (1 if mode == "dry-run" else 0)
    recent = c.get("/v1/inspect/preemptions").json()["recent"]
    if mode == "dry-run":  # what it would have evicted, marked as a dry run
        (answer,) = recent
        assert answer["dry_run"] and [v["pod"] for v in answer["chosen"]["victims"]] == [f"{NS}/b0"]
    else:
        assert recent == []


def test_a_pod_that_never_preempts_and_a_pod_with_room_are_left_alone() -> None:
    ext, clock, _ = _setup()
    c = asgi_client(ext)
    _filter(c, _urgent(preemptionPolicy="Never"))
    small = _urgent("small", mem=1000)
    assert _filter(c, small)["NodeNames"] == [NODE]
    assert ext.stranded.get(f"{NS}/small") is None
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [] and srv.requests == []
    assert ext.stranded.get(f"{NS}/urgent") is None, REASON_NEVER


def test_a_refused_eviction_is_given_up_and_the_pod_may_preempt_again() -> None:
    ext, clock, _ = _setup()
    c = asgi_client(ext)
    _filter(c, _urgent())
    with RecordedApiServer() as srv:
        srv.add("POST", _eviction("b0"), 429, "eviction_429_disruption_budget.json")
        pre = _preemptor(srv, ext, [])
        clock.t += GRACE_S
        assert pre.tick() == [(f"{NS}/urgent", f"{NS}/b0: blocked")]
        clock.t += GIVE_UP_S - 1
        assert pre.tick() == []
        clock.t += 1
        assert pre.tick() == [(f"{NS}/urgent", "gave_up")]
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="gave_up") == 1
    # refused again later: a new attempt (b0 is still the victim to take)
    clock.t += 30
    _filter(c, _urgent())
    clock.t += GRACE_S
    assert ext.stranded.due(clock()) == [f"{NS}/urgent"]


def test_the_registry_waits_for_the_grace_and_backs_off() -> None:
    s = StrandedPods()
    s.refused("ns/p", ["n2", "n1"], 10.0)
    assert s.get("ns/p").nodes == ("n1", "n2")
    assert s.due(10.5) == [] and s.due(11.0) == ["ns/p"]
    s.tried("ns/p", 11.0)
    assert s.due(50.0) == []  # not before another refusal
    s.refused("ns/p", ["n1"], 11.5)
    assert s.due(12.5) == [] and s.due(13.0) == ["ns/p"]  # backoff: 2 s after the try
    s.preempting("ns/p", "n1", ["u1"], 14.0)
    assert s.due(100.0) == [] and [k for k, _ in s.in_progress()] == ["ns/p"]
    s.refused("ns/p", [], 15.0)  # a refusal with no room node keeps the preemption
    assert s.get("ns/p").node == "n1"
    s.settled("ns/p")
    assert s.in_progress() == [] and s.due(100.0) == []
    s.refused("ns/p", [], 101.0)  # and without one it is forgotten
    assert s.get("ns/p") is None
    s.refused("ns/q", ["n1"], 1.0)
    s.offered("ns/q")
    assert len(s) == 0
    # three preemptions for a pod still refused, and no fourth: evictions do not cascade
    for k in range(MAX_PREEMPTIONS):
        s.refused("ns/r", ["n1"], 200.0 + 10 * k)
        assert s.due(201.0 + 10 * k) == ["ns/r"]
        s.preempting("ns/r", "n1", [f"u{k}"], 201.0 + 10 * k)
        s.settled("ns/r")
    s.refused("ns/r", ["n1"], 300.0)
    assert s.due(400.0) == [] and s.get("ns/r").preemptions == MAX_PREEMPTIONS


def test_a_pod_deleted_after_an_attempt_is_forgotten() -> None:
    ext, clock, _ = _setup(keep=("b0", "c1"))  # nothing may go: the attempt finds none
    c = asgi_client(ext)
    _filter(c, _urgent())
    with RecordedApiServer() as srv:
        pre = _preemptor(srv, ext, [])
        clock.t += GRACE_S
        pre.tick()
        assert len(ext.stranded) == 1  # waits for a new refusal
        ext.cache.drop_pending(f"{NS}/urgent")  # the watch saw it deleted
        pre.tick()
    assert len(ext.stranded) == 0


def test_a_pod_that_needs_nvlink_gets_a_ring_freed_where_kube_scheduler_counts_four_free() -> None:
    # DGX-1 V100, one-GPU pods of low priority on GPUs 1, 2, 4 and 7: GPUs 0, 3, 5 and 6
    # are free, four by kube-scheduler's count, but no NVLink ring (the cube-mesh quads
    # are 0-3 and 4-7). A 4-GPU pod that needs NVLink on every hop: topoplace frees the
    # quad 4-7 by evicting the pods on 4 and 7.
    from benchmarks.clusters import make_pod
    from tests.health.builders import dgx1

    pods = []
    for g in (1, 2, 4, 7):
        p = make_pod(f"one-{g}", 1, node="v1", gpu_indices=[g])
        p["spec"]["priority"] = 10
        pods.append(p)
    clock = Clock(100.0)  # the cache's clock, advanced by hand
    cache = ClusterCache.from_objects([dgx1("v1")], pods, SchedParams(), clock=clock)
    ext = Extender(cache)
    c = asgi_client(ext)
    train = make_pod("train", 4, annotations={"topoplace.io/min-link": "nvlink"})
    train["spec"]["priority"] = 1000
    body = orjson.dumps({"Pod": train, "NodeNames": ["v1"]})
    res = c.post("/scheduler/filter", content=body).json()
    assert not res.get("NodeNames")
    assert res["FailedNodes"]["v1"] == "no free GPU set meets the required link"
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    woken: list[str] = []
    with RecordedApiServer() as srv:
        _answers(srv, "default", "one-4", "one-7")
        clock.t += GRACE_S
        done = _preemptor(srv, ext, woken).tick()
        sent = [json.loads(r["body"]) for r in srv.requests if r["path"].endswith("/eviction")]
    assert done == [
        ("default/train", "default/one-4: evicted"),
        ("default/train", "default/one-7: evicted"),
    ]
    assert [b["deleteOptions"]["preconditions"]["uid"] for b in sent] == [
        uid["one-4"],
        uid["one-7"],
    ]
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert answer["by"] == "topoplace" and answer["share"] == ""
    assert answer["chosen"]["gpus"] == [4, 5, 6, 7] and answer["chosen"]["bottleneck_gbps"] > 0
    for name in ("one-4", "one-7"):
        cache.delete_pod(f"default/{name}")
    with RecordedApiServer() as srv:
        assert _preemptor(srv, ext, woken).tick() == [("default/train", "woken")]
    assert woken == ["default/train"]
    assert cache.snapshot().pods["default/train"].gpus == (4, 5, 6, 7)  # held for it
    assert c.post("/scheduler/filter", content=body).json()["NodeNames"] == ["v1"]
    bind = {"PodName": "train", "PodNamespace": "default", "PodUID": train["metadata"]["uid"]}
    assert c.post("/scheduler/bind", content=orjson.dumps({**bind, "Node": "v1"})).json() == {
        "Error": ""
    }
    assert cache.snapshot().pods["default/train"].gpus == (4, 5, 6, 7)


def test_a_pod_with_nothing_of_lower_priority_on_its_nodes_costs_no_search() -> None:
    from scheduler.core.preemption import lowest_priorities

    ext, clock, _ = _setup()
    assert lowest_priorities(ext.cache.snapshot()) == {NODE: 10}
    c = asgi_client(ext)
    low = _urgent("low")
    low["spec"]["priority"] = 10  # the same as every pod there: none may go
    _filter(c, low)
    with RecordedApiServer() as srv:
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [] and srv.requests == []
    assert c.get("/v1/inspect/preemptions").json()["recent"] == []  # not even an answer
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="none") == 1
    assert ext.stranded.due(clock() + 100) == []  # tried: waits for another refusal


def test_the_preemptor_thread_acts_by_itself_and_not_when_off() -> None:
    import time

    ext, clock, _ = _setup()
    _filter(asgi_client(ext), _urgent())
    clock.t += GRACE_S
    with RecordedApiServer() as srv:
        _answers(srv, NS, "b0")
        pre = _preemptor(srv, ext, [])
        pre.start()
        try:
            deadline = time.monotonic() + 10
            while not srv.requests and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            pre.stop()
        assert srv.requests and srv.requests[0]["path"] == _eviction("b0")
    off, _, _ = _setup(preempt="off")
    with RecordedApiServer() as srv:
        quiet = _preemptor(srv, off, [])
        quiet.start()
        assert not quiet._loop.running


def test_the_verb_leaves_kube_schedulers_candidate_when_a_node_it_cannot_offer_costs_less() -> None:
    # Two DGX-1 V100. v1: one-GPU pods on 0, 1, 2, 4, 5 (three free: kube-scheduler's
    # count refuses it, so it is its preemption candidate; an NVLink quad there costs two
    # pods). v2: pods on 0, 1, 2, 4 (four free, so kube-scheduler sends it to filter and
    # never names victims there; the quad 4-7 costs one pod).
    from benchmarks.clusters import make_pod
    from tests.health.builders import dgx1

    pods = []
    for node, used in (("v1", (0, 1, 2, 4, 5)), ("v2", (0, 1, 2, 4))):
        for g in used:
            p = make_pod(f"{node}-{g}", 1, node=node, gpu_indices=[g])
            p["spec"]["priority"] = 10
            pods.append(p)
    clock = Clock(100.0)  # the cache's clock, advanced by hand
    cache = ClusterCache.from_objects([dgx1("v1"), dgx1("v2")], pods, SchedParams(), clock=clock)
    ext = Extender(cache)
    c = asgi_client(ext)
    train = make_pod("train", 4, annotations={"topoplace.io/min-link": "nvlink"})
    train["spec"]["priority"] = 1000
    res = c.post("/scheduler/filter", content=orjson.dumps({"Pod": train, "NodeNames": ["v2"]}))
    assert not res.json().get("NodeNames")
    kube = [{"UID": p["metadata"]["uid"]} for p in pods if p["spec"]["nodeName"] == "v1"]
    args = {"Pod": train, "NodeNameToMetaVictims": {"v1": {"Pods": kube, "NumPDBViolations": 0}}}
    r = c.post("/scheduler/preempt", content=orjson.dumps(args))
    assert r.json() == {"NodeNameToMetaVictims": {}}  # kube-scheduler evicts nothing
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert answer["reason"].startswith("topoplace preempts on v2 instead")
    assert _sample(ext, "topoplace_preemptions_total", outcome="deferred") == 1
    # topoplace then starts it on v2; with started preemptions off the verb names v1's two
    with RecordedApiServer() as srv:
        _answers(srv, "default", "v2-4")
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [("default/train", "default/v2-4: evicted")]
    off = Extender(
        ClusterCache.from_objects(
            [dgx1("v1"), dgx1("v2")],
            pods,
            SchedParams.from_config({"preemption": {"start": "off"}}),
        )
    )
    oc = asgi_client(off)
    oc.post("/scheduler/filter", content=orjson.dumps({"Pod": train, "NodeNames": ["v2"]}))
    named = oc.post("/scheduler/preempt", content=orjson.dumps(args)).json()
    assert sorted(named["NodeNameToMetaVictims"]) == ["v1"]
    assert len(named["NodeNameToMetaVictims"]["v1"]["Pods"]) == 2


def test_the_search_is_bounded_as_kube_schedulers_own_candidates_are() -> None:
    from benchmarks.clusters import make_node, make_pod
    from scheduler.core.preemption import lowest_priorities
    from scheduler.core.snapshot import build_snapshot
    from scheduler.server.started_preemption import candidates

    nodes = [make_node(f"n{i:03d}", 8, "h100") for i in range(300)]
    pods = []
    for i in range(300):
        p = make_pod(f"p{i:03d}", 1, node=f"n{i:03d}", gpu_indices=[0])
        p["spec"]["priority"] = 10 + i % 7  # the lowest on a node: 10..16
        pods.append(p)
    snap = build_snapshot(nodes, pods, SchedParams())
    lowest = lowest_priorities(snap)
    names = [f"n{i:03d}" for i in range(300)] + ["gone"]
    got = candidates(names, snap, lowest, 1000)
    assert len(got) == 100  # max(100, 10 % of 300)
    picked = sorted((lowest[n], n) for n in got)
    assert picked == sorted((lowest[n], n) for n in names[:300])[:100]
    assert max(lowest[n] for n in got) == 12  # 43 nodes at 10, 43 at 11, then some at 12
    only_lowest = candidates(names, snap, lowest, 11)  # only pods of priority 10 may go
    assert list(only_lowest) == [f"n{i:03d}" for i in range(0, 300, 7)]
    assert candidates(names, snap, lowest, 10) == {}  # nothing lower than 10


def test_a_pod_refused_again_and_again_is_due_a_grace_after_its_first_refusal() -> None:
    # A gang's two members take turns, each refused every second or so (the gang runtime
    # wakes them): counted from the latest refusal, the grace would never pass.
    s = StrandedPods()
    for t in (10.0, 10.6, 11.2, 11.8):
        s.refused("gang:ns/g", ["n1"], t)
        assert s.get("gang:ns/g").refused_at == 10.0
    assert s.due(10.9) == [] and s.due(11.8) == ["gang:ns/g"]
    s.tried("gang:ns/g", 11.8)
    s.refused("gang:ns/g", ["n1"], 12.4)  # the first refusal after the try starts anew
    assert s.get("gang:ns/g").refused_at == 12.4


def test_two_pods_due_in_one_pass_do_not_take_the_same_victims() -> None:
    # Both ask 10,000 MiB on the one node: the first evicts b0; the second's search leaves
    # the node alone while that preemption is in progress (its GPU memory is the first's),
    # instead of naming b0 too and racing it for GPU 0 once b0 is gone.
    ext, clock, _ = _setup()
    c = asgi_client(ext)
    _filter(c, _urgent())
    _filter(c, _urgent("urgent-b"))
    with RecordedApiServer() as srv:
        _answers(srv, NS, "b0")
        clock.t += GRACE_S
        assert _preemptor(srv, ext, []).tick() == [(f"{NS}/urgent", f"{NS}/b0: evicted")]
    assert ext.stranded.busy() == (frozenset({NODE}), ext.stranded.get(f"{NS}/urgent").victims)
    assert ext.stranded.get(f"{NS}/urgent-b").tries == 1  # tried: nothing to take now
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="none") == 1


def test_the_watch_seeing_the_last_victim_go_runs_a_pass_at_once() -> None:
    ext, clock, pods = _setup()
    _filter(asgi_client(ext), _urgent())
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    with RecordedApiServer() as srv:
        _answers(srv, NS, "b0")
        pre = _preemptor(srv, ext, [])
        clock.t += GRACE_S
        pre.tick()
    pre.pod_gone(uid["a0"])  # not a victim: nothing to do
    assert not pre._loop._poked.is_set()
    pre.pod_gone(uid["b0"])
    assert pre._loop._poked.is_set()


def test_a_poked_loop_ticks_before_its_interval_ends() -> None:
    import threading

    from scheduler.kube.loop import Periodic

    ticked = threading.Event()
    loop = Periodic("test-poke", ticked.set, lambda: 60.0, "a test tick")
    loop.start()
    try:
        assert not ticked.wait(0.3)  # an interval of a minute: no tick yet
        loop.poke()
        assert ticked.wait(10)  # the poke runs it now
    finally:
        loop.stop(timeout=5)
    assert not loop.running


def test_a_failing_victim_search_is_tried_and_backed_off_not_looped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from scheduler.server import started_preemption

    def broken_search_stub(*_: Any) -> Any:  # stands in for a search that raises
        raise RuntimeError("search blew up")

    monkeypatch.setattr(started_preemption, "_search", broken_search_stub)
    ext, clock, _ = _setup()
    _filter(asgi_client(ext), _urgent())
    with RecordedApiServer() as srv:
        pre = _preemptor(srv, ext, [])
        clock.t += GRACE_S
        assert pre.tick() == [] and pre.tick() == [] and srv.requests == []
    assert ext.stranded.get(f"{NS}/urgent").tries == 1
    assert _sample(ext, "topoplace_started_preemptions_total", outcome="none") == 1


def test_busy_follows_the_preemptions_in_progress_only() -> None:
    s = StrandedPods(limit=2)
    s.refused("ns/p", ["n1"], 1.0)
    assert s.busy() == (frozenset(), frozenset())
    s.preempting("ns/p", "n1", ["u1"], 2.0)
    s.preempting("gang:ns/g", "n9", ["x"], 2.0)  # no record: nothing starts
    assert s.busy() == (frozenset({"n1"}), frozenset({"u1"}))
    s.refused("ns/q", ["n2"], 3.0)  # refusals leave it as it is
    s.tried("ns/q", 3.5)
    assert s.busy() == (frozenset({"n1"}), frozenset({"u1"}))
    s.refused("ns/r", ["n3"], 4.0)  # over the limit: the oldest, ns/p, goes
    assert s.get("ns/p") is None and s.busy() == (frozenset(), frozenset())
    s.preempting("ns/q", "a,b", ["u2", "u3"], 5.0)  # a gang's record: nodes comma-joined
    assert s.busy() == (frozenset({"a", "b"}), frozenset({"u2", "u3"}))
    s.settled("ns/q")
    assert s.busy() == (frozenset(), frozenset())
    s.preempting("ns/r", "n3", ["u4"], 6.0)
    s.prune(lambda k: k != "ns/r")
    assert s.busy() == (frozenset(), frozenset())
