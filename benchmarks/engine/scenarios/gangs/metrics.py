"""What the gang scenario measures in a run of the one engine.

A run is :mod:`benchmarks.engine` with a snapshot ledger, a registered gang policy, the
Pollux locality stretch, ``serve="instant"`` and a FIFO queue (Kueue ``StrictFIFO`` or
``BestEffortFIFO``, see :mod:`benchmarks.engine.loop`): all events of one instant are
applied, then the queue is served once; a placed gang runs ``duration x slowdown``. An
attempt is skipped when the free GPUs cannot hold the gang (in total, or in any one domain
of a required level: a necessary condition for every policy) and when the gang was refused
on the very same snapshot generation; a *refusal* is therefore a policy saying no although
enough GPUs were free (fragmentation, topology rules, heuristics).

:class:`GangStats` is the hook that records every gang's outcome and the run's allocation
integrals; :func:`summarize` turns a :class:`RunResult` into the report's metrics.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.engine.jobs import Job, Run
from benchmarks.engine.locality import PlacementProfile
from benchmarks.engine.loop import Engine, Hook
from scheduler.core.params import SchedParams
from scheduler.core.schedule import PlacementResult


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

    job: Job
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


class GangStats(Hook):
    """Records every gang's outcome, the policy calls and the allocation integrals.

    Args:
        jobs: the run's gangs (outcomes are kept in this order).
    """

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.t0 = time.perf_counter()
        self.jobs = tuple(jobs)
        self.out: dict[str, GangOutcome] = {j.name: GangOutcome(j) for j in jobs}
        self.window = max((j.arrive for j in jobs), default=0.0)
        self.allocated = 0
        self.useful = 0.0
        self.alloc_gpu_s = 0.0
        self.useful_gpu_s = 0.0
        self.makespan = 0.0
        self.calls = 0
        self.refusals = 0
        self.statuses: Counter[str] = Counter()
        self.refusals_of: Counter[str] = Counter()

    def advance(self, engine: Engine, before: float, now: float) -> None:
        """Integrate allocated (and useful) GPUs over the arrival window."""
        span = max(0.0, min(now, self.window) - min(before, self.window))
        self.alloc_gpu_s += self.allocated * span
        self.useful_gpu_s += self.useful * span

    def attempted(self, engine: Engine, run: Run, result: PlacementResult) -> None:
        """Count the policy call, its status and a refusal."""
        self.calls += 1
        self.statuses[str(result.details.get("status", "ok" if result.ok else "refused"))] += 1
        if not result.ok:
            self.refusals += 1
            self.refusals_of[run.job.name] += 1

    def started(self, engine: Engine, run: Run) -> None:
        """Record the placement: its spread, slowdown and the policy's lower bound."""
        job = run.job
        prof = run.locality
        assert isinstance(prof, PlacementProfile)
        self.allocated += job.gpus
        self.useful += job.gpus / run.slowdown
        lb = run.details.get("lower_bound") or {}
        assert isinstance(lb, Mapping)
        self.out[job.name] = GangOutcome(
            job=job,
            start=run.start,
            finish=run.finish,
            slowdown=run.slowdown,
            islands=prof.islands,
            domains=dict(prof.domains),
            lower_bound={str(k): int(v) for k, v in lb.items()},
            bandwidth_gbps=prof.bottleneck_gbps,
            status=str(run.details.get("status", "")),
            refusals=self.refusals_of[job.name],
        )

    def released(self, engine: Engine, run: Run, why: str) -> None:
        """The gang departed."""
        self.allocated -= run.job.gpus
        self.useful -= run.job.gpus / self.out[run.job.name].slowdown
        self.makespan = max(self.makespan, engine.now)

    def result(
        self,
        cluster: str,
        policy: str,
        seed: int,
        backfill: bool,
        capacity: int,
        checks: int,
        params: SchedParams,
    ) -> RunResult:
        """The run's raw results (with the solver parameters that were used)."""
        g = params.gang
        return RunResult(
            cluster=cluster,
            policy=policy,
            seed=seed,
            backfill=backfill,
            capacity=capacity,
            outcomes=tuple(self.out[j.name] for j in self.jobs),
            alloc_gpu_s=self.alloc_gpu_s,
            useful_gpu_s=self.useful_gpu_s,
            window=self.window,
            makespan=self.makespan,
            calls=self.calls,
            refusals=self.refusals,
            statuses=dict(sorted(self.statuses.items())),
            checks=checks,
            wall_s=time.perf_counter() - self.t0,
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
