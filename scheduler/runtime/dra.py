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
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from scheduler.core import dra
from scheduler.core.model import EMPTY_MAP, Health, PodRequest
from scheduler.core.objects import meta, object_key
from scheduler.core.params import SchedParams
from scheduler.core.schedule import (
    REASON_CORDONED,
    REASON_UNKNOWN_NODE,
    FilterOutcome,
    choose_gpus,
    filter_nodes,
)
from scheduler.core.snapshot import ClusterSnapshot, gpus_by_dra
from scheduler.runtime.cache import ClusterCache

PICKS_TTL_S = 10.0
"""How long the devices a filtered claim pod may get stay avoided by topoplace's allocator
(kube-scheduler allocates in PreBind, well within this unless its binding cycle stalls)."""


CLIQUE_LABEL = "nvidia.com/gpu.clique"
"""``<ClusterUUID>.<CliqueID>``: the NVLink partition a node's GPUs are in. A ComputeDomain
(IMEX) spans one partition, so the whole value counts (the fabric's ``nvlink-domain``
level keeps only the ClusterUUID, the physical rack)."""

CANDIDATES_MEMO_MAX = 200_000
"""Entries (node, request form) of the candidate devices kept per inventory: every node
for a few dozen request forms at 5,000 nodes."""


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


def _grouped(ids: frozenset[dra.DeviceId]) -> Mapping[Any, frozenset[dra.DeviceId]]:
    """Device ids by (driver, pool)."""
    groups: dict[Any, set[dra.DeviceId]] = {}
    for did in ids:
        groups.setdefault(did[:2], set()).add(did)
    return {k: frozenset(v) for k, v in groups.items()}


def _same_basis(
    was: tuple[Any, ...], now: tuple[Any, ...], was_claims: Sequence[Any], claims: Sequence[Any]
) -> bool:
    """Whether plans made from ``was`` (pod identity, inventory, classes, devices in flight,
    claims complete) and the pod's claim objects ``was_claims`` hold for ``now``."""
    return (
        was[0] == now[0]
        and was[1] is now[1]
        and was[2] is now[2]
        and was[3] == now[3]
        and was[4] == now[4]
        and len(was_claims) == len(claims)
        and all(a is b for a, b in zip(was_claims, claims, strict=True))
    )


def _pod_identity(pod: Mapping[str, Any]) -> tuple[str, Any, Any]:
    """(namespace/name, uid, resourceVersion): the same pod, unchanged."""
    m = meta(pod)
    return object_key(pod), m.get("uid"), m.get("resourceVersion")


@dataclass(frozen=True, slots=True)
class ExtendedPick:
    """The devices topoplace chose for a gated pod whose ``nvidia.com/gpu`` DRA backs
    (``scheduler.kube.allocator``): kube-scheduler is kept to ``node`` (filter) and, at
    bind, the special claim it made is given ``devices`` instead of its first fit.

    Attributes:
        node: the node.
        devices: the devices, in GPU order.
        gpus: their GPU indices.
        hold: the ledger key holding them meanwhile (an assumed holding).
    """

    node: str
    devices: tuple[dra.Device, ...]
    gpus: tuple[int, ...]
    hold: str


