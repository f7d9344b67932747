"""Single-pod decisions: filter, score, choose GPUs, and whole-cluster placement.

Every function is pure: a snapshot, a request and parameters in, a value out. The filter
and score paths are vectorized over the snapshot's node arrays; only failing nodes (for
their reason strings) and the final answer touch Python objects per node.

Reason strings are constants (see ``REASON_*``), so kube-scheduler's "0/N nodes are
available" message aggregates them. "Not now" (FailedNodes: freeing GPUs could help) and
"never" (FailedAndUnresolvableNodes: broken, cordoned, or too small even when empty) are
kept apart, as kube-scheduler's preemption depends on the difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations, compress
from types import MappingProxyType
from typing import Any

import numpy as np

from scheduler.core.linkclass import _qualifying_subsets, class_rank, feasible_sizes
from scheduler.core.model import EMPTY_MAP, Health, PodRequest, mask_to_indices
from scheduler.core.params import SchedParams
from scheduler.core.snapshot import (
    BLOCKED_CORDONED,
    BLOCKED_NO_GPUS,
    BLOCKED_SHARED,
    BLOCKED_UNHEALTHY,
    ClusterSnapshot,
    arrays_parent,
)
from topology.select import GpuSet, ring_bottleneck, select_gpus

REASON_UNKNOWN_NODE = "node unknown to topoplace"
REASON_NO_GPUS = "node has no GPUs"
REASON_TOO_FEW_HEALTHY = "node has fewer healthy GPUs than requested"
REASON_LINK_NEVER = "no GPU set on this node meets the required link"
REASON_NOT_ENOUGH_FREE = "not enough free healthy GPUs"
REASON_LINK_NOW = "no free GPU set meets the required link"
REASON_CORDONED = "node cordoned"
REASON_NODE_SELECTOR = "node does not match the pod's nodeSelector"
REASON_NO_FEASIBLE_NODE = "no node can take the pod"
REASON_NOT_CHOSEN = "another node suits the pod better"
REASON_REPLICA_NODE = (
    "node shares its GPUs as time-slicing/MPS replicas (only pods that opt in take them)"
)

MAX_SCORE = 10


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    """Per-node verdicts for one pod.

    Attributes:
        feasible: node names that can take the pod, in request order.
        failed: node -> reason where waiting or preempting could help.
        unresolvable: node -> reason where it cannot help.
    """

    feasible: tuple[str, ...]
    failed: Mapping[str, str]
    unresolvable: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Assignment:
    """One pod placed on one node with concrete GPU indices."""

    pod: str
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """Result of planning one pod or a whole gang.

    Attributes:
        ok: True when every pod of the request has an assignment.
        assignments: one per pod (empty on refusal); all-or-nothing.
        reason: why not, in words a user can act on ("" when ok).
        failed / unresolvable: per-node reasons (single-pod decisions).
        details: policy-specific record (solver status, objective, bound, gap, time,
            domains used, collective bandwidth, parameters), JSON-serializable.
    """

    ok: bool
    assignments: tuple[Assignment, ...] = ()
    reason: str = ""
    failed: Mapping[str, str] = field(default_factory=lambda: EMPTY_MAP)
    unresolvable: Mapping[str, str] = field(default_factory=lambda: EMPTY_MAP)
    details: Mapping[str, Any] = field(default_factory=dict)


_POSITIONS_MEMO: list[tuple[Mapping[str, int], list[str], np.ndarray, bool]] = []
"""Most recent (snapshot index, names, positions, all known) first. kube-scheduler sends
the same candidate list for pod after pod (and to filter then prioritize), and comparing
two lists of equal strings is far cheaper than hashing thousands of freshly parsed names.
Entries keep their index alive, so identity comparison is safe; a rebuilt snapshot index
(nodes added or removed) never matches an old entry. Results are identical with or
without it. Lists that find their own positions (see :func:`_lookup`) are not kept here:
they remember their positions themselves."""

_POSITIONS_MEMO_SIZE = 4


def _lookup(snap: ClusterSnapshot, names: Sequence[str]) -> tuple[np.ndarray, bool]:
    """(positions of ``names`` in the snapshot with -1 for unknown names (read-only),
    whether every name is known).

    A sequence that knows its own positions is asked first: one with a method
    ``positions_in(index)`` returning (read-only int64 positions with -1 for unknown
    names, all known), or None to be looked up here. It must be read-only and answer
    exactly what the lookup below would; the extender's wire layer hands over such lists
    (``CandidateNames``, whose positions are found from the request bytes without a
    Python string per name). Otherwise the common case (every name known) runs at C
    speed through ``map``; only a request naming an unknown node pays for a per-name
    default.
    """
    index = snap.index
    resolve = getattr(names, "positions_in", None)
    found = resolve(index) if resolve is not None else None
    if found is not None:
        return found  # type: ignore[no-any-return]
    as_list = names if isinstance(names, list) else list(names)
    for idx, cached, pos, known in tuple(_POSITIONS_MEMO):
        if idx is index and len(cached) == len(as_list) and cached == as_list:
            return pos, known
    known = True
    try:
        pos = np.fromiter(map(index.__getitem__, as_list), dtype=np.int64, count=len(as_list))
    except KeyError:
        get = index.get
        pos = np.fromiter((get(n, -1) for n in as_list), dtype=np.int64, count=len(as_list))
        known = False
    pos.flags.writeable = False
    _POSITIONS_MEMO.insert(0, (index, list(as_list), pos, known))  # a copy: callers may mutate
    del _POSITIONS_MEMO[_POSITIONS_MEMO_SIZE:]
    return pos, known


def name_positions(snap: ClusterSnapshot, names: Sequence[str]) -> np.ndarray:
    """Positions of ``names`` in the snapshot's node order, -1 for unknown names.

    The array is read-only and may be shared between calls.
    """
    return _lookup(snap, names)[0]


def known_positions(snap: ClusterSnapshot, names: Sequence[str]) -> np.ndarray | None:
    """:func:`name_positions` when every name is known, else None."""
    pos, known = _lookup(snap, names)
    return pos if known else None


# Filter verdict codes, in precedence order: a node gets the first that applies.
FEASIBLE = 0
CODE_UNKNOWN = 1
CODE_UNHEALTHY = BLOCKED_UNHEALTHY
"""The reason of an unhealthy node is its own first health reason (see :func:`verdict_reason`)."""
CODE_CORDONED = BLOCKED_CORDONED
CODE_NO_GPUS = BLOCKED_NO_GPUS
CODE_TOO_FEW_HEALTHY = 5
CODE_LINK_NEVER = 6
CODE_NOT_ENOUGH_FREE = 7
CODE_LINK_NOW = 8
CODE_NODE_SELECTOR = 9
CODE_NOT_CHOSEN = 10
"""Feasible, but the engine chose another candidate (see :func:`narrow_to_choice`)."""
ROOM_CODES = np.array([CODE_NOT_ENOUGH_FREE, CODE_LINK_NOW])
"""Codes of a node refused only because the GPUs the pod could use are taken (not for
its hardware, health or labels): where preempting could help."""
CODE_REPLICA_NODE = BLOCKED_SHARED
"""A time-slicing / MPS replica node: no whole GPU to give (``scheduler.core.replicas``)."""

FILTER_VERDICTS: Mapping[int, tuple[bool, str]] = MappingProxyType(
    {
        CODE_UNKNOWN: (False, REASON_UNKNOWN_NODE),
        CODE_UNHEALTHY: (True, "node unhealthy"),
        CODE_CORDONED: (True, REASON_CORDONED),
        CODE_NO_GPUS: (True, REASON_NO_GPUS),
        CODE_TOO_FEW_HEALTHY: (True, REASON_TOO_FEW_HEALTHY),
        CODE_LINK_NEVER: (True, REASON_LINK_NEVER),
        CODE_NOT_ENOUGH_FREE: (False, REASON_NOT_ENOUGH_FREE),
        CODE_LINK_NOW: (False, REASON_LINK_NOW),
        CODE_NODE_SELECTOR: (True, REASON_NODE_SELECTOR),
        CODE_NOT_CHOSEN: (False, REASON_NOT_CHOSEN),
        CODE_REPLICA_NODE: (True, REASON_REPLICA_NODE),
    }
)
"""Failing code -> (unresolvable, reason). Unresolvable verdicts go to
FailedAndUnresolvableNodes ("never"), the others to FailedNodes ("not now")."""


def verdict_reason(snap: ClusterSnapshot, code: int, position: int) -> str:
    """The reason string of a failing ``code`` for the node at ``position``."""
    if code == CODE_UNHEALTHY:
        reasons = snap.nodes[position].health.reasons
        return reasons[0] if reasons else FILTER_VERDICTS[code][1]
    return FILTER_VERDICTS[code][1]


def _known(pos: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(mask of unknown positions or None if all are known, positions safe to index with:
    unknown ones read node 0 and must be masked by the caller)."""
    unknown = pos < 0
    if not unknown.any():
        return None, pos
    return unknown, np.where(unknown, 0, pos)


