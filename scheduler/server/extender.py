"""The extender's verbs as plain methods: parsed payload in, wire result out.

This layer owns no HTTP (see ``app.py``) and no Kubernetes I/O (a :class:`Binder` does
the API write). It turns extender payloads into core requests, runs the pure core on one
snapshot per call, keeps assumptions in the :class:`~scheduler.runtime.cache.ClusterCache`, and
records metrics.

Concurrency: kube-scheduler calls filter and prioritize one pod at a time but bind runs
asynchronously, so any verb may overlap a bind. Decisions read an immutable snapshot;
bind chooses and assumes GPUs atomically under the cache lock, so two binds can never
be given the same GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import orjson

from scheduler.core import dra
from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.fractional import (
    BACKEND_HAMI,
    REASON_NO_SHARE_ROOM,
    PodShape,
    ShareError,
    ShareRequest,
    hami_annotations,
    is_share_pod,
    whole_hami_containers,
)
from scheduler.core.model import PLACEMENT_ANNOTATION, RESERVATION_PREFIX, PodInfo, PodRequest
from scheduler.core.objects import (
    ObjectError,
    bound_pod,
    meta,
    placement_value,
    redacted_pod,
    request_from_pod,
)
from scheduler.core.preemption import broken_gangs, fits_on, select_victims
from scheduler.core.remediation import being_deleted
from scheduler.core.schedule import (
    CODE_NODE_SELECTOR,
    CODE_NOT_CHOSEN,
    FEASIBLE,
    REASON_LINK_NOW,
    REASON_NOT_CHOSEN,
    REASON_NOT_ENOUGH_FREE,
    REASON_UNKNOWN_NODE,
    ROOM_CODES,
    FilterOutcome,
    PlacementResult,
    choose_gpus,
    filter_codes,
    filter_nodes,
    known_positions,
    name_positions,
    narrow_with_rank,
    outcome_of,
    score_nodes,
    score_positions,
    selector_matches,
    verdict_counts,
    verdict_groups,
    verdict_reason,
)
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from scheduler.runtime.parked import ParkedPods
from scheduler.runtime.preempted import PreemptionLedger
from scheduler.runtime.share_fits import FitMemo
from scheduler.runtime.stranded import StrandedPods, gang_record_key
from scheduler.server import started_preemption, wire
from scheduler.server.decisions import DecisionLog, gang_member_summary
from scheduler.server.fractional_verbs import (
    is_replica_pod,
    pod_share_request,
    replica_bind_start,
    replica_filter,
    replica_prioritize,
    share_bind_start,
    share_filter,
    share_prioritize,
)
from scheduler.server.metrics import Metrics
from scheduler.server.replies import NameTable

log = logging.getLogger(__name__)
audit = logging.getLogger("topoplace.bind")
"""One JSON line per bind and per refused bind (pod, node, GPUs, result, reason, caller)."""

ERR_UNKNOWN_POD = "unknown pod: it was never seen in a filter call"
ERR_UID_MISMATCH = "pod UID does not match the pod seen in filter"
ERR_OTHER_NODE = "pod is already bound to another node"
ERR_NOT_OUR_PROFILE = "pod's schedulerName is not one of topoplace's profiles"
ERR_ALREADY_BOUND = "pod is already bound"
ERR_NO_ROOM_CPU_MEMORY = "node lacks the CPU or memory the pod requests"
ERR_BIND_IN_FLIGHT = REASON_BIND_IN_FLIGHT = "the pod's bind to another node is still being written"
"""Filter's reason for the other nodes, and bind's error for another node, while a bind of
the pod is in flight (``ClusterCache.binding``): kube-scheduler gave up on it after its
``httpTimeout`` and scheduled the pod again, but the write may still land."""


class Binder(Protocol):
    """Writes a binding somewhere. Returns "" on success or an error message."""

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> str:
        """Bind ``pod`` to ``node`` with ``annotations`` merged onto the pod."""
        ...


@dataclass(frozen=True, slots=True)
class _BindWrite:
    """A bind decided and held (:meth:`Extender._bind_start`), waiting for its write."""

    key: str
    pod: Mapping[str, Any]
    annotations: Mapping[str, str]
    req: PodRequest
    node: str = ""
    gpus: tuple[int, ...] = ()
    why: str = ""
    """The decision's one-line summary written into the placement record (for the
    decision records)."""


class SnapshotBinder:
    """Binder for snapshot mode: the cache is the only record; nothing to write."""

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> str:
        """Always succeeds: the caller has already assumed the placement."""
        return ""


class GangHandler(Protocol):
    """Gang-aware hooks (see ``scheduler/runtime/gangs.py``). Each returns None for pods it does
    not handle, so the single-pod path runs."""

    def filter(
        self, ext: Extender, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> FilterOutcome | None: ...

    def prioritize(
        self, ext: Extender, req: PodRequest, names: list[str]
    ) -> list[tuple[str, int]] | None: ...

    def choose(self, ext: Extender, snap: ClusterSnapshot, req: PodRequest, node: str) -> Any:
        """A ``MemberPlacement`` (gpus, gang, plan record) for a planned member, an error
        string, or None for pods it does not handle."""
        ...

    def bound(self, ext: Extender, req: PodRequest, ok: bool) -> None: ...

    def preemption_plan(
        self, ext: Extender, snap: ClusterSnapshot, req: PodRequest
    ) -> PlacementResult | None:
        """The placement of ``req``'s gang if every pod of lower priority were gone, or
        None for a pod it does not handle."""
        ...

    def what_if(
        self, ext: Extender, snap: ClusterSnapshot, req: PodRequest
    ) -> PlacementResult | None:
        """The placement of ``req``'s gang on ``snap``, or None for a pod it does not
        handle (the victim search of a preemption topoplace starts for a gang)."""
        ...

    def pending_members(self, ext: Extender, gang: str) -> list[PodRequest]:
        """The requests of ``gang``'s members seen and still pending."""
        ...

    def plan_now(self, ext: Extender, gang: str, why: str) -> str:
        """Plan ``gang`` now and wake its parked members; the plan id or ""."""
        ...


