"""Health history: flapping memory with exponential decay, settle time, XID bursts over time,
and the mutable tracker wired into the cache."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.clusters import make_node, make_pod
from scheduler.core.health import (
    REASON_FAILED_BEFORE,
    REASON_FLAPPING,
    REASON_HEARTBEAT_STALE,
    REASON_NOT_READY,
    REASON_SETTLING,
    REASON_XID_BURST,
    HealthParams,
)
from scheduler.core.health_history import (
    HealthHistory,
    NodeHistory,
    adjust,
    flap_risk,
    forget_node,
    observe,
)
from scheduler.core.model import Health, NodeHealth, PodRequest
from scheduler.core.objects import meta, node_gpus
from scheduler.core.params import SchedParams
from scheduler.core.schedule import filter_nodes, place_pod, score_nodes
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.health_tracker import HealthTracker
from tests.health.builders import (
    HEARTBEAT,
    Clock,
    device,
    dgx,
    resource_slice,
    taint,
    tracked_cache,
)

H, D, U = Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY
P = HealthParams()
HL = P.flap_half_life_seconds
W = P.flap_weight
OK = NodeHealth()
DOWN = NodeHealth(U, ("node not ready",), 1.0)


def run(seq: list[tuple[float, NodeHealth]], params: HealthParams = P) -> HealthHistory:
    h = HealthHistory()
    for t, v in seq:
        h = observe(h, "n1", v, t, params=params)
    return h


ONE_FAILURE = [(0.0, OK), (100.0, DOWN), (700.0, OK)]  # down 10 min, recovered at t=700
FLAPPING = [
    (0.0, OK),
    (100.0, DOWN),
    (400.0, OK),
    (3000.0, DOWN),
    (3300.0, OK),
    (6000.0, DOWN),
    (6300.0, OK),
]


# (description, observations, time of judgement, expected state, reasons, risk)
HISTORY_ROWS = [
    ("never failed: trusted", [(0.0, OK)], 10_000.0, H, (), 0.0),
    (
        "currently down: unchanged verdict",
        [(0.0, OK), (100.0, DOWN)],
        200.0,
        U,
        ("node not ready",),
        1.0,
    ),
    (
        "just recovered: settling, DEGRADED",
        ONE_FAILURE,
        800.0,
        D,
        (REASON_SETTLING, REASON_FAILED_BEFORE),
        1 - (1 - P.settle_risk) * (1 - W * 0.5 ** (700 / HL)),
    ),
    (
        "settled after one failure: HEALTHY but carries decayed risk",
        ONE_FAILURE,
        700.0 + P.settle_seconds + 1,
        H,
        (REASON_FAILED_BEFORE,),
        W * 0.5 ** ((600 + P.settle_seconds + 1) / HL),
    ),
    (
        "one half-life later the risk has halved",
        ONE_FAILURE,
        100.0 + HL,
        H,
        (REASON_FAILED_BEFORE,),
        W / 2,
    ),
    (
        "ten half-lives later almost forgotten",
        ONE_FAILURE,
        100.0 + 10 * HL,
        H,
        (REASON_FAILED_BEFORE,),
        W / 1024,
    ),
    (
        "flapping node (3 failures in 2 h) after settling: DEGRADED, failed repeatedly",
        FLAPPING,
        6300.0 + P.settle_seconds,
        D,
        (REASON_FLAPPING,),
        sum(W * 0.5 ** ((6300.0 + P.settle_seconds - t) / HL) for t in (100.0, 3000.0, 6000.0)),
    ),
]


@pytest.mark.parametrize(
    "desc,seq,at,state,reasons,risk", HISTORY_ROWS, ids=[r[0] for r in HISTORY_ROWS]
)
def test_history_adjusts_verdicts(desc, seq, at, state, reasons, risk) -> None:  # noqa: ANN001
    h = run(seq)
    current = seq[-1][1]
    v = adjust(current, h.of("n1"), at, P)
    assert v.state == state
    assert set(v.reasons) == set(reasons) | set(current.reasons)
    assert v.risk == pytest.approx(risk, abs=1e-5)


def test_flap_risk_decays_with_the_configured_half_life() -> None:
    for half_life in (600.0, 3600.0, 86_400.0):
        p = HealthParams(flap_half_life_seconds=half_life)
        node = run(ONE_FAILURE, p).of("n1")
        r0 = flap_risk(node, 100.0, p)
        assert r0 == pytest.approx(p.flap_weight)
        for k in (1, 2, 3):
            assert flap_risk(node, 100.0 + k * half_life, p) == pytest.approx(r0 / 2**k, rel=1e-4)


def test_flapping_node_stays_riskier_than_a_one_off_failure_and_decays_back() -> None:
    at = 6300.0 + P.settle_seconds
    once = adjust(OK, run(ONE_FAILURE).of("n1"), at, P)
    flappy = adjust(OK, run(FLAPPING).of("n1"), at, P)
    assert flappy.risk > once.risk and flappy.state == D
    much_later = adjust(OK, run(FLAPPING).of("n1"), at + 3 * HL, P)
    assert much_later.state == H and much_later.risk < P.flap_degraded_risk


def test_settle_time_is_configurable_and_restarts_on_every_recovery() -> None:
    p = HealthParams(settle_seconds=60.0)
    node = run(ONE_FAILURE, p).of("n1")
    assert adjust(OK, node, 750.0, p).state == D
    assert adjust(OK, node, 761.0, p).state == H
    again = run([*ONE_FAILURE, (2000.0, DOWN), (2100.0, OK)], p).of("n1")
    assert adjust(OK, again, 2150.0, p).state == D


def test_observe_is_idempotent_bounded_and_pure() -> None:
    h = run(ONE_FAILURE)
    assert observe(h, "n1", OK, 800.0) is h  # same state again: nothing changes
    p = HealthParams(history_max_events=4)
    many = run([(float(t), DOWN if t % 2 else OK) for t in range(40)], p)
    assert len(many.of("n1").events) == 4
    before = dict(h.nodes)
    observe(h, "n2", DOWN, 900.0)
    assert dict(h.nodes) == before
    assert forget_node(h, "n1").of("n1") == NodeHistory()
    assert forget_node(h, "zz") is h


def test_time_never_goes_back() -> None:
    h = run([(1000.0, OK), (2000.0, DOWN)])
    h = observe(h, "n1", OK, 1500.0)  # a late, out-of-order event
    assert [t for t, _ in h.of("n1").events] == [2000.0, 2000.0]


def test_history_disabled_returns_the_verdict() -> None:
    p = HealthParams(history=False)
    assert adjust(OK, run(FLAPPING, p).of("n1"), 6400.0, p) == OK


def test_xid_burst_across_observations() -> None:
    """No single snapshot shows three XIDs, but three arrive within the window."""
    h = HealthHistory()
    for i, t in enumerate((0.0, 600.0, 1200.0)):
        h = observe(h, "n1", OK, t, xids=[(t, f"dra/gpu-{i}/94/{t}")])
        v = adjust(OK, h.of("n1"), t, P)
    assert v.state == D and REASON_XID_BURST in v.reasons
    # The same signal seen again is not counted twice; old ones leave the window.
    h2 = observe(h, "n1", OK, 1300.0, xids=[(1200.0, "dra/gpu-2/94/1200.0")])
    assert len(h2.of("n1").xids) == 3
    later = observe(h, "n1", OK, 1200.0 + P.xid_window_seconds + 1)
    assert adjust(OK, later.of("n1"), 1200.0 + P.xid_window_seconds + 1, P).state == H


# ---- tracker + cache hook -----------------------------------------------------------------------


def test_cache_without_tracker_keeps_its_behaviour() -> None:
    sp = SchedParams()
    cache = ClusterCache.from_objects([dgx("a")], [], sp)
    cache.upsert_node(dgx("a", ready=False))
    cache.upsert_node(dgx("a"))
    assert cache.snapshot().node("a").health == OK


def test_cache_with_tracker_remembers_a_flapping_node() -> None:
    sp = SchedParams()
    cache, _, clock = tracked_cache([dgx("a"), dgx("b")], at=HEARTBEAT + 10, params=sp)
    for name in ("a", "b"):
        cache.upsert_node(dgx(name))
    for _ in range(3):  # a fails three times in quick succession
        clock.t += 60
        cache.upsert_node(dgx("a", ready=False))
        assert cache.snapshot().node("a").health.reasons[0] == REASON_NOT_READY
        clock.t += 60
        cache.upsert_node(dgx("a"))
    snap = cache.snapshot()
    a = snap.node("a").health
    assert a.state == D and REASON_SETTLING in a.reasons and REASON_FLAPPING in a.reasons
    assert snap.arrays.risk[snap.index["a"]] == pytest.approx(a.risk)
    req = PodRequest("ns/p", gpus=8)
    assert set(filter_nodes(snap, req, None, sp).feasible) == {"a", "b"}  # usable, not trusted
    scores = dict(score_nodes(snap, req, None, sp))
    assert scores["a"] < scores["b"]
    assert place_pod(snap, req, sp).assignments[0].node == "b"


def test_a_joining_node_is_not_a_failure_but_a_failure_after_it_joined_is() -> None:
    """A kubelet registers its node NotReady and reports Ready seconds later: that first
    Ready is not a recovery (no settle time, no failure memory). A node that has been
    usable and then fails is remembered."""
    cache, _, clock = tracked_cache([dgx("a")], at=HEARTBEAT + 10)
    cache.upsert_node(dgx("a"))
    for _ in range(2):  # registered, not ready yet: excluded, as any NotReady node
        clock.t += 5
        cache.upsert_node(dgx("new", ready=False))
        assert cache.snapshot().node("new").health.state == Health.UNHEALTHY
    clock.t += 5
    cache.upsert_node(dgx("new"))
    assert cache.snapshot().node("new").health == OK
    clock.t += 60
    cache.upsert_node(dgx("new", ready=False))  # now a failure
    clock.t += 60
    cache.upsert_node(dgx("new"))
    v = cache.snapshot().node("new").health
    assert v.state == D and REASON_SETTLING in v.reasons
    cache.delete_node("new")  # deleted and registered again: joining again
    clock.t += 60
    cache.upsert_node(dgx("new", ready=False))
    clock.t += 5
    cache.upsert_node(dgx("new"))
    assert cache.snapshot().node("new").health == OK


def test_a_relist_forgets_the_nodes_it_no_longer_lists() -> None:
    cache, tracker, clock = tracked_cache([dgx("a"), dgx("b")], at=HEARTBEAT + 10)
    for name in ("a", "b"):
        cache.upsert_node(dgx(name))
    clock.t += 60
    cache.upsert_node(dgx("b", ready=False))
    assert "b" in tracker.history.nodes
    cache.replace_all([dgx("a")], [])  # b was deleted while the watch was down
    assert "b" not in tracker.history.nodes
    cache.upsert_node(dgx("b", ready=False))  # registered again: joining, not failing
    clock.t += 5
    cache.upsert_node(dgx("b"))
    assert cache.snapshot().node("b").health == OK


def test_observe_joined_false_records_no_failure() -> None:
    bad = NodeHealth(Health.UNHEALTHY, (REASON_NOT_READY,), 1.0)
    h = observe(HealthHistory(), "n", bad, 100.0, joined=False)
    assert h.of("n").events == ()
    h = observe(HealthHistory(), "n", bad, 100.0)
    assert h.of("n").failing


def test_tracker_flags_a_stale_heartbeat_on_refresh() -> None:
    cache, tracker, clock = tracked_cache([dgx("a")])
    tracker.refresh(cache)
    assert cache.snapshot().node("a").health == OK
    clock.t = HEARTBEAT + 900  # no update from the kubelet for 15 minutes
    tracker.refresh(cache)
    v = cache.snapshot().node("a").health
    assert v.state == D and v.reasons == (REASON_HEARTBEAT_STALE,)


def test_tracker_counts_dra_xids_across_updates() -> None:
    p = HealthParams()
    tracker = HealthTracker(p, clock=Clock(HEARTBEAT + 30))
    node = make_node("a", 8, "h100", machine="DGX-H100")
    v = OK
    for i in range(3):
        devs = [
            device(i, taints=[taint("gpu.nvidia.com/xid", "None", "94", f"2026-11-29T19:5{i}:00Z")])
        ]
        v = tracker.adjust(node, OK, HEARTBEAT + 60 * (i + 1), devices=devs)
    assert v.state == D and REASON_XID_BURST in v.reasons
    assert tracker.adjust({"metadata": {}}, OK) == OK  # nameless objects pass through


def test_cache_counts_dra_xids_across_slice_updates() -> None:
    """Three non-fatal XID taints, each replacing the last on the node's ResourceSlice
    (the watch rebuilds the snapshot on every slice event): no single slice shows a burst,
    the node's history does, and the rebuild, a node update and a refresh all keep it."""
    sp = SchedParams()
    node = dgx("a")
    cache, _, clock = tracked_cache([node, dgx("b")], params=sp)
    for i in range(3):
        clock.t += 60
        xid = taint("gpu.nvidia.com/xid", "None", "94", f"2026-11-29T19:5{i}:00Z")
        slices = [resource_slice("a", [device(i, taints=[xid])])]
        cache.replace_all([node, dgx("b")], [], {"resourceslices": slices})
        got = cache.snapshot().node("a").health
        assert (REASON_XID_BURST in got.reasons) == (i == 2), (i, got)
    assert got.state == D
    assert cache.snapshot().node("b").health == OK
    clock.t += 30
    cache.upsert_node(dgx("a"))  # the kubelet's heartbeat: history applied again
    assert REASON_XID_BURST in cache.snapshot().node("a").health.reasons
    clock.t += 30
    cache.refresh_nodes()
    assert REASON_XID_BURST in cache.snapshot().node("a").health.reasons
    clock.t += sp.health.xid_window_seconds  # an hour later the burst is over
    cache.refresh_nodes()
    assert REASON_XID_BURST not in cache.snapshot().node("a").health.reasons


