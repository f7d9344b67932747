"""Wake pods kube-scheduler has parked, so it retries them now.

kube-scheduler keeps a pod that failed scheduling in its unschedulable queue until a cluster
event that one of the *plugins that rejected it* cares about. A pod rejected only by an
extender has no such plugin: without QueueingHints (kube-scheduler <= 1.31, or the gate off)
no event moves it, and it waits for the periodic flush (``podMaxInUnschedulablePodsDuration``,
5 minutes). An update of the pod itself always moves it (``PriorityQueue.Update``:
``isPodUpdated`` compares the pods without status, resourceVersion and managed fields), so
the waker patches one annotation, :data:`WAKE_ANNOTATION`, whose value says when and why.

The gang runtime calls :meth:`PodWaker.wake` from inside a filter; the patches run on one
worker thread, never on the caller's. RBAC: ``patch`` on ``pods`` (config/deploy/rbac.yaml).
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
from collections.abc import Callable

from scheduler.kube.client import ApiError, ApiUnavailable, KubeApi
from scheduler.kube.metrics import KubeMetrics

log = logging.getLogger(__name__)

WAKE_ANNOTATION = "topoplace.io/requeue"
MAX_QUEUED = 10_000


class PodWaker:
    """Patches :data:`WAKE_ANNOTATION` onto pods, asynchronously and in order.

    Args:
        api: the API client.
        metrics: counts outcomes (``topoplace_kube_pod_wakes``).
        now: wall clock (injected for tests), written into the annotation.
    """

    def __init__(
        self,
        api: KubeApi,
        metrics: KubeMetrics | None = None,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.now = now
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue(MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def wake(self, keys: list[str], why: str) -> None:
        """Queue ``namespace/name`` keys to be patched (never blocks; drops past
        :data:`MAX_QUEUED`, counted as errors)."""
        self._ensure_thread()
        for key in keys:
            try:
                self._queue.put_nowait((key, why))
            except queue.Full:
                log.warning("wake queue full: %s not woken", key)
                self._count("error")

    def wake_now(self, key: str, why: str) -> str:
        """Patch one pod synchronously; returns the outcome (ok, gone, error)."""
        ns, _, name = key.partition("/")
        stamp = self.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            self.api.patch_pod_annotations(ns, name, {WAKE_ANNOTATION: f"{stamp} {why}"[:200]})
        except ApiError as exc:
            outcome = "gone" if exc.not_found else "error"
            if outcome == "error":
                log.warning("waking %s failed: %s", key, exc)
            return self._count(outcome)
        except ApiUnavailable as exc:
            log.warning("waking %s failed: %s", key, exc)
            return self._count("error")
        log.info("woke %s (%s)", key, why)
        return self._count("ok")

    def close(self, timeout: float = 5.0) -> None:
        """Finish queued patches (up to ``timeout``) and stop the worker."""
        with self._lock:
            t = self._thread
            self._thread = None
        if t is not None:
            self._queue.put(None)
            t.join(timeout)

    def _count(self, outcome: str) -> str:
        if self.metrics is not None:
            self.metrics.wakes.labels(outcome=outcome).inc()
        return outcome

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pod-waker", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.wake_now(*item)
            except Exception:  # never let the worker die
                log.exception("waking %s failed", item[0])
