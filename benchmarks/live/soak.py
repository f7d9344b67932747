"""Soak: the chaos runner's stream of work at a steady load, no faults, for hours; does
anything in topoplace drift or pile up?

    python -m benchmarks.live.soak --kube-bin ~/kube-bin-1.36 --seed 1 --duration 7200 \\
        --out out/live-soak

and, with no run, the drift table of a part of a finished one (samples after ``--warmup``)::

    python -m benchmarks.live.soak --from-samples benchmarks/results/live-soak.samples.csv \\
        --warmup 3600

The plane, the nodes and the work are :mod:`benchmarks.live.chaos`'s (whole-GPU pods,
gangs with and without a leaf constraint, HAMi shares, DRA claim pods gated and ungated,
three priorities, completions), with no fault injected; the invariants are checked all
along as in a chaos run, and the settle and ledger comparison close it. With DRA nodes
(``--dra-nodes``, default 2) kube-scheduler runs the shipped DRA variant
(``config/deploy/dra/scheduler-config-dra.yaml``: no ``managedResources``, so claim pods
reach topoplace), as the chaos runs do; the report names the configuration kube-scheduler
was given (read back from the file it was started with). Every ``--sample`` seconds a
sampler records, of the ``topoplace serve`` process:

* ``rss_mb``: resident memory (``VmRSS`` of ``/proc/PID/status``), ``threads`` and
  ``fds`` (``/proc/PID/fd`` entries);
* ``filter_p99_ms`` / ``bind_p99_ms``: the p99 of the requests of that window, from the
  deltas of the ``topoplace_request_seconds`` histogram of ``/metrics`` (the upper bound
  of the bucket holding the 99th percentile: bucket resolution, not interpolated);
* ``cpu_ms_per_pod``: CPU seconds (``utime + stime`` of ``/proc/PID/stat``) of the window
  over the pods the window saw bound (every pod of a job counts once, when its job is
  bound), in milliseconds. The window runs from the end of the previous sample's reads to
  the start of this one's, so the CPU topoplace spends answering the sampler is not in it:
  that is ``sampler_cpu_ms`` (CPU across this sample's reads of ``/metrics`` and the four
  inspect endpoints, reported with its slope, so a read that grows costlier shows there);
  ``cpu_ms_per_s`` is the same window's CPU over its seconds (``window_s``; the whole
  rate, background included: watches, the Lease, the waker). Both are ratios of sums and
  are judged over 5-minute blocks of windows (:func:`cpu_blocks`, :data:`BLOCK_S`): a
  pod's CPU (its filters, kube-scheduler's retries while it waits, up to 5 minutes apart)
  falls in other windows than the one it binds in, so a single window's ratio is mostly
  timing;
* ``filter_mean_ms``: the mean server time of the window's filter requests (the
  histogram's ``_sum`` and ``_count`` deltas): the cost of one call of the stream's mix;
  ``filters`` their number, and ``filters_per_pod`` the filter calls per pod bound over
  the same blocks as CPU per pod (reported, :data:`MIX_MEASURES`): how many times
  kube-scheduler asked about a pod before it bound, the mix CPU per pod moves with;
  ``calls`` (extender calls of every verb) and ``events`` (watch events applied) of the
  window, and per pod bound over the blocks ``calls_per_pod`` and ``events_per_pod``
  (reported); ``cpu_per_work_refcalls``: the block's CPU in reference calls over its calls
  plus events, what the process spends on the same unit of work. With it sampled, this is
  the CPU measure judged, and CPU per pod and per second are reported
  (:data:`MIX_JUDGED_BY`);
* ``calib_cpu_ms``: CPU of topoplace per filter call over :data:`CALIBRATION_CALLS` calls of
  one fixed request in a row (:func:`calibration_body`), right after the reads. CPU per pod
  moves with the stream's mix (a gang waiting for room makes kube-scheduler retry its
  members, and each retry is a filter that binds nothing); the calibration is the same
  work every time, so it can only move if topoplace's own state makes a call costlier.
  Its CPU and its calls are outside the windows of the other measures;
* ``ref_cpu_ms`` and ``calib_ratio``: the same calibration of a :class:`Reference`, a second
  topoplace serving the run's nodes and devices from a file (no pods, no API server),
  right after; and the ratio of the two. CPU per call moves with the host as well (another
  guest on the same hardware, the CPU's clock: a quiet VM's calibration varies by a
  quarter between minutes; in a 2-hour run both stepped up by half at the same minute),
  and the host moves both alike, so the verdict on the calibration is the ratio's;
* ``cpu_per_pod_refcalls``, ``cpu_per_s_refcalls``, ``filter_mean_refcalls``: CPU per pod,
  CPU per second and the mean filter time in reference calls (over ``ref_cpu_ms`` of the
  same sample), the host's speed at that moment taken out. With a reference these are
  judged, and the raw figures (:data:`HOST_MEASURES`) are reported;
* sizes of what could accumulate: ``parked`` (``topoplace_parked_pods``),
  ``binds_in_flight`` (``topoplace_kube_binds_in_flight``), ``decisions`` and
  ``decision_mb`` (the decision ring of ``/v1/inspect/decisions``), ``placements`` and
  ``placements_held`` (entries of ``/v1/inspect/placements``; held: any state but
  ``bound``), ``gang_plans`` (its gangs: ``gangs_live`` planned and not complete,
  ``gangs_complete`` kept for inspection, ``gangs_refused``), ``cache_pods`` / ``cache_nodes`` /
  ``cache_claims`` / ``cache_slices`` (topoplace's watch cache, ``/v1/inspect/snapshot``),
  ``preemptions_recent`` / ``teardowns`` / ``stranded`` (``/v1/inspect/preemptions``);
  ``metrics_kb`` (the size of ``/metrics``: a label set that keeps growing shows here);
  and, from the API server, ``api_pods`` (live pods of the chaos namespace: what the
  caches should follow);
* every store the serving process keeps between requests (``GET /v1/inspect/state``: the
  cache's pending, nominated and expiring holds, the DRA router's windows and memos, the
  parked pods and refusals, the gang runtime's maps, ...), in ``stores.csv`` and a table
  of its own (:func:`store_drifts`): a store with a cap is held to it, one without must
  not grow;
* ``load1``: the host's one-minute load average (``/proc/loadavg``), so the reader sees
  what else the machine was doing when a latency or a CPU figure moved.

The table (``summary.md``; every sample in ``samples.csv``): per measure its value at the
start and at the end of the measured part (samples after ``--warmup`` seconds: start-up
and the first fill are not drift), two slopes per hour over it, its maximum, the bound it
is held to and whether it holds. The slopes: the ordinary least-squares one
(:func:`slope_per_hour`) and the Theil-Sen one (:func:`theil_sen_per_hour`: the median of
the slopes between every pair of samples), which a few outlying windows (a sample taken
while the host was busy elsewhere) cannot pull: half the pairs would have to lie. Bounds:
resident memory, threads, fds, latencies and CPU per pod: a drift is *growth*, so the
bound is on the upward slope only (a falling latency is no drift): the Theil-Sen
``slope x run hours`` at most ``--drift`` (default 10 %) of the measure's median over the
run (growth over the whole run smaller than a tenth of the level). The verdict is the
Theil-Sen one; whether the least-squares slope also keeps under the bound is shown
beside it (``ols holds``), so an outlier-driven least-squares figure is visible, not
hidden. Sizes: the maximum at most a stated ceiling (decision ring: its own caps; the
watch cache and placements: the live pods the API server has plus ``--max-pending``;
parked and held: the pending pods at most, ``--max-pending`` plus a largest gang; gang
plans: the live and refused ones the pending pods at most, the complete ones the
runtime's ``DONE_KEPT``).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import yaml

from benchmarks.live import chaos
from benchmarks.live.chaos import stop_on_sigterm
from benchmarks.live.kubesched import REPO, cpu_seconds
from scheduler.runtime.gangs import DONE_KEPT

DRIFT_MEASURES = (
    "rss_mb",
    "threads",
    "fds",
    "filter_p99_ms",
    "bind_p99_ms",
    "filter_mean_ms",
    "cpu_ms_per_pod",
    "cpu_ms_per_s",
    "calib_cpu_ms",
    "ref_cpu_ms",
    "calib_ratio",
    "cpu_per_pod_refcalls",
    "cpu_per_s_refcalls",
    "filter_mean_refcalls",
    "cpu_per_work_refcalls",
    "filters_per_pod",
    "calls_per_pod",
    "events_per_pod",
)
IN_REFERENCE_CALLS = {
    "cpu_per_pod_refcalls": "cpu_ms_per_pod",
    "cpu_per_s_refcalls": "cpu_ms_per_s",
    "filter_mean_refcalls": "filter_mean_ms",
}
"""Measures expressed in the reference's calibration calls (the measure over
``ref_cpu_ms`` of the same sample): what they are once the host's speed at that moment
is taken out."""
HOST_MEASURES = ("calib_cpu_ms", "ref_cpu_ms", *IN_REFERENCE_CALLS.values())
"""CPU and time move with the host too (another guest on the same hardware, the CPU's
clock, the control plane's own work on the same cores): with a reference sampled these
are reported, and the verdicts are on ``calib_ratio`` and the measures in reference calls
(:data:`IN_REFERENCE_CALLS`), which the host moves for both alike."""
REFERENCE_KINDS = ("Node", "ResourceSlice", "DeviceClass")
"""What the reference process serves of the cluster: its nodes and devices, no pods."""
CALIBRATION_CALLS = 600
"""Filter calls of one calibration (``calib_cpu_ms``): at about 0.35 ms of CPU each, 0.2 s,
20 ticks of the kernel's 10 ms CPU clock; the Theil-Sen slope over a run's samples sees
through the tick."""
SIZE_MEASURES = (
    "parked",
    "binds_in_flight",
    "decisions",
    "decision_mb",
    "placements",
    "placements_held",
    "gang_plans",
    "gangs_live",
    "gangs_complete",
    "gangs_refused",
    "cache_pods",
    "cache_nodes",
    "cache_claims",
    "cache_slices",
    "preemptions_recent",
    "teardowns",
    "stranded",
    "api_pods",
    "sampler_cpu_ms",
    "metrics_kb",
)
BLOCK_MEASURES = (
    "cpu_ms_per_pod",
    "cpu_ms_per_s",
    "cpu_per_pod_refcalls",
    "cpu_per_s_refcalls",
    "cpu_per_work_refcalls",
    "filters_per_pod",
    "calls_per_pod",
    "events_per_pod",
)
"""Ratios of sums, judged over blocks of :data:`BLOCK_S` (:func:`cpu_blocks`), not per
window."""
BLOCK_S = 300.0
"""Seconds of one block of CPU per pod and per second: kube-scheduler retries a pending pod
within 5 minutes (``podMaxInUnschedulablePodsDuration``), so the CPU a pod costs (its
filters, its retries while it waits for room) falls within a block of its binding, where a
30 s window counts the retries of pods bound in other windows against the ten or so it
binds."""
MIX_MEASURES = ("filters_per_pod", "calls_per_pod", "events_per_pod")
"""What the stream asks of topoplace, reported with its slopes and never judged: the filter
calls per pod bound (kube-scheduler's retries of pods waiting for room, gang members woken
and refused again), the extender calls of every verb and the watch events applied per pod
bound, by which CPU per pod moves with the mix of work."""
MIX_JUDGED_BY = {
    "cpu_per_pod_refcalls": "cpu_per_work_refcalls",
    "cpu_per_s_refcalls": "cpu_per_work_refcalls",
}
"""CPU per pod and per second, reported with their slopes, and judged through CPU per unit
of work (:func:`cpu_blocks`). How many times kube-scheduler asks about a pod before it
binds is the stream's doing: a gang that waits for room has each member retried up to
every 5 minutes, and in a 2-hour run the filter calls per pod bound moved by a quarter
between quarter hours and rose 2.1/h. Over 5-minute blocks CPU per pod then varies by
14 % of its level, and the Theil-Sen slopes of the same blocks in shuffled order (no
trend at all) span -10.7/h to +10.1/h at 90 % around a median of 100, twice the bound
of 5.2/h: a verdict on CPU per pod would be a verdict on the stream. CPU per unit of work
(an extender call of any verb, or a watch event applied) is what the process spends on
the same work, and is the one held to the bound; :func:`shuffled_slopes` gives each
block measure's no-trend range in the summary, so the reader sees how far a slope is
from noise."""
COLUMNS = (
    "t_s",
    "pods_bound",
    "cpu_s",
    "window_s",
    "filters",
    "calls",
    "events",
    "load1",
    *DRIFT_MEASURES,
    *SIZE_MEASURES,
)
_BUCKET = re.compile(
    r'^topoplace_request_seconds_bucket\{le="([^"]+)",verb="([a-z]+)"\} ([0-9.e+-]+)$'
)
_GAUGE = re.compile(r"^(topoplace_[a-z_]+) ([0-9.e+-]+)$")
_SUM_COUNT = re.compile(r'^topoplace_request_seconds_(sum|count)\{verb="([a-z]+)"\} ([0-9.e+-]+)$')
_WATCH_EVENTS = re.compile(r"^topoplace_kube_watch_events_total\{[^}]*\} ([0-9.e+-]+)$")


def log(msg: str) -> None:
    """A progress line on stderr."""
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- reading the process and its metrics ---------------------------------------------------


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


def threads(pid: int) -> int:
    """Threads of ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Threads for pid {pid}")


def histograms(text: str) -> dict[str, list[tuple[float, float]]]:
    """verb -> cumulative ``(upper bound, count)`` buckets of
    ``topoplace_request_seconds`` in a Prometheus text exposition, by bound."""
    out: dict[str, list[tuple[float, float]]] = {}
    for line in text.splitlines():
        m = _BUCKET.match(line)
        if m:
            out.setdefault(m.group(2), []).append((float(m.group(1)), float(m.group(3))))
    for v in out.values():
        v.sort()
    return out


def sums_counts(text: str) -> dict[str, tuple[float, float]]:
    """verb -> ``(sum of seconds, count)`` of ``topoplace_request_seconds``."""
    got: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _SUM_COUNT.match(line)
        if m:
            got[(m.group(2), m.group(1))] = float(m.group(3))
    verbs = {v for v, _ in got}
    return {v: (got.get((v, "sum"), 0.0), got.get((v, "count"), 0.0)) for v in verbs}


def work_counts(
    text: str, sums: Mapping[str, tuple[float, float]] | None = None
) -> tuple[float, float]:
    """``(extender calls of every verb, watch events applied)`` so far, from a Prometheus
    text exposition: the counts of ``topoplace_request_seconds`` summed over its verbs
    (``sums``: :func:`sums_counts` of ``text`` when the caller has it already) and
    ``topoplace_kube_watch_events_total`` summed over resources and event types."""
    calls = sum(c for _, c in (sums_counts(text) if sums is None else sums).values())
    events = 0.0
    for line in text.splitlines():
        m = _WATCH_EVENTS.match(line)
        if m:
            events += float(m.group(1))
    return calls, events


def window_mean_ms(now: tuple[float, float] | None, before: tuple[float, float] | None) -> float:
    """Mean milliseconds of the requests between two ``(sum, count)`` readings (nan when the
    window saw none)."""
    if now is None:
        return math.nan
    s0, c0 = before or (0.0, 0.0)
    n = now[1] - c0
    return (now[0] - s0) / n * 1000.0 if n > 0 else math.nan


def calibration_body(nodes: Sequence[str]) -> bytes:
    """The calibration's filter request: the same pod every time, as kube-scheduler sends
    it (PascalCase ``ExtenderArgs``, ``NodeNames`` for the shipped ``nodeCacheCapable``,
    no TypeMeta, an empty ``nodeName``): a 1-GPU whole-GPU pod, the commonest kind of the
    stream, against every node. Its pools take in the probe node, which no work uses when
    no fault runs, so some node always passes it: it is never refused, so never parked or
    woken. It never exists in the API server, so topoplace keeps nothing of it past its
    pending-pod expiry."""
    pod = chaos._pod("soak-calibration", {"nvidia.com/gpu": "1"}, "low", ("work", "hami", "probe"))
    del pod["kind"], pod["apiVersion"]
    pod["metadata"]["uid"] = "00000000-0000-4000-8000-0000000ca11b"
    pod["spec"]["nodeName"] = ""
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": sorted(nodes)})


class Reference:
    """A second topoplace, ``serve --cluster`` of the run's nodes and devices with no pods
    and no API server, started with the run and calibrated right after the serving one at
    every sample: the same code and request on the same host at the same moment, without
    the run's history. ``calib_ratio`` (serving / reference) moves only when the serving
    process's own state makes a call costlier; the host (another guest on the hardware,
    the CPU's clock) moves both alike.

    Args:
        items: the cluster's objects (only :data:`REFERENCE_KINDS` are kept).
        workdir: where its cluster file and log go.
        policy: the serving process's policy file (None: the shipped one).
        source: the checkout whose ``scheduler`` package it runs.
    """

    def __init__(
        self,
        items: Sequence[Mapping[str, Any]],
        workdir: Path,
        policy: str | Path | None,
        source: Path = REPO,
    ) -> None:
        kept = [i for i in items if i.get("kind") in REFERENCE_KINDS]
        self.nodes = sorted(i["metadata"]["name"] for i in kept if i.get("kind") == "Node")
        self.body = calibration_body(self.nodes)
        """The calibration's request over its nodes (which never change)."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.cluster_file = workdir / "reference-cluster.json"
        self.cluster_file.write_bytes(
            orjson.dumps({"kind": "List", "apiVersion": "v1", "items": kept})
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "scheduler.cli.main", "serve", "--cluster"]
        cmd += [str(self.cluster_file), "--host", "127.0.0.1", "--port", str(self.port)]
        if policy:
            cmd += ["--config", str(policy)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            x for x in (str(source), os.environ.get("PYTHONPATH")) if x
        )}  # fmt: skip
        self.log_file = workdir / "reference.log"
        with open(self.log_file, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=source, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"reference topoplace exited: {self.log_file.read_text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("reference topoplace not ready in 60 s")
            time.sleep(0.1)

    def calibrate(self, calls: int) -> float:
        """:func:`calibrate` of this process, with the same request over its nodes."""
        return calibrate(self.url + "/scheduler/filter", self.proc.pid, self.body, calls, {})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def calibrate(url: str, pid: int, body: bytes, calls: int, client_args: Mapping[str, Any]) -> float:
    """Milliseconds of CPU of process ``pid`` per filter call over ``calls`` POSTs of
    ``body`` to ``url`` in a row: the same work at every sample, so its cost can only move
    with topoplace's state, not with the stream's mix of work."""
    with httpx.Client(timeout=30, **client_args) as http:
        http.post(url, content=body, headers={"Content-Type": "application/json"})  # connect
        c0 = cpu_seconds(pid)
        for _ in range(calls):
            r = http.post(url, content=body, headers={"Content-Type": "application/json"})
            r.raise_for_status()
        c1 = cpu_seconds(pid)
    return (c1 - c0) / calls * 1000.0


def gauges(text: str) -> dict[str, float]:
    """Unlabelled ``topoplace_*`` samples of an exposition by name."""
    return {
        m.group(1): float(m.group(2)) for line in text.splitlines() if (m := _GAUGE.match(line))
    }


def window_quantile(
    now: Sequence[tuple[float, float]], before: Sequence[tuple[float, float]], q: float
) -> float:
    """The ``q`` quantile of the observations between two readings of one cumulative
    histogram: the upper bound of the first bucket whose count delta reaches ``q`` of the
    window's total (nan when the window saw none; inf when it lies past the last finite
    bound)."""
    prev = dict(before)
    deltas = [(le, c - prev.get(le, 0.0)) for le, c in now]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return math.nan
    for le, c in deltas:
        if c >= q * total:
            return le
    return math.inf


def load1() -> float:
    """The host's one-minute load average (first field of ``/proc/loadavg``)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def scheduler_config_kind(path: Path) -> str:
    """Which shipped kube-scheduler configuration the file at ``path`` is: ``dra`` when no
    extender lists ``managedResources`` (every pod reaches the extender: the DRA
    variant), ``default`` when one does."""
    cfg = yaml.safe_load(path.read_text()) or {}
    return (
        "default" if any(e.get("managedResources") for e in cfg.get("extenders") or ()) else "dra"
    )