REASON_PICKED_ELSEWHERE = "topoplace allocated this pod's GPUs on another node"


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
        self._pick_counts: Counter[dra.DeviceId] = Counter()  # device -> pods picking it
        self._memo: tuple[Any, Any, tuple[frozenset[Any], frozenset[Any]]] | None = None
        # held devices by (driver, pool), for the last held set (one per claims change)
        self._pools_memo: tuple[frozenset[Any], Mapping[Any, frozenset[Any]]] | None = None
        # per inventory: (node, entry key) -> candidate devices; node -> its pools
        self._inv_memo: tuple[Any, dict[Any, Any], dict[str, tuple[Any, ...]]] | None = None
        # the last pod's plans, for prioritize: (what they were made from, the pod's claim
        # objects, name -> (plan, the node's held devices then))
        self._last_plans: tuple[tuple[Any, ...], tuple[Any, ...], dict[str, Any]] | None = None
        self._mapped_memo: tuple[Any, Mapping[str, str]] | None = None
        self._extended_picks: dict[str, ExtendedPick] = {}
        self.reallocate: Callable[[str, str], str] | None = None
        """Gives a chosen pod's special claim topoplace's devices at bind
        (``GateAllocator.reallocate``, set where the allocator runs)."""

    # ---- extended resources backed by DRA (nvidia.com/gpu on DRA nodes) -------------------

    def _mapped(self, classes: Any) -> Mapping[str, str]:
        """``dra.extended_resource_classes`` of ``classes``, made once per classes object."""
        memo = self._mapped_memo
        if memo is None or memo[0] is not classes:
            memo = (classes, MappingProxyType(dra.extended_resource_classes(classes or {})))
            self._mapped_memo = memo
        return memo[1]

    def extended_resources(self, pod: Mapping[str, Any]) -> Mapping[str, str]:
        """The pod's extended resources a DeviceClass backs (resource -> class; empty for
        most pods, and always in a cluster without such a DeviceClass)."""
        classes = self.cache.snapshot().extra.get(dra.CLASSES_KEY)
        if not classes:
            return EMPTY_MAP
        mapped = self._mapped(classes)
        return {r: mapped[r] for r in dra.pod_extended_resources(pod, mapped)}

    def pick_extended(self, key: str, pick: ExtendedPick) -> None:
        """Remember topoplace's choice for pod ``key`` (:class:`ExtendedPick`)."""
        with self._lock:
            self._extended_picks[key] = pick

    def extended_pick(self, key: str) -> ExtendedPick | None:
        """topoplace's choice for pod ``key``, if any."""
        with self._lock:
            return self._extended_picks.get(key)

    def before_bind(self, key: str, node: str) -> str:
        """Called by bind before the Binding of pod ``key`` to ``node`` is written: for a
        pod topoplace chose devices for, :attr:`reallocate` gives them to its claim.
        Returns "" or an error (the bind then fails)."""
        if self.reallocate is None or self.extended_pick(key) is None:
            return ""
        return self.reallocate(key, node)

    def extended_keys(self) -> list[str]:
        """The pods topoplace has chosen for (:meth:`pick_extended`), sorted."""
        with self._lock:
            return sorted(self._extended_picks)

    def drop_extended(self, key: str) -> ExtendedPick | None:
        """Forget the choice for pod ``key`` (returns it)."""
        with self._lock:
            return self._extended_picks.pop(key, None)

    def split_by_dra(self, names: Sequence[str]) -> tuple[list[str], list[str]]:
        """(nodes whose GPUs are DRA devices, the others) of ``names``, order kept."""
        snap = self.cache.snapshot()
        by_dra: list[str] = []
        other: list[str] = []
        for n in names:
            node = snap.node(n)
            (by_dra if node is not None and gpus_by_dra(node) else other).append(n)
        return by_dra, other

    def filter_extended(
        self,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: Sequence[str],
        extended: Mapping[str, str],
        params: SchedParams,
    ) -> FilterOutcome:
        """Filter for a pod asking ``nvidia.com/gpu`` (``req.gpus`` > 0) that DRA backs
        (``extended``): device-plugin nodes by the whole-GPU filter, DRA nodes by what
        kube-scheduler's allocator would give its special claim there (:meth:`filter`;
        the usual whole-GPU room counts too, from the ledger). Order kept. A pod topoplace
        chose devices for (:class:`ExtendedPick`) is kept to its node while kube-scheduler
        offers it (if not, it goes where it fits and keeps kube-scheduler's first fit)."""
        picked = self.extended_pick(object_key(pod))
        if picked is not None and picked.node in names:  # topoplace chose: that node only
            failed = {n: REASON_PICKED_ELSEWHERE for n in names if n != picked.node}
            ok = tuple(n for n in names if n == picked.node)
            return FilterOutcome(ok, MappingProxyType(failed), EMPTY_MAP)
        by_dra, other = self.split_by_dra(names)
        snap = self.cache.snapshot()
        parts = [filter_nodes(snap, req, other, params)] if other else []
        if by_dra:
            whole = filter_nodes(snap, req, by_dra, params)
            ok = set(whole.feasible)
            claims = self.filter(pod, [n for n in by_dra if n in ok], extended)
            parts += [FilterOutcome((), whole.failed, whole.unresolvable), claims]
        keep = {n for p in parts for n in p.feasible}
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        for p in parts:
            failed.update(p.failed)
            never.update(p.unresolvable)
        return FilterOutcome(
            tuple(n for n in names if n in keep),
            MappingProxyType(failed),
            MappingProxyType(never),
        )

    def prioritize_extended(
        self,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: Sequence[str],
        extended: Mapping[str, str],
        params: SchedParams,
    ) -> list[tuple[str, int]]:
        """Scores 0..10 for such a pod, every node on one scale (``dra.plan_scores``): a
        DRA node by the set kube-scheduler's allocator would give it there, a
        device-plugin node by the set topoplace hands out there (``choose_gpus``)."""
        by_dra, _ = self.split_by_dra(names)
        snap = self.cache.snapshot()
        drap = {p.node: p for p in self.plans(pod, by_dra, extended=extended)}
        plans = []
        for n in names:
            p = drap.get(n)
            if p is None:
                gs = choose_gpus(snap, req, n, params)
                p = dra.PodPlan(n, dra.Prediction(True, True), gs.gpus, gs.error)
            plans.append(p)
        return list(zip(names, dra.plan_scores(plans, snap.node), strict=True))

    def extended_gpus(self, pod: Mapping[str, Any], node: str) -> tuple[int, ...] | None:
        """The GPUs the special claim of ``pod`` holds on ``node`` (None: no allocated
        special claim there yet)."""
        snap = self.cache.snapshot()
        made = dra.extended_claim_of(pod, snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP)
        if made is None or not dra.is_allocated(made):
            return None
        held = dra.claim_holding(made, self.cache.dra_inventory(snap))
        return held[1] if held is not None and held[0] == node else None

    def _held(self, snap: ClusterSnapshot) -> tuple[frozenset[Any], frozenset[Any]]:
        memo = self._memo
        claims = snap.extra.get(dra.CLAIMS_KEY)
        if memo is None or memo[0] is not claims or memo[1] is not snap.pods:
            memo = (claims, snap.pods, held_and_in_flight(snap))
            self._memo = memo
        return memo[2]

    def _by_pool(self, held: frozenset[Any]) -> Mapping[Any, frozenset[Any]]:
        """``held`` grouped by (driver, pool): a node's first fit needs only its pools'."""
        memo = self._pools_memo
        if memo is not None and memo[0] is held:
            return memo[1]
        out = _grouped(held)
        self._pools_memo = (held, out)
        return out

    def _inventory_memo(self, inv: dra.Inventory) -> tuple[dict[Any, Any], dict[str, Any]]:
        memo = self._inv_memo
        if memo is None or memo[0] is not inv:
            memo = (inv, {}, {})
            self._inv_memo = memo
        return memo[1], memo[2]

    def plans(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str],
        also_held: frozenset[dra.DeviceId] = frozenset(),
        extended: Mapping[str, str] | None = None,
    ) -> list[dra.PodPlan]:
        """One plan per name (unknown nodes, unhealthy and cordoned nodes refused);
        ``also_held``: devices to count as taken besides allocated claims.

        The pod's claims are read once (``dra.prepare_claim_pod``); per node only its own
        pools' held devices are looked at, and the devices each request may take on it are
        remembered per inventory. Without ``also_held``, the plans of the last pod are
        kept, each with the node's held devices it was made with: prioritize, which follows
        filter for the same pod, takes a node's plan again while they are the same (other
        pods bound, or claims allocated on other nodes, meanwhile) and the pod's claims,
        the classes, the inventory and the devices in flight are unchanged. (Health and
        cordons are checked anew on every call.) ``extended``: the pod's extended resources
        DRA hands out on these nodes (:meth:`extended_resources`), planned as the special
        claim kube-scheduler makes for them (``dra.prepare_extended_pod``)."""
        snap = self.cache.snapshot()
        inv = self.cache.dra_inventory(snap)
        held, flying = self._held(snap)
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        own, complete = dra.pod_claims(pod, claims)
        basis = (_pod_identity(pod), inv, snap.extra.get(dra.CLASSES_KEY), flying, complete)
        last = self._last_plans
        known: Mapping[str, tuple[dra.PodPlan, Any]] = EMPTY_MAP
        if extended:
            basis = (*basis[:4], (basis[4], tuple(sorted(extended.items()))))
        if not also_held and last is not None and _same_basis(last[0], basis, last[1], own):
            known = last[2]
        by_pool = self._by_pool(held)
        more = _grouped(also_held) if also_held else EMPTY_MAP
        cands, pools = self._inventory_memo(inv)

        def candidates(node: str, entry: dra.FitEntry) -> Sequence[dra.Device]:
            key = (node, entry.key)
            got = cands.get(key)
            if got is None:
                got = dra.request_candidates(inv.by_node.get(node, ()), entry)
                if len(cands) >= CANDIDATES_MEMO_MAX:
                    cands.clear()  # many distinct selectors: start over, stay bounded
                cands[key] = got
            return got

        prep: dra.ClaimPod | None = None
        domain = dra.pod_compute_domain(pod, claims)
        if domain:
            serving = dra.serving_domains(all_claims(snap))
            clique = clique_reader(snap, self.cache.params.fabric)
            cliques = dra.domain_cliques(domain, serving, clique)
        out = []
        made: dict[str, tuple[dra.PodPlan, Any]] = {}
        for name in names:
            node = snap.node(name)
            why = dra.cd_verdict(domain, name, clique(name), serving, cliques) if domain else ""
            busy: Any = None
            if node is None:
                plan = dra.PodPlan(name, dra.UNKNOWN, (), REASON_UNKNOWN_NODE)
            elif node.health.state >= Health.UNHEALTHY:
                reason = node.health.reasons[0] if node.health.reasons else "node unhealthy"
                plan = dra.PodPlan(name, dra.UNKNOWN, (), reason, never=True)
            elif node.health.unschedulable:
                plan = dra.PodPlan(name, dra.UNKNOWN, (), REASON_CORDONED)
            elif why:
                plan = dra.PodPlan(name, dra.UNKNOWN, (), why)
            else:
                mine = pools.get(name)
                if mine is None:
                    mine = tuple(sorted({d.id[:2] for d in inv.by_node.get(name, ())}))
                    pools[name] = mine
                if len(mine) == 1 and not more:
                    busy = by_pool.get(mine[0], frozenset())
                else:
                    busy = frozenset().union(
                        *(by_pool.get(p, frozenset()) for p in mine),
                        *(more.get(p, frozenset()) for p in mine),
                    )
                prev = known.get(name)  # a plan reads the node's held devices, not the node
                if prev is not None and prev[1] == busy:
                    plan = prev[0]
                else:
                    if prep is None:
                        prep = (
                            dra.prepare_extended_pod(pod, inv, snap.extra, extended)
                            if extended
                            else dra.prepare_claim_pod(pod, inv, snap.extra)
                        )
                    plan = dra.plan_prepared(prep, name, inv, busy, flying, candidates)
            out.append(plan)
            made[name] = (plan, busy)
        if not also_held and not domain:
            self._last_plans = (basis, tuple(own), made)
        return out

    def filter(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str],
        extended: Mapping[str, str] | None = None,
    ) -> FilterOutcome:
        """Which of ``names`` the claim pod may use, and why not; remembers the feasible
        nodes' predicted devices (:meth:`likely_kube_picks`). ``extended``: as for
        :meth:`plans`."""
        plans = self.plans(pod, names, extended=extended)
        feasible = tuple(p.node for p in plans if not p.verdict)
        failed = {p.node: p.verdict for p in plans if p.verdict and not p.never}
        never = {p.node: p.verdict for p in plans if p.verdict and p.never}
        picks = {d.id for p in plans if not p.verdict for c in p.prediction.devices for d in c}
        # kube-scheduler also counts the devices of pods it filtered before this one and has
        # not written yet (its in-flight allocations): the first fit may land past them.
        # Only where it took one of those can it land elsewhere (dra.first_fit_stands).
        key = object_key(pod)
        others = self.likely_kube_picks(exclude=key)
        if others and picks:
            redo = [
                p.node
                for p in plans
                if not p.verdict and not dra.first_fit_stands(p.prediction, others)
            ]
            if redo:
                for p in self.plans(pod, redo, others, extended):
                    picks.update(d.id for c in p.prediction.devices for d in c)
        with self._lock:
            self._drop_picks(key)
            if picks:
                ids = frozenset(picks)
                self._picks[key] = (self._clock() + self.picks_ttl_s, ids)
                self._pick_counts.update(ids)
        return FilterOutcome(feasible, MappingProxyType(failed), MappingProxyType(never))

    def _drop_picks(self, key: str) -> None:
        """Forget pod ``key``'s picks (under the lock)."""
        old = self._picks.pop(key, None)
        if old is not None:
            counts = self._pick_counts
            for i in old[1]:
                n = counts[i] - 1
                if n:
                    counts[i] = n
                else:
                    del counts[i]

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
        with self._lock:
            for key, (deadline, _) in list(self._picks.items()):
                pod = self.cache.pending(key)
                done = pod is not None and all(
                    dra.is_allocated(c) for c in dra.pod_claims(pod, claims)[0]
                )
                if deadline < now or done:
                    self._drop_picks(key)
            counts = self._pick_counts
            mine = self._picks.get(exclude)
            if mine is None:
                return frozenset(counts)
            return frozenset(i for i, n in counts.items() if n > 1 or i not in mine[1])
