"""Outputs of the gang scenario: raw CSV, Markdown tables, PNG plots (matplotlib Agg).

* ``results.csv``: one row per (cluster, queue, policy, seed) with every metric of
  :func:`benchmarks.engine.scenarios.gangs.metrics.summarize` and the solver parameters (the raw results).
* ``gangs.csv.gz`` (optional): one row per gang and run (for other analyses).
* ``report.md``: the conditions, then per cluster and queueing mode a locality table and a
  time/allocation table, each cell ``mean [min, max]`` over seeds; metric definitions.
* ``locality.png``: per cluster and queueing mode, the share of gangs by the fabric tier of
  their ring bottleneck, and the mean number of domains above the lower bound.
* ``wait.png``: per cluster and queueing mode, the distribution (ECDF) of queueing delay
  per policy, gangs of all seeds pooled.
"""

from __future__ import annotations

import csv
import gzip
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.engine.scenarios.gangs.metrics import RunResult
from topology.fabric import Fabric

QUEUES = {True: "best-effort-fifo", False: "strict-fifo"}
"""Queueing mode names (Kueue ``queueingStrategy``) by ``backfill``."""
QUEUE_TITLES = {
    "best-effort-fifo": "BestEffortFIFO (backfill on)",
    "strict-fifo": "StrictFIFO (backfill off)",
}
LOCAL_NAMES = {"nvl72": "racks", "h100": "leaves"}
COLORS = {
    "topoplace": "#d62728",
    "greedy-topology": "#ff9896",
    "kai-binpack": "#1f77b4",
    "kueue-bestfit": "#2ca02c",
    "kueue-balanced": "#98df8a",
    "first-fit": "#7f7f7f",
}

Agg = dict[tuple[str, str, str], dict[str, tuple[float, float, float]]]


