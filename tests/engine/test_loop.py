"""The engine's own semantics on two 8-GPU nodes: queueing disciplines, explicit departures,
faults (interrupt, checkpoint, re-queue, restart overhead), crashes on broken hardware, the
horizon, and refusals it must not hide."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.clusters import make_node
from benchmarks.engine.health import GpuFault, Outage, SignalHealth, health_policies
from benchmarks.engine.jobs import Job, Run
from benchmarks.engine.ledger import SnapshotLedger
from benchmarks.engine.loop import Engine, Hook, InvariantError
from benchmarks.engine.placers import SnapshotPlacement, greedy_gang
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment, PlacementResult

PARAMS = SchedParams()


class Log(Hook):
    """Every start (time, node of the first member), interruption and release."""

    def __init__(self) -> None:
        self.starts: dict[str, list[tuple[float, str]]] = {}
        self.finishes: dict[str, float] = {}
        self.releases: list[tuple[str, str, float]] = []
        self.interrupts: list[tuple[str, float, float]] = []
        self.rejects: list[str] = []
        self.done = False

    def started(self, engine: Engine, run: Run) -> None:
        self.starts.setdefault(run.job.name, []).append((run.start, run.members[0].node))
        self.finishes[run.job.name] = run.finish

    def interrupted(self, engine: Engine, run: Run, elapsed: float, kept: float) -> None:
        self.interrupts.append((run.job.name, elapsed, kept))

    def released(self, engine: Engine, run: Run, why: str) -> None:
        self.releases.append((run.job.name, why, engine.now))

    def rejected(self, engine: Engine, run: Run) -> None:
        self.rejects.append(run.job.name)

    def finished(self, engine: Engine) -> None:
        self.done = True


def _nodes() -> list[dict]:
    return [make_node("a", 8), make_node("b", 8)]


def _engine(queue: str = "best-effort-fifo", **kw: object) -> tuple[Engine, Log]:
    log = Log()
    ledger = SnapshotLedger(_nodes(), kw.pop("params", PARAMS))  # type: ignore[arg-type]
    placement = SnapshotPlacement(greedy_gang, greedy_gang, ledger.params)
    return Engine(ledger, placement, queue=queue, hooks=[log], check=True, **kw), log  # type: ignore[arg-type]


JOBS = [
    Job("long", 0.0, 1, 8, duration=100.0),  # takes one node
    Job("gang", 1.0, 2, 8, gang=True, duration=10.0),  # needs both nodes
    Job("small", 2.0, 1, 8, duration=10.0),
]


def test_strict_fifo_blocks_behind_the_head() -> None:
    engine, log = _engine("strict-fifo")
    engine.run(JOBS)
    assert log.starts == {"long": [(0.0, "a")], "gang": [(100.0, "a")], "small": [(110.0, "a")]}
    assert engine.checks > 0 and log.done and not engine.queue


def test_best_effort_fifo_backfills() -> None:
    engine, log = _engine("best-effort-fifo")
    engine.run(JOBS)
    assert log.starts["small"] == [(2.0, "b")] and log.starts["gang"] == [(100.0, "a")]


def test_reject_tries_once() -> None:
    engine, log = _engine("reject")
    engine.run(JOBS)
    assert log.rejects == ["gang"] and "gang" not in log.starts
    assert log.starts["small"] == [(2.0, "b")]


def test_an_explicit_departure_withdraws_a_waiting_job() -> None:
    engine, log = _engine("strict-fifo")
    engine.run([JOBS[0], replace(JOBS[1], depart=50.0), JOBS[2]])
    assert "gang" not in log.starts and log.starts["small"] == [(50.0, "b")]


def test_a_running_job_leaves_at_its_departure() -> None:
    engine, log = _engine()
    engine.run([Job("svc", 0.0, 1, 4, depart=30.0)])  # no duration: runs until it leaves
    assert log.releases == [("svc", "leave", 30.0)] and log.finishes["svc"] == float("inf")


def test_a_fault_interrupts_checkpoints_requeues_and_restarts() -> None:
    outage = Outage("a", "host", 5000.0, 9000.0, 5040.0)
    health = SignalHealth(_nodes(), [outage], health_policies()["topoplace"])
    engine, log = _engine(health=health)
    engine.run([Job("train", 0.0, 1, 8, gang=True, duration=3 * 3600.0)], [outage])
    # 5000 s in: one checkpoint (3600 s) kept; re-queued 300 s later, away from the broken
    # node; the restart costs 600 s; the remaining 7200 s of work follow.
    assert log.interrupts == [("train", 5000.0, 3600.0)]
    assert log.starts["train"] == [(0.0, "a"), (5300.0, "b")]
    assert log.releases == [("train", "requeue", 5300.0), ("train", "finish", 13100.0)]


@pytest.mark.parametrize("policy,starts", [
    ("topoplace", [(10.0, "b")]),  # the device taint is published at 10 s: node a has 7 GPUs
    ("ready-only", [(10.0, "a"), (310.0, "a"), (610.0, "a"), (910.0, "a")]),  # crash loop
])  # fmt: skip
def test_placed_on_broken_hardware_crashes(policy: str, starts: list[tuple[float, str]]) -> None:
    fault = GpuFault("a", 0, 0.0, 1e6, 10.0)
    hp = health_policies()[policy]
    health = SignalHealth(_nodes(), [fault], hp)
    engine, log = _engine(health=health, horizon=1000.0, params=replace(PARAMS, health=hp))
    engine.run([Job("train", 10.0, 1, 8, gang=True, duration=3600.0)], [fault])
    assert log.starts["train"] == starts
    if policy == "ready-only":  # the last placement is still running at the horizon
        assert [(w, t) for _, w, t in log.releases] == [
            ("crash", 310.0), ("crash", 610.0), ("crash", 910.0), ("end", 1000.0)
        ]  # fmt: skip
    else:  # placed once, on healthy hardware; the work ends after the horizon
        assert log.releases == [("train", "end", 1000.0)]


def test_jobs_need_unique_names_and_placements_whole_gangs() -> None:
    engine, _ = _engine()
    with pytest.raises(ValueError, match="two jobs"):
        engine.run([Job("x", 0.0, 1, 1), Job("x", 1.0, 1, 1)])

    class Half:
        def place(self, ledger: object, run: Run) -> PlacementResult:
            return PlacementResult(ok=True, assignments=(Assignment(run.key + "-0", "a", (0,)),))

    ledger = SnapshotLedger(_nodes(), PARAMS)
    with pytest.raises(InvariantError, match="1 of 2 members"):
        Engine(ledger, Half()).run([Job("g", 0.0, 2, 1, gang=True)])
    with pytest.raises(ValueError, match="queueing"):
        Engine(ledger, Half(), queue="lifo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="health model"):
        Engine(ledger, Half()).run([], [Outage("a", "host", 0.0, 1.0, 0.0)])
