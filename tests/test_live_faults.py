"""The live failure-injection replay (``benchmarks/live/faults.py``) without a control plane:
how a render becomes API writes, how a job's attempts become pods, and that the live
engine's lifecycle and accounting are the offline engine's when placements are the same.

The live run itself (real kube-scheduler, topoplace, API server) is ``topoplace bench
live-faults --kube-bin DIR``; its figures are in ``benchmarks/results/live-faults.md``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks.engine.health import EPOCH0, GpuFault, Outage, SignalHealth
from benchmarks.engine.jobs import Job, Run
from benchmarks.engine.loop import Engine, Hook
from benchmarks.engine.scenarios.faults.metrics import FaultStats
from benchmarks.live import faults as lf
from benchmarks.live.scenariofile import FirstPlacements
from scheduler.core.health import HealthParams
from scheduler.core.model import PLACEMENT_ANNOTATION, PLACEMENT_VERSION

SCENARIO = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "faults-live.yaml"


def _nodes() -> list[dict[str, Any]]:
    from benchmarks.clusters import dgx_h100_nodes

    return [dict(n) for n in dgx_h100_nodes(4)]


# ---- renders as patches ---------------------------------------------------------------------


def test_host_outage_becomes_not_ready_and_unreachable_then_clears() -> None:
    nodes = _nodes()
    name = nodes[1]["metadata"]["name"]
    sh = SignalHealth(nodes, [Outage(name, "host", 1000.0, 5000.0, 1040.0)], HealthParams())
    before, _ = sh.render(name, 1000.0)  # broken, not yet detected: published as healthy
    during, _ = sh.render(name, 1040.0)
    after, _ = sh.render(name, 5000.0)
    meta, status = lf.node_patches(before, during)
    assert meta == {
        "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]}
    }
    assert status is not None
    ready = status["status"]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == (
        "Ready",
        "Unknown",
        "NodeStatusUnknown",
    )
    meta, status = lf.node_patches(during, after)
    assert meta == {"spec": {"taints": None}}
    assert status is not None and status["status"]["conditions"][0]["status"] == "True"


def test_gpu_node_outage_cordons_and_labels_then_marks_remediated() -> None:
    nodes = _nodes()
    name = nodes[0]["metadata"]["name"]
    sh = SignalHealth(nodes, [Outage(name, "gpu-node", 100.0, 900.0, 130.0)], HealthParams())
    ok, _ = sh.render(name, 0.0)
    bad, _ = sh.render(name, 130.0)
    fixed, _ = sh.render(name, 900.0)
    meta, status = lf.node_patches(ok, bad)
    assert meta == {
        "metadata": {"labels": {"dgxc.nvidia.com/nvsentinel-state": "quarantined"}},
        "spec": {"unschedulable": True},
    }
    assert status is not None
    assert [c["type"] for c in status["status"]["conditions"]] == ["Ready", "GpuXidError"]
    meta, status = lf.node_patches(bad, fixed)
    assert meta == {
        "metadata": {"labels": {"dgxc.nvidia.com/nvsentinel-state": "remediation-succeeded"}},
        "spec": {"unschedulable": None},
    }
    assert status is not None and [c["type"] for c in status["status"]["conditions"]] == ["Ready"]


def test_a_heartbeat_is_a_status_patch_only_and_nothing_is_no_patch() -> None:
    nodes = _nodes()
    name = nodes[2]["metadata"]["name"]
    sh = SignalHealth(nodes, [], HealthParams())
    a, _ = sh.render(name, 10.0)
    b, _ = sh.render(name, 10.0 + 300.0)
    assert lf.node_patches(a, a) == (None, None)
    meta, status = lf.node_patches(a, b)
    assert meta is None
    assert status is not None and set(status["status"]) == {"conditions"}
    hb = status["status"]["conditions"][0]["lastHeartbeatTime"]
    assert hb != a["status"]["conditions"][0]["lastHeartbeatTime"]
    assert hb.startswith("2027-01-01T00:")  # trace time, from EPOCH0


def test_lost_gpu_is_a_device_taint_and_a_lower_allocatable() -> None:
    nodes = _nodes()
    name = nodes[3]["metadata"]["name"]
    f = GpuFault(name, 5, 50.0, 600.0, 60.0, xid_times=(20.0, 30.0))
    sh = SignalHealth(nodes, [f], HealthParams())
    ok, _ = sh.render(name, 0.0)
    bad, devs = sh.render(name, 60.0)
    taints = lf.device_taints(devs)
    assert [t["key"] for t in taints[5]] == ["gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/xid"]
    assert lf.blocking_only(taints) == {
        5: [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}]
    }
    _, status = lf.node_patches(ok, bad)
    assert status is not None and status["status"]["allocatable"]["nvidia.com/gpu"] == "7"
    v2 = lf.slice_devices(name, 8, "v1beta2", taints)
    assert [d["name"] for d in v2] == [f"gpu-{i}" for i in range(8)]
    assert v2[5]["taints"][0]["key"] == "gpu.nvidia.com/gpu-lost" and "taints" not in v2[4]
    v1 = lf.slice_devices(name, 8, "v1beta1", taints)
    assert v1[5]["basic"]["taints"] == v2[5]["taints"]
    assert v1[5]["basic"]["attributes"]["index"] == {"int": 5}


# ---- attempts as pods -----------------------------------------------------------------------


def test_attempt_pods_are_the_engine_pods_renamed_and_later_ones_go_first() -> None:
    job = Job("job-00007", 0.0, pods=3, gpus_per_pod=8, gang=True, duration=3600.0)
    first = lf.attempt_pods(job, 0, namespace="ns", run="r1", restarted=False)
    again = lf.attempt_pods(job, 2, namespace="ns", run="r1", restarted=True)
    assert [p["metadata"]["name"] for p in first] == [f"job-00007-{i}" for i in range(3)]
    assert [p["metadata"]["name"] for p in again] == [f"job-00007-r2-{i}" for i in range(3)]
    assert {p["metadata"]["annotations"]["topoplace.io/gang"] for p in again} == {"job-00007-r2"}
    assert {p["metadata"]["annotations"]["topoplace.io/gang-size"] for p in again} == {"3"}
    assert all(p["spec"]["schedulerName"] == lf.SCHEDULER for p in first + again)
    assert all("priorityClassName" not in p["spec"] for p in first)
    assert all(p["spec"]["priorityClassName"] == lf.RESTARTED_CLASS for p in again)
    # an explicit priority beside a class is refused by the Priority admission plugin
    assert all("priority" not in p["spec"] for p in first + again)
    labels = again[0]["metadata"]["labels"]
    assert labels[lf.JOB_LABEL] == "job-00007" and labels[lf.ATTEMPT_LABEL] == "2"
    assert lf.priority_class()["preemptionPolicy"] == "Never"


# ---- the live engine is the engine ----------------------------------------------------------


class Starts(Hook):
    """Every placement of every job, in order (not only the first)."""

    def __init__(self) -> None:
        self.of: dict[str, list[tuple[float, tuple[Any, ...]]]] = {}

    def started(self, engine: Engine, run: Run) -> None:
        self.of.setdefault(run.job.name, []).append((run.start, tuple(run.members)))


class Ends(Hook):
    """How each job's last placement ended."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def released(self, engine: Engine, run: Run, why: str) -> None:
        self.last[run.job.name] = why


