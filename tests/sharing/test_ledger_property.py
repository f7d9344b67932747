"""One ledger: whole GPUs, gangs and fractional shares never double-book (property test).

Random sequences of whole-GPU pods, gang members, fractional pods (decided by the same
core code the extender runs) and deletions, on HAMi-registered nodes. After every step:
no GPU's memory, compute or split count is overcommitted, no GPU is both held whole and
shared, and the node masks equal what the pods hold. Adversarial steps try to put a whole
pod on a shared GPU and a share on a whole GPU: both must be refused.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.fractional import (
    best_decision,
    check_shares,
    decide,
    node_devices,
    share_request,
    workload_distribution,
)
from scheduler.core.model import GpuShare, PodInfo, PodRequest, indices_to_mask
from scheduler.core.params import SchedParams
from scheduler.core.schedule import place_pod
from scheduler.core.snapshot import (
    ClusterSnapshot,
    DoubleBookingError,
    build_snapshot,
    with_pod,
    without_pod,
)
from tests.sharing.builders import A100_MIB, hami_node, share_pod

PARAMS = SchedParams()


def _cluster() -> ClusterSnapshot:
    nodes = [
        hami_node("infer-a", 4, split=4),
        hami_node("infer-b", 2, A100_MIB, product="a100-40gb", split=3),
        hami_node("infer-c", 8, product="h100", memory_mib=81920, split=10),
    ]
    return build_snapshot(nodes, [], PARAMS)


def check(snap: ClusterSnapshot) -> None:
    for n in snap.nodes:
        devs = node_devices(n)
        whole = 0
        mem = [0] * n.gpu_capacity
        milli = [0] * n.gpu_capacity
        tasks = [0] * n.gpu_capacity
        for p in snap.pods.values():
            if p.node != n.name:
                continue
            m = indices_to_mask(p.gpus)
            assert not whole & m, "a GPU held whole twice"
            whole |= m
            for s in p.shares:
                mem[s.gpu] += s.memory_mib
                milli[s.gpu] += s.milli
                tasks[s.gpu] += 1
        shared = sum(1 << g for g in range(n.gpu_capacity) if tasks[g])
        assert not whole & shared, "a whole GPU holds a share"
        assert n.used_mask == whole | shared
        for g, d in enumerate(devs):
            assert mem[g] <= d.memory_mib, "GPU memory overcommitted"
            assert milli[g] <= d.cores * 10, "GPU compute overcommitted"
            assert tasks[g] <= d.split
            got = n.share_used[g] if g < len(n.share_used) else (0, 0, 0)
            assert got == (mem[g], milli[g], tasks[g])


ops = st.lists(
    st.one_of(
        st.tuples(st.just("whole"), st.integers(1, 4)),
        st.tuples(st.just("gang"), st.integers(2, 3)),
        st.tuples(
            st.just("share"),
            st.sampled_from([1000, 3000, 5000, 8000, 12000, 20000]),
            st.sampled_from([0, 10, 25, 50, 100]),
            st.integers(1, 2),
        ),
        st.tuples(st.just("delete"), st.integers(0, 1000)),
        st.tuples(st.just("attack"), st.integers(0, 1000)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_whole_gang_fractional_sequences_never_double_book(seq: list) -> None:
    snap = _cluster()
    check(snap)
    for k, op in enumerate(seq, 1):
        kind = op[0]
        if kind == "whole":
            req = PodRequest(key=f"t/w{k}", gpus=op[1])
            res = place_pod(snap, req, PARAMS)
            if res.ok:
                a = res.assignments[0]
                snap = with_pod(snap, PodInfo(key=req.key, uid="", node=a.node, gpus=a.gpus))
        elif kind == "gang":
            cur = snap
            ok = True
            for m in range(op[1]):
                req = PodRequest(key=f"t/g{k}-{m}", gpus=2, gang=f"t/g{k}", gang_size=op[1])
                res = place_pod(cur, req, PARAMS)
                if not res.ok:
                    ok = False
                    break
                a = res.assignments[0]
                cur = with_pod(
                    cur, PodInfo(key=req.key, uid="", node=a.node, gpus=a.gpus, gang=f"t/g{k}")
                )
            if ok:
                snap = cur  # all or nothing
        elif kind == "share":
            _, mem, cores, count = op
            pod = share_pod(f"s{k}", mem=mem, cores=cores, count=count)
            req = share_request(pod, 2000, PARAMS.sharing)
            assert req is not None
            dist = workload_distribution(snap.nodes, snap.pods.values()) if snap.pods else None
            if dist is None:
                from scheduler.core.sharing import SharingTask, typical_tasks

                dist = typical_tasks([SharingTask("x", 2000, num_gpu=1, gpu_milli=250)])
            best = best_decision(decide(snap.nodes, req, dist, PARAMS.sharing))
            if best is not None:
                snap = with_pod(
                    snap,
                    PodInfo(key=f"t/s{k}", uid="", node=best.node, gpus=(), shares=best.shares),
                )
        elif kind == "delete" and snap.pods:
            keys = sorted(snap.pods)
            snap = without_pod(snap, keys[op[1] % len(keys)])
        elif kind == "attack":
            for n in snap.nodes:
                shared = n.shared_mask
                whole = n.used_mask & ~shared
                if shared:
                    g = (shared & -shared).bit_length() - 1
                    try:
                        with_pod(snap, PodInfo(key="t/evil", uid="", node=n.name, gpus=(g,)))
                    except DoubleBookingError:
                        pass
                    else:
                        raise AssertionError("a whole GPU was given while it holds a share")
                if whole:
                    g = (whole & -whole).bit_length() - 1
                    assert check_shares(n, (GpuShare(g, 1, 0),))
                    try:
                        with_pod(
                            snap,
                            PodInfo(
                                key="t/evil",
                                uid="",
                                node=n.name,
                                gpus=(),
                                shares=(GpuShare(g, 1, 0),),
                            ),
                        )
                    except DoubleBookingError:
                        pass
                    else:
                        raise AssertionError("a share went on a GPU held whole")
        check(snap)


def test_overcommit_is_refused() -> None:
    snap = _cluster()
    s = PodInfo(key="t/a", uid="", node="infer-a", gpus=(), shares=(GpuShare(0, 15000, 500),))
    snap = with_pod(snap, s)
    for share in (GpuShare(0, 400, 0), GpuShare(0, 100, 600)):
        try:
            with_pod(snap, PodInfo(key="t/b", uid="", node="infer-a", gpus=(), shares=(share,)))
        except DoubleBookingError:
            continue
        raise AssertionError(f"{share} overcommits GPU 0")
    snap = with_pod(
        snap, PodInfo(key="t/c", uid="", node="infer-a", gpus=(), shares=(GpuShare(0, 360, 500),))
    )
    n = snap.node("infer-a")
    assert n is not None and n.share_used[0] == (15360, 1000, 2)
    snap = without_pod(without_pod(snap, "t/a"), "t/c")
    n = snap.node("infer-a")
    assert n is not None and n.share_used == () and n.used_mask == 0
