"""``nvidia.com/gpu`` backed by DRA (DRAExtendedResource, on by default in 1.36): the special
claim kube-scheduler makes, read from objects recorded on a real v1.36.2 plane
(tests/fixtures/kube/dra-1.36: pod ``er-three`` on ``er-node-0``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scheduler.core import dra
from scheduler.core.objects import request_from_pod
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import gpus_by_dra
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from tests.dra import recorded

PARAMS = SchedParams()
SPECIAL = "default/er-three-extended-resources-pwvwt"
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


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
