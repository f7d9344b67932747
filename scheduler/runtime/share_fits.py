"""The fractional path's memory between pods: each node's fit per request form.

``scheduler.core.fractional.decide`` scores every node that can take a fractional pod; what
it computes of a node before scoring (the devices the pod would get, the projected free
share of each GPU: a :class:`~scheduler.core.fractional.Fit`) depends only on the node's
state and the request's form. Between two pods only the node that took the first one
changes, so :class:`FitMemo` keeps the fits of recent forms and hands them to
:func:`~scheduler.core.fractional.node_fits`, which reuses a fit exactly while the node's
object is the one it was computed on. Measured with ``python -m benchmarks.live.fractional``'s
offline replay (300 openb nodes, 1,600 HAMi pods): 25.1 ms -> 9.7 ms per pod, the same
1,600 placements.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.core.fractional import (
    ContainerAsk,
    Fit,
    NodeTenancy,
    PodShape,
    ShareRequest,
    TenantLimits,
    fit_form,
    node_fits,
    node_tenancy,
    pod_shapes,
)
from scheduler.core.model import NodeInfo, PodInfo
from scheduler.core.podmap import PodMap
from scheduler.core.share_table import (
    GPU_FIELDS,
    RowKey,
    RowsVerdict,
    ShareRow,
    StateFits,
    decide_rows,
    fit_states,
    share_row,
)
from scheduler.core.sharing import FragmentationModel, TaskShape, TypicalDistribution

MAX_FORMS = 64
"""Request forms kept (the least recently used is dropped first)."""
MAX_NODES_PER_FORM = 100_000
"""Fits kept per form: past this (node names come and go) the form starts afresh."""


class FitMemo:
    """Fits per request form (:func:`~scheduler.core.fractional.fit_form`), by node name,
    for the per-node path; and, for the vector path, the nodes' share columns
    (:attr:`rows`) and what the held pods mean for the next (:attr:`held`). Thread-safe: a
    prioritize may run on a worker thread beside filter."""

    def __init__(self, forms: int = MAX_FORMS, nodes_per_form: int = MAX_NODES_PER_FORM) -> None:
        self._forms: OrderedDict[Any, dict[str, Fit]] = OrderedDict()
        self._size = forms
        self._nodes = nodes_per_form
        self._lock = threading.Lock()
        self.rows = ShareRows()
        """The nodes' share columns, for the vector path (``scheduler.core.share_table``)."""
        self.held = HeldShares()
        """The held pods' shape counts (FGD's target workload) and the nodes' tenancy."""

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Request forms remembered and their nodes' fits, the share columns' stores
        (:meth:`ShareRows.sizes`), and the held pods' shapes (one per share pod held),
        with their caps: ``/v1/inspect/state``."""
        with self._lock:
            forms = len(self._forms)
            fits = sum(map(len, self._forms.values()))
        return {
            "forms": (forms, self._size),
            "node_fits": (fits, self._size * self._nodes),
            **self.rows.sizes(),
            **self.held.sizes(),
        }

    def fits(
        self,
        nodes: Sequence[NodeInfo],
        req: ShareRequest,
        selection_policy: str,
        tenancy: Mapping[str, NodeTenancy] | None = None,
    ) -> dict[str, Fit]:
        """:func:`~scheduler.core.fractional.node_fits` of ``nodes`` (with ``tenancy``),
        reusing and then keeping this form's fits."""
        key = fit_form(req, selection_policy)
        with self._lock:
            known = self._forms.get(key)
            if known is not None:
                self._forms.move_to_end(key)
        got = node_fits(nodes, req, selection_policy, known, tenancy)
        with self._lock:
            table = self._forms.get(key)
            if table is None or len(table) + len(got) > self._nodes:
                table = self._forms[key] = {}
                while len(self._forms) > self._size:
                    self._forms.popitem(last=False)
            table.update(got)
        return got

    def forms(self) -> int:
        """How many request forms are kept."""
        with self._lock:
            return len(self._forms)


