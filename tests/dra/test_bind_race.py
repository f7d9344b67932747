"""The race of topoplace's gated allocation with kube-scheduler's own, replayed step by step
on the recorded v1.33.0 objects (``tests/fixtures/kube/dra-1.33``).

The interleaving that let one device be held by two claims live: topoplace writes a gated
pod's allocation and checks it against every claim at once; kube-scheduler, whose
DynamicResources filter ran on a view without that write, writes its first fit for an
ungated pod only after topoplace's check (its PreBind), then calls topoplace's bind."""

from __future__ import annotations

import copy
from typing import Any

from scheduler.core import dra
from scheduler.kube import allocator as al
from scheduler.runtime.dra import DraRouter
from tests.dra import recorded
from tests.dra.test_allocator import MockClaimApi, _claim, _pod, _setup

NODE = "gpu-node-0"


def _ungated(name: str, claim: str) -> dict[str, Any]:
    p = _pod(name, claim, node=NODE)
    p["spec"].pop("schedulingGates")
    return p


def _kube_prebind(api: MockClaimApi, key: str, devices: list[dra.Device], pod_name: str) -> None:
    """kube-scheduler's PreBind: its allocation and the pod's reservation, one status write."""
    cur = api.claims[key]
    spec = dra.claim_spec(cur)
    status = {
        "allocation": dra.allocation_status(NODE, spec, devices),
        "reservedFor": [{"resource": "pods", "name": pod_name, "uid": f"uid-{pod_name}"}],
    }
    api.update_claim_status({**copy.deepcopy(cur), "status": status})


def _holders(api: MockClaimApi) -> dict[tuple[str, str, str], list[str]]:
    out: dict[tuple[str, str, str], list[str]] = {}
    for k, c in sorted(api.claims.items()):
        for i in dra.allocated_ids(c):
            out.setdefault(i, []).append(k)
    return out


def _setup_pair() -> tuple[Any, MockClaimApi, DraRouter, al.GateAllocator, list[float]]:
    """Node gpu-node-0 empty; claim g2 (2 GPUs) of the gated pod pg, u2 (2 GPUs) of the
    ungated pu; the router on a clock the test moves."""
    claims = {"default/g2": _claim("g2", 2), "default/u2": _claim("u2", 2)}
    gated = _pod("pg", "g2", node=NODE)
    cache, api, _ = _setup(claims, [gated])
    now = [100.0]
    router = DraRouter(cache, clock=lambda: now[0])
    alloc = al.GateAllocator(cache, api, lambda: [gated], settle_s=0.0, router=router)
    return cache, api, router, alloc, now


def _stale_first_fit(cache: Any, api: MockClaimApi, held: tuple[Any, ...] = ()) -> list[Any]:
    spec = dra.claim_spec(api.claims["default/u2"])
    p = dra.first_fit(cache.dra_inventory(), NODE, [spec], recorded.classes(), held)
    return list(p.devices[0])


def _names(devs: list[Any]) -> list[str]:
    return [d.name for d in devs]


G_IDS = (("gpu.nvidia.com", NODE, "gpu-0"), ("gpu.nvidia.com", NODE, "gpu-3"))


def _step_with_prebind_after_g2(
    api: MockClaimApi, alloc: al.GateAllocator, stale: list[Any]
) -> list[Any]:
    """One allocator step in which kube-scheduler's PreBind of ``stale`` for u2 (pod pu)
    lands right after topoplace's write of g2's allocation, before its check."""
    written = api.update_claim_status

    def prebind_first(claim: Any) -> dict[str, Any]:
        out = written(claim)
        first = not dra.is_allocated(api.claims["default/u2"])
        if dra.object_key(claim) == "default/g2" and dra.is_allocated(claim) and first:
            _kube_prebind(api, "default/u2", stale, "pu")
        return out

    api.update_claim_status = prebind_first  # type: ignore[method-assign]
    try:
        return alloc.step()
    finally:
        api.update_claim_status = written  # type: ignore[method-assign]


