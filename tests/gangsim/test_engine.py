"""Gangs on the one engine: a small smoke run with invariants checked at every event,
determinism, queueing modes, a hand-checked locality case, and the invariant checker."""

from __future__ import annotations

import dataclasses
import math
import random
from types import MappingProxyType

import pytest

from benchmarks.engine.jobs import Job, Run
from benchmarks.engine.ledger import SnapshotLedger
from benchmarks.engine.locality import LocalityModel, ModelFit, profile
from benchmarks.engine.loop import Engine, InvariantError
from benchmarks.engine.placers import SnapshotPlacement, hold, placer_named
from benchmarks.engine.scenarios.gangs.metrics import GangStats, RunResult, summarize
from benchmarks.engine.scenarios.gangs.workload import ClusterSpec, cluster_spec
from scheduler.core.model import PodInfo
from scheduler.core.params import GangParams, SchedParams
from scheduler.core.schedule import Assignment

PARAMS = SchedParams(gang=GangParams(solver_time_limit_seconds=0.25, seed=7, workers=1))
MODEL = LocalityModel((ModelFit("m", 1.5, {}, 2.0, "22", 1),), 50.0)
LEVELS = {"local": "nvlink-domain", "spine": "spine", "node": "node"}


def _job(
    i: int, t: float, gpus: int, dur: float, required: str = "", per: int = 4, preferred: str = ""
) -> Job:
    return Job(
        f"j{i:03d}", t, gpus // per, per, gang=True, duration=dur, required=required,
        preferred=preferred,
    )  # fmt: skip


def simulate(
    cl: ClusterSpec,
    jobs: list[Job],
    policy: str,
    params: SchedParams,
    model: LocalityModel,
    *,
    seed: int = 0,
    backfill: bool = True,
    check: bool = False,
) -> RunResult:
    """One gang run: the engine as the gang scenario configures it, a hand-made model."""
    stats = GangStats(jobs)
    ledger = SnapshotLedger(cl.nodes(), params)

    def stretch(led: SnapshotLedger, run: Run) -> tuple[float, object]:
        prof = profile(led.snap, run.members, params.fabric)
        return model.of(prof), prof

    engine = Engine(
        ledger,
        SnapshotPlacement(placer_named("place-pod"), placer_named(policy), params),
        queue="best-effort-fifo" if backfill else "strict-fifo",
        serve="instant",
        hooks=[stats],
        stretch=stretch,
        check=check,
        namespace="gangsim",
    )
    engine.run(jobs)
    return stats.result(cl.name, policy, seed, backfill, ledger.capacity, engine.checks, params)


