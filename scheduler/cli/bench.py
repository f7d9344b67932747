"""``topoplace bench``: offline benchmark scenarios, by name or from scenario files.

Every scenario runs on the one offline engine (:mod:`benchmarks.engine`). The named ones
(``--scenario``) keep their own knobs as flags; ``--scenario-file FILE...`` runs any
scenario file (``benchmarks/scenarios/*.yaml``, format in ``benchmarks/scenarios/README.md``)
and writes the figures of its report kind into ``--out`` (printing them when the report is
a table). Scenarios import their (heavier) benchmark modules lazily, when run.

A scenario's independent runs (workload x policy x seed) go through
:mod:`benchmarks.sweep`: local processes by default (``--workers N``, default all CPUs,
``1`` = inline), or a Ray cluster with ``--ray ADDRESS`` (``local`` starts one; ``auto``,
``host:port`` or ``ray://host:port`` joins one; ``pip install 'topoplace[ray]'``). Results do
not depend on the executor (only measured times do).

    topoplace bench --scenario fgd-openb --seeds 42-51 --out out/fgd --workers 2
    topoplace bench --scenario gangs --out out/gangs --ray local
    topoplace bench --scenario-file benchmarks/scenarios/mix.yaml --workers 1
    topoplace bench --scenario-file benchmarks/scenarios/gangs-*.yaml --out out/gangs
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import sweep  # standard library only; the scenarios' modules load when run


@dataclass(frozen=True, slots=True)
class Scenario:
    """A benchmark scenario: a one-line description and its runner (namespace -> exit code)."""

    description: str
    run: Callable[[argparse.Namespace], int]


def _run_fgd_openb(args: argparse.Namespace) -> int:
    from benchmarks.sim.fgd_repro import run_args

    return run_args(args)


def _run_faults(args: argparse.Namespace) -> int:
    from benchmarks.faults.run import run_args

    return run_args(args)


def _run_gangs(args: argparse.Namespace) -> int:
    from benchmarks.gangsim.run import run_args

    return run_args(args)


SCENARIOS: dict[str, Scenario] = {
    "fgd-openb": Scenario(
        "FGD paper (ATC '23) policies on the Alibaba openb traces vs the published results",
        _run_fgd_openb,
    ),
    "faults": Scenario(
        "failure injection at Llama 3 failure rates: topoplace health vs Ready-only baselines",
        _run_faults,
    ),
    "gangs": Scenario(
        "gang placement on NVL72 and DGX H100 clusters: topoplace CP-SAT vs KAI, Kueue and "
        "first-fit (Helios-derived gangs, Pollux-calibrated locality; --workloads = clusters)",
        _run_gangs,
    ),
}
"""Scenario registry: name -> scenario."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the CLI's sub-command parsers."""
    lines = "\n".join(f"  {name}: {s.description}" for name, s in sorted(SCENARIOS.items()))
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="run an offline benchmark scenario",
        description=f"Run an offline benchmark scenario.\n\nscenarios:\n{lines}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", choices=sorted(SCENARIOS), help="a named scenario")
    which.add_argument(
        "--scenario-file",
        nargs="+",
        metavar="FILE",
        help="scenario files (YAML/JSON) of one report kind, run together",
    )
    parser.add_argument("--policies", nargs="+", help="policies (default: scenario's set)")
    parser.add_argument("--seeds", default="42-51", help="seeds, e.g. 42-51 or 42,43")
    parser.add_argument("--workloads", nargs="+", help="workloads (default: scenario's set)")
    parser.add_argument("--out", help="output directory (required by named scenarios)")
    parser.add_argument("--data", help="input data directory (default: the shared copy)")
    parser.add_argument("--expected", help="published results directory (default: shared copy)")
    parser.add_argument("--tune", type=float, help="arrived demand / capacity (default 1.3)")
    parser.add_argument("--rank-skip", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    sweep.add_arguments(parser, jobs_alias=True)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the selected scenario or scenario files; returns the exit code."""
    if getattr(args, "scenario_file", None):
        from benchmarks.engine.run import main_files

        try:
            with sweep.from_args(args) as executor:
                return main_files(
                    args.scenario_file,
                    args.out,
                    executor,
                    command="topoplace bench --scenario-file " + " ".join(args.scenario_file),
                    quiet=args.quiet,
                )
        except sweep.SweepError as exc:
            print(f"topoplace bench: {exc}")
            return 2
    if not args.out:
        print("topoplace bench: --out is required with --scenario")
        return 2
    scenario = SCENARIOS.get(args.scenario)
    if scenario is None:
        print(f"topoplace bench: unknown scenario {args.scenario!r}")
        return 2
    return scenario.run(args)
