"""Head-to-head of two sharing policies from a reproduction's ``results.csv``.

Markdown: per workload the mean allocation ratio at 130 % arrived demand of both
policies over the seeds they share, the difference in percentage points, on how many seeds
the policy beats the baseline, and the mean run time; then every run's time per
(workload, policy, seed).

``topoplace bench fgd-openb --compare fgd topoplace-share`` appends it to a run's report
(``--render-only --out DIR`` with ``--compare``: from an earlier run's ``results.csv``).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.engine.scenarios.fgd.report import read_results_csv


def compare(path: Path, baseline: str, policy: str) -> str:
    """The Markdown tables (see the module docstring).

    Raises:
        ValueError: a policy has no runs in ``path``.
    """
    runs = read_results_csv(path)
    by = {(r.workload, r.policy, r.seed): r for r in runs}
    for p in (baseline, policy):
        if not any(r.policy == p for r in runs):
            raise ValueError(f"no runs of {p!r} in {path}")
    workloads = list(dict.fromkeys(r.workload for r in runs))
    out = [
        f"| workload | {baseline} | {policy} | Δ pp | seeds won | seeds | "
        f"s/run {baseline} | s/run {policy} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    wins = 0
    worst = float("inf")
    for wl in workloads:
        seeds = sorted(s for (w, p, s) in by if w == wl and p == policy and (wl, baseline, s) in by)
        if not seeds:
            continue
        a = [by[(wl, baseline, s)] for s in seeds]
        b = [by[(wl, policy, s)] for s in seeds]
        ma = sum(r.alloc_pct_at_130 for r in a) / len(a)
        mb = sum(r.alloc_pct_at_130 for r in b) / len(b)
        won = sum(y.alloc_pct_at_130 > x.alloc_pct_at_130 for x, y in zip(a, b, strict=True))
        wins += mb > ma
        worst = min(worst, mb - ma)
        out.append(
            f"| {wl} | {ma:.2f} | {mb:.2f} | {mb - ma:+.2f} | {won} | {len(seeds)} | "
            f"{sum(r.seconds for r in a) / len(a):.1f} | {sum(r.seconds for r in b) / len(b):.1f} |"
        )
    out += [
        "",
        f"{policy} beats {baseline} on {wins} of {len(workloads)} workloads (10-seed means); "
        f"worst difference {worst:+.2f} pp.",
        "",
        "Run time per (workload, policy, seed), seconds:",
        "",
        "| workload | policy | "
        + " | ".join(str(s) for s in sorted({r.seed for r in runs}))
        + " |",
        "|---|---|" + "---|" * len({r.seed for r in runs}),
    ]
    seeds_all = sorted({r.seed for r in runs})
    for wl in workloads:
        for p in (baseline, policy):
            cells = [
                f"{by[(wl, p, s)].seconds:.1f}" if (wl, p, s) in by else "–" for s in seeds_all
            ]
            out.append(f"| {wl} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(out)