def gang_jobs(n: int, seed: int, preferred: bool = False) -> list[Job]:
    """Seeded small gangs for a 2-rack NVL72 (no shared data needed); half of those that fit
    a rack require it, and with ``preferred`` half of the others prefer it."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 600.0)
        gpus = rng.choice([8, 8, 8, 16, 16, 32, 64, 96])
        req = "nvlink-domain" if gpus <= 72 and rng.random() < 0.5 else ""
        pref = "nvlink-domain" if preferred and not req and rng.random() < 0.5 else ""
        out.append(_job(i, t, gpus, rng.uniform(600.0, 7200.0), req, preferred=pref))
    return out


@pytest.mark.parametrize("backfill", [True, False])
def test_smoke_two_policies_with_invariants(backfill: bool) -> None:
    cl = cluster_spec("nvl72", 2)
    jobs = gang_jobs(40, 5)
    for policy in ("topoplace", "first-fit"):
        run = simulate(cl, jobs, policy, PARAMS, MODEL, seed=5, backfill=backfill, check=True)
        assert run.checks >= len(jobs)  # every event instant checked
        assert all(o.placed for o in run.outcomes)
        m = summarize(run, LEVELS)
        assert m["placed"] == 40 and m["never_placed"] == 0
        assert 0.0 < m["alloc"] <= 1.0
        assert m["wait_mean_min"] >= 0.0 and m["wait_p95_min"] >= 0.0
        assert 1.0 <= m["slowdown_mean"] <= 2.0
        assert run.makespan == pytest.approx(max(o.finish for o in run.outcomes))
        for o in run.outcomes:
            assert o.start >= o.job.arrive
            assert o.finish == pytest.approx(o.start + o.job.duration * o.slowdown)
            if o.job.required:
                assert o.islands == 1 and o.slowdown == 1.0  # one NVLink domain
            assert o.domains["node"] == o.job.pods  # whole trays
        if policy == "topoplace":
            assert m["at_lb_share"] == 1.0
            assert set(run.statuses) <= {"optimal", "feasible"}
        # Deterministic: the same run again gives the same outcomes.
        again = simulate(cl, jobs, policy, PARAMS, MODEL, seed=5, backfill=backfill)
        assert again.outcomes == run.outcomes
        assert again.alloc_gpu_s == run.alloc_gpu_s


def test_strict_fifo_blocks_and_best_effort_backfills() -> None:
    cl = cluster_spec("nvl72", 1)  # 72 GPUs
    jobs = [
        _job(0, 0.0, 64, 1000.0),  # leaves 8 GPUs free
        _job(1, 10.0, 16, 100.0),  # cannot start before job 0 ends
        _job(2, 20.0, 8, 100.0),  # fits at once
    ]
    strict = simulate(cl, jobs, "first-fit", PARAMS, MODEL, backfill=False, check=True)
    best = simulate(cl, jobs, "first-fit", PARAMS, MODEL, backfill=True, check=True)
    s = {o.job.name: o for o in strict.outcomes}
    b = {o.job.name: o for o in best.outcomes}
    assert s["j001"].start == 1000.0 and s["j002"].start == 1000.0  # blocked by the head
    assert b["j001"].start == 1000.0 and b["j002"].start == 20.0  # backfilled
    assert best.calls == 3 and best.refusals == 0  # impossible attempts are not made
    # Allocation over the arrival window [0, 20]: 64 GPUs all along, +8 from t=20 only.
    assert best.alloc_gpu_s == pytest.approx(64 * 20.0)
    assert summarize(best, LEVELS)["alloc"] == pytest.approx(64 / 72)


def test_topoplace_keeps_a_gang_in_one_rack_where_first_fit_splits_it() -> None:
    cl = cluster_spec("nvl72", 2)
    jobs = [_job(0, 0.0, 68, 5000.0), _job(1, 1.0, 8, 1000.0)]  # 17 trays, then 2 trays
    by_policy = {}
    for policy in ("topoplace", "first-fit"):
        run = simulate(cl, jobs, policy, PARAMS, MODEL, check=True)
        by_policy[policy] = run.outcomes[1]
    ff, tp = by_policy["first-fit"], by_policy["topoplace"]
    # first-fit: last tray of rack 0 + first tray of rack 1; racks meet at the spine (25 GB/s)
    assert (ff.islands, ff.bandwidth_gbps) == (2, 25.0)
    assert ff.slowdown == pytest.approx(min(2.0, 1 + 0.5 * 50 / 25))
    assert ff.finish == pytest.approx(1.0 + 1000.0 * 2.0)
    assert ff.lower_bound["nvlink-domain"] == 1 and ff.domains["nvlink-domain"] == 2
    # topoplace: both trays in rack 1, NVLink all the way
    assert (tp.islands, tp.bandwidth_gbps, tp.slowdown) == (1, 900.0, 1.0)
    assert tp.finish == pytest.approx(1001.0)


def test_unplaceable_gang_is_reported_not_looped() -> None:
    cl = cluster_spec("nvl72", 1)
    jobs = [_job(0, 0.0, 8, 10.0), _job(1, 1.0, 144, 10.0)]  # bigger than the cluster
    run = simulate(cl, jobs, "topoplace", PARAMS, MODEL, check=True)
    assert run.outcomes[0].placed and not run.outcomes[1].placed
    assert math.isnan(run.outcomes[1].start)
    assert summarize(run, LEVELS)["never_placed"] == 1


def _running(job: Job, members: tuple[Assignment, ...]) -> Run:
    return Run(job, 0, "gangsim/" + job.name, members=members, running=True)


def test_invariant_checker_catches_violations() -> None:
    cl = cluster_spec("nvl72", 1)
    ledger = SnapshotLedger(cl.nodes(), PARAMS)
    job = _job(0, 0.0, 8, 10.0)
    key = "gangsim/" + job.name
    members = (
        Assignment(f"{key}-0", "gb200-r000-t00", (0, 1, 2, 3)),
        Assignment(f"{key}-1", "gb200-r000-t01", (0, 1, 2, 3)),
    )
    run = _running(job, members)
    ledger.hold(run)
    held = ledger.snap
    ledger.check([run])  # consistent
    with pytest.raises(InvariantError, match="not running"):  # a queued gang holds GPUs
        ledger.check([dataclasses.replace(run, running=False)])
    with pytest.raises(InvariantError, match="members hold"):  # a member is missing
        ledger.check([_running(dataclasses.replace(job, pods=3), members)])
    ledger.snap = hold(ledger.snap, key, [Assignment(f"{key}-2", "gb200-r000-t02", (0, 1))])
    three = (*members, Assignment(f"{key}-2", "gb200-r000-t02", (0, 1)))
    with pytest.raises(InvariantError, match="wrong number of GPUs"):
        ledger.check([_running(dataclasses.replace(job, pods=3), three)])
    # Double booking smuggled past with_pod: a second pod on the same GPUs.
    twin = PodInfo(key=f"{key}-2", uid="", node="gb200-r000-t00", gpus=(0, 1, 2, 3), gang=key)
    pods = dict(held.pods)
    pods[twin.key] = twin
    forged = dataclasses.replace(held, pods=MappingProxyType(pods))
    ledger.snap = forged
    twin_run = _running(
        dataclasses.replace(job, pods=3), (*members, Assignment(twin.key, twin.node, twin.gpus))
    )
    with pytest.raises(InvariantError, match="held twice"):
        ledger.check([twin_run])