def test_kube_schedulers_late_prebind_of_a_stale_first_fit_fails_at_bind_and_is_undone() -> None:
    cache, api, router, alloc, now = _setup_pair()
    ungated = _ungated("pu", "u2")
    assert router.check_bind is not None  # the allocator arms the bind check itself

    # 1. kube-scheduler's DynamicResources filter for pu, on a view without g2's allocation.
    stale = _stale_first_fit(cache, api)
    assert _names(stale) == ["gpu-0", "gpu-1"]

    # 2. topoplace allocates the gated pod (the NVLink pair 0-3), checks against every claim
    #    (u2 is not allocated yet) and releases it.
    (out,) = alloc.step()
    assert (out.state, out.devices) == (al.RELEASED, ("gpu-0", "gpu-3"))

    # 3. topoplace's filter for pu within RECENT_S of the write predicts as a view without
    #    it would (gpu-0, gpu-1) and refuses the node: kube-scheduler may not count g2 yet.
    f = router.filter(ungated, [NODE])
    assert (f.feasible, dict(f.failed)) == ((), {NODE: dra.REASON_CLAIM_IN_FLIGHT})
    # ... past it, from its own view (g2 held): gpu-1, gpu-2, and the node passes.
    now[0] += router.recent_s + 0.1
    assert router.filter(ungated, [NODE]).feasible == (NODE,)
    (plan,) = router.plans(ungated, [NODE])
    assert plan.prediction.gpus == (1, 2)

    # 4. A kube-scheduler cycle begun before the write and stalled past the window: its
    #    PreBind writes the stale first fit, and gpu-0 is in two claims.
    _kube_prebind(api, "default/u2", stale, "pu")
    both = {i: ks for i, ks in _holders(api).items() if len(ks) > 1}
    assert both == {("gpu.nvidia.com", NODE, "gpu-0"): ["default/g2", "default/u2"]}

    # 5. topoplace's bind for pu: the claim kube-scheduler allocated takes a device of
    #    topoplace's: its allocation is removed, the bind fails, and g2 (no pod reserved it
    #    yet) is written again, so that kube-scheduler's set of allocated devices, which
    #    lost gpu-0 when u2 gave it back, has it again.
    assert router.own_devices(NODE) == {i: "default/g2" for i in G_IDS}
    api.writes.clear()
    err = router.before_bind_claims("default/pu", ungated, NODE, "uid-pu")
    assert err.startswith("the pod's DRA devices are also allocated by topoplace")
    assert "default/g2" in err
    assert api.writes == [("status", "default/u2"), ("status", "default/g2")] + [
        ("status", "default/g2")
    ]
    u2 = api.claims["default/u2"]
    assert not dra.is_allocated(u2) and "reservedFor" not in u2["status"]
    assert dra.allocated_ids(api.claims["default/g2"]) == G_IDS
    assert all(len(ks) == 1 for ks in _holders(api).values())

    # 6. kube-scheduler tries pu again, from a view with g2: gpu-1, gpu-2; the bind passes.
    fresh = _stale_first_fit(cache, api, G_IDS)
    assert _names(fresh) == ["gpu-1", "gpu-2"]
    _kube_prebind(api, "default/u2", fresh, "pu")
    assert router.before_bind_claims("default/pu", ungated, NODE, "uid-pu") == ""
    assert all(len(ks) == 1 for ks in _holders(api).values())
    assert len(_holders(api)) == 4


def test_a_prebind_before_topoplaces_check_waits_for_the_bind_check_then_releases() -> None:
    """The other order: kube-scheduler's write lands before topoplace's check. Its pod is
    not bound (topoplace binds it), so topoplace keeps the devices and the gate; the bind
    check gives kube-scheduler's allocation back and writes g2 again; then pg goes."""
    cache, api, router, alloc, now = _setup_pair()
    ungated = _ungated("pu", "u2")
    stale = _stale_first_fit(cache, api)
    (out,) = _step_with_prebind_after_g2(api, alloc, stale)
    assert out.state == al.WAITING and "waiting for their bind" in out.reason, out
    assert dra.allocated_ids(api.claims["default/g2"]) == G_IDS
    assert api.ungated == []
    err = router.before_bind_claims("default/pu", ungated, NODE, "uid-pu")
    assert err and not dra.is_allocated(api.claims["default/u2"])
    assert all(len(ks) == 1 for ks in _holders(api).values())
    (out,) = alloc.step()
    assert out.state == al.RELEASED and api.ungated == ["default/pg"]
    assert dra.allocated_ids(api.claims["default/g2"]) == G_IDS


