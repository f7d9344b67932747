"""List+watch of Nodes, Pods and PodGroups into the :class:`~scheduler.runtime.cache.ClusterCache`.

A small reflector, one per resource, in the manner of client-go's: list, then watch from
the list's ``resourceVersion`` with bookmarks, apply every event to the cache, and

* relist on ``410 Gone`` (an ``ERROR`` event or a 410 answer to the watch request): the
  store of that resource is replaced and the cache rebuilt with
  :meth:`~scheduler.runtime.cache.ClusterCache.replace_all` (live assumptions survive);
* reconnect after any other failure from the last seen ``resourceVersion``, with capped
  exponential backoff and jitter drawn from a seeded RNG.

What feeds the cache:

* Nodes: all of them.
* Pods: those that hold GPUs, are bound to a node, or carry a gang marker
  (:func:`feeds_cache`). Other pending pods are ignored; a pod that is deleted, or stops
  qualifying, releases what it held. Pending pods that qualify are also remembered with
  :meth:`~scheduler.runtime.cache.ClusterCache.remember_pending`, so bind and the gang layer can
  find them without a prior filter call (e.g. right after a restart).
* PodGroups of the coscheduling (``scheduling.x-k8s.io/v1alpha1``), Volcano
  (``scheduling.volcano.sh/v1beta1``), KAI/Run:ai (``scheduling.run.ai/v2alpha2``) and
  Kubernetes' own (``scheduling.k8s.io/v1alpha2``, 1.36+ with its gate) APIs, and Grove's
  PodGangs (``scheduler.grove.io/v1alpha1``), when the API server serves them (discovered at start; skipped quietly
  otherwise), into ``snapshot.extra["podgroups"]`` as ``{"namespace/name": object}``.
* PodDisruptionBudgets (``policy/v1``), into ``snapshot.extra["poddisruptionbudgets"]``
  the same way, for the preempt verb (``core.disruption``); skipped with a warning when
  the API refuses them.

Objects reach the cache as raw camelCase dicts without ``managedFields``, the same shape
kube-scheduler's extender payloads carry, with ``kind``/``apiVersion`` set.

Health and readiness: :attr:`KubeWatcher.synced` turns true once the initial list of
every resource is in the cache; :attr:`KubeWatcher.last_healthy` is "now" while every
watch is connected, else the moment the earliest still-broken watch broke;
:meth:`KubeWatcher.healthy` is false once a watch has been broken for longer than
``WatchOptions.broken_after_s``.

Concurrency: each resource runs in its own daemon thread. Every store update together
with its cache update happens under one watcher lock, so a relist of one resource (which
rebuilds the cache from all stores) never interleaves with an event of another. A burst
of ResourceSlice changes that need a rebuild is applied by one rebuild on a thread of
its own (``kube-slice-rebuild``, see ``WatchOptions.slice_rebuild_delay_s``), under the
same lock.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.core import dra
from scheduler.core.disruption import BUDGETS_EXTRA
from scheduler.core.dra import gated
from scheduler.core.objects import gang_of, meta, object_key, pod_gpus, pod_terminated
from scheduler.kube import dra as kdra
from scheduler.kube.client import (
    NODES,
    PDBS,
    PODS,
    ApiError,
    KubeApi,
    ResourceKind,
    strip_object,
)
from scheduler.kube.metrics import KubeMetrics
from scheduler.runtime.cache import ClusterCache

log = logging.getLogger(__name__)

PODGROUPS_EXTRA = "podgroups"
"""Key of the PodGroup objects in ``ClusterSnapshot.extra``."""

POD_GROUP_KINDS: tuple[ResourceKind, ...] = (
    ResourceKind("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"),
    ResourceKind("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup"),
    ResourceKind("scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup"),
    ResourceKind("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup"),
    ResourceKind("scheduler.grove.io", "v1alpha1", "podgangs", "PodGang"),
)
"""PodGroup APIs of the gang schedulers topoplace understands, in precedence order (a
later API's object with the same ``namespace/name`` replaces an earlier one's)."""


def feeds_cache(pod: Mapping[str, Any]) -> bool:
    """True for pods the cache must know: bound to a node, holding GPUs, in a gang, or
    gated for topoplace's DRA allocator (``topoplace.io/allocate``)."""
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    if pod_gpus(pod) > 0 or gated(pod):
        return True
    return bool(gang_of(pod)[0])


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """Tuning of the reflectors.

    Attributes:
        broken_after_s: a watch broken for longer than this makes :meth:`healthy` false.
        backoff_initial_s / backoff_max_s: reconnect delay, doubling up to the cap.
        backoff_jitter: the delay is multiplied by a factor in ``[1 - jitter, 1]``.
        seed: seed of the jitter RNG (deterministic delays in tests).
        watch_seconds: server-side duration of one watch request (None: the client's).
        podgroups: discover and watch PodGroup APIs.
        disruption_budgets: watch PodDisruptionBudgets (``policy/v1``) into
            ``snapshot.extra`` (:data:`~scheduler.core.disruption.BUDGETS_EXTRA`): the
            preempt verb honours them as kube-scheduler does. A 403 or 404 skips them
            with a warning (preemption then counts no budget).
        dra: discover and watch ``resource.k8s.io`` ResourceSlices, ResourceClaims and
            DeviceClasses (:mod:`scheduler.kube.dra`).
        slice_rebuild_delay_s: a ResourceSlice change that needs a rebuild of the cache
            (any but a device-taint update: GPUs published, removed, moved) after a quiet
            spell is rebuilt at once; one within this long of the last rebuild waits
            this long for the rest of its burst (a DRA driver rolled out publishes a
            slice per node), then one rebuild applies them all; 0: each rebuilds at
            once, in the watch's thread.
        slice_rebuild_share: those rebuilds take at most this share of the time (a
            rebuild of 2.6 s at 5,000 nodes is followed by at least 7.8 s without one
            at 0.25), see :func:`slice_rebuild_due`.
    """

    broken_after_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    backoff_jitter: float = 0.25
    seed: int = 0
    watch_seconds: int | None = None
    podgroups: bool = True
    disruption_budgets: bool = True
    dra: bool = True
    slice_rebuild_delay_s: float = 0.5
    slice_rebuild_share: float = 0.25