def test_cache_counts_the_xids_of_a_node_whose_gpus_are_its_slices() -> None:
    """On a DRA node that advertises no ``nvidia.com/gpu`` (the recorded nodes of a real
    v1.33 control plane: their GPUs are what their ResourceSlice describes) the tracker
    reads the device taints too: it is given the node's modeled GPU count, not the
    object's 0."""
    from tests.dra import recorded

    nodes = recorded.nodes()
    name = "gpu-node-0"
    assert node_gpus(next(n for n in nodes if meta(n)["name"] == name)) == (0, 0)
    cache, _, clock = tracked_cache(nodes)
    for i in range(3):
        clock.t += 60
        xid = taint("gpu.nvidia.com/xid", "None", "94", f"2026-11-29T19:5{i}:00Z")
        devs = [device(j, taints=[xid] if j == i else []) for j in range(8)]
        cache.replace_all(nodes, [], {"resourceslices": [resource_slice(name, devs)]})
        node = cache.snapshot().node(name)
        assert node.gpu_capacity == 8
        assert (REASON_XID_BURST in node.health.reasons) == (i == 2), (i, node.health)
    clock.t += 30
    cache.refresh_nodes()
    assert REASON_XID_BURST in cache.snapshot().node(name).health.reasons


def test_a_rebuild_keeps_a_flapping_verdict() -> None:
    """A relist (or any ResourceSlice event) rebuilds the snapshot from the objects; the
    verdicts it shows carry the health history, as a node update's do."""
    cache, _, clock = tracked_cache([dgx("a"), dgx("b")], at=HEARTBEAT + 10)
    for _ in range(3):
        clock.t += 60
        cache.upsert_node(dgx("a", ready=False))
        clock.t += 60
        cache.upsert_node(dgx("a"))
    flapping = cache.snapshot().node("a").health
    assert flapping.state == D and REASON_FLAPPING in flapping.reasons
    cache.replace_all([dgx("a"), dgx("b")], [])
    snap = cache.snapshot()
    assert snap.node("a").health == flapping
    assert snap.arrays.risk[snap.index["a"]] == pytest.approx(flapping.risk)
    assert REASON_FLAPPING not in snap.node("b").health.reasons