def _yield_to_a_bound_pod() -> tuple[Any, MockClaimApi, DraRouter, al.GateAllocator]:
    """kube-scheduler's pod pu is bound already (u2 in use) and its PreBind of the stale
    first fit lands right after topoplace's write of g2: topoplace's allocation yields."""
    cache, api, router, alloc, now = _setup_pair()
    stale = _stale_first_fit(cache, api)
    bound = _ungated("pu", "u2")
    bound["spec"]["nodeName"] = NODE
    bound["spec"]["nodeSelector"] = {}
    cache.upsert_pod(bound)
    (out,) = _step_with_prebind_after_g2(api, alloc, stale)
    assert out.state == al.YIELDED, out
    return cache, api, router, alloc


def test_a_bound_pods_claim_makes_topoplace_yield() -> None:
    """kube-scheduler's pod bound already (its claim in use): topoplace's allocation
    yields, and the pod is tried again with the other claim known."""
    cache, api, router, _ = _yield_to_a_bound_pod()
    assert not dra.is_allocated(api.claims["default/g2"])
    assert all(len(ks) == 1 for ks in _holders(api).values())
    # u2 is in use, so it cannot be written again: kube-scheduler's set of allocated
    # devices lost gpu-0 (g2 gave it back). topoplace keeps claim pods off it: a 1-GPU
    # pod whose first fit, as kube-scheduler sees it, is gpu-0 is refused there, and a
    # bind of a claim kube-scheduler gave gpu-0 fails.
    lost = {("gpu.nvidia.com", NODE, "gpu-0"), ("gpu.nvidia.com", NODE, "gpu-1")}
    assert router.uncounted() == {"default/u2": frozenset(lost)}
    c1 = _claim("c1", 1)
    api.claims["default/c1"] = c1
    cache.apply_claim("default/c1", copy.deepcopy(c1))
    p1 = _ungated("p1", "c1")
    f = router.filter(p1, [NODE])
    assert dict(f.failed) == {NODE: dra.REASON_CLAIM_IN_FLIGHT}
    _kube_prebind(
        api, "default/c1", [d for d in _stale_first_fit(cache, api) if d.name == "gpu-0"], "p1"
    )
    assert router.before_bind_claims("default/p1", p1, NODE, "uid-p1")
    assert not dra.is_allocated(api.claims["default/c1"])


def test_an_uncounted_device_s_pod_is_allocated_by_topoplace() -> None:
    """The pod above is pinned to the node, and kube-scheduler's first fit there keeps
    landing on gpu-0, which it no longer counts: refused on every node it may use, it would
    wait for as long as u2 lives. topoplace's allocator takes it on (no gate to remove):
    it gives c1 a free device topoplace counts, and wakes the pod; kube-scheduler then only
    reserves the allocation, and the bind check passes."""
    cache, api, router, alloc = _yield_to_a_bound_pod()
    lost = {("gpu.nvidia.com", NODE, "gpu-0"), ("gpu.nvidia.com", NODE, "gpu-1")}
    c1 = _claim("c1", 1)
    api.claims["default/c1"] = c1
    cache.apply_claim("default/c1", copy.deepcopy(c1))
    p1 = _ungated("p1", "c1")
    cache.remember_pending(p1)
    woken: list[str] = []
    api.wake_pod = lambda ns, name, why: woken.append(f"{ns}/{name}")  # type: ignore[attr-defined]
    alloc.pending = list  # the watch keeps no pending claim pod without the gate
    assert router.adopted() == frozenset()
    assert router.filter(p1, [NODE]).feasible == ()
    assert router.adopted() == {"default/p1"}
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    got = set(dra.allocated_ids(api.claims["default/c1"]))
    assert len(got) == 1 and not got & lost, got
    assert api.ungated == [] and woken == ["default/p1"]
    assert router.adopted() == frozenset()
    # kube-scheduler, on its next try, only reserves the allocation (PreBind)
    cur = copy.deepcopy(api.claims["default/c1"])
    cur["status"]["reservedFor"] = [{"resource": "pods", "name": "p1", "uid": "uid-p1"}]
    api.update_claim_status(cur)
    assert router.before_bind_claims("default/p1", p1, NODE, "uid-p1") == ""
    assert all(len(ks) == 1 for ks in _holders(api).values())
    # nothing left for the allocator to do for it
    assert alloc.step() == []


