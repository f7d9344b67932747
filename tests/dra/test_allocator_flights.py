"""The gated allocator's timing: each allocation settles on its own timer, is checked once
the watch shows its writes (not against a list), is written by writer threads that overlap
across pods but keep one pod's writes in order, and the thread runs a pass on a watch
event, not on a poll."""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from benchmarks.live.dra import NAMESPACE, pod_object
from scheduler.core import dra
from scheduler.core.params import SchedParams
from scheduler.kube import allocator as al
from scheduler.kube import dra as kdra
from tests.dra import recorded
from tests.dra.test_allocator import MockClaimApi, _claim, _pod, _setup
from tests.dra.test_watch import _api, _watcher

PARAMS_POLICY = SchedParams().selection_policy


def _wait(cond: Any, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def _settled(alloc: al.GateAllocator) -> list[al.Outcome]:
    """Let the writer threads finish, then one more pass: what ended."""
    assert alloc.idle(10.0)
    out = alloc.tick()
    assert alloc.idle(10.0)
    return out + alloc.tick()


def test_each_allocation_settles_on_its_own_timer_and_nothing_sleeps() -> None:
    """A settle of 2 s: pod a written at t=0 goes at t=2 while pod b, written at t=1.5, is
    still settling; b goes at t=3.5. No pass sleeps."""
    claims = {"default/ca": _claim("ca", 1), "default/cb": _claim("cb", 1)}
    pods = [_pod("a", "ca")]
    cache, api, _ = _setup(claims, [])
    now = [0.0]
    slept: list[float] = []
    alloc = al.GateAllocator(
        cache, api, lambda: pods, settle_s=2.0, sleep=slept.append, monotonic=lambda: now[0]
    )
    try:
        alloc.tick()
        assert _settled(alloc) == [] and api.ungated == []  # written, settling
        assert dra.is_allocated(api.claims["default/ca"])
        now[0] = 1.5
        pods.append(_pod("b", "cb"))
        assert _settled(alloc) == []
        assert dra.is_allocated(api.claims["default/cb"])  # planned and written meanwhile
        now[0] = 2.0
        (out,) = _settled(alloc)
        assert (out.pod, out.state) == ("default/a", al.RELEASED)
        assert api.ungated == ["default/a"]  # b's settle has not ended: b waits, a does not
        now[0] = 3.4
        assert _settled(alloc) == []
        now[0] = 3.5
        (out,) = _settled(alloc)
        assert (out.pod, out.state) == ("default/b", al.RELEASED)
        assert api.ungated == ["default/a", "default/b"]
        assert slept == []
    finally:
        alloc.stop()


class LaggingWatchApi(MockClaimApi):
    """The mock API whose watch shows the writes only when the test says so."""

    def __init__(self, cache: Any, claims: Mapping[str, dict]) -> None:
        super().__init__(cache, claims)
        self.lag: list[tuple[str, dict]] = []

    def _bump(self, c: dict) -> dict:
        self.rv += 1
        c["metadata"]["resourceVersion"] = str(self.rv)
        key = dra.object_key(c)
        self.claims[key] = c
        self.lag.append((key, copy.deepcopy(c)))
        return copy.deepcopy(c)

    def deliver(self) -> None:
        """The watch catches up: every write so far, in order."""
        with self.lock:
            for key, c in self.lag:
                self.cache.apply_claim(key, c)
            self.lag.clear()


def _lagging(now: list[float]) -> tuple[LaggingWatchApi, al.GateAllocator]:
    claims = {"default/c2": _claim("c2", 2)}
    cache, _, _ = _setup(claims, [])
    api = LaggingWatchApi(cache, claims)
    pods = [_pod("p2", "c2")]
    alloc = al.GateAllocator(cache, api, lambda: pods, settle_s=0.0, monotonic=lambda: now[0])
    return api, alloc


def test_the_check_waits_for_the_watch_to_show_the_writes_and_reads_no_list() -> None:
    now = [10.0]
    api, alloc = _lagging(now)
    try:
        alloc.tick()
        assert _settled(alloc) == []  # written; the watch has not shown it: no check yet
        assert api.ungated == [] and api.lists == 0
        api.deliver()
        (out,) = _settled(alloc)
        assert out.state == al.RELEASED and api.ungated == ["default/p2"]
        assert api.lists == 0  # the cache, caught up to the write, was the consistent read
    finally:
        alloc.stop()


def test_a_watch_that_stays_behind_makes_the_check_read_a_list() -> None:
    now = [10.0]
    api, alloc = _lagging(now)
    try:
        alloc.tick()
        assert _settled(alloc) == [] and api.lists == 0
        now[0] += al.CATCH_UP_S - 0.01
        assert _settled(alloc) == [] and api.lists == 0
        now[0] += 0.02
        (out,) = _settled(alloc)
        assert out.state == al.RELEASED and api.lists == 1
    finally:
        alloc.stop()


class SlowApi(MockClaimApi):
    """The mock API where each write takes ``delay`` seconds (outside its lock), recording
    (what, key, start, end) per write."""

    def __init__(self, cache: Any, claims: Mapping[str, dict], delay: float) -> None:
        super().__init__(cache, claims)
        self.delay = delay
        self.log: list[tuple[str, str, float, float]] = []

    def _timed(self, what: str, key: str, fn: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        time.sleep(self.delay)
        out = fn(*args)
        with self.lock:
            self.log.append((what, key, t0, time.monotonic()))
        return out

    def update_claim(self, claim: Mapping[str, Any]) -> dict:
        return self._timed("claim", dra.object_key(claim), super().update_claim, claim)

    def update_claim_status(self, claim: Mapping[str, Any]) -> dict:
        return self._timed("status", dra.object_key(claim), super().update_claim_status, claim)

    def remove_gate(
        self, pod: Mapping[str, Any], gate: str, annotations: Mapping[str, str] | None = None
    ) -> dict:
        sup = super().remove_gate
        return self._timed("gate", dra.object_key(pod), sup, pod, gate, annotations)


def test_writes_of_different_pods_overlap_and_each_pods_stay_in_order() -> None:
    claims = {f"default/c{i}": _claim(f"c{i}", 1) for i in range(4)}
    pods = [_pod(f"p{i}", f"c{i}") for i in range(4)]
    cache, _, _ = _setup(claims, [])
    api = SlowApi(cache, claims, delay=0.05)
    alloc = al.GateAllocator(cache, api, lambda: pods, settle_s=0.0)
    try:
        outs = alloc.step()
    finally:
        alloc.stop()
    assert [o.state for o in outs] == [al.RELEASED] * 4
    assert len(api.log) == 12
    for i in range(4):
        mine = [
            (what, t0, t1)
            for what, key, t0, t1 in api.log
            if key in (f"default/c{i}", f"default/p{i}")
        ]
        assert [w for w, _, _ in sorted(mine, key=lambda r: r[1])] == ["claim", "status", "gate"]
        for (_, _, end), (_, start, _) in zip(mine, mine[1:], strict=False):
            assert end <= start  # one pod's writes never overlap: each starts after the last
    overlaps = [
        (a[1], b[1])
        for a in api.log
        for b in api.log
        if a[1][-1] != b[1][-1] and a[2] < b[3] and b[2] < a[3]
    ]
    assert overlaps  # writes of different pods ran at the same time


def test_the_thread_runs_a_pass_on_a_watch_event_not_on_its_poll() -> None:
    """The safety poll is 60 s here: a gated pod is still allocated and released at once
    when the watch reports it, and an event that cannot matter (kube-scheduler allocating
    a claim of its own) runs no pass."""
    claims = {"default/c2": _claim("c2", 2), "default/theirs": _claim("theirs", 1)}
    pods: list[dict] = []
    cache, api, _ = _setup(claims, [])
    passes = [0]
    alloc = al.GateAllocator(cache, api, lambda: passes.__setitem__(0, passes[0] + 1) or pods)
    alloc.start(interval=60.0)
    try:
        assert _wait(lambda: passes[0] == 1)  # the first pass, at start
        p = _pod("p2", "c2")
        pods.append(p)
        inv = cache.dra_inventory()
        theirs = dra.allocated_claim(
            claims["default/theirs"],
            "gpu-node-1",
            dra.claim_spec(claims["default/theirs"]),
            [d for d in inv.by_node["gpu-node-1"] if d.name == "gpu-7"],
        )
        alloc.notify("resourceclaims", "MODIFIED", theirs)
        alloc.notify("pods", "ADDED", {"metadata": {"name": "x"}, "spec": {}})  # not gated
        time.sleep(0.8)
        assert passes[0] == 1 and api.ungated == []  # nothing that matters: no pass
        alloc.notify("pods", "ADDED", p)
        assert _wait(lambda: api.ungated == ["default/p2"], 5.0)
    finally:
        alloc.stop()


def test_notify_is_safe_from_the_watch_thread_while_passes_run() -> None:
    """Events from another thread during passes: every pod released once, though the
    cache still shows it gated (its version of before the release) a while."""
    claims = {f"default/c{i}": _claim(f"c{i}", 1) for i in range(6)}
    pods: list[dict] = []
    cache, api, _ = _setup(claims, [])
    alloc = al.GateAllocator(cache, api, lambda: list(pods))
    alloc.start(interval=60.0)
    try:

        def feed() -> None:
            for i in range(6):
                p = _pod(f"p{i}", f"c{i}")
                p["metadata"]["resourceVersion"] = str(100 + i)
                pods.append(p)
                alloc.notify("pods", "ADDED", p)
                time.sleep(0.02)

        t = threading.Thread(target=feed)
        t.start()
        t.join()
        assert _wait(lambda: len(api.ungated) >= 6, 10.0)
        for p in pods:
            alloc.notify("pods", "MODIFIED", p)  # the watch shows the old version again
        time.sleep(al.RECHECK_S + 0.5)
    finally:
        alloc.stop()
    assert sorted(api.ungated) == [f"default/p{i}" for i in range(6)]
    assert api.lists == 0


def test_the_watcher_reports_each_claim_event_after_the_cache_has_it() -> None:
    api = _api()
    w = _watcher(api)
    w.sync()
    seen: list[tuple[str, str, bool]] = []

    def hook(kind: str, typ: str, obj: Mapping[str, Any]) -> None:
        key = dra.object_key(obj)
        in_cache = w.cache.snapshot().extra[dra.CLAIMS_KEY].get(key) is not None
        seen.append((kind, typ, in_cache == (typ != "DELETED")))
        raise RuntimeError("a listener's bug")  # must not break the watch

    w.on_event = hook
    claims = kdra.kinds_for("v1beta2")[1]
    events = recorded.watch_events()
    api.watches[claims.name] = deque([events])
    assert w.watch_once(w.streams[claims.name]) == len(events) == 3
    assert seen == [("resourceclaims", e["type"], True) for e in events]


# ---- the search for a gated pod's node: the same choice from a few nodes ------------------------


def _cluster(n_nodes: int, seed: int, topology: str) -> tuple[Any, list[tuple[str, int]]]:
    """``n_nodes`` 8-GPU DRA nodes of ``topology``, a random part of their GPUs allocated
    by claims, a few devices tainted; and (claim, GPUs) of free claims to place."""
    import random

    from benchmarks.cluster.dra import device_class, node_slices
    from benchmarks.live.dra import claim_object, node_objects
    from scheduler.runtime.cache import ClusterCache

    rng = random.Random(seed)
    nodes = node_objects(n_nodes, "pick")
    for n in nodes:
        n["metadata"].setdefault("annotations", {})["topoplace.io/gpu-topology"] = topology
    slices = [s for n in nodes for s in node_slices(n["metadata"]["name"], "v1")]
    for s in rng.sample(slices, max(1, n_nodes // 8)):
        dev = rng.choice(s["spec"]["devices"])
        dev["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    claims = []
    for i, n in enumerate(nodes):
        used = rng.sample(range(8), rng.choice((0, 0, 1, 2, 3, 4, 5, 6, 8)))
        if not used:
            continue
        c = claim_object(f"held-{i}", len(used), "v1")
        c["metadata"].update(uid=f"uid-held-{i}", resourceVersion="1")
        name = n["metadata"]["name"]
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpus",
                            "driver": "gpu.nvidia.com",
                            "pool": name,
                            "device": f"gpu-{g}",
                        }
                        for g in sorted(used)
                    ]  # fmt: skip
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [name]}
                            ]
                        }  # fmt: skip
                    ]
                },
            }
        }
        claims.append(c)
    want = [(f"want-{k}", k) for k in (1, 2, 3, 4, 5, 6, 8)]
    for name, k in want:
        c = claim_object(name, k, "v1")
        c["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
        claims.append(c)
    extra = dra.extra_of([device_class("v1"), *slices, *claims])
    return ClusterCache.from_objects(nodes, [], SchedParams(), extra=extra), want


def test_the_node_search_chooses_what_reading_every_node_chooses() -> None:
    """Random ledgers on NVLink (DGX-1) and NVSwitch nodes, every claim size, with devices
    to avoid: the branch and bound returns the very pick of ``pick_for_pod`` over every
    node, and reads fewer nodes."""
    checked = 0
    for seed, topology in [(1, "dgx1-v100"), (2, "dgx1-v100"), (3, "dgx-h100"), (4, "dgx1-v100")]:
        cache, want = _cluster(60, seed, topology)
        api = MockClaimApi(cache, cache.snapshot().extra[dra.CLAIMS_KEY])
        alloc = al.GateAllocator(cache, api, list, settle_s=0.0)
        snap = cache.snapshot()
        inv = cache.dra_inventory(snap)
        claims = snap.extra[dra.CLAIMS_KEY]
        avoid = frozenset(d.id for d in list(inv.by_id.values())[:: 3 + seed % 2])
        for name, _ in want:
            pod = pod_object(f"p-{name}", name, "x", gated=True)
            nodes = alloc._nodes(snap, pod, inv)
            mine = [claims[f"{NAMESPACE}/{name}"]]
            reads: list[int] = []
            real = dra.pick_for_pod

            def counting(
                pod: Any, among: Any, *a: Any, real: Any = real, reads: list[int] = reads
            ) -> Any:
                reads.append(len(among))
                return real(pod, among, *a)

            dra.pick_for_pod = counting  # type: ignore[assignment]
            try:
                got = alloc._pick(pod, mine, nodes, inv, snap, avoid)
            finally:
                dra.pick_for_pod = real  # type: ignore[assignment]
            full = dra.pick_for_pod(
                pod, nodes, inv, snap.extra, PARAMS_POLICY, avoid, snap.pods.values(), None
            )
            assert got == full, (seed, name)
            if isinstance(full, dra.Pick):
                assert sum(reads) < len(nodes), (seed, name, reads)
            checked += 1
        alloc.stop()
    assert checked == 28


def test_the_gate_waits_while_kube_scheduler_allocates_on_the_node_at_most_hold_max() -> None:
    """kube-scheduler has a claim pod in flight on gpu-node-0 (filtered, claim not yet
    allocated): the checked allocation there keeps its gate until that pod's claim is
    allocated (a conflict would then still find topoplace's claim unreserved, free to be
    written again), and never longer than HOLD_MAX_S; one on another node goes at once."""
    claims = {"default/c0": _claim("c0", 1), "default/c1": _claim("c1", 1)}
    pods = [_pod("p0", "c0", node="gpu-node-0"), _pod("p1", "c1", node="gpu-node-1")]
    for p in pods:
        p["metadata"]["resourceVersion"] = "7"  # the watch shows them gated until it moves
    cache, api, _ = _setup(claims, [])
    now = [50.0]
    flying = {("gpu.nvidia.com", "gpu-node-0", "gpu-7")}
    alloc = al.GateAllocator(
        cache, api, lambda: pods, settle_s=0.0, monotonic=lambda: now[0], kube_picks=lambda: flying
    )
    try:
        alloc.tick()
        done = _settled(alloc)
        assert [(o.pod, o.state) for o in done] == [("default/p1", al.RELEASED)]
        now[0] += 0.5
        assert _settled(alloc) == [] and api.ungated == ["default/p1"]  # p0 held
        flying.clear()  # kube-scheduler's claim shows allocated: no pod in flight there
        (out,) = _settled(alloc)
        assert (out.pod, out.state) == ("default/p0", al.RELEASED)
    finally:
        alloc.stop()
    # Held no longer than HOLD_MAX_S, however long kube-scheduler stays busy.
    cache, api, _ = _setup({"default/c0": _claim("c0", 1)}, [])
    now = [50.0]
    alloc = al.GateAllocator(
        cache,
        api,
        lambda: pods[:1],
        settle_s=0.0,
        monotonic=lambda: now[0],
        kube_picks=lambda: {("gpu.nvidia.com", "gpu-node-0", "gpu-7")},
    )
    try:
        alloc.tick()
        assert _settled(alloc) == []
        now[0] += al.HOLD_MAX_S - 0.01
        assert _settled(alloc) == []
        now[0] += 0.02
        (out,) = _settled(alloc)
        assert out.state == al.RELEASED
    finally:
        alloc.stop()


def test_the_gate_waits_for_an_ungated_claim_pod_kube_scheduler_has_queued_for_the_node() -> None:
    """An ungated claim pod pinned to gpu-node-0, its claim not allocated yet (kube-scheduler
    will allocate it, perhaps from a view without topoplace's write): the gated pod on
    gpu-node-0 keeps its gate until that claim shows allocated."""
    theirs = _claim("theirs", 1)
    claims = {"default/c0": _claim("c0", 1), "default/theirs": theirs}
    gated = _pod("p0", "c0", node="gpu-node-0")
    gated["metadata"]["resourceVersion"] = "7"
    queued = _pod("q", "theirs", node="gpu-node-0")
    queued["spec"].pop("schedulingGates")
    cache, api, _ = _setup(claims, [])
    now = [50.0]
    alloc = al.GateAllocator(
        cache, api, lambda: [gated, queued], settle_s=0.0, monotonic=lambda: now[0]
    )
    try:
        alloc.tick()
        assert _settled(alloc) == []
        now[0] += 0.5
        assert _settled(alloc) == [] and api.ungated == []
        inv = cache.dra_inventory()
        d7 = [d for d in inv.by_node["gpu-node-0"] if d.name == "gpu-7"]
        done = dra.allocated_claim(theirs, "gpu-node-0", dra.claim_spec(theirs), d7)
        done["metadata"]["resourceVersion"] = "2000"
        api.claims["default/theirs"] = done
        cache.apply_claim("default/theirs", copy.deepcopy(done))  # its PreBind, watched
        (out,) = _settled(alloc)
        assert (out.pod, out.state) == ("default/p0", al.RELEASED)
    finally:
        alloc.stop()