def test_refresh_is_one_transition_and_keeps_usage() -> None:
    """Refreshing many nodes copies the snapshot once (not once per node), keeps the GPUs
    pods hold, and leaves alone a node the watch updated while the refresh assessed."""
    nodes = [dgx(f"n{i}") for i in range(6)]
    pods = [make_pod("held", 4, node="n0", gpu_indices=[0, 1, 2, 3])]
    cache, tracker, clock = tracked_cache(nodes, pods)
    assert cache.refresh_nodes() == 0  # nothing aged yet
    before = cache.snapshot()
    clock.t = HEARTBEAT + 900
    assert cache.refresh_nodes() == 6
    after = cache.snapshot()
    assert after.generation == before.generation + 1
    assert all(n.health.reasons == (REASON_HEARTBEAT_STALE,) for n in after.nodes)
    assert after.node("n0").used_mask == 0b1111 and after.arrays.free[after.index["n0"]] == 4

    # The watch replaces n1's object while a refresh is assessing: the watch wins.
    clock.t = HEARTBEAT + 30
    real_adjust = tracker.adjust
    newer = dgx("n1", ready=False)

    def adjust_then_watch_event(obj, verdict, now=None, devices=(), gpu_capacity=None):
        out = real_adjust(obj, verdict, now, devices, gpu_capacity)
        if meta(obj)["name"] == "n5":  # the last node assessed
            cache.upsert_node(newer)
        return out

    tracker.adjust = adjust_then_watch_event  # type: ignore[method-assign]
    cache.refresh_nodes()
    snap = cache.snapshot()
    assert snap.node("n1").raw is newer and snap.node("n1").health.reasons[0] == REASON_NOT_READY
    assert snap.node("n2").health == OK  # heartbeat fresh again for the others