class ShareRows:
    """The :func:`~scheduler.core.share_table.share_row` of every node of the latest
    snapshot seen, as columns, with each row's state id; brought up to date per call by
    recomputing only the rows whose node object changed (a snapshot replaces a node's
    object whenever anything on it changes, and keeps it otherwise).

    Thread-safe: one lock around the update and the decision that reads the columns (a
    prioritize may run on a worker thread beside filter). The nodes tuple last seen is held,
    so the object ids compared stay those of live objects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: tuple[NodeInfo, ...] | None = None
        self._ids = np.zeros(0, dtype=np.int64)
        self._gpu = np.zeros((0, 0, len(GPU_FIELDS)), dtype=np.int64)
        self._form = np.zeros(0, dtype=np.int64)
        self._capacity = np.zeros(0, dtype=np.int64)
        self._cpu_free = np.zeros(0, dtype=np.int64)
        self._cpu_capacity = np.zeros(0, dtype=np.int64)
        self._models: list[str] = []
        self._state_of = np.zeros(0, dtype=np.int64)
        self._states: dict[RowKey, int] = {}
        self._fits: OrderedDict[FitKey, StateFits] = OrderedDict()
        self._done: dict[FitKey, np.ndarray] = {}
        self._tenancy: Mapping[str, NodeTenancy] = {}
        self._tversion = 0
        self._frags: OrderedDict[tuple[TypicalDistribution, tuple[str, ...]], Any] = OrderedDict()
        self.rebuilds = 0
        """Full rebuilds so far (a new node set, or a node wider than the columns)."""
        self.compactions = 0
        """Times the states no row is in were dropped (:meth:`_compact`)."""
        self.epoch = 0
        """Bumped whenever the node set or a node's devices changed: the shapes of held
        shares must then be read again (:class:`HeldShares`)."""

    def _put(self, i: int, row: ShareRow) -> None:
        self._form[i] = row.form
        self._capacity[i] = row.capacity
        self._cpu_free[i] = row.cpu_free
        self._cpu_capacity[i] = row.cpu_capacity
        self._models[i] = row.model
        g = self._gpu[i]
        g[:] = 0
        if row.gpus:
            g[: len(row.gpus)] = row.gpus
        key = row.key
        sid = self._states.get(key)
        if sid is None:
            sid = self._states[key] = len(self._states)
        self._state_of[i] = sid

    def _row(self, node: NodeInfo) -> ShareRow:
        return share_row(node, self._tenancy.get(node.name))

    def _rebuild(self, nodes: tuple[NodeInfo, ...]) -> None:
        n = len(nodes)
        rows = [self._row(node) for node in nodes]
        width = max([8, *(r.capacity for r in rows)])
        self._gpu = np.zeros((n, width, len(GPU_FIELDS)), dtype=np.int64)
        self._form = np.zeros(n, dtype=np.int64)
        self._capacity = np.zeros(n, dtype=np.int64)
        self._cpu_free = np.zeros(n, dtype=np.int64)
        self._cpu_capacity = np.zeros(n, dtype=np.int64)
        self._models = [""] * n
        self._state_of = np.zeros(n, dtype=np.int64)
        self._states = {}
        self._fits.clear()  # state ids are given afresh
        self._done.clear()
        for i, r in enumerate(rows):
            self._put(i, r)
        self.rebuilds += 1

    def _update(self, nodes: tuple[NodeInfo, ...]) -> bool:
        """Bring the columns to ``nodes``; True when a node's devices (what a held share's
        shape is read against) may have changed, or the node set did."""
        if nodes is self._nodes:
            return False
        ids = np.fromiter(map(id, nodes), dtype=np.int64, count=len(nodes))
        old = self._nodes
        if old is None or len(old) != len(nodes):
            self._rebuild(nodes)
            self._nodes, self._ids = nodes, ids
            return True
        devices_changed = False
        width = self._gpu.shape[1]
        changed = np.flatnonzero(ids != self._ids).tolist()
        for i in changed:
            if old[i].name != nodes[i].name or nodes[i].gpu_capacity > width:
                self._rebuild(nodes)
                self._nodes, self._ids = nodes, ids
                return True
        for i in changed:
            if old[i].devices != nodes[i].devices or old[i].gpu_capacity != nodes[i].gpu_capacity:
                devices_changed = True
            self._put(i, self._row(nodes[i]))
        self._nodes, self._ids = nodes, ids
        self._compact()
        return devices_changed

    def _state_cap(self) -> int:
        """States remembered before those no row is in are dropped (:meth:`_compact`)."""
        return STATES_PER_ROW * len(self._state_of) + STATE_SLACK

    def _compact(self) -> None:
        """Past :meth:`_state_cap`, drop the states no row is in any more and number the
        others afresh, carrying their fits: the tables stay near the working set (the
        current rows' states) instead of climbing to a ceiling set by every state ever
        seen, and no fit of a state still in use is computed again."""
        if len(self._states) <= self._state_cap():
            return
        live = np.unique(self._state_of)
        new_id = np.full(len(self._states), -1, dtype=np.int64)
        new_id[live] = np.arange(len(live), dtype=np.int64)
        self._states = {
            key: int(new_id[sid]) for key, sid in self._states.items() if new_id[sid] >= 0
        }
        self._state_of = new_id[self._state_of]
        room = self._room(len(live))
        for key, known in self._fits.items():
            self._carry(key, known, live[live < len(known.fits)], room)
        self.compactions += 1

    def _carry(self, key: FitKey, src: StateFits, at: np.ndarray, room: int) -> StateFits:
        """``key``'s fits table made anew with ``room`` rows: the rows ``at`` of ``src``
        first, with whether each was computed, zeros after."""
        table = StateFits(
            *(_rows(getattr(src, f), at, room) for f in StateFits.__dataclass_fields__)
        )
        done = np.zeros(room, dtype=bool)
        if len(at):
            done[: len(at)] = self._done[key][at]
        self._fits[key] = table
        self._done[key] = done
        return table

    def _room(self, size: int) -> int:
        """Rows of a fits table with room for ``size`` states: twice as many (states come
        one at a time), at least 64, at most what :meth:`_compact` lets the states reach."""
        return max(size, min(max(64, 2 * size), self._state_cap() + 1))

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """States numbered, request forms with a fits table, the tables' rows in all, and
        fragmentation models kept, each with its cap: ``/v1/inspect/state``."""
        with self._lock:
            cap = self._state_cap()
            return {
                "row_states": (len(self._states), cap),
                "fit_forms": (len(self._fits), MAX_FORMS),
                "fit_rows": (
                    sum(len(t.fits) for t in self._fits.values()),
                    MAX_FORMS * (cap + 1),
                ),
                "frag_models": (len(self._frags), MAX_FRAGS),
            }

    def refresh(self, nodes: tuple[NodeInfo, ...]) -> int:
        """Bring the columns to ``nodes`` (a snapshot's); the :attr:`epoch` after it."""
        with self._lock:
            if self._update(nodes):
                self.epoch += 1
            return self.epoch

    def decide(
        self,
        nodes: tuple[NodeInfo, ...],
        pos: np.ndarray,
        form: int,
        ask: ContainerAsk,
        limits: TenantLimits | None,
        cpu_milli: int,
        dist: TypicalDistribution,
        policy: str,
        held: HeldShares,
        index: Mapping[str, int],
        tenancy: Mapping[str, NodeTenancy],
        version: int,
    ) -> tuple[RowsVerdict, np.ndarray, np.ndarray]:
        """(the verdict of the rows of ``pos`` whose backend is ``form`` and that have a
        GPU, the rows of ``pos`` of another backend, the rows with no GPU) on ``nodes``
        (``index``: name -> position), with the nodes' ``tenancy`` at ``version`` of
        ``held``."""
        with self._lock:
            # Take the tenancy: the rows of the nodes whose tenancy changed since the last
            # one taken are read again (every row when too many changes were missed).
            names: set[str] | None = set()
            if version != self._tversion or tenancy is not self._tenancy:
                names = held.changed_since(self._tversion)
                if names is None:
                    self._nodes = None
                self._tenancy, self._tversion = tenancy, version
            if self._update(nodes):
                self.epoch += 1
            for name in names or ():
                i = index.get(name)
                if i is not None:
                    self._put(i, self._row(nodes[i]))
            if names:
                self._compact()
            forms = self._form[pos]
            other = pos[forms != form]
            mine = pos[forms == form]
            too_few = mine[self._capacity[mine] < 1]
            mine = mine[self._capacity[mine] >= 1]
            verdict = decide_rows(
                self._state_of,
                self._gpu,
                self._capacity,
                self._cpu_free,
                self._cpu_capacity,
                self._models,
                mine,
                ask,
                cpu_milli,
                dist,
                policy,
                lambda states, reps: self._fitted((ask, limits), states, reps),
                limits,
                self._frag,
            )
        return verdict, other, too_few

    def _frag(self, dist: TypicalDistribution, models: tuple[str, ...]) -> Any:
        """``FragmentationModel.build(dist, models)``, kept for the last few workloads: the
        next pod's filter meets the workload the last prioritize (or the bind of the pod
        before) left, and the model's memo of expected waste is costly to refill."""
        key = (dist, models)
        got = self._frags.get(key)
        if got is None:
            got = self._frags[key] = FragmentationModel.build(dist, models)
            while len(self._frags) > MAX_FRAGS:
                self._frags.popitem(last=False)
        else:
            self._frags.move_to_end(key)
        return got

    def _fitted(self, key: FitKey, states: np.ndarray, reps: np.ndarray) -> StateFits:
        """The fits of ``key`` (an ask and its limits) on ``states`` (``reps``: a row of
        each), computed once per state and key (a state's id names the same values until
        the next rebuild)."""
        ask, limits = key
        known = self._fits.get(key)
        size = len(self._states)
        if known is None:
            new = fit_states(self._gpu[reps], self._capacity[reps], ask, limits)
            known = self._grown(key, new, size)
            done = self._done[key]
            for f in StateFits.__dataclass_fields__:
                getattr(known, f)[states] = getattr(new, f)
            done[states] = True
            return new
        if len(known.fits) < size:
            known = self._grown(key, known, size)
        self._fits.move_to_end(key)
        done = self._done[key]
        todo = ~done[states]
        if todo.any():
            new = fit_states(self._gpu[reps[todo]], self._capacity[reps[todo]], ask, limits)
            at = states[todo]
            for f in StateFits.__dataclass_fields__:
                getattr(known, f)[at] = getattr(new, f)
            done[at] = True
        return known.take(states)

    def _grown(self, key: FitKey, like: StateFits, size: int) -> StateFits:
        """``key``'s fits table with room for ``size`` states (grown geometrically: states
        come one at a time), keeping what it had: arrays shaped as ``like``'s (zero where
        not computed; ``_done`` says which are), kept as the most recently used."""
        known = self._fits.get(key)
        kept = np.arange(0 if known is None else len(known.fits))
        grown = self._carry(key, like if known is None else known, kept, self._room(size))
        self._fits.move_to_end(key)
        while len(self._fits) > MAX_FORMS:
            gone, _ = self._fits.popitem(last=False)
            self._done.pop(gone, None)
        return grown


MAX_FRAGS = 4
"""Fragmentation models kept (:meth:`ShareRows._frag`)."""
TENANCY_LOG = 256
"""Tenancy changes remembered for :meth:`HeldShares.changed_since`."""
STATES_PER_ROW = 2
"""States remembered per node (with :data:`STATE_SLACK`) before those no row is in are
dropped: every change to a node's shares gives it a new state, so without this the
tables grow with the changes seen, not with the nodes."""
STATE_SLACK = 64
"""States remembered beyond :data:`STATES_PER_ROW` per node."""


def _rows(a: np.ndarray, at: np.ndarray, room: int) -> np.ndarray:
    """The rows ``at`` of ``a`` first, in a new array of ``room`` rows (zeros after)."""
    out = np.zeros((room, *a.shape[1:]), dtype=a.dtype)
    out[: len(at)] = a[at]
    return out


FitKey = tuple[ContainerAsk, TenantLimits | None]
"""What a state's fit depends on besides the state: the ask and the request's limits."""


class HeldShares:
    """What the pods holding GPUs mean for the next share pod, kept between pods: FGD's
    target workload counts (:func:`~scheduler.core.fractional.pod_shapes`) and the
    tenancy of every node holding shares (:func:`~scheduler.core.fractional.node_tenancy`).

    A snapshot's pods are a ``PodMap`` whose versions share their base dict, so only the
    keys in either version's changes are read again (found by comparing every key when the
    base was flattened; all pods read again only when the epoch moved: devices changed). Thread-safe (one lock); the
    tenancy mapping handed out is never changed afterwards (a change makes a new one)."""

    def __init__(self) -> None:
        self._pods: Mapping[str, PodInfo] | None = None
        self._shapes: dict[str, PodShape] = {}
        self._counts: Counter[TaskShape] = Counter()
        self._on: dict[str, set[str]] = {}  # node -> keys of the share pods on it
        self._tenancy: dict[str, NodeTenancy] = {}
        self._epoch = -1
        self._lock = threading.Lock()
        self.version = 0
        """Bumped with every change of the tenancy mapping."""
        self._log: deque[tuple[int, frozenset[str]]] = deque(maxlen=TENANCY_LOG)

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Held pods' shapes, nodes with shares, tenancy entries (each bounded by the
        held pods and nodes), and the change log with its cap."""
        with self._lock:
            return {
                "held_shapes": (len(self._shapes), None),
                "share_nodes": (len(self._on), None),
                "tenancy": (len(self._tenancy), None),
                "tenancy_log": (len(self._log), TENANCY_LOG),
            }

    def _full(self, nodes: Sequence[NodeInfo], pods: Mapping[str, PodInfo]) -> None:
        self._shapes = pod_shapes(nodes, pods.values(), self._shapes)
        self._counts = Counter(s for _, _, s in self._shapes.values())
        self._on = {}
        for k, p in pods.items():
            if p.shares:
                self._on.setdefault(p.node, set()).add(k)

    def update(
        self,
        nodes: Sequence[NodeInfo],
        index: Mapping[str, int],
        pods: Mapping[str, PodInfo],
        epoch: int,
    ) -> tuple[Counter[TaskShape], Mapping[str, NodeTenancy], int]:
        """(the shape counts of ``pods`` on ``nodes``, a copy the caller may change; the
        tenancy per node holding shares; its :attr:`version`). ``index``: name ->
        position; ``epoch``: :attr:`ShareRows.epoch` of ``nodes`` (all pods are read again
        when it moved)."""
        with self._lock:
            old = self._pods
            keys = None if epoch != self._epoch or old is None else changed_keys(old, pods)
            self._epoch = epoch
            touched: set[str] = set()
            if keys is None:
                self._full(nodes, pods)
                touched = set(self._on) | set(self._tenancy)
            else:
                for k in keys:
                    before = self._shapes.pop(k, None)
                    if before is not None:
                        self._counts[before[2]] -= 1
                    was = old.get(k) if old is not None else None
                    if was is not None and was.shares:
                        self._on.get(was.node, set()).discard(k)
                        touched.add(was.node)
                    p = pods.get(k)
                    if p is None:
                        continue
                    if p.shares:
                        self._on.setdefault(p.node, set()).add(k)
                        touched.add(p.node)
                    i = index.get(p.node)
                    got = pod_shapes((nodes[i],), (p,)) if i is not None else {}
                    if k in got:
                        self._shapes[k] = got[k]
                        self._counts[got[k][2]] += 1
            self._pods = pods
            changed: set[str] = set()
            if touched:
                tenancy = dict(self._tenancy)
                for name in touched:
                    i = index.get(name)
                    held = self._on.get(name)
                    if i is None or not held:
                        self._on.pop(name, None)
                        if tenancy.pop(name, None) is not None:
                            changed.add(name)
                        continue
                    t = node_tenancy(nodes[i], [pods[k] for k in held if k in pods])
                    if tenancy.get(name) != t:
                        tenancy[name] = t
                        changed.add(name)
                if changed:
                    self._tenancy = tenancy
                    self.version += 1
                    self._log.append((self.version, frozenset(changed)))
            return +self._counts, self._tenancy, self.version

    def changed_since(self, version: int) -> set[str] | None:
        """Nodes whose tenancy changed after ``version`` (None: too long ago to say)."""
        with self._lock:
            if version == self.version:
                return set()
            if not self._log or self._log[0][0] > version + 1:
                return None
            out: set[str] = set()
            for v, names in self._log:
                if v > version:
                    out |= names
            return out


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """The keys whose value differs (by identity) between two pod maps, or that only one
    has. Two ``PodMap`` versions that share their base dict differ only within their
    changes and deletions; otherwise (a version flattened its changes into a new base,
    about once every ``sqrt(pods)`` updates) every key is compared, which costs a pass over
    the pods, not the shapes and tenancy of every pod read again."""
    if isinstance(old, PodMap) and isinstance(new, PodMap) and old._base is new._base:  # noqa: SLF001
        keys = set(old._delta) | set(new._delta) | set(old._gone) | set(new._gone)  # noqa: SLF001
        return {k for k in keys if old.get(k) is not new.get(k)}
    missing = _MISSING
    out = {k for k, v in new.items() if old.get(k, missing) is not v}
    out.update(k for k in old if k not in new)
    return out


_MISSING: Any = object()