class RecordingApiNoServer:
    """Stands in for the API server (none runs in CI): records the writes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.patches: list[tuple[str, str]] = []

    def create_pod(self, ns: str, pod: dict[str, Any]) -> None:
        with self.lock:
            self.created.append(pod["metadata"]["name"])

    def delete_pod(self, ns: str, name: str) -> None:
        with self.lock:
            self.deleted.append(name)

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> None:
        with self.lock:
            self.patches.append((method, path))


class OfflinePlacingSchedulerStandIn(lf.LiveEngine):
    """The live engine with kube-scheduler replaced (it cannot run in CI) by the offline
    engine's own placements: attempt k of a job is bound exactly where and when the offline
    engine placed that job the k-th time, on a simulated clock (1 s = 1 trace s)."""

    def __init__(self, starts: dict[str, list[tuple[float, tuple[Any, ...]]]], **kw: Any) -> None:
        super().__init__(**kw)
        self.starts = starts
        self.evictions: dict[str, list[tuple[int, float]]] = {}
        """Attempts the stand-in's topoplace evicts (job -> [(attempt, time)])."""
        self.t = 0.0
        self.due: list[tuple[float, int, dict[str, Any], str]] = []

    def clock(self) -> float:
        return self.t

    def _enqueue(self, r: Run) -> None:
        super()._enqueue(r)
        k = self.attempt[r.job.name]
        placed = self.starts.get(r.job.name, [])
        if k >= len(placed):
            return  # the offline engine never placed this attempt
        at, members = placed[k]
        for name, a in zip(self.pods_of[(r.job.name, k)], members, strict=True):
            rec = {"v": PLACEMENT_VERSION, "node": a.node, "gpus": list(a.gpus)}
            pod = {
                "metadata": {"name": name, "annotations": {PLACEMENT_ANNOTATION: json.dumps(rec)}},
                "spec": {"nodeName": a.node},
            }
            self.due.append((at, len(self.due), pod, lf.BOUND))
        for kk, when in self.evictions.get(r.job.name, ()):
            if kk == k:  # topoplace evicts the gang: the first member's deletion is seen
                gone = {"metadata": {"name": self.pods_of[(r.job.name, k)][0]}}
                self.due.append((when, len(self.due), gone, lf.DELETED))
        self.due.sort(key=lambda d: (d[0], d[1]))

    def next_bind(self, timeout: float) -> tuple[dict[str, Any], float, str] | None:
        # a bind due strictly before the next event comes first; at the same instant, the
        # events (the offline engine serves its queue after them)
        if self.due and self.due[0][0] < self.t + timeout:
            at, _, pod, kind = self.due.pop(0)
            self.t = max(self.t, at)
            return pod, at, kind
        self.t += timeout
        return None


