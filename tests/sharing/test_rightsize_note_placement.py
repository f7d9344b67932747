"""The right-sizer's note end to end, in process: the running right-sizer learns a workload
from Prometheus answers (``tests/rightsize``'s ``Prom``: HAMi pods at 25 % of the SMs), the
admission webhook patches each new pod of it over HTTP, the patched pods are bound as HAMi
binds them, and share placement (the extender's filter, per-node and vector paths) reads
their notes: a GPU holding the policy's ``max_tenants_per_gpu`` tenants is refused to the
next, and so is a GPU where the tenants' measured p95s would pass ``gpu_compute_limit``."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from typing import Any

import orjson
import pytest

from scheduler.cli.main import load_params
from scheduler.core.fractional import (
    REASON_COMPUTE_P95,
    REASON_TENANTS,
    RIGHTSIZE_ANNOTATION,
    TenantLimits,
    tenant_limits,
)
from scheduler.core.rightsize import MEMORY_SHARE, GiB
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender
from scheduler.server.webhook import ANNOTATION, PodSizing, WebhookApp
from tests.rightsize.test_rightsizer import NS, T0, Prom, sizer
from tests.rightsize.test_webhook import answer, apply_patch
from tests.sharing.builders import A100_MIB, hami_node, share_pod

NODE = "infer-a"
RS_NAME = "infer-7d9f8b6c5d"


def right_sizer(policies: dict[str, Any]) -> Any:
    """The right-sizer after its first round on 2 GiB used at 25 % of the SMs for six hours
    (recommendation: memory-share, compute 0.3, measured p95 0.25), under ``policies``."""
    rs = sizer(Prom(lambda t: 2 * GiB), [T0], policies=policies)
    rs.tick()
    return rs


def created(k: int) -> dict[str, Any]:
    """Pod ``k`` of the ``infer`` Deployment as the API server shows it to the webhook at
    CREATE: a HAMi share (20000 MiB, 50 % of the cores), ``generateName``, its ReplicaSet
    as controller, no note."""
    pod = share_pod(f"{RS_NAME}-p{k:04d}", mem=20000, cores=50, namespace=NS)
    meta = pod["metadata"]
    meta["generateName"] = f"{RS_NAME}-"
    del meta["name"], meta["uid"]
    meta["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": RS_NAME, "controller": True}
    ]
    return pod


def admitted(app: WebhookApp, k: int) -> dict[str, Any]:
    """Pod ``k`` after the webhook's patch (over HTTP), named as the API server names it."""
    pod = created(k)
    resp = answer(app, pod, namespace=NS)
    out: dict[str, Any] = apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
    out["metadata"]["name"] = f"{RS_NAME}-p{k:04d}"
    out["metadata"]["uid"] = f"uid-{k}"
    return out


def bound(pod: dict[str, Any], gpu: int) -> dict[str, Any]:
    """``pod`` running on GPU ``gpu`` of :data:`NODE` as HAMi's scheduler records it (its
    patched limits in ``vgpu-devices-allocated``, ``bind-phase: success``)."""
    pod = copy.deepcopy(pod)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    mem, cores = limits["nvidia.com/gpumem"], limits["nvidia.com/gpucores"]
    pod["metadata"]["annotations"].update(
        {
            "hami.io/vgpu-devices-allocated": f"GPU-{NODE}-{gpu:02d},NVIDIA,{mem},{cores}:;",
            "hami.io/bind-phase": "success",
        }
    )
    pod["spec"]["nodeName"] = NODE
    pod["status"]["phase"] = "Running"
    return pod


def extender(gpus: int, pods: list[dict[str, Any]]) -> Extender:
    params = load_params(None)
    params = dataclasses.replace(
        params, extender=dataclasses.replace(params.extender, reasons_when_placed=True)
    )
    node = hami_node(NODE, gpus, memory_mib=A100_MIB)
    return Extender(ClusterCache.from_objects([node], pods, params), gangs=GangRuntime())


