"""topoplace's own GPU-sharing policy: FGD's fragmentation drop, the waste expected after the
next request, and CPU-stranded GPU, with shares measured in compute and GPU memory.

Registered as ``topoplace-share`` in the sharing-policy registry, next to FGD and the other
baselines of ``scheduler.core.policies.sharing_policies``; same contract (``score(view,
task, ctx) -> SharingScores``), so the simulator and the extender call it exactly as they call
``fgd``.

Why FGD leaves GPUs idle. On the openb traces at 130 % arrived demand FGD leaves 4-9 % of the
GPUs unallocated. About a quarter of that idle GPU sits on nodes whose *CPU* is used up: every
task that could fill the GPU needs more CPU than the node has left. FGD's measure (paper Eq. 1)
only asks whether the *next* task's CPU fits; it does not see that, say, 20 free cores cannot
feed 8 free GPUs when the workload asks for about 11 cores per GPU, until the node is stuck.

The measure. For a node with ``G`` free milli-GPU and ``C`` free milli-CPU and a target workload
whose GPU tasks ask, popularity-weighted, ``rho`` milli-CPU per milli-GPU, the GPU the node's
CPU can no longer feed is

    S_n = max(0, G - C / rho)          (milli-GPU)

Why FGD packs memory-sized shares poorly. FGD's measure asks whether the *next* request fits
a device, in one number. A share alone on a GPU leaves room that every typical request still
fits, so it scores no fragmentation, and opening a fresh GPU costs nothing, however badly that
GPU will be filled later. On the openb traces most tasks are whole GPUs, which a fresh GPU
alone fits, and that pressure packs the shares. A workload of shares only (48 HAMi pods of 10,
20, 40 and 30 GiB with 25 % of the SMs each, on A100-80GB) has no such pressure, and FGD
spreads it over 23 GPUs where 15 suffice. One number also hides the second dimension: a
share's projection ``max(compute, memory)`` is too large in one and a device's
``min(compute, memory)`` too small in the other.

The measure. A GPU-sharing task's device ``d`` with free ``v = (compute, memory)`` per mille
(``view.gpu_free_dims``; one dimension when absent) adds the drop of the waste the device is
expected to strand *after* the next request, ``A(v) = sum over fitting s of p_s W(v - s)``
(:class:`~scheduler.core.sharing.ExpectedWaste`: the typical requests keep landing on the
device while they fit, and it strands ``min(compute, memory)`` free once one does not; FGD's
per-device term is the first step of ``W``). An idle GPU strands nothing (``A = 0``): opening
one costs the waste a GPU started with this share is expected to end with. FGD's own term is
counted in both dimensions too (a shape fits a device when its compute and its memory both
fit). A placement is scored by the drop of the three expected-waste estimates, in one unit:

    delta = (F_n(M) before - after) + (A(v_d) before - after) + (S_n before - after)

where ``F_n(M)`` is FGD's fragmentation against the same target workload (``ctx.frag``). The
node score is FGD's ``int(100 * sigmoid(delta / 1000))`` and ties go to the lowest rank, as for
FGD: the quantisation plus the seeded tie order is part of why FGD works (the FGD reproduction
notes record that ranking by the exact drop does worse), and we keep it. Effects: CPU-only and
CPU-heavy tasks go to nodes with CPU to spare (T4 nodes with 52 cores per GPU) instead of
eating the CPU that an 8-GPU node's GPUs will need; a node's last cores go to the tasks with
the most GPU per core.

GPU choice inside a node: the device with the largest *exact* drop of ``F_n(M) + A(v_d)``
(to 1e-6; on equal drops the tightest fit, then the lowest index). FGD takes the first device
with the best *quantised* score, which can pick a visibly worse device when two drops round to
the same integer. (``S_n`` does not depend on the device.)

Whole-GPU tasks take the lowest-indexed free devices, as with every other sharing policy.

Pure and deterministic: reads the view, the task and ``ctx.frag``; no randomness of its own
(the seeded tie order is ``view.rank``); never writes to its arguments (``ctx.frag`` keeps a
memo of ``W`` per device state, whose values depend on the workload alone). Cost per decision
is FGD's plus O(candidates) plus, once per target workload, ``W`` of the device states met
(O(T) each).

Calling it (extender or simulator)::

    from scheduler.core.policies.sharing_policies import (
        SharingContext, get_sharing_policy, select_host)
    policy = get_sharing_policy("topoplace-share")
    result = policy.score(view, task, SharingContext(candidates=feasible, frag=frag))
    node = select_host(result, view.rank)   # device: result.gpus at that node

(or :func:`choose_share`, which does the filter, the score and the device choice in one call).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.policies.sharing_base import (
    NO_GPU,
    SharingContext,
    SharingScores,
    register_sharing_policy,
    select_host,
    sigmoid_score,
)
from scheduler.core.sharing import (
    MILLI,
    FloatArray,
    FragmentationModel,
    GpuSelection,
    IntArray,
    SharingClusterView,
    SharingTask,
    allocate,
    feasible_mask,
    weighted_sum,
)

POLICY_NAME = "topoplace-share"
"""Registry name of :class:`TopoplaceSharePolicy`."""

DELTA_DECIMALS = 6
"""Score inputs are rounded to 1e-6 milli-GPU, so a placement whose exact change is zero
scores exactly 50 whatever the float summation order (never 49 by rounding noise)."""


def cpu_per_gpu_milli(frag: FragmentationModel) -> float:
    """Popularity-weighted CPU milli-cores the target workload asks per milli-GPU.

    Over the typical shapes that use a GPU: ``sum(p_m * cpu_m) / sum(p_m * gpus_m * milli_m)``.
    0.0 when no typical shape uses a GPU (the CPU-stranding term is then off).
    """
    w = frag.weights * frag.needs_gpu
    gpu = float(weighted_sum((frag.num_gpu * frag.gpu_milli).astype(np.float64), w))
    if gpu <= 0.0:
        return 0.0
    return float(weighted_sum(frag.cpu_milli.astype(np.float64), w)) / gpu


def cpu_stranded(gpu_free: FloatArray, cpu_free: FloatArray, rho: float) -> FloatArray:
    """``S_n = max(0, G - C / rho)``: free milli-GPU the free CPU cannot feed (0 if rho is 0)."""
    if rho <= 0.0:
        return np.zeros_like(gpu_free, dtype=np.float64)
    out: FloatArray = np.maximum(0.0, gpu_free - cpu_free / rho)
    return out


@register_sharing_policy(POLICY_NAME)
class TopoplaceSharePolicy:
    """FGD's fragmentation drop plus the drop of CPU-stranded GPU (see the module docstring)."""

    name = POLICY_NAME
    gpu_selection: GpuSelection = "best"
    cacheable = True

    def score(
        self, view: SharingClusterView, task: SharingTask, ctx: SharingContext
    ) -> SharingScores:
        """Score ``ctx.candidates`` (and pick the device of a GPU-sharing task).

        Raises:
            ValueError: ``ctx.frag`` is missing.
        """
        frag = ctx.frag
        if frag is None:
            raise ValueError(f"{POLICY_NAME} policy needs ctx.frag (the target workload)")
        idx = ctx.candidates
        # Nodes in the same state (model, free share per device, free CPU) score the same:
        # score each distinct state once (most nodes are idle early on, full late).
        width = view.gpu_free.shape[1]
        cols = [view.model_ids[idx], view.cpu_free[idx], view.gpu_free[idx]]
        dims = view.gpu_free_dims if task.gpu_dims else None
        if dims is not None:
            cols.append(dims[idx].reshape(len(idx), 2 * width))
        states, inverse = _distinct_rows(np.column_stack(cols).astype(np.int64, copy=False))
        state_dims = None
        if dims is not None:
            state_dims = states[:, 2 + width :].reshape(len(states), width, 2)
        delta, gpus = _state_delta(
            frag,
            states[:, 2 : 2 + width],
            states[:, 1],
            states[:, 0],
            task,
            cpu_per_gpu_milli(frag),
            state_dims,
        )
        return SharingScores(idx, sigmoid_score(delta)[inverse], gpus[inverse])


