"""HAMi's node lock around a HAMi hand-off (scheduler/kube/handoff.py), against an
in-memory API that behaves like the API server for the calls used (conditional patch ->
409 on a stale resourceVersion, 404 for a missing pod)."""

from __future__ import annotations

from typing import Any

from scheduler.core.fractional import HAMI_LOCK
from scheduler.kube.client import ApiError
from scheduler.kube.handoff import (
    ERR_NODE_LOCKED,
    HamiNodeLock,
    HandoffBinder,
    lock_value,
    parse_lock,
)

NOW = 1_764_450_000.0


class InMemoryApiMock:
    def __init__(self, pods: set[tuple[str, str]] = frozenset()) -> None:  # type: ignore[assignment]
        self.node = {"metadata": {"name": "infer-a", "resourceVersion": "1", "annotations": {}}}
        self.pods = set(pods)
        self.patches: list[dict[str, Any]] = []
        self.conflict_once = False

    def get_node(self, name: str) -> dict[str, Any]:
        return {
            "metadata": dict(
                self.node["metadata"], annotations=dict(self.node["metadata"]["annotations"])
            )
        }

    def patch_node_annotations(self, name: str, ann: dict, rv: str = "") -> dict[str, Any]:
        md = self.node["metadata"]
        if self.conflict_once or (rv and rv != md["resourceVersion"]):
            self.conflict_once = False
            md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)
            raise ApiError(409, "Conflict", "the object has been modified")
        self.patches.append(dict(ann))
        for k, v in ann.items():
            if v is None:
                md["annotations"].pop(k, None)
            else:
                md["annotations"][k] = v
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)
        return self.node

    def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        if (ns, name) not in self.pods:
            raise ApiError(404, "NotFound", "not found")
        return {"metadata": {"namespace": ns, "name": name}}


class RecordingBinder:
    def __init__(self, err: str = "") -> None:
        self.err = err
        self.calls: list[str] = []

    def bind(self, pod: Any, node: str, ann: Any) -> str:
        self.calls.append(node)
        return self.err

    def fetch_pod(self, ns: str, name: str) -> None:
        return None


POD = {"metadata": {"namespace": "infer", "name": "p0"}}


def plant(api: InMemoryApiMock, value: str | None) -> None:
    """Another writer sets (or clears) the node's lock: a new resourceVersion, as any
    write to an object on the API server gives it."""
    md = api.node["metadata"]
    if value is None:
        md["annotations"].pop(HAMI_LOCK, None)
    else:
        md["annotations"][HAMI_LOCK] = value
    md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)


HAMI = {"hami.io/vgpu-node": "infer-a"}


def test_lock_format_is_hamis() -> None:
    v = lock_value("infer", "p0", NOW)
    assert v == "2025-11-29T21:00:00Z,infer,p0"
    assert parse_lock(v) == (NOW, "infer", "p0")
    assert parse_lock("garbage,,") is None


def test_hold_mode_keeps_the_lock_and_blocks_a_second_pod() -> None:
    api = InMemoryApiMock({("infer", "p0")})
    b = HandoffBinder(RecordingBinder(), HamiNodeLock(api, 300, lambda: NOW), "hold")
    assert b.bind(POD, "infer-a", HAMI) == ""
    assert api.node["metadata"]["annotations"][HAMI_LOCK] == "2025-11-29T21:00:00Z,infer,p0"
    other = {"metadata": {"namespace": "infer", "name": "p1"}}
    assert b.bind(other, "infer-a", HAMI).startswith(ERR_NODE_LOCKED)


def test_release_mode_expiry_dangling_and_failure() -> None:
    api = InMemoryApiMock({("infer", "p0")})
    b = HandoffBinder(RecordingBinder(), HamiNodeLock(api, 300, lambda: NOW), "release")
    api.conflict_once = True  # a concurrent node update: read again, retry
    assert b.bind(POD, "infer-a", HAMI) == ""
    assert HAMI_LOCK not in api.node["metadata"]["annotations"]
    assert api.patches[-1] == {HAMI_LOCK: None}
    # a lock of a pod that no longer exists is taken over
    plant(api, lock_value("infer", "gone", NOW))
    assert b.bind(POD, "infer-a", HAMI) == ""
    # an expired lock of a live pod is taken over; a fresh one is not
    api.pods.add(("infer", "live"))
    plant(api, lock_value("infer", "live", NOW - 301))
    assert b.bind(POD, "infer-a", HAMI) == ""
    plant(api, lock_value("infer", "live", NOW - 10))
    assert b.bind(POD, "infer-a", HAMI).startswith(ERR_NODE_LOCKED)
    # a failed bind releases the lock even in hold mode
    plant(api, None)
    hold = HandoffBinder(RecordingBinder("binding conflict"), HamiNodeLock(api, 300, lambda: NOW))
    assert hold.bind(POD, "infer-a", HAMI) == "binding conflict"
    assert HAMI_LOCK not in api.node["metadata"]["annotations"]


