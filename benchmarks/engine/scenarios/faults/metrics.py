"""What the failure-injection benchmark measures in a run of the one engine.

One run = one scenario, one seed, one health policy: :mod:`benchmarks.engine` with a
snapshot ledger, the gang placer, ``best-effort-fifo`` served after every event, the
faults of :mod:`benchmarks.engine.scenarios.faults.scenario` rendered as published signals
(:class:`benchmarks.engine.health.SignalHealth`) and the engine's recovery model. The
policy only ever sees what a real cluster would publish at that moment.

Accounting (per policy, :class:`FaultStats`):

* a job placed on hardware that is broken at that instant crashes after
  ``crash_after``; the placement counts as *signalled* when the fault was already published
  (a scheduler that reads the signal could have avoided it) and *silent* otherwise;
* a fault on a node or GPU a running gang uses interrupts the whole gang (a "gang
  restart"): the work since its last checkpoint and its restart overhead are lost, and it
  is re-queued ``requeue_delay`` later, ahead of new arrivals, or when remediation evicts
  it, if sooner (``Recovery.evict_after``; the GPU-hours it held until then are lost);
* time to re-placement runs from the fault to the next placement that does not crash
  (its GPU-weighted sum is the GPU-hours the interrupted gangs spent waiting);
* goodput = GPU-hours that advanced training / GPU-hours held by jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmarks.engine.health import GpuFault, Outage, SignalHealth
from benchmarks.engine.jobs import Job, Run
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.scenarios.faults.scenario import HOUR


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
    evicted: int = 0
    """Gangs torn down by remediation before the job controller's delay (``requeue_delay``
    after a fault, ``crash_after`` after a start on broken hardware)."""
    teardown_times: list[float] = field(default_factory=list)
    """Per fault that interrupted a running gang: seconds until its GPUs were freed."""

    @property
    def goodput(self) -> float:
        """Useful share of the GPU-hours held by jobs."""
        return (self.held_gpu_h - self.lost_gpu_h) / self.held_gpu_h if self.held_gpu_h else 1.0

    def replace_minutes(self, q: float) -> float:
        """Quantile ``q`` of the time from failure to re-placement, in minutes."""
        if not self.replace_times:
            return float("nan")
        return float(np.quantile(np.array(self.replace_times), q)) / 60.0


class FaultStats(Hook):
    """Accounts for one run (see the module docstring).

    Args:
        policy: the health policy's name.
        seed: the run's seed.
        jobs: the run's gangs.
        faults: the run's ground truth (outages, then GPU faults).
    """

    def __init__(
        self, policy: str, seed: int, jobs: Sequence[Job], faults: Sequence[Outage | GpuFault]
    ) -> None:
        outages = [f for f in faults if isinstance(f, Outage)]
        m = Metrics(policy, seed, jobs=len(jobs), outages=len(outages))
        m.gpu_faults = sum(1 for f in faults if isinstance(f, GpuFault) and f.end > f.start)
        m.host_outages = sum(1 for o in outages if o.kind == "host")
        m.gpu_node_outages = sum(1 for o in outages if o.kind == "gpu-node")
        m.flaps = sum(1 for o in outages if o.kind == "flap")
        self.metrics = m
        self.fail_time: dict[str, float] = {}
        self.hit_at: dict[str, float] = {}

    def interrupted(self, engine: Engine, run: Run, elapsed: float, kept: float) -> None:
        """A fault hit the gang: its unsaved work and the teardown delay are lost."""
        m = self.metrics
        delay = engine.recovery.requeue_delay
        m.lost_gpu_h += run.job.gpus * (elapsed - kept + delay) / HOUR
        m.gang_restarts += 1
        m.interruptions += 1
        self.fail_time.setdefault(run.job.name, engine.now)
        self.hit_at[run.job.name] = engine.now

    def started(self, engine: Engine, run: Run) -> None:
        """Classify the placement (broken, warned) and close a re-placement."""
        m = self.metrics
        t = run.start
        health = engine.health
        assert isinstance(health, SignalHealth)
        if any(health.warned(a.node, t) for a in run.members):
            m.placed_on_warned += 1
        if run.broken:
            signalled = [b for b in run.broken if b[1]]
            if signalled:
                m.bad_signalled += 1
                if any(b[0] == "node" for b in signalled):
                    m.bad_signalled_node += 1
                else:
                    m.bad_signalled_gpu += 1
            else:
                m.bad_silent += 1
        else:
            failed = self.fail_time.pop(run.job.name, None)
            if failed is not None:
                m.replace_times.append(t - failed)
                m.replace_gpu_h += run.job.gpus * (t - failed) / HOUR

    def released(self, engine: Engine, run: Run, why: str) -> None:
        """GPU-hours held; a crash loses the whole placement; a finish completes the job."""
        m = self.metrics
        t = engine.now
        hit = self.hit_at.pop(run.job.name, None)
        if hit is not None and why in ("requeue", "evicted"):
            m.teardown_times.append(t - hit)
            if why == "evicted":  # sooner than the requeue_delay interrupted() charged
                m.evicted += 1
                early = hit + engine.recovery.requeue_delay - t
                m.lost_gpu_h -= run.job.gpus * max(0.0, early) / HOUR
        if why == "crash":
            m.lost_gpu_h += run.job.gpus * (t - run.start) / HOUR
            m.gang_restarts += 1
            self.fail_time.setdefault(run.job.name, run.start)
            if t - run.start < engine.recovery.crash_after - 1e-6:  # evicted before the crash
                m.evicted += 1
        m.held_gpu_h += run.job.gpus * (t - run.start) / HOUR
        if why == "finish":
            m.completed += 1

    def finished(self, engine: Engine) -> None:
        """Gangs still waiting for a re-placement at the end."""
        self.metrics.not_replaced = len(self.fail_time)


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