def _distinct_rows(rows: IntArray) -> tuple[IntArray, IntArray]:
    """(the distinct rows, each row's index among them). Rows compare as their bytes (one
    sort of fixed-size byte strings: several times cheaper than ``np.unique(axis=0)``); the
    order of the distinct rows is not numeric, and nothing depends on it (every row is
    scored on its own). One row is its own."""
    if len(rows) == 1:
        return rows, np.zeros(1, dtype=np.int64)
    rows = np.ascontiguousarray(rows)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return rows[first], inverse.reshape(-1)


def _state_delta(
    frag: FragmentationModel,
    free: IntArray,
    cpu: IntArray,
    models: IntArray,
    task: SharingTask,
    rho: float,
    dims: IntArray | None = None,
) -> tuple[FloatArray, IntArray]:
    """Per node state: the score input ``delta`` (rounded) and the device of a GPU-sharing
    task (``NO_GPU`` for other tasks). ``dims``: per device free (compute, memory) per mille
    when the task's share is sized in both (else one dimension, ``free``)."""
    g_before = free.sum(axis=1).astype(np.float64)
    c_before = cpu.astype(np.float64)
    strand = cpu_stranded(g_before, c_before, rho) - cpu_stranded(
        g_before - task.total_gpu_milli, c_before - task.cpu_milli, rho
    )
    if task.is_sharing:
        per_dev = _sharing_drop(frag, free, cpu, models, task, dims)  # NaN: no room
        gpus = _best_device(per_dev, free - task.gpu_milli)
        frag_drop = per_dev[np.arange(len(free)), gpus]
        gpu_col: IntArray = gpus.astype(np.int64)
    else:
        if task.needs_gpu and task.gpu_milli < MILLI:  # fractional on several devices
            frag_drop = _multi_share_drop(frag, free, cpu, models, task)
        else:
            frag_drop = frag.delta_exclusive(free, cpu, models, task)
        gpu_col = np.full(len(free), NO_GPU, dtype=np.int64)
    delta: FloatArray = np.round(frag_drop + strand, DELTA_DECIMALS)
    return delta, gpu_col


