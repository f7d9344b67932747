"""topoplace's own allocation for pods gated with topoplace.io/allocate (recorded v1.33.0
objects; the API is a mock that keeps claims in memory and echoes writes as the watch would)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.kube import allocator as al
from scheduler.kube.client import ApiError
from scheduler.runtime.cache import ClusterCache
from tests.dra import recorded
from topology.select import ring_bottleneck
from topology.shape import CATALOG

PARAMS = SchedParams()
DGX1 = CATALOG["dgx1-v100"]


class MockClaimApi:
    """Claims in memory; every write is echoed to the cache as a watch event would be.
    ``sneak`` claims are kube-scheduler's writes the watch has not delivered yet: in
    ``list_claims`` at once, and in the cache just before the echo of the next write (a
    watch delivers in ``resourceVersion`` order, so a write made before topoplace's shows
    before it)."""

    def __init__(self, cache: ClusterCache, claims: Mapping[str, dict]) -> None:
        self.cache = cache
        self.claims = {k: copy.deepcopy(v) for k, v in claims.items()}
        self.sneak: list[dict] = []
        self.ungated: list[str] = []
        self.notes: dict[str, dict[str, str]] = {}  # pod -> annotations added with the gate
        self.writes: list[tuple[str, str]] = []
        self.rv = 1000
        self.lists = 0
        self.delivered: set[str] = set()  # sneak claims the watch has shown
        self.lock = threading.RLock()  # the allocator's writer threads call at once

    def _bump(self, c: dict) -> dict:
        self.rv += 1
        c["metadata"]["resourceVersion"] = str(self.rv)
        key = dra.object_key(c)
        self.claims[key] = c
        for s in self.sneak:
            k = dra.object_key(s)
            if k not in self.delivered:
                self.delivered.add(k)
                self.cache.apply_claim(k, copy.deepcopy(s))
        self.cache.apply_claim(key, copy.deepcopy(c))
        return copy.deepcopy(c)

    def get_claim(self, ns: str, name: str) -> dict:
        with self.lock:
            c = self.claims.get(f"{ns}/{name}")
            if c is None:
                raise ApiError(404, "NotFound", "no such claim")
            return copy.deepcopy(c)

    def list_claims(self) -> list[dict]:
        with self.lock:
            self.lists += 1
            return [copy.deepcopy(c) for c in self.claims.values()] + copy.deepcopy(self.sneak)

    def update_claim(self, claim: Mapping[str, Any]) -> dict:
        with self.lock:
            key = dra.object_key(claim)
            cur = self.claims[key]
            if claim["metadata"].get("resourceVersion") != cur["metadata"].get("resourceVersion"):
                raise ApiError(409, "Conflict", "stale")
            self.writes.append(("claim", key))
            new = copy.deepcopy(cur)
            new["metadata"] = copy.deepcopy(dict(claim["metadata"]))
            return self._bump(new)

    def update_claim_status(self, claim: Mapping[str, Any]) -> dict:
        with self.lock:
            key = dra.object_key(claim)
            cur = self.claims[key]
            if claim["metadata"].get("resourceVersion") != cur["metadata"].get("resourceVersion"):
                raise ApiError(409, "Conflict", "stale")
            self.writes.append(("status", key))
            new = copy.deepcopy(cur)
            new["status"] = copy.deepcopy(dict(claim.get("status") or {}))
            return self._bump(new)

    def remove_gate(
        self, pod: Mapping[str, Any], gate: str, annotations: Mapping[str, str] | None = None
    ) -> dict:
        with self.lock:
            self.ungated.append(dra.object_key(pod))
            if annotations:
                self.notes[dra.object_key(pod)] = dict(annotations)
        return {}


def _claim(name: str, count: int) -> dict:
    c = copy.deepcopy(recorded.claims()["default/pending-four"])
    c["metadata"]["name"] = name
    c["metadata"]["uid"] = f"uid-{name}"
    c["spec"]["devices"]["requests"][0]["exactly"]["count"] = count
    return c


def pod_metadata(name: str, gang: str = "", size: int = 0) -> dict:
    """A test pod's metadata in namespace default (uid ``uid-<name>``), annotated as a
    member of gang ``gang`` of ``size`` when ``gang`` is set."""
    ann = {"topoplace.io/gang": gang, "topoplace.io/gang-size": str(size)} if gang else {}
    return {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": ann}


def _pod(name: str, claim: str, *, gang: str = "", size: int = 0, node: str = "") -> dict:
    return {
        "kind": "Pod",
        "metadata": pod_metadata(name, gang, size),
        "spec": {
            "schedulingGates": [{"name": dra.ALLOCATE_GATE}],
            "nodeSelector": {"kubernetes.io/hostname": node} if node else {},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def _nodes(topology: str = "dgx1-v100") -> list[dict]:
    out = recorded.nodes()
    for n in out:
        n["metadata"].setdefault("annotations", {})["topoplace.io/gpu-topology"] = topology
    return out


def _setup(
    claims: dict[str, dict], pods: list[dict], *, keep_recorded: bool = False
) -> tuple[ClusterCache, MockClaimApi, al.GateAllocator]:
    extra = recorded.extra()
    if not keep_recorded:
        extra[dra.CLAIMS_KEY] = {}
    extra[dra.CLAIMS_KEY].update(claims)
    cache = ClusterCache.from_objects(_nodes(), [], PARAMS, extra=extra)
    api = MockClaimApi(cache, extra[dra.CLAIMS_KEY])
    alloc = al.GateAllocator(cache, api, lambda: pods, settle_s=0.0)
    return cache, api, alloc


def _devices(api: MockClaimApi, key: str) -> tuple[str, list[str]]:
    c = api.claims[key]
    return dra.allocation_node(c), [d for _, _, d in dra.allocated_ids(c)]


def test_allocates_the_nvlink_best_pair_first_fit_would_not() -> None:
    claims = {"default/c2": _claim("c2", 2)}
    pods = [_pod("p2", "c2", node="gpu-node-0")]
    cache, api, alloc = _setup(claims, pods)
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    assert _devices(api, "default/c2") == ("gpu-node-0", ["gpu-0", "gpu-3"])
    # kube-scheduler's first fit would have taken gpu-0, gpu-1: half the bandwidth.
    inv = cache.dra_inventory()
    ff = dra.first_fit(
        inv, "gpu-node-0", [dra.claim_spec(claims["default/c2"])], recorded.classes(), ()
    )
    assert [d.name for d in ff.devices[0]] == ["gpu-0", "gpu-1"]
    assert (ring_bottleneck(DGX1, (0, 3)), ring_bottleneck(DGX1, ff.gpus)) == (50.0, 25.0)
    c = api.claims["default/c2"]
    assert dra.DELETE_PROTECTION in c["metadata"]["finalizers"]
    assert c["metadata"]["annotations"][dra.ALLOCATED_BY] == "topoplace"
    assert api.writes == [("claim", "default/c2"), ("status", "default/c2")]  # finalizer first
    assert api.ungated == ["default/p2"]
    held = cache.snapshot().pods["resourceclaim:default/c2"]
    assert (held.node, held.gpus, held.assumed) == ("gpu-node-0", (0, 3), False)


def test_fragmented_node_four_gpus() -> None:
    """GPU 0 held by another claim: first fit takes 1-4 (7.9 GB/s ring), topoplace 4-7."""
    first = _claim("first", 1)
    cache0, api0, _ = _setup({"default/first": first}, [])
    inv = cache0.dra_inventory()
    d0 = [d for d in inv.by_node["gpu-node-0"] if d.name == "gpu-0"]
    first["status"] = {"allocation": dra.allocation_status("gpu-node-0", dra.claim_spec(first), d0)}
    claims = {"default/first": first, "default/c4": _claim("c4", 4)}
    cache, api, alloc = _setup(claims, [_pod("p4", "c4", node="gpu-node-0")])
    (out,) = alloc.step()
    assert out.state == al.RELEASED
    assert _devices(api, "default/c4")[1] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    ff = dra.first_fit(
        cache.dra_inventory(),
        "gpu-node-0",
        [dra.claim_spec(claims["default/c4"])],
        recorded.classes(),
        dra.allocated_ids(first),
    )
    assert ff.gpus == (1, 2, 3, 4)
    assert ring_bottleneck(DGX1, ff.gpus) == 7.875
    assert ring_bottleneck(DGX1, (4, 5, 6, 7)) == 25.0


def test_never_hands_a_device_another_claim_holds_or_a_tainted_one() -> None:
    # Recorded claims hold gpu-node-0 GPUs 0-3 and gpu-node-1 all but the tainted gpu-5.
    claims = {"default/c4": _claim("c4", 4), "default/c1": _claim("c1", 1)}
    pods = [_pod("pa", "c4"), _pod("pb", "c1")]
    cache, api, alloc = _setup(claims, pods, keep_recorded=True)
    outs = alloc.step()
    assert [o.state for o in outs] == [al.RELEASED, al.WAITING]
    assert _devices(api, "default/c4") == ("gpu-node-0", ["gpu-4", "gpu-5", "gpu-6", "gpu-7"])
    assert outs[1].reason == dra.REASON_NO_DRA_NODE  # gpu-node-1's free GPU is tainted
    assert not dra.is_allocated(api.claims["default/c1"])
    assert api.ungated == ["default/pa"]


def test_avoids_devices_kube_scheduler_may_be_allocating() -> None:
    claims = {"default/c2": _claim("c2", 2)}
    cache, api, alloc = _setup(claims, [_pod("p2", "c2", node="gpu-node-0")])
    alloc.kube_picks = lambda: {("gpu.nvidia.com", "gpu-node-0", "gpu-3")}
    (out,) = alloc.step()
    assert out.state == al.RELEASED
    assert "gpu-3" not in _devices(api, "default/c2")[1]


def test_race_with_kube_scheduler_topoplace_yields_then_retries() -> None:
    """kube-scheduler allocates gpu-3 to another claim after topoplace's pick and before
    its write (the watch shows that claim before topoplace's write): the check finds it,
    topoplace removes its own allocation (the pod is still gated) and, once the other claim
    is known, allocates around it. No device ends with two claims. (A claim written after
    topoplace's write is the bind check's: ``tests/dra/test_bind_race.py``.)"""
    claims = {"default/c2": _claim("c2", 2)}
    pods = [_pod("p2", "c2", node="gpu-node-0")]
    cache, api, alloc = _setup(claims, pods)
    inv = cache.dra_inventory()
    theirs = _claim("kube-scheduler-s", 1)
    d3 = [d for d in inv.by_node["gpu-node-0"] if d.name == "gpu-3"]
    theirs["status"] = {
        "allocation": dra.allocation_status("gpu-node-0", dra.claim_spec(theirs), d3)
    }
    api.sneak = [theirs]
    (out,) = alloc.step()
    assert out.state == al.YIELDED
    assert "kube-scheduler-s" in out.reason
    c = api.claims["default/c2"]
    assert not dra.is_allocated(c)
    assert dra.DELETE_PROTECTION not in c["metadata"]["finalizers"]
    assert dra.ALLOCATED_BY not in c["metadata"]["annotations"]
    assert "resourceclaim:default/c2" not in cache.snapshot().pods
    assert api.ungated == []
    # The watch now shows kube-scheduler's claim.
    api.sneak = []
    api.claims["default/kube-scheduler-s"] = theirs
    cache.apply_claim("default/kube-scheduler-s", theirs)
    (out,) = alloc.step()
    assert out.state == al.RELEASED
    node, devs = _devices(api, "default/c2")
    assert "gpu-3" not in devs
    held = [dra.allocated_ids(x) for x in api.list_claims()]
    flat = [i for ids in held for i in ids]
    assert len(flat) == len(set(flat))  # no device in two claims


def test_restart_releases_a_pod_whose_claims_topoplace_already_allocated() -> None:
    c = _claim("c2", 2)
    cache0, _, _ = _setup({}, [])
    devs = [d for d in cache0.dra_inventory().by_node["gpu-node-0"] if d.name in ("gpu-0", "gpu-3")]
    done = dra.allocated_claim(c, "gpu-node-0", dra.claim_spec(c), devs)
    cache, api, alloc = _setup({"default/c2": done}, [_pod("p2", "c2")])
    assert cache.snapshot().pods["resourceclaim:default/c2"].gpus == (0, 3)  # from the claim
    (out,) = alloc.step()
    assert (out.state, out.node, out.devices) == (al.RELEASED, "gpu-node-0", ("gpu-0", "gpu-3"))
    assert api.writes == []  # nothing written again
    assert api.ungated == ["default/p2"]


def test_waits_for_claims_that_do_not_exist_yet() -> None:
    cache, api, alloc = _setup({}, [_pod("p", "missing")])
    (out,) = alloc.step()
    assert (out.state, out.reason) == (al.WAITING, dra.REASON_CLAIMS_UNKNOWN)
    assert api.writes == [] and api.ungated == []


def test_gang_is_allocated_all_or_nothing_with_the_gang_solver() -> None:
    claims = {f"default/g{i}": _claim(f"g{i}", 4) for i in range(4)}
    pods = [_pod(f"m{i}", f"g{i}", gang="train", size=3) for i in range(3)]
    # Two members of three: nothing is written.
    cache, api, alloc = _setup(claims, pods[:2])
    outs = alloc.step()
    assert {o.state for o in outs} == {al.WAITING}
    assert api.writes == []
    # Four members of 4 GPUs do not fit (gpu-5 of gpu-node-1 is tainted): nothing written.
    four = [_pod(f"m{i}", f"g{i}", gang="train4", size=4) for i in range(4)]
    cache, api, alloc = _setup(claims, four)
    outs = alloc.step()
    assert {o.state for o in outs} == {al.WAITING}
    assert "room for 3" in outs[0].reason
    assert api.writes == [] and api.ungated == []
    # Three: each on one NVLink quad of a DGX-1, never the tainted GPU.
    cache, api, alloc = _setup(claims, pods)
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    got = [_devices(api, f"default/g{i}") for i in range(3)]
    flat = [(n, d) for n, devs in got for d in devs]
    assert len(flat) == len(set(flat)) == 12
    assert ("gpu-node-1", "gpu-5") not in flat
    assert sorted(api.ungated) == [f"default/m{i}" for i in range(3)]
    for _, devs in got:
        idx = tuple(sorted(int(d.split("-")[1]) for d in devs))
        assert idx in ((0, 1, 2, 3), (4, 5, 6, 7))  # a quad, not a cross-socket set
        assert ring_bottleneck(DGX1, idx) == 25.0


def test_gang_restart_keeps_allocated_members_and_plans_the_rest() -> None:
    claims = {f"default/g{i}": _claim(f"g{i}", 4) for i in range(3)}
    pods = [_pod(f"m{i}", f"g{i}", gang="train", size=3) for i in range(3)]
    cache0, _, _ = _setup({}, [])
    inv = cache0.dra_inventory()
    quad = [d for d in inv.by_node["gpu-node-1"] if d.name in ("gpu-0", "gpu-1", "gpu-2", "gpu-3")]
    claims["default/g0"] = dra.allocated_claim(
        claims["default/g0"], "gpu-node-1", dra.claim_spec(claims["default/g0"]), quad
    )
    cache, api, alloc = _setup(claims, pods)
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    assert _devices(api, "default/g0") == ("gpu-node-1", ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    assert ("claim", "default/g0") not in api.writes  # untouched
    flat = [(n, d) for n, devs in (_devices(api, k) for k in claims) for d in devs]
    assert len(flat) == len(set(flat)) == 12
    assert sorted(api.ungated) == [f"default/m{i}" for i in range(3)]


def test_one_pass_writes_every_pick_and_checks_them_on_the_watch_without_a_list() -> None:
    claims = {f"default/c{i}": _claim(f"c{i}", 2) for i in range(4)}
    pods = [_pod(f"p{i}", f"c{i}") for i in range(4)]
    cache, api, alloc = _setup(claims, pods)
    outs = alloc.step()
    assert [o.state for o in outs] == [al.RELEASED] * 4
    assert api.lists == 0  # the watch showed each write: the cache is the consistent read
    flat = [(n, d) for n, devs in (_devices(api, k) for k in claims) for d in devs]
    assert len(flat) == len(set(flat)) == 8
    # Every pair is a doubled NVLink pair of the DGX-1 (50 GB/s); the fuller node (7
    # healthy GPUs: gpu-5 is tainted) is packed first, its tainted GPU never used.
    nodes = []
    for k in claims:
        node, devs = _devices(api, k)
        nodes.append(node)
        assert ring_bottleneck(DGX1, tuple(int(d[4:]) for d in devs)) == 50.0
    assert nodes.count("gpu-node-1") == 3
    assert ("gpu-node-1", "gpu-5") not in flat
