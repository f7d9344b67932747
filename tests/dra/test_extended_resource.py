"""``nvidia.com/gpu`` backed by DRA (DRAExtendedResource, on by default in 1.36): the special
claim kube-scheduler makes, read from objects recorded on a real v1.36.2 plane
(tests/fixtures/kube/dra-1.36: pod ``er-three`` on ``er-node-0``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from scheduler.core import dra
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import gpus_by_dra
from scheduler.kube import allocator as al
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from tests.dra import recorded
from tests.dra.test_allocator import MockClaimApi

PARAMS = SchedParams()
SPECIAL = "default/er-three-extended-resources-pwvwt"
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
NOW = 1_796_601_600.0  # 2026-12-07T00:00:00Z


def _pod() -> dict[str, Any]:
    return recorded.load_136("pod.extended-resources.json")


def _pending(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as it was before kube-scheduler placed it (no node, no status)."""
    p = copy.deepcopy(pod)
    p["spec"].pop("nodeName", None)
    p["status"] = {}
    return p


def _class(name: str, created: str, resource: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"extendedResourceName": resource},
    }


def test_classes_map_resources_as_kube_scheduler_resolves_them() -> None:
    classes = recorded.extra_136()[dra.CLASSES_KEY]
    assert dra.extended_resource_classes(classes) == {
        IMPLICIT: "gpu.nvidia.com",
        "nvidia.com/gpu": "gpu.nvidia.com",
    }
    clash = {
        "old": _class("old", "2026-01-01T00:00:00Z", "nvidia.com/gpu"),
        "new": _class("new", "2026-06-01T00:00:00Z", "nvidia.com/gpu"),
        "b-same": _class("b-same", "2026-07-01T00:00:00Z", "example.com/x"),
        "a-same": _class("a-same", "2026-07-01T00:00:00Z", "example.com/x"),
    }
    got = dra.extended_resource_classes(clash)
    assert got["nvidia.com/gpu"] == "new"  # the newest class wins
    assert got["example.com/x"] == "a-same"  # equal age: the lower name


