"""Live benchmark runner: one arrival sequence through the real kube-scheduler with topoplace
as extender, through default-scheduler alone (its own kube-scheduler process, with the
same API client limits and ``percentageOfNodesToScore: 100``, and optionally the adaptive
default), and through the offline engine.

Steps: start a loopback control plane (the test cluster, :mod:`benchmarks.cluster`: etcd
and kube-apiserver from ``--kube-bin``, no kube-scheduler: every arm runs its own), create the scenario's nodes (parallel raw REST), measure the bind floor
(``POST pods/<name>/binding`` with no scheduler running), replay the sequence offline on
the very Node objects the API server holds, then per run and arm:

* start only that arm's processes: ``topoplace serve --kubeconfig`` and kube-scheduler with
  the configuration topoplace ships (profile ``topoplace``) for the ``topoplace`` arm; a
  kube-scheduler with one plain profile and no extender (:func:`render_default_config`)
  for ``default`` (``percentageOfNodesToScore: 100``) and ``default-adaptive`` (unset);
  both with ``clientConnection`` qps 500 / burst 1000;
* hand it the pods in arrival order as a backlog (``--release``, see :data:`RELEASES`):
  by default every pod is created before the arm's kube-scheduler starts, so that it
  finds them all queued, in arrival order, and no client competes with it;
* watch the bindings until all are bound or nothing moves for ``--idle-timeout`` seconds;
  read CPU seconds of topoplace, kube-scheduler, kube-apiserver and etcd
  (``/proc/<pid>/stat``), the host's CPU share and load, and both schedulers' metrics;
* stop the arm's processes and delete the pods.

Arms alternate their order from one run to the next. Everything started is stopped by pid;
the plane's folder is removed unless ``--keep-work``.

Example (small; the acceptance scale is ``--nodes 500 --big 100 --small 2000``)::

    python -m benchmarks.live.run --scenario mix --nodes 50 --big 10 --small 200 \\
        --out /tmp/livebench-out

Scenario files (``benchmarks/scenarios/*.yaml``, the offline engine's format) replay the
same way: ``--scenario-file PATH [--seed N]`` takes the nodes and the pods of the file's
first run from :func:`benchmarks.engine.replay.from_inputs` (Node objects as the file makes
them; Pods in arrival order, a gang's members together with ``topoplace.io/gang`` /
``gang-size`` / ``topology-required`` / ``-preferred``). ``--max-pods N`` keeps whole jobs
in arrival order, ``--until S`` the jobs arriving up to scenario time S (also the run's
horizon, live and offline). Pods that leave are deleted while an arm runs: an explicit
departure at that time after the first release, a duration after the pod (a gang: its last
member) was bound; ``--time-scale X`` runs X scenario seconds per live second. By default
the pods are a backlog in arrival order (``--release cold``); ``--release timed`` creates
each at its arrival time. The offline column is then the offline engine
(:mod:`benchmarks.live.scenariofile`) on the same file, seed and jobs: every job at time 0
for a backlog, the file's times for ``timed``; the file's ``params`` go to the live
topoplace as well (``policy.yaml`` in the results). ``--scenario-file
benchmarks/scenarios/mix.yaml`` creates the nodes and pods of ``--scenario mix --nodes 500
--big 100 --small 2000`` (same names, order, GPUs, CPU, memory, product and leaf/spine
labels; the file's nodes also carry GFD's family/memory labels)::

    python -m benchmarks.live.run --scenario-file benchmarks/scenarios/gangs-h100.yaml \
        --until 10800 --release timed --time-scale 30 --out /tmp/livebench-gangs

Results: ``summary.md`` (conditions, medians over runs, gaps, costs, bind floor),
``runs.csv`` (one row per run and arm), ``pods-<arm>-<run>.csv`` (node and latency of every
pod), ``bind-floor.csv``, the rendered ``scheduler-config*.yaml``, and with ``--py-spy``
``pyspy-topoplace-<run>.txt`` (raw stacks) and ``pyspy-top-<run>.txt`` (hot spots).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import heapq
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.cluster import Cluster, Ports
from benchmarks.cluster.cluster import recorded_pid, stop_recorded
from benchmarks.engine.scenario import ScenarioError
from benchmarks.live.kubeapi import Api, parallel
from benchmarks.live.kubesched import (
    DEFAULT_KUBE_BIN,
    REPO,
    TRANSPORT_CONFIGS,
    KubeScheduler,
    Topoplace,
    binary_version,
    cpu_seconds,
    extender_transport,
    extender_uses_tls,
    host_cpu_busy,
    load_shipped,
    make_certs,
    pin,
    profile_names,
    render_default_config,
    render_shipped_config,
)
from benchmarks.live.metrics import (
    API_SERIES,
    Figures,
    apiserver_calls,
    compare_with_offline,
    histogram_ms,
    metric_deltas,
    parse_prometheus,
    percentile,
    placement_figures,
    timing_figures,
)
from benchmarks.live.offline import OfflineResult, replay
from benchmarks.live.scenario import (
    HOLD_GATE,
    PHASE_LABEL,
    RUN_LABEL,
    PodSpec,
    Scenario,
    mix_scenario,
    openb_scenario,
)
from benchmarks.live.scenariofile import FileReplay, engine_offline, load_file, merged_policy

ARMS = ("topoplace", "default", "default-adaptive")
DEFAULT_ARMS: dict[str, tuple[str, int | None]] = {
    # arm -> (profile name, percentageOfNodesToScore); a plain default profile under its
    # own name, so that no other scheduler of a shared plane takes its pods
    "default": ("bench-default-100", 100),
    "default-adaptive": ("bench-default-adaptive", None),
}
ARM_TITLES = {
    "topoplace": "live topoplace",
    "default": "live default-scheduler (100 %)",
    "default-adaptive": "live default-scheduler (adaptive %)",
}
CLIENT_QPS, CLIENT_BURST = 500, 1000
"""The comparison arms' API client limits: those topoplace's shipped configuration sets."""


def log(msg: str) -> None:
    print(f"[livebench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- control plane --------------------------------------------------------------------------


@dataclass
class Plane:
    """A loopback control plane of the test cluster (:class:`benchmarks.cluster.Cluster`:
    etcd and kube-apiserver, no kube-scheduler: every arm runs its own), stopped by pid."""

    work: Path
    kube_bin: Path
    api_port: int
    etcd_port: int
    etcd_peer_port: int
    dra: bool = False
    """Serve ``resource.k8s.io`` (the gates and runtime config 1.32/1.33 need; on by
    default from 1.34)."""
    feature_gates: tuple[str, ...] = ()
    kubeconfig: str = ""
    cluster: Cluster | None = None

    @classmethod
    def from_args(
        cls,
        work: Path,
        args: argparse.Namespace,
        *,
        dra: bool = False,
        feature_gates: Sequence[str] = (),
    ) -> Plane:
        """A plane in ``work`` with the binaries and ports of a runner's flags."""
        return cls(
            work,
            Path(args.kube_bin),
            args.api_port,
            args.etcd_port,
            args.etcd_peer_port,
            dra=dra,
            feature_gates=tuple(feature_gates),
        )

    def up(self) -> str:
        """Start it; the kubeconfig path (logs in ``work/logs``)."""
        self.cluster = Cluster(
            self.kube_bin,
            self.work,
            ports=Ports(api=self.api_port, etcd=self.etcd_port, etcd_peer=self.etcd_peer_port),
            dra=self.dra,
            feature_gates=self.feature_gates,
        )
        self.kubeconfig = self.cluster.up()
        return self.kubeconfig

    def pid(self, name: str) -> int | None:
        """The pid of ``name`` (``etcd``, ``kube-apiserver``) if it still runs."""
        return recorded_pid(self.work.resolve(), name)

    def down(self, purge: bool) -> None:
        """Stop what it started (by pid); with ``purge`` also remove its folder."""
        if self.cluster is not None:
            self.cluster.down()
        else:
            stop_recorded(self.work.resolve())
        if purge:
            shutil.rmtree(self.work, ignore_errors=True)


# ---- one arm --------------------------------------------------------------------------------


@dataclass
class ArmResult:
    figures: Figures
    nodes_of: dict[str, str] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    """Pod -> when it was released to the scheduler (create, or ungate, request sent)."""
    bound: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    """Pod -> when its deletion was sent (it left: :class:`Departures`)."""


