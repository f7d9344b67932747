"""Capacity claims answered by masks over every node (``DraRouter.vectorized``: the first
fit of one request on shared devices by ``dra.capacity_fit_masks``) against the node-by-node
search, on seeded random clusters of shared and plain GPUs: the same feasible nodes,
reasons, scores and likely picks."""

from __future__ import annotations

import random
from typing import Any

import pytest

from benchmarks.cluster.dra import SHARED_CLASS, device_class, node_slices
from benchmarks.clusters import dgx_h100_nodes
from scheduler.core import dra
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from tests.dra.randomized import agree, claim_cluster, fits_and_refusals

GI = 1 << 30
ASKS = ("1500Mi", "10Gi", "30Gi", "60Gi", "81Gi")


def _claim(name: str, cls: str, count: int, caps: dict[str, str]) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount"}
    exactly["count"] = count
    if caps:
        exactly["capacity"] = {"requests": caps}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    }


def _cluster(seed: int) -> tuple[ClusterCache, list[str], list[dict[str, Any]]]:
    """30-90 nodes, each with 0-8 shared GPUs (the rest plain), shares of 1-60Gi and whole
    claims allocated at random (never over capacity), a cordoned node, and 16 pods asking
    1 or 2 shared or any GPUs with and without capacity requests."""
    rng = random.Random(seed)
    nodes = dgx_h100_nodes(rng.randint(30, 90))
    names = [n["metadata"]["name"] for n in nodes]
    rng.choice(nodes)["spec"] = {"unschedulable": True}
    slices = []
    for n in names:
        for s in node_slices(n, "v1", gpus=8, shared=rng.randint(0, 8)):
            slices.append(dict(s, kind="ResourceSlice"))
    inv = dra.inventory(slices)
    classes = [dict(device_class("v1"), kind="DeviceClass")]
    classes.append(dict(device_class("v1", SHARED_CLASS, shared=True), kind="DeviceClass"))
    claims: list[dict[str, Any]] = []
    used: dict[Any, int] = {}
    for i in range(rng.randint(20, 120)):
        d = rng.choice([d for n in rng.sample(names, 1) for d in inv.by_node[n]])
        if d.shared:
            mem = rng.randint(1, 60) * GI
            if used.get(d.id, 0) + mem > 80 * GI:
                continue
            used[d.id] = used.get(d.id, 0) + mem
            c = _claim(f"held-{i}", SHARED_CLASS, 1, {"memory": str(mem)})
        else:
            if d.id in used:
                continue
            used[d.id] = 80 * GI
            c = _claim(f"held-{i}", "gpu.nvidia.com", 1, {})
        c["status"] = {"allocation": dra.allocation_status(d.node, dra.claim_spec(c), [d])}
        claims.append(c)
    pending = []
    for i in range(16):
        cls = rng.choice((SHARED_CLASS, SHARED_CLASS, "gpu.nvidia.com"))
        caps = {"memory": rng.choice(ASKS)} if rng.random() < 0.8 else {}
        if caps and rng.random() < 0.3:
            caps["compute"] = rng.choice(("20", "50"))
        pending.append(_claim(f"want-{i}", cls, rng.choice((1, 1, 2)), caps))
    return claim_cluster(nodes, [*classes, *slices, *claims], pending, names, rng)


@pytest.mark.parametrize("seed", range(20))
def test_capacity_masks_give_the_node_by_node_answers(seed: int) -> None:
    cache, names, pods = _cluster(seed)
    fast, slow = DraRouter(cache), DraRouter(cache)
    slow.vectorized = False
    rng = random.Random(seed)
    for pod in pods:
        offered = [n for n in names if rng.random() > 0.1]
        got = fast._fast(pod, offered)
        assert got is not None and got.table.cap is not None  # the capacity masks answer
        agree(fast, slow, pod, offered)


def test_the_random_clusters_fit_and_refuse() -> None:
    """Some pods fit some nodes and are refused on others for room (so the comparison
    above covers both)."""
    fits, refusals = fits_and_refusals(_cluster)
    assert fits > 100 and refusals > 100, (fits, refusals)