def test_the_special_claim_spec_equals_the_one_kube_scheduler_created() -> None:
    pod = _pod()
    mapped = dra.extended_resource_classes(recorded.extra_136()[dra.CLASSES_KEY])
    assert dra.pod_extended_resources(pod, mapped) == {"nvidia.com/gpu": 3}
    spec = dra.extended_claim_spec(pod, {"nvidia.com/gpu": "gpu.nvidia.com"})
    assert spec is not None
    made = recorded.load_136("claim.extended-resources.json")
    want = [
        (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"])
        for r in made["spec"]["devices"]["requests"]
    ]
    # the init container's GPU reuses container a's request: no request of its own
    assert [(r.name, r.device_class, r.count) for r in spec.requests] == want
    assert want == [("container-1-request-1", "gpu.nvidia.com", 1),
                    ("container-2-request-0", "gpu.nvidia.com", 2)]  # fmt: skip


@pytest.mark.parametrize(
    ("init", "sidecar", "want"),
    [
        # an init container needing more than the later containers request gets the rest
        (
            4,
            False,
            [
                ("container-0-request-0", 1),
                ("container-1-request-1", 1),
                ("container-2-request-0", 2),
            ],
        ),  # fmt: skip
        # a sidecar (restartPolicy Always) is long-lived: a request of its own
        (
            1,
            True,
            [
                ("container-0-request-0", 1),
                ("container-1-request-1", 1),
                ("container-2-request-0", 2),
            ],
        ),  # fmt: skip
    ],
)
def test_init_containers_as_kube_scheduler_counts_them(
    init: int, sidecar: bool, want: list[tuple[str, int]]
) -> None:
    pod = _pod()
    c = pod["spec"]["initContainers"][0]
    c["resources"] = {"limits": {"nvidia.com/gpu": str(init)}}
    if sidecar:
        c["restartPolicy"] = "Always"
    spec = dra.extended_claim_spec(pod, {"nvidia.com/gpu": "gpu.nvidia.com"})
    assert spec is not None
    assert [(r.name, r.count) for r in spec.requests] == want


def test_the_special_claim_is_found_by_status_and_by_owner() -> None:
    claims = recorded.extra_136()[dra.CLAIMS_KEY]
    pod = _pod()
    assert dra.object_key(dra.extended_claim_of(pod, claims) or {}) == SPECIAL
    pod["status"] = {}  # PreBind created the claim, the pod status patch not seen yet
    assert dra.object_key(dra.extended_claim_of(pod, claims) or {}) == SPECIAL
    pod["metadata"]["uid"] = "another-pod-of-that-name"
    assert dra.extended_claim_of(pod, claims) is None


def test_first_fit_of_the_special_claim_is_what_kube_scheduler_allocated() -> None:
    extra = recorded.extra_136()
    made = extra[dra.CLAIMS_KEY].pop(SPECIAL)
    inv = dra.inventory(extra[dra.SLICES_KEY])
    spec = dra.extended_claim_spec(_pod(), {"nvidia.com/gpu": "gpu.nvidia.com"})
    assert spec is not None
    got = dra.first_fit(
        inv, "er-node-0", [spec], extra[dra.CLASSES_KEY],
        dra.held_device_ids(extra[dra.CLAIMS_KEY].values()),
    )  # fmt: skip
    assert got.known and got.feasible
    results = made["status"]["allocation"]["devices"]["results"]
    assert [d.name for c in got.devices for d in c] == [r["device"] for r in results]
    assert got.gpus == (0, 1, 2)


def _router(without_special: bool) -> tuple[ClusterCache, DraRouter]:
    extra = recorded.extra_136()
    if without_special:
        extra[dra.CLAIMS_KEY].pop(SPECIAL)
    nodes = recorded.items_136("nodes.json", "Node")
    cache = ClusterCache.from_objects(nodes, [], PARAMS, extra=extra)
    return cache, DraRouter(cache)


def test_router_predicts_kube_schedulers_devices_for_the_pending_pod() -> None:
    cache, router = _router(without_special=True)
    pod = _pending(_pod())
    ext = router.extended_resources(pod)
    assert ext == {"nvidia.com/gpu": "gpu.nvidia.com"}
    assert router.split_by_dra(["er-node-0", "gpu-node-0"]) == (["er-node-0", "gpu-node-0"], [])
    req = request_from_pod(pod, PARAMS.fabric)
    assert req.gpus == 3
    out = router.filter_extended(pod, req, ["er-node-0", "gpu-node-0", "gpu-node-1"], ext, PARAMS)
    assert out.feasible == ("er-node-0",)  # the other two are full
    (plan,) = router.plans(pod, ["er-node-0"], extended=ext)
    assert plan.gpus == (0, 1, 2)
    picks = router.likely_kube_picks()
    assert sorted(d for _, _, d in picks) == ["gpu-0", "gpu-1", "gpu-2"]


def test_bound_pod_holds_its_special_claims_gpus_once() -> None:
    cache, router = _router(without_special=False)
    pod = _pod()
    node = cache.snapshot().node("er-node-0")
    assert node is not None and gpus_by_dra(node)
    assert router.extended_gpus(pod, "er-node-0") == (0, 1, 2)
    assert router.extended_gpus(pod, "gpu-node-0") is None
    cache.upsert_pod({**pod, "kind": "Pod"})  # the watch shows it bound
    snap = cache.snapshot()
    assert snap.pods["default/er-three"].gpus == ()  # its claim holds them
    assert snap.pods["resourceclaim:" + SPECIAL].gpus == (0, 1, 2)
    assert snap.node("er-node-0").used_mask == 0b111  # type: ignore[union-attr]


# ---- the gate: topoplace chooses, kube-scheduler's claim gets topoplace's devices at bind ----


class PodClaimApi(MockClaimApi):
    """The mock claim API with pods (``get_pod``)."""

    def __init__(self, cache: ClusterCache, claims: dict, pods: dict) -> None:
        super().__init__(cache, claims)
        self.pods = pods

    def get_pod(self, ns: str, name: str) -> dict:
        return copy.deepcopy(self.pods[f"{ns}/{name}"])


def _gated_er(gpus: int) -> dict[str, Any]:
    pod = _pending(_pod())
    pod["metadata"]["name"] = "er-gated"
    pod["metadata"]["uid"] = "uid-er-gated"
    pod["spec"]["initContainers"] = []
    pod["spec"]["containers"] = [
        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    ]
    pod["spec"]["schedulingGates"] = [{"name": dra.ALLOCATE_GATE}]
    return pod


def _gated_setup(pod: dict) -> tuple[ClusterCache, PodClaimApi, DraRouter, al.GateAllocator]:
    extra = recorded.extra_136()
    extra[dra.CLAIMS_KEY].pop(SPECIAL)
    nodes = recorded.items_136("nodes.json", "Node")
    for n in nodes:
        n["metadata"].setdefault("annotations", {})["topoplace.io/gpu-topology"] = "dgx1-v100"
    cache = ClusterCache.from_objects(nodes, [], PARAMS, extra=extra)
    api = PodClaimApi(cache, extra[dra.CLAIMS_KEY], {})
    router = DraRouter(cache)
    alloc = al.GateAllocator(
        cache, api, lambda: [pod], settle_s=0.0, clock=lambda: NOW, router=router
    )
    return cache, api, router, alloc


def _prebind(api: PodClaimApi, pod: dict, node: str, devices: list[str]) -> str:
    """What kube-scheduler's PreBind leaves: the special claim (first fit), reserved for the
    pod, and the pod's status naming it (the recorded claim's shape)."""
    made = copy.deepcopy(recorded.load_136("claim.extended-resources.json"))
    made["kind"] = "ResourceClaim"
    made["metadata"]["name"] = "er-gated-extended-resources-abcde"
    made["metadata"]["ownerReferences"][0].update(name="er-gated", uid="uid-er-gated")
    made["spec"]["devices"]["requests"] = [
        {
            "name": "container-0-request-0",
            "exactly": {
                "allocationMode": "ExactCount",
                "count": len(devices),
                "deviceClassName": "gpu.nvidia.com",
            },
        }
    ]
    results = [
        {"request": "container-0-request-0", "driver": "gpu.nvidia.com", "pool": node, "device": d}
        for d in devices
    ]
    made["status"]["allocation"]["devices"]["results"] = results
    made["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"
    ] = [node]
    made["status"]["reservedFor"] = [
        {"resource": "pods", "name": "er-gated", "uid": "uid-er-gated"}
    ]
    key = dra.object_key(made)
    api.claims[key] = made
    api.cache.apply_claim(key, copy.deepcopy(made))
    bound = copy.deepcopy(pod)
    bound["spec"].pop("schedulingGates", None)
    bound["status"] = {
        "extendedResourceClaimStatus": {
            "resourceClaimName": made["metadata"]["name"],
            "requestMappings": [
                {
                    "containerName": "main",
                    "requestName": "container-0-request-0",
                    "resourceName": "nvidia.com/gpu",
                }
            ],
        }
    }
    api.pods["default/er-gated"] = bound
    return key


def test_gated_gpu_pod_gets_the_nvlink_pair_in_the_claim_kube_scheduler_made() -> None:
    pod = _gated_er(2)
    cache, api, router, alloc = _gated_setup(pod)
    (out,) = alloc.step()
    assert out.state == al.RELEASED, out
    assert api.ungated == ["default/er-gated"]
    pick = router.extended_pick("default/er-gated")
    assert pick is not None and pick.node == "er-node-0"
    # a DGX-1 pair joined by two NVLinks (50 GB/s), where first fit gives gpu-0, gpu-1 (25)
    assert pick.gpus == (0, 3)
    assert cache.snapshot().node("er-node-0").used_mask == 0b1001  # type: ignore[union-attr]
    req = request_from_pod(pod, PARAMS.fabric)
    names = ["er-node-0", "gpu-node-0", "gpu-node-1"]
    ext = router.extended_resources(pod)
    assert router.filter_extended(pod, req, names, ext, PARAMS).feasible == ("er-node-0",)
    key = _prebind(api, pod, "er-node-0", ["gpu-0", "gpu-1"])
    before = len(api.writes)
    assert alloc.reallocate("default/er-gated", "er-node-0") == ""
    assert api.writes[before:] == [("status", key), ("status", key)]
    c = api.claims[key]
    assert [d for _, _, d in dra.allocated_ids(c)] == ["gpu-0", "gpu-3"]
    assert c["status"]["reservedFor"] == [
        {"resource": "pods", "name": "er-gated", "uid": "uid-er-gated"}
    ]
    assert c["status"]["allocation"]["allocationTimestamp"] == "2026-12-07T00:00:00Z"
    assert router.extended_pick("default/er-gated") is None
    snap = cache.snapshot()
    assert snap.pods[dra.holder_key(key)].gpus == (0, 3)
    assert snap.node("er-node-0").used_mask == 0b1001  # type: ignore[union-attr]


def test_reallocate_writes_nothing_when_first_fit_is_the_choice_or_the_node_differs() -> None:
    pod = _gated_er(1)
    cache, api, router, alloc = _gated_setup(pod)
    (out,) = alloc.step()
    assert out.state == al.RELEASED
    pick = router.extended_pick("default/er-gated")
    assert pick is not None and pick.gpus == (0,)
    _prebind(api, pod, "er-node-0", ["gpu-0"])
    before = len(api.writes)
    assert alloc.reallocate("default/er-gated", "er-node-0") == ""
    assert api.writes[before:] == []
    # another pod, bound elsewhere than chosen: its claim is left as kube-scheduler made it
    cache2, api2, router2, alloc2 = _gated_setup(pod)
    alloc2.step()
    _prebind(api2, pod, "er-node-0", ["gpu-0"])
    n = len(api2.writes)
    assert alloc2.reallocate("default/er-gated", "gpu-node-0") == ""
    assert api2.writes[n:] == [] and router2.extended_pick("default/er-gated") is None


def test_the_choice_is_written_with_the_gate_and_taken_back_after_a_restart() -> None:
    pod = _gated_er(2)
    _, api, router, alloc = _gated_setup(pod)
    alloc.step()
    note = api.notes["default/er-gated"][al.EXTENDED_PICK]
    assert json.loads(note) == {
        "node": "er-node-0",
        "devices": [["gpu.nvidia.com", "er-node-0", "gpu-0"], ["gpu.nvidia.com", "er-node-0", "gpu-3"]],
    }  # fmt: skip
    # topoplace restarts: the released pod (no gate, the annotation) is pending still
    released = copy.deepcopy(pod)
    released["spec"].pop("schedulingGates")
    released["metadata"]["annotations"] = {al.EXTENDED_PICK: note}
    cache2, api2, router2, alloc2 = _gated_setup(released)
    assert router2.extended_pick("default/er-gated") is None
    assert alloc2.step() == []  # nothing gated
    pick = router2.extended_pick("default/er-gated")
    assert pick is not None and (pick.node, pick.gpus) == ("er-node-0", (0, 3))
    assert cache2.snapshot().node("er-node-0").used_mask == 0b1001  # type: ignore[union-attr]
    key = _prebind(api2, released, "er-node-0", ["gpu-0", "gpu-1"])
    assert alloc2.reallocate("default/er-gated", "er-node-0") == ""
    assert [d for _, _, d in dra.allocated_ids(api2.claims[key])] == ["gpu-0", "gpu-3"]
    alloc2.step()  # still pending until the watch shows it bound: not taken back again
    assert router2.extended_pick("default/er-gated") is None


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def request_json(self, *args: Any) -> dict:
        self.calls.append(args)
        return {}


def test_the_gate_and_the_annotation_go_in_one_guarded_patch() -> None:
    from scheduler.kube.dra import ClaimWriter

    rec = _Recorder()
    w = ClaimWriter(rec, "v1")  # type: ignore[arg-type]
    gated = {"metadata": {"name": "p", "namespace": "ns", "annotations": {"a": "b"}},
             "spec": {"schedulingGates": [{"name": dra.ALLOCATE_GATE}, {"name": "other"}]}}  # fmt: skip
    w.remove_gate(gated, dra.ALLOCATE_GATE, {"topoplace.io/dra-devices": "{}"})
    method, path, ops, ctype = rec.calls[0]
    assert (method, path, ctype) == (
        "PATCH",
        "/api/v1/namespaces/ns/pods/p",
        "application/json-patch+json",
    )
    assert ops == [
        {"op": "test", "path": "/spec/schedulingGates",
         "value": [{"name": dra.ALLOCATE_GATE}, {"name": "other"}]},
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "other"}]},
        {"op": "add", "path": "/metadata/annotations/topoplace.io~1dra-devices", "value": "{}"},
    ]  # fmt: skip
    bare = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"schedulingGates": []}}
    w.remove_gate(bare, dra.ALLOCATE_GATE, {"k": "v"})
    assert rec.calls[1][2][-1] == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {"k": "v"},
    }


