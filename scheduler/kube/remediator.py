"""Evict pods on failed hardware so their work is re-placed (policy ``remediation:``).

The decision is the pure :func:`scheduler.core.remediation.plan`; this module keeps its
state and does the writes:

- since when each pod has been on failed hardware (``remediation.after_seconds`` is
  measured on the health tracker's clock, the one the verdicts were made on);
- the evictions: ``POST pods/{name}/eviction`` (``policy/v1``), with the pod's UID as a
  precondition (a namesake recreated meanwhile is never evicted) and
  ``remediation.grace_period_seconds``. The Eviction API honours PodDisruptionBudgets: a
  ``429`` is ``blocked`` and tried again after :data:`RETRY_BLOCKED_S`. RBAC: ``create``
  on ``pods/eviction`` (``config/deploy/rbac.yaml``);
- at most ``remediation.max_evictions_per_minute`` evictions in any 60 s (a gang goes
  whole or waits, unless it alone is larger than the bound);
- an Event on each evicted pod (``events.k8s.io/v1``, reason :data:`EVENT_REASON`,
  action ``Evict``, a note that names the failure), so ``kubectl describe`` and
  ``kubectl get events`` say why it went (RBAC: ``create`` on ``events``); a failed Event
  write is logged, never retried;
- the re-placements: a pod bound after an eviction with the same controller (owner
  reference) or gang as an evicted pod is its successor, counted in
  ``topoplace_replacements{kind}`` and timed in ``topoplace_replacement_seconds``.

It acts only while the extender is ready and, with HA, this replica leads (an eviction is a
write, like a bind). ``mode: dry-run`` logs and counts what it would evict, once per pod.
Metrics: ``topoplace_remediation_evictions{kind,outcome}``,
``topoplace_pods_on_failed_hardware``, ``topoplace_remediation_held``.
"""

from __future__ import annotations

import datetime
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.model import PodInfo
from scheduler.core.params import SchedParams
from scheduler.core.remediation import (
    KIND_PREEMPTED,
    Fault,
    Plan,
    fault_rows,
    gang_key,
    on_failed_hardware,
    plan,
    teardown_groups,
)
from scheduler.kube.client import ApiError, KubeApi
from scheduler.kube.loop import Periodic
from scheduler.kube.metrics import KubeMetrics

log = logging.getLogger(__name__)

EVENT_REASON = "HardwareFailure"
EVENT_REASON_PREEMPTED = "GangMemberPreempted"
"""The Event reason when a pod goes because a member of its gang was preempted."""
EVENT_CONTROLLER = "topoplace.io/remediation"
RETRY_BLOCKED_S = 10.0
"""Seconds before an eviction a PodDisruptionBudget refused (or that failed) is tried again."""
EVICTED_MEMORY_S = 120.0
"""An evicted pod is not evicted again for this long (its deletion reaches the watch
first)."""
RECENT = 100
"""Actions :meth:`Remediator.view` shows."""
SUCCESSOR_WINDOW_S = 3600.0
"""How long after an eviction a newly bound pod of the same controller or gang counts as
its re-placement."""


def _owner(p: PodInfo) -> str:
    """The UID of the pod's controller ("" without one)."""
    meta = p.raw.get("metadata") if isinstance(p.raw, Mapping) else None
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for r in refs if isinstance(refs, list) else ():
        if isinstance(r, Mapping) and r.get("controller") and isinstance(r.get("uid"), str):
            return str(r["uid"])
    return ""


def _lineage(p: PodInfo) -> str:
    """What a successor shares with the pod: its gang, else its controller ("" if none)."""
    gang = gang_key(p)
    if gang:
        return "gang:" + gang
    owner = _owner(p)
    return "owner:" + owner if owner else ""


@dataclass(slots=True)
class _Awaiting:
    """Evictions of one lineage whose successors have not been bound yet."""

    known: set[str]
    """UIDs of the lineage's pods at eviction time (never successors)."""
    pending: deque[tuple[float, str]] = field(default_factory=deque)
    """(wall time of the eviction, kind), oldest first."""


