"""Claim pods at the extender: filter and prioritize by what the DRA allocator will give.

kube-scheduler calls the extender for a pod whose GPUs are ResourceClaims only when its
extender entry has no ``managedResources`` (see ``docs/dra.md``). Its own DynamicResources
filter runs first, so the nodes offered can allocate the claims in its view. For each
one, :class:`DraRouter` predicts the devices kube-scheduler's first-fit allocator will
pick there (``scheduler.core.dra.plan_pod``), refuses unhealthy nodes, nodes where the
claims cannot be allocated in topoplace's view, nodes where the first fit would take a
device topoplace's own allocator is writing or wrote in the last :data:`RECENT_S` seconds
(predicted as kube-scheduler may still see it: free), and, for a ComputeDomain pod,
nodes serving another domain or outside the domain's NVLink partition; and scores the rest by the
ring bandwidth of the predicted set (``plan_scores``), not of the best set.

It also remembers, for a few seconds, the devices the first fit would take on every node
it let through (:meth:`DraRouter.likely_kube_picks`): kube-scheduler will allocate one of
those sets in its PreBind, and topoplace's allocator (``scheduler.kube.allocator``) avoids
them meanwhile. At bind, the claims kube-scheduler allocated for a pod are checked
against topoplace's own devices (:meth:`DraRouter.before_bind_claims`).

A pod whose claims are one ``ExactCount`` request (the common case) is answered without
per-node Python: the first fit on every node at once by candidate bit masks
(``scheduler.core.dra.GreedyTable``; capacity requests by the capacity columns), scores from
per-node columns, the same answers as node by node (``tests/dra/test_vectorized.py``,
``test_capacity_vectorized.py``). With ``matchAttribute`` constraints, the allocator's
search runs once per distinct (candidates' attribute values, free candidates), which
identical nodes share (``dra.constrained_masks``, ``test_constrained_vectorized.py``).
No I/O.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

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
    name_positions,
)
from scheduler.core.snapshot import ClusterSnapshot, gpus_by_dra
from scheduler.runtime.cache import ClusterCache
from topology.select import ring_bottleneck

log = logging.getLogger(__name__)

PICKS_TTL_S = 10.0
"""How long the devices a filtered claim pod may get stay avoided by topoplace's allocator
(kube-scheduler allocates in PreBind, well within this unless its binding cycle stalls)."""


RECENT_S = 5.0
"""Seconds after topoplace writes an allocation during which claim pods' first fit is
predicted without it, and a node where that first fit would take one of its devices is
refused (``REASON_CLAIM_IN_FLIGHT``): kube-scheduler may still allocate from a view without
the write (its informer behind, or a scheduling cycle begun before it), and the two would
then name one device (see :meth:`DraRouter.note_written`)."""

HELD_OFF_RETRY_S = 1.0
"""Seconds after which a claim pod refused only for devices topoplace is writing (or that
kube-scheduler no longer counts), with no window of recent writes open to wait for, is
woken to be tried again."""


ADOPT_S = 30.0
"""Seconds a claim pod stays handed to the allocator after a refusal for devices
kube-scheduler no longer counts (:meth:`DraRouter.adopted`)."""


BOUND_DOMAIN_S = 30.0
"""Seconds a ComputeDomain pod's bind makes its node count as serving the domain before
topoplace's watch shows the claims (:meth:`DraRouter.bound_domains`)."""


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

REASON_CLAIMS_NOT_SEEN = "topoplace has not seen the pod's ResourceClaims yet"
"""Every node's reason for a claim pod whose claims are not all in topoplace's cache
(:meth:`DraRouter.plans`). kube-scheduler asks only once its own informer has them, but
topoplace's watch may lag it: without the claims topoplace can tell neither the devices the
pod would get nor its ComputeDomain, so passing the pod would let it onto a node serving
another domain unchecked. The refusal is "not now"; the pod is woken once the claims are
seen (``ParkedPods.wait_for_claims``)."""


BindCheck = Callable[[str, Mapping[str, Any], str, str, Mapping[dra.DeviceId, str], bool], str]
"""``(pod key, pod, node, pod uid, topoplace's devices on the node -> claim key, whether
the pod's GPUs are a special extended-resource claim) -> "" or an error``
(``GateAllocator.check_bind``)."""


# verdict codes of the vectorized plans (:class:`_Fast`)
_OK, _UNKNOWN_NODE, _UNHEALTHY, _CORDONED, _NO_FIT, _IN_FLIGHT, _SEARCH = range(7)
_REASONS = {
    _UNKNOWN_NODE: REASON_UNKNOWN_NODE,
    _CORDONED: REASON_CORDONED,
    _NO_FIT: dra.REASON_CLAIM_NOT_ALLOCATABLE,
    _IN_FLIGHT: dra.REASON_CLAIM_IN_FLIGHT,
}


