"""Faults, and how a cluster publishes them: the health signals placement sees.

Ground truth is a list of faults: node-wide :class:`Outage` s (a host fault, a GPU fault
that takes the node, a flapping node) and one-GPU :class:`GpuFault` s, each with the instant
it starts, is detected (its signal is published) and is repaired, and optionally an early
warning. :class:`SignalHealth` renders, at any instant, what a real cluster would publish
for a node (Ready and its heartbeat, NVSentinel's condition, state label and cordon, the
allocatable GPU count, DRA device taints: ``gpu-lost`` and non-fatal ``xid``) as Node
objects and DRA devices, and assesses them with :func:`scheduler.core.health.assess` and,
when the health policy keeps history, :func:`~scheduler.core.health_history.observe` /
:func:`~scheduler.core.health_history.adjust`; the engine then moves the snapshot with
``with_node_health``. Placement only ever sees these signals; the ground truth decides
whether a job placed on a node crashes.

The compared health policies are :func:`health_policies` (``topoplace``, ``kube-default``,
``ready-only``).
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.engine.jobs import Run
from benchmarks.engine.loop import ASSESS, TICK
from scheduler.core.health import HealthParams, assess
from scheduler.core.health_history import HealthHistory, adjust, observe
from scheduler.core.objects import node_gpus

HEARTBEAT_PERIOD = 300.0
"""The kubelet's ``nodeStatusReportFrequency`` default: Ready's heartbeat is refreshed at
least this often while nothing changes."""
TICK_SECONDS = 1800.0
"""Re-assessment period for nodes that carry history (risk decays continuously)."""
EPOCH0 = 1_798_761_600.0
"""2027-01-01T00:00:00Z: simulated time 0 (signals carry wall-clock timestamps)."""


def health_policies() -> dict[str, HealthParams]:
    """The compared health models.

    * ``topoplace``: every signal, history (flapping, settle) and early warnings.
    * ``kube-default``: what kube-scheduler enforces by itself: Ready (via the not-ready
      taint), cordon, and the allocatable GPU count; nothing else.
    * ``ready-only``: only the Ready condition (HiveD-style health, or a Kueue setup
      whose scheduler ignores cordons and device health).
    """
    ready = HealthParams.ready_only()
    return {
        "topoplace": HealthParams(),
        "kube-default": replace(ready, honour_cordon=True, check_allocatable=True),
        "ready-only": ready,
    }


@dataclass(frozen=True, slots=True)
class Outage:
    """A node-wide outage: ``kind`` is "host", "gpu-node" or "flap".

    The node is broken in [start, end); its signals appear at ``detect``; a warning (if
    any) starts at ``warn``.
    """

    node: str
    kind: str
    start: float
    end: float
    detect: float
    warn: float | None = None


@dataclass(frozen=True, slots=True)
class GpuFault:
    """One GPU broken in [start, end); device taint at ``detect``; XIDs at ``xid_times``."""

    node: str
    gpu: int
    start: float
    end: float
    detect: float
    xid_times: tuple[float, ...] = ()


class SignalHealth:
    """Faults rendered as published signals and assessed by one health policy.

    Args:
        nodes: the cluster's Node objects (as created; not modified).
        faults: outages and GPU faults (any order).
        health: the health policy.
    """

    def __init__(
        self,
        nodes: Sequence[Mapping[str, Any]],
        faults: Sequence[Outage | GpuFault],
        health: HealthParams,
    ) -> None:
        self.base = {n["metadata"]["name"]: n for n in nodes}
        self.names = sorted(self.base)
        self.phase = {name: (i * 37.0) % HEARTBEAT_PERIOD for i, name in enumerate(self.names)}
        self.outages: dict[str, list[Outage]] = {}
        self.gpu_faults: dict[str, list[GpuFault]] = {}
        for f in faults:
            if isinstance(f, GpuFault):
                self.gpu_faults.setdefault(f.node, []).append(f)
            else:
                self.outages.setdefault(f.node, []).append(f)
        self.health = health
        self.history = HealthHistory()

    def broken(self, run: Run, t: float) -> tuple[tuple[str, bool], ...]:
        """Per member on broken hardware at ``t``: ("node"|"gpu", signalled)."""
        out = []
        for a in run.members:
            b = self.broken_at(a.node, a.gpus, t)
            if b is not None:
                out.append(b)
        return tuple(out)

    def broken_at(self, node: str, gpus: Sequence[int], t: float) -> tuple[str, bool] | None:
        """("node"|"gpu", signalled) if ``node`` or one of ``gpus`` is broken at ``t``."""
        for o in self.outages.get(node, ()):
            if o.start <= t < o.end:
                return "node", t >= o.detect
        for f in self.gpu_faults.get(node, ()):
            if f.gpu in gpus and f.start <= t < f.end:
                return "gpu", t >= f.detect
        return None

    def evicted_at(self, run: Run, t: float, after: float) -> float | None:
        """When topoplace's remediation evicts ``run``: the earliest time, at ``t`` or
        later, at which the failure of a member's node or GPU has been published for
        ``after`` seconds while the member held it and is published still (the signals of
        :meth:`render`: NotReady, NVSentinel's fatal condition, the DRA driver's GPU
        taint, each only if this health policy reads it); None if no failure lasts that
        long. The storm guard and the eviction rate bound are not modelled."""
        hp = self.health
        reads = {
            "host": True,
            "flap": True,
            "gpu-node": bool(hp.fatal_conditions or hp.nvsentinel_bad_states),
        }
        best: float | None = None
        for a in run.members:
            spans = [
                (o.detect, o.end) for o in self.outages.get(a.node, ()) if reads.get(o.kind, True)
            ]
            if hp.dra_taints:
                spans += [
                    (f.detect, f.end) for f in self.gpu_faults.get(a.node, ()) if f.gpu in a.gpus
                ]
            for shown, end in spans:
                when = max(shown, run.start) + after
                if end > t and when < end and (best is None or when < best):
                    best = when
        return None if best is None else max(best, t)

    def warned(self, node: str, t: float) -> bool:
        """True while a warning precedes a fault of ``node`` (ground truth)."""
        for o in self.outages.get(node, ()):
            if o.warn is not None and o.warn <= t < o.start:
                return True
        for f in self.gpu_faults.get(node, ()):
            if f.xid_times and f.xid_times[0] <= t < f.start:
                return True
        return False

    def render(self, name: str, t: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The Node object and tainted DRA devices of ``name`` as published at ``t``."""
        obj = copy.deepcopy(self.base[name])
        status = obj["status"]
        spec = obj.setdefault("spec", {})
        labels = obj["metadata"]["labels"]
        ready = True
        hb = t - ((t + self.phase[name]) % HEARTBEAT_PERIOD)
        for o in self.outages.get(name, ()):
            if o.warn is not None and o.warn <= t < o.start:
                hb = min(hb, o.warn)  # kubelet stalled: Ready, but no status posted
            if not (o.start <= t < o.end) or t < o.detect:
                if o.kind == "gpu-node" and o.end <= t:
                    labels["dgxc.nvidia.com/nvsentinel-state"] = "remediation-succeeded"
                continue
            if o.kind in ("host", "flap"):
                ready = False
            else:
                status["conditions"].append(
                    {
                        "type": "GpuXidError",
                        "status": "True",
                        "reason": "GpuXidErrorIsNotHealthy",
                        "message": "ErrorCode:79 GPU has fallen off the bus",
                        "lastHeartbeatTime": _rfc3339(o.detect),
                        "lastTransitionTime": _rfc3339(o.detect),
                    }
                )
                spec["unschedulable"] = True
                labels["dgxc.nvidia.com/nvsentinel-state"] = "quarantined"
        rc = status["conditions"][0]
        rc["lastHeartbeatTime"] = _rfc3339(hb)
        if not ready:
            rc["status"] = "Unknown"
            rc["reason"] = "NodeStatusUnknown"
            spec.setdefault("taints", []).append(
                {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
            )
        devices: dict[int, list[dict[str, Any]]] = {}
        lost = 0
        for f in self.gpu_faults.get(name, ()):
            if f.detect <= t < f.end:
                devices.setdefault(f.gpu, []).append(
                    {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}
                )
                lost += 1
            seen = [x for x in f.xid_times if x <= t < max(f.start, f.end)]
            if seen:
                devices.setdefault(f.gpu, []).append(
                    {
                        "key": "gpu.nvidia.com/xid",
                        "value": "94",
                        "effect": "None",
                        "timeAdded": _rfc3339(seen[-1]),
                    }
                )
        if lost:
            cap = int(status["capacity"]["nvidia.com/gpu"])
            status["allocatable"]["nvidia.com/gpu"] = str(max(cap - lost, 0))
        devs = [
            {"name": f"gpu-{g}", "attributes": {"index": {"int": g}}, "taints": ts}
            for g, ts in sorted(devices.items())
        ]
        return obj, devs

    def reassess_times(self, name: str) -> list[float]:
        """Every instant at which ``name``'s published signals or history may change."""
        hp = self.health
        out: list[float] = []
        settle = hp.settle_seconds + 1.0
        stale = hp.heartbeat_stale_seconds + 1.0
        for o in self.outages.get(name, ()):
            out += [o.start, o.detect, o.end, o.end + settle]
            if o.warn is not None:
                out += [o.warn, o.warn + stale]
        for f in self.gpu_faults.get(name, ()):
            out += [f.start, f.detect, f.end, f.end + settle, *f.xid_times]
        return out

    def initial(self, ledger: Any) -> None:
        """Assess every node at time 0."""
        for name in self.names:
            self.assess(ledger, name, 0.0)

    def schedule(self, push: Callable[[float, str, Any], None], horizon: float) -> None:
        """Re-assess each node whenever its signals may change, and every
        :data:`TICK_SECONDS` up to ``horizon`` (without one: up to the last change) when the
        policy keeps history."""
        last = 0.0
        for name in self.names:
            for t in sorted(set(self.reassess_times(name))):
                push(t, ASSESS, name)
                last = max(last, t)
        if self.health.history:
            end = horizon if math.isfinite(horizon) else last
            k = 1
            while k * TICK_SECONDS <= end:
                push(k * TICK_SECONDS, TICK, None)
                k += 1

    def assess(self, ledger: Any, node: str, t: float) -> None:
        """Assess ``node`` from what it publishes at ``t``; the ledger takes the verdict."""
        hp = self.health
        obj, devs = self.render(node, t)
        cap, alloc = node_gpus(obj)
        rep = assess(obj, cap, alloc, hp, now=EPOCH0 + t, devices=devs)
        v = rep.node
        if hp.history:
            self.history = observe(self.history, node, v, EPOCH0 + t, xids=rep.xids, params=hp)
            v = adjust(v, self.history.of(node), EPOCH0 + t, hp)
        ledger.set_health(node, v)

    def tick(self, ledger: Any, t: float) -> None:
        """Re-assess every node with history (its risk decays with time)."""
        for name in sorted(self.history.nodes):
            self.assess(ledger, name, t)


def _rfc3339(t: float) -> str:
    return _dt.datetime.fromtimestamp(EPOCH0 + t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
