"""Claim pods at the extender: filter and prioritize by what the DRA allocator will give.

kube-scheduler calls the extender for a pod whose GPUs are ResourceClaims only when its
extender entry has no ``managedResources`` (see ``docs/dra.md``). Its own DynamicResources
filter runs first, so the nodes offered can allocate the claims in its view. For each
one, :class:`DraRouter` predicts the devices kube-scheduler's first-fit allocator will
pick there (``scheduler.core.dra.plan_pod``), refuses unhealthy nodes, nodes where the
claims cannot be allocated in topoplace's view, nodes where the first fit would take a
device topoplace's own allocator is writing at that moment, and, for a ComputeDomain pod,
nodes serving another domain or outside the domain's NVLink partition; and scores the rest by the
ring bandwidth of the predicted set (``plan_scores``), not of the best set.

It also remembers, for a few seconds, the devices the first fit would take on every node
it let through (:meth:`DraRouter.likely_kube_picks`): kube-scheduler will allocate one of
those sets in its PreBind, and topoplace's allocator (``scheduler.kube.allocator``) avoids
them meanwhile. No I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from scheduler.core import dra
from scheduler.core.model import EMPTY_MAP, Health
from scheduler.core.objects import object_key
from scheduler.core.schedule import REASON_CORDONED, REASON_UNKNOWN_NODE, FilterOutcome
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.runtime.cache import ClusterCache

PICKS_TTL_S = 10.0
"""How long the devices a filtered claim pod may get stay avoided by topoplace's allocator
(kube-scheduler allocates in PreBind, well within this unless its binding cycle stalls)."""


CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""``<ClusterUUID>.<CliqueID>``: the NVLink partition a node's GPUs are in. A ComputeDomain
(IMEX) spans one partition, so the whole value counts (the fabric's ``nvlink-domain``
level keeps only the ClusterUUID, the physical rack)."""


def clique_reader(snap: ClusterSnapshot, fabric: Any = None) -> Callable[[str], str | None]:
    """node name -> its NVLink partition (the :data:`CLIQUE_LABEL` value), None without."""

    def clique(name: str) -> str | None:
        n = snap.node(name)
        v = n.labels.get(CLIQUE_LABEL) if n is not None else None
        return v if isinstance(v, str) and v else None

    return clique


def all_claims(snap: ClusterSnapshot) -> list[Mapping[str, Any]]:
    """Claims from the API plus topoplace's own allocations not visible there yet."""
    claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
    out = list(claims.values() if isinstance(claims, Mapping) else claims)
    out += [
        p.raw
        for k, p in snap.pods.items()
        if p.assumed and k.startswith(dra.HOLDER_PREFIX) and p.raw
    ]
    return out


def held_and_in_flight(
    snap: ClusterSnapshot,
) -> tuple[frozenset[dra.DeviceId], frozenset[dra.DeviceId]]:
    """(devices allocated claims hold, devices topoplace's assumed allocations take)."""
    claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
    values = claims.values() if isinstance(claims, Mapping) else claims
    held = dra.held_device_ids(values)
    flying: set[dra.DeviceId] = set()
    for key, p in snap.pods.items():
        if p.assumed and key.startswith(dra.HOLDER_PREFIX):
            flying.update(dra.allocated_ids(p.raw))
    return held, frozenset(flying - held)