def slope_per_hour(ts: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``ts`` (seconds), per hour; nan with fewer than
    two finite points."""
    pts = [(t, y) for t, y in zip(ts, ys, strict=True) if math.isfinite(y)]
    if len(pts) < 2:
        return math.nan
    mt = sum(t for t, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    if den == 0:
        return math.nan
    return sum((t - mt) * (y - my) for t, y in pts) / den * 3600.0


def theil_sen_per_hour(ts: Sequence[float], ys: Sequence[float]) -> float:
    """Theil-Sen slope of ``ys`` over ``ts`` (seconds), per hour: the median of
    ``(y_j - y_i) / (t_j - t_i)`` over every pair ``i < j`` of finite points with
    ``t_i != t_j``; nan when there is no such pair. Up to about 29 % of the points can be
    arbitrarily wrong without moving it far (its breakdown point), where one point can
    move a least-squares slope anywhere."""
    t = np.asarray(ts, dtype=float)
    y = np.asarray(ys, dtype=float)
    if t.shape != y.shape:
        raise ValueError(f"ts and ys differ in length: {t.shape} vs {y.shape}")
    ok = np.isfinite(y) & np.isfinite(t)
    t, y = t[ok], y[ok]
    i, j = np.triu_indices(len(t), k=1)
    dt = t[j] - t[i]
    keep = dt != 0
    if not keep.any():
        return math.nan
    return float(np.median((y[j] - y[i])[keep] / dt[keep])) * 3600.0


# ---- the sampler ------------------------------------------------------------------------------


class Sampler:
    """Samples the measures of the module docstring every ``interval`` seconds in a thread
    (a sample whose reads fail is skipped, counted in ``errors``)."""

    def __init__(
        self,
        plane: chaos.Plane,
        driver: chaos.Driver,
        interval: float,
        calls: int = CALIBRATION_CALLS,
        workdir: Path | None = None,
    ) -> None:
        self.plane = plane
        self.driver = driver
        self.interval = interval
        self.calls = calls
        self.workdir = workdir
        """Where the :class:`Reference` keeps its files (None: no reference)."""
        self.reference: Reference | None = None
        self.rows: list[dict[str, float]] = []
        self.stores: list[dict[str, float]] = []
        """Per sample: ``t_s`` and the size of every store of ``/v1/inspect/state``
        (``part.store``)."""
        self.caps: dict[str, float | None] = {}
        """Each store's cap as ``/v1/inspect/state`` states it (None: none)."""
        self.errors = 0
        self.t0 = time.monotonic()
        self._prev: (
            tuple[
                float,
                int,
                dict[str, list[tuple[float, float]]],
                float,
                tuple[float, float],
                tuple[float, float],
            ]
            | None
        ) = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)

    def start(self) -> Callable[[], None]:
        """Start; the function that stops it."""
        self._thread.start()
        return self.stop

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.reference is not None:
            self.reference.stop()

    def _loop(self) -> None:
        self._sample()  # the baseline of the first window
        # the work part only: once arrivals stop (the settle) the load is no longer steady
        while not self._stop.wait(self.interval) and not self.driver.stop_faults.is_set():
            try:
                self._sample()
            except Exception as exc:  # a read failed: the next sample tries again
                self.errors += 1
                log(f"sample failed: {exc!r}")

    def _sample(self) -> None:
        tp = self.plane.tp
        assert tp is not None and tp.pid is not None
        pid = tp.pid
        cpu = cpu_seconds(pid)
        bound = self.driver.result.pods_bound
        text = tp.metrics()
        hist = histograms(text)
        g = gauges(text)
        decisions = tp.get("/v1/inspect/decisions?limit=1")["ring"]
        placements = tp.get("/v1/inspect/placements")
        items = tp.get("/v1/inspect/snapshot")["items"]
        snap = Counter(i.get("kind") for i in items)
        pre = tp.get("/v1/inspect/preemptions")
        stores = flat_stores(tp.get("/v1/inspect/state")["stores"])
        reads_done = cpu_seconds(pid)
        calib = ref = math.nan
        if self.calls > 0:
            nodes = [i["metadata"]["name"] for i in items if i.get("kind") == "Node"]
            if self.reference is None and self.workdir is not None:
                self.reference = Reference(items, self.workdir, tp.policy, tp.source)
            calib = calibrate(
                f"{tp.extender_url}/filter",
                pid,
                calibration_body(nodes),
                self.calls,
                tp.client_args,
            )
            if self.reference is not None:
                ref = self.reference.calibrate(self.calls)
        sums = sums_counts(text)
        filt, work = sums.get("filter"), work_counts(text, sums)
        # the calibration's calls are in the histograms: the next window starts after them
        base_hist, base_filt, base_work = hist, filt, work
        if self.calls > 0:
            base_text = tp.metrics()
            base_sums = sums_counts(base_text)
            base_hist, base_filt = histograms(base_text), base_sums.get("filter")
            base_work = work_counts(base_text, base_sums)
        # the CPU topoplace spent answering these reads and the calibration: kept out of the
        # window's figure
        after = cpu_seconds(pid)
        state = self.driver.poller.snapshot()
        now = time.monotonic() - self.t0
        row: dict[str, float] = {
            "t_s": round(now, 1),
            "pods_bound": bound,
            "cpu_s": round(cpu, 2),
            "window_s": math.nan,
            "filters": math.nan,
            "calls": math.nan,
            "events": math.nan,
            "load1": load1(),
            "rss_mb": round(rss_mb(pid), 2),
            "threads": threads(pid),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "filter_p99_ms": math.nan,
            "bind_p99_ms": math.nan,
            "cpu_ms_per_pod": math.nan,
            "cpu_ms_per_s": math.nan,
            "filter_mean_ms": math.nan,
            "calib_cpu_ms": round(calib, 3),
            "ref_cpu_ms": round(ref, 3),
            "calib_ratio": round(calib / ref, 3) if ref > 0 else math.nan,
            "sampler_cpu_ms": round((reads_done - cpu) * 1000.0, 1),
            "metrics_kb": round(len(text.encode()) / 1024, 1),
            "parked": g.get("topoplace_parked_pods", math.nan),
            "binds_in_flight": g.get("topoplace_kube_binds_in_flight", math.nan),
            "decisions": decisions["records"],
            "decision_mb": round(decisions["bytes"] / 2**20, 3),
            "placements": len(placements["placements"]),
            "placements_held": sum(
                1 for p in placements["placements"] if p.get("state") != "bound"
            ),
            "gang_plans": len(placements["gangs"]),
            **{
                f"gangs_{state}": sum(
                    1 for g in placements["gangs"].values() if g.get("state") == state
                )
                for state in ("live", "complete", "refused")
            },
            "cache_pods": snap["Pod"],
            "cache_nodes": snap["Node"],
            "cache_claims": snap["ResourceClaim"],
            "cache_slices": snap["ResourceSlice"],
            "preemptions_recent": len(pre.get("recent") or ()),
            "teardowns": len(pre.get("pending_teardowns") or ()),
            "stranded": len(pre.get("stranded") or ()),
            "api_pods": (
                sum(1 for p in state.pods if not p["metadata"].get("deletionTimestamp"))
                if state is not None
                else math.nan
            ),
        }
        if self._prev is not None:
            pcpu, pbound, phist, pt, pfilt, pwork = self._prev
            for verb in ("filter", "bind"):
                q = window_quantile(hist.get(verb, []), phist.get(verb, []), 0.99)
                row[f"{verb}_p99_ms"] = q * 1000.0 if math.isfinite(q) else q
            row["filter_mean_ms"] = round(window_mean_ms(filt, pfilt), 3)
            if filt is not None:
                row["filters"] = filt[1] - pfilt[1]
            row["calls"] = work[0] - pwork[0]
            row["events"] = work[1] - pwork[1]
            pods = bound - pbound
            # the window: from the end of the previous sample's reads to the start of these
            if pods > 0:
                row["cpu_ms_per_pod"] = round((cpu - pcpu) / pods * 1000.0, 2)
            if now > pt:
                row["window_s"] = round(now - pt, 2)
                row["cpu_ms_per_s"] = round((cpu - pcpu) / (now - pt) * 1000.0, 2)
            self.rows.append(in_reference_calls(row))
            self.stores.append({"t_s": row["t_s"], **{k: v for k, (v, _) in stores.items()}})
            self.caps.update((k, cap) for k, (_, cap) in stores.items())
        self._prev = (
            after,
            bound,
            base_hist,
            time.monotonic() - self.t0,
            base_filt or (0.0, 0.0),
            base_work,
        )


