"""Failure injection replayed live: a scenario file's faults, through the real kube-scheduler.

    python -m benchmarks.live.faults --kube-bin ~/kube-bin-1.33 --out out/live-faults
    python -m benchmarks.live.faults --scenario-file benchmarks/scenarios/faults.yaml \\
        --until 1d --time-scale 120 --out out/live-faults-big

What runs, on the loopback test cluster (:mod:`benchmarks.cluster`; Kubernetes >= 1.32 with
DRA served and the ``DRADeviceTaints`` gate, which this module asks for):

* **Nodes and their signals.** The file's Node objects, and one ResourceSlice per node
  (driver ``gpu.nvidia.com``, devices ``gpu-<i>``). The ground truth (outages, GPU faults,
  warnings, flaps) is the one the offline engine draws for the same file and seed
  (:mod:`benchmarks.engine.sources`), rendered by the same code
  (:meth:`benchmarks.engine.health.SignalHealth.render`) at the same instants: the Ready
  condition and its heartbeat every 5 minutes of trace time (the kubelet's status report),
  NVSentinel's condition, state label and cordon, the unreachable taint, the allocatable
  GPU count, DRA device taints. :class:`LiveSignals` writes each render as merge patches of
  the Node, its status and its slice, with the trace's own timestamps.
* **Time.** ``--time-scale S`` trace seconds per live second. Topoplace runs with
  ``TOPOPLACE_HEALTH_CLOCK`` (:class:`scheduler.kube.runner.ReplayClock`) so that its health
  clock reads trace time: a heartbeat's age, a settle time or an XID window is what it was
  in the trace, and its health refresh runs every ``30 / S`` s (30 trace seconds).
* **Jobs.** The file's gangs arrive at their (scaled) times as pods of the shipped
  scheduler profile, placed by kube-scheduler with topoplace as its extender, with the
  shipped configuration and policy. The benchmark plays the job controller, through the
  offline engine's own lifecycle (:class:`LiveEngine` is :class:`benchmarks.engine.loop.Engine`
  with kube-scheduler as its placement step): a gang starts when its last member is bound
  (the placement read from topoplace's ``topoplace.io/placement`` annotation); a fault on
  hardware it uses interrupts it and ``requeue_delay`` later its pods are deleted and a new
  attempt created (``<job>-r<k>``, a PriorityClass that never preempts puts it ahead of new
  arrivals, as the engine's queue does); a gang placed on broken hardware crashes
  ``crash_after`` later the same way; a gang whose work is done is deleted.
* **Accounting.** The offline benchmark's own hook, :class:`benchmarks.engine.scenarios.faults.metrics.FaultStats`,
  on both: placements on signalled-failed hardware, before detection, on warned hardware,
  gang restarts, time from a failure to a good placement, GPU-hours lost, goodput, jobs
  done. The offline rows are the engine on the same file, seed and horizon for each health
  policy (``topoplace``, the live arm's; ``kube-default`` and ``ready-only`` for scale).

Known differences from the offline replay, each reported where it shows:

* A live arm reads health through kube-scheduler, which honours the unreachable taint,
  cordons and the allocatable count by itself: a live ``ready-only`` topoplace is offline
  ``kube-default`` (:data:`OFFLINE_TWIN`), and the offline ``ready-only`` row (a scheduler
  that reads nothing but Ready) has no live twin.

* kube-scheduler's queue: a pod that did not fit waits in its backoff or unschedulable
  queue until an event moves it, where the engine retries every waiting job after every
  event; at ``S`` trace seconds per second, a one-second backoff is ``S`` trace seconds.
* Non-fatal XID device taints (effect ``None`` in the offline render) are refused by a
  1.33 API server (it accepts NoSchedule and NoExecute); they are then left out and
  counted (``xid_taints_dropped``).
* A placement is published with the latency of the live loop (``lag`` figures, in trace
  seconds); an arrival, a departure or a heartbeat happens when the driver gets to it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import queue
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks.engine.health import (
    EPOCH0,
    HEARTBEAT_PERIOD,
    GpuFault,
    Outage,
    SignalHealth,
    health_policies,
)
from benchmarks.engine.jobs import Job, Run
from benchmarks.engine.loop import ARRIVE, ASSESS, FAULT, LEAVE, Engine, Hook, Recovery
from benchmarks.engine.replay import first_run, pod_objects
from benchmarks.engine.run import build
from benchmarks.engine.scenario import Scenario as EngineScenario
from benchmarks.engine.scenario import _duration
from benchmarks.engine.scenarios.faults.metrics import FaultStats, Metrics, summarize
from benchmarks.engine.scenarios.faults.run import table
from benchmarks.engine.sources import Inputs, materialize
from benchmarks.live.kubeapi import MERGE_PATCH, Api, ApiError
from benchmarks.live.scenariofile import FirstPlacements, merged_policy
from scheduler.core.objects import placement_of
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment

NAMESPACE = "livebench-faults"
SCHEDULER = "topoplace"
"""The shipped scheduler configuration's profile."""
DRIVER = "gpu.nvidia.com"
RESTARTED_CLASS = "livebench-restarted"
"""PriorityClass of a job's later attempts: ahead of new arrivals in kube-scheduler's queue
(as the engine queues interrupted jobs first), ``preemptionPolicy: Never``."""
JOB_LABEL = "livebench.topoplace.io/job"
ATTEMPT_LABEL = "livebench.topoplace.io/attempt"
RUN_LABEL = "livebench.topoplace.io/faults-run"
HEALTH_POLICIES = ("topoplace", "kube-default", "ready-only")
OFFLINE_TWIN = {
    "topoplace": "topoplace",
    "kube-default": "kube-default",
    "ready-only": "kube-default",
}
"""The offline row a live arm compares with. Behind kube-scheduler a topoplace that reads
only Ready is ``kube-default``: kube-scheduler itself keeps pods off cordoned nodes and
nodes with the unreachable taint, and counts allocatable GPUs (offline ``ready-only``, a
scheduler that reads nothing else, has no live twin here)."""
NO_XID = "topoplace, no XID taints"
"""The offline row of what a 1.33 server lets the live run publish (:class:`BlockingTaintsOnly`)."""
NO_REMEDIATION = "topoplace, no remediation"
"""The offline row of topoplace's placements with the job controller's delays only (no
evictions: the policy's ``remediation.mode`` off)."""
CHECK_TRACE_S = 10.0
"""How often (trace seconds) the live topoplace looks for pods on failed hardware."""
DEFAULT_FILE = Path(__file__).resolve().parents[1] / "scenarios" / "faults-live.yaml"
REFRESH_TRACE_S = 30.0
"""Topoplace's health refresh period in trace seconds (``TOPOPLACE_HEALTH_REFRESH_S`` is
this over the time scale)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- jobs as pods ---------------------------------------------------------------------------


def attempt_name(job: str, attempt: int) -> str:
    """The live name of ``job``'s ``attempt`` (0: the job's own name; k: ``<job>-r<k>``)."""
    return job if attempt == 0 else f"{job}-r{attempt}"


def attempt_pods(
    job: Job, attempt: int, *, namespace: str, run: str, restarted: bool
) -> list[dict[str, Any]]:
    """The Pod objects of ``job``'s ``attempt``: the engine's own pod objects
    (:func:`benchmarks.engine.replay.pod_objects`; a gang annotated with the attempt's
    name as its gang), for the shipped profile, labelled with the job, the attempt and the
    run; a later attempt in :data:`RESTARTED_CLASS`."""
    pods = pod_objects(replace(job, name=attempt_name(job.name, attempt)), namespace, SCHEDULER)
    for p in pods:
        p["metadata"].setdefault("labels", {}).update(
            {JOB_LABEL: job.name, ATTEMPT_LABEL: str(attempt), RUN_LABEL: run}
        )
        p["spec"]["terminationGracePeriodSeconds"] = 0
        p["spec"].pop("priority", None)  # the Priority admission plugin sets it
        if restarted:
            p["spec"]["priorityClassName"] = RESTARTED_CLASS
    return pods


def priority_class() -> dict[str, Any]:
    """:data:`RESTARTED_CLASS`: queue order only (it never preempts)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": RESTARTED_CLASS},
        "value": 1000,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "livebench: a job's later attempts go ahead of new arrivals",
    }


