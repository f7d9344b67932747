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


def _report(out: Path, rows: list[dict[str, object]]) -> tuple[str, list[dict[str, str]]]:
    """The report of two tasks' runs ``rows``: (summary.md, runs.csv rows)."""
    args = argparse.Namespace(
        backend="hami", nodes=300, workload="default", fill=0.9, runs=2, topoplace_src=None
    )
    work = [frac.Task("a00000-x", 1, 500), frac.Task("a00001-y", 2, 1000)]
    off = {"bound": 2, "nodes_used": 1, "gpus_used": 3, "gpus_untouched": 0,
           "allocation": 0.5, "overcommitted_gpus": 0}  # fmt: skip
    frac.write(out, args, work, {}, rows, off)
    with open(out / "runs.csv") as f:
        return (out / "summary.md").read_text(), list(csv.DictReader(f))


def test_report_carries_each_arms_load(tmp_path: Path) -> None:
    summary, rows = _report(tmp_path, [_row(1, 3.5, 4.25), _row(2, 6.0, 2.0)])
    assert "load average" in summary
    assert "topoplace 3.5, 6.0; default-scheduler 4.2, 2.0" in summary
    assert [float(r["load_mean"]) for r in rows] == [3.5, 6.0]
    assert [float(r["default_load_max"]) for r in rows] == [5.25, 3.0]


def test_host_cost_counts_the_cpu_of_real_processes_and_the_api_writes() -> None:
    """A real child process burns CPU inside the block, another idles: the meter tells
    them apart, counts the child started inside from 0, and turns the API server's
    counters (recorded text of ``apiserver_request_total``) into writes per pod."""
    import subprocess
    import sys

    texts = iter(
        [
            'apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 5\n'
            'apiserver_request_total{code="200",resource="nodes",verb="PATCH"} 1\n',
            'apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 15\n'
            'apiserver_request_total{code="200",resource="nodes",verb="PATCH"} 6\n'
            'apiserver_request_total{code="200",resource="nodes",verb="GET"} 40\n'
            'apiserver_request_total{code="200",resource="pods",verb="LIST"} 7\n'
            'apiserver_request_total{code="201",resource="events",verb="POST"} 10\n',
        ]
    )
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy: list[subprocess.Popen[bytes]] = []
    try:
        time.sleep(0.3)  # the idle one's start-up, before the block
        cost = frac.HostCost(
            {"idle": lambda: idle.pid, "busy": lambda: busy[0].pid if busy else None},
            lambda: next(texts),
        )
        with cost:
            # started inside the block, as kube-scheduler is: counted from 0
            busy.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.4: pass\ntime.sleep(30)",
                    ]  # fmt: skip
                )
            )
            time.sleep(1.2)
        got = cost.figures(10)
    finally:
        for proc in (idle, *busy):
            proc.kill()
            proc.wait()
    assert got["cpu_ms_idle"] < 5.0
    assert 400.0 / 10 <= got["cpu_ms_busy"] <= 700.0 / 10  # its start-up and the 0.4 s
    assert got["cpu_ms_total"] == got["cpu_ms_idle"] + got["cpu_ms_busy"]
    assert got["writes_per_pod"] == (10 + 5 + 10) / 10  # bindings, node patches, events
    assert got["node_writes_per_pod"] == 5 / 10


def test_host_cost_reads_a_process_running_through_the_block() -> None:
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
         "while time.process_time() - t < 0.3: pass\nsys.stdin.readline()"],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    assert child.stdin is not None
    try:
        cost = frac.HostCost({"child": lambda: child.pid})
        time.sleep(0.3)  # its start-up, outside the block
        with cost:
            child.stdin.write(b"\n")
            child.stdin.flush()
            time.sleep(1.0)  # it burns 0.3 s of CPU, then waits
        got = cost.figures(3)
    finally:
        child.kill()
        child.wait()
    assert 250.0 / 3 <= got["cpu_ms_child"] <= 600.0 / 3
    assert "writes_per_pod" not in got  # no API server metrics were read


def test_report_shows_each_arms_host_cost(tmp_path: Path) -> None:
    rows = []
    for run, api_ms in ((1, 4.0), (2, 5.0)):
        row = _row(run, 1.0, 1.0)
        for part in frac.COST_PARTS:
            row[f"cpu_ms_{part}"] = api_ms if part == "apiserver" else 1.0
            if part != "topoplace":
                row[f"default_cpu_ms_{part}"] = 0.5
        row.update(writes_per_pod=2.5, node_writes_per_pod=0.5)
        row.update(default_writes_per_pod=2.0, default_node_writes_per_pod=0.0)
        rows.append(row)
    summary, got = _report(tmp_path, rows)
    assert "| topoplace | 4.50 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 2.50 | 0.50 |" in summary
    assert "| default-scheduler | 0.50 | 0.50 | 0.50 | - | 0.50 | 0.50 | 2.00 | 0.00 |" in summary
    assert [float(r["cpu_ms_apiserver"]) for r in got] == [4.0, 5.0]
    assert [float(r["default_node_writes_per_pod"]) for r in got] == [0.0, 0.0]
