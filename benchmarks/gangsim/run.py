"""Gang scenario (issue 6): topoplace's CP-SAT gang placement vs KAI / Kueue / first-fit.

    python -m benchmarks.gangsim.run --out benchmarks/results/gangs       # the full scenario
    python -m benchmarks.gangsim.run --clusters nvl72 --policies topoplace,first-fit \\
        --seeds 1 --jobs 200 --backfill on --out /tmp/gangs
    topoplace bench --scenario gangs --out out/gangs                      # via the bench CLI
    topoplace bench --scenario gangs --out out/gangs --ray local          # runs as Ray tasks

Runs every (cluster, queueing mode, seed, policy) on the one engine (:mod:`benchmarks.engine`;
the scenario files ``benchmarks/scenarios/gangs-nvl72.yaml`` and ``gangs-h100.yaml`` are the
defaults, ``topoplace bench --scenario-file`` runs them) and writes ``results.csv``, ``report.md``, ``locality.png`` and ``wait.png`` to ``--out``
(see :mod:`benchmarks.gangsim.report`). ``--jobs`` is the number of gangs per run (at most;
arrivals also stop after ``--hours``). The runs are independent and go through
:mod:`benchmarks.sweep`, costliest first: ``--workers N`` local processes (default all CPUs,
``1`` inline) or ``--ray ADDRESS``. Through ``topoplace bench``, ``--workloads`` selects the
clusters, ``--jobs`` is the old spelling of ``--workers``, and the other knobs take their
defaults.

Deterministic for a seed: the workload depends only on (cluster, seed), policies are pure,
CP-SAT runs with one worker, a fixed seed and a deterministic-time limit
(``params.gang``; recorded in the report and the CSV). Only wall times vary (``wall_s``),
whichever executor ran the runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

from benchmarks import sweep
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.run import Context, run_scenarios
from benchmarks.engine.scenario import Scenario, ScenarioError, parse_seeds
from benchmarks.engine.sources import Inputs
from benchmarks.gangsim import report
from benchmarks.gangsim.locality import model
from benchmarks.gangsim.metrics import GangStats, RunResult, summarize
from benchmarks.gangsim.workload import (
    ClusterSpec,
    WorkloadSpec,
    cluster_spec,
    derive,
    describe,
)
from scheduler.core.params import SchedParams
from scheduler.core.policies.cpsat import wall_cap
from scheduler.core.policies.registry import policy_names

DEFAULT_POLICIES = (
    "topoplace",
    "kai-binpack",
    "kueue-bestfit",
    "first-fit",
    "greedy-topology",
    "kueue-balanced",
)
DEFAULT_CLUSTERS = ("nvl72", "h100")
DEFAULT_SEEDS = "1-3"
DEFAULT_TIME_LIMIT = 0.25
"""CP-SAT deterministic-time limit per gang (s); plans here take milliseconds."""
_SPEC = WorkloadSpec()
QUEUE_OF = {v: k for k, v in report.QUEUES.items()}
"""Queueing mode name -> backfill."""


def gang_scenario(
    cluster: str,
    units: int,
    spec: WorkloadSpec,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    backfills: Sequence[bool] = (True, False),
    time_limit: float = DEFAULT_TIME_LIMIT,
    check: bool = False,
) -> Scenario:
    """One cluster of the gang scenario (``benchmarks/scenarios/gangs-<cluster>.yaml`` with
    the defaults): Helios-derived gangs, CP-SAT pinned (1 worker, seed 7), the Pollux
    locality stretch, every (queueing mode, seed, policy)."""
    cl = cluster_spec(cluster, units)
    defaults = asdict(WorkloadSpec())
    knobs = {k: v for k, v in asdict(spec).items() if v != defaults[k]}
    return Scenario(
        name=f"gangs-{cluster}",
        description=cl.describe(),
        nodes=(cl.node_source(),),
        arrivals=({"generator": "helios-gangs", "cluster": cluster, "units": units, **knobs},),
        gang_policy=policies[0],
        queue=report.QUEUES[backfills[0]],
        serve="instant",
        params={"gang": {"solver_time_limit_seconds": time_limit, "seed": 7, "workers": 1}},
        locality="pollux",
        check=check,
        namespace="gangsim",
        sweep=(
            ("queue", tuple(report.QUEUES[b] for b in backfills)),
            ("seed", tuple(seeds)),
            ("gang_policy", tuple(policies)),
        ),
        report="gangs",
    )


def _cluster_of(run: Scenario) -> ClusterSpec:
    gen = run.arrivals[0]
    return cluster_spec(str(gen["cluster"]), gen.get("units"))


def _spec_of(run: Scenario) -> WorkloadSpec:
    keys = {f.name for f in fields(WorkloadSpec)}
    return WorkloadSpec(**{k: v for k, v in run.arrivals[0].items() if k in keys})


def _git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions() -> str:
    from importlib.metadata import version

    return (
        f"Python {platform.python_version()}, numpy {version('numpy')}, "
        f"OR-Tools {version('ortools')}; {platform.machine()} {platform.system()}, "
        f"{os.cpu_count()} CPUs"
    )


class GangReport:
    """The gang scenario's outputs: per run a :class:`RunResult` and its summary;
    ``results.csv``, ``report.md``, ``locality.png``, ``wait.png`` (``gangs.csv.gz`` with
    ``extra["gang_csv"]``)."""

    needs_out = True

    def hooks(self, run: Scenario, inputs: Inputs) -> list[Hook]:
        """The gang recorder."""
        return [GangStats(inputs.jobs)]

    def result(
        self, run: Scenario, inputs: Inputs, engine: Engine, hooks: list[Hook]
    ) -> tuple[RunResult, dict[str, float]]:
        """The raw result and its summary."""
        stats = hooks[0]
        assert isinstance(stats, GangStats)
        cl = inputs.info["cluster"]
        res = stats.result(
            cl.name,
            run.gang_policy,
            run.seed,
            QUEUE_OF[run.queue],
            engine.ledger.capacity,  # type: ignore[attr-defined]
            engine.checks,
            inputs.params,
        )
        levels = dict(zip(("local", "spine", "node"), cl.report_levels, strict=True))
        return res, summarize(res, levels)

    def cost(self, run: Scenario) -> float:
        """Relative cost (CP-SAT and the larger cluster first)."""
        h100 = run.arrivals[0].get("cluster") == "h100"
        return (4.0 if run.gang_policy == "topoplace" else 1.0) * (3.0 if h100 else 1.0)

    def write(
        self,
        runs: Sequence[Scenario],
        results: Sequence[tuple[RunResult, dict[str, float]]],
        out: Path | None,
        ctx: Context,
    ) -> str:
        """Write the outputs into ``out``; returns the report text."""
        if out is None:
            raise ScenarioError("the gangs report writes files: give --out")
        raw = [r for r, _ in results]
        clusters = list(dict.fromkeys(r.cluster for r in raw))
        policies = list(dict.fromkeys(r.gang_policy for r in runs))
        seeds = list(dict.fromkeys(r.seed for r in runs))
        queues = list(dict.fromkeys(r.queue for r in runs))
        specs = {c: (_cluster_of(r), _spec_of(r)) for r in runs for c in [_cluster_of(r).name]}
        time_limit = runs[0].params["gang"]["solver_time_limit_seconds"]
        out.mkdir(parents=True, exist_ok=True)
        rows = report.csv_rows(results, {c: specs[c][0].locality_level for c in clusters})
        report.write_csv(out / "results.csv", rows)
        if ctx.extra.get("gang_csv"):
            report.write_gangs(out / "gangs.csv.gz", raw)
        combos = [(c, q) for c in clusters for q in queues]
        report.plot_locality(raw, policies, combos, SchedParams().fabric, out / "locality.png")
        report.plot_wait(raw, policies, combos, out / "wait.png")

        m = model()
        command = f"command: `{ctx.command}`" if ctx.command else "command: (library call)"
        conds = [command]
        conds += [specs[c][0].describe() for c in clusters]
        for c in clusters:
            cl, spec = specs[c]
            lines = describe(cl, spec, derive(cl, spec))
            if c != clusters[0]:
                lines = [
                    x for x in lines if x.startswith(("arrivals", "constraints", "gang sizes"))
                ]
            conds += lines
            gangs = [len(r.outcomes) for r in raw if r.cluster == c]
            offered = {r.seed: mm["offered_load"] for r, mm in results if r.cluster == c}
            conds.append(
                f"gangs per run ({c}): {min(gangs)}-{max(gangs)} over seeds; realised offered "
                "load (packed GPU-seconds arriving / GPUs x window) by seed: "
                + ", ".join(f"{s}: {v:.2f}" for s, v in sorted(offered.items()))
            )
        check = any(r.check for r in runs)
        conds += [
            "queueing: FIFO by arrival; " + "; ".join(report.QUEUE_TITLES[q] for q in queues)
            + " (Kueue ClusterQueue queueingStrategy semantics, see benchmarks/engine/loop.py)",
            f"policies: {', '.join(policies)} (scheduler/core/policies; KAI, Kueue and "
            "first-fit are modelled on their documented algorithms)",
            f"CP-SAT (topoplace): params.gang.solver_time_limit_seconds = {time_limit:g} "
            f"(max_deterministic_time), wall cap {wall_cap(time_limit):g} s, 1 worker, "
            "random_seed 7; other policies have no parameters",
            f"seeds: {', '.join(map(str, seeds))}; cells are mean [min, max] over seeds",
            f"locality model: mean spread factor {m.mean_spread:.3f} under one leaf, per-model "
            "caps (table below; benchmarks/gangsim/locality.py)",
            f"benchmark code at commit {_git_head()}; {_versions()}; total wall time "
            f"{ctx.wall_s:.0f} s on {ctx.where}"
            + (f"; invariants checked after every event ({sum(r.checks for r in raw)} checks)"
               if check else ""),
            "analysis of these results (what wins, what loses, why): benchmarks/gangsim/README.md",
        ]  # fmt: skip
        text = report.render(
            "Gang scenario: topoplace vs KAI, Kueue and first-fit on NVL72 and DGX H100 clusters",
            conds,
            m.describe(),
            rows,
            combos,
            policies,
            ["locality.png", "wait.png"],
        )
        (out / "report.md").write_text(text)
        return text


REPORT = GangReport()
"""The ``gangs`` report (``report: gangs`` in a scenario file)."""


def run(
    clusters: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    spec: WorkloadSpec,
    out: Path,
    *,
    backfills: Sequence[bool] = (True, False),
    units: dict[str, int] | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    executor: sweep.Executor | None = None,
    check: bool = False,
    gang_csv: bool = False,
    command: str = "",
    quiet: bool = False,
) -> str:
    """Run the scenario and write the outputs; returns the report text.

    ``executor`` runs the independent runs (default: inline); the outputs do not depend on
    it except the measured wall times.
    """
    t0 = time.perf_counter()
    units = units or {}
    scenarios = [
        gang_scenario(c, units.get(c, 8), spec, policies, seeds, backfills=backfills,
                      time_limit=time_limit, check=check)
        for c in clusters
    ]  # fmt: skip
    total = sum(len(s.runs()) for s in scenarios)
    executor = executor or sweep.LocalExecutor(1)
    finished = 0

    def note(t: Scenario, r: tuple[RunResult, dict[str, float]]) -> None:
        nonlocal finished
        finished += 1
        if not quiet:
            m = r[1]
            print(
                f"[{finished}/{total}] {r[0].cluster} {t.queue} seed "
                f"{t.seed} {t.gang_policy}: wait {m['wait_mean_min']:.1f} min, alloc "
                f"{m['alloc']:.1%}, {r[0].wall_s:.1f} s",
                flush=True,
            )

    runs, results = run_scenarios(scenarios, executor, on_result=note)
    ctx = Context(
        executor.describe(),
        time.perf_counter() - t0,
        command,
        quiet,
        extra={"gang_csv": gang_csv},
    )
    return REPORT.write(runs, results, out, ctx)


def _split(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or ():
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The scenario's command-line arguments."""
    ap.add_argument("--clusters", nargs="+", default=[",".join(DEFAULT_CLUSTERS)],
                    help="clusters: nvl72, h100 (default both)")  # fmt: skip
    ap.add_argument("--policies", nargs="+", default=None,
                    help=f"gang policies (default {','.join(DEFAULT_POLICIES)})")  # fmt: skip
    ap.add_argument("--seeds", default=DEFAULT_SEEDS, help="seeds, e.g. 1-3 or 1,5")
    ap.add_argument("--jobs", type=int, default=_SPEC.jobs, help="gangs per run (max)")
    ap.add_argument("--hours", type=float, default=_SPEC.hours,
                    help="arrival window in hours (max)")  # fmt: skip
    ap.add_argument("--load", type=float, default=_SPEC.load, help="offered load")
    ap.add_argument("--required-share", type=float, default=_SPEC.required_share)
    ap.add_argument("--preferred-share", type=float, default=_SPEC.preferred_share)
    ap.add_argument("--backfill", default="on,off", help="queueing modes: on, off or on,off")
    ap.add_argument("--nvl72-racks", type=int, default=8)
    ap.add_argument("--h100-sus", type=int, default=8, help="DGX H100 scalable units (32 nodes)")
    ap.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT,
                    help="CP-SAT deterministic-time limit per gang (s)")  # fmt: skip
    sweep.add_arguments(ap)
    ap.add_argument("--check", action="store_true", help="check invariants after every event")
    ap.add_argument("--gang-csv", action="store_true", help="also write gangs.csv.gz")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")