def test_other_binds_pass_through_without_api_calls() -> None:
    api = InMemoryApiMock()
    inner = RecordingBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW))
    assert b.bind(POD, "dgx-0", {"topoplace.io/placement": "{}"}) == ""
    assert inner.calls == ["dgx-0"] and api.patches == []


class AsyncRecordingBinder(RecordingBinder):
    def __init__(self) -> None:
        super().__init__()
        self.async_calls: list[str] = []

    async def bind_async(self, pod: Any, node: str, ann: Any) -> str:
        self.async_calls.append(node)
        return ""


class AsyncInMemoryApiMock(InMemoryApiMock):
    """The in-memory API with the event-loop calls ``KubeApi`` has; its blocking calls
    fail the test (nothing may run them from the event loop)."""

    def __init__(self, pods: set[tuple[str, str]] = frozenset()) -> None:  # type: ignore[assignment]
        super().__init__(pods)
        self.reads = 0

    async def get_node_async(self, name: str) -> dict[str, Any]:
        self.reads += 1
        return InMemoryApiMock.get_node(self, name)

    async def patch_node_annotations_async(self, name: str, ann: dict, rv: str = "") -> dict:
        return dict(InMemoryApiMock.patch_node_annotations(self, name, ann, rv))

    def get_node(self, name: str) -> dict[str, Any]:
        raise AssertionError("a blocking read from the event loop")

    def patch_node_annotations(self, name: str, ann: dict, rv: str = "") -> dict[str, Any]:
        raise AssertionError("a blocking patch from the event loop")


def test_async_path_keeps_the_inner_binders_event_loop_write() -> None:
    import asyncio

    api = InMemoryApiMock({("infer", "p0")})
    inner = AsyncRecordingBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW), "release")
    assert asyncio.run(b.bind_async(POD, "dgx-0", {"topoplace.io/placement": "{}"})) == ""
    assert inner.async_calls == ["dgx-0"] and inner.calls == [] and api.patches == []
    # A HAMi hand-off writes its Binding on the event loop too, under the lock (an API
    # without async calls is called in a worker thread).
    assert asyncio.run(b.bind_async(POD, "infer-a", HAMI)) == ""
    assert inner.async_calls == ["dgx-0", "infer-a"] and inner.calls == []
    assert [list(p) for p in api.patches] == [[HAMI_LOCK], [HAMI_LOCK]]
    assert HAMI_LOCK not in api.node["metadata"]["annotations"]


def test_async_hand_off_uses_the_apis_async_calls_and_reads_the_node_once() -> None:
    import asyncio

    api = AsyncInMemoryApiMock({("infer", "p0")})
    inner = AsyncRecordingBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW), "release")
    assert asyncio.run(b.bind_async(POD, "infer-a", HAMI)) == ""
    assert inner.async_calls == ["infer-a"]
    assert api.patches == [{HAMI_LOCK: "2025-11-29T21:00:00Z,infer,p0"}, {HAMI_LOCK: None}]
    # The release patched the version acquire's patch returned: one read in all.
    assert api.reads == 1
    # Another writer between acquire and release: the release reads the node again.
    lock = HamiNodeLock(api, 300, lambda: NOW)

    async def bump_between() -> None:
        assert await lock.acquire_async("infer-a", "infer", "p0") == ""
        api.node["metadata"]["resourceVersion"] = "99"  # e.g. a label changed
        await lock.release_async("infer-a", "infer", "p0")

    asyncio.run(bump_between())
    assert HAMI_LOCK not in api.node["metadata"]["annotations"]
    assert api.patches[-1] == {HAMI_LOCK: None} and api.reads == 3


def test_async_binds_on_one_node_take_turns() -> None:
    import asyncio

    api = AsyncInMemoryApiMock({("infer", f"p{i}") for i in range(4)})
    inner = AsyncRecordingBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW), "hold")
    pods = [{"metadata": {"namespace": "infer", "name": f"p{i}"}} for i in range(2)]

    async def both() -> list[str]:
        return list(await asyncio.gather(*(b.bind_async(p, "infer-a", HAMI) for p in pods)))

    got = asyncio.run(both())
    # hold: the first keeps the lock (HAMi's device plugin releases it); the second,
    # serialized behind it, finds it held by a live pod and is refused.
    assert got[0] == "" and got[1].startswith(ERR_NODE_LOCKED)
    assert inner.async_calls == ["infer-a"]


