"""live-fractional reports the host's load average each arm ran under (no cluster needed:
the sampler and the report alone)."""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

from benchmarks.live import fractional as frac


def test_load_sampler_samples_while_the_arm_runs() -> None:
    with frac.LoadSampler(every_s=0.01) as load:
        time.sleep(0.1)
    assert len(load.samples) >= 3  # the first, some during, the last at exit
    got = load.figures("default_")
    assert set(got) == {"default_load_min", "default_load_mean", "default_load_max"}
    assert 0 <= got["default_load_min"] <= got["default_load_mean"] <= got["default_load_max"]
    now = os.getloadavg()[0]
    assert got["default_load_max"] <= max(now, *load.samples) + 1e-9
    n = len(load.samples)
    time.sleep(0.05)
    assert len(load.samples) == n  # stopped at exit


def _row(run: int, load: float, default_load: float) -> dict[str, object]:
    row: dict[str, object] = {k: 1.0 for k in frac.FIELDS}
    row.update(
        run=run,
        pods_per_s_sched=40.0,
        default_bound=10,
        default_pods_per_s=50.0,
        over_default=0.8,
        load_min=load - 1,
        load_mean=load,
        load_max=load + 1,
        default_load_min=default_load - 1,
        default_load_mean=default_load,
        default_load_max=default_load + 1,
    )
    return row


def test_report_carries_each_arms_load(tmp_path: Path) -> None:
    args = argparse.Namespace(
        backend="hami", nodes=300, workload="default", fill=0.9, runs=2, topoplace_src=None
    )
    work = [frac.Task("a00000-x", 1, 500), frac.Task("a00001-y", 2, 1000)]
    off = {"bound": 2, "nodes_used": 1, "gpus_used": 3, "gpus_untouched": 0,
           "allocation": 0.5, "overcommitted_gpus": 0}  # fmt: skip
    frac.write(tmp_path, args, work, {}, [_row(1, 3.5, 4.25), _row(2, 6.0, 2.0)], off)
    summary = (tmp_path / "summary.md").read_text()
    assert "load average" in summary
    assert "topoplace 3.5, 6.0; default-scheduler 4.2, 2.0" in summary
    with open(tmp_path / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["load_mean"]) for r in rows] == [3.5, 6.0]
    assert [float(r["default_load_max"]) for r in rows] == [5.25, 3.0]
