"""A refused gang member that kube-scheduler parked comes back: when another member's filter
plans the gang, and when the cluster frees room for a gang every member of which was
refused. The waker is the pod patcher of kube mode (scheduler/kube/waker.py); here the gang
runtime is driven through the extender and the waker records what it was asked to wake."""

from __future__ import annotations

import datetime
from typing import Any

from scheduler.kube.client import ApiError
from scheduler.kube.metrics import KubeMetrics
from scheduler.kube.waker import WAKE_ANNOTATION, PodWaker
from scheduler.runtime.gangs import REASON_GANG_UNPLACEABLE, WAKE_BACKOFF_SECONDS
from tests.builders import dgx_su, gang_pod, make_pod
from tests.gang.test_extender_gangs import Clock, bind, filt, make_ext


class RecordingWaker:
    """Stands in for kube mode's PodWaker (which patches pods through the API)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str]] = []

    def __call__(self, keys: list[str], why: str) -> None:
        self.calls.append((list(keys), why))

    @property
    def woken(self) -> list[str]:
        return [k for keys, _ in self.calls for k in keys]


def _blocked_cluster(clock: Clock) -> tuple[Any, list[str], RecordingWaker]:
    """Two 8-GPU nodes, one GPU of the second held by a blocker: a 2 x 8 gang cannot fit."""
    ext, names = make_ext(dgx_su("su", nodes=2), clock=clock)
    blocker = make_pod("blocker", 1)
    (node,) = filt(ext, blocker, [names[1]])["NodeNames"]
    assert bind(ext, blocker, node) == ""
    waker = RecordingWaker()
    ext.gangs.waker = waker
    return ext, names, waker


def test_plan_made_by_a_later_member_wakes_the_refused_one() -> None:
    clock = Clock()
    ext, names, waker = _blocked_cluster(clock)
    a, b = (gang_pod(f"m-{i}", 8, "race", 2) for i in range(2))
    refused = filt(ext, a, names)
    assert refused["NodeNames"] == [] and set(refused["FailedNodes"].values()) == {
        REASON_GANG_UNPLACEABLE
    }
    # The deletion topoplace had not seen when a was tried: room for the whole gang now.
    ext.cache.delete_pod("default/blocker")
    # Within the refusal hold, but GPUs were freed since: b's filter solves again and plans.
    (nb,) = filt(ext, b, names)["NodeNames"]
    assert waker.woken == ["default/m-0"] and waker.calls[0][1].startswith("planned ")
    assert bind(ext, b, nb) == ""
    # The woken member finds its slot waiting and binds: the gang is whole.
    (na,) = filt(ext, a, names)["NodeNames"]
    assert na != nb and bind(ext, a, na) == ""
    assert {ext.cache.snapshot().pods[f"default/m-{i}"].node for i in range(2)} == set(names)


def test_poll_wakes_a_fully_parked_gang_once_room_frees_with_backoff() -> None:
    clock = Clock()
    ext, names, waker = _blocked_cluster(clock)
    a, b = (gang_pod(f"p-{i}", 8, "parked", 2) for i in range(2))
    assert filt(ext, a, names)["NodeNames"] == []
    clock.t += 3  # past the refusal hold: b's filter solves again and is refused again
    assert filt(ext, b, names)["NodeNames"] == []
    assert ext.gangs.poll(ext) == []  # nothing changed since the refusal: no wake
    ext.cache.delete_pod("default/blocker")
    assert ext.gangs.poll(ext) == ["default/p-0", "default/p-1"]
    woken_at = clock.t
    assert ext.gangs.poll(ext) == []  # woken pods are no longer parked
    # Woken, refused again (another pod took the room first): backed off before the next wake.
    rival = make_pod("rival", 1)
    (rn,) = filt(ext, rival, names)["NodeNames"]
    assert bind(ext, rival, rn) == ""
    clock.t = woken_at + 3
    assert filt(ext, a, names)["NodeNames"] == []
    ext.cache.delete_pod("default/rival")
    clock.t = woken_at + WAKE_BACKOFF_SECONDS[1] - 0.5
    assert ext.gangs.poll(ext) == []
    clock.t = woken_at + WAKE_BACKOFF_SECONDS[1]
    assert ext.gangs.poll(ext) == ["default/p-0"]


def test_poll_does_not_wake_when_the_cluster_lacks_the_gpus() -> None:
    clock = Clock()
    ext, names, waker = _blocked_cluster(clock)
    big = [gang_pod(f"b-{i}", 8, "big", 3) for i in range(3)]
    assert filt(ext, big[0], names)["NodeNames"] == []
    clock.t += 3
    assert filt(ext, big[1], names)["NodeNames"] == []
    clock.t += 3
    assert filt(ext, big[2], names)["NodeNames"] == []
    ext.cache.delete_pod("default/blocker")  # 16 GPUs free, 24 needed
    assert ext.gangs.poll(ext) == [] and waker.calls == []


class FakeApiRecordingPatches:
    """Stands in for KubeApi (no API server in CI): records annotation patches."""

    def __init__(self, missing: set[str] = frozenset()) -> None:
        self.patches: list[tuple[str, str, dict]] = []
        self.missing = missing

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict) -> dict:
        if name in self.missing:
            raise ApiError(404, "NotFound", 'pods "gone" not found')
        self.patches.append((namespace, name, dict(annotations)))
        return {}


def test_pod_waker_patches_the_requeue_annotation_and_counts_outcomes() -> None:
    api = FakeApiRecordingPatches(missing={"gone"})
    km = KubeMetrics()
    fixed = datetime.datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    w = PodWaker(api, km, now=lambda: fixed)  # type: ignore[arg-type]
    w.wake(["ml/w-1", "ml/gone"], "planned abc123")
    w.close()
    assert api.patches == [
        ("ml", "w-1", {WAKE_ANNOTATION: "2026-11-30T12:00:00.123456Z planned abc123"})
    ]
    samples = {
        s.labels["outcome"]: s.value
        for m in km.wakes.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert samples == {"ok": 1.0, "gone": 1.0}
