"""What the share pod's server path keeps between calls gives the values it would compute
afresh: HAMi registers parsed once per value, held shares read incrementally across a
flattened pod map, per-state fits grown without recomputing them, and the state tables
kept near the working set."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from scheduler.core.fractional import (
    NO_TENANCY,
    ContainerAsk,
    ShareError,
    TenantLimits,
    choose_devices,
    device_fits,
    hami_devices,
    node_tenancy,
    resolve,
    share_request,
    tenancy_binds,
    tenancy_reason,
)
from scheduler.core.params import SchedParams
from scheduler.core.podmap import PodMap
from scheduler.core.share_table import StateFits, fit_states
from scheduler.core.snapshot import build_snapshot
from scheduler.runtime import share_fits
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.share_fits import HeldShares, ShareRows, changed_keys
from scheduler.server.extender import Extender
from tests.sharing.builders import hami_node, register, share_pod


def test_hami_register_parsed_once_per_value() -> None:
    text = register("n", 4, 15360, unhealthy=[1])
    first = hami_devices(text)
    again = hami_devices("".join(text))  # an equal string, another object
    assert again is first
    assert [(d.index, d.healthy) for d in again] == [(0, True), (1, False), (2, True), (3, True)]
    for _ in range(2):  # a malformed value is refused every time, not remembered
        with pytest.raises(ShareError, match="no device"):
            hami_devices("[]")
    with pytest.raises(ShareError, match="not a string"):
        hami_devices(["not", "a", "string"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_changed_keys_exact_across_flattened_bases(seed: int) -> None:
    rng = random.Random(seed)
    m: PodMap[object] = PodMap({f"p{i}": object() for i in range(40)})
    flattened = 0
    for _ in range(300):
        old = m
        for _ in range(rng.randint(1, 6)):
            k = f"p{rng.randrange(80)}"
            m = m.delete(k) if k in m and rng.random() < 0.3 else m.set(k, object())
        flattened += old._base is not m._base  # noqa: SLF001 - the case under test
        truth = {k for k in set(old) | set(m) if old.get(k) is not m.get(k)}
        assert changed_keys(old, m) == truth
    assert flattened > 0
    assert changed_keys({"a": 1, "b": 2}, {"b": 2, "c": 3}) == {"a", "c"}


def _cluster(nodes: int = 6) -> tuple[ClusterCache, Extender, list[str]]:
    names = [f"gpu-{i:02d}" for i in range(nodes)]
    objs = [hami_node(n, gpus=4) for n in names]
    cache = ClusterCache.from_objects(objs, [], SchedParams())
    return cache, Extender(cache), names


class CountingHeld(HeldShares):
    """HeldShares that counts its full re-reads."""

    def __init__(self) -> None:
        super().__init__()
        self.fulls = 0

    def _full(self, nodes, pods):  # type: ignore[no-untyped-def]
        self.fulls += 1
        super()._full(nodes, pods)


def test_held_shares_incremental_equals_fresh_read_past_flattening() -> None:
    cache, ext, names = _cluster()
    held = CountingHeld()
    rows = ShareRows()
    bases = set()
    for i in range(150):
        pod = share_pod(f"s{i:03d}", mem=1000 + 37 * (i % 5), cores=5)
        cache.upsert_pod(pod)
        r = ext.filter({"Pod": pod, "NodeNames": names})
        if r.get("NodeNames"):
            node = r["NodeNames"][0]
            assert not ext.bind(
                {"PodName": f"s{i:03d}", "PodNamespace": "infer", "PodUID": f"uid-infer-s{i:03d}",
                 "Node": node}
            )["Error"]  # fmt: skip
        snap = cache.snapshot()
        bases.add(id(snap.pods._base))  # noqa: SLF001 - flattening must happen here
        epoch = rows.refresh(snap.nodes)
        counts, tenancy, _ = held.update(snap.nodes, snap.index, snap.pods, epoch)
        fresh_counts, fresh_tenancy, _ = HeldShares().update(
            snap.nodes, snap.index, snap.pods, epoch
        )
        assert counts == fresh_counts
        assert dict(tenancy) == dict(fresh_tenancy)
    assert len(bases) > 2  # the pod map flattened its changes more than once
    assert sum(counts.values()) > 100
    assert held.fulls == 1  # the first read only


def test_state_fits_grown_equal_direct_fits() -> None:
    # 120 nodes in distinct states (memory per GPU and GPU count): more states than the
    # first table holds, offered in growing batches.
    objs = [hami_node(f"n{i:03d}", gpus=1 + i % 8, memory_mib=8000 + 64 * i) for i in range(120)]
    snap = build_snapshot(objs, [], SchedParams())
    rows = ShareRows()
    rows.refresh(snap.nodes)
    state_of = rows._state_of  # noqa: SLF001 - the memo's own columns
    gpu, capacity = rows._gpu, rows._capacity  # noqa: SLF001
    reps_of = {int(s): i for i, s in enumerate(state_of.tolist())}
    ask = ContainerAsk(1, 0, 30, 25)
    order = list(reps_of)
    random.Random(7).shuffle(order)
    for lo, hi in ((0, 5), (3, 40), (0, 90), (50, len(order))):
        states = np.array(sorted(order[lo:hi]), dtype=np.int64)
        reps = np.array([reps_of[int(s)] for s in states], dtype=np.int64)
        got = rows._fitted((ask, None), states, reps)  # noqa: SLF001
        want = fit_states(gpu[reps], capacity[reps], ask, None)
        for f in StateFits.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    assert len(state_of) == 120 and len(set(state_of.tolist())) > 64


def test_share_request_read_once_per_pod_version() -> None:
    from scheduler.server.verbs import share as verbs

    _, ext, _ = _cluster(1)
    pod = share_pod("r1", mem=2000, cores=20)
    pod["metadata"]["resourceVersion"] = "41"
    first = verbs.pod_share_request(ext, pod)
    copy = {**pod, "metadata": {**pod["metadata"]}}  # the watch's copy, same version
    assert verbs.pod_share_request(ext, copy) is first
    changed = share_pod("r1", mem=3000, cores=20)  # the pod changed: a new version
    changed["metadata"]["resourceVersion"] = "42"
    got = verbs.pod_share_request(ext, changed)
    assert got is not first and got.containers[0].memory_mib == 3000
    plain = share_pod("r2", mem=2500, cores=10)  # no resourceVersion: by identity
    assert verbs.pod_share_request(ext, plain) is verbs.pod_share_request(ext, plain)
    other = share_pod("r2", mem=1500, cores=10)
    assert verbs.pod_share_request(ext, other).containers[0].memory_mib == 1500
    bad = share_pod("r3", mem="lots", cores=10)
    bad["metadata"]["resourceVersion"] = "7"
    for _ in range(2):
        with pytest.raises(ShareError):
            verbs.pod_share_request(ext, bad)
    for i in range(verbs.REQUEST_MEMO + 10):
        verbs.pod_share_request(ext, share_pod(f"m{i}", mem=1000, cores=5))
    assert len(verbs._requests) == verbs.REQUEST_MEMO  # noqa: SLF001 - bounded


@pytest.mark.parametrize(
    ("tenancy", "limits", "binds"),
    [
        (None, TenantLimits(p95_milli=300, max_tenants=2, limit_milli=800), False),
        (((500, 0, 0), (0, 0, 0)), None, False),  # tenants without limits, request without
        (((500, 0, 0),), TenantLimits(p95_milli=300), False),  # a p95 alone bounds nothing
        (((500, 3, 0), (0, 0, 0)), None, True),  # a tenant's most tenants
        (((0, 0, 0), (500, 0, 900)), None, True),  # a tenant's compute limit
        (((500, 0, 0),), TenantLimits(max_tenants=2), True),  # the request's own
        (((500, 0, 0),), TenantLimits(limit_milli=700), True),
    ],
)
def test_tenancy_binds_only_when_a_limit_is_set(
    tenancy: tuple[tuple[int, int, int], ...] | None, limits: TenantLimits | None, binds: bool
) -> None:
    assert tenancy_binds(tenancy, limits) is binds


def _place_random(
    ext: Any,
    names: list[str],
    prefix: str,
    count: int,
    rng: random.Random,
    mems: tuple[int, ...],
    cores: tuple[int, ...],
) -> None:
    """``count`` share pods ``<prefix>NN`` of random memory and cores, each filtered on
    ``names`` and bound to the node offered (those offered none stay pending)."""
    for i in range(count):
        name = f"{prefix}{i:02d}"
        pod = share_pod(name, mem=rng.choice(mems), cores=rng.choice(cores))
        ext.cache.upsert_pod(pod)
        r = ext.filter({"Pod": pod, "NodeNames": names})
        if r.get("NodeNames"):
            ext.bind({"PodName": name, "PodNamespace": "infer",
                      "PodUID": f"uid-infer-{name}", "Node": r["NodeNames"][0]})  # fmt: skip


def test_placement_with_unbinding_tenancy_equals_without() -> None:
    # Nodes packed with shares whose tenancy sets no limit: the devices chosen, and the
    # reason for a node that cannot take the pod, are those of no tenancy at all.
    cache, ext, names = _cluster(4)
    _place_random(ext, names, "t", 60, random.Random(3), (1000, 3000, 6000), (10, 40))
    snap = cache.snapshot()
    tenancy = {n.name: node_tenancy(n, snap.pods_on(n.name)) for n in snap.nodes}
    assert any(t != NO_TENANCY for ts in tenancy.values() for t in ts)
    asked = 0
    for mem, cores, count in ((2000, 20, 1), (5000, 50, 2), (9000, 30, 1), (14000, 100, 4)):
        req = share_request(share_pod("ask", mem=mem, cores=cores, count=count), 2000)
        assert req is not None
        for n in snap.nodes:
            assert choose_devices(n, req, None, "nvidia-best-effort", tenancy[n.name]) == (
                choose_devices(n, req)
            )
            assert tenancy_reason(n, req, tenancy[n.name]) == ""
            asked += 1
    assert asked == 16


def test_multi_gpu_share_workload_is_the_reference_one() -> None:
    from scheduler.server.verbs import share as verbs

    cache, ext, names = _cluster(4)
    for i in range(30):
        pod = share_pod(f"w{i:02d}", mem=1000 + 500 * (i % 4), cores=10 + 5 * (i % 3))
        cache.upsert_pod(pod)
        r = ext.filter({"Pod": pod, "NodeNames": names})
        assert r["NodeNames"], r
        ext.bind({"PodName": f"w{i:02d}", "PodNamespace": "infer",
                  "PodUID": f"uid-infer-w{i:02d}", "Node": r["NodeNames"][0]})  # fmt: skip
    pod = share_pod("multi", mem=3000, cores=25, count=2)
    req = verbs.pod_share_request(ext, pod)
    snap = cache.snapshot()
    counts, _, _ = verbs._held(ext, snap)  # noqa: SLF001 - the two computations compared
    ask = next(c for c in req.containers if c.count)
    kept = verbs._vector_distribution(ext, snap, req, ask, counts)  # noqa: SLF001
    assert kept == verbs._distribution(ext, snap, req)  # noqa: SLF001
    assert len(kept.shapes) >= 3
    cache.upsert_pod(pod)
    r = ext.filter({"Pod": pod, "NodeNames": names})
    assert len(r["NodeNames"]) == 1


def test_policy_device_taken_when_it_fits_else_the_tightest() -> None:
    cache, ext, names = _cluster(3)
    _place_random(ext, names, "f", 40, random.Random(11), (2000, 5000, 9000), (20, 50))
    snap = cache.snapshot()
    taken = fell_back = 0
    for n in snap.nodes:
        for mem, cores in ((1000, 10), (4000, 30), (8000, 60), (15360, 100)):
            req = share_request(share_pod("ask", mem=mem, cores=cores), 2000)
            assert req is not None
            tightest = choose_devices(n, req)
            for first in range(-1, n.gpu_capacity + 1):
                got = choose_devices(n, req, first)
                dev = next((d for d in n.devices if d.index == first), None)
                share = resolve(req.containers[0], dev) if dev is not None else None
                if share is not None and device_fits(n, dev, share, None, req):
                    assert got == [[share]]
                    taken += 1
                else:
                    assert got == tightest
                    fell_back += 1
    assert taken >= 5 and fell_back >= 5  # both cases met


def test_state_tables_stay_near_the_working_set_and_keep_live_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20 nodes whose state changes one at a time, 400 times (as shares come and go): the
    # states numbered and the fits tables stay within a small multiple of the nodes, and
    # the fits of the states still in use are neither lost nor computed again.
    computed: list[int] = []

    def counting_fit_states(gpu, capacity, ask, limits):  # type: ignore[no-untyped-def]
        computed.append(len(capacity))
        return fit_states(gpu, capacity, ask, limits)

    monkeypatch.setattr(share_fits, "fit_states", counting_fit_states)
    mem = [8000 + 64 * i for i in range(20)]
    rows = ShareRows()
    ask = ContainerAsk(1, 0, 30, 25)
    rng = random.Random(3)
    most = {"row_states": 0, "fit_rows": 0}
    for step in range(400):
        mem[rng.randrange(20)] = 8000 + 16 * step + 4096
        objs = [hami_node(f"n{i:02d}", memory_mib=m) for i, m in enumerate(mem)]
        snap = build_snapshot(objs, [], SchedParams())
        rows.refresh(snap.nodes)
        state_of = rows._state_of  # noqa: SLF001 - the memo's own columns
        reps_of = {int(s): i for i, s in enumerate(state_of.tolist())}
        states = np.array(sorted(reps_of), dtype=np.int64)
        reps = np.array([reps_of[int(s)] for s in states], dtype=np.int64)
        got = rows._fitted((ask, None), states, reps)  # noqa: SLF001
        want = fit_states(rows._gpu[reps], rows._capacity[reps], ask, None)  # noqa: SLF001
        for f in StateFits.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
        before = len(computed)
        rows._fitted((ask, None), states, reps)  # noqa: SLF001
        assert len(computed) == before  # every live state's fit is kept
        sizes = rows.sizes()
        for name in most:
            assert sizes[name][0] <= sizes[name][1]
            most[name] = max(most[name], sizes[name][0])
    cap = share_fits.STATES_PER_ROW * 20 + share_fits.STATE_SLACK
    assert rows.compactions == 4 and rows.rebuilds == 1  # numbered afresh, never rebuilt
    assert most == {"row_states": cap, "fit_rows": cap + 1}  # not the 419 states seen
    # Each state's fit computed once while it lives: the first 20, then the one new state
    # of the changed node per step.
    assert sum(computed) == 20 + 399
