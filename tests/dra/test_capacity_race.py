"""The race of topoplace's gated share with kube-scheduler's share of the same shared GPU
(consumable capacity), on the objects a real Kubernetes v1.36.2 control plane wrote
(``tests/fixtures/kube/dra-1.36/capacity``): several claims may name a shared device, the
conflict is their ``consumedCapacity`` summing past its capacity. The allocation written
second yields: topoplace's own in its check after writing, kube-scheduler's at bind."""

from __future__ import annotations

import copy
from typing import Any

from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.kube import allocator as al
from scheduler.runtime.cache import ClusterCache
from tests.dra.test_allocator import MockClaimApi
from tests.dra.test_capacity import (
    GI,
    NODE,
    NOW,
    SHARED,
    _claim,
    _claims,
    _extra,
    _gated_pod,
    _items,
    _slices,
)

GPU1 = ("gpu.nvidia.com", NODE, "gpu-1")


def _setup(
    gated: list[dict[str, Any]], new: list[dict[str, Any]], bound: list[dict[str, Any]] = ()
) -> tuple[ClusterCache, MockClaimApi, al.GateAllocator]:
    """The recorded cluster (its pods bound, as recorded) plus ``bound`` pods, claims
    ``new`` and gated pods ``gated`` (the allocator's pending list)."""
    claims = _claims()
    for c in new:
        claims[dra.object_key(c)] = c
    pods = _items("pods.json", "Pod") + list(bound)
    cache = ClusterCache.from_objects(
        _items("nodes.json", "Node"), pods, SchedParams(), extra=_extra(claims)
    )
    api = MockClaimApi(cache, claims)
    alloc = al.GateAllocator(cache, api, lambda: list(gated), settle_s=0.0, clock=lambda: NOW)
    return cache, api, alloc


def _kube_share(name: str, like: str, pod: str) -> dict[str, Any]:
    """kube-scheduler's share as its PreBind writes it: recorded claim ``like`` (a share of
    gpu-node-0's gpu-1) under a new name, reserved for pod ``pod``."""
    c = copy.deepcopy(_claims()[f"default/{like}"])
    c["metadata"].update(name=name, uid=f"uid-{name}")
    c["metadata"].pop("resourceVersion", None)
    c["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    return c


def _bound_pod(name: str, claim: str) -> dict[str, Any]:
    p = copy.deepcopy(
        next(p for p in _items("pods.json", "Pod") if p["metadata"]["name"] == "share-d-pod")
    )
    p["metadata"].update(name=name, uid=f"uid-{name}")
    p["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": claim}]
    return p


def _memory_on_gpu1(claims: Any) -> int:
    return dra.consumed_by_device(claims).get(GPU1, {}).get("memory", 0)


def test_conflicts_name_the_other_shares_of_a_device_over_capacity_only_with_the_inventory() -> (
    None
):
    """share-z takes 70Gi of gpu-3 beside share-c's 70Gi: a conflict with share-c when the
    inventory is given, none without (exclusive devices only, as before); share-a's share
    of gpu-1 (17Gi of 80Gi used) is no conflict either way."""
    claims = _claims()
    z = copy.deepcopy(claims["default/share-c"])
    z["metadata"].update(name="share-z", uid="uid-share-z")
    claims["default/share-z"] = z
    inv = dra.inventory(_slices())
    mine = {"default/share-z": dra.allocated_ids(z)}
    assert dra.conflicts(mine, claims.values()) == {}
    assert dra.conflicts(mine, claims.values(), inv) == {"default/share-z": ["default/share-c"]}
    a = {"default/share-a": dra.allocated_ids(claims["default/share-a"])}
    assert dra.conflicts(a, claims.values(), inv) == {}


