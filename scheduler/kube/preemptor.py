"""Evict for a pod kube-scheduler will not preempt for (policy ``preemption.start``).

The decisions are ``scheduler.server.started_preemption``'s (why kube-scheduler does not
preempt: ``scheduler.runtime.stranded``); this module does the writes, from a thread of
its own that looks every :data:`CHECK_S` (every :data:`SETTLE_CHECK_S` while victims are
going, so the freed GPUs are held for the pod soon after the watch sees them go), only
while the extender is ready and, with HA, this replica leads:

- the victims go through the Eviction API (``policy/v1``, ``POST pods/{name}/eviction``)
  with their UID as a precondition and their own grace period, as kube-scheduler's
  preemption deletes them with theirs. A refusal (429: a PodDisruptionBudget changed since
  the choice) or an error leaves that pod in place; the preemption is given up after
  ``stranded.GIVE_UP_S`` if a victim stays. RBAC: ``create`` on ``pods/eviction``;
- an Event on each victim (reason :data:`EVENT_REASON`, as kube-scheduler's
  ``Preempted``; reporting controller :data:`CONTROLLER`), naming the pod it makes room
  for;
- once the victims are gone (the watch's deletion of the last one runs a pass at once,
  :meth:`Preemptor.pod_gone`), the pod's GPUs are held for it and the pod is woken
  (``topoplace.io/requeue``, :class:`scheduler.kube.waker.PodWaker`): a deletion moves
  pods that an in-tree plugin rejected, not one only topoplace refused. A gang is planned
  at once instead, its reservations held, and its members woken by the gang runtime.

``preemption.start: dry-run`` logs and counts what would be evicted; ``off`` does nothing.
Metrics: ``topoplace_started_preemptions{outcome}``, and
``topoplace_remediation_evictions{kind="started-preemption",outcome}`` per eviction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scheduler.core.preemption import lowest_priorities
from scheduler.kube.client import ApiError, KubeApi
from scheduler.kube.loop import Periodic
from scheduler.kube.metrics import KubeMetrics
from scheduler.kube.remediator import eviction_event, reporting_instance
from scheduler.runtime.stranded import gang_of
from scheduler.server import started_preemption

log = logging.getLogger(__name__)

EVENT_REASON = "Preempted"
"""The victims' Event reason (kube-scheduler's for the pods it preempts)."""
CONTROLLER = "topoplace.io/preemption"
"""The Events' ``reportingController``."""
KIND = "started-preemption"
"""The ``kind`` label of these evictions in ``topoplace_remediation_evictions``."""
CHECK_S = 0.5
"""Seconds between passes."""
SETTLE_CHECK_S = 0.1
"""Seconds between passes while a preemption's victims are going."""
MAX_STARTS = 32
"""Pods looked at per pass at most, oldest refusal first (a victim search over thousands
of nodes takes some 200 ms; the rest wait for the next pass)."""