def filter_codes(
    snap: ClusterSnapshot, req: PodRequest, pos: np.ndarray, params: SchedParams
) -> np.ndarray:
    """One verdict code per position (``FEASIBLE`` or a key of :data:`FILTER_VERDICTS`).

    ``pos`` are node positions in the snapshot (-1: unknown node), as from
    :func:`name_positions`. The whole decision is array operations over the snapshot's
    node arrays. A pod that requests no GPUs is feasible everywhere, unknown nodes
    included: topoplace has nothing to add for it.
    """
    n = len(pos)
    k = req.gpus
    if k <= 0 or not n:
        return np.zeros(n, dtype=np.int8)
    unknown, p = _known(pos)
    a = snap.arrays
    every = _for_all_nodes(_CODES_MEMO, (a, k, req.min_link), n, len(a.free))
    if every is None:
        code = _codes_at(a, k, req.min_link, p)
    else:
        if not len(every):
            every[:] = [_every_codes(a, k, req.min_link)]
        code = every[0].take(p)
    if unknown is not None:
        code[unknown] = CODE_UNKNOWN
    if req.node_selector:
        for j in np.flatnonzero(code == 0).tolist():
            if not selector_matches(snap.nodes[p[j]].labels, req.node_selector):
                code[j] = CODE_NODE_SELECTOR
    return code


