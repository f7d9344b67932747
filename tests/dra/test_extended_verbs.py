"""The extender's verbs for ``nvidia.com/gpu`` pods that DRA backs (``verbs/extended.py``),
on objects recorded from a real v1.36.2 plane (tests/fixtures/kube/dra-1.36)."""

from __future__ import annotations

import copy
from typing import Any

from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.server.extender import Extender
from tests.dra import recorded
from tests.helpers import with_reasons

PARAMS = SchedParams()
SPECIAL = "default/er-three-extended-resources-pwvwt"
NAMES = ["er-node-0", "gpu-node-0", "gpu-node-1"]


def _ext() -> Extender:
    extra = recorded.extra_136()
    extra[dra.CLAIMS_KEY].pop(SPECIAL)  # as before kube-scheduler's PreBind
    nodes = recorded.items_136("nodes.json", "Node")
    return Extender(ClusterCache.from_objects(nodes, [], with_reasons(PARAMS), extra=extra))


def _pod(gpus: int) -> dict[str, Any]:
    pod = recorded.load_136("pod.extended-resources.json")
    pod["spec"].pop("nodeName", None)
    pod["status"] = {}
    pod["spec"]["initContainers"] = []
    pod["spec"]["containers"] = [
        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    ]
    return pod


def _prebind(ext: Extender, gpus: int) -> None:
    """The special claim kube-scheduler's PreBind writes: ``gpus`` devices of er-node-0."""
    made = copy.deepcopy(recorded.load_136("claim.extended-resources.json"))
    made["kind"] = "ResourceClaim"
    made["spec"]["devices"]["requests"] = [
        {
            "name": "container-0-request-0",
            "exactly": {"allocationMode": "ExactCount", "count": gpus,
                        "deviceClassName": "gpu.nvidia.com"},
        }
    ]  # fmt: skip
    made["status"]["allocation"]["devices"]["results"] = [
        {"request": "container-0-request-0", "driver": "gpu.nvidia.com",
         "pool": "er-node-0", "device": f"gpu-{i}"}
        for i in range(gpus)
    ]  # fmt: skip
    ext.cache.apply_claim(SPECIAL, made)


def _bind(ext: Extender, pod: dict[str, Any], node: str) -> dict[str, str]:
    m = pod["metadata"]
    return ext.bind(
        {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    )


def test_the_pod_is_a_dra_backed_gpu_pod_and_goes_where_its_claim_fits() -> None:
    ext = _ext()
    pod = _pod(3)
    out = ext.filter({"Pod": pod, "NodeNames": NAMES})
    assert out["NodeNames"] == ["er-node-0"]  # gpu-node-0 and -1 are full
    scores = {h["Host"]: h["Score"] for h in ext.prioritize({"Pod": pod, "NodeNames": NAMES})}
    assert scores["er-node-0"] == 10 and scores["gpu-node-0"] == 0


def test_bind_holds_the_special_claims_gpus_once() -> None:
    ext = _ext()
    pod = _pod(3)
    ext.filter({"Pod": pod, "NodeNames": NAMES})
    _prebind(ext, 3)
    assert _bind(ext, pod, "er-node-0") == {"Error": ""}
    snap = ext.cache.snapshot()
    assert snap.pods["default/er-three"].gpus == ()
    assert snap.node("er-node-0").used_mask == 0b111  # type: ignore[union-attr]


def test_a_pod_taking_the_whole_node_binds() -> None:
    """Its claim holds all eight GPUs by the time kube-scheduler calls bind: counting the
    pod's request again answered "not enough free healthy GPUs" on every retry."""
    ext = _ext()
    pod = _pod(8)
    assert ext.filter({"Pod": pod, "NodeNames": NAMES})["NodeNames"] == ["er-node-0"]
    _prebind(ext, 8)
    assert _bind(ext, pod, "er-node-0") == {"Error": ""}
    assert ext.cache.snapshot().node("er-node-0").used_mask == 0xFF  # type: ignore[union-attr]


def test_which_kind_a_gpu_pod_is() -> None:
    from scheduler.core.objects import request_from_pod
    from scheduler.server.verbs.extended import EXTENDED
    from scheduler.server.verbs.kinds import kind_of
    from scheduler.server.verbs.whole import WHOLE

    ext = _ext()
    pod = _pod(2)
    assert kind_of(ext, pod, request_from_pod(pod, PARAMS.fabric)) is EXTENDED
    cpu_only = copy.deepcopy(pod)
    cpu_only["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert kind_of(ext, cpu_only, request_from_pod(cpu_only, PARAMS.fabric)) is WHOLE
    # no DeviceClass names nvidia.com/gpu: a whole-GPU pod as ever
    extra = recorded.extra_136()
    for c in extra[dra.CLASSES_KEY].values():
        c["spec"].pop("extendedResourceName")
    nodes = recorded.items_136("nodes.json", "Node")
    plain = Extender(ClusterCache.from_objects(nodes, [], PARAMS, extra=extra))
    assert kind_of(plain, pod, request_from_pod(pod, PARAMS.fabric)) is WHOLE
