"""The soak's slopes and verdicts (benchmarks/live/soak.py): the Theil-Sen slope against
hand-computed values, its resistance to outlying windows where least squares gives way,
and the drift bound on growth only (a falling latency is no drift)."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import yaml

from benchmarks.live.chaos import dra_variant_config
from benchmarks.live.kubesched import load_shipped, render_config
from benchmarks.live.soak import (
    DRIFT_MEASURES,
    IN_REFERENCE_CALLS,
    SIZE_MEASURES,
    cpu_blocks,
    drifts,
    load1,
    noise_lines,
    scheduler_config_kind,
    shuffled_slopes,
    slope_per_hour,
    theil_sen_per_hour,
    work_counts,
)


def test_theil_sen_of_a_line_is_its_slope() -> None:
    ts = [0.0, 900.0, 1800.0, 2700.0, 3600.0]
    ys = [10.0 + 3.0 * t / 3600.0 for t in ts]  # 3 per hour
    assert math.isclose(theil_sen_per_hour(ts, ys), 3.0)
    assert math.isclose(slope_per_hour(ts, ys), 3.0)


def test_theil_sen_is_the_median_of_pairwise_slopes() -> None:
    # points (0 h, 0), (1 h, 1), (2 h, 5): pair slopes 1, 2.5, 4 per hour; median 2.5
    ts = [0.0, 3600.0, 7200.0]
    ys = [0.0, 1.0, 5.0]
    assert math.isclose(theil_sen_per_hour(ts, ys), 2.5)
    # least squares: sum((t-1)(y-2)) / sum((t-1)^2) = (2 + 3) / 2 = 2.5 per hour here too
    assert math.isclose(slope_per_hour(ts, ys), 2.5)
    # four points: pair slopes 1, 1.5, 2, 2, 2.5, 3 -> median (2 + 2) / 2 = 2
    assert math.isclose(theil_sen_per_hour([0.0, 3600.0, 7200.0, 10800.0], [0, 1, 3, 6]), 2.0)


def test_outlying_windows_pull_least_squares_not_theil_sen() -> None:
    # a flat 36 ms per pod over 2 h, a window every 30 s binding one pod, with two
    # busy-host windows at 254 ms near the end (the shape of an earlier soak's CPU per
    # pod): two 5-minute blocks of ten windows rise to (9 x 36 + 254) / 10 = 57.8 ms
    ts = [30.0 * i for i in range(241)]
    ys = [36.0] * 241
    ys[200] = ys[230] = 254.0
    table = {d.measure: d for d in drifts(_rows(ts, cpu=ys), 0.0, 0.10, {})}
    blocks = cpu_blocks(_rows(ts, cpu=ys), 0.0)
    assert len(blocks) == 24
    bys = [b["cpu_ms_per_pod"] for b in blocks]
    assert sorted(bys)[-2:] == pytest.approx([57.8, 57.8]) and bys.count(36.0) == 22
    bts = [b["t_s"] for b in blocks]
    assert theil_sen_per_hour(bts, bys) == 0.0
    ols = slope_per_hour(bts, bys)
    assert ols > 1.0  # two blocks alone give the OLS fit a growth of 1+ ms/h
    cpu = table["cpu_ms_per_pod"]
    assert cpu.robust_h == 0.0 and cpu.holds
    assert math.isclose(cpu.slope_h, ols) and not cpu.ols_holds
    assert cpu.peak == pytest.approx(57.8)


def test_cpu_per_pod_is_a_ratio_of_sums_over_blocks() -> None:
    """A window's CPU includes the retries of pods bound in other windows: windows binding
    1 and 19 pods in turn at the same 300 ms each read 300 and 15.8 ms per pod; the block
    of ten reads 3,000 ms over 100 pods, 30 ms. In reference calls each window's CPU is
    over its own sample's reference first; a tail shorter than a block is left out, and so
    are the windows of the warm-up."""
    rows = []
    bound = 0.0
    for i in range(26):
        pods = 0 if i == 0 else (1 if i % 2 else 19)
        bound += pods
        rows.append(
            {
                "t_s": 30.0 * i,
                "pods_bound": bound,
                "window_s": 30.0,
                "cpu_ms_per_s": 10.0,  # 300 ms a window
                "filters": 15.0,
                "ref_cpu_ms": 0.2 if i <= 10 else 0.4,
            }
        )
    blocks = cpu_blocks(rows, 0.0)
    assert [b["t_s"] for b in blocks] == [300.0, 600.0]  # windows 21-25: 150 s, left out
    assert blocks[0]["cpu_ms_per_pod"] == pytest.approx(30.0)
    assert blocks[0]["cpu_ms_per_s"] == pytest.approx(10.0)
    assert blocks[0]["cpu_per_pod_refcalls"] == pytest.approx(150.0)  # 30 / 0.2
    assert blocks[1]["cpu_per_pod_refcalls"] == pytest.approx(75.0)  # 30 / 0.4
    assert blocks[1]["cpu_per_s_refcalls"] == pytest.approx(25.0)
    assert blocks[0]["filters_per_pod"] == pytest.approx(1.5)  # 150 filters, 100 pods
    # filters per pod is the stream's mix: reported with its slopes, never failed
    rows[15]["filters"] = 1500.0  # the second block: 16.35 a pod
    table = {d.measure: d for d in drifts(rows, 0.0, 0.10, {})}
    assert table["filters_per_pod"].bound == "reported (the stream's mix)"
    assert table["filters_per_pod"].holds and table["filters_per_pod"].peak == pytest.approx(16.35)
    # window_s, when a row has it, is the window's span (not the time between samples):
    # a 15 s first window leaves the block 15 s short, so it takes the 11th window too
    rows[1]["window_s"] = 15.0
    first = cpu_blocks(rows, 0.0)[0]
    assert first["t_s"] == 330.0 and first["cpu_ms_per_pod"] == pytest.approx(3150.0 / 101)
    # the warm-up's windows are not in any block
    assert [b["t_s"] for b in cpu_blocks(rows, 400.0)] == [690.0]


def _work_rows(calls_per_window: list[float], cpu_ms_per_s: list[float]) -> list[dict]:
    """Windows of 30 s binding 5 pods each, at a reference of 0.5 ms a call, with the
    given extender calls (and 20 watch events) and CPU rate each."""
    rows = []
    for i, (calls, rate) in enumerate(zip(calls_per_window, cpu_ms_per_s, strict=True)):
        rows.append(
            {
                "t_s": 30.0 * i,
                "pods_bound": 5.0 * i,
                "window_s": 30.0,
                "cpu_ms_per_s": rate,
                "filters": calls - 10.0,
                "calls": calls,
                "events": 20.0,
                "ref_cpu_ms": 0.5,
            }
        )
    return rows


def test_cpu_per_unit_of_work_is_judged_and_cpu_per_pod_reported_with_the_mix() -> None:
    """Over 2 h kube-scheduler asks about each pod more and more often (calls per window
    from 40 to 160) and topoplace's CPU follows the calls at the same cost per call: CPU
    per pod quadruples, CPU per unit of work is flat. The per-pod figure is reported with
    its slope, the per-work one holds. When the cost per call grows instead, it fails."""
    n = 241
    calls = [40.0 + 120.0 * i / (n - 1) for i in range(n)]
    same_cost = [(c + 20.0) * 0.5 / 30.0 * 3 for c in calls]  # 3 ref calls per unit of work
    rows = _work_rows(calls, same_cost)
    blocks = cpu_blocks(rows, 0.0)
    assert blocks[0]["calls_per_pod"] == pytest.approx(sum(calls[1:11]) / 50)
    assert blocks[0]["events_per_pod"] == pytest.approx(4.0)  # 200 events, 50 pods
    assert all(b["cpu_per_work_refcalls"] == pytest.approx(3.0) for b in blocks)
    table = {d.measure: d for d in drifts(rows, 0.0, 0.10, {})}
    per_pod = table["cpu_per_pod_refcalls"]
    assert per_pod.robust_h > 10.0 and per_pod.holds  # rising, and not the verdict
    assert (
        per_pod.bound == "reported (moves with the stream's mix: judged as cpu_per_work_refcalls)"
    )
    assert table["cpu_per_s_refcalls"].bound.startswith("reported (moves with the stream's mix")
    work = table["cpu_per_work_refcalls"]
    assert work.holds and work.robust_h == pytest.approx(0.0, abs=1e-9)
    assert table["calls_per_pod"].bound == "reported (the stream's mix)"
    # the same calls, each a little costlier every window: 3 to 4.5 ref calls a unit
    aging = [r * (1.0 + 0.5 * i / (n - 1)) for i, r in enumerate(same_cost)]
    table = {d.measure: d for d in drifts(_work_rows(calls, aging), 0.0, 0.10, {})}
    assert not table["cpu_per_work_refcalls"].holds
    assert table["cpu_per_work_refcalls"].robust_h == pytest.approx(0.75, rel=0.05)


def test_work_counts_sum_every_verb_and_every_watch_event() -> None:
    text = """\