def test_back_to_back_binds_on_a_node_read_it_once_and_still_see_other_writers() -> None:
    import asyncio

    api = AsyncInMemoryApiMock({("infer", f"p{i}") for i in range(6)})
    inner = AsyncRecordingBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW), "release")
    pods = [{"metadata": {"namespace": "infer", "name": f"p{i}"}} for i in range(6)]

    async def binds(which: range) -> list[str]:
        return [await b.bind_async(pods[i], "infer-a", HAMI) for i in which]

    assert asyncio.run(binds(range(4))) == ["", "", "", ""]
    assert api.reads == 1  # lock, bind, release: the next lock patches release's version
    assert len(api.patches) == 8 and HAMI_LOCK not in api.node["metadata"]["annotations"]
    # Another scheduler's live lock lands in between: the conditional patch fails, the
    # node is read, and the bind is refused as before.
    plant(api, lock_value("infer", "p5", NOW))
    assert asyncio.run(binds(range(4, 5)))[0].startswith(ERR_NODE_LOCKED)
    assert api.reads == 2 and inner.async_calls == ["infer-a"] * 4


def test_hold_mode_keeps_nothing_per_pod_once_bound() -> None:
    import asyncio

    lock = HamiNodeLock(AsyncInMemoryApiMock({("infer", "p0")}), 300, lambda: NOW)
    sync_lock = HamiNodeLock(InMemoryApiMock({("infer", "p0")}), 300, lambda: NOW)
    assert (
        asyncio.run(HandoffBinder(AsyncRecordingBinder(), lock).bind_async(POD, "infer-a", HAMI))
        == ""
    )
    assert HandoffBinder(RecordingBinder(), sync_lock).bind(POD, "infer-a", HAMI) == ""
    # The device plugin releases hold-mode locks: no version is kept for a release.
    assert lock._taken == {} and sync_lock._taken == {}


class SlowAsyncBinder(AsyncRecordingBinder):
    """Writes take a while (an API round trip), so binds to one node overlap; records the
    most Bindings in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.most = 0

    async def bind_async(self, pod: Any, node: str, ann: Any) -> str:
        import asyncio

        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return await super().bind_async(pod, node, ann)


def _burst(b: HandoffBinder, n: int) -> list[str]:
    import asyncio

    pods = [{"metadata": {"namespace": "infer", "name": f"p{i}"}} for i in range(n)]

    async def all_of() -> list[str]:
        return list(await asyncio.gather(*(b.bind_async(p, "infer-a", HAMI) for p in pods)))

    return asyncio.run(all_of())


def test_release_mode_binds_to_one_node_share_one_take_of_the_lock() -> None:
    api = AsyncInMemoryApiMock({("infer", f"p{i}") for i in range(6)})
    inner = SlowAsyncBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW), "release")
    assert _burst(b, 6) == [""] * 6
    # One take (naming the first pod) and one release for the six Bindings, written at once.
    assert api.patches == [{HAMI_LOCK: lock_value("infer", "p0", NOW)}, {HAMI_LOCK: None}]
    assert inner.async_calls == ["infer-a"] * 6 and inner.most == 6
    assert b.shared_binds == 5 and HAMI_LOCK not in api.node["metadata"]["annotations"]
    # The next burst takes the lock again (the node was let go in between).
    assert _burst(b, 2) == ["", ""] and len(api.patches) == 4


def test_release_mode_burst_refused_together_while_another_binder_holds_the_node() -> None:
    api = AsyncInMemoryApiMock({("infer", f"p{i}") for i in range(4)} | {("hami", "other")})
    plant(api, lock_value("hami", "other", NOW))
    inner = SlowAsyncBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW), "release")
    got = _burst(b, 3)
    assert all(g.startswith(ERR_NODE_LOCKED) for g in got)
    assert inner.async_calls == [] and api.patches == []  # nothing written, nothing released
    assert api.node["metadata"]["annotations"][HAMI_LOCK] == lock_value("hami", "other", NOW)


def test_release_mode_lets_the_node_go_after_a_full_batch() -> None:
    from scheduler.kube.handoff import MAX_SHARED_BINDS

    n = MAX_SHARED_BINDS + 3
    api = AsyncInMemoryApiMock({("infer", f"p{i}") for i in range(n)})
    inner = SlowAsyncBinder()
    b = HandoffBinder(inner, HamiNodeLock(api, 300, lambda: NOW), "release")
    assert _burst(b, n) == [""] * n
    # Two takes: the batch of MAX_SHARED_BINDS, released, then the three that waited.
    assert [list(p.values())[0] is None for p in api.patches] == [False, True, False, True]
    assert inner.most == MAX_SHARED_BINDS and len(inner.async_calls) == n