class Evictions(Hook):
    """When each placement was ended by remediation: job -> [(placement index, time)]."""

    def __init__(self, starts: Starts) -> None:
        self.starts = starts
        self.of: dict[str, list[tuple[int, float]]] = {}

    def released(self, engine: Engine, run: Run, why: str) -> None:
        early_crash = why == "crash" and engine.now - run.start < engine.recovery.crash_after
        if why == "evicted" or early_crash:
            k = len(self.starts.of[run.job.name]) - 1
            self.of.setdefault(run.job.name, []).append((k, engine.now))


def _offline(
    rp: lf.Replay, evict_after: float | None = None
) -> tuple[FaultStats, FirstPlacements, Starts, Evictions]:
    from dataclasses import replace

    from benchmarks.engine.run import build
    from benchmarks.engine.sources import materialize

    run = replace(rp.run, recovery=replace(rp.run.recovery, evict_after=evict_after))
    inputs = materialize(run)
    inputs.jobs = [j for j in inputs.jobs if j.arrive <= rp.horizon]
    inputs.params = rp.inputs.params
    stats = FaultStats("topoplace", rp.run.seed, inputs.jobs, inputs.faults)
    first, starts = FirstPlacements(), Starts()
    evictions = Evictions(starts)
    build(run, inputs, [stats, first, starts, evictions]).run(inputs.jobs, inputs.faults)
    return stats, first, starts, evictions


def _live_stand_in(
    rp: lf.Replay,
    starts: Starts,
    evictions: dict[str, list[tuple[int, float]]],
    hooks: list[Hook] | None = None,
) -> tuple[FaultStats, OfflinePlacingSchedulerStandIn]:
    """The live engine over ``rp`` with the stand-in placing as ``starts`` and deleting
    as ``evictions``, run to the horizon: (its FaultStats, the engine)."""
    api = RecordingApiNoServer()
    signals = lf.LiveSignals(
        rp.inputs.nodes, rp.inputs.faults, rp.inputs.params.health, api, "v1beta2", 1.0
    )
    signals.initial_objects()
    stats = FaultStats("topoplace", rp.run.seed, rp.inputs.jobs, rp.inputs.faults)
    eng = OfflinePlacingSchedulerStandIn(
        starts.of,
        api=api,
        signals=signals,
        namespace="ns",
        run_id="t",
        scale=1.0,
        recovery=rp.run.recovery,
        horizon=rp.horizon,
        hooks=[stats, *(hooks or [])],
    )
    eng.evictions = evictions
    signals.start(0.0)
    eng.run(rp.inputs.jobs, rp.inputs.faults)
    signals.stop()
    return stats, eng


