"""Event loop of the gang scenario: arrivals, all-or-nothing placement, departures.

One run = one cluster, one workload (seed), one registered gang policy, one queueing mode.
It uses ``scheduler/core`` and ``topology/`` only (no HTTP, no Kubernetes API), the way the
failure benchmark (:mod:`benchmarks.faults.engine`) does, and shares its snapshot helper
(:func:`benchmarks.faults.placement.hold`).

Loop:

* Events are arrivals and departures, ordered by (time, departures first, sequence).
  All events of one instant are applied, then the queue is served once.
* The queue is FIFO by arrival. ``backfill=False`` is Kueue's ``StrictFIFO``: only the head
  may start; a head that cannot be placed blocks everyone behind it. ``backfill=True`` is
  Kueue's default ``BestEffortFIFO``: every queued gang is tried in arrival order and any
  that can be placed starts; there is no reservation for the head, so large gangs can wait
  long behind a stream of small ones (as in Kueue).
* Each attempt calls the policy, ``policy(snapshot, gang, params)``, on the current
  immutable snapshot; a success returns every member (all or nothing) and the next
  snapshot is built member by member with ``with_pod`` (which refuses double booking); a
  departure builds it with ``without_pod``. Nothing else changes the cluster.
* A placed gang runs ``duration x slowdown``, the slowdown given by the locality model for
  the placement (:mod:`benchmarks.gangsim.locality`).
* Attempts are skipped when they cannot change the answer: when the free GPUs cannot hold
  the gang (in total, or in any one domain of a required level: a necessary condition for
  every policy), and when the gang was refused on the very same snapshot generation
  (policies are deterministic functions of the snapshot). A *refusal* is therefore a policy
  saying no although enough GPUs were free (fragmentation, topology rules, heuristics).

With ``check_invariants`` the loop verifies after every event: each running gang holds
exactly its members and GPUs, queued and finished gangs hold nothing, no GPU is held twice
and every node's used mask is the union of its pods' GPUs, and the allocated GPU count
matches the snapshot's free counts.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.faults.placement import hold
from benchmarks.gangsim.locality import LocalityModel, profile
from benchmarks.gangsim.workload import ClusterSpec, GangJob
from scheduler.core.gang import simple_gang
from scheduler.core.model import Health, indices_to_mask
from scheduler.core.params import SchedParams
from scheduler.core.policies.registry import get_policy
from scheduler.core.schedule import Assignment
from scheduler.core.snapshot import ClusterSnapshot, build_snapshot, without_pod

NAMESPACE = "gangsim"
_DEPART, _ARRIVE = 0, 1


class InvariantError(AssertionError):
    """The simulated cluster broke all-or-nothing or no-double-booking."""


@dataclass(frozen=True, slots=True)
class GangOutcome:
    """What happened to one gang (times in seconds; ``nan`` when never placed).

    Attributes:
        job: the gang.
        start / finish: placement and departure times.
        slowdown: locality factor applied to its duration.
        islands: NVLink domains used.
        domains: domains used per fabric level and ``node``.
        lower_bound: the policy's lower bound per level at placement time (fewest domains
            whose free capacity covers the gang; -1 infeasible).
        bandwidth_gbps: ring all-reduce bottleneck of the placement.
        status: the policy's result status (CP-SAT: optimal / feasible / fallback).
        refusals: attempts refused before it was placed.
    """

    job: GangJob
    start: float = math.nan
    finish: float = math.nan
    slowdown: float = math.nan
    islands: int = 0
    domains: Mapping[str, int] = field(default_factory=dict)
    lower_bound: Mapping[str, int] = field(default_factory=dict)
    bandwidth_gbps: float = math.nan
    status: str = ""
    refusals: int = 0

    @property
    def placed(self) -> bool:
        """True when the gang ran."""
        return not math.isnan(self.start)

    @property
    def wait(self) -> float:
        """Queueing delay (s)."""
        return self.start - self.job.arrive

    @property
    def jct(self) -> float:
        """Job completion time: arrival to departure (s)."""
        return self.finish - self.job.arrive


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run's raw results.

    Attributes:
        cluster / policy / seed / backfill: the conditions.
        capacity: cluster GPUs.
        outcomes: one per gang, in arrival order.
        alloc_gpu_s: integral of allocated GPUs over [0, ``window``] (GPU-seconds).
        useful_gpu_s: the same integral with each gang's GPUs divided by its slowdown: the
            packed-equivalent work the allocation delivered (allocation net of locality loss).
        window: the last arrival time (the cluster is fed until then).
        makespan: last departure.
        calls / refusals: policy calls and refusals (see the module docstring).
        statuses: result status counts over all calls.
        checks: invariant checks performed.
        wall_s: wall-clock time of the run.
        params: the solver parameters used (recorded with the results).
    """

    cluster: str
    policy: str
    seed: int
    backfill: bool
    capacity: int
    outcomes: tuple[GangOutcome, ...]
    alloc_gpu_s: float
    useful_gpu_s: float
    window: float
    makespan: float
    calls: int
    refusals: int
    statuses: Mapping[str, int]
    checks: int
    wall_s: float
    params: Mapping[str, Any]


