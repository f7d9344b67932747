"""benchmarks/live/combine.py: one table over several live result folders."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.live import combine

COLUMNS = [
    "arm",
    "run",
    "pods_bound",
    "nodes_used",
    "whole_nodes_free",
    "pods_per_s",
    "cpu_topoplace_s",
    "cpu_kube_scheduler_s",
    "cpu_apiserver_s",
    "cpu_etcd_s",
    "same_node_as_offline",
]


def _folder(tmp: Path, name: str, rows: list[dict[str, object]]) -> Path:
    d = tmp / name
    d.mkdir()
    with (d / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})
    return d


def _run(arm: str, run: int, pps: float, cpu: tuple[float, float, float, float], same: int) -> dict:
    tp, ks, api, etcd = cpu
    return {
        "arm": arm,
        "run": run,
        "pods_bound": 1000,
        "nodes_used": 350 if arm == "topoplace" else 500,
        "whole_nodes_free": 150 if arm == "topoplace" else 0,
        "pods_per_s": pps,
        "cpu_topoplace_s": tp if arm == "topoplace" else "",
        "cpu_kube_scheduler_s": ks,
        "cpu_apiserver_s": api,
        "cpu_etcd_s": etcd,
        "same_node_as_offline": same,
    }


def test_combines_runs_of_several_folders(tmp_path: Path) -> None:
    a = _folder(
        tmp_path,
        "a",
        [
            _run("topoplace", 1, 150.0, (2.0, 4.0, 4.0, 1.0), 1000),
            _run("topoplace", 2, 120.0, (3.0, 5.0, 4.0, 1.0), 1000),
            _run("default", 1, 200.0, (0, 5.0, 4.0, 1.0), 3),
            _run("default", 2, 100.0, (0, 6.0, 4.0, 1.0), 5),
            {"arm": "offline", "run": 1, "pods_bound": 1000, "nodes_used": 350},
        ],
    )
    b = _folder(
        tmp_path,
        "b",
        [
            _run("topoplace", 1, 90.0, (3.0, 5.0, 5.0, 1.0), -1),  # not replayed offline
            _run("default", 1, 180.0, (0, 5.0, 5.0, 1.0), -1),
        ],
    )
    rows = combine.load([a, b])
    assert len(rows) == 6
    # run 1 of folder b pairs with b's default run 1, not with a's
    pairs = combine.paired(rows, "default")
    assert [(t["pods_per_s"], d["pods_per_s"]) for t, d in pairs] == [
        ("150.0", "200.0"),
        ("120.0", "100.0"),
        ("90.0", "180.0"),
    ]
    assert combine.arm_cpu_ms_per_pod(rows[0]) == pytest.approx(11.0)  # 11 s over 1,000 pods
    assert combine.arm_cpu_ms_per_pod(rows[2]) == pytest.approx(10.0)  # no topoplace column

    text = combine.report(rows, line=0.7)
    # medians: topoplace 120 (90-150); default 180 (100-200)
    assert "| topoplace | 3 | 120.0 (90.0-150.0) | 3.00 | 5.00 | 4.00 | 1.00 | 13.00 |" in text
    assert "| default | 3 | 180.0 (100.0-200.0) | - | 5.00 | 4.00 | 1.00 | 11.00 |" in text
    # ratio of medians 120/180; per-run 0.75, 1.20, 0.50 -> median 0.75; 2 of 3 at 0.7x;
    # CPU ratio: default's median of 10, 11, 11 over topoplace's of 11, 13, 14
    assert "| default | 0.67x | 0.75x (0.50-1.20) | 2 of 3 | 0.85 |" in text
    # only folder a's runs were replayed offline
    assert "live against offline (2 topoplace runs replayed offline): at least 1000" in text
    assert "nodes free: 350 / 150" in text


def test_the_bar_is_a_parameter(tmp_path: Path) -> None:
    d = _folder(
        tmp_path,
        "a",
        [
            _run("topoplace", 1, 80.0, (2.0, 4.0, 4.0, 1.0), -1),
            _run("default", 1, 100.0, (0, 5.0, 4.0, 1.0), -1),
        ],
    )
    rows = combine.load([d])
    assert "| 1 of 1 |" in combine.report(rows, line=0.8)
    assert "| 0 of 1 |" in combine.report(rows, line=0.81)
    assert "live against offline" not in combine.report(rows)


def test_refuses_what_is_not_a_result_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        combine.main([str(tmp_path)])
    assert exc.value.code == 2
    assert "no runs.csv" in capsys.readouterr().err
    (tmp_path / "runs.csv").write_text("arm,pods_per_s\ntopoplace,1\n")
    with pytest.raises(SystemExit):
        combine.main([str(tmp_path)])
    assert "no column run" in capsys.readouterr().err


def test_main_prints_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _folder(
        tmp_path,
        "a",
        [
            _run("topoplace", 1, 140.0, (2.0, 4.0, 4.0, 1.0), 1000),
            _run("default", 1, 200.0, (0, 5.0, 4.0, 1.0), 2),
        ],
    )
    assert combine.main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "| default | 0.70x | 0.70x (0.70-0.70) | 1 of 1 | 0.91 |" in out