def place(ext: Extender, pod: dict[str, Any], fast: bool) -> dict[str, Any]:
    """The extender's filter answer for ``pod`` on :data:`NODE`."""
    raw = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": [NODE]})
    if fast:
        out: dict[str, Any] = orjson.loads(ext.filter_json(orjson.loads(raw), raw))
        return out
    return ext.filter(orjson.loads(raw))


def held(ext: Extender, pod: dict[str, Any]) -> list[int]:
    info = ext.cache.snapshot().pods[f"{NS}/{pod['metadata']['name']}"]
    return [s.gpu for s in info.shares]


def test_the_webhook_note_is_what_placement_reads() -> None:
    """The note written by the webhook from the running right-sizer: the recommendation's
    size and the placement limits, read back by ``tenant_limits`` as the policy states
    them (milli of a GPU)."""
    rs = right_sizer({"default": {"max_tenants_per_gpu": 2, "gpu_compute_limit": 0.6}})
    sizing = rs.for_pod(created(0), NS)
    assert isinstance(sizing, PodSizing)
    assert sizing.rec.mode == MEMORY_SHARE and sizing.rec.gpu_compute_ratio == 0.3
    assert ANNOTATION == RIGHTSIZE_ANNOTATION
    pod = admitted(WebhookApp(rs.for_pod), 0)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpucores"] == "30"
    assert int(limits["nvidia.com/gpumem"]) < 20000  # right-sized down from 20000 MiB
    note = orjson.loads(pod["metadata"]["annotations"][ANNOTATION])
    assert (note["compute_p95"], note["max_tenants_per_gpu"], note["gpu_compute_limit"]) == (
        0.25,
        2,
        0.6,
    )
    assert tenant_limits(pod["metadata"]["annotations"]) == TenantLimits(250, 2, 600)


@pytest.mark.parametrize("fast", [False, True], ids=["per-node", "vector"])
def test_the_tenant_cap_refuses_the_next_tenant(fast: bool) -> None:
    """Policy: two tenants per GPU, the whole GPU's compute. Two admitted pods share GPU 0
    (p95 0.5 together, 60 of 100 cores, memory to spare); the third is refused on a 1-GPU
    node for the tenant cap alone, and goes to the idle GPU of a 2-GPU node."""
    app = WebhookApp(right_sizer({"default": {"max_tenants_per_gpu": 2}}).for_pod)
    tenants = [bound(admitted(app, k), 0) for k in range(2)]
    third = admitted(app, 2)
    out = place(extender(1, tenants), third, fast)
    assert out["NodeNames"] == []
    assert (out["FailedNodes"] or {}) == {NODE: REASON_TENANTS}
    ext = extender(2, tenants)
    assert place(ext, third, fast)["NodeNames"] == [NODE]
    assert held(ext, third) == [1]


@pytest.mark.parametrize("fast", [False, True], ids=["per-node", "vector"])
@pytest.mark.parametrize(
    ("limit", "placed"),
    [(0.6, False), (0.7, False), (0.75, True), (0.8, True)],
    ids=["0.6", "0.7", "0.75-exactly", "0.8"],
)
def test_the_compute_limit_refuses_a_gpu_whose_p95_sum_would_pass_it(
    fast: bool, limit: float, placed: bool
) -> None:
    """Policy: eight tenants per GPU, ``gpu_compute_limit`` as given. Two admitted pods at
    p95 0.25 on the one GPU: a third brings the sum to 0.75, refused above the limit and
    placed at or under it (so nothing else refuses it: 90 of 100 cores, memory to spare)."""
    policies = {"default": {"max_tenants_per_gpu": 8, "gpu_compute_limit": limit}}
    app = WebhookApp(right_sizer(policies).for_pod)
    tenants = [bound(admitted(app, k), 0) for k in range(2)]
    third = admitted(app, 2)
    ext = extender(1, tenants)
    out = place(ext, third, fast)
    if placed:
        assert out["NodeNames"] == [NODE]
        assert held(ext, third) == [0]
    else:
        assert out["NodeNames"] == []
        assert (out["FailedNodes"] or {}) == {NODE: REASON_COMPUTE_P95}
