"""Gang placement benchmark: CP-SAT (``topoplace``) against the baselines.

For each cluster size (default 500 / 2,000 / 10,000 nodes) a DGX H100 fleet is built with
:mod:`benchmarks.clusters` (32 nodes per leaf, 4 leaves per spine, Topograph labels) and
realistic partial usage (seeded): every leaf gets a utilisation level (a quarter idle, a
quarter nearly full, the rest 20-70 %), busy nodes run a pod of 8 GPUs (half of them) or
of 1, 2 or 4 GPUs; 2 % of nodes are degraded (NVSentinel ``GpuThermalWatch``), 1 %
unhealthy (``GpuXidError``), 0.5 % cordoned. Gangs of 8 to 512 pods x 8 GPUs (no
constraint, as for the targets; ``--required`` / ``--preferred`` add a level, which is how
Kueue and KAI users ask for topology) are planned by every registered gang policy,
``--runs`` times each, on one snapshot.

The ``mixed`` scenario (``--mixed``) adds GB200 NVL72 racks (18 x 4-GPU trays per rack and
leaf) to a DGX fleet and plans 4-GPU gangs that require or prefer one NVLink domain.

Reported per (nodes, gang, policy): wall time of the whole ``plan`` call (view, bounds,
model build and solve, materialisation) p50 and p99 over the runs, result status (solver
status for CP-SAT: optimal / feasible / fallback; ``heuristic`` for baselines; refused),
relative gap, domains used per level against the exact lower bound (fewest domains whose
free capacity covers the gang; in brackets the nested bound: fewest leaves given the
fewest spines), the collective bandwidth estimate, and whether every run gave the same
placement. The conditions (machine, library versions, solver parameters, fleet
statistics) are printed first.

``topoplace bench gang-solver [--sizes 500 2000 10000] [--gangs 8 32 128 512] [--runs 7]
[--policies topoplace kueue-bestfit ...] [--mixed]`` (the rows also in ``OUT/rows.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from benchmarks.clusters import dgx_h100_nodes, make_pod, nvl72_racks
from benchmarks.registry import Figures
from scheduler.core.gang import GangRequest, simple_gang
from scheduler.core.params import SchedParams
from scheduler.core.policies.common import GangView, lower_bounds, nested_bounds
from scheduler.core.policies.cpsat import LINEARIZATION_LEVEL, wall_cap
from scheduler.core.policies.registry import distinct_policies
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot, build_snapshot

DEFAULT_SIZES = (500, 2000, 10000)
DEFAULT_GANGS = (8, 32, 128, 512)
TARGETS = {
    (2000, 128): "median <= 200 ms, domain count proven minimal",
    (10000, 512): "<= 2 s, gap <= 5 %",
}


def _busy_pod(name: str, gpus: int, i: int) -> dict[str, Any]:
    return make_pod(
        f"job-{name}",
        gpus,
        namespace="bench",
        node=name,
        gpu_indices=list(range(gpus)),
        cpu="16",
        memory="128Gi",
    )


def _health(node: dict[str, Any], rng: random.Random) -> None:
    x = rng.random()
    if x < 0.02:
        node["status"]["conditions"].append(
            {"type": "GpuThermalWatch", "status": "True", "reason": "GpuThermalWatchIsNotHealthy"}
        )
    elif x < 0.03:
        node["status"]["conditions"].append(
            {"type": "GpuXidError", "status": "True", "reason": "GpuXidErrorIsNotHealthy"}
        )
    elif x < 0.035:
        node["spec"]["unschedulable"] = True


def dgx_fleet(num_nodes: int, seed: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A DGX H100 fleet with realistic partial usage and health (see module docstring)."""
    rng = random.Random(seed)
    nodes = dgx_h100_nodes(num_nodes, nodes_per_leaf=32, leaves_per_spine=4, prefix="dgx")
    pods = []
    leaf_util: dict[str, float] = {}
    for n in nodes:
        leaf = n["metadata"]["labels"]["network.topology.nvidia.com/leaf"]
        if leaf not in leaf_util:
            x = rng.random()
            leaf_util[leaf] = 0.0 if x < 0.25 else 0.95 if x < 0.5 else rng.uniform(0.2, 0.7)
        _health(n, rng)
        if rng.random() < leaf_util[leaf]:
            g = 8 if rng.random() < 0.5 else rng.choice((1, 2, 4))
            pods.append(_busy_pod(n["metadata"]["name"], g, len(pods)))
    return nodes, pods


