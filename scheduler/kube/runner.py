"""Kube mode: the extender wired to a live API server (no leader election here).

:func:`build_kube_extender` returns ``(extender, stop)``; the caller serves
``create_app(extender)`` with uvicorn and calls ``stop()`` after uvicorn returns.

Life cycle::

    build  -> watcher thread: list nodes, pods, PodGroups -> cache.replace_all
           -> recovery (placements from annotations, gang plans) -> ready
           -> one watch thread per resource (relist on 410, backoff on errors)
    serve  -> filter / bind answer ``Error`` until ready, so kube-scheduler backs the pod
              off instead of acting on an empty or stale cache
           -> the remediator (``remediator.py``) evicts pods on failed hardware and their
              gang every ``remediation.check_seconds``, once ready (and leading)
    stop() -> new binds are refused ("shutting down": kube-scheduler requeues them),
              in-flight binds finish (up to ``drain_timeout_s``), watches close.

Readiness (``/readyz`` via ``Extender.ready``): initial sync done AND recovery done AND no
watch broken for longer than ``WatchOptions.broken_after_s``.

HA (``KubeOptions.leader_lease``, see ``leader.py``): each replica follows the Lease its
kube-scheduler elects on. A replica whose kube-scheduler does not hold it is a warm standby:
it lists and watches (its cache stays current, ``/readyz`` is true) but holds nothing and
refuses filter and bind with :data:`ERR_NOT_LEADER` (kube-scheduler retries with backoff),
and does not wake parked gang members. On **takeover** it drops whatever it held in memory
(nominations, gang reservations and plans of an earlier term), replays the gang plans from
the bound members' placement records and reserves the open slots again
(``recovery.recover``, the same path as a restart), and only then acts. On **step-down** it
refuses at once and drops what it held. Every decision is persisted on the Binding, so
nothing else has to move between replicas.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson

from scheduler.core.params import SchedParams
from scheduler.core.snapshot import build_snapshot
from scheduler.kube.allocator import GateAllocator
from scheduler.kube.binder import KubeBinder
from scheduler.kube.client import KubeApi, Timeouts
from scheduler.kube.dra import ClaimWriter, is_dra_kind
from scheduler.kube.handoff import HamiNodeLock, HandoffBinder
from scheduler.kube.metrics import KubeMetrics
from scheduler.kube.preemptor import Preemptor
from scheduler.kube.recovery import RecoveryReport, recover
from scheduler.kube.remediator import Remediator
from scheduler.kube.waker import PodWaker
from scheduler.kube.watcher import KubeWatcher, WatchOptions
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.health_tracker import HealthTracker
from scheduler.server import wire
from scheduler.server.extender import Extender
from scheduler.server.metrics import Metrics

log = logging.getLogger(__name__)

ERR_NOT_READY = "topoplace is not ready: cluster state is not synced or a watch is broken"
ERR_SHUTTING_DOWN = "topoplace is shutting down"
ERR_NOT_LEADER = (
    "this topoplace replica is not the leader (its kube-scheduler does not hold the Lease, "
    "or it is taking over); retry"
)


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """Kube-mode settings.

    Attributes:
        context: kubeconfig context (None: the current one).
        timeouts: API request timeouts.
        watch: reflector tuning (broken-watch threshold, backoff, seed).
        drain_timeout_s: how long ``stop()`` waits for in-flight binds.
        expire_interval_s: how often expired assumptions (gang reservations with a TTL)
            are dropped; 0 disables the janitor.
        scheduler_names: kube-scheduler profiles (``schedulerName``) that call topoplace;
            bind refuses pods of any other profile (empty: :data:`DEFAULT_PROFILES`), and
            after a restart, pending gangs of these profiles are planned (reserved) again
            before readiness. Gangs with a member bound by topoplace always are.
        dra_allocate: when the server serves DRA, allocate the claims of pods gated with
            ``topoplace.io/allocate`` (``scheduler.kube.allocator``).
        health_refresh_interval_s: how often every node is re-assessed by the health
            tracker (heartbeats age, settle times and failure memories expire without any
            watch event); 0 disables it.
        health_clock: the health tracker's clock as (epoch, wall, rate): at wall-clock
            time ``wall`` it reads ``epoch`` and it advances ``rate`` seconds per second
            (:class:`ReplayClock`; a trace replayed faster than real time publishes its
            signals' timestamps in trace time). None: the wall clock.
        leader_lease: (namespace, name) of the Lease this replica's kube-scheduler elects
            its leader on; this replica acts only while that kube-scheduler holds it (see
            the module docstring). None: always act (one replica).
        leader_identity: this replica's identity prefix in the Lease (default: the
            hostname, shared with kube-scheduler in the same pod).
        leader_poll_s: seconds between two reads of the Lease.
    """

    context: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    watch: WatchOptions = field(default_factory=WatchOptions)
    drain_timeout_s: float = 25.0
    expire_interval_s: float = 1.0
    scheduler_names: tuple[str, ...] = ()
    health_refresh_interval_s: float = 30.0
    health_clock: tuple[float, float, float] | None = None
    dra_allocate: bool = True
    leader_lease: tuple[str, str] | None = None
    leader_identity: str = ""
    leader_poll_s: float = 1.0


ENV_SCHEDULER_NAMES = "TOPOPLACE_SCHEDULER_NAMES"
DEFAULT_PROFILES = ("topoplace",)
"""Profiles topoplace binds for when ``TOPOPLACE_SCHEDULER_NAMES`` names none (the
profile of the shipped scheduler configuration)."""
ENV_BROKEN_AFTER = "TOPOPLACE_WATCH_BROKEN_AFTER_S"
ENV_SLICE_REBUILD_DELAY = "TOPOPLACE_SLICE_REBUILD_DELAY_S"
ENV_LEADER_LEASE = "TOPOPLACE_LEADER_LEASE"
ENV_LEADER_IDENTITY = "TOPOPLACE_LEADER_IDENTITY"
ENV_HEALTH_REFRESH = "TOPOPLACE_HEALTH_REFRESH_S"
ENV_HEALTH_CLOCK = "TOPOPLACE_HEALTH_CLOCK"


class ReplayClock:
    """A clock for health signals replayed faster than real time: reads ``epoch`` at
    wall-clock time ``wall`` and advances ``rate`` seconds per wall-clock second.

    Health compares published timestamps (a heartbeat's age, an XID window, a settle time)
    with its clock; a replay that compresses a day into minutes writes the trace's own
    timestamps, and this clock makes their ages what they were in the trace."""

    def __init__(self, epoch: float, wall: float, rate: float) -> None:
        if not (math.isfinite(epoch) and math.isfinite(wall) and math.isfinite(rate)):
            raise ValueError("a replay clock needs finite epoch, wall and rate")
        if rate <= 0:
            raise ValueError(f"a replay clock's rate must be positive, got {rate}")
        self.epoch, self.wall, self.rate = epoch, wall, rate

    def __call__(self) -> float:
        return self.epoch + (time.time() - self.wall) * self.rate

    @classmethod
    def parse(cls, text: str) -> tuple[float, float, float]:
        """``EPOCH@WALL*RATE`` (epoch seconds, epoch seconds, a positive factor).

        Raises:
            ValueError: anything else.
        """
        m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*@\s*([0-9.eE+-]+)\s*\*\s*([0-9.eE+-]+)\s*", text)
        try:
            if m is None:
                raise ValueError
            got = (float(m[1]), float(m[2]), float(m[3]))
            cls(*got)
        except ValueError:
            raise ValueError(
                f"{ENV_HEALTH_CLOCK} must be EPOCH@WALL*RATE (e.g. 1798761600@1764700000*60: "
                f"trace time 1798761600 at wall time 1764700000, 60 s per second), got {text!r}"
            ) from None
        return got


def options_from_env(environ: Mapping[str, str] | None = None) -> KubeOptions:
    """Defaults overridable without CLI flags (e.g. in the Deployment):
    ``TOPOPLACE_SCHEDULER_NAMES`` (comma-separated profiles that call topoplace) and
    ``TOPOPLACE_WATCH_BROKEN_AFTER_S`` (readiness threshold for a broken watch),
    ``TOPOPLACE_SLICE_REBUILD_DELAY_S`` (``WatchOptions.slice_rebuild_delay_s``: how long a
    burst of ResourceSlice changes gathers before its rebuild),
    ``TOPOPLACE_LEADER_LEASE`` (``NAMESPACE/NAME``: follow that Lease),
    ``TOPOPLACE_LEADER_IDENTITY``, ``TOPOPLACE_HEALTH_REFRESH_S`` (how often every node's
    health is re-assessed, 0 to 3600 s; 0 never) and ``TOPOPLACE_HEALTH_CLOCK``
    (:meth:`ReplayClock.parse`: health read on a replay's clock).

    Raises:
        ValueError: a value out of range or unreadable (the message names the variable).
    """
    import os

    env = os.environ if environ is None else environ
    opts = KubeOptions()
    names = tuple(n.strip() for n in env.get(ENV_SCHEDULER_NAMES, "").split(",") if n.strip())
    if names:
        opts = replace(opts, scheduler_names=names)
    broken = _seconds(env, ENV_BROKEN_AFTER, 86400)
    if broken is not None:
        opts = replace(opts, watch=replace(opts.watch, broken_after_s=broken))
    delay = _seconds(env, ENV_SLICE_REBUILD_DELAY, 600)
    if delay is not None:
        opts = replace(opts, watch=replace(opts.watch, slice_rebuild_delay_s=delay))
    lease = env.get(ENV_LEADER_LEASE, "").strip()
    if lease:
        from scheduler.kube.leader import parse_lease_ref

        opts = replace(opts, leader_lease=parse_lease_ref(lease))
    identity = env.get(ENV_LEADER_IDENTITY, "").strip()
    if identity:
        opts = replace(opts, leader_identity=identity)
    every = _seconds(env, ENV_HEALTH_REFRESH, 3600)
    if every is not None:
        opts = replace(opts, health_refresh_interval_s=every)
    clock = env.get(ENV_HEALTH_CLOCK, "").strip()
    if clock:
        opts = replace(opts, health_clock=ReplayClock.parse(clock))
    return opts


def _seconds(env: Mapping[str, str], name: str, most: float) -> float | None:
    """The seconds ``env[name]`` gives (None when unset or blank).

    Raises:
        ValueError: not a number in ``0 .. most`` (the message names the variable).
    """
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= most:
        raise ValueError(f"{name} must be 0..{most:g} seconds, got {text!r}")
    return value


class InFlight:
    """Counts calls in progress; after :meth:`close` refuses new ones. Thread-safe."""

    def __init__(self, gauge: Any = None) -> None:
        self._cv = threading.Condition()
        self._n = 0
        self._closed = False
        self._gauge = gauge

    def enter(self) -> bool:
        """Start a call; False (and nothing counted) once closed."""
        with self._cv:
            if self._closed:
                return False
            self._n += 1
            if self._gauge is not None:
                self._gauge.set(self._n)
            return True

    def exit(self) -> None:
        """End a call started with a successful :meth:`enter`."""
        with self._cv:
            self._n -= 1
            if self._gauge is not None:
                self._gauge.set(self._n)
            self._cv.notify_all()

    def close(self) -> None:
        """Refuse new calls from now on (idempotent)."""
        with self._cv:
            self._closed = True

    @property
    def count(self) -> int:
        """Calls in progress."""
        return self._n

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is in progress; False if the timeout passed first."""
        with self._cv:
            return self._cv.wait_for(lambda: self._n == 0, timeout)


class KubeReadiness:
    """``Extender.ready`` in kube mode: synced, recovered, and watches healthy."""

    def __init__(self, watcher: KubeWatcher) -> None:
        self.watcher = watcher
        self.recovered = threading.Event()
        self.report: RecoveryReport | None = None

    def __call__(self) -> bool:
        return self.watcher.synced and self.recovered.is_set() and self.watcher.healthy()


class Leadership:
    """Whether this replica acts (HA, see the module docstring).

    Attributes:
        leader: the kube-scheduler beside this replica holds the Lease (set by the
            follower before its callbacks run).
        active: leader AND the takeover (drop what was held, replay plans) is done: the
            verbs act only then.
        takeovers: how many takeovers completed.
    """

    def __init__(self) -> None:
        self.leader = False
        self.active = False
        self.takeovers = 0
        self.lock = threading.Lock()
        """Serializes takeover, step-down and the initial recovery."""


class KubeExtender(Extender):
    """An :class:`Extender` that refuses filter and bind until ready (and, with HA, while
    this replica does not lead), and counts binds so shutdown can drain them. Prioritize
    and preempt are never refused (they change nothing; a prioritize error is ignored by
    kube-scheduler anyway)."""

    def __init__(
        self,
        *args: Any,
        inflight: InFlight | None = None,
        leadership: Leadership | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.inflight = inflight or InFlight()
        self.leadership = leadership

    def _refusal(self) -> str:
        """Why filter and bind must not act now ("" when they may)."""
        if not self.ready():
            return ERR_NOT_READY
        lead = self.leadership
        if lead is not None and not lead.active:
            return ERR_NOT_LEADER
        return ""

    def filter(self, body: Any) -> dict[str, Any]:
        """``ExtenderFilterResult``; ``Error`` while not ready or not leading."""
        why = self._refusal()
        if why:
            self.metrics.filter_errors.labels(reason="not ready").inc()
            return wire.filter_result(None, None, {}, {}, why)
        return super().filter(body)

    def filter_json(self, body: Any, raw: bytes | None = None) -> bytes:
        """:meth:`Extender.filter_json`; ``Error`` while not ready or not leading."""
        why = self._refusal()
        if why:
            self.metrics.filter_errors.labels(reason="not ready").inc()
            return orjson.dumps(wire.filter_result(None, None, {}, {}, why))
        return super().filter_json(body, raw)

    def bind(self, body: Any, caller: str = "") -> dict[str, str]:
        """``ExtenderBindingResult``; ``Error`` while not ready or shutting down."""
        refused = self._admit_bind()
        if refused is not None:
            return refused
        try:
            return super().bind(body, caller)
        finally:
            self.inflight.exit()

    async def bind_async(self, body: Any, caller: str = "") -> dict[str, str]:
        """:meth:`bind` on the event loop (the API write awaited, no worker thread)."""
        refused = self._admit_bind()
        if refused is not None:
            return refused
        try:
            return await super().bind_async(body, caller)
        finally:
            self.inflight.exit()

    def _admit_bind(self) -> dict[str, str] | None:
        """Count a bind as in flight (the caller then calls ``inflight.exit()``), or its
        refusal, with nothing counted, while shutting down, not ready or not leading."""
        if not self.inflight.enter():
            self.metrics.binds.labels(result="error").inc()
            return {"Error": ERR_SHUTTING_DOWN}
        why = self._refusal()
        if why:
            self.inflight.exit()
            self.metrics.binds.labels(result="error").inc()
            return {"Error": why}
        return None


@dataclass(slots=True, eq=False)
class KubeRuntime:
    """Everything kube mode runs, for callers that need more than ``(extender, stop)``."""

    api: KubeApi
    cache: ClusterCache
    watcher: KubeWatcher
    binder: KubeBinder
    extender: KubeExtender
    readiness: KubeReadiness
    options: KubeOptions
    kube_metrics: KubeMetrics
    waker: PodWaker | None = None
    allocator: Any = None
    follower: Any = None
    """The :class:`~scheduler.kube.leader.LeaseFollower` (HA), or None."""
    remediator: Remediator | None = None
    """Evicts pods on failed hardware (policy ``remediation:``), or None."""
    preemptor: Preemptor | None = None
    """Evicts for pods kube-scheduler will not preempt for (``preemption.start``)."""
    _janitor_stop: threading.Event = field(default_factory=threading.Event)
    _janitor: threading.Thread | None = None
    _stopped: bool = False

    def start(self) -> None:
        """Start the reflectors (and recovery after the initial sync), the janitor and the
        Lease follower."""
        self.watcher.start()
        if self.follower is not None:
            self.follower.start()
        if self.remediator is not None:
            self.remediator.start()
        if self.preemptor is not None:
            self.preemptor.start()
        if self.options.expire_interval_s > 0 and self._janitor is None:
            self._janitor = threading.Thread(
                target=self._expire_loop, name="kube-expire", daemon=True
            )
            self._janitor.start()

    def _expire_loop(self) -> None:
        last_refresh = time.monotonic()
        every = self.options.health_refresh_interval_s
        tick = self.options.expire_interval_s
        if 0 < every < tick:  # a replay's fast refresh: wake as often as it asks
            tick = every
        while not self._janitor_stop.wait(tick):
            try:
                gone = self.cache.expire()
                if gone:
                    log.info("dropped %d expired assumption(s)", len(gone))
            except Exception:
                log.exception("expiring assumptions failed")
            poll = getattr(self.extender.gangs, "poll", None)
            lead = self.extender.leadership
            if callable(poll) and (lead is None or lead.active):
                try:
                    poll(self.extender)
                except Exception:
                    log.exception("waking parked gang members failed")
            if lead is None or lead.active:
                try:
                    p = self.extender.params
                    window = max(p.extender.nomination_ttl_seconds, p.gang.plan_ttl_seconds)
                    self.extender.parked.poll(self.cache, window)
                except Exception:
                    log.exception("waking refused pods failed")
            every = self.options.health_refresh_interval_s
            tracker = self.cache.health_tracker
            if tracker is not None and every > 0 and time.monotonic() - last_refresh >= every:
                last_refresh = time.monotonic()
                try:
                    tracker.refresh(self.cache)
                except Exception:
                    log.exception("health refresh failed")

    def stop(self, timeout: float | None = None) -> bool:
        """Refuse new binds, wait for in-flight ones, stop the watches; True if drained."""
        if self._stopped:
            return True
        self._stopped = True
        wait = self.options.drain_timeout_s if timeout is None else timeout
        self.extender.inflight.close()
        drained = self.extender.inflight.wait_idle(wait)
        if not drained:
            log.warning(
                "shutdown: %d bind(s) still in flight after %.1fs",
                self.extender.inflight.count,
                wait,
            )
        self._janitor_stop.set()
        if self.remediator is not None:
            self.remediator.stop()
        if self.preemptor is not None:
            self.preemptor.stop()
        if self.allocator is not None:
            self.allocator.stop()
        if self.follower is not None:
            self.follower.stop()
        if self.waker is not None:
            self.waker.close()
        self.watcher.stop()
        self.api.close()
        log.info("kube mode stopped (binds drained: %s)", drained)
        return drained


def _default_gangs() -> Any:
    """The gang runtime when the gang layer is installed, else None (pods alone)."""
    try:
        from scheduler.runtime.gangs import GangRuntime  # type: ignore[attr-defined]
    except ImportError:
        return None
    return GangRuntime()


_AUTO: Any = object()


def build_kube_runtime(
    api: KubeApi,
    params: SchedParams,
    *,
    options: KubeOptions | None = None,
    metrics: Metrics | None = None,
    gangs: Any = _AUTO,
    clock: Callable[[], float] | None = None,
) -> KubeRuntime:
    """Wire cache, watcher, binder, recovery and readiness over ``api`` (not started)."""
    opts = options or KubeOptions()
    metrics = metrics or Metrics()
    km = KubeMetrics(metrics.registry)
    if gangs is _AUTO:
        gangs = _default_gangs()
    clock_kw: dict[str, Any] = {} if clock is None else {"clock": clock}
    cache = ClusterCache(
        build_snapshot([], [], params),
        params,
        health_tracker=HealthTracker(
            params.health,
            time.time if opts.health_clock is None else ReplayClock(*opts.health_clock),
        ),
        **clock_kw,
    )
    watcher = KubeWatcher(api, cache, opts.watch, km, **clock_kw)
    binder = KubeBinder(api, km)
    readiness = KubeReadiness(watcher)
    sharing = params.sharing
    handoff = HandoffBinder(
        binder, HamiNodeLock(api, sharing.hami_lock_expiry_seconds), sharing.hami_lock
    )
    ext = KubeExtender(
        cache,
        handoff,
        metrics,
        ready=readiness,
        gangs=gangs,
        fetch_pod=binder.fetch_pod,
        inflight=InFlight(km.binds_in_flight),
        profiles=opts.scheduler_names or DEFAULT_PROFILES,
        leadership=Leadership() if opts.leader_lease is not None else None,
    )
    lead = ext.leadership
    # Pods kube-scheduler parked after topoplace alone refused them come back when
    # woken: gang members (the gang runtime) and single GPU pods (ext.parked).
    # And any pod refused while the cache was behind on ResourceSlice changes, once a
    # rebuild has applied them (kube-scheduler may have retried it on the change first).
    waker = PodWaker(api, km)
    ext.parked.waker = waker.wake
    if gangs is not None and hasattr(gangs, "waker"):
        gangs.waker = waker.wake

    def caught_up(since: float) -> None:
        if lead is None or lead.active:
            ext.parked.wake_refused_since(since, cache, "ResourceSlice changes applied")

    watcher.on_caught_up = caught_up
    rt = KubeRuntime(api, cache, watcher, binder, ext, readiness, opts, km, waker)
    rt.remediator = Remediator(
        api,
        cache,
        params,
        opts.scheduler_names or DEFAULT_PROFILES,
        km,
        metrics.replacements,
        may_act=lambda: readiness() and (lead is None or lead.active),
        preemptions=ext.preemptions,
    )
    ext.remediation_view = rt.remediator.view
    rt.preemptor = Preemptor(
        api, ext, km, waker.wake, may_act=lambda: readiness() and (lead is None or lead.active)
    )
    watcher.on_pod_gone = rt.preemptor.pod_gone

    def start_allocator() -> None:
        """DRA served: allocate claims of pods gated with topoplace.io/allocate (only
        where this replica acts: the allocation is a write)."""
        version = next((k.version for k in watcher.kinds if is_dra_kind(k)), None)
        if opts.dra_allocate and version is not None and rt.allocator is None:
            rt.allocator = GateAllocator(
                cache,
                ClaimWriter(api, version),
                watcher.pending_pods,
                ext.dra.likely_kube_picks,
                router=ext.dra,
            )
            ext.dra.reallocate = rt.allocator.reallocate
            watcher.on_event = rt.allocator.notify  # a gated pod or a claim: a pass at once
            rt.allocator.start()

    def after_sync() -> None:
        if lead is None:
            readiness.report = recover(ext, watcher.pending_pods(), opts.scheduler_names)
            readiness.recovered.set()
            start_allocator()
            return
        with lead.lock:  # a standby has nothing to recover until it takes over
            if lead.leader:
                _take_over(ext, watcher, readiness, opts, km)
                start_allocator()
        readiness.recovered.set()

    watcher.on_synced = after_sync
    if lead is not None and opts.leader_lease is not None:
        from scheduler.kube.leader import LeaseFollower, default_identity, kube_lease_getter

        ns, name = opts.leader_lease

        def started() -> None:
            lead.leader = True
            with lead.lock:
                if watcher.synced:  # else the initial recovery takes over
                    _take_over(ext, watcher, readiness, opts, km)
                    start_allocator()

        def stopped() -> None:
            lead.leader = False
            lead.active = False  # refuse at once
            km.leader.set(0)
            with lead.lock:
                if rt.allocator is not None:
                    watcher.on_event = None
                    rt.allocator.stop()
                    rt.allocator = None
                _drop_held(ext)

        rt.follower = LeaseFollower(
            kube_lease_getter(api, ns, name),
            opts.leader_identity or default_identity(),
            f"{ns}/{name}",
            on_started=started,
            on_stopped=stopped,
            poll_s=opts.leader_poll_s,
            **clock_kw,
        )
    return rt


def _drop_held(ext: KubeExtender) -> None:
    """Forget every assumption (nominations, gang reservations, binds never confirmed) and
    every gang plan, and start the gang handler afresh: what a replica held in memory in an
    earlier term may be stale. Bound pods (the API's truth) stay."""
    cache = ext.cache
    with cache.lock:
        for key, pod in list(cache.snapshot().pods.items()):
            if pod.assumed:
                cache.forget(key)
        cache.plans.clear()
    old = ext.gangs
    if old is not None:
        fresh = type(old)(policy=getattr(old, "policy", None))
        if hasattr(old, "waker"):
            fresh.waker = old.waker
        ext.gangs = fresh


def _take_over(
    ext: KubeExtender,
    watcher: KubeWatcher,
    readiness: KubeReadiness,
    opts: KubeOptions,
    km: KubeMetrics,
) -> None:
    """Become the acting replica (``leadership.lock`` held, cache synced): drop what was
    held, replay the gang plans from the placement records and reserve again, then act."""
    lead = ext.leadership
    assert lead is not None
    _drop_held(ext)
    report = recover(ext, watcher.pending_pods(), opts.scheduler_names)
    readiness.report = report
    if lead.leader:  # still leading after the replay
        lead.active = True
        lead.takeovers += 1
        km.leader.set(1)
        log.info(
            "takeover %d done: %d gang plan(s) replayed, %d gang(s) planned again",
            lead.takeovers,
            report.gangs,
            report.replanned,
        )


def build_kube_extender(
    kubeconfig: str | None,
    params: SchedParams,
    *,
    options: KubeOptions | None = None,
    metrics: Metrics | None = None,
    gangs: Any = _AUTO,
) -> tuple[Extender, Callable[..., bool]]:
    """Kube mode: an extender fed by list+watch, binding through the API; started.

    Args:
        kubeconfig: kubeconfig path; None: ``$KUBECONFIG``, in-cluster, ``~/.kube/config``.
        params: scheduling parameters.
        options: kube-mode settings (default: :func:`options_from_env`).
        metrics: the extender's metrics (adapter metrics join its registry).
        gangs: gang handler; default: ``scheduler.runtime.gangs.GangRuntime()`` when installed.

    Returns:
        ``(extender, stop)``. ``stop(timeout=None) -> bool`` refuses new binds, waits for
        in-flight ones (``options.drain_timeout_s`` by default) and stops the watches;
        call it after the HTTP server has stopped. It returns True when every bind
        finished.

    Raises:
        ApiUnavailable: no usable Kubernetes configuration.
    """
    opts = options or options_from_env()
    api = KubeApi.from_config(kubeconfig, opts.context, opts.timeouts)
    rt = build_kube_runtime(api, params, options=opts, metrics=metrics, gangs=gangs)
    rt.start()
    return rt.extender, rt.stop


def on_app_shutdown(app: Any, fn: Callable[[], Any]) -> None:
    """Run ``fn()`` when the ASGI app's lifespan ends.

    uvicorn runs the lifespan shutdown after it stopped accepting connections and waited
    for in-flight requests, and *before* it re-raises SIGTERM/SIGINT (which would kill the
    process before a ``finally:`` after ``uvicorn.run`` could run). Use it to call the
    ``stop`` of :func:`build_kube_extender` on graceful shutdown; ``stop`` is idempotent.
    """
    import contextlib

    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> Any:
        async with inner(a) as state:
            try:
                yield state
            finally:
                fn()

    app.router.lifespan_context = lifespan


def readiness_detail(extender: Extender) -> Mapping[str, Any]:
    """A small dict describing kube-mode readiness (for logs and debugging)."""
    r = extender.ready
    if not isinstance(r, KubeReadiness):
        return {"ready": bool(r())}
    w = r.watcher
    return {
        "ready": r(),
        "synced": w.synced,
        "recovered": r.recovered.is_set(),
        "watches_healthy": w.healthy(),
        "resources": [k.name for k in w.kinds],
        "recovery": None if r.report is None else asdict(r.report),
    }
