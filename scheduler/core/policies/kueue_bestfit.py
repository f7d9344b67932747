"""``kueue-bestfit``: Kueue Topology Aware Scheduling, BestFit profile.

Modelled on Kueue's TAS (KEP-2724 "Computing the assignment" and
``pkg/cache/tas_flavor_snapshot.go``; read, not copied):

* **required** level: one domain of that level must host the whole PodSet; among those that
  fit, BestFit takes the tightest (the least free capacity that still fits, ties by name);
* **preferred** level: start at that level and go up one level at a time until a single
  domain fits; if none fits even at the top, use several top-level domains;
* below the fit level, descend level by level: take child domains largest first and, for
  the last part, the tightest child that covers the rest; at node level the same;
* **no constraint** ("unconstrained" / implicit default): LeastFreeCapacity at node level,
  i.e. nodes with the least free capacity first (what Kueue does for unconstrained PodSets).

Members of different roles are placed role by role (Kueue places each PodSet separately),
heaviest first, along the same order of nodes.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gang import GangRequest
from scheduler.core.params import SchedParams
from scheduler.core.policies.common import (
    REQ_NODE,
    Descent,
    Filler,
    GangView,
    descend,
    fits,
    group_capacity,
    levels_below,
    prepare,
    refusal,
    success,
)
from scheduler.core.policies.registry import register
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot

NAME = "kueue-bestfit"
HOW = Descent(partly_used_first=False, tight=True, node_order="bestfit", exact_split=False)


def least_free_order(view: GangView, idx: np.ndarray) -> list[int]:
    """Least free capacity first (Kueue LeastFreeCapacity), ties by name."""
    p = view.primary
    return [int(x) for x in idx[np.lexsort((idx, view.slots[p][idx]))]]


def bestfit_order(view: GangView) -> list[int] | None:
    """Node order of the BestFit descent, or None when a required level cannot be met."""
    need = view.count
    allidx = np.arange(len(view.pos), dtype=np.int64)
    n_levels = len(view.levels)
    if view.required == REQ_NODE:
        return descend(view, allidx, [], need, HOW)
    if view.required >= 0:
        gid = view.group_ids(view.required)
        uq, caps, first = group_capacity(view, allidx, gid)
        ok = np.flatnonzero(fits(caps, need))
        if not len(ok):
            return None
        p = view.primary
        g = min(ok.tolist(), key=lambda x: (int(caps[p, x]), int(first[x])))
        idx = allidx[gid == uq[g]]
        return descend(view, idx, levels_below(view, view.required), need, HOW)
    if view.preferred == REQ_NODE or view.preferred >= 0:
        start = 0 if view.preferred == REQ_NODE else view.preferred
        for li in range(start, n_levels):
            gid = view.group_ids(li)
            _, caps, _ = group_capacity(view, allidx, gid)
            if fits(caps, need).any():
                return descend(view, allidx, list(range(li, -1, -1)), need, HOW)
        return descend(view, allidx, list(range(n_levels - 1, -1, -1)), need, HOW)
    return least_free_order(view, allidx)


@register(NAME)
def plan(snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams) -> PlacementResult:
    """Place the gang like Kueue TAS BestFit (pure, deterministic)."""
    prep = prepare(snapshot, gang, params, NAME, need_scope=True)
    if isinstance(prep, PlacementResult):
        return prep
    view, bounds = prep
    order = bestfit_order(view)
    if order is not None:
        f = Filler(view)
        if f.fill(order):
            return success(view, f.assignments(), NAME, bounds, status="heuristic")
    return refusal(view, NAME, bounds)
