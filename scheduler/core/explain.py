"""Why a single GPU pod goes where it goes (or stays pending), as a JSON-ready record.

Pure: a snapshot, a request, candidate positions and parameters in, a plain ``dict`` out.
The extender records only the inputs of each decision (the immutable snapshot it decided
on and the candidate positions) and calls :func:`explain` when someone asks (the inspect
API, ``topoplace explain``, the demo), so the hot path pays nothing for explanations.

The score is taken apart into points that add up to the integer prioritize returns:

* ``topology``, ``health``, ``packing``: ``10 * weight * component / sum(weights)``, the
  three components of :func:`~scheduler.core.schedule.rank_positions`;
* ``rounding``: prioritize floors ``10 * rank`` and caps every node but the engine's
  choice at 9 (this term is the floor and the cap, <= 0);
* ``choice``: the engine's choice among the candidates scores 10 whatever its rank (this
  term is ``10 - floor``; 0 for every other node).

So ``topology + health + packing + rounding + choice == score`` for every candidate, and
``(topology + health + packing) / 10`` is the node's rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.core.model import PodRequest, mask_to_indices
from scheduler.core.params import SchedParams
from scheduler.core.schedule import (
    CODE_CORDONED,
    CODE_LINK_NEVER,
    CODE_LINK_NOW,
    CODE_NO_GPUS,
    CODE_NODE_SELECTOR,
    CODE_NOT_ENOUGH_FREE,
    CODE_TOO_FEW_HEALTHY,
    CODE_UNHEALTHY,
    CODE_UNKNOWN,
    FEASIBLE,
    MAX_SCORE,
    best_position,
    choose_gpus,
    filter_codes,
    name_order,
    rank_positions,
    topology_scale,
    verdict_groups,
    verdict_reason,
)
from scheduler.core.snapshot import ClusterSnapshot

PARTS = ("topology", "health", "packing")
"""The weighted components of a node's rank, in the order they are shown."""

RUNNERS_UP = 3
"""How many runners-up an explanation lists."""

TIED_SHOWN = 8
"""How many tied node names an explanation lists (the count is always exact)."""

EXAMPLES = 3
"""Node names listed per rejection reason (the first by name; counts are always exact)."""

DIGITS = 4
"""Points are rounded to this many decimals; ``rounding`` absorbs the difference so the
rounded parts still add up to the score."""