def test_refresh_parses_a_node_again_only_when_its_inputs_change(monkeypatch) -> None:
    """A refresh re-parses a Node object only when the object, the snapshot's health
    inputs (DRA slices, ``now``) or the parameters changed since the last one; otherwise it
    re-applies the health history at the new time to the node it parsed then. The result
    is what parsing every node again gives (here: the recorded nodes and ResourceSlices of
    a real v1.33 control plane)."""
    import scheduler.runtime.cache as cache_mod
    from scheduler.core.snapshot import health_inputs, node_from_update
    from tests.dra import recorded

    parsed: list[str] = []
    real = cache_mod.modeled_node

    def counting(obj, params, now, devices):  # type: ignore[no-untyped-def]
        parsed.append(meta(obj)["name"])
        return real(obj, params, now, devices)

    monkeypatch.setattr(cache_mod, "modeled_node", counting)
    sp = SchedParams()
    nodes = recorded.nodes() + [dgx(f"n{i}") for i in range(4)]
    names = sorted(meta(n)["name"] for n in nodes)
    cache, tracker, clock = tracked_cache(nodes, extra=recorded.extra(), params=sp)

    def parsed_by(refresh_at: float) -> list[str]:
        parsed.clear()
        clock.t = refresh_at
        cache.refresh_nodes()
        return sorted(parsed)

    def as_parsed_again() -> None:  # what the refresh without memory computed
        snap = cache.snapshot()
        _, devices = health_inputs(snap.extra, sp)
        kept = tracker.history
        # A probe over the same (immutable) history, so that checking records nothing.
        probe = HealthTracker(sp.health, clock=clock)
        probe._history = kept
        for n in snap.nodes:
            fresh = node_from_update(snap, n.raw, sp)
            verdict = probe.adjust(
                n.raw,
                fresh.health,
                devices=devices.get(n.name, ()),
                gpu_capacity=fresh.gpu_capacity,
            )
            assert replace(fresh, health=verdict) == n
        assert tracker.history is kept

    assert parsed_by(HEARTBEAT + 30) == names  # the first refresh parses every node
    assert parsed_by(HEARTBEAT + 60) == []  # nothing changed but the time
    as_parsed_again()
    stale = parsed_by(HEARTBEAT + 900)  # heartbeats aged: health re-applied, no parse
    assert stale == []
    assert cache.snapshot().node("n0").health.reasons == (REASON_HEARTBEAT_STALE,)
    as_parsed_again()

    cache.upsert_node(dgx("n1", ready=False))  # a new object for one node
    assert parsed_by(HEARTBEAT + 930) == ["n1"]
    assert cache.snapshot().node("n1").health.reasons[0] == REASON_NOT_READY
    as_parsed_again()

    # New ResourceSlices (the watch rebuilds extra with a new list): every node again.
    from scheduler.core import dra

    cache.set_extra(dra.SLICES_KEY, recorded.slices())
    assert parsed_by(HEARTBEAT + 960) == names
    assert parsed_by(HEARTBEAT + 990) == []
    as_parsed_again()

    # A rebuild from a fresh list (the watch's initial sync or a relist) has just parsed
    # every object: the next refresh parses none, except a node whose name several
    # objects share (made unmodeled by the rebuild, modeled from its object alone).
    twin = dgx("n2")
    cache.replace_all([*nodes, twin], [], recorded.extra())
    assert cache.snapshot().node("n2").unmodeled
    assert parsed_by(HEARTBEAT + 1020) == ["n2"]
    as_parsed_again()
    cache.replace_all(nodes, [], recorded.extra())
    assert parsed_by(HEARTBEAT + 1050) == []
    as_parsed_again()


def test_health_inputs_index_the_slices_once_per_list() -> None:
    """The DRA devices by node are indexed once per list of slices (not once per node
    update or refreshed node): the same list gives the same read-only index, equal to
    ``devices_by_node``; a new list (even equal) is indexed anew."""
    from scheduler.core.health import RESOURCESLICES_KEY, devices_by_node
    from scheduler.core.snapshot import health_inputs
    from tests.dra import recorded

    sp = SchedParams()
    slices = recorded.slices()
    extra = {RESOURCESLICES_KEY: slices}
    now, devices = health_inputs(extra, sp)
    assert now is None and dict(devices) == devices_by_node(slices, sp.health) and devices
    assert health_inputs(extra, sp)[1] is devices
    with pytest.raises(TypeError):
        devices["x"] = ()  # type: ignore[index]
    again = health_inputs({RESOURCESLICES_KEY: recorded.slices()}, sp)[1]
    assert again is not devices and again == devices
    assert health_inputs({}, sp)[1] == {}
