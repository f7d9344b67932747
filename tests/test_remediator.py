"""The remediator's evictions over real HTTP, answered with bodies recorded from a real
kube-apiserver v1.33.0 (tests/fixtures/kube/manifest.json: ``eviction_*``).

The cache holds real-shaped DGX H100 nodes (one with NVSentinel's fatal XID condition) and
pods with topoplace's placement record; the health tracker runs on a settable clock, the
rate limit on a second one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.clusters import make_pod
from scheduler.core.params import SchedParams
from scheduler.kube.metrics import KubeMetrics
from scheduler.kube.remediator import RETRY_BLOCKED_S, Remediator
from scheduler.server.metrics import Metrics
from tests.health.builders import condition, dgx, tracked_cache
from tests.kube.recorded import RecordedApiServer, recorded

NS = "rec"
AFTER = 60.0


def _path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}/eviction"


class Wall:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


def _setup(
    mode: str = "evict", pods: list[dict] | None = None, **remediation: Any
) -> tuple[Any, Any, Any, Metrics, Wall]:
    params = SchedParams.from_config(
        {
            "remediation": {
                "mode": mode,
                "after_seconds": AFTER,
                "grace_period_seconds": 0,
                **remediation,
            }
        }
    )
    nodes = [dgx("a", conditions=[condition("GpuXidError")]), dgx("b"), dgx("c")]
    if pods is None:
        pods = [
            make_pod(
                f"w{i}", 8, namespace=NS, node=n, gpu_indices=range(8), gang="train", gang_size=2
            )
            for i, n in enumerate("ab")
        ] + [make_pod("solo", 8, namespace=NS, node="c", gpu_indices=range(8))]
    cache, tracker, clock = tracked_cache(nodes, pods, params=params)
    cache.replace_all(nodes, pods)  # the tracker grades the nodes as a watch would
    metrics = Metrics()
    return cache, clock, params, metrics, Wall()


def _remediator(
    srv: RecordedApiServer, cache: Any, params: Any, metrics: Metrics, wall: Wall, **kw: Any
) -> Remediator:
    return Remediator(
        srv.api(),
        cache,
        params,
        ("topoplace",),
        KubeMetrics(metrics.registry),
        metrics.replacements,
        wall=wall,
        **kw,
    )


def _evictions_answered(srv: RecordedApiServer, *names: str) -> None:
    """The recorded 201 for the eviction of each of ``names``."""
    for name in names:
        srv.add("POST", _path(name), 201, "eviction_201_created.json")


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


EVENTS = f"/apis/events.k8s.io/v1/namespaces/{NS}/events"


def test_a_failed_member_and_its_gang_are_evicted_once_with_the_recorded_request() -> None:
    cache, clock, params, metrics, wall = _setup()
    uids = {p.key: p.uid for p in cache.snapshot().pods.values()}
    with RecordedApiServer() as srv:
        _evictions_answered(srv, "w0", "w1")
        srv.add("POST", EVENTS, 201, "event_201_created.json")
        rem = _remediator(srv, cache, params, metrics, wall)
        assert rem.tick() == []  # seen on failed hardware now: not due
        clock.t += AFTER - 1
        assert rem.tick() == [] and srv.requests == []
        clock.t += 1
        done = rem.tick()
        assert [(f.pod, f.kind, o) for f, o in done] == [
            ("rec/w0", "node", "evicted"),
            ("rec/w1", "gang", "evicted"),
        ]
        # The pods are still in the cache until the watch sees them go: not evicted twice.
        wall.t += 5
        assert rem.tick() == []
        sent = [(r["path"], json.loads(r["body"])) for r in srv.requests]
    # each eviction, then the Event that says why
    assert [p for p, _ in sent] == [_path("w0"), EVENTS, _path("w1"), EVENTS]
    want = recorded("eviction_request_sent.json")
    for (_, body), key in zip(sent[0::2], ("rec/w0", "rec/w1"), strict=True):
        want["metadata"]["name"] = key.split("/")[1]
        want["deleteOptions"]["preconditions"]["uid"] = uids[key]
        assert body == want
    events = [body for _, body in sent[1::2]]
    assert [e["regarding"]["uid"] for e in events] == [uids["rec/w0"], uids["rec/w1"]]
    assert {(e["reason"], e["action"], e["type"]) for e in events} == {
        ("HardwareFailure", "Evict", "Warning")
    }
    assert "its node: GPU fault condition" in events[0]["note"]
    assert "gang member rec/w0: GPU fault condition" in events[1]["note"]
    # named as client-go names events: <pod>.<hex nanoseconds>
    assert events[0]["metadata"]["name"].startswith("w0.")
    assert (
        _sample(metrics, "topoplace_remediation_evictions_total", kind="node", outcome="evicted")
        == 1
    )
    assert (
        _sample(metrics, "topoplace_remediation_evictions_total", kind="gang", outcome="evicted")
        == 1
    )
    assert _sample(metrics, "topoplace_pods_on_failed_hardware") == 1


def test_a_refused_event_loses_nothing() -> None:
    cache, clock, params, metrics, wall = _setup()
    with RecordedApiServer() as srv:
        _evictions_answered(srv, "w0", "w1")
        srv.add("POST", EVENTS, 403, "eviction_403_forbidden.json")
        rem = _remediator(srv, cache, params, metrics, wall)
        rem.tick()
        clock.t += AFTER
        assert [o for _, o in rem.tick()] == ["evicted", "evicted"]


@pytest.mark.parametrize(
    "status,fixture,outcome,retried",
    [
        (404, "eviction_404_pod_missing.json", "gone", False),
        (409, "eviction_409_uid_precondition.json", "gone", False),
        (429, "eviction_429_disruption_budget.json", "blocked", True),
        (403, "eviction_403_forbidden.json", "error", True),
    ],
    ids=["pod gone", "a namesake (UID precondition)", "disruption budget", "no RBAC"],
)
def test_eviction_answers_map_to_outcomes(
    status: int, fixture: str, outcome: str, retried: bool
) -> None:
    pods = [make_pod("p", 8, namespace=NS, node="a", gpu_indices=range(8))]
    cache, clock, params, metrics, wall = _setup(pods=pods)
    with RecordedApiServer() as srv:
        srv.add("POST", _path("p"), status, fixture)
        rem = _remediator(srv, cache, params, metrics, wall)
        rem.tick()
        clock.t += AFTER
        assert [o for _, o in rem.tick()] == [outcome]
        wall.t += RETRY_BLOCKED_S - 1
        assert rem.tick() == []  # not hammered
        wall.t += 1
        assert [o for _, o in rem.tick()] == ([outcome] if retried else [])
    assert _sample(
        metrics, "topoplace_remediation_evictions_total", kind="node", outcome=outcome
    ) == (2 if retried else 1)


def test_dry_run_reports_each_pod_once_and_writes_nothing() -> None:
    cache, clock, params, metrics, wall = _setup(mode="dry-run")
    with RecordedApiServer() as srv:
        rem = _remediator(srv, cache, params, metrics, wall)
        rem.tick()
        clock.t += AFTER
        assert [(f.pod, o) for f, o in rem.tick()] == [("rec/w0", "dry_run"), ("rec/w1", "dry_run")]
        assert rem.tick() == []
        assert srv.requests == []
    assert (
        _sample(metrics, "topoplace_remediation_evictions_total", kind="gang", outcome="dry_run")
        == 1
    )


def test_nothing_while_the_replica_may_not_act_or_mode_is_off() -> None:
    cache, clock, params, metrics, wall = _setup()
    with RecordedApiServer() as srv:
        rem = _remediator(srv, cache, params, metrics, wall, may_act=lambda: False)
        rem.tick()
        clock.t += AFTER * 2
        assert rem.tick() == []
        off = SchedParams.from_config({"remediation": {"mode": "off"}})
        rem = _remediator(srv, cache, off, Metrics(), wall)
        rem.start()
        assert not rem._loop.running and rem.tick() == []
        assert srv.requests == []


def test_the_rate_bound_holds_a_gang_until_the_window_is_empty_then_it_goes_whole() -> None:
    pods = [
        make_pod(f"w{i}", 2, namespace=NS, node=n, gpu_indices=[0, 1], gang="train", gang_size=2)
        for i, n in enumerate("ab")
    ] + [make_pod("solo", 2, namespace=NS, node="a", gpu_indices=[6, 7])]
    cache, clock, params, metrics, wall = _setup(pods=pods, max_evictions_per_minute=1)
    with RecordedApiServer() as srv:
        _evictions_answered(srv, "w0", "w1", "solo")
        rem = _remediator(srv, cache, params, metrics, wall)
        rem.tick()
        clock.t += AFTER
        # Both faults are seen at once; by key, the pod alone goes first. The gang, two
        # pods over a bound of one, waits for an empty window, then goes whole.
        assert [f.pod for f, _ in rem.tick()] == ["rec/solo"]
        wall.t += 59
        assert rem.tick() == []
        wall.t += 1
        assert [f.pod for f, _ in rem.tick()] == ["rec/w0", "rec/w1"]
        wall.t += 60
        assert rem.tick() == []


def test_successors_bound_after_the_eviction_count_as_re_placements() -> None:
    cache, clock, params, metrics, wall = _setup()
    with RecordedApiServer() as srv:
        _evictions_answered(srv, "w0", "w1")
        rem = _remediator(srv, cache, params, metrics, wall)
        rem.tick()
        clock.t += AFTER
        assert len(rem.tick()) == 2
        # The evicted pods go; the job controller recreates them (new UIDs); topoplace
        # binds them on healthy nodes 42 s after the eviction.
        cache.delete_pod("rec/w0")
        cache.delete_pod("rec/w1")
        wall.t += 42
        rem.tick()
        assert _sample(metrics, "topoplace_replacements_total", kind="node") == 0
        for i, n in enumerate("bc"):
            new = make_pod(
                f"w{i}-r1", 8, namespace=NS, node=n, gpu_indices=range(8), gang="train", gang_size=2
            )
            cache.upsert_pod(new)
        rem.tick()
        rem.tick()  # counted once
    assert _sample(metrics, "topoplace_replacements_total", kind="node") == 1
    assert _sample(metrics, "topoplace_replacements_total", kind="gang") == 1
    assert _sample(metrics, "topoplace_replacement_seconds_count", kind="gang") == 1
    assert _sample(metrics, "topoplace_replacement_seconds_sum", kind="node") == 42


def test_the_view_tells_what_is_due_when_and_what_was_done() -> None:
    cache, clock, params, metrics, wall = _setup()
    with RecordedApiServer() as srv:
        _evictions_answered(srv, "w0", "w1")
        srv.add("POST", EVENTS, 201, "event_201_created.json")
        rem = _remediator(srv, cache, params, metrics, wall)
        rem.tick()
        clock.t += 15
        v = rem.view()
        assert (v["mode"], v["acting"], v["failed_gpu_nodes"], v["gpu_nodes"]) == (
            "evict",
            True,
            1,
            3,
        )
        (w0,) = v["on_failed_hardware"]
        assert (w0["pod"], w0["kind"], w0["seen_for_seconds"], w0["due_in_seconds"]) == (
            "rec/w0",
            "node",
            15.0,
            AFTER - 15,
        )
        assert v["recent"] == []
        clock.t += AFTER
        rem.tick()
        recent = rem.view()["recent"]
    assert [(r["pod"], r["kind"], r["cause"], r["outcome"]) for r in recent] == [
        ("rec/w0", "node", "rec/w0", "evicted"),
        ("rec/w1", "gang", "rec/w0", "evicted"),
    ]


def test_without_an_api_server_the_view_shows_the_pods_and_evicts_nothing() -> None:
    from scheduler.runtime.cache import ClusterCache
    from scheduler.server.extender import Extender
    from tests.helpers import asgi_client

    params = SchedParams.from_config({"remediation": {"mode": "evict"}})
    nodes = [dgx("a", conditions=[condition("GpuXidError")]), dgx("b")]
    pods = [make_pod("p", 8, namespace=NS, node="a", gpu_indices=range(8))]
    ext = Extender(ClusterCache.from_objects(nodes, pods, params))
    r = asgi_client(ext).get("/v1/inspect/remediation")
    assert r.status_code == 200
    body = r.json()
    assert (body["mode"], body["acting"]) == ("evict", False)
    assert "no Kubernetes API" in body["why_not"]
    assert body["on_failed_hardware"] == [
        {"pod": "rec/p", "node": "a", "kind": "node", "reason": "GPU fault condition", "gang": ""}
    ]


def test_a_gang_that_lost_a_member_to_preemption_goes_whole_once_the_victim_goes() -> None:
    from scheduler.core.remediation import Broken
    from scheduler.runtime.preempted import PreemptionLedger

    pods = [
        make_pod(f"w{i}", 8, namespace=NS, node=n, gpu_indices=range(8), gang="train", gang_size=3)
        for i, n in enumerate("abc")
    ]
    # (node a also has an XID fault, not due for 60 s: only the teardown acts here)
    cache, clock, params, metrics, wall = _setup(pods=pods)
    ledger = PreemptionLedger(lambda: wall.t)
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    ledger.record({}, [Broken("rec/train", "rec/w0", uid["w0"], frozenset({uid["w1"], uid["w2"]}))])
    with RecordedApiServer() as srv:
        _evictions_answered(srv, "w1", "w2")
        srv.add("POST", EVENTS, 201, "event_201_created.json")
        rem = _remediator(srv, cache, params, metrics, wall, preemptions=ledger)
        assert rem.tick() == []  # w0 not preempted yet (kube-scheduler may not have)
        pods[0]["metadata"]["deletionTimestamp"] = "2026-12-02T22:00:00Z"
        cache.replace_all(
            [dgx("a", conditions=[condition("GpuXidError")]), dgx("b"), dgx("c")], pods
        )
        done = rem.tick()
        assert [(f.pod, f.kind, o) for f, o in done] == [
            ("rec/w1", "preempted", "evicted"),
            ("rec/w2", "preempted", "evicted"),
        ]
        assert rem.tick() == []  # evicted once
        events = [json.loads(r["body"]) for r in srv.requests if r["path"] == EVENTS]
    assert {e["reason"] for e in events} == {"GangMemberPreempted"}
    assert "gang member rec/w0 was preempted" in events[0]["note"]
    # once the members are going, nothing is left: the record is done
    for p in pods[1:]:
        p["metadata"]["deletionTimestamp"] = "2026-12-02T22:00:01Z"
    cache.replace_all([dgx("a"), dgx("b"), dgx("c")], pods)
    rem.tick()
    assert ledger.broken() == []
