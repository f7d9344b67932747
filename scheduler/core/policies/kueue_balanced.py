"""``kueue-balanced``: Kueue TAS BalancedPlacement (alpha ``TASBalancedPlacement``).

Modelled on Kueue's balanced placement (KEP-2724 "Balanced placement", Kueue TAS docs; read,
not copied). For a **preferred** level P, Kueue maximises the smallest number of pods any
used domain one level *below* P receives and, second, minimises the number of P domains
used, then spreads the pods as evenly as it can; it only does so when the PodSet fits in a
single domain one level *above* P, and otherwise (and for required or unconstrained
PodSets) falls back to BestFit (:mod:`kueue_bestfit`).

Here: for every candidate parent domain (one level above P, tightest first) and for the m
largest P domains inside it (m from the fewest that fit, up to two more), the children
(level below P, or nodes when P is the closest level) are sorted by capacity; using the k
largest gives a threshold ``min(c_k, n // k)``; the best (threshold, then fewest P domains,
then name) wins. Each chosen child gets the threshold and the rest is dealt out one pod at a
time to children with room, largest first. Gangs with several roles use BestFit.
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
    group_capacity,
    prepare,
    refusal,
    success,
)
from scheduler.core.policies.kueue_bestfit import bestfit_order
from scheduler.core.policies.registry import register
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot

NAME = "kueue-balanced"
EXTRA_DOMAINS = 2


def _threshold(caps: np.ndarray, n: int) -> tuple[int, int]:
    """(best threshold, children used) over the k largest children."""
    c = np.sort(caps)[::-1]
    cum = np.cumsum(c)
    best = (0, 0)
    for k in range(1, len(c) + 1):
        if cum[k - 1] < n:
            continue
        t = int(min(c[k - 1], n // k))
        if t > best[0]:
            best = (t, k)
    return best


def _deal(caps: np.ndarray, n: int, t: int, k: int) -> np.ndarray:
    """Shares per child: t for the k largest, the rest one at a time, largest first."""
    order = np.lexsort((np.arange(len(caps)), -caps))
    share = np.zeros(len(caps), dtype=np.int64)
    chosen = order[:k]
    share[chosen] = t
    left = n - t * k
    while left > 0:
        moved = False
        for i in chosen.tolist():
            if left == 0:
                break
            if share[i] < caps[i]:
                share[i] += 1
                left -= 1
                moved = True
        if not moved:
            break
    return share


def balanced_shares(view: GangView) -> list[tuple[np.ndarray, int]] | None:
    """[(candidate indices of a child domain, members it gets)] or None to fall back."""
    pref = view.preferred
    if pref < 0 or view.required != REQ_NONE or len([r for r in view.roles if r.count]) != 1:
        return None
    p = view.primary
    n = int(view.roles[p].count)
    allidx = np.arange(len(view.pos), dtype=np.int64)
    parent_level = pref + 1 if pref + 1 < len(view.levels) else None
    child_level = pref - 1 if pref >= 1 else REQ_NODE
    pgid = (
        view.group_ids(parent_level)
        if parent_level is not None
        else np.zeros(len(allidx), dtype=np.int64)
    )
    puq, pcaps, pfirst = group_capacity(view, allidx, pgid)
    parents = [g for g in range(len(puq)) if pcaps[p, g] >= n]
    if not parents:
        return None
    best: tuple[tuple[int, int, int], list[tuple[np.ndarray, int]]] | None = None
    for g in sorted(parents, key=lambda x: (int(pcaps[p, x]), int(pfirst[x]))):
        idx = allidx[pgid == puq[g]]
        dgid = view.group_ids(pref)
        duq, dcaps, dfirst = group_capacity(view, idx, dgid)
        order = sorted(range(len(duq)), key=lambda x: (-int(dcaps[p, x]), int(dfirst[x])))
        cum = np.cumsum([int(dcaps[p, x]) for x in order])
        m0 = int(np.searchsorted(cum, n)) + 1
        for m in range(m0, min(len(order), m0 + EXTRA_DOMAINS) + 1):
            doms = [duq[x] for x in order[:m]]
            sub = idx[np.isin(dgid[idx], doms)]
            cgid = view.group_ids(child_level)
            cuq, ccaps, cfirst = group_capacity(view, sub, cgid)
            t, k = _threshold(ccaps[p], n)
            if k == 0:
                continue
            key = (-t, m, int(pfirst[g]))
            if best is None or key < best[0]:
                share = _deal(ccaps[p], n, t, k)
                groups = [
                    (sub[cgid[sub] == cuq[i]], int(share[i]))
                    for i in np.lexsort((cfirst, -ccaps[p])).tolist()
                    if share[i] > 0
                ]
                best = (key, groups)
    return best[1] if best else None


@register(NAME)
def plan(snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams) -> PlacementResult:
    """Place the gang like Kueue TAS BalancedPlacement (pure, deterministic)."""
    prep = prepare(snapshot, gang, params, NAME, need_scope=True)
    if isinstance(prep, PlacementResult):
        return prep
    view, bounds = prep
    shares = balanced_shares(view)
    if shares is not None:
        f = Filler(view)
        p = view.primary
        for idx, k in shares:
            left = k
            for j in idx[np.lexsort((idx, -view.slots[p][idx]))].tolist():
                if left <= 0:
                    break
                left -= f.place_many(j, p, left)
        if f.complete():
            return success(view, f.assignments(), NAME, bounds, status="heuristic", mode="balanced")
    order = bestfit_order(view)
    if order is not None:
        f = Filler(view)
        if f.fill(order):
            return success(view, f.assignments(), NAME, bounds, status="heuristic", mode="bestfit")
    return refusal(view, NAME, bounds)