@dataclass(frozen=True, slots=True, eq=False)
class _Fast:
    """A greedy claim pod's plans on ``names`` from :class:`dra.GreedyTable` masks: the
    same verdicts and devices :meth:`DraRouter.plans` gives node by node.

    Attributes:
        names: the nodes asked about.
        code: verdict code per name (``_OK`` ...; ``_SEARCH``: see ``searched``).
        trows: table row per name (-1: the node has no candidates).
        sidx: snapshot index per name (-1: unknown node).
        free: free candidate bits per name (0 where not looked at).
        sel: the first fit's candidate bits per name (0 where none).
        table: the request form's table.
        searched: name -> plan, for names the masks cannot answer (``_SEARCH``).
    """

    names: Sequence[str]
    code: np.ndarray
    trows: np.ndarray
    sidx: np.ndarray
    free: np.ndarray
    sel: np.ndarray
    table: dra.GreedyTable
    searched: Mapping[str, dra.PodPlan]
    count: int
    sig: np.ndarray | None = None
    """A constrained request's: signature per table row (``dra.constraint_signatures``);
    None for a greedy one."""
    sigs: tuple[tuple[int, ...], ...] = ()

    def first_fit(self, free: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chosen candidate bits, solved) of the first fit on table ``rows`` with the
        candidates ``free`` may take: the first free ones of a greedy request, the
        search's answer (``dra.constrained_masks``) of a constrained one (not solved
        where the search would run out of budget, too)."""
        if self.sig is None:
            return dra.first_free_masks(free, self.count)
        sel, status = dra.constrained_masks(
            free, self.sig[rows], self.sigs, self.count, self.table.gpu.shape[1]
        )
        return sel, status == dra.FIT_FEASIBLE


class DraRouter:
    """Filter / prioritize for claim pods over the cache's snapshot.

    Args:
        cache: the cluster cache (its snapshot carries the DRA objects).
        clock: monotonic seconds.
        picks_ttl_s: see :data:`PICKS_TTL_S`.
        recent_s: see :data:`RECENT_S`.
        bound_domain_s: see :data:`BOUND_DOMAIN_S`.
    """

    def __init__(
        self,
        cache: ClusterCache,
        clock: Callable[[], float] = time.monotonic,
        picks_ttl_s: float = PICKS_TTL_S,
        recent_s: float = RECENT_S,
        bound_domain_s: float = BOUND_DOMAIN_S,
    ) -> None:
        self.cache = cache
        self._clock = clock
        self.picks_ttl_s = picks_ttl_s
        self.recent_s = recent_s
        self._recent: dict[str, tuple[float, frozenset[dra.DeviceId]]] = {}
        self._uncounted: dict[str, frozenset[dra.DeviceId]] = {}
        self._held_off: dict[str, float] = {}  # pod -> when the window that refused it ends
        self._adopt: dict[str, float] = {}  # pod -> until when the allocator may allocate it
        self.on_adopt: Callable[[], None] | None = None
        """Called when a pod is handed to the allocator (:meth:`adopted`; its wake)."""
        self._recent_memo: tuple[tuple[Any, ...], frozenset[dra.DeviceId], Mapping[Any, Any]] = (
            (),
            frozenset(),
            EMPTY_MAP,
        )
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
        self.vectorized = True
        """Answer claim pods of one ``ExactCount`` request (with or without capacity
        requests and ``matchAttribute`` constraints) with :class:`dra.GreedyTable` masks
        over every node at once (False: node by node; the answers are the same,
        ``tests/dra/test_vectorized.py`` and its siblings)."""
        # per inventory: request form -> table; (table, held, recent) -> held bits;
        # (table, flying) -> bits; names -> (rows, snapshot indices); snapshot nodes -> columns
        self._tables: tuple[Any, dict[Any, dra.GreedyTable]] | None = None
        self._bits_memo: dict[tuple[int, str], tuple[Any, Any, np.ndarray]] = {}
        self._cap_memo: dict[Any, Any] = {}
        self._sig_memo: dict[Any, tuple[Any, np.ndarray, tuple[tuple[int, ...], ...]]] = {}
        # the last claim pod prepared: (its claim objects, complete, classes, inventory, prep)
        self._prep_memo: tuple[tuple[Any, ...], bool, Any, Any, dra.ClaimPod] | None = None
        self._row_of_index: dict[int, tuple[Any, Any, np.ndarray]] = {}
        self._columns: tuple[Any, tuple[Any, ...]] | None = None
        # pod -> (table, rows, bits): its first fit's candidate bits on those rows (only
        # the rows it has picks on: most pods keep one node after ``best``)
        self._mask_picks: dict[str, tuple[dra.GreedyTable, np.ndarray, np.ndarray]] = {}
        self._last_fast: tuple[Any, Any, _Fast] | None = None
        self._expired_with: Any = None  # the claims the picks were last checked against
        self._expire_checked: set[str] = set()
        self._extended_picks: dict[str, ExtendedPick] = {}
        self.reallocate: Callable[[str, str], str] | None = None
        """Gives a chosen pod's special claim topoplace's devices at bind
        (``GateAllocator.reallocate``, set where the allocator runs)."""
        self.check_bind: BindCheck | None = None
        """Checks at bind the claims kube-scheduler allocated for a pod against the devices
        topoplace allocated (``GateAllocator.check_bind``, set by the allocator itself)."""
        self._own_memo: tuple[Any, Any, Mapping[str, Mapping[Any, str]], frozenset[str]] | None = (
            None
        )
        self._consumed_memo: tuple[Any, dra.Consumed, Mapping[str, Any]] | None = None
        self._over_memo: tuple[Any, tuple[dra.Overcommit, ...]] = (None, ())
        self._over_seen: set[tuple[Any, ...]] = set()
        self.bound_domain_s = bound_domain_s
        """How long a ComputeDomain pod's bind counts for its node (:meth:`bound_domains`):
        well past the watch's lag behind kube-scheduler's PreBind writes."""
        self._bound_domains: dict[str, tuple[float, str, str]] = {}  # pod -> (until, node, domain)

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Entries of each of the router's stores, with its cap (None: bounded by the
        pods in flight and their windows, or by the request forms of one inventory):
        ``/v1/inspect/state``."""
        inv = self._inv_memo
        tables = self._tables
        with self._lock:
            return {
                "recent": (len(self._recent), None),
                "uncounted": (len(self._uncounted), None),
                "held_off": (len(self._held_off), None),
                "adopt": (len(self._adopt), None),
                "picks": (len(self._picks), None),
                "pick_counts": (len(self._pick_counts), None),
                "mask_picks": (len(self._mask_picks), None),
                "extended_picks": (len(self._extended_picks), None),
                "bound_domains": (len(self._bound_domains), None),
                "overcommits_logged": (len(self._over_seen), None),
                "candidates_memo": (0 if inv is None else len(inv[1]), CANDIDATES_MEMO_MAX),
                "tables": (0 if tables is None else len(tables[1]), None),
                "bits_memo": (len(self._bits_memo), None),
                "capacity_memo": (len(self._cap_memo), 64),
                "signature_memo": (len(self._sig_memo), 32),
                "rows_memo": (len(self._row_of_index), 8),
            }

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

    def before_bind(
        self, key: str, node: str, pod: Mapping[str, Any] | None = None, uid: str = ""
    ) -> str:
        """Called by bind before the Binding of pod ``key`` (whose ``nvidia.com/gpu`` DRA
        backs) to ``node`` is written: for a pod topoplace chose devices for,
        :attr:`reallocate` gives them to its claim; for any other, the special claim
        kube-scheduler made is checked as :meth:`before_bind_claims` checks claims.
        Returns "" or an error (the bind then fails)."""
        if self.reallocate is not None and self.extended_pick(key) is not None:
            return self.reallocate(key, node)
        return self._check_bind(key, pod or {}, node, uid, extended=True)

    def before_bind_claims(self, key: str, pod: Mapping[str, Any], node: str, uid: str) -> str:
        """Called by bind before the Binding of claim pod ``key`` to ``node`` is written.

        kube-scheduler wrote the pod's claim allocations in its PreBind, from its own view
        of the cluster. Where that view lacked an allocation topoplace had written (its
        informer behind, or its scheduling cycle begun before the write), both name a
        device. topoplace checks its own allocations after writing them, but a PreBind
        that comes after that check is seen only here: every claim of the pod that
        kube-scheduler allocated is read from the API and compared with the devices
        topoplace allocated or holds on ``node`` (:meth:`own_devices`; topoplace holds a
        device in its ledger before it writes it, so an allocation of topoplace's that
        came first is always known here). On a conflict the claim's allocation is removed
        (nothing runs the pod yet) and the bind fails: kube-scheduler allocates again
        from a view that has topoplace's. Without any device of topoplace's on ``node``
        nothing is read. Returns "" or an error.

        A pod of a ComputeDomain that passes makes ``node`` count as serving its domain
        for :attr:`bound_domain_s` seconds (:meth:`bound_domains`), before topoplace's watch
        shows the claims kube-scheduler allocated."""
        err = self._check_bind(key, pod, node, uid, extended=False)
        if not err:
            claims = self.cache.snapshot().extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
            domain = dra.pod_compute_domain(pod, claims)
            if domain and self.bound_domain_s > 0:
                with self._lock:
                    self._bound_domains[key] = (self._clock() + self.bound_domain_s, node, domain)
        return err

    def bound_domains(self) -> Mapping[str, frozenset[str]]:
        """node -> the ComputeDomains of the claim pods topoplace was asked to bind there in
        the last :attr:`bound_domain_s` seconds. kube-scheduler wrote their claims'
        allocations in PreBind, but topoplace's watch may not show them yet: until it
        does, only these records tell that the node serves the domain (a pod of another
        domain filtered meanwhile would otherwise pass there)."""
        if not self._bound_domains:
            return EMPTY_MAP
        now = self._clock()
        out: dict[str, set[str]] = {}
        with self._lock:
            for k, (deadline, node, domain) in list(self._bound_domains.items()):
                if deadline < now:
                    del self._bound_domains[k]
                else:
                    out.setdefault(node, set()).add(domain)
        return {n: frozenset(v) for n, v in out.items()}

    def _check_bind(
        self, key: str, pod: Mapping[str, Any], node: str, uid: str, extended: bool
    ) -> str:
        if self.check_bind is None:
            return ""
        own = self.own_devices(node)
        if not own and not self._shares_on(node):
            return ""
        return self.check_bind(key, pod, node, uid, own, extended)

    def _shares_on(self, node: str) -> bool:
        """True if topoplace allocated a share of a shared device on ``node`` (an allocated
        claim it marked, or one of its allocations being written): the bind check must then
        read kube-scheduler's claims for the pod, whose shares may take that device past its
        capacity (:meth:`own_devices` leaves shares out: a share is no clash by itself).
        Read from the memo :meth:`own_devices` keeps (call it first)."""
        memo = self._own_memo
        return memo is not None and node in memo[3]

    def own_devices(self, node: str) -> Mapping[dra.DeviceId, str]:
        """Devices on ``node`` that topoplace allocated (claims marked
        ``topoplace.io/allocated-by``) or holds (its assumed holdings: allocations being
        written, devices chosen for gated ``nvidia.com/gpu`` pods), and those
        kube-scheduler no longer counts (:meth:`note_uncounted`), each with its claim key.
        Made once per (claims, pods) of the snapshot."""
        snap = self.cache.snapshot()
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        memo = self._own_memo
        if memo is None or memo[0] is not claims or memo[1] is not snap.pods:
            by_node: dict[str, dict[Any, str]] = {}
            shared: set[str] = set()  # nodes where topoplace holds a share (:meth:`_shares_on`)
            values = claims.values() if isinstance(claims, Mapping) else claims
            for c in values:
                if dra.allocated_by_topoplace(c) and dra.is_allocated(c):
                    at = dra.allocation_node(c)
                    mine = by_node.setdefault(at, {})
                    for i in dra.exclusive_ids(c):  # a share of a shared device is no clash
                        mine[i] = dra.object_key(c)
                    if dra.shared_results(c):
                        shared.add(at)
            for k, p in snap.pods.items():
                if p.assumed and k.startswith(dra.HOLDER_PREFIX) and p.raw:
                    mine = by_node.setdefault(p.node, {})
                    for i in dra.exclusive_ids(p.raw):
                        mine[i] = k[len(dra.HOLDER_PREFIX) :]
                    if dra.shared_results(p.raw):
                        shared.add(p.node)
            inv = self.cache.dra_inventory(snap)
            for k, ids in self.uncounted().items():
                for i in ids:
                    d = inv.by_id.get(i)
                    if d is not None:
                        by_node.setdefault(d.node, {})[i] = k
            memo = (claims, snap.pods, by_node, frozenset(shared))
            self._own_memo = memo
        return memo[2].get(node, EMPTY_MAP)

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

    def note_written(self, claim_key: str, ids: Sequence[dra.DeviceId]) -> None:
        """topoplace has just written an allocation of ``ids`` for claim ``claim_key``: for
        :attr:`recent_s` seconds they count as in flight (:data:`RECENT_S`)."""
        if self.recent_s > 0 and ids:
            with self._lock:
                self._recent[claim_key] = (self._clock() + self.recent_s, frozenset(ids))

    def _note_held_off(self, key: str, out: FilterOutcome) -> None:
        """Pod ``key`` got no node and some were refused only for devices topoplace is
        writing or wrote recently: it is due a wake (:meth:`due_wakes`) when the window of
        recent writes ends, or :data:`HELD_OFF_RETRY_S` from now when no window is open
        (devices of allocations still being written, or ones kube-scheduler no longer
        counts), since kube-scheduler parks a pod only an extender refused until an event
        it may never see."""
        if out.feasible or dra.REASON_CLAIM_IN_FLIGHT not in out.failed.values():
            self._held_off.pop(key, None)
            if out.feasible and self._adopt:
                with self._lock:
                    self._adopt.pop(key, None)
            return
        now = self._clock()
        ends = [d for d, _ in self._recent.values()]
        due = max(ends) + 0.1 if ends else now + HELD_OFF_RETRY_S
        adopt = bool(self._uncounted) and bool(self.uncounted())
        with self._lock:
            self._held_off[key] = due
            if adopt:
                fresh = key not in self._adopt
                self._adopt[key] = now + ADOPT_S
        if adopt and fresh:
            log.info(
                "claim pod %s is refused on every node left to it while kube-scheduler "
                "no longer counts devices %s: topoplace's allocator allocates its claims",
                key,
                sorted(i for ids in self._uncounted.values() for i in ids),
            )
            if self.on_adopt is not None:
                self.on_adopt()

    def adopted(self) -> frozenset[str]:
        """Claim pods without the gate that topoplace's allocator allocates itself: every
        node left to them was refused (``REASON_CLAIM_IN_FLIGHT``) while some devices are
        ones kube-scheduler no longer counts (:meth:`note_uncounted`). kube-scheduler's
        first fit would keep landing on those devices, and the pod would wait for as long
        as the claim holding them lives (a pod pinned to the node, or every other node
        full). The allocator gives its claims free devices topoplace counts; the pod keeps
        no gate, and kube-scheduler then only reserves the allocation. Each stays
        :data:`ADOPT_S` after its last such refusal."""
        if not self._adopt:
            return frozenset()
        now = self._clock()
        with self._lock:
            for k, until in list(self._adopt.items()):
                if until < now:
                    del self._adopt[k]
            return frozenset(self._adopt)

    def drop_adopted(self, key: str) -> None:
        """Pod ``key`` is allocated (or gone): :meth:`adopted` no longer has it."""
        if self._adopt:
            with self._lock:
                self._adopt.pop(key, None)

    def due_wakes(self) -> list[str]:
        """Pods refused by a window that has ended since (see :meth:`_note_held_off`),
        each once, in key order."""
        if not self._held_off:
            return []
        now = self._clock()
        with self._lock:
            due = sorted(k for k, t in self._held_off.items() if t <= now)
            for k in due:
                del self._held_off[k]
        return due

    def note_uncounted(self, claim_key: str, ids: Sequence[dra.DeviceId]) -> None:
        """Claim ``claim_key`` holds ``ids``, but kube-scheduler no longer counts them as
        allocated: they were in two claims, and the other one gave them back (its set of
        allocated devices then drops them, whoever still holds them; a claim in use cannot
        be written again to make it count them). Until that claim's allocation goes,
        claim pods' first fit is predicted without them and a node where it would take one
        is refused, and a bind of a claim kube-scheduler gave one of them fails
        (:meth:`own_devices`)."""
        if ids:
            with self._lock:
                self._uncounted[claim_key] = frozenset(ids)
                self._own_memo = None

    def counted_again(self, claim_key: str) -> None:
        """Claim ``claim_key``'s allocation was written again: kube-scheduler counts its
        devices again (:meth:`note_uncounted` no longer holds)."""
        with self._lock:
            if self._uncounted.pop(claim_key, None) is not None:
                self._own_memo = None

    def uncounted(self) -> Mapping[str, frozenset[dra.DeviceId]]:
        """:meth:`note_uncounted`'s claims still allocated with those devices."""
        if not self._uncounted:
            return EMPTY_MAP
        claims = self.cache.snapshot().extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        with self._lock:
            for k, ids in list(self._uncounted.items()):
                c = claims.get(k) if isinstance(claims, Mapping) else None
                if c is None or not ids & set(dra.allocated_ids(c)):
                    del self._uncounted[k]
                    self._own_memo = None
            return dict(self._uncounted)

    def recent(self) -> tuple[frozenset[dra.DeviceId], Mapping[Any, frozenset[dra.DeviceId]]]:
        """(devices kube-scheduler may not count as allocated: those topoplace wrote in
        the last :attr:`recent_s` seconds and :meth:`uncounted` ones; the same by (driver,
        pool)); the same objects while that set is unchanged."""
        if not self._recent and not self._uncounted:
            return frozenset(), EMPTY_MAP
        now = self._clock()
        lost = self.uncounted()
        with self._lock:
            for k, (deadline, _) in list(self._recent.items()):
                if deadline < now:
                    del self._recent[k]
            key = (
                tuple(sorted((k, v[0]) for k, v in self._recent.items())),
                tuple(sorted(lost)),
            )
            memo = self._recent_memo
            if memo[0] != key:
                ids = frozenset().union(*(v[1] for v in self._recent.values()), *lost.values())
                memo = (key, ids, _grouped(ids))
                self._recent_memo = memo
        return memo[1], memo[2]

    def consumed(self, snap: ClusterSnapshot | None = None) -> dra.Consumed:
        """What allocated claims consume of shared devices (``dra.consumed_by_device``),
        made once per claims object."""
        return self._consumed(snap or self.cache.snapshot())[0]

    def _consumed(self, snap: ClusterSnapshot) -> tuple[dra.Consumed, Mapping[str, Any]]:
        """(:meth:`consumed`, node -> a key of its devices' consumption)."""
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        memo = self._consumed_memo
        if memo is None or memo[0] is not claims:
            values = claims.values() if isinstance(claims, Mapping) else claims
            got = dra.consumed_by_device(values)
            inv = self.cache.dra_inventory(snap)
            per: dict[str, list[Any]] = {}
            for did in sorted(got):
                d = inv.by_id.get(did)
                if d is not None:
                    per.setdefault(d.node, []).append((did, tuple(sorted(got[did].items()))))
            memo = (claims, MappingProxyType(got), {n: tuple(v) for n, v in per.items()})
            self._consumed_memo = memo
        return memo[1], memo[2]

    def overcommits(self) -> tuple[dra.Overcommit, ...]:
        """Shared devices whose allocated claims consume more than their capacity, whoever
        allocated them (``dra.overcommits``); each is logged once while it lasts (one
        that ends and comes back is logged again, so the set of those logged stays as
        small as the overcommits of now). Made once per claims object."""
        snap = self.cache.snapshot()
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        memo = self._over_memo
        if memo[0] is not claims:
            values = claims.values() if isinstance(claims, Mapping) else claims
            got = tuple(dra.overcommits(values, self.cache.dra_inventory(snap)))
            now = {(o.device, o.capacity, o.consumed, o.claims): o for o in got}
            seen, self._over_seen = self._over_seen, set(now)  # only those that last
            for k, o in now.items():
                if k not in seen:
                    log.warning(
                        "shared device %s is overcommitted: %s %d of %d by claims %s",
                        "/".join(o.device),
                        o.capacity,
                        o.consumed,
                        o.value,
                        ", ".join(o.claims),
                    )
            memo = (claims, got)
            self._over_memo = memo
        return memo[1]

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
        """One plan per name (unknown nodes, unhealthy and cordoned nodes refused; every
        node, :data:`REASON_CLAIMS_NOT_SEEN`, while a claim the pod names is not in the
        cache); ``also_held``: devices to count as taken besides allocated claims.

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
        recent, recent_pools = self.recent()
        if recent:  # kube-scheduler may not count them yet: predicted without, refused on
            flying = flying | recent
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        own, complete = dra.pod_claims(pod, claims)
        if not complete:  # neither its devices nor its ComputeDomain can be told
            return [dra.PodPlan(n, dra.UNKNOWN, (), REASON_CLAIMS_NOT_SEEN) for n in names]
        basis = (_pod_identity(pod), inv, snap.extra.get(dra.CLASSES_KEY), flying, complete)
        last = self._last_plans
        known: Mapping[str, tuple[dra.PodPlan, Any]] = EMPTY_MAP
        if extended:
            basis = (*basis[:4], (basis[4], tuple(sorted(extended.items()))))
        if not also_held and last is not None and _same_basis(last[0], basis, last[1], own):
            known = last[2]
        by_pool = self._by_pool(held)
        consumed, consumed_at = self._consumed(snap)
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
            for n, ds in self.bound_domains().items():  # bound, the watch not showing it yet
                serving[n] = serving.get(n, frozenset()) | ds
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
                if recent_pools and any(p in recent_pools for p in mine):
                    busy = busy - frozenset().union(*(recent_pools.get(p, ()) for p in mine))
                if consumed_at:  # shares of the node's shared devices: read by its plan too
                    busy = (busy, consumed_at.get(name, ()))
                prev = known.get(name)  # a plan reads the node's held devices, not the node
                if prev is not None and prev[1] == busy:
                    plan = prev[0]
                else:
                    if prep is None:
                        prep = self._prepared(pod, inv, snap, extended)
                    held_here = busy[0] if consumed_at else busy
                    plan = dra.plan_prepared(
                        prep, name, inv, held_here, flying, candidates, consumed
                    )
            out.append(plan)
            made[name] = (plan, busy)
        if not also_held and not domain:
            self._last_plans = (basis, tuple(own), made)
        return out

    def _prepared(
        self,
        pod: Mapping[str, Any],
        inv: dra.Inventory,
        snap: ClusterSnapshot,
        extended: Mapping[str, str] | None,
    ) -> dra.ClaimPod:
        """``dra.prepare_claim_pod`` (``prepare_extended_pod`` with ``extended``); the
        former kept for the last pod while its claim objects, the classes and the
        inventory are the same objects (prioritize follows filter for the same pod)."""
        if extended:
            return dra.prepare_extended_pod(pod, inv, snap.extra, extended)
        own, complete = dra.pod_claims(pod, snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP)
        classes = snap.extra.get(dra.CLASSES_KEY)
        memo = self._prep_memo
        if (
            memo is not None
            and memo[1] == complete
            and memo[2] is classes
            and memo[3] is inv
            and len(memo[0]) == len(own)
            and all(a is b for a, b in zip(memo[0], own, strict=True))
        ):
            return memo[4]
        prep = dra.prepare_claim_pod(pod, inv, snap.extra)
        self._prep_memo = (tuple(own), complete, classes, inv, prep)
        return prep

    # ---- greedy claim pods on every node at once --------------------------------------------

    def _table(
        self, inv: dra.Inventory, entry: dra.FitEntry, capacity: bool = False
    ) -> dra.GreedyTable:
        """The :class:`dra.GreedyTable` of ``entry``'s request form over every DRA node,
        made once per inventory (``capacity``: with the candidates' capacities)."""
        memo = self._tables
        if memo is None or memo[0] is not inv:
            memo = (inv, {})
            self._tables = memo
            self._bits_memo.clear()
            self._cap_memo.clear()
            self._sig_memo.clear()
        key = ("capacity", entry.key) if capacity else entry.key
        table = memo[1].get(key)
        if table is None:
            devices = inv.by_node
            table = dra.greedy_table(
                tuple(devices),
                lambda n: dra.request_candidates(devices.get(n, ()), entry),
                capacity,
            )
            memo[1][key] = table
        return table

    def _signatures(
        self, table: dra.GreedyTable, attrs: tuple[str, ...]
    ) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
        """``dra.constraint_signatures(table, attrs)``, made once per (table, attrs)."""
        key = (id(table), attrs)
        got = self._sig_memo.get(key)
        if got is None or got[0] is not table:
            got = (table, *dra.constraint_signatures(table, attrs))
            if len(self._sig_memo) >= 32:
                self._sig_memo.clear()
            self._sig_memo[key] = got
        return got[1], got[2]

    def _has_capacity(self, inv: dra.Inventory) -> bool:
        """Whether ``inv`` has a shared device or one with a request policy (then every
        greedy request takes the capacity masks), once per inventory."""
        got = self._cap_memo.get("inventory")
        if got is None or got[0] is not inv:
            got = (inv, any(not d.plain for d in inv.by_id.values()))
            self._cap_memo["inventory"] = got
        return bool(got[1])

    def _fit_bits(
        self, table: dra.GreedyTable, requests: tuple[tuple[str, int], ...], snap: ClusterSnapshot
    ) -> np.ndarray:
        """Per row of a capacity table, the candidates a request of capacity ``requests``
        fits beside what allocated claims consume (``dra.capacity_fit_masks``): the
        request's consumption once per (table, requests), the claims' per (table, claims)."""
        consumed = self.consumed(snap)
        k_take = (id(table), "take", requests)
        got = self._cap_memo.get(k_take)
        if got is None or got[0] is not table:
            got = (table, table.cap.take(requests) if table.cap is not None else None)
            self._cap_memo[k_take] = got
        take, bad = got[1]
        k_used = (id(table), "used")
        used = self._cap_memo.get(k_used)
        if used is None or used[0] is not table or used[1] is not consumed:
            used = (table, consumed, dra.capacity_used(table, consumed) if consumed else None)
            self._cap_memo[k_used] = used
        k_fit = (id(table), "fit", requests)
        fit = self._cap_memo.get(k_fit)
        if fit is None or fit[0] is not table or fit[1] is not consumed:
            fit = (table, consumed, dra.capacity_fit_masks(table, take, bad, used[2]))
            self._cap_memo[k_fit] = fit
        if len(self._cap_memo) > 64:
            self._cap_memo.clear()
        return fit[2]

    def _bits(self, table: dra.GreedyTable, what: str, ids: frozenset[Any]) -> np.ndarray:
        """``table.id_masks(ids)``, made once per (table, what, ids object)."""
        key = (id(table), what)
        got = self._bits_memo.get(key)
        if got is None or got[0] is not table or got[1] is not ids:
            got = (table, ids, table.id_masks(ids))
            self._bits_memo[key] = got
        return got[2]

    def _rows(
        self, table: dra.GreedyTable, snap: ClusterSnapshot, names: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(table row, snapshot index) of each name (-1: none; a name the snapshot does
        not know has no row either: it is refused as unknown). Snapshot indices come from
        ``schedule.name_positions`` (a list from the wire layer knows them from the
        request bytes; another is looked up once per list), rows from them by an array
        made once per (table, snapshot nodes)."""
        index = snap.index
        by_index = self._row_of_index.get(id(table))
        if by_index is None or by_index[0] is not table or by_index[1] is not index:
            arr = np.full(len(index) + 1, -1, np.int64)  # the last: for index -1
            rows = table.row
            for name, i in index.items():
                arr[i] = rows.get(name, -1)
            arr.setflags(write=False)
            by_index = (table, index, arr)
            if len(self._row_of_index) >= 8:
                self._row_of_index.clear()
            self._row_of_index[id(table)] = by_index
        sidx = name_positions(snap, names)
        return by_index[2][sidx], sidx

    def _fast(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str],
        extended: Mapping[str, str] | None = None,
    ) -> _Fast | None:
        """The plans of a claim pod of one request on ``names`` by masks, or None when the
        pod is not one (several requests, ``All``, ``distinctAttribute``, allocated or
        pinned claims, a ComputeDomain, ...): then :meth:`plans` answers node by node.
        Nodes the masks cannot answer (too many candidates, counters, a constrained
        search past its budget) are planned node by node (``searched``)."""
        if not self.vectorized or not names:
            return None
        snap = self.cache.snapshot()
        inv = self.cache.dra_inventory(snap)
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        if dra.pod_compute_domain(pod, claims):
            return None
        prep = self._prepared(pod, inv, snap, extended)
        if prep.pins or prep.holdings or not prep.complete or prep.pending is None:
            return None
        entry = prep.pending.greedy
        capacity = False
        attrs: tuple[str, ...] | None = None
        if entry is None or self._has_capacity(inv):
            # capacity requests, or shared devices / request policies in the cluster:
            # masks of what fits
            entry = prep.pending.capacity_greedy
            capacity = entry is not None and entry.request is not None
        if entry is None and prep.pending.constrained is not None:
            # matchAttribute constraints: the search's answer per distinct (candidates'
            # attribute values, free candidates), on every node at once
            entry, attrs = prep.pending.constrained
            capacity = self._has_capacity(inv) or bool(entry.request and entry.request.capacity)
        if entry is None or entry.count < 1:
            return None
        table = self._table(inv, entry, capacity)
        held, flying = self._held(snap)
        recent, _ = self.recent()
        if recent:
            flying = flying | recent
        held_bits = self._bits(table, "held", held)
        if recent:
            held_bits = held_bits & ~self._bits(table, "recent", recent)
        trows, sidx = self._rows(table, snap, names)
        n = len(names)
        code = np.full(n, _NO_FIT, dtype=np.int8)
        arrays = snap.arrays
        known = sidx >= 0
        at = np.where(known, sidx, 0)
        state = np.where(known, arrays.state[at], 0)
        cordoned = np.where(known, arrays.unschedulable[at], False)
        has = trows >= 0
        tr = np.where(has, trows, 0)
        exact = has & table.exact[tr]
        free = np.where(exact, table.full[tr] & ~held_bits[tr], 0)
        if capacity and entry.request is not None:
            free &= self._fit_bits(table, entry.request.capacity, snap)[tr]
        sig: np.ndarray | None = None
        sigs: tuple[tuple[int, ...], ...] = ()
        if attrs is None:
            sel, ok = dra.first_free_masks(free, entry.count)
            unsolved = None
        else:
            sig, sigs = self._signatures(table, attrs)
            width = table.gpu.shape[1]
            sel, status = dra.constrained_masks(free, sig[tr], sigs, entry.count, width)
            ok = status == dra.FIT_FEASIBLE
            unsolved = status == dra.FIT_UNKNOWN  # past the search's budget: node by node
        sel = np.where(ok & exact, sel, 0)
        code[ok & exact] = _OK
        if flying:
            hit = (sel & self._bits(table, "flying", flying)[tr]) != 0
            code[hit & (code == _OK)] = _IN_FLIGHT
        code[has & ~exact] = _SEARCH
        if unsolved is not None:
            code[has & unsolved] = _SEARCH
        code[cordoned.astype(bool)] = _CORDONED
        code[state >= int(Health.UNHEALTHY)] = _UNHEALTHY
        code[~known] = _UNKNOWN_NODE
        searched: Mapping[str, dra.PodPlan] = EMPTY_MAP
        slow = np.flatnonzero(code == _SEARCH)
        if len(slow):
            few = [names[i] for i in slow]
            searched = {p.node: p for p in self.plans(pod, few, extended=extended)}
        return _Fast(names, code, trows, sidx, free, sel, table, searched, entry.count, sig, sigs)

    def _fast_verdicts(self, fast: _Fast) -> tuple[tuple[str, ...], dict[str, str], dict[str, str]]:
        """(feasible names in order, "not now" reasons, "never" reasons) of ``fast``."""
        names, code = fast.names, fast.code
        snap = self.cache.snapshot()
        feasible: list[str] = []
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        if not (code != _OK).any():
            return tuple(names), failed, never
        for i in range(len(names)):
            c = int(code[i])
            name = names[i]
            if c == _OK:
                feasible.append(name)
            elif c == _SEARCH:
                p = fast.searched[name]
                if not p.verdict:
                    feasible.append(name)
                elif p.never:
                    never[name] = p.verdict
                else:
                    failed[name] = p.verdict
            elif c == _UNHEALTHY:
                node = snap.node(name)
                reasons = node.health.reasons if node is not None else ()
                never[name] = reasons[0] if reasons else "node unhealthy"
            else:
                failed[name] = _REASONS[c]
        return tuple(feasible), failed, never

    def _fast_filter(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str],
        extended: Mapping[str, str] | None,
    ) -> FilterOutcome | None:
        """:meth:`filter` for a greedy claim pod, by masks (None: not one)."""
        fast = self._fast(pod, names, extended)
        if fast is None:
            return None
        feasible, failed, never = self._fast_verdicts(fast)
        self._last_fast = (_pod_identity(pod), self.cache.snapshot(), fast)
        table = fast.table
        ok = fast.code == _OK
        picks = np.zeros(len(table.nodes), dtype=np.int64)
        picks[fast.trows[ok]] = fast.sel[ok]
        ids: set[dra.DeviceId] = set()
        key = object_key(pod)
        slow = [p for p in fast.searched.values() if not p.verdict]
        for p in slow:
            ids.update(d.id for c in p.prediction.devices for d in c)
        if slow:  # as :meth:`filter` does node by node
            more = self.likely_kube_picks(exclude=key)
            redo = [p.node for p in slow if not dra.first_fit_stands(p.prediction, more)]
            if more and redo:
                for p in self.plans(pod, redo, more, extended):
                    ids.update(d.id for c in p.prediction.devices for d in c)
        others = self._others_bits(table, key)
        if others is not None and table.cap is not None:
            others = others & ~table.cap.shared_bits  # a share holds capacity, not the device
        if others is not None and ok.any():
            tr = fast.trows[ok]
            moved = (fast.sel[ok] & others[tr]) != 0
            if moved.any():
                # kube-scheduler counts the devices of pods it filtered before this one too:
                # where the first fit took one of those, it lands past them (as plans with
                # ``also_held``; flying devices do not change the first fit)
                rows = tr[moved]
                sel2, ok2 = fast.first_fit(fast.free[ok][moved] & ~others[rows], rows)
                picks[rows[ok2]] |= sel2[ok2]
        with self._lock:
            self._drop_picks(key)
            at = np.flatnonzero(picks)
            if len(at):
                self._mask_picks[key] = (table, at, picks[at])
            if ids or key in self._mask_picks:
                frozen = frozenset(ids)
                self._picks[key] = (self._clock() + self.picks_ttl_s, frozen)
                self._pick_counts.update(frozen)
        return FilterOutcome(feasible, MappingProxyType(failed), MappingProxyType(never))

    def _others_bits(self, table: dra.GreedyTable, exclude: str) -> np.ndarray | None:
        """The candidate bits of ``table`` that claim pods filtered before (but
        ``exclude``) may get from kube-scheduler now (:meth:`likely_kube_picks`), or None
        when there are none. Costs the rows those pods have picks on, not a table's rows
        per pod."""
        self._expire_picks()
        with self._lock:
            parts = [
                (r, b) for k, (t, r, b) in self._mask_picks.items() if k != exclude and t is table
            ]
            other_tables = any(
                k != exclude and t is not table for k, (t, _, _) in self._mask_picks.items()
            )
            counts = self._pick_counts
            mine = self._picks.get(exclude)
            ids = [i for i, c in counts.items() if c > 1 or mine is None or i not in mine[1]]
        if other_tables:  # another request form's picks: their devices, as ids
            ids += list(self._mask_pick_ids(lambda t: t is not table, exclude))
        if not parts and not ids:
            return None
        out = np.zeros(len(table.nodes), np.int64)
        few = [(r, b) for r, b in parts if len(r) <= 64]  # narrowed to a node or a few
        for r, b in parts:
            if len(r) > 64:  # a pod's picks on many nodes: its rows are distinct
                out[r] |= b
        if len(few) == 1:
            out[few[0][0]] |= few[0][1]
        elif few:
            rows = np.concatenate([r for r, _ in few])
            bits = np.concatenate([b for _, b in few])
            np.bitwise_or.at(out, rows, bits)
        if ids:
            out = out | table.id_masks(ids)
        return out

    def _mask_pick_ids(self, which: Callable[[dra.GreedyTable], bool], exclude: str) -> set[Any]:
        """The device ids of the mask picks of tables ``which`` accepts, but ``exclude``'s."""
        with self._lock:
            recs = [
                (t, r, b) for k, (t, r, b) in self._mask_picks.items() if k != exclude and which(t)
            ]
        out: set[Any] = set()
        for t, rows, bits in recs:
            for r, m in zip(rows.tolist(), bits.tolist(), strict=True):
                out.update(d.id for d in t.devices(r, m))
        return out

    def _fast_scores(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str],
        extended: Mapping[str, str] | None = None,
    ) -> list[int] | None:
        """``dra.plan_scores`` of the plans of a greedy claim pod, by masks (None: not
        one). The same numbers: the same float operations in the same order."""
        fast = self._fast(pod, names, extended)
        if fast is None:
            return None
        return self._scores_of(fast)[0].tolist()

    def _scores_of(self, fast: _Fast) -> tuple[np.ndarray, int]:
        """(``dra.plan_scores`` of ``fast``'s plans (see :meth:`_fast_scores`), the
        position of the one scored 10, -1 when none is)."""
        names = fast.names
        snap = self.cache.snapshot()
        shape_id, cap, used, health, shapes = self._node_columns(snap)
        code = fast.code
        live = code == _OK
        for name, p in fast.searched.items():
            if not p.verdict:
                live[names.index(name)] = True
        if not live.any():
            return np.zeros(len(names), dtype=np.int64), -1
        idx = np.flatnonzero(live)
        si = fast.sidx[idx]
        gm = np.zeros(len(idx), dtype=np.int64)
        okc = code[idx] == _OK
        gm[okc] = dra.gpu_masks(fast.table, fast.trows[idx][okc], fast.sel[idx][okc])
        for j in np.flatnonzero(~okc):  # searched: their plan's GPUs
            p = fast.searched[names[int(idx[j])]]
            gm[j] = sum(1 << g for g in p.gpus if 0 <= g < 63)
        sid = shape_id[si]
        gm &= self._shape_masks(shapes)[sid]  # GPUs the shape has (plan_value's "ok")
        bw = self._ring_values(shapes, sid, gm)
        c = cap[si]
        pack = np.where(c > 0, dra._popcount(used[si] | gm) / np.where(c > 0, c, 1), 0.0)
        top = float(bw.max()) or 1.0
        raw = 0.7 * bw / top + 0.2 * pack + 0.1 * health[si]
        # the best: highest round(raw, 9), then the first name (as plan_scores); Python's
        # round on each distinct value near the top, the names only of the tied
        # (snapshot nodes are sorted by name: the first name is the lowest index)
        near = np.flatnonzero(raw >= raw.max() - 1e-8)
        cand = raw[near]
        if cand.min() == cand.max():  # one value near the top (identical nodes): all tie
            tied = near
        else:
            values = {float(v): round(float(v), 9) for v in np.unique(cand)}
            top9 = max(values.values())
            tops = np.asarray([v for v, r in values.items() if r == top9], np.float64)
            tied = near[np.isin(cand, tops)]
        best = int(tied[np.argmin(si[tied])])
        out = np.zeros(len(names), dtype=np.int64)
        out[idx] = np.minimum(9, (10 * raw + 1e-9).astype(np.int64))
        out[idx[best]] = 10
        return out, int(idx[best])

    def _node_columns(
        self, snap: ClusterSnapshot
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[Any, ...]]:
        """Per snapshot node: (shape id, GPU capacity, used GPU bits, 1 - risk, shapes)."""
        memo = self._columns
        if memo is None or memo[0] is not snap.nodes:
            shapes: dict[Any, int] = {}
            sid, cap, used, health = [], [], [], []
            for n in snap.nodes:
                sid.append(shapes.setdefault(n.shape, len(shapes)))
                cap.append(int(n.gpu_capacity))
                used.append(n.used_mask)
                health.append(1.0 - float(n.health.risk))
            memo = (
                snap.nodes,
                (
                    np.asarray(sid, np.int64),
                    np.asarray(cap, np.int64),
                    np.asarray(used, np.int64),
                    np.asarray(health, np.float64),
                    tuple(shapes),
                ),
            )
            self._columns = memo
        return memo[1]

    @staticmethod
    def _shape_masks(shapes: tuple[Any, ...]) -> np.ndarray:
        return np.asarray([(1 << min(s.num_gpus, 63)) - 1 for s in shapes], np.int64)

    _RINGS: dict[tuple[Any, int], float] = {}

    def _ring_values(self, shapes: tuple[Any, ...], sid: np.ndarray, gm: np.ndarray) -> np.ndarray:
        """``ring_bottleneck`` of each (shape, GPU bits); 0 below two GPUs (one GPU per
        plan: no lookup at all)."""
        out = np.zeros(len(gm), np.float64)
        multi = np.flatnonzero(gm & (gm - 1))  # two GPUs or more
        if not len(multi):
            return out
        sid, gm = sid[multi], gm[multi]
        key = sid * (1 << 40) + gm if len(shapes) < (1 << 20) else None
        if key is None:
            out[multi] = [self._ring(shapes[int(a)], int(b)) for a, b in zip(sid, gm, strict=True)]
            return out
        uniq, inv = np.unique(key, return_inverse=True)
        vals = np.asarray(
            [self._ring(shapes[int(u) >> 40], int(u) & ((1 << 40) - 1)) for u in uniq],
            np.float64,
        )
        out[multi] = vals[inv]
        return out

    def _ring(self, shape: Any, mask: int) -> float:
        k = (shape, mask)
        v = DraRouter._RINGS.get(k)
        if v is None:
            gpus = dra.mask_bits(mask)
            v = ring_bottleneck(shape, gpus) if len(gpus) >= 2 else 0.0
            if len(DraRouter._RINGS) > 100_000:
                DraRouter._RINGS.clear()
            DraRouter._RINGS[k] = v
        return v

    def filter(
        self,
        pod: Mapping[str, Any],
        names: Sequence[str],
        extended: Mapping[str, str] | None = None,
    ) -> FilterOutcome:
        """Which of ``names`` the claim pod may use, and why not; remembers the feasible
        nodes' predicted devices (:meth:`likely_kube_picks`). ``extended``: as for
        :meth:`plans`."""
        quick = self._fast_filter(pod, names, extended)
        if quick is not None:
            self._note_held_off(object_key(pod), quick)
            return quick
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
        out = FilterOutcome(feasible, MappingProxyType(failed), MappingProxyType(never))
        self._note_held_off(key, out)
        return out

    def best(self, pod: Mapping[str, Any], names: Sequence[str]) -> str:
        """The node of ``names`` :meth:`prioritize` scores 10 ("" when none is feasible),
        and the pod's remembered picks (:meth:`likely_kube_picks`) narrowed to it: with
        one node left, kube-scheduler allocates there."""
        last = self._last_fast
        if last is not None and last[0] == _pod_identity(pod) and last[1] is self.cache.snapshot():
            # filter's plans of this pod on every node offered: the feasible ones are the
            # nodes scored, so the same scores as prioritize on them
            fast = last[2]
            at = self._scores_of(fast)[1]
            top = fast.names[at] if at >= 0 else ""
            if top not in names:
                top = next((n for n, v in self.prioritize(pod, names) if v == 10), "")
        else:
            top = next((n for n, v in self.prioritize(pod, names) if v == 10), "")
        key = object_key(pod)
        inv = self.cache.dra_inventory()
        with self._lock:
            mp = self._mask_picks.get(key)
            only: tuple[dra.GreedyTable, np.ndarray, np.ndarray] | None = None
            if mp is not None:
                table, rows, bits = mp
                r = table.row.get(top, -1)
                at = rows == r
                only = (table, rows[at], bits[at])
                self._mask_picks[key] = only
            old = self._picks.get(key)
            if old is not None:
                kept = frozenset(i for i in old[1] if getattr(inv.by_id.get(i), "node", "") == top)
                self._drop_picks(key)
                if only is not None:
                    self._mask_picks[key] = only
                self._picks[key] = (old[0], kept)
                self._pick_counts.update(kept)
        return top

    def _drop_picks(self, key: str) -> None:
        """Forget pod ``key``'s picks (under the lock)."""
        self._mask_picks.pop(key, None)
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
        quick = self._fast_scores(pod, names)
        if quick is not None:
            return list(zip(names, quick, strict=True))
        snap = self.cache.snapshot()
        plans = self.plans(pod, names)
        return list(zip(names, dra.plan_scores(plans, snap.node), strict=True))

    def _expire_picks(self) -> None:
        """Forget the picks of pods whose claims show allocated or that are bound, or
        older than :attr:`picks_ttl_s`."""
        if not self._picks:
            return
        now = self._clock()
        snap = self.cache.snapshot()
        claims = snap.extra.get(dra.CLAIMS_KEY) or EMPTY_MAP
        was = self._expired_with
        # no claim changed and no pod bound: only deadlines to check
        seen = was is not None and was[0] is claims and was[1] is snap.pods
        with self._lock:
            for key, (deadline, _) in list(self._picks.items()):
                if deadline < now:
                    self._drop_picks(key)
                    continue
                if seen and key in self._expire_checked:
                    continue
                pod = self.cache.pending(key)
                if pod is None:  # bound (kube-scheduler's PreBind wrote its claims) or gone
                    done = key in snap.pods
                else:
                    done = all(dra.is_allocated(c) for c in dra.pod_claims(pod, claims)[0])
                if done:
                    self._drop_picks(key)
            self._expired_with = (claims, snap.pods)
            self._expire_checked = set(self._picks)

    def likely_kube_picks(self, exclude: str = "") -> frozenset[dra.DeviceId]:
        """Devices kube-scheduler may be allocating now for claim pods topoplace filtered
        (until their claims show allocated, or :attr:`picks_ttl_s`), but pod ``exclude``."""
        self._expire_picks()
        with self._lock:
            counts = self._pick_counts
            mine = self._picks.get(exclude)
            if mine is None:
                out = set(counts)
            else:
                out = {i for i, n in counts.items() if n > 1 or i not in mine[1]}
        if self._mask_picks:
            out |= self._mask_pick_ids(lambda _t: True, exclude)
        return frozenset(out)