class Remediator:
    """Looks every ``remediation.check_seconds`` and evicts what :func:`plan` says is due.

    Args:
        api: the API client.
        cache: the cluster cache (its snapshot and its health tracker's clock).
        params: the policy (``remediation`` and ``health``).
        profiles: kube-scheduler profiles whose pods topoplace places.
        metrics: adapter metrics.
        replacements: the server's ``topoplace_replacements`` counter (labels ``kind``).
        may_act: True while this replica may write (ready and leading).
        wall: wall clock for rate limits and re-placement times (injected for tests).
    """

    def __init__(
        self,
        api: KubeApi,
        cache: Any,
        params: SchedParams,
        profiles: Collection[str],
        metrics: KubeMetrics,
        replacements: Any = None,
        may_act: Callable[[], bool] = lambda: True,
        wall: Callable[[], float] = time.time,
        preemptions: Any = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.params = params
        self.profiles = tuple(profiles)
        self.metrics = metrics
        self.replacements = replacements
        self.may_act = may_act
        self.wall = wall
        self.preemptions = preemptions
        """The extender's ``PreemptionLedger``: gangs broken by a preemption it answered
        (torn down here, see ``remediation.teardown_groups``); None: none."""
        self.instance = reporting_instance()
        """``reportingInstance`` of the Events (the pod's hostname)."""
        self.since: dict[str, float] = {}
        self._evicted: dict[str, float] = {}  # uid -> wall time
        self._retry: dict[str, float] = {}  # uid -> wall time it may be tried again
        self._reported: set[str] = set()  # uids reported by a dry run
        self._window: deque[float] = deque()  # wall times of the last minute's evictions
        self._awaiting: dict[str, _Awaiting] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        """The latest actions (evictions and their outcomes, dry-run reports), newest last."""
        self._loop = Periodic(
            "kube-remediate",
            self.tick,
            lambda: self.params.remediation.check_seconds,
            "remediation check",
        )
        self.last: Plan | None = None

    # ---- the loop ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the checking thread (nothing when ``mode`` is ``off``)."""
        if self.params.remediation.mode != "off":
            self._loop.start()

    def stop(self) -> None:
        """Stop the checking thread (an eviction in flight finishes)."""
        self._loop.stop()

    def _now(self) -> float:
        tracker = getattr(self.cache, "health_tracker", None)
        return float(tracker.now()) if tracker is not None else self.wall()

    def tick(self) -> list[tuple[Fault, str]]:
        """One check: plan, then evict (or report) what is due; returns (fault, outcome)
        for every pod acted on."""
        rp = self.params.remediation
        if rp.mode == "off" or not self.may_act():
            return []
        snap = self.cache.snapshot()
        wall = self.wall()
        self._count_successors(snap, wall)
        pl = plan(snap, rp, self.params.health, self.profiles, self._now(), self.since)
        self.last = pl
        self.since = dict(pl.waiting)
        self.metrics.on_failed_hardware.set(len(pl.waiting))
        self.metrics.remediation_held.set(1 if pl.paused else 0)
        groups = list(pl.groups)
        if pl.paused:  # holds hardware evictions only: a preempted gang still goes whole
            log.warning("remediation: %s", pl.paused)
            groups = []
        if self.preemptions is not None and rp.whole_gangs:
            for group, record in teardown_groups(snap, self.preemptions.broken(), self.profiles):
                if group:
                    groups.append(group)  # kept until nothing is left to evict
                else:
                    self.preemptions.done(record)
        for uid in [u for u, t in self._evicted.items() if wall - t > EVICTED_MEMORY_S]:
            del self._evicted[uid]
        while self._window and wall - self._window[0] >= 60.0:
            self._window.popleft()
        done: list[tuple[Fault, str]] = []
        for group in groups:
            todo = [
                f
                for f in group
                if f.uid not in self._evicted and self._retry.get(f.uid, 0.0) <= wall
            ]
            if not todo:
                continue
            if rp.mode == "dry-run":
                for f in todo:
                    if f.uid not in self._reported:
                        self._reported.add(f.uid)
                        log.warning("remediation (dry run) would evict %s", _describe(f))
                        done.append((f, self._count(f, "dry_run")))
                continue
            room = rp.max_evictions_per_minute - len(self._window)
            if len(todo) > room and self._window:
                log.info(
                    "remediation: %d eviction(s) of %s wait for room (%d/min)",
                    len(todo),
                    todo[0].cause,
                    rp.max_evictions_per_minute,
                )
                break  # keep the order: later groups wait behind this one
            lineage = self._remember(snap, group, wall)
            for f in todo:
                outcome = self._evict(f, wall)
                done.append((f, outcome))
                if outcome == "evicted":
                    self._window.append(wall)
                    if lineage.get(f.pod):
                        self._awaiting[lineage[f.pod]].pending.append((wall, f.kind))
        alive = {p.uid for p in snap.pods.values()}
        self._reported &= alive
        for uid in [u for u in self._retry if u not in alive]:
            del self._retry[uid]  # gone meanwhile: nothing to try again
        return done

    # ---- evictions -------------------------------------------------------------------------

    def _evict(self, f: Fault, wall: float) -> str:
        ns, _, name = f.pod.partition("/")
        opts: dict[str, Any] = {"preconditions": {"uid": f.uid}} if f.uid else {}
        grace = self.params.remediation.grace_period_seconds
        if grace is not None:
            opts["gracePeriodSeconds"] = grace
        try:
            self.api.evict_pod(ns, name, opts)
        except ApiError as exc:
            if exc.not_found or exc.conflict:  # gone, or a namesake (UID precondition)
                self._evicted[f.uid] = wall
                return self._count(f, "gone")
            self._retry[f.uid] = wall + RETRY_BLOCKED_S
            if exc.status == 429:
                log.warning("remediation: eviction of %s blocked: %s", f.pod, exc.message)
                return self._count(f, "blocked")
            log.warning("remediation: eviction of %s failed: %s", f.pod, exc)
            return self._count(f, "error")
        self._evicted[f.uid] = wall
        self._retry.pop(f.uid, None)
        log.warning("remediation: evicted %s", _describe(f))
        self._event(f, ns, name)
        return self._count(f, "evicted")

    def _event(self, f: Fault, ns: str, name: str) -> None:
        """Post the Event that says why ``f``'s pod was evicted (best effort)."""
        body = eviction_event(
            ns,
            name,
            f.uid,
            EVENT_REASON_PREEMPTED if f.kind == KIND_PREEMPTED else EVENT_REASON,
            f"evicted by topoplace so its gang is placed again whole: {_describe(f)}"
            if f.kind == KIND_PREEMPTED
            else f"evicted by topoplace for re-placement: {_describe(f)}",
            self.instance,
        )
        try:
            self.api.create_event(ns, body)
        except ApiError as exc:
            log.warning("remediation: the Event about %s was not written: %s", f.pod, exc)

    def _count(self, f: Fault, outcome: str) -> str:
        self.metrics.evictions.labels(kind=f.kind, outcome=outcome).inc()
        self.recent.append(
            {
                "time": self.wall(),
                "pod": f.pod,
                "node": f.node,
                "kind": f.kind,
                "reason": f.reason,
                "cause": f.cause,
                "outcome": outcome,
            }
        )
        return outcome

    def view(self) -> dict[str, Any]:
        """What remediation does now (``GET /v1/inspect/remediation``): its settings,
        whether this replica acts, the storm guard, every pod on failed hardware with when
        it is due, and the latest actions."""
        rp = self.params.remediation
        snap = self.cache.snapshot()
        now = self._now()
        faults, failed, gpu_nodes = on_failed_hardware(snap, rp, self.params.health, self.profiles)
        last = self.last
        return {
            "mode": rp.mode,
            "acting": rp.mode != "off" and self.may_act(),
            "after_seconds": rp.after_seconds,
            "whole_gangs": rp.whole_gangs,
            "failed_gpu_nodes": failed,
            "gpu_nodes": gpu_nodes,
            "held": last.paused if last is not None else "",
            "on_failed_hardware": fault_rows(faults, self.since, rp.after_seconds, now),
            "recent": list(self.recent),
        }

    # ---- re-placements ---------------------------------------------------------------------

    def _remember(self, snap: Any, group: tuple[Fault, ...], wall: float) -> dict[str, str]:
        """Register the group's lineages (the pods alive now are not successors); returns
        pod key -> lineage."""
        out: dict[str, str] = {}
        for f in group:
            p = snap.pods.get(f.pod)
            lin = _lineage(p) if p is not None else ""
            if not lin:
                continue
            out[f.pod] = lin
            if lin not in self._awaiting:
                self._awaiting[lin] = _Awaiting(
                    {q.uid for q in snap.pods.values() if _lineage(q) == lin}
                )
        return out

    def _count_successors(self, snap: Any, wall: float) -> None:
        """Count pods bound since an eviction of their lineage as its re-placements."""
        for lin in [k for k, a in self._awaiting.items() if not a.pending]:
            del self._awaiting[lin]
        for a in self._awaiting.values():
            while a.pending and wall - a.pending[0][0] > SUCCESSOR_WINDOW_S:
                a.pending.popleft()
        if not self._awaiting:
            return
        for p in snap.pods.values():
            if p.assumed or not p.node:
                continue
            lin = _lineage(p)
            a = self._awaiting.get(lin) if lin else None
            if a is None or not a.pending or p.uid in a.known:
                continue
            a.known.add(p.uid)
            t, kind = a.pending.popleft()
            if self.replacements is not None:
                self.replacements.labels(kind=kind).inc()
            self.metrics.replacement_seconds.labels(kind=kind).observe(max(0.0, wall - t))
            log.info("remediation: %s re-placed on %s (%s, %.1fs)", p.key, p.node, kind, wall - t)


def reporting_instance() -> str:
    """The ``reportingInstance`` of this replica's Events: its host name (as client-go's
    recorder, at most 128 characters)."""
    return socket.gethostname()[:128] or "topoplace"


def eviction_event(
    ns: str,
    name: str,
    uid: str,
    reason: str,
    note: str,
    instance: str,
    controller: str = EVENT_CONTROLLER,
) -> dict[str, Any]:
    """An ``events.k8s.io/v1`` Warning about evicting the pod ``ns/name`` (action
    ``Evict``), named as client-go's recorder names events."""
    now = datetime.datetime.now(datetime.UTC)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # as client-go's recorder names events: <object>.<unix nanoseconds in hex>
        "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": ns},
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingController": controller,
        "reportingInstance": instance,
        "action": "Evict",
        "reason": reason,
        "type": "Warning",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns, "uid": uid},
        "note": note[:1024],
    }


def _describe(f: Fault) -> str:
    what = {
        "node": "its node",
        "gpu": "a GPU it holds",
        "gang": f"gang member {f.cause}",
        KIND_PREEMPTED: f"gang member {f.cause} was preempted",
    }
    return f"{f.pod} on {f.node} ({what.get(f.kind, f.kind)}: {f.reason})"