# ---- signals as API writes ------------------------------------------------------------------


def node_patches(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(Node merge patch, status merge patch) that turn ``before`` into ``after`` in what a
    render changes (labels, ``spec.unschedulable``, ``spec.taints``, the conditions, the
    allocatable and capacity counts); None where nothing changed. Lists are replaced whole
    (merge-patch semantics), removed labels set to null."""
    meta: dict[str, Any] = {}
    lb, la = before["metadata"].get("labels") or {}, after["metadata"].get("labels") or {}
    labels = {k: v for k, v in la.items() if lb.get(k) != v}
    labels.update({k: None for k in lb if k not in la})
    if labels:
        meta["labels"] = labels
    spec: dict[str, Any] = {}
    sb, sa = before.get("spec") or {}, after.get("spec") or {}
    if bool(sb.get("unschedulable")) != bool(sa.get("unschedulable")):
        spec["unschedulable"] = True if sa.get("unschedulable") else None
    if (sb.get("taints") or []) != (sa.get("taints") or []):
        spec["taints"] = sa.get("taints") or None
    obj: dict[str, Any] = {}
    if meta:
        obj["metadata"] = meta
    if spec:
        obj["spec"] = spec
    status: dict[str, Any] = {}
    for k in ("conditions", "allocatable", "capacity"):
        if (before.get("status") or {}).get(k) != (after.get("status") or {}).get(k):
            status[k] = after["status"][k]
    return obj or None, ({"status": status} if status else None)


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def slice_devices(
    node: str, gpus: int, version: str, taints: Mapping[int, Sequence[Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """The devices ``gpu-0 .. gpu-<gpus-1>`` of ``node``'s slice in the shape of ``version``
    (v1beta1 nests attributes and taints under ``basic``), with ``taints`` by GPU index."""
    out = []
    for i in range(gpus):
        body: dict[str, Any] = {
            "attributes": {"index": {"int": i}, "type": {"string": "gpu"}},
            "capacity": {"memory": {"value": "80Gi"}},
        }
        if taints.get(i):
            body["taints"] = [dict(t) for t in taints[i]]
        out.append(
            {"name": f"gpu-{i}", "basic": body}
            if version == "v1beta1"
            else {"name": f"gpu-{i}", **body}
        )
    return out


def slice_object(node: str, gpus: int, version: str) -> dict[str, Any]:
    """``node``'s ResourceSlice (one pool of one slice, untainted devices)."""
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": slice_devices(node, gpus, version, {}),
        },
    }