def csv_rows(
    summaries: Sequence[tuple[RunResult, Mapping[str, float]]],
    local_levels: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Flat rows for ``results.csv`` (sorted by cluster, queue, policy, seed)."""
    rows = []
    for run, m in summaries:
        row: dict[str, Any] = {
            "cluster": run.cluster,
            "queue": QUEUES[run.backfill],
            "policy": run.policy,
            "seed": run.seed,
            "local_level": local_levels.get(run.cluster, ""),
        }
        row.update({k: _num(v) for k, v in m.items()})
        row.update({f"param_{k}": v for k, v in sorted(run.params.items())})
        row["statuses"] = ";".join(f"{k}={v}" for k, v in run.statuses.items())
        row["invariant_checks"] = run.checks
        rows.append(row)
    rows.sort(key=lambda r: (r["cluster"], r["queue"], r["policy"], r["seed"]))
    return rows


def _num(v: float) -> float | str:
    if isinstance(v, float) and math.isnan(v):
        return ""
    return round(v, 6) if isinstance(v, float) else v


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write rows (union of keys, first-seen order) as CSV."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def write_gangs(path: Path, runs: Iterable[RunResult]) -> None:
    """One gzip CSV row per gang and run."""
    with gzip.open(path, "wt", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["cluster", "queue", "policy", "seed", "gang", "gpus", "constraint", "arrive_s",
             "start_s", "finish_s", "duration_s", "slowdown", "islands", "nodes",
             "bandwidth_gbps", "status"]
        )  # fmt: skip
        for r in runs:
            for o in r.outcomes:
                j = o.job
                w.writerow(
                    [r.cluster, QUEUES[r.backfill], r.policy, r.seed, j.name, j.gpus,
                     j.constraint, f"{j.arrive:.3f}", f"{o.start:.3f}", f"{o.finish:.3f}",
                     f"{j.duration:.3f}", f"{o.slowdown:.4f}", o.islands,
                     o.domains.get("node", 0), o.bandwidth_gbps, o.status]
                )  # fmt: skip


def aggregate(rows: Sequence[Mapping[str, Any]]) -> Agg:
    """(cluster, queue, policy) -> metric -> (mean, min, max) over seeds."""
    acc: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in rows:
        key = (str(r["cluster"]), str(r["queue"]), str(r["policy"]))
        d = acc.setdefault(key, {})
        for k, v in r.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                d.setdefault(k, []).append(float(v))
    return {
        key: {k: (float(np.mean(v)), float(np.min(v)), float(np.max(v))) for k, v in d.items()}
        for key, d in acc.items()
    }


def cell(v: tuple[float, float, float] | None, fmt: str = "{:.2f}", pct: bool = False) -> str:
    """``mean [min, max]`` (one value when they coincide)."""
    if v is None or any(math.isnan(x) for x in v):
        return "n/a"
    f = (lambda x: f"{x:.1%}") if pct else (lambda x: fmt.format(x))
    mean, lo, hi = v
    if f(lo) == f(hi):
        return f(mean)
    return f"{f(mean)} [{f(lo)}, {f(hi)}]"


def tables(agg: Agg, cluster: str, queue: str, policies: Sequence[str]) -> list[str]:
    """The locality table and the time/allocation table of one cluster and queue."""
    local = LOCAL_NAMES.get(cluster, "domains")
    out = [
        f"**Locality** ({local} = the cluster's NVLink / scalable-unit domain; "
        "lower bound = fewest domains whose free capacity covers the gang at placement)",
        "",
        f"| policy | {local} used mean | {local} p95 | {local} lower bound | excess over bound | "
        "spines used | nodes used | at bound (all levels) | > 1 NVLink domain | "
        "coll. BW mean GB/s | coll. BW p5 GB/s | slowdown mean |",
        "|---|" + "---|" * 11,
    ]
    for p in policies:
        m = agg.get((cluster, queue, p))
        if m is None:
            continue
        out.append(
            f"| {p} | {cell(m.get('dom_local_mean'), '{:.3f}')} | "
            f"{cell(m.get('dom_local_p95'), '{:.0f}')} | {cell(m.get('lb_local_mean'), '{:.3f}')} "
            f"| {cell(m.get('excess_local_mean'), '{:.3f}')} | "
            f"{cell(m.get('dom_spine_mean'), '{:.3f}')} | {cell(m.get('dom_node_mean'), '{:.2f}')}"
            f" | {cell(m.get('at_lb_share'), pct=True)} | {cell(m.get('spread_share'), pct=True)}"
            f" | {cell(m.get('bw_mean_gbps'), '{:.0f}')} | {cell(m.get('bw_p5_gbps'), '{:.1f}')}"
            f" | {cell(m.get('slowdown_mean'), '{:.3f}')} |"
        )
    out += [
        "",
        "**Time and allocation** (JCT = queueing + duration x slowdown; allocation = "
        "time-averaged allocated GPUs / cluster GPUs over the arrival window)",
        "",
        "| policy | wait mean min | wait p95 min | wait GPU-weighted min | JCT mean h | JCT p95 h "
        "| GPU allocation | useful allocation | makespan h | refusals | policy calls | "
        "CP-SAT fallbacks | run wall s |",
        "|---|" + "---|" * 12,
    ]
    for p in policies:
        m = agg.get((cluster, queue, p))
        if m is None:
            continue
        out.append(
            f"| {p} | {cell(m.get('wait_mean_min'), '{:.1f}')} | "
            f"{cell(m.get('wait_p95_min'), '{:.1f}')} | "
            f"{cell(m.get('wait_gpu_mean_min'), '{:.1f}')} | {cell(m.get('jct_mean_h'), '{:.2f}')} | "
            f"{cell(m.get('jct_p95_h'), '{:.2f}')} | {cell(m.get('alloc'), pct=True)} | "
            f"{cell(m.get('alloc_useful'), pct=True)} | "
            f"{cell(m.get('makespan_h'), '{:.1f}')} | {cell(m.get('refusals'), '{:.0f}')} | "
            f"{cell(m.get('calls'), '{:.0f}')} | {cell(m.get('fallbacks'), '{:.0f}')} | "
            f"{cell(m.get('wall_s'), '{:.1f}')} |"
        )
    return out


PAIRED = (
    ("wait_mean_min", "wait mean min", "{:+.1f}", True),
    ("wait_gpu_mean_min", "wait GPU-weighted min", "{:+.1f}", True),
    ("jct_mean_h", "JCT mean h", "{:+.3f}", True),
    ("slowdown_mean", "slowdown mean", "{:+.3f}", True),
    ("alloc_useful", "useful allocation", "{:+.1%}", False),
    ("makespan_h", "makespan h", "{:+.1f}", True),
)


def paired(
    rows: Sequence[Mapping[str, Any]],
    cluster: str,
    queue: str,
    policies: Sequence[str],
    ref: str = "topoplace",
) -> list[str]:
    """Per baseline: mean over seeds of (baseline - ``ref``) on the same workload, and the
    seeds where ``ref`` is better (lower, or higher for allocation)."""
    by = {
        (str(r["policy"]), int(r["seed"])): r
        for r in rows
        if r["cluster"] == cluster and r["queue"] == queue
    }
    seeds = sorted({s for (p, s) in by if p == ref})
    if not seeds or len(policies) < 2:
        return []
    out = [
        f"**Paired with {ref}** (same workload per seed: mean over seeds of baseline - {ref};"
        f" in brackets the seeds, of {len(seeds)}, where {ref} is better)",
        "",
        "| baseline | " + " | ".join(c[1] for c in PAIRED) + " |",
        "|---|" + "---|" * len(PAIRED),
    ]
    for p in policies:
        if p == ref or not all((p, s) in by for s in seeds):
            continue
        cells = []
        for key, _, fmt, lower_better in PAIRED:
            diffs = []
            for s in seeds:
                a, b = by[(p, s)].get(key), by[(ref, s)].get(key)
                if isinstance(a, int | float) and isinstance(b, int | float):
                    diffs.append(float(a) - float(b))
            if not diffs:
                cells.append("n/a")
                continue
            wins = sum(1 for d in diffs if (d > 1e-12 if lower_better else d < -1e-12))
            cells.append(f"{fmt.format(float(np.mean(diffs)))} ({wins})")
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    return out


DEFINITIONS = [
    "## Metric definitions",
    "",
    "- *domains used*: distinct domains of a level holding the gang's members; *lower bound*:"
    " the policy's exact bound at placement time (fewest domains of that level whose free "
    "capacity covers the gang, within the required domain if any; "
    "`scheduler.core.policies.common.lower_bounds`); *excess* = used - bound, averaged over "
    "gangs; *at bound* = share of gangs at the bound on every level.",
    "- *> 1 NVLink domain*: share of gangs spread over several NVLink domains (several racks"
    " on NVL72; several nodes on H100), i.e. whose all-reduce leaves NVLink.",
    "- *coll. BW*: ring all-reduce bottleneck of the placement, GB/s per GPU and direction "
    "(`topology.fabric.Fabric.collective_bandwidth`: NVLink inside a domain, else the lowest "
    "common tier: leaf 50, spine 25, core 12.5); mean and 5th percentile over gangs.",
    "- *slowdown*: the locality model's factor on the gang's duration (see above).",
    "- *wait*: start - arrival (mean and p95 over gangs; *GPU-weighted*: weighted by the "
    "gang's GPUs, i.e. the GPU-hours waited per GPU requested); *JCT*: departure - arrival.",
    "- *GPU allocation*: integral of allocated GPUs over [0, last arrival] / (GPUs x last "
    "arrival): includes the initial ramp-up, the same for every policy. *Useful allocation*: "
    "the same with each gang's GPUs divided by its slowdown (the packed-equivalent work the "
    "allocated GPUs delivered; a spread gang holds its GPUs longer for the same work).",
    "- *makespan*: last departure; *refusals*: policy calls that returned no placement although"
    " the free GPUs could hold the gang (attempts that cannot succeed are filtered before the"
    " call); *CP-SAT fallbacks*: CP-SAT returned no solution in its limit and the greedy "
    "placement was used.",
    "- Cells: mean over seeds, [min, max] over seeds when they differ.",
]


def _tier(o: Any, fabric: Fabric) -> str:
    if o.islands <= 1:
        return "one NVLink domain"
    for lv in fabric.levels:
        if lv.name in ("nvlink-domain", "accelerator"):
            continue
        if abs(o.bandwidth_gbps - lv.bandwidth_gbps) < 1e-9:
            return lv.name
    return "other"


TIERS = ("one NVLink domain", "leaf", "spine", "core", "zone", "other")
TIER_COLORS = ("#2ca02c", "#bcbd22", "#ff7f0e", "#d62728", "#8c564b", "#7f7f7f")


def plot_locality(
    runs: Sequence[RunResult],
    policies: Sequence[str],
    combos: Sequence[tuple[str, str]],
    fabric: Fabric,
    path: Path,
) -> None:
    """Bottleneck tier shares and excess domains per policy (one row per cluster x queue)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(combos), 2, figsize=(12, 3.0 * len(combos) + 0.6), squeeze=False)
    for row, (cl, q) in enumerate(combos):
        mine = {p: [r for r in runs if r.cluster == cl and QUEUES[r.backfill] == q and
                    r.policy == p] for p in policies}  # fmt: skip
        ax = axes[row][0]
        bottom = np.zeros(len(policies))
        for tier, color in zip(TIERS, TIER_COLORS, strict=True):
            share = []
            for p in policies:
                outs = [o for r in mine[p] for o in r.outcomes if o.placed]
                share.append(
                    sum(1 for o in outs if _tier(o, fabric) == tier) / len(outs) if outs else 0.0
                )
            vals = np.array(share)
            if vals.any():
                ax.bar(range(len(policies)), vals, bottom=bottom, color=color, label=tier)
            bottom += vals
        ax.set_xticks(range(len(policies)), policies, rotation=20, fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of gangs")
        ax.set_title(f"{cl}, {q}: ring bottleneck tier", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        ax = axes[row][1]
        local = LOCAL_NAMES.get(cl, "domains")
        width = 0.35
        for k, (alias, label) in enumerate((("local", local), ("spine", "spines"))):
            excess: list[float] = []
            for p in policies:
                outs = [o for r in mine[p] for o in r.outcomes if o.placed]
                lv = _level_of(alias, outs)
                ex = [
                    o.domains.get(lv, 0) - o.lower_bound[lv]
                    for o in outs
                    if o.lower_bound.get(lv, -1) >= 0
                ]
                excess.append(float(np.mean(ex)) if ex else 0.0)
            ax.bar(np.arange(len(policies)) + (k - 0.5) * width, excess, width, label=label)
        ax.set_xticks(range(len(policies)), policies, rotation=20, fontsize=8)
        ax.set_ylabel("mean domains above lower bound")
        ax.set_title(f"{cl}, {q}: domains spanned beyond the bound", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _level_of(alias: str, outs: Sequence[Any]) -> str:
    if alias != "local":
        return alias
    for o in outs:
        if "nvlink-domain" in o.lower_bound:
            return "nvlink-domain"
    return "leaf"


def plot_wait(
    runs: Sequence[RunResult],
    policies: Sequence[str],
    combos: Sequence[tuple[str, str]],
    path: Path,
) -> None:
    """ECDF of queueing delay per policy (one panel per cluster x queue)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2 if len(combos) > 1 else 1
    nrows = math.ceil(len(combos) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 3.6 * nrows), squeeze=False)
    for k, (cl, q) in enumerate(combos):
        ax = axes[k // cols][k % cols]
        for p in policies:
            waits = sorted(
                o.wait / 3600.0
                for r in runs
                if r.cluster == cl and QUEUES[r.backfill] == q and r.policy == p
                for o in r.outcomes
                if o.placed
            )
            if not waits:
                continue
            y = np.arange(1, len(waits) + 1) / len(waits)
            ax.step(waits, y, where="post", label=p, color=COLORS.get(p), lw=1.3)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(left=0)
        ax.set_xlabel("queueing delay (h, symlog)")
        ax.set_ylabel("share of gangs")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
        ax.set_title(f"{cl}, {q}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    for k in range(len(combos), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def render(
    title: str,
    conditions: Sequence[str],
    locality_table: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    combos: Sequence[tuple[str, str]],
    policies: Sequence[str],
    plots: Sequence[str],
) -> str:
    """The Markdown report."""
    out = [f"# {title}", "", "## Conditions", ""]
    out += [f"- {c}" for c in conditions]
    out += ["", "### Locality model (Pollux measurements)", ""]
    out += list(locality_table)
    agg = aggregate(rows)
    for cl, q in combos:
        out += ["", f"## {cl}, {QUEUE_TITLES.get(q, q)}", ""]
        out += tables(agg, cl, q, policies)
        pair = paired(rows, cl, q, policies)
        if pair:
            out += [""] + pair
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{p}]({p})" for p in plots]
    out += [""] + DEFINITIONS
    return "\n".join(out) + "\n"