class Preemptor:
    """Acts on ``ext.stranded`` (see the module docstring).

    Args:
        api: the API client.
        ext: the extender (its cache, ``stranded``, preemption ledger and metrics).
        metrics: adapter metrics (eviction outcomes).
        wake: ``wake(keys, why)``, kube-scheduler retries the pods (the pod waker).
        may_act: True while this replica may write (ready and leading).
    """

    def __init__(
        self,
        api: KubeApi,
        ext: Any,
        metrics: KubeMetrics,
        wake: Callable[[list[str], str], None],
        may_act: Callable[[], bool] = lambda: True,
    ) -> None:
        self.api = api
        self.ext = ext
        self.metrics = metrics
        self.wake = wake
        self.may_act = may_act
        self.instance = reporting_instance()
        self._loop = Periodic(
            "kube-preempt",
            self.tick,
            lambda: SETTLE_CHECK_S if self.ext.stranded.in_progress() else CHECK_S,
            "preempting for refused pods",
        )

    def start(self) -> None:
        """Start the checking thread (nothing when ``preemption.start`` is ``off``)."""
        if self.ext.params.preemption.start != "off":
            self._loop.start()

    def stop(self) -> None:
        """Stop the checking thread (an eviction in flight finishes)."""
        self._loop.stop()

    def pod_gone(self, uid: str) -> None:
        """The watch let pod ``uid`` go: when it was a victim of a preemption in progress,
        run a pass now (it settles the preemption: the GPUs are held, the pod woken)
        rather than within :data:`SETTLE_CHECK_S`. Called on the watch's thread; cheap
        for any other pod."""
        if uid and uid in self.ext.stranded.busy()[1]:
            self._loop.poke()

    def tick(self) -> list[tuple[str, str]]:
        """One pass: settle the preemptions in progress (wake the pods whose victims are
        gone), then start those due. Returns (pod, what happened) for each acted on."""
        mode = self.ext.params.preemption.start
        if mode == "off" or not self.may_act():
            return []
        done: list[tuple[str, str]] = []
        woken: list[str] = []
        cache = self.ext.cache
        if len(self.ext.stranded):
            held = cache.snapshot().pods
            gangs = self.ext.gangs

            def waiting(k: str) -> bool:
                gang = gang_of(k)
                if gang:
                    return gangs is not None and bool(gangs.pending_members(self.ext, gang))
                return k not in held and cache.pending(k) is not None

            self.ext.stranded.prune(waiting)
        going = self.ext.stranded.in_progress()
        present = {p.uid for p in cache.snapshot().pods.values()} if going else set()
        for key, _rec in going:
            outcome = started_preemption.settle(self.ext, key, present)
            if outcome:
                done.append((key, outcome))
            if outcome == started_preemption.WOKEN and not gang_of(key):
                woken.append(key)  # a gang's members are woken by the gang runtime
        if woken:
            try:
                self.wake(woken, "the pods topoplace preempted for it are gone")
            except Exception:  # the waker is an I/O edge: never let it break the loop
                log.exception("waking preemptors failed")
        due = self.ext.stranded.due(cache.now())
        lowest = lowest_priorities(cache.snapshot()) if due else {}
        for key in due[:MAX_STARTS]:
            if gang_of(key):
                gchoice = started_preemption.start_gang(self.ext, key, mode == "dry-run", lowest)
                if gchoice is None:
                    continue
                victims = [(v, gchoice.nodes[v.pod]) for v in gchoice.victims]
            else:
                chosen = started_preemption.start(self.ext, key, mode == "dry-run", lowest)
                if chosen is None:
                    continue
                victims = [(v, chosen.node) for v in chosen.victims]
            for v, node in victims:
                done.append((key, f"{v.pod}: {self._evict(key, node, v.pod, v.uid)}"))
        return done

    def _evict(self, preemptor: str, node: str, pod: str, uid: str) -> str:
        ns, _, name = pod.partition("/")
        try:
            self.api.evict_pod(ns, name, {"preconditions": {"uid": uid}} if uid else {})
        except ApiError as exc:
            if exc.not_found or exc.conflict:  # gone already, or a namesake (UID precondition)
                return self._count("gone")
            log.warning("preemption for %s: eviction of %s refused: %s", preemptor, pod, exc)
            return self._count("blocked" if exc.status == 429 else "error")
        gang = gang_of(preemptor)
        whom = f"gang {gang}" if gang else preemptor
        note = f"preempted by topoplace on {node} for {whom}, which needs its GPUs"
        try:
            body = eviction_event(ns, name, uid, EVENT_REASON, note, self.instance, CONTROLLER)
            self.api.create_event(ns, body)
        except ApiError as exc:
            log.warning("preemption: the Event about %s was not written: %s", pod, exc)
        return self._count("evicted")

    def _count(self, outcome: str) -> str:
        self.metrics.evictions.labels(kind=KIND, outcome=outcome).inc()
        return outcome
