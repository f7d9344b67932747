"""ComputeDomains while topoplace's watch lags the API server (the cause of the live test's
failures on a loaded host): the one-domain-per-node rule holds only for what topoplace has
seen, so a claim pod whose claims topoplace has not seen yet is refused until they are,
and woken then. Nodes, slices and claims as in ``test_compute_domain.py`` (copies of the recorded
v1.33.0 gpu-node-0; channel claims in the NVIDIA driver's shape)."""

from __future__ import annotations

from scheduler.core import dra
from scheduler.runtime.dra import REASON_CLAIMS_NOT_SEEN, DraRouter
from scheduler.server.extender import Extender
from tests.dra.test_allocator import _claim
from tests.dra.test_compute_domain import _cache, _channel_claim, _pod

NODES = ["a", "b", "c"]


def _allocated_gpu_claim(name: str, node: str) -> dict:
    """A 1-GPU claim kube-scheduler allocated on ``node`` (gpu-0)."""
    c = _claim(name, 1)
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node,
                     "device": "gpu-0"}
                ]
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }
    }  # fmt: skip
    return c


def _h_on_a_and_i_seen() -> dict[str, dict]:
    """pod-h's claims (domain cd-h) allocated on a, pod-i's (domain cd-i) not yet."""
    return {
        "default/h": _allocated_gpu_claim("h", "a"),
        "default/h-ch": _channel_claim("h-ch", "cd-h", node="a"),
        "default/i": _claim("i", 1),
        "default/i-ch": _channel_claim("i-ch", "cd-i"),
    }


def test_a_node_serving_a_domain_is_refused_to_another_domain_once_seen() -> None:
    """pod-h (domain cd-h) runs on a, its claims allocated there and seen: pod-i of
    domain cd-i, its claims seen, is refused a."""
    claims = _h_on_a_and_i_seen()
    router = DraRouter(_cache(claims))
    plans = router.plans(_pod("pod-i", ["i", "i-ch"], gated=False), NODES)
    assert plans[0].verdict == dra.REASON_CD_NODE_BUSY


def test_a_pod_whose_claims_are_not_seen_yet_is_refused_everywhere_until_they_are() -> None:
    """The live test's race: pod-i's claims are created and then pod-i at once;
    kube-scheduler (its own informer has the claims) asks topoplace before topoplace's
    watch shows them. topoplace can tell neither the devices nor the domain, so it refuses
    every node, "not now" (passing it would let it onto a, beside cd-h). Once the claims
    are seen, a is refused for serving cd-h and b and c pass."""
    claims = {
        "default/h": _allocated_gpu_claim("h", "a"),
        "default/h-ch": _channel_claim("h-ch", "cd-h", node="a"),
    }
    cache = _cache(claims)
    router = DraRouter(cache)
    pod = _pod("pod-i", ["i", "i-ch"], gated=False)
    plans = router.plans(pod, NODES)
    assert [p.verdict for p in plans] == [REASON_CLAIMS_NOT_SEEN] * 3
    assert not any(p.never for p in plans)
    out = router.filter(pod, NODES)
    assert out.feasible == ()
    assert dict(out.failed) == dict.fromkeys(NODES, REASON_CLAIMS_NOT_SEEN)
    assert dict(out.unresolvable) == {}
    cache.apply_claim("default/i", _claim("i", 1))
    # one claim seen, the channel (the domain) not yet: still refused everywhere
    assert [p.verdict for p in router.plans(pod, NODES)] == [REASON_CLAIMS_NOT_SEEN] * 3
    cache.apply_claim("default/i-ch", _channel_claim("i-ch", "cd-i"))
    out = router.filter(pod, NODES)
    assert out.feasible == ("b", "c")
    assert dict(out.failed) == {"a": dra.REASON_CD_NODE_BUSY}


def test_a_pod_whose_claims_are_not_seen_yet_is_not_let_onto_a_serving_node() -> None:
    claims = {
        "default/h": _allocated_gpu_claim("h", "a"),
        "default/h-ch": _channel_claim("h-ch", "cd-h", node="a"),
    }
    router = DraRouter(_cache(claims))
    plans = router.plans(_pod("pod-i", ["i", "i-ch"], gated=False), NODES)
    assert plans[0].verdict != ""


def test_a_pod_refused_for_unseen_claims_is_woken_once_they_are_seen() -> None:
    """kube-scheduler saw pod-i's claims arrive before it asked, so no event of theirs
    moves the pod it parked after topoplace's refusal: topoplace wakes it (the janitor's
    poll, ``ParkedPods.wake_claims_seen``) once its watch shows every one of them, once."""
    claims = {
        "default/h": _allocated_gpu_claim("h", "a"),
        "default/h-ch": _channel_claim("h-ch", "cd-h", node="a"),
    }
    cache = _cache(claims)
    ext = Extender(cache)
    woken: list[tuple[list[str], str]] = []
    ext.parked.waker = lambda keys, why: woken.append((list(keys), why))
    body = {"Pod": _pod("pod-i", ["i", "i-ch"], gated=False), "NodeNames": NODES}
    res = ext.filter(body)
    assert not res.get("NodeNames")
    assert res["FailedNodes"] == dict.fromkeys(NODES, REASON_CLAIMS_NOT_SEEN)
    assert ext.parked.waiting_for_claims("default/pod-i") == ("default/i", "default/i-ch")
    assert ext.parked.poll(cache) == [] and woken == []
    ext.filter(body)  # refused again, still for its claims: remembered once
    assert ext.parked.waiting_for_claims("default/pod-i") == ("default/i", "default/i-ch")
    cache.apply_claim("default/i", _claim("i", 1))
    assert ext.parked.poll(cache) == [] and woken == []  # the channel claim still missing
    cache.apply_claim("default/i-ch", _channel_claim("i-ch", "cd-i"))
    assert ext.parked.poll(cache) == ["default/pod-i"]
    assert woken == [(["default/pod-i"], "its ResourceClaims are seen")]
    assert ext.parked.poll(cache) == [] and len(woken) == 1  # once
    assert ext.parked.waiting_for_claims("default/pod-i") == ()
    # kube-scheduler's retry: a is refused for the other domain, b or c offered (the
    # better scored, extender.decide_in_filter)
    assert ext.filter(body)["NodeNames"] in (["b"], ["c"])
    assert dict(ext.dra.filter(body["Pod"], NODES).failed)["a"] == dra.REASON_CD_NODE_BUSY


