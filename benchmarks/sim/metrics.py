"""Metrics of the FGD reproduction: GPU allocation ratio vs. arrived demand, fragmentation.

The artifact logs, after every task, the allocated GPU milli, the arrived GPU milli (requests of
all tasks submitted so far, placed or not) and the cluster fragmentation. Its analysis then
bins events by arrived demand in % of cluster GPU capacity rounded to an integer
(``k = 0..130``) and reports, per bin, the mean of the allocation ratio in % (each rounded to two
decimals). A bin without events takes the events of bins ``k-1..k+1``. ``discrete_curve``
reproduces that, so our numbers are comparable column for column with
``analysis_allo_discrete.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.sim.engine import SimResult

ARRIVAL_POINTS: tuple[int, ...] = tuple(range(0, 131))
"""Arrived-demand bins (% of cluster GPU capacity)."""


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
