"""Failure-injection benchmark: topoplace's health model vs Ready-only baselines.

    topoplace bench faults                     # defaults: 30 days, seeds 1-2, 1x and 10x
    topoplace bench faults --days 60 --seeds 1-5 --multipliers 1 --workers 2
    topoplace bench faults --ray local         # runs as Ray tasks

Prints the conditions, then one table per failure-rate multiplier with a row per health
policy (sums over seeds; re-placement times pooled). Optionally writes the table as
Markdown, the raw per-seed numbers as JSON and one CSV row per run (``--out``).

The runs are those of the scenario file ``benchmarks/scenarios/faults.yaml`` (the defaults;
``topoplace bench benchmarks/scenarios/faults.yaml`` runs it) on the one engine (:mod:`benchmarks.engine`).
The (multiplier, seed, policy) runs are independent and go through :mod:`benchmarks.sweep`:
``--workers N`` local processes (default all CPUs, ``1`` inline) or ``--ray ADDRESS``. The
outputs are the same whichever executes them (nothing measured goes into them).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from benchmarks import sweep
from benchmarks.engine.health import health_policies
from benchmarks.engine.loop import Engine, Hook, Recovery
from benchmarks.engine.run import Context, run_scenarios
from benchmarks.engine.scenario import Scenario, parse_seeds
from benchmarks.engine.scenarios.faults.metrics import FaultStats, Metrics, summarize
from benchmarks.engine.scenarios.faults.scenario import (
    DAY,
    FAULT_KNOBS,
    WORKLOAD_KNOBS,
    node_sources,
)
from benchmarks.engine.scenarios.faults.scenario import Scenario as Knobs
from benchmarks.engine.sources import Inputs
from benchmarks.registry import Figures

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


def faults_scenario(
    base: Knobs,
    seeds: Sequence[int],
    multipliers: Sequence[float],
    policies: Sequence[str],
    gang_policy: str = "",
) -> Scenario:
    """The benchmark as a scenario (``benchmarks/scenarios/faults.yaml`` with the defaults):
    the knobs of ``base`` (those that differ from the defaults are written out), every
    (failure-rate multiplier, seed, health policy)."""
    default = Knobs()

    def changed(names: Sequence[str]) -> dict[str, Any]:
        return {k: getattr(base, k) for k in names if getattr(base, k) != getattr(default, k)}

    return Scenario(
        name="faults",
        description="failure injection at Llama 3 failure rates",
        nodes=node_sources(base),
        arrivals=({"generator": "llama3-gangs", **changed(WORKLOAD_KNOBS)},),
        faults=({"generator": "llama3", **changed(FAULT_KNOBS)},),
        gang_policy=gang_policy or "pod-by-pod",
        queue="best-effort-fifo",
        health=policies[0],
        recovery=Recovery(
            base.requeue_delay, base.crash_after, base.checkpoint_every, base.restart_overhead
        ),
        horizon=base.days * DAY,
        namespace="faults",
        sweep=(
            ("fault_rate", tuple(multipliers)),
            ("seed", tuple(seeds)),
            ("health", tuple(policies)),
        ),
        report="faults",
    )


def knobs_of(run: Scenario) -> Knobs:
    """The benchmark's knobs as ``run`` states them (rate multiplier of the generator, before
    the run's ``fault_rate``)."""
    racks = sum(int(e["nvl72"].get("racks", 0)) for e in run.nodes if "nvl72" in e)
    dgx = sum(int(e["dgx-h100"].get("count", 0)) for e in run.nodes if "dgx-h100" in e)
    gen = {k: v for e in (*run.arrivals, *run.faults) for k, v in e.items() if k != "generator"}
    if "sizes" in gen:
        gen["sizes"] = tuple((int(s), float(w)) for s, w in gen["sizes"])
    rec = run.recovery
    return Knobs(
        days=(run.horizon or 0.0) / DAY,
        racks=racks,
        dgx_nodes=dgx,
        requeue_delay=rec.requeue_delay,
        crash_after=rec.crash_after,
        checkpoint_every=rec.checkpoint_every,
        restart_overhead=rec.restart_overhead,
        **gen,
    )


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