topoplace_request_seconds_sum{verb="filter"} 0.25
topoplace_request_seconds_count{verb="filter"} 100.0
topoplace_request_seconds_sum{verb="prioritize"} 0.1
topoplace_request_seconds_count{verb="prioritize"} 40.0
topoplace_request_seconds_count{verb="bind"} 3.0
topoplace_kube_watch_events_total{resource="pods",type="ADDED"} 12.0
topoplace_kube_watch_events_total{resource="pods",type="MODIFIED"} 30.0
topoplace_kube_watch_events_total{resource="resourceclaims",type="DELETED"} 2.0
topoplace_kube_watch_restarts_total{reason="gone",resource="pods"} 5.0
"""
    assert work_counts(text) == (143.0, 44.0)
    assert work_counts("") == (0.0, 0.0)


def test_shuffled_slopes_give_the_no_trend_range_and_a_trend_lies_outside() -> None:
    ts = [300.0 * i for i in range(24)]
    noise = [100.0 + (17 * i % 11 - 5) * 3.0 for i in range(24)]  # spread, no trend
    lo, hi = shuffled_slopes(ts, noise)
    assert lo < 0.0 < hi
    assert shuffled_slopes(ts, noise) == (lo, hi)  # seeded
    trend = [y + 20.0 * t / 3600.0 for t, y in zip(ts, noise, strict=True)]
    assert theil_sen_per_hour(ts, trend) > hi
    # the range is of the values, whatever their order: a trend does not widen it much
    lo2, hi2 = shuffled_slopes(ts, trend)
    assert hi2 < theil_sen_per_hour(ts, trend)
    assert math.isnan(shuffled_slopes(ts[:2], noise[:2])[0])
    rows = _work_rows([50.0] * 241, [5.0] * 241)
    lines = noise_lines(rows, 0.0)
    assert lines[0].startswith("Noise of the block measures (24 blocks of 5 minutes)")
    assert any(
        line.startswith("- cpu_per_work_refcalls: 0/h; no trend: 0 to 0/h") for line in lines
    )


def test_theil_sen_skips_nan_and_needs_two_distinct_times() -> None:
    ts = [0.0, 1800.0, 3600.0, 5400.0]
    assert math.isclose(theil_sen_per_hour(ts, [1.0, math.nan, 3.0, 4.0]), 2.0)
    assert math.isnan(theil_sen_per_hour([0.0], [1.0]))
    assert math.isnan(theil_sen_per_hour([5.0, 5.0], [1.0, 2.0]))
    assert math.isnan(theil_sen_per_hour(ts, [math.nan] * 4))
    with pytest.raises(ValueError):
        theil_sen_per_hour([0.0, 1.0], [1.0])


def _rows(
    ts: list[float], cpu: list[float] | None = None, filt: list[float] | None = None
) -> list[dict[str, float]]:
    out = []
    for i, t in enumerate(ts):
        row = {m: 10.0 for m in (*DRIFT_MEASURES, *SIZE_MEASURES)}
        row.update(t_s=t, api_pods=20.0, load1=1.5)
        for m in ("ref_cpu_ms", "calib_ratio", *IN_REFERENCE_CALLS):
            row[m] = math.nan  # no reference: the raw CPU per pod is judged
        if cpu is not None:  # one pod bound a window, at cpu[i] ms
            row.update(pods_bound=float(i), window_s=ts[i] - ts[i - 1] if i else 0.0)
            row["cpu_ms_per_s"] = cpu[i] / row["window_s"] if i else math.nan
        if filt is not None:
            row["filter_p99_ms"] = filt[i]
        out.append(row)
    return out


def test_falling_latency_is_no_drift_rising_is() -> None:
    ts = [600.0 * i for i in range(13)]  # 2 h
    falling = [100.0 - 20.0 * i / 6 for i in range(13)]  # -20 ms/h
    rising = [100.0 + 20.0 * i / 6 for i in range(13)]  # +20 ms/h: 100 to 140 in 2 h
    down = {d.measure: d for d in drifts(_rows(ts, filt=falling), 0.0, 0.10, {})}
    up = {d.measure: d for d in drifts(_rows(ts, filt=rising), 0.0, 0.10, {})}
    assert math.isclose(down["filter_p99_ms"].robust_h, -20.0)
    assert down["filter_p99_ms"].holds and down["filter_p99_ms"].ols_holds
    assert math.isclose(up["filter_p99_ms"].robust_h, 20.0)
    assert not up["filter_p99_ms"].holds and not up["filter_p99_ms"].ols_holds
    # the bound: 10 % of the median 120 over 2 h = 6 per hour
    assert up["filter_p99_ms"].bound.startswith("growth <= 6/h (10% of median 120")
    # load1 is reported with its slopes, never judged
    assert up["load1"].holds and up["load1"].bound == "reported" and up["load1"].peak == 1.5


def test_scheduler_config_kind_tells_the_dra_variant_from_the_default() -> None:
    with tempfile.TemporaryDirectory() as d:
        default = Path(d) / "default.yaml"
        default.write_text(yaml.safe_dump(render_config(load_shipped(), "/kc", "http://x")))
        dra = Path(d) / "dra.yaml"
        dra.write_text(yaml.safe_dump(dra_variant_config("/kc", "http://x")))
        assert scheduler_config_kind(default) == "default"
        assert scheduler_config_kind(dra) == "dra"


def test_load1_reads_proc_loadavg() -> None:
    first = float(Path("/proc/loadavg").read_text().split()[0])
    assert 0.0 <= load1() < 10_000.0
    assert abs(load1() - first) < 50.0
