"""The one mutable cluster view: assume / forget / confirm under one lock.

Every decision takes :meth:`ClusterCache.snapshot` (an immutable
:class:`~scheduler.core.snapshot.ClusterSnapshot`, O(1) to take) and never sees later
changes. All mutation happens here, under ``self._lock``, and publishes a new snapshot.

State machine of a pod's resources::

    (none) --assume--> ASSUMED --confirm--> BOUND --(pod deleted / terminated)--> (none)
               ASSUMED --forget / TTL expiry--> (none)

* ``assume`` refuses (DoubleBookingError) if any GPU is already held: two concurrent binds
  can never be given the same GPU, because choosing and assuming happen under one lock
  (:meth:`assume_chosen`).
* ``forget`` and ``confirm`` are idempotent.
* Assumptions without a TTL never expire (a bind in flight); with a TTL they expire at
  ``clock() + ttl`` and are dropped by :meth:`expire` (gang reservations).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from scheduler.core import dra
from scheduler.core.health import NOW_KEY, RESOURCESLICES_KEY
from scheduler.core.model import EMPTY_MAP, NodeHealth, NodeInfo, PodInfo
from scheduler.core.objects import (
    REDACTED_ANNOTATIONS,
    ObjectError,
    meta,
    object_key,
    pod_terminated,
    redacted_pod,
)
from scheduler.core.params import SchedParams
from scheduler.core.podmap import PodMap
from scheduler.core.snapshot import (
    UNMODELED_DUPLICATE,
    ClusterSnapshot,
    DoubleBookingError,
    build_snapshot,
    claim_holding_info,
    health_inputs,
    holds_usage_of,
    index_slice_update,
    modeled_node,
    pod_info_for,
    with_node_health,
    with_node_object,
    with_nodes,
    with_pod,
    with_pods,
    with_usage_of,
    without_node,
    without_pod,
)

log = logging.getLogger(__name__)


def _with_record(snap: ClusterSnapshot, pod: PodInfo) -> ClusterSnapshot:
    """``snap`` with ``pod``'s record replaced; its usage (node, GPUs, requests) must be the
    held pod's: the node arrays are shared, not copied."""
    pods = snap.pods if isinstance(snap.pods, PodMap) else PodMap(snap.pods)
    return with_pods(snap, pods.set(pod.key, pod))


def _holding(snap: ClusterSnapshot, pod: PodInfo) -> ClusterSnapshot:
    """``snap`` with ``pod`` holding its resources: a record swap when the same key already
    holds exactly that usage (a nomination turning into a bind, a bind the watch confirms),
    else :func:`with_pod` (which may raise DoubleBookingError / KeyError)."""
    old = snap.pods.get(pod.key)
    if old is not None and (old.node, old.gpus, old.cpu_milli, old.memory_bytes, old.shares) == (
        pod.node,
        pod.gpus,
        pod.cpu_milli,
        pod.memory_bytes,
        pod.shares,
    ):
        return _with_record(snap, pod)
    return with_pod(snap, pod)


def _same_health_inputs(a: ClusterSnapshot, b: ClusterSnapshot) -> bool:
    """Whether two snapshots assess their nodes' health from the same inputs besides the
    objects (see :func:`health_inputs`): the same ResourceSlices (by identity: a new list
    is a new object) and the same pinned time."""
    return a.extra.get(RESOURCESLICES_KEY) is b.extra.get(RESOURCESLICES_KEY) and a.extra.get(
        NOW_KEY
    ) == b.extra.get(NOW_KEY)


def _slice_name(s: Any) -> Any:
    return (s.get("metadata") or {}).get("name") if isinstance(s, Mapping) else None


def _slice_at(slices: list[Any], name: Any) -> int:
    """Where the slice called ``name`` is in ``slices`` (-1: nowhere). The snapshot keeps
    its slices sorted by name (``dra.extra_of``), so it is looked up by bisection, and
    checked; a list in another order is searched through."""
    at = bisect.bisect_left(slices, name, key=lambda s: str(_slice_name(s) or ""))
    if at < len(slices) and _slice_name(slices[at]) == name:
        return at
    return next((i for i, s in enumerate(slices) if _slice_name(s) == name), -1)


def _annotations_read(m: Mapping[str, Any]) -> Any:
    """A pod's annotations as placement reads them (without :data:`REDACTED_ANNOTATIONS`,
    which a pod kept for bind does not carry)."""
    ann = m.get("annotations")
    if not isinstance(ann, Mapping):
        return ann
    if any(k in ann for k in REDACTED_ANNOTATIONS):
        return {k: v for k, v in ann.items() if k not in REDACTED_ANNOTATIONS}
    return ann


