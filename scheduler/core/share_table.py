"""A fractional pod's filter and score over every node at once: per-GPU ledger columns and
the vector form of :func:`scheduler.core.fractional.decide`.

:func:`~scheduler.core.fractional.decide` fits and scores a share pod node by node in
Python (``_fit``: a few dozen attribute reads per GPU); at 5,000 nodes that is ~50 ms per
pod where a whole-GPU pod costs 1.5 ms. Here the same answer comes from integer columns:

* :func:`share_row` turns one node into its row: the backend, the GPU count, the free CPU,
  the device type and, per GPU, the device memory, the compute capacity, the memory,
  compute and task count held by shares, the split bound and whether a share may go there
  at all (healthy, usable, not held whole). A caller keeps the rows of a snapshot and
  recomputes only the rows of nodes that changed (``scheduler.runtime.share_fits``).
* Rows with equal values are one *state*: a node's fit and its score under a cacheable
  sharing policy depend on its state alone (``SharingPolicy.cacheable``), so
  :func:`decide_rows` fits the distinct states of the offered nodes (:func:`fit_states`:
  ``device_fits``, ``free_milli`` / ``free_dims_of`` clamped to the exact fit, the
  request's share, all as numpy expressions over ``(states, GPUs)``), scores them with the
  configured policy on one view, and hands every offered node its state's score.

The answers are those of ``decide`` (checked on seeded random clusters in
``tests/test_share_table.py``): the same nodes fit, the same scores, the same winner (highest
score, ties to the lowest name) with the same devices (:func:`name_devices`, the policy's
device as ``decide`` names it). Requests it does not cover (several devices or containers,
HAMi's type/UUID selectors, a policy that is not cacheable) are left to ``decide``
(:func:`vector_request`).

Pure: no I/O, no clock, inputs never mutated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.fractional import (
    BACKEND_GPUSHARE,
    BACKEND_HAMI,
    NO_TENANCY,
    ContainerAsk,
    NodeTenancy,
    ShareDecision,
    ShareRequest,
    TenantLimits,
    choose_devices,
    milli_capacity,
    node_devices,
    policy_device,
    usage_of,
)
from scheduler.core.model import GpuShare, NodeInfo
from scheduler.core.policies.sharing_policies import (
    NO_GPU,
    SharingContext,
    SharingPolicy,
    SharingScores,
    get_sharing_policy,
)
from scheduler.core.sharing import (
    MILLI,
    FragmentationModel,
    IntArray,
    SharingClusterView,
    SharingTask,
    TypicalDistribution,
)

FORMS = ("", BACKEND_HAMI, BACKEND_GPUSHARE)
"""Backend codes of a row (0: none, or one topoplace does not place on)."""
NO_CPU_BOUND = 1 << 40
"""Free CPU of a node that publishes none (as ``decide`` counts it)."""

# Per-GPU columns of a row, in this order (see :func:`share_row`).
GPU_FIELDS = (
    "memory",
    "cap",
    "used_memory",
    "used_milli",
    "tasks",
    "split",
    "ok",
    "tenants_p95",
    "tenants_max",
    "tenants_limit",
)
_MEM, _CAP, _UMEM, _UMILLI, _TASKS, _SPLIT, _OK, _TP95, _TMAX, _TLIM = range(len(GPU_FIELDS))
NO_BOUND = 1 << 40
WHY_NONE, WHY_TENANTS, WHY_COMPUTE_P95 = 0, 1, 2
"""Why a state that has room refuses the request (:attr:`StateFits.why`)."""

RowKey = tuple[object, ...]
FitsOf = Callable[[IntArray, IntArray], "StateFits"]
FragOf = Callable[[TypicalDistribution, tuple[str, ...]], FragmentationModel]
"""(target workload, device types) -> ``FragmentationModel.build`` of them."""
"""(state ids, a row of each) -> their :class:`StateFits`."""
"""A row's values, hashable: equal keys are one state."""


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One node's row.

    Attributes:
        form: index into :data:`FORMS` of the node's backend.
        capacity: GPUs of the node.
        cpu_free: free CPU milli (:data:`NO_CPU_BOUND` when the node publishes none).
        cpu_capacity: CPU milli of the node.
        model: the first device's type ("" without devices).
        gpus: per GPU index, :data:`GPU_FIELDS` (``ok`` 1 when a share may go there:
            healthy, usable, not held whole; the last three: the GPU's tenancy,
            ``fractional.node_tenancy``).
    """

    form: int
    capacity: int
    cpu_free: int
    cpu_capacity: int
    model: str
    gpus: tuple[tuple[int, ...], ...]

    @property
    def key(self) -> RowKey:
        """The row's values (equal for nodes in the same state)."""
        return (self.form, self.capacity, self.cpu_free, self.cpu_capacity, self.model, self.gpus)


