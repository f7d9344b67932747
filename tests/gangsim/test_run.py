"""The scenario's command line end to end on a tiny configuration (outputs written)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.engine.locality import POLLUX_DIR
from benchmarks.engine.scenarios.gangs.workload import HELIOS_SUMMARY
from benchmarks.registry import main as bench

pytestmark = pytest.mark.skipif(
    not (HELIOS_SUMMARY.exists() and POLLUX_DIR.exists()),
    reason="../shared/data (helios, pollux-placement-throughput) is not present",
)


def test_main_writes_csv_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "gangs"
    args = ["--clusters", "nvl72", "--nvl72-racks", "2", "--policies", "topoplace,first-fit",
            "--seeds", "1", "--jobs", "15", "--workers", "1", "--check", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert bench(["gangs", *args]) == 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {(r["policy"], r["queue"]) for r in rows} == {
        (p, q) for p in ("topoplace", "first-fit") for q in ("best-effort-fifo", "strict-fifo")
    }
    assert all(r["placed"] == "15.0" and int(r["invariant_checks"]) > 0 for r in rows)
    text = (out / "report.md").read_text()
    assert "## nvl72, BestEffortFIFO (backfill on)" in text
    assert "solver_time_limit_seconds = 0.25" in text
    for png in ("locality.png", "wait.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Deterministic: a second run gives the same raw results except wall time.
    out2 = tmp_path / "again"
    assert bench(["gangs", *args[:-1], str(out2)]) == 0
    rows2 = list(csv.DictReader((out2 / "results.csv").open()))
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in rows2]


def test_unknown_policy_is_rejected(tmp_path: Path) -> None:
    assert bench(["gangs", "--policies", "nope", "--out", str(tmp_path)]) == 2
