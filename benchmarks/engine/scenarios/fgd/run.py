"""Reproduce the FGD paper's GPU allocation results on the openb traces.

Usage::

    topoplace bench fgd-openb --workloads default,cpu050 --policies fgd,bestfit \\
        --seeds 42-51 --out out/fgd
    topoplace bench fgd-openb --ray local   # the same on Ray

For every (workload, policy, seed) it replays the artifact's task order for the seed, places
tasks until 130 % of the cluster's GPU capacity has arrived, and records the GPU allocation
ratio and fragmentation per arrived-demand bin. It writes ``results.csv``, ``report.md`` and
plots into ``--out``, side by side with the published numbers when those are available.

The runs are independent and go through :mod:`benchmarks.sweep`: ``--workers N`` local
processes (default all CPUs, ``1`` inline) or ``--ray ADDRESS``; ``results.csv`` is the same
whichever executes them, except the measured ``seconds`` column. With Ray, every worker node
needs the traces at the ``--data`` path.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import sweep
from benchmarks.engine import openb
from benchmarks.engine.artifact import DEFAULT_RANK_SKIP, DEFAULT_TUNE_RATIO
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.run import Context, run_scenarios
from benchmarks.engine.scenario import Scenario, ScenarioError
from benchmarks.engine.scenario import parse_seeds as scenario_seeds
from benchmarks.engine.scenarios.fgd.metrics import Recorder, RunSummary, summarize
from benchmarks.engine.scenarios.fgd.report import load_published, read_results_csv, write_report
from benchmarks.engine.sources import Inputs
from benchmarks.registry import Figures
from scheduler.core.policies.sharing_policies import (
    PAPER_POLICY_IDS,
    SHARING_POLICIES,
    get_sharing_policy,
)

DEFAULT_POLICIES: tuple[str, ...] = tuple(PAPER_POLICY_IDS)
DEFAULT_SEEDS: tuple[int, ...] = tuple(range(42, 52))


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"42-51"``, ``"42,45"`` or a mix (``"42-44,50"``) as a sorted tuple of distinct seeds.

    Raises:
        ValueError: no seeds in ``text``.
    """
    return tuple(sorted(set(scenario_seeds(text))))


def parse_names(values: Sequence[str] | str | None, default: Sequence[str]) -> tuple[str, ...]:
    """Comma- or space-separated names (``"all"`` or nothing: ``default``)."""
    if values is None:
        return tuple(default)
    if isinstance(values, str):
        values = [values]
    names = [n for v in values for n in v.replace(",", " ").split() if n]
    if not names or names == ["all"]:
        return tuple(default)
    return tuple(dict.fromkeys(names))


def fgd_scenario(
    workloads: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    data_dir: str | Path | None = None,
    tune_ratio: float = DEFAULT_TUNE_RATIO,
    rank_skip: int = DEFAULT_RANK_SKIP,
) -> Scenario:
    """The reproduction as a scenario (``benchmarks/scenarios/fgd-openb.yaml`` with the
    defaults): the openb nodes, the artifact's seeded arrival order, ties to its seeded node
    ranking, every (workload, policy, seed)."""
    data = str(openb.data_dir(data_dir).resolve())  # workers may run elsewhere
    return Scenario(
        name="fgd-openb",
        description="FGD paper (ATC '23) policies on the Alibaba openb traces",
        nodes=({"openb": {"path": data}},),
        arrivals=({"openb": {"path": data, "order": "fgd-artifact", "tune": tune_ratio}},),
        pod_policy=policies[0],
        ties="go-rank",
        rank_skip=rank_skip,
        sweep=(("workload", tuple(workloads)), ("pod_policy", tuple(policies)),
               ("seed", tuple(seeds))),
        report="fgd",
    )  # fmt: skip