_CODES_MEMO: list[tuple[tuple[Any, ...], list[np.ndarray]]] = []
"""Verdicts of every node, by (node arrays, GPUs, link class), most recent first: see
:func:`_for_all_nodes`."""

_RANK_MEMO: list[tuple[tuple[Any, ...], list[np.ndarray]]] = []
"""Ranks of every node, by (node arrays, GPUs, link class, weights): see
:func:`_for_all_nodes`."""

_ALL_NODES_MEMO_SIZE = 4


def _for_all_nodes(
    memo: list[tuple[tuple[Any, ...], list[np.ndarray]]], key: tuple[Any, ...], n: int, nodes: int
) -> list[np.ndarray] | None:
    """The memo entry of ``key`` (a list holding the per-node array once computed), or
    None when ``n`` positions are better computed one by one.

    A per-node value depends only on the immutable node arrays (``key[0]``, compared by
    identity; entries hold it, so identity is safe) and the request's shape, never on
    which nodes were asked about. When a request asks about at least half the nodes
    (kube-scheduler names every node on a large cluster, to filter and to prioritize),
    the value is computed for every node once per arrays version and read by position:
    the same floats and codes, and the next request of the same shape on the same
    snapshot (prioritize after filter, the next pod on an unchanged cluster) reads them.
    """
    for entry in memo:
        k = entry[0]
        if k[0] is key[0] and k[1:] == key[1:]:
            return entry[1]
    if 2 * n < nodes:
        return None
    out: list[np.ndarray] = []
    memo.insert(0, (key, out))
    del memo[_ALL_NODES_MEMO_SIZE:]
    return out


_DERIVE_STEPS = 8
"""How many row updates back :func:`_ancestor` looks for values to bring up to date."""


def _ancestor(
    memo: list[tuple[tuple[Any, ...], list[np.ndarray]]], a: Any, shape: tuple[Any, ...]
) -> tuple[list[np.ndarray], np.ndarray] | None:
    """Per-node values memoized for arrays ``a`` descends from by recent row updates
    (``snapshot.arrays_parent``) with the same request ``shape``, and the rows that may
    differ since (sorted positions); None when there are none or too many rows."""
    rows: set[int] = set()
    cur = a
    for _ in range(_DERIVE_STEPS):
        parent = arrays_parent(cur)
        if parent is None:
            return None
        cur, changed = parent
        rows.update(changed)
        if 8 * len(rows) > len(a.free):
            return None
        for key, values in memo:
            if key[0] is cur and key[1:] == shape and values:
                return values, np.array(sorted(rows), dtype=np.int64)
    return None


def _every_codes(a: Any, k: int, min_link: str) -> np.ndarray:
    """:func:`_codes_at` for every node (read-only): brought up to date from an
    ancestor's codes where one is memoized (only the changed rows recomputed, the same
    codes), else computed for every node."""
    found = _ancestor(_CODES_MEMO, a, (k, min_link))
    if found is None:
        return _codes_at(a, k, min_link, None)
    (old,), rows = found
    code = old.copy()
    code[rows] = _codes_at(a, k, min_link, rows)
    code.flags.writeable = False
    return code