class FaultReport:
    """The benchmark's outputs: a :class:`Metrics` per run; the conditions and one table per
    failure-rate multiplier (sums over seeds); ``report.md``, ``results.json`` and
    ``results.csv`` when an output directory is given."""

    def hooks(self, run: Scenario, inputs: Inputs) -> list[Hook]:
        """The fault accounting."""
        return [FaultStats(run.health, run.seed, inputs.jobs, inputs.faults)]

    def result(self, run: Scenario, inputs: Inputs, engine: Engine, hooks: list[Hook]) -> Metrics:
        """The run's metrics."""
        stats = hooks[0]
        assert isinstance(stats, FaultStats)
        return stats.metrics

    def write(
        self, runs: Sequence[Scenario], results: Sequence[Metrics], out: Path | None, ctx: Context
    ) -> str:
        """The report text (also written to ``out``, with the raw results)."""
        base = knobs_of(runs[0])
        seeds = list(dict.fromkeys(r.seed for r in runs))
        multipliers = list(dict.fromkeys(r.fault_rate for r in runs))
        policies = list(dict.fromkeys(r.health for r in runs))
        gp = runs[0].gang_policy
        gang = "greedy place_pod per member" if gp == "pod-by-pod" else gp
        text = ["# Failure injection: health models under published failure rates", ""]
        text += ["Conditions:", ""] + [f"- {line}" for line in base.describe()]
        text += [
            f"- seeds {','.join(map(str, seeds))}; gang placement: {gang}; numbers are sums "
            "over seeds",
            "- policies: topoplace = every signal + history + early warning; kube-default = "
            "Ready + cordon + allocatable count; ready-only = the Ready condition alone",
            "",
        ]
        raw: dict[str, Any] = {"days": base.days, "seeds": seeds, "runs": []}
        for m in multipliers:
            rows = []
            for p in policies:
                mine = [
                    r
                    for run, r in zip(runs, results, strict=True)
                    if run.fault_rate == m and run.health == p
                ]
                rows.append({"policy": p, **dict(summarize(mine))})
                raw["runs"] += [{**asdict(r), "multiplier": m, "goodput": r.goodput} for r in mine]
            raw.setdefault("summary", []).extend({"multiplier": m, **r} for r in rows)
            n = rows[0]
            text += [
                f"## Failure rate x{m:g}: {n['host_outages']:.0f} host faults, "
                f"{n['gpu_node_outages']:.0f} node-level GPU faults, {n['gpu_faults']:.0f} "
                f"GPU-local faults, {n['flaps']:.0f} flaps; {n['jobs']:.0f} gangs",
                "",
                table(rows),
                "",
            ]
        report = "\n".join(text)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "report.md").write_text(report + "\n")
            (out / "results.json").write_text(json.dumps(raw, indent=1, default=float) + "\n")
            write_csv(out / "results.csv", raw["runs"])
        return report


REPORT = FaultReport()
"""The ``faults`` report (``report: faults`` in a scenario file)."""


def run(
    days: float,
    seeds: Sequence[int],
    multipliers: Sequence[float],
    policies: Sequence[str],
    executor: sweep.Executor | None = None,
    gang_policy: str = "",
    flap_share: float | None = None,
    out: Path | None = None,
) -> str:
    """Run every (multiplier, seed, policy); returns the report text (written to ``out``
    with the raw results when given).

    ``executor`` runs the independent runs (default: inline); the outputs do not depend on it.
    """
    base = Knobs(days=days)
    if flap_share is not None:
        base = replace(base, flap_share=flap_share)
    scenario = faults_scenario(base, seeds, [float(m) for m in multipliers], policies, gang_policy)
    ex = executor or sweep.LocalExecutor(1)
    t0 = time.perf_counter()
    runs, results = run_scenarios([scenario], ex)
    return REPORT.write(runs, results, out, Context(ex.describe(), time.perf_counter() - t0))


def add_arguments(ap: Any) -> None:
    """The benchmark's own flags (the runner adds ``--out``, ``--seeds``, ``--workers``...)."""
    ap.add_argument("--days", type=float, default=30.0, help="simulated days (default 30)")
    ap.add_argument("--multipliers", default="1,10", help="failure-rate multipliers (default 1,10)")
    ap.add_argument("--policies", nargs="+", default=None, help="health policies (default all)")
    ap.add_argument("--gang-policy", default="", help="registered gang policy (default greedy)")
    ap.add_argument(
        "--flap-share", type=float, default=None, help="share of flapping nodes (default 0.02)"
    )


def figures(out: Path, conditions: dict[str, Any]) -> Figures:
    """The headline table of ``results.json``: per failure-rate multiplier and health
    policy, the report's columns (sums over seeds; re-placement times pooled)."""
    summary = json.loads((out / "results.json").read_text())["summary"]
    keys = [k for k, _, _ in COLUMNS]
    return Figures(
        "Health policies under injected faults, per failure-rate multiplier (sums over seeds)",
        ("multiplier", *(h for _, h, _ in COLUMNS)),
        [(r["multiplier"], *(r[k] for k in keys)) for r in summary],
        conditions,
        (f"Full report: {out / 'report.md'}.",),
    )


def bench(args: argparse.Namespace) -> Figures | int:
    """Run from the runner's parsed arguments (``topoplace bench faults``)."""
    policies = args.policies or list(health_policies())
    unknown = set(policies) - set(health_policies())
    if unknown:
        print(
            f"faults: unknown health policies {sorted(unknown)}; known: {list(health_policies())}"
        )
        return 2
    seeds = parse_seeds(args.seeds or "1-2")
    mults = [float(x) for x in str(args.multipliers).split(",") if x.strip()]
    out = Path(args.out)
    try:
        with sweep.from_args(args) as executor:
            text = run(
                args.days,
                seeds,
                mults,
                policies,
                executor=executor,
                gang_policy=args.gang_policy or "",
                flap_share=args.flap_share,
                out=out,
            )
    except sweep.SweepError as exc:
        print(f"faults: {exc}")
        return 2
    if not args.quiet:
        print(text)
    cond = {
        "days": args.days,
        "seeds": ",".join(map(str, seeds)),
        "failure-rate multipliers": ",".join(f"{m:g}" for m in mults),
        "cluster": "4 NVL72 racks + 64 DGX H100",
    }
    return figures(out, cond)


_CSV_METRICS = tuple(
    f.name
    for f in fields(Metrics)
    if f.name not in ("policy", "seed", "evicted", "teardown_times")  # no remediation here
)


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