def _resources(containers: Any) -> Any:
    """The ``resources`` of each container (what placement reads of them), or the value
    itself when it is not a list."""
    if not isinstance(containers, list):
        return containers
    return [c.get("resources") if isinstance(c, Mapping) else c for c in containers]


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod seen in a filter call and not yet bound (needed to bind it later).

    ``obj`` is the pod without what decisions do not need (:func:`redacted_pod`: no env,
    commands, volumes, managed fields); ``size`` its JSON size in bytes; ``req`` the
    request a filter read from this very version of the pod (``PodRequest``), if any, so
    bind does not read it again."""

    obj: Mapping[str, Any]
    seen_at: float
    size: int = 0
    req: Any = None

    def same_version(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``pod`` is the version held: same uid and resourceVersion (the API
        server's version of the whole object), both set."""
        new, old = meta(pod), meta(self.obj)
        rv = new.get("resourceVersion")
        return bool(rv) and rv == old.get("resourceVersion") and new.get("uid") == old.get("uid")


PENDING_MAX_ENTRIES = 100_000
PENDING_MAX_BYTES = 256 * 1024 * 1024
"""Bounds of the pending-pod store: oldest entries are evicted first, in O(1)."""


class _Modeled(NamedTuple):
    """Nodes as parsed from their objects (``modeled_node``), and the health inputs and
    parameters they were parsed with: see ``ClusterCache._modeled``."""

    at: float | None
    devices: Mapping[str, Any] | None
    params: SchedParams | None
    nodes: Mapping[str, tuple[Any, NodeInfo]]
    """Node name -> (its Node object, the node parsed from it)."""


def _inventory(slices: Any, previous: dra.Inventory | None = None) -> dra.Inventory:
    """The DRA inventory of ``slices`` (slices ``previous`` read already are not read
    again)."""
    return dra.inventory(slices, previous=previous) if slices else dra.EMPTY_INVENTORY