def _domain_codes(snap: ClusterSnapshot, params: SchedParams) -> dict[str, np.ndarray]:
    """Per fabric level, a domain code per node (unlabelled nodes get their own code)."""
    out: dict[str, np.ndarray] = {}
    n = len(snap.nodes)
    for li, lv in enumerate(params.fabric.levels):
        codes: dict[str, int] = {}
        arr = np.empty(n, dtype=np.int64)
        for i, nd in enumerate(snap.nodes):
            d = nd.fabric_path[li]
            arr[i] = codes.setdefault(d if d is not None else "\0" + nd.name, len(codes))
        out[lv.name] = arr
    return out


def may_fit(snap: ClusterSnapshot, job: GangJob, codes: Mapping[str, np.ndarray]) -> bool:
    """A necessary condition for any policy: enough free member slots (in one domain of the
    required level, if any)."""
    a = snap.arrays
    ok = (a.state < int(Health.UNHEALTHY)) & ~a.unschedulable
    slots = np.where(ok, a.free // job.gpus_per_pod, 0)
    if int(slots.sum()) < job.pods:
        return False
    if job.required and job.required in codes:
        per = np.bincount(codes[job.required], weights=slots)
        return bool(per.max() >= job.pods)
    return True


def check_invariants(
    snap: ClusterSnapshot,
    running: Mapping[str, tuple[GangJob, tuple[Assignment, ...]]],
    idle: Sequence[str],
    capacity: int,
    allocated: int,
) -> None:
    """Raise :class:`InvariantError` unless the snapshot is consistent (module docstring).

    Args:
        running: gang key -> (job, member assignments) of running gangs.
        idle: keys of gangs that must hold nothing (queued or finished).
    """
    by_gang: dict[str, list[Any]] = {}
    for p in snap.pods.values():
        by_gang.setdefault(p.gang, []).append(p)
    if set(by_gang) != set(running):
        extra = sorted(set(by_gang) ^ set(running))[:3]
        raise InvariantError(f"pods held by gangs that are not running (or missing): {extra}")
    for key, (job, members) in running.items():
        pods = by_gang[key]
        if len(pods) != job.pods or len(members) != job.pods:
            raise InvariantError(f"{key}: {len(pods)} of {job.pods} members hold resources")
        if any(len(p.gpus) != job.gpus_per_pod for p in pods):
            raise InvariantError(f"{key}: a member holds the wrong number of GPUs")
    for key in idle:
        if key in by_gang:
            raise InvariantError(f"{key}: holds resources while not running")
    masks: dict[str, int] = {}
    for p in snap.pods.values():
        m = indices_to_mask(p.gpus)
        if masks.get(p.node, 0) & m:
            raise InvariantError(f"GPU held twice on {p.node}")
        masks[p.node] = masks.get(p.node, 0) | m
    for nd in snap.nodes:
        if nd.used_mask != masks.get(nd.name, 0):
            raise InvariantError(f"{nd.name}: used mask differs from its pods' GPUs")
    if int(snap.arrays.free.sum()) != capacity - allocated:
        raise InvariantError("free GPU count differs from the GPUs held by running gangs")


def gang_key(job: GangJob) -> str:
    """The gang's key ``namespace/name``."""
    return f"{NAMESPACE}/{job.name}"


def simulate(
    cluster: ClusterSpec,
    jobs: Sequence[GangJob],
    policy: str,
    params: SchedParams,
    model: LocalityModel,
    *,
    seed: int = 0,
    backfill: bool = True,
    check: bool = False,
) -> RunResult:
    """Run ``jobs`` on ``cluster`` with the gang policy ``policy`` (deterministic).

    Raises:
        ValueError: unknown policy.
        InvariantError: with ``check``, when the cluster state becomes inconsistent.
    """
    t0 = time.perf_counter()
    plan = get_policy(policy)
    snap = build_snapshot(cluster.nodes(), [], params)
    capacity = int(snap.arrays.capacity.sum())
    codes = _domain_codes(snap, params)
    events: list[tuple[float, int, int, str]] = []
    seq = 0
    for j in jobs:
        heapq.heappush(events, (j.arrive, _ARRIVE, seq, j.name))
        seq += 1
    by_name = {j.name: j for j in jobs}
    out: dict[str, GangOutcome] = {j.name: GangOutcome(j) for j in jobs}
    queue: list[GangJob] = []
    running: dict[str, tuple[GangJob, tuple[Assignment, ...]]] = {}
    done: list[str] = []
    refused_at: dict[str, int] = {}
    refusals_of: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    calls = refusals = checks = 0
    allocated = 0
    useful = 0.0
    alloc_gpu_s = useful_gpu_s = 0.0
    window = max((j.arrive for j in jobs), default=0.0)
    now = 0.0
    makespan = 0.0

    def attempt(job: GangJob, t: float) -> bool:
        nonlocal snap, calls, refusals, seq, allocated, useful
        if refused_at.get(job.name) == snap.generation or not may_fit(snap, job, codes):
            return False
        key = gang_key(job)
        gang = simple_gang(
            key, job.pods, job.gpus_per_pod, required=job.required, preferred=job.preferred
        )
        res = plan(snap, gang, params)
        calls += 1
        statuses[str(res.details.get("status", "ok" if res.ok else "refused"))] += 1
        if not res.ok:
            refusals += 1
            refusals_of[job.name] += 1
            refused_at[job.name] = snap.generation
            return False
        members = tuple(
            Assignment(f"{key}-m{i:03d}", a.node, tuple(a.gpus))
            for i, a in enumerate(sorted(res.assignments, key=lambda a: a.pod))
        )
        if len(members) != job.pods:
            raise InvariantError(f"{key}: policy returned {len(members)} of {job.pods} members")
        snap = hold(snap, key, members)
        prof = profile(snap, members, params.fabric)
        slow = model.of(prof)
        finish = t + job.duration * slow
        heapq.heappush(events, (finish, _DEPART, seq, job.name))
        seq += 1
        allocated += job.gpus
        useful += job.gpus / slow
        running[key] = (job, members)
        lb = res.details.get("lower_bound") or {}
        out[job.name] = GangOutcome(
            job=job,
            start=t,
            finish=finish,
            slowdown=slow,
            islands=prof.islands,
            domains=dict(prof.domains),
            lower_bound={str(k): int(v) for k, v in lb.items()},
            bandwidth_gbps=prof.bottleneck_gbps,
            status=str(res.details.get("status", "")),
            refusals=refusals_of[job.name],
        )
        return True

    def serve(t: float) -> None:
        i = 0
        while i < len(queue):
            if attempt(queue[i], t):
                queue.pop(i)
                continue
            if not backfill:
                return
            i += 1

    while events:
        t = events[0][0]
        span = max(0.0, min(t, window) - min(now, window))
        alloc_gpu_s += allocated * span
        useful_gpu_s += useful * span
        now = t
        while events and events[0][0] == t:
            _, kind, _, name = heapq.heappop(events)
            job = by_name[name]
            if kind == _ARRIVE:
                queue.append(job)
            else:
                key = gang_key(job)
                _, members = running.pop(key)
                for m in members:
                    snap = without_pod(snap, m.pod)
                allocated -= job.gpus
                useful -= job.gpus / out[name].slowdown
                done.append(key)
                makespan = max(makespan, t)
        serve(t)
        if check:
            idle = [gang_key(j) for j in queue] + done
            check_invariants(snap, running, idle, capacity, allocated)
            checks += 1

    g = params.gang
    return RunResult(
        cluster=cluster.name,
        policy=policy,
        seed=seed,
        backfill=backfill,
        capacity=capacity,
        outcomes=tuple(out[j.name] for j in jobs),
        alloc_gpu_s=alloc_gpu_s,
        useful_gpu_s=useful_gpu_s,
        window=window,
        makespan=makespan,
        calls=calls,
        refusals=refusals,
        statuses=dict(sorted(statuses.items())),
        checks=checks,
        wall_s=time.perf_counter() - t0,
        params={
            "solver_time_limit_seconds": g.solver_time_limit_seconds,
            "seed": g.seed,
            "workers": g.workers,
            "selection_policy": params.selection_policy,
        },
    )


def _q(values: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


def summarize(run: RunResult, levels: Mapping[str, str]) -> dict[str, float]:
    """Metrics of one run (times in minutes / hours as named; shares in 0..1).

    ``levels``: alias -> fabric level (or ``node``) whose domain counts are reported, e.g.
    ``{"local": "nvlink-domain", "spine": "spine", "node": "node"}``; keys are named by
    alias (``dom_local_mean``).
    """
    placed = [o for o in run.outcomes if o.placed]
    waits = [o.wait / 60.0 for o in placed]
    jcts = [o.jct / 3600.0 for o in placed]
    m: dict[str, float] = {
        "gangs": float(len(run.outcomes)),
        "placed": float(len(placed)),
        "never_placed": float(len(run.outcomes) - len(placed)),
        "wait_mean_min": float(np.mean(waits)) if waits else math.nan,
        "wait_p95_min": _q(waits, 0.95),
        "wait_gpu_mean_min": (
            sum(o.wait * o.job.gpus for o in placed) / 60.0 / sum(o.job.gpus for o in placed)
            if placed
            else math.nan
        ),
        "jct_mean_h": float(np.mean(jcts)) if jcts else math.nan,
        "jct_p95_h": _q(jcts, 0.95),
        "slowdown_mean": float(np.mean([o.slowdown for o in placed])) if placed else math.nan,
        "spread_share": (float(np.mean([o.islands > 1 for o in placed])) if placed else math.nan),
        "bw_mean_gbps": float(np.mean([o.bandwidth_gbps for o in placed])) if placed else math.nan,
        "bw_p5_gbps": _q([o.bandwidth_gbps for o in placed], 0.05),
        "alloc": run.alloc_gpu_s / (run.capacity * run.window) if run.window > 0 else math.nan,
        "alloc_useful": (
            run.useful_gpu_s / (run.capacity * run.window) if run.window > 0 else math.nan
        ),
        "makespan_h": run.makespan / 3600.0,
        "calls": float(run.calls),
        "refusals": float(run.refusals),
        "fallbacks": float(run.statuses.get("fallback", 0)),
        "wall_s": run.wall_s,
    }
    for alias, lv in levels.items():
        used = [o.domains.get(lv, 0) for o in placed]
        pairs = [
            (o.domains.get(lv, 0), o.lower_bound[lv])
            for o in placed
            if o.lower_bound.get(lv, -1) >= 0
        ]
        m[f"dom_{alias}_mean"] = float(np.mean(used)) if used else math.nan
        m[f"dom_{alias}_p95"] = _q(used, 0.95)
        m[f"lb_{alias}_mean"] = float(np.mean([b for _, b in pairs])) if pairs else math.nan
        m[f"excess_{alias}_mean"] = float(np.mean([u - b for u, b in pairs])) if pairs else math.nan
    at = [
        all(
            o.domains.get(lv, 0) <= o.lower_bound[lv]
            for lv in levels.values()
            if o.lower_bound.get(lv, -1) >= 0
        )
        for o in placed
    ]
    m["at_lb_share"] = float(np.mean(at)) if at else math.nan
    m["offered_load"] = offered_load(run)
    return m


def offered_load(run: RunResult) -> float:
    """Realised offered load of the workload: GPU-seconds of packed work arriving in the
    window / (GPUs x window)."""
    work = sum(o.job.gpus * o.job.duration for o in run.outcomes)
    return work / (run.capacity * run.window) if run.window > 0 else math.nan
