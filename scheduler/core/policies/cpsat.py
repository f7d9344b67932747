"""``topoplace`` (alias ``cpsat``): whole-gang placement with OR-Tools CP-SAT.

Formulation (why it solves fast)
--------------------------------
Nothing is indexed by pod x node. Candidate nodes are **aggregated into classes** of
interchangeable nodes: same domain at every fabric level, same per-role slot counts, same
free GPU count, same untouched flag, same risk and cost (numpy ``unique`` over those
columns; typically a handful of classes per leaf or NVL72 rack). Members are aggregated by
role. Variables, for class c with N_c nodes and role r:

* ``y[r,c]`` in 0..min(count_r, N_c * slots[r,c]): members of role r placed in class c;
* ``n[c]`` in 0..N_c: nodes of class c used;
* ``u[l,d]`` boolean: domain d of level l used (only levels with more than one candidate
  domain or with unlabelled candidates, which count as one domain per node used);
* ``s[l]`` boolean: the whole gang is inside one domain of level l (bandwidth tiers).

Hard constraints: every member placed (``sum_c y[r,c] == count_r``); per-class capacity
(``y[r,c] <= slots[r,c] * n[c]``, and for gangs with several roles GPU/CPU/memory sums
against ``n[c]`` times the class's free amount); ``n[c] <= N_c * u[l,d(c)]`` and a per-domain
capacity cut for the primary role; the **exact lower bound** on domains at every level
(``D_l >= LB_l``, from :func:`~scheduler.core.policies.common.lower_bounds`), which gives the
solver the compactness bound immediately, so a placement at the bound is proven optimal for
that term without search; the required level (``sum_d u[R,d] == 1``; ``node`` = one node);
members already bound pin their domains. Health and the NVLink rule are applied before
(unhealthy, cordoned and NVLink-busy nodes have no slots).

Soft objective (minimised; integer, weights from ``params.gang.weights`` over
:data:`~scheduler.core.policies.common.DEFAULT_WEIGHTS`, recorded with every result):

* compactness: ``compactness * 2**i * D_l`` for the i-th level from the closest, plus
  ``preferred * D_P`` at a preferred level P, where P and the levels above it are made
  lexicographic (a domain fewer there outweighs any change below);
* bandwidth: ``bandwidth * sum_l (b_l - b_{l+1}) / b_best * (1 - s_l)``: the share of the best
  achievable tier bandwidth lost (telescoping over tiers);
* health: ``health * risk`` per member;
* fragmentation: ``fragmentation`` per untouched domain opened (fill partly used domains
  first), ``nvl_reserve`` per untouched NVLink domain opened by a gang that does not need
  one, and ``fragmentation / 8`` per GPU left free on a used node and per GPU a member
  leaves free on the node it lands on (best fit: holes before whole nodes);
* spares: ``spare`` per node missing from ``params.gang.spare_nodes`` free candidate nodes
  left in the chosen required (else preferred) domain;
* cost: ``cost * node cost`` per node used (label ``topoplace.io/cost`` or weight map
  ``cost.<gpu product>``);
* domain best fit (tie-break): among placements equal on every term above, the one whose
  used domains keep the least free capacity (tightest fit, as KAI bin-packing and Kueue
  BestFit choose). Per level l and labelled domain d, ``F_d`` = the primary role's free
  slots on d's candidates (free trays on NVL72 with whole-tray members); using d costs
  ``round(bestfit * BESTFIT_TICKS * F_d / max_d F_d)`` on ``u[l,d]``. The members placed in
  labelled domains of a level add up to a constant, so this is the capacity left free in
  the used domains (``F_d - used_d``) up to a constant, and it is linear in existing
  variables (no new variable). It is **lexicographically last**: every other term is
  multiplied by one plus the term's largest possible value (the sum of the largest
  ``min(domains, members)`` coefficients per level), so it never overrides compactness,
  the preferred / required semantics, health, fragmentation, spares or cost; ``bestfit``
  only sets its resolution, and 0 turns it off. Levels where every domain has the same
  free capacity (an empty cluster, the solver benchmark) or with unlabelled candidates get
  no term, so their model is unchanged.

Determinism: one search worker by default (``params.gang.workers``), ``random_seed =
params.gang.seed``, a deterministic-time limit (``max_deterministic_time``) equal to the
configured time limit, and a wall-clock cap (``max_time_in_seconds``) of three times it plus
one second as a safety net only. When the wall clock is not the binding limit (the normal case, see the
benchmark), the same input gives the same placement in every process. The greedy placement
(:mod:`greedy_topology`) is given as a hint; when the solver returns nothing in time the
greedy placement is used (status ``fallback``).

Class aggregation is exact for one role; with several roles a class's combined CPU/memory is
checked when members are placed on concrete nodes, and a class that does not fit is split
into single nodes and the model solved again (lazy disaggregation, at most a few rounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from scheduler.core.gang import NVLINK_LEVEL, GangRequest
from scheduler.core.params import SchedParams
from scheduler.core.policies.common import (
    BIG,
    REQ_NODE,
    Bounds,
    Filler,
    GangView,
    nested_bounds,
    prepare,
    refusal,
    role_order,
    success,
)
from scheduler.core.policies.greedy_topology import greedy_fill
from scheduler.core.policies.registry import register
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot

NAME = "topoplace"
ALIAS = "cpsat"
SCALE = 100
WALL_CAP_FACTOR = 3.0
WALL_CAP_FLOOR = 1.0


def wall_cap(limit: float) -> float:
    """Wall-clock safety cap for a deterministic-time limit: generous enough that it never
    binds before the deterministic limit on a loaded machine (so results stay identical),
    while still bounding the time a pathological model can take."""
    return limit * WALL_CAP_FACTOR + WALL_CAP_FLOOR


MAX_ROUNDS = 3
BESTFIT_TICKS = 64
"""Resolution of the domain best-fit tie-break: coefficient of a domain with the largest
free capacity at its level when ``weights["bestfit"]`` is 1."""
LINEARIZATION_LEVEL = 2
"""Put every linear constraint into CP-SAT's LP relaxation: with it the domain-capacity and
fragmentation terms are bounded at the root (the default level 1 left a 10 % gap open on
the 2,000-node benchmark after a second; level 2 proves optimality in tens of ms)."""

_STATUS: dict[Any, str] = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.MODEL_INVALID: "invalid",
    cp_model.UNKNOWN: "unknown",
}


@dataclass
class _Classes:
    """Aggregated candidate classes."""

    members: list[np.ndarray]  # candidate indices per class, ascending
    size: np.ndarray  # N_c
    slots: np.ndarray  # (roles, classes)
    free: np.ndarray
    untouched: np.ndarray
    risk: np.ndarray
    cost: np.ndarray
    cpu_min: np.ndarray
    mem_min: np.ndarray
    dom: np.ndarray  # (levels, classes), -1 = unlabelled
    of: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64)
    )  # class per candidate


def _classes(view: GangView, split: set[int]) -> _Classes:
    m = len(view.pos)
    uniq_split = np.full(m, -1, dtype=np.int64)
    if split:
        idx = np.array(sorted(split), dtype=np.int64)
        uniq_split[idx] = idx
    cols = [view.dom[i] for i in range(len(view.levels))]
    cols += [view.slots[r] for r in range(len(view.roles))]
    cols += [
        view.free,
        view.untouched.astype(np.int64),
        np.round(view.risk * 1000).astype(np.int64),
        np.round(view.cost * 1000).astype(np.int64),
        uniq_split,
    ]
    key = np.column_stack(cols) if m else np.zeros((0, len(cols)), dtype=np.int64)
    uniq, inv, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    order = np.argsort(inv, kind="stable")
    bounds = np.cumsum(counts)[:-1]
    members = np.split(order, bounds) if m else []
    k = len(uniq)
    cpu_min = np.full(k, BIG, dtype=np.int64)
    mem_min = np.full(k, BIG, dtype=np.int64)
    np.minimum.at(cpu_min, inv, view.cpu_free)
    np.minimum.at(mem_min, inv, view.mem_free)
    nl = len(view.levels)
    nr = len(view.roles)
    return _Classes(
        members=[np.sort(x) for x in members],
        size=counts.astype(np.int64),
        slots=uniq[:, nl : nl + nr].T.copy(),
        free=uniq[:, nl + nr].copy(),
        untouched=uniq[:, nl + nr + 1].astype(bool),
        risk=view.risk[[int(x[0]) for x in members]] if m else np.zeros(0),
        cost=view.cost[[int(x[0]) for x in members]] if m else np.zeros(0),
        cpu_min=cpu_min,
        mem_min=mem_min,
        dom=uniq[:, :nl].T.copy() if nl else np.zeros((0, k), dtype=np.int64),
        of=inv,
    )


class _Model:
    """The CP-SAT model of one gang over aggregated classes."""

    def __init__(
        self,
        view: GangView,
        bounds: Bounds,
        nested: dict[str, dict[int, int]],
        cls: _Classes,
        hint: Filler | None,
    ):
        self.view = view
        self.cls = cls
        self.m = cp_model.CpModel()
        m = self.m
        roles = view.roles
        k = len(cls.size)
        w = view.weights
        sum_ = cp_model.LinearExpr.sum
        wsum = cp_model.LinearExpr.weighted_sum

        # Variables per class.
        self.n = [m.new_int_var(0, int(cls.size[c]), f"n{c}") for c in range(k)]
        self.y: dict[tuple[int, int], Any] = {}
        for r, role in enumerate(roles):
            if role.count <= 0:
                continue
            for c in range(k):
                s = int(cls.slots[r, c])
                if s > 0:
                    self.y[r, c] = m.new_int_var(
                        0, min(role.count, s * int(cls.size[c])), f"y{r}_{c}"
                    )
        by_class: dict[int, list[tuple[int, Any]]] = {}
        for (r, c), v in self.y.items():
            by_class.setdefault(c, []).append((r, v))
        for r, role in enumerate(roles):
            vs = [v for (rr, _), v in self.y.items() if rr == r]
            if role.count > 0:
                m.add(sum_(vs) == role.count)
        gpu_roles = [r for r, role in enumerate(roles) if role.gpus > 0 and role.count > 0]
        cpu_roles = [r for r, role in enumerate(roles) if role.cpu_milli > 0 and role.count > 0]
        mem_roles = [r for r, role in enumerate(roles) if role.memory_bytes > 0 and role.count > 0]
        for c in range(k):
            ys = by_class.get(c, [])
            for r, v in ys:
                m.add(v <= int(cls.slots[r, c]) * self.n[c])
            m.add(self.n[c] <= sum_([v for _, v in ys]))
            if len([r for r, _ in ys if r in gpu_roles]) > 1:
                m.add(
                    wsum(
                        [v for r, v in ys if r in gpu_roles],
                        [roles[r].gpus for r, _ in ys if r in gpu_roles],
                    )
                    <= int(cls.free[c]) * self.n[c]
                )
            if len([r for r, _ in ys if r in cpu_roles]) > 1 and cls.cpu_min[c] < BIG:
                m.add(
                    wsum(
                        [v for r, v in ys if r in cpu_roles],
                        [roles[r].cpu_milli for r, _ in ys if r in cpu_roles],
                    )
                    <= int(cls.cpu_min[c]) * self.n[c]
                )
            if len([r for r, _ in ys if r in mem_roles]) > 1 and cls.mem_min[c] < BIG:
                m.add(
                    wsum(
                        [v for r, v in ys if r in mem_roles],
                        [roles[r].memory_bytes for r, _ in ys if r in mem_roles],
                    )
                    <= int(cls.mem_min[c]) * self.n[c]
                )

        # Domains per level.
        p = view.primary
        nl = len(view.levels)
        self.u: dict[tuple[int, int], Any] = {}
        self.d_expr: dict[int, Any] = {}
        self.d_max: dict[int, int] = {}
        self.d_const: dict[int, bool] = {}
        obj_terms: list[Any] = []
        obj_coefs: list[int] = []
        offset = 0

        def add_obj(var: Any, coef: float) -> None:
            ci = int(round(coef))
            if ci:
                obj_terms.append(var)
                obj_coefs.append(ci)

        for li in range(nl):
            doms = cls.dom[li]
            labelled = np.unique(doms[doms >= 0])
            singles = [c for c in range(k) if doms[c] < 0]
            fixed = view.fixed_dom[li]
            if (
                len(labelled) + len(singles) <= 1
                and not singles
                and len(fixed - set(labelled.tolist())) == 0
            ):
                self.d_const[li] = True
                continue
            terms = []
            for d in labelled.tolist():
                u = m.new_bool_var(f"u{li}_{d}")
                self.u[li, d] = u
                terms.append(u)
                in_d = np.flatnonzero(doms == d)
                for c in in_d.tolist():
                    m.add(self.n[c] <= int(cls.size[c]) * u)
                cap = int(sum(int(cls.slots[p, c]) * int(cls.size[c]) for c in in_d.tolist()))
                yp = [self.y[p, c] for c in in_d.tolist() if (p, c) in self.y]
                if yp and cap < roles[p].count:
                    m.add(sum_(yp) <= cap * u)
                if d in fixed:
                    m.add(u == 1)
            const = len([d for d in fixed if d < 0 or d not in set(labelled.tolist())])
            expr = sum_(terms + [self.n[c] for c in singles]) + const
            self.d_expr[li] = expr
            self.d_max[li] = len(terms) + int(sum(int(cls.size[c]) for c in singles)) + const
            lb = bounds.per_level.get(view.levels[li].name, -1)
            if lb > 0:
                m.add(expr >= lb)

        self.lw = self._level_weights(bounds)

        # Conditional (nested) bounds: at most k parent domains => at least LB_k children,
        # plus the pair cut  w_c * D_child + w_p * D_parent >= min_k (w_c * LB_k + w_p * k)
        # that hands the LP the exact compactness bound of the pair.
        for li in range(nl - 1):
            table = nested.get(view.levels[li].name)
            if not table or li in self.d_const:
                continue
            parent = li + 1
            if parent in self.d_const:
                if 1 in table:
                    m.add(self.d_expr[li] >= table[1])
                continue
            for kk, lbk in sorted(table.items()):
                b = m.new_bool_var(f"nb{li}_{kk}")
                m.add(self.d_expr[parent] >= kk + 1).only_enforce_if(b.negated())
                m.add(self.d_expr[li] >= lbk).only_enforce_if(b)
            wc = self.lw[li]
            wp = self.lw[parent]
            lb_c = max(1, bounds.per_level.get(view.levels[li].name, 1))
            k_hi = max(table) + 1
            best = min([wc * v + wp * kk for kk, v in table.items()] + [wc * lb_c + wp * k_hi])
            m.add(wc * self.d_expr[li] + wp * self.d_expr[parent] >= best)

        # Required level.
        if view.required == REQ_NODE:
            m.add(sum_(self.n) == 1)
        elif view.required >= 0 and view.required not in self.d_const:
            li = view.required
            doms = cls.dom[li]
            choose = [u for (lv, _), u in self.u.items() if lv == li]
            for c in range(k):
                if doms[c] < 0:
                    b = m.new_bool_var(f"b{c}")
                    m.add(self.n[c] <= b)
                    choose.append(b)
            m.add(sum_(choose) == 1)

        # Objective: compactness (+ preferred level).
        for li in range(nl):
            if li in self.d_const:
                continue
            add_obj(self.d_expr[li], self.lw[li])

        # Bandwidth tiers: s_l = whole gang in one domain of level l.
        fabric = view.params.fabric
        bws = [lv.bandwidth_gbps for lv in view.levels] + [float(fabric.cross_cluster_gbps)]
        best = next(
            (li for li in range(nl) if bounds.per_level.get(view.levels[li].name, -1) == 1), nl
        )
        b_best = bws[best] if best < len(bws) else bws[-1]
        prev_s: Any = None
        self.s: dict[int, Any] = {}
        for li in range(nl - 1, best - 1, -1):
            delta = (bws[li] - bws[li + 1]) / b_best if b_best > 0 else 0.0
            if li in self.d_const:
                sv = None
            else:
                sv = m.new_bool_var(f"s{li}")
                self.s[li] = sv
                m.add(self.d_expr[li] <= 1 + self.d_max[li] * (1 - sv))
                if prev_s is not None:
                    m.add(sv <= prev_s)
                coef = w["bandwidth"] * SCALE * delta
                if int(round(coef)):
                    offset += int(round(coef))
                    add_obj(sv, -coef)
            if sv is not None:
                prev_s = sv

        # Health, stranded GPUs, cost per class.
        strand = w["fragmentation"] * SCALE / 8.0
        for c in range(k):
            for r, v in by_class.get(c, []):
                add_obj(v, w["health"] * SCALE * float(cls.risk[c]))
                if roles[r].gpus > 0:
                    # Best fit: GPUs a member leaves free on the node it lands on (holes
                    # first). A y-term: constant, so harmless to the LP, for whole-node members.
                    add_obj(v, strand * (int(cls.free[c]) - 2 * roles[r].gpus))
            add_obj(self.n[c], strand * int(cls.free[c]) + w["cost"] * SCALE * float(cls.cost[c]))

        # Fragmentation: untouched domains opened; NVL reserve.
        nvl = next((li for li, lv in enumerate(view.levels) if lv.name == NVLINK_LEVEL), -1)
        wants_nvl = NVLINK_LEVEL in (view.gang.topology.required, view.gang.topology.preferred)
        for (li, d), u in self.u.items():
            if view.dom_untouched[li][d]:
                add_obj(u, w["fragmentation"] * SCALE)
                if li == nvl and not wants_nvl:
                    add_obj(u, w["nvl_reserve"] * SCALE)

        # Spare nodes in the chosen required (else preferred) domain.
        spare = int(view.params.gang.spare_nodes)
        sl = view.required if view.required >= 0 else view.preferred
        if spare > 0 and sl >= 0:
            doms = cls.dom[sl]
            for (li, d), u in self.u.items():
                if li != sl:
                    continue
                room = [c for c in np.flatnonzero(doms == d).tolist() if cls.slots[p, c] > 0]
                if not room:
                    continue
                miss = m.new_int_var(0, spare, f"miss{d}")
                total = int(sum(int(cls.size[c]) for c in room))
                m.add(miss >= spare * u - (total - sum_([self.n[c] for c in room])))
                add_obj(miss, w["spare"] * SCALE)

        # Domain best fit (lexicographically last, see the module docstring).
        bf_terms, bf_coefs, tie = self._bestfit(w.get("bestfit", 0.0))
        obj_coefs = [c * tie for c in obj_coefs]
        offset *= tie
        m.minimize(wsum(obj_terms + bf_terms, obj_coefs + bf_coefs) + offset)
        self.offset = offset
        self.tie = tie
        if hint is not None:
            self._hint(hint)

    def _bestfit(self, weight: float) -> tuple[list[Any], list[int], int]:
        """Domain best-fit terms on ``u`` and the factor (> their largest possible sum) that
        puts every other objective term lexicographically before them."""
        view = self.view
        cls = self.cls
        p = view.primary
        size = view.gang.size + len(view.gang.fixed)
        terms: list[Any] = []
        coefs: list[int] = []
        tie = 1
        if weight <= 0:
            return terms, coefs, tie
        for li in range(len(view.levels)):
            if li in self.d_const:
                continue
            doms = cls.dom[li]
            if (doms < 0).any():
                continue
            us = [(d, u) for (lv, d), u in self.u.items() if lv == li]
            if len(us) < 2:
                continue
            cap = np.zeros(int(doms.max()) + 1, dtype=np.int64)
            np.add.at(cap, doms, cls.slots[p] * cls.size)
            top = int(cap.max())
            if top <= 0:
                continue
            cs = [int(round(weight * BESTFIT_TICKS * int(cap[d]) / top)) for d, _ in us]
            if len(set(cs)) < 2:
                continue
            for (_, u), c in zip(us, cs, strict=True):
                if c > 0:
                    terms.append(u)
                    coefs.append(c)
            tie += sum(sorted(cs, reverse=True)[: max(1, min(len(cs), size))])
        return terms, coefs, tie

    def _level_weights(self, bounds: Bounds) -> dict[int, int]:
        """Objective coefficient of one domain per level.

        ``compactness * 2**i`` (coarser tiers cost more: each one up halves the bandwidth in
        the default fabric). With a preferred level P, P and every coarser level become
        lexicographic: one domain fewer there outweighs any change at the finer levels
        (their widest possible swing), which is what "preferred" means in Kueue and KAI
        (stay in one P domain if at all possible, else in one domain of the next level up).
        """
        view = self.view
        w = view.weights
        size = view.gang.size + len(view.gang.fixed)
        out: dict[int, int] = {}
        swing = 0
        for li in range(len(view.levels)):
            if li in self.d_const:
                out[li] = 0
                continue
            c = w["compactness"] * SCALE * (2**li)
            if view.preferred >= 0 and li >= view.preferred:
                if li == view.preferred:
                    c += w["preferred"] * SCALE
                c = max(c, swing + 1)
            out[li] = int(round(c))
            lb = max(1, bounds.per_level.get(view.levels[li].name, 1))
            swing += out[li] * max(0, min(self.d_max[li], size) - lb)
        return out

    def _hint(self, f: Filler) -> None:
        cls = self.cls
        ny = {key: 0 for key in self.y}
        nn = [0] * len(cls.size)
        for j, placed in f.placed.items():
            c = int(cls.of[j])
            nn[c] += 1
            for r, _ in placed:
                if (r, c) in ny:
                    ny[r, c] += 1
        for key, v in self.y.items():
            self.m.add_hint(v, ny[key])
        for c, v in enumerate(self.n):
            self.m.add_hint(v, nn[c])
        for (li, d), u in self.u.items():
            used = any(nn[c] > 0 for c in np.flatnonzero(cls.dom[li] == d).tolist())
            self.m.add_hint(u, int(used))

    def solve(self, params: SchedParams) -> tuple[cp_model.CpSolver, Any]:
        solver = cp_model.CpSolver()
        g = params.gang
        prm = solver.parameters
        prm.num_workers = int(g.workers)
        prm.random_seed = int(g.seed)
        prm.max_deterministic_time = float(g.solver_time_limit_seconds)
        prm.max_time_in_seconds = wall_cap(float(g.solver_time_limit_seconds))
        prm.linearization_level = LINEARIZATION_LEVEL
        prm.log_search_progress = False
        status = solver.solve(self.m)
        return solver, status

    def materialize(self, solver: cp_model.CpSolver) -> tuple[Filler, set[int]]:
        """Place the solved counts on concrete nodes; classes that do not fit are returned."""
        view = self.view
        cls = self.cls
        f = Filler(view)
        bad: set[int] = set()
        order = role_order(view)
        for c in range(len(cls.size)):
            n = solver.value(self.n[c])
            if n <= 0:
                continue
            nodes = cls.members[c].tolist()
            for r in order:
                want = solver.value(self.y[r, c]) if (r, c) in self.y else 0
                for j in nodes:
                    if want <= 0:
                        break
                    want -= f.place_many(j, r, min(want, int(cls.slots[r, c])))
                if want > 0:
                    bad.add(c)
        return f, bad


def _record(
    solver: cp_model.CpSolver | None, cp_status: Any, view: GangView, tie: int = 1, **kw: Any
) -> dict[str, Any]:
    """The solver record. ``objective`` / ``bound`` are the soft objective without the
    best-fit tie-break (in weight units); ``bestfit_tiebreak`` is the tie-break's value
    (ticks) and ``tiebreak_factor`` the factor that puts it lexicographically last."""
    g = view.params.gang
    rec: dict[str, Any] = {
        "weights": dict(view.weights),
        "solver": {
            "engine": "ortools-cp-sat",
            "seed": int(g.seed),
            "workers": int(g.workers),
            "max_deterministic_time": float(g.solver_time_limit_seconds),
            "max_time_in_seconds": wall_cap(float(g.solver_time_limit_seconds)),
            "linearization_level": LINEARIZATION_LEVEL,
        },
    }
    if view.ignored_weights:
        rec["ignored_weights"] = list(view.ignored_weights)
    if solver is not None and cp_status is not None:
        has = cp_status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        obj = solver.objective_value if has else None
        bound = solver.best_objective_bound if has else None
        rec["solver_status"] = _STATUS.get(cp_status, str(cp_status))
        main = None if obj is None else int(round(obj)) // tie
        rec["objective"] = round(main / SCALE, 4) if main is not None else None
        rec["bound"] = round(bound / tie / SCALE, 4) if bound is not None else None
        if tie > 1:
            rec["tiebreak_factor"] = tie
            rec["bestfit_tiebreak"] = None if main is None else int(round(obj)) - main * tie
        rec["gap"] = (
            round(abs(obj - bound) / max(1.0, abs(obj)), 6)
            if obj is not None and bound is not None
            else None
        )
        rec["solve_time_ms"] = round(solver.wall_time * 1000, 3)
        rec["deterministic_time"] = round(solver.deterministic_time, 6)
    rec.update(kw)
    return rec


def _nested_json(nested: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    """Nested bounds as JSON: level -> {"at most k parent domains": fewest domains}."""
    return {lvl: {str(k): v for k, v in sorted(t.items())} for lvl, t in sorted(nested.items())}


def _plan(snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams) -> PlacementResult:
    prep = prepare(snapshot, gang, params, NAME)
    if isinstance(prep, PlacementResult):
        return prep
    view, bounds = prep
    if not bounds.scopes or any(v < 0 for v in bounds.per_level.values()):
        return refusal(
            view,
            NAME,
            bounds,
            **_record(None, None, view, status="infeasible", proof="capacity bound"),
        )
    hint = greedy_fill(view, bounds)
    nested = nested_bounds(view, bounds)
    split: set[int] = set()
    solver = status = None
    classes = 0
    tie = 1
    for rnd in range(MAX_ROUNDS):
        cls = _classes(view, split)
        classes = len(cls.size)
        model = _Model(view, bounds, nested, cls, hint)
        tie = model.tie
        solver, status = model.solve(params)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        f, bad = model.materialize(solver)
        if not bad and f.complete():
            return success(
                view,
                f.assignments(),
                NAME,
                bounds,
                **_record(
                    solver,
                    status,
                    view,
                    model.tie,
                    status=_STATUS[status],
                    classes=classes,
                    candidates=int(len(view.pos)),
                    rounds=rnd + 1,
                    lower_bound_nested=_nested_json(nested),
                ),
            )
        for c in sorted(bad):
            split.update(int(j) for j in cls.members[c])
    if hint is not None:
        return success(
            view,
            hint.assignments(),
            NAME,
            bounds,
            **_record(
                solver,
                status,
                view,
                tie,
                status="fallback",
                classes=classes,
                candidates=int(len(view.pos)),
                lower_bound_nested=_nested_json(nested),
            ),
        )
    st = "infeasible" if status == cp_model.INFEASIBLE else "unknown"
    return refusal(
        view, NAME, bounds, **_record(solver, status, view, tie, status=st, classes=classes)
    )


plan = register(NAME, ALIAS)(_plan)
