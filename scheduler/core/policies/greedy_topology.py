"""``greedy-topology``: a fast topology heuristic (also the CP-SAT fallback and hint).

Algorithm (one pass, no search):

1. Candidate scopes: with a required level, every domain of that level that can host the
   whole gang (its summed per-node capacity covers each role), tried tightest first and
   partly used before untouched; without one, the whole cluster.
2. Inside a scope, descend the fabric from the coarsest level to the finest: at each level,
   if one domain can host the (remaining) gang, take the tightest such domain, preferring
   domains already partly used (so whole domains such as NVL72 racks stay free for the
   gangs that need them); otherwise take the fewest domains and, inside them, the fewest
   child domains (an exact max-plus dynamic programme over domains and their sorted child
   capacities), falling back to largest first with the tightest domain for the last part
   (Kueue's BestFit trick) when levels are not nested.
3. At node level, fill holes first: nodes with the fewest free GPUs (healthy before
   degraded), then name order. Members are placed one by one with exact accounting.

It is optimal for the domain count at the coarsest level whenever one domain suffices, and
usually close elsewhere; CP-SAT improves on it and proves bounds.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gang import GangRequest
from scheduler.core.params import SchedParams
from scheduler.core.policies.common import (
    REQ_NONE,
    Bounds,
    Descent,
    Filler,
    GangView,
    descend,
    levels_below,
    prepare,
    refusal,
    success,
)
from scheduler.core.policies.registry import register
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot

NAME = "greedy-topology"
MAX_SCOPES = 16
"""Required-level domains tried before giving up (each try is a full first-fit pass)."""

HOW = Descent(partly_used_first=True, tight=True, node_order="holes", exact_split=True)


def scope_order(view: GangView, bounds: Bounds) -> list[np.ndarray]:
    """Candidate scopes, best first: partly used before untouched, tightest, name order."""
    p = view.primary
    scopes = list(bounds.scopes)

    def key(idx: np.ndarray) -> tuple[bool, int, int]:
        return (bool(view.untouched[idx].all()), int(view.slots[p][idx].sum()), int(idx.min()))

    return sorted(scopes, key=key)


def greedy_fill(view: GangView, bounds: Bounds, how: Descent = HOW) -> Filler | None:
    """The greedy placement as a complete :class:`Filler`, or None."""
    need = view.count
    below = levels_below(view, view.required)
    scopes = scope_order(view, bounds) if view.required != REQ_NONE else list(bounds.scopes)
    for idx in scopes[:MAX_SCOPES]:
        order = descend(view, idx, below, need, how)
        f = Filler(view)
        if f.fill(order):
            return f
    return None


@register(NAME)
def plan(snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams) -> PlacementResult:
    """Place the gang with the greedy topology heuristic (pure, deterministic)."""
    prep = prepare(snapshot, gang, params, NAME)
    if isinstance(prep, PlacementResult):
        return prep
    view, bounds = prep
    f = greedy_fill(view, bounds)
    if f is None:
        return refusal(view, NAME, bounds)
    return success(view, f.assignments(), NAME, bounds, status="heuristic")