def share_row(node: NodeInfo, tenancy: NodeTenancy | None = None) -> ShareRow:
    """``node``'s row: what :func:`~scheduler.core.fractional.decide` reads of it for a
    single-device share without selectors (``tenancy``: the node's, as ``decide`` is
    given it)."""
    form = FORMS.index(node.sharing) if node.sharing in FORMS else 0
    devs = node_devices(node)
    usable, used = node.usable_mask, node.used_mask
    gpus = []
    for d in devs:
        mem, milli, tasks = usage_of(node, d.index)
        bit = 1 << d.index
        ok = d.healthy and bool(usable & bit) and not (used & bit and not tasks)
        t = tenancy[d.index] if tenancy is not None and d.index < len(tenancy) else NO_TENANCY
        gpus.append(
            (d.memory_mib, milli_capacity(d), mem, milli, tasks, d.split, 1 if ok else 0, *t)
        )
    cpu_free = max(0, node.cpu_milli - node.cpu_used_milli) if node.cpu_milli else NO_CPU_BOUND
    return ShareRow(
        form,
        node.gpu_capacity,
        cpu_free,
        node.cpu_milli,
        devs[0].type if devs else "",
        tuple(gpus),
    )


def vector_request(req: ShareRequest, policy: str) -> ContainerAsk | None:
    """The one device ``req`` asks for when :func:`decide_rows` answers it exactly (one
    container asking one device, no HAMi type/UUID selector, a backend topoplace places
    on, a cacheable sharing policy), else None (use ``decide``)."""
    if req.form not in (BACKEND_HAMI, BACKEND_GPUSHARE) or req.devices != 1:
        return None
    if req.use_types or req.nouse_types or req.use_uuids or req.nouse_uuids:
        return None
    if not get_sharing_policy(policy).cacheable:
        return None
    asks = [c for c in req.containers if c.count]
    return asks[0] if len(asks) == 1 else None


@dataclass(frozen=True, slots=True)
class StateFits:
    """:func:`fit_states` of some states (row ``j`` of every array is state ``j``).

    Attributes:
        fits: the request fits some GPU of the state.
        free: per GPU, the projected free share (per mille), clamped to the exact fit.
        free_dims: per GPU, free (compute, memory) per mille, clamped likewise.
        need: the request's share there (per mille; its largest over the GPUs).
        need_dims: the request's (compute, memory) there.
        dev_fits: per GPU, the request fits it (``device_fits``).
        share_mem: per GPU, the memory (MiB) the request takes there (``resolve``).
        why: per state, why it refuses the request although a GPU has room
            (``WHY_*``: the right-sizer's limits; ``WHY_NONE``: it fits, or no room).
    """

    fits: np.ndarray
    free: IntArray
    free_dims: IntArray
    need: IntArray
    need_dims: IntArray
    dev_fits: np.ndarray
    share_mem: IntArray
    why: IntArray

    def take(self, at: IntArray) -> StateFits:
        """The fits of the states ``at`` (indices into these)."""
        return StateFits(
            self.fits[at],
            self.free[at],
            self.free_dims[at],
            self.need[at],
            self.need_dims[at],
            self.dev_fits[at],
            self.share_mem[at],
            self.why[at],
        )


