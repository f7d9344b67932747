"""``topoplace rightsize replay``: the fixed interface end to end, and its errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from scheduler.cli.main import main
from scheduler.core.rightsize import GiB

HEADER = "timestamp,workload,pod,container,metric,value\n"


def write(tmp_path: Path, text: str, name: str = "series.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_replay_writes_rows_in_force_from_later_timestamps(tmp_path: Path) -> None:
    lines = [HEADER.strip()]
    for i in range(180):
        t = 60 * i
        for pod in ("a-1", "a-2"):
            lines.append(f"{t},team/a,{pod},main,gpu_memory_used_bytes,{10 * GiB}")
            lines.append(f"{t},team/a,{pod},main,gpu_utilization_ratio,0.1")
    lines.append(f"{180 * 60},team/a,a-1,main,gpu_memory_used_bytes,{30 * GiB}")  # an OOM
    lines.append(f"{181 * 60},team/a,a-1,main,gpu_memory_used_bytes,{10 * GiB}")
    # rows in reverse order: the replay sorts by timestamp
    series = write(tmp_path, "\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    policy = write(
        tmp_path, "default:\n  max_memory: 60Gi\n  modes: [memory-share, exclusive]\n", "p.yaml"
    )
    out = tmp_path / "out"
    rc = main(
        ["rightsize", "replay", "--series", str(series), "--policy", str(policy), "--out", str(out)]
    )
    assert rc == 0
    with (out / "recommendations.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == [
        "timestamp",
        "workload",
        "pod",
        "container",
        "gpu_memory_limit_bytes",
        "gpu_compute_ratio",
        "mode",
    ]
    assert [(r["timestamp"], r["pod"]) for r in rows[:2]] == [("60", "a-1"), ("60", "a-2")]
    assert all(r["mode"] in ("memory-share", "exclusive") for r in rows)
    assert all(int(r["gpu_memory_limit_bytes"]) <= 60 * GiB for r in rows)
    last = [r for r in rows if r["timestamp"] == str(181 * 60)]
    assert {r["pod"] for r in last} == {"a-1", "a-2"}  # the OOM raise applies to the workload
    assert int(last[0]["gpu_memory_limit_bytes"]) >= 1.2 * 30 * GiB
    summary = (out / "summary.md").read_text()
    assert "| team/a |" in summary and "| 1 |" in summary  # one OOM raise


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        (
            "timestamp,workload,pod,metric,value\n1,w,p,gpu_memory_used_bytes,1\n",
            ":1:",
            "missing column(s) container",
        ),
        (
            HEADER + "1,w,p,c,gpu_memory_used_bytes,5\n2,w,p,c,gpu_memory_bytes,5\n",
            ":3:",
            "unknown metric 'gpu_memory_bytes'",
        ),
        (HEADER + "1,w,p,c,gpu_memory_used_bytes,lots\n", ":2:", "value 'lots' is not a number"),
        (
            HEADER + "soon,w,p,c,gpu_memory_used_bytes,1\n",
            ":2:",
            "timestamp 'soon' is not a number",
        ),
        (HEADER + "1,w,p,c,gpu_utilization_ratio,57\n", ":2:", "is not 0..1"),
        (HEADER + "1,w,p\n", ":2:", "3 fields"),
        ("", ":1:", "empty file"),
    ],
    ids=[
        "missing-column",
        "unknown-metric",
        "non-numeric",
        "bad-timestamp",
        "ratio-range",
        "short-row",
        "empty",
    ],
)
def test_bad_series_is_a_clear_error_with_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, what: str
) -> None:
    series = write(tmp_path, text)
    rc = main(["rightsize", "replay", "--series", str(series), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"topoplace: error: {series}{where}" in err and what in err
    assert not (tmp_path / "o").exists()


def test_bad_policy_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = write(tmp_path, HEADER + "1,w,p,c,gpu_memory_used_bytes,1\n")
    policy = write(tmp_path, "default:\n  modes: [warp]\n", "p.yaml")
    rc = main(
        [
            "rightsize",
            "replay",
            "--series",
            str(series),
            "--policy",
            str(policy),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 2
    assert "unknown mode(s) ['warp']" in capsys.readouterr().err


def test_timestamps_are_written_exactly(tmp_path: Path) -> None:
    t0 = 1_662_858_720.0
    lines = [HEADER.strip()]
    lines += [f"{t0 + 57 * i},w,p,c,gpu_memory_used_bytes,{GiB}" for i in range(3)]
    lines.append(f"{t0 + 171.25},w,p,c,gpu_memory_used_bytes,{GiB}")
    series = write(tmp_path, "\n".join(lines) + "\n")
    assert main(["rightsize", "replay", "--series", str(series), "--out", str(tmp_path / "o")]) == 0
    with (tmp_path / "o" / "recommendations.csv").open() as fh:
        stamps = [r["timestamp"] for r in csv.DictReader(fh)]
    assert stamps[0] == "1662858777"  # in force from the second sample
    assert set(stamps) <= {"1662858777", "1662858834", "1662858891.25"}