def components(
    snap: ClusterSnapshot, req: PodRequest, pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(topology, health, packing) per position, each in 0..1: the components of
    :func:`~scheduler.core.schedule.rank_positions` (meaningful where it is >= 0)."""
    n = len(pos)
    k = req.gpus
    p = np.where(pos < 0, 0, pos)
    a = snap.arrays
    free = a.free.take(p)
    top = topology_scale(a, k)  # None unless 2 <= k <= the largest node's GPUs
    if top is not None:
        topo = a.best_bw[:, k].take(p).astype(np.float64) / top if top > 0 else np.ones(n)
    else:
        topo = np.ones(n)
    health = 1.0 - a.risk.take(p)
    packing = k / np.maximum(free, 1) if k > 0 else np.zeros(n)
    return topo, health, packing


def _weights(params: SchedParams) -> dict[str, float]:
    w = params.weights
    return {"topology": w.topology, "health": w.health, "packing": w.packing}


def _points(comp: Mapping[str, float], rank: float, score: int, params: SchedParams) -> dict:
    """The score of one node taken apart (see the module docstring)."""
    return _points_w(comp, rank, score, _weights(params))


def _points_w(comp: Mapping[str, float], rank: float, score: int, w: Mapping[str, float]) -> dict:
    """:func:`_points` with the weights (``_weights(params)``) given."""
    if rank < 0:
        return {**dict.fromkeys(PARTS, 0.0), "rounding": 0.0, "choice": 0}
    total = sum(w.values())
    pts = {k: round(MAX_SCORE * w[k] * comp[k] / total, DIGITS) for k in PARTS}
    base = min(math.floor(max(rank, 0.0) * MAX_SCORE + 1e-9), MAX_SCORE - 1)
    pts["rounding"] = round(base - sum(pts[k] for k in PARTS), DIGITS)
    pts["choice"] = score - base
    return pts


def _node_row(
    snap: ClusterSnapshot,
    req: PodRequest,
    at: int,
    comps: tuple[np.ndarray, np.ndarray, np.ndarray],
    j: int,
    rank: float,
    score: int,
    params: SchedParams,
) -> dict[str, Any]:
    node = snap.nodes[at]
    comp = {k: round(float(c[j]), DIGITS) for k, c in zip(PARTS, comps, strict=True)}
    return {
        "node": node.name,
        "score": score,
        "rank": round(rank, 6),
        "components": comp,
        "points": _points(
            {k: float(c[j]) for k, c in zip(PARTS, comps, strict=True)}, rank, score, params
        ),
        "free_gpus": node.free_gpus,
        "gpus": node.gpu_capacity,
        "product": node.labels.get("nvidia.com/gpu.product", ""),
    }


def _why_lost(
    chosen: Mapping[str, Any], other: Mapping[str, Any], cmp: int, names_first: bool
) -> str:
    """How ``other`` compares with the node the pod went to, in words. ``cmp``: the sign
    of other's rank minus the chosen node's (exact); ``names_first``: ``other``'s name
    sorts before the chosen node's."""
    if cmp == 0:
        if not names_first:
            return (
                f"tied at rank {chosen['rank']:.4f}; lost the tie-break by name to {chosen['node']}"
            )
        return (
            f"tied at rank {chosen['rank']:.4f} and first by name; "
            f"{chosen['node']} was bound instead"
        )
    if cmp > 0:
        gains = {k: other["points"][k] - chosen["points"][k] for k in PARTS}
        part = max(PARTS, key=lambda k: (gains[k], -PARTS.index(k)))
        return (
            f"ranked above {chosen['node']} ({gains[part]:.2f} points more {part}); "
            f"{chosen['node']} was bound instead"
        )
    deficits = {k: chosen["points"][k] - other["points"][k] for k in PARTS}
    part = max(PARTS, key=lambda k: (deficits[k], -PARTS.index(k)))
    return (
        f"lost on {part}: {deficits[part]:.2f} points less "
        f"({other['components'][part]:.2f} vs {chosen['components'][part]:.2f})"
    )


def _lacks(snap: ClusterSnapshot, req: PodRequest, code: int, at: int) -> str:
    """What the node at ``at`` lacks to take ``req`` (its verdict is ``code``)."""
    n = snap.nodes[at]
    a = snap.arrays
    k = req.gpus
    free, usable = int(a.free[at]), int(a.usable[at])
    if code == CODE_NOT_ENOUGH_FREE:
        return f"{k - free} more free GPU(s): {free} free of {usable} healthy, {k} requested"
    if code == CODE_TOO_FEW_HEALTHY:
        return (
            f"{k - usable} more healthy GPU(s): {usable} healthy of {n.gpu_capacity}, {k} requested"
        )
    if code in (CODE_LINK_NOW, CODE_LINK_NEVER):
        now = "free " if code == CODE_LINK_NOW else ""
        return f"a {now}{k}-GPU set linked by {req.min_link} or better"
    if code == CODE_NODE_SELECTOR:
        want = ", ".join(f"{key}={v}" for key, v in sorted(req.node_selector.items()))
        return f"labels matching the nodeSelector ({want})"
    if code == CODE_CORDONED:
        return "to be uncordoned"
    if code == CODE_NO_GPUS:
        return "GPUs"
    if code == CODE_UNHEALTHY:
        return "health: " + ", ".join(n.health.reasons or ("node unhealthy",))
    return verdict_reason(snap, code, at)


_CLOSENESS = {
    CODE_NOT_ENOUGH_FREE: 0,
    CODE_LINK_NOW: 1,
    CODE_NODE_SELECTOR: 2,
    CODE_LINK_NEVER: 3,
    CODE_TOO_FEW_HEALTHY: 4,
    CODE_CORDONED: 5,
    CODE_UNHEALTHY: 6,
    CODE_NO_GPUS: 7,
}


def _closest(
    snap: ClusterSnapshot, req: PodRequest, pos: np.ndarray, codes: np.ndarray
) -> dict[str, Any] | None:
    """The failing candidate that comes closest to taking the pod, and what it lacks:
    "not now" verdicts before "never", then most free GPUs, most healthy GPUs, name."""
    best: tuple[Any, ...] | None = None
    a = snap.arrays
    for j in np.flatnonzero((codes != FEASIBLE) & (codes != CODE_UNKNOWN)).tolist():
        at = int(pos[j])
        c = int(codes[j])
        key = (
            _CLOSENESS.get(c, 9),
            -int(a.free[at]),
            -int(a.usable[at]),
            snap.nodes[at].name,
            c,
            at,
        )
        if best is None or key < best:
            best = key
    if best is None:
        return None
    c, at = best[4], best[5]
    return {
        "node": snap.nodes[at].name,
        "verdict": verdict_reason(snap, c, at),
        "lacks": _lacks(snap, req, c, at),
        "free_gpus": int(a.free[at]),
    }


def occupancy(snap: ClusterSnapshot, node: str, gpus: Sequence[int]) -> dict[str, Any]:
    """GPU use of ``node`` before the decision and after it takes ``gpus``."""
    n = snap.node(node)
    if n is None:
        return {}
    used = mask_to_indices(n.used_mask)
    bad = mask_to_indices(n.health.bad_mask)
    after = sorted(set(used) | set(gpus))
    return {
        "capacity": n.gpu_capacity,
        "used_before": list(used),
        "used_after": after,
        "unhealthy": list(bad),
        "pods_before": sorted(p.key for p in snap.pods_on(node) if p.gpus),
    }


def explain(
    snap: ClusterSnapshot,
    req: PodRequest,
    pos: np.ndarray,
    params: SchedParams,
    verb: str = "filter",
    chosen: str | None = None,
    runners_up: int = RUNNERS_UP,
) -> dict[str, Any]:
    """The decision for ``req`` among the candidates at ``pos`` (-1: unknown node), taken
    apart.

    ``verb`` "filter" ranks the candidates that pass the filter (the engine's choice is
    among them, as :func:`~scheduler.core.schedule.narrow_to_choice`); "prioritize"
    scores every candidate as :func:`~scheduler.core.schedule.score_positions` does
    (kube-scheduler sends prioritize only the nodes its filters passed). ``chosen``: the
    node the pod was bound to, when known (it may differ from the engine's choice when
    kube-scheduler's own scores overruled it); default the engine's choice.

    Returns a JSON-ready dict: ``outcome`` ("placed" or "pending"), ``chosen`` (node,
    score, rank, components, points, GPUs, occupancy before / after, whether it is the
    engine's choice), ``runners_up`` (the next best with their points and why each lost),
    ``ties`` (how many shared the top rank and how the tie was broken), ``failed`` and
    ``unresolvable`` (reason -> node count), ``closest`` (pending: the failing node that
    comes closest and what it lacks), ``weights``, ``summary`` (one line).
    """
    pos = np.asarray(pos, dtype=np.int64)
    codes = filter_codes(snap, req, pos, params)
    rank = rank_positions(snap, req, pos, params).copy()
    if verb != "prioritize":
        rank[codes != FEASIBLE] = -1.0
    best = best_position(snap, pos, rank)
    scores = np.clip(np.floor(np.maximum(rank, 0.0) * MAX_SCORE + 1e-9), 0, MAX_SCORE - 1)
    scores = scores.astype(np.int64)
    if best >= 0:
        scores[best] = MAX_SCORE
    comps = components(snap, req, pos)
    failed: dict[str, int] = {}
    unresolvable: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    order = name_order(snap)
    for never, reason, idx in verdict_groups(snap, pos, codes):
        target = unresolvable if never else failed
        target[reason] = target.get(reason, 0) + len(idx)
        at = pos.take(idx)
        at = at[at >= 0]
        first = at[np.argsort(order.take(at), kind="stable")[:EXAMPLES]]
        examples.setdefault(reason, []).extend(snap.nodes[int(i)].name for i in first.tolist())
    out: dict[str, Any] = {
        "pod": req.key,
        "verb": verb,
        "request": {
            "gpus": req.gpus,
            "min_link": req.min_link,
            "gang": req.gang,
            "node_selector": dict(req.node_selector),
        },
        "weights": _weights(params),
        "selection_policy": params.selection_policy,
        "candidates": len(pos),
        "feasible": int((codes == FEASIBLE).sum()),
        "failed": dict(sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))),
        "unresolvable": dict(sorted(unresolvable.items(), key=lambda kv: (-kv[1], kv[0]))),
        "examples": {r: sorted(v)[:EXAMPLES] for r, v in sorted(examples.items())},
        "generation": snap.generation,
    }
    # The node explained: the one the pod went to, else the engine's choice.
    j = best
    if chosen is not None:
        hits = np.flatnonzero(pos == snap.index.get(chosen, -2))
        j = int(hits[0]) if len(hits) else -1
    if j < 0 or rank[j] < 0:
        out["outcome"] = "pending"
        out["chosen"] = None
        out["closest"] = _closest(snap, req, pos, codes)
        out["runners_up"] = []
        out["ties"] = {"count": 0, "broken_by": ""}
        if chosen is not None and j >= 0:
            out["closest"] = {
                "node": chosen,
                "verdict": verdict_reason(snap, int(codes[j]), int(pos[j])),
                "lacks": _lacks(snap, req, int(codes[j]), int(pos[j])),
                "free_gpus": int(snap.arrays.free[int(pos[j])]),
            }
        out["summary"] = summary_line(out)
        return out
    at = int(pos[j])
    row = _node_row(snap, req, at, comps, j, float(rank[j]), int(scores[j]), params)
    node = snap.nodes[at].name
    gs = choose_gpus(snap, req, node, params)
    row["engine_choice"] = j == best
    row["gpus_chosen"] = list(gs.gpus)
    row["bottleneck_gbps"] = gs.bottleneck_gbps
    row["occupancy"] = occupancy(snap, node, gs.gpus)
    out["outcome"] = "placed"
    out["chosen"] = row
    # Ties at the top rank and the runners-up, best first (ties by name, as the engine).
    top = rank[j]
    tied = np.flatnonzero(rank == top)
    tied_names = sorted(snap.nodes[int(pos[t])].name for t in tied.tolist())
    out["ties"] = {
        "count": len(tied),
        "broken_by": (
            ""
            if len(tied) < 2
            else "lowest node name"
            if j == best
            else "its scheduler (not the engine's choice)"
        ),
        "tied": tied_names[:TIED_SHOWN],
    }
    ok = np.flatnonzero((rank >= 0) & (np.arange(len(pos)) != j))
    if len(ok):
        keys = np.lexsort((order.take(pos.take(ok)), -rank.take(ok)))
        ok = ok[keys[:runners_up]]
    rows = []
    for r in ok.tolist():
        other = _node_row(snap, req, int(pos[r]), comps, r, float(rank[r]), int(scores[r]), params)
        cmp = int(np.sign(rank[r] - rank[j]))
        other["why_lost"] = _why_lost(row, other, cmp, other["node"] < row["node"])
        rows.append(other)
    out["runners_up"] = rows
    out["closest"] = None
    out["summary"] = summary_line(out)
    return out


