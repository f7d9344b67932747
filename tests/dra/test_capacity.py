"""Consumable capacity (shared GPUs) and MIG partitions on the v1 shape, against objects a
real Kubernetes v1.36.2 control plane wrote (tests/fixtures/kube/dra-1.36/capacity)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from scheduler.core import dra
from scheduler.core.model import GpuShare
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot, with_pod
from scheduler.kube import allocator as al
from scheduler.runtime.cache import ClusterCache
from tests.dra.test_allocator import MockClaimApi

DIR = Path(__file__).resolve().parents[1] / "fixtures" / "kube" / "dra-1.36" / "capacity"
GI = 1 << 30
NODE = "gpu-node-0"


def _items(name: str, kind: str) -> list[dict[str, Any]]:
    out = json.loads((DIR / name).read_text())["items"]
    for it in out:
        it.setdefault("kind", kind)
    return out


def _slices() -> list[dict[str, Any]]:
    return _items("resourceslices.v1.json", "ResourceSlice")


def _claims() -> dict[str, dict[str, Any]]:
    return {dra.object_key(c): c for c in _items("resourceclaims.v1.json", "ResourceClaim")}


def _classes() -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in _items("deviceclasses.v1.json", "DeviceClass")}


def _extra(claims: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        dra.SLICES_KEY: _slices(),
        dra.CLAIMS_KEY: _claims() if claims is None else claims,
        dra.CLASSES_KEY: _classes(),
    }


def _by_creation(claims: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        claims.values(),
        key=lambda c: (c["metadata"]["creationTimestamp"], c["metadata"]["name"]),
    )


# ---- the request policy, as the allocator rounds ------------------------------------------


@pytest.mark.parametrize(
    ("desc", "cap", "requested", "consumed", "violated"),
    [
        ("no policy: the request as is", dra.Capacity(100), 30, 30, False),
        ("no policy, not requested: the whole value", dra.Capacity(100), None, 100, False),
        ("default when not requested", dra.Capacity(100, default=10), None, 10, False),
        ("range: below min goes up to min", dra.Capacity(80, min=1, step=1), 0, 1, False),
        ("range: up to the next step from min", dra.Capacity(80, min=2, step=4), 7, 10, False),
        ("range: on the grid stays", dra.Capacity(80, min=2, step=4), 6, 6, False),
        ("range without step: as is", dra.Capacity(80, min=2), 7, 7, False),
        ("range: over max breaks the policy", dra.Capacity(80, min=1, max=8), 9, 9, True),
        (
            "values: the first not below",
            dra.Capacity(100, valid_values=(10, 25, 50)),
            20,
            25,
            False,
        ),
        (
            "values: none above: as is, broken",
            dra.Capacity(100, valid_values=(10, 25)),
            60,
            60,
            True,
        ),
        ("values: the default never breaks", dra.Capacity(100, 7, (10, 25)), None, 7, False),
    ],
)
def test_request_policy_rounds_as_the_allocator(
    desc: str, cap: dra.Capacity, requested: int | None, consumed: int, violated: bool
) -> None:
    got = cap.consumed(requested)
    assert got == consumed, desc
    assert cap.violated(got) is violated, desc


def test_recorded_shared_devices_read_with_their_policies() -> None:
    inv = dra.inventory(_slices())
    gpu1 = inv.by_id[("gpu.nvidia.com", NODE, "gpu-1")]
    assert gpu1.shared and not gpu1.plain and gpu1.gpu == 1
    assert gpu1.capacities["memory"] == dra.Capacity(80 * GI, 80 * GI, None, GI, None, GI)
    assert gpu1.capacities["compute"] == dra.Capacity(100, 10, (10, 25, 50, 100))
    plain = inv.by_id[("gpu.nvidia.com", NODE, "gpu-5")]
    assert not plain.shared and plain.plain
    mig = inv.by_id[("gpu.nvidia.com", NODE, "gpu-0-mig-1g10gb-19-0")]
    assert mig.partition and mig.gpu == 0 and mig.consumes
    # a request naming a capacity the device lacks does not match it
    assert dra.consumption(gpu1, [("bandwidth", 1)]) is None
    # the driver's own domain names the same capacity
    assert dra.consumption(gpu1, [("gpu.nvidia.com/memory", 3 * GI)]) == {
        "memory": 3 * GI,
        "compute": 10,
    }


def test_recorded_results_read_as_shares_and_never_as_held_devices() -> None:
    claims = _claims()
    a = claims["default/share-a"]
    ((did, share, amounts),) = dra.shared_results(a)
    assert did == ("gpu.nvidia.com", NODE, "gpu-1")
    assert share == a["status"]["allocation"]["devices"]["results"][0]["shareID"]
    assert amounts == {"memory": 10 * GI, "compute": 25}
    assert dra.exclusive_ids(a) == ()
    held = dra.held_device_ids(claims.values())
    assert held == {("gpu.nvidia.com", NODE, "gpu-0-mig-1g10gb-19-0")}
    used = dra.consumed_by_device(claims.values())
    assert used[("gpu.nvidia.com", NODE, "gpu-1")] == {"memory": 17 * GI, "compute": 45}
    assert used[("gpu.nvidia.com", NODE, "gpu-2")] == {"memory": 80 * GI, "compute": 10}
    assert used[("gpu.nvidia.com", NODE, "gpu-3")] == {"memory": 70 * GI, "compute": 100}
    assert dra.overcommits(claims.values(), dra.inventory(_slices())) == []


def test_first_fit_predicts_every_recorded_allocation_in_creation_order() -> None:
    """Replay: each claim, with the ones kube-scheduler allocated before it, gets from the
    prediction the device and the consumed capacity kube-scheduler wrote."""
    inv = dra.inventory(_slices())
    classes = _classes()
    before: list[dict[str, Any]] = []
    checked = 0
    for c in _by_creation(_claims()):
        if (dra.allocation_node(c) or NODE) != NODE:
            continue
        spec = dra.claim_spec(c)
        held = dra.held_device_ids(before)
        used = dra.consumed_by_device(before)
        p = dra.first_fit(inv, NODE, [spec], classes, held, consumed=used)
        assert p.known, c["metadata"]["name"]
        alloc = (c.get("status") or {}).get("allocation")
        if alloc is None:  # share-huge: 81Gi fits no shared GPU
            assert not p.feasible
            continue
        (result,) = alloc["devices"]["results"]
        ((d,),) = p.devices
        assert d.name == result["device"], c["metadata"]["name"]
        if "consumedCapacity" in result:
            want = {k: dra.quantity_int(v) for k, v in result["consumedCapacity"].items()}
            assert dra.consumption(d, spec.requests[0].capacity) == want
        before.append(c)
        checked += 1
    assert checked == 6


def test_a_claim_takes_a_shared_device_once_and_others_take_what_is_left() -> None:
    """kube-scheduler 1.36 gave ``share-two`` (count 2, 35Gi each, gpu-node-1) gpu-1 and
    gpu-2, not gpu-1 twice; on gpu-node-0 (gpu-1 has 17Gi, 2 and 3 are full) the second
    35Gi goes past the full ones."""
    inv = dra.inventory(_slices())
    claims = _claims()
    two = claims.pop("default/share-two")
    spec = dra.claim_spec(two)
    got = [r["device"] for r in two["status"]["allocation"]["devices"]["results"]]
    p = dra.first_fit(inv, "gpu-node-1", [spec], _classes(), ())
    assert [d.name for d in p.devices[0]] == got == ["gpu-1", "gpu-2"]
    used = dra.consumed_by_device(claims.values())
    p = dra.first_fit(inv, NODE, [spec], _classes(), (), consumed=used)
    assert [d.name for d in p.devices[0]] == ["gpu-1", "gpu-4"]


# ---- the one ledger ------------------------------------------------------------------------


def test_shares_and_partitions_enter_the_per_gpu_ledger() -> None:
    nodes = _items("nodes.json", "Node")
    snap = build_snapshot(nodes, [], SchedParams(), _extra())
    n = snap.node(NODE)
    assert n is not None
    # GPU 0 has a MIG partition, GPUs 1-3 shares: none is free for a whole-GPU pod
    assert n.used_mask == 0b1111
    assert n.free_mask & 0b1111 == 0
    mem = [n.share_used[g][0] for g in range(4)]
    tasks = [n.share_used[g][2] for g in range(4)]
    assert tasks == [1, 3, 1, 1]
    # shares count as the same fraction of the GPU memory the node's label publishes
    label = int(nodes[0]["metadata"]["labels"]["nvidia.com/gpu.memory"])
    assert label == 81559
    assert mem == [-(-m * label // (80 * 1024)) for m in (9856, 17 * 1024, 80 * 1024, 70 * 1024)]
    assert mem[2] == label  # a share of the whole memory is the whole GPU
    assert [n.share_used[g][1] for g in range(1, 4)] == [450, 100, 1000]
    holding = snap.pods["resourceclaim:default/share-a"]
    assert holding.gpus == ()
    assert holding.shares == (GpuShare(1, -(-10 * 1024 * label // (80 * 1024)), 250),)


def test_a_second_partition_of_one_gpu_is_counted_beside_the_first() -> None:
    claims = _claims()
    other = copy.deepcopy(claims["default/mig-small"])
    other["metadata"]["name"] = "mig-other"
    other["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-0-mig-1g10gb-19-1"
    claims["default/mig-other"] = other
    snap = build_snapshot(_items("nodes.json", "Node"), [], SchedParams(), _extra(claims))
    assert "resourceclaim:default/mig-other" in snap.pods
    n = snap.node(NODE)
    assert n is not None and n.share_used[0][2] == 2


def test_a_claim_over_capacity_is_reported_and_not_counted_twice() -> None:
    claims = _claims()
    extra = copy.deepcopy(claims["default/share-c"])  # 70Gi on gpu-3, as if another allocator
    extra["metadata"]["name"] = "share-z"
    extra["metadata"]["uid"] = "0000"
    claims["default/share-z"] = extra
    over = dra.overcommits(claims.values(), dra.inventory(_slices()))
    assert [(o.device[2], o.capacity, o.consumed, o.value, o.claims) for o in over] == [
        ("gpu-3", "compute", 200, 100, ("default/share-c", "default/share-z")),
        ("gpu-3", "memory", 140 * GI, 80 * GI, ("default/share-c", "default/share-z")),
    ]
    snap = build_snapshot(_items("nodes.json", "Node"), [], SchedParams(), _extra(claims))
    assert "resourceclaim:default/share-z" not in snap.pods  # the later one is left out
    n = snap.node(NODE)
    assert n is not None and n.share_used[3] == (-(-70 * 81559 // 80), 1000, 1)


def test_a_whole_gpu_holding_is_refused_on_a_shared_gpu() -> None:
    snap = build_snapshot(_items("nodes.json", "Node"), [], SchedParams(), _extra())
    whole = snap.pods["resourceclaim:default/share-a"]
    from dataclasses import replace

    from scheduler.core.snapshot import DoubleBookingError

    with pytest.raises(DoubleBookingError):
        with_pod(snap, replace(whole, key="p/whole", gpus=(1,), shares=()))


# ---- topoplace's choice for gated pods ----------------------------------------------------

NOW = 1_796_601_600.0  # 2026-12-07T00:00:00Z
SHARED = "shared-gpu.nvidia.com"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _claim(
    name: str, cls: str, caps: dict[str, str] | None = None, profile: str = ""
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": 1}
    if caps:
        exactly["capacity"] = {"requests": caps}
    if profile:
        expr = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
        exactly["selectors"] = [{"cel": {"expression": expr}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {},
    }


def _gated_pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "schedulingGates": [{"name": dra.ALLOCATE_GATE}],
            "resourceClaims": [{"name": "g", "resourceClaimName": claim}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "g"}]}}],
        },
    }


def _allocator(
    new: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> tuple[MockClaimApi, al.GateAllocator, ClusterCache]:
    claims = _claims()
    for c in new:
        claims[dra.object_key(c)] = c
    cache = ClusterCache.from_objects(
        _items("nodes.json", "Node"), [], SchedParams(), extra=_extra(claims)
    )
    api = MockClaimApi(cache, claims)
    alloc = al.GateAllocator(cache, api, lambda: list(pods), settle_s=0.0, clock=lambda: NOW)
    return api, alloc, cache


def _results(api: MockClaimApi, key: str) -> list[dict[str, Any]]:
    return api.claims[key]["status"]["allocation"]["devices"]["results"]


def test_a_gated_share_goes_where_topoplace_share_packs_it_with_consumed_capacity() -> None:
    """20Gi: kube-scheduler's first fit would take gpu-node-0's gpu-1 (17Gi used: 43Gi left
    after); topoplace-share takes gpu-node-1's gpu-1 (35Gi used: 25Gi left, the tightest
    fit), written as the allocator writes a share."""
    pods = [_gated_pod("ps", "gs")]
    api, alloc, cache = _allocator([_claim("gs", SHARED, {"memory": "20Gi"})], pods)
    inv = dra.inventory(_slices())
    spec = dra.claim_spec(api.claims["default/gs"])
    kube = dra.first_fit(
        inv, NODE, [spec], _classes(), (), consumed=dra.consumed_by_device(_claims().values())
    )
    assert kube.devices[0][0].name == "gpu-1"
    (out,) = alloc.step()
    assert (out.state, out.node, out.devices) == (al.RELEASED, "gpu-node-1", ("gpu-1",))
    (res,) = _results(api, "default/gs")
    assert res["consumedCapacity"] == {"compute": "10", "memory": "20Gi"}
    assert UUID.match(res["shareID"])
    assert res["device"] == "gpu-1" and res["pool"] == "gpu-node-1"
    # the same result fields as kube-scheduler 1.36 wrote for its shares
    kube_res = _claims()["default/share-a"]["status"]["allocation"]["devices"]["results"][0]
    assert sorted(res) == sorted(kube_res)
    # the ledger holds a share of gpu-1, not the GPU: 35Gi + 20Gi of it
    n = cache.snapshot().node("gpu-node-1")
    assert n is not None
    each = [-(-g * 81559 // 80) for g in (35, 20)]  # each share rounded up on its own
    assert n.share_used[1][2] == 2 and n.share_used[1][0] == sum(each)
    assert dra.overcommits(api.claims.values(), inv) == []


def test_gated_shares_fill_gpus_without_overcommit_and_then_wait() -> None:
    """Ten 30Gi shares on what is left (node-0: 63Gi on gpu-1, 10Gi on gpu-3, 80Gi on
    gpu-4; node-1: 45Gi on gpu-1 and gpu-2, 80Gi on gpu-3 and gpu-4): 2 + 2 + 1 + 1 + 2
    + 2 = 10 fit, two per 80Gi GPU, one per GPU with 45Gi or 63Gi left; the eleventh
    waits."""
    new = [_claim(f"s{i}", SHARED, {"memory": "30Gi"}) for i in range(11)]
    pods = [_gated_pod(f"p{i:02d}", f"s{i}") for i in range(11)]
    api, alloc, cache = _allocator(new, pods)
    outs = []
    for _ in range(12):
        outs += alloc.step()
        pods[:] = [
            p
            for p in pods
            if p["metadata"]["name"] not in {o.pod[8:] for o in outs if o.state == al.RELEASED}
        ]
    released = [o for o in outs if o.state == al.RELEASED]
    assert len(released) == 10
    waiting = [o for o in outs if o.state == al.WAITING]
    assert waiting and waiting[-1].reason == dra.REASON_NO_SHARE_ROOM
    inv = dra.inventory(_slices())
    assert dra.overcommits(api.claims.values(), inv) == []
    used = dra.consumed_by_device(api.claims.values())
    for did, amounts in used.items():
        assert amounts["memory"] <= 80 * GI, did


def test_a_gated_mig_claim_takes_a_free_slice_of_the_gpu_already_cut() -> None:
    """2g.20gb: gpu-node-0's gpu-0 holds mig-small (1g at slice 0): the 2g partition goes
    at slices 2-3 of that GPU, gpu-node-1's gpu-0 stays whole; a second 2g goes at 4-5,
    never over a slice held."""
    pods = [_gated_pod("pm", "gm"), _gated_pod("pn", "gn")]
    api, alloc, cache = _allocator(
        [
            _claim("gm", dra_mig_class(), profile="2g.20gb"),
            _claim("gn", dra_mig_class(), profile="2g.20gb"),
        ],
        pods,
    )
    outs = alloc.step()
    got = sorted((o.pod, o.node, o.devices) for o in outs)
    assert got == [
        ("default/pm", NODE, ("gpu-0-mig-2g20gb-14-2",)),
        ("default/pn", NODE, ("gpu-0-mig-2g20gb-14-4",)),
    ]
    for k in ("default/gm", "default/gn"):
        (res,) = _results(api, k)
        assert "shareID" not in res and "consumedCapacity" not in res
    n = cache.snapshot().node(NODE)
    assert n is not None and n.share_used[0][2] == 3 and not (n.free_mask & 1)
    # the shared counters of gpu-0 hold every partition: the full GPU no longer fits there
    inv = dra.inventory(_slices())
    whole = dra.ClaimSpec("w", (dra.Request("gpu", "gpu.nvidia.com", 1),))
    held = dra.held_device_ids(api.claims.values())
    p = dra.first_fit(inv, NODE, [whole], _classes(), held)
    assert p.devices[0][0].name != "gpu-0"


def dra_mig_class() -> str:
    return "mig.nvidia.com"


def test_an_overcommitted_shared_device_is_counted_in_the_metric_at_filter() -> None:
    from prometheus_client import generate_latest

    from scheduler.runtime.dra import DraRouter
    from scheduler.server.metrics import Metrics
    from scheduler.server.verbs import claim as verb

    claims = _claims()
    twin = copy.deepcopy(claims["default/share-c"])  # gpu-3 again: 140Gi of 80Gi
    twin["metadata"]["name"] = "share-z"
    claims["default/share-z"] = twin
    cache = ClusterCache.from_objects(
        _items("nodes.json", "Node"), [], SchedParams(), extra=_extra(claims)
    )

    class Host:  # the two attributes the verb's helper reads
        metrics = Metrics()
        dra = DraRouter(cache)

    verb.note_overcommits(Host)  # type: ignore[arg-type]
    text = generate_latest(Host.metrics.registry).decode()
    assert "topoplace_dra_overcommitted_devices 1.0" in text  # gpu-3 (memory and compute)


def test_an_overcommit_is_logged_once_while_it_lasts_and_the_log_memory_stays_small(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each overcommit is logged once while it lasts; one that ends is forgotten (the set
    of those logged held every overcommit ever seen, a store that only grew), and logged
    again if it comes back."""
    from scheduler.runtime.dra import DraRouter

    claims = _claims()
    twin = copy.deepcopy(claims["default/share-c"])  # gpu-3 again: 140Gi of 80Gi
    twin["metadata"]["name"] = "share-z"
    cache = ClusterCache.from_objects(
        _items("nodes.json", "Node"), [], SchedParams(), extra=_extra(claims)
    )
    router = DraRouter(cache)

    def logged() -> int:
        return sum("is overcommitted" in r.getMessage() for r in caplog.records)

    with caplog.at_level("WARNING", logger="scheduler.runtime.dra"):
        assert router.overcommits() == ()
        cache.apply_claim("default/share-z", twin)
        assert len(router.overcommits()) == 2 and logged() == 2  # gpu-3: compute, memory
        cache.apply_claim("default/share-a", None)  # another claim changes: same overcommit
        assert len(router.overcommits()) == 2 and logged() == 2
        assert router.sizes()["overcommits_logged"] == (2, None)
        cache.apply_claim("default/share-z", None)  # it ends
        assert router.overcommits() == () and router.sizes()["overcommits_logged"][0] == 0
        cache.apply_claim("default/share-z", twin)  # and comes back: logged again
        assert len(router.overcommits()) == 2 and logged() == 4
