"""The placement step: the same code the live extender runs, on the engine's ledger.

Whole-GPU pods and gangs are placed on immutable snapshots (:class:`SnapshotPlacement`):

* :func:`greedy_gang` (``place-pod`` / ``pod-by-pod``): the members one after the other with
  :func:`scheduler.core.schedule.place_pod`, each on the snapshot that already holds the
  members before it; all or nothing. One member = one single pod, exactly the decision the
  live extender makes. A gang so placed is what kube-scheduler + a gang permit plugin do
  pod by pod with topoplace's filter and score.
* :func:`registry_placer`: a gang policy registered in ``scheduler.core.policies.registry``
  (CP-SAT ``topoplace``, ``kai-binpack``, ``kueue-bestfit``, ``first-fit``...).

Fractional (GPU-sharing) pods are placed on the sharing ledger by a registered sharing
policy (:class:`SharingPlacement`: FGD and the baselines of the FGD paper), as the FGD
artifact's scheduler does: filter the feasible nodes, score them, take the best (ties: the
lowest rank), choose the devices.

All placers are pure: snapshot in, result out, member assignments in member order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from benchmarks.engine.jobs import MIB, Run
from scheduler.core.fractional import place_on_view
from scheduler.core.model import EMPTY_MAP, PodInfo, PodRequest, frozen_map
from scheduler.core.params import SchedParams
from scheduler.core.policies.sharing_policies import (
    NO_GPU,
    SharingContext,
    SharingPolicy,
    SharingScores,
)
from scheduler.core.schedule import REASON_NO_FEASIBLE_NODE, Assignment, PlacementResult, place_pod
from scheduler.core.sharing import (
    SharingClusterView,
    SharingTask,
    feasible_mask,
)
from scheduler.core.snapshot import ClusterSnapshot, with_pod


@dataclass(frozen=True, slots=True)
class GangAsk:
    """A homogeneous group: ``pods`` members of ``gpus`` GPUs each.

    Attributes:
        key: ``namespace/name``; member ``i`` is ``<key>-<i>``.
        node_selector: labels every member's node must carry.
        required / preferred: fabric level of the gang's topology constraint.
        cpu_milli / memory_bytes: requests per member.
        gang: a gang (members carry ``key`` as their gang); False for a lone pod.
    """

    key: str
    pods: int
    gpus: int
    node_selector: Mapping[str, str] = field(default_factory=lambda: EMPTY_MAP)
    required: str = ""
    preferred: str = ""
    cpu_milli: int = 0
    memory_bytes: int = 0
    gang: bool = True

    def member(self, i: int) -> str:
        """Pod key of member ``i``."""
        return f"{self.key}-{i}"


Placer = Callable[[ClusterSnapshot, GangAsk, SchedParams], PlacementResult]


def hold(
    snap: ClusterSnapshot,
    gang: str,
    assignments: Sequence[Assignment],
    cpu_milli: int = 0,
    memory_bytes: int = 0,
) -> ClusterSnapshot:
    """The snapshot with every assignment holding its GPUs (raises on double booking)."""
    for a in assignments:
        snap = with_pod(
            snap,
            PodInfo(
                key=a.pod,
                uid="",
                node=a.node,
                gpus=a.gpus,
                cpu_milli=cpu_milli,
                memory_bytes=memory_bytes,
                gang=gang,
            ),
        )
    return snap


def greedy_gang(snap: ClusterSnapshot, ask: GangAsk, params: SchedParams) -> PlacementResult:
    """Place every member with ``place_pod`` on successive snapshots; all or nothing."""
    out: list[Assignment] = []
    cur = snap
    gang = ask.key if ask.gang else ""
    for i in range(ask.pods):
        req = PodRequest(
            key=ask.member(i),
            gpus=ask.gpus,
            cpu_milli=ask.cpu_milli,
            memory_bytes=ask.memory_bytes,
            gang=gang,
            gang_size=ask.pods if ask.gang else 0,
            node_selector=frozen_map(ask.node_selector),
        )
        res = place_pod(cur, req, params)
        if not res.ok:
            return PlacementResult(ok=False, reason=res.reason)
        a = res.assignments[0]
        out.append(a)
        if i + 1 < ask.pods:
            cur = hold(cur, gang, [a], ask.cpu_milli, ask.memory_bytes)
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
        gang = simple_gang(
            ask.key,
            ask.pods,
            ask.gpus,
            required=ask.required,
            preferred=ask.preferred,
            cpu_milli=ask.cpu_milli,
            memory_bytes=ask.memory_bytes,
        )
        if ask.node_selector:
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


def placer_named(name: str) -> Placer:
    """``place-pod`` / ``pod-by-pod`` (:func:`greedy_gang`) or a registered gang policy.

    Raises:
        ValueError: unknown name.
    """
    if name in ("place-pod", "pod-by-pod"):
        return greedy_gang
    placer = registry_placer(name)
    if placer is None:
        raise ValueError(f"unknown placement {name!r}: place-pod, pod-by-pod or a gang policy")
    return placer


@dataclass(frozen=True, slots=True)
class SnapshotPlacement:
    """Single pods with ``pods``, gangs with ``gangs``, on a snapshot ledger."""

    pods: Placer
    gangs: Placer
    params: SchedParams

    def place(self, ledger: object, run: Run) -> PlacementResult:
        """Place ``run.job`` on ``ledger.snap`` (see :class:`benchmarks.engine.loop.Placement`)."""
        job = run.job
        ask = GangAsk(
            run.key,
            job.pods,
            job.gpus_per_pod,
            frozen_map(job.selector()),
            job.required,
            job.preferred,
            job.cpu_milli,
            job.memory_mib * MIB,
            gang=job.gang,
        )
        placer = self.gangs if job.gang else self.pods
        return placer(ledger.snap, ask, self.params)  # type: ignore[attr-defined]


class _ScoreCache:
    """Per task shape, the last score of each node and the node version it was computed at."""

    __slots__ = ("_entries", "_n")

    def __init__(self, n: int) -> None:
        self._n = n
        self._entries: dict[tuple[int, int, int, int], tuple[np.ndarray, ...]] = {}

    def scores(
        self,
        policy: SharingPolicy,
        view: SharingClusterView,
        task: SharingTask,
        ctx: SharingContext,
    ) -> SharingScores:
        key = (task.cpu_milli, task.memory_mib, task.num_gpu, task.gpu_milli)
        entry = self._entries.get(key)
        if entry is None:
            entry = (
                np.full(self._n, -1, dtype=np.int64),
                np.zeros(self._n, dtype=np.int64),
                np.full(self._n, NO_GPU, dtype=np.int64),
            )
            self._entries[key] = entry
        ver, score, gpu = entry
        cand = ctx.candidates
        stale = cand[ver[cand] != view.version[cand]]
        if len(stale):
            fresh = policy.score(view, task, replace(ctx, candidates=stale))
            score[stale] = fresh.scores
            gpu[stale] = fresh.gpus
            ver[stale] = view.version[stale]
        return SharingScores(cand, score[cand], gpu[cand])


class SharingPlacement:
    """A sharing policy on a sharing ledger: one pod per job (fractional or whole GPUs).

    ``rng`` (a Go ``math/rand`` replay for the FGD artifact) serves the ``random`` policy and
    the random device choice; scores of unchanged nodes are reused for policies that allow
    it (``cacheable``).
    """

    def __init__(self, policy: SharingPolicy, rng: object, n: int, use_cache: bool = True) -> None:
        self.policy = policy
        self.rng = rng
        self.cache = _ScoreCache(n) if use_cache and policy.cacheable else None

    def place(self, ledger: object, run: Run) -> PlacementResult:
        """Place ``run.job`` on ``ledger.view`` (see :class:`benchmarks.engine.loop.Placement`)."""
        view: SharingClusterView = ledger.view  # type: ignore[attr-defined]
        task = run.job.task()
        cand = np.flatnonzero(feasible_mask(view, task))
        if len(cand) == 0:
            return PlacementResult(ok=False, reason=REASON_NO_FEASIBLE_NODE)
        ctx = SharingContext(candidates=cand, frag=ledger.frag, rng=self.rng)  # type: ignore[attr-defined]
        if self.cache is not None:
            result = self.cache.scores(self.policy, view, task, ctx)
        else:
            result = self.policy.score(view, task, ctx)
        # The same host-and-device step the live extender runs (scheduler.core.fractional).
        i, gpus = place_on_view(view, task, self.policy, result, self.rng)
        return PlacementResult(ok=True, assignments=(Assignment(run.key, view.names[i], gpus),))
