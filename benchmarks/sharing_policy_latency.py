"""Per-pod decision time of the GPU-sharing policies at the openb cluster size.

Replays one FGD-artifact run (openb cluster: 1,213 nodes / 6,212 GPUs; a workload and seed,
tasks until 130 % of the GPU capacity has arrived) and times every per-pod decision: filter
the feasible nodes (``feasible_mask``), score them all with the policy (no per-node score
cache, as a stateless extender call would), pick the node (``select_host``) and the
device(s). The cluster fills up as the run goes, so the figures cover an empty to a full
cluster. Every policy replays the same arrivals; its own decisions shape the cluster it sees.
With ``--cache`` a node's score is reused while the node is unchanged (per task shape, keyed
by the view's per-node ``version``), as the simulator does and an extender can.

Run: ``python -m benchmarks.sharing_policy_latency [--policies fgd topoplace-share]
[--workload default] [--seed 42] [--data DIR] [--cache]``. Prints, per policy, the decisions timed,
median, p99 and max in milliseconds, and the allocation reached.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.engine.placers import SharingPlacement
from benchmarks.engine.run import build, materialize, report
from benchmarks.sim.fgd_repro import fgd_scenario
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


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.sharing_policy_latency")
    p.add_argument("--policies", nargs="+", default=["fgd", "topoplace-share"])
    p.add_argument("--workload", default="default")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data", help="openb trace directory (default: ../shared copy)")
    p.add_argument(
        "--cache",
        action="store_true",
        help="reuse each node's score while the node is unchanged (per task shape), as the "
        "simulator does; default: score every feasible node on every decision",
    )
    args = p.parse_args(argv)
    print(
        f"openb cluster (1,213 nodes, 6,212 GPUs), workload {args.workload}, seed {args.seed}, "
        "tasks to 130 % arrived demand; one decision = filter + score every feasible node "
        f"({'scores of unchanged nodes reused' if args.cache else 'no score cache'}) + node + "
        "device; single process",
        flush=True,
    )
    print("| policy | pods | decisions | median ms | p99 ms | max ms | alloc@130 % |")
    print("|---|---|---|---|---|---|---|")
    for policy in args.policies:
        secs, kinds, alloc = time_policy(policy, args.workload, args.seed, args.data, args.cache)
        all_ms = np.asarray(secs) * 1000.0
        kind = np.asarray(kinds)
        for name in ("all", "fractional", "whole GPUs", "CPU only"):
            ms = all_ms if name == "all" else all_ms[kind == name]
            if len(ms) == 0:
                continue
            print(
                f"| {policy} | {name} | {len(ms)} | {statistics.median(ms):.2f} | "
                f"{float(np.percentile(ms, 99)):.2f} | {float(ms.max()):.2f} | {alloc:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