@dataclass
class Probes:
    """What an arm reads just before the first release and just after the last bind: CPU
    time of the processes that take part, the host's CPU and load, topoplace's and
    kube-scheduler's metrics."""

    pids: dict[str, int | None] = field(default_factory=dict)
    """Other processes (``apiserver``, ``etcd``) -> pid (None: absent)."""
    topoplace: Topoplace | None = None
    kube_scheduler: KubeScheduler | None = None
    scheduler_metrics: Callable[[], str] | None = None
    apiserver_metrics: Callable[[], str] | None = None

    def snap(self, metrics_first: bool, scrape: bool = True) -> dict[str, Any]:
        """One reading. Metrics are scraped before the CPU times at the start and after
        them at the end (``metrics_first``), so no scrape is counted in the arm's CPU;
        ``scrape=False`` reads only CPU and load."""
        out: dict[str, Any] = {"tp": {}, "ks": {}}

        def do_scrape() -> None:
            if not scrape:
                return
            out["tp"] = parse_prometheus(self.topoplace.metrics()) if self.topoplace else {}
            sm: dict[str, float] = {}
            if self.scheduler_metrics is not None:
                with contextlib.suppress(Exception):
                    sm = parse_prometheus(self.scheduler_metrics())
            out["ks"] = sm
            am: dict[str, float] = {}
            if self.apiserver_metrics is not None:
                with contextlib.suppress(Exception):
                    text = self.apiserver_metrics()
                    am = parse_prometheus(
                        "\n".join(ln for ln in text.splitlines() if ln.startswith(API_SERIES))
                    )
            out["api"] = am

        if metrics_first:
            do_scrape()
        pids = {
            "topoplace": self.topoplace.pid if self.topoplace else None,
            "kube_scheduler": self.kube_scheduler.pid if self.kube_scheduler else None,
            **self.pids,
        }
        out["cpu"] = {k: cpu_seconds(p) for k, p in pids.items()}
        out["host"] = host_cpu_busy()
        out["load1"] = os.getloadavg()[0]
        if not metrics_first:
            do_scrape()
        return out


def cost_figures(
    fig: Figures,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    profile: str,
    before_metrics: Mapping[str, Any] | None = None,
) -> Figures:
    """CPU, load and the schedulers' own latency figures of an arm from two readings
    (metrics from ``before_metrics`` when given: the CPU reading may be a later one)."""
    d = {k: after["cpu"].get(k, math.nan) - v for k, v in before["cpu"].items()}
    fig.cpu_topoplace_s = d.get("topoplace", math.nan)
    fig.cpu_kube_scheduler_s = d.get("kube_scheduler", math.nan)
    fig.cpu_apiserver_s = d.get("apiserver", math.nan)
    fig.cpu_etcd_s = d.get("etcd", math.nan)
    if fig.pods_bound:
        fig.cpu_ms_per_pod_topoplace = 1000 * fig.cpu_topoplace_s / fig.pods_bound
        fig.cpu_ms_per_pod_kube_scheduler = 1000 * fig.cpu_kube_scheduler_s / fig.pods_bound
    (b0, t0), (b1, t1) = before["host"], after["host"]
    fig.host_busy_share = (b1 - b0) / (t1 - t0) if t1 > t0 else math.nan
    ours = sum(v for v in d.values() if not math.isnan(v))
    # /proc/stat counts jiffies over all cores: the arm's CPU capacity
    fig.bench_cpu_share = ours * os.sysconf("SC_CLK_TCK") / (t1 - t0) if t1 > t0 else math.nan
    fig.load1_start, fig.load1_end = before["load1"], after["load1"]
    mb = before_metrics if before_metrics is not None else before
    ks0, ks1 = mb.get("ks") or {}, after.get("ks") or {}
    if ks1:
        att = histogram_ms(
            ks0,
            ks1,
            "scheduler_scheduling_attempt_duration_seconds",
            profile=profile,
            result="scheduled",
        )
        fig.sched_attempt_mean_ms = att["mean_ms"]
        fig.sched_attempt_p99_ms = att["p99_ms"]
        bind = histogram_ms(
            ks0,
            ks1,
            "scheduler_framework_extension_point_duration_seconds",
            extension_point="Bind",
            profile=profile,
        )
        fig.sched_bind_mean_ms = bind["mean_ms"]
    tp0, tp1 = mb.get("tp") or {}, after.get("tp") or {}
    if tp1:
        flt = histogram_ms(tp0, tp1, "topoplace_request_seconds", verb="filter")
        bnd = histogram_ms(tp0, tp1, "topoplace_request_seconds", verb="bind")
        fig.tp_filter_mean_ms, fig.tp_filter_p99_ms = flt["mean_ms"], flt["p99_ms"]
        fig.tp_bind_mean_ms = bnd["mean_ms"]
        fig.tp_bind_p50_ms, fig.tp_bind_p99_ms = bnd["p50_ms"], bnd["p99_ms"]
        fig.extra.update(metric_deltas(tp0, tp1))
    fig.extra.update(apiserver_calls(mb.get("api") or {}, after.get("api") or {}))
    return fig


RELEASES = ("cold", "ungate", "create", "timed")
"""How an arm hands its pods to the scheduler (``--release``):

* ``cold``: a backlog the scheduler finds at start. Every pod is created (one client, arrival
  order) while the arm's kube-scheduler is not running yet, under a name that sorts in
  arrival order (``aNNNNN-<name>``), then kube-scheduler starts: its informer lists them
  in that order and queues them all before its first scheduling cycle (it waits for its
  caches), so it schedules them strictly in arrival order, and no client competes with it
  for the CPU. Throughput and CPU are taken from the first bind to the last.
* ``ungate``: a backlog released by clients. Every pod is created held by a scheduling
  gate while the scheduler runs, then the gates are removed in arrival order by
  ``ungate_workers`` concurrent clients (order kept to within that many pods).
* ``create``: the pods are created one after another (``create_workers`` clients).
* ``timed``: each pod is created at its arrival time in the scenario (scenario seconds /
  ``time_scale`` after the first release), the scheduler running (scenario files with
  arrival times).

Pods that leave (a scenario file's ``depart`` or ``duration``) are deleted by
:class:`Departures` while the arm runs, whatever the release."""