def _validate(clusters: Sequence[str], policies: Sequence[str], backfill: str) -> str:
    known = set(policy_names())
    bad = [p for p in policies if p not in known]
    if bad:
        return f"unknown policies {bad}; registered: {', '.join(sorted(known))}"
    badc = [c for c in clusters if c not in DEFAULT_CLUSTERS]
    if badc:
        return f"unknown clusters {badc}; known: {', '.join(DEFAULT_CLUSTERS)}"
    if not {x.strip() for x in backfill.split(",")} <= {"on", "off"}:
        return "--backfill takes on, off or on,off"
    return ""


def run_args(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run from parsed arguments (``main`` and ``topoplace bench --scenario gangs``)."""
    bench = getattr(args, "scenario", None) == "gangs"
    if bench:  # the bench CLI's shared flags
        clusters = _split(getattr(args, "workloads", None)) or list(DEFAULT_CLUSTERS)
        seeds_arg = args.seeds if args.seeds != "42-51" else DEFAULT_SEEDS
        spec = WorkloadSpec()
    else:
        clusters = _split(args.clusters)
        seeds_arg = args.seeds
        spec = WorkloadSpec(
            jobs=args.jobs,
            hours=args.hours,
            load=args.load,
            required_share=args.required_share,
            preferred_share=args.preferred_share,
        )
    policies = _split(getattr(args, "policies", None)) or list(DEFAULT_POLICIES)
    backfill = getattr(args, "backfill", "on,off")
    err = _validate(clusters, policies, backfill)
    if err:
        print(f"gangsim: {err}", file=sys.stderr)
        return 2
    backfills = [x.strip() == "on" for x in backfill.split(",") if x.strip()]
    cmd = "python -m benchmarks.gangsim.run " + " ".join(argv) if argv is not None else ""
    if bench:
        cmd = "topoplace bench --scenario gangs ..."
    try:
        with sweep.from_args(args) as executor:
            run(
                clusters,
                policies,
                parse_seeds(seeds_arg),
                spec,
                Path(args.out),
                backfills=backfills,
                units={
                    "nvl72": getattr(args, "nvl72_racks", 8),
                    "h100": getattr(args, "h100_sus", 8),
                },
                time_limit=getattr(args, "time_limit", DEFAULT_TIME_LIMIT),
                executor=executor,
                check=getattr(args, "check", False),
                gang_csv=getattr(args, "gang_csv", False),
                command=cmd,
                quiet=getattr(args, "quiet", False),
            )
    except sweep.SweepError as exc:
        print(f"gangsim: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {Path(args.out) / 'report.md'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point. Returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gangsim.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(ap)
    args_list = list(sys.argv[1:] if argv is None else argv)
    return run_args(ap.parse_args(args_list), args_list)


if __name__ == "__main__":
    # Through the importable module, so runs sent to other processes (Ray workers) refer to
    # benchmarks.gangsim.run, not to __main__.
    from benchmarks.gangsim.run import main as _main

    raise SystemExit(_main())
