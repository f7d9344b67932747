"""Placement keeps what the right-sizer learned: at most ``max_tenants_per_gpu`` tenants on
a GPU, and a GPU's tenants together within the policy's compute limit at their measured
compute p95 (``fractional.tenant_limits``, ``tenancy_refusal``, ``node_tenancy``), on the
per-node path and on the vector path alike, with the reason in filter."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from scheduler.cli.main import load_params
from scheduler.core.fractional import (
    REASON_COMPUTE_P95,
    REASON_NO_SHARE_ROOM,
    REASON_TENANTS,
    RIGHTSIZE_ANNOTATION,
    TenantLimits,
    tenancy_refusal,
    tenant_limits,
)
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender
from tests.sharing.builders import hami_bound, hami_node, share_pod


def _note(**fields: Any) -> dict[str, str]:
    return {RIGHTSIZE_ANNOTATION: orjson.dumps(fields).decode()}


@pytest.mark.parametrize(
    ("note", "want"),
    [
        (
            {"compute_p95": 0.2, "max_tenants_per_gpu": 2, "gpu_compute_limit": 0.8},
            TenantLimits(200, 2, 800),
        ),
        ({"gpu_compute_ratio": 0.35, "mode": "hami"}, TenantLimits(350, 0, 0)),  # sized p95: bound
        ({"compute_p95": 0.1234}, TenantLimits(124, 0, 0)),  # rounded up to a milli
        ({"max_tenants_per_gpu": True}, None),  # a boolean is no count
        ({"max_tenants_per_gpu": 0, "compute_p95": -1}, None),  # out of range: absent
        ({"workload": "infer/llm"}, None),  # nothing for placement
    ],
)
def test_tenant_limits_read_from_the_right_sizer_note(note: dict[str, Any], want: Any) -> None:
    assert tenant_limits(_note(**note)) == want


def test_tenant_limits_ignore_what_is_not_a_note() -> None:
    assert tenant_limits({RIGHTSIZE_ANNOTATION: "not json"}) is None
    assert tenant_limits({RIGHTSIZE_ANNOTATION: "[1, 2]"}) is None
    assert tenant_limits({}) is None


@pytest.mark.parametrize(
    ("tasks", "gpu", "limits", "share", "want", "why"),
    [
        (0, (0, 1, 100), TenantLimits(900, 1, 100), 300, "", "alone on a GPU: never refused"),
        (2, (600, 2, 0), None, 300, REASON_TENANTS, "the tenants' own cap of 2"),
        (2, (600, 0, 0), TenantLimits(300, 2, 0), 300, REASON_TENANTS, "the newcomer's cap"),
        (2, (600, 3, 0), TenantLimits(300, 4, 0), 300, "", "a third tenant within both caps"),
        (1, (600, 0, 800), TenantLimits(300, 0, 0), 300, REASON_COMPUTE_P95, "0.6 + 0.3 > 0.8"),
        (1, (600, 0, 800), TenantLimits(200, 0, 0), 300, "", "0.6 + 0.2 = 0.8: within"),
        (1, (600, 0, 0), TenantLimits(None, 0, 700), 300, REASON_COMPUTE_P95, "its share counts"),
        (1, (600, 0, 0), None, 300, "", "no limit anywhere"),
    ],
)
def test_tenancy_refusal(
    tasks: int, gpu: tuple[int, int, int], limits: Any, share: int, want: str, why: str
) -> None:
    assert tenancy_refusal(tasks, gpu, limits, share) == want, why


def _extender(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Extender:
    params = load_params(None)
    params = dataclasses.replace(
        params, extender=dataclasses.replace(params.extender, reasons_when_placed=True)
    )
    return Extender(ClusterCache.from_objects(nodes, pods, params), gangs=GangRuntime())


def _cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One 2-GPU HAMi node: GPU 0 holds two tenants whose policy allows two per GPU; GPU 1
    one tenant busy at p95 0.6 whose policy caps a GPU's tenants at 0.8 together. Every
    GPU has memory and compute left for a small share."""
    node = hami_node("infer-a", 2)
    pods = []
    for k in range(2):
        p = hami_bound(f"pair-{k}", 0, 2000, cores=10)
        p["metadata"]["annotations"].update(_note(compute_p95=0.3, max_tenants_per_gpu=2))
        pods.append(p)
    busy = hami_bound("busy", 1, 2000, cores=10)
    busy["metadata"]["annotations"].update(_note(compute_p95=0.6, gpu_compute_limit=0.8))
    pods.append(busy)
    return [node], pods