class ClusterCache:
    """Thread-safe owner of the current snapshot and of assumptions.

    Args:
        snapshot: initial snapshot.
        params: scheduling parameters (used to rebuild nodes from objects).
        clock: monotonic clock in seconds (injected for tests).
        health_tracker: optional owner of health history (``scheduler.runtime.health_tracker``);
            when set, ``upsert_node`` stores the verdict its ``adjust(node_obj, verdict)``
            returns (flapping risk, settle time, heartbeat staleness).
    """

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        params: SchedParams,
        clock: Callable[[], float] = time.monotonic,
        health_tracker: Any = None,
    ) -> None:
        self.health_tracker = health_tracker
        self._lock = threading.RLock()
        self._snap = snapshot
        self.params = params
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._pending: OrderedDict[str, PendingPod] = OrderedDict()
        self._pending_bytes = 0
        self._nominated: dict[str, str] = {}
        self._binding: dict[str, str] = {}
        """Pod key -> node of a bind in flight (from its assume to its confirm or forget)."""
        self._dra_inv: tuple[Any, dra.Inventory] = (None, dra.EMPTY_INVENTORY)
        self._expired_total = 0
        self._bound_unseen: dict[str, Any] = {}
        """Pods topoplace bound (the API accepted the Binding: :meth:`confirm` without an
        object) that the watch has not shown bound yet, by key, with their uid. The
        stores a rebuild reads still show them pending, so :meth:`replace_all` carries
        their records over, and an older event of the pending pod does not release them
        (:meth:`upsert_pod`)."""
        self._unheld: dict[str, str] = {}
        """Allocated claims that hold nothing because another holding had their GPUs when
        their allocation arrived (claim key -> node): held once that one goes
        (:meth:`_claims_held_again`)."""
        self._modeled: _Modeled = _Modeled(None, None, None, {})
        """The nodes as the last :meth:`refresh_nodes` or :meth:`replace_all` parsed them
        (:func:`modeled_node`), with the inputs they were parsed with: a node whose object
        and health inputs have not changed since is not parsed again (only its health
        history is re-applied at the new time). Replaced whole, never edited; a node is
        reused only when its object is the very one being refreshed, so a value written by
        a refresh that raced a rebuild costs a parse, never a wrong node."""
        self.plans: dict[str, Any] = {}
        """Gang plans by gang key; owned by the gang layer, guarded by :attr:`lock`."""

    @classmethod
    def from_objects(
        cls,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        params: SchedParams,
        clock: Callable[[], float] = time.monotonic,
        extra: Mapping[str, Any] | None = None,
    ) -> ClusterCache:
        """A cache over Node and Pod objects (a cluster file or an initial list)."""
        inv = _inventory((extra or EMPTY_MAP).get(dra.SLICES_KEY))
        cache = cls(build_snapshot(nodes, pods, params, extra, inv), params, clock)
        cache._dra_inv = (cache._snap.extra.get(dra.SLICES_KEY), inv)
        return cache

    @property
    def lock(self) -> threading.RLock:
        """The cache lock; hold it to make several operations atomic."""
        return self._lock

    def snapshot(self) -> ClusterSnapshot:
        """The current immutable snapshot (O(1))."""
        return self._snap

    def now(self) -> float:
        """The cache's clock."""
        return self._clock()

    # ---- assumptions -------------------------------------------------------------------

    def assume(self, pod: PodInfo, ttl: float | None = None) -> ClusterSnapshot:
        """Hold ``pod``'s resources. Raises DoubleBookingError / KeyError on conflict."""
        with self._lock:
            held = pod if pod.assumed is True else replace(pod, assumed=True)
            self._snap = _holding(self._snap, held)
            if ttl is None:
                self._expiry.pop(pod.key, None)
            else:
                self._expiry[pod.key] = self._clock() + ttl
            return self._snap

    def assume_chosen(
        self,
        choose: Callable[[ClusterSnapshot], PodInfo | str],
        ttl: float | None = None,
    ) -> PodInfo | str:
        """Choose on the current snapshot and assume the choice, atomically.

        ``choose`` returns the PodInfo to assume, or an error string (nothing is assumed).
        """
        with self._lock:
            choice = choose(self._snap)
            if isinstance(choice, str):
                return choice
            self.assume(choice, ttl)
            return choice

    # ---- nominations (filter's choice, held for the pod's bind) ---------------------------

    def nominate(self, pod: PodInfo, ttl: float) -> bool:
        """Hold the GPUs filter chose for ``pod`` until its bind (or ``ttl`` seconds).

        A nomination is an assumption with a TTL, marked so that the pod's bind on the same
        node takes exactly these GPUs (:meth:`take_nomination`). Replaces an earlier
        nomination of the same pod. False (nothing held) when the GPUs are taken.
        """
        with self._lock:
            self.release_nomination(pod.key)
            try:
                self.assume(pod, ttl)
            except (KeyError, ValueError):
                return False
            self._nominated[pod.key] = pod.node
            return True

    def release_nomination(self, key: str) -> bool:
        """Drop ``key``'s nomination, if it has one (idempotent). True if one was dropped."""
        with self._lock:
            if self._nominated.pop(key, None) is None:
                return False
            return self.forget(key)

    def assume_for_bind(
        self,
        key: str,
        node: str,
        choose: Callable[[ClusterSnapshot, tuple[int, ...] | None], PodInfo | str],
    ) -> PodInfo | str:
        """At bind, atomically: take ``key``'s nomination on ``node``
        (:meth:`take_nomination`), choose with it (``choose(snapshot, nominated GPUs or
        None)``) and assume the choice; on an error string the nomination is released too."""
        with self._lock:
            nominated = self.take_nomination(key, node)
            choice = self.assume_chosen(lambda s: choose(s, nominated))
            if isinstance(choice, str):
                if nominated is not None:
                    self.forget(key)
            else:
                self._binding[key] = choice.node
            return choice

    def binding(self, key: str) -> str | None:
        """The node ``key``'s bind is writing to (assumed at bind, not yet confirmed or
        forgotten), or None. kube-scheduler gives up on a bind after its ``httpTimeout``
        and schedules the pod again while the write may still land: a filter then must not
        decide afresh (the new hold would replace the one the write carries, and free its
        GPUs for others), but offer that node alone."""
        if key not in self._binding:  # every filter asks: no lock for the usual answer
            return None
        with self._lock:
            node = self._binding.get(key)
            if node is None:
                return None
            pod = self._snap.pods.get(key)
            if pod is None or not pod.assumed or pod.node != node:
                del self._binding[key]  # settled some other way (a rebuild, the watch)
                return None
            return node

    def take_nomination(self, key: str, node: str) -> tuple[int, ...] | None:
        """At bind: the GPUs nominated for ``key`` on ``node`` (still held, now without a
        TTL, until the caller assumes the bound pod over them), or None. A nomination on
        another node is released."""
        with self._lock:
            nominated = self._nominated.pop(key, None)
            if nominated is None:
                return None
            pod = self._snap.pods.get(key)
            if nominated != node or pod is None or not pod.assumed or pod.node != node:
                self.forget(key)
                return None
            self._expiry.pop(key, None)
            return pod.gpus

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Entries of each of the cache's own stores, with its cap (None: bounded by the
        pods it tracks and their TTLs, not by a count): ``/v1/inspect/state``."""
        with self._lock:
            return {
                "pods": (len(self._snap.pods), None),
                "expiry": (len(self._expiry), None),
                "pending": (len(self._pending), PENDING_MAX_ENTRIES),
                "nominated": (len(self._nominated), None),
                "binding": (len(self._binding), None),
                "bound_unseen": (len(self._bound_unseen), None),
                "unheld": (len(self._unheld), None),
                "gang_plans": (len(self.plans), None),
            }

    def nominations(self) -> int:
        """How many nominations are held."""
        return len(self._nominated)

    def forget(self, key: str) -> bool:
        """Release an assumed pod (idempotent). Bound pods are left alone. True if released."""
        with self._lock:
            self._nominated.pop(key, None)
            self._binding.pop(key, None)
            pod = self._snap.pods.get(key)
            self._expiry.pop(key, None)
            if pod is None or not pod.assumed:
                return False
            self._snap = without_pod(self._snap, key)
            return True

    def confirm(self, key: str, raw: Mapping[str, Any] | None = None) -> bool:
        """Mark an assumed pod as bound (idempotent), with ``raw`` (the bound Pod as the
        API shows it) as its object when given. True if the pod is held."""
        with self._lock:
            pod = self._snap.pods.get(key)
            self._expiry.pop(key, None)
            self._binding.pop(key, None)
            if pod is None:
                return False
            self._nominated.pop(key, None)
            if pod.assumed:
                bound = (
                    replace(pod, assumed=False)
                    if raw is None
                    else replace(pod, assumed=False, raw=raw)
                )
                self._snap = _with_record(self._snap, bound)
                if raw is None:
                    self._bound_unseen[key] = meta(pod.raw).get("uid")
            if raw is not None:
                self._bound_unseen.pop(key, None)
            return True

    def expire(self) -> list[str]:
        """Drop assumptions whose TTL has passed; returns their keys (sorted)."""
        with self._lock:
            now = self._clock()
            gone = sorted(k for k, t in self._expiry.items() if t <= now)
            for k in gone:
                self.forget(k)
            self._expired_total += len(gone)
            return gone

    @property
    def expired_total(self) -> int:
        """Assumptions dropped by :meth:`expire` so far (nominations and gang reservations
        that lapsed: resources freed without any event from the API)."""
        return self._expired_total

    def expiry_of(self, key: str) -> float | None:
        """When an assumption expires (cache clock), None if it does not."""
        return self._expiry.get(key)

    # ---- pending pods (seen by filter, not yet bound) -----------------------------------

    def remember_pending(
        self,
        pod: Mapping[str, Any],
        req: Any = None,
        max_entries: int = PENDING_MAX_ENTRIES,
        max_bytes: int = PENDING_MAX_BYTES,
    ) -> None:
        """Keep the Pod object of a pod being scheduled, so bind can find it, with the
        request ``req`` read from it (if the caller read one).

        Only what decisions need is kept (:func:`redacted_pod`), and the store is bounded
        in entries and in bytes: the least recently seen pods are evicted first, in O(1)
        each (a pod evicted before its bind is fetched from the API, or refused). The
        version already held (the watch's, then filter's) is only marked seen again."""
        key = object_key(pod)
        with self._lock:
            held = self._pending.get(key)
            if held is not None and held.same_version(pod):
                self._pending[key] = PendingPod(
                    held.obj, self._clock(), held.size, held.req if req is None else req
                )
                self._pending.move_to_end(key)
                return
        obj = redacted_pod(pod)
        try:
            size = len(orjson.dumps(obj))
        except TypeError:
            size = 0
        with self._lock:
            self._drop_pending(key)
            self._pending[key] = PendingPod(obj, self._clock(), size, req)
            self._pending_bytes += size
            while self._pending and (
                len(self._pending) > max_entries or self._pending_bytes > max_bytes
            ):
                _, gone = self._pending.popitem(last=False)
                self._pending_bytes -= gone.size

    def _drop_pending(self, key: str) -> None:
        old = self._pending.pop(key, None)
        if old is not None:
            self._pending_bytes -= old.size

    def pending_bytes(self) -> int:
        """JSON bytes held by the pending-pod store."""
        return self._pending_bytes

    def pending(self, key: str) -> Mapping[str, Any] | None:
        """The Pod object last seen for ``key`` in a filter call, if any."""
        p = self._pending.get(key)
        return None if p is None else p.obj

    def pending_request(self, key: str, pod: Mapping[str, Any]) -> Any:
        """The request a filter read from the pending pod ``key`` (a ``PodRequest``), if
        ``pod`` is the object held for it and one was read; else None."""
        p = self._pending.get(key)
        return p.req if p is not None and p.obj is pod else None

    def drop_pending(self, key: str) -> None:
        """Forget a pending pod (idempotent)."""
        with self._lock:
            self._drop_pending(key)

    # ---- events from the API (watch) ----------------------------------------------------

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        """Add or update a node from its object; malformed objects are logged and ignored."""
        with self._lock:
            try:
                self._snap = with_node_object(self._snap, obj, self.params)
            except ObjectError as exc:
                log.warning("ignoring malformed node: %s", exc)
                return
            if self.health_tracker is not None:
                node = self._snap.node(str((obj.get("metadata") or {}).get("name")))
                if node is not None:
                    _, devices = health_inputs(self._snap.extra, self.params)
                    verdict = self._tracked(obj, node, devices)
                    self._snap = with_node_health(self._snap, node.name, verdict)

    def _tracked(
        self, obj: Mapping[str, Any], node: NodeInfo, devices: Mapping[str, Any]
    ) -> NodeHealth:
        """``node``'s verdict observed by the health tracker (which must be set) for its
        object ``obj`` and adjusted by its history, with the node's DRA devices (from
        ``devices``, by node name) and its modeled GPU count."""
        assert self.health_tracker is not None
        return self.health_tracker.adjust(
            obj, node.health, devices=devices.get(node.name, ()), gpu_capacity=node.gpu_capacity
        )

    def _current(
        self,
        raw: Mapping[str, Any],
        base: NodeInfo,
        held: NodeInfo | None,
        devices: Mapping[str, Any],
    ) -> NodeInfo:
        """``base``, the node its object ``raw`` models (:func:`modeled_node`), as the
        snapshot holds it now: with the usage of ``held`` (the same node in the snapshot,
        if there) and, with a health tracker, its verdict adjusted by history. ``held``
        itself when that is what it already is (the common case of a refresh: nothing but
        the time changed)."""
        # the verdict reads the node's name, GPU count and health: base's, usage aside
        verdict = base.health if self.health_tracker is None else self._tracked(raw, base, devices)
        if held is None:
            return base if verdict is base.health else replace(base, health=verdict)
        if holds_usage_of(held, base, verdict):
            return held
        return replace(with_usage_of(base, held), health=verdict)

    def _with_history(self, snap: ClusterSnapshot) -> ClusterSnapshot:
        """``snap`` (just built from objects) with every node's verdict observed by the
        health tracker and adjusted by its history, as a node update does: a rebuild (a
        relist, or any ResourceSlice event) must not drop a flapping, settling or
        XID-burst verdict until the next refresh. ``snap`` itself without a tracker."""
        if self.health_tracker is None:
            return snap
        _, devices = health_inputs(snap.extra, self.params)
        changed: dict[str, NodeInfo] = {}
        for node in snap.nodes:
            if not node.raw:
                continue
            verdict = self._tracked(node.raw, node, devices)
            if verdict != node.health:
                changed[node.name] = replace(node, health=verdict)
        return with_nodes(snap, changed) if changed else snap

    def _as_modeled(self, snap: ClusterSnapshot) -> _Modeled:
        """:attr:`_modeled` for a snapshot just built from objects (``build_snapshot``):
        its nodes are the ``modeled_node`` of their objects with the pods' usage, which
        the refresh replaces whole (``with_usage_of``), and health as the objects say it
        (no history applied yet). A node made unmodeled because several objects share
        its name is left out (its object alone would model it)."""
        at, devices = health_inputs(snap.extra, self.params)
        nodes = {
            n.name: (n.raw, n) for n in snap.nodes if n.raw and n.unmodeled != UNMODELED_DUPLICATE
        }
        return _Modeled(at, devices, self.params, nodes)

    def refresh_nodes(self) -> int:
        """Re-assess every node from its stored object (health ages with time even when no
        event arrives) and apply what changed in one snapshot transition. Returns how many
        nodes changed.

        The assessment runs outside the lock, so filter, bind and the watch are not held
        up; under the lock the changes are rebased on the current snapshot (its pods'
        usage), and a node the watch updated or deleted meanwhile is left as the watch
        made it. A Node object is parsed again only when it, the snapshot's health inputs
        (``now``, the DRA devices) or the parameters changed since the last refresh
        (:attr:`_modeled`); otherwise only the health history is applied at the new time
        (``topoplace bench background-cpu --kind health``).
        """
        snap = self._snap
        params = self.params
        at, devices = health_inputs(snap.extra, params)
        last = self._modeled
        same_inputs = last.at == at and last.devices is devices and last.params is params
        memo = last.nodes if same_inputs else {}
        kept: dict[str, tuple[Any, NodeInfo]] = {}
        assessed: list[tuple[NodeInfo, NodeInfo]] = []
        for node in snap.nodes:
            raw = node.raw
            if not raw:
                continue
            seen = memo.get(node.name)
            if seen is not None and seen[0] is raw:
                base = seen[1]  # the same inputs: the same node (``modeled_node``)
            else:
                try:
                    base = modeled_node(raw, params, at, devices)
                except ObjectError:
                    continue
            kept[node.name] = (raw, base)
            fresh = self._current(raw, base, snap.node(base.name), devices)
            if fresh is not node and fresh != node:
                assessed.append((node, fresh))
        with self._lock:
            current = self._snap
            if not _same_health_inputs(current, snap):
                # Rebuilt (or its slices patched) meanwhile: these nodes were assessed
                # against devices the snapshot no longer has. The rebuild applied the
                # history itself; the next refresh assesses from the new inputs.
                log.debug("health refresh skipped: the snapshot's health inputs changed")
                return 0
            self._modeled = _Modeled(at, devices, params, kept)
            changed: dict[str, NodeInfo] = {}
            for seen, fresh in assessed:
                now = current.node(seen.name)
                if now is None or now.raw is not seen.raw:
                    continue
                changed[now.name] = with_usage_of(fresh, now)
            self._snap = with_nodes(current, changed)
            return len(changed)

    def delete_node(self, name: str) -> None:
        """Remove a node and what it held, and its health history (idempotent): a node
        registered again under that name joins afresh."""
        with self._lock:
            self._snap = without_node(self._snap, name)
        if self.health_tracker is not None:
            self.health_tracker.forget(name)

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        """Apply a Pod object from the API: bound pods hold resources, finished ones don't.

        A pod the API shows bound confirms any assumption for it; if it was assumed on a
        different node or GPUs, the API wins.
        """
        key = object_key(obj)
        node = (obj.get("spec") or {}).get("nodeName")
        with self._lock:
            if not node or pod_terminated(obj):
                old = self._snap.pods.get(key)
                if old is not None and (pod_terminated(obj) or not old.assumed):
                    if not pod_terminated(obj) and self._unseen_as(key, obj):
                        return  # an event from before topoplace's own Binding
                    self._snap = without_pod(self._snap, key)
                    self._expiry.pop(key, None)
                    self._nominated.pop(key, None)
                    self._bound_unseen.pop(key, None)
                return
            self._bound_unseen.pop(key, None)
            self._drop_pending(key)
            old = self._snap.pods.get(key)
            if old is not None and old.node == node and not old.assumed:
                return
            if old is not None and self._confirms(old, obj, node):
                # The API shows the binding topoplace assumed, from the same inputs: the
                # record pod_info_for would build is the assumed one, now confirmed.
                self.confirm(key, obj)
                return
            try:
                info = pod_info_for(self._snap, obj, node, params=self.params)
                self._snap = _holding(self._snap, info)
                self._expiry.pop(key, None)
                self._nominated.pop(key, None)
            except KeyError:
                log.debug("pod %s bound to unknown node %s", key, node)
            except ValueError as exc:
                log.error("pod %s conflicts with held GPUs on %s: %s", key, node, exc)

    def _confirms(self, old: PodInfo, obj: Mapping[str, Any], node: str) -> bool:
        """Whether ``obj`` (a bound Pod from the API) is ``old`` (an assumption on
        ``node``) as the API shows it, read from the same inputs :func:`pod_info_for`
        reads: the same uid, labels, annotations (but the last-applied configuration,
        which a pending pod kept for bind does not carry) and container resources, whole
        GPUs recorded by topoplace's placement, no shares, no replica node. Then the
        PodInfo it would build equals ``old`` but for ``raw`` and ``assumed``, and the
        watch's confirmation of topoplace's own bind skips rebuilding it (about 0.1 ms
        per pod, measured against a real API server)."""
        if not old.assumed or old.node != node or old.shares or old.replicas:
            return False
        if not old.gpu_indices_known:
            return False
        n = self._snap.node(node)
        if n is None or n.replicas:
            return False
        new_m, old_m = meta(obj), meta(old.raw)
        if not old_m or new_m.get("uid") != old_m.get("uid") or not new_m.get("uid"):
            return False
        if new_m.get("labels") != old_m.get("labels"):
            return False
        if _annotations_read(new_m) != _annotations_read(old_m):
            return False
        new_s, old_s = obj.get("spec"), old.raw.get("spec")
        if not isinstance(new_s, Mapping) or not isinstance(old_s, Mapping):
            return False
        return all(
            _resources(new_s.get(kind)) == _resources(old_s.get(kind))
            for kind in ("containers", "initContainers")
        )

    def set_extra(self, key: str, value: Any) -> None:
        """Replace one entry of the snapshot's ``extra`` (e.g. PodGroups from a watch)."""
        with self._lock:
            extra = dict(self._snap.extra)
            extra[key] = value
            self._snap = replace(
                self._snap, extra=MappingProxyType(extra), generation=self._snap.generation + 1
            )

    def dra_inventory(self, snap: ClusterSnapshot | None = None) -> dra.Inventory:
        """The DRA devices of ``snap`` (the current snapshot when None), computed once per
        list of ResourceSlices."""
        slices = (snap or self._snap).extra.get(dra.SLICES_KEY)
        cached = self._dra_inv
        if cached[0] is not slices:
            cached = (slices, _inventory(slices, cached[1]))
            self._dra_inv = cached
        return cached[1]

    def apply_slice_taints(self, new: Mapping[str, Any], node: str) -> bool:
        """A ResourceSlice of ``node`` changed its devices' taints and nothing else
        (:func:`~scheduler.core.dra.taints_only_update`): the slice is replaced in
        ``extra`` and ``node`` alone is assessed again (per-GPU health, XID taints through
        the health tracker), in one transition, instead of rebuilding the snapshot from
        every object (:meth:`replace_all`, 1.17 s at 5,000 nodes with one slice each:
        ``benchmarks/results/verb-cost.md``). The DRA
        inventory and the health inputs' device index are brought up to date for that
        node, not read again from every slice. Returns False, changing nothing, when the
        snapshot holds no slice of that name (the caller rebuilds)."""
        name = (new.get("metadata") or {}).get("name")
        with self._lock:
            snap = self._snap
            before = snap.extra.get(dra.SLICES_KEY)
            slices = list(before) if isinstance(before, list | tuple) else []
            at = _slice_at(slices, name)
            if at < 0:
                return False
            old = slices[at]
            slices[at] = new
            extra = dict(snap.extra)
            extra[dra.SLICES_KEY] = slices
            _, devices_before = health_inputs(snap.extra, self.params)
            index_slice_update(before, slices, old, new, self.params)
            when, devices = health_inputs(extra, self.params)
            held = snap.node(node)
            changed: dict[str, NodeInfo] = {}
            base: NodeInfo | None = None
            if held is not None and held.raw:
                with contextlib.suppress(ObjectError):
                    base = modeled_node(held.raw, self.params, when, devices)
            if held is not None and base is not None:
                fresh = self._current(held.raw, base, held, devices)
                if fresh is not held and fresh != held:
                    changed[node] = fresh
            self._snap = with_nodes(snap, changed, extra)
            inv_slices, inv = self._dra_inv
            if inv_slices is before:
                self._dra_inv = (slices, dra.with_slice_taints(inv, new))
            last = self._modeled
            if (
                last.devices is devices_before
                and last.at == when
                and last.params is self.params
                and held is not None
                and base is not None
            ):
                nodes = dict(last.nodes)
                nodes[node] = (held.raw, base)
                self._modeled = _Modeled(when, devices, self.params, nodes)
            return True

    def apply_claim(self, key: str, claim: Mapping[str, Any] | None) -> None:
        """A ResourceClaim from the API (None: deleted): stored in ``extra`` and, when
        allocated, holding its GPUs in the ledger whoever allocated it; a claim that is not
        (or no longer) allocated releases them, except topoplace's own assumed allocation
        of a claim whose write the watch has not shown yet. The API is the truth: an
        allocation that collides with an *assumed* holding (kube-scheduler allocated the
        same device at the same moment) replaces that assumption, which
        ``scheduler.kube.allocator`` then detects and retries."""
        with self._lock:
            snap = self._snap
            claims = dict(snap.extra.get(dra.CLAIMS_KEY) or {})
            if claim is None:
                claims.pop(key, None)
            else:
                claims[key] = claim
            extra = dict(snap.extra)
            extra[dra.CLAIMS_KEY] = claims
            snap = replace(snap, extra=MappingProxyType(extra), generation=snap.generation + 1)
            hk = dra.holder_key(key)
            old = snap.pods.get(hk)
            self._unheld.pop(key, None)
            info = None
            if claim is not None:
                info = claim_holding_info(claim, self.dra_inventory(snap), snap.node)
            if info is None:
                if old is not None and not (old.assumed and claim is not None):
                    snap = without_pod(snap, hk)
                    self._expiry.pop(hk, None)
                    snap = self._claims_held_again(snap, old.node)
                self._snap = snap
                return
            try:
                snap = _holding(snap, info)
            except DoubleBookingError:
                mask = sum(1 << g for g in info.gpus)
                for k, p in list(snap.pods.items()):
                    if (
                        p.assumed
                        and p.node == info.node
                        and k != hk
                        and sum(1 << g for g in p.gpus) & mask
                    ):
                        log.warning("claim %s took GPUs assumed for %s: assumption dropped", key, k)
                        snap = without_pod(snap, k)
                        self._expiry.pop(k, None)
                try:
                    snap = _holding(snap, info)
                except ValueError as exc:
                    # Two allocators raced for a device (the one that wrote last, topoplace's,
                    # yields); the claim holds its GPUs once the other holding goes.
                    log.warning(
                        "claim %s names GPUs on %s that another holding has (%s): not held "
                        "until that one is released",
                        key,
                        info.node,
                        exc,
                    )
                    self._unheld[key] = info.node
            except KeyError:
                pass
            self._expiry.pop(hk, None)
            self._snap = snap

    def _claims_held_again(self, snap: ClusterSnapshot, node: str) -> ClusterSnapshot:
        """``snap`` with the holdings of the claims refused on ``node`` (:attr:`_unheld`):
        a claim whose devices another holding had when its allocation arrived (two
        allocators raced for one device, and the loser of the race, topoplace, yields) is
        held as soon as the other is released, not never (lock held)."""
        waiting = sorted(k for k, n in self._unheld.items() if n == node)
        claims = snap.extra.get(dra.CLAIMS_KEY) if waiting else None
        if not isinstance(claims, Mapping):
            return snap
        inv = self.dra_inventory(snap)
        for key in waiting:
            claim = claims.get(key)
            info = claim_holding_info(claim, inv, snap.node) if isinstance(claim, Mapping) else None
            if info is None:
                self._unheld.pop(key, None)
                continue
            try:
                snap = _holding(snap, info)
            except ValueError:
                continue  # still held by another: the next release tries again
            self._unheld.pop(key, None)
            log.info("claim %s now holds GPUs %s on %s", key, list(info.gpus), node)
        return snap

    def delete_pod(self, key: str) -> None:
        """A pod is gone: release its resources (idempotent)."""
        with self._lock:
            self._drop_pending(key)
            self._bound_unseen.pop(key, None)
            self._nominated.pop(key, None)
            self._binding.pop(key, None)
            self._expiry.pop(key, None)
            self._snap = without_pod(self._snap, key)

    def _unheld_after_rebuild(self, snap: ClusterSnapshot, inv: dra.Inventory) -> dict[str, str]:
        """:attr:`_unheld` of a snapshot just built from objects: its allocated claims on
        known nodes that hold nothing (``build_snapshot`` counts a device named by two
        claims once, for the first)."""
        claims = snap.extra.get(dra.CLAIMS_KEY)
        if not isinstance(claims, Mapping) or not claims:
            return {}
        out = {}
        for key, claim in claims.items():
            if dra.holder_key(key) in snap.pods or not isinstance(claim, Mapping):
                continue
            info = claim_holding_info(claim, inv, snap.node) if dra.is_allocated(claim) else None
            if info is not None:
                out[key] = info.node
        return out

    def replace_all(
        self,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Rebuild from objects (the initial list, a relist, a ResourceSlice change),
        keeping what topoplace holds that the objects do not show yet: assumptions and
        nominations, and pods it bound whose binding the watch has not shown (listed
        still pending, with the same uid).

        The new snapshot is built without the lock: at 5,000 nodes that takes seconds,
        and filter and bind go on answering from the current snapshot meanwhile. What
        they hold when it is ready is carried over under the lock."""
        pods = pods if isinstance(pods, list) else list(pods)
        # The DRA inventory is read once, here, beside the snapshot (claim holdings and
        # claim pods' filters use it), not by the first claim pod's filter.
        inv = _inventory((extra or EMPTY_MAP).get(dra.SLICES_KEY), self._dra_inv[1])
        snap = build_snapshot(nodes, pods, self.params, extra, inv)
        unheld = self._unheld_after_rebuild(snap, inv)
        modeled = self._as_modeled(snap)
        snap = self._with_history(snap)
        pending = {
            object_key(p): meta(p).get("uid")
            for p in pods
            if isinstance(p, Mapping)
            and not (p.get("spec") or {}).get("nodeName")
            and not pod_terminated(p)
        }
        with self._lock:
            unseen, still_unseen = self._bound_unseen, {}
            for key, pod in self._snap.pods.items():
                if key in snap.pods or pod.node not in snap.index:
                    continue
                bound = key in unseen and key in pending and pending[key] == unseen[key]
                if not pod.assumed and not bound:
                    continue
                try:
                    snap = with_pod(snap, pod)
                except ValueError:
                    log.warning("dropping %s's GPUs: they are now held", key)
                    self._expiry.pop(key, None)
                    continue
                if bound:
                    still_unseen[key] = unseen[key]
            self._bound_unseen = still_unseen
            self._unheld = unheld
            self._modeled = modeled
            self._snap = snap
            self._dra_inv = (snap.extra.get(dra.SLICES_KEY), inv)
        if self.health_tracker is not None:  # nodes gone while the watch was broken
            self.health_tracker.retain(snap.index)

    def _unseen_as(self, key: str, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is the pod topoplace bound as ``key`` and the watch has not
        shown bound yet (:attr:`_bound_unseen`: the same uid)."""
        return key in self._bound_unseen and self._bound_unseen[key] == meta(obj).get("uid")
