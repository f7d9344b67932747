"""Issue 12, finding 9: HA. A replica follows its kube-scheduler's Lease, stands by with a
warm cache while another holds it, and on takeover replays the gang plans before acting.

The Lease objects are real ones recorded from kube-scheduler v1.33.0 leader election
(``tests/fixtures/leases/``); the API is the recorded fake of the kube adapter tests. On
today's main nothing follows a Lease: every replica acts and a standby never replays plans.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.model import PodInfo
from scheduler.core.params import SchedParams
from scheduler.kube.client import PODS, ApiUnavailable
from scheduler.kube.leader import LeaseFollower, holds, lease_record, parse_lease_ref
from scheduler.kube.runner import (
    ERR_NOT_LEADER,
    KubeOptions,
    build_kube_runtime,
    options_from_env,
)
from scheduler.kube.watcher import WatchOptions
from tests.test_kube_adapter import Clock, gang_member_with_plan_api, pending_train_a

LEASES = Path(__file__).resolve().parents[1] / "fixtures" / "leases"


def lease(name: str) -> dict[str, Any]:
    return json.loads((LEASES / f"{name}.json").read_text())


class Script:
    """A ``get_lease`` mock: returns (or raises) what the test set last."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __call__(self) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return copy.deepcopy(self.value)


def follower(identity: str, script: Script, clock: Clock) -> tuple[LeaseFollower, list[str]]:
    calls: list[str] = []
    f = LeaseFollower(
        script,
        identity,
        "topoplace-system/topoplace-scheduler",
        on_started=lambda: calls.append("started"),
        on_stopped=lambda: calls.append("stopped"),
        clock=clock,
    )
    return f, calls


# ---- the Lease as kube-scheduler writes it --------------------------------------------------


def test_recorded_leases_read_as_kube_scheduler_wrote_them() -> None:
    a = lease_record(lease("held-by-a"))
    assert a is not None and a.holder.startswith("replica-a_") and a.duration_s == 6.0
    assert a.transitions == 0
    b = lease_record(lease("taken-over-by-b"))
    assert b is not None and b.holder.startswith("replica-b_") and b.transitions == 1
    released = lease_record(lease("released-by-b"))
    assert released is not None and released.holder == "" and released.duration_s == 1.0
    assert lease_record(None) is None
    assert lease_record({"kind": "ConfigMap"}) is None
    odd = lease_record({"kind": "Lease", "spec": {"holderIdentity": 7, "leaseDurationSeconds": -3}})
    assert odd is not None and odd.holder == "" and odd.duration_s == 15.0


def test_holder_matches_the_pods_hostname_only() -> None:
    holder = lease_record(lease("held-by-a")).holder  # type: ignore[union-attr]
    assert holds(holder, "replica-a")
    assert not holds(holder, "replica")  # a prefix of the hostname is not the hostname
    assert not holds(holder, "replica-b")
    assert not holds("", "replica-a") and not holds(holder, "")


def test_failover_between_two_replicas_on_the_recorded_leases() -> None:
    clock = Clock()
    script = Script(lease("held-by-a"))
    a, a_calls = follower("replica-a", script, clock)
    b, b_calls = follower("replica-b", script, clock)
    assert a.observe() and not b.observe()
    clock.t += 3
    script.value = lease("held-by-a-renewed")
    assert a.observe() and not b.observe()
    # replica-a dies: its Lease is not renewed. Both stop trusting it after the duration.
    clock.t += 6.5
    assert not a.observe()
    assert a_calls == ["started", "stopped"]
    script.value = lease("taken-over-by-b")
    clock.t += 0.5
    assert b.observe() and not a.observe()
    assert b_calls == ["started"]
    # replica-b shuts down and releases the Lease (empty holder).
    script.value = lease("released-by-b")
    assert not b.observe()
    assert b_calls == ["started", "stopped"]


def test_an_unreadable_lease_keeps_the_last_answer_for_one_duration() -> None:
    clock = Clock()
    script = Script(lease("taken-over-by-b"))
    b, calls = follower("replica-b", script, clock)
    assert b.observe()
    script.value = ApiUnavailable("connection refused")
    clock.t += 5
    assert b.observe()
    clock.t += 1.5
    assert not b.observe() and calls == ["started", "stopped"]
    script.value = None  # deleted
    assert not b.observe()


def test_lease_reference_and_environment() -> None:
    assert parse_lease_ref("topoplace-system/topoplace-scheduler") == (
        "topoplace-system",
        "topoplace-scheduler",
    )
    for bad in ("", "x", "/x", "x/", "a/b/c"):
        with pytest.raises(ValueError):
            parse_lease_ref(bad)
    opts = options_from_env(
        {"TOPOPLACE_LEADER_LEASE": "ns/l", "TOPOPLACE_LEADER_IDENTITY": "pod-1"}
    )
    assert opts.leader_lease == ("ns", "l") and opts.leader_identity == "pod-1"
    assert options_from_env({}).leader_lease is None


