"""What every gang policy shares: the candidate view, lower bounds, refusals, exact filling
of nodes, and the result record.

Pure. The expensive per-node work is vectorized over the snapshot's numpy arrays; Python
loops touch each node at most once per plan (fabric paths, optional CPU/memory/cost
columns), never nodes x pods.

Terms:
    * **slots[r, j]**: how many members of role r the eligible node j could host on its own
      (free healthy GPUs // GPUs per member, CPU and memory when requested, capped at the
      role's count; 0 where the node is unhealthy, cordoned, excluded by the NVLink rule or
      by a nodeSelector).
    * **domain**: one value of a fabric level's label (``leaf-3``, an NVL72 rack). A node
      without that label is its own singleton domain at that level (it cannot share it with
      anyone, so a gang that must stay in one such domain must stay on that node).
    * **lower bound** at a level: the fewest domains whose free capacity covers the gang
      (largest domains first), per role and for the GPU total; with a required level, the
      least over the candidate domains of that level. Exact for gangs with one role.
      Per-level bounds need not hold together (the 6 largest leaves may sit under 3 spines
      while 2 spines suffice); :func:`nested_bounds` gives the exact fewest child domains
      when at most k parent domains are used (a max-plus programme over parents), which
      CP-SAT receives as cuts and the greedy descent uses to split.

NVLink exclusivity (Grove, IMEX): a node serves one multi-node NVLink workload at a time.
A gang *uses a multi-node NVLink domain* when its members (bound pods, assumed pods or
reservation pseudo pods, i.e. every ``PodInfo`` with that ``gang``) sit on two or more
nodes of one ``nvlink-domain``, or when any of its members' Pod objects requires or
prefers the ``nvlink-domain`` level. A gang that itself requires or prefers
``nvlink-domain`` never gets a node that holds a pod of another such gang.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from scheduler.core.gang import NVLINK_LEVEL, GangRequest, GangRole
from scheduler.core.linkclass import class_rank, feasible_sizes
from scheduler.core.model import Health, PodRequest, affinity_matches
from scheduler.core.objects import HOSTNAME_LEVEL, ObjectError, topology_of
from scheduler.core.params import SchedParams
from scheduler.core.schedule import Assignment, PlacementResult, choose_gpus
from scheduler.core.snapshot import ClusterSnapshot
from topology.select import select_gpus


def _placement_masks(role: GangRole, nodes: Sequence[Any]) -> list[tuple[str, np.ndarray]]:
    """(constraint, allowed-node mask) for the role's ``nodeSelector`` and required node
    affinity, whichever it has: the plan keeps every member, seen or not, on allowed nodes."""
    out = []
    sel, aff = role.node_selector, role.node_affinity
    if sel:
        ok = (all(nd.labels.get(k) == v for k, v in sel.items()) for nd in nodes)
        out.append(("nodeSelector", np.fromiter(ok, dtype=bool, count=len(nodes))))
    if aff:
        ok = (affinity_matches(aff, nd.labels, nd.name) for nd in nodes)
        out.append(("nodeAffinity", np.fromiter(ok, dtype=bool, count=len(nodes))))
    return out


REQ_NONE = -1
REQ_NODE = -2
BIG = 1 << 40
COST_LABEL = "topoplace.io/cost"

DEFAULT_WEIGHTS: Mapping[str, float] = {
    "compactness": 10.0,
    "preferred": 40.0,
    "bandwidth": 10.0,
    "health": 4.0,
    "fragmentation": 2.0,
    "nvl_reserve": 4.0,
    "spare": 3.0,
    "cost": 1.0,
    "bestfit": 1.0,
}
"""Soft-objective weights (``params.gang.weights`` overrides any of them; keys
``cost.<gpu product>`` give a node cost per GPU product). See ``cpsat.py``."""


def gang_weights(params: SchedParams) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """(weights, cost per GPU product, ignored keys) from the defaults and the params."""
    w = dict(DEFAULT_WEIGHTS)
    costs: dict[str, float] = {}
    ignored: list[str] = []
    for k, v in sorted((params.gang.weights or {}).items()):
        try:
            f = float(v)
        except (TypeError, ValueError):
            ignored.append(k)
            continue
        if k.startswith("cost."):
            costs[k[5:]] = f
        elif k in w and f >= 0:
            w[k] = f
        else:
            ignored.append(k)
    return w, costs, ignored


@dataclass(frozen=True, slots=True)
class Level:
    """A fabric level as the planner uses it (closest first)."""

    name: str
    path_index: int
    bandwidth_gbps: float


def _codes(values: Iterable[str | None], count: int) -> tuple[np.ndarray, list[str]]:
    mapping: dict[str, int] = {}
    names: list[str] = []

    def code(v: str | None) -> int:
        if v is None:
            return -1
        c = mapping.get(v)
        if c is None:
            c = mapping[v] = len(names)
            names.append(v)
        return c

    arr = np.fromiter((code(v) for v in values), dtype=np.int64, count=count)
    return arr, names


def _multi_slots(snap: ClusterSnapshot, i: int, gpus: int, rank: int, policy: str) -> int:
    """Exact number of disjoint ``gpus``-sets meeting link rank on node i (greedy picks)."""
    node = snap.nodes[i]
    mask = node.free_mask
    n = 0
    while mask.bit_count() >= gpus:
        if not (feasible_sizes(node.shape, mask)[rank] >> gpus) & 1:
            break
        gs = _pick(node, mask, gpus, "", policy, rank)
        if not gs:
            break
        for g in gs:
            mask &= ~(1 << g)
        n += 1
    return n


class _OneNode:
    """Minimal snapshot stand-in for :func:`choose_gpus` with a given free mask."""

    __slots__ = ("_node",)

    def __init__(self, node: Any) -> None:
        self._node = node

    def node(self, name: str) -> Any:
        return self._node if name == self._node.name else None


def _pick(
    node: Any, mask: int, gpus: int, min_link: str, policy: str, rank: int = -1
) -> tuple[int, ...]:
    """GPU indices for one member among ``mask`` (the selection policy's choice)."""
    if rank < 0 and not min_link:
        gs = select_gpus(node.shape, mask, gpus, 0, policy)
        return gs.gpus
    link = min_link or ("nvlink", "pix", "pxb", "phb", "node", "sys")[rank]
    shim = _OneNode(replace(node, used_mask=node.all_mask & ~mask))
    req = PodRequest(key="", gpus=gpus, min_link=link)
    return choose_gpus(shim, req, node.name, _PolicyOnly(policy)).gpus  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _PolicyOnly:
    selection_policy: str


def _mnnvl_nodes(snap: ClusterSnapshot, params: SchedParams, gang: str) -> np.ndarray:
    """Bool per node: holds a pod of another gang that uses a multi-node NVLink domain."""
    fabric = params.fabric
    try:
        li = fabric.level_index(NVLINK_LEVEL)
    except ValueError:
        return np.zeros(len(snap.nodes), dtype=bool)
    by_gang: dict[str, list[Any]] = {}
    for p in snap.pods.values():
        if p.gang and p.gang != gang:
            by_gang.setdefault(p.gang, []).append(p)
    out = np.zeros(len(snap.nodes), dtype=bool)
    for _, pods in sorted(by_gang.items()):
        nodes = sorted({p.node for p in pods})
        multi = False
        seen: dict[str, str] = {}
        for name in nodes:
            n = snap.node(name)
            dom = n.fabric_path[li] if n is not None and li < len(n.fabric_path) else None
            if dom is None:
                continue
            if dom in seen and seen[dom] != name:
                multi = True
                break
            seen[dom] = name
        if not multi:
            for p in pods:
                if not p.raw:
                    continue
                try:
                    t = topology_of(p.raw, fabric)
                except ObjectError:
                    continue
                if NVLINK_LEVEL in (t.required, t.preferred):
                    multi = True
                    break
        if multi:
            for name in nodes:
                i = snap.index.get(name)
                if i is not None:
                    out[i] = True
    return out


class GangView:
    """The candidate nodes of one gang on one snapshot (built once per plan; read-only).

    Attributes:
        snapshot / gang / params: the inputs.
        roles: ``gang.roles``.
        levels: fabric levels with at least one labelled candidate (or the required /
            preferred one), closest first.
        pos: snapshot indices of candidate nodes (eligible for at least one role), ascending
            (= name order).
        slots: (roles, candidates) members of each role a candidate could host alone.
        free / capacity: free healthy GPUs / physical GPUs per candidate.
        untouched: candidate holds no pod and no unhealthy GPU (free == capacity).
        risk / cost: per candidate.
        cpu_free / mem_free: per candidate (``BIG`` when the node does not report it).
        dom: (levels, candidates) domain code per level (-1 = unlabelled).
        dom_names: per level, domain names by code.
        dom_untouched: per level, bool per domain code: none of the domain's nodes (all
            nodes, candidates or not) holds a GPU.
        required / preferred: index into ``levels``, ``REQ_NODE`` or ``REQ_NONE``.
        excluded: nodes excluded by reason (for refusal messages).
        error: a request error that makes the gang unplaceable regardless of capacity.
        fixed_nodes / fixed_dom: snapshot indices and per-level domain codes (+ -1-node
            markers as ``-(i+2)``) of members already holding resources.
    """

    def __init__(self, snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams):
        self.snapshot = snapshot
        self.gang = gang
        self.params = params
        self.roles: tuple[GangRole, ...] = gang.roles
        self.error = ""
        self.excluded: dict[str, int] = {}
        snap = snapshot
        a = snap.arrays
        n = len(snap.nodes)
        fabric = params.fabric
        policy = snap.policy
        ok = (a.state < int(Health.UNHEALTHY)) & ~a.unschedulable & (a.capacity >= 0)
        self.excluded["unhealthy"] = int((a.state >= int(Health.UNHEALTHY)).sum())
        self.excluded["cordoned"] = int((a.unschedulable & (a.state < int(Health.UNHEALTHY))).sum())

        # Levels (all fabric levels; pruned after eligibility) and requirement indices.
        all_levels = [
            Level(lv.name, i, float(lv.bandwidth_gbps)) for i, lv in enumerate(fabric.levels)
        ]
        names = {lv.name for lv in all_levels}
        for what in ("required", "preferred"):
            v = getattr(gang.topology, what)
            if v and v != HOSTNAME_LEVEL and v not in names:
                self.error = f"unknown topology level {v!r}; known: " + ", ".join(
                    [HOSTNAME_LEVEL] + [lv.name for lv in all_levels]
                )

        needs_cpu = any(r.cpu_milli for r in self.roles)
        needs_mem = any(r.memory_bytes for r in self.roles)
        cpu_all = mem_all = None
        if needs_cpu or needs_mem:
            cpu_all = np.fromiter(
                (
                    nd.cpu_milli - nd.cpu_used_milli if nd.cpu_milli > 0 else BIG
                    for nd in snap.nodes
                ),
                dtype=np.int64,
                count=n,
            )
            mem_all = np.fromiter(
                (
                    nd.memory_bytes - nd.memory_used_bytes if nd.memory_bytes > 0 else BIG
                    for nd in snap.nodes
                ),
                dtype=np.int64,
                count=n,
            )
        free_all = a.free.astype(np.int64)
        slots = np.zeros((len(self.roles), n), dtype=np.int64)
        for r, role in enumerate(self.roles):
            if role.gpus > 0:
                s = free_all // role.gpus
                if role.min_link:
                    rank = class_rank(role.min_link)
                    if role.gpus <= a.max_gpus:
                        one = ((a.links_free[:, rank] >> role.gpus) & 1).astype(bool)
                    else:
                        one = np.zeros(n, dtype=bool)
                    s = np.where(one, s, 0)
                    for i in np.flatnonzero(ok & (s >= 2)):
                        s[i] = _multi_slots(snap, int(i), role.gpus, rank, policy)
            else:
                s = np.full(n, role.count, dtype=np.int64)
            if role.cpu_milli and cpu_all is not None:
                s = np.minimum(s, np.maximum(cpu_all, 0) // role.cpu_milli)
            if role.memory_bytes and mem_all is not None:
                s = np.minimum(s, np.maximum(mem_all, 0) // role.memory_bytes)
            for what, match in _placement_masks(role, snap.nodes):
                self.excluded[what] = int((ok & ~match).sum())
                s = np.where(match, s, 0)
            slots[r] = np.where(ok, np.minimum(s, role.count), 0)

        if NVLINK_LEVEL in (gang.topology.required, gang.topology.preferred):
            busy = _mnnvl_nodes(snap, params, gang.key)
            hit = busy & (slots.sum(axis=0) > 0)
            self.excluded["nvlink-exclusive"] = int(hit.sum())
            slots[:, busy] = 0

        # Fabric domain codes over ALL nodes (needed for whole-free domains and fixed members).
        # Nodes share few distinct paths (one per leaf or rack): code the distinct paths,
        # then index (one dict lookup per node instead of one per node and level).
        distinct: dict[tuple[str | None, ...], int] = {}
        path_of = np.fromiter(
            (distinct.setdefault(nd.fabric_path, len(distinct)) for nd in snap.nodes),
            dtype=np.int64,
            count=n,
        )
        upaths = list(distinct)
        codes_all = []
        dom_names = []
        for lv in all_levels:
            arr, nm = _codes(
                (p[lv.path_index] if lv.path_index < len(p) else None for p in upaths),
                len(upaths),
            )
            codes_all.append(arr[path_of] if n else np.zeros(0, dtype=np.int64))
            dom_names.append(nm)

        # Fixed members pin the required domain.
        self.fixed_nodes = sorted({snap.index[f.node] for f in gang.fixed if f.node in snap.index})
        req_name = gang.topology.required
        if req_name == HOSTNAME_LEVEL:
            self.required = REQ_NODE
        elif req_name and req_name in names:
            self.required = next(i for i, lv in enumerate(all_levels) if lv.name == req_name)
        else:
            self.required = REQ_NONE
        pref_name = gang.topology.preferred
        if pref_name == HOSTNAME_LEVEL:
            self.preferred = REQ_NODE
        elif pref_name and pref_name in names:
            self.preferred = next(i for i, lv in enumerate(all_levels) if lv.name == pref_name)
        else:
            self.preferred = REQ_NONE
        if self.fixed_nodes and self.required != REQ_NONE:
            fixed = np.array(self.fixed_nodes, dtype=np.int64)
            if self.required == REQ_NODE:
                keep = np.zeros(n, dtype=bool)
                if len(fixed) == 1:
                    keep[fixed[0]] = True
                else:
                    self.error = "members already bound sit on several nodes"
            else:
                fc = set(codes_all[self.required][fixed].tolist())
                if len(fc) != 1 or -1 in fc:
                    keep = np.zeros(n, dtype=bool)
                    if len(fixed) == 1:
                        keep[fixed[0]] = True
                    else:
                        self.error = (
                            f"members already bound span several {req_name} domains; "
                            "delete them to re-place the gang whole"
                        )
                else:
                    keep = codes_all[self.required] == fc.pop()
            slots[:, ~keep] = 0

        elig = slots.sum(axis=0) > 0
        self.pos = np.flatnonzero(elig).astype(np.int64)
        self.slots = slots[:, self.pos]
        self.free = free_all[self.pos]
        self.capacity = a.capacity[self.pos].astype(np.int64)
        self.untouched = self.free == self.capacity
        self.risk = a.risk[self.pos].astype(np.float64)
        self.cpu_free = cpu_all[self.pos] if cpu_all is not None else np.full(len(self.pos), BIG)
        self.mem_free = mem_all[self.pos] if mem_all is not None else np.full(len(self.pos), BIG)
        self.weights, costs, self.ignored_weights = gang_weights(params)
        if costs or self.weights.get("cost", 0) > 0:
            self.cost = np.fromiter(
                (_node_cost(snap.nodes[int(i)], costs) for i in self.pos),
                dtype=np.float64,
                count=len(self.pos),
            )
        else:
            self.cost = np.zeros(len(self.pos))

        used_all = (a.free != a.capacity).astype(np.int64)
        keep_levels = []
        for li in range(len(all_levels)):
            cand = codes_all[li][self.pos]
            if (cand >= 0).any() or li in (self.required, self.preferred):
                keep_levels.append(li)
        remap = {old: new for new, old in enumerate(keep_levels)}
        self.levels: tuple[Level, ...] = tuple(all_levels[li] for li in keep_levels)
        self.required = (
            remap.get(self.required, self.required) if self.required >= 0 else self.required
        )
        self.preferred = (
            remap.get(self.preferred, self.preferred) if self.preferred >= 0 else self.preferred
        )
        self.dom = (
            np.stack([codes_all[li][self.pos] for li in keep_levels])
            if keep_levels
            else np.zeros((0, len(self.pos)), dtype=np.int64)
        )
        self.dom_names = [dom_names[li] for li in keep_levels]
        self.dom_untouched = []
        self.fixed_dom: list[set[int]] = []
        fixed_arr = np.array(self.fixed_nodes, dtype=np.int64)
        for li in keep_levels:
            c = codes_all[li]
            k = len(dom_names[li])
            if k:
                labelled = c >= 0
                used = np.bincount(c[labelled], weights=used_all[labelled], minlength=k)
                self.dom_untouched.append(used == 0)
            else:
                self.dom_untouched.append(np.zeros(0, dtype=bool))
            fd = set()
            for i in fixed_arr.tolist():
                fd.add(int(c[i]) if c[i] >= 0 else -(i + 2))
            self.fixed_dom.append(fd)

    # ---- convenience -------------------------------------------------------------------

    @property
    def count(self) -> np.ndarray:
        """Members to place per role."""
        return np.array([r.count for r in self.roles], dtype=np.int64)

    @property
    def primary(self) -> int:
        """Index of the role that dominates placement: most GPUs, then most members."""
        return max(
            range(len(self.roles)),
            key=lambda r: (self.roles[r].gpus, self.roles[r].count, -r),
        )

    def node(self, j: int) -> Any:
        """NodeInfo of candidate j."""
        return self.snapshot.nodes[int(self.pos[j])]

    def group_ids(self, level: int) -> np.ndarray:
        """Domain id per candidate at ``level`` with unlabelled nodes as singletons
        (``REQ_NODE``: every candidate its own group)."""
        m = len(self.pos)
        if level == REQ_NODE:
            return np.arange(m, dtype=np.int64)
        d = self.dom[level]
        k = len(self.dom_names[level])
        return np.where(d >= 0, d, k + np.arange(m, dtype=np.int64))

    def level_name(self, level: int) -> str:
        """Name of a level index (``node`` for REQ_NODE)."""
        return HOSTNAME_LEVEL if level == REQ_NODE else self.levels[level].name


def _node_cost(node: Any, costs: Mapping[str, float]) -> float:
    raw = node.labels.get(COST_LABEL)
    if raw is not None:
        try:
            v = float(raw)
            if v >= 0:
                return v
        except ValueError:
            pass
    return float(costs.get(node.labels.get("nvidia.com/gpu.product", ""), 0.0))


# ---- lower bounds -------------------------------------------------------------------------


def cover(caps: np.ndarray, need: int) -> int:
    """Fewest entries of ``caps`` whose sum reaches ``need`` (-1 if even all fall short)."""
    if need <= 0:
        return 0
    if caps.size == 0:
        return -1
    s = np.cumsum(np.sort(caps)[::-1])
    k = int(np.searchsorted(s, need))
    return k + 1 if k < len(s) else -1


def _dims(view: GangView) -> tuple[np.ndarray, np.ndarray]:
    """Capacity rows (roles + GPU total) per candidate and the matching needs."""
    caps = [view.slots[r] for r in range(len(view.roles))]
    needs = [view.roles[r].count for r in range(len(view.roles))]
    total = view.gang.total_gpus
    if total > 0 and sum(1 for r in view.roles if r.gpus > 0) > 1:
        gpu_cap = np.where((view.slots * (view.count[:, None] > 0)).sum(axis=0) > 0, view.free, 0)
        caps.append(gpu_cap)
        needs.append(total)
    return np.stack(caps) if caps else np.zeros((0, len(view.pos))), np.array(needs)


@dataclass(frozen=True, slots=True)
class Bounds:
    """Lower bounds and required-level candidates of a gang.

    Attributes:
        per_level: level name -> fewest domains (``node`` included); -1 = infeasible.
        scopes: candidate required-level groups that can host the whole gang, as arrays
            of candidate indices (a single scope of all candidates without a required level).
        best_scope_capacity: per role, the most members any single required-level group
            can host (for refusal messages).
    """

    per_level: Mapping[str, int]
    scopes: tuple[np.ndarray, ...]
    best_scope_capacity: tuple[int, ...]


def lower_bounds(view: GangView) -> Bounds:
    """Exact lower bounds on domains per level (see module docstring)."""
    caps, needs = _dims(view)
    m = len(view.pos)
    if view.required == REQ_NONE:
        scope_ids = np.zeros(m, dtype=np.int64)
    else:
        scope_ids = view.group_ids(view.required)
    # Feasible scopes: every dimension covered.
    if m:
        uniq, inv = np.unique(scope_ids, return_inverse=True)
        totals = np.stack(
            [np.bincount(inv, weights=caps[d], minlength=len(uniq)) for d in range(len(needs))]
        )
        feasible = np.all(totals >= needs[:, None], axis=0)
        best_cap = tuple(int(totals[d].max()) for d in range(len(view.roles)))
    else:
        uniq = np.zeros(0, dtype=np.int64)
        inv = np.zeros(0, dtype=np.int64)
        feasible = np.zeros(0, dtype=bool)
        best_cap = tuple(0 for _ in view.roles)
    scopes = tuple(np.flatnonzero(inv == s) for s in np.flatnonzero(feasible))
    levels = list(range(len(view.levels))) + [REQ_NODE]
    per: dict[str, int] = {}
    for li in levels:
        gid = view.group_ids(li)
        best = -1
        for idx in scopes:
            g = gid[idx]
            uq, gi = np.unique(g, return_inverse=True)
            lb = 0
            for d in range(len(needs)):
                sums = np.bincount(gi, weights=caps[d][idx], minlength=len(uq))
                c = cover(sums, int(needs[d]))
                if c < 0:
                    lb = -1
                    break
                lb = max(lb, c)
            if lb >= 0 and (best < 0 or lb < best):
                best = lb
        if best >= 0 and li != REQ_NODE and view.fixed_dom[li]:
            best = max(best, len(view.fixed_dom[li]))
        per[view.level_name(li)] = best
    return Bounds(per, scopes, best_cap)


# ---- refusals -----------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _need_phrase(role: GangRole, per_node: int) -> str:
    if role.gpus <= 0:
        extra = []
        if role.cpu_milli:
            extra.append(f"{role.cpu_milli / 1000:g} CPU")
        if role.memory_bytes:
            extra.append(f"{role.memory_bytes / 2**30:g} GiB memory")
        return _plural(role.count, "pod") + (f" with {' and '.join(extra)}" if extra else "")
    link = f" linked by {role.min_link} or better" if role.min_link else ""
    if per_node <= 1:
        return f"{_plural(role.count, 'node')} with {role.gpus} free healthy GPUs{link}"
    return f"{_plural(role.count, 'pod')} x {role.gpus} free healthy GPUs{link}"


def refusal_message(view: GangView, bounds: Bounds | None = None) -> str:
    """Why the gang cannot be placed, in words a user can act on."""
    if view.error:
        return view.error
    bounds = bounds or lower_bounds(view)
    notes = []
    ex = view.excluded
    if ex.get("nvlink-exclusive"):
        notes.append(
            f"{_plural(ex['nvlink-exclusive'], 'node')} serve another multi-node NVLink workload"
        )
    if ex.get("unhealthy"):
        notes.append(f"{_plural(ex['unhealthy'], 'node')} unhealthy")
    if ex.get("cordoned"):
        notes.append(f"{_plural(ex['cordoned'], 'node')} cordoned")
    note = f" ({'; '.join(notes)})" if notes else ""
    if view.snapshot.nodes:
        cap_max = int(view.snapshot.arrays.capacity.max())
        for role in view.roles:
            if role.gpus > cap_max:
                return (
                    f"each {role.name} member needs {role.gpus} GPUs on one node; "
                    f"the largest node has {cap_max}"
                )
    else:
        return "the cluster has no nodes"
    for r, role in enumerate(view.roles):
        total = int(view.slots[r].sum()) if len(view.pos) else 0
        per_node = int(view.slots[r].max()) if len(view.pos) else 0
        if total < role.count:
            inside = ""
            if view.required >= 0:
                inside = f" inside one {view.level_name(view.required)}"
            elif view.required == REQ_NODE:
                inside = " on one node"
            whole = "the whole cluster" if inside else "the cluster"
            return (
                f"needs {_need_phrase(role, per_node)}{inside}; {whole} has room for {total} now"
                + note
            )
    if view.required != REQ_NONE and not bounds.scopes:
        lvl = view.level_name(view.required)
        for r, role in enumerate(view.roles):
            per_node = int(view.slots[r].max()) if len(view.pos) else 0
            best = bounds.best_scope_capacity[r] if r < len(bounds.best_scope_capacity) else 0
            if best < role.count:
                if view.required == REQ_NODE:
                    return (
                        f"needs all {view.gang.describe()} on one node; the best node has "
                        f"room for {best}" + note
                    )
                unit = "has" if per_node <= 1 else "has room for"
                return (
                    f"needs {_need_phrase(role, per_node)} inside one {lvl}; "
                    f"the largest such domain {unit} {best}" + note
                )
        return f"no single {lvl} has room for all members together ({view.gang.describe()}){note}"
    return (
        "no placement fits every member's GPU, CPU and memory requests together "
        f"({view.gang.describe()}){note}"
    )


# ---- exact filling ------------------------------------------------------------------------


class Filler:
    """Places members on candidate nodes one by one with exact accounting (GPU masks, CPU,
    memory); the concrete GPUs come from the selection policy, as the device plugin would
    hand them out. Every policy ends here, so no policy can double-book."""

    def __init__(self, view: GangView) -> None:
        self.view = view
        self.policy = view.snapshot.policy
        self.masks: dict[int, int] = {}
        self.cpu: dict[int, int] = {}
        self.mem: dict[int, int] = {}
        self.placed: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        self.done = [0] * len(view.roles)

    def copy(self) -> Filler:
        """An independent copy (for trial placements)."""
        f = Filler.__new__(Filler)
        f.view = self.view
        f.policy = self.policy
        f.masks = dict(self.masks)
        f.cpu = dict(self.cpu)
        f.mem = dict(self.mem)
        f.placed = {k: list(v) for k, v in self.placed.items()}
        f.done = list(self.done)
        return f

    def remaining(self, r: int) -> int:
        """Members of role r still to place."""
        return self.view.roles[r].count - self.done[r]

    def complete(self) -> bool:
        """True when every member is placed."""
        return all(self.remaining(r) == 0 for r in range(len(self.view.roles)))

    def place(self, j: int, r: int) -> bool:
        """Place one member of role r on candidate j if it fits."""
        v = self.view
        role = v.roles[r]
        if v.slots[r, j] <= 0 or self.remaining(r) <= 0:
            return False
        if role.cpu_milli:
            c = self.cpu.get(j, int(v.cpu_free[j]))
            if c < role.cpu_milli:
                return False
        if role.memory_bytes:
            mm = self.mem.get(j, int(v.mem_free[j]))
            if mm < role.memory_bytes:
                return False
        gpus: tuple[int, ...] = ()
        if role.gpus > 0:
            node = v.node(j)
            mask = self.masks.get(j)
            if mask is None:
                mask = node.free_mask
            if mask.bit_count() < role.gpus:
                return False
            gpus = tuple(_pick(node, mask, role.gpus, role.min_link, self.policy))
            if len(gpus) != role.gpus:
                return False
            for g in gpus:
                mask &= ~(1 << g)
            self.masks[j] = mask
        if role.cpu_milli:
            self.cpu[j] = self.cpu.get(j, int(v.cpu_free[j])) - role.cpu_milli
        if role.memory_bytes:
            self.mem[j] = self.mem.get(j, int(v.mem_free[j])) - role.memory_bytes
        self.placed.setdefault(j, []).append((r, gpus))
        self.done[r] += 1
        return True

    def place_many(self, j: int, r: int, k: int) -> int:
        """Place up to k members of role r on candidate j; returns how many fit."""
        n = 0
        while n < k and self.place(j, r):
            n += 1
        return n

    def fill(self, order: Iterable[int], roles: Sequence[int] | None = None) -> bool:
        """Fill nodes in ``order`` (first fit), heaviest roles first; True when complete."""
        order = list(order)
        rs = roles if roles is not None else role_order(self.view)
        for r in rs:
            for j in order:
                if self.remaining(r) == 0:
                    break
                self.place_many(j, r, self.remaining(r))
        return self.complete()

    def assignments(self) -> tuple[Assignment, ...]:
        """Members -> (node, GPUs): slots of each role in order over nodes in name order."""
        v = self.view
        keys: list[list[str]] = [[] for _ in v.roles]
        for _, role, pod in v.gang.slots():
            keys[v.roles.index(role)].append(pod)
        nxt = [0] * len(v.roles)
        out = []
        for j in sorted(self.placed):
            name = v.node(j).name
            for r, gpus in sorted(self.placed[j], key=lambda t: (t[0], t[1])):
                out.append(Assignment(keys[r][nxt[r]], name, tuple(sorted(gpus))))
                nxt[r] += 1
        return tuple(out)


def role_order(view: GangView) -> list[int]:
    """Roles heaviest first (GPUs, CPU, memory), ties by name."""
    return sorted(
        range(len(view.roles)),
        key=lambda r: (
            -view.roles[r].gpus,
            -view.roles[r].cpu_milli,
            -view.roles[r].memory_bytes,
            view.roles[r].name,
        ),
    )


# ---- results ------------------------------------------------------------------------------


def domains_used(view: GangView, assignments: Sequence[Assignment]) -> dict[str, int]:
    """Distinct domains per level (unlabelled nodes count one each) and nodes, over the new
    assignments and the fixed members."""
    snap = view.snapshot
    names = sorted({a.node for a in assignments} | {f.node for f in view.gang.fixed})
    nodes = [snap.node(nm) for nm in names]
    out: dict[str, int] = {}
    for lv in view.levels:
        doms = set()
        for nd in nodes:
            if nd is None:
                continue
            d = nd.fabric_path[lv.path_index] if lv.path_index < len(nd.fabric_path) else None
            doms.add(d if d is not None else "\0" + nd.name)
        out[lv.name] = len(doms)
    out[HOSTNAME_LEVEL] = len(names)
    return out


def collective_bandwidth(view: GangView, assignments: Sequence[Assignment]) -> float:
    """Estimated ring all-reduce bottleneck of the whole gang (GB/s per direction)."""
    snap = view.snapshot
    per_node: dict[str, list[int]] = {}
    for a in list(assignments) + list(view.gang.fixed):
        if a.gpus:
            per_node.setdefault(a.node, []).extend(a.gpus)
    members = []
    for name in sorted(per_node):
        nd = snap.node(name)
        if nd is None:
            continue
        members.append((nd.fabric_path, nd.shape, tuple(sorted(set(per_node[name])))))
    if not members:
        return 0.0
    return float(view.params.fabric.collective_bandwidth(members))


def success(
    view: GangView,
    assignments: Sequence[Assignment],
    policy: str,
    bounds: Bounds | None = None,
    **details: Any,
) -> PlacementResult:
    """A successful result with the common record (domains, bounds, bandwidth)."""
    bounds = bounds or lower_bounds(view)
    used = domains_used(view, assignments)
    rec: dict[str, Any] = {
        "policy": policy,
        "gang": view.gang.key,
        "members": view.gang.size,
        "domains_used": used,
        "lower_bound": dict(bounds.per_level),
        "at_lower_bound": all(used.get(k, 0) <= v for k, v in bounds.per_level.items() if v >= 0),
        "collective_bandwidth_gbps": collective_bandwidth(view, assignments),
        "required": view.gang.topology.required,
        "preferred": view.gang.topology.preferred,
    }
    rec.update(details)
    return PlacementResult(ok=True, assignments=tuple(assignments), details=rec)


def refusal(
    view: GangView, policy: str, bounds: Bounds | None = None, reason: str = "", **details: Any
) -> PlacementResult:
    """A refusal explaining itself; nothing is assigned."""
    bounds = bounds or lower_bounds(view)
    rec: dict[str, Any] = {
        "policy": policy,
        "gang": view.gang.key,
        "members": view.gang.size,
        "lower_bound": dict(bounds.per_level),
        "excluded": dict(view.excluded),
        "status": "infeasible",
    }
    rec.update(details)
    return PlacementResult(ok=False, reason=reason or refusal_message(view, bounds), details=rec)


def trivial(view: GangView, policy: str) -> PlacementResult | None:
    """The result for an empty gang (nothing to place) or a request error; None otherwise."""
    if view.error:
        return refusal(view, policy, reason=view.error)
    if view.gang.size == 0:
        return success(view, (), policy, status="optimal")
    return None


def prepare(
    snapshot: ClusterSnapshot,
    gang: GangRequest,
    params: SchedParams,
    policy: str,
    need_scope: bool = False,
) -> tuple[GangView, Bounds] | PlacementResult:
    """The opening every policy shares: the gang's view of the snapshot and its lower
    bounds, or the final result when there is nothing to plan (empty gang, request error;
    with ``need_scope``, also the refusal when no domain can hold the gang)."""
    view = GangView(snapshot, gang, params)
    done = trivial(view, policy)
    if done is not None:
        return done
    bounds = lower_bounds(view)
    if need_scope and not bounds.scopes:
        return refusal(view, policy, bounds)
    return view, bounds


# ---- domain helpers for the heuristics -----------------------------------------------------


def group_capacity(
    view: GangView, idx: np.ndarray, gid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group ids, per-role capacity (roles, groups), first candidate per group) of the
    candidates ``idx`` grouped by ``gid``."""
    g = gid[idx]
    uq, inv = np.unique(g, return_inverse=True)
    caps = np.stack(
        [
            np.bincount(inv, weights=view.slots[r][idx], minlength=len(uq))
            for r in range(len(view.roles))
        ]
    ).astype(np.int64)
    first = np.full(len(uq), BIG, dtype=np.int64)
    np.minimum.at(first, inv, idx)
    return uq, caps, first


def fits(caps: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Bool per group: capacity covers every role's need."""
    out: np.ndarray = np.all(caps >= need[:, None], axis=0)
    return out


def group_untouched(view: GangView, level: int, groups: np.ndarray) -> np.ndarray:
    """Bool per group id at ``level``: no node of the domain holds GPUs (singletons: the
    node itself)."""
    if level == REQ_NODE:
        whole: np.ndarray = view.untouched[groups]
        return whole
    k = len(view.dom_names[level])
    out = np.zeros(len(groups), dtype=bool)
    lab = groups < k
    out[lab] = view.dom_untouched[level][groups[lab]]
    out[~lab] = view.untouched[groups[~lab] - k]
    return out


# ---- hierarchical descent (greedy heuristics and baselines) --------------------------------


@dataclass(frozen=True, slots=True)
class Descent:
    """How a greedy descent picks domains.

    Attributes:
        partly_used_first: among domains that fit, prefer ones already partly used (keeps
            whole domains, e.g. NVL72 racks, free for the gangs that need them).
        tight: among domains that fit, take the smallest (BestFit); else the largest.
        node_order: ``"holes"`` (fewest free GPUs first, healthy first), ``"bestfit"``
            (largest first, the last one the tightest), ``"name"`` (name order).
        exact_split: when no single domain fits, choose the fewest domains and, inside
            them, the fewest child domains exactly (a small dynamic programme) instead of
            largest-first.
    """

    partly_used_first: bool = True
    tight: bool = True
    node_order: str = "holes"
    exact_split: bool = False


def _choose_groups(
    caps: np.ndarray,
    need: np.ndarray,
    untouched: np.ndarray,
    first: np.ndarray,
    p: int,
    how: Descent,
) -> list[tuple[int, np.ndarray]]:
    """Groups to use and each one's share of ``need`` (BestFit-style)."""
    chosen: list[tuple[int, np.ndarray]] = []
    remaining = need.copy()
    avail = np.ones(caps.shape[1], dtype=bool)
    while (remaining > 0).any() and avail.any():
        whole = avail & fits(caps, remaining)
        cand = np.flatnonzero(whole)
        if len(cand):
            if how.tight:
                key = [
                    (bool(untouched[g]) if how.partly_used_first else False, caps[p, g], first[g])
                    for g in cand
                ]
            else:
                key = [
                    (bool(untouched[g]) if how.partly_used_first else False, -caps[p, g], first[g])
                    for g in cand
                ]
            g = int(cand[min(range(len(cand)), key=key.__getitem__)])
        else:
            cand = np.flatnonzero(avail)
            key = [
                (-caps[p, g], bool(untouched[g]) if how.partly_used_first else False, first[g])
                for g in cand
            ]
            g = int(cand[min(range(len(cand)), key=key.__getitem__)])
        share = np.minimum(caps[:, g], remaining)
        if not share.any():
            break
        chosen.append((g, share))
        remaining = remaining - share
        avail[g] = False
    return chosen


def _dp_split(
    view: GangView, idx: np.ndarray, parent_level: int, child_level: int, need: np.ndarray
) -> list[tuple[int, np.ndarray]] | None:
    """Fewest parent domains, then fewest child domains, covering the primary role's need
    (exact max-plus programme with backtracking); parents as (group id, share of need).
    None when the levels are not nested or nothing covers."""
    p = view.primary
    target = int(need[p])
    if target <= 0:
        return None
    cg = view.group_ids(child_level)[idx]
    pg = view.group_ids(parent_level)[idx]
    cu, cinv = np.unique(cg, return_inverse=True)
    pairs = np.unique(np.stack([cg, pg]), axis=1)
    if pairs.shape[1] != len(cu):
        return None
    par = np.empty(len(cu), dtype=np.int64)
    par[np.searchsorted(cu, pairs[0])] = pairs[1]
    caps = np.bincount(cinv, weights=view.slots[p][idx], minlength=len(cu)).astype(np.int64)
    pu = np.unique(par)
    hs = []
    for q in pu.tolist():
        c = np.sort(caps[par == q])[::-1]
        hs.append(np.cumsum(c))
    l_max = int(min(len(cu), 4096))
    k_max = len(pu)
    neg = np.iinfo(np.int64).min // 4
    # Layered table: tables[s][j, L] = most members coverable with the first s parents, j of
    # them used, L children in total.
    tables = [np.full((k_max + 1, l_max + 1), neg, dtype=np.int64)]
    tables[0][0, 0] = 0
    best_j = None
    for h in hs:
        g = tables[-1]
        new = g.copy()
        for li, val in enumerate(h.tolist()[:l_max], start=1):
            cand = g[:-1, : l_max + 1 - li] + val
            np.maximum(new[1:, li:], cand, out=new[1:, li:])
        tables.append(new)
    last = tables[-1]
    for j in range(1, k_max + 1):
        ok = np.flatnonzero(last[j] >= target)
        if len(ok):
            best_j = (j, int(ok[0]))
            break
    if best_j is None:
        return None
    j, L = best_j
    picks: list[tuple[int, int]] = []
    for si in range(len(hs) - 1, -1, -1):
        cur = tables[si + 1][j, L]
        if tables[si][j, L] == cur:
            continue
        h = hs[si]
        for li in range(1, min(len(h), L) + 1):
            if j >= 1 and tables[si][j - 1, L - li] + int(h[li - 1]) == cur:
                picks.append((int(pu[si]), li))
                j -= 1
                L -= li
                break
        else:  # pragma: no cover - the table is consistent by construction
            return None
    # Shares: larger contributions first.
    puq, pcaps, _ = group_capacity(view, idx, view.group_ids(parent_level))
    out = []
    remaining = need.copy()
    picks.sort(key=lambda t: (-int(hs[int(np.searchsorted(pu, t[0]))][t[1] - 1]), t[0]))
    for q, li in picks:
        gi = int(np.searchsorted(puq, q))
        share = np.minimum(pcaps[:, gi], remaining)
        share[p] = min(int(remaining[p]), int(hs[int(np.searchsorted(pu, q))][li - 1]))
        out.append((gi, share))
        remaining = remaining - share
    return out


def node_sequence(view: GangView, idx: np.ndarray, need: np.ndarray, how: Descent) -> list[int]:
    """Candidates ``idx`` in the order the descent fills them at node level."""
    if len(idx) == 0:
        return []
    if how.node_order == "name":
        return sorted(int(x) for x in idx)
    if how.node_order == "holes":
        order = np.lexsort((idx, view.free[idx], view.risk[idx] > 0))
        return [int(x) for x in idx[order]]
    gid = view.group_ids(REQ_NODE)
    uq, caps, first = group_capacity(view, idx, gid)
    chosen = _choose_groups(
        caps, need, view.untouched[uq], first, view.primary, replace(how, partly_used_first=False)
    )
    picked = [int(uq[g]) for g, _ in chosen]
    rest = sorted(set(idx.tolist()) - set(picked))
    return picked + rest


def _lookahead(
    view: GangView,
    idx: np.ndarray,
    gid: np.ndarray,
    uq: np.ndarray,
    caps: np.ndarray,
    first: np.ndarray,
    untouched: np.ndarray,
    ok: np.ndarray,
    child_level: int,
    need: np.ndarray,
) -> list[tuple[int, np.ndarray]]:
    """Among domains that fit whole, the one needing the fewest child domains (then
    partly used first, tightest, name order)."""
    p = view.primary
    cg = view.group_ids(child_level)
    g_of = np.searchsorted(uq, gid[idx])
    best: tuple[int, bool, int, int] | None = None
    best_g = -1
    for g in np.flatnonzero(ok).tolist():
        _, ccaps, _ = group_capacity(view, idx[g_of == g], cg)
        k = cover(ccaps[p], int(need[p]))
        key = (k if k >= 0 else BIG, bool(untouched[g]), int(caps[p, g]), int(first[g]))
        if best is None or key < best:
            best, best_g = key, g
    return [(best_g, need.copy())]


def descend(
    view: GangView, idx: np.ndarray, levels: Sequence[int], need: np.ndarray, how: Descent
) -> list[int]:
    """Order candidates ``idx`` for first-fit filling: at each level (coarse to fine) the
    domains chosen for the gang come first, recursively; every node not chosen follows at
    the very end as overflow."""
    chosen, rest = _descend(view, idx, levels, need, how)
    return chosen + node_sequence(view, np.array(sorted(rest), dtype=np.int64), need, Descent())


def _descend(
    view: GangView, idx: np.ndarray, levels: Sequence[int], need: np.ndarray, how: Descent
) -> tuple[list[int], list[int]]:
    if len(idx) == 0:
        return [], []
    if not levels:
        return node_sequence(view, idx, need, how), []
    li = levels[0]
    gid = view.group_ids(li)
    uq, caps, first = group_capacity(view, idx, gid)
    chosen = None
    ok = fits(caps, need)
    if how.exact_split and len(levels) >= 2 and not ok.any():
        chosen = _dp_split(view, idx, li, levels[1], need)
    elif how.exact_split and len(levels) >= 2 and int(ok.sum()) > 1:
        untouched = group_untouched(view, li, uq)
        chosen = _lookahead(view, idx, gid, uq, caps, first, untouched, ok, levels[1], need)
    if chosen is None:
        chosen = _choose_groups(caps, need, group_untouched(view, li, uq), first, view.primary, how)
    out: list[int] = []
    rest: list[int] = []
    used = np.zeros(len(uq), dtype=bool)
    g_of = np.searchsorted(uq, gid[idx])
    for g, share in chosen:
        o, r = _descend(view, idx[g_of == g], levels[1:], share, how)
        out += o
        rest += r
        used[g] = True
    rest += idx[~used[g_of]].tolist()
    return out, rest


def levels_below(view: GangView, level: int) -> list[int]:
    """Level indices finer than ``level``, coarse to fine (all levels for REQ_NONE)."""
    if level == REQ_NODE:
        return []
    top = len(view.levels) if level == REQ_NONE else level
    return list(range(top - 1, -1, -1))


# ---- nested (lexicographic) lower bounds ----------------------------------------------------

NESTED_SPAN = 3
"""Conditional bounds are computed for parent counts LB .. LB + NESTED_SPAN."""


def _max_cover_table(
    parent_of_child: np.ndarray, child_caps: np.ndarray, k_max: int, l_max: int
) -> np.ndarray:
    """g[j, L]: the most members coverable with at most j parents and L children.

    Max-plus dynamic programme over parents: a parent's best use of l children is the sum of
    its l largest child capacities (children sorted by capacity, largest first).
    """
    neg = np.iinfo(np.int64).min // 4
    g = np.full((k_max + 1, l_max + 1), neg, dtype=np.int64)
    g[0, 0] = 0
    order = np.lexsort((-child_caps, parent_of_child))
    pc = parent_of_child[order]
    cc = child_caps[order]
    starts = np.flatnonzero(np.r_[True, pc[1:] != pc[:-1]])
    ends = np.r_[starts[1:], len(pc)]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        h = np.cumsum(cc[s:e])[:l_max]
        new = g.copy()
        for li, val in enumerate(h.tolist(), start=1):
            cand = g[:-1, : l_max + 1 - li] + val
            np.maximum(new[1:, li:], cand, out=new[1:, li:])
        g = new
    # "at most j parents, at most L children"
    g = np.maximum.accumulate(np.maximum.accumulate(g, axis=0), axis=1)
    return g


def nested_bounds(view: GangView, bounds: Bounds) -> dict[str, dict[int, int]]:
    """Conditional lower bounds: child level name -> {k: fewest child domains when at most
    k parent domains are used}, for consecutive levels (parent = next coarser level, child
    level counted as in :func:`lower_bounds`, unlabelled nodes as singletons), only where
    every child domain lies inside one parent domain. Primary role only (valid for any
    gang). Minimum over the candidate required-level scopes."""
    out: dict[str, dict[int, int]] = {}
    p = view.primary
    need = int(view.roles[p].count)
    if need <= 0 or not bounds.scopes:
        return out
    cap_all = view.slots[p]
    top = len(view.levels) if view.required == REQ_NONE else view.required
    if view.required == REQ_NODE:
        return out
    for child in range(0, top - 1):
        parent = child + 1
        lb_parent = bounds.per_level.get(view.levels[parent].name, -1)
        lb_child = bounds.per_level.get(view.levels[child].name, -1)
        if lb_parent < 1 or lb_child < 1:
            continue
        cg = view.group_ids(child)
        pg = view.group_ids(parent)
        res: dict[int, int] = {}
        for idx in bounds.scopes:
            cu, cinv = np.unique(cg[idx], return_inverse=True)
            pairs = np.unique(np.stack([cg[idx], pg[idx]]), axis=1)
            if pairs.shape[1] != len(cu):
                res = {}
                break  # not hierarchical: no conditional bound
            par = np.empty(len(cu), dtype=np.int64)
            par[np.searchsorted(cu, pairs[0])] = pairs[1]
            caps = np.bincount(cinv, weights=cap_all[idx], minlength=len(cu)).astype(np.int64)
            k_max = lb_parent + NESTED_SPAN
            l_max = min(len(cu), max(lb_child * 2, lb_child + 8 * (NESTED_SPAN + 1)))
            g = _max_cover_table(par, caps, k_max, l_max)
            for k in range(lb_parent, k_max + 1):
                ok = np.flatnonzero(g[k] >= need)
                if len(ok) == 0:
                    continue
                val = int(ok[0])
                if k not in res or val < res[k]:
                    res[k] = val
        # monotone: allowing more parents never needs more children
        if res:
            best = BIG
            for k in sorted(res):
                best = min(best, res[k])
                res[k] = best
            out[view.levels[child].name] = res
    return out