class DraRouter:
    """Filter / prioritize for claim pods over the cache's snapshot.

    Args:
        cache: the cluster cache (its snapshot carries the DRA objects).
        clock: monotonic seconds.
        picks_ttl_s: see :data:`PICKS_TTL_S`.
    """

    def __init__(
        self,
        cache: ClusterCache,
        clock: Callable[[], float] = time.monotonic,
        picks_ttl_s: float = PICKS_TTL_S,
    ) -> None:
        self.cache = cache
        self._clock = clock
        self.picks_ttl_s = picks_ttl_s
        self._lock = threading.Lock()
        self._picks: dict[str, tuple[float, frozenset[dra.DeviceId]]] = {}
        self._memo: tuple[Any, Any, tuple[frozenset[Any], frozenset[Any]]] | None = None

    def _held(self, snap: ClusterSnapshot) -> tuple[frozenset[Any], frozenset[Any]]:
        memo = self._memo
        claims = snap.extra.get(dra.CLAIMS_KEY)
        if memo is None or memo[0] is not claims or memo[1] is not snap.pods:
            memo = (claims, snap.pods, held_and_in_flight(snap))
            self._memo = memo
        return memo[2]

    def plans(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str],
        also_held: frozenset[dra.DeviceId] = frozenset(),
    ) -> list[dra.PodPlan]:
        """One plan per name (unknown nodes, unhealthy and cordoned nodes refused);
        ``also_held``: devices to count as taken besides allocated claims."""
        snap = self.cache.snapshot()
        inv = self.cache.dra_inventory(snap)
        held, flying = self._held(snap)
        held = held | also_held
        domain = dra.pod_compute_domain(pod, snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP)
        if domain:
            serving = dra.serving_domains(all_claims(snap))
            clique = clique_reader(snap, self.cache.params.fabric)
            cliques = dra.domain_cliques(domain, serving, clique)
        out = []
        for name in names:
            node = snap.node(name)
            why = dra.cd_verdict(domain, name, clique(name), serving, cliques) if domain else ""
            if node is None:
                out.append(dra.PodPlan(name, dra.UNKNOWN, (), REASON_UNKNOWN_NODE))
            elif node.health.state >= Health.UNHEALTHY:
                reason = node.health.reasons[0] if node.health.reasons else "node unhealthy"
                out.append(dra.PodPlan(name, dra.UNKNOWN, (), reason, never=True))
            elif node.health.unschedulable:
                out.append(dra.PodPlan(name, dra.UNKNOWN, (), REASON_CORDONED))
            elif why:
                out.append(dra.PodPlan(name, dra.UNKNOWN, (), why))
            else:
                out.append(dra.plan_pod(pod, name, inv, snap.extra, held, flying))
        return out

    def filter(self, pod: Mapping[str, Any], names: Sequence[str]) -> FilterOutcome:
        """Which of ``names`` the claim pod may use, and why not; remembers the feasible
        nodes' predicted devices (:meth:`likely_kube_picks`)."""
        plans = self.plans(pod, names)
        feasible = tuple(p.node for p in plans if not p.verdict)
        failed = {p.node: p.verdict for p in plans if p.verdict and not p.never}
        never = {p.node: p.verdict for p in plans if p.verdict and p.never}
        picks = {d.id for p in plans if not p.verdict for c in p.prediction.devices for d in c}
        # kube-scheduler also counts the devices of pods it filtered before this one and has
        # not written yet (its in-flight allocations): the first fit may land past them.
        others = self.likely_kube_picks(exclude=object_key(pod))
        if others and picks:
            ok = [p.node for p in plans if not p.verdict]
            for p in self.plans(pod, ok, others):
                picks.update(d.id for c in p.prediction.devices for d in c)
        with self._lock:
            if picks:
                self._picks[object_key(pod)] = (self._clock() + self.picks_ttl_s, frozenset(picks))
            else:
                self._picks.pop(object_key(pod), None)
        return FilterOutcome(feasible, MappingProxyType(failed), MappingProxyType(never))

    def prioritize(self, pod: Mapping[str, Any], names: Sequence[str]) -> list[tuple[str, int]]:
        """Scores 0..10 by the predicted set's bandwidth (``dra.plan_scores``)."""
        snap = self.cache.snapshot()
        plans = self.plans(pod, names)
        return list(zip(names, dra.plan_scores(plans, snap.node), strict=True))

    def likely_kube_picks(self, exclude: str = "") -> frozenset[dra.DeviceId]:
        """Devices kube-scheduler may be allocating now for claim pods topoplace filtered
        (until their claims show allocated, or :attr:`picks_ttl_s`), but pod ``exclude``."""
        now = self._clock()
        snap = self.cache.snapshot()
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        out: set[dra.DeviceId] = set()
        with self._lock:
            for key, (deadline, ids) in list(self._picks.items()):
                pod = self.cache.pending(key)
                done = pod is not None and all(
                    dra.is_allocated(c) for c in dra.pod_claims(pod, claims)[0]
                )
                if deadline < now or done:
                    del self._picks[key]
                elif key != exclude:
                    out |= ids
        return frozenset(out)
