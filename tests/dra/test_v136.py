"""Kubernetes 1.36 (``resource.k8s.io/v1`` only): objects recorded from a real v1.36.2
control plane (tests/fixtures/kube/dra-1.36, see its README)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.kube import allocator as al
from scheduler.kube import dra as kdra
from scheduler.kube.client import NODES, PODS
from scheduler.kube.watcher import KubeWatcher, WatchOptions
from scheduler.runtime.cache import ClusterCache
from tests.dra import recorded
from tests.dra.test_allocator import MockClaimApi
from tests.kube.recorded import RecordedApiFake

PARAMS = SchedParams()
NOW = 1_796_601_600.0  # 2026-12-07T00:00:00Z


def _api() -> RecordedApiFake:
    """The 1.36 server: v1 discovery only (v1beta1 / v1beta2 are not served)."""
    api = RecordedApiFake()
    api.lists[NODES.name] = recorded.load_136("nodes.json")
    api.lists[PODS.name] = recorded.load_136("pods.json")
    api.resources[(dra.GROUP, "v1")] = recorded.load_136("apiresources.v1.json")
    slices, claims, classes = kdra.kinds_for("v1")
    api.lists[slices.name] = recorded.load_136("resourceslices.v1.json")
    api.lists[claims.name] = recorded.load_136("resourceclaims.v1.json")
    api.lists[classes.name] = recorded.load_136("deviceclasses.v1.json")
    return api


def test_the_recorded_server_serves_v1_only_and_topoplace_reads_v1() -> None:
    group = recorded.load_136("apigroup.json")
    assert [v["version"] for v in group["versions"]] == ["v1"]
    api = _api()
    assert kdra.served_version(api) == "v1"
    assert [k.version for k in kdra.discover(api)] == ["v1", "v1", "v1"]


def test_sync_reads_v1_objects_into_the_ledger() -> None:
    api = _api()
    opts = WatchOptions(podgroups=False, disruption_budgets=False)
    w = KubeWatcher(api, ClusterCache(build_snapshot([], [], PARAMS), PARAMS), opts)
    w.sync()
    assert api.calls["list:resourceslices.resource.k8s.io"] == 1
    snap = w.cache.snapshot()
    used = {n.name: n.used_mask for n in snap.nodes}
    # gpu-node-0: two-gpus 0,1 + same-root 2,3 (kube-scheduler), gated-four 4-7 (topoplace);
    # gpu-node-1: pinned-seven (gpu-5 tainted, skipped); er-node-0: er-three's special claim.
    assert used == {"er-node-0": 0b111, "gpu-node-0": 0xFF, "gpu-node-1": 0b11011111}
    assert snap.node("gpu-node-1").health.bad_mask == 1 << 5  # type: ignore[union-attr]


# ---- the gated allocation binds on 1.36 -----------------------------------------------------


def _prebind_reserve(claim: Mapping[str, Any], pod_uid: str, now: str) -> dict[str, Any]:
    """What kube-scheduler 1.36's PreBind writes to a pre-allocated claim (``bindClaim``
    with DRADeviceBindingConditions + DRAResourceClaimDeviceStatus, both on by default):
    the pod appended to ``reservedFor`` and, if the allocation has none, an
    ``allocationTimestamp``."""
    out = copy.deepcopy(dict(claim))
    st = out["status"]
    st.setdefault("reservedFor", []).append({"resource": "pods", "name": "p", "uid": pod_uid})
    st["allocation"].setdefault("allocationTimestamp", now)
    return out


def _server_accepts(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """The API server's rule for a status update of an allocated claim (validation.go
    ``validateResourceClaimStatusUpdate``): ``status.allocation`` is immutable once set."""
    return old["status"]["allocation"] == new["status"]["allocation"]


def test_the_recorded_rejection_is_the_allocation_changing_under_prebind() -> None:
    pre_fix = recorded.load_136("claim.pre-allocated-without-timestamp.json")
    rejected = recorded.load_136("status_put_422_allocation_immutable.json")
    assert rejected["response"]["status"] == 422
    cause = rejected["response"]["body"]["details"]["causes"][0]
    assert cause["field"] == "status.allocation"
    assert "field is immutable" in cause["message"]
    sent = rejected["request"]["body"]
    assert "allocationTimestamp" not in pre_fix["status"]["allocation"]
    assert sent["status"] == _prebind_reserve(
        pre_fix, sent["status"]["reservedFor"][0]["uid"], "2026-12-06T23:50:30Z"
    )["status"] | {"reservedFor": sent["status"]["reservedFor"]}
    assert not _server_accepts(pre_fix, sent)


def _gated_setup() -> tuple[MockClaimApi, al.GateAllocator]:
    extra = recorded.extra_136()
    claim = copy.deepcopy(recorded.load_136("claim.pre-allocated-without-timestamp.json"))
    claim["status"] = {}  # as created: not allocated yet
    claim["metadata"]["finalizers"] = []
    claim["metadata"]["annotations"] = {}
    claim.setdefault("kind", "ResourceClaim")
    key = dra.object_key(claim)
    extra[dra.CLAIMS_KEY] = {
        k: c
        for k, c in extra[dra.CLAIMS_KEY].items()
        if k != "default/gated-four"  # free gpu-node-0's GPUs 4-7 again
    }
    extra[dra.CLAIMS_KEY][key] = claim
    nodes = recorded.items_136("nodes.json", "Node")
    cache = ClusterCache.from_objects(nodes, [], PARAMS, extra=extra)
    api = MockClaimApi(cache, extra[dra.CLAIMS_KEY])
    pod = {
        "kind": "Pod",
        "metadata": {"name": "pending-four-pod", "namespace": "default", "uid": "uid-p4"},
        "spec": {
            "schedulingGates": [{"name": dra.ALLOCATE_GATE}],
            "nodeSelector": {"kubernetes.io/hostname": "gpu-node-0"},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "pending-four"}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    alloc = al.GateAllocator(cache, api, lambda: [pod], settle_s=0.0, clock=lambda: NOW)
    return api, alloc


def test_topoplace_writes_what_kube_scheduler_writes_so_prebind_changes_nothing() -> None:
    api, alloc = _gated_setup()
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    assert out.devices == ("gpu-4", "gpu-5", "gpu-6", "gpu-7")
    written = api.claims["default/pending-four"]
    mine = written["status"]["allocation"]
    assert mine["allocationTimestamp"] == "2026-12-07T00:00:00Z"
    # the same fields as the allocation the real kube-scheduler 1.36 wrote for two-gpus
    kube = recorded.extra_136()[dra.CLAIMS_KEY]["default/two-gpus"]["status"]["allocation"]
    assert sorted(mine) == sorted(kube) == ["allocationTimestamp", "devices", "nodeSelector"]
    assert sorted(mine["devices"]["results"][0]) == sorted(kube["devices"]["results"][0])
    reserved = _prebind_reserve(written, "uid-p4", "2026-12-07T00:00:09Z")
    assert _server_accepts(written, reserved)
    assert reserved["status"]["allocation"]["allocationTimestamp"] == "2026-12-07T00:00:00Z"


def test_rfc3339_is_the_api_time_format() -> None:
    assert al.rfc3339(NOW) == "2026-12-07T00:00:00Z"
    assert al.rfc3339(NOW + 59.9) == "2026-12-07T00:00:59Z"