def test_topoplace_yields_its_share_when_kube_schedulers_landed_first_over_capacity() -> None:
    """A gated 60Gi share: topoplace-share packs it on gpu-node-0's gpu-1 (17Gi used: the
    tightest fit). kube-scheduler writes a 5Gi share there (recorded share-d's) before
    topoplace's write, for a pod that is bound: 17 + 5 + 60 > 80Gi. topoplace's check
    finds it; its allocation is undone (the pod still gated) and the pod retried with
    kube-scheduler's consumption known goes elsewhere. No device ends over capacity."""
    gated = [_gated_pod("pg", "gs")]
    theirs = _kube_share("share-k", "share-d", "share-k-pod")
    cache, api, alloc = _setup(
        gated, [_claim("gs", SHARED, {"memory": "60Gi"})], [_bound_pod("share-k-pod", "share-k")]
    )
    inv = cache.dra_inventory()
    api.sneak = [theirs]
    (out,) = alloc.step()
    assert (out.state, out.node, out.devices) == (al.YIELDED, NODE, ("gpu-1",)), out
    assert "default/share-k" in out.reason
    gs = api.claims["default/gs"]
    assert not dra.is_allocated(gs) and dra.ALLOCATED_BY not in gs["metadata"]["annotations"]
    assert api.ungated == []
    # kube-scheduler's share kept, and not written again (shares are counted one by one)
    assert ("status", "default/share-k") not in api.writes
    # the watch now shows share-k; the retry goes where 60Gi fits beside everything
    api.sneak = []
    api.claims["default/share-k"] = theirs
    cache.apply_claim("default/share-k", theirs)
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    assert (out.node, out.devices) != (NODE, ("gpu-1",))
    assert dra.overcommits(api.claims.values(), inv) == []
    assert _memory_on_gpu1(api.claims.values()) == 22 * GI


def test_topoplace_keeps_its_share_when_the_sum_fits() -> None:
    """The same race with a 2Gi share of kube-scheduler's (recorded share-b's): 17 + 2 +
    60 = 79Gi of 80Gi: both stay, the gate goes."""
    gated = [_gated_pod("pg", "gs")]
    theirs = _kube_share("share-k", "share-b", "share-k-pod")
    cache, api, alloc = _setup(
        gated, [_claim("gs", SHARED, {"memory": "60Gi"})], [_bound_pod("share-k-pod", "share-k")]
    )
    api.sneak = [theirs]
    (out,) = alloc.step()
    assert (out.state, out.node, out.devices) == (al.RELEASED, NODE, ("gpu-1",)), out
    assert api.ungated == ["default/pg"]
    assert _memory_on_gpu1(api.list_claims()) == 79 * GI
    assert dra.overcommits(api.list_claims(), cache.dra_inventory()) == []


def test_an_unbound_kube_share_is_waited_for_and_given_back_at_bind() -> None:
    """kube-scheduler's 5Gi share lands first for a pod it has not bound yet (topoplace
    binds it): topoplace keeps its share and its gate; at that pod's bind the check finds
    the sum over capacity with topoplace's share and gives kube-scheduler's allocation back
    (the bind fails, kube-scheduler retries); then topoplace's pod goes."""
    gated = [_gated_pod("pg", "gs")]
    theirs = _kube_share("share-k", "share-d", "share-k-pod")
    cache, api, alloc = _setup(gated, [_claim("gs", SHARED, {"memory": "60Gi"})])
    api.sneak = [theirs]
    (out,) = alloc.step()
    assert (out.state, out.devices) == (al.WAITING, ("gpu-1",)), out
    assert "waiting for their bind" in out.reason
    assert api.ungated == []
    api.sneak = []
    api.claims["default/share-k"] = copy.deepcopy(theirs)
    cache.apply_claim("default/share-k", copy.deepcopy(theirs))
    assert _memory_on_gpu1(api.claims.values()) == 82 * GI
    pod = _bound_pod("share-k-pod", "share-k")
    pod["spec"].pop("nodeName")
    err = alloc.check_bind("default/share-k-pod", pod, NODE, "uid-share-k-pod", {})
    assert err.startswith("the pod's DRA devices are also allocated by topoplace"), err
    assert "default/gs" in err
    k = api.claims["default/share-k"]
    assert not dra.is_allocated(k) and "reservedFor" not in k["status"]
    assert dra.is_allocated(api.claims["default/gs"])
    assert _memory_on_gpu1(api.claims.values()) == 77 * GI
    outs = alloc.step()
    assert [(o.state, o.devices) for o in outs] == [(al.RELEASED, ("gpu-1",))]
    assert api.ungated == ["default/pg"]


