"""Failure-injection benchmark: topoplace's health model vs Ready-only baselines.

    python -m benchmarks.faults.run                       # defaults: 30 days, seeds 1-2, 1x and 10x
    python -m benchmarks.faults.run --days 60 --seeds 1-5 --multipliers 1 --workers 2
    topoplace bench --scenario faults --out out/faults    # the same through the bench CLI
    topoplace bench --scenario faults --out out/faults --ray local   # runs as Ray tasks

Prints the conditions, then one table per failure-rate multiplier with a row per health
policy (sums over seeds; re-placement times pooled). Optionally writes the table as
Markdown, the raw per-seed numbers as JSON and one CSV row per run (``--out``).

The (multiplier, seed, policy) runs are independent and go through :mod:`benchmarks.sweep`:
``--workers N`` local processes (default all CPUs, ``1`` inline) or ``--ray ADDRESS``. The
outputs are the same whichever executes them (nothing measured goes into them).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path

from benchmarks import sweep
from benchmarks.faults.engine import Metrics, health_policies, simulate, summarize
from benchmarks.faults.placement import greedy_gang, registry_placer
from benchmarks.faults.scenario import Scenario

COLUMNS = (
    ("policy", "policy", "{}"),
    ("bad_signalled", "placed on signalled-failed HW", "{:.0f}"),
    ("bad_signalled_node", "(node)", "{:.0f}"),
    ("bad_signalled_gpu", "(GPU)", "{:.0f}"),
    ("bad_silent", "placed before detection", "{:.0f}"),
    ("placed_on_warned", "placed on warned HW", "{:.0f}"),
    ("gang_restarts", "gang restarts", "{:.0f}"),
    ("replace_mean_min", "fail->re-place mean min", "{:.1f}"),
    ("replace_p50_min", "p50", "{:.1f}"),
    ("replace_p95_min", "p95", "{:.1f}"),
    ("replace_gpu_h", "GPU-h waiting", "{:.0f}"),
    ("lost_gpu_h", "GPU-h lost to failures", "{:.0f}"),
    ("goodput", "goodput", "{:.2%}"),
    ("completed", "jobs done", "{:.0f}"),
)


def parse_seeds(text: str) -> list[int]:
    """``"1-3"`` -> [1, 2, 3]; ``"1,5"`` -> [1, 5]."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part.strip():
            out.append(int(part))
    return out


def run_one(args: tuple[Scenario, int, str, str]) -> Metrics:
    """One run: ``(scenario, seed, health policy, gang policy or "")`` -> its metrics."""
    sc, seed, policy, gang_policy = args
    placer = (registry_placer(gang_policy) if gang_policy else None) or greedy_gang
    return simulate(sc, seed, policy, health_policies()[policy], placer)