def _merge_gang(base: FilterOutcome, planned: FilterOutcome) -> FilterOutcome:
    """Combine the gang plan's verdict with the single-pod verdict.

    The plan decides which node a member may use (its own GPUs are reserved, so the
    single-pod filter would call that node full); broken hardware stays "never"
    (FailedAndUnresolvableNodes), so kube-scheduler's event names the real cause and
    preemption does not evict pods for a node that cannot serve anyway.
    """
    unres = dict(base.unresolvable)
    feasible = tuple(n for n in planned.feasible if n not in unres)
    failed = {n: r for n, r in planned.failed.items() if n not in unres}
    failed.update((n, r) for n, r in planned.unresolvable.items() if n not in unres)
    return FilterOutcome(feasible, failed, unres)


def _node_refuses(
    snap: ClusterSnapshot,
    req: PodRequest,
    node: str,
    cpu: int,
    memory: int,
    check_gpus: bool,
    params: Any,
) -> str:
    """Why ``node`` cannot take the pod at bind time ("" if it can): topoplace's own
    filter for the pod on that node now (health, cordon, nodeSelector, and, unless the
    GPUs are already held for it by a nomination or a gang slot, room and link class),
    plus CPU and memory against what is bound there."""
    i = snap.index.get(node)
    if i is None:
        return REASON_UNKNOWN_NODE
    pos = np.array([i], dtype=np.int64)
    code = int(snap.arrays.blocked[i])
    if req.gpus > 0 and check_gpus:
        code = int(filter_codes(snap, req, pos, params)[0])
    elif code == FEASIBLE and not selector_matches(snap.nodes[i].labels, req.node_selector):
        code = CODE_NODE_SELECTOR
    if code != FEASIBLE:
        return verdict_reason(snap, code, i)
    n = snap.nodes[i]
    used_cpu, used_memory = n.cpu_used_milli, n.memory_used_bytes
    own = snap.pods.get(req.key)
    if own is not None and own.node == node:  # its nomination already counts its requests
        used_cpu -= own.cpu_milli
        used_memory -= own.memory_bytes
    if (n.cpu_milli and used_cpu + cpu > n.cpu_milli) or (
        n.memory_bytes and used_memory + memory > n.memory_bytes
    ):
        return ERR_NO_ROOM_CPU_MEMORY
    return ""


def _gang_filter_info(out: FilterOutcome, candidates: int) -> dict[str, Any]:
    """A gang member's filter verdict for the decision records."""
    reasons = Counter(out.failed.values())
    reasons.update(out.unresolvable.values())
    return {
        "planned_node": out.feasible[0] if out.feasible else None,
        "candidates": candidates,
        "reasons": dict(sorted(reasons.items())),
    }


ROOM_REASONS = frozenset({REASON_NOT_ENOUGH_FREE, REASON_LINK_NOW, REASON_NO_SHARE_ROOM})
"""Reasons of a node refused only because the GPUs the pod could use are taken
(``schedule.ROOM_CODES``, and no share room for a fractional pod). On a node kube-scheduler
sent (its in-tree filters passed with every pod in place) preempting there is topoplace's
alone to start (``scheduler.runtime.stranded``)."""


def _names_at(snap: ClusterSnapshot, positions: Any) -> list[str]:
    return [snap.nodes[int(i)].name for i in positions]


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's spec, or an empty mapping when it is missing or malformed."""
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


