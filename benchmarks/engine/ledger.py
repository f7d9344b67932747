"""The cluster state of one run: an immutable snapshot, or the GPU-sharing arrays.

* :class:`SnapshotLedger` holds a :class:`scheduler.core.snapshot.ClusterSnapshot` and moves
  it from one immutable snapshot to the next (``with_pod`` / ``without_pod`` /
  ``with_node_health``), exactly the transitions the live cache makes; every placement
  reads the current snapshot. Whole GPUs, gangs and health live here.
* :class:`SharingLedger` holds the per-GPU milli-GPU arrays of
  :class:`scheduler.core.sharing.SharingClusterView`, the vocabulary of the FGD policies
  (fractional GPUs). The engine owns these arrays and changes them only in :meth:`hold` and
  :meth:`release`, between decisions; it also keeps every node's fragmentation (FGD's
  measure) up to date.

Both count a ``generation`` that changes with every change, so a refusal can be remembered
until the cluster changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.engine.jobs import MIB, Job, Run
from benchmarks.engine.loop import InvariantError
from benchmarks.engine.placers import hold
from scheduler.core.model import Health, NodeHealth, indices_to_mask
from scheduler.core.params import SchedParams
from scheduler.core.sharing import (
    SHARE_AFFINITY,
    FragmentationModel,
    SharingClusterView,
    SharingNode,
    SharingTask,
    TypicalDistribution,
)
from scheduler.core.snapshot import build_snapshot, with_node_health, without_pod


class SnapshotLedger:
    """A cluster of Node objects as successive immutable snapshots.

    Attributes:
        snap: the current snapshot (replaced, never changed).
        params: scheduler parameters it was built with.
    """

    def __init__(self, node_objs: Iterable[Mapping[str, Any]], params: SchedParams) -> None:
        self.snap = build_snapshot(node_objs, [], params)
        self.params = params
        self._codes: dict[str, np.ndarray] | None = None
        self._selectors: dict[tuple[tuple[str, str], ...], np.ndarray] = {}

    @property
    def generation(self) -> int:
        """The snapshot's generation."""
        return self.snap.generation

    @property
    def capacity(self) -> int:
        """Physical GPUs in the cluster."""
        return int(self.snap.arrays.capacity.sum())

    def domain_codes(self) -> dict[str, np.ndarray]:
        """Per fabric level, a domain code per node (unlabelled nodes get their own code)."""
        if self._codes is None:
            snap = self.snap
            out: dict[str, np.ndarray] = {}
            for li, lv in enumerate(self.params.fabric.levels):
                codes: dict[str, int] = {}
                arr = np.empty(len(snap.nodes), dtype=np.int64)
                for i, nd in enumerate(snap.nodes):
                    d = nd.fabric_path[li]
                    arr[i] = codes.setdefault(d if d is not None else "\0" + nd.name, len(codes))
                out[lv.name] = arr
            self._codes = out
        return self._codes

    def _selector(self, selector: Mapping[str, str]) -> np.ndarray:
        key = tuple(sorted(selector.items()))
        mask = self._selectors.get(key)
        if mask is None:
            mask = np.fromiter(
                (all(nd.labels.get(k) == v for k, v in key) for nd in self.snap.nodes),
                dtype=bool,
                count=len(self.snap.nodes),
            )
            self._selectors[key] = mask
        return mask

    def may_fit(self, job: Job) -> bool:
        """Enough free member slots on healthy, schedulable nodes that match the job's
        selector (in one domain of the required level, if any)."""
        per = job.gpus_per_pod
        if per <= 0:
            return True
        a = self.snap.arrays
        ok = (a.state < int(Health.UNHEALTHY)) & ~a.unschedulable
        selector = job.selector()
        if selector:
            ok &= self._selector(selector)
        slots = np.where(ok, a.free // per, 0)
        if int(slots.sum()) < job.pods:
            return False
        codes = self.domain_codes()
        if job.required and job.required in codes:
            return bool(np.bincount(codes[job.required], weights=slots).max() >= job.pods)
        return True

    def hold(self, run: Run) -> None:
        """Every member holds its GPUs, CPU and memory (raises on double booking)."""
        job = run.job
        self.snap = hold(
            self.snap,
            run.key if job.gang else "",
            run.members,
            job.cpu_milli,
            job.memory_mib * MIB,
        )

    def release(self, run: Run) -> None:
        """Every member frees what it holds."""
        for a in run.members:
            self.snap = without_pod(self.snap, a.pod)

    def gpu_usage(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node: milli-GPU in use, and physical GPUs."""
        used = np.array([nd.used_mask.bit_count() * 1000 for nd in self.snap.nodes], dtype=np.int64)
        return used, np.asarray(self.snap.arrays.capacity, dtype=np.int64)

    def set_health(self, node: str, health: NodeHealth) -> None:
        """``node`` is now assessed as ``health``."""
        self.snap = with_node_health(self.snap, node, health)

    def check(self, runs: Iterable[Run]) -> None:
        """Raise :class:`InvariantError` unless the snapshot holds exactly the members of the
        running jobs (all or nothing), each with its GPUs, no GPU held twice, and every
        node's used mask is the union of its pods' GPUs."""
        snap = self.snap
        running = [r for r in runs if r.running]
        held = {a.pod: r for r in running for a in r.members}
        if set(snap.pods) != set(held):
            extra = sorted(set(snap.pods) ^ set(held))[:3]
            raise InvariantError(f"pods held by jobs that are not running (or missing): {extra}")
        for r in running:
            if len(r.members) != r.job.pods:
                raise InvariantError(f"{r.key}: {len(r.members)} of {r.job.pods} members hold")
            if any(len(snap.pods[a.pod].gpus) != r.job.gpus_per_pod for a in r.members):
                raise InvariantError(f"{r.key}: a member holds the wrong number of GPUs")
        masks: dict[str, int] = {}
        for p in snap.pods.values():
            m = indices_to_mask(p.gpus)
            if masks.get(p.node, 0) & m:
                raise InvariantError(f"GPU held twice on {p.node}")
            masks[p.node] = masks.get(p.node, 0) | m
        for nd in snap.nodes:
            if nd.used_mask != masks.get(nd.name, 0):
                raise InvariantError(f"{nd.name}: used mask differs from its pods' GPUs")


class SharingLedger:
    """GPU-sharing nodes as arrays the engine owns (see the module docstring).

    Attributes:
        view: the arrays (read by the sharing policies between decisions).
        frag: the fragmentation model of the target workload.
        node_frag: per node, its current fragmentation (milli-GPU).
        index: node name -> row.
    """

    def __init__(
        self,
        nodes: Sequence[SharingNode],
        typical: TypicalDistribution,
        rank: np.ndarray | None = None,
    ) -> None:
        self.view = SharingClusterView.from_nodes(nodes, rank)
        view = self.view
        self.frag = FragmentationModel.build(typical, view.model_names)
        self.node_frag = self.frag.node_frag(view.gpu_free, view.cpu_free, view.model_ids)
        self.index = {n: i for i, n in enumerate(view.names)}
        self.generation = 0

    def may_fit(self, job: Job) -> bool:
        """Always True: the sharing placement filters the feasible nodes itself."""
        return True

    def hold(self, run: Run) -> None:
        """The job's one member takes its CPU, memory and GPU share."""
        self._apply(run, +1)

    def release(self, run: Run) -> None:
        """The job's member frees what it took."""
        self._apply(run, -1)

    def _apply(self, run: Run, sign: int) -> None:
        if len(run.members) != 1:
            raise ValueError("the sharing ledger places single pods only")
        a = run.members[0]
        i = self.index[a.node]
        task: SharingTask = run.job.task()
        view = self.view
        view.cpu_free[i] -= sign * task.cpu_milli
        view.memory_free[i] -= sign * task.memory_mib
        for g in a.gpus:
            view.gpu_free[i, g] -= sign * task.gpu_milli
        if task.needs_gpu:
            view.affinity[i, 0 if task.affinity == SHARE_AFFINITY else task.num_gpu] += sign
        view.version[i] += 1
        sl = slice(i, i + 1)
        self.node_frag[i] = float(
            self.frag.node_frag(view.gpu_free[sl], view.cpu_free[sl], view.model_ids[sl])[0]
        )
        self.generation += 1

    def gpu_usage(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node: milli-GPU in use, and GPUs."""
        v = self.view
        return v.gpu_count * 1000 - v.gpu_free.sum(axis=1), v.gpu_count.copy()

    def check(self, runs: Iterable[Run]) -> None:
        """Raise :class:`InvariantError` on negative or excess free resources."""
        v = self.view
        if (v.gpu_free < 0).any() or (v.gpu_free > 1000).any():
            raise InvariantError("a GPU's free share is outside 0..1000 milli")
        if (v.cpu_free < 0).any() or (v.memory_free < 0).any():
            raise InvariantError("a node's free CPU or memory is negative")
