"""``fractional.decide`` with the fits a :class:`FitMemo` keeps between pods, and devices
named lazily, gives exactly the decisions computed afresh; a node's fit is reused only for
the very node object it was computed on; the typical workload from shape counts equals the
one from tasks."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.fractional import (
    ShareDecision,
    best_decision,
    decide,
    node_fits,
    share_request,
    workload_distribution,
)
from scheduler.core.model import PodInfo
from scheduler.core.params import SchedParams
from scheduler.core.sharing import SharingTask, typical_from_counts, typical_tasks
from scheduler.core.snapshot import build_snapshot, with_pod
from scheduler.runtime.share_fits import FitMemo
from tests.sharing.builders import A100_MIB, hami_node, share_pod

SELECT = "nvidia-best-effort"

PARAMS = SchedParams()


def _cluster() -> object:
    nodes = [hami_node(f"t4-{i}", 4) for i in range(5)]
    nodes += [hami_node(f"a100-{i}", 8, A100_MIB, product="a100") for i in range(3)]
    return build_snapshot(nodes, [], PARAMS)


def _pods(seed: int, n: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        pct = rng.choice([10, 25, 30, 50, 100])
        count = rng.choice([1, 1, 1, 2])
        out.append(share_pod(f"p{k}", mem=None, cores=pct, percent=pct, count=count))
    return out


def _as_tuple(got: dict[str, ShareDecision]) -> dict[str, tuple[object, ...]]:
    return {name: (d.node, d.score, d.containers) for name, d in got.items()}


def test_decide_with_a_memo_equals_decide_afresh_pod_after_pod() -> None:
    snap = _cluster()
    memo = FitMemo()
    placed = 0
    for k, pod in enumerate(_pods(7, 60)):
        req = share_request(pod, 2000, PARAMS.sharing)
        assert req is not None
        dist = (
            workload_distribution(snap.nodes, snap.pods.values(), [], PARAMS.sharing.popularity)
            if snap.pods
            else typical_tasks([SharingTask("x", 2000, num_gpu=1, gpu_milli=250)])
        )
        fresh = decide(snap.nodes, req, dist, PARAMS.sharing)
        fits = memo.fits(snap.nodes, req, SELECT)
        kept = decide(snap.nodes, req, dist, PARAMS.sharing, SELECT, fits)
        # Scores and the winner first (no device named yet), then every node's devices.
        assert {n: d.score for n, d in kept.items()} == {n: d.score for n, d in fresh.items()}
        assert _as_tuple(kept) == _as_tuple(fresh)
        best = best_decision(kept)
        if best is None:
            continue
        snap = with_pod(
            snap, PodInfo(key=f"t/p{k}", uid="", node=best.node, gpus=(), shares=best.shares)
        )
        placed += 1
    assert placed >= 40  # the sequence exercised a filling cluster, not an empty one


def test_a_fit_is_reused_only_for_the_same_node_object() -> None:
    snap = _cluster()
    pod = share_pod("p", mem=None, cores=30, percent=30)
    req = share_request(pod, 2000, PARAMS.sharing)
    assert req is not None
    dist = typical_tasks([SharingTask("x", 2000, num_gpu=1, gpu_milli=300)])
    before = node_fits(snap.nodes, req, SELECT)
    assert set(before) == {n.name for n in snap.nodes}
    again = node_fits(snap.nodes, req, SELECT, before)
    assert all(again[n] is before[n] for n in before)  # nothing changed: all reused
    best = best_decision(decide(snap.nodes, req, dist, PARAMS.sharing, SELECT, before))
    assert best is not None
    snap2 = with_pod(snap, PodInfo(key="t/p", uid="", node=best.node, gpus=(), shares=best.shares))
    after = node_fits(snap2.nodes, req, SELECT, before)
    changed = {n for n in before if after[n] is not before[n]}
    assert changed == {best.node}  # only the node whose object the bind replaced
    assert after[best.node].free != before[best.node].free
    # Fits of another node object are never taken: decide fits that node itself.
    assert (
        decide(snap2.nodes, req, dist, PARAMS.sharing, SELECT, before).keys()
        == decide(snap2.nodes, req, dist, PARAMS.sharing, SELECT).keys()
    )
    assert {
        n: d.containers
        for n, d in decide(snap2.nodes, req, dist, PARAMS.sharing, SELECT, before).items()
    } == {
        n: d.containers for n, d in decide(snap2.nodes, req, dist, PARAMS.sharing, SELECT).items()
    }


def test_memo_keeps_forms_apart_and_bounded() -> None:
    snap = _cluster()
    memo = FitMemo(forms=3)
    reqs = []
    for pct in (10, 20, 30, 40):
        req = share_request(share_pod("p", mem=None, cores=pct, percent=pct), 0, PARAMS.sharing)
        assert req is not None
        reqs.append(req)
    first = memo.fits(snap.nodes, reqs[0], SELECT)
    # The same form with another CPU request reuses the form's fits.
    other_cpu = share_request(share_pod("q", mem=None, cores=10, percent=10), 900, PARAMS.sharing)
    assert other_cpu is not None
    assert all(v is first[k] for k, v in memo.fits(snap.nodes, other_cpu, SELECT).items())
    for req in reqs[1:]:
        memo.fits(snap.nodes, req, SELECT)
    assert memo.forms() == 3
    # The oldest form was dropped: its fits are computed anew.
    assert all(v is not first[k] for k, v in memo.fits(snap.nodes, reqs[0], SELECT).items())
    # A filter of a subset of the nodes keeps the others' fits.
    last = memo.fits(snap.nodes, reqs[3], SELECT)
    memo.fits(snap.nodes[:1], reqs[3], SELECT)
    assert all(v is last[k] for k, v in memo.fits(snap.nodes, reqs[3], SELECT).items())


def test_a_lazy_decision_reads_like_an_eager_one() -> None:
    shares = ((),)
    calls = []

    class GroupStandIn:
        """Stands in for decide's scored group: names the devices of node ``j``."""

        def devices(self, j: int) -> tuple[tuple[object, ...], ...]:
            calls.append(j)
            return shares  # type: ignore[return-value]

    lazy = ShareDecision("n", None, 42, GroupStandIn(), 1)  # type: ignore[arg-type]
    assert calls == []
    assert lazy == ShareDecision("n", shares, 42)  # type: ignore[arg-type]
    assert lazy.containers is shares and lazy.shares == ()
    assert calls == [1]  # named once, for its own index
    assert "node='n'" in repr(lazy)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1000, 4000, 8000]),
            st.sampled_from([0, 1, 2, 8]),
            st.sampled_from([0, 100, 250, 500, 1000]),
        ),
        min_size=1,
        max_size=80,
    ),
    st.sampled_from([0.5, 0.9, 0.95, 1.0]),
)
def test_typical_from_counts_equals_typical_tasks(
    shapes: list[tuple[int, int, int]], popularity: float
) -> None:
    tasks = [
        SharingTask(f"t{i}", cpu, num_gpu=n, gpu_milli=m) for i, (cpu, n, m) in enumerate(shapes)
    ]
    from collections import Counter

    counts = Counter(t.shape for t in tasks)
    assert typical_from_counts(counts, popularity) == typical_tasks(tasks, popularity)


