"""``topoplace bench``: list and run every benchmark with the same flags.

The runner is :mod:`benchmarks.registry` (a benchmark is a scenario file or one registered
module); this module only hands it the command line::

    topoplace bench --list
    topoplace bench gangs --seeds 1-2 --workers 2
    topoplace bench pod-path --runs 3 --write-results
    topoplace bench live-mix --kube-bin /path/to/kube-bin --nodes 500
    topoplace bench mix                                   # benchmarks/scenarios/mix.yaml
    topoplace bench benchmarks/scenarios/gangs-*.yaml --out out/gangs

``topoplace bench NAME --help`` shows the common flags and NAME's own.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the CLI's sub-command parsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="list and run the benchmarks (offline, micro, live)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--list", action="store_true", help="list every benchmark")
    parser.add_argument("name", nargs="?", help="a benchmark name or scenario file")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="common and NAME's own flags")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the named benchmark (or print the list); returns the exit code."""
    from benchmarks import registry

    if args.list or not args.name:
        print(registry.listing())
        return 0 if args.list else 2
    return registry.main([args.name, *args.argv])