def test_live_engine_fed_the_offline_placements_accounts_exactly_as_offline() -> None:
    rp = lf.load(SCENARIO, until=6 * 3600.0)  # six hours: faults, restarts and crashes
    stats, first, starts, _ = _offline(rp)
    m = stats.metrics
    assert m.gang_restarts > 0 and m.completed > 0 and m.interruptions > 0  # not a trivial run
    live_first = FirstPlacements()
    ends = Ends()
    live_stats, eng = _live_stand_in(rp, starts, {}, [live_first, ends])
    api = eng.api
    signals = eng.signals
    assert vars(live_stats.metrics) == vars(m)

    def where(fp: FirstPlacements) -> dict[str, Any]:
        return {j: (t, [(a.node, a.gpus) for a in ms]) for j, (t, ms) in fp.members.items()}

    assert where(live_first) == where(first)
    assert lf.same_first(live_first, first) == (len(first.members),) * 3
    # every attempt's pods were created, and every attempt that ended before the horizon
    # deleted; what is left is the running and waiting jobs' current attempts
    made = [n for names in eng.pods_of.values() for n in names]
    assert sorted(api.created) == sorted(made)
    unfinished = {j for j, why in ends.last.items() if why == "end"}
    unfinished |= {r.job.name for r in eng.runs.values() if r.queued}
    left = {
        n
        for (job, k), names in eng.pods_of.items()
        if eng.attempt[job] == k and job in unfinished
        for n in names
    }
    assert left and set(api.created) - set(api.deleted) == left
    restarts = sum(1 for (_, k) in eng.pods_of if k > 0)
    assert 0 < restarts <= m.gang_restarts  # a restart after the horizon makes no attempt
    # signals: every node's heartbeat and every change was written, in trace time
    assert signals.figures.status_patches > len(rp.inputs.nodes) * (rp.horizon // 300 - 1)
    assert signals.figures.slice_updates > 0 and not signals.figures.errors


def test_remediation_offline_frees_a_gangs_gpus_sooner_and_live_evictions_account_alike() -> None:
    rp = lf.load(SCENARIO, until=6 * 3600.0)
    after = lf.evict_after(rp)
    assert after == 60.0  # the shipped policy evicts, a minute after a published failure
    plain, _, _, _ = _offline(rp)
    stats, _, starts, evictions = _offline(rp, after)
    m = stats.metrics
    assert plain.metrics.evicted == 0 and plain.metrics.teardown_times
    assert all(abs(x - 300.0) < 1e-6 for x in plain.metrics.teardown_times)
    # Faults published within 4 minutes (NotReady 40 s, NVSentinel 30 s, DRA 10 s after
    # the fault): every interrupted gang is evicted a minute after publication.
    assert m.evicted > 0 and m.teardown_times and max(m.teardown_times) <= 40.0 + after
    assert sum(len(v) for v in evictions.of.values()) == m.evicted
    # The live engine ends the attempts when topoplace's deletions arrive (here at the
    # offline eviction times) and accounts exactly as the offline engine with remediation.
    live, eng = _live_stand_in(rp, starts, evictions.of)
    assert vars(live.metrics) == vars(m)
    assert len(eng.evicted) == m.evicted
    assert {w for _, _, w in eng.evicted} <= {"requeue", "crash"}


def test_an_eviction_of_a_job_no_fault_hit_interrupts_it_and_is_reported() -> None:
    rp = lf.load(SCENARIO, until=3 * 3600.0)
    stats, _, starts, _ = _offline(rp)
    job = next(j for j, placed in starts.of.items() if placed[0][0] < 1800.0)
    at = starts.of[job][0][0] + 600.0
    live, eng = _live_stand_in(rp, starts, {job: [(0, at)]})
    assert (eng.pods_of[(job, 0)][0], at, "healthy") in eng.evicted
    assert live.metrics.interruptions == stats.metrics.interruptions + 1
    assert eng.attempt[job] >= 1  # re-queued: a second attempt was made


def test_evicted_at_is_a_minute_after_publication_while_the_failure_lasts() -> None:
    from scheduler.core.schedule import Assignment

    nodes = _nodes()
    a, b = (n["metadata"]["name"] for n in nodes[:2])
    faults = [
        Outage(a, "host", 1000.0, 5000.0, 1040.0),  # published at 1040
        Outage(b, "flap", 1000.0, 1090.0, 1040.0),  # published 50 s only: no eviction
        GpuFault(b, 3, 2000.0, 9000.0, 2010.0, ()),
    ]
    sh = SignalHealth(nodes, faults, HealthParams())
    run = Run(Job("j", 0.0, pods=2, gpus_per_pod=4, gang=True), 0, "ns/j")
    run.start = 100.0
    run.members = (Assignment("j-0", a, (0, 1, 2, 3)), Assignment("j-1", b, (0, 1, 2, 3)))
    assert sh.evicted_at(run, 1000.0, 60.0) == 1100.0
    run.members = (Assignment("j-1", b, (0, 1, 2, 3)),)
    assert sh.evicted_at(run, 1000.0, 60.0) == 2070.0  # the flap is too short; GPU 3 fails
    run.members = (Assignment("j-1", b, (4, 5, 6, 7)),)
    assert sh.evicted_at(run, 1000.0, 60.0) is None  # holds no failed GPU
    blind = SignalHealth(nodes, faults, HealthParams.ready_only())
    run.members = (Assignment("j-1", b, (0, 1, 2, 3)),)
    assert blind.evicted_at(run, 1000.0, 60.0) is None  # it does not read DRA taints


def test_a_file_without_faults_is_refused() -> None:
    from benchmarks.engine.scenario import ScenarioError

    mix = SCENARIO.parent / "mix.yaml"
    with pytest.raises(ScenarioError, match="no faults"):
        lf.load(mix)


def test_offline_rows_differ_by_health_policy() -> None:
    rp = lf.load(SCENARIO)
    got = {p: lf.offline(rp, p)[0] for p in ("topoplace", "ready-only")}
    assert got["topoplace"].bad_signalled == 0
    assert got["ready-only"].bad_signalled > 0  # it places on nodes it could know are broken
    assert got["topoplace"].goodput > got["ready-only"].goodput


def test_replay_clock_reads_trace_time() -> None:
    from scheduler.kube.runner import ReplayClock, options_from_env

    opts = options_from_env(
        {"TOPOPLACE_HEALTH_CLOCK": f"{EPOCH0:.0f}@1000*120", "TOPOPLACE_HEALTH_REFRESH_S": "0.25"}
    )
    assert opts.health_clock == (EPOCH0, 1000.0, 120.0)
    assert opts.health_refresh_interval_s == 0.25
    clock = ReplayClock(*opts.health_clock)
    import time

    assert clock() == pytest.approx(EPOCH0 + (time.time() - 1000.0) * 120.0, abs=120.0)
    for bad in ("1798761600", "a@b*c", "1@2*0", "1@2*-1", "nan@1*1"):
        with pytest.raises(ValueError, match="TOPOPLACE_HEALTH_CLOCK"):
            options_from_env({"TOPOPLACE_HEALTH_CLOCK": bad})
    for bad in ("-1", "x", "4000"):
        with pytest.raises(ValueError, match="TOPOPLACE_HEALTH_REFRESH_S"):
            options_from_env({"TOPOPLACE_HEALTH_REFRESH_S": bad})


def test_the_tracker_of_a_replay_reads_a_stale_heartbeat_in_trace_time() -> None:
    """Topoplace's health tracker on a replay clock: a heartbeat 400 trace seconds old is
    stale (the threshold is 360 s) though it is 3.3 wall seconds old at 120x."""
    from scheduler.core.model import Health
    from scheduler.kube.runner import ReplayClock
    from scheduler.runtime.health_tracker import HealthTracker

    nodes = _nodes()
    name = nodes[0]["metadata"]["name"]
    sh = SignalHealth(
        nodes, [Outage(name, "host", 2000.0, 2000.0, 2000.0, warn=1000.0)], HealthParams()
    )
    obj, _ = sh.render(name, 1400.0)  # the kubelet stalled at 1000: heartbeat at <= 1000
    import time

    wall = time.time()
    fresh = HealthTracker(HealthParams(), clock=ReplayClock(EPOCH0 + 1000.0, wall, 120.0))
    stale = HealthTracker(HealthParams(), clock=ReplayClock(EPOCH0 + 1400.0, wall, 120.0))
    from scheduler.core.model import NodeHealth

    ok = NodeHealth()
    assert fresh.adjust(obj, ok).state == Health.HEALTHY
    assert stale.adjust(obj, ok).state == Health.DEGRADED


def test_load_keeps_the_jobs_within_the_horizon_and_the_shipped_policy() -> None:
    rp = lf.load(SCENARIO, until=7200.0)
    assert rp.horizon == 7200.0
    assert rp.inputs.jobs and all(j.arrive <= 7200.0 for j in rp.inputs.jobs)
    assert rp.inputs.params.gang.seed == 7  # config/policy.yaml's pinned solver seed


def test_live_policy_carries_the_health_policy_of_the_arm() -> None:
    from benchmarks.engine.health import health_policies
    from scheduler.core.params import SchedParams

    rp = lf.load(SCENARIO, until=3600.0)
    for name, hp in health_policies().items():
        got = SchedParams.from_config(lf.live_policy(rp.run, name)).health
        assert got == hp, name
    shipped = lf.live_policy(rp.run)
    assert shipped["gang"]["seed"] == 7 and "history" not in shipped["health"]


def test_cli_refuses_unknown_health_policies() -> None:
    with pytest.raises(SystemExit):
        lf.parse_args(["--out", "x", "--health", "topoplace,made-up"])
    args = lf.parse_args(["--out", "x", "--health", "topoplace,ready-only"])
    assert args.health == ["topoplace", "ready-only"]


class Server133NoServer(RecordingApiNoServer):
    """Stands in for a 1.33 API server (none runs in CI): it refuses a device taint whose
    effect is not NoSchedule or NoExecute, as its validation does."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[Any] = []

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> None:
        from benchmarks.live.kubeapi import ApiError

        if "resourceslices" in path:
            effects = {t["effect"] for d in body["spec"]["devices"] for t in d.get("taints") or []}
            if effects - {"NoSchedule", "NoExecute"}:
                raise ApiError(422, b'{"reason":"Invalid"}', f"{method} {path}")
            self.bodies.append(body)
        super().call(method, path, body, **kw)


def test_signals_leave_out_what_a_133_server_refuses_and_count_it_once() -> None:
    nodes = _nodes()
    name = nodes[0]["metadata"]["name"]
    f = GpuFault(name, 2, 500.0, 900.0, 510.0, xid_times=(100.0, 200.0))
    api = Server133NoServer()
    sig = lf.LiveSignals(nodes, [f], HealthParams(), api, "v1beta2", 1.0)  # type: ignore[arg-type]
    sig.initial_objects()
    for t in (100.0, 150.0, 200.0, 510.0, 900.0):
        obj, devs = sig.render(name, t)
        sig.write(name, obj, devs)
    assert not sig.xid_ok
    assert sig.figures.xid_taints_dropped == 2  # two XIDs, each counted once
    # the lost GPU was published (NoSchedule), then cleared
    tainted = [[d["name"] for d in b["spec"]["devices"] if d.get("taints")] for b in api.bodies]
    assert tainted == [["gpu-2"], []]
    assert sig.figures.slice_updates == 2


def test_every_live_arm_has_an_offline_twin_among_the_offline_rows() -> None:
    assert set(lf.OFFLINE_TWIN) == set(lf.HEALTH_POLICIES)
    assert set(lf.OFFLINE_TWIN.values()) <= set(lf.HEALTH_POLICIES)
    assert lf.OFFLINE_TWIN["ready-only"] == "kube-default"  # kube-scheduler's own checks
