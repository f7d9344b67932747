"""What the chaos runner found, as tests of the extender in process.

``test_gang_plan_honours_required_node_affinity``: a gang plan must keep every member, seen
or not, to the nodes its required node affinity allows. Found by ``python -m benchmarks.live.chaos --seed 1`` (pods of a gang with a
required node affinity to pool ``work``: the plan reserved the probe node's GPUs for a
member that can never bind there; the gang stayed partly bound until the plan's TTL, and a
probe pod on the probe node was refused "not enough free healthy GPUs" for 109 s); fails
without ``GangRole.node_affinity``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from benchmarks.clusters import make_node, make_pod
from scheduler.core.model import RESERVATION_PREFIX
from scheduler.core.params import SchedParams
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.extender import Extender

POOL = "topoplace-chaos"


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _cluster() -> tuple[Extender, list[str]]:
    """Two work nodes (one with 4 of its 8 GPUs held) and one probe node, all free else."""
    nodes = [
        make_node("work-0", labels={POOL: "work"}),
        make_node("work-1", labels={POOL: "work"}),
        make_node("probe", labels={POOL: "probe"}),
    ]
    busy = make_pod("busy", 4, node="work-1", gpu_indices=[0, 1, 2, 3])
    cache = ClusterCache.from_objects(nodes, [busy], SchedParams(), clock=_Clock())
    return Extender(cache, gangs=GangRuntime()), [n["metadata"]["name"] for n in nodes]


def _member(i: int, how: str) -> dict[str, Any]:
    pod = make_pod(f"g-{i}", 8, gang="g", gang_size=2)
    if how == "selector":
        pod["spec"]["nodeSelector"] = {POOL: "work"}
    else:
        term = {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["work"]}]}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    return pod


def _reserved_nodes(ext: Extender) -> set[str]:
    snap = ext.cache.snapshot()
    return {p.node for k, p in snap.pods.items() if k.startswith(RESERVATION_PREFIX)}


def test_gang_plan_honours_node_selector() -> None:
    """Control: with ``nodeSelector`` the 2 x 8-GPU gang does not fit the work pool (one
    free work node) and nothing is reserved on the probe node."""
    ext, _ = _cluster()
    # kube-scheduler passes only the nodes its in-tree filters (selector, GPU count) left
    out = ext.filter({"Pod": _member(0, "selector"), "NodeNames": ["work-0"]})
    assert out["NodeNames"] in ([], None)
    assert "probe" not in _reserved_nodes(ext)


def test_gang_plan_honours_required_node_affinity() -> None:
    """The same gang with the same constraint written as a required node affinity: the
    plan must not reserve the probe node either."""
    ext, _ = _cluster()
    ext.filter({"Pod": _member(0, "affinity"), "NodeNames": ["work-0"]})
    assert "probe" not in _reserved_nodes(ext)


def test_refusal_of_a_gang_whose_pods_are_all_gone_is_forgotten() -> None:
    """Found by the soak (``python -m benchmarks.live.soak --seed 1``): a gang preempted
    after it was planned was refused when its last member came back, then all its pods were
    deleted (the job ended); its refusal stayed in the gang runtime (and in
    ``/v1/inspect/placements``) for ever, one more for every such gang. The janitor's
    poll forgets the refusal of a gang none of whose pods is pending or bound; a refused
    gang whose members still wait keeps it."""
    ext, _ = _cluster()
    for i in range(2):
        out = ext.filter({"Pod": _member(i, "selector"), "NodeNames": ["work-0"]})
        assert out["NodeNames"] in ([], None)
    assert ext.gangs.describe_plans(ext)["default/g"]["state"] == "refused"
    ext.gangs.poll(ext)
    assert "default/g" in ext.gangs.describe_plans(ext)  # its members still wait
    ext.cache.delete_pod("default/g-0")
    ext.gangs.poll(ext)
    assert "default/g" in ext.gangs.describe_plans(ext)  # one member still waits
    ext.cache.delete_pod("default/g-1")
    ext.gangs.poll(ext)
    assert "default/g" not in ext.gangs.describe_plans(ext)


def _bind_after_409(annotations: dict[str, str], path: str) -> str:
    """A bind whose Binding the API server refuses with 409 because the pod is bound to
    that node already (an earlier bind whose answer was lost), the pod read back as it is
    recorded: bound to rec-node-0 with the placement record GPUs 0-3."""
    import asyncio

    from scheduler.kube.binder import KubeBinder
    from tests.kube.recorded import RecordedApiServer, recorded

    pod = recorded("get_pod_bound.json")
    pod["spec"].pop("nodeName")
    pod["metadata"].pop("annotations")
    with RecordedApiServer() as srv:
        srv.add(
            "POST",
            "/api/v1/namespaces/rec/pods/train-a/binding",
            409,
            "binding_409_already_bound_same_node.json",
        )
        srv.add("GET", "/api/v1/namespaces/rec/pods/train-a", 200, "get_pod_bound.json")
        binder = KubeBinder(srv.api())
        if path == "thread":
            return binder.bind(pod, "rec-node-0", annotations)
        return asyncio.run(binder.bind_async(pod, "rec-node-0", annotations))


def test_a_retried_bind_is_settled_only_by_its_own_placement_record() -> None:
    """Found by ``python -m benchmarks.live.chaos --seed 102`` (an ``api-error`` fault):
    a bind's Binding reached the API server (GPUs 2, 3 of a HAMi node recorded) but its
    answer was lost, and the read-back failed too, so topoplace released the GPUs; the
    retry chose GPUs 3, 4, got 409 (bound already), read the pod back bound to that node
    and took it for its own bind. topoplace then held GPUs 3, 4 while the pod held 2, 3,
    and gave GPU 2 to a HAMi share: one device, a whole-GPU pod and a share (the
    invariant hami-over-capacity). The read-back now settles a bind only when the pod
    carries the placement record this bind wrote; another record is a conflict (the
    assumption is released and the watch's record is held)."""
    for path in ("thread", "event-loop"):
        same = {"topoplace.io/placement": '{"gpus":[0,1,2,3],"node":"rec-node-0","v":1}'}
        assert _bind_after_409(same, path) == ""
        other = {"topoplace.io/placement": '{"gpus":[4,5,6,7],"node":"rec-node-0","v":1}'}
        assert _bind_after_409(other, path).startswith("binding conflict")
        assert _bind_after_409({}, path) == ""  # a bind without a record: the node settles it


def test_a_node_that_loses_its_gpus_for_a_while_comes_back_with_its_pods_gpus_held() -> None:
    """A node whose GPU labels change shape (here: its GPUs unknown for a while, as odd GFD
    values make them), then are restored, must come back with the GPUs its bound pods hold
    still held: the old node's usage, cut to the GPUs it had meanwhile (none), no longer
    says so. Found by ``topoplace bench live-chaos`` (a ``node-labels`` fault on a node with
    a 4-GPU pod bound: 10 s later a gang member was bound to the same GPUs 0-3); fails
    without ``scheduler.core.snapshot.usage_from_pods``."""
    from scheduler.core.snapshot import DoubleBookingError, with_pod

    params = SchedParams()
    node = make_node("work-0", labels={POOL: "work"})
    busy = make_pod("busy", 4, node="work-0", gpu_indices=[0, 1, 2, 3])
    cache = ClusterCache.from_objects([node], [busy], params)
    assert cache.snapshot().node("work-0").used_mask == 0b1111
    odd = make_node("work-0", labels={POOL: "work"}, allocatable_gpus=0)
    odd["status"]["capacity"]["nvidia.com/gpu"] = "0"
    cache.upsert_node(odd)
    assert cache.snapshot().node("work-0").gpu_capacity == 0
    cache.upsert_node(node)
    snap = cache.snapshot()
    back = snap.node("work-0")
    assert back.gpu_capacity == 8
    assert back.used_mask == 0b1111
    assert back.cpu_used_milli == snap.pods["default/busy"].cpu_milli
    rival = replace(snap.pods["default/busy"], key="default/rival", uid="r")
    try:
        with_pod(snap, rival)
    except DoubleBookingError:
        pass
    else:
        raise AssertionError("GPUs 0-3 handed to a second pod")


def _held_twice(snap: Any) -> list[str]:
    """Ledger faults of ``snap``: a GPU two holdings (bound pods, nominations, gang
    reservations) both claim, or a node whose used GPUs are not what its holdings hold."""
    faults = []
    for name in snap.names:
        node = snap.node(name)
        union = 0
        for p in snap.pods_on(name):
            mask = sum(1 << g for g in p.gpus)
            if union & mask:
                faults.append(f"{name}: GPUs {sorted(p.gpus)} of {p.key} held twice")
            union |= mask
        if node.used_mask != union:
            faults.append(f"{name}: ledger {node.used_mask:#x}, holdings {union:#x}")
    return faults


def test_a_gang_reservation_keeps_its_gpus_when_the_pods_before_it_leave() -> None:
    """The chain behind ``gang-partly-bound`` (seed 106): a gang (two 4-GPU members bound
    on ``w0``) is on a node whose GPU labels go odd for 3 s and come back; a 3 x 4-GPU gang
    is then planned; the first gang completes (its pods are deleted); an 8-GPU pod is
    scheduled. Before ``usage_from_pods`` the node came back with its pods' GPUs free, the
    second gang reserved GPUs the first still held, the first gang's deletion then cleared
    those GPUs from the ledger under the reservations (``without_pod`` clears a deleted
    pod's GPUs), and the next pod was given them: the second gang stayed partly bound
    until a relist dropped its reservations ("their GPUs are now held"). Fails without
    ``scheduler.core.snapshot.usage_from_pods`` (commit 6c677f1)."""
    nodes = [make_node(name, labels={POOL: "work"}) for name in ("w0", "w2")]
    old = [
        make_pod(f"old-{i}", 4, node="w0", gpu_indices=[4 * i + j for j in range(4)])
        for i in range(2)
    ]
    other = make_pod("other", 4, node="w2", gpu_indices=[4, 5, 6, 7])
    cache = ClusterCache.from_objects(nodes, [*old, other], SchedParams(), clock=_Clock())
    ext = Extender(cache, gangs=GangRuntime())
    names = ["w0", "w2"]
    odd = make_node("w0", labels={POOL: "work"}, allocatable_gpus=0)
    odd["status"]["capacity"]["nvidia.com/gpu"] = "0"
    cache.upsert_node(odd)
    cache.upsert_node(nodes[0])
    assert _held_twice(cache.snapshot()) == []
    # a 3 x 4-GPU gang: w0 is full, w2 has room for one member only
    out = ext.filter({"Pod": make_pod("mid-0", 4, gang="mid", gang_size=3), "NodeNames": names})
    assert out["NodeNames"] in ([], None)
    assert _reserved_nodes(ext) == set()
    for p in old:  # the first gang completes
        cache.delete_pod(f"default/{p['metadata']['name']}")
    assert _held_twice(cache.snapshot()) == []
    out = ext.filter({"Pod": make_pod("big", 8), "NodeNames": names})
    assert out["NodeNames"] == ["w0"]
    assert _held_twice(cache.snapshot()) == []