WATCH_LAG_S = 1.0
"""How long before topoplace's watch delivered a change kube-scheduler may have seen it and
retried pods on it: a pod refused that long before a ResourceSlice change counts as
refused while the cache was behind (:attr:`KubeWatcher.on_caught_up`)."""


def slice_rebuild_due(
    now: float,
    stale_since: float | None,
    delay: float,
    last_end: float,
    last_seconds: float,
    share: float,
) -> float:
    """When the rebuild for a ResourceSlice change seen at ``now`` may run, with changes
    pending since ``stale_since`` (None: none) and the last rebuild ended at ``last_end``
    after ``last_seconds``.

    Rebuilds keep to ``share`` of the time: the next starts no sooner than the last one's
    end plus ``last_seconds x (1 / share - 1)``. A change after a quiet spell (nothing
    pending, no rebuild for ``delay`` and that gap) is rebuilt at once (``now``); any
    other waits ``delay`` from the first pending change, for the rest of its burst."""
    gap = last_seconds * (1.0 / share - 1.0) if 0 < share < 1 else 0.0
    if stale_since is None and now >= last_end + max(delay, gap):
        return now
    return max((now if stale_since is None else stale_since) + delay, last_end + gap)


def _pool_slices(store: Mapping[str, Mapping[str, Any]], slice_obj: Mapping[str, Any]) -> int:
    """How many stored ResourceSlices belong to ``slice_obj``'s pool (driver and pool name)."""
    spec = slice_obj.get("spec") or {}
    want = (spec.get("driver"), (spec.get("pool") or {}).get("name"))
    n = 0
    for s in store.values():
        other = s.get("spec") or {}
        n += (other.get("driver"), (other.get("pool") or {}).get("name")) == want
    return n