class Extender:
    """filter / prioritize / bind / preempt over one cache.

    Args:
        cache: the cluster cache.
        binder: writes bindings (snapshot mode: :class:`SnapshotBinder`).
        metrics: Prometheus metrics.
        ready: returns True once the cache is synced and plans are recovered.
        gangs: gang-aware hooks, or None to treat every pod alone.
        fetch_pod: looks up a Pod object by key when bind meets a pod it has not seen in
            filter (kube mode: a GET from the API); None in snapshot mode.
        profiles: the kube-scheduler profiles (``spec.schedulerName``) topoplace binds
            for; a bind for a pod of any other scheduler is refused. None: any (snapshot
            mode, where a bind writes nothing).
    """

    def __init__(
        self,
        cache: ClusterCache,
        binder: Binder | None = None,
        metrics: Metrics | None = None,
        ready: Callable[[], bool] = lambda: True,
        gangs: GangHandler | None = None,
        fetch_pod: Callable[[str, str], Mapping[str, Any] | None] | None = None,
        profiles: Collection[str] | None = None,
    ) -> None:
        self.profiles = None if profiles is None else frozenset(profiles)
        self.cache = cache
        self.binder = binder or SnapshotBinder()
        self.metrics = metrics or Metrics()
        self.ready = ready
        self.gangs = gangs
        self.parked = ParkedPods()
        """Refused single GPU pods to wake when GPUs free (kube mode sets its waker)."""
        self.remediation_view: Callable[[], dict[str, Any]] | None = None
        """What remediation does now (kube mode sets its remediator's view; see
        ``/v1/inspect/remediation``)."""
        self.fetch_pod = fetch_pod
        self._tables: tuple[Any, NameTable | None] | None = None
        self._names_memo = wire.NamesMemo()
        self._last_request: tuple[bytes, Any, PodRequest] | None = None
        self.decisions = DecisionLog(lambda: self.params)
        """Decision records (inputs only; explained on demand, see ``decisions.py``)."""
        self.dra = DraRouter(cache)
        """Claim pods (DRA): filter/prioritize by what the DRA allocator will give."""
        self.share_fits = FitMemo()
        """Fractional pods: each node's fit per request form, kept between pods."""
        self.share_shapes: dict[str, PodShape] | None = None
        """Fractional pods: the held pods' FGD shapes as last read (reused while unchanged)."""
        self.share_dist: tuple[Any, Any, Any] | None = None
        """Fractional pods: (pods map, request key, FGD workload) of the last decision."""
        self.preemptions = PreemptionLedger(cache.now)
        """Preemption answers and the gangs they break (see :meth:`preempt`)."""
        self.stranded = StrandedPods()
        """Pods refused for GPUs taken where kube-scheduler sees room, and topoplace's own
        preemptions for them (``started_preemption``)."""

    @property
    def params(self) -> Any:
        """The scheduling parameters."""
        return self.cache.params

    # ---- filter -------------------------------------------------------------------------

    def filter(self, body: Any) -> dict[str, Any]:
        """``ExtenderArgs`` -> ``ExtenderFilterResult``. Raises WireError on bad input."""
        pod, names, items = wire.extender_args(body)
        req = self._filter_request(pod)
        if isinstance(req, dict):
            return req
        return self._noted(pod, req, self._filter(pod, req, names, items))

    def filter_json(self, body: Any, raw: bytes | None = None) -> bytes:
        """:meth:`filter` serialized as JSON bytes.

        The common case (a single pod, ``NodeNames``, every name known) is decided and
        serialized from node positions by array operations (see ``replies.py``); gang
        members, full ``Nodes`` payloads and unknown names take the general path.
        ``raw``, the request's bytes, lets a candidate list sent before be recognised
        without reading its names (see ``wire.NamesMemo``).
        """
        pod, names, items = wire.extender_args(body, raw, self._names_memo, defer_names=True)
        req = self._filter_request(pod, self._names_memo.head)
        if isinstance(req, dict):
            return orjson.dumps(req)
        if not req.gang:
            binding = self.cache.binding(req.key)
            if binding is not None:  # a bind kube-scheduler timed out is still being written
                res = self._bind_in_flight(binding, wire.names_list(names), items)
                return orjson.dumps(self._noted(pod, req, res))
        if is_share_pod(pod):  # fractional pods: a branch of their own (fractional_verbs)
            res = share_filter(self, pod, req, wire.names_list(names), items)
            return orjson.dumps(self._noted(pod, req, res))
        if is_replica_pod(self, pod, req):  # time-slicing / MPS replicas (fractional_verbs)
            res = replica_filter(self, pod, req, wire.names_list(names), items)
            return orjson.dumps(self._noted(pod, req, res))
        if items is None and req.gpus > 0 and not (self.gangs is not None and req.gang):
            with self.cache.lock:
                snap = self._decision_snapshot(req)
                pos = known_positions(snap, names)
                table = self._name_table(snap)
                if table is not None and pos is not None:
                    codes, basis = self._decide(snap, pod, req, pos)
            if table is not None and pos is not None:
                self.decisions.record("filter", snap, req, pos, basis)
                # Nodes the engine did not choose are counted, not sent (nor are failed
                # ones when a node is offered: see send_reasons).
                counts = np.bincount(codes, minlength=CODE_NOT_CHOSEN + 1)
                feasible = pos[codes == FEASIBLE]
                room = () if len(feasible) else _names_at(snap, pos[np.isin(codes, ROOM_CODES)])
                if self._note_outcome(pod, req, len(feasible) > 0, room):
                    # kube-scheduler parks it: wake it when its candidates have the GPUs
                    self.parked.refused(req.key, req.gpus, snap, pos)
                not_chosen = int(counts[CODE_NOT_CHOSEN])
                if not self.send_reasons(len(feasible)):  # counted only: no node lists
                    sizes = verdict_counts(snap, pos, codes, (CODE_NOT_CHOSEN,), counts)
                    self._count_groups(len(feasible), sizes, not_chosen)
                    return table.filter_result(feasible, [])
                groups = verdict_groups(snap, pos, codes, (CODE_NOT_CHOSEN,), counts)
                sizes = [(never, reason, len(idx)) for never, reason, idx in groups]
                self._count_groups(len(feasible), sizes, not_chosen)
                return table.filter_result(feasible, [(n, r, pos[i]) for n, r, i in groups])
        elif items is None and req.gpus <= 0 and not req.gang and not dra.uses_claims(pod):
            # No GPUs asked (every pod comes here when managedResources is empty, for
            # claim pods): every node passes, answered from positions.
            snap = self.cache.snapshot()
            pos = known_positions(snap, names)
            table = self._name_table(snap)
            if table is not None and pos is not None:
                self._count_groups(len(pos), [])
                return table.filter_result(pos, [])
        return orjson.dumps(
            self._noted(pod, req, self._filter(pod, req, wire.names_list(names), items))
        )

    def _bind_in_flight(
        self, node: str, names: list[str], items: list[Mapping[str, Any]] | None
    ) -> dict[str, Any]:
        """Filter's answer for a pod whose bind to ``node`` is still being written: that
        node alone, the hold the write carries kept (a new decision would replace it and
        free its GPUs for other pods while the write may land). kube-scheduler then binds
        the pod there again, which settles as the first write did."""
        offered = (node,) if node in names else ()
        failed = {n: REASON_BIND_IN_FLIGHT for n in names if n != node}
        return self.filter_reply(FilterOutcome(offered, failed, {}), items)

    def _noted(
        self, pod: Mapping[str, Any], req: PodRequest, res: dict[str, Any]
    ) -> dict[str, Any]:
        """``res`` (a filter reply), its outcome told to ``parked`` and ``stranded``
        (:meth:`_note_outcome`)."""
        if not res.get("Error"):
            offered = res.get("NodeNames") or ((res.get("Nodes") or {}).get("items"))
            room = (
                ()
                if offered
                else [
                    n
                    for key in ("FailedNodes", "FailedAndUnresolvableNodes")
                    for n, why in (res.get(key) or {}).items()
                    if why in ROOM_REASONS
                ]
            )
            self._note_outcome(pod, req, bool(offered), room)
        return res

    def _note_outcome(
        self, pod: Mapping[str, Any], req: PodRequest, offered: bool, room: Iterable[str] = ()
    ) -> bool:
        """Tell ``parked`` and ``stranded`` what filter answered the pod: a node (nothing
        to wake it for), or none, a refusal of one of topoplace's pods, noted for waking
        (and, a pod alone, for the preemption topoplace starts on ``room``: the nodes
        refused only for GPUs taken); True then."""
        if offered:
            self.parked.offered(req.key)
            self.stranded.offered(req.key)
            return False
        if not self._ours(pod):
            return False
        now = self.cache.now()
        self.parked.note_refusal(req.key, now)
        if not req.gang:
            self.stranded.refused(req.key, room, now)
        return True

    def send_reasons(self, offered: int) -> bool:
        """Whether a filter reply offering ``offered`` nodes carries the failed nodes'
        reasons: always when it offers none; otherwise only with
        ``extender.reasons_when_placed``. kube-scheduler keeps the reasons of a filter that
        left it a node only for a count in its log (``findNodesThatPassExtenders`` and
        ``schedulePod``: preemption and the "0/N nodes are available" message need an
        empty list), and decoding 250 of them costs it about 130 us per pod."""
        return not offered or self.params.extender.reasons_when_placed

    def _decision_snapshot(self, req: PodRequest) -> ClusterSnapshot:
        """The snapshot a single pod's filter decides on (cache lock held): expired holds
        dropped, and the pod's own earlier nomination released (a retried filter decides
        afresh, as if the pod had never been seen)."""
        self.cache.expire()
        self.cache.release_nomination(req.key)
        return self.cache.snapshot()

    def _decide(
        self, snap: ClusterSnapshot, pod: Mapping[str, Any], req: PodRequest, pos: Any
    ) -> tuple[Any, tuple[Any, Any] | None]:
        """Filter codes for a single GPU pod, narrowed to the engine's choice with its GPUs
        nominated when ``extender.decide_in_filter`` is on (cache lock held); and the
        ``(codes, rank)`` it chose by, for the decision record (None when it did not rank)."""
        codes = filter_codes(snap, req, pos, self.params)
        if not self.params.extender.decide_in_filter or not self._ours(pod):
            return codes, None
        narrowed, i, rank = narrow_with_rank(snap, req, pos, codes, self.params)
        basis = (codes, rank)
        if i < 0:
            return codes, basis
        node = snap.nodes[int(pos[i])].name
        gs = choose_gpus(snap, req, node, self.params)
        if not gs.gpus:  # pragma: no cover - feasible nodes always have a set
            return codes, basis
        if not self._nominate(pod, req, node, gs.gpus):
            return codes, basis
        return narrowed, basis

    def _nominate(
        self, pod: Mapping[str, Any], req: PodRequest, node: str, gpus: tuple[int, ...]
    ) -> bool:
        """Hold ``gpus`` of ``node`` for the single GPU pod's bind (a nomination with
        ``extender.nomination_ttl_seconds``); False when they are taken."""
        info = PodInfo(
            key=req.key,
            uid=str(meta(pod).get("uid") or ""),
            node=node,
            gpus=tuple(gpus),
            # The request read them strictly (request_from_pod), so they equal what the
            # lenient pod_resource(pod, "cpu" / "memory") would read: values in range.
            cpu_milli=req.cpu_milli,
            memory_bytes=req.memory_bytes,
            assumed=True,
            raw=pod,
        )
        return self.cache.nominate(info, self.params.extender.nomination_ttl_seconds)

    def hold_gpus(self, pod: Mapping[str, Any], req: PodRequest, node: str) -> bool:
        """Hold for the single GPU pod the GPUs its filter would choose on ``node`` now (its
        own earlier nomination released first); False when it does not fit there."""
        with self.cache.lock:
            snap = self._decision_snapshot(req)
            if fits_on(snap, req, node, self.params):
                return False
            gs = choose_gpus(snap, req, node, self.params)
            return bool(gs.gpus) and self._nominate(pod, req, node, gs.gpus)

    def _filter_request(
        self, pod: Mapping[str, Any], head: bytes | None = None
    ) -> PodRequest | dict[str, Any]:
        """The pod's request (remembered for bind when it asks for GPUs), or the error
        result for an invalid pod. ``head``: see :meth:`_request`."""
        try:
            req = self._request(pod, head)
        except ObjectError as exc:
            self.metrics.filter_errors.labels(reason="invalid pod").inc()
            return wire.filter_result(None, None, {}, {}, f"invalid pod: {exc}")
        if req.gpus > 0:
            self.cache.remember_pending(pod, req)
        return req

    def _filter(
        self,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        if is_share_pod(pod):
            return share_filter(self, pod, req, names, items)
        if is_replica_pod(self, pod, req):
            return replica_filter(self, pod, req, names, items)
        out: FilterOutcome | None = None
        if req.gpus <= 0 and dra.uses_claims(pod):
            # Claim pods: DRA decides (a claim gang is placed whole by kube/allocator.py).
            self.cache.remember_pending(pod)  # bind finds it without a GET
            out = self.dra.filter(pod, names)
        if out is None and self.gangs is not None and req.gang:
            planned = self.gangs.filter(self, pod, req, names)
            if planned is not None:
                base = filter_nodes(self.cache.snapshot(), req, names, self.params)
                out = _merge_gang(base, planned)
                self.decisions.record_info(
                    "filter", req.key, req.gang, _gang_filter_info(out, len(names))
                )
        if out is None and req.gpus > 0:
            with self.cache.lock:
                snap = self._decision_snapshot(req)
                pos = name_positions(snap, names)
                codes, basis = self._decide(snap, pod, req, pos)
            self.decisions.record("filter", snap, req, pos, basis)
            out = outcome_of(snap, names, pos, codes)
        if out is None:
            out = filter_nodes(self.cache.snapshot(), req, names, self.params)
        return self.filter_reply(out, items)

    def filter_reply(
        self, out: FilterOutcome, items: list[Mapping[str, Any]] | None
    ) -> dict[str, Any]:
        """Count a filter's outcome and answer it: node names, or the ``items`` (Node
        objects) kept. Nodes that fit but were not chosen are not sent as failed, nor, when
        a node is offered, the failed ones (:meth:`send_reasons`)."""
        reasons = Counter(out.failed.values())
        reasons.update(out.unresolvable.values())
        self._count_filter(len(out.feasible), len(out.failed), len(out.unresolvable), reasons)
        failed: Mapping[str, str] = {}
        unres: Mapping[str, str] = {}
        if self.send_reasons(len(out.feasible)):
            failed = {n: r for n, r in out.failed.items() if r != REASON_NOT_CHOSEN}
            unres = out.unresolvable
        if items is None:
            return wire.filter_result(list(out.feasible), None, failed, unres)
        keep = set(out.feasible)
        kept = [n for n in items if wire.node_name_of(n) in keep]
        return wire.filter_result(None, kept, failed, unres)

    def _count_groups(
        self, feasible: int, groups: list[tuple[bool, str, int]], not_chosen: int = 0
    ) -> None:
        """Count a vector verdict (see :func:`verdict_counts`: its groups' sizes) into the
        metrics, with ``not_chosen`` feasible nodes the engine did not choose (counted as
        failed)."""
        split = [not_chosen, 0]  # failed, unresolvable
        reasons: Counter[str] = Counter()
        if not_chosen:
            reasons[REASON_NOT_CHOSEN] = not_chosen
        for never, reason, n in groups:
            split[never] += n
            reasons[reason] += n
        self._count_filter(feasible, split[0], split[1], reasons)

    def _count_filter(
        self, feasible: int, failed: int, unresolvable: int, reasons: Mapping[str, int]
    ) -> None:
        m = self.metrics
        m.child(m.filter_nodes, "feasible").inc(feasible)
        m.child(m.filter_nodes, "failed").inc(failed)
        m.child(m.filter_nodes, "unresolvable").inc(unresolvable)
        for reason, n in reasons.items():
            m.child(m.filter_reasons, reason).inc(n)
            if reason == REASON_UNKNOWN_NODE:
                log.warning("filter named %d node(s) unknown to topoplace", n)

    def _name_table(self, snap: ClusterSnapshot) -> NameTable | None:
        """The serialized-name table of the snapshot's node set (None: names too uneven
        for fixed-width records), built once per node set."""
        cached = self._tables
        if cached is None or cached[0] is not snap.index:
            try:
                table: NameTable | None = NameTable(snap.names)
            except ValueError:
                table = None
            cached = (snap.index, table)
            self._tables = cached
        return cached[1]

    # ---- prioritize ---------------------------------------------------------------------

    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        """``ExtenderArgs`` -> ``HostPriorityList``. Raises WireError on bad input."""
        pod, names, _ = wire.extender_args(body)
        req = self._score_request(pod)
        if req is not None and is_share_pod(pod):
            return share_prioritize(self, pod, req, names)
        if req is not None and is_replica_pod(self, pod, req):
            return replica_prioritize(self, pod, req, names)
        return self._prioritize(req, names, pod)

    def prioritize_json(self, body: Any, raw: bytes | None = None) -> bytes:
        """:meth:`prioritize` serialized as JSON bytes.

        Single pods with every host known are scored and serialized from node positions
        by array operations (see ``replies.py``); gang members, invalid pods and unknown
        hosts take the general path. ``raw`` as for :meth:`filter_json`.
        """
        pod, names, _ = wire.extender_args(body, raw, self._names_memo, defer_names=True)
        req = self._score_request(pod, self._names_memo.head)
        if req is not None and is_share_pod(pod):
            return orjson.dumps(share_prioritize(self, pod, req, wire.names_list(names)))
        if req is not None and is_replica_pod(self, pod, req):
            return orjson.dumps(replica_prioritize(self, pod, req, wire.names_list(names)))
        if req is not None and req.gpus <= 0 and dra.uses_claims(pod):
            return orjson.dumps(self._prioritize(req, wire.names_list(names), pod))
        if req is not None and not (self.gangs is not None and req.gang):
            snap = self.cache.snapshot()
            pos = known_positions(snap, names)
            table = self._name_table(snap)
            if table is not None and pos is not None:
                self.decisions.record("prioritize", snap, req, pos)
                return table.host_priorities(pos, score_positions(snap, req, pos, self.params))
        return orjson.dumps(self._prioritize(req, wire.names_list(names)))

    def _score_request(
        self, pod: Mapping[str, Any], head: bytes | None = None
    ) -> PodRequest | None:
        """The pod's request, or None for an invalid pod (which scores 0 everywhere).
        ``head``: see :meth:`_request`."""
        try:
            return self._request(pod, head)
        except ObjectError:
            return None

    def _request(self, pod: Mapping[str, Any], head: bytes | None) -> PodRequest:
        """``request_from_pod(pod)``. ``head``: the bytes of the body ``pod`` was parsed
        from, all but its ``NodeNames`` (``NamesMemo.head``), or None. When they equal
        those of the last body a request was made from (kube-scheduler filters, then
        prioritizes, the same pod), that request is returned: a pure function of equal
        input, the same value, without reading the pod again.

        Raises:
            ObjectError: an invalid pod.
        """
        fabric = self.params.fabric
        last = self._last_request
        if head is not None and last is not None and last[1] is fabric and last[0] == head:
            return last[2]
        req = request_from_pod(pod, fabric)
        if head is not None:
            self._last_request = (head, fabric, req)
        return req

    def _prioritize(
        self, req: PodRequest | None, names: list[str], pod: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        if req is None:
            return [{"Host": n, "Score": 0} for n in names]
        scores = None
        if pod is not None and req.gpus <= 0 and dra.uses_claims(pod):  # before gangs
            scores = self.dra.prioritize(pod, names)
        if scores is None and self.gangs is not None and req.gang:
            scores = self.gangs.prioritize(self, req, names)
            if scores is not None:
                top = [(n, s) for n, s in scores if s]
                node, score = top[0] if top else (None, 0)
                info = {"planned_node": node, "score": score, "points": {"gang plan": score}}
                self.decisions.record_info("prioritize", req.key, req.gang, info)
        if scores is None:
            snap = self.cache.snapshot()
            scores = score_nodes(snap, req, names, self.params)
            if req.gpus > 0:
                self.decisions.record("prioritize", snap, req, name_positions(snap, names))
        return [{"Host": n, "Score": s} for n, s in scores]

    # ---- bind ---------------------------------------------------------------------------

    def bind(self, body: Any, caller: str = "") -> dict[str, str]:
        """``ExtenderBindingArgs`` -> ``ExtenderBindingResult``. Raises WireError on bad input.

        Every bind and every refusal is logged as one JSON line (logger
        ``topoplace.bind``): pod, node, GPUs, result, reason and ``caller`` (the client
        address the HTTP layer saw).
        """
        name, ns, uid, node = wire.binding_args(body)
        key = f"{ns}/{name}"
        start = self._bind_start(key, uid, node)
        if isinstance(start, str):
            return self._bind_report(key, uid, node, start, caller)
        try:
            err = self.binder.bind(start.pod, node, start.annotations)
        except Exception as exc:  # an I/O edge: never let it crash the extender
            err = self._binder_failed(key, exc)
        return self._bind_report(key, uid, node, self._bind_end(start, err), caller)

    async def bind_async(self, body: Any, caller: str = "") -> dict[str, str]:
        """:meth:`bind` for the event loop: the decision runs inline (CPU only, under the
        cache lock), the API write is awaited when the binder has ``bind_async``
        (``KubeBinder``: no worker thread), else called inline (in-memory binders)."""
        name, ns, uid, node = wire.binding_args(body)
        key = f"{ns}/{name}"
        fetched = None
        if self.fetch_pod is not None and self.cache.pending(key) is None:
            held = self.cache.snapshot().pods.get(key)
            if held is None or held.assumed:  # not a retry of a finished bind: read it
                fetched = await asyncio.to_thread(self.fetch_pod, ns, name)
        start = self._bind_start(key, uid, node, fetched)
        if isinstance(start, str):
            return self._bind_report(key, uid, node, start, caller)
        write = getattr(self.binder, "bind_async", None)
        try:
            if write is not None:
                err = await write(start.pod, node, start.annotations)
            else:
                err = self.binder.bind(start.pod, node, start.annotations)
        except Exception as exc:  # an I/O edge: never let it crash the extender
            err = self._binder_failed(key, exc)
        return self._bind_report(key, uid, node, self._bind_end(start, err), caller)

    @staticmethod
    def _binder_failed(key: str, exc: Exception) -> str:
        log.error("binder failed for %s: %s: %s", key, type(exc).__name__, exc, exc_info=exc)
        return f"binding failed: {type(exc).__name__}"

    def _bind_report(self, key: str, uid: str, node: str, err: str, caller: str) -> dict[str, str]:
        """Count and audit-log one bind answer; the ``ExtenderBindingResult``."""
        m = self.metrics
        m.child(m.binds, "ok" if not err else "error").inc()
        held = self.cache.snapshot().pods.get(key) if not err else None
        audit.info(
            orjson.dumps(
                {
                    "event": "bind",
                    "pod": key,
                    "uid": uid,
                    "node": node,
                    "gpus": list(held.gpus) if held is not None else [],
                    "result": "refused" if err else "bound",
                    "reason": err,
                    "caller": caller,
                }
            ).decode()
        )
        return {"Error": err.replace("%", "%%")}

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        """Whether topoplace binds this pod (its schedulerName is one of the profiles)."""
        if self.profiles is None:
            return True
        return str(_spec(pod).get("schedulerName") or "default-scheduler") in self.profiles

    def _authorize(self, pod: Mapping[str, Any], node: str) -> str:
        """Why topoplace will not bind ``pod`` to ``node`` at all ("" if it may): only pods
        of its own profiles, not bound yet. Anyone who reaches the port can call bind; this
        and the node check in :meth:`_bind` keep it from binding what kube-scheduler did not
        ask for."""
        if not self._ours(pod):
            return ERR_NOT_OUR_PROFILE
        bound_to = _spec(pod).get("nodeName")
        if bound_to:
            return ERR_ALREADY_BOUND if bound_to == node else ERR_OTHER_NODE
        return ""

    def _bind_start(
        self, key: str, uid: str, node: str, fetched: Mapping[str, Any] | None = None
    ) -> str | _BindWrite:
        """Decide a bind and hold its GPUs: an error, or what to write through the binder
        (then :meth:`_bind_end` with the write's outcome). ``fetched``: the pod as read
        from the API by the caller, for a pod neither filter nor the watch has shown."""
        snap = self.cache.snapshot()
        held = snap.pods.get(key)
        if held is not None and not held.assumed:
            # Idempotent retry of a bind that succeeded (reply lost or timed out).
            return "" if held.node == node else ERR_OTHER_NODE
        binding = self.cache.binding(key)
        if binding is not None and binding != node:
            return f"{ERR_BIND_IN_FLIGHT} ({binding})"
        pod = self.cache.pending(key) or fetched
        if pod is None and self.fetch_pod is not None:
            ns, name = key.split("/", 1)
            pod = self.fetch_pod(ns, name)
        if pod is None:
            return ERR_UNKNOWN_POD
        pod_uid = str(meta(pod).get("uid") or "")
        if uid and pod_uid and uid != pod_uid:
            return ERR_UID_MISMATCH
        why = self._authorize(pod, node)
        if why:
            return why
        if snap.node(node) is None:
            return REASON_UNKNOWN_NODE
        req = self.cache.pending_request(key, pod)  # read by filter from this very object
        if req is None:
            try:
                req = request_from_pod(pod, self.params.fabric)
            except ObjectError as exc:
                return f"invalid pod: {exc}"
        if is_share_pod(pod):
            return share_bind_start(self, key, pod, req, node, pod_uid)
        if is_replica_pod(self, pod, req):
            return replica_bind_start(self, key, pod, req, node, pod_uid)
        if req.gang and req.gpus <= 0 and dra.uses_claims(pod):
            req = replace(req, gang="")  # its claims are allocated: a claim gang is whole already
        cpu, memory = req.cpu_milli, req.memory_bytes  # as pod_resource reads a valid pod
        summary = self._why(req, node)

        def choose(s: ClusterSnapshot, nominated: tuple[int, ...] | None) -> PodInfo | str:
            held_for_it = nominated is not None or (self.gangs is not None and bool(req.gang))
            why = _node_refuses(s, req, node, cpu, memory, not held_for_it, self.params)
            if why:
                return why
            gang, plan = "", None
            picked: Any = None
            if self.gangs is not None and req.gang:
                picked = self.gangs.choose(self, s, req, node)
            if isinstance(picked, str):
                return picked
            if picked is not None:
                gpus, gang, plan = picked.gpus, picked.gang, picked.plan
            elif nominated is not None:
                gpus = nominated
            else:
                gs = choose_gpus(s, req, node, self.params)
                if req.gpus and not gs.gpus:
                    return gs.error
                gpus = gs.gpus
            annotation = placement_value(node, gpus, gang or req.gang, plan, summary)
            return PodInfo(
                key=key,
                uid=pod_uid,
                node=node,
                gpus=gpus,
                cpu_milli=cpu,
                memory_bytes=memory,
                gang=gang or req.gang,
                assumed=True,
                raw=bound_pod(pod, node, {PLACEMENT_ANNOTATION: annotation}),
            )

        choice = self.cache.assume_for_bind(key, node, choose)
        if isinstance(choice, str):
            if self.gangs is not None and req.gang:
                self.gangs.bound(self, req, False)
            return choice
        annotation = (choice.raw.get("metadata") or {}).get("annotations", {})[PLACEMENT_ANNOTATION]
        handoff = {PLACEMENT_ANNOTATION: annotation}
        target = snap.node(node)
        if target is not None and target.sharing == BACKEND_HAMI and choice.gpus:
            # HAMi's device plugin serves every nvidia.com/gpu container on its node from
            # its annotations: a whole GPU in HAMi's form (full memory, 100 % compute).
            containers = whole_hami_containers(target, pod, choice.gpus)
            handoff.update(hami_annotations(target, containers, int(time.time())))
        return _BindWrite(key, pod, handoff, req, node, choice.gpus, summary)

    def _bind_end(self, start: _BindWrite, err: str) -> str:
        """After the binder's write: confirm the held GPUs, or release them."""
        if err:
            self.cache.forget(start.key)
        else:
            self.cache.confirm(start.key)
            self.cache.drop_pending(start.key)
        if self.gangs is not None and start.req.gang:
            self.gangs.bound(self, start.req, not err)
        self.decisions.record_info(
            "bind",
            start.key,
            start.req.gang,
            {"node": start.node, "gpus": list(start.gpus), "why": start.why, "error": err},
        )
        return err

    def _why(self, req: PodRequest, node: str) -> str:
        """The one-line summary of binding ``req`` to ``node`` for its placement record,
        from the decision records ("" when none is held); never fails a bind."""
        try:
            if self.gangs is not None and req.gang:
                plan = self.decisions.gang_plan(req.gang)
                return gang_member_summary(plan, node) if plan is not None else ""
            return self.decisions.bind_summary(req.key, node) if req.gpus > 0 else ""
        except Exception:  # an explanation must never cost a placement
            log.exception("explaining the bind of %s failed", req.key)
            return ""

    # ---- preempt ------------------------------------------------------------------------

    def preempt(self, body: Any) -> dict[str, Any]:
        """``ExtenderPreemptionArgs`` -> ``ExtenderPreemptionResult``.

        For a pod asking for whole GPUs, topoplace chooses the node and its victims
        (``scheduler.core.preemption``) among kube-scheduler's candidates and answers
        with that node alone; an empty map when preempting would not help (kube-scheduler
        then evicts nothing). A gang member preempts only when its whole gang fits once
        every lower-priority pod is gone, and only on the nodes of that placement. The
        gangs its victims belong to are recorded so their other members are evicted too
        (kube mode, ``remediation``). A fractional pod (HAMi, gpushare) is given victims
        that leave it devices with its memory and compute. Replica and claim pods,
        fractional gang members, and pods topoplace cannot read get kube-scheduler's own
        victims back unchanged.
        """
        pod, victims, pdb = wire.preemption_args(body)
        passed = {
            "NodeNameToMetaVictims": {
                node: {"Pods": v, "NumPDBViolations": pdb.get(node, 0)}
                for node, v in sorted(victims.items())
            }
        }
        try:
            req = self._request(pod, None)
        except ObjectError:
            req = None
        fractional = req is not None and is_share_pod(pod)
        share: ShareRequest | None = None
        if fractional and req is not None and not req.gang:
            with contextlib.suppress(ShareError):
                share = pod_share_request(self, pod)
        if (
            req is None
            or not victims
            or (fractional and share is None)
            or (not fractional and (req.gpus <= 0 or is_replica_pod(self, pod, req)))
        ):
            self.metrics.child(self.metrics.preemptions, "passed").inc()
            return passed
        snap = self.cache.snapshot()
        live = {p.uid for p in snap.pods.values() if p.uid and not being_deleted(p)}
        started = self.stranded.get(gang_record_key(req.gang)) if req.gang else None
        if self.preemptions.waiting_for(
            req.key,
            live.__contains__,
            lambda node: not fits_on(snap, req, node, self.params, share),
        ):
            waiting = "its last preemption still stands (victims going, or room on its node now)"
        elif started is not None and started.node:
            waiting = f"topoplace's preemption for its gang still going (victims on {started.node})"
        else:
            waiting = ""
        if waiting:
            self.metrics.child(self.metrics.preemptions, "waiting").inc()
            log.info("preemption for %s: %s; none more", req.key, waiting)
            return {"NodeNameToMetaVictims": {}}
        proposed = {node: {v["UID"] for v in vs} for node, vs in victims.items()}
        within: frozenset[str] | None = None
        why = ""
        if req.gang and self.gangs is not None:
            placed = self.gangs.preemption_plan(self, snap, req)
            if placed is not None:
                if placed.ok:
                    within = frozenset(a.node for a in placed.assignments)
                else:
                    why = f"the gang does not fit even with every lower-priority pod gone: {placed.reason}"
        decision = (
            select_victims(snap, req, proposed, self.params, within, share) if not why else None
        )
        chosen = decision.chosen if decision is not None else None
        elsewhere = started_preemption.cheaper_elsewhere(self, snap, req, share, chosen)
        if elsewhere is not None:
            why = (
                f"topoplace preempts on {elsewhere.node} instead, where kube-scheduler sees "
                f"room (victims {', '.join(v.pod for v in elsewhere.victims)})"
            )
            chosen = None
        answer = {
            "pod": req.key,
            "priority": req.priority,
            "gpus": req.gpus,
            "share": share.form if share is not None else "",
            "proposed": {n: len(v) for n, v in sorted(proposed.items())},
            "chosen": chosen.as_dict() if chosen is not None else None,
            "options": len(decision.options) if decision is not None else 0,
            "refused": dict(decision.refused) if decision is not None else {},
            "reason": why,
        }
        broken = broken_gangs(snap, chosen, req.key) if chosen is not None else []
        self.preemptions.record(
            answer,
            broken,
            req.key,
            [v.uid for v in chosen.victims] if chosen else (),
            chosen.node if chosen else "",
        )
        if chosen is None:
            outcome = "deferred" if elsewhere is not None else "none"
            self.metrics.child(self.metrics.preemptions, outcome).inc()
            log.info(
                "preemption for %s: no victims named (%s)",
                req.key,
                why or "; ".join(f"{n}: {r}" for n, r in sorted(answer["refused"].items())[:5]),
            )
            return {"NodeNameToMetaVictims": {}}
        self.metrics.child(self.metrics.preemptions, "chosen").inc()
        for v in chosen.victims:
            self.metrics.child(self.metrics.preemption_victims, "yes" if v.gang else "no").inc()
        self.metrics.preemption_budget_violations.inc(chosen.pdb_violations)
        log.info(
            "preemption for %s: %s, victims %s (gangs broken: %s)",
            req.key,
            chosen.node,
            ", ".join(v.pod for v in chosen.victims),
            ", ".join(chosen.gangs_broken) or "none",
        )
        return {
            "NodeNameToMetaVictims": {
                chosen.node: {
                    "Pods": [{"UID": v.uid} for v in chosen.victims],
                    # topoplace's own count for its victims (one node is answered, so
                    # kube-scheduler nominates it whatever the count)
                    "NumPDBViolations": chosen.pdb_violations,
                }
            }
        }

    # ---- inspection ---------------------------------------------------------------------

    def snapshot_list(self) -> dict[str, Any]:
        """The current state as a Kubernetes List of Nodes and Pods (round-trips: loads
        back with ``--cluster`` to the same placements). Pods are redacted
        (:func:`redacted_pod`): nothing a placement does not need leaves the extender."""
        snap = self.cache.snapshot()
        items: list[Any] = []
        for n in snap.nodes:
            items.append({"kind": "Node", "apiVersion": "v1", **n.raw})
        for key in sorted(snap.pods):
            p = snap.pods[key]
            if p.key.startswith((RESERVATION_PREFIX, dra.HOLDER_PREFIX)) or not p.raw:
                continue
            items.append({"kind": "Pod", "apiVersion": "v1", **redacted_pod(p.raw)})
        items += dra.objects_of(snap.extra)
        items += (snap.extra.get(BUDGETS_EXTRA) or {}).values()
        return {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}

    def placements(self) -> dict[str, Any]:
        """Held placements and gang plans, for ``/v1/inspect/placements``."""
        snap = self.cache.snapshot()
        pods = []
        for key in sorted(snap.pods):
            p = snap.pods[key]
            if not p.gpus and not p.shares:
                continue
            pods.append(
                {
                    "pod": key,
                    "node": p.node,
                    "gpus": list(p.gpus),
                    "shares": [[s.gpu, s.memory_mib, s.milli] for s in p.shares],
                    "state": "assumed" if p.assumed else "bound",
                    "gpu_indices_known": p.gpu_indices_known,
                    "gang": p.gang,
                    "expires_in_s": (
                        None
                        if self.cache.expiry_of(key) is None
                        else round(self.cache.expiry_of(key) - self.cache.now(), 3)  # type: ignore[operator]
                    ),
                }
            )
        plans = {}
        describe = getattr(self.gangs, "describe_plans", None)
        if callable(describe):
            plans = describe(self)
        return {"generation": snap.generation, "placements": pods, "gangs": plans}
