"""``sharing-latency``: per-pod decision time of the GPU-sharing policies at the openb cluster size.

Replays one FGD-artifact run (openb cluster: 1,213 nodes / 6,212 GPUs; a workload and seed,
tasks until 130 % of the GPU capacity has arrived) and times every per-pod decision: filter
the feasible nodes (``feasible_mask``), score them all with the policy (no per-node score
cache, as a stateless extender call would), pick the node (``select_host``) and the
device(s). The cluster fills up as the run goes, so the figures cover an empty to a full
cluster. Every policy replays the same arrivals; its own decisions shape the cluster it sees.
With ``--cache`` a node's score is reused while the node is unchanged (per task shape, keyed
by the view's per-node ``version``), as the simulator does and an extender can.

``topoplace bench sharing-latency [--policies fgd topoplace-share] [--workload default]
[--seeds 42] [--data DIR] [--cache]``: per policy, the decisions timed, median, p99 and max
in milliseconds, and the allocation reached.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.engine.placers import SharingPlacement
from benchmarks.engine.run import build, materialize, report
from benchmarks.engine.scenarios.fgd.run import fgd_scenario
from benchmarks.registry import Figures
from scheduler.core.policies.sharing_policies import get_sharing_policy
from scheduler.core.schedule import PlacementResult


class TimedPlacement:
    """A :class:`SharingPlacement` without score cache whose every decision is timed."""

    def __init__(self, inner: SharingPlacement) -> None:
        self.inner = inner
        self.seconds: list[float] = []
        self.kinds: list[str] = []

    def place(self, ledger: Any, run: Any) -> PlacementResult:
        """Place and record the wall time of the decision."""
        t0 = time.perf_counter()
        out = self.inner.place(ledger, run)
        self.seconds.append(time.perf_counter() - t0)
        task = run.job.task()
        self.kinds.append(
            "fractional" if task.is_sharing else "whole GPUs" if task.needs_gpu else "CPU only"
        )
        return out


def time_policy(
    policy: str, workload: str, seed: int, data: str | None, cache: bool = False
) -> tuple[list[float], list[str], float]:
    """Decision times (s) of ``policy`` over one run, the kind of each pod, and the
    allocation at 130 % (%)."""
    get_sharing_policy(policy)
    run = fgd_scenario([workload], [policy], [seed], data).runs()[0]
    rep = report(run.report)
    inputs = materialize(run)
    hooks = rep.hooks(run, inputs)
    engine = build(run, inputs, hooks)
    n = len(engine.ledger.view)  # type: ignore[attr-defined]
    timed = TimedPlacement(
        SharingPlacement(get_sharing_policy(policy), inputs.rng, n, use_cache=cache)
    )
    engine.placement = timed
    engine.run(inputs.jobs, inputs.faults)
    summary = rep.result(run, inputs, engine, hooks)
    return timed.seconds, timed.kinds, float(summary.alloc_pct_at_130)


def add_arguments(ap: Any) -> None:
    """Policies, workload, data, cache (the runner's ``--seeds``: the first is the run's
    seed, default 42)."""
    ap.add_argument("--policies", nargs="+", default=["fgd", "topoplace-share"])
    ap.add_argument("--workload", default="default")
    ap.add_argument("--data", help="openb trace directory (default: ../shared copy)")
    ap.add_argument(
        "--cache",
        action="store_true",
        help="reuse each node's score while the node is unchanged (per task shape), as the "
        "simulator does; default: score every feasible node on every decision",
    )


def run(args: argparse.Namespace) -> Figures:
    """Per policy and pod kind: decisions, median, p99 and max ms, allocation at 130 %."""
    from benchmarks.registry import parse_seeds

    seed = parse_seeds(args.seeds)[0] if args.seeds else 42
    rows: list[tuple[Any, ...]] = []
    for policy in args.policies:
        secs, kinds, alloc = time_policy(policy, args.workload, seed, args.data, args.cache)
        all_ms = np.asarray(secs) * 1000.0
        kind = np.asarray(kinds)
        for name in ("all", "fractional", "whole GPUs", "CPU only"):
            ms = all_ms if name == "all" else all_ms[kind == name]
            if len(ms) == 0:
                continue
            rows.append((policy, name, len(ms), float(statistics.median(ms)),
                         float(np.percentile(ms, 99)), float(ms.max()), alloc))  # fmt: skip
    return Figures(
        "Per-pod decision time of the GPU-sharing policies (wall ms, single process)",
        ("policy", "pods", "decisions", "median ms", "p99 ms", "max ms", "alloc % at 130 %"),
        rows,
        {
            "cluster": "openb (1,213 nodes, 6,212 GPUs)",
            "workload": args.workload,
            "seed": seed,
            "arrivals": "tasks to 130 % arrived demand",
            "decision": "filter + score every feasible node + node + device",
            "score cache": "scores of unchanged nodes reused" if args.cache else "none",
        },  # fmt: skip
    )