def test_the_bind_check_passes_a_kube_share_that_fits() -> None:
    """A 2Gi share of kube-scheduler's beside topoplace's 60Gi (79Gi of 80Gi): the bind
    passes and nothing is written."""
    gated = [_gated_pod("pg", "gs")]
    cache, api, alloc = _setup(gated, [_claim("gs", SHARED, {"memory": "60Gi"})])
    (out,) = alloc.step()
    assert (out.state, out.devices) == (al.RELEASED, ("gpu-1",)), out
    theirs = _kube_share("share-k", "share-b", "share-k-pod")
    api.claims["default/share-k"] = copy.deepcopy(theirs)
    cache.apply_claim("default/share-k", copy.deepcopy(theirs))
    api.writes.clear()
    pod = _bound_pod("share-k-pod", "share-k")
    pod["spec"].pop("nodeName")
    assert alloc.check_bind("default/share-k-pod", pod, NODE, "uid-share-k-pod", {}) == ""
    assert api.writes == []


def test_the_bind_check_refuses_a_kube_share_written_after_topoplaces_over_capacity() -> None:
    """topoplace's 60Gi share is written, checked and released first; kube-scheduler's
    PreBind then writes a 5Gi share of the same GPU from a view without it (17 + 60 + 5 >
    80Gi). Its pod's bind finds the sum over capacity with topoplace's share: the
    allocation and reservation are removed (only that claim's), the bind fails."""
    gated = [_gated_pod("pg", "gs")]
    cache, api, alloc = _setup(gated, [_claim("gs", SHARED, {"memory": "60Gi"})])
    (out,) = alloc.step()
    assert (out.state, out.devices) == (al.RELEASED, ("gpu-1",)), out
    theirs = _kube_share("share-k", "share-d", "share-k-pod")
    api.claims["default/share-k"] = copy.deepcopy(theirs)
    cache.apply_claim("default/share-k", copy.deepcopy(theirs))
    assert [o.device for o in dra.overcommits(api.claims.values(), cache.dra_inventory())] == [GPU1]
    api.writes.clear()
    pod = _bound_pod("share-k-pod", "share-k")
    pod["spec"].pop("nodeName")
    err = alloc.check_bind("default/share-k-pod", pod, NODE, "uid-share-k-pod", {})
    assert "default/gs" in err, err
    assert api.writes == [("status", "default/share-k")]
    assert not dra.is_allocated(api.claims["default/share-k"])
    assert dra.overcommits(api.claims.values(), cache.dra_inventory()) == []
    assert _memory_on_gpu1(api.claims.values()) == 77 * GI


def test_the_extenders_bind_reads_kube_shares_where_topoplace_holds_only_shares() -> None:
    """topoplace holds only a share on the node (no device of its own alone): the
    extender's bind still reads the claims kube-scheduler allocated for the pod, finds its
    5Gi share of the same GPU over capacity beside topoplace's 60Gi, and fails the bind
    (before, a node without devices of topoplace's was not read at all)."""
    from scheduler.runtime.dra import DraRouter

    gated = [_gated_pod("pg", "gs")]
    claims = _claims()
    claims["default/gs"] = _claim("gs", SHARED, {"memory": "60Gi"})
    cache = ClusterCache.from_objects(
        _items("nodes.json", "Node"),
        _items("pods.json", "Pod"),
        SchedParams(),
        extra=_extra(claims),
    )
    api = MockClaimApi(cache, claims)
    router = DraRouter(cache, clock=lambda: NOW)
    alloc = al.GateAllocator(
        cache, api, lambda: list(gated), settle_s=0.0, clock=lambda: NOW, router=router
    )
    (out,) = alloc.step()
    assert (out.state, out.devices) == (al.RELEASED, ("gpu-1",)), out
    assert router.own_devices(NODE) == {}  # a share is no device of topoplace's alone
    theirs = _kube_share("share-k", "share-d", "share-k-pod")
    api.claims["default/share-k"] = copy.deepcopy(theirs)
    cache.apply_claim("default/share-k", copy.deepcopy(theirs))
    pod = _bound_pod("share-k-pod", "share-k")
    pod["spec"].pop("nodeName")
    err = router.before_bind_claims("default/share-k-pod", pod, NODE, "uid-share-k-pod")
    assert "default/gs" in err, err
    assert not dra.is_allocated(api.claims["default/share-k"])
    assert dra.overcommits(api.claims.values(), cache.dra_inventory()) == []
