"""The node-by-node (scalar) verdicts and ranks of a few positions equal the array
operations', bit for bit: a row update (one pod placed) recomputes one or two rows that
way (``schedule._FEW_ROWS``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.clusters import synthetic_cluster
from scheduler.core import schedule
from scheduler.core.linkclass import LINK_CLASSES
from scheduler.core.params import SchedParams, ScoreWeights
from scheduler.core.schedule import _codes_at, _rank_at
from scheduler.core.snapshot import NodeArrays
from scheduler.runtime.cache import ClusterCache

WIDTH = 8

_unit = st.floats(min_value=-2.0, max_value=3.0, allow_nan=False) | st.sampled_from(
    [0.0, -0.0, 1.0, 0.5]
)


@st.composite
def node_arrays(draw: st.DrawFn) -> NodeArrays:
    """Arbitrary per-node vectors of the dtypes and shapes a snapshot holds, edge values
    included (risk above 1 or negative, zero bandwidths, blocked nodes, no free GPU)."""
    n = draw(st.integers(1, 12))
    nl = len(LINK_CLASSES)
    ints = st.integers(0, WIDTH)
    cap = np.array(draw(st.lists(ints, min_size=n, max_size=n)), np.int32)
    free = np.array(draw(st.lists(ints, min_size=n, max_size=n)), np.int32)
    usable = np.array(draw(st.lists(ints, min_size=n, max_size=n)), np.int32)
    blocked = np.array(
        draw(st.lists(st.sampled_from([0, 0, 0, 2, 3, 4, 11]), min_size=n, max_size=n)), np.int8
    )
    risk = np.array(draw(st.lists(_unit, min_size=n, max_size=n)), np.float64)
    bw = draw(
        st.lists(
            st.floats(min_value=0.0, max_value=900.0, allow_nan=False) | st.just(0.0),
            min_size=n * (WIDTH + 1),
            max_size=n * (WIDTH + 1),
        )
    )
    masks = st.integers(0, (1 << (WIDTH + 1)) - 1)
    lf = draw(st.lists(masks, min_size=n * nl, max_size=n * nl))
    lu = draw(st.lists(masks, min_size=n * nl, max_size=n * nl))
    zeros = np.zeros(n, np.int8)
    return NodeArrays(
        capacity=cap,
        free=free,
        usable=usable,
        state=zeros,
        unschedulable=zeros.astype(np.bool_),
        risk=risk,
        assumed=zeros.astype(np.bool_),
        best_bw=np.asfortranarray(np.array(bw, np.float64).reshape(n, WIDTH + 1)),
        links_free=np.asfortranarray(np.array(lf, np.int64).reshape(n, nl)),
        links_usable=np.asfortranarray(np.array(lu, np.int64).reshape(n, nl)),
        blocked=blocked,
    )


def _by_arrays(fn: Any, *args: Any) -> np.ndarray:
    """``fn(*args)`` with every position computed by the array operations."""
    saved = schedule._FEW_ROWS
    schedule._FEW_ROWS = -1  # every position through the array operations
    try:
        return fn(*args)
    finally:
        schedule._FEW_ROWS = saved


@settings(max_examples=300, deadline=None)
@given(
    a=node_arrays(),
    k=st.integers(1, WIDTH + 2),
    link=st.sampled_from(("",) + tuple(LINK_CLASSES)),
    w=st.tuples(
        st.sampled_from([0.0, 1.0, 2.0, 4.0, 0.3]),
        st.sampled_from([0.0, 1.0, 2.0, 0.7]),
        st.sampled_from([0.0, 1.0, 4.0, 1e-3]),
    ).filter(lambda t: sum(t) > 0),
    data=st.data(),
)
def test_scalar_rows_equal_the_array_operations(
    a: NodeArrays, k: int, link: str, w: tuple[float, float, float], data: st.DataObject
) -> None:
    n = len(a.free)
    p = np.array(
        data.draw(st.lists(st.integers(0, n - 1), min_size=0, max_size=schedule._FEW_ROWS)),
        dtype=np.int64,
    )
    weights = ScoreWeights(*w)
    codes = _codes_at(a, k, link, p)
    want = _by_arrays(_codes_at, a, k, link, p)
    assert codes.dtype == want.dtype and codes.tobytes() == want.tobytes()
    for top in (False, 0.0, 125.5):
        rank = _rank_at(a, k, link, weights, p, top)
        want = _by_arrays(_rank_at, a, k, link, weights, p, top)
        assert rank.dtype == want.dtype and rank.tobytes() == want.tobytes()


def test_scalar_rows_equal_the_array_operations_on_a_real_cluster() -> None:
    """Every node of a synthetic 300-node cluster, one at a time, for each request shape."""
    objs = synthetic_cluster(300)["items"]
    cache = ClusterCache.from_objects([o for o in objs if o["kind"] == "Node"], [], SchedParams())
    a = cache.snapshot().arrays
    w = SchedParams().weights
    seen: set[int] = set()
    ranks: set[bool] = set()
    for k in (1, 2, 3, 4, 8):
        for link in ("",) + tuple(LINK_CLASSES):
            for i in range(len(a.free)):
                p = np.array([i, (i * 7) % len(a.free)], dtype=np.int64)
                codes = _codes_at(a, k, link, p)
                rank = _rank_at(a, k, link, w, p)
                assert codes.tobytes() == _by_arrays(_codes_at, a, k, link, p).tobytes()
                assert rank.tobytes() == _by_arrays(_rank_at, a, k, link, w, p).tobytes()
                seen.update(codes.tolist())
                ranks.update((rank >= 0).tolist())
    assert len(seen) >= 2 and ranks == {True, False}  # feasible and refused nodes both met


def test_verdict_counts_are_the_sizes_of_the_verdict_groups() -> None:
    """Counting a verdict without naming its nodes gives each group of
    :func:`verdict_groups` (unhealthy nodes split by their health reason, cordoned, full,
    too small) with its size, in the same order: the filter's metrics are counted from it."""
    from scheduler.core.model import Health, NodeHealth, PodInfo
    from scheduler.core.schedule import (
        CODE_NOT_CHOSEN,
        filter_codes,
        name_positions,
        narrow_with_rank,
        verdict_counts,
        verdict_groups,
    )
    from scheduler.core.snapshot import with_node_health, with_pod

    objs = synthetic_cluster(120)["items"]
    cache = ClusterCache.from_objects([o for o in objs if o["kind"] == "Node"], [], SchedParams())
    snap = cache.snapshot()
    names = list(snap.names)
    for j, name in enumerate(names[:12]):
        reason = ("xid-79", "ecc", "nvlink-down")[j % 3]
        health = (
            NodeHealth(Health.UNHEALTHY, (reason,), 1.0)
            if j < 9
            else NodeHealth(unschedulable=True, reasons=("cordoned",))
        )
        snap = with_node_health(snap, name, health)
    for name in names[12:40]:
        node = snap.node(name)
        assert node is not None
        gpus = tuple(g for g in range(node.gpu_capacity) if (node.free_mask >> g) & 1)
        if gpus:
            snap = with_pod(snap, PodInfo(f"t/{name}", "", name, gpus[: max(1, len(gpus) - 1)]))
    params = SchedParams()
    seen = 0
    for k in (1, 2, 4, 8):
        req = request_from_pod_k(k)
        pos = name_positions(snap, names[::-1] + names[:5] + ["ghost"])
        codes = filter_codes(snap, req, pos, params)
        narrowed, _, _ = narrow_with_rank(snap, req, pos, codes, params)
        for c, skip in ((codes, ()), (narrowed, (CODE_NOT_CHOSEN,))):
            groups = verdict_groups(snap, pos, c, skip)
            want = [(never, reason, len(idx)) for never, reason, idx in groups]
            assert verdict_counts(snap, pos, c, skip) == want
            assert verdict_counts(snap, pos, c, skip, np.bincount(c, minlength=12)) == want
            seen = max(seen, len(want))
    assert seen >= 5  # several unhealthy reasons and other refusals met


def request_from_pod_k(k: int) -> Any:
    from benchmarks.clusters import make_pod
    from scheduler.core.objects import request_from_pod

    return request_from_pod(make_pod(f"k{k}", k), SchedParams().fabric)