def _up(part: IntArray, whole: IntArray) -> IntArray:
    """``-(-part * 1000 // whole)`` where ``whole > 0``, else 0 (``_per_mille_up``)."""
    safe = np.where(whole > 0, whole, 1)
    out: IntArray = np.where(whole > 0, -(-part * MILLI // safe), 0)
    return out


def fit_states(
    gpu: IntArray, capacity: IntArray, ask: ContainerAsk, limits: TenantLimits | None = None
) -> StateFits:
    """The fit of ``ask`` on each state, as ``decide``'s ``_fit`` computes it per node.

    Args:
        gpu: ``(states, width, len(GPU_FIELDS))`` per-GPU columns (0 beyond a state's
            GPUs).
        capacity: ``(states,)`` GPU count of each state.
        ask: the one device asked for.
        limits: the right-sizer's limits of the request (``tenancy_refusal``, vectorized).
    """
    devmem, cap = gpu[:, :, _MEM], gpu[:, :, _CAP]
    umem, umilli, tasks = gpu[:, :, _UMEM], gpu[:, :, _UMILLI], gpu[:, :, _TASKS]
    split, ok = gpu[:, :, _SPLIT], gpu[:, :, _OK] > 0
    width = gpu.shape[1]
    valid = np.arange(width)[None, :] < capacity[:, None]
    smem = (
        np.full_like(devmem, ask.memory_mib)
        if ask.memory_mib
        else devmem * ask.memory_percent // 100
    )
    milli = ask.cores * 10
    room = (
        valid
        & ok
        & ~((devmem <= 0) & (smem > 0))
        & (smem <= devmem - umem)
        & (milli <= cap - umilli)
        & ~((split > 0) & (tasks >= split))
        & ~((milli >= cap) & (tasks > 0))
        & ~((milli == 0) & (umilli >= cap))
    )
    # The right-sizer's limits (tenancy_refusal): on a GPU with tenants, at most the least
    # max_tenants among them and the request, and their p95 together within the least limit.
    tmax, tlim = gpu[:, :, _TMAX], gpu[:, :, _TLIM]
    cap_t = np.where(tmax > 0, tmax, NO_BOUND)
    lim = np.where(tlim > 0, tlim, NO_BOUND)
    own = milli
    if limits is not None:
        if limits.max_tenants:
            cap_t = np.minimum(cap_t, limits.max_tenants)
        if limits.limit_milli:
            lim = np.minimum(lim, limits.limit_milli)
        if limits.p95_milli is not None:
            own = limits.p95_milli
    busy = tasks > 0
    refuse_t = busy & (tasks + 1 > cap_t)
    refuse_c = busy & ~refuse_t & (lim < NO_BOUND) & (gpu[:, :, _TP95] + own > lim)
    fits = room & ~refuse_t & ~refuse_c
    tc = np.minimum(MILLI, _up(np.full_like(cap, milli), cap))
    tm = np.minimum(MILLI, _up(smem, devmem))
    neither = (tc == 0) & (tm == 0)
    tm = np.where(neither, 1, tm)
    m = np.minimum(MILLI, np.maximum(1, np.maximum(tc, _up(smem, devmem))))
    shared = valid & ok & (devmem > 0)
    safe_cap = np.where(cap > 0, cap, 1)
    safe_mem = np.where(devmem > 0, devmem, 1)
    fc = np.where(shared, np.maximum(0, (cap - umilli) * MILLI // safe_cap), 0)
    fm = np.where(shared, np.maximum(0, (devmem - umem) * MILLI // safe_mem), 0)
    f = np.where(shared, np.maximum(0, np.minimum(fc, fm)), 0)
    f = np.where(fits, np.maximum(f, m), np.minimum(f, m - 1))
    fc = np.where(fits, np.maximum(fc, tc), np.where(tc > 0, np.minimum(fc, tc - 1), fc))
    fm = np.where(fits, np.maximum(fm, tm), np.where(tc > 0, fm, np.minimum(fm, tm - 1)))
    free = np.where(valid, np.maximum(0, f), 0)
    dims = np.stack(
        [np.where(valid, np.maximum(0, fc), 0), np.where(valid, np.maximum(0, fm), 0)], axis=2
    )
    first = np.argmax(np.where(valid, m, -1), axis=1)
    rows = np.arange(len(capacity))
    need = m[rows, first]
    need_dims = np.stack([tc[rows, first], tm[rows, first]], axis=1)
    fit_any = fits.any(axis=1) & (capacity > 0)
    why = np.where(
        fit_any | ~room.any(axis=1),
        WHY_NONE,
        np.where((room & refuse_t).any(axis=1), WHY_TENANTS, WHY_COMPUTE_P95),
    )
    return StateFits(fit_any, free, dims, need, need_dims, fits, smem, why)


@dataclass(frozen=True, slots=True)
class StateScores:
    """The policy's verdict on some states (row ``j``: state ``j``).

    Attributes:
        fitted: the states' fits (:func:`fit_states`).
        score: the policy's score (0..100; -1 where it does not fit).
        view: the view the fitting states were scored on (None when none fits).
        at: per state, its row in ``view`` (-1 where it does not fit).
        groups: per policy call (states giving the request one share): its task, its
            ``SharingScores`` and the states it scored, in the scores' order.
        milli: the compute the request takes on a GPU (milli).
    """

    fitted: StateFits
    score: IntArray
    view: SharingClusterView | None
    at: IntArray
    groups: tuple[tuple[SharingTask, SharingScores, IntArray], ...]
    milli: int

    @property
    def fits(self) -> np.ndarray:
        """The request fits the state."""
        return self.fitted.fits


def score_states(
    sf: StateFits,
    capacity: IntArray,
    cpu_free: IntArray,
    cpu_capacity: IntArray,
    models: Sequence[str],
    ask: ContainerAsk,
    cpu_milli: int,
    dist: TypicalDistribution,
    policy_name: str,
    frag_of: FragOf | None = None,
) -> StateScores:
    """Score the states that ``ask`` fits (``sf``: :func:`fit_states`) with the sharing
    policy ``policy_name`` as ``decide`` does (one policy call per share the request takes
    there, on one projected view); each state's GPU count, free CPU, CPU capacity and
    device type as :func:`share_row` gives them. ``frag_of``: the fragmentation model of
    a target workload over device types, when a caller keeps them (a model is a pure
    function of its arguments; its memo of expected waste then carries over)."""
    n = len(capacity)
    score = np.full(n, -1, dtype=np.int64)
    at = np.full(n, -1, dtype=np.int64)
    keep = np.flatnonzero(sf.fits)
    if len(keep) == 0:
        return StateScores(sf, score, None, at, (), ask.cores * 10)
    k = len(keep)
    at[keep] = np.arange(k)
    width = sf.free.shape[1]
    view = SharingClusterView(
        names=tuple(str(int(j)) for j in keep),
        models=tuple(models[int(j)] for j in keep),
        gpu_count=capacity[keep].astype(np.int64),
        gpu_free=np.ascontiguousarray(sf.free[keep], dtype=np.int64),
        cpu_free=cpu_free[keep].astype(np.int64),
        cpu_capacity=cpu_capacity[keep].astype(np.int64),
        memory_free=np.zeros(k, dtype=np.int64),
        memory_capacity=np.zeros(k, dtype=np.int64),
        affinity=np.zeros((k, width + 1), dtype=np.int64),
        version=np.zeros(k, dtype=np.int64),
        rank=np.arange(k, dtype=np.int64),
        gpu_free_dims=np.ascontiguousarray(sf.free_dims[keep], dtype=np.int64),
    )
    frag = (frag_of or FragmentationModel.build)(dist, view.model_names)
    policy = get_sharing_policy(policy_name)
    need = sf.need[keep]
    nd = sf.need_dims[keep]
    key = (need * (MILLI + 1) + nd[:, 0]) * (MILLI + 1) + nd[:, 1]
    forms, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    groups = []
    for g, code in enumerate(forms.tolist()):
        rest, gmem = divmod(code, MILLI + 1)
        gm, gc = divmod(rest, MILLI + 1)
        members = np.flatnonzero(inverse == g)
        task = SharingTask(
            name="", cpu_milli=cpu_milli, num_gpu=1, gpu_milli=gm, gpu_dims=(gc, gmem)
        )
        result = policy.score(view, task, SharingContext(candidates=members, frag=frag))
        score[keep[result.nodes]] = result.scores
        groups.append((task, result, members))
    return StateScores(sf, score, view, at, tuple(groups), ask.cores * 10)


def name_devices(
    scored: StateScores,
    state: int,
    node: NodeInfo,
    req: ShareRequest,
    policy_name: str,
    selection_policy: str,
    tenancy: NodeTenancy | None = None,
) -> ShareDecision:
    """The decision ``decide`` gives ``node`` (in state ``state``, which fits): its
    state's score and the devices the policy named for it (``place_on_view`` on that
    node's own scores, then ``choose_devices`` with that device first; ``tenancy``: the
    node's)."""
    assert scored.view is not None
    row = int(scored.at[state])
    policy: SharingPolicy = get_sharing_policy(policy_name)
    for task, result, _ in scored.groups:
        hit = np.flatnonzero(result.nodes == row)
        if len(hit):
            j = int(hit[0])
            g = int(result.gpus[j])
            sf = scored.fitted
            if (
                g != NO_GPU
                and 0 <= g < sf.dev_fits.shape[1]
                and sf.dev_fits[state, g]
                and scored.view.gpu_free[row, g] >= task.gpu_milli
            ):
                # The policy's device, which fits: what place_on_view names and
                # choose_devices takes first (the request's share of that device).
                share = GpuShare(g, int(sf.share_mem[state, g]), scored.milli)
                got = tuple((share,) if c.count else () for c in req.containers)
                return ShareDecision(node.name, got, int(result.scores[j]))
            one = SharingScores(
                result.nodes[j : j + 1], result.scores[j : j + 1], result.gpus[j : j + 1]
            )
            first = policy_device(scored.view, task, policy, one)
            found = choose_devices(node, req, first, selection_policy, tenancy) or []
            return ShareDecision(node.name, tuple(tuple(c) for c in found), int(result.scores[j]))
    raise ValueError(f"state {state} was not scored")  # pragma: no cover - callers pass fits


@dataclass(frozen=True, slots=True)
class RowsVerdict:
    """:func:`decide_rows` over offered rows.

    Attributes:
        rows: the offered rows that fit, in the order offered.
        scores: their scores (0..100), aligned with ``rows``.
        states: their states (indices into ``scored``), aligned with ``rows``.
        no_room: the offered rows that do not fit.
        scored: the states' verdict (for :func:`name_devices`).
        why: per row of ``no_room``, ``WHY_*``: refused by the right-sizer's limits
            although a GPU has room (``WHY_NONE``: no room).
    """

    rows: IntArray
    scores: IntArray
    states: IntArray
    no_room: IntArray
    scored: StateScores
    why: IntArray

    def order(self, top: int) -> IntArray:
        """Indices into ``rows`` of the ``top`` best (highest score, ties to the lowest
        row: ``best_decision``'s order), best first."""
        n = len(self.rows)
        if top <= 0 or n == 0:
            return np.zeros(0, dtype=np.int64)
        key = (MAX_SCORE_KEY - self.scores) * (int(self.rows.max()) + 1) + self.rows
        if top < n:
            part = np.argpartition(key, top - 1)[:top]
        else:
            part = np.arange(n)
        out: IntArray = part[np.argsort(key[part], kind="stable")]
        return out


MAX_SCORE_KEY = 1 << 20
"""Above every policy score (0..100, or a baseline's beyond): sorts scores descending."""


def decide_rows(
    state_of: IntArray,
    gpu: IntArray,
    capacity: IntArray,
    cpu_free: IntArray,
    cpu_capacity: IntArray,
    models: Sequence[str],
    rows: IntArray,
    ask: ContainerAsk,
    cpu_milli: int,
    dist: TypicalDistribution,
    policy_name: str,
    fitted: FitsOf | None = None,
    limits: TenantLimits | None = None,
    frag_of: FragOf | None = None,
) -> RowsVerdict:
    """Fit and score the offered ``rows`` (of a snapshot's node order, backend and GPU
    count already checked) by their distinct states.

    Args:
        state_of: per row of the snapshot, its state id.
        gpu, capacity, cpu_free, cpu_capacity, models: per row of the snapshot (see
            :func:`share_row`).
        rows: offered rows, any order, each once (the verdict keeps their order).
        ask, cpu_milli: the request (:func:`vector_request`) and its CPU.
        dist: the target workload of the sharing policy.
        policy_name: the sharing policy.
        fitted: the fits of given states (ids, a row of each) when a caller keeps them
            (they depend on the state, ``ask`` and ``limits`` alone); else
            :func:`fit_states`.
        limits: the right-sizer's limits of the request.
        frag_of: see :func:`score_states`.
    """
    ids = state_of[rows]
    # Rows of one state are alike: any of them stands for it (no sort needed).
    width = int(ids.max()) + 1 if len(ids) else 0
    rep_of = np.zeros(width, dtype=np.int64)
    rep_of[ids] = rows
    present = np.zeros(width, dtype=bool)
    present[ids] = True
    states = np.flatnonzero(present)
    index = np.zeros(width, dtype=np.int64)
    index[states] = np.arange(len(states))
    inverse = index[ids]
    reps = rep_of[states]
    sf = (
        fitted(states, reps)
        if fitted is not None
        else fit_states(gpu[reps], capacity[reps], ask, limits)
    )
    scored = score_states(
        sf,
        capacity[reps],
        cpu_free[reps],
        cpu_capacity[reps],
        [models[int(r)] for r in reps],
        ask,
        cpu_milli,
        dist,
        policy_name,
        frag_of,
    )
    fit = scored.fits[inverse]
    why = sf.why[inverse][~fit]
    return RowsVerdict(rows[fit], scored.score[inverse][fit], inverse[fit], rows[~fit], scored, why)