def table(rows: Sequence[dict[str, float | str]]) -> str:
    """A Markdown table of summary rows."""
    head = "| " + " | ".join(c[1] for c in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            v = r[key]
            cells.append("n/a" if isinstance(v, float) and math.isnan(v) else fmt.format(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(
    days: float,
    seeds: Sequence[int],
    multipliers: Sequence[float],
    policies: Sequence[str],
    executor: sweep.Executor | None = None,
    gang_policy: str = "",
    flap_share: float | None = None,
) -> tuple[str, dict[str, object]]:
    """Run every (multiplier, seed, policy); returns (report text, raw results).

    ``executor`` runs the independent runs (default: inline); the outputs do not depend on it.
    """
    base = Scenario(days=days)
    if flap_share is not None:
        base = replace(base, flap_share=flap_share)
    tasks = [
        (replace(base, rate_multiplier=m), s, p, gang_policy)
        for m in multipliers
        for s in seeds
        for p in policies
    ]
    results = (executor or sweep.LocalExecutor(1)).map(run_one, tasks)
    out = ["# Failure injection: health models under published failure rates", ""]
    out += ["Conditions:", ""] + [f"- {line}" for line in base.describe()]
    out += [
        f"- seeds {','.join(map(str, seeds))}; gang placement: "
        f"{gang_policy or 'greedy place_pod per member'}; numbers are sums over seeds",
        "- policies: topoplace = every signal + history + early warning; kube-default = "
        "Ready + cordon + allocatable count; ready-only = the Ready condition alone",
        "",
    ]
    raw: dict[str, object] = {"days": days, "seeds": list(seeds), "runs": []}
    for m in multipliers:
        rows = []
        for p in policies:
            mine = [
                r
                for (sc, _s, pol, _g), r in zip(tasks, results, strict=True)
                if sc.rate_multiplier == m and pol == p
            ]
            agg = dict(summarize(mine))
            rows.append({"policy": p, **agg})
            raw["runs"] += [  # type: ignore[operator]
                {**asdict(r), "multiplier": m, "goodput": r.goodput} for r in mine
            ]
        n = rows[0]
        out += [
            f"## Failure rate x{m:g}: {n['host_outages']:.0f} host faults, "
            f"{n['gpu_node_outages']:.0f} node-level GPU faults, {n['gpu_faults']:.0f} "
            f"GPU-local faults, {n['flaps']:.0f} flaps; {n['jobs']:.0f} gangs",
            "",
            table(rows),
            "",
        ]
    return "\n".join(out), raw


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints the report. Returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.faults.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(ap)
    return run_args(ap.parse_args(argv))


def add_arguments(ap: argparse.ArgumentParser, *, bench_cli: bool = False) -> None:
    """Arguments of the scenario (``bench_cli``: only those the bench CLI lacks)."""
    ap.add_argument("--days", type=float, default=30.0, help="simulated days (default 30)")
    ap.add_argument("--multipliers", default="1,10", help="failure-rate multipliers (default 1,10)")
    ap.add_argument("--gang-policy", default="", help="registered gang policy (default greedy)")
    ap.add_argument(
        "--flap-share", type=float, default=None, help="share of flapping nodes (default 0.02)"
    )
    if not bench_cli:
        ap.add_argument("--seeds", default="1-2", help="seeds, e.g. 1-3 (default 1-2)")
        ap.add_argument("--policies", nargs="+", default=None, help="health policies")
        ap.add_argument(
            "--out", default="", help="directory for report.md, results.json and results.csv"
        )
        sweep.add_arguments(ap, jobs_alias=True)


def run_args(args: argparse.Namespace) -> int:
    """Run from parsed arguments (shared by ``main`` and the bench CLI)."""
    policies = args.policies or list(health_policies())
    unknown = set(policies) - set(health_policies())
    if unknown:
        print(f"unknown health policies: {sorted(unknown)}; known: {list(health_policies())}")
        return 2
    seeds_arg = getattr(args, "seeds", None) or "1-2"
    if getattr(args, "scenario", None) == "faults" and seeds_arg == "42-51":
        seeds_arg = "1-2"  # the bench CLI's default seed range is the FGD scenario's
    mults = [float(x) for x in str(getattr(args, "multipliers", "1,10")).split(",") if x.strip()]
    try:
        with sweep.from_args(args) as executor:
            text, raw = run(
                float(getattr(args, "days", 30.0)),
                parse_seeds(seeds_arg),
                mults,
                policies,
                executor=executor,
                gang_policy=getattr(args, "gang_policy", "") or "",
                flap_share=getattr(args, "flap_share", None),
            )
    except sweep.SweepError as exc:
        print(f"faults: {exc}")
        return 2
    print(text)
    out = getattr(args, "out", "")
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "report.md").write_text(text + "\n")
        (d / "results.json").write_text(json.dumps(raw, indent=1, default=float) + "\n")
        write_csv(d / "results.csv", raw["runs"])  # type: ignore[arg-type]
    return 0


_CSV_METRICS = tuple(f.name for f in fields(Metrics) if f.name not in ("policy", "seed"))


def write_csv(path: Path, runs: Sequence[dict[str, object]]) -> None:
    """One row per run (``raw["runs"]`` of :func:`run`): multiplier, policy, seed, the scalar
    metrics and goodput; re-placement times as count, mean, p50 and p95 in minutes (empty
    when there were none). Floats in ``repr`` form, so equal runs give equal bytes."""
    head = ["multiplier", "policy", "seed"]
    head += [k for k in _CSV_METRICS if k != "replace_times"]
    head += ["replacements", "replace_mean_min", "replace_p50_min", "replace_p95_min", "goodput"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in runs:
            m = Metrics(**{k: r[k] for k in ("policy", "seed", *_CSV_METRICS)})  # type: ignore[arg-type]
            times = m.replace_times
            stats = [
                sum(times) / len(times) / 60.0 if times else "",
                m.replace_minutes(0.5) if times else "",
                m.replace_minutes(0.95) if times else "",
            ]
            w.writerow(
                [r["multiplier"], m.policy, m.seed]
                + [getattr(m, k) for k in _CSV_METRICS if k != "replace_times"]
                + [len(times), *stats, m.goodput]
            )


if __name__ == "__main__":
    # Through the importable module, so runs sent to other processes (Ray workers) refer to
    # benchmarks.faults.run, not to __main__.
    from benchmarks.faults.run import main as _main

    raise SystemExit(_main())