class FgdReport:
    """The reproduction's outputs: a :class:`RunSummary` per run; ``results.csv``,
    ``report.md`` and the plots beside the published numbers."""

    needs_out = True

    def hooks(self, run: Scenario, inputs: Inputs) -> list[Hook]:
        """The per-event recorder."""
        return [Recorder(run.pod_policy, run.seed)]

    def result(
        self, run: Scenario, inputs: Inputs, engine: Engine, hooks: list[Hook]
    ) -> RunSummary:
        """Summary and allocation curve of the run."""
        rec = hooks[0]
        assert isinstance(rec, Recorder)
        return summarize(inputs.info["workload"], rec.result())

    def write(
        self,
        runs: Sequence[Scenario],
        results: Sequence[RunSummary],
        out: Path | None,
        ctx: Context,
    ) -> str:
        """Write ``results.csv``, the plots and ``report.md`` into ``out``."""
        if out is None:
            raise ScenarioError("the fgd report writes files: give --out")
        workloads = list(dict.fromkeys(r.workload for r in results))
        policies = list(dict.fromkeys(r.policy for r in results))
        seeds = sorted({r.seed for r in results})
        arr = runs[0].arrivals[0].get("openb", {})
        tune = float(arr.get("tune", DEFAULT_TUNE_RATIO))
        setup = [
            *_setup(tune, runs[0].rank_skip),
            f"Runs: {len(results)} ({len(workloads)} workloads x {len(policies)} policies x "
            f"{len(seeds)} seeds: {seeds[0]}..{seeds[-1]}), {ctx.where}, "
            f"{ctx.wall_s:.0f} s wall.",
            _regenerate(workloads, policies, seeds),
        ]
        published = load_published(ctx.extra.get("expected"))
        path = write_report(out, results, published, setup_lines=setup, notes=NOTES)
        return "" if ctx.quiet else f"wrote {path}"


REPORT = FgdReport()
"""The ``fgd`` report (``report: fgd`` in a scenario file)."""


def _setup(tune_ratio: float, rank_skip: int) -> list[str]:
    return [
        "Setup: the 1,213-node / 6,212-GPU openb cluster "
        "(`openb_node_list_gpu_node.csv`); tasks shuffled with Go `math/rand` seeded by the "
        f"run seed and submitted until arrived GPU demand reaches {tune_ratio:.0%} of capacity; "
        "ties between equally scored nodes go to the node with the lowest seeded random rank, "
        f"as in the artifact (rank permutation after {rank_skip} extra draws). Published = "
        "FGD artifact cached results (`fgd-artifact-expected-results`)."
    ]


def _regenerate(workloads: Sequence[str], policies: Sequence[str], seeds: Sequence[int]) -> str:
    return (
        "Regenerate: `topoplace bench fgd-openb --workloads "
        f"{','.join(workloads)} --policies {','.join(policies)} "
        f"--seeds {_seed_text(seeds)} --out <dir>` (`--workers N` or `--ray ADDRESS` to "
        "spread the runs; results do not depend on it)."
    )


NOTES: tuple[str, ...] = (
    "- **What is replayed.** The semantics were re-derived from the authors' simulator "
    "(hkust-adsl/kubernetes-scheduler-simulator): tasks sorted by name, Go `math/rand` seeded "
    "with the run seed draws one `Int`, shuffles them, then appends tasks sampled with "
    "replacement from the name-sorted workload until the next one would exceed 130 % of GPU "
    "capacity (multigpu30 is above it and is tuned down by removing random tasks). Filters: "
    "CPU and memory fit, GPU model (`gpu_spec`), enough GPUs with room. Scores are the "
    "artifact's integer formulas (see `scheduler/core/policies/sharing_policies.py`). The "
    "typical tasks of FGD are the shapes (CPU, per-GPU milli, GPU count, GPU model constraint) "
    "covering 95 % of the original workload, CPU-only tasks included. The metric bins every "
    "event by arrived GPU demand (% of capacity, rounded) and averages the allocation ratio, "
    "as the artifact's merge script does.",
    "- **Ties.** The artifact runs a kube-scheduler fork whose `selectHost` keeps the "
    "lexicographically smallest node name among the best-scored nodes, and it prefixes every "
    "node name with a `rand.Perm` index drawn from the same generator. Ties, which are very "
    "common with 0..100 integer scores, therefore go to a per-run random but fixed node "
    "ranking. Between tuning and the permutation the artifact's informers draw 10 more values "
    "from the generator (found by search; it reproduces every deterministic policy).",
    "- **Random** cannot be replayed seed by seed: the artifact draws `rand.Intn(n)` over the "
    "feasible-node list, whose order comes from kube-scheduler's parallel filter (16 "
    "goroutines appending as they finish), so the same draw names a different node in every "
    "execution. Our draws are uniform over the same feasible set; the 10-seed means agree "
    "within the seed-to-seed spread (published per-seed range about 1 pp).",
    "- **FGD and float rounding.** A placement that changes no shape's fragmentation has an "
    "exact delta of 0 (score 50). The artifact computes before and after as separate float sums "
    "accumulated per category, and for a few % of such placements the rounding leaves about "
    "-4e-13, which truncates to 49. With many typical shapes (gpuspec*) this changes decisions. "
    "We evaluate exactly those zero-change placements in the artifact's summation order, which "
    "made 7 of 10 gpuspec10 runs (and one gpuspec20 and one multigpu20 run) go from "
    "close-but-different to identical.",
    "- **Variants tried, not registered** (default / gpushare60, seeds 42..51, allocation at "
    "130 %): ranking nodes by the exact fragmentation drop instead of the quantised sigmoid "
    "score gives 94.42 / 90.68 (FGD: 95.39 / 91.40); keeping FGD's score but breaking ties by "
    "best fit gives 95.36 / 91.21, by least-allocated CPU 94.38 / 90.07. The quantisation plus "
    "random tie-breaking is part of FGD's performance, so we found no well-founded "
    "`topoplace-fgd` improvement.",
    "- **least-allocated** (kube-scheduler's default spreading score, CPU and memory; GPU-blind) "
    "is an extra baseline without published numbers.",
    "- **Run time** in the table above was measured with 2 worker processes on a 2-core host "
    "shared with other jobs. Alone on one core a run takes 1.1-2.9 s for the baselines and "
    "3.2-5.4 s for FGD (slowest: gpuspec10, whose GPU-type constraints make 74 typical shapes).",
)
"""Analysis notes appended to the report."""


