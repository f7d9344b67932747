"""The soak's pure parts (benchmarks/live/soak.py): histogram windows, slopes, the drift
table and its bounds, and the reads of a real process."""

from __future__ import annotations

import math
import os
import time

import orjson
import pytest

from benchmarks.live.kubesched import cpu_seconds
from benchmarks.live.soak import (
    DRIFT_MEASURES,
    REFERENCE_KINDS,
    SIZE_MEASURES,
    Reference,
    calibrate,
    calibration_body,
    drifts,
    flat_stores,
    gauges,
    histograms,
    parse_args,
    rss_mb,
    slope_per_hour,
    store_drifts,
    sums_counts,
    threads,
    window_mean_ms,
    window_quantile,
)

EXPOSITION = """\
# HELP topoplace_request_seconds Extender request latency by verb
# TYPE topoplace_request_seconds histogram
topoplace_request_seconds_bucket{le="0.005",verb="filter"} 90.0
topoplace_request_seconds_bucket{le="0.01",verb="filter"} 99.0
topoplace_request_seconds_bucket{le="0.05",verb="filter"} 100.0
topoplace_request_seconds_bucket{le="+Inf",verb="filter"} 100.0
topoplace_request_seconds_bucket{le="0.005",verb="bind"} 1.0
topoplace_request_seconds_bucket{le="0.01",verb="bind"} 1.0
topoplace_request_seconds_bucket{le="0.05",verb="bind"} 2.0
topoplace_request_seconds_bucket{le="+Inf",verb="bind"} 3.0
topoplace_request_seconds_sum{verb="filter"} 0.25
topoplace_request_seconds_count{verb="filter"} 100.0
topoplace_request_seconds_sum{verb="bind"} 0.09
topoplace_request_seconds_count{verb="bind"} 3.0
topoplace_parked_pods 4.0
topoplace_binds_total{result="ok"} 7.0
"""


def test_histograms_and_gauges_are_read_from_an_exposition() -> None:
    h = histograms(EXPOSITION)
    assert h["filter"] == [(0.005, 90.0), (0.01, 99.0), (0.05, 100.0), (math.inf, 100.0)]
    assert gauges(EXPOSITION) == {"topoplace_parked_pods": 4.0}


def test_window_quantile_is_over_the_window_only() -> None:
    before = histograms(EXPOSITION)["filter"]
    # the next window: 100 more requests, 10 of them slow (0.01-0.05 s)
    now = [(0.005, 180.0), (0.01, 190.0), (0.05, 200.0), (math.inf, 200.0)]
    assert window_quantile(now, before, 0.99) == 0.05
    assert window_quantile(now, before, 0.5) == 0.005
    assert math.isnan(window_quantile(before, before, 0.99))  # nothing in the window
    bind = histograms(EXPOSITION)["bind"]
    assert window_quantile(bind, [], 0.99) == math.inf  # past the last finite bound


def test_window_mean_is_over_the_window_only() -> None:
    sc = sums_counts(EXPOSITION)
    assert sc == {"filter": (0.25, 100.0), "bind": (0.09, 3.0)}
    assert math.isclose(window_mean_ms(sc["filter"], None), 2.5)
    # 50 more filter calls taking 0.5 s together: 10 ms each in that window
    assert math.isclose(window_mean_ms((0.75, 150.0), sc["filter"]), 10.0)
    assert math.isnan(window_mean_ms(sc["filter"], sc["filter"]))  # no call in the window
    assert math.isnan(window_mean_ms(None, sc["filter"]))


def test_calibration_body_is_one_fixed_request_as_kube_scheduler_sends_it() -> None:
    import orjson

    body = calibration_body(["chaos-w1", "chaos-probe", "chaos-w0"])
    assert body == calibration_body(["chaos-w0", "chaos-w1", "chaos-probe"])  # same each time
    args = orjson.loads(body)
    assert set(args) == {"Pod", "Nodes", "NodeNames"} and args["Nodes"] is None
    assert args["NodeNames"] == ["chaos-probe", "chaos-w0", "chaos-w1"]
    pod = args["Pod"]
    assert "kind" not in pod and "apiVersion" not in pod  # typed informer cache: no TypeMeta
    assert pod["spec"]["nodeName"] == "" and pod["metadata"]["uid"]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    # the probe node, idle when no fault runs, is among its pools: it is never refused
    term = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert "probe" in term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]


