"""What the chaos runner found, as tests of the extender in process.

``test_gang_plan_honours_required_node_affinity``: a gang plan must keep every member, seen
or not, to the nodes its required node affinity allows. Found by ``python -m benchmarks.live.chaos --seed 1`` (pods of a gang with a
required node affinity to pool ``work``: the plan reserved the probe node's GPUs for a
member that can never bind there; the gang stayed partly bound until the plan's TTL, and a
probe pod on the probe node was refused "not enough free healthy GPUs" for 109 s); fails
without ``GangRole.node_affinity``.
"""

from __future__ import annotations

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