def device_taints(devs: Sequence[Mapping[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """GPU index -> taints of a render's tainted devices."""
    return {int(d["attributes"]["index"]["int"]): list(d.get("taints") or []) for d in devs}


def blocking_only(taints: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, list[Any]]:
    """``taints`` without the non-blocking ones (effect None, which a 1.33 server refuses)."""
    out = {}
    for i, ts in taints.items():
        keep = [t for t in ts if t.get("effect") in ("NoSchedule", "NoExecute")]
        if keep:
            out[i] = keep
    return out


@dataclass
class SignalFigures:
    """What :class:`LiveSignals` wrote."""

    node_patches: int = 0
    status_patches: int = 0
    slice_updates: int = 0
    xid_taints_dropped: int = 0
    """Distinct non-blocking device taints (node, GPU, key, time) the server refused."""
    errors: list[str] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)
    """Per write: trace seconds between its due time and the write's answer."""


class LiveSignals(SignalHealth):
    """The ground truth of :class:`SignalHealth`, published to the API instead of assessed:
    every instant the engine would re-assess a node (a signal changes) and every heartbeat
    (each node every :data:`HEARTBEAT_PERIOD` trace seconds, at its own phase), the node's
    render is written as patches of what changed since the last write, by one writer
    thread in due order. ``wall0`` (epoch seconds) is trace time 0, ``scale`` trace
    seconds per second."""

    def __init__(
        self,
        nodes: Sequence[Mapping[str, Any]],
        faults: Sequence[Outage | GpuFault],
        health: Any,
        api: Api,
        version: str,
        scale: float,
    ) -> None:
        super().__init__(nodes, faults, health)
        self.api = api
        self.version = version
        self.scale = scale
        self.wall0 = 0.0
        self.gpus = {
            n: int(self.base[n]["status"]["capacity"].get("nvidia.com/gpu", 0)) for n in self.names
        }
        self.sent: dict[str, dict[str, Any]] = {}
        self.sent_taints: dict[str, dict[int, list[Any]]] = {}
        self.xid_ok = True
        self._dropped: set[tuple[str, int, Any, Any]] = set()
        self.figures = SignalFigures()
        self._q: queue.SimpleQueue[tuple[str, float, dict[str, Any], list[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    # ---- the objects at time 0 ----------------------------------------------------------

    def initial_objects(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every Node as rendered at trace time 0, and its slice; remembered as sent."""
        nodes, slices = [], []
        for name in self.names:
            obj, devs = self.render(name, 0.0)
            self.sent[name] = obj
            self.sent_taints[name] = {}
            nodes.append(obj)
            if self.gpus[name]:
                slices.append(slice_object(name, self.gpus[name], self.version))
        return nodes, slices

    # ---- the engine's health model ------------------------------------------------------

    def initial(self, ledger: Any) -> None:
        """Nothing: the objects of time 0 exist before the replay starts."""

    def schedule(self, push: Callable[[float, str, Any], None], horizon: float) -> None:
        """Publish each node whenever its signals may change, and at each heartbeat."""
        end = horizon
        for name in self.names:
            times = set(self.reassess_times(name))
            if math.isfinite(end):
                k = 1
                while (t := k * HEARTBEAT_PERIOD - self.phase[name]) <= end:
                    if t > 0:
                        times.add(t)
                    k += 1
            for t in sorted(times):
                push(t, ASSESS, name)

    def assess(self, ledger: Any, node: str, t: float) -> None:
        """Hand ``node``'s render at ``t`` to the writer."""
        obj, devs = self.render(node, t)
        self._q.put((node, t, obj, devs))

    def tick(self, ledger: Any, t: float) -> None:
        """Nothing: topoplace re-assesses on its own clock."""

    # ---- the writer ---------------------------------------------------------------------

    def start(self, wall0: float) -> None:
        self.wall0 = wall0
        self._thread = threading.Thread(target=self._write_loop, name="signals", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=60)

    def _write_loop(self) -> None:
        while (item := self._q.get()) is not None:
            node, t, obj, devs = item
            try:
                self.write(node, obj, devs)
            except Exception as exc:  # reported with the figures; the replay goes on
                self.figures.errors.append(f"{node} at {t:.0f} s: {exc}"[:300])
            self.figures.lag.append((time.time() - self.wall0) * self.scale - t)

    def write(self, node: str, obj: dict[str, Any], devs: list[dict[str, Any]]) -> None:
        """Patch what changed since the last write of ``node``."""
        meta_patch, status_patch = node_patches(self.sent[node], obj)
        if meta_patch is not None:
            self.api.call("PATCH", f"/api/v1/nodes/{node}", meta_patch, content_type=MERGE_PATCH)
            self.figures.node_patches += 1
        if status_patch is not None:
            self.api.call(
                "PATCH", f"/api/v1/nodes/{node}/status", status_patch, content_type=MERGE_PATCH
            )
            self.figures.status_patches += 1
        self.sent[node] = obj
        taints = device_taints(devs)
        if not self.xid_ok:
            taints = self._without_nonblocking(node, taints)
        if taints != self.sent_taints.get(node, {}) and self.gpus[node]:
            self._patch_slice(node, taints)

    def _without_nonblocking(self, node: str, taints: dict[int, list[Any]]) -> dict[int, list[Any]]:
        """``taints`` without the non-blocking ones, each left out counted once."""
        for gpu, ts in taints.items():
            for t in ts:
                if t.get("effect") not in ("NoSchedule", "NoExecute"):
                    self._dropped.add((node, gpu, t.get("key"), t.get("timeAdded")))
        self.figures.xid_taints_dropped = len(self._dropped)
        return blocking_only(taints)

    def _patch_slice(self, node: str, taints: dict[int, list[Any]]) -> None:
        path = f"/apis/resource.k8s.io/{self.version}/resourceslices/{slice_name(node)}"
        body = {"spec": {"devices": slice_devices(node, self.gpus[node], self.version, taints)}}
        try:
            self.api.call("PATCH", path, body, content_type=MERGE_PATCH)
        except ApiError as exc:
            kept = blocking_only(taints)
            if exc.status != 422 or kept == taints or not self.xid_ok:
                raise
            self.xid_ok = False  # this server refuses effect None: publish the rest
            log(f"the API server refuses non-blocking device taints ({exc}); leaving them out")
            taints = self._without_nonblocking(node, taints)
            if taints == self.sent_taints.get(node, {}):
                return
            body = {"spec": {"devices": slice_devices(node, self.gpus[node], self.version, taints)}}
            self.api.call("PATCH", path, body, content_type=MERGE_PATCH)
        self.sent_taints[node] = taints
        self.figures.slice_updates += 1


# ---- the engine, with kube-scheduler placing ------------------------------------------------


class _ClusterLedger:
    """The engine's ledger when the cluster is the API: it holds nothing itself."""

    generation = 0

    def may_fit(self, job: Job) -> bool:
        return True

    def hold(self, run: Run) -> None:
        pass

    def release(self, run: Run) -> None:
        pass

    def check(self, runs: Any) -> None:
        pass

    def gpu_usage(self) -> tuple[Any, Any]:
        return (), ()


BOUND, DELETED = "bound", "deleted"
"""What the pod watch reports to :class:`LiveEngine`."""


class LiveEngine(Engine):
    """The offline engine's lifecycle (arrivals, faults, interruptions, re-queues, crashes,
    finishes, the horizon; the hooks) in wall-clock time, with kube-scheduler + topoplace
    as the placement step: a queued job's attempt exists as pods, and it starts when the
    watch has seen all of them bound. ``wall0`` (epoch seconds) is trace time 0."""

    def __init__(
        self,
        api: Api,
        signals: LiveSignals,
        *,
        namespace: str,
        run_id: str,
        scale: float,
        recovery: Recovery,
        horizon: float,
        hooks: Sequence[Hook],
        api_workers: int = 4,
    ) -> None:
        super().__init__(
            _ClusterLedger(),
            None,  # type: ignore[arg-type]  # placement is kube-scheduler's
            queue="best-effort-fifo",
            hooks=hooks,
            health=signals,
            recovery=recovery,
            horizon=horizon,
            namespace=namespace,
        )
        self.api = api
        self.signals = signals
        self.run_id = run_id
        self.scale = scale
        self.wall0 = 0.0
        self.attempt: dict[str, int] = {}
        self.pods_of: dict[tuple[str, int], list[str]] = {}
        self.member_of: dict[str, tuple[str, int, int]] = {}
        self.bound_members: dict[str, dict[int, Assignment]] = {}
        self.binds: queue.SimpleQueue[tuple[Mapping[str, Any], float, str]] = queue.SimpleQueue()
        """(pod, epoch seconds, BOUND or DELETED) as the watch saw them."""
        self.deleting: set[str] = set()
        """Pods this engine deleted itself (an attempt that ended)."""
        self.evicted: list[tuple[str, float, str]] = []
        """(pod, trace time, what the engine knew of its run) per attempt ended by a deletion
        it did not make (topoplace's remediation): ``requeue`` (the run was interrupted by a
        fault, its teardown due later), ``crash`` (placed on broken hardware) or
        ``healthy`` (no fault the engine knows of)."""
        self.start_lag: list[float] = []
        """Per start: trace seconds from the attempt's creation to its last bind."""
        self.created_at: dict[tuple[str, int], float] = {}
        self.api_errors: list[str] = []
        self._work: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(api_workers)
        ]
        self._workers = [
            threading.Thread(target=self._api_loop, args=(q,), name=f"api-{i}", daemon=True)
            for i, q in enumerate(self._work)
        ]

    # ---- time -----------------------------------------------------------------------------

    def clock(self) -> float:
        """Wall-clock epoch seconds."""
        return time.time()

    def next_bind(self, timeout: float) -> tuple[Mapping[str, Any], float, str] | None:
        """The next pod the watch saw bound or deleted, when (epoch seconds) and which
        (:data:`BOUND`, :data:`DELETED`), waiting at most ``timeout`` seconds; None if none
        came."""
        try:
            return self.binds.get(timeout=timeout)
        except queue.Empty:
            return None

    def trace_now(self) -> float:
        return (self.clock() - self.wall0) * self.scale

    # ---- API work, off the event loop ---------------------------------------------------

    def _submit(self, job: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the API worker of ``job``: one job's writes happen in the order
        they were asked for (an attempt's pods are gone before the next attempt's are
        created, as a job controller that recreates pods does), jobs in parallel."""
        self._work[zlib.crc32(job.encode()) % len(self._work)].put(fn)

    def _api_loop(self, work: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (fn := work.get()) is not None:
            try:
                fn()
            except Exception as exc:
                self.api_errors.append(str(exc)[:300])

    def _create(self, pod: dict[str, Any]) -> None:
        self.api.create_pod(self.namespace, pod)

    def _delete(self, name: str) -> None:
        self.api.delete_pod(self.namespace, name)

    # ---- the lifecycle's API side ---------------------------------------------------------

    def _enqueue(self, r: Run) -> None:
        super()._enqueue(r)
        name = r.job.name
        k = self.attempt.get(name, -1) + 1
        self.attempt[name] = k
        self.bound_members.pop(name, None)
        pods = attempt_pods(
            r.job, k, namespace=self.namespace, run=self.run_id, restarted=r.restarted
        )
        names = [p["metadata"]["name"] for p in pods]
        self.pods_of[(name, k)] = names
        for i, n in enumerate(names):
            self.member_of[n] = (name, k, i)
        self.created_at[(name, k)] = self.now
        for p in pods:
            self._submit(name, lambda p=p: self._create(p))

    def _delete_attempt(self, job: str) -> None:
        k = self.attempt.get(job)
        for n in self.pods_of.get((job, k), []) if k is not None else []:
            self.deleting.add(n)
            self._submit(job, lambda n=n: self._delete(n))

    def _evict_time(self, r: Run, t: float) -> float | None:
        """None: live, topoplace's own evictions end the attempts (:meth:`deleted`)."""
        return None

    def _release(self, r: Run, t: float, why: str) -> None:
        super()._release(r, t, why)
        if why != "end":
            self._delete_attempt(r.job.name)

    def _handle(self, event: tuple[float, int, int, str, Any]) -> None:
        kind, payload = event[3], event[4]
        was_queued = kind == LEAVE and payload in self.runs and self.runs[payload].queued
        super()._handle(event)
        if was_queued:  # left while waiting: its pending pods go
            self._delete_attempt(payload)

    def _serve(self, t: float) -> None:
        """Nothing: kube-scheduler serves the queue."""

    def bound(self, pod: Mapping[str, Any], t: float) -> None:
        """A pod of the run was seen bound at trace time ``t``: the job starts with its last
        member (a pod of an attempt that is no longer current is ignored)."""
        name = pod["metadata"]["name"]
        ref = self.member_of.get(name)
        if ref is None:
            return
        job, k, i = ref
        r = self.runs.get(job)
        if r is None or self.attempt.get(job) != k or r.running or not r.queued:
            return
        got = self.bound_members.setdefault(job, {})
        if i in got:
            return
        rec = placement_of(pod)
        gpus = tuple(rec["gpus"]) if rec is not None else ()
        got[i] = Assignment(name, pod["spec"]["nodeName"], gpus)
        if len(got) == r.job.pods:
            self.start_lag.append(t - self.created_at.get((job, k), t))
            self._start(r, t, [got[m] for m in range(r.job.pods)], {"source": "kube-scheduler"})

    def deleted(self, pod: Mapping[str, Any], t: float) -> None:
        """A pod of the current attempt of a running job was deleted by someone else (the
        job controller's view of topoplace's eviction) at trace time ``t``: the attempt
        ends now, as the offline engine ends it at its eviction time (a crash for a job
        placed on broken hardware, else a re-queue); a job no fault hit is interrupted
        first. Deletions of pods this engine deleted, or of older attempts, are ignored."""
        name = pod["metadata"]["name"]
        ref = self.member_of.get(name)
        if ref is None or name in self.deleting:
            return
        job, k, _ = ref
        r = self.runs.get(job)
        if r is None or self.attempt.get(job) != k or not r.running:
            return
        if r.broken:  # placed on broken hardware: its crash was due
            self.evicted.append((name, t, "crash"))
            self._release(r, t, "crash")
            r.restarted = True
        else:
            if not r.doomed:
                self.evicted.append((name, t, "healthy"))
                self._interrupt(r, t)
            else:
                self.evicted.append((name, t, "requeue"))
            self._release(r, t, "evicted")
        r.epoch += 1  # the teardown still scheduled belongs to the placement just ended
        self._enqueue(r)

    # ---- the loop -------------------------------------------------------------------------

    def run(self, jobs: Sequence[Job], faults: Sequence[Any] = ()) -> None:
        """Replay ``jobs`` and ``faults`` from ``self.wall0`` on (set it first), until the
        horizon (or, without one, until no event is left and no job waits or runs)."""
        for w in self._workers:
            w.start()
        for f in faults:
            if f.end > f.start:
                self.push(f.start, FAULT, f)
        assert self.health is not None
        self.health.schedule(self.push, self.horizon)
        for j in jobs:
            self.push(j.arrive, ARRIVE, j)
            if j.depart is not None:
                self.push(j.depart, LEAVE, j.name)
        events = self._events
        end = self.horizon
        while True:
            due = events[0][0] if events else end
            if not math.isfinite(due):
                if not any(r.running or r.queued for r in self.runs.values()):
                    break
                due = self.trace_now() + self.scale  # wait for binds, a second at a time
            wait = self.wall0 + due / self.scale - self.clock()
            if wait > 0:  # binds until the next event is due (overdue events go first)
                got = self.next_bind(wait)
                if got is not None:
                    t = max(self.now, (got[1] - self.wall0) * self.scale)
                    self._advance(t)
                    if got[2] == DELETED:
                        self.deleted(got[0], t)
                    else:
                        self.bound(got[0], t)
                    continue
            if not events:
                if math.isfinite(end):
                    break  # the horizon (later events were never scheduled)
                continue
            t = events[0][0]
            self._advance(t)
            while events and events[0][0] == t:
                self._handle(heapq.heappop(events))
            for h in self.hooks:
                h.settled(self, t)
        if math.isfinite(end):
            self._advance(end)
            for r in self.runs.values():
                if r.running:
                    self._release(r, end, "end")
        for h in self.hooks:
            h.finished(self)
        for q in self._work:
            q.put(None)
        for w in self._workers:
            w.join(timeout=120)

    def _advance(self, t: float) -> None:
        if t > self.now:
            for h in self.hooks:
                h.advance(self, self.now, t)
            self.now = t


# ---- one file, offline and live -------------------------------------------------------------


@dataclass
class Replay:
    """One run of a scenario file with faults: the run, its nodes, jobs and faults."""

    run: EngineScenario
    inputs: Inputs
    path: str

    @property
    def horizon(self) -> float:
        return self.run.horizon if self.run.horizon is not None else math.inf


def load(path: str | Path, seed: int | None = None, until: float | None = None) -> Replay:
    """The first run of ``path``'s sweep (``seed`` if given; the horizon capped at
    ``until`` trace seconds), materialised by the engine's own sources.

    Raises:
        ScenarioError: a file without faults, or with jobs the live replay cannot make
            (fractional or sharing placement).
    """
    from benchmarks.engine.scenario import ScenarioError

    run = first_run(path, seed)
    if until is not None:
        run = replace(run, horizon=until if run.horizon is None else min(until, run.horizon))
    run = replace(run, locality="")  # live pods run their written duration
    inputs = materialize(run)
    if not inputs.faults:
        raise ScenarioError(f"{path}: no faults section (use benchmarks.live.run for it)")
    if any(j.fractional for j in inputs.jobs):
        raise ScenarioError(f"{path}: fractional jobs are replayed by benchmarks.live.fractional")
    if run.horizon is not None:
        inputs.jobs = [j for j in inputs.jobs if j.arrive <= run.horizon]
    inputs.params = SchedParams.from_config(live_policy(run))
    return Replay(run, inputs, str(path))


def live_policy(
    run: EngineScenario, health: str | None = None, check_seconds: float | None = None
) -> dict[str, Any]:
    """The live topoplace's policy: the shipped ``config/policy.yaml`` with the file's
    ``params`` sections over it (the offline engine gets the same parameters, its health
    section set by the run's health policy); with ``health``, the ``health`` section of
    that policy of :func:`benchmarks.engine.health.health_policies` (``topoplace`` is the
    shipped one) and, for any other than ``topoplace``, remediation off (the baselines
    stand for schedulers that do not evict); ``check_seconds``: how often remediation looks
    (wall seconds; a replay compresses time)."""
    from scheduler.cli.clusterfile import load_policy

    policy = merged_policy(load_policy(None), run.params)
    if health is not None and health != "topoplace":
        hp = health_policies()[health]
        policy["health"] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in asdict(hp).items()
        }
        policy["remediation"] = {"mode": "off"}
    if check_seconds is not None:
        policy.setdefault("remediation", {})["check_seconds"] = check_seconds
    return policy


def evict_after(rp: Replay) -> float | None:
    """The remediation delay of the live topoplace's policy (None unless ``mode: evict``)."""
    r = rp.inputs.params.remediation
    return r.after_seconds if r.mode == "evict" else None


class BlockingTaintsOnly(SignalHealth):
    """:class:`SignalHealth` publishing only the device taints a 1.33 API server accepts
    (NoSchedule, NoExecute): the offline twin of a live run whose server refused the
    non-blocking XID taints."""

    def render(self, name: str, t: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        obj, devs = super().render(name, t)
        kept = []
        for d in devs:
            ts = [
                x for x in d.get("taints") or [] if x.get("effect") in ("NoSchedule", "NoExecute")
            ]
            if ts:
                kept.append({**d, "taints": ts})
        return obj, kept


def offline(
    rp: Replay, policy: str, blocking_only: bool = False, remediate: bool = True
) -> tuple[Metrics, FirstPlacements]:
    """The offline engine on ``rp`` with health policy ``policy`` (``blocking_only``: the
    signals of :class:`BlockingTaintsOnly`): its fault accounting and each job's first
    placement. ``topoplace`` evicts as the live policy says (:func:`evict_after`) unless
    ``remediate`` is False; the other policies never do (:func:`live_policy`)."""
    run = replace(rp.run, health=policy)
    if policy == "topoplace" and remediate:
        run = replace(run, recovery=replace(run.recovery, evict_after=evict_after(rp)))
    inputs = materialize(run)
    inputs.jobs = [j for j in inputs.jobs if j.arrive <= rp.horizon]
    inputs.params = rp.inputs.params
    stats = FaultStats(policy, run.seed, inputs.jobs, inputs.faults)
    first = FirstPlacements()
    engine = build(run, inputs, [stats, first])
    if blocking_only:
        engine.health = BlockingTaintsOnly(inputs.nodes, inputs.faults, inputs.params.health)
    engine.run(inputs.jobs, inputs.faults)
    return stats.metrics, first


def same_first(live: FirstPlacements, off: FirstPlacements) -> tuple[int, int, int]:
    """(jobs placed in both, on the same nodes, and on the same GPUs too); members of a
    gang are interchangeable (which member takes which slot is kube-scheduler's order)."""
    both = same_nodes = same_gpus = 0
    for job, (_, members) in live.members.items():
        got = off.members.get(job)
        if got is None:
            continue
        both += 1
        if sorted(a.node for a in members) == sorted(a.node for a in got[1]):
            same_nodes += 1
            if sorted((a.node, tuple(a.gpus)) for a in members) == sorted(
                (a.node, tuple(a.gpus)) for a in got[1]
            ):
                same_gpus += 1
    return both, same_nodes, same_gpus


def start_delays(live: FirstPlacements, off: FirstPlacements) -> list[float]:
    """Per job placed in both: its first start live minus offline (trace seconds)."""
    return [t - off.members[j][0] for j, (t, _) in live.members.items() if j in off.members]


def _q(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


@dataclass
class LiveResult:
    """One live run."""

    health: str
    run: int
    metrics: Metrics
    first: FirstPlacements
    signals: SignalFigures
    start_lag: list[float]
    api_errors: list[str]
    verbs: dict[str, dict[str, float]]
    seconds: float
    evicted: list[tuple[str, float, str]] = field(default_factory=list)
    """:attr:`LiveEngine.evicted`: attempts ended by topoplace's evictions."""


def live_run(rp: Replay, args: argparse.Namespace, index: int, health: str) -> LiveResult:
    """One live replay of ``rp`` on a fresh control plane (see the module docstring), the
    live topoplace with health policy ``health``."""
    from benchmarks.live.dra import dra_version
    from benchmarks.live.kubesched import KubeScheduler, Topoplace
    from benchmarks.live.standalone import down_plane, up_plane, verb_ms

    out = Path(args.out)
    work_dir, plane, kc, api = up_plane(
        args, "livebench-faults-", dra=True, feature_gates=("DRADeviceTaints=true",)
    )
    run_id = f"{health}-r{index}"
    tp = ks = None
    stop = threading.Event()
    try:
        version = dra_version(api)
        scale = float(args.time_scale)
        signals = LiveSignals(
            rp.inputs.nodes, rp.inputs.faults, rp.inputs.params.health, api, version, scale
        )
        nodes, slices = signals.initial_objects()
        api.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", priority_class(), ok=(409,))
        api.ensure_namespace(NAMESPACE)
        api.create_nodes(nodes)
        for sl in slices:
            api.call("POST", f"/apis/resource.k8s.io/{version}/resourceslices", sl)
        log(f"run {index}: {len(nodes)} nodes, {len(slices)} slices ({version})")
        wall0 = time.time() + args.start_margin
        env = {
            "TOPOPLACE_HEALTH_CLOCK": f"{EPOCH0:.0f}@{wall0:.3f}*{scale:g}",
            "TOPOPLACE_HEALTH_REFRESH_S": f"{REFRESH_TRACE_S / scale:.4g}",
        }
        logs = out / "logs" / run_id
        policy = out / f"policy-{health}.yaml"
        check = max(0.05, CHECK_TRACE_S / scale)
        policy.write_text(yaml.safe_dump(live_policy(rp.run, health, check), sort_keys=False))
        tp = Topoplace(
            kc, logs, port=args.extender_port, source=args.topoplace_src, env=env, policy=policy
        )
        tp.start()
        ks = KubeScheduler(
            kc, tp.extender_url, logs, port=args.topoplace_sched_port, kube_bin=args.kube_bin
        )
        ks.start()
        if time.time() > wall0:
            raise RuntimeError(
                f"topoplace and kube-scheduler took longer than --start-margin "
                f"{args.start_margin:g} s to start"
            )
        stats = FaultStats(health, rp.run.seed, rp.inputs.jobs, rp.inputs.faults)
        first = FirstPlacements()
        engine = LiveEngine(
            api,
            signals,
            namespace=NAMESPACE,
            run_id=run_id,
            scale=scale,
            recovery=rp.run.recovery,
            horizon=rp.horizon,
            hooks=[stats, first],
        )
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        rv = api.list_pods(NAMESPACE)["metadata"]["resourceVersion"]

        def on_event(kind: str, obj: dict[str, Any], _t: float) -> None:
            if kind == "DELETED" or (obj.get("metadata") or {}).get("deletionTimestamp"):
                engine.binds.put((obj, time.time(), DELETED))
            elif kind in ("ADDED", "MODIFIED") and (obj.get("spec") or {}).get("nodeName"):
                engine.binds.put((obj, time.time(), BOUND))

        errors: list[BaseException] = []

        def watch() -> None:
            try:
                api.watch(
                    path,
                    rv,
                    on_event,
                    stop,
                    server_timeout=5,
                    label_selector=f"{RUN_LABEL}={run_id}",
                )
            except BaseException as exc:
                errors.append(exc)

        th = threading.Thread(target=watch, name="watch-pods", daemon=True)
        th.start()
        time.sleep(max(0.0, wall0 - time.time()))
        engine.wall0 = wall0
        signals.start(wall0)
        log(f"run {index}: replaying {rp.horizon:g} trace s at {scale:g} per s")
        engine.run(rp.inputs.jobs, rp.inputs.faults)
        took = time.time() - wall0
        signals.stop()
        if errors:
            raise RuntimeError(f"the pod watch failed: {errors[0]}")
        verbs = verb_ms(tp, ("filter", "prioritize", "bind"))
        return LiveResult(
            health,
            index,
            stats.metrics,
            first,
            signals.figures,
            engine.start_lag,
            engine.api_errors,
            verbs,
            took,
            engine.evicted,
        )
    finally:
        stop.set()
        for proc in (ks, tp):
            if proc is not None:
                proc.stop()
        down_plane(api, plane, work_dir, out / "logs" / run_id)


# ---- report ---------------------------------------------------------------------------------


def live_label(lv: LiveResult) -> str:
    return f"live {lv.health}, run {lv.run}"


def row(name: str, m: Metrics) -> dict[str, Any]:
    r = dict(summarize([m]))
    r["policy"] = name
    return r


def render(
    rp: Replay,
    args: argparse.Namespace,
    off: Mapping[str, tuple[Metrics, FirstPlacements]],
    lives: Sequence[LiveResult],
) -> str:
    """The Markdown report."""
    inp = rp.inputs
    rec = rp.run.recovery
    outages = [f for f in inp.faults if isinstance(f, Outage)]
    kinds = Counter(o.kind for o in outages)
    gpu_faults = sum(1 for f in inp.faults if isinstance(f, GpuFault) and f.end > f.start)
    lines = [
        "# Failure injection, live and offline",
        "",
        f"Scenario file `{rp.path}`, seed {rp.run.seed}, horizon {rp.horizon:g} s "
        f"({rp.horizon / 3600:g} h); {len(inp.nodes)} nodes "
        f"({sum(int(n['status']['capacity'].get('nvidia.com/gpu', 0)) for n in inp.nodes)} GPUs), "
        f"{len(inp.jobs)} gangs; faults: {kinds.get('host', 0)} host, "
        f"{kinds.get('gpu-node', 0)} node-level GPU, {gpu_faults} GPU-local, "
        f"{kinds.get('flap', 0)} flaps; recovery: re-queued {rec.requeue_delay:g} s after "
        f"a fault, a crash {rec.crash_after:g} s after a start on broken hardware, checkpoints "
        f"every {rec.checkpoint_every:g} s, {rec.restart_overhead:g} s per restart"
        + (
            f"; topoplace's remediation evicts a gang {after:g} s after a failure of "
            f"its hardware is published (offline row `{NO_REMEDIATION}`: without it)."
            if (after := evict_after(rp)) is not None
            else "."
        ),
        "",
    ]
    if lives:
        lines += [
            f"Live: the test cluster of `benchmarks.cluster` (`{args.kube_bin}`, DRA, "
            f"`DRADeviceTaints`), kube-scheduler with the shipped configuration and topoplace as its "
            f"extender (the shipped policy), {args.time_scale:g} trace seconds per live second "
            f"(`TOPOPLACE_HEALTH_CLOCK`, health refresh every {REFRESH_TRACE_S:g} trace s); "
            f"topoplace {args.revisions}.",
            "",
        ]
    lines += [
        "Offline: `benchmarks.engine` on the same file, seed and horizon for each health "
        "policy. Live and offline are accounted by `benchmarks.engine.scenarios.faults.metrics.FaultStats`.",
        "",
    ]
    rows = [row(f"offline {p}", m) for p, (m, _) in off.items()]
    rows += [row(live_label(lv), lv.metrics) for lv in lives]
    lines += [table(rows), ""]
    for lv in lives:
        ref = off.get(OFFLINE_TWIN[lv.health])
        sf = lv.signals
        lines.append(
            f"{live_label(lv).capitalize()} ({lv.seconds:.0f} s; its offline twin: "
            f"{OFFLINE_TWIN[lv.health]}):"
        )
        if ref is not None:
            both, nodes, gpus = same_first(lv.first, ref[1])
            delays = start_delays(lv.first, ref[1])
            lines.append(
                f"- first placements: {both} jobs placed in both; {nodes} on the same nodes as "
                f"offline, {gpus} also on the same GPUs; first start later than offline by "
                f"(trace s) p50 {_q(delays, 0.5):.1f}, p90 {_q(delays, 0.9):.1f}, max "
                f"{max(delays, default=float('nan')):.1f}"
            )
        lines.append(
            f"- signals written: {sf.status_patches} status patches, {sf.node_patches} node "
            f"patches, {sf.slice_updates} slice updates; non-blocking XID taints left out: "
            f"{sf.xid_taints_dropped}; write lag (trace s) p50 {_q(sf.lag, 0.5):.1f}, p99 "
            f"{_q(sf.lag, 0.99):.1f}; errors {len(sf.errors)}"
            + (f" (first: {sf.errors[0]})" if sf.errors else "")
        )
        why = Counter(w for _, _, w in lv.evicted)
        twin = ref[0] if ref is not None else None
        lines.append(
            f"- remediation: {len(lv.evicted)} attempts ended by topoplace's evictions "
            f"({why.get('requeue', 0)} of interrupted jobs, {why.get('crash', 0)} of jobs "
            f"placed on broken hardware, {why.get('healthy', 0)} of jobs no fault hit); "
            f"gangs torn down before the job controller's delay: live {lv.metrics.evicted}"
            + (f", offline {twin.evicted}" if twin is not None else "")
            + "; GPUs freed after a fault (trace s) p50 / max: live "
            f"{_q(lv.metrics.teardown_times, 0.5):.0f} / "
            f"{max(lv.metrics.teardown_times, default=float('nan')):.0f}"
            + (
                f", offline {_q(twin.teardown_times, 0.5):.0f} / "
                f"{max(twin.teardown_times, default=float('nan')):.0f}"
                if twin is not None
                else ""
            )
        )
        lines.append(
            f"- from an attempt's creation to its last bind (trace s): p50 "
            f"{_q(lv.start_lag, 0.5):.1f}, p99 {_q(lv.start_lag, 0.99):.1f} over "
            f"{len(lv.start_lag)} starts; API errors {len(lv.api_errors)}"
            + (f" (first: {lv.api_errors[0]})" if lv.api_errors else "")
        )
        v = lv.verbs
        lines.append(
            "- topoplace verbs (ms, mean / p99): "
            + ", ".join(
                f"{k} {v[k].get('mean_ms', float('nan')):.1f} / {v[k].get('p99_ms', float('nan')):.1f}"
                for k in v
            )
        )
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from benchmarks.live.standalone import add_plane_args

    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.live.faults", description=__doc__.split("\n", 1)[0]
    )
    ap.add_argument("--scenario-file", default=str(DEFAULT_FILE))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--until", default=None, help="cap the horizon (seconds, or 12h, 1d)")
    ap.add_argument("--time-scale", type=float, default=120.0, help="trace seconds per live second")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--start-margin",
        type=float,
        default=30.0,
        help="seconds between starting topoplace and trace time 0 (it starts on that clock)",
    )
    ap.add_argument(
        "--health",
        default="topoplace",
        help="health policies of the live topoplace, comma-separated: "
        + ", ".join(HEALTH_POLICIES)
        + " (each a run of its own; topoplace is the shipped policy; behind kube-scheduler, "
        "ready-only is kube-default, which kube-scheduler enforces itself)",
    )
    ap.add_argument("--offline-only", action="store_true", help="the offline rows alone")
    add_plane_args(ap)
    args = ap.parse_args(argv)
    if args.time_scale <= 0:
        ap.error("--time-scale must be positive")
    args.health = [h for h in args.health.split(",") if h]
    bad = set(args.health) - set(HEALTH_POLICIES)
    if bad or not args.health:
        ap.error(f"--health: one or more of {', '.join(HEALTH_POLICIES)}")
    return args


def _live_figures(lv: LiveResult, twin: FirstPlacements) -> dict[str, Any]:
    """One live arm's figures for ``results.json``, its first placements beside its
    offline twin's (``twin``)."""
    return {
        "arm": live_label(lv),
        "seconds": lv.seconds,
        "signals": {k: v for k, v in vars(lv.signals).items() if k != "lag"},
        "lag_p50": _q(lv.signals.lag, 0.5),
        "lag_p99": _q(lv.signals.lag, 0.99),
        "start_lag_p50": _q(lv.start_lag, 0.5),
        "start_lag_p99": _q(lv.start_lag, 0.99),
        "api_errors": lv.api_errors[:20],
        "evicted": lv.evicted,
        "teardown_times": lv.metrics.teardown_times,
        "verbs": lv.verbs,
        "first_as_offline": same_first(lv.first, twin),
        "first_start_delays": start_delays(lv.first, twin),
        "first_placements": {
            job: {
                "live": [[a.node, list(a.gpus)] for a in members],
                "offline": [[a.node, list(a.gpus)] for a in twin.members.get(job, (0, ()))[1]],
            }
            for job, (_, members) in lv.first.members.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.live.standalone import missing

    args = parse_args(argv)
    until = _duration(args.until, "--until") if args.until is not None else None
    rp = load(args.scenario_file, args.seed, until)
    if not math.isfinite(rp.horizon):
        print("the replay needs a horizon (the file's, or --until)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.live.run import _revisions

    args.revisions = _revisions(args.topoplace_src)
    off = {p: offline(rp, p) for p in HEALTH_POLICIES}
    off[NO_REMEDIATION] = offline(rp, "topoplace", remediate=False)
    lives: list[LiveResult] = []
    if not args.offline_only:
        lacking = missing(args)
        if lacking:
            print(lacking, file=sys.stderr)
            return 2
        for i in range(args.runs):
            for health in args.health:
                lives.append(live_run(rp, args, i + 1, health))
    if any(lv.signals.xid_taints_dropped for lv in lives):
        off[NO_XID] = offline(rp, "topoplace", blocking_only=True)
    text = render(rp, args, off, lives)
    (out / "report.md").write_text(text + "\n")
    rows = [row(f"offline {p}", m) for p, (m, _) in off.items()]
    rows += [row(live_label(lv), lv.metrics) for lv in lives]
    extra = [_live_figures(lv, off[OFFLINE_TWIN[lv.health]][1]) for lv in lives]
    (out / "results.json").write_text(
        json.dumps({"rows": rows, "live": extra, "file": rp.path, "seed": rp.run.seed}, indent=1)
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
