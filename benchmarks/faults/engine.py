"""A minimal, deterministic discrete-event loop over ``scheduler/core`` (no HTTP, no API).

One run = one scenario, one seed, one health policy. The ground truth (which node or GPU
is broken when, which warnings precede it) comes from :mod:`benchmarks.faults.scenario`;
the policy only ever sees what a real cluster would publish at that moment, rendered as
Node objects (Ready + heartbeat, NVSentinel condition / label / cordon, allocatable) and
DRA devices (``gpu-lost`` and non-fatal ``xid`` taints), assessed with
:func:`scheduler.core.health.assess` and, when the policy keeps history,
:func:`~scheduler.core.health_history.observe` / :func:`~scheduler.core.health_history.adjust`.
Gangs are placed with :mod:`benchmarks.faults.placement` on the resulting snapshots.

Accounting (per policy):

* a job placed on hardware that is broken at that instant crashes after
  ``crash_after``; the placement counts as *signalled* when the fault was already published
  (a scheduler that reads the signal could have avoided it) and *silent* otherwise;
* a fault on a node or GPU a running gang uses interrupts the whole gang (a "gang
  restart"): the work since its last checkpoint and its restart overhead are lost, and it
  is re-queued ``requeue_delay`` later, ahead of new arrivals;
* time to re-placement runs from the fault to the next placement that does not crash
  (its GPU-weighted sum is the GPU-hours the interrupted gangs spent waiting);
* goodput = GPU-hours that advanced training / GPU-hours held by jobs.
"""

from __future__ import annotations

import copy
import datetime as _dt
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from benchmarks.faults.placement import GangAsk, Placer, greedy_gang, hold
from benchmarks.faults.scenario import (
    DAY,
    HOUR,
    POOLS,
    GpuFault,
    Job,
    Outage,
    Scenario,
    cluster,
    faults,
    workload,
)
from scheduler.core.health import HealthParams, assess
from scheduler.core.health_history import HealthHistory, adjust, observe
from scheduler.core.model import Health
from scheduler.core.objects import node_gpus
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import (
    ClusterSnapshot,
    build_snapshot,
    with_node_health,
    without_pod,
)

HEARTBEAT_PERIOD = 300.0
"""The kubelet's ``nodeStatusReportFrequency`` default: Ready's heartbeat is refreshed at
least this often while nothing changes."""
TICK = 1800.0
"""Re-assessment period for nodes that carry history (risk decays continuously)."""


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


@dataclass
class Metrics:
    """Results of one run (sums over the horizon)."""

    policy: str
    seed: int
    jobs: int = 0
    completed: int = 0
    outages: int = 0
    host_outages: int = 0
    gpu_node_outages: int = 0
    flaps: int = 0
    gpu_faults: int = 0
    interruptions: int = 0
    gang_restarts: int = 0
    bad_signalled: int = 0
    bad_signalled_node: int = 0
    bad_signalled_gpu: int = 0
    bad_silent: int = 0
    placed_on_warned: int = 0
    replace_times: list[float] = field(default_factory=list)
    not_replaced: int = 0
    replace_gpu_h: float = 0.0
    lost_gpu_h: float = 0.0
    held_gpu_h: float = 0.0

    @property
    def goodput(self) -> float:
        """Useful share of the GPU-hours held by jobs."""
        return (self.held_gpu_h - self.lost_gpu_h) / self.held_gpu_h if self.held_gpu_h else 1.0

    def replace_minutes(self, q: float) -> float:
        """Quantile ``q`` of the time from failure to re-placement, in minutes."""
        if not self.replace_times:
            return float("nan")
        return float(np.quantile(np.array(self.replace_times), q)) / 60.0


@dataclass
class _Run:
    """A job's state in one run."""

    job: Job
    saved: float = 0.0  # seconds of work checkpointed
    start: float = 0.0
    overhead: float = 0.0
    members: tuple[Any, ...] = ()
    running: bool = False
    doomed: bool = False
    epoch: int = 0
    restarted: bool = False
    fail_time: float | None = None


class _World:
    """Ground truth rendered as the signals a cluster publishes."""

    def __init__(
        self, sc: Scenario, nodes: list[dict[str, Any]], outages: list[Outage], gf: list[GpuFault]
    ) -> None:
        self.sc = sc
        self.base = {n["metadata"]["name"]: n for n in nodes}
        self.names = sorted(self.base)
        self.phase = {name: (i * 37.0) % HEARTBEAT_PERIOD for i, name in enumerate(self.names)}
        self.outages: dict[str, list[Outage]] = {}
        for o in outages:
            self.outages.setdefault(o.node, []).append(o)
        self.gpu_faults: dict[str, list[GpuFault]] = {}
        for f in gf:
            self.gpu_faults.setdefault(f.node, []).append(f)

    def broken(self, node: str, gpus: tuple[int, ...], t: float) -> tuple[str, bool] | None:
        """("node"|"gpu", signalled) if ``node`` or one of ``gpus`` is broken at ``t``."""
        for o in self.outages.get(node, ()):
            if o.start <= t < o.end:
                return "node", t >= o.detect
        for f in self.gpu_faults.get(node, ()):
            if f.gpu in gpus and f.start <= t < f.end:
                return "gpu", t >= f.detect
        return None

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

    def reassess_times(self, name: str, hp: HealthParams) -> list[float]:
        """Every instant at which ``name``'s published signals or history may change."""
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


