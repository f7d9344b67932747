"""``first-fit``: the naive baseline.

Nodes in name order, each member on the first node with room (heaviest roles first). With a
required level, the first domain of that level (by its first node's name) that can host
the whole gang. No topology preference beyond the hard constraint, no health preference
beyond exclusion: this is what a gang scheduler without topology awareness does
(coscheduling's PreFilter + default scoring, roughly).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gang import GangRequest
from scheduler.core.params import SchedParams
from scheduler.core.policies.common import (
    REQ_NONE,
    Filler,
    prepare,
    refusal,
    success,
)
from scheduler.core.policies.registry import register
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot

NAME = "first-fit"


@register(NAME)
def plan(snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams) -> PlacementResult:
    """Place the gang first-fit in node-name order (pure, deterministic)."""
    prep = prepare(snapshot, gang, params, NAME)
    if isinstance(prep, PlacementResult):
        return prep
    view, bounds = prep
    scopes = list(bounds.scopes)
    if view.required != REQ_NONE:
        scopes.sort(key=lambda idx: int(idx.min()))
    for idx in scopes:
        f = Filler(view)
        if f.fill(np.sort(idx).tolist()):
            return success(view, f.assignments(), NAME, bounds, status="heuristic")
    return refusal(view, NAME, bounds)