def mixed_fleet(num_nodes: int, seed: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Half the nodes in GB200 NVL72 racks (partly used), half DGX H100 (see dgx_fleet)."""
    rng = random.Random(seed + 1000)
    racks = max(1, num_nodes // 2 // 18)
    nvl = nvl72_racks(racks, leaves_per_spine=4, prefix="gb200")
    pods = []
    for r in range(racks):
        x = rng.random()
        util = 0.0 if x < 0.3 else 0.9 if x < 0.5 else rng.uniform(0.1, 0.6)
        for t in range(18):
            n = nvl[r * 18 + t]
            _health(n, rng)
            if rng.random() < util:
                pods.append(_busy_pod(n["metadata"]["name"], rng.choice((2, 4, 4)), len(pods)))
    dgx, dpods = dgx_fleet(num_nodes - len(nvl), seed)
    return nvl + dgx, pods + dpods


@dataclass
class Row:
    """One (cluster, gang, policy) measurement."""

    scenario: str
    nodes: int
    gang: str
    policy: str
    p50_ms: float
    p99_ms: float
    status: str
    gap: float | None
    used: dict[str, int]
    lower: dict[str, int]
    nested: dict[str, int]
    bandwidth: float
    stable: bool
    ok: bool
    reason: str
    solve_ms: float | None


def _digest(res: PlacementResult) -> str:
    h = hashlib.sha1()
    for a in res.assignments:
        h.update(f"{a.pod}@{a.node}:{a.gpus}".encode())
    h.update(res.reason.encode())
    return h.hexdigest()[:12]


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else 0.0


def measure(
    scenario: str,
    snap: ClusterSnapshot,
    gang: GangRequest,
    params: SchedParams,
    policies: dict[str, Any],
    runs: int,
) -> list[Row]:
    """Time every policy on one gang."""
    view = GangView(snap, gang, params)
    bounds = lower_bounds(view)
    nb = nested_bounds(view, bounds)
    spine_lb = bounds.per_level.get("spine", -1)
    nested = {lvl: tab.get(spine_lb, -1) for lvl, tab in nb.items() if lvl == "leaf"}
    rows = []
    for name, fn in policies.items():
        times = []
        digests = set()
        res = None
        for _ in range(runs):
            t = time.perf_counter()
            res = fn(snap, gang, params)
            times.append((time.perf_counter() - t) * 1000)
            digests.add(_digest(res))
        assert res is not None
        d = res.details
        rows.append(
            Row(
                scenario=scenario,
                nodes=len(snap.nodes),
                gang=f"{gang.size}x{gang.roles[0].gpus}"
                + (f" req={gang.topology.required}" if gang.topology.required else "")
                + (f" pref={gang.topology.preferred}" if gang.topology.preferred else ""),
                policy=name,
                p50_ms=statistics.median(times),
                p99_ms=_pct(times, 99),
                status=str(d.get("status", "?")) if res.ok else "refused",
                gap=d.get("gap"),
                used=dict(d.get("domains_used", {})),
                lower=dict(bounds.per_level),
                nested=nested,
                bandwidth=float(d.get("collective_bandwidth_gbps", 0.0)),
                stable=len(digests) == 1,
                ok=res.ok,
                reason=res.reason,
                solve_ms=d.get("solve_time_ms"),
            )
        )
    return rows


def fleet_stats(snap: ClusterSnapshot) -> str:
    """One line describing the fleet's usage and health."""
    a = snap.arrays
    free = int(a.free.sum())
    cap = int(a.capacity.sum())
    whole = int(((a.free == a.capacity) & (a.state < 2) & ~a.unschedulable).sum())
    return (
        f"{len(snap.nodes)} nodes, {cap} GPUs, {free} free ({100 * free / max(cap, 1):.0f} %), "
        f"{whole} whole free healthy nodes, {int((a.state == 1).sum())} degraded, "
        f"{int((a.state >= 2).sum())} unhealthy, {int(a.unschedulable.sum())} cordoned"
    )


def conditions(params: SchedParams, runs: int) -> list[str]:
    """Machine, versions and parameters the figures were measured under."""
    import ortools

    g = params.gang
    return [
        f"machine: {platform.machine()} {platform.processor() or ''} ({os.cpu_count()} CPUs), "
        f"{platform.system()} {platform.release()}",
        f"python {platform.python_version()}, numpy {np.__version__}, ortools {ortools.__version__}",
        f"CP-SAT: workers {g.workers}, seed {g.seed}, max_deterministic_time "
        f"{g.solver_time_limit_seconds} s, wall cap {wall_cap(g.solver_time_limit_seconds)} s, "
        f"linearization level {LINEARIZATION_LEVEL}",
        f"runs per cell: {runs} (p99 over {runs} runs = near max); times are whole plan() calls "
        "in one process, snapshot prebuilt",
    ]


def fmt_levels(used: dict[str, int], lower: dict[str, int], nested: dict[str, int]) -> str:
    """``leaf 7/6[7] spine 2/2`` (used / lower bound [nested bound])."""
    parts = []
    for lvl in ("nvlink-domain", "leaf", "spine"):
        if lvl in used or lvl in lower:
            nb = f"[{nested[lvl]}]" if lvl in nested and nested[lvl] >= 0 else ""
            parts.append(f"{lvl} {used.get(lvl, '-')}/{lower.get(lvl, '-')}{nb}")
    return " ".join(parts)


def table(rows: list[Row]) -> str:
    """Markdown table of the rows."""
    head = (
        "| scenario | nodes | gang | policy | p50 ms | p99 ms | status | gap | "
        "domains used/LB[nested] | bw GB/s | same placement |"
    )
    sep = "|" + "---|" * 11
    out = [head, sep]
    for r in rows:
        gap = "" if r.gap is None else f"{100 * r.gap:.1f} %"
        out.append(
            f"| {r.scenario} | {r.nodes} | {r.gang} | {r.policy} | {r.p50_ms:.1f} | "
            f"{r.p99_ms:.1f} | {r.status} | {gap} | "
            f"{fmt_levels(r.used, r.lower, r.nested) if r.ok else r.reason[:60]} | "
            f"{r.bandwidth:g} | {'yes' if r.stable else 'NO'} |"
        )
    return "\n".join(out)


def run(
    sizes: Sequence[int] = DEFAULT_SIZES,
    gangs: Sequence[int] = DEFAULT_GANGS,
    runs: int = 7,
    policy_names: Sequence[str] | None = None,
    mixed: bool = False,
    required: str = "",
    seed: int = 1,
    out: Any = sys.stdout,
    preferred: str = "",
) -> list[Row]:
    """Run the benchmark and print conditions and the table; returns the rows."""
    params = SchedParams()
    allp = distinct_policies()
    policies = {n: allp[n] for n in (policy_names or list(allp))}
    for line in conditions(params, runs):
        print(line, file=out)
    rows: list[Row] = []
    for n in sizes:
        scenarios = [("dgx", dgx_fleet)] + ([("mixed", mixed_fleet)] if mixed else [])
        for scen, build in scenarios:
            nodes, pods = build(n, seed)
            t = time.perf_counter()
            snap = build_snapshot(nodes, pods, params)
            print(
                f"[{scen} {n}] {fleet_stats(snap)}; snapshot built in "
                f"{time.perf_counter() - t:.1f} s",
                file=out,
            )
            glist: list[GangRequest] = []
            if scen == "dgx":
                glist = [
                    simple_gang(f"bench/g{k}", k, 8, required=required, preferred=preferred)
                    for k in gangs
                ]
            else:
                glist = [
                    simple_gang("bench/nvl16", 16, 4, required="nvlink-domain"),
                    simple_gang("bench/nvl36", 36, 4, preferred="nvlink-domain"),
                    simple_gang("bench/nvl64", 64, 4, preferred="leaf"),
                ]
            for g in glist:
                rows += measure(scen, snap, g, params, policies, runs)
                print(
                    table(
                        [
                            r
                            for r in rows
                            if r.nodes == len(snap.nodes)
                            and r.scenario == scen
                            and r.gang.startswith(f"{g.size}x")
                        ][-len(policies) :]
                    ).split("\n", 2)[2],
                    file=out,
                )
    print("", file=out)
    print(table(rows), file=out)
    for (n, k), goal in TARGETS.items():
        hit = [
            r
            for r in rows
            if r.nodes == n
            and r.scenario == "dgx"
            and r.gang.startswith(f"{k}x")
            and r.policy == "topoplace"
        ]
        for r in hit:
            print(
                f"target {k}x8 on {n} nodes ({goal}): p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms, "
                f"status {r.status}, gap {'' if r.gap is None else f'{100 * r.gap:.1f} %'}, "
                f"{fmt_levels(r.used, r.lower, r.nested)}",
                file=out,
            )
    return rows


def add_arguments(ap: Any) -> None:
    """Sizes, gangs, policies, levels (the runner adds ``--runs``, default 7, and
    ``--seeds``: the first seeds the fleet, default 1)."""
    ap.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    ap.add_argument("--gangs", type=int, nargs="+", default=list(DEFAULT_GANGS))
    ap.add_argument("--policies", nargs="+", default=None)
    ap.add_argument("--required", default="", help="a required level for the DGX gangs")
    ap.add_argument("--preferred", default="", help="a preferred level for the DGX gangs")
    ap.add_argument("--mixed", action="store_true", help="also run the NVL72 + DGX scenario")


def bench(args: argparse.Namespace) -> Figures:
    """:func:`run` with the runner's flags; the rows also go to ``OUT/rows.json``."""
    from pathlib import Path

    from benchmarks.registry import parse_seeds

    seed = parse_seeds(args.seeds)[0] if args.seeds else 1
    runs = args.runs or 7
    with open(os.devnull, "w") if args.quiet else nullcontext(sys.stdout) as out:
        rows = run(args.sizes, args.gangs, runs, args.policies, args.mixed, args.required, seed,
                   out=out, preferred=args.preferred)  # fmt: skip
    Path(args.out, "rows.json").write_bytes(
        orjson.dumps([r.__dict__ for r in rows], option=orjson.OPT_INDENT_2)
    )
    return Figures(
        "Gang plan time and quality per cluster size, gang and policy",
        (
            "scenario",
            "nodes",
            "gang",
            "policy",
            "p50 ms",
            "p99 ms",
            "status",
            "gap %",
            "domains used/LB[nested]",
            "bw GB/s",
            "same placement",
        ),  # fmt: skip
        [
            (
                r.scenario,
                r.nodes,
                r.gang,
                r.policy,
                r.p50_ms,
                r.p99_ms,
                r.status,
                "" if r.gap is None else round(100 * r.gap, 1),
                fmt_levels(r.used, r.lower, r.nested) if r.ok else r.reason[:60],
                r.bandwidth,
                "yes" if r.stable else "NO",
            )  # fmt: skip
            for r in rows
        ],
        {
            "runs per case": runs,
            "fleet seed": seed,
            "required": args.required or "none",
            "preferred": args.preferred or "none",
            "solver": "CP-SAT, 1 worker, deterministic-time limit (params.gang)",
        },  # fmt: skip
    )
