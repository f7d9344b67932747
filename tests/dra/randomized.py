"""The random claim clusters the vectorized-answer tests share: a cache of nodes with their
DRA objects, a pod for each pending claim, and the node names in a seeded random order with
one node topoplace does not know at the end."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.clusters import claim_pod
from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter

UNKNOWN_NODE = "no-such-node"

Cluster = tuple[ClusterCache, list[str], list[dict[str, Any]]]
"""(cache, node names offered, pods)."""


def claim_cluster(
    nodes: Sequence[dict[str, Any]],
    objects: Sequence[dict[str, Any]],
    pending: Sequence[dict[str, Any]],
    names: Sequence[str],
    rng: random.Random,
) -> Cluster:
    """(a cache of ``nodes`` with ``objects`` and the ``pending`` claims, ``names``
    shuffled by ``rng`` plus :data:`UNKNOWN_NODE`, a pod ``pod-<i>`` of each pending claim)."""
    pods = [claim_pod(f"pod-{i}", c["metadata"]["name"]) for i, c in enumerate(pending)]
    extra = dra.extra_of([*objects, *pending])
    cache = ClusterCache.from_objects(list(nodes), [], SchedParams(), extra=extra)
    order = list(names)
    rng.shuffle(order)
    return cache, [*order, UNKNOWN_NODE], pods


def fits_and_refusals(make: Callable[[int], Cluster], seeds: int = 4) -> tuple[int, int]:
    """(nodes offered to the pods, nodes refused to them for room) over the clusters
    ``make(seed)`` of ``seeds`` seeds: a comparison on them covers both verdicts only if
    each is common."""
    fits = refusals = 0
    for seed in range(seeds):
        cache, names, pods = make(seed)
        router = DraRouter(cache)
        for pod in pods:
            out = router.filter(pod, names)
            fits += len(out.feasible)
            refusals += sum(1 for r in out.failed.values() if r == dra.REASON_CLAIM_NOT_ALLOCATABLE)
    return fits, refusals


def agree(fast: DraRouter, slow: DraRouter, pod: dict[str, Any], offered: list[str]) -> Any:
    """Both routers' filter, scores (on the nodes offered, and on the feasible ones) and
    likely picks for ``pod`` are equal; returns filter's outcome."""
    a, b = fast.filter(pod, offered), slow.filter(pod, offered)
    assert (a.feasible, dict(a.failed), dict(a.unresolvable)) == (
        b.feasible,
        dict(b.failed),
        dict(b.unresolvable),
    )
    assert fast.prioritize(pod, offered) == slow.prioritize(pod, offered)
    if a.feasible:
        assert fast.prioritize(pod, list(a.feasible)) == slow.prioritize(pod, list(a.feasible))
    assert fast.likely_kube_picks() == slow.likely_kube_picks()
    return a