def run_reproduction(
    workloads: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    out_dir: Path,
    *,
    executor: sweep.Executor | None = None,
    data_dir: str | Path | None = None,
    expected_dir: str | Path | None = None,
    tune_ratio: float = DEFAULT_TUNE_RATIO,
    rank_skip: int = DEFAULT_RANK_SKIP,
    progress: bool = True,
) -> Path:
    """Run every (workload, policy, seed) and write the report; returns the report path.

    ``executor`` runs the independent runs (default: inline, in this process); the report is
    the same whichever does, except measured times.

    Raises:
        FileNotFoundError: If the traces are absent.
        KeyError: For an unknown policy.
    """
    for p in policies:
        get_sharing_policy(p)
    scenario = fgd_scenario(workloads, policies, seeds, data_dir, tune_ratio, rank_skip)
    data = scenario.nodes[0]["openb"]["path"]
    for wl in workloads:
        if not openb.pod_file(wl, data).is_file():
            raise FileNotFoundError(f"no pod list for workload {wl!r} in {data}")
    executor = executor or sweep.LocalExecutor(1)
    t0 = time.perf_counter()
    finished = 0
    total = len(scenario.runs())

    def note(_: Scenario, r: RunSummary) -> None:
        nonlocal finished
        finished += 1
        if progress:
            print(
                f"[{finished}/{total}] {r.workload} {r.policy} seed={r.seed} "
                f"alloc@130={r.alloc_pct_at_130:.2f}% ({r.seconds:.1f}s, "
                f"elapsed {time.perf_counter() - t0:.0f}s)",
                file=sys.stderr,
                flush=True,
            )

    runs, results = run_scenarios([scenario], executor, on_result=note)
    ctx = Context(
        executor.describe(),
        time.perf_counter() - t0,
        quiet=not progress,
        extra={"expected": expected_dir},
    )
    REPORT.write(runs, results, out_dir, ctx)
    path = out_dir / "report.md"
    if progress:
        print(f"wrote {path}", file=sys.stderr)
    return path


def render_only(
    out_dir: Path,
    expected_dir: str | Path | None = None,
    rank_skip: int = DEFAULT_RANK_SKIP,
    tune_ratio: float = DEFAULT_TUNE_RATIO,
) -> Path:
    """Re-render ``report.md`` and the plots from an existing ``results.csv`` in ``out_dir``."""
    runs = read_results_csv(out_dir / "results.csv")
    if not runs:
        raise ValueError(f"no runs in {out_dir / 'results.csv'}")
    workloads = tuple(dict.fromkeys(r.workload for r in runs))
    policies = tuple(dict.fromkeys(r.policy for r in runs))
    seeds = tuple(sorted({r.seed for r in runs}))
    setup = [
        *_setup(tune_ratio, rank_skip),
        f"Runs: {len(runs)} ({len(workloads)} workloads x {len(policies)} policies x "
        f"{len(seeds)} seeds: {seeds[0]}..{seeds[-1]}); report re-rendered from results.csv.",
        _regenerate(workloads, policies, seeds),
    ]
    return write_report(out_dir, runs, load_published(expected_dir), setup_lines=setup, notes=NOTES)


def _seed_text(seeds: Sequence[int]) -> str:
    s = sorted(seeds)
    if s == list(range(s[0], s[-1] + 1)) and len(s) > 1:
        return f"{s[0]}-{s[-1]}"
    return ",".join(map(str, s))