def test_calibrate_counts_the_cpu_of_the_server_per_call() -> None:
    """A real HTTP server in this process that spends CPU on each request: the calibration
    posts the body ``calls`` times (after one connecting call) and reports this process's
    CPU per call, which covers the server's work."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[bytes] = []

    class Burn(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.rfile.read(int(self.headers["Content-Length"])))
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.004:  # 4 ms of CPU
                pass
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Burn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/scheduler/filter"
        ms = calibrate(url, os.getpid(), b'{"Pod": {}}', 50, {})
    finally:
        server.shutdown()
    assert len(seen) == 51 and set(seen) == {b'{"Pod": {}}'}
    # the 4 ms each call burns, plus the client's and server's own, read in 10 ms ticks
    assert 3.5 <= ms < 40.0


def test_slope_per_hour() -> None:
    ts = [0.0, 1800.0, 3600.0, 5400.0]
    assert math.isclose(slope_per_hour(ts, [100.0, 101.0, 102.0, 103.0]), 2.0)
    assert math.isclose(slope_per_hour(ts, [5.0, math.nan, 5.0, 5.0]), 0.0)
    assert math.isnan(slope_per_hour([0.0], [1.0]))


def _rows(rss: list[float], decisions: list[float]) -> list[dict[str, float]]:
    out = []
    for i, (r, d) in enumerate(zip(rss, decisions, strict=True)):
        row = {m: 10.0 for m in (*DRIFT_MEASURES, *SIZE_MEASURES)}
        row.update(t_s=600.0 * i, rss_mb=r, decisions=d, api_pods=20.0)
        out.append(row)
    return out


def test_drift_bounds_hold_for_flat_and_fail_for_growing() -> None:
    args = parse_args([])
    flat = drifts(_rows([200.0] * 13, [100.0] * 13), 0.0, 0.10, {"decisions": 2048})
    by = {d.measure: d for d in flat}
    assert by["rss_mb"].holds and by["rss_mb"].start == 200.0 and by["rss_mb"].slope_h == 0.0
    assert by["decisions"].holds and by["decisions"].peak == 100.0
    # 200 MB growing 40 MB/h over 2 h: 80 MB, more than 10 % of the level
    growing = drifts(
        _rows([200.0 + 40.0 * i / 6 for i in range(13)], [100.0 + 200 * i for i in range(13)]),
        0.0,
        0.10,
        {"decisions": 2048},
    )
    by = {d.measure: d for d in growing}
    assert math.isclose(by["rss_mb"].slope_h, 40.0) and not by["rss_mb"].holds
    assert by["decisions"].peak == 2500.0 and not by["decisions"].holds
    assert args.duration == 7200 and args.fault_count == 0 and args.faults == []


def test_a_measure_missing_from_older_samples_is_not_sampled_not_failed() -> None:
    rows = _rows([200.0] * 13, [1.0] * 13)
    for r in rows:
        del r["calib_cpu_ms"]
        r["filter_mean_ms"] = math.nan
    by = {d.measure: d for d in drifts(rows, 0.0, 0.10, {})}
    for m in ("calib_cpu_ms", "filter_mean_ms"):
        assert by[m].bound == "not sampled" and by[m].holds and math.isnan(by[m].start)
    assert by["rss_mb"].holds and by["rss_mb"].bound.startswith("growth <=")


def test_warmup_samples_are_not_measured() -> None:
    rows = _rows([100.0, 150.0] + [200.0] * 11, [1.0] * 13)
    by = {d.measure: d for d in drifts(rows, 1200.0, 0.10, {})}
    assert by["rss_mb"].start == 200.0 and by["rss_mb"].slope_h == 0.0


def test_process_reads_of_this_process() -> None:
    pid = os.getpid()
    assert 10.0 < rss_mb(pid) < 100_000.0
    assert threads(pid) >= 1
    assert cpu_seconds(pid) > 0.0


def test_from_samples_recomputes_the_table_of_a_later_part(tmp_path, capsys) -> None:
    """``--from-samples`` re-reads a samples.csv and judges only the samples after
    ``--warmup``: a CPU rise confined to the first hour fails over the run and holds over
    the second hour."""
    import csv

    from benchmarks.live.soak import COLUMNS, main

    rows = []
    for i in range(240):
        t = 30.0 * i
        row = dict.fromkeys(COLUMNS, 1.0)
        row.update(t_s=t, load1=0.2, rss_mb=180.0, threads=19, fds=25)
        row.update(filter_p99_ms=7.5, bind_p99_ms=25.0)
        cpu = 8.0 + 2.0 * min(t, 3600.0) / 3600.0  # rises for an hour, then flat
        # ten pods bound a window of 30 s: cpu x 3 ms per pod
        row.update(cpu_ms_per_s=cpu, cpu_ms_per_pod=cpu * 3.0, pods_bound=10.0 * i, window_s=30.0)
        for m in ("ref_cpu_ms", "calib_ratio", "cpu_per_pod_refcalls", "cpu_per_s_refcalls"):
            row[m] = math.nan  # samples of a run without a reference
        rows.append(row)
    rows[100]["cpu_ms_per_s"] = math.nan  # a window whose CPU was not read
    path = tmp_path / "samples.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)

    def verdict(warmup: str) -> dict[str, str]:
        assert main(["--from-samples", str(path), "--warmup", warmup]) == 0
        out = capsys.readouterr().out
        cells = [line.split(" | ") for line in out.splitlines() if line.startswith("| cpu_ms")]
        return {c[0].strip("| "): c[7] for c in cells}

    assert verdict("300") == {"cpu_ms_per_pod": "NO", "cpu_ms_per_s": "NO"}
    assert verdict("3600") == {"cpu_ms_per_pod": "yes", "cpu_ms_per_s": "yes"}


def test_stores_are_held_to_their_cap_or_to_no_growth() -> None:
    """``/v1/inspect/state`` flattened; a capped store fails only over its cap, an uncapped
    one when it grows with the work (a store keeping the refusals of pods that went, as
    the parked pods' did: +25 an hour over 2 hours), not when it moves by a few around its
    level."""
    state = {
        "parked": {"refused_at": {"size": 3, "cap": 10000}},
        "cache": {"expiry": {"size": 2, "cap": None}},
    }
    assert flat_stores(state) == {"cache.expiry": (2.0, None), "parked.refused_at": (3.0, 10000.0)}
    ts = [600.0 * i for i in range(13)]  # 2 hours, a sample every 10 minutes
    noisy = [2.0, 3.0, 1.0, 4.0, 2.0, 0.0, 3.0, 2.0, 5.0, 1.0, 2.0, 3.0, 2.0]
    rows = [
        {"t_s": t, "cache.expiry": n, "parked.refused_at": 25.0 * t / 3600, "dra.picks": 7.0}
        for t, n in zip(ts, noisy, strict=True)
    ]
    caps = {"cache.expiry": None, "parked.refused_at": 10000.0, "dra.picks": None}
    by = {d.measure: d for d in store_drifts(rows, caps, 0.0, 0.10)}
    assert by["cache.expiry"].holds and by["dra.picks"].holds
    assert by["parked.refused_at"].holds  # under its cap
    caps["parked.refused_at"] = None  # the same series without a cap: growth
    by = {d.measure: d for d in store_drifts(rows, caps, 0.0, 0.10)}
    assert not by["parked.refused_at"].holds
    assert math.isclose(by["parked.refused_at"].robust_h, 25.0)
    over = [{**r, "parked.refused_at": 10001.0} for r in rows]
    by = {d.measure: d for d in store_drifts(over, {"parked.refused_at": 10000.0}, 0.0, 0.10)}
    assert not by["parked.refused_at"].holds and by["parked.refused_at"].bound == "max <= cap 10000"


def test_with_a_reference_the_calibration_is_judged_by_its_ratio() -> None:
    """The host slows both processes alike (calibration and reference +50 % over the run):
    the ratio is flat and holds, the two CPU figures are reported, not failed. The serving
    process alone growing costlier fails the ratio."""
    host = _rows([200.0] * 13, [1.0] * 13)
    for i, r in enumerate(host):
        r["calib_cpu_ms"] = 0.4 * (1 + 0.5 * i / 12)
        r["ref_cpu_ms"] = 0.36 * (1 + 0.5 * i / 12)
        r["calib_ratio"] = r["calib_cpu_ms"] / r["ref_cpu_ms"]
    by = {d.measure: d for d in drifts(host, 0.0, 0.10, {})}
    assert by["calib_ratio"].holds and abs(by["calib_ratio"].robust_h) < 1e-9
    for m in ("calib_cpu_ms", "ref_cpu_ms"):
        assert by[m].holds and by[m].bound.startswith("reported") and by[m].robust_h > 0.05
    own = _rows([200.0] * 13, [1.0] * 13)
    for i, r in enumerate(own):
        r["calib_cpu_ms"], r["ref_cpu_ms"] = 0.4 * (1 + 0.5 * i / 12), 0.36
        r["calib_ratio"] = r["calib_cpu_ms"] / r["ref_cpu_ms"]
    by = {d.measure: d for d in drifts(own, 0.0, 0.10, {})}
    assert not by["calib_ratio"].holds
    # without a reference (older samples) the calibration itself is judged
    for r in host:
        r["ref_cpu_ms"] = r["calib_ratio"] = math.nan
    by = {d.measure: d for d in drifts(host, 0.0, 0.10, {})}
    assert not by["calib_cpu_ms"].holds and by["calib_ratio"].bound == "not sampled"


def test_reference_serves_the_nodes_without_the_pods_and_is_calibrated(tmp_path) -> None:
    """A real ``topoplace serve --cluster`` of the nodes (pods and claims left out) answers
    the calibration's request with a node and costs CPU per call; stopped, it is gone."""
    import httpx

    from benchmarks.clusters import dgx_h100_nodes, make_pod
    from benchmarks.live.chaos import POOL_LABEL

    nodes = dgx_h100_nodes(2)
    for n in nodes:  # the chaos stream's pool labels: the calibration pod asks for them
        n["metadata"]["labels"][POOL_LABEL] = "work"
    pod = make_pod("held", 8, node="dgx-h100-01")
    ref = Reference([*nodes, {**pod, "kind": "Pod"}], tmp_path, None)
    try:
        kept = orjson.loads(ref.cluster_file.read_bytes())["items"]
        assert {i["kind"] for i in kept} <= set(REFERENCE_KINDS) and len(kept) == 2
        r = httpx.post(
            ref.url + "/scheduler/filter",
            content=calibration_body(ref.nodes),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 200 and len(r.json()["NodeNames"]) == 1
        ms = ref.calibrate(50)
        assert 0.0 < ms < 50.0
    finally:
        ref.stop()
    assert ref.proc.poll() is not None


def test_in_reference_calls_the_host_is_taken_out() -> None:
    """CPU per pod rises by half with the host (the reference's call costs half more at the
    same minute): the raw figure is reported, the one in reference calls is flat and
    holds; a rise the reference does not share fails in reference calls."""
    rows = _rows([200.0] * 13, [1.0] * 13)
    for i, r in enumerate(rows):
        host = 1.0 if i < 6 else 1.5
        # windows of 600 s binding 100 pods each at 30 ms a pod (times the host)
        r.update(pods_bound=100.0 * i, window_s=600.0, cpu_ms_per_s=3000.0 * host / 600.0)
        r.update(cpu_ms_per_pod=30.0 * host, ref_cpu_ms=0.2 * host, calib_cpu_ms=0.24 * host)
        r["calib_ratio"] = r["calib_cpu_ms"] / r["ref_cpu_ms"]
        for m in ("cpu_per_pod_refcalls", "cpu_per_s_refcalls", "filter_mean_refcalls"):
            del r[m]  # derived from the row
    by = {d.measure: d for d in drifts(rows, 0.0, 0.10, {})}
    assert by["cpu_ms_per_pod"].holds and by["cpu_ms_per_pod"].bound.startswith("reported")
    assert by["cpu_per_pod_refcalls"].holds and by["cpu_per_pod_refcalls"].start == 150.0
    assert by["cpu_per_pod_refcalls"].end == pytest.approx(150.0)
    for r in rows[6:]:
        r["ref_cpu_ms"] = 0.2  # the reference did not slow: topoplace's own cost rose
    by = {d.measure: d for d in drifts(rows, 0.0, 0.10, {})}
    assert not by["cpu_per_pod_refcalls"].holds
    assert by["cpu_per_pod_refcalls"].end == pytest.approx(225.0)


def test_summary_gives_each_kinds_bind_wait() -> None:
    """The summary's line of waits: p50 / p99 / longest per kind that had a job bound (a
    gang that waited 28 minutes behind small jobs shows as its longest)."""
    from types import SimpleNamespace

    from benchmarks.live import chaos
    from benchmarks.live.soak import markdown

    result = chaos.Result(seed=1, duration=7200.0, settle_bound=180.0)
    result.waits = {"whole": [2.0, 3.0, 4.0], "gang": [5.0, 1680.0]}
    sampler = SimpleNamespace(rows=[], errors=0)
    md = markdown([], result, sampler, parse_args([]), "v1.36.2", "python -m ...")  # type: ignore[arg-type]
    (line,) = [x for x in md.splitlines() if x.startswith("Wait from a job's creation")]
    assert "whole 3.0/4.0/4.0 s" in line and "gang 5.0/1680.0/1680.0 s" in line
    assert "share" not in line
