"""The vectorized first fit of greedy claim pods (``DraRouter.vectorized``: one request of
``count`` devices without constraints, on every node at once by bit masks) against the
node-by-node plans, on many seeded random clusters: the same feasible nodes, the same
reasons, the same scores, and the same devices kube-scheduler is expected to take.
Constrained claims: ``test_constrained_vectorized.py``; capacity claims:
``test_capacity_vectorized.py``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from benchmarks.clusters import claim_pod, dgx_h100_nodes, node_slices, resource_claim
from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from tests.dra import recorded
from tests.dra.randomized import claim_cluster

CLASSES = list(recorded.classes("v1beta1").values())


def _cluster(seed: int) -> tuple[ClusterCache, list[str], list[dict[str, Any]], list[str]]:
    """A random cluster: 40-120 DGX H100 nodes with one 8-GPU slice each (a few without
    one, a few with a tainted device), random claims of 1-8 GPUs allocated, a cordoned and
    an unhealthy node, and 12 pods with pending claims of 1-8 GPUs (a few pinned)."""
    rng = random.Random(seed)
    nodes = dgx_h100_nodes(rng.randint(40, 120))
    names = [n["metadata"]["name"] for n in nodes]
    for n in rng.sample(nodes, 2):
        n["spec"] = {"unschedulable": True}
    bad = rng.choice(nodes)
    bad["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    with_slices = [n for n in names if rng.random() > 0.05]
    slices = [dict(s, kind="ResourceSlice") for s in node_slices(with_slices)]
    for s in rng.sample(slices, min(3, len(slices))):
        dev = rng.choice(s["spec"]["devices"])
        body = dev.get("basic", dev)
        body["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    inv = dra.inventory(slices)
    claims: list[dict[str, Any]] = []
    taken: set[Any] = set()
    for i, n in enumerate(rng.sample(with_slices, len(with_slices) // 2)):
        free = [d for d in inv.by_node[n] if d.id not in taken]
        k = rng.randint(1, 8)
        if len(free) < k:
            continue
        devs = rng.sample(free, k)
        taken.update(d.id for d in devs)
        c = resource_claim(f"held-{i}", k)
        c["status"] = {"allocation": dra.allocation_status(n, dra.claim_spec(c), devs)}
        claims.append(c)
    pending = [resource_claim(f"want-{i}", rng.randint(1, 8)) for i in range(12)]
    classes = [dict(c, kind="DeviceClass") for c in CLASSES]
    cache, order, pods = claim_cluster(nodes, [*classes, *slices, *claims], pending, names, rng)
    return cache, order, pods, with_slices


def _both(cache: ClusterCache) -> tuple[DraRouter, DraRouter]:
    fast, slow = DraRouter(cache), DraRouter(cache)
    slow.vectorized = False
    return fast, slow


@pytest.mark.parametrize("seed", range(30))
def test_vectorized_first_fit_gives_the_node_by_node_answers(seed: int) -> None:
    cache, names, pods, _ = _cluster(seed)
    fast, slow = _both(cache)
    rng = random.Random(seed)
    for pod in pods:
        offered = [n for n in names if rng.random() > 0.1]
        assert fast._fast(pod, offered) is not None  # the greedy path is taken
        a, b = fast.filter(pod, offered), slow.filter(pod, offered)
        assert (a.feasible, dict(a.failed), dict(a.unresolvable)) == (
            b.feasible,
            dict(b.failed),
            dict(b.unresolvable),
        )
        if a.feasible:
            assert fast.prioritize(pod, list(a.feasible)) == slow.prioritize(pod, list(a.feasible))
        assert fast.prioritize(pod, offered) == slow.prioritize(pod, offered)
        # the devices kube-scheduler is expected to take: the same for the allocator
        assert fast.likely_kube_picks() == slow.likely_kube_picks()


def test_refusals_and_in_flight_devices_agree() -> None:
    """Devices topoplace is writing (assumed holdings, and its writes of the last
    seconds) are refused the same way by both paths."""
    cache, names, pods, with_slices = _cluster(7)
    fast, slow = _both(cache)
    inv = cache.dra_inventory()
    node = with_slices[0]
    first = inv.by_node[node][0]
    for r in (fast, slow):
        r.note_written("default/mine", [first.id])
    for pod in pods:
        a, b = fast.filter(pod, names), slow.filter(pod, names)
        assert (a.feasible, dict(a.failed)) == (b.feasible, dict(b.failed))
    assert any(
        dict(fast.filter(p, [node]).failed).get(node) == dra.REASON_CLAIM_IN_FLIGHT for p in pods
    )


def test_a_pod_outside_the_greedy_form_takes_the_node_by_node_path() -> None:
    cache, names, _, _ = _cluster(3)
    c = resource_claim("two-requests", 2)
    more = {"name": "more", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    c["spec"]["devices"]["requests"].append(more)
    c["spec"]["devices"]["constraints"] = [
        {"requests": ["gpus", "more"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    ]
    extra = dict(cache.snapshot().extra)
    claims = dict(extra[dra.CLAIMS_KEY])
    claims["default/two-requests"] = dict(c, kind="ResourceClaim")
    cache2 = ClusterCache.from_objects(
        [n.raw for n in cache.snapshot().nodes],
        [],
        SchedParams(),
        extra={**extra, dra.CLAIMS_KEY: claims},
    )
    pod = claim_pod("p", "two-requests")
    fast, slow = _both(cache2)
    assert fast._fast(pod, names) is None
    assert fast.filter(pod, names) == slow.filter(pod, names)


def test_the_random_clusters_refuse_for_every_reason() -> None:
    """The clusters above exercise each verdict (so the comparison covers them)."""
    failed: set[str] = set()
    never: set[str] = set()
    for seed in range(5):
        cache, names, pods, _ = _cluster(seed)
        fast, _ = _both(cache)
        for pod in pods:
            out = fast.filter(pod, names)
            failed |= set(out.failed.values())
            never |= set(out.unresolvable.values())
    assert failed == {
        "node cordoned",
        dra.REASON_CLAIM_NOT_ALLOCATABLE,
        "node unknown to topoplace",
    }
    assert never == {"node not ready"}
