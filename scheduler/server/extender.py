"""The extender's verbs as plain methods: parsed payload in, wire result out.

This layer owns no HTTP (see ``app.py``) and no Kubernetes I/O (a :class:`Binder` does
the API write). It parses extender payloads, reads the pod's request, and dispatches each
verb to the pod's kind (``verbs/kinds.py``: whole GPUs, gang members, GPU shares, GPU
replicas, DRA claims; each a module of ``verbs/`` implementing filter, score, bind, preempt
and explain). What every kind shares stays here: the request memo, the bind's checks
(idempotent retry, bind in flight, profile, UID), settling a bind after its write, counting
filter outcomes, and telling parked and stranded pods what filter answered. The kinds run
the pure core on one snapshot per call and keep assumptions in the
:class:`~scheduler.runtime.cache.ClusterCache`.

Concurrency: kube-scheduler calls filter and prioritize one pod at a time but bind runs
asynchronously, so any verb may overlap a bind. Decisions read an immutable snapshot;
bind chooses and assumes GPUs atomically under the cache lock, so two binds can never
be given the same GPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import orjson

from scheduler.core import dra
from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.fractional import REASON_NO_SHARE_ROOM, PodShape
from scheduler.core.model import RESERVATION_PREFIX, PodRequest
from scheduler.core.objects import ObjectError, meta, redacted_pod, request_from_pod
from scheduler.core.schedule import (
    REASON_LINK_NOW,
    REASON_NOT_CHOSEN,
    REASON_NOT_ENOUGH_FREE,
    REASON_UNKNOWN_NODE,
    FilterOutcome,
)
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.dra import DraRouter
from scheduler.runtime.parked import ParkedPods
from scheduler.runtime.preempted import PreemptionLedger
from scheduler.runtime.share_fits import FitMemo
from scheduler.runtime.stranded import StrandedPods
from scheduler.server import wire
from scheduler.server.decisions import DecisionLog
from scheduler.server.metrics import Metrics
from scheduler.server.replies import NameTable
from scheduler.server.verbs import preempt as preempt_verb
from scheduler.server.verbs.base import (
    ERR_ALREADY_BOUND,
    ERR_BIND_IN_FLIGHT,
    ERR_NOT_OUR_PROFILE,
    ERR_OTHER_NODE,
    ERR_UID_MISMATCH,
    ERR_UNKNOWN_POD,
    REASON_BIND_IN_FLIGHT,
    Binder,
    BindWrite,
    GangHandler,
    SnapshotBinder,
    spec_of,
    zero_scores,
)

# Re-exported: the kube adapter, the CLI and the tests import these from this module.
from scheduler.server.verbs.base import ERR_NO_ROOM_CPU_MEMORY as ERR_NO_ROOM_CPU_MEMORY
from scheduler.server.verbs.kinds import kind_of

log = logging.getLogger(__name__)
audit = logging.getLogger("topoplace.bind")
"""One JSON line per bind and per refused bind (pod, node, GPUs, result, reason, caller)."""

ROOM_REASONS = frozenset({REASON_NOT_ENOUGH_FREE, REASON_LINK_NOW, REASON_NO_SHARE_ROOM})
"""Reasons of a node refused only because the GPUs the pod could use are taken
(``schedule.ROOM_CODES``, and no share room for a fractional pod). On a node kube-scheduler
sent (its in-tree filters passed with every pod in place) preempting there is topoplace's
alone to start (``scheduler.runtime.stranded``)."""


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

    def state_sizes(self) -> dict[str, dict[str, dict[str, int | None]]]:
        """``GET /v1/inspect/state``: the entries of every store the serving process keeps
        between requests, by component, each with its cap (None: bounded by the pods and
        gangs in flight and by their windows, not by a count). What the soak benchmark
        samples to show that nothing accumulates."""
        parts: dict[str, dict[str, tuple[int, int | None]]] = {
            "cache": self.cache.sizes(),
            "dra": self.dra.sizes(),
            "parked": self.parked.sizes(),
            "stranded": self.stranded.sizes(),
            "preemptions": self.preemptions.sizes(),
        }
        sizes = getattr(self.gangs, "sizes", None)
        if callable(sizes):
            parts["gangs"] = sizes()
        ring = self.decisions.stats()
        parts["decisions"] = {"records": (ring["records"], ring["max_records"])}
        parts["share_fits"] = self.share_fits.sizes()
        return {
            part: {name: {"size": n, "cap": cap} for name, (n, cap) in stores.items()}
            for part, stores in parts.items()
        }

    # ---- filter -------------------------------------------------------------------------

    def filter(self, body: Any) -> dict[str, Any]:
        """``ExtenderArgs`` -> ``ExtenderFilterResult``. Raises WireError on bad input."""
        pod, names, items = wire.extender_args(body)
        req = self._filter_request(pod)
        if isinstance(req, dict):
            return req
        res = kind_of(self, pod, req).filter(self, pod, req, names, items)
        return self._noted(pod, req, res)

    def filter_json(self, body: Any, raw: bytes | None = None) -> bytes:
        """:meth:`filter` serialized as JSON bytes.

        The common case (a single pod, ``NodeNames``, every name known) is decided and
        serialized from node positions by array operations (the kind's ``filter_fast``,
        ``replies.py``); gang members, full ``Nodes`` payloads and unknown names take the
        general path. ``raw``, the request's bytes, lets a candidate list sent before be
        recognised without reading its names (see ``wire.NamesMemo``).
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
        kind = kind_of(self, pod, req)
        fast = kind.filter_fast(self, pod, req, names, items)
        if fast is not None:
            return fast
        res = kind.filter(self, pod, req, wire.names_list(names), items)
        return orjson.dumps(self._noted(pod, req, res))

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
        (:meth:`note_outcome`)."""
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
            self.note_outcome(pod, req, bool(offered), room)
        return res

    def note_outcome(
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
        if not self.ours(pod):
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

    def decision_snapshot(self, req: PodRequest) -> ClusterSnapshot:
        """The snapshot a single pod's filter decides on (cache lock held): expired holds
        dropped, and the pod's own earlier nomination released (a retried filter decides
        afresh, as if the pod had never been seen)."""
        self.cache.expire()
        self.cache.release_nomination(req.key)
        return self.cache.snapshot()

    def _filter_request(
        self, pod: Mapping[str, Any], head: bytes | None = None
    ) -> PodRequest | dict[str, Any]:
        """The pod's request (remembered for bind when it asks for GPUs), or the error
        result for an invalid pod. ``head``: see :meth:`request`."""
        try:
            req = self.request(pod, head)
        except ObjectError as exc:
            self.metrics.filter_errors.labels(reason="invalid pod").inc()
            return wire.filter_result(None, None, {}, {}, f"invalid pod: {exc}")
        if req.gpus > 0:
            self.cache.remember_pending(pod, req)
        return req

    def filter_reply(
        self, out: FilterOutcome, items: list[Mapping[str, Any]] | None, not_chosen: int = 0
    ) -> dict[str, Any]:
        """Count a filter's outcome and answer it: node names, or the ``items`` (Node
        objects) kept. Nodes that fit but were not chosen are not sent as failed, nor, when
        a node is offered, the failed ones (:meth:`send_reasons`). ``not_chosen``: feasible
        nodes left out of ``out`` (counted as failed, :data:`REASON_NOT_CHOSEN`, without a
        map entry each)."""
        reasons = Counter(out.failed.values())
        reasons.update(out.unresolvable.values())
        if not_chosen:
            reasons[REASON_NOT_CHOSEN] += not_chosen
        failed_n = len(out.failed) + not_chosen
        self._count_filter(len(out.feasible), failed_n, len(out.unresolvable), reasons)
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

    def count_groups(
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

    def name_table(self, snap: ClusterSnapshot) -> NameTable | None:
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
        if req is None:
            return zero_scores(names)
        return kind_of(self, pod, req).score(self, pod, req, names)

    def prioritize_json(self, body: Any, raw: bytes | None = None) -> bytes:
        """:meth:`prioritize` serialized as JSON bytes.

        Single pods with every host known are scored and serialized from node positions
        by array operations (the kind's ``score_fast``, ``replies.py``); gang members,
        invalid pods and unknown hosts take the general path. ``raw`` as for
        :meth:`filter_json`.
        """
        pod, names, _ = wire.extender_args(body, raw, self._names_memo, defer_names=True)
        req = self._score_request(pod, self._names_memo.head)
        if req is None:
            return orjson.dumps(zero_scores(wire.names_list(names)))
        kind = kind_of(self, pod, req)
        fast = kind.score_fast(self, pod, req, names)
        if fast is not None:
            return fast
        return orjson.dumps(kind.score(self, pod, req, wire.names_list(names)))

    def _score_request(
        self, pod: Mapping[str, Any], head: bytes | None = None
    ) -> PodRequest | None:
        """The pod's request, or None for an invalid pod (which scores 0 everywhere).
        ``head``: see :meth:`request`."""
        try:
            return self.request(pod, head)
        except ObjectError:
            return None

    def request(self, pod: Mapping[str, Any], head: bytes | None = None) -> PodRequest:
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

    # ---- bind ---------------------------------------------------------------------------

    _request = request
    """:meth:`request` under its former name (tests and benchmarks call it so)."""

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

    def ours(self, pod: Mapping[str, Any]) -> bool:
        """Whether topoplace binds this pod (its schedulerName is one of the profiles)."""
        if self.profiles is None:
            return True
        return str(spec_of(pod).get("schedulerName") or "default-scheduler") in self.profiles

    def _authorize(self, pod: Mapping[str, Any], node: str) -> str:
        """Why topoplace will not bind ``pod`` to ``node`` at all ("" if it may): only pods
        of its own profiles, not bound yet. Anyone who reaches the port can call bind; this
        and the node check in :meth:`_bind` keep it from binding what kube-scheduler did not
        ask for."""
        if not self.ours(pod):
            return ERR_NOT_OUR_PROFILE
        bound_to = spec_of(pod).get("nodeName")
        if bound_to:
            return ERR_ALREADY_BOUND if bound_to == node else ERR_OTHER_NODE
        return ""

    def _bind_start(
        self, key: str, uid: str, node: str, fetched: Mapping[str, Any] | None = None
    ) -> str | BindWrite:
        """Decide a bind and hold its GPUs: an error, or what to write through the binder
        (then :meth:`_bind_end` with the write's outcome). ``fetched``: the pod as read
        from the API by the caller, for a pod neither filter nor the watch has shown. The
        checks every pod shares run here; the decision is the pod's kind's ``bind``."""
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
        return kind_of(self, pod, req).bind(self, key, pod, req, node, pod_uid)

    def _bind_end(self, start: BindWrite, err: str) -> str:
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

    # ---- preempt ------------------------------------------------------------------------

    def preempt(self, body: Any) -> dict[str, Any]:
        """``ExtenderPreemptionArgs`` -> ``ExtenderPreemptionResult``.

        The pod's kind says what a preemption for it needs (``PodKind.preempt``) and
        ``verbs/preempt.py`` answers: for a pod asking for whole GPUs, the node and its
        victims (``scheduler.core.preemption``) among kube-scheduler's candidates, that node
        alone; an empty map when preempting would not help (kube-scheduler then evicts
        nothing). A gang member preempts only when its whole gang fits once every
        lower-priority pod is gone, and only on the nodes of that placement. A fractional
        pod (HAMi, gpushare) is given victims that leave it devices with its memory and
        compute. Replica and claim pods, fractional gang members, and pods topoplace
        cannot read get kube-scheduler's own victims back unchanged.
        """
        pod, victims, pdb = wire.preemption_args(body)
        passed = {
            "NodeNameToMetaVictims": {
                node: {"Pods": v, "NumPDBViolations": pdb.get(node, 0)}
                for node, v in sorted(victims.items())
            }
        }
        try:
            req = self.request(pod, None)
        except ObjectError:
            req = None
        ask = None
        if req is not None and victims:
            ask = kind_of(self, pod, req).preempt(self, pod, req)
        if req is None or ask is None:
            self.metrics.child(self.metrics.preemptions, "passed").inc()
            return passed
        return preempt_verb.answer(self, req, victims, ask)

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