def _codes_at(a: Any, k: int, min_link: str, p: np.ndarray | None) -> np.ndarray:
    """:func:`filter_codes` from the node arrays alone (no unknown nodes, no
    nodeSelector) at positions ``p``, or for every node when ``p`` is None (read-only)."""

    if p is not None and len(p) <= _FEW_ROWS:
        return np.array([_code_of(a, k, min_link, i) for i in p.tolist()], dtype=a.blocked.dtype)

    def at(x: np.ndarray) -> np.ndarray:
        return x if p is None else x.take(p)

    code = a.blocked.copy() if p is None else a.blocked.take(p)  # node-level verdicts or 0
    # Request-dependent verdicts, lowest precedence first so that higher ones overwrite.
    due = np.zeros(len(code), dtype=np.int8)
    linked = bool(min_link) and k <= a.max_gpus
    if linked:
        r = class_rank(min_link)
        due[(at(a.links_free[:, r]) >> k) & 1 == 0] = CODE_LINK_NOW
    due[at(a.free) < k] = CODE_NOT_ENOUGH_FREE
    if linked:
        due[(at(a.links_usable[:, r]) >> k) & 1 == 0] = CODE_LINK_NEVER
    due[at(a.usable) < k] = CODE_TOO_FEW_HEALTHY
    np.copyto(code, due, where=code == 0)
    if p is None:
        code.flags.writeable = False
    return code


_FEW_ROWS = 8
"""Up to this many positions, :func:`_codes_at` and :func:`_rank_at` compute node by node
with scalars (:func:`_code_of`, :func:`_rank_of`) instead of array operations: a row
update (one pod placed) brings the memoized per-node values up to date with one or two
rows, where a dozen array operations on one element cost more than the arithmetic."""


def _code_of(a: Any, k: int, min_link: str, i: int) -> int:
    """:func:`_codes_at` of the node at position ``i``, from scalars: the same verdict,
    by the same tests in the same precedence (the highest that holds wins)."""
    blocked = a.blocked.item(i)
    if blocked:
        return int(blocked)
    due = 0
    linked = bool(min_link) and k <= a.max_gpus
    if linked:
        r = class_rank(min_link)
        if (a.links_free.item(i, r) >> k) & 1 == 0:
            due = CODE_LINK_NOW
    if a.free.item(i) < k:
        due = CODE_NOT_ENOUGH_FREE
    if linked and (a.links_usable.item(i, r) >> k) & 1 == 0:
        due = CODE_LINK_NEVER
    if a.usable.item(i) < k:
        due = CODE_TOO_FEW_HEALTHY
    return due


