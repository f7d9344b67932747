"""``kai-binpack``: KAI-Scheduler-style topology placement with bin-packing.

Modelled on NVIDIA KAI-Scheduler's topology plugin (``pkg/scheduler/plugins/topology``;
read, not copied): the plugin counts how many of the job's pods each topology domain can
allocate (per node: how many copies of the largest pod fit), then walks the relevant
levels from the *preferred* level up to the *required* one (only the required level when
no preference is given) and stops at the first level where some domain can allocate the
whole job. Here the domain chosen at that level is the bin-packing one, i.e. the domain
with the fewest allocatable pods that still fits (ties by name), and inside it nodes are
filled most-allocated first (KAI's default ``binpack`` node placement). Without any
topology constraint the whole cluster is bin-packed. If a preference cannot be met at any
level below the top and nothing is required, the domain found higher up is narrowed to its
fewest largest children (KAI's ``improveChoiceForPreference``) and bin-packed.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gang import GangRequest
from scheduler.core.params import SchedParams
from scheduler.core.policies.common import (
    REQ_NODE,
    REQ_NONE,
    Filler,
    GangView,
    fits,
    group_capacity,
    prepare,
    refusal,
    success,
)
from scheduler.core.policies.registry import register
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot

NAME = "kai-binpack"
MAX_DOMAINS = 16


def binpack_order(view: GangView, idx: np.ndarray) -> list[int]:
    """Most allocated first (fewest free GPUs), ties by name."""
    return [int(x) for x in idx[np.lexsort((idx, view.free[idx]))]]


def relevant_levels(view: GangView) -> list[int]:
    """Level indices from the preferred level up to the required one (KAI's walk)."""
    req, pref = view.required, view.preferred
    if req == REQ_NODE:
        return [REQ_NODE]
    top = req if req >= 0 else len(view.levels) - 1
    if pref == REQ_NODE:
        return [REQ_NODE] + list(range(0, top + 1))
    if pref >= 0 and (req < 0 or pref <= req):
        return list(range(pref, top + 1))
    return [req] if req >= 0 else []


def _children_subset(view: GangView, idx: np.ndarray, child: int, need: np.ndarray) -> np.ndarray:
    """Candidates of the largest child domains (capacity order) that together fit."""
    p = view.primary
    cgid = view.group_ids(child)
    cuq, ccaps, cfirst = group_capacity(view, idx, cgid)
    order = sorted(range(len(cuq)), key=lambda g: (-int(ccaps[p, g]), int(cfirst[g])))
    take: list[int] = []
    total = np.zeros_like(need)
    for g in order:
        take.append(int(cuq[g]))
        total = total + ccaps[:, g]
        if np.all(total >= need):
            break
    out: np.ndarray = idx[np.isin(cgid[idx], take)]
    return out


@register(NAME)
def plan(snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams) -> PlacementResult:
    """Place the gang the KAI way with bin-packing (pure, deterministic)."""
    prep = prepare(snapshot, gang, params, NAME, need_scope=True)
    if isinstance(prep, PlacementResult):
        return prep
    view, bounds = prep
    need = view.count
    allidx = np.arange(len(view.pos), dtype=np.int64)
    p = view.primary
    for li in relevant_levels(view):
        gid = view.group_ids(li)
        uq, caps, first = group_capacity(view, allidx, gid)
        ok = np.flatnonzero(fits(caps, need))
        if not len(ok):
            continue
        ranked = sorted(ok.tolist(), key=lambda g: (int(caps[p, g]), int(first[g])))
        for g in ranked[:MAX_DOMAINS]:
            idx = allidx[gid == uq[g]]
            if view.preferred >= 0 and li > view.preferred:
                # KAI's improveChoiceForPreference: the preferred level was not met, so
                # use the fewest children of the chosen domain, largest first.
                idx = _children_subset(view, idx, li - 1, need)
            f = Filler(view)
            if f.fill(binpack_order(view, idx)):
                return success(view, f.assignments(), NAME, bounds, status="heuristic")
        if view.required != REQ_NONE and li == (view.required if view.required >= 0 else REQ_NODE):
            return refusal(view, NAME, bounds)
    if view.required == REQ_NONE:
        f = Filler(view)
        if f.fill(binpack_order(view, allidx)):
            return success(view, f.assignments(), NAME, bounds, status="heuristic")
    return refusal(view, NAME, bounds)
