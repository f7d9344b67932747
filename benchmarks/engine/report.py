"""The ``placement`` report: the figures any scenario has (``report: placement``).

Per run: jobs and pods that arrived, were placed, rejected or never placed; GPUs requested
and in use at the end (of capacity); nodes with a GPU in use and nodes left wholly free at
the end (the live benchmark's packing figures); waiting time of placed jobs; wall time.
``write`` prints one Markdown table (a row per run) and, with an output directory, writes
it as ``report.md`` beside ``results.csv``.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from benchmarks.engine.jobs import Run
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.run import Context
from benchmarks.engine.scenario import Scenario
from benchmarks.engine.sources import Inputs


@dataclass(frozen=True, slots=True)
class PlacementSummary:
    """Figures of one run (GPUs in whole GPUs; fractional shares count their fraction)."""

    scenario: str
    pod_policy: str
    gang_policy: str
    queue: str
    seed: int
    jobs: int
    pods: int
    placed_jobs: int
    placed_pods: int
    rejected_jobs: int
    waiting_jobs: int
    gpus_requested: float
    gpus_in_use: float
    gpu_capacity: int
    nodes: int
    nodes_used: int
    nodes_whole_free: int
    wait_mean_s: float
    wait_p95_s: float
    wall_s: float


class Placements(Hook):
    """Counts arrivals, placements and rejections, and each placed job's first wait."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.jobs = self.pods = self.placed_jobs = self.placed_pods = self.rejects = 0
        self.milli_requested = 0
        self.waits: dict[str, float] = {}

    def arrived(self, engine: Engine, run: Run) -> None:
        """Count the job and its request."""
        self.jobs += 1
        self.pods += run.job.pods
        self.milli_requested += run.job.gpu_milli_total

    def started(self, engine: Engine, run: Run) -> None:
        """Count a first placement and its wait."""
        if run.job.name not in self.waits:
            self.waits[run.job.name] = run.start - run.job.arrive
            self.placed_jobs += 1
            self.placed_pods += run.job.pods

    def rejected(self, engine: Engine, run: Run) -> None:
        """Count a rejection."""
        self.rejects += 1

    def summary(self, run: Scenario, engine: Engine) -> PlacementSummary:
        """The run's figures, from the hook's counts and the final ledger."""
        used, capacity = engine.ledger.gpu_usage()  # type: ignore[attr-defined]
        waits = np.array(list(self.waits.values()), dtype=float)
        return PlacementSummary(
            scenario=run.name,
            pod_policy=run.pod_policy,
            gang_policy=run.gang_policy,
            queue=run.queue,
            seed=run.seed,
            jobs=self.jobs,
            pods=self.pods,
            placed_jobs=self.placed_jobs,
            placed_pods=self.placed_pods,
            rejected_jobs=self.rejects,
            waiting_jobs=len(engine.queue),
            gpus_requested=self.milli_requested / 1000.0,
            gpus_in_use=float(used.sum()) / 1000.0,
            gpu_capacity=int(capacity.sum()),
            nodes=len(capacity),
            nodes_used=int((used > 0).sum()),
            nodes_whole_free=int(((used == 0) & (capacity > 0)).sum()),
            wait_mean_s=float(waits.mean()) if len(waits) else math.nan,
            wait_p95_s=float(np.quantile(waits, 0.95)) if len(waits) else math.nan,
            wall_s=time.perf_counter() - self.t0,
        )


_TABLE = (
    ("scenario", "scenario", "{}"),
    ("pod_policy", "pods", "{}"),
    ("gang_policy", "gangs", "{}"),
    ("queue", "queue", "{}"),
    ("seed", "seed", "{}"),
    ("placed_pods", "pods placed", "{}"),
    ("pods", "pods", "{}"),
    ("rejected_jobs", "jobs rejected", "{}"),
    ("waiting_jobs", "jobs waiting", "{}"),
    ("gpus_in_use", "GPUs in use", "{:g}"),
    ("gpu_capacity", "GPUs", "{}"),
    ("nodes_used", "nodes used", "{}"),
    ("nodes_whole_free", "nodes wholly free", "{}"),
    ("wait_mean_s", "wait mean s", "{:.1f}"),
    ("wall_s", "wall s", "{:.2f}"),
)


class PlacementReport:
    """The ``placement`` report (see the module docstring)."""

    def hooks(self, run: Scenario, inputs: Inputs) -> list[Hook]:
        """The placement counter."""
        return [Placements()]

    def result(
        self, run: Scenario, inputs: Inputs, engine: Engine, hooks: list[Hook]
    ) -> PlacementSummary:
        """The run's figures."""
        h = hooks[0]
        assert isinstance(h, Placements)
        return h.summary(run, engine)

    def write(
        self,
        runs: Sequence[Scenario],
        results: Sequence[PlacementSummary],
        out: Path | None,
        ctx: Context,
    ) -> str:
        """A table of the runs (also ``report.md`` and ``results.csv`` in ``out``)."""
        lines = [
            "| " + " | ".join(t for _, t, _ in _TABLE) + " |",
            "|" + "---|" * len(_TABLE),
        ]
        for r in results:
            cells = []
            for k, _, fmt in _TABLE:
                v = getattr(r, k)
                cells.append("n/a" if isinstance(v, float) and math.isnan(v) else fmt.format(v))
            lines.append("| " + " | ".join(cells) + " |")
        names = ", ".join(dict.fromkeys(r.name for r in runs))
        text = "\n".join(
            [
                f"# Placement: {names}",
                "",
                *[f"- {d}" for d in dict.fromkeys(r.description for r in runs if r.description)],
                f"- {len(results)} run(s) on {ctx.where}, {ctx.wall_s:.1f} s wall",
                "",
                *lines,
            ]
        )
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "report.md").write_text(text + "\n")
            with (out / "results.csv").open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow([fl.name for fl in fields(PlacementSummary)])
                for r in results:
                    w.writerow(list(asdict(r).values()))
        return text


REPORT = PlacementReport()
"""The ``placement`` report."""