def selector_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Whether a node's labels satisfy a pod's ``nodeSelector``."""
    return all(labels.get(k) == v for k, v in selector.items())


def outcome_of(
    snap: ClusterSnapshot, names: Sequence[str], pos: np.ndarray, codes: np.ndarray
) -> FilterOutcome:
    """A :class:`FilterOutcome` by name from the verdict codes of ``names`` (at ``pos``)."""
    feasible = tuple(compress(names, (codes == FEASIBLE).tolist()))
    failed: dict[str, str] = {}
    unres: dict[str, str] = {}
    for never, reason, idx in verdict_groups(snap, pos, codes):
        (unres if never else failed).update(dict.fromkeys([names[i] for i in idx.tolist()], reason))
    return FilterOutcome(feasible, MappingProxyType(failed), MappingProxyType(unres))


def filter_nodes(
    snap: ClusterSnapshot,
    req: PodRequest,
    names: Sequence[str] | None,
    params: SchedParams,
) -> FilterOutcome:
    """Which of ``names`` (all nodes when None) can take ``req`` now, and why not.

    A pod that requests no GPUs passes every node untouched: topoplace has nothing to add.
    """
    if names is None:
        names = snap.names
    if req.gpus <= 0:
        return FilterOutcome(tuple(names), EMPTY_MAP, EMPTY_MAP)
    pos = name_positions(snap, names)
    code = filter_codes(snap, req, pos, params)
    if not code.any():
        return FilterOutcome(tuple(names), EMPTY_MAP, EMPTY_MAP)
    return outcome_of(snap, names, pos, code)


def verdict_groups(
    snap: ClusterSnapshot,
    pos: np.ndarray,
    codes: np.ndarray,
    skip: tuple[int, ...] = (),
    counts: np.ndarray | None = None,
) -> list[tuple[bool, str, np.ndarray]]:
    """The failing candidates of a :func:`filter_codes` verdict, grouped by reason:
    (unresolvable, reason, indices into ``pos``) per group, codes in precedence order.
    Unhealthy nodes are grouped by their own first health reason. Codes in ``skip`` are
    left out; ``counts`` is ``np.bincount(codes)`` when the caller has it."""
    groups: list[tuple[bool, str, np.ndarray]] = []
    for c in _failing(codes, skip, counts):
        idx = np.flatnonzero(codes == c)
        never, reason = FILTER_VERDICTS[c]
        if c != CODE_UNHEALTHY:
            groups.append((never, reason, idx))
            continue
        groups.extend(_unhealthy_groups(snap, pos, idx))
    return groups


def _failing(codes: np.ndarray, skip: tuple[int, ...], counts: np.ndarray | None) -> list[int]:
    """The failing codes present in ``codes`` (``counts``: their ``np.bincount`` if known),
    ascending, without those in ``skip``."""
    if counts is None:
        counts = np.bincount(codes)
    return [c for c in np.flatnonzero(counts).tolist() if c != FEASIBLE and c not in skip]


def _unhealthy_groups(
    snap: ClusterSnapshot, pos: np.ndarray, idx: np.ndarray
) -> list[tuple[bool, str, np.ndarray]]:
    """The unhealthy candidates ``idx`` (indices into ``pos``) grouped by their node's
    first health reason, in order of first appearance (see :func:`verdict_groups`)."""
    never = FILTER_VERDICTS[CODE_UNHEALTHY][0]
    by_reason: dict[str, list[int]] = {}
    for i, at in zip(idx.tolist(), pos[idx].tolist(), strict=True):
        by_reason.setdefault(verdict_reason(snap, CODE_UNHEALTHY, at), []).append(i)
    return [(never, r, np.asarray(ix, dtype=np.int64)) for r, ix in by_reason.items()]


def verdict_counts(
    snap: ClusterSnapshot,
    pos: np.ndarray,
    codes: np.ndarray,
    skip: tuple[int, ...] = (),
    counts: np.ndarray | None = None,
) -> list[tuple[bool, str, int]]:
    """(unresolvable, reason, how many) of each group of :func:`verdict_groups`, in the
    same order, for a caller that counts the groups without naming their nodes: only
    unhealthy nodes (split by their health reason) are looked up one by one."""
    if counts is None:
        counts = np.bincount(codes)
    out: list[tuple[bool, str, int]] = []
    for c in _failing(codes, skip, counts):
        if c != CODE_UNHEALTHY:
            never, reason = FILTER_VERDICTS[c]
            out.append((never, reason, int(counts[c])))
            continue
        groups = _unhealthy_groups(snap, pos, np.flatnonzero(codes == c))
        out.extend((never, reason, len(idx)) for never, reason, idx in groups)
    return out


def score_nodes(
    snap: ClusterSnapshot,
    req: PodRequest,
    names: Sequence[str] | None,
    params: SchedParams,
) -> list[tuple[str, int]]:
    """Integer scores 0..10 for every node in ``names`` (request order kept).

    See :func:`score_list` for how they are computed.
    """
    if names is None:
        names = snap.names
    return list(zip(names, score_list(snap, req, names, params), strict=True))


def score_list(
    snap: ClusterSnapshot,
    req: PodRequest,
    names: Sequence[str],
    params: SchedParams,
) -> list[int]:
    """Integer scores 0..10, one per name, in the order of ``names``.

    The engine's choice among ``names`` alone scores 10; the others score their
    :func:`rank_positions` value scaled to 0..9 (see :func:`score_positions`). Nodes that
    cannot take the pod, or are unknown, score 0. The same input always gives the same
    output.
    """
    if not names:
        return []
    if req.gpus <= 0:
        return [0] * len(names)
    result: list[int] = score_positions(snap, req, name_positions(snap, names), params).tolist()
    return result


def rank_positions(
    snap: ClusterSnapshot, req: PodRequest, pos: np.ndarray, params: SchedParams
) -> np.ndarray:
    """The engine's preference for each position: a float64 in 0..1 (higher is better),
    -1 where the node cannot take the pod (or is unknown).

    Components, each in 0..1, weighted by ``params.weights``:

    * topology: ring bottleneck of the set the node would really give (the selection
      policy's choice) relative to the best such set anywhere in the snapshot (not among
      the candidates, so the value of a node does not depend on which other nodes
      kube-scheduler happened to send). 1 for single-GPU pods.
    * health: 1 - risk.
    * packing: the share of the node's free GPUs the pod would take (an exact fit is 1).

    This is the one ranking every single-pod decision uses: :func:`best_position` (the
    extender's filter and :func:`place_pod`, hence the simulators) and
    :func:`score_positions` (prioritize). Vectorized; the same input always gives the
    same floats.
    """
    k = req.gpus
    n = len(pos)
    if k <= 0 or not n:
        return np.zeros(n, dtype=np.float64)
    unknown, p = _known(pos)
    every = _every_rank(snap, req, params, n)
    if every is None:
        rank = _rank_at(snap.arrays, k, req.min_link, params.weights, p)
    else:
        rank = every.take(p)
    if unknown is not None:
        rank[unknown] = -1.0
    return rank


def _every_rank(
    snap: ClusterSnapshot, req: PodRequest, params: SchedParams, n: int
) -> np.ndarray | None:
    """:func:`rank_positions` of every node (read-only; ``req.gpus`` >= 1), when ``n``
    positions are worth it (see :func:`_for_all_nodes`), else None."""
    entry = _every_rank_entry(snap, req, params, n)
    return None if entry is None else entry[0]


def _best_of(
    snap: ClusterSnapshot, req: PodRequest, params: SchedParams, pos: np.ndarray, rank: np.ndarray
) -> int:
    """:func:`best_position` of ``rank`` at ``pos``, where ``rank`` is -1 or the rank of
    every node (memoized) at that position. The best node of the whole snapshot (highest
    rank, then lowest name) is the answer whenever it is among the positions with its
    rank: nothing ranks higher, and no tied node has a lower name."""
    entry = _every_rank_entry(snap, req, params, len(pos)) if req.gpus > 0 else None
    if entry is not None:
        if len(entry) < 3:
            entry.append(best_position(snap, np.arange(len(entry[0])), entry[0]))
        best = entry[2]
        if best >= 0:
            at = np.flatnonzero(pos == best)
            if len(at) and rank[at[0]] >= 0:
                return int(at[0])
    return best_position(snap, pos, rank)


def _every_rank_entry(
    snap: ClusterSnapshot, req: PodRequest, params: SchedParams, n: int
) -> list[Any] | None:
    """The memo entry of :func:`_every_rank`: [ranks, topology scale, and once asked
    for, the best position of all (see :func:`_best_of`)]."""
    a = snap.arrays
    w = params.weights
    key = (a, req.gpus, req.min_link, w.topology, w.health, w.packing)
    every = _for_all_nodes(_RANK_MEMO, key, n, len(a.free))
    if every is None:
        return None
    if not len(every):
        k, link = req.gpus, req.min_link
        top = topology_scale(a, k)
        found = _ancestor(_RANK_MEMO, a, key[1:])
        if found is not None and found[0][1] == top:  # the same scale: only rows changed
            (old, *_), rows = found
            rank = old.copy()
            rank[rows] = _rank_at(a, k, link, w, rows, top)
            rank.flags.writeable = False
        else:
            rank = _rank_at(a, k, link, w, None, top)
        every[:] = [rank, top]
    return every


def topology_scale(a: Any, k: int) -> Any:
    """The best ``k``-GPU set's bottleneck on any node that could take it now (the
    topology component's scale in :func:`rank_positions`), or None when it is unused."""
    if k >= 2 and k <= a.max_gpus:
        col = a.best_bw[:, k]
        return float(np.where((a.blocked == 0) & (a.free >= k), col, 0.0).max())
    return None


def _rank_at(
    a: Any, k: int, min_link: str, w: Any, p: np.ndarray | None, top: Any = False
) -> np.ndarray:
    """:func:`rank_positions` from the node arrays alone (no unknown nodes) at positions
    ``p``, or for every node when ``p`` is None (then read-only); ``top``: :func:`topology_scale`
    if known. Element by element the same operations either way, so the same floats."""

    total = w.topology + w.health + w.packing
    if top is False and 2 <= k <= a.max_gpus:
        top = topology_scale(a, k)
    if p is not None and len(p) <= _FEW_ROWS and total > 0:
        return np.array([_rank_of(a, k, min_link, w, i, top, total) for i in p.tolist()])

    def at(x: np.ndarray) -> np.ndarray:
        return x if p is None else x.take(p)

    free = at(a.free)
    ok = (at(a.blocked) == 0) & (free >= k)
    if min_link and k <= a.max_gpus:
        ok &= (at(a.links_free[:, class_rank(min_link)]) >> k) & 1 == 1
    n = len(free)
    if k >= 2 and k <= a.max_gpus:
        bw = at(a.best_bw[:, k]).astype(np.float64)
        if top > 0:
            # An extreme bandwidth over a tiny scale overflows to inf, clipped to 1 below,
            # as the scalar path's float division does (no warning there either).
            with np.errstate(over="ignore"):
                topo = bw / top
        else:
            topo = np.ones(n)
    else:
        topo = np.ones(n)
    health = 1.0 - at(a.risk)
    packing = k / np.maximum(free, 1)  # only read where ok, i.e. where free >= k >= 1
    raw = (w.topology * topo + w.health * health + w.packing * packing) / total
    rank = np.where(ok, np.clip(raw, 0.0, 1.0), -1.0)
    if p is None:
        rank.flags.writeable = False
    return rank


def _rank_of(a: Any, k: int, min_link: str, w: Any, i: int, top: Any, total: float) -> float:
    """:func:`_rank_at` of the node at position ``i``, from scalars (``top``: the
    topology scale when ``k`` uses it; ``total`` > 0: the sum of the weights). Element by
    element the same IEEE double operations in the same order, so the same float: Python
    floats are doubles, ``min``/``max`` keep the first of equals as ``np.clip`` does."""
    free = a.free.item(i)
    ok = a.blocked.item(i) == 0 and free >= k
    if ok and min_link and k <= a.max_gpus:
        ok = (a.links_free.item(i, class_rank(min_link)) >> k) & 1 == 1
    if not ok:
        return -1.0
    topo = 1.0
    if k >= 2 and k <= a.max_gpus and top > 0:
        topo = a.best_bw.item(i, k) / top
    health = 1.0 - a.risk.item(i)
    packing = k / max(free, 1)
    raw = (w.topology * topo + w.health * health + w.packing * packing) / total
    return min(max(raw, 0.0), 1.0)


def best_position(snap: ClusterSnapshot, pos: np.ndarray, rank: np.ndarray) -> int:
    """Index into ``pos`` of the engine's choice: the highest ``rank`` (>= 0), ties broken
    by the lowest node name. -1 when no position can take the pod."""
    if not len(rank):
        return -1
    top = rank.max()
    if top < 0:
        return -1
    tied = np.flatnonzero(rank == top)
    if len(tied) == 1:
        return int(tied[0])
    order = name_order(snap)
    return int(tied[np.argmin(order.take(pos.take(tied)))])


_NAME_ORDER: list[tuple[Mapping[str, int], np.ndarray]] = []
"""(snapshot index, name order) of the most recent node set: see :func:`name_order`."""


def name_order(snap: ClusterSnapshot) -> np.ndarray:
    """Rank of each node's name in sorted order, by snapshot position (read-only).

    Built once per node set (snapshots share their ``index`` until nodes are added or
    removed), so ties among thousands of equal nodes are broken by name without a Python
    comparison per node."""
    index = snap.index
    for idx, order in _NAME_ORDER:
        if idx is index:
            return order
    names = [n.name for n in snap.nodes]
    order = np.empty(len(names), dtype=np.int64)
    order[np.argsort(np.array(names, dtype=object), kind="stable")] = np.arange(len(names))
    order.flags.writeable = False
    _NAME_ORDER[:] = [(index, order)]
    return order


def narrow_to_choice(
    snap: ClusterSnapshot,
    req: PodRequest,
    pos: np.ndarray,
    codes: np.ndarray,
    params: SchedParams,
) -> tuple[np.ndarray, int]:
    """Keep only the engine's choice among the feasible positions of a filter verdict.

    Returns (codes with every other feasible position turned into
    :data:`CODE_NOT_CHOSEN`, index of the choice into ``pos`` or -1). When kube-scheduler
    is left with one feasible node it skips scoring and picks that node, so the live
    decision is exactly the engine's (see ``docs/deploy.md``).
    """
    out, i, _ = narrow_with_rank(snap, req, pos, codes, params)
    return out, i


def narrow_with_rank(
    snap: ClusterSnapshot,
    req: PodRequest,
    pos: np.ndarray,
    codes: np.ndarray,
    params: SchedParams,
) -> tuple[np.ndarray, int, np.ndarray]:
    """:func:`narrow_to_choice` plus the ranks it chose by: :func:`rank_positions` at the
    feasible positions, -1 elsewhere (what an explanation of the same decision needs,
    see ``core/explain.summarize``)."""
    feasible = codes == FEASIBLE
    count = int(np.count_nonzero(feasible))
    if not count:
        return codes, -1, np.full(len(pos), -1.0)
    every = _every_rank(snap, req, params, count) if req.gpus > 0 else None
    if every is not None:  # the same floats as below, read by position
        rank = np.where(feasible, every.take(pos), -1.0)
    else:
        rank = np.full(len(pos), -1.0)
        feas = np.flatnonzero(feasible)
        rank[feas] = rank_positions(snap, req, pos[feas], params)
    i = best_position(snap, pos, rank) if every is None else _best_of(snap, req, params, pos, rank)
    if i < 0:
        return codes, -1, rank
    out = codes.copy()
    out[feasible] = CODE_NOT_CHOSEN
    out[i] = FEASIBLE
    return out, i, rank


def score_positions(
    snap: ClusterSnapshot, req: PodRequest, pos: np.ndarray, params: SchedParams
) -> np.ndarray:
    """:func:`score_list` over node positions (-1: unknown) as an int64 array.

    The engine's choice (:func:`best_position` over :func:`rank_positions`) alone scores
    :data:`MAX_SCORE`; every other node scores ``floor(10 * rank)`` capped at
    ``MAX_SCORE - 1``, and nodes that cannot take the pod 0. kube-scheduler multiplies
    the extender's score by its weight (and by 10), so with the shipped weight the
    engine's choice wins unless an in-tree plugin overrules it by a wide margin.
    """
    n = len(pos)
    if req.gpus <= 0 or not n:
        return np.zeros(n, dtype=np.int64)
    rank = rank_positions(snap, req, pos, params)
    scores = np.floor(np.maximum(rank, 0.0) * MAX_SCORE + 1e-9)
    np.clip(scores, 0, MAX_SCORE - 1, out=scores)
    best = _best_of(snap, req, params, pos, rank)
    if best >= 0:
        scores[best] = MAX_SCORE
    return scores.astype(np.int64)


def choose_gpus(
    snap: ClusterSnapshot, req: PodRequest, node_name: str, params: SchedParams
) -> GpuSet:
    """The GPU indices ``req`` gets on ``node_name`` (a refusal carries ``error``).

    Uses the configured selection policy; with a min-link requirement, the best set by
    ring bottleneck among the sets that meet it (ties: lowest indices).
    """
    node = snap.node(node_name)
    if node is None:
        return GpuSet((), 0.0, 0.0, REASON_UNKNOWN_NODE)
    if node.health.state >= Health.UNHEALTHY:
        return GpuSet(
            (), 0.0, 0.0, node.health.reasons[0] if node.health.reasons else "node unhealthy"
        )
    if req.gpus <= 0:
        return GpuSet((), 0.0, 0.0)
    free = node.free_mask
    if free.bit_count() < req.gpus:
        return GpuSet((), 0.0, 0.0, REASON_NOT_ENOUGH_FREE)
    chosen = select_gpus(node.shape, free, req.gpus, 0, params.selection_policy)
    if not chosen.gpus or not req.min_link:
        return chosen
    rank = class_rank(req.min_link)
    if not (feasible_sizes(node.shape, free)[rank] >> req.gpus) & 1:
        return GpuSet((), 0.0, 0.0, REASON_LINK_NOW)
    if node.shape.num_gpus <= 10:
        good = _qualifying_subsets(node.shape.name, node.shape.num_gpus, rank)
        cands = [s for s in good if s & free == s and s.bit_count() == req.gpus]
    else:
        cands = []
        for combo in combinations(mask_to_indices(free), req.gpus):
            m = sum(1 << i for i in combo)
            if (feasible_sizes(node.shape, m)[rank] >> req.gpus) & 1:
                cands.append(m)
                break
    if chosen.gpus and sum(1 << g for g in chosen.gpus) in cands:
        return chosen
    best = max(
        cands,
        key=lambda m: (ring_bottleneck(node.shape, mask_to_indices(m)), -m),
    )
    gpus = mask_to_indices(best)
    return GpuSet(gpus, 0.0, ring_bottleneck(node.shape, gpus))


def place_pod(snap: ClusterSnapshot, req: PodRequest, params: SchedParams) -> PlacementResult:
    """Place one pod on the whole cluster: the decision the extender makes live.

    Filter every node (:func:`filter_codes`), take the engine's choice among the feasible
    ones (:func:`narrow_to_choice`: highest :func:`rank_positions`, ties by name), and
    the GPUs :func:`choose_gpus` gives there. The extender's filter narrows
    kube-scheduler's candidates to this same node, so simulators calling this function
    replay what the live extender does.
    """
    pos = np.arange(len(snap.nodes), dtype=np.int64)
    codes = filter_codes(snap, req, pos, params)
    if req.gpus <= 0:
        # Nothing topoplace decides: the first node by name that passes.
        ok = np.flatnonzero(codes == FEASIBLE)
        choice = int(min(ok.tolist(), key=lambda i: snap.nodes[i].name)) if len(ok) else -1
    else:
        codes, choice = narrow_to_choice(snap, req, pos, codes, params)
    if choice < 0:
        out = outcome_of(snap, snap.names, pos, codes)
        return PlacementResult(
            ok=False,
            reason=REASON_NO_FEASIBLE_NODE,
            failed=out.failed,
            unresolvable=out.unresolvable,
        )
    best_node = snap.nodes[choice].name
    gs = choose_gpus(snap, req, best_node, params)
    if req.gpus and not gs.gpus:
        return PlacementResult(ok=False, reason=gs.error or REASON_NO_FEASIBLE_NODE)
    return PlacementResult(
        ok=True,
        assignments=(Assignment(req.key, best_node, gs.gpus),),
        details={"score": MAX_SCORE, "bottleneck_gbps": gs.bottleneck_gbps},
    )