# ---- the runner: stand by, take over, step down ------------------------------------------------


def _gang_api() -> Any:
    """The recorded cluster with rec/train-a bound as member 1 of gang rec/llm (size 2),
    its placement record carrying the whole plan: the other slot is rec-node-1 GPUs 4-7.
    (The recorded pending pod gang-w-0 of another role is left out: it would make the gang
    be planned again, which recovery tests cover elsewhere.)"""
    api = gang_member_with_plan_api(("rec-node-1", [4, 5, 6, 7]))
    items = api.lists[PODS.name]["items"]
    items[:] = [p for p in items if p["metadata"]["name"] != "gang-w-0"]
    return api


def _gang_runtime(identity: str, clock: Clock) -> Any:
    """The runtime of replica ``identity`` over :func:`_gang_api`, electing on the Lease
    topoplace-system/topoplace-scheduler, no expiry sweep."""
    opts = KubeOptions(
        watch=WatchOptions(podgroups=False),
        expire_interval_s=0,
        leader_lease=("topoplace-system", "topoplace-scheduler"),
        leader_identity=identity,
    )
    return build_kube_runtime(_gang_api(), SchedParams(), options=opts, clock=clock)


def _reservations(rt: Any) -> list[tuple[str, tuple[int, ...]]]:
    return sorted(
        (p.node, p.gpus)
        for k, p in rt.cache.snapshot().pods.items()
        if k.startswith("gang-reservation:")
    )


def test_standby_acts_only_after_takeover_and_replays_the_plan_first() -> None:
    pytest.importorskip("scheduler.runtime.gangs")
    clock = Clock()
    rt = _gang_runtime("replica-b", clock)
    script = Script(lease("held-by-a"))
    rt.follower.get_lease = script
    rt.follower.clock = clock
    rt.follower.observe()
    rt.watcher.sync()
    rt.watcher.on_synced()
    ext = rt.extender
    # Standby: ready (warm cache), holds nothing, refuses filter and bind.
    assert rt.readiness() and not ext.leadership.active
    assert _reservations(rt) == [] and rt.cache.plans == {}
    args = {"Pod": pending_train_a(), "NodeNames": ["rec-node-0", "rec-node-1"]}
    assert ext.filter(args)["Error"] == ERR_NOT_LEADER
    assert json.loads(ext.filter_json(args))["Error"] == ERR_NOT_LEADER
    bind = {"PodName": "train-a", "PodNamespace": "rec", "PodUID": "", "Node": "rec-node-0"}
    assert ext.bind(bind) == {"Error": ERR_NOT_LEADER}
    # Held in an earlier term and stale, on GPUs the recorded plan promised the gang.
    rt.cache.assume(
        PodInfo(key="rec/stale", uid="", node="rec-node-1", gpus=(4, 5), assumed=True), 30
    )
    # replica-a's kube-scheduler dies; replica-b's takes the Lease: replay, then act.
    clock.t += 7
    rt.follower.observe()
    script.value = lease("taken-over-by-b")
    clock.t += 1
    assert rt.follower.observe()
    assert ext.leadership.active and ext.leadership.takeovers == 1
    assert "rec/stale" not in rt.cache.snapshot().pods
    assert rt.cache.plans["rec/llm"].plan_id == "p-2"
    assert _reservations(rt) == [("rec-node-1", (4, 5, 6, 7))]
    assert rt.readiness.report is not None and rt.readiness.report.gangs == 1
    assert ext.filter(args)["Error"] != ERR_NOT_LEADER
    # Step down: refuse at once, hold nothing.
    script.value = lease("released-by-b")
    assert not rt.follower.observe()
    assert not ext.leadership.active
    assert _reservations(rt) == [] and rt.cache.plans == {}
    assert ext.filter(args)["Error"] == ERR_NOT_LEADER
    assert rt.kube_metrics.leader._value.get() == 0


def test_a_replica_leading_at_start_up_recovers_once_synced() -> None:
    pytest.importorskip("scheduler.runtime.gangs")
    clock = Clock()
    rt = _gang_runtime("replica-a", clock)
    rt.follower.get_lease = Script(lease("held-by-a"))
    rt.follower.clock = clock
    assert rt.follower.observe()  # leads before the cache is synced: nothing yet
    assert not rt.extender.leadership.active and not rt.readiness()
    rt.watcher.sync()
    rt.watcher.on_synced()
    assert rt.readiness() and rt.extender.leadership.active
    assert _reservations(rt) == [("rec-node-1", (4, 5, 6, 7))]
