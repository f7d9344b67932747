"""Gang scenario (issue 6): topoplace's CP-SAT gang placement vs KAI / Kueue / first-fit.

    topoplace bench gangs                                   # the full scenario, out/gangs
    topoplace bench gangs --clusters nvl72 --policies topoplace,first-fit --seeds 1 \\
        --jobs 200 --backfill on --out /tmp/gangs
    topoplace bench gangs --ray local                       # runs as Ray tasks

Runs every (cluster, queueing mode, seed, policy) on the one engine (:mod:`benchmarks.engine`;
the scenario files ``benchmarks/scenarios/gangs-nvl72.yaml`` and ``gangs-h100.yaml`` are the
defaults, ``topoplace bench benchmarks/scenarios/gangs-*.yaml`` runs them) and writes
``results.csv``, ``report.md``, ``locality.png`` and ``wait.png`` to ``--out`` (see
:mod:`benchmarks.engine.scenarios.gangs.report`); :func:`figures` is the headline table.
``--jobs`` is the number of gangs per run (at most; arrivals also stop after ``--hours``).
The runs are independent and go through :mod:`benchmarks.sweep`, costliest first:
``--workers N`` local processes (default all CPUs, ``1`` inline) or ``--ray ADDRESS``.

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
from typing import Any

from benchmarks import sweep
from benchmarks.engine.locality import model
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.run import Context, run_scenarios
from benchmarks.engine.scenario import Scenario, ScenarioError, parse_seeds
from benchmarks.engine.scenarios.gangs import report
from benchmarks.engine.scenarios.gangs.metrics import GangStats, RunResult, summarize
from benchmarks.engine.scenarios.gangs.workload import (
    ClusterSpec,
    WorkloadSpec,
    cluster_spec,
    derive,
    describe,
)
from benchmarks.engine.sources import Inputs
from benchmarks.registry import Figures
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
            "caps (table below; benchmarks/engine/locality.py)",
            f"benchmark code at commit {_git_head()}; {_versions()}; total wall time "
            f"{ctx.wall_s:.0f} s on {ctx.where}"
            + (f"; invariants checked after every event ({sum(r.checks for r in raw)} checks)"
               if check else ""),
            "analysis of these results (what wins, what loses, why): benchmarks/engine/scenarios/gangs/README.md",
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


def add_arguments(ap: Any) -> None:
    """The scenario's own flags (the runner adds ``--out``, ``--seeds``, ``--workers``...)."""
    ap.add_argument("--clusters", nargs="+", default=[",".join(DEFAULT_CLUSTERS)],
                    help="clusters: nvl72, h100 (default both)")  # fmt: skip
    ap.add_argument("--policies", nargs="+", default=None,
                    help=f"gang policies (default {','.join(DEFAULT_POLICIES)})")  # fmt: skip
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
    ap.add_argument("--check", action="store_true", help="check invariants after every event")
    ap.add_argument("--gang-csv", action="store_true", help="also write gangs.csv.gz")


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


FIGURE_COLUMNS = (
    ("wait_mean_min", "wait mean min"),
    ("jct_mean_h", "JCT mean h"),
    ("alloc", "GPU allocation"),
    ("dom_local_mean", "domains used mean"),
    ("excess_local_mean", "excess over bound"),
    ("bw_mean_gbps", "coll. BW mean GB/s"),
    ("slowdown_mean", "slowdown mean"),
)
"""``results.csv`` columns the headline table shows (mean over seeds)."""


def figures(out: Path, conditions: dict[str, Any]) -> Figures:
    """The headline table of a run's ``results.csv``: per cluster, queueing mode and
    policy, the mean over seeds of :data:`FIGURE_COLUMNS`."""
    import csv

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["cluster"], r["queue"], r["policy"]), []).append(r)
    table = [
        (*key, len(rs), *(sum(float(r[c]) for r in rs) / len(rs) for c, _ in FIGURE_COLUMNS))
        for key, rs in groups.items()
    ]
    return Figures(
        "Gang placement per cluster, queueing mode and policy (mean over seeds)",
        ("cluster", "queue", "policy", "seeds", *(h for _, h in FIGURE_COLUMNS)),
        table,
        conditions,
        (f"Full report: {out / 'report.md'} (locality, time, allocation, per-level bounds).",),
    )


def bench(args: argparse.Namespace) -> Figures | int:
    """Run from the runner's parsed arguments (``topoplace bench gangs``)."""
    clusters = _split(args.clusters)
    spec = WorkloadSpec(
        jobs=args.jobs,
        hours=args.hours,
        load=args.load,
        required_share=args.required_share,
        preferred_share=args.preferred_share,
    )
    policies = _split(args.policies) or list(DEFAULT_POLICIES)
    err = _validate(clusters, policies, args.backfill)
    if err:
        print(f"gangs: {err}", file=sys.stderr)
        return 2
    backfills = [x.strip() == "on" for x in args.backfill.split(",") if x.strip()]
    seeds = parse_seeds(args.seeds or DEFAULT_SEEDS)
    out = Path(args.out)
    try:
        with sweep.from_args(args) as executor:
            run(
                clusters,
                policies,
                seeds,
                spec,
                out,
                backfills=backfills,
                units={"nvl72": args.nvl72_racks, "h100": args.h100_sus},
                time_limit=args.time_limit,
                executor=executor,
                check=args.check,
                gang_csv=args.gang_csv,
                command=getattr(args, "command", "topoplace bench gangs"),
                quiet=args.quiet,
            )
    except sweep.SweepError as exc:
        print(f"gangs: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'report.md'}")
    cond = {
        "clusters": ", ".join(clusters),
        "seeds": ",".join(map(str, seeds)),
        "gangs per run": f"at most {spec.jobs} or {spec.hours:g} h",
        "load": spec.load,
        "CP-SAT limit s": args.time_limit,
    }
    return figures(out, cond)