def add_arguments(p: Any) -> None:
    """The reproduction's own flags (the runner adds ``--out``, ``--seeds``, ``--workers``...)."""
    p.add_argument(
        "--workloads",
        nargs="+",
        help=f"openb workloads, comma/space separated (default: {' '.join(openb.PAPER_WORKLOADS)})",
    )
    p.add_argument(
        "--policies",
        nargs="+",
        help=f"policies (default: the paper's six; known: {', '.join(sorted(SHARING_POLICIES))})",
    )
    p.add_argument("--data", help="trace directory (default: ../shared/data/alibaba-gpu-v2023)")
    p.add_argument("--expected", help="published results directory (default: shared copy)")
    p.add_argument("--tune", type=float, default=DEFAULT_TUNE_RATIO, help="arrived demand ratio")
    p.add_argument(
        "--rank-skip", type=int, default=DEFAULT_RANK_SKIP, help="draws before node ranking"
    )
    p.add_argument(
        "--render-only",
        action="store_true",
        help="re-render report.md and plots from <out>/results.csv without simulating",
    )
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASELINE", "POLICY"),
        help="also write POLICY vs BASELINE per workload (compare.md in --out)",
    )


def figures(out: Path, conditions: dict[str, Any]) -> Figures:
    """The headline table of a run's ``results.csv``: per workload and policy, the mean over
    seeds of the GPU allocation and fragmentation at 100 % and 130 % arrived demand, with
    the published allocation at 130 % where the artifact's results are present."""
    import csv

    with (out / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["policy"]), []).append(r)

    def mean(rs: list[dict[str, str]], col: str) -> float | str:
        xs = [float(r[col]) for r in rs if r.get(col)]
        return round(sum(xs) / len(xs), 2) if xs else ""

    table = [
        (wl, pol, len(rs), *(mean(rs, c) for c in ("alloc_pct_at_100", "alloc_pct_at_130",
                                                  "published_alloc_pct_at_130", "frag_pct_at_130")))
        for (wl, pol), rs in groups.items()
    ]  # fmt: skip
    return Figures(
        "GPU allocation (% of GPUs) per workload and policy, mean over seeds",
        (
            "workload",
            "policy",
            "seeds",
            "alloc % at 100 %",
            "alloc % at 130 %",
            "published alloc % at 130 %",
            "frag % at 130 %",
        ),  # fmt: skip
        table,
        conditions,
        (f"Full report: {out / 'report.md'} (curves, per-seed rows, plots).",),
    )


def _compare(out: Path, pair: Sequence[str] | None) -> int:
    """``--compare BASELINE POLICY``: write and print :func:`.policy_compare.compare` of
    ``out/results.csv`` into ``out/compare.md``; an exit code (2: a policy without runs)."""
    if not pair:
        return 0
    from benchmarks.engine.scenarios.fgd.policy_compare import compare

    try:
        text = compare(out / "results.csv", pair[0], pair[1])
    except ValueError as exc:
        print(f"fgd-openb: {exc}", file=sys.stderr)
        return 2
    (out / "compare.md").write_text(text + "\n")
    print(text)
    return 0


def bench(args: argparse.Namespace) -> Figures | int:
    """Run from the runner's parsed arguments (``topoplace bench fgd-openb``)."""
    out = Path(args.out)
    try:
        if args.render_only:
            render_only(out, args.expected)
            return _compare(out, args.compare)
        workloads = parse_names(args.workloads, openb.PAPER_WORKLOADS)
        policies = parse_names(args.policies, DEFAULT_POLICIES)
        seeds = parse_seeds(args.seeds or "42-51")
        with sweep.from_args(args) as executor:
            run_reproduction(
                workloads,
                policies,
                seeds,
                out,
                executor=executor,
                data_dir=args.data,
                expected_dir=args.expected,
                tune_ratio=args.tune,
                rank_skip=args.rank_skip,
                progress=not args.quiet,
            )
    except (FileNotFoundError, KeyError, ValueError, sweep.SweepError) as exc:
        print(f"fgd-openb: {exc}", file=sys.stderr)
        return 2
    if _compare(out, args.compare):
        return 2
    cond = {
        "cluster": "openb (1,213 nodes, 6,212 GPUs)",
        "workloads": ", ".join(workloads),
        "seeds": _seed_text(seeds),
        "arrivals": f"artifact order until {args.tune:.0%} of GPU capacity",
    }
    return figures(out, cond)
