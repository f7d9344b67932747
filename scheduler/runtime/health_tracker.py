"""The mutable owner of node health history (outside the pure core).

:class:`HealthTracker` holds one :class:`~scheduler.core.health_history.HealthHistory` and
applies it to verdicts as nodes are upserted into the cache. It is the only place that
reads a wall clock for health: the core functions get ``now`` passed in.

Wiring: ``ClusterCache(..., health_tracker=HealthTracker(params.health))``. The cache calls
:meth:`HealthTracker.adjust` with the node's DRA devices and modeled GPU count from
``upsert_node`` and ``replace_all`` (under its lock) and from ``refresh_nodes``, after the
node's own signals were assessed; the adjusted verdict (heartbeat staleness at ``now``,
flapping risk, settle time, XID bursts across updates, DRA device taints included) is what
the snapshot stores. Because a stale
heartbeat is, by definition, the absence of updates, the owner of the cache should call
:meth:`HealthTracker.refresh` periodically (e.g. every 30 s) to re-assess every node.

Concurrency: all methods are thread-safe (one lock); the history value itself is
immutable, so :attr:`history` can be read without the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scheduler.core.health import HealthParams, heartbeat_verdict, merge, xid_signals
from scheduler.core.health_history import HealthHistory, adjust, forget_node, observe
from scheduler.core.model import Health, NodeHealth
from scheduler.core.objects import meta, node_gpus

if TYPE_CHECKING:
    from scheduler.runtime.cache import ClusterCache


class HealthTracker:
    """Remembers health transitions per node and adjusts verdicts with them.

    Args:
        params: health parameters (half-life, settle time, thresholds).
        clock: wall clock in epoch seconds (``time.time``; injected for tests). Must be
            comparable with the Node's ``lastHeartbeatTime``.
    """

    def __init__(self, params: HealthParams, clock: Callable[[], float] = time.time) -> None:
        self.params = params
        self._clock = clock
        self._lock = threading.Lock()
        self._history = HealthHistory()
        self._usable: set[str] = set()
        """Nodes seen usable (not UNHEALTHY) at least once: until then a node is joining
        and its NotReady is not a failure (:func:`observe`'s ``joined``)."""

    @property
    def history(self) -> HealthHistory:
        """The current (immutable) history."""
        return self._history

    def now(self) -> float:
        """The tracker's wall clock."""
        return self._clock()

    def adjust(
        self,
        node_obj: Mapping[str, Any],
        verdict: NodeHealth,
        now: float | None = None,
        devices: Iterable[Mapping[str, Any]] = (),
        gpu_capacity: int | None = None,
    ) -> NodeHealth:
        """Record ``verdict`` for the node and return it adjusted by history.

        Args:
            node_obj: the Node object the verdict was assessed from.
            verdict: the node's verdict from its current signals.
            now: wall-clock seconds (the tracker's clock when None).
            devices: the node's DRA devices, if known, so non-fatal XID taints are
                counted across updates.
            gpu_capacity: the node's GPUs as modeled (a DRA node that advertises no
                ``nvidia.com/gpu`` has as many as its slices describe); None: what the
                object advertises. Device taints are read only on a node with GPUs.
        """
        t = self.now() if now is None else now
        name = meta(node_obj).get("name")
        if not isinstance(name, str) or not name:
            return verdict
        p = self.params
        base = merge(verdict, heartbeat_verdict(node_obj, t, p))
        cap = node_gpus(node_obj)[0] if gpu_capacity is None else gpu_capacity
        xids = xid_signals(node_obj, cap, p, devices)
        with self._lock:
            joined = name in self._usable
            self._history = observe(
                self._history, name, base, t, xids=xids, params=p, joined=joined
            )
            if not joined and base.state < Health.UNHEALTHY:
                self._usable.add(name)
            return adjust(base, self._history.of(name), t, p)

    def forget(self, node_name: str) -> None:
        """Drop a deleted node's history (idempotent)."""
        with self._lock:
            self._history = forget_node(self._history, node_name)
            self._usable.discard(node_name)

    def retain(self, names: Container[str]) -> None:
        """Forget every node not in ``names`` (after a relist: nodes deleted meanwhile)."""
        with self._lock:
            for name in [n for n in self._history.nodes if n not in names]:
                self._history = forget_node(self._history, name)
            self._usable = {n for n in self._usable if n in names}

    def refresh(self, cache: ClusterCache) -> None:
        """Re-assess every node of the cache at the current time (heartbeats age, settle
        times and failure memories expire without any event)."""
        cache.refresh_nodes()