_EPOCH0 = 1_798_761_600.0  # 2027-01-01T00:00:00Z: simulated time 0


def _rfc3339(t: float) -> str:
    return _dt.datetime.fromtimestamp(_EPOCH0 + t, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def simulate(
    sc: Scenario,
    seed: int,
    policy: str,
    health: HealthParams,
    placer: Placer = greedy_gang,
) -> Metrics:
    """Run one scenario under one health policy; deterministic for a seed."""
    nodes = cluster(sc)
    outages, gpu_faults = faults(sc, nodes, seed)
    jobs = workload(sc, seed)
    world = _World(sc, nodes, outages, gpu_faults)
    params = SchedParams(health=health)
    snap = build_snapshot(nodes, [], params)
    history = HealthHistory()
    horizon = sc.days * DAY
    m = Metrics(policy, seed, jobs=len(jobs), outages=len(outages))
    m.gpu_faults = sum(1 for f in gpu_faults if f.end > f.start)
    m.host_outages = sum(1 for o in outages if o.kind == "host")
    m.gpu_node_outages = sum(1 for o in outages if o.kind == "gpu-node")
    m.flaps = sum(1 for o in outages if o.kind == "flap")

    def assess_node_at(s: ClusterSnapshot, name: str, t: float) -> ClusterSnapshot:
        nonlocal history
        obj, devs = world.render(name, t)
        cap, alloc = node_gpus(obj)
        rep = assess(obj, cap, alloc, health, now=_EPOCH0 + t, devices=devs)
        v = rep.node
        if health.history:
            history = observe(history, name, v, _EPOCH0 + t, xids=rep.xids, params=health)
            v = adjust(v, history.of(name), _EPOCH0 + t, health)
        return with_node_health(s, name, v)

    for name in world.names:
        snap = assess_node_at(snap, name, 0.0)

    pool_idx = {
        pool: np.array(
            [i for i, n in enumerate(snap.nodes) if n.labels.get("nvidia.com/gpu.product") == prod],
            dtype=np.int64,
        )
        for pool, (prod, _) in POOLS.items()
    }

    # Events: (time, order, kind, payload). Order breaks ties deterministically:
    # faults before re-assessments before job events before arrivals.
    events: list[tuple[float, int, int, str, Any]] = []
    seq = 0

    def push(t: float, order: int, kind: str, payload: Any) -> None:
        nonlocal seq
        if t <= horizon:
            heapq.heappush(events, (t, order, seq, kind, payload))
            seq += 1

    for o in outages:
        push(o.start, 0, "outage", o)
    for f in gpu_faults:
        if f.end > f.start:
            push(f.start, 0, "gpu-fault", f)
    for name in world.names:
        for t in sorted(set(world.reassess_times(name, health))):
            push(t, 1, "assess", name)
    if health.history:
        k = 1
        while k * TICK <= horizon:
            push(k * TICK, 1, "tick", None)
            k += 1
    for j in jobs:
        push(j.arrive, 3, "arrive", j)

    runs: dict[str, _Run] = {}
    queue: list[str] = []

    def release(r: _Run, t: float) -> None:
        nonlocal snap
        for a in r.members:
            snap = without_pod(snap, a.pod)
        m.held_gpu_h += r.job.gpus * (t - r.start) / HOUR
        r.members = ()
        r.running = False

    def interrupt(r: _Run, t: float) -> None:
        # The gang keeps its GPUs until the job controller notices and tears it down
        # (``requeue_delay``); that time is lost too.
        elapsed = t - r.start
        productive = max(0.0, elapsed - r.overhead)
        kept = math.floor(productive / sc.checkpoint_every) * sc.checkpoint_every
        r.saved = min(r.saved + kept, r.job.hours * HOUR)
        m.lost_gpu_h += r.job.gpus * (elapsed - kept + sc.requeue_delay) / HOUR
        m.gang_restarts += 1
        m.interruptions += 1
        r.fail_time = t if r.fail_time is None else r.fail_time
        r.doomed = True
        r.restarted = True
        r.epoch += 1
        push(t + sc.requeue_delay, 2, "requeue", (r.job.name, r.epoch))

    def hits(r: _Run, node: str, gpus: tuple[int, ...] | None) -> bool:
        return any(a.node == node and (gpus is None or set(a.gpus) & set(gpus)) for a in r.members)

    def try_schedule(t: float) -> None:
        nonlocal snap
        if not queue:
            return
        a = snap.arrays
        order = sorted(queue, key=lambda n: (not runs[n].restarted, runs[n].job.arrive, n))
        for name in order:
            r = runs[name]
            job = r.job
            idx = pool_idx[job.pool]
            ok = (
                (a.state[idx] < int(Health.UNHEALTHY))
                & ~a.unschedulable[idx]
                & (a.free[idx] >= job.gpus_per_pod)
            )
            if int(ok.sum()) < job.pods:
                continue
            ask = GangAsk(
                f"faults/{name}-{r.epoch}",
                job.pods,
                job.gpus_per_pod,
                {"nvidia.com/gpu.product": POOLS[job.pool][0]},
            )
            res = placer(snap, ask, params)
            if not res.ok:
                continue
            snap = hold(snap, ask.key, res.assignments)
            a = snap.arrays
            queue.remove(name)
            r.members = res.assignments
            r.start = t
            r.running = True
            r.overhead = sc.restart_overhead if r.restarted else 0.0
            bad = [world.broken(x.node, x.gpus, t) for x in res.assignments]
            bad = [b for b in bad if b is not None]
            if any(world.warned(x.node, t) for x in res.assignments):
                m.placed_on_warned += 1
            if bad:
                r.doomed = True
                signalled = [b for b in bad if b[1]]
                if signalled:
                    m.bad_signalled += 1
                    if any(b[0] == "node" for b in signalled):
                        m.bad_signalled_node += 1
                    else:
                        m.bad_signalled_gpu += 1
                else:
                    m.bad_silent += 1
                push(t + sc.crash_after, 2, "crash", (name, r.epoch))
            else:
                r.doomed = False
                if r.fail_time is not None:
                    m.replace_times.append(t - r.fail_time)
                    m.replace_gpu_h += job.gpus * (t - r.fail_time) / HOUR
                    r.fail_time = None
                left = job.hours * HOUR - r.saved
                push(t + r.overhead + left, 2, "finish", (name, r.epoch))

    while events:
        t, _, _, kind, payload = heapq.heappop(events)
        if kind == "outage" or kind == "gpu-fault":
            node = payload.node
            gpus = None if kind == "outage" else (payload.gpu,)
            for r in [r for r in runs.values() if r.running and not r.doomed]:
                if hits(r, node, gpus):
                    interrupt(r, t)
            snap = assess_node_at(snap, node, t)
        elif kind == "assess":
            snap = assess_node_at(snap, payload, t)
        elif kind == "tick":
            for name in sorted(history.nodes):
                snap = assess_node_at(snap, name, t)
        elif kind == "arrive":
            runs[payload.name] = _Run(payload)
            queue.append(payload.name)
        elif kind == "requeue":
            name, epoch = payload
            r = runs[name]
            if r.epoch == epoch and r.running:
                release(r, t)
                queue.append(name)
        elif kind == "crash":
            name, epoch = payload
            r = runs[name]
            if r.epoch == epoch and r.running:
                m.lost_gpu_h += r.job.gpus * (t - r.start) / HOUR
                release(r, t)
                m.gang_restarts += 1
                r.fail_time = r.start if r.fail_time is None else r.fail_time
                r.restarted = True
                r.epoch += 1
                queue.append(name)
        elif kind == "finish":
            name, epoch = payload
            r = runs[name]
            if r.epoch == epoch and r.running:
                release(r, t)
                m.completed += 1
                r.epoch += 1
        try_schedule(t)

    for r in runs.values():
        if r.running:
            release(r, horizon)
        if r.fail_time is not None:
            m.not_replaced += 1
    return m


def summarize(results: list[Metrics]) -> Mapping[str, float]:
    """Totals over seeds of one policy (times pooled over every re-placement)."""
    times = [x for r in results for x in r.replace_times]
    held = sum(r.held_gpu_h for r in results)
    lost = sum(r.lost_gpu_h for r in results)
    agg = {
        k: float(sum(getattr(r, k) for r in results))
        for k in (
            "jobs",
            "completed",
            "outages",
            "host_outages",
            "gpu_node_outages",
            "flaps",
            "gpu_faults",
            "interruptions",
            "gang_restarts",
            "bad_signalled",
            "bad_signalled_node",
            "bad_signalled_gpu",
            "bad_silent",
            "placed_on_warned",
            "not_replaced",
        )
    }
    agg["replace_gpu_h"] = sum(r.replace_gpu_h for r in results)
    agg["lost_gpu_h"] = lost
    agg["held_gpu_h"] = held
    agg["goodput"] = (held - lost) / held if held else 1.0
    agg["replace_n"] = float(len(times))
    arr = np.array(times) / 60.0 if times else np.array([float("nan")])
    agg["replace_mean_min"] = float(arr.mean())
    agg["replace_p50_min"] = float(np.quantile(arr, 0.5))
    agg["replace_p95_min"] = float(np.quantile(arr, 0.95))
    return agg