class Departures:
    """Deletes the arm's pods when the scenario says they leave, on a thread of its own.

    A pod with an explicit departure is deleted ``depart / time_scale`` seconds after the
    first release (bound or not: the offline engine drops it from its queue too); a pod
    with a duration ``duration / time_scale`` seconds after it was bound, a gang's members
    all together that long after its last member was bound (the offline engine starts a
    gang's work when all its members are placed). Deletions use grace period 0 (no
    kubelet confirms them).
    """

    def __init__(
        self,
        api: Api,
        namespace: str,
        scenario: Scenario,
        live_name: Mapping[str, str],
        time_scale: float = 1.0,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.api = api
        self.namespace = namespace
        self.scale = time_scale
        self.live_name = dict(live_name)
        self.pods = {p.name: p for p in scenario.pods}
        self.gangs = scenario.gangs()
        self.deleted: dict[str, float] = {}
        """Pod -> when its deletion was sent (monotonic)."""
        self.errors: list[str] = []
        self._heap: list[tuple[float, int, tuple[str, ...]]] = []
        self._seq = 0
        self._bound: dict[str, float] = {}
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """True if some pod of the scenario leaves."""
        return any(p.depart is not None or p.duration is not None for p in self.pods.values())

    def _push(self, t: float, names: Sequence[str]) -> None:
        heapq.heappush(self._heap, (t, self._seq, tuple(names)))
        self._seq += 1
        self._cv.notify()

    def start(self, t_release: float) -> None:
        """Schedule the explicit departures (relative to ``t_release``) and start deleting."""
        with self._cv:
            for p in self.pods.values():
                if p.depart is not None:
                    self._push(t_release + p.depart / self.scale, [p.name])
        self._thread = threading.Thread(target=self._loop, name="departures", daemon=True)
        self._thread.start()

    def bound(self, name: str, t: float) -> None:
        """Pod ``name`` was seen bound at ``t``: schedule its end of work, if it has one."""
        p = self.pods.get(name)
        if p is None or p.duration is None:
            return
        with self._cv:
            self._bound[name] = t
            if not p.gang:
                self._push(t + p.duration / self.scale, [name])
                return
            members = self.gangs[p.gang]
            if all(m in self._bound for m in members):
                last = max(self._bound[m] for m in members)
                self._push(last + p.duration / self.scale, members)

    def planned(self) -> list[tuple[float, tuple[str, ...]]]:
        """Deletions scheduled and not yet sent: (monotonic time, pods), earliest first."""
        with self._cv:
            return [(t, n) for t, _, n in sorted(self._heap)]

    def pending(self) -> int:
        """Deletions scheduled and not yet sent."""
        with self._cv:
            return sum(len(n) for _, _, n in self._heap)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(timeout=wait)
                if self._stop:
                    return
                _, _, names = heapq.heappop(self._heap)
            for n in names:
                if n in self.deleted:
                    continue
                self.deleted[n] = time.monotonic()
                try:
                    self.api.delete_pod(self.namespace, self.live_name.get(n, n))
                except Exception as exc:  # reported with the arm
                    self.errors.append(f"{n}: {exc}")

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(5.0)


def run_arm(
    api: Api,
    scenario: Scenario,
    *,
    arm: str,
    scheduler_name: str,
    run: int,
    run_id: str,
    namespace: str,
    labels: Mapping[str, Any],
    timeout: float,
    idle_timeout: float,
    rate: float = 0.0,
    probes: Probes | None = None,
    create_workers: int = 1,
    release: str = "cold",
    ungate_workers: int = 4,
    settle: float = 2.0,
    launch: Callable[[], Any] | None = None,
    on_release: Callable[[], None] | None = None,
    time_scale: float = 1.0,
    horizon: float | None = None,
) -> ArmResult:
    """Release the scenario's pods to ``scheduler_name`` in arrival order (see
    :data:`RELEASES`), delete those that leave (:class:`Departures`), watch them bind, take
    the figures.

    ``launch`` starts the scheduler (``cold`` only: it must not be running before).
    ``on_release`` is called just before the release (e.g. to start a profiler).
    ``time_scale``: scenario seconds per live second (arrivals, departures, durations);
    ``horizon``: scenario seconds after the first release at which the arm stops (pods bound
    later do not count, as the offline engine's horizon)."""
    if release not in RELEASES:
        raise ValueError(f"release must be one of {RELEASES}")
    cold = release == "cold"
    if cold and launch is None:
        raise ValueError("release 'cold' needs launch (the scheduler starts after the pods)")
    phase = f"{arm}-{run}"
    selector = f"{PHASE_LABEL}={phase}"
    gate = HOLD_GATE if release == "ungate" else ""
    pods = [p.to_object(namespace, scheduler_name, run_id, phase, gate) for p in scenario.pods]
    live_name = {p.name: p.name for p in scenario.pods}
    if cold:
        width = max(5, len(str(len(pods))))
        for i, (sp, obj) in enumerate(zip(scenario.pods, pods, strict=True)):
            live_name[sp.name] = obj["metadata"]["name"] = f"a{i:0{width}d}-{sp.name}"
    scenario_name = {v: k for k, v in live_name.items()}
    deps = Departures(api, namespace, scenario, live_name, time_scale)
    path = f"/api/v1/namespaces/{namespace}/pods"
    rv = api.list_pods(namespace, selector)["metadata"]["resourceVersion"]
    res = ArmResult(Figures(arm=arm, run=run, release=release))
    lock = threading.Lock()
    last = [time.monotonic()]
    errors: list[BaseException] = []
    first: dict[str, Any] = {}

    def on_event(kind: str, obj: dict[str, Any], t: float) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        node = (obj.get("spec") or {}).get("nodeName")
        name = scenario_name.get(obj["metadata"]["name"], obj["metadata"]["name"])
        if node:
            with lock:
                if name not in res.bound:
                    if not res.bound and cold and probes is not None:
                        first.update(probes.snap(metrics_first=False, scrape=False))
                    res.bound[name] = t
                    res.nodes_of[name] = node
                    last[0] = t
                    if deps.active:
                        deps.bound(name, t)

    stop = threading.Event()

    def watch() -> None:
        try:
            api.watch(path, rv, on_event, stop, server_timeout=5, label_selector=selector)
        except BaseException as exc:  # reported after the arm
            errors.append(exc)

    th = threading.Thread(target=watch, name=f"watch-{phase}", daemon=True)
    th.start()
    time.sleep(0.2)  # let the watch connect

    def in_order(
        workers: int,
        due: Callable[[int], float | None],
        act: Callable[[dict[str, Any]], Any],
        stamp: bool,
    ) -> None:
        """``act`` on every pod, handed out in arrival order to ``workers`` threads, each
        taken no earlier than ``due(i)`` (None: at once); ``stamp`` records when."""
        order = iter(enumerate(pods))
        take = threading.Lock()

        def worker() -> None:
            while True:
                with take:  # hand pods out in arrival order
                    item = next(order, None)
                    if item is None:
                        return
                    i, pod = item
                    at = due(i)
                    wait = at - time.monotonic() if at is not None else 0.0
                    if wait > 0:
                        time.sleep(wait)
                    if stamp:
                        res.created[scenario.pods[i].name] = time.monotonic()
                act(pod)

        parallel(lambda _: worker(), list(range(workers)), workers)

    def create_all(workers: int) -> float:
        t = time.monotonic()

        def due(i: int) -> float | None:
            if rate > 0 and release == "create":
                return t + i / rate
            if release == "timed":
                return t + scenario.pods[i].arrive / time_scale
            return None

        in_order(workers, due, lambda pod: api.create_pod(namespace, pod), release != "ungate")
        return time.monotonic() - t

    if release not in ("create", "timed"):
        secs = create_all(1 if cold else create_workers)
        what = "ready for the scheduler to start" if cold else f"held by gate {HOLD_GATE}"
        log(f"{phase}: {len(pods)} pods created ({what}) in {secs:.1f}s; settling {settle:g}s")
        time.sleep(settle)
    before = probes.snap(metrics_first=True) if probes else {}
    if on_release is not None:
        on_release()
    t_start = time.monotonic()
    if deps.active:
        deps.start(t_start)
    if cold:
        assert launch is not None
        res.created.clear()
        launch()
        t_created = t_start
        log(f"{phase}: scheduler started {time.monotonic() - t_start:.1f}s after launch")
    elif release == "ungate":
        in_order(
            ungate_workers,
            lambda i: t_start + i / rate if rate > 0 else None,
            lambda pod: api.ungate_pod(namespace, pod["metadata"]["name"]),
            True,
        )
        t_created = time.monotonic()
        log(f"{phase}: {len(pods)} pods ungated in {t_created - t_start:.1f}s")
    else:
        create_all(create_workers)
        t_created = time.monotonic()
        log(f"{phase}: {len(pods)} pods created in {t_created - t_start:.1f}s")
    with lock:
        last[0] = max(last[0], t_created)
    n = len(pods)
    reported = 0.0
    t_horizon = t_start + horizon / time_scale if horizon is not None else math.inf
    while True:
        now = time.monotonic()
        gone = dict(deps.deleted)
        with lock:
            done = len(res.bound.keys() | gone.keys())
            idle = now - max(last[0], max(gone.values(), default=0.0))
        if deps.pending() and done < n:
            idle = 0.0  # pods wait for the departures still to come
        if done >= n or now - t_start > timeout or now > t_horizon or idle > idle_timeout or errors:
            break
        if now - reported > 10:
            log(
                f"{phase}: {len(res.bound)}/{n} bound"
                + (f", {len(gone)} deleted" if deps.active else "")
            )
            reported = now
        time.sleep(0.05)
    t_end = time.monotonic()
    deps.stop()
    res.deleted = dict(deps.deleted)
    if deps.errors:
        log(f"{phase}: {len(deps.errors)} deletions failed, first: {deps.errors[0]}")
    if horizon is not None:
        with lock:
            late = [k for k, t in res.bound.items() if t > t_horizon]
            for k in late:
                del res.bound[k]
                res.nodes_of.pop(k, None)
    after = probes.snap(metrics_first=False) if probes else {}
    stop.set()
    th.join(1.0)  # a daemon; its stream ends within server_timeout
    if errors:
        log(f"{phase}: watch failed: {errors[0]}")
    # Reconcile with a list (a binding the watch missed still counts, without a time).
    pending: Counter[str] = Counter()
    for obj in api.list_pods(namespace, selector).get("items") or []:
        name = scenario_name.get(obj["metadata"]["name"], obj["metadata"]["name"])
        node = (obj.get("spec") or {}).get("nodeName")
        if node:
            if horizon is None:
                res.nodes_of.setdefault(name, node)
        else:
            msg = next(
                (
                    c.get("message") or c.get("reason") or ""
                    for c in (obj.get("status") or {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"
                ),
                "no PodScheduled condition",
            )
            pending[msg[:160]] += 1
    fig = placement_figures(res.figures, scenario, res.nodes_of, labels)
    if cold:
        # the backlog is there from the start: time from the first bind to the last
        t0 = min(res.bound.values(), default=t_start)
        res.created = dict.fromkeys((p.name for p in scenario.pods), t_start)
        timing_figures(fig, scenario, res.created, res.bound, t_start, t_end)
        if len(res.bound) > 1:
            span = max(res.bound.values()) - t0
            fig.seconds = span
            fig.pods_per_s = (len(res.bound) - 1) / span if span > 0 else math.nan
        fig.create_seconds = fig.release_per_s = fig.drain_s = math.nan
        fig.startup_s = t0 - t_start
    else:
        timing_figures(fig, scenario, res.created, res.bound, t_created, t_end)
    fig.pending_reasons = "; ".join(f"{k} (x{v})" for k, v in pending.most_common(3))
    if scenario.lifetimes or release == "timed":
        # arrival -> bound in scenario seconds (a backlog arrives at its first bind)
        zero = min(res.bound.values(), default=t_start) if cold else None
        waits = [
            (b - (zero if zero is not None else res.created.get(k, b))) * time_scale
            for k, b in res.bound.items()
        ]
        fig.wait_mean_scn_s = statistics.fmean(waits) if waits else math.nan
        fig.pods_deleted = len(res.deleted)
    if probes is not None:
        cost_figures(fig, first or before, after, scheduler_name, before_metrics=before)
        per = fig.pods_bound - 1 if cold else fig.pods_bound  # pods between the readings
        if cold and per > 0:
            fig.cpu_ms_per_pod_topoplace = 1000 * fig.cpu_topoplace_s / per
            fig.cpu_ms_per_pod_kube_scheduler = 1000 * fig.cpu_kube_scheduler_s / per
        cpu = [fig.cpu_topoplace_s, fig.cpu_kube_scheduler_s, fig.cpu_apiserver_s, fig.cpu_etcd_s]
        total = sum(c for c in cpu if not math.isnan(c))
        fig.pods_per_cpu_s = per / total if total > 0 else math.nan
    log(
        f"{phase}: {fig.pods_bound}/{fig.pods} bound in {fig.seconds:.1f}s "
        f"({fig.pods_per_s:.1f} pods/s), nodes used {fig.nodes_used}, "
        f"whole nodes free {fig.whole_nodes_free}, CPU topoplace {fig.cpu_topoplace_s:.1f}s "
        f"kube-scheduler {fig.cpu_kube_scheduler_s:.1f}s, host busy {fig.host_busy_share:.0%}"
    )
    return res


def wait_topoplace_free(tp: Topoplace, scenario: Scenario, timeout: float = 120) -> None:
    """Until topoplace's cache shows every GPU of the scenario's nodes free."""
    want = {n.name: n.gpus for n in scenario.nodes}
    deadline = time.monotonic() + timeout
    while True:
        got = {n["name"]: n.get("free_gpus") for n in tp.get("/v1/inspect/nodes")["nodes"]}
        if all(got.get(k) == v for k, v in want.items()):
            return
        if time.monotonic() > deadline:
            busy = [k for k, v in want.items() if got.get(k) != v][:5]
            raise RuntimeError(f"topoplace still shows GPUs in use after {timeout}s: {busy}")
        time.sleep(0.5)


# ---- the bind floor -------------------------------------------------------------------------

NOBODY = "livebench-nobody"
"""schedulerName of the bind-floor pods: no scheduler serves it, the benchmark binds them."""


def measure_bind_floor(
    api: Api,
    scenario: Scenario,
    *,
    namespace: str,
    run_id: str,
    pods: int = 400,
    workers: Sequence[int] = (1, 8),
) -> list[dict[str, Any]]:
    """The raw cost of the API write every bind ends in: ``pods`` one-GPU pods (the
    scenario's first one-GPU pod's shape) for a scheduler that does not exist, then
    ``POST pods/<name>/binding`` for each, one share sequentially and the others with more
    concurrent clients (``workers``), nodes round robin. One row per setting: requests,
    seconds, binds/s, latency p50/p99/mean (ms)."""
    shape = next((p for p in scenario.pods if p.gpus == 1), scenario.pods[0])
    names = [n.name for n in scenario.nodes]
    share = max(1, pods // len(workers))
    rows: list[dict[str, Any]] = []
    for k, w in enumerate(workers):
        phase = f"bindfloor-{w}"
        objs = [
            PodSpec(
                f"bindfloor-{w}-{i:04d}", shape.gpus, shape.cpu_milli, shape.memory_mib
            ).to_object(namespace, NOBODY, run_id, phase)
            for i in range(share)
        ]
        parallel(lambda o: api.create_pod(namespace, o), objs, 8)

        def bind(item: tuple[int, dict[str, Any]], k: int = k) -> float:
            i, obj = item
            t = time.perf_counter()
            api.bind_pod(namespace, obj["metadata"]["name"], names[(i + k) % len(names)])
            return time.perf_counter() - t

        t0 = time.perf_counter()
        lat: list[float] = parallel(bind, list(enumerate(objs)), w)
        secs = time.perf_counter() - t0
        rows.append(
            {
                "clients": w,
                "binds": len(lat),
                "seconds": round(secs, 3),
                "binds_per_s": round(len(lat) / secs, 1),
                "p50_ms": round(1000 * percentile(lat, 50), 2),
                "p99_ms": round(1000 * percentile(lat, 99), 2),
                "mean_ms": round(1000 * statistics.fmean(lat), 2),
            }
        )
        log(f"bind floor, {w} client(s): {rows[-1]}")
    api.delete_pods(namespace)
    return rows


# ---- profiling --------------------------------------------------------------------------


class PySpy:
    """``py-spy record`` of one process (raw collapsed stacks), stopped with SIGINT."""

    def __init__(self, binary: str, pid: int, out: Path, rate: int = 100) -> None:
        self.cmd = [binary, "record", "--pid", str(pid), "--rate", str(rate)]
        self.cmd += ["--format", "raw", "--gil", "--output", str(out)]
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.DEVNULL,
            stderr=open(self.out.with_suffix(".log"), "wb"),  # noqa: SIM115
            stdin=subprocess.DEVNULL,
        )
        time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _frame(f: str) -> str:
    """``func (path/file.py:123)`` -> ``file.py:func`` (the path shortened to the repo)."""
    name, _, loc = f.partition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/lib/python3", str(REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{name}"


def profile_top(raw: str, n: int = 25) -> str:
    """Top functions of a py-spy raw (collapsed) profile: by own samples and inclusive."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, cnt = line.rpartition(" ")
        if not stack or not cnt.isdigit():
            continue
        c = int(cnt)
        frames = [_frame(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += c
        own[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    out = [f"samples: {total}", "", "own time (the function itself):"]
    out += [f"{100 * c / total:6.1f}%  {f}" for f, c in own.most_common(n)] if total else []
    out += ["", "inclusive (the function and what it calls):"]
    out += [f"{100 * c / total:6.1f}%  {f}" for f, c in incl.most_common(n)] if total else []
    return "\n".join(out)


# ---- report ---------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else math.nan


def median_figures(figs: Sequence[Figures]) -> dict[str, float]:
    """Median over runs of every numeric field."""
    out: dict[str, float] = {}
    if not figs:
        return out
    for k, v in figs[0].row().items():
        if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("run",):
            out[k] = _median([f.row().get(k, math.nan) for f in figs])
    return out


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() else f"{v:.{nd}f}"
    return str(v)


ROWS: tuple[tuple[str, str, bool], ...] = (
    # (label, field, gap computed against offline)
    ("pods bound", "pods_bound", True),
    ("GPUs bound", "gpus_bound", True),
    ("allocation ratio", "allocation_ratio", True),
    ("nodes used", "nodes_used", True),
    ("whole nodes free", "whole_nodes_free", True),
    ("whole 8-GPU nodes free", "whole_8gpu_nodes_free", True),
    ("free GPUs on partly used nodes (fragmentation)", "frag_free_gpus", True),
    ("fragmentation share of free GPUs", "frag_share", True),
    ("pods/s (first release -> last bind; cold: first bind -> last)", "pods_per_s", False),
    ("cold: kube-scheduler launch -> first bind, s", "startup_s", False),
    ("releasing the pods took, s", "create_seconds", False),
    ("releases/s (client)", "release_per_s", False),
    ("last bind after the last release, s", "drain_s", False),
    ("latency release -> bind p50, s", "latency_p50", False),
    ("latency release -> bind p99, s", "latency_p99", False),
    ("kube-scheduler cycle start -> bound, mean ms", "sched_attempt_mean_ms", False),
    ("kube-scheduler cycle start -> bound, p99 ms", "sched_attempt_p99_ms", False),
    ("kube-scheduler Bind plugin mean, ms (10 % sample)", "sched_bind_mean_ms", False),
    ("topoplace filter mean, ms (server side)", "tp_filter_mean_ms", False),
    ("topoplace filter p99, ms", "tp_filter_p99_ms", False),
    ("topoplace bind mean, ms (server side, API write included)", "tp_bind_mean_ms", False),
    ("topoplace bind p50, ms", "tp_bind_p50_ms", False),
    ("topoplace bind p99, ms", "tp_bind_p99_ms", False),
    ("CPU s topoplace", "cpu_topoplace_s", False),
    ("CPU ms per pod topoplace", "cpu_ms_per_pod_topoplace", False),
    ("CPU s kube-scheduler", "cpu_kube_scheduler_s", False),
    ("CPU ms per pod kube-scheduler", "cpu_ms_per_pod_kube_scheduler", False),
    ("CPU s kube-apiserver", "cpu_apiserver_s", False),
    ("CPU s etcd", "cpu_etcd_s", False),
    ("host CPU busy during the arm (2 cores = 100 %)", "host_busy_share", False),
    ("share of the host's CPU used by the arm's processes", "bench_cpu_share", False),
    ("pods per CPU second of the arm's processes", "pods_per_cpu_s", False),
    ("load average (1 min) at the end", "load1_end", False),
    ("gangs complete", "gangs_complete", True),
    ("gangs partly bound at the end", "gangs_partial_at_end", True),
    ("longest partly-bound window, s", "gang_partial_max_s", False),
    ("gangs partly bound at one instant (max)", "gangs_partial_max_concurrent", False),
    ("most leaves one gang spans", "gang_leaves_max", True),
    ("mean wait arrival -> bound, scenario s", "wait_mean_scn_s", True),
    ("pods deleted (left as the scenario says)", "pods_deleted", False),
    ("pods placed as offline (same node, or unplaced in both)", "same_node_as_offline", False),
    ("first pod placed elsewhere than offline (arrival index)", "first_divergence", False),
)


def speed_ratios(med: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """topoplace's median pods/s over each default arm's."""
    tp = (med.get("topoplace") or {}).get("pods_per_s", math.nan)
    return {
        arm: tp / m["pods_per_s"]
        for arm, m in med.items()
        if arm != "topoplace" and m.get("pods_per_s") and not math.isnan(tp)
    }


def paired_ratios(live: Mapping[str, Sequence[Figures]]) -> dict[str, list[float]]:
    """Per default arm, topoplace's pods/s over that arm's in the same run (runs are
    adjacent in time, so a slow spell of the host lands on both sides of one ratio)."""
    tp = {f.run: f.pods_per_s for f in live.get("topoplace") or ()}
    out: dict[str, list[float]] = {}
    for arm, figs in live.items():
        if arm == "topoplace":
            continue
        pairs = [
            tp[f.run] / f.pods_per_s
            for f in sorted(figs, key=lambda f: f.run)
            if f.run in tp and f.pods_per_s and not math.isnan(tp[f.run] / f.pods_per_s)
        ]
        if pairs:
            out[arm] = pairs
    return out


def render_summary(
    scenario: Scenario,
    conditions: Mapping[str, Any],
    live: Mapping[str, Sequence[Figures]],
    offline_fig: Figures | None,
    offline: OfflineResult | None,
    bind_floor: Sequence[Mapping[str, Any]] = (),
) -> str:
    med = {arm: median_figures(figs) for arm, figs in live.items() if figs}
    off = offline_fig.row() if offline_fig else {}
    lines = [f"# Live benchmark: {scenario.name}", ""]
    lines.append(f"Scenario: {scenario.description}.")
    lines.append("")
    lines.append("Conditions:")
    lines.append("")
    for k, v in conditions.items():
        lines.append(f"- {k}: {v}")
    lines.append("")
    if scenario.lifetimes:
        lines.append(
            "Pods leave during the run: the placement figures count every pod bound at some "
            "time before the arm ended (nodes used = nodes that ever held one of the "
            "scenario's pods; whole nodes free = nodes that never did; the offline column "
            "the same, from each job's first placement by the engine)."
        )
    else:
        lines.append(
            f"Best possible: {scenario.best_nodes_used()} nodes used, "
            f"{scenario.best_whole_free()} whole nodes free (a bound: fewest nodes, largest "
            "first, whose GPUs cover the request)."
        )
    lines.append("")
    ratios = speed_ratios(med)
    if ratios:
        lines.append(
            "Throughput, topoplace / default-scheduler (median pods/s): "
            + ", ".join(f"{ratio:.2f}x vs {ARM_TITLES[a][5:]}" for a, ratio in ratios.items())
            + "."
        )
        for arm, pairs in paired_ratios(live).items():
            if len(pairs) > 1:
                lines.append("")
                lines.append(
                    f"Run by run vs {ARM_TITLES[arm][5:]}: "
                    + ", ".join(f"{r:.2f}x" for r in pairs)
                    + f" (median {statistics.median(pairs):.2f}x)."
                )
        lines.append("")
    arms = [a for a in ARMS if a in med]
    head = ["figure"] + [ARM_TITLES[a] for a in arms]
    if offline_fig:
        head += ["offline (topoplace engine)", "gap live topoplace - offline"]
    lines.append("Medians over runs (latency: median of each run's p50 / p99):")
    lines.append("")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for label, key, gap in ROWS:
        if key.startswith("gang") and not scenario.gangs():
            continue
        if key in ("wait_mean_scn_s", "pods_deleted") and not scenario.lifetimes:
            continue
        vals = [med[a].get(key) for a in arms]
        if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals) and not gap:
            continue
        if key == "gang_leaves_max" and not any(vals):
            continue
        row = [label] + [_fmt(v) for v in vals]
        if offline_fig:
            ov = off.get(key)
            row.append(_fmt(ov) if gap else "")
            lv = med.get("topoplace", {}).get(key)
            if gap and lv is not None and ov is not None and not math.isnan(float(ov)):
                row.append(_fmt(float(lv) - float(ov)))
            else:
                row.append("")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if bind_floor:
        lines.append(
            "Bind floor: `POST pods/<name>/binding` sent by this benchmark's own client "
            "(Python, httpx) with no scheduler running, one-GPU pods, nodes round robin:"
        )
        lines.append("")
        lines.append("| clients | binds | binds/s | p50 ms | p99 ms | mean ms |")
        lines.append("|---|---|---|---|---|---|")
        for r in bind_floor:
            lines.append(
                f"| {r['clients']} | {r['binds']} | {r['binds_per_s']} | {r['p50_ms']} | "
                f"{r['p99_ms']} | {r['mean_ms']} |"
            )
        lines.append("")
    if offline is not None and offline.source == "engine":
        reasons = Counter(offline.refused.values())
        lines.append(
            f"Offline: {offline.engine}. {len(offline.placements)} pods placed, "
            f"{len(offline.refused)} not"
            + (
                " (" + ", ".join(f"{k}: {v}" for k, v in reasons.most_common()) + ")"
                if reasons
                else ""
            )
            + f", in {offline.seconds:.2f}s."
        )
        lines.append("")
    elif offline is not None:
        lines.append(
            f"Offline: {len(offline.placements)} placed, {len(offline.refused)} refused in "
            f"{offline.seconds:.2f}s; gang policy `{offline.policy}`; {offline.narrowed} pod(s) "
            "decided among the nodes kube-scheduler's own filters leave (CPU/memory/pods, "
            "node affinity), the others by `place_pod` over all nodes."
        )
        if offline.gangs and len(offline.gangs) <= 20:
            lines.append(
                "Offline gangs: " + ", ".join(f"{k}: {v}" for k, v in offline.gangs.items())
            )
        lines.append("")
    lines.append("Per run:")
    lines.append("")
    cols = [
        "arm",
        "run",
        "pods_bound",
        "nodes_used",
        "whole_nodes_free",
        "frag_free_gpus",
        "pods_per_s",
        "latency_p50",
        "latency_p99",
        "cpu_ms_per_pod_topoplace",
        "cpu_ms_per_pod_kube_scheduler",
        "host_busy_share",
        "bench_cpu_share",
        "load1_start",
        "gangs_partial_at_end",
        "gang_partial_max_s",
        "same_node_as_offline",
        "first_divergence",
    ]
    if not scenario.gangs():
        cols = [c for c in cols if not c.startswith("gang")]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for figs in live.values():
        for f in figs:
            r = f.row()
            lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    lines.append("")
    notes = []
    for figs in live.values():
        for f in figs:
            if f.pending_reasons:
                notes.append(f"- {f.arm} run {f.run}, pods left pending: {f.pending_reasons}")
            if f.extra:
                extra = ", ".join(f"{k}={_fmt(v, 3)}" for k, v in sorted(f.extra.items()))
                notes.append(f"- {f.arm} run {f.run}, metrics during the arm: {extra}")
    if notes:
        lines.append("Notes:")
        lines.append("")
        lines.extend(notes)
        lines.append("")
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        return
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(r.get(k)) for k in keys})


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else round(v, 6)
    return v


def pod_rows(
    scenario: Scenario, res: ArmResult, offline: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    rows = []
    t0 = min(res.created.values()) if res.created else 0.0
    for i, p in enumerate(scenario.pods):
        c, b = res.created.get(p.name), res.bound.get(p.name)
        row = {
            "arrival": i,
            "pod": p.name,
            "gpus": p.gpus,
            "gang": p.gang,
            "node": res.nodes_of.get(p.name, ""),
            "offline_node": (offline or {}).get(p.name, ""),
            "created_s": round(c - t0, 6) if c is not None else "",
            "bound_s": round(b - t0, 6) if b is not None else "",
            "latency_s": round(b - c, 6) if b is not None and c is not None else "",
        }
        if scenario.lifetimes or scenario.source:
            d = res.deleted.get(p.name)
            row["arrive_scn_s"] = p.arrive
            row["deleted_s"] = round(d - t0, 6) if d is not None else ""
        rows.append(row)
    return rows


# ---- main -----------------------------------------------------------------------------------


def build_scenario(args: argparse.Namespace) -> Scenario:
    """The scenario the flags describe (``--scenario-file``: also ``args.file_replay``)."""
    args.file_replay = None
    if args.scenario_file:
        fr = load_file(
            args.scenario_file,
            seed=args.seed,
            max_pods=args.max_pods,
            until=args.until,
            namespace=args.namespace,
        )
        args.file_replay = fr
        return fr.scenario
    if args.scenario == "mix":
        return mix_scenario(
            args.nodes,
            args.big,
            args.small,
            h100_share=args.h100_share,
            nodes_per_leaf=args.nodes_per_leaf,
            leaves_per_spine=args.leaves_per_spine,
            gangs=args.gangs,
            gang_size=args.gang_size,
            gang_gpus=args.gang_gpus,
            gang_preferred=args.gang_preferred,
        )
    return openb_scenario(
        args.workload,
        args.data,
        max_pods=args.max_pods,
        resources=args.resources,
        max_nodes=args.max_nodes,
    )


def _repo_path(path: str | Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    p = Path(path).resolve()
    return p.relative_to(REPO).as_posix() if p.is_relative_to(REPO) else str(p)


def transport_line(transport: str, config: str | Path) -> str:
    """The "extender transport" condition of a run's summary, from the configuration's own
    extender stanza (:func:`extender_transport`)."""
    where = _repo_path(config)
    if transport == "plain":
        return (
            f"plain HTTP on loopback as shipped ({where}: http://127.0.0.1 urlPrefix, no "
            "tlsConfig; topoplace serve --host 127.0.0.1 without --tls-*)"
        )
    what = "mTLS" if transport == "mtls" else "TLS without a client certificate"
    return (
        f"{what} ({where}: https urlPrefix, tlsConfig; the run's own CA and key pairs from "
        "`topoplace certs`; topoplace serve --tls-cert/--tls-key"
        + ("/--tls-client-ca)" if transport == "mtls" else ")")
    )


def _config_line(cfg: Mapping[str, Any]) -> str:
    """The knobs of the rendered scheduler configuration that matter for the figures."""
    conn = cfg.get("clientConnection") or {}
    ext = (cfg.get("extenders") or [{}])[0]
    prof = (cfg.get("profiles") or [{}])[0]
    disabled = [
        d.get("name")
        for d in ((prof.get("plugins") or {}).get("score") or {}).get("disabled") or []
    ]
    strategy = next(
        (
            ((pc.get("args") or {}).get("scoringStrategy") or {}).get("type")
            for pc in prof.get("pluginConfig") or []
            if pc.get("name") == "NodeResourcesFit"
        ),
        None,
    )
    return (
        f"extender weight {ext.get('weight')}, nodeCacheCapable {ext.get('nodeCacheCapable')}, "
        f"percentageOfNodesToScore {cfg.get('percentageOfNodesToScore')}, client qps "
        f"{conn.get('qps', 'default (50)')} / burst {conn.get('burst', 'default (100)')}, "
        f"NodeResourcesFit {strategy or 'default (LeastAllocated)'}, score plugins disabled: "
        f"{', '.join(map(str, disabled)) or 'none'}"
    )


def _git_rev(root: Path = REPO) -> str:
    """The short revision of the checkout at ``root`` (with a note when it has uncommitted
    changes), or the one written to ``.livebench-rev`` by a pinned export (``git archive
    REV``); "unknown revision" for a tree that is neither (an export without the file)."""
    pinned = root / ".livebench-rev"
    if pinned.exists():
        return pinned.read_text().strip() + " (pinned export: git archive)"

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return out.stdout.strip()

    try:
        top = git("rev-parse", "--show-toplevel")
        if not top or Path(top).resolve() != root.resolve():
            return "unknown revision (no .livebench-rev, not a git checkout)"
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if dirty else "")
    except OSError:
        return ""


def _revisions(topoplace_src: str | None) -> str:
    """The summary's "topoplace" revisions, read when the run starts: the runner's own
    checkout (it replays offline), and the tree the live arm runs when ``--topoplace-src``
    names another one."""
    runner = _git_rev()
    if not topoplace_src:
        return f"at {runner}"
    src = Path(topoplace_src)
    return f"live arm at {_git_rev(src)} (the checkout in {src}); runner and offline replay at {runner}"


def _cpu_list(text: str) -> frozenset[int]:
    """``0,2-3`` -> {0, 2, 3}."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def _cpu_split(text: str) -> tuple[frozenset[int], frozenset[int]]:
    """``--pin-cpus`` ``CONTROL/EXTENDER`` (e.g. ``0/1``) -> two disjoint CPU sets of this
    host."""
    control, sep, extender = text.partition("/")
    try:
        if not sep:
            raise ValueError("no slash")
        sets = (_cpu_list(control), _cpu_list(extender))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--pin-cpus {text!r}: expected CONTROL/EXTENDER CPU lists, e.g. 0/1 or 0-1/2"
        ) from None
    usable = os.sched_getaffinity(0)
    if not all(sets) or sets[0] & sets[1] or not (sets[0] | sets[1]) <= usable:
        raise argparse.ArgumentTypeError(
            f"--pin-cpus {text!r}: two non-empty, disjoint sets of this host's CPUs "
            f"{sorted(usable)} are needed"
        )
    return sets


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.live.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", choices=("mix", "openb"), default="mix")
    p.add_argument(
        "--scenario-file",
        default=None,
        metavar="PATH",
        help="replay a scenario file (benchmarks/scenarios/*.yaml; the first run of its "
        "sweep) instead of --scenario; the offline column is the offline engine on the same "
        "file and seed",
    )
    p.add_argument("--out", required=True, help="results directory (created)")
    g = p.add_argument_group("scenario file")
    g.add_argument("--seed", type=int, default=None, help="the run's seed (default: the file's)")
    g.add_argument(
        "--until",
        type=float,
        default=None,
        metavar="SECONDS",
        help="keep the jobs arriving up to this scenario time; also the run's horizon "
        "(offline and live)",
    )
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="scenario seconds per live second (arrivals with --release timed, departures, "
        "durations)",
    )
    g = p.add_argument_group("mix")
    g.add_argument("--nodes", type=int, default=50)
    g.add_argument("--big", type=int, default=10, help="8-GPU pods, first")
    g.add_argument("--small", type=int, default=200, help="1-GPU pods, after the big ones")
    g.add_argument("--h100-share", type=float, default=0.8)
    g.add_argument("--nodes-per-leaf", type=int, default=16)
    g.add_argument("--leaves-per-spine", type=int, default=4)
    g.add_argument("--gangs", type=int, default=0, help="gangs spread among the small pods")
    g.add_argument("--gang-size", type=int, default=4)
    g.add_argument("--gang-gpus", type=int, default=8)
    g.add_argument("--gang-preferred", default="", help="topology-preferred level, e.g. leaf")
    g = p.add_argument_group("openb")
    g.add_argument("--workload", default="default")
    g.add_argument("--data", default=None, help="trace dir (default ../shared/data/...)")
    g.add_argument(
        "--max-pods",
        type=int,
        default=None,
        help="keep at most this many pods (scenario files: whole jobs in arrival order)",
    )
    g.add_argument("--max-nodes", type=int, default=None, help="an evenly spaced sample of N nodes")
    g.add_argument("--resources", choices=("trace", "minimal"), default="trace")
    g = p.add_argument_group("run")
    g.add_argument("--runs", type=int, default=1)
    g.add_argument(
        "--arms",
        default="topoplace,default",
        help=f"live arms, comma-separated, of {', '.join(ARMS)}",
    )
    g.add_argument("--no-offline", action="store_true")
    g.add_argument("--timeout", type=float, default=900, help="per arm, seconds")
    g.add_argument("--idle-timeout", type=float, default=20, help="stop when no bind for S s")
    g.add_argument(
        "--release",
        choices=RELEASES,
        default="cold",
        help="cold: a backlog kube-scheduler finds at start (default); ungate: a backlog of "
        "gated pods released by clients; create: pods created one after another; timed: "
        "each pod created at its arrival time (scenario files, see --time-scale)",
    )
    g.add_argument(
        "--ungate-workers",
        type=int,
        default=4,
        help="backlog: concurrent clients removing the gates in arrival order",
    )
    g.add_argument(
        "--settle", type=float, default=2.0, help="seconds between creating and releasing"
    )
    g.add_argument(
        "--rate", type=float, default=0, help="pods/s to release (0: as fast as possible)"
    )
    g.add_argument(
        "--create-workers",
        type=int,
        default=1,
        help="concurrent pod creators (1: strict arrival order; more: faster, order kept "
        "to within that many pods)",
    )
    g.add_argument("--bind-floor", type=int, default=400, help="pods bound raw (0: skip)")
    g.add_argument(
        "--py-spy",
        default=None,
        metavar="BINARY",
        help="record topoplace with py-spy during each topoplace arm (e.g. `py-spy`)",
    )
    g.add_argument(
        "--pin-cpus",
        default=None,
        metavar="CONTROL/EXTENDER",
        type=_cpu_split,
        help="confine the control plane (etcd, kube-apiserver, every arm's kube-scheduler) "
        "to the CPUs before the slash and topoplace and this runner to those after it, "
        "e.g. `0/1`: the extender on a CPU of its own, as when its container has its own "
        "CPU (needs the runner's own plane)",
    )
    g.add_argument("--namespace", default="livebench")
    g.add_argument("--policy", default=None, help="topoplace policy file (default shipped)")
    g.add_argument(
        "--topoplace-src",
        default=None,
        help="run topoplace from another checkout (e.g. `git archive REV | tar -x -C DIR`, "
        "then `git rev-parse --short REV > DIR/.livebench-rev` so the summary names it); "
        "the offline arm still uses this one",
    )
    g.add_argument("--node-workers", type=int, default=8)
    g = p.add_argument_group("control plane")
    g.add_argument("--kubeconfig", default=None, help="use this running plane (no up/down)")
    g.add_argument("--kube-bin", default=str(DEFAULT_KUBE_BIN))
    g.add_argument("--work", default=None, help="plane work dir (default /tmp/livebench-*)")
    g.add_argument("--keep-work", action="store_true", help="keep the work dir and logs")
    g.add_argument("--api-port", type=int, default=17443)
    g.add_argument("--etcd-port", type=int, default=24790)
    g.add_argument("--etcd-peer-port", type=int, default=24800)
    g.add_argument("--topoplace-sched-port", type=int, default=11260, help="shipped config's")
    g.add_argument(
        "--default-sched-port",
        type=int,
        default=11261,
        help="the default arms' kube-scheduler (default-adaptive: this + 1)",
    )
    g.add_argument("--extender-port", type=int, default=8890)
    g.add_argument(
        "--shipped-config",
        default=None,
        help="another scheduler-config.yaml (a ConfigMap like config/deploy's, or a bare "
        "KubeSchedulerConfiguration); default: the one --transport names",
    )
    g.add_argument(
        "--transport",
        choices=sorted(TRANSPORT_CONFIGS),
        default=None,
        help="extender transport of the topoplace arm: plain (config/deploy, as shipped: "
        "http on loopback) or mtls (the component config/deploy/mtls: https with client "
        "certificates, the run's own from `topoplace certs`); default plain, or whatever "
        "--shipped-config says",
    )
    args = p.parse_args(argv)
    if args.shipped_config is None:
        args.shipped_config = str(TRANSPORT_CONFIGS[args.transport or "plain"])
    elif args.transport is not None:
        got = extender_transport(load_shipped(args.shipped_config))
        if got != args.transport:
            p.error(f"--transport {args.transport}, but {args.shipped_config} is {got}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        p.error(f"unknown arms {bad}; choose from {list(ARMS)}")
    args.arm_list = arms
    if args.time_scale <= 0:
        p.error("--time-scale must be positive")
    return args


def shipped_profile(args: argparse.Namespace) -> str:
    """The profile name of the shipped scheduler configuration (``--shipped-config``)."""
    return profile_names(load_shipped(args.shipped_config))[0]


@dataclass
class ArmProcesses:
    """The processes one arm runs: topoplace (topoplace arm) and one kube-scheduler."""

    tp: Topoplace | None = None
    ks: KubeScheduler | None = None
    profile: str = ""

    def stop(self) -> None:
        if self.ks is not None:
            self.ks.stop()
        if self.tp is not None:
            self.tp.stop()


@contextlib.contextmanager
def arm_processes(
    arm: str,
    args: argparse.Namespace,
    kc: str,
    logs: Path,
    scenario: Scenario,
    start_scheduler: bool = True,
) -> Iterator[ArmProcesses]:
    """Start ``arm``'s processes, yield them ready, stop them (by pid) on exit. Without
    ``start_scheduler`` the kube-scheduler is set up but left for the caller to start
    (``procs.ks.start()``, release ``cold``)."""
    procs = ArmProcesses()
    try:
        if arm == "topoplace":
            procs.tp = Topoplace(
                kc,
                logs,
                port=args.extender_port,
                policy=args.policy,
                source=args.topoplace_src,
                tls_dir=args.tls_dir,
            )
            if args.pin_cpus:
                procs.tp.cpus = args.pin_cpus[1]
            secs = procs.tp.start()
            log(f"topoplace ready in {secs:.1f}s (log {procs.tp.log_file})")
            procs.ks = KubeScheduler(
                kc,
                procs.tp.extender_url,
                logs,
                port=args.topoplace_sched_port,
                kube_bin=args.kube_bin,
                config_path=args.shipped_config,
                tls_dir=args.tls_dir,
            )
        else:
            name, pct = DEFAULT_ARMS[arm]
            port = args.default_sched_port + list(DEFAULT_ARMS).index(arm)
            cfg = render_default_config(
                kc,
                name,
                percentage_of_nodes_to_score=pct,
                qps=CLIENT_QPS,
                burst=CLIENT_BURST,
            )
            procs.ks = KubeScheduler(kc, "", logs, port=port, kube_bin=args.kube_bin, config=cfg)
        if args.pin_cpus:
            procs.ks.cpus = args.pin_cpus[0]
        if procs.tp is not None:
            wait_topoplace_free(procs.tp, scenario)
        if start_scheduler:
            secs = procs.ks.start()
            log(f"{arm}: kube-scheduler ready in {secs:.1f}s")
        procs.profile = (
            procs.ks.scheduler_name or DEFAULT_ARMS.get(arm, ("",))[0] or shipped_profile(args)
        )
        yield procs
    finally:
        procs.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    revisions = _revisions(args.topoplace_src)  # before the run: the code that runs
    from scheduler import __version__
    from scheduler.cli.clusterfile import load_policy
    from scheduler.cli.main import load_params

    try:
        scenario = build_scenario(args)
    except (OSError, ScenarioError) as exc:
        print(f"livebench: {exc}", file=sys.stderr)
        return 2
    fr: FileReplay | None = args.file_replay
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if fr is not None and fr.params:
        # the file's policy sections for the live topoplace too (the engine gets the same)
        merged = merged_policy(load_policy(args.policy), fr.params)
        policy_file = out / "policy.yaml"
        policy_file.write_text(yaml.safe_dump(merged, sort_keys=False))
        args.policy = str(policy_file.resolve())
        log(f"topoplace policy: {args.policy} (the file's params over the shipped policy)")
    run_id = f"lb{os.getpid()}"
    log(f"scenario: {scenario.description}")
    work = Path(args.work or tempfile.mkdtemp(prefix="livebench-", dir="/tmp"))
    plane = Plane.from_args(work, args)
    own_plane = args.kubeconfig is None
    if args.pin_cpus and not own_plane:
        raise SystemExit("--pin-cpus needs the runner's own plane (no --kubeconfig)")
    api: Api | None = None
    live: dict[str, list[Figures]] = {a: [] for a in args.arm_list}
    offline_res: OfflineResult | None = None
    offline_fig: Figures | None = None
    conditions: dict[str, Any] = {}
    ok = False
    try:
        t = time.monotonic()
        kc = plane.up() if own_plane else args.kubeconfig
        if own_plane:
            log(f"control plane up in {time.monotonic() - t:.1f}s ({work})")
            if args.pin_cpus:
                control, extender = args.pin_cpus
                for name in ("etcd", "kube-apiserver"):
                    pid = plane.pid(name)
                    if pid is None or not pin(pid, control):
                        raise RuntimeError(f"--pin-cpus: cannot pin {name} (pid {pid})")
                pin(os.getpid(), extender)
                log(
                    f"pinned: control plane on CPUs {sorted(control)}, "
                    f"topoplace and this runner on {sorted(extender)}"
                )
        api = Api(kc)
        api.ensure_namespace(args.namespace)
        node_objs = [n.to_object(run_id) for n in scenario.nodes]
        secs = api.create_nodes(node_objs, workers=args.node_workers)
        log(f"{len(node_objs)} nodes created in {secs:.1f}s")
        nodes = api.list_nodes(f"{RUN_LABEL}={run_id}")
        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
        bad = [
            n["metadata"]["name"]
            for n in nodes
            if any(
                t.get("key", "").startswith("node.kubernetes.io/")
                for t in (n.get("spec") or {}).get("taints") or []
            )
        ]
        if bad or len(nodes) != len(node_objs):
            raise RuntimeError(f"nodes not ready: {len(nodes)}/{len(node_objs)}, tainted {bad[:5]}")
        logs = work / "bench-logs"
        plane_pids = {
            "apiserver": plane.pid("kube-apiserver") if own_plane else None,
            "etcd": plane.pid("etcd") if own_plane else None,
        }
        floor: list[dict[str, Any]] = []
        if args.bind_floor > 0:
            floor = measure_bind_floor(
                api, scenario, namespace=args.namespace, run_id=run_id, pods=args.bind_floor
            )
            write_csv(out / "bind-floor.csv", floor)
        extender_url = f"http://127.0.0.1:{args.extender_port}/scheduler"
        args.tls_dir = None
        transport = extender_transport(load_shipped(args.shipped_config))
        if extender_uses_tls(load_shipped(args.shipped_config)):
            args.tls_dir = make_certs(work / "tls", args.topoplace_src)
            log(f"the extender talks {transport}: certificates in {args.tls_dir}")
        else:
            log("the extender talks plain HTTP on loopback")
        shipped_text = render_shipped_config(
            kc, extender_url, None, args.shipped_config, args.tls_dir
        )
        (out / "scheduler-config.yaml").write_text(shipped_text)
        shipped_dict = yaml.safe_load(shipped_text)
        profile = profile_names(shipped_dict)[0]
        for arm in args.arm_list:
            if arm in DEFAULT_ARMS:
                name, pct = DEFAULT_ARMS[arm]
                cfg = render_default_config(
                    kc, name, percentage_of_nodes_to_score=pct, qps=CLIENT_QPS, burst=CLIENT_BURST
                )
                (out / f"scheduler-config-{arm}.yaml").write_text(
                    yaml.safe_dump(cfg, sort_keys=False)
                )
        params = load_params(args.policy)
        pod_objs = [p.to_object(args.namespace, profile, run_id) for p in scenario.pods]
        offline_nodes: dict[str, str] | None = None
        if not args.no_offline:
            wait_scn = math.nan
            if fr is not None:
                er = engine_offline(fr, params, backlog=args.release != "timed")
                offline_res = er.offline
                arrive = {
                    p.name: (0.0 if args.release != "timed" else p.arrive) for p in scenario.pods
                }
                waits = [er.start[k] - arrive[k] for k in er.start]
                wait_scn = statistics.fmean(waits) if waits else math.nan
            else:
                offline_res = replay(nodes, pod_objs, params)
            offline_nodes = {k: v[0] for k, v in offline_res.placements.items()}
            offline_fig = placement_figures(
                Figures(arm="offline", run=0), scenario, offline_nodes, labels
            )
            offline_fig.wait_mean_scn_s = wait_scn
            offline_fig.extra.update(
                {"seconds": round(offline_res.seconds, 3), "narrowed": offline_res.narrowed}
            )
            log(
                f"offline: {len(offline_res.placements)} placed in {offline_res.seconds:.2f}s, "
                f"nodes used {offline_fig.nodes_used}, whole free {offline_fig.whole_nodes_free}"
            )
        cores = os.cpu_count()
        load = os.getloadavg()
        release = {
            "cold": "a backlog kube-scheduler finds at start: every pod created (one client, "
            "arrival order, names that sort in arrival order) before the arm's kube-scheduler "
            "starts; pods/s and CPU from its first bind to its last",
            "ungate": "a backlog: all created held by a scheduling gate (one client, arrival "
            f"order), then the gates removed in arrival order by {args.ungate_workers} "
            "concurrent clients as fast as they go",
            "create": f"created back to back by {args.create_workers} client(s)"
            + (f", paced at {args.rate:g}/s" if args.rate else ""),
            "timed": "each created at its arrival time in the scenario "
            f"({args.time_scale:g} scenario seconds per live second), the scheduler running",
        }[args.release]
        if scenario.lifetimes:
            release += (
                "; pods leave as the scenario says (explicit departures, or their duration "
                f"after being bound; {args.time_scale:g} scenario seconds per live second), "
                "deleted with grace 0"
            )
        horizon = fr.run.horizon if fr is not None else None
        conditions = {
            **({"scenario": scenario.source} if scenario.source else {}),
            "nodes": f"{len(scenario.nodes)} ({scenario.gpu_capacity} GPUs)",
            "pods": f"{len(scenario.pods)} ({scenario.gpus_requested} GPUs), arrival order; "
            + release,
            "runs": f"{args.runs} (arms alternate order per run; figures are medians)",
            "Kubernetes": f"{api.version()} (kube-scheduler "
            f"{binary_version(Path(args.kube_bin) / 'kube-scheduler')})",
            "topoplace": f"{__version__} {revisions}",
            "topoplace arm": f"kube-scheduler profile `{profile}` with the shipped "
            f"{_repo_path(args.shipped_config)} (rendered copy: scheduler-config.yaml): "
            + _config_line(shipped_dict),
            "topoplace policy": args.policy or "shipped config/policy.yaml",
            "extender transport": transport_line(transport, args.shipped_config),
            "default arms": "each its own kube-scheduler process, one plain profile "
            "(kube-scheduler's default plugins and scoring, no extender), client qps "
            f"{CLIENT_QPS} / burst {CLIENT_BURST}; `default`: percentageOfNodesToScore 100; "
            "`default-adaptive`: unset (adaptive); copies: scheduler-config-<arm>.yaml",
            "processes": "only the arm's own scheduler processes run during an arm (started "
            "before it, stopped after it); the plane runs no kube-scheduler of its own",
            "CPU pinning": (
                f"etcd, kube-apiserver and every arm's kube-scheduler (GOMAXPROCS "
                f"{len(args.pin_cpus[0])}) confined to CPUs {sorted(args.pin_cpus[0])}; "
                f"topoplace and this runner to CPUs {sorted(args.pin_cpus[1])} (--pin-cpus): "
                "the extender on CPUs of its own, as when its container has CPU of its own; "
                "both arms' control plane gets the same CPUs"
                if args.pin_cpus
                else "none (every process may run on every CPU)"
            ),
            "host": f"{platform.machine()}, {cores} cores, load average at start "
            f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (another engineer's control "
            f"plane may share the machine), Python {platform.python_version()}",
            "wait": f"until all bound or no bind for {args.idle_timeout:g}s "
            f"(cap {args.timeout:g}s per arm)"
            + (
                f"; the arm stops at the run's horizon, {horizon:g} scenario seconds = "
                f"{horizon / args.time_scale:g} s after the first release"
                if horizon is not None
                else ""
            ),
        }
        for r in range(1, args.runs + 1):
            order = list(args.arm_list) if r % 2 else list(reversed(args.arm_list))
            for arm in order:
                cold = args.release == "cold"
                with arm_processes(arm, args, kc, logs, scenario, not cold) as procs:
                    probes = Probes(
                        pids=plane_pids,
                        topoplace=procs.tp,
                        kube_scheduler=procs.ks,
                        scheduler_metrics=(
                            lambda port=procs.ks.port: api.get_text(  # type: ignore[union-attr]
                                f"https://127.0.0.1:{port}/metrics"
                            )
                        )
                        if procs.ks
                        else None,
                        apiserver_metrics=lambda: api.get_text(api.server + "/metrics"),
                    )
                    spy: PySpy | None = None
                    if args.py_spy and procs.tp is not None and procs.tp.pid:
                        spy = PySpy(args.py_spy, procs.tp.pid, out / f"pyspy-topoplace-{r}.txt")
                    try:
                        res = run_arm(
                            api,
                            scenario,
                            arm=arm,
                            scheduler_name=procs.profile,
                            run=r,
                            run_id=run_id,
                            namespace=args.namespace,
                            labels=labels,
                            timeout=args.timeout,
                            idle_timeout=args.idle_timeout,
                            rate=args.rate,
                            probes=probes,
                            create_workers=args.create_workers,
                            release=args.release,
                            ungate_workers=args.ungate_workers,
                            settle=args.settle,
                            launch=procs.ks.start if cold and procs.ks else None,
                            on_release=spy.start if spy else None,
                            time_scale=args.time_scale,
                            horizon=horizon,
                        )
                    finally:
                        if spy is not None:
                            spy.stop()
                    if spy is not None and spy.out.exists():
                        top = profile_top(spy.out.read_text())
                        (out / f"pyspy-top-{r}.txt").write_text(top + "\n")
                        log(f"py-spy: {spy.out}\n{top[:2000]}")
                if offline_nodes is not None:
                    compare_with_offline(res.figures, scenario, res.nodes_of, offline_nodes)
                live[arm].append(res.figures)
                write_csv(out / f"pods-{arm}-{r}.csv", pod_rows(scenario, res, offline_nodes))
                secs = api.delete_pods(args.namespace)
                log(f"{arm}-{r}: pods deleted in {secs:.1f}s")
        rows = [f.row() for figs in live.values() for f in figs]
        if offline_fig:
            rows.append(offline_fig.row())
        write_csv(out / "runs.csv", rows)
        text = render_summary(scenario, conditions, live, offline_fig, offline_res, floor)
        (out / "summary.md").write_text(text + "\n")
        print(text)
        log(f"results in {out}")
        ok = True
        return 0
    finally:
        if api is not None:
            with contextlib.suppress(Exception):
                api.delete_pods(args.namespace, timeout=30)
            with contextlib.suppress(Exception):
                api.delete_nodes(f"{RUN_LABEL}={run_id}")
            api.close()
        if own_plane:
            keep = args.keep_work or not ok
            plane.down(purge=not keep)
            if keep:
                log(f"work dir kept (logs in {work}/logs and {work}/bench-logs): {work}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