def test_no_device_of_topoplaces_on_the_node_reads_nothing() -> None:
    claims = {"default/u2": _claim("u2", 2)}
    ungated = _ungated("pu", "u2")
    cache, api, _ = _setup(claims, [])
    router = DraRouter(cache)
    al.GateAllocator(cache, api, list, settle_s=0.0, router=router)
    reads: list[str] = []
    api.get_claim = lambda ns, name: reads.append(name) or {}  # type: ignore[assignment,method-assign,func-returns-value]
    assert router.own_devices(NODE) == {}
    assert router.before_bind_claims("default/pu", ungated, NODE, "uid-pu") == ""
    assert reads == []


def test_a_claim_another_running_pod_reserved_is_left_allocated() -> None:
    cache, api, router, alloc, now = _setup_pair()
    ungated = _ungated("pu", "u2")
    stale = _stale_first_fit(cache, api)
    alloc.step()
    _kube_prebind(api, "default/u2", stale, "other")
    err = router.before_bind_claims("default/pu", ungated, NODE, "uid-pu")
    assert err  # the bind still fails: the device is topoplace's
    assert dra.is_allocated(api.claims["default/u2"])  # but a running pod's claim stays


def test_a_pod_refused_only_by_the_window_is_woken_when_it_ends() -> None:
    """kube-scheduler parks a pod only an extender refused: once the window of
    topoplace's recent writes has ended, the allocator wakes the pods it kept from them."""
    cache, api, router, alloc, now = _setup_pair()
    ungated = _ungated("pu", "u2")
    cache.remember_pending(ungated)
    woken: list[tuple[str, str]] = []
    api.wake_pod = lambda ns, name, why: woken.append((ns, name))  # type: ignore[attr-defined]
    alloc.step()  # g2 written: gpu-0 and gpu-3 recent
    assert router.filter(ungated, [NODE]).feasible == ()
    assert alloc.wake_held_off() == [] and woken == []  # the window is still open
    now[0] += router.recent_s + 0.2
    assert alloc.wake_held_off() == ["default/pu"]
    assert woken == [("default", "pu")]
    assert alloc.wake_held_off() == []  # once


def test_a_pod_refused_for_devices_in_flight_with_no_window_open_is_woken_soon() -> None:
    """With the window of recent writes off (``recent_s`` 0, as the live race test runs)
    a pod refused for devices topoplace is still writing, or no longer counted by
    kube-scheduler, has no window end to wait for: it is woken HELD_OFF_RETRY_S later, once
    (before, it waited for kube-scheduler's own 5-minute flush of unschedulable pods)."""
    from scheduler.core.schedule import FilterOutcome
    from scheduler.runtime.dra import HELD_OFF_RETRY_S

    cache, api, router, alloc, now = _setup_pair()
    router.recent_s = 0.0
    refused = FilterOutcome((), {NODE: dra.REASON_CLAIM_IN_FLIGHT}, {})
    router._note_held_off("default/pu", refused)
    assert router.due_wakes() == []
    now[0] += HELD_OFF_RETRY_S - 0.05
    assert router.due_wakes() == []
    now[0] += 0.1
    assert router.due_wakes() == ["default/pu"]
    assert router.due_wakes() == []  # once
    # a pod that got a node is not woken
    router._note_held_off("default/pu", refused)
    router._note_held_off("default/pu", FilterOutcome((NODE,), {}, {}))
    now[0] += HELD_OFF_RETRY_S + 1
    assert router.due_wakes() == []