def flat_stores(state: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
    """``/v1/inspect/state``'s ``stores`` as ``part.store -> (size, cap or None)``."""
    return {
        f"{part}.{name}": (float(s["size"]), None if s.get("cap") is None else float(s["cap"]))
        for part, named in sorted(state.items())
        for name, s in sorted(named.items())
    }


# ---- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Drift:
    """One measure over the measured part: start, end, least-squares (``slope_h``) and
    Theil-Sen (``robust_h``) slopes per hour, maximum, its bound (text), whether it holds
    (drift measures: on the Theil-Sen slope) and whether the least-squares slope keeps
    under the same bound too (``ols_holds``; sizes: equal to ``holds``)."""

    measure: str
    start: float
    end: float
    slope_h: float
    robust_h: float
    peak: float
    bound: str
    holds: bool
    ols_holds: bool


def _first_last(ys: Sequence[float], k: int = 3) -> tuple[float, float]:
    """Median of the first and of the last ``k`` finite values (one sample is noise)."""
    f = [y for y in ys if math.isfinite(y)]
    if not f:
        return math.nan, math.nan
    return statistics.median(f[:k]), statistics.median(f[-k:])


def in_reference_calls(row: Mapping[str, float]) -> dict[str, float]:
    """``row`` with the measures of :data:`IN_REFERENCE_CALLS` (NaN without a reference
    figure); those it has already are kept."""
    ref = float(row.get("ref_cpu_ms", math.nan))
    out = dict(row)
    for name, src in IN_REFERENCE_CALLS.items():
        if not math.isfinite(float(out.get(name, math.nan))):
            v = float(row.get(src, math.nan))
            out[name] = round(v / ref, 2) if math.isfinite(ref) and ref > 0 else math.nan
    return out


def _measured(
    rows: Sequence[Mapping[str, float]], warmup: float
) -> tuple[list[Mapping[str, float]], list[float], float]:
    """(the rows after ``warmup`` seconds, or all of them when none is; their times; the
    hours they span)."""
    kept = [r for r in rows if r["t_s"] >= warmup] or list(rows)
    ts = [r["t_s"] for r in kept]
    hours = max((ts[-1] - ts[0]) / 3600.0, 1e-9) if ts else 1e-9
    return kept, ts, hours


def cpu_blocks(
    rows: Sequence[Mapping[str, float]], warmup: float, block_s: float = BLOCK_S
) -> list[dict[str, float]]:
    """The measures of :data:`BLOCK_MEASURES` over consecutive blocks of the windows after
    ``warmup`` seconds, each block at least ``block_s`` long (a shorter tail is left out):
    the sum of the windows' CPU over the sum of their pods bound (or of their seconds); in
    reference calls, each window's CPU over its own sample's ``ref_cpu_ms`` first. A
    window's CPU is ``cpu_ms_per_s x window_s`` (``window_s`` missing from older samples:
    the time since the previous sample), its pods the growth of ``pods_bound``; its work
    the extender calls (``calls``, every verb) plus the watch events applied (``events``),
    NaN in samples written before they were counted. Each block is at ``t_s`` of its last
    window."""
    out: list[dict[str, float]] = []
    secs = cpu = refcalls = bound = filters = calls = events = 0.0
    for prev, row in zip(rows[:-1], rows[1:], strict=True):
        if row["t_s"] < warmup:
            continue
        span = float(row.get("window_s", math.nan))
        if not math.isfinite(span):
            span = row["t_s"] - prev["t_s"]
        rate = float(row.get("cpu_ms_per_s", math.nan))
        pods = float(row.get("pods_bound", math.nan)) - float(prev.get("pods_bound", math.nan))
        if not (math.isfinite(rate) and math.isfinite(pods) and span > 0):
            continue
        ref = float(row.get("ref_cpu_ms", math.nan))
        secs += span
        cpu += rate * span
        refcalls += rate * span / ref if math.isfinite(ref) and ref > 0 else math.nan
        bound += pods
        filters += float(row.get("filters", math.nan))
        calls += float(row.get("calls", math.nan))
        events += float(row.get("events", math.nan))
        if secs < block_s:
            continue
        per_pod = 1.0 / bound if bound > 0 else math.nan
        work = calls + events
        out.append(
            {
                "t_s": row["t_s"],
                "cpu_ms_per_pod": cpu * per_pod,
                "cpu_ms_per_s": cpu / secs,
                "cpu_per_pod_refcalls": refcalls * per_pod,
                "cpu_per_s_refcalls": refcalls / secs,
                "cpu_per_work_refcalls": refcalls / work if work > 0 else math.nan,
                "filters_per_pod": filters * per_pod,
                "calls_per_pod": calls * per_pod,
                "events_per_pod": events * per_pod,
            }
        )
        secs = cpu = refcalls = bound = filters = calls = events = 0.0
    return out


SHUFFLES = 400
"""Orderings of :func:`shuffled_slopes` (seeded: the same blocks give the same range)."""


def shuffled_slopes(
    ts: Sequence[float], ys: Sequence[float], shuffles: int = SHUFFLES, seed: int = 0
) -> tuple[float, float]:
    """The 5th and 95th percentiles of the Theil-Sen slope per hour of ``ys`` put in
    ``shuffles`` random orders over the same ``ts``: the slopes a series of the same values
    with no trend at all shows, so a measured slope can be read against its noise (nan
    with fewer than 3 finite values)."""
    pts = [(t, y) for t, y in zip(ts, ys, strict=True) if math.isfinite(y)]
    if len(pts) < 3:
        return math.nan, math.nan
    t = [p[0] for p in pts]
    y = np.asarray([p[1] for p in pts], dtype=float)
    rng = np.random.default_rng(seed)
    got = [theil_sen_per_hour(t, rng.permutation(y)) for _ in range(shuffles)]
    return float(np.quantile(got, 0.05)), float(np.quantile(got, 0.95))


def drifts(
    rows: Sequence[Mapping[str, float]], warmup: float, drift: float, ceilings: Mapping[str, float]
) -> list[Drift]:
    """The table of the module docstring over the rows after ``warmup`` seconds (the
    measures in reference calls derived where a row lacks them; those of
    :data:`BLOCK_MEASURES` over blocks, :func:`cpu_blocks`)."""
    kept, ts, hours = _measured([in_reference_calls(r) for r in rows], warmup)
    if not kept:
        return []
    out: list[Drift] = []
    ratio = any(math.isfinite(float(r.get("calib_ratio", math.nan))) for r in kept)
    blocks = cpu_blocks(rows, warmup)
    bts = [b["t_s"] for b in blocks]
    for m in DRIFT_MEASURES:
        ys = [float(r.get(m, math.nan)) for r in kept]
        mts = ts
        if m in BLOCK_MEASURES:
            ys, mts = [b[m] for b in blocks], bts
        finite = [y for y in ys if math.isfinite(y)]
        level = statistics.median(finite) if finite else math.nan
        s = slope_per_hour(mts, ys)
        rs = theil_sen_per_hour(mts, ys)
        start, end = _first_last(ys)
        limit = drift * level / hours if math.isfinite(level) else math.nan
        if not finite:  # a samples.csv written before the measure existed
            out.append(Drift(m, *(math.nan,) * 5, "not sampled", True, True))
            continue
        if m in MIX_MEASURES:
            bound = "reported (the stream's mix)"
            out.append(Drift(m, start, end, s, rs, max(finite), bound, True, True))
            continue
        by = MIX_JUDGED_BY.get(m)
        if by is not None and any(math.isfinite(b.get(by, math.nan)) for b in blocks):
            bound = f"reported (moves with the stream's mix: judged as {by})"
            out.append(Drift(m, start, end, s, rs, max(finite), bound, True, True))
            continue
        if ratio and m in HOST_MEASURES:
            bound = "reported (moves with the host: judged in reference calls)"
            out.append(Drift(m, start, end, s, rs, max(finite), bound, True, True))
            continue
        out.append(
            Drift(
                m,
                start,
                end,
                s,
                rs,
                max(finite) if finite else math.nan,
                f"growth <= {limit:.3g}/h ({drift:.0%} of median {level:.3g} over {hours:.2f} h)",
                math.isfinite(rs) and rs <= limit,
                math.isfinite(s) and s <= limit,
            )
        )
    for m in (*SIZE_MEASURES, "load1"):
        ys = [float(r.get(m, math.nan)) for r in kept]
        finite = [y for y in ys if math.isfinite(y)]
        start, end = _first_last(ys, 1)
        peak = max(finite) if finite else math.nan
        ceil = ceilings.get(m)
        ok = ceil is None or (math.isfinite(peak) and peak <= ceil)
        out.append(
            Drift(
                m,
                start,
                end,
                slope_per_hour(ts, ys),
                theil_sen_per_hour(ts, ys),
                peak,
                f"max <= {ceil:g}" if ceil is not None else "reported",
                ok,
                ok,
            )
        )
    return out


STORE_SLACK = 2.0
"""Entries a store without a cap may grow by over the run besides ``--drift`` of its
median: a store of a few entries moves by one or two with the work in flight."""


def store_drifts(
    rows: Sequence[Mapping[str, float]],
    caps: Mapping[str, float | None],
    warmup: float,
    drift: float,
) -> list[Drift]:
    """One line per store of ``/v1/inspect/state`` over the rows after ``warmup`` seconds.
    A store with a cap holds if its maximum stays at most the cap; one without (bounded by
    the pods and gangs in flight and their windows) holds if it does not grow: its
    Theil-Sen slope times the run's hours at most ``drift`` of its median plus
    :data:`STORE_SLACK` entries (a store that keeps what it should drop grows with the
    work done, and fails)."""
    kept, ts, hours = _measured(rows, warmup)
    if not kept:
        return []
    out: list[Drift] = []
    for m in sorted({k for r in kept for k in r} - {"t_s"}):
        ys = [float(r.get(m, math.nan)) for r in kept]
        finite = [y for y in ys if math.isfinite(y)]
        if not finite:
            continue
        start, end = _first_last(ys, 1)
        s, rs, peak = slope_per_hour(ts, ys), theil_sen_per_hour(ts, ys), max(finite)
        cap = caps.get(m)
        if cap is not None:
            ok = peak <= cap
            out.append(Drift(m, start, end, s, rs, peak, f"max <= cap {cap:g}", ok, ok))
            continue
        limit = (drift * statistics.median(finite) + STORE_SLACK) / hours
        out.append(
            Drift(
                m,
                start,
                end,
                s,
                rs,
                peak,
                f"growth <= {limit:.3g}/h ({drift:.0%} of median + {STORE_SLACK:g})",
                math.isfinite(rs) and rs <= limit,
                math.isfinite(s) and s <= limit,
            )
        )
    return out


def ceilings(
    rows: Sequence[Mapping[str, float]], args: argparse.Namespace, nodes: int, slices: int
) -> dict[str, float]:
    """The size bounds of the module docstring for this run."""
    live = max((r["api_pods"] for r in rows if math.isfinite(r["api_pods"])), default=0.0)
    largest_gang = 4
    return {
        "parked": args.max_pending + largest_gang,
        "binds_in_flight": args.max_pending + largest_gang,
        "decisions": 2048,
        "decision_mb": 64,
        "placements": live + args.max_pending,
        "placements_held": args.max_pending + largest_gang,
        # the gang runtime keeps the last DONE_KEPT complete plans for inspection
        "gangs_complete": DONE_KEPT,
        "gangs_live": args.max_pending,
        "gangs_refused": args.max_pending,
        "gang_plans": DONE_KEPT + 2 * args.max_pending,
        "cache_pods": live + args.max_pending,
        "cache_nodes": nodes,
        "cache_claims": live + args.max_pending,
        "cache_slices": slices,
        "teardowns": args.max_pending + largest_gang,
        "stranded": args.max_pending + largest_gang,
    }


def noise_lines(rows: Sequence[Mapping[str, float]], warmup: float) -> list[str]:
    """One line per block measure: its Theil-Sen slope per hour and the no-trend range of
    :func:`shuffled_slopes` over the same blocks (empty without blocks)."""
    blocks = cpu_blocks(rows, warmup)
    if len(blocks) < 3:
        return []
    ts = [b["t_s"] for b in blocks]
    lines = [
        f"Noise of the block measures ({len(blocks)} blocks of {BLOCK_S / 60:.0f} minutes): "
        f"the Theil-Sen slope, and the 5th-95th percentiles of the slopes of the same "
        f"blocks in {SHUFFLES} shuffled orders (no trend at all).",
        "",
    ]
    for m in BLOCK_MEASURES:
        ys = [b[m] for b in blocks]
        if not any(math.isfinite(y) for y in ys):
            continue
        lo, hi = shuffled_slopes(ts, ys)
        lines.append(
            f"- {m}: {_fmt(theil_sen_per_hour(ts, ys))}/h; no trend: {_fmt(lo)} to {_fmt(hi)}/h"
        )
    return lines


def _fmt(x: float) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def table_lines(table: Sequence[Drift]) -> list[str]:
    """The drift table in Markdown."""
    lines = [
        "| measure | start | end | OLS slope /h | Theil-Sen slope /h | max | bound | holds "
        "| ols holds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in table:
        lines.append(
            f"| {d.measure} | {_fmt(d.start)} | {_fmt(d.end)} | {_fmt(d.slope_h)} | "
            f"{_fmt(d.robust_h)} | {_fmt(d.peak)} | {d.bound} | {'yes' if d.holds else 'NO'} "
            f"| {'yes' if d.ols_holds else 'NO'} |"
        )
    return lines


def read_samples(path: Path) -> list[dict[str, float]]:
    """The rows of a ``samples.csv`` (an empty cell reads as NaN)."""
    with open(path, newline="") as f:
        return [
            {k: float(v) if v not in ("", "nan") else math.nan for k, v in r.items()}
            for r in csv.DictReader(f)
        ]


def markdown(
    table: Sequence[Drift],
    result: chaos.Result,
    sampler: Sampler,
    args: argparse.Namespace,
    version: str,
    command: str,
    config: str = "dra",
    stores: Sequence[Drift] = (),
) -> str:
    """summary.md: command, conditions (``config``: the kube-scheduler configuration,
    :func:`scheduler_config_kind`), the drift table, the stores' table
    (:func:`store_drifts`), the run's invariant figures."""
    measured = [r["t_s"] for r in sampler.rows if r["t_s"] >= args.warmup]
    span = (measured[-1] - measured[0]) if len(measured) > 1 else 0.0
    loads = [
        r["load1"] for r in sampler.rows if r["t_s"] >= args.warmup and math.isfinite(r["load1"])
    ]
    load = (
        f"host load average (1 min, per sample) mean {statistics.fmean(loads):.2f}, median "
        f"{statistics.median(loads):.2f}, max {max(loads):.2f}"
        if loads
        else "host load average not sampled"
    )
    ks_config = (
        "the shipped DRA variant (config/deploy/dra/scheduler-config-dra.yaml: no "
        "managedResources, every pod reaches topoplace)"
        if config == "dra"
        else "the shipped configuration (config/deploy/scheduler-config.yaml: managedResources "
        "nvidia.com/gpu and HAMi's; pods asking GPUs through a claim only do not reach topoplace)"
    )
    lines = [
        "# live-soak",
        "",
        "The chaos runner's stream of work at a steady load with no fault, sampled for drift "
        "and accumulation (benchmarks/live/soak.py).",
        "",
        "Command:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Conditions: Kubernetes {version} (the project's test cluster, DRA served), "
        f"kube-scheduler with {ks_config}, topoplace with the shipped policy "
        f"(hami_lock: release); {args.nodes} 8-GPU work nodes, {args.hami_nodes} HAMi nodes, "
        f"{args.dra_nodes} DRA nodes, one probe node; seed {args.seed}; work for "
        f"{args.duration:.0f} s, arrivals every {args.arrival:.1f} s on average, lifetime "
        f"~{args.lifetime:.0f} s, at most {args.max_pending} pods pending; a sample every "
        f"{args.sample:.0f} s ({len(sampler.rows)} samples, {sampler.errors} failed); measured "
        f"after a {args.warmup:.0f} s warm-up: {span / 3600:.2f} h; {os.cpu_count()} cores "
        f"shared with other work; {load}.",
        "",
        "Drift is growth: for rss_mb, threads, fds, the p99 latencies and CPU per pod the bound "
        "is on the upward slope only (a falling latency is no drift), judged on the Theil-Sen "
        "slope (median of the slopes between every pair of samples: a few outlying windows "
        "cannot pull it); `ols holds` says whether the least-squares slope keeps under the "
        "same bound. CPU per pod, per second and per unit of work are ratios of sums over "
        f"blocks of {BLOCK_S / 60:.0f} minutes (the block's CPU over its pods, seconds, or "
        "extender calls plus watch events; kube-scheduler retries a waiting pod within 5 "
        "minutes, so a pod's CPU falls within a block of its binding, not within its 30 s "
        "window). CPU per pod and per second move with how often kube-scheduler asks about "
        "a pod (`calls_per_pod`), which is the stream's doing: they are reported, and the "
        "CPU topoplace spends on the same work is judged as CPU per unit of work. Sizes are "
        "held to their ceiling (`max`); load1 is the host's, reported.",
        "",
        *table_lines(table),
    ]
    noise = noise_lines(sampler.rows, args.warmup)
    if noise:
        lines += ["", *noise]
    if stores:
        held = sum(d.holds for d in stores)
        lines += [
            "",
            f"Stores the process keeps between requests (`GET /v1/inspect/state`, every "
            f"sample): {held} of {len(stores)} hold. A store with a cap is held to it; one "
            "without (bounded by the pods and gangs in flight and their windows) must not "
            "grow.",
            "",
            *table_lines(stores),
        ]
    jobs = sum(result.created.values())
    lines += [
        "",
        f"Jobs created {jobs} ({', '.join(f'{k} {result.created[k]}' for k in chaos.POD_KINDS)}), "
        f"pods bound {result.pods_bound}; invariant violations {len(result.violations)}; "
        f"pending after the {result.settle_bound:.0f} s settle {len(result.pending_after_settle)}; "
        f"ledger differences {len(result.ledger_diff)}; API reads {result.reads} "
        f"({result.read_errors} failed).",
        "",
        "Wait from a job's creation to every pod of it bound, p50 / p99 / longest: "
        + "; ".join(
            f"{k} {'/'.join(f'{x:.1f}' for x in chaos.wait_figures(result.waits[k]))} s"
            for k in chaos.POD_KINDS
            if result.waits.get(k)
        )
        + ".",
        "",
        "Start / end: medians of the first and last three samples (CPU per pod and per "
        "second: blocks; sizes: the first and last sample) of the measured part. p99 "
        "latencies are bucket upper bounds of topoplace_request_seconds (a window's 99th "
        "percentile lies at or below it).",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The soak's own flags (``--sample``, ``--warmup``, ``--drift``) and the chaos
    runner's (faults are off whatever they say)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=300.0, help="seconds not measured")
    p.add_argument("--drift", type=float, default=0.10, help="drift bound over the run")
    p.add_argument(
        "--from-samples",
        default=None,
        help="no run: the drift table of a samples.csv after --warmup seconds (sizes reported)",
    )
    own, rest = p.parse_known_args(argv)
    defaults = ["--duration", "7200", "--out", "out/live-soak"]
    args = chaos.parse_args([*defaults, *rest, "--fault-count", "0", "--faults", ""])
    for k, v in vars(own).items():
        setattr(args, k, v)
    return args


def write(
    out: Path, sampler: Sampler, table: Sequence[Drift], md: str, result: chaos.Result
) -> None:
    """samples.csv, stores.csv, summary.md, summary.csv (drift and store lines) and
    violations.txt in ``out``."""
    with open(out / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(sampler.rows)
    names = sorted({k for r in sampler.stores for k in r} - {"t_s"})
    with open(out / "stores.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["t_s", *names], restval="")
        w.writeheader()
        w.writerows(sampler.stores)
    (out / "summary.md").write_text(md)
    with open(out / "summary.csv", "w", newline="") as f:
        w2 = csv.writer(f, lineterminator="\n")
        w2.writerow(
            (
                "measure",
                "start",
                "end",
                "ols_slope_per_hour",
                "theil_sen_slope_per_hour",
                "max",
                "bound",
                "holds",
                "ols_holds",
            )
        )
        for d in table:
            w2.writerow(
                (
                    d.measure,
                    d.start,
                    d.end,
                    d.slope_h,
                    d.robust_h,
                    d.peak,
                    d.bound,
                    d.holds,
                    d.ols_holds,
                )
            )
    (out / "violations.txt").write_text(
        "".join(f"{t:.1f} {v.kind} {v.subject}: {v.detail}\n" for t, v in result.violations)
        + "".join(f"ledger: {d}\n" for d in result.ledger_diff)
        + "".join(f"pending after settle: {p}\n" for p in result.pending_after_settle)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_samples:
        rows = read_samples(Path(args.from_samples))
        table = drifts(rows, args.warmup, args.drift, {})
        print("\n".join([*table_lines(table), "", *noise_lines(rows, args.warmup)]))
        return 0
    stop_on_sigterm()
    command = "python -m benchmarks.live.soak " + " ".join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    holder: dict[str, Any] = {}

    def observe(plane: chaos.Plane, driver: chaos.Driver) -> Callable[[], None]:
        sampler = Sampler(plane, driver, args.sample, workdir=out / "reference")
        holder["sampler"] = sampler
        holder["nodes"] = len(plane.node_objs)
        holder["slices"] = len(plane.dra_nodes)
        holder["config"] = scheduler_config_kind(plane.replicas[0].ks.config_file)
        log(f"kube-scheduler configuration: {holder['config']}")
        log(f"sampling every {args.sample:.0f}s for {args.duration:.0f}s")
        return sampler.start()

    result, version = chaos.run(args, observe=observe)
    sampler: Sampler = holder["sampler"]
    table = drifts(
        sampler.rows,
        args.warmup,
        args.drift,
        ceilings(sampler.rows, args, holder["nodes"], holder["slices"]),
    )
    stores = store_drifts(sampler.stores, sampler.caps, args.warmup, args.drift)
    md = markdown(table, result, sampler, args, version, command, holder["config"], stores)
    write(out, sampler, [*table, *stores], md, result)
    print(md)
    if args.results:
        res = REPO / "benchmarks" / "results"
        (res / "live-soak.md").write_text(md)
        (res / "live-soak.csv").write_text((out / "summary.csv").read_text())
        (res / "live-soak.samples.csv").write_text((out / "samples.csv").read_text())
        (res / "live-soak.stores.csv").write_text((out / "stores.csv").read_text())
    bad = (
        result.violations
        or result.pending_after_settle
        or result.ledger_diff
        or not all(d.holds for d in (*table, *stores))
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
