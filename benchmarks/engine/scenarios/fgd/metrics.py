"""Metrics of the FGD reproduction: GPU allocation ratio vs. arrived demand, fragmentation.

:class:`Recorder` is the engine hook that logs a run. The artifact logs, after every task, the allocated GPU milli, the arrived GPU milli (requests of
all tasks submitted so far, placed or not) and the cluster fragmentation. Its analysis then
bins events by arrived demand in % of cluster GPU capacity rounded to an integer
(``k = 0..130``) and reports, per bin, the mean of the allocation ratio in % (each rounded to two
decimals). A bin without events takes the events of bins ``k-1..k+1``. ``discrete_curve``
reproduces that, so our numbers are comparable column for column with
``analysis_allo_discrete.csv``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from benchmarks.engine.jobs import Run
from benchmarks.engine.loop import Engine, Hook

ARRIVAL_POINTS: tuple[int, ...] = tuple(range(0, 131))
"""Arrived-demand bins (% of cluster GPU capacity)."""


@dataclass(frozen=True, slots=True, eq=False)
class SimResult:
    """Per-event record of one run.

    Attributes:
        policy: Policy name.
        seed: Run seed.
        total_gpus: GPUs in the cluster.
        arrived_gpu_milli: Cumulative GPU milli requested by arrived tasks, after each event.
        used_gpu_milli: GPU milli allocated, after each event.
        frag_gpu_milli: Cluster fragmentation ``sum_n F_n(M)``, after each event.
        idle_gpu_milli: Free GPU milli, after each event.
        placed: Per event, whether an arrival was placed (True for departures).
        node: Per event, index of the node used (-1 if none).
        num_tasks: Arrivals.
        num_failed: Arrivals that fit nowhere.
        seconds: Wall time of the event loop.
    """

    policy: str
    seed: int
    total_gpus: int
    arrived_gpu_milli: np.ndarray
    used_gpu_milli: np.ndarray
    frag_gpu_milli: np.ndarray
    idle_gpu_milli: np.ndarray
    placed: np.ndarray
    node: np.ndarray
    num_tasks: int
    num_failed: int
    seconds: float

    @property
    def final_alloc_pct(self) -> float:
        """Allocated share of GPU capacity after the last event, in %."""
        return 100.0 * float(self.used_gpu_milli[-1]) / (self.total_gpus * 1000.0)


class Recorder(Hook):
    """Records, after every event of a run on a sharing ledger, the artifact's per-task log:
    arrived and allocated GPU milli, idle GPU milli and the cluster fragmentation."""

    def __init__(self, policy: str, seed: int) -> None:
        self.policy = policy
        self.seed = seed
        self.t0 = time.perf_counter()
        self.rows: list[tuple[int, int, float, int, bool, int]] = []
        self.capacity = -1
        self.free = 0
        self.arrived_milli = 0
        self.num_tasks = 0
        self.failed = 0
        self._placed = True
        self._node = -1

    def _init(self, engine: Engine) -> None:
        if self.capacity < 0:
            view = engine.ledger.view  # type: ignore[attr-defined]
            self.capacity = int(view.gpu_count.sum()) * 1000
            self.free = int(view.gpu_free.sum())

    def arrived(self, engine: Engine, run: Run) -> None:
        """Count the arrival's GPU demand (placed or not)."""
        self._init(engine)
        self.num_tasks += 1
        self.arrived_milli += run.job.gpu_milli_total

    def started(self, engine: Engine, run: Run) -> None:
        """The task took its GPU share on its node."""
        self._node = engine.ledger.index[run.members[0].node]  # type: ignore[attr-defined]
        self.free -= run.job.gpu_milli_total

    def rejected(self, engine: Engine, run: Run) -> None:
        """The task fit nowhere."""
        self.failed += 1
        self._placed = False

    def released(self, engine: Engine, run: Run, why: str) -> None:
        """The task left its node."""
        self._node = engine.ledger.index[run.members[0].node]  # type: ignore[attr-defined]
        self.free += run.job.gpu_milli_total

    def settled(self, engine: Engine, t: float) -> None:
        """One row per event."""
        self._init(engine)
        frag = engine.ledger.node_frag.sum()  # type: ignore[attr-defined]
        self.rows.append(
            (
                self.arrived_milli,
                self.capacity - self.free,
                frag,
                self.free,
                self._placed,
                self._node,
            )
        )
        self._placed = True
        self._node = -1

    def result(self) -> SimResult:
        """The run's per-event record."""
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * 6
        return SimResult(
            policy=self.policy,
            seed=self.seed,
            total_gpus=self.capacity // 1000,
            arrived_gpu_milli=np.array(cols[0], dtype=np.int64),
            used_gpu_milli=np.array(cols[1], dtype=np.int64),
            frag_gpu_milli=np.array(cols[2], dtype=np.float64),
            idle_gpu_milli=np.array(cols[3], dtype=np.int64),
            placed=np.array(cols[4], dtype=bool),
            node=np.array(cols[5], dtype=np.int64),
            num_tasks=self.num_tasks,
            num_failed=self.failed,
            seconds=time.perf_counter() - self.t0,
        )


