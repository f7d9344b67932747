"""Gang placement for the fault benchmark, on ``scheduler/core`` only.

Two placers, both pure (snapshot in, result out, nothing changed):

* :func:`greedy_gang`: place the members one after the other with
  :func:`scheduler.core.schedule.place_pod`, each on the snapshot that already holds the
  members before it; all or nothing. This is what kube-scheduler + a gang permit plugin
  does pod by pod, with topoplace's filter and score.
* :func:`registry_placer`: a gang policy registered in
  ``scheduler.core.policies.registry`` (e.g. the CP-SAT planner), if that package is
  importable; None otherwise.

Both return the member assignments in member order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.core.model import EMPTY_MAP, PodInfo, PodRequest, frozen_map
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment, PlacementResult, place_pod
from scheduler.core.snapshot import ClusterSnapshot, with_pod


@dataclass(frozen=True, slots=True)
class GangAsk:
    """A homogeneous gang: ``pods`` members of ``gpus`` GPUs each."""

    key: str
    pods: int
    gpus: int
    node_selector: Mapping[str, str] = field(default_factory=lambda: EMPTY_MAP)

    def member(self, i: int) -> str:
        """Pod key of member ``i``."""
        return f"{self.key}-{i}"


Placer = Callable[[ClusterSnapshot, GangAsk, SchedParams], PlacementResult]


def hold(snap: ClusterSnapshot, gang: str, assignments: Sequence[Assignment]) -> ClusterSnapshot:
    """The snapshot with every assignment holding its GPUs (raises on double booking)."""
    for a in assignments:
        snap = with_pod(snap, PodInfo(key=a.pod, uid="", node=a.node, gpus=a.gpus, gang=gang))
    return snap


def greedy_gang(snap: ClusterSnapshot, ask: GangAsk, params: SchedParams) -> PlacementResult:
    """Place every member with ``place_pod`` on successive snapshots; all or nothing."""
    out: list[Assignment] = []
    cur = snap
    for i in range(ask.pods):
        req = PodRequest(
            key=ask.member(i),
            gpus=ask.gpus,
            gang=ask.key,
            gang_size=ask.pods,
            node_selector=frozen_map(ask.node_selector),
        )
        res = place_pod(cur, req, params)
        if not res.ok:
            return PlacementResult(ok=False, reason=res.reason)
        a = res.assignments[0]
        out.append(a)
        cur = hold(cur, ask.key, [a])
    return PlacementResult(ok=True, assignments=tuple(out), details={"policy": "greedy-place-pod"})


def registry_placer(name: str) -> Placer | None:
    """A placer using the registered gang policy ``name``, or None when unavailable."""
    try:
        from scheduler.core.gang import simple_gang
        from scheduler.core.policies.registry import get_policy

        policy = get_policy(name)
    except (ImportError, ValueError):
        return None

    def place(snap: ClusterSnapshot, ask: GangAsk, params: SchedParams) -> PlacementResult:
        gang = simple_gang(ask.key, ask.pods, ask.gpus)
        if ask.node_selector:
            from dataclasses import replace

            gang = replace(
                gang, roles=tuple(replace(r, node_selector=ask.node_selector) for r in gang.roles)
            )
        res = policy(snap, gang, params)
        if not res.ok:
            return res
        # Rename slots to member keys in a stable order.
        members = sorted(res.assignments, key=lambda a: a.pod)
        renamed = tuple(Assignment(ask.member(i), a.node, a.gpus) for i, a in enumerate(members))
        return PlacementResult(ok=True, assignments=renamed, details=dict(res.details))

    return place