def summarize(
    snap: ClusterSnapshot,
    req: PodRequest,
    pos: np.ndarray,
    params: SchedParams,
    verb: str = "filter",
    chosen: str | None = None,
    basis: tuple[np.ndarray, np.ndarray] | None = None,
) -> str:
    """``explain(...)["summary"]`` for a placed pod, computing only what the line shows
    (the chosen node's parts, the tie count, the runner-up): a few vector operations over
    the candidates and scalar arithmetic for the (at most two) nodes shown, for bind,
    which writes it into the placement record. "" when the pod would not be placed (a pod
    that binds was placed).

    ``basis``: the filter's own ``(codes, rank)`` for these positions (``rank`` as
    :func:`~scheduler.core.schedule.narrow_with_rank` returns it: -1 where infeasible), so
    that a filter decision is not ranked a second time; the line is the same.

    The same numbers as :func:`explain`, by the same float operations on the same values:
    the engine's choice is :func:`~scheduler.core.schedule.best_position` (highest rank,
    then lowest name), and the runner-up is the best of the others, which is the engine's
    choice when the pod goes elsewhere, the next by name among those tied with the choice,
    or else the best below it."""
    pos = np.asarray(pos, dtype=np.int64)
    if basis is not None and verb != "prioritize":
        rank = basis[1]  # -1 already wherever the filter's codes are not FEASIBLE
    else:
        rank = rank_positions(snap, req, pos, params)
        if verb != "prioritize":
            rank = np.where(filter_codes(snap, req, pos, params) == FEASIBLE, rank, -1.0)
    if not len(rank):
        return ""
    peak = rank.max()
    if peak < 0:
        return ""  # nothing can take the pod: neither the engine's choice nor ``chosen``
    tied = np.flatnonzero(rank == peak)
    names = None
    if len(tied) == 1:
        best = int(tied[0])
    else:
        names = name_order(snap).take(pos.take(tied))
        first = int(np.argmin(names))
        best = int(tied[first])
    j = best
    if chosen is not None:
        want = snap.index.get(chosen, -2)
        if int(pos[best]) != want:  # else the first position of ``chosen`` is ``best``
            hits = np.flatnonzero(pos == want)
            j = int(hits[0]) if len(hits) else -1
    if j < 0 or rank[j] < 0:
        return ""
    top = float(rank[j])
    if j != best:
        count = int(np.count_nonzero(rank == rank[j]))
        r = best  # the highest rank, lowest name: the best of the others
    elif names is not None:
        count = len(tied)
        rest = names.copy()
        rest[first] = np.iinfo(rest.dtype).max
        r = int(tied[int(np.argmin(rest))])  # the next by name among the tied
    else:
        count = 1
        others = rank.copy()
        others[j] = -1.0
        r = best_position(snap, pos, others)
    w = _weights(params)
    scale = _scale(snap.arrays, req.gpus)
    c = _line_row(snap, req, int(pos[j]), top, _score(j, best, top), w, scale)
    c["engine_choice"] = j == best
    runners = []
    if r >= 0:
        rr = float(rank[r])
        other = _line_row(snap, req, int(pos[r]), rr, _score(r, best, rr), w, scale)
        cmp = (rr > top) - (rr < top)
        other["why_lost"] = _why_lost(c, other, cmp, other["node"] < c["node"])
        runners.append(other)
    broken = "lowest node name" if j == best else "its scheduler (not the engine's choice)"
    return summary_line(
        {
            "chosen": c,
            "ties": {"count": count, "broken_by": broken if count > 1 else ""},
            "runners_up": runners,
        }
    )


