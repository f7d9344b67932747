"""Health history: flapping memory, settle time and XID bursts across snapshots.

A single Node object says how a node is *now*. Whether it can be trusted also depends on
its past: a node that failed three times today and turned Ready five minutes ago is more
likely to fail again than one that has been healthy for a month. This module keeps that
past as a pure value and turns it into risk.

* :class:`HealthHistory` is immutable: per node, the bounded list of transitions
  ``(time, kind)`` with kind ``"unhealthy"`` (entered UNHEALTHY) or ``"recovered"`` (left
  it), plus the distinct non-fatal XID signals seen within the XID window.
* :func:`observe` returns a new history after seeing one verdict at ``now``. Seeing the
  same verdict again changes nothing (idempotent), so re-assessing a node is harmless.
* :func:`adjust` turns a node's history into risk on top of its current verdict:

  - every past transition to unhealthy adds ``flap_weight * 0.5 ** (age / half_life)``
    (the sum capped at 1): the memory of a failure decays exponentially;
  - below ``flap_degraded_risk`` that is risk only ("node failed recently"); at or above
    it the node is DEGRADED ("node failed repeatedly");
  - for ``settle_seconds`` after a recovery the node is DEGRADED ("node recovered
    recently") with ``settle_risk``: it must stay healthy that long to be trusted fully;
  - ``xid_burst_threshold`` distinct non-fatal XID signals first seen within
    ``xid_window_seconds`` make it DEGRADED ("burst of non-fatal GPU errors"), even when
    no single snapshot showed them all at once.

  An UNHEALTHY verdict is returned unchanged (it is never placed on anyway).

  A node that has never been usable is joining, not failing (a kubelet registers its
  node NotReady): :func:`observe` with ``joined=False`` records no failure for it, and its
  first Ready starts no settle time. The tracker knows which nodes have been usable.

The mutable owner of a history lives outside the core (``scheduler/runtime/health_tracker.py``);
the fault-injection benchmark drives these functions directly with simulated time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from scheduler.core.health import (
    REASON_FAILED_BEFORE,
    REASON_FLAPPING,
    REASON_SETTLING,
    REASON_XID_BURST,
    HealthParams,
    merge,
)
from scheduler.core.model import Health, NodeHealth

UNHEALTHY = "unhealthy"
RECOVERED = "recovered"


@dataclass(frozen=True, slots=True)
class NodeHistory:
    """One node's remembered past.

    Attributes:
        events: transitions ``(time, kind)`` in time order, at most
            ``HealthParams.history_max_events`` (oldest dropped first).
        xids: distinct non-fatal XID signals ``(first seen, key)`` within the XID window.
    """

    events: tuple[tuple[float, str], ...] = ()
    xids: tuple[tuple[float, str], ...] = ()

    @property
    def failing(self) -> bool:
        """True while the last transition seen is into UNHEALTHY."""
        return bool(self.events) and self.events[-1][1] == UNHEALTHY

    @property
    def last_recovery(self) -> float | None:
        """Time of the last recovery, if the node is not failing now."""
        if self.events and self.events[-1][1] == RECOVERED:
            return self.events[-1][0]
        return None


EMPTY_NODE_HISTORY = NodeHistory()


@dataclass(frozen=True, slots=True)
class HealthHistory:
    """Histories of all nodes (read-only mapping by node name)."""

    nodes: Mapping[str, NodeHistory] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, name: str) -> NodeHistory:
        """The history of ``name`` (empty when never seen)."""
        return self.nodes.get(name, EMPTY_NODE_HISTORY)


def observe(
    history: HealthHistory,
    node_name: str,
    verdict: NodeHealth,
    now: float,
    *,
    xids: Iterable[tuple[float | None, str]] = (),
    params: HealthParams | None = None,
    joined: bool = True,
) -> HealthHistory:
    """The history after seeing ``verdict`` for ``node_name`` at ``now``.

    Args:
        history: the history so far (not modified).
        node_name: the node.
        verdict: its current verdict (before :func:`adjust`).
        now: wall-clock seconds; an observation older than the last event is taken as
            happening at the last event's time (histories never go back in time).
        xids: non-fatal XID signals in this observation (``HealthReport.xids``); keys
            already remembered are ignored, a missing time means "first seen now".
        params: bounds and the XID window (defaults when None).
        joined: the node has been seen usable (not UNHEALTHY) before. A node that never
            was is joining the cluster (a kubelet registers its node NotReady, and the
            not-ready taint stays until it reports Ready): its UNHEALTHY verdicts are not
            failures, and its first Ready is not a recovery to settle from.
    """
    p = params or HealthParams()
    old = history.of(node_name)
    events = list(old.events)
    t = max(now, events[-1][0]) if events else now
    if verdict.state >= Health.UNHEALTHY and not old.failing:
        if joined:
            events.append((t, UNHEALTHY))
    elif verdict.state < Health.UNHEALTHY and old.failing:
        events.append((t, RECOVERED))
    events = events[-p.history_max_events :]
    seen = {k for _, k in old.xids}
    new_xids = list(old.xids)
    for when, key in xids:
        if key not in seen:
            seen.add(key)
            new_xids.append((t if when is None else min(float(when), t), key))
    horizon = t - p.xid_window_seconds
    new_xids = sorted(x for x in new_xids if x[0] >= horizon)[-4 * p.history_max_events :]
    new = NodeHistory(tuple(events), tuple(new_xids))
    if new == old:
        return history
    nodes = dict(history.nodes)
    nodes[node_name] = new
    return HealthHistory(MappingProxyType(nodes))


def forget_node(history: HealthHistory, node_name: str) -> HealthHistory:
    """The history without ``node_name`` (a deleted node); unknown names are a no-op."""
    if node_name not in history.nodes:
        return history
    nodes = {k: v for k, v in history.nodes.items() if k != node_name}
    return HealthHistory(MappingProxyType(nodes))


def flap_risk(node: NodeHistory, now: float, params: HealthParams) -> float:
    """Decayed memory of past failures: ``sum(w * 0.5 ** (age / half_life))``, capped at 1."""
    if params.flap_half_life_seconds <= 0:
        return 0.0
    total = 0.0
    for t, kind in node.events:
        if kind == UNHEALTHY:
            age = max(now - t, 0.0)
            total += params.flap_weight * 0.5 ** (age / params.flap_half_life_seconds)
    return min(round(total, 6), 1.0)


def recent_xids(node: NodeHistory, now: float, params: HealthParams) -> int:
    """Distinct non-fatal XID signals first seen within the XID window before ``now``."""
    return sum(1 for t, _ in node.xids if 0.0 <= now - t <= params.xid_window_seconds)


def adjust(verdict: NodeHealth, node: NodeHistory, now: float, params: HealthParams) -> NodeHealth:
    """The verdict with the node's history applied (see the module docstring).

    Pure; ``verdict`` is returned unchanged when history is disabled, the node is
    UNHEALTHY, or its history carries no risk.
    """
    if not params.history or verdict.state >= Health.UNHEALTHY:
        return verdict
    out = verdict
    r = flap_risk(node, now, params)
    if r > 0:
        if r >= params.flap_degraded_risk:
            out = merge(out, NodeHealth(Health.DEGRADED, (REASON_FLAPPING,), r))
        else:
            out = merge(out, NodeHealth(Health.HEALTHY, (REASON_FAILED_BEFORE,), r))
    rec = node.last_recovery
    if rec is not None and now - rec < params.settle_seconds:
        out = merge(out, NodeHealth(Health.DEGRADED, (REASON_SETTLING,), params.settle_risk))
    if (
        params.xid_burst_threshold > 0
        and REASON_XID_BURST not in out.reasons
        and recent_xids(node, now, params) >= params.xid_burst_threshold
    ):
        out = merge(out, NodeHealth(Health.DEGRADED, (REASON_XID_BURST,), params.xid_burst_risk))
    return out
