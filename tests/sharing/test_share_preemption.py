"""Preemption for fractional (HAMi) pods: the victims must free one device with the memory
and compute the pod asks, not just the ``nvidia.com/gpu`` replica count kube-scheduler's
dry run counts (scheduler/core/preemption.py with a share; the preempt verb over HTTP).

HAMi nodes as HAMi's device plugin registers them (``hami.io/node-nvidia-register``, split
replicas advertised as ``nvidia.com/gpu``); bound pods carry HAMi's
``vgpu-devices-allocated`` record, as HAMi's scheduler writes it.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from scheduler.core.fractional import RIGHTSIZE_ANNOTATION, share_request
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.preemption import select_victims
from scheduler.core.snapshot import build_snapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.helpers import asgi_client, fixture
from tests.sharing.builders import hami_bound, hami_node, share_pod

SP = SchedParams()
# Two T4s (15,360 MiB), two replicas each: four pods fill the node's count.
PODS = {"a0": (0, 2000), "b0": (0, 12000), "c1": (1, 6000), "d1": (1, 6000)}


def _cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [hami_node("infer-a", 2, split=2)]
    return nodes, [hami_bound(n, g, m) for n, (g, m) in PODS.items()]


def _urgent(mem: int = 10000) -> dict[str, Any]:
    p = share_pod("urgent", mem=mem, cores=30)
    p["spec"]["priority"] = 1000
    return p


def test_the_pod_whose_device_then_has_the_memory_goes_not_the_one_kube_scheduler_counts() -> None:
    nodes, pods = _cluster()
    snap = build_snapshot(nodes, pods, SP)
    urgent = _urgent()
    req = request_from_pod(urgent, SP.fabric)
    share = share_request(urgent, req.cpu_milli, SP.sharing)
    # kube-scheduler's dry run frees one replica: the youngest pod, a0 (2,000 MiB on GPU
    # 0, beside b0's 12,000: 3,360 MiB would be free, the pod asks 10,000).
    kube = {"infer-a": {pods[0]["metadata"]["uid"]}}
    d = select_victims(snap, req, kube, SP, share=share)
    assert d.chosen is not None
    assert [v.pod for v in d.chosen.victims] == ["infer/b0"]
    assert d.chosen.gpus == (0,) and d.chosen.gpus_disrupted == 1
    # Read as a pod of one whole GPU it would empty GPU 1: two pods for one.
    whole = select_victims(snap, req, kube, SP)
    assert [v.pod for v in whole.chosen.victims] == ["infer/c1", "infer/d1"]


def test_a_share_no_device_could_hold_is_refused_with_the_reason() -> None:
    nodes, pods = _cluster()
    snap = build_snapshot(nodes, pods, SP)
    urgent = _urgent(16000)  # more than a T4 has
    req = request_from_pod(urgent, SP.fabric)
    share = share_request(urgent, req.cpu_milli, SP.sharing)
    d = select_victims(snap, req, {"infer-a": {pods[0]["metadata"]["uid"]}}, SP, share=share)
    assert d.chosen is None
    assert d.refused == {"infer-a": "not enough free GPU memory or compute on any GPU"}


def _args(pod: dict[str, Any], victims: list[dict[str, Any]]) -> bytes:
    body = copy.deepcopy(fixture("preempt_args.json"))
    body["Pod"] = pod
    body["NodeNameToMetaVictims"] = {
        "infer-a": {"Pods": [{"UID": v["metadata"]["uid"]} for v in victims], "NumPDBViolations": 0}
    }
    return orjson.dumps(body)


def test_the_preempt_verb_answers_for_a_hami_pod() -> None:
    nodes, pods = _cluster()
    ext = Extender(ClusterCache.from_objects(nodes, pods, SP))
    c = asgi_client(ext)
    r = c.post("/scheduler/preempt", content=_args(_urgent(), [pods[0]]))
    assert r.json() == {
        "NodeNameToMetaVictims": {
            "infer-a": {"Pods": [{"UID": pods[1]["metadata"]["uid"]}], "NumPDBViolations": 0}
        }
    }
    (answer,) = c.get("/v1/inspect/preemptions").json()["recent"]
    assert answer["share"] == "hami" and answer["chosen"]["gpus"] == [0]
    sample = ext.metrics.registry.get_sample_value
    assert sample("topoplace_preemptions_total", {"outcome": "chosen"}) == 1
    # the same pod again while b0 is still seen: it waits, nothing more is preempted
    again = c.post("/scheduler/preempt", content=_args(_urgent(), [pods[2]]))
    assert again.json() == {"NodeNameToMetaVictims": {}}
    # a share pod topoplace cannot read gets kube-scheduler's victims back
    bad = _urgent()
    bad["metadata"]["name"] = "bad"
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    r = c.post("/scheduler/preempt", content=_args(bad, [pods[0]]))
    assert r.json()["NodeNameToMetaVictims"]["infer-a"]["Pods"] == [
        {"UID": pods[0]["metadata"]["uid"]}
    ]
    assert sample("topoplace_preemptions_total", {"outcome": "passed"}) == 1


def test_preemption_keeps_the_right_sizers_tenant_cap() -> None:
    """GPU 0 holds two tenants whose right-sizer note caps a GPU at two; GPU 1 has too
    little memory left. By memory alone the urgent share fits GPU 0 and needs no victim,
    but filter refuses GPU 0 for the cap, so the pod would stay pending: preemption must
    count the cap as filter does, not answer "nothing to evict". Victims are reprieved
    smallest share first (as kube-scheduler reprieves): a0 and b0 come back (GPU 0 at its
    cap of two, the pod then needs GPU 1), so c1 goes and the pod takes GPU 1."""
    note = {RIGHTSIZE_ANNOTATION: orjson.dumps({"max_tenants_per_gpu": 2}).decode()}
    nodes = [hami_node("infer-a", 2, split=4)]
    pods = [hami_bound("a0", 0, 2000), hami_bound("b0", 0, 3000), hami_bound("c1", 1, 14000)]
    for p in pods[:2]:
        p["metadata"]["annotations"].update(note)
    snap = build_snapshot(nodes, pods, SP)
    urgent = share_pod("urgent", mem=3000, cores=20, annotations=note)
    urgent["spec"]["priority"] = 1000
    req = request_from_pod(urgent, SP.fabric)
    share = share_request(urgent, req.cpu_milli, SP.sharing)
    assert share.limits is not None and share.limits.max_tenants == 2
    kube = {"infer-a": {p["metadata"]["uid"] for p in pods}}
    d = select_victims(snap, req, kube, SP, share=share)
    assert d.chosen is not None, d.refused
    assert [v.pod for v in d.chosen.victims] == ["infer/c1"]
    assert d.chosen.gpus == (1,)
