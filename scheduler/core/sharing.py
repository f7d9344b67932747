"""Pure model of GPU-sharing nodes and tasks, and the fragmentation measure of FGD.

This module is the shared vocabulary of the GPU-sharing scheduler policies
(``scheduler.core.policies.sharing_policies``) and of the trace-driven simulator
(``benchmarks.engine.scenarios.fgd``). It follows the definitions of Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent" (USENIX ATC '23) and the
semantics of the authors' simulator (hkust-adsl/kubernetes-scheduler-simulator), re-derived here.

Model:
    * A node has CPU (milli-cores), memory (MiB) and zero or more GPUs of one model. Each GPU
      is tracked as its free amount in milli-GPU (0..1000); the index is the device id.
    * A task requests CPU, memory and either no GPU, a fraction of one GPU (``num_gpu == 1``
      and ``gpu_milli < 1000``: a GPU-sharing task), or ``num_gpu`` whole GPUs. ``gpu_spec``
      optionally restricts the GPU models it may run on.

Fragmentation (paper Sec. 3): for a node ``n`` and a target workload given as a distribution of
"typical" task shapes ``M`` with popularity ``p_m``, the fragmented GPU amount is

    F_n(M) = sum_m p_m * F_n(m)

where ``F_n(m)`` is the free GPU milli on ``n`` that task ``m`` cannot use:
    * all free GPU milli if ``m`` cannot run on ``n`` at all (lacks CPU, lacks enough GPUs
      with room, wrong GPU model) -- and also for a task that needs no GPU, since it can never
      use GPU capacity;
    * otherwise the free milli of the GPUs whose free amount is below ``m``'s per-GPU request
      (the "stranded" partial GPUs).
Only CPU and GPU enter the measure (as in the paper and its artifact), not host memory. A share
sized in GPU memory apart from its compute (HAMi ``gpumem`` with ``gpucores``) carries both
(``SharingTask.gpu_dims``, ``TaskShape.dims``, ``SharingClusterView.gpu_free_dims``):
``gpu_milli`` and ``gpu_free`` are then their one-number projection, which FGD and the
feasibility masks read, and ``FragmentationModel.delta_sharing_2d`` / :class:`ExpectedWaste`
measure both dimensions (topoplace-share).

Purity contract: no I/O, no clock, no unseeded randomness, no mutation of arguments. The
dataclasses are frozen. ``SharingClusterView`` wraps numpy arrays that the *caller* owns and may
update between decisions; every function here only reads them and returns new arrays.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

MILLI = 1000
"""Milli-GPU in one whole GPU."""
MAX_GPUS_PER_NODE = 8
"""Largest GPU count per node in the modelled clusters (array width of the cluster view)."""
MAX_SPEC_CPU_MILLI = 128_000
"""Largest node CPU in the openb cluster; normaliser used by BestFit and DotProd."""
MAX_SPEC_GPU_MILLI = 8_000
"""Largest node GPU milli in the openb cluster; normaliser used by BestFit and DotProd."""
SHARE_AFFINITY = "share-gpu"
"""Affinity tag of GPU-sharing tasks (GpuClustering groups tasks by tag)."""

GpuSelection = Literal["best", "worst", "random"]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def weighted_sum(amounts: npt.NDArray[np.generic], weights: FloatArray) -> FloatArray:
    """``amounts @ weights`` (a sum over the last axis) with the same bits on every CPU.

    ``@`` hands this to BLAS, and OpenBLAS picks a kernel per processor (Haswell, Zen,
    SkylakeX, ...) whose accumulation order changes the last bits of the sum: the same
    replay then gave other fragmentation figures on an AMD host than on an Intel one. An
    elementwise product is exact IEEE arithmetic, and numpy's ``add.reduce`` over a
    contiguous last axis is its pairwise sum, plain C in a fixed order on every target.
    """
    return np.add.reduce(np.multiply(amounts, weights), axis=-1)


def model_allowed(gpu_spec: Sequence[str], gpu_model: str) -> bool:
    """Whether a task with GPU-type constraint ``gpu_spec`` may use GPUs of ``gpu_model``.

    An empty spec allows every model (but a node without GPUs still has no usable model).
    """
    specs = [s for s in gpu_spec if s]
    if not specs:
        return True
    return bool(gpu_model) and gpu_model in specs


@dataclass(frozen=True, slots=True)
class SharingTask:
    """A task (pod) in a GPU-sharing cluster.

    Attributes:
        name: Unique task name.
        cpu_milli: Requested CPU in milli-cores.
        memory_mib: Requested memory in MiB.
        num_gpu: Number of GPUs requested (0 for CPU-only tasks).
        gpu_milli: Requested milli-GPU *per GPU* (1..1000); a GPU-sharing task has
            ``num_gpu == 1`` and ``gpu_milli < 1000``.
        gpu_spec: Allowed GPU models (empty: any model).
        gpu_dims: For a share sized in GPU memory apart from its compute (HAMi
            ``gpumem`` with ``gpucores``): its (compute, memory) per mille of the device, and
            ``gpu_milli`` is their maximum (the one-dimensional projection). Empty: one
            dimension, both equal ``gpu_milli`` (the openb traces).
    """

    name: str
    cpu_milli: int
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: tuple[str, ...] = ()
    gpu_dims: tuple[int, int] | tuple[()] = ()

    @property
    def needs_gpu(self) -> bool:
        """True if the task occupies GPU capacity."""
        return self.num_gpu > 0 and self.gpu_milli > 0

    @property
    def is_sharing(self) -> bool:
        """True for a fractional single-GPU (GPU-sharing) task."""
        return self.num_gpu == 1 and 0 < self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        """Total milli-GPU requested (``num_gpu * gpu_milli``)."""
        return self.num_gpu * self.gpu_milli if self.needs_gpu else 0

    @property
    def affinity(self) -> str | None:
        """GpuClustering tag: ``"share-gpu"``, ``"<k>-gpu"`` or None for CPU-only tasks."""
        if not self.needs_gpu:
            return None
        if self.is_sharing:
            return SHARE_AFFINITY
        return f"{self.num_gpu}-gpu"

    @property
    def shape(self) -> TaskShape:
        """The resource shape used by the typical-task distribution."""
        return TaskShape(
            cpu_milli=self.cpu_milli,
            gpu_milli=self.gpu_milli if self.needs_gpu else 0,
            num_gpu=self.num_gpu if self.needs_gpu else 0,
            gpu_spec="|".join(self.gpu_spec) if self.needs_gpu else "",
            dims=self.gpu_dims if self.needs_gpu else (),
        )


@dataclass(frozen=True, slots=True)
class SharingNode:
    """Immutable state of one node: capacities and what is still free.

    ``gpu_free_milli[i]`` is the free milli-GPU of device ``i``. ``affinity`` counts placed GPU
    tasks per affinity tag (sorted by tag), as GpuClustering needs.
    """

    name: str
    gpu_model: str
    cpu_milli_capacity: int
    memory_mib_capacity: int
    gpu_free_milli: tuple[int, ...]
    cpu_milli_free: int
    memory_mib_free: int
    affinity: tuple[tuple[str, int], ...] = ()

    @classmethod
    def empty(
        cls, name: str, gpu_model: str, cpu_milli: int, memory_mib: int, num_gpu: int
    ) -> SharingNode:
        """An idle node with ``num_gpu`` fully free GPUs."""
        return cls(
            name=name,
            gpu_model=gpu_model if num_gpu > 0 else "",
            cpu_milli_capacity=cpu_milli,
            memory_mib_capacity=memory_mib,
            gpu_free_milli=(MILLI,) * num_gpu,
            cpu_milli_free=cpu_milli,
            memory_mib_free=memory_mib,
        )

    @property
    def num_gpu(self) -> int:
        """Number of GPU devices."""
        return len(self.gpu_free_milli)

    @property
    def gpu_free_total(self) -> int:
        """Free milli-GPU summed over devices."""
        return sum(self.gpu_free_milli)

    @property
    def fully_free_gpus(self) -> int:
        """Number of devices with nothing allocated."""
        return sum(1 for f in self.gpu_free_milli if f == MILLI)

    def affinity_count(self, tag: str) -> int:
        """Number of placed tasks with affinity ``tag``."""
        return dict(self.affinity).get(tag, 0)


def fits(node: SharingNode, task: SharingTask) -> bool:
    """Whether ``task`` can be placed on ``node`` now (kube NodeResourcesFit + GPU-share filter).

    CPU and memory must fit; a GPU task also needs an allowed GPU model and ``num_gpu`` devices
    each with at least ``gpu_milli`` free.
    """
    if task.cpu_milli > node.cpu_milli_free or task.memory_mib > node.memory_mib_free:
        return False
    if not task.needs_gpu:
        return True
    if node.num_gpu == 0 or not model_allowed(task.gpu_spec, node.gpu_model):
        return False
    return sum(1 for f in node.gpu_free_milli if f >= task.gpu_milli) >= task.num_gpu


def allocate(
    node: SharingNode,
    task: SharingTask,
    selection: GpuSelection = "best",
    draw: int | None = None,
) -> tuple[int, ...] | None:
    """Choose the GPU devices for ``task`` on ``node``; None if it does not fit.

    Rules (the open-gpu-share "Reserve" step of the FGD artifact):
        * CPU-only task: ``()``.
        * Whole-GPU task(s): the lowest-indexed fully free devices.
        * GPU-sharing task: among devices with enough free milli, ``"best"`` takes the one with
          the least free (lowest index on ties), ``"worst"`` the one with the most, ``"random"``
          the ``draw``-th candidate in index order (``draw`` is drawn by the caller from its
          seeded generator, in ``[0, number of candidates)``).
        * Multi-GPU fractional tasks (not produced by the traces): best-fit per device.

    Args:
        node: Node state (not modified).
        task: Task to place.
        selection: Device selection rule for GPU-sharing tasks.
        draw: Index into the candidate list for ``"random"``.

    Returns:
        Device indices in increasing order, or None.
    """
    if not fits(node, task):
        return None
    if not task.needs_gpu:
        return ()
    free = node.gpu_free_milli
    if task.gpu_milli >= MILLI:
        chosen = [i for i, f in enumerate(free) if f == MILLI][: task.num_gpu]
        return tuple(chosen)
    candidates = [i for i, f in enumerate(free) if f >= task.gpu_milli]
    if task.num_gpu > 1:
        ordered = sorted(candidates, key=lambda i: (free[i], i))
        return tuple(sorted(ordered[: task.num_gpu]))
    if selection == "best":
        return (min(candidates, key=lambda i: (free[i], i)),)
    if selection == "worst":
        return (min(candidates, key=lambda i: (-free[i], i)),)
    if draw is None or not 0 <= draw < len(candidates):
        raise ValueError("random GPU selection needs a draw in [0, number of candidates)")
    return (candidates[draw],)


def bind(node: SharingNode, task: SharingTask, gpus: Sequence[int]) -> SharingNode:
    """Return the node state after placing ``task`` on devices ``gpus``.

    Raises:
        ValueError: If the placement does not fit.
    """
    if task.cpu_milli > node.cpu_milli_free or task.memory_mib > node.memory_mib_free:
        raise ValueError(f"task {task.name} does not fit CPU/memory of node {node.name}")
    free = list(node.gpu_free_milli)
    if task.needs_gpu:
        if len(gpus) != task.num_gpu or len(set(gpus)) != len(gpus):
            raise ValueError(f"task {task.name} needs {task.num_gpu} distinct GPUs, got {gpus}")
        for g in gpus:
            if free[g] < task.gpu_milli:
                raise ValueError(f"GPU {g} of node {node.name} lacks room for {task.name}")
            free[g] -= task.gpu_milli
    elif gpus:
        raise ValueError(f"CPU-only task {task.name} cannot take GPUs")
    affinity = dict(node.affinity)
    tag = task.affinity
    if tag is not None:
        affinity[tag] = affinity.get(tag, 0) + 1
    return SharingNode(
        name=node.name,
        gpu_model=node.gpu_model,
        cpu_milli_capacity=node.cpu_milli_capacity,
        memory_mib_capacity=node.memory_mib_capacity,
        gpu_free_milli=tuple(free),
        cpu_milli_free=node.cpu_milli_free - task.cpu_milli,
        memory_mib_free=node.memory_mib_free - task.memory_mib,
        affinity=tuple(sorted(affinity.items())),
    )


# --------------------------------------------------------------------------- typical tasks


@dataclass(frozen=True, slots=True, order=True)
class TaskShape:
    """Resource shape of a task as seen by the fragmentation measure (host memory is ignored).

    ``gpu_spec`` is the constraint as written in the trace (``"A|B"``; ``""`` for none).
    ``dims``: (compute, memory) per mille of the device for a share sized in both, with
    ``gpu_milli`` their maximum; ``()`` for one dimension (the openb traces). Field order is
    the artifact's tie-break order for equally popular shapes.
    """

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_spec: str = ""
    dims: tuple[int, int] | tuple[()] = ()

    @property
    def needs_gpu(self) -> bool:
        """True if the shape occupies GPU capacity."""
        return self.num_gpu > 0 and self.gpu_milli > 0

    @property
    def allowed_models(self) -> tuple[str, ...]:
        """The constraint as a tuple of model names."""
        return tuple(s for s in self.gpu_spec.split("|") if s)

    @property
    def compute_memory(self) -> tuple[int, int]:
        """(compute, memory) per mille of a device: ``dims``, or ``gpu_milli`` twice."""
        return self.dims if self.dims else (self.gpu_milli, self.gpu_milli)


@dataclass(frozen=True, slots=True)
class TypicalDistribution:
    """The target workload: typical task shapes and their popularity (weights sum to 1)."""

    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError("shapes and weights differ in length")


def typical_tasks(
    tasks: Iterable[SharingTask], popularity: float = 0.95, step: int = 1
) -> TypicalDistribution:
    """The most popular task shapes covering ``popularity`` of all tasks, renormalised.

    Shapes are ranked by count (ties: larger CPU, then larger per-GPU milli, more GPUs, later
    spec string first); shapes are added ``step`` at a time until their cumulative count
    reaches ``popularity`` of the total, as the FGD artifact does (its default: 95 %, step 1).
    CPU-only tasks are included: they make idle GPUs on CPU-exhausted nodes count as
    fragmented.

    Args:
        tasks: The workload (order does not matter).
        popularity: Fraction of tasks the selected shapes must cover, in (0, 1].
        step: Number of shapes added per round.

    Returns:
        The distribution, most popular shape first.
    """
    return typical_from_counts(Counter(t.shape for t in tasks), popularity, step)


def typical_from_counts(
    counts: Mapping[TaskShape, int], popularity: float = 0.95, step: int = 1
) -> TypicalDistribution:
    """:func:`typical_tasks` of a workload given as how many tasks have each shape."""
    counts = {s: c for s, c in counts.items() if c > 0}
    if not counts:
        raise ValueError("typical_tasks needs at least one task")
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = float(sum(counts.values()))
    expected = float(round(popularity * 100)) * total / 100.0
    chosen: list[tuple[TaskShape, float]] = []
    cum = 0.0
    limit = 0
    while cum < expected and len(chosen) < len(ranked):
        limit += step
        while len(chosen) < limit and len(chosen) < len(ranked):
            shape, cnt = ranked[len(chosen)]
            cum += cnt
            chosen.append((shape, cnt / total))
    if len(chosen) == len(ranked):
        weights = tuple(w for _, w in chosen)
    else:
        scale = cum / total
        weights = tuple(w / scale for _, w in chosen)
    return TypicalDistribution(tuple(s for s, _ in chosen), weights)


# --------------------------------------------------------------------------- fragmentation

FragCategory = Literal[
    "q1_lack_both",
    "q2_lack_gpu",
    "q3_satisfied",
    "q4_lack_cpu",
    "xl_satisfied",
    "xr_lack_cpu",
    "no_access",
]


def classify(node: SharingNode, shape: TaskShape) -> FragCategory:
    """The paper's quadrant of ``(node, shape)``: which resource blocks the shape, if any.

    ``q3_satisfied`` means the shape fits. ``xl``/``xr`` are CPU-only shapes (fits / lacks CPU).
    """
    cpu_ok = node.cpu_milli_free >= shape.cpu_milli
    if not shape.needs_gpu:
        return "xl_satisfied" if cpu_ok else "xr_lack_cpu"
    if not model_allowed(shape.allowed_models, node.gpu_model):
        return "no_access"
    gpu_ok = sum(1 for f in node.gpu_free_milli if f >= shape.gpu_milli) >= shape.num_gpu
    if gpu_ok:
        return "q3_satisfied" if cpu_ok else "q4_lack_cpu"
    return "q2_lack_gpu" if cpu_ok else "q1_lack_both"


def shape_fragmentation(node: SharingNode, shape: TaskShape) -> int:
    """``F_n(m)``: free milli-GPU on ``node`` that ``shape`` cannot use."""
    if classify(node, shape) == "q3_satisfied":
        return sum(f for f in node.gpu_free_milli if f < shape.gpu_milli)
    return node.gpu_free_total


def fragmentation_breakdown(
    node: SharingNode, dist: TypicalDistribution
) -> dict[FragCategory, float]:
    """Free milli-GPU of ``node`` split by category, weighted by popularity.

    For a satisfiable shape its stranded part is booked as ``q2_lack_gpu`` and the usable part
    as ``q3_satisfied``; the values sum to the node's free GPU milli (weights sum to 1).
    """
    out: dict[FragCategory, float] = {
        "q1_lack_both": 0.0,
        "q2_lack_gpu": 0.0,
        "q3_satisfied": 0.0,
        "q4_lack_cpu": 0.0,
        "xl_satisfied": 0.0,
        "xr_lack_cpu": 0.0,
        "no_access": 0.0,
    }
    total = node.gpu_free_total
    for shape, w in zip(dist.shapes, dist.weights, strict=True):
        cat = classify(node, shape)
        if cat == "q3_satisfied":
            stranded = sum(f for f in node.gpu_free_milli if f < shape.gpu_milli)
            out["q2_lack_gpu"] += w * stranded
            out["q3_satisfied"] += w * (total - stranded)
        else:
            out[cat] += w * total
    return out


def node_fragmentation(node: SharingNode, dist: TypicalDistribution) -> float:
    """``F_n(M)``: expected fragmented milli-GPU of ``node`` for the target workload."""
    return math.fsum(
        w * shape_fragmentation(node, s) for s, w in zip(dist.shapes, dist.weights, strict=True)
    )


def cluster_fragmentation(nodes: Iterable[SharingNode], dist: TypicalDistribution) -> float:
    """Sum of ``node_fragmentation`` over ``nodes`` (milli-GPU)."""
    return math.fsum(node_fragmentation(n, dist) for n in nodes)


# --------------------------------------------------------------------------- array view


@dataclass(frozen=True, slots=True, eq=False)
class SharingClusterView:
    """Column-oriented, read-only view of a cluster for vectorised policies.

    Node ``i`` has ``gpu_count[i]`` devices; ``gpu_free[i, :gpu_count[i]]`` are their free
    milli-GPU and the rest of the row is 0 (padding never fits a GPU request and adds nothing to
    sums). ``affinity[i, 0]`` counts GPU-sharing tasks, ``affinity[i, k]`` tasks of ``k`` whole
    GPUs. ``version[i]`` changes whenever node ``i`` changes, so callers can cache per-node
    results. ``rank[i]`` is the tie-break rank (lower wins). ``gpu_free_dims[i, g]``, when
    given, is device ``g``'s free (compute, memory) per mille, for shares sized in GPU memory
    apart from compute; ``gpu_free`` is then the projection ``min(compute, memory)``
    (clamped to the exact fit by the caller). None: one dimension, ``gpu_free``.

    Ownership: the arrays belong to the caller (the simulator or the extender's cache) and may
    be updated in place *between* decisions; nothing in ``scheduler.core`` writes to them.
    """

    names: tuple[str, ...]
    models: tuple[str, ...]
    gpu_count: IntArray
    gpu_free: IntArray
    cpu_free: IntArray
    cpu_capacity: IntArray
    memory_free: IntArray
    memory_capacity: IntArray
    affinity: IntArray
    version: IntArray
    rank: IntArray
    gpu_free_dims: IntArray | None = None
    model_ids: IntArray = field(init=False)
    model_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        model_names = tuple(sorted(set(self.models)))
        lookup = {m: i for i, m in enumerate(model_names)}
        object.__setattr__(self, "model_names", model_names)
        object.__setattr__(
            self, "model_ids", np.array([lookup[m] for m in self.models], dtype=np.int64)
        )

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def from_nodes(
        cls, nodes: Sequence[SharingNode], rank: Sequence[int] | IntArray | None = None
    ) -> SharingClusterView:
        """Build a view (with freshly allocated arrays) from node states.

        Args:
            nodes: Node states, in the order the view will index them.
            rank: Tie-break rank per node (default: position in ``nodes``).
        """
        n = len(nodes)
        width = max([MAX_GPUS_PER_NODE, *(nd.num_gpu for nd in nodes)])
        gpu_free = np.zeros((n, width), dtype=np.int64)
        affinity = np.zeros((n, width + 1), dtype=np.int64)
        for i, nd in enumerate(nodes):
            gpu_free[i, : nd.num_gpu] = nd.gpu_free_milli
            for tag, cnt in nd.affinity:
                col = 0 if tag == SHARE_AFFINITY else int(tag.split("-")[0])
                affinity[i, col] = cnt
        return cls(
            names=tuple(nd.name for nd in nodes),
            models=tuple(nd.gpu_model for nd in nodes),
            gpu_count=np.array([nd.num_gpu for nd in nodes], dtype=np.int64),
            gpu_free=gpu_free,
            cpu_free=np.array([nd.cpu_milli_free for nd in nodes], dtype=np.int64),
            cpu_capacity=np.array([nd.cpu_milli_capacity for nd in nodes], dtype=np.int64),
            memory_free=np.array([nd.memory_mib_free for nd in nodes], dtype=np.int64),
            memory_capacity=np.array([nd.memory_mib_capacity for nd in nodes], dtype=np.int64),
            affinity=affinity,
            version=np.zeros(n, dtype=np.int64),
            rank=np.asarray(rank if rank is not None else range(n), dtype=np.int64),
        )

    def node(self, i: int) -> SharingNode:
        """Snapshot of node ``i`` as an immutable ``SharingNode``."""
        k = int(self.gpu_count[i])
        aff = []
        for col, cnt in enumerate(self.affinity[i]):
            if cnt:
                aff.append((SHARE_AFFINITY if col == 0 else f"{col}-gpu", int(cnt)))
        return SharingNode(
            name=self.names[i],
            gpu_model=self.models[i],
            cpu_milli_capacity=int(self.cpu_capacity[i]),
            memory_mib_capacity=int(self.memory_capacity[i]),
            gpu_free_milli=tuple(int(x) for x in self.gpu_free[i, :k]),
            cpu_milli_free=int(self.cpu_free[i]),
            memory_mib_free=int(self.memory_free[i]),
            affinity=tuple(sorted(aff)),
        )

    def nodes(self) -> tuple[SharingNode, ...]:
        """Snapshots of all nodes."""
        return tuple(self.node(i) for i in range(len(self)))

    def allowed_models_mask(self, gpu_spec: Sequence[str]) -> BoolArray:
        """Per node: does the node's GPU model satisfy ``gpu_spec``."""
        allowed = np.array([model_allowed(gpu_spec, m) for m in self.model_names], dtype=bool)
        return allowed[self.model_ids] & (self.gpu_count > 0)


def feasible_mask(view: SharingClusterView, task: SharingTask) -> BoolArray:
    """Per node: whether ``task`` fits now (same rule as ``fits``)."""
    ok: BoolArray = (view.cpu_free >= task.cpu_milli) & (view.memory_free >= task.memory_mib)
    if not task.needs_gpu:
        return ok
    ok &= view.allowed_models_mask(task.gpu_spec)
    room = (view.gpu_free >= task.gpu_milli).sum(axis=1)
    out: BoolArray = ok & (room >= task.num_gpu)
    return out


def whole_gpu_choice(gpu_free: IntArray, num_gpu: int) -> BoolArray:
    """Per row, mask of the ``num_gpu`` lowest-indexed fully free devices (exclusive tasks)."""
    free = gpu_free == MILLI
    out: BoolArray = free & (np.cumsum(free, axis=1) <= num_gpu)
    return out


# --------------------------------------------------------------------------- vectorised frag


@dataclass(frozen=True, slots=True, eq=False)
class FragmentationModel:
    """Pre-computed arrays to evaluate ``F_n(M)`` for many nodes and hypothetical placements.

    Built once per (distribution, model list). All methods are pure; results for a node are
    exactly ``node_fragmentation`` up to float summation order. To keep "nothing changed"
    placements at exactly zero delta, deltas are computed as a weighted sum of per-shape
    integer differences.
    """

    dist: TypicalDistribution
    model_names: tuple[str, ...]
    gpu_milli: IntArray
    num_gpu: IntArray
    cpu_milli: IntArray
    weights: FloatArray
    needs_gpu: BoolArray
    access: BoolArray  # (n_models, T)
    dim_compute: IntArray  # (T,) per-GPU compute per mille (gpu_milli for one dimension)
    dim_memory: IntArray  # (T,) per-GPU memory per mille (gpu_milli for one dimension)
    waste: ExpectedWaste  # W of the single-GPU shapes (a memo filled on first use)

    @classmethod
    def build(cls, dist: TypicalDistribution, model_names: Sequence[str]) -> FragmentationModel:
        """Arrays for ``dist`` over nodes whose models are indexed as in ``model_names``."""
        shapes = dist.shapes
        access = np.array(
            [[model_allowed(s.allowed_models, m) for s in shapes] for m in model_names],
            dtype=bool,
        ).reshape(len(model_names), len(shapes))
        num_gpu = np.array([s.num_gpu for s in shapes], dtype=np.int64)
        weights = np.array(dist.weights, dtype=np.float64)
        needs_gpu = np.array([s.needs_gpu for s in shapes], dtype=bool)
        dim_compute = np.array([s.compute_memory[0] for s in shapes], dtype=np.int64)
        dim_memory = np.array([s.compute_memory[1] for s in shapes], dtype=np.int64)
        single = needs_gpu & (num_gpu == 1)
        return cls(
            dist=dist,
            model_names=tuple(model_names),
            gpu_milli=np.array([s.gpu_milli for s in shapes], dtype=np.int64),
            num_gpu=num_gpu,
            cpu_milli=np.array([s.cpu_milli for s in shapes], dtype=np.int64),
            weights=weights,
            needs_gpu=needs_gpu,
            access=access,
            dim_compute=dim_compute,
            dim_memory=dim_memory,
            waste=ExpectedWaste(dim_compute[single], dim_memory[single], weights[single]),
        )

    def per_shape(self, gpu_free: IntArray, cpu_free: IntArray, model_ids: IntArray) -> IntArray:
        """``F_n(m)`` for each node row and typical shape: array ``(k, T)`` of milli-GPU.

        Args:
            gpu_free: ``(k, G)`` free milli per device (0-padded).
            cpu_free: ``(k,)`` free CPU milli.
            model_ids: ``(k,)`` indices into ``model_names``.
        """
        m = self.gpu_milli
        ge = gpu_free[:, :, None] >= m[None, None, :]
        usable = (gpu_free[:, :, None] * ge).sum(axis=1)
        count = ge.sum(axis=1)
        return self._combine(gpu_free.sum(axis=1), usable, count, cpu_free, model_ids)

    def _combine(
        self,
        total: IntArray,
        usable: IntArray,
        count: IntArray,
        cpu_free: IntArray,
        model_ids: IntArray,
    ) -> IntArray:
        """``F_n(m) = total - [shape fits] * usable`` from the per-shape device statistics.

        ``total``/``cpu_free``/``model_ids`` carry leading axes ``S``; ``usable``/``count`` have
        shape ``S + (T,)``.
        """
        fit = (
            self.needs_gpu
            & self.access[model_ids]
            & (count >= self.num_gpu)
            & (cpu_free[..., None] >= self.cpu_milli)
        )
        return total[..., None] - np.where(fit, usable, 0)

    def node_frag(self, gpu_free: IntArray, cpu_free: IntArray, model_ids: IntArray) -> FloatArray:
        """``F_n(M)`` per node row (milli-GPU)."""
        return weighted_sum(self.per_shape(gpu_free, cpu_free, model_ids), self.weights)

    def node_frag_artifact_order(
        self, gpu_free: IntArray, cpu_free: IntArray, model_ids: IntArray
    ) -> FloatArray:
        """``F_n(M)`` per node row, rounded exactly like the FGD artifact computes it.

        Same value as ``node_frag`` up to float rounding, but summed in the artifact's order:
        ``p_m * F_n(m)`` is added, shape by shape in distribution order, to the bucket of its
        category (a satisfiable shape's stranded part goes to ``q2_lack_gpu``), then the
        buckets are added in the order q1, q2, q4, xl, xr, no_access. Two states with the same
        true fragmentation but amounts in different categories can then differ by one ulp,
        which decides FGD's integer score when the true change is exactly zero (50 vs 49).
        """
        total = gpu_free.sum(axis=1)
        m = self.gpu_milli
        ge = gpu_free[:, :, None] >= m
        stranded = total[:, None] - (gpu_free[:, :, None] * ge).sum(axis=1)
        cpu_ok = cpu_free[:, None] >= self.cpu_milli
        gpu_ok = ge.sum(axis=1) >= self.num_gpu
        access = self.access[model_ids]
        # Bucket ids: 0 q1, 1 q2 (and stranded part of q3), 3 q4, 4 xl, 5 xr, 6 no_access.
        gpu_cat = np.where(
            ~access,
            6,
            np.where(gpu_ok, np.where(cpu_ok, 1, 3), np.where(cpu_ok, 1, 0)),
        )
        cat = np.where(self.needs_gpu, gpu_cat, np.where(cpu_ok, 4, 5))
        q3 = self.needs_gpu & access & gpu_ok & cpu_ok
        amount = np.where(q3, stranded, total[:, None]).astype(np.float64)
        contrib = self.weights * amount  # (k, T): the artifact's freq * float64(amount)
        buckets = np.zeros((gpu_free.shape[0], 7, len(self.weights)))
        np.put_along_axis(buckets, cat[:, None, :], contrib[:, None, :], axis=1)
        sums = np.cumsum(buckets, axis=2)[:, :, -1]  # sequential, in shape order
        out = np.zeros(gpu_free.shape[0])
        for c in (0, 1, 3, 4, 5, 6):
            out = out + sums[:, c]
        return out

    def delta_exclusive(
        self,
        gpu_free: IntArray,
        cpu_free: IntArray,
        model_ids: IntArray,
        task: SharingTask,
    ) -> FloatArray:
        """``F_before - F_after`` per node row for a CPU-only or whole-GPU task.

        Whole GPUs are taken from the lowest-indexed fully free devices (the rows must be
        feasible for ``task``).
        """
        before = self.per_shape(gpu_free, cpu_free, model_ids)
        after_free = gpu_free
        if task.needs_gpu:
            if task.gpu_milli < MILLI:
                raise ValueError("delta_exclusive is for CPU-only or whole-GPU tasks")
            after_free = gpu_free - whole_gpu_choice(gpu_free, task.num_gpu) * MILLI
        after = self.per_shape(after_free, cpu_free - task.cpu_milli, model_ids)
        return weighted_sum(before - after, self.weights)

    def delta_sharing(
        self,
        gpu_free: IntArray,
        cpu_free: IntArray,
        model_ids: IntArray,
        task: SharingTask,
    ) -> FloatArray:
        """``F_before - F_after`` per (node row, device) for a GPU-sharing task.

        Returns ``(k, G)``; entries for devices without room are NaN. Only the chosen device's
        free amount changes, so per-shape statistics are updated incrementally:
        O(k * G * T) instead of O(k * G * G * T).
        """
        m = self.gpu_milli
        ge = gpu_free[:, :, None] >= m  # (k, G, T)
        usable = (gpu_free[:, :, None] * ge).sum(axis=1)  # (k, T)
        count = ge.sum(axis=1)
        total = gpu_free.sum(axis=1)
        before = self._combine(total, usable, count, cpu_free, model_ids)  # (k, T)

        new_dev = gpu_free - task.gpu_milli  # (k, G) free of device g if chosen
        ge_new = new_dev[:, :, None] >= m
        usable_after = (
            usable[:, None, :]
            - np.where(ge, gpu_free[:, :, None], 0)
            + np.where(ge_new, new_dev[:, :, None], 0)
        )  # (k, G, T)
        count_after = count[:, None, :] - ge + ge_new
        k, g = gpu_free.shape
        after = self._combine(
            np.broadcast_to((total - task.gpu_milli)[:, None], (k, g)),
            usable_after,
            count_after,
            np.broadcast_to((cpu_free - task.cpu_milli)[:, None], (k, g)),
            np.broadcast_to(model_ids[:, None], (k, g)),
        )
        delta = weighted_sum(before[:, None, :] - after, self.weights)
        return np.where(gpu_free >= task.gpu_milli, delta, np.nan)

    def delta_sharing_2d(
        self,
        free_dims: IntArray,
        cpu_free: IntArray,
        model_ids: IntArray,
        task: SharingTask,
    ) -> FloatArray:
        """:meth:`delta_sharing` with each device's free share in two dimensions.

        ``free_dims`` is ``(k, G, 2)``: free (compute, memory) per mille. A shape fits a device
        when its compute and its memory both fit (``dim_compute`` / ``dim_memory``); the amount
        a device strands is ``min(free compute, free memory)``, the share of it still free in
        both. With compute equal to memory (one dimension) this is :meth:`delta_sharing`.
        Returns ``(k, G)``; NaN where the task's ``gpu_dims`` do not fit.
        """
        c, mem = free_dims[:, :, 0], free_dims[:, :, 1]
        amount = np.minimum(c, mem)
        dc, dm = self.dim_compute, self.dim_memory
        ge = (c[:, :, None] >= dc) & (mem[:, :, None] >= dm)  # (k, G, T)
        usable = (amount[:, :, None] * ge).sum(axis=1)  # (k, T)
        count = ge.sum(axis=1)
        total = amount.sum(axis=1)
        before = self._combine(total, usable, count, cpu_free, model_ids)  # (k, T)

        tc, tm = task.gpu_dims if task.gpu_dims else (task.gpu_milli, task.gpu_milli)
        nc, nm = c - tc, mem - tm  # (k, G) free of device g if chosen
        new_amount = np.minimum(nc, nm)
        ge_new = (nc[:, :, None] >= dc) & (nm[:, :, None] >= dm)
        usable_after = (
            usable[:, None, :]
            - np.where(ge, amount[:, :, None], 0)
            + np.where(ge_new, new_amount[:, :, None], 0)
        )  # (k, G, T)
        count_after = count[:, None, :] - ge + ge_new
        k, g = c.shape
        after = self._combine(
            total[:, None] - amount + new_amount,
            usable_after,
            count_after,
            np.broadcast_to((cpu_free - task.cpu_milli)[:, None], (k, g)),
            np.broadcast_to(model_ids[:, None], (k, g)),
        )
        delta = weighted_sum(before[:, None, :] - after, self.weights)
        return np.where((nc >= 0) & (nm >= 0), delta, np.nan)


SMALL_STATES = 64
"""Up to this many devices, :meth:`ExpectedWaste.ahead_of` reads its memo per device."""


class ExpectedWaste:
    """Expected free share a device strands when the target workload keeps arriving.

    FGD asks whether the *next* request fits a device. A device that every typical request
    still fits scores no fragmentation, however badly its free share will be filled: a share
    alone on a GPU leaves room the next request fits, then stranded room once a second one
    lands. ``W`` follows the requests past the next one. For a device with free
    ``v = (compute, memory)`` per mille and the single-GPU typical shapes ``s`` with
    popularity ``p_s``:

        W(v) = sum_s p_s * (W(v - s)       if s fits v
                            min(v)         otherwise)

    that is, the next request lands on the device while it fits, and the device's free share
    is stranded once one does not (FGD's per-device term is this first step, with ``W(v - s)``
    taken as 0). :meth:`ahead` is the rest, ``sum over fitting s of p_s * W(v - s)``: the
    waste expected *after* the next request, which FGD leaves out. Shapes of several GPUs and
    CPU-only shapes do not land on one device and are left out of ``W``.

    Values depend only on the shapes and weights given; they are computed on first use per
    state and remembered (a memo: the answers never change, whatever the order of the
    questions). Every state is visited once, each in O(T) for T shapes; the recursion is an
    explicit stack (a shape takes at least 1 per mille, so every step lowers ``v``).
    """

    __slots__ = ("_shapes", "_waste", "_ahead", "_table")

    def __init__(self, compute: IntArray, memory: IntArray, weights: FloatArray) -> None:
        self._shapes = tuple(
            (int(c), int(m), float(p))
            for c, m, p in zip(compute.tolist(), memory.tolist(), weights.tolist(), strict=True)
            if c + m > 0 and p > 0.0
        )
        self._waste: dict[tuple[int, int], float] = {}
        self._ahead: dict[tuple[int, int], float] = {}
        self._table: FloatArray | None = None

    def waste(self, compute: int, memory: int) -> float:
        """``W(v)`` of a device with free ``v = (compute, memory)`` per mille."""
        memo = self._waste
        top = (compute, memory)
        hit = memo.get(top)
        if hit is not None:
            return hit
        stack = [top]
        while stack:
            state = stack[-1]
            if state in memo:
                stack.pop()
                continue
            sc, sm = state
            amount = float(min(sc, sm))
            missing = False
            total = 0.0
            for dc, dm, p in self._shapes:
                if sc >= dc and sm >= dm:
                    v = memo.get((sc - dc, sm - dm))
                    if v is None:
                        stack.append((sc - dc, sm - dm))
                        missing = True
                    else:
                        total += p * v
                else:
                    total += p * amount
            if not missing:
                memo[state] = total
                stack.pop()
        return memo[top]

    def ahead(self, compute: int, memory: int) -> float:
        """The waste expected after the next request: ``sum over fitting s of p_s W(v - s)``."""
        key = (compute, memory)
        hit = self._ahead.get(key)
        if hit is not None:
            return hit
        if key == (MILLI, MILLI):
            return 0.0
        total = 0.0
        for dc, dm, p in self._shapes:
            if compute >= dc and memory >= dm:
                total += p * self.waste(compute - dc, memory - dm)
        self._ahead[key] = total
        return total

    def ahead_of(self, compute: IntArray, memory: IntArray) -> FloatArray:
        """:meth:`ahead` per element of two integer arrays of one shape, each in
        ``0..MILLI``. One dimension (``memory`` is ``compute``, the same array) reads a table
        of every state, built on first use; else each distinct state is computed once."""
        if memory is compute:
            table = self._table
            if table is None:
                table = np.array([self.ahead(v, v) for v in range(MILLI + 1)])
                self._table = table
            one: FloatArray = table[compute]
            return one
        if compute.size <= SMALL_STATES:
            # Few devices (one node's, a prioritize): the memo read per element is
            # cheaper than sorting them into distinct states first.
            ahead = self.ahead
            flat = [
                ahead(c, m)
                for c, m in zip(compute.ravel().tolist(), memory.ravel().tolist(), strict=True)
            ]
            few: FloatArray = np.array(flat, dtype=np.float64).reshape(compute.shape)
            return few
        key = compute.astype(np.int64) * (MILLI + 1) + memory
        states, inverse = np.unique(key.reshape(-1), return_inverse=True)
        values = np.array([self.ahead(*divmod(int(k), MILLI + 1)) for k in states.tolist()])
        out: FloatArray = values[inverse.reshape(-1)].reshape(compute.shape)
        return out