def test_pod_shapes_kept_between_pods_equal_shapes_read_afresh() -> None:
    from scheduler.core.fractional import pod_shapes, shapes_distribution

    snap = _cluster()
    known = None
    for k, pod in enumerate(_pods(3, 40)):
        req = share_request(pod, 1000 + 500 * (k % 3), PARAMS.sharing)
        assert req is not None
        fresh = pod_shapes(snap.nodes, snap.pods.values())
        kept = pod_shapes(snap.nodes, snap.pods.values(), known)
        assert {p: v[2] for p, v in kept.items()} == {p: v[2] for p, v in fresh.items()}
        if known:  # every pod placed before is read again only if its object changed
            assert all(kept[p] is known[p] for p in known if p in kept)
        known = kept
        if kept:
            assert shapes_distribution(kept.values(), (), 0.95) == workload_distribution(
                snap.nodes, snap.pods.values()
            )
        dist = typical_tasks([SharingTask("x", 2000, num_gpu=1, gpu_milli=250)])
        best = best_decision(decide(snap.nodes, req, dist, PARAMS.sharing))
        if best is not None:
            snap = with_pod(
                snap,
                PodInfo(
                    key=f"t/p{k}",
                    uid="",
                    node=best.node,
                    gpus=(),
                    shares=best.shares,
                    cpu_milli=req.cpu_milli,
                ),
            )
    assert known and len(known) >= 30
    # A pod placed again under the same key, with another share: its shape is read anew.
    from dataclasses import replace

    from scheduler.core.snapshot import without_pod

    key = next(iter(known))
    old = snap.pods[key]
    smaller = tuple(
        replace(s, milli=s.milli // 2, memory_mib=s.memory_mib // 2) for s in old.shares
    )
    snap = with_pod(without_pod(snap, key), replace(old, shares=smaller))
    again = pod_shapes(snap.nodes, snap.pods.values(), known)
    assert again[key][2] != known[key][2]
    assert again[key][2] == pod_shapes(snap.nodes, snap.pods.values())[key][2]