_NO_FIT = np.iinfo(np.int64).max


def _best_device(per_dev: FloatArray, left: IntArray) -> IntArray:
    """Per row, the device with the largest drop (to ``DELTA_DECIMALS``; NaN: no room);
    on equal drops the one with the least free share ``left`` after the placement (best
    fit), then the lowest index."""
    drop = np.where(np.isnan(per_dev), -np.inf, np.round(per_dev, DELTA_DECIMALS))
    top = drop == drop.max(axis=1, keepdims=True)
    out: IntArray = np.where(top, left, _NO_FIT).argmin(axis=1)  # first of equals: lowest
    return out


def _sharing_drop(
    frag: FragmentationModel,
    free: IntArray,
    cpu: IntArray,
    models: IntArray,
    task: SharingTask,
    dims: IntArray | None,
) -> FloatArray:
    """Per (node state, device): the drop of FGD's fragmentation (in two dimensions when
    ``dims`` is given) plus the drop of the device's waste expected after the next request
    (:class:`~scheduler.core.sharing.ExpectedWaste`); NaN where the task has no room."""
    if dims is not None:
        per_dev = frag.delta_sharing_2d(dims, cpu, models, task)
        comp, mem = dims[:, :, 0], dims[:, :, 1]
        tc, tm = task.gpu_dims if task.gpu_dims else (task.gpu_milli, task.gpu_milli)
    else:
        per_dev = frag.delta_sharing(free, cpu, models, task)
        comp = mem = free
        tc = tm = task.gpu_milli
    room = ~np.isnan(per_dev)
    comp_after = np.where(room, comp - tc, comp)
    mem_after = comp_after if mem is comp else np.where(room, mem - tm, mem)
    ahead = frag.waste.ahead_of(comp, mem) - frag.waste.ahead_of(comp_after, mem_after)
    out: FloatArray = per_dev + ahead
    return out


def _multi_share_drop(
    frag: FragmentationModel,
    free: IntArray,
    cpu: IntArray,
    models: IntArray,
    task: SharingTask,
) -> FloatArray:
    """Fragmentation drop per row for a fractional task on ``num_gpu > 1`` devices, each taking
    the best-fit devices (least free room first, lowest index on ties) as ``allocate`` does."""
    width = free.shape[1]
    room = free >= task.gpu_milli
    key = np.where(room, free * (width + 1) + np.arange(width), np.iinfo(np.int64).max)
    first = np.argsort(key, axis=1, kind="stable")[:, : task.num_gpu]
    take = np.zeros(free.shape, dtype=bool)
    np.put_along_axis(take, first, True, axis=1)
    after = free - np.where(take & room, task.gpu_milli, 0)
    before_f = frag.per_shape(free, cpu, models)
    after_f = frag.per_shape(after, cpu - task.cpu_milli, models)
    out: FloatArray = weighted_sum(before_f - after_f, frag.weights)
    return out


@dataclass(frozen=True, slots=True)
class ShareChoice:
    """Where a task goes: node index into the view, its name and the device indices."""

    node: int
    name: str
    gpus: tuple[int, ...]


def choose_share(
    view: SharingClusterView, task: SharingTask, frag: FragmentationModel
) -> ShareChoice | None:
    """The whole per-pod decision of ``topoplace-share``: filter, score, node, devices.

    Args:
        view: The cluster (read only).
        task: The pod's request.
        frag: Fragmentation model of the target workload (the workload seen so far).

    Returns:
        The choice, or None if the task fits no node.
    """
    cand = np.flatnonzero(feasible_mask(view, task))
    if len(cand) == 0:
        return None
    policy = TopoplaceSharePolicy()
    result = policy.score(view, task, SharingContext(candidates=cand, frag=frag))
    i = select_host(result, view.rank)
    gpus: tuple[int, ...] = ()
    if task.is_sharing:
        gpus = (int(result.gpus[np.searchsorted(result.nodes, i)]),)
    elif task.needs_gpu:
        got = allocate(view.node(i), task, policy.gpu_selection)
        if got is None:  # pragma: no cover - feasible_mask guarantees a fit
            raise RuntimeError(f"{task.name} does not fit node {view.names[i]}")
        gpus = got
    return ShareChoice(i, view.names[i], gpus)