def test_a_pod_offered_a_node_or_gone_is_not_woken_for_its_claims() -> None:
    """A pod refused for unseen claims and then offered a node (its claims came in by the
    next filter) is forgotten; one deleted meanwhile is dropped, not woken."""
    cache = _cache({})
    ext = Extender(cache)
    woken: list[list[str]] = []
    ext.parked.waker = lambda keys, why: woken.append(list(keys))
    body = {"Pod": _pod("pod-j", ["j"], gated=False), "NodeNames": NODES}
    assert not ext.filter(body).get("NodeNames")
    assert ext.parked.waiting_for_claims("default/pod-j") == ("default/j",)
    cache.apply_claim("default/j", _claim("j", 1))
    assert ext.filter(body)["NodeNames"]
    assert ext.parked.waiting_for_claims("default/pod-j") == ()
    body = {"Pod": _pod("pod-k", ["k"], gated=False), "NodeNames": NODES}
    assert not ext.filter(body).get("NodeNames")
    cache.drop_pending("default/pod-k")
    cache.apply_claim("default/k", _claim("k", 1))
    assert ext.parked.poll(cache) == [] and woken == []
    assert ext.parked.waiting_for_claims("default/pod-k") == ()


def test_a_domain_pod_bound_makes_its_node_serve_the_domain_before_the_watch_shows_it() -> None:
    """pod-h (cd-h) is bound to a: kube-scheduler wrote h's allocation in PreBind, but
    topoplace's watch still shows h unallocated. pod-i (cd-i, its claims seen) is refused a
    from the bind on, for ``bound_domain_s`` seconds (the watch shows the allocation by then)."""
    now = [100.0]
    claims = {
        "default/h": _claim("h", 1),
        "default/h-ch": _channel_claim("h-ch", "cd-h"),
        "default/i": _claim("i", 1),
        "default/i-ch": _channel_claim("i-ch", "cd-i"),
    }
    router = DraRouter(_cache(claims), clock=lambda: now[0], bound_domain_s=30.0)
    pod_i = _pod("pod-i", ["i", "i-ch"], gated=False)
    assert [p.verdict for p in router.plans(pod_i, NODES)] == ["", "", ""]
    pod_h = _pod("pod-h", ["h", "h-ch"], gated=False)
    assert router.before_bind_claims("default/pod-h", pod_h, "a", "uid-h") == ""
    assert router.bound_domains() == {"a": frozenset({"cd-h"})}
    verdicts = [p.verdict for p in router.plans(pod_i, NODES)]
    assert verdicts == [dra.REASON_CD_NODE_BUSY, "", ""]
    # a pod of cd-h itself is not kept off a
    router.cache.apply_claim("default/h2", _claim("h2", 1))
    router.cache.apply_claim("default/h2-ch", _channel_claim("h2-ch", "cd-h"))
    pod_h2 = _pod("pod-h2", ["h2", "h2-ch"], gated=False)
    assert router.plans(pod_h2, ["a"])[0].verdict == ""
    now[0] += 31.0
    assert router.bound_domains() == {}
    assert [p.verdict for p in router.plans(pod_i, NODES)] == ["", "", ""]


def test_nodes_not_chosen_for_a_claim_pod_are_counted_not_sent() -> None:
    """With ``extender.decide_in_filter`` the claim pod is offered its best node alone;
    the other feasible nodes are counted as not chosen in the metrics (as for a whole-GPU
    pod) and never sent as failed, and the refused node keeps its reason."""
    claims = _h_on_a_and_i_seen()
    ext = Extender(_cache(claims))
    sample = ext.metrics.registry.get_sample_value
    res = ext.filter({"Pod": _pod("pod-i", ["i", "i-ch"], gated=False), "NodeNames": NODES})
    (chosen,) = res["NodeNames"]
    assert chosen in ("b", "c")
    assert "b" not in res.get("FailedNodes", {}) and "c" not in res.get("FailedNodes", {})
    assert sample("topoplace_filter_nodes_total", {"result": "feasible"}) == 1
    assert sample("topoplace_filter_nodes_total", {"result": "failed"}) == 2
    not_chosen = {"reason": "another node suits the pod better"}
    assert sample("topoplace_filter_failures_total", not_chosen) == 1
    assert sample("topoplace_filter_failures_total", {"reason": dra.REASON_CD_NODE_BUSY}) == 1