def _filter(ext: Extender, pod: dict[str, Any], fast: bool) -> dict[str, Any]:
    body = {"Pod": pod, "Nodes": None, "NodeNames": ["infer-a"]}
    raw = orjson.dumps(body)
    if fast:
        out: dict[str, Any] = orjson.loads(ext.filter_json(orjson.loads(raw), raw))
        return out
    return ext.filter(orjson.loads(raw))


def _held(ext: Extender, pod: dict[str, Any]) -> list[int]:
    info = ext.cache.snapshot().pods[f"infer/{pod['metadata']['name']}"]
    return [s.gpu for s in info.shares]


@pytest.mark.parametrize("fast", [False, True], ids=["per-node", "vector"])
def test_a_gpu_at_its_tenant_cap_or_compute_limit_is_refused(fast: bool) -> None:
    nodes, pods = _cluster()
    ext = _extender(nodes, pods)
    # p95 0.3: GPU 0 holds its two tenants, GPU 1 would reach 0.9 > 0.8: refused, and why.
    pod = share_pod("wants-0.3", mem=1000, cores=10, annotations=_note(compute_p95=0.3))
    out = _filter(ext, pod, fast)
    assert out["NodeNames"] == []
    assert (out["FailedNodes"] or {}) == {"infer-a": REASON_TENANTS}


@pytest.mark.parametrize("fast", [False, True], ids=["per-node", "vector"])
def test_the_compute_limit_alone_gives_its_reason(fast: bool) -> None:
    nodes, pods = _cluster()
    pods = pods[2:]  # GPU 1's tenant alone
    fill = hami_bound("fill-0", 0, 15000, cores=10)  # GPU 0: 360 MiB left, no room
    ext = _extender(nodes, [*pods, fill])
    pod = share_pod("wants-0.3", mem=1000, cores=10, annotations=_note(compute_p95=0.3))
    out = _filter(ext, pod, fast)
    assert out["NodeNames"] == []
    assert (out["FailedNodes"] or {}) == {"infer-a": REASON_COMPUTE_P95}


@pytest.mark.parametrize("fast", [False, True], ids=["per-node", "vector"])
def test_a_share_within_both_limits_goes_where_they_allow(fast: bool) -> None:
    nodes, pods = _cluster()
    ext = _extender(nodes, pods)
    # p95 0.2: GPU 1 reaches exactly 0.8 (within); GPU 0 still holds its two tenants.
    pod = share_pod("wants-0.2", mem=1000, cores=10, annotations=_note(compute_p95=0.2))
    out = _filter(ext, pod, fast)
    assert out["NodeNames"] == ["infer-a"]
    assert _held(ext, pod) == [1]


@pytest.mark.parametrize("fast", [False, True], ids=["per-node", "vector"])
def test_without_the_right_sizer_note_only_room_counts(fast: bool) -> None:
    """The same cluster without any note: both GPUs have room, the pod is placed, and a
    full node gives the plain reason."""
    nodes, pods = _cluster()
    for p in pods:
        p["metadata"]["annotations"].pop(RIGHTSIZE_ANNOTATION)
    ext = _extender(nodes, pods)
    pod = share_pod("plain", mem=1000, cores=10)
    assert _filter(ext, pod, fast)["NodeNames"] == ["infer-a"]
    big = share_pod("too-big", mem=15000, cores=10)
    assert (_filter(ext, big, fast)["FailedNodes"] or {}) == {"infer-a": REASON_NO_SHARE_ROOM}


def test_the_newcomers_own_cap_refuses_a_shared_gpu() -> None:
    """A pod whose policy allows one tenant per GPU takes the idle GPU, never a shared one."""
    node = hami_node("infer-a", 2)
    tenant = hami_bound("t", 0, 2000, cores=10)  # no note: counts as a tenant all the same
    ext = _extender([node], [tenant])
    pod = share_pod("alone", mem=1000, cores=10, annotations=_note(max_tenants_per_gpu=1))
    assert _filter(ext, pod, True)["NodeNames"] == ["infer-a"]
    assert _held(ext, pod) == [1]