def test_a_chosen_pod_not_offered_its_node_goes_where_it_fits() -> None:
    pod = _gated_er(2)
    _, _, router, alloc = _gated_setup(pod)
    alloc.step()
    req = request_from_pod(pod, PARAMS.fabric)
    ext = router.extended_resources(pod)
    out = router.filter_extended(pod, req, ["gpu-node-1"], ext, PARAMS)
    assert out.feasible == () and "er-node-0" not in out.failed  # no verdict from the pick
    kept = router.filter_extended(pod, req, ["er-node-0", "gpu-node-1"], ext, PARAMS)
    assert kept.feasible == ("er-node-0",)
    assert kept.failed["gpu-node-1"] == "topoplace allocated this pod's GPUs on another node"


def test_a_device_kube_scheduler_gave_another_claim_meanwhile_fails_the_bind() -> None:
    pod = _gated_er(2)
    _, api, router, alloc = _gated_setup(pod)
    alloc.step()
    _prebind(api, pod, "er-node-0", ["gpu-0", "gpu-1"])
    other = copy.deepcopy(recorded.load_136("claim.extended-resources.json"))
    other["metadata"].update(name="raced", ownerReferences=[])
    other["status"]["allocation"]["devices"]["results"] = [
        {"request": "container-1-request-1", "driver": "gpu.nvidia.com",
         "pool": "er-node-0", "device": "gpu-3"}
    ]  # fmt: skip
    api.sneak.append(other)  # in the API, not yet in topoplace's view
    err = alloc.reallocate("default/er-gated", "er-node-0")
    assert err.startswith("the pod's DRA devices are also held by"), err
    assert "default/raced" in err
    assert router.extended_pick("default/er-gated") is None