def _score(i: int, best: int, rank: float) -> int:
    """What prioritize scores the candidate ``i`` of ``rank`` >= 0 (``best``: the engine's
    choice), as :func:`~scheduler.core.schedule.score_positions`."""
    return MAX_SCORE if i == best else min(math.floor(rank * MAX_SCORE + 1e-9), MAX_SCORE - 1)


_SCALES: list[tuple[Any, int, Any]] = []
"""(node arrays, set size, :func:`topology_scale`) of the latest summaries: see
:func:`_scale`."""

_SCALES_SIZE = 4


def _scale(a: Any, k: int) -> Any:
    """``topology_scale(a, k)``, a maximum over every node, computed once per node arrays
    version and set size: the arrays are read-only and compared by identity (an entry
    holds them, so their id cannot be reused while it is looked up), and ``k`` by value;
    sizes the topology component does not use need no maximum (None)."""
    if k < 2 or k > a.max_gpus:
        return None
    for arrays, size, top in _SCALES:
        if arrays is a and size == k:
            return top
    top = topology_scale(a, k)
    _SCALES[:] = [(a, k, top), *_SCALES[: _SCALES_SIZE - 1]]
    return top


def _line_row(
    snap: ClusterSnapshot,
    req: PodRequest,
    at: int,
    rank: float,
    score: int,
    w: Mapping[str, float],
    scale: Any,
) -> dict[str, Any]:
    """The part of :func:`_node_row` a summary line reads, for the node at ``at``: its
    components as :func:`components` computes them, element by element (the same
    floats), from scalars."""
    a = snap.arrays
    k = req.gpus
    p = at if at >= 0 else 0
    topo = float(a.best_bw[p, k]) / scale if scale else 1.0
    health = 1.0 - float(a.risk[p])
    packing = k / max(int(a.free[p]), 1) if k > 0 else 0.0
    comp = {"topology": topo, "health": health, "packing": packing}
    return {
        "node": snap.nodes[at].name,
        "score": score,
        "rank": round(rank, 6),
        "components": {key: round(v, DIGITS) for key, v in comp.items()},
        "points": _points_w(comp, rank, score, w),
    }


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def summary_line(exp: Mapping[str, Any]) -> str:
    """One line for people (and for the placement record): the score taken apart, the
    runner-up and why it lost, or why the pod is pending."""
    c = exp.get("chosen")
    if not c:
        reasons = dict(exp.get("failed") or {})
        reasons.update(exp.get("unresolvable") or {})
        top = "; ".join(f"{n}x {r}" for r, n in list(reasons.items())[:3])
        close = exp.get("closest")
        near = f"; closest {close['node']} lacks {close['lacks']}" if close else ""
        return f"pending: 0/{exp.get('candidates', 0)} nodes fit ({top}){near}"
    p = c["points"]
    parts = " + ".join(f"{k} {_fmt(p[k])}" for k in PARTS)
    extra = ""
    if p["rounding"]:
        extra += f" {'-' if p['rounding'] < 0 else '+'} rounding {_fmt(abs(p['rounding']))}"
    if p["choice"]:
        extra += f" + choice {p['choice']}"
    line = f"{c['node']} score {c['score']} = {parts}{extra}"
    ties = exp.get("ties") or {}
    if ties.get("count", 0) > 1:
        line += f"; {ties['count']} tied, {ties['broken_by']} wins"
    ru = exp.get("runners_up") or []
    if ru:
        line += f"; runner-up {ru[0]['node']} ({ru[0]['score']}): {ru[0]['why_lost']}"
    if not c.get("engine_choice", True):
        line += "; not the engine's choice"
    return line
