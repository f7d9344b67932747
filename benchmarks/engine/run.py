"""Run scenarios on the one engine: one run in any process, a sweep through an executor.

:func:`run_one` builds the engine a run asks for (ledger, placement, health, stretch,
queue) from its materialised inputs, attaches its report's hooks, replays the jobs and
faults and returns the report's per-run result. :func:`run_scenarios` does that for every
run of one or more scenarios through :mod:`benchmarks.sweep` (results in input order), and
:func:`main_files` is ``topoplace bench FILE...``: load files, run, write the
report of their kind.

Reports are registered by name (``report:`` in a scenario file). A report provides
``hooks(run, inputs)``, ``result(run, inputs, engine, hooks)`` (picklable; computed where
the run executes) and ``write(runs, results, out, context)`` (in the calling process);
optionally ``cost(run)`` (costliest runs are submitted first) and ``needs_out`` (True when
it only writes files).
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from benchmarks import sweep
from benchmarks.engine.health import SignalHealth, health_policies
from benchmarks.engine.ledger import SharingLedger, SnapshotLedger
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.placers import SharingPlacement, SnapshotPlacement, placer_named
from benchmarks.engine.scenario import Scenario, ScenarioError, load
from benchmarks.engine.sources import Inputs, materialize, sharing_node

REPORTS: dict[str, str] = {
    "placement": "benchmarks.engine.report",
    "fgd": "benchmarks.engine.scenarios.fgd.run",
    "gangs": "benchmarks.engine.scenarios.gangs.run",
    "faults": "benchmarks.engine.scenarios.faults.run",
}
"""Report name -> module whose ``REPORT`` implements it."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a report's ``write`` may state about the sweep.

    Attributes:
        where: the executor's description.
        wall_s: wall time of the whole sweep.
        command: the command line that ran it ("" for a library call).
        quiet: no progress or summary lines on stdout.
        extra: report-specific options (e.g. the fgd report's ``expected`` directory).
    """

    where: str
    wall_s: float
    command: str = ""
    quiet: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


class Report(Protocol):
    """A report kind (see the module docstring)."""

    def hooks(self, run: Scenario, inputs: Inputs) -> list[Hook]:
        """Hooks that collect what this report needs from one run."""
        ...

    def result(self, run: Scenario, inputs: Inputs, engine: Engine, hooks: list[Hook]) -> Any:
        """The run's result, once the engine is done."""
        ...

    def write(
        self, runs: Sequence[Scenario], results: Sequence[Any], out: Path | None, ctx: Context
    ) -> str:
        """Write the outputs into ``out`` (if given); returns the text to print."""
        ...


def report(name: str) -> Report:
    """The registered report ``name``.

    Raises:
        ScenarioError: unknown report.
    """
    if name not in REPORTS:
        raise ScenarioError(f"unknown report {name!r}; known: {', '.join(REPORTS)}")
    return importlib.import_module(REPORTS[name]).REPORT  # type: ignore[no-any-return]


def is_sharing(policy: str) -> bool:
    """True if ``policy`` names a GPU-sharing (FGD-family) policy."""
    from scheduler.core.policies.sharing_policies import SHARING_POLICIES

    return policy in SHARING_POLICIES


def build(run: Scenario, inputs: Inputs, hooks: Sequence[Hook]) -> Engine:
    """The engine ``run`` describes, over ``inputs``.

    Raises:
        ScenarioError: inconsistent choices (gangs or faults on a sharing ledger, an
            unknown policy).
    """
    params = replace(inputs.params, health=health_policies()[run.health])
    inputs.params = params
    stretch = None
    health = None
    if is_sharing(run.pod_policy):
        from benchmarks.engine.artifact import node_rank
        from scheduler.core.policies.sharing_policies import get_sharing_policy
        from scheduler.core.sharing import typical_tasks

        if any(j.pods > 1 for j in inputs.jobs) or inputs.faults:
            raise ScenarioError("sharing policies place single pods, without faults")
        snodes = sorted((sharing_node(n) for n in inputs.nodes), key=lambda n: n.name)
        rank = node_rank(len(snodes), inputs.rng, run.rank_skip) if run.ties == "go-rank" else None
        ledger: Any = SharingLedger(snodes, typical_tasks(inputs.tasks), rank)
        placement: Any = SharingPlacement(
            get_sharing_policy(run.pod_policy), inputs.rng, len(snodes)
        )
    else:
        try:
            placement = SnapshotPlacement(
                placer_named(run.pod_policy), placer_named(run.gang_policy), params
            )
        except ValueError as exc:
            raise ScenarioError(str(exc)) from exc
        try:
            for j in inputs.jobs:
                j.selector()
        except ValueError as exc:
            raise ScenarioError(str(exc)) from exc
        ledger = SnapshotLedger(inputs.nodes, params)
        if inputs.faults:
            health = SignalHealth(inputs.nodes, inputs.faults, params.health)
        if run.locality == "pollux":
            stretch = pollux_stretch(params)
    return Engine(
        ledger,
        placement,
        queue=run.queue,  # type: ignore[arg-type]
        serve=run.serve,  # type: ignore[arg-type]
        hooks=hooks,
        health=health,
        recovery=run.recovery,
        stretch=stretch,
        horizon=run.horizon if run.horizon is not None else math.inf,
        check=run.check,
        namespace=run.namespace,
    )


def pollux_stretch(params: Any) -> Callable[[Any, Any], tuple[float, object]]:
    """Gang run times stretched by the Pollux-calibrated locality model (the profile of the
    placement is what the model saw)."""
    from benchmarks.engine.locality import model, profile

    m = model()
    fabric = params.fabric

    def stretch(ledger: Any, run: Any) -> tuple[float, object]:
        prof = profile(ledger.snap, run.members, fabric)
        return m.of(prof), prof

    return stretch


def run_one(run: Scenario) -> Any:
    """Materialise, build and replay one run; returns its report's result (any process)."""
    rep = report(run.report)
    inputs = materialize(run)
    hooks = rep.hooks(run, inputs)
    engine = build(run, inputs, hooks)
    engine.run(inputs.jobs, inputs.faults)
    return rep.result(run, inputs, engine, hooks)


def run_scenarios(
    scenarios: Sequence[Scenario],
    executor: sweep.Executor | None = None,
    *,
    on_result: Callable[[Scenario, Any], None] | None = None,
) -> tuple[list[Scenario], list[Any]]:
    """Every run of ``scenarios`` (in order), through ``executor`` (default: inline).

    Raises:
        ScenarioError: scenarios of different report kinds.
    """
    kinds = {s.report for s in scenarios}
    if len(kinds) > 1:
        raise ScenarioError(f"scenarios of different reports cannot run together: {kinds}")
    runs = [r for s in scenarios for r in s.runs()]
    rep = report(next(iter(kinds))) if kinds else None
    cost = getattr(rep, "cost", None)
    order = sorted(range(len(runs)), key=lambda i: -cost(runs[i])) if cost else None
    ex = executor or sweep.LocalExecutor(1)

    def note(i: int, r: Any) -> None:
        if on_result is not None:
            on_result(runs[i], r)

    return runs, ex.map(run_one, runs, order=order, on_result=note)


def main_files(
    files: Sequence[str],
    out: str | None,
    executor: sweep.Executor,
    *,
    command: str = "",
    quiet: bool = False,
) -> int:
    """``topoplace bench FILE...``: run the files' runs, write their report.

    Returns:
        A process exit code (2 for unreadable or malformed files).
    """
    try:
        scenarios = [load(f) for f in files]
        if getattr(report(scenarios[0].report), "needs_out", False) and not out:
            raise ScenarioError(f"the {scenarios[0].report} report writes files: give --out")
        t0 = time.perf_counter()
        done = 0

        def progress(run: Scenario, _: Any) -> None:
            nonlocal done
            done += 1
            if not quiet:
                print(f"[{done}] {run.name} seed={run.seed} done", file=sys.stderr, flush=True)

        runs, results = run_scenarios(scenarios, executor, on_result=progress)
        ctx = Context(executor.describe(), time.perf_counter() - t0, command, quiet)
        text = report(scenarios[0].report).write(runs, results, Path(out) if out else None, ctx)
    except (OSError, ScenarioError) as exc:
        print(f"topoplace bench: {exc}", file=sys.stderr)
        return 2
    if text and not quiet:
        print(text)
    return 0