def _round_half_even(x: np.ndarray, decimals: int) -> np.ndarray:
    return np.round(x, decimals)


def discrete_curve(
    arrived_milli: np.ndarray,
    values: np.ndarray,
    total_gpus: int,
    points: tuple[int, ...] = ARRIVAL_POINTS,
) -> dict[int, float]:
    """Mean of ``values`` per arrived-demand bin.

    Args:
        arrived_milli: Per event, cumulative arrived GPU milli.
        values: Per event, the value to average (already in the unit to report).
        total_gpus: Cluster GPUs (capacity = ``total_gpus * 1000`` milli).
        points: Bins to report.

    Returns:
        ``{k: mean}`` for bins with data (or neighbours with data).
    """
    arrive = _round_half_even(arrived_milli / total_gpus / 10.0, 0)
    out: dict[int, float] = {}
    for k in points:
        sel = arrive == k
        if not sel.any():
            sel = (arrive >= k - 1) & (arrive <= k + 1)
            if not sel.any():
                continue
        out[k] = float(np.round(values[sel].mean(), 2))
    return out


def alloc_curve(result: SimResult) -> dict[int, float]:
    """GPU allocation ratio (%) per arrived-demand bin (artifact's ``analysis_allo``)."""
    alloc = _round_half_even(result.used_gpu_milli / result.total_gpus / 10.0, 2)
    return discrete_curve(result.arrived_gpu_milli, alloc, result.total_gpus)


def frag_curve(result: SimResult) -> dict[int, float]:
    """Fragmented GPU as % of all cluster GPUs per bin (artifact's ``analysis_frag``)."""
    arrive = _round_half_even(result.arrived_gpu_milli / result.total_gpus / 10.0, 0)
    out: dict[int, float] = {}
    for k in ARRIVAL_POINTS:
        sel = arrive == k
        if not sel.any():
            sel = (arrive >= k - 1) & (arrive <= k + 1)
            if not sel.any():
                continue
        mean_milli = result.frag_gpu_milli[sel].mean()
        out[k] = float(np.round(100.0 * mean_milli / 1000.0 / result.total_gpus, 2))
    return out


def frag_ratio_curve(result: SimResult) -> dict[int, float]:
    """Fragmented share of idle GPU (%) per bin (artifact's ``analysis_frag_ratio``)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = 100.0 * result.frag_gpu_milli / result.idle_gpu_milli
    ratio = np.where(result.idle_gpu_milli > 0, ratio, 0.0)
    return discrete_curve(result.arrived_gpu_milli, ratio, result.total_gpus)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """Headline numbers of one run."""

    workload: str
    policy: str
    seed: int
    num_tasks: int
    num_failed: int
    alloc_pct_at_100: float
    alloc_pct_at_130: float
    frag_pct_at_130: float
    frag_ratio_pct_at_130: float
    seconds: float
    alloc_curve: dict[int, float]


def summarize(workload: str, result: SimResult) -> RunSummary:
    """Headline numbers and the allocation curve of ``result``."""
    alloc = alloc_curve(result)
    frag = frag_curve(result)
    ratio = frag_ratio_curve(result)
    last = max(alloc) if alloc else 0
    return RunSummary(
        workload=workload,
        policy=result.policy,
        seed=result.seed,
        num_tasks=result.num_tasks,
        num_failed=result.num_failed,
        alloc_pct_at_100=alloc.get(100, float("nan")),
        alloc_pct_at_130=alloc.get(130, alloc.get(last, float("nan"))),
        frag_pct_at_130=frag.get(130, float("nan")),
        frag_ratio_pct_at_130=ratio.get(130, float("nan")),
        seconds=result.seconds,
        alloc_curve=alloc,
    )