class Backoff:
    """Capped exponential backoff with downward jitter from a given RNG."""

    def __init__(self, initial: float, cap: float, jitter: float, rng: random.Random) -> None:
        self.initial = initial
        self.cap = cap
        self.jitter = min(max(jitter, 0.0), 1.0)
        self.rng = rng
        self.attempts = 0

    def next(self) -> float:
        """The next delay (seconds): ``min(cap, initial * 2**n) * (1 - jitter * U[0,1))``."""
        base = min(self.cap, self.initial * (2 ** min(self.attempts, 62)))
        self.attempts += 1
        return base * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        """After a success: start again from ``initial``."""
        self.attempts = 0


@dataclass(slots=True, eq=False)
class ResourceStream:
    """Reflector state of one resource (owned by the watcher, guarded by its lock)."""

    kind: ResourceKind
    backoff: Backoff
    rv: str = ""
    store: dict[str, dict[str, Any]] = field(default_factory=dict)
    broken_since: float | None = None
    need_relist: bool = False
    current: Any = None
    thread: threading.Thread | None = None


class KubeWatcher:
    """Keeps a :class:`ClusterCache` in step with the API server.

    Args:
        api: the API (real :class:`~scheduler.kube.client.KubeApi` or a recorded fake).
        cache: the cache to feed.
        options: tuning.
        metrics: adapter metrics (a private registry when None).
        clock: monotonic seconds (injected in tests).
        sleep: interruptible sleep; default waits on the stop event.
        on_synced: called once after the initial sync, before any watch starts (recovery
            runs here, on a cache no event changes meanwhile); retried with backoff if it
            raises.
    """

    def __init__(
        self,
        api: KubeApi,
        cache: ClusterCache,
        options: WatchOptions | None = None,
        metrics: KubeMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        on_synced: Callable[[], Any] | None = None,
    ) -> None:
        self.api = api
        self.on_synced = on_synced
        self.cache = cache
        self.options = options or WatchOptions()
        self.metrics = metrics or KubeMetrics()
        self._clock = clock
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._lock = threading.RLock()
        self._synced = threading.Event()
        rng = random.Random(self.options.seed)
        self._rng = rng
        self._boot_backoff = self._new_backoff()
        self.streams: dict[str, ResourceStream] = {}
        for kind in (NODES, PODS):
            self.streams[kind.name] = ResourceStream(kind, self._new_backoff())
        self._boot_broken_since: float | None = None
        self._boot_thread: threading.Thread | None = None
        self._event_counters: dict[tuple[str, str], Any] = {}
        self._slices_stale_since: float | None = None
        """When the first ResourceSlice change not yet in the cache arrived (None: all
        are in); a rebuild applies them (:meth:`rebuild_stale_slices`)."""
        self._slices_stale = threading.Event()
        self._last_rebuild = (float("-inf"), 0.0)
        """(end, seconds) of the last rebuild, on :attr:`_clock`."""
        self._rebuilder: threading.Thread | None = None
        self._behind_since: float | None = None
        """Since when (the cache's clock, less :data:`WATCH_LAG_S`) the cache is behind on
        ResourceSlice changes it takes by a rebuild; None when it is not."""
        self.on_pod_gone: Callable[[str], Any] | None = None
        """Called with a deleted pod's UID once the cache has let it go (kube mode: the
        preemptor settles a preemption whose last victim it was at once, instead of at its
        next pass, so the freed GPUs are held for their pod sooner)."""
        self.on_event: Callable[[str, str, Mapping[str, Any]], Any] | None = None
        """Called with (resource plural, event type, object) after a pod or DRA event is
        applied, on the watch's thread (kube mode: wakes the gated-pod allocator,
        ``GateAllocator.notify``); must return at once and not raise."""
        self.on_caught_up: Callable[[float], Any] | None = None
        """Called with :attr:`_behind_since` once a rebuild has applied those changes
        (kube mode: wake the pods refused since then, ``ParkedPods.wake_refused_since``):
        kube-scheduler may have retried pods on a change the cache did not have yet, and
        a pod only topoplace refused gets no other event to bring it back."""

    def _new_backoff(self) -> Backoff:
        o = self.options
        return Backoff(o.backoff_initial_s, o.backoff_max_s, o.backoff_jitter, self._rng)

    # ---- state --------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the initial list of every resource is in the cache."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until synced (or the timeout); returns :attr:`synced`."""
        return self._synced.wait(timeout)

    @property
    def last_healthy(self) -> float:
        """Clock time up to which every watch was healthy (now, if all are connected)."""
        with self._lock:
            broken = [s.broken_since for s in self.streams.values() if s.broken_since is not None]
            if self._boot_broken_since is not None:
                broken.append(self._boot_broken_since)
        return min(broken) if broken else self._clock()

    def healthy(self) -> bool:
        """False once some watch has been broken for longer than ``broken_after_s``."""
        ok = self._clock() - self.last_healthy <= self.options.broken_after_s
        self.metrics.watch_healthy.set(1 if ok else 0)
        return ok

    @property
    def kinds(self) -> list[ResourceKind]:
        """Resources being reflected (nodes, pods, then discovered PodGroup APIs)."""
        return [s.kind for s in self.streams.values()]

    def objects(self, kind: ResourceKind) -> list[dict[str, Any]]:
        """A copy of the stored objects of ``kind``, sorted by key."""
        with self._lock:
            s = self.streams.get(kind.name)
            return [] if s is None else [s.store[k] for k in sorted(s.store)]

    def pending_pods(self) -> list[dict[str, Any]]:
        """Stored pods not bound and not finished (GPU or gang pods), sorted by key."""
        with self._lock:
            store = self.streams[PODS.name].store
            return [
                store[k]
                for k in sorted(store)
                if not (store[k].get("spec") or {}).get("nodeName") and not pod_terminated(store[k])
            ]

    def podgroups(self) -> dict[str, Any]:
        """PodGroups of every discovered API by ``namespace/name`` (later APIs win)."""
        with self._lock:
            out: dict[str, Any] = {}
            for s in self.streams.values():
                if s.kind in POD_GROUP_KINDS:
                    out.update(s.store)
            return dict(sorted(out.items()))

    def budgets(self) -> dict[str, Any]:
        """PodDisruptionBudgets by ``namespace/name`` (empty when not watched)."""
        with self._lock:
            s = self.streams.get(PDBS.name)
            return {} if s is None else {k: s.store[k] for k in sorted(s.store)}

    def _mark_broken(self, s: ResourceStream) -> None:
        with self._lock:
            if s.broken_since is None:
                s.broken_since = self._clock()

    def _mark_connected(self, s: ResourceStream) -> None:
        with self._lock:
            s.broken_since = None

    # ---- initial sync -------------------------------------------------------------------

    def discover_podgroups(self) -> list[ResourceKind]:
        """PodGroup APIs the server serves (discovery; quietly skips missing groups)."""
        found = []
        for kind in POD_GROUP_KINDS:
            try:
                res = self.api.api_resources(kind.group, kind.version)
            except ApiError as exc:
                log.warning("discovery of %s/%s failed: %s", kind.group, kind.version, exc)
                continue
            names = {
                r.get("name") for r in (res or {}).get("resources") or () if isinstance(r, Mapping)
            }
            if kind.plural in names:
                found.append(kind)
        return found

    def sync(self) -> None:
        """List every resource and rebuild the cache from scratch; then :attr:`synced`.

        Raises:
            ApiError: a list failed (nothing is changed).
        """
        kinds = [NODES, PODS]
        if self.options.podgroups:
            kinds += self.discover_podgroups()
        if self.options.disruption_budgets:
            kinds.append(PDBS)
        if self.options.dra:
            kinds += kdra.discover(self.api)
        lists: dict[str, dict[str, Any]] = {}
        for kind in kinds:
            try:
                lists[kind.name] = self.api.list(kind)
            except ApiError as exc:
                optional = kind in POD_GROUP_KINDS or kind == PDBS or kdra.is_dra_kind(kind)
                if optional and exc.status in (403, 404):
                    log.warning("not watching %s: %s", kind.name, exc)
                    continue
                raise
        with self._lock:
            for kind in kinds:
                if kind.name not in lists:
                    continue
                s = self.streams.get(kind.name) or ResourceStream(kind, self._new_backoff())
                self.streams[kind.name] = s
                self._load(s, lists[kind.name])
            self._rebuild("sync")
            for obj in self.streams[PODS.name].store.values():
                if not (obj.get("spec") or {}).get("nodeName") and not pod_terminated(obj):
                    self.cache.remember_pending(obj)
            self._synced.set()
        self.metrics.synced.set(1)
        snap = self.cache.snapshot()
        log.info(
            "synced with the API: %d nodes, %d pods holding resources, %d podgroups (%s)",
            len(snap.nodes),
            len(snap.pods),
            len(snap.extra.get(PODGROUPS_EXTRA) or {}),
            ", ".join(k.name for k in self.kinds),
        )

    def _load(self, s: ResourceStream, lst: Mapping[str, Any]) -> None:
        """Replace a stream's store and resourceVersion from a list (lock held)."""
        items: Iterable[Any] = lst.get("items") or ()
        store: dict[str, dict[str, Any]] = {}
        for obj in items:
            if not isinstance(obj, dict):
                continue
            strip_object(obj, s.kind)
            if s.kind == PODS and not feeds_cache(obj):
                continue
            store[self._key(s.kind, obj)] = obj
        s.store = store
        s.rv = str(meta(lst).get("resourceVersion") or "")
        s.need_relist = False

    @staticmethod
    def _key(kind: ResourceKind, obj: Mapping[str, Any]) -> str:
        return str(meta(obj).get("name") or "") if kind == NODES else object_key(obj)

    def _rebuild(self, cause: str) -> None:
        """Rebuild the cache from every store, keeping other ``extra`` entries (lock held);
        counted by ``cause`` and timed (:class:`~scheduler.kube.metrics.KubeMetrics`)."""
        started, at = time.monotonic(), self._clock()
        extra = dict(self.cache.snapshot().extra)
        extra[PODGROUPS_EXTRA] = self.podgroups()
        if PDBS.name in self.streams:
            extra[BUDGETS_EXTRA] = self.budgets()
        if self._dra_stores():
            extra.update(kdra.extra_from_stores(self._dra_stores()))
        self.cache.replace_all(
            self.streams[NODES.name].store.values(),
            list(self.streams[PODS.name].store.values()),
            extra=extra,
        )
        # Every store was read: slice changes pending (no event came meanwhile: the
        # watcher's lock is held) are in. After a failure they stay pending.
        self._slices_stale_since = None
        self._slices_stale.clear()
        self.metrics.slices_pending.set(0)
        self.metrics.rebuilds.labels(cause=cause).inc()
        self.metrics.rebuild_seconds.set(time.monotonic() - started)
        end = self._clock()
        self._last_rebuild = (end, end - at)
        behind, self._behind_since = self._behind_since, None
        if behind is not None and self.on_caught_up is not None:
            try:
                self.on_caught_up(behind)
            except Exception:  # a hook's failure must not fail the rebuild
                log.exception("after the rebuild: waking refused pods failed")

    def _slices_changed(self) -> None:
        """A ResourceSlice change the cache can only take by a rebuild (lock held): at
        once, or marked pending for :meth:`rebuild_stale_slices`."""
        if self._behind_since is None:
            self._behind_since = self.cache.now() - WATCH_LAG_S
        now = self._clock()
        end, seconds = self._last_rebuild
        o = self.options
        due = slice_rebuild_due(
            now,
            self._slices_stale_since,
            o.slice_rebuild_delay_s,
            end,
            seconds,
            o.slice_rebuild_share,
        )
        if o.slice_rebuild_delay_s <= 0 or (self._slices_stale_since is None and due <= now):
            self._rebuild("resourceslices")
            return
        if self._slices_stale_since is None:
            self._slices_stale_since = now
            self.metrics.slices_pending.set(1)
        self._slices_stale.set()

    def pending_slices_due(self) -> float | None:
        """When the pending ResourceSlice changes are due to be rebuilt (on the watcher's
        clock), None when none are pending."""
        with self._lock:
            since = self._slices_stale_since
            if since is None:
                return None
            end, seconds = self._last_rebuild
            o = self.options
            return slice_rebuild_due(
                since, since, o.slice_rebuild_delay_s, end, seconds, o.slice_rebuild_share
            )

    def rebuild_stale_slices(self, force: bool = False) -> bool:
        """Rebuild the cache for the pending ResourceSlice changes if they are due (or
        ``force``); True if it rebuilt."""
        with self._lock:
            due = self.pending_slices_due()
            if due is None or (not force and due > self._clock()):
                return False
            self._rebuild("resourceslices")
            return True

    def _rebuild_loop(self) -> None:
        """The thread that applies pending ResourceSlice changes when they are due."""
        while not self._stop.is_set():
            if not self._slices_stale.wait(timeout=1.0):
                continue
            due = self.pending_slices_due()
            if due is None:
                continue
            wait = due - self._clock()
            if wait > 0:
                self._stop.wait(min(wait, 1.0))
                continue
            try:
                self.rebuild_stale_slices()
            except Exception:  # a bug in rebuilding: keep the thread, retry when due
                log.exception("rebuild for ResourceSlice changes failed")
                with self._lock:
                    self._last_rebuild = (self._clock(), max(self._last_rebuild[1], 1.0))

    def relist(self, s: ResourceStream) -> None:
        """List one resource again (after 410 Gone) and rebuild the cache.

        Raises:
            ApiError: the list failed (the old store stays; retry later).
        """
        lst = self.api.list(s.kind)
        with self._lock:
            self._load(s, lst)
            self._rebuild("relist")
        self.metrics.relists.labels(resource=s.kind.name).inc()
        log.info("relisted %s at resourceVersion %s (%d objects)", s.kind.name, s.rv, len(s.store))

    # ---- events -------------------------------------------------------------------------

    def apply_event(self, s: ResourceStream, event: Mapping[str, Any]) -> None:
        """Apply one watch event to the store and the cache.

        Raises:
            ApiError: an ``ERROR`` event (``.gone`` for 410: the caller relists).
        """
        typ = str(event.get("type") or "")
        obj = event.get("object")
        if not isinstance(obj, dict):
            log.warning("%s watch event %s without an object", s.kind.name, typ)
            return
        counter = self._event_counters.get((s.kind.name, typ))
        if counter is None:  # the labelled child, looked up once per (resource, type)
            counter = self.metrics.watch_events.labels(resource=s.kind.name, type=typ or "?")
            self._event_counters[(s.kind.name, typ)] = counter
        counter.inc()
        if typ == "ERROR":
            raise ApiError.from_status(obj)
        rv = str(meta(obj).get("resourceVersion") or "")
        if typ == "BOOKMARK":
            if rv:
                s.rv = rv
            return
        if typ not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("%s watch: unknown event type %r ignored", s.kind.name, typ)
            return
        strip_object(obj, s.kind)
        with self._lock:
            if s.kind == NODES:
                self._node_event(s, typ, obj)
            elif s.kind == PODS:
                self._pod_event(s, typ, obj)
            elif kdra.is_dra_kind(s.kind):
                self._dra_event(s, typ, obj)
            elif s.kind == PDBS:
                self._store_event(s, typ, obj)
                self.cache.set_extra(BUDGETS_EXTRA, self.budgets())
            else:
                self._group_event(s, typ, obj)
            if rv:
                s.rv = rv
        hook = self.on_event
        if hook is not None and (s.kind == PODS or kdra.is_dra_kind(s.kind)):
            try:
                hook(s.kind.plural, typ, obj)
            except Exception:  # a listener's bug must not break the watch
                log.exception("watch event listener failed")

    def _node_event(self, s: ResourceStream, typ: str, obj: dict[str, Any]) -> None:
        name = self._key(NODES, obj)
        if typ == "DELETED":
            s.store.pop(name, None)
            self.cache.delete_node(name)
            return
        new = name not in s.store or self.cache.snapshot().node(name) is None
        s.store[name] = obj
        self.cache.upsert_node(obj)
        if new:
            # Pods bound to this node may have arrived first (separate streams): apply them.
            pods = self.streams[PODS.name].store
            for key in sorted(pods):
                if (pods[key].get("spec") or {}).get("nodeName") == name:
                    self.cache.upsert_pod(pods[key])

    def _pod_event(self, s: ResourceStream, typ: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        if typ == "DELETED":
            s.store.pop(key, None)
            self.cache.delete_pod(key)
            if self.on_pod_gone is not None:
                self.on_pod_gone(str((obj.get("metadata") or {}).get("uid") or ""))
            return
        if feeds_cache(obj):
            s.store[key] = obj
            self.cache.upsert_pod(obj)
            if not (obj.get("spec") or {}).get("nodeName") and not pod_terminated(obj):
                # Pending GPU / gang pods: bind and the gang layer find them by key even
                # before (or without) a filter call, e.g. right after a restart.
                self.cache.remember_pending(obj)
        elif s.store.pop(key, None) is not None:
            self.cache.delete_pod(key)

    def _dra_stores(self) -> dict[str, dict[str, Any]]:
        """Stores of the watched DRA kinds by plural (lock held)."""
        return {s.kind.plural: s.store for s in self.streams.values() if kdra.is_dra_kind(s.kind)}

    def _dra_event(self, s: ResourceStream, typ: str, obj: dict[str, Any]) -> None:
        """Claims change one ledger holding; a slice whose devices' taints alone changed
        re-reads its node; other slice events re-read every node; classes replace theirs."""
        key = self._key(s.kind, obj)  # namespace/name ("default/" for cluster-scoped kinds)
        old = s.store.get(key)
        if typ == "DELETED":
            s.store.pop(key, None)
        else:
            s.store[key] = obj
        if s.kind.plural == "resourceclaims":
            self.cache.apply_claim(key, None if typ == "DELETED" else obj)
        elif s.kind.plural == "resourceslices":
            node = ""
            if typ == "MODIFIED" and old is not None and self._slices_stale_since is None:
                node = dra.taints_only_update(old, obj, lambda: _pool_slices(s.store, obj))
            # A device's taints changed (its health): that node alone. Anything else
            # (GPUs added or removed, pools moving on), or any change while others wait
            # for their rebuild: every node, from every object, once the burst is in.
            if node and self.cache.apply_slice_taints(obj, node):
                self.metrics.slice_updates.labels(path="node").inc()
            else:
                self.metrics.slice_updates.labels(path="rebuild").inc()
                self._slices_changed()
        else:
            extra = kdra.extra_from_stores(self._dra_stores())
            self.cache.set_extra(dra.CLASSES_KEY, extra[dra.CLASSES_KEY])

    @staticmethod
    def _store_event(s: ResourceStream, typ: str, obj: dict[str, Any]) -> None:
        """A namespaced object added, changed or deleted in ``s``'s store (lock held)."""
        key = object_key(obj)
        if typ == "DELETED":
            s.store.pop(key, None)
        else:
            s.store[key] = obj

    def _group_event(self, s: ResourceStream, typ: str, obj: dict[str, Any]) -> None:
        self._store_event(s, typ, obj)
        self.cache.set_extra(PODGROUPS_EXTRA, self.podgroups())

    # ---- watch loop ---------------------------------------------------------------------

    def watch_once(self, s: ResourceStream) -> int:
        """One watch request from ``s.rv`` until the server ends it; returns the number
        of events applied.

        Raises:
            ApiError: refused, broken, or an ERROR event (``.gone``: relist).
        """
        w = self.api.watch(s.kind, s.rv, self.options.watch_seconds)
        s.current = w
        self._mark_connected(s)
        n = 0
        try:
            for event in w:
                if self._stop.is_set():
                    break
                self.apply_event(s, event)
                if n == 0:
                    s.backoff.reset()
                n += 1
        finally:
            s.current = None
        return n

    def step(self, s: ResourceStream) -> None:
        """One iteration of a resource's loop: relist if needed, then watch once; on
        failure mark the stream broken and wait out the backoff. Never raises ApiError."""
        started = self._clock()
        try:
            if s.need_relist:
                self.relist(s)
            n = self.watch_once(s)
            if n == 0 and self._clock() - started < 1.0 and not self._stop.is_set():
                self._sleep(s.backoff.next())  # the server ended at once: don't spin
            else:
                s.backoff.reset()
        except ApiError as exc:
            if self._stop.is_set():
                return
            if exc.gone:
                s.need_relist = True
                self.metrics.watch_restarts.labels(resource=s.kind.name, reason="gone").inc()
                log.info("%s watch expired (%s): relisting", s.kind.name, exc.message)
                return
            self._mark_broken(s)
            self.metrics.watch_restarts.labels(resource=s.kind.name, reason="error").inc()
            delay = s.backoff.next()
            log.warning("%s watch failed (%s); retrying in %.2fs", s.kind.name, exc, delay)
            self._sleep(delay)
        except Exception:  # a bug in event handling: keep the reflector alive
            if self._stop.is_set():
                return
            self._mark_broken(s)
            delay = s.backoff.next()
            log.exception("%s watch loop error; retrying in %.2fs", s.kind.name, delay)
            self._sleep(delay)

    def _run(self, s: ResourceStream) -> None:
        while not self._stop.is_set():
            self.step(s)

    def _boot(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
                with self._lock:
                    self._boot_broken_since = None
                break
            except ApiError as exc:
                with self._lock:
                    if self._boot_broken_since is None:
                        self._boot_broken_since = self._clock()
                delay = self._boot_backoff.next()
                log.warning("initial list failed (%s); retrying in %.2fs", exc, delay)
                self._sleep(delay)
            except Exception:
                delay = self._boot_backoff.next()
                log.exception("initial sync error; retrying in %.2fs", delay)
                self._sleep(delay)
        while self.on_synced is not None and not self._stop.is_set():
            try:
                self.on_synced()
                break
            except Exception:
                delay = self._boot_backoff.next()
                log.exception("post-sync hook (recovery) failed; retrying in %.2fs", delay)
                self._sleep(delay)
        if self._stop.is_set():
            return
        with self._lock:
            streams = list(self.streams.values())
        for s in streams:
            t = threading.Thread(
                target=self._run, args=(s,), name=f"watch-{s.kind.name}", daemon=True
            )
            s.thread = t
            t.start()
        self._rebuilder = threading.Thread(
            target=self._rebuild_loop, name="kube-slice-rebuild", daemon=True
        )
        self._rebuilder.start()

    def start(self) -> None:
        """Start the initial sync and then one watch thread per resource (daemons)."""
        if self._boot_thread is not None:
            return
        self._boot_thread = threading.Thread(target=self._boot, name="kube-sync", daemon=True)
        self._boot_thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every reflector, closing open watches; waits up to ``timeout`` seconds."""
        self._stop.set()
        with self._lock:
            streams = list(self.streams.values())
        for s in streams:
            w = s.current
            if w is not None:
                w.close()
        deadline = time.monotonic() + timeout
        self._slices_stale.set()  # wakes the rebuild thread, which sees the stop
        threads = [self._boot_thread, self._rebuilder] + [s.thread for s in streams]
        for t in threads:
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop.is_set()
