"""ClusterSnapshot: the immutable view every decision is made on.

A snapshot holds the nodes (sorted by name), the pods that hold resources, and per-node
numpy arrays derived from them so that filter and prioritize over thousands of nodes are
vector operations rather than Python loops:

* ``free`` / ``usable`` / ``capacity``: free healthy, healthy, and physical GPU counts;
* ``state`` / ``unschedulable`` / ``risk``: health;
* ``blocked``: why the node can take no GPU pod at all, whatever it asks for
  (``BLOCKED_*``; 0 when it can), so filter starts from one column;
* ``best_bw[i, k]``: ring bottleneck (GB/s) of the best k-GPU set node i can give now
  under the configured selection policy (what the device plugin would hand out);
* ``links_free[i, r]`` / ``links_usable[i, r]``: bitmask of set sizes k for which a ring
  of link class rank <= r exists among the free (resp. all healthy) GPUs.

Transitions (:func:`with_pod`, :func:`without_pod`, :func:`with_node`, ...) return new
snapshots; arrays are copied (a memcpy) and only changed rows are recomputed, so a
transition costs microseconds plus O(nodes) memcpy, never O(nodes) Python work. All arrays
are marked read-only.

No single object poisons the view. :func:`build_snapshot` and :func:`with_node_object`
survive any Node or Pod object: a node topoplace cannot model (more than ``MAX_NODE_GPUS``
GPUs, an unreadable field, a topology whose row cannot be computed, a name shared by two
objects) is kept as an unmodeled node (``NodeInfo.unmodeled``; UNHEALTHY with the constant
reason ``health.REASON_UNMODELED``, no GPUs in the model), logged, and counted by
:attr:`ClusterSnapshot.unmodeled_nodes`; a bound pod whose object cannot be read is
skipped and logged. Everything else is served. Logging is the core's only side effect
here (a warning per unmodeled node per full build, and when a node update turns a node
unmodeled); the result does not depend on it.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter
from types import MappingProxyType
from typing import Any

import numpy as np

from scheduler.core import dra
from scheduler.core.fractional import (
    SHARE_RECORD_KEYS,
    add_share,
    bound_shares,
    check_shares,
    node_devices,
)
from scheduler.core.health import NOW_KEY, RESOURCESLICES_KEY, devices_by_node, parse_time
from scheduler.core.linkclass import LINK_CLASSES, feasible_sizes
from scheduler.core.model import (
    EMPTY_MAP,
    GPU_RESOURCE,
    GpuShare,
    Health,
    NodeHealth,
    NodeInfo,
    PodInfo,
    indices_to_mask,
    mask_to_indices,
)
from scheduler.core.objects import (
    ObjectError,
    gang_of,
    meta,
    node_from_object,
    object_key,
    placement_of,
    pod_gpus,
    pod_replicas,
    pod_resource,
    pod_terminated,
    unmodeled_node,
)
from scheduler.core.params import SchedParams
from scheduler.core.podmap import PodMap
from scheduler.core.quantity import cpu_milli, quantity_int
from topology.select import best_bottlenecks

log = logging.getLogger(__name__)

UNMODELED_DUPLICATE = "several Node objects share this name"
"""``NodeInfo.unmodeled`` of a name given to more than one Node object in one build."""

BLOCKED_UNHEALTHY = 2
BLOCKED_CORDONED = 3
BLOCKED_NO_GPUS = 4
BLOCKED_SHARED = 11
"""Values of ``NodeArrays.blocked``, in precedence order (the filter's verdict codes).
``BLOCKED_SHARED``: a time-slicing / MPS replica node (``NodeInfo.replicas``), which no
whole-GPU pod or gang takes (``scheduler.core.replicas``)."""


class DoubleBookingError(ValueError):
    """A placement would give a GPU that another pod already holds."""


@dataclass(frozen=True, slots=True)
class NodeArrays:
    """Per-node vectors in node order (see module docstring). Read-only."""

    capacity: np.ndarray
    free: np.ndarray
    usable: np.ndarray
    state: np.ndarray
    unschedulable: np.ndarray
    risk: np.ndarray
    assumed: np.ndarray
    best_bw: np.ndarray
    links_free: np.ndarray
    links_usable: np.ndarray
    blocked: np.ndarray

    @property
    def max_gpus(self) -> int:
        """Largest set size the ``best_bw`` columns cover."""
        return int(self.best_bw.shape[1]) - 1


def _row(node: NodeInfo, policy: str, width: int) -> tuple[Any, ...]:
    free_mask = node.free_mask
    bw = best_bottlenecks(node.shape, free_mask, policy) if node.gpu_capacity else (0.0,)
    bw_row = list(bw[: width + 1]) + [0.0] * max(0, width + 1 - len(bw))
    lf = feasible_sizes(node.shape, free_mask) if node.gpu_capacity else (0,) * len(LINK_CLASSES)
    lu = (
        feasible_sizes(node.shape, node.usable_mask)
        if node.gpu_capacity
        else (0,) * len(LINK_CLASSES)
    )
    if node.health.state >= Health.UNHEALTHY:
        blocked = BLOCKED_UNHEALTHY
    elif node.health.unschedulable:
        blocked = BLOCKED_CORDONED
    elif node.replicas:
        blocked = BLOCKED_SHARED
    elif not node.gpu_capacity:
        blocked = BLOCKED_NO_GPUS
    else:
        blocked = 0
    return (
        node.gpu_capacity,
        free_mask.bit_count(),
        node.usable_mask.bit_count(),
        int(node.health.state),
        node.health.unschedulable,
        node.health.risk,
        node.shape_source == "assumed" and node.gpu_capacity > 0,
        bw_row,
        lf,
        lu,
        blocked,
    )


def _arrays(nodes: Sequence[NodeInfo], policy: str) -> NodeArrays:
    width = max([8] + [n.gpu_capacity for n in nodes])
    rows = [_row(n, policy, width) for n in nodes]
    count = len(nodes)
    nl = len(LINK_CLASSES)

    def col(i: int, dtype: Any) -> np.ndarray:
        return np.array([r[i] for r in rows], dtype=dtype) if rows else np.zeros(0, dtype)

    arr = NodeArrays(
        capacity=col(0, np.int32),
        free=col(1, np.int32),
        usable=col(2, np.int32),
        state=col(3, np.int8),
        unschedulable=col(4, np.bool_),
        risk=col(5, np.float64),
        assumed=col(6, np.bool_),
        # Column-major: a request reads one column (its set size or link class) across
        # many nodes, which is then one contiguous block of memory.
        best_bw=np.asfortranarray(
            np.array([r[7] for r in rows], np.float64).reshape(count, width + 1)
        ),
        links_free=np.asfortranarray(np.array([r[8] for r in rows], np.int64).reshape(count, nl)),
        links_usable=np.asfortranarray(np.array([r[9] for r in rows], np.int64).reshape(count, nl)),
        blocked=col(10, np.int8),
    )
    _freeze(arr)
    return arr


_ARRAY_FIELDS = tuple(NodeArrays.__dataclass_fields__)
"""The fields of :class:`NodeArrays`, in declaration (constructor) order."""


def _freeze(arr: NodeArrays) -> None:
    for f in arr.__dataclass_fields__:
        getattr(arr, f).flags.writeable = False


_ROWS_MEMO: list[tuple[NodeArrays, int, tuple[bytes, ...], NodeArrays]] = []
"""Recent single-row updates, most recent first: (arrays, row, the row's new bytes per
field, the arrays that update gave). Every update is remembered both ways: ``new`` is
``old`` with the row's new bytes, and ``old`` is ``new`` with the row's old bytes, so a
nomination released (or a pod removed and added again) gives back the arrays it had
before instead of copying them again. Entries hold their arrays (immutable, read-only),
so identity comparison is safe. Results are identical with or without it."""

_ROWS_MEMO_SIZE = 4


_PACKERS: dict[tuple[Any, tuple[int, ...]], struct.Struct | None] = {}
"""Packers by (array dtype, row shape): a row's values packed as the array stores them
(None: converted by numpy). A pure function of its key (memoized for speed)."""

_STRUCT_CODES = {"b1": "?", "i1": "b", "i2": "h", "i4": "i", "i8": "q", "f4": "f", "f8": "d"}


def _packer(dtype: Any, shape: tuple[int, ...]) -> struct.Struct | None:
    """How one row of an array of ``dtype`` whose rows have ``shape`` is packed into the
    bytes ``a[i].tobytes()`` holds (None for a dtype without a struct code)."""
    key = (dtype, shape)
    if key in _PACKERS:
        return _PACKERS[key]
    text = dtype.str
    code = _STRUCT_CODES.get(text[1:])
    p = None
    if code is not None and text[0] in "<>|" and len(shape) <= 1:
        count = shape[0] if shape else 1
        p = struct.Struct(("<" if text[0] == "|" else text[0]) + f"{count}{code}")
    _PACKERS[key] = p
    return p


def _as_stored(a: np.ndarray, value: Any) -> bytes:
    """``value`` (a row value as :func:`_row` gives it) as ``a``'s row bytes: exactly
    ``np.asarray(value, dtype=a.dtype).tobytes()``, packed with :mod:`struct` when the
    value packs as it is (ints, bools and floats, as many as the row holds), else by
    numpy."""
    shape = a.shape[1:]
    p = _PACKERS.get((a.dtype, shape)) or _packer(a.dtype, shape)
    if p is not None:
        try:
            return p.pack(*value) if shape else p.pack(value)
        except (struct.error, TypeError):
            pass
    return np.asarray(value, dtype=a.dtype).tobytes()


def _update_rows(arr: NodeArrays, changes: Mapping[int, NodeInfo], policy: str) -> NodeArrays:
    """``arr`` with the rows of ``changes`` recomputed. Arrays whose changed rows keep
    their bytes are shared with ``arr`` (read-only), not copied: a pod placed or removed
    changes a node's free GPUs and free sets, not its capacity, health or usable sets.
    One changed row (every pod placed or removed) is :func:`_update_row`, memoized."""
    width = arr.max_gpus
    columns = [getattr(arr, f) for f in _ARRAY_FIELDS]
    if len(changes) == 1:
        ((i, node),) = changes.items()
        return _update_row(arr, columns, i, _row(node, policy, width))
    rows = {i: _row(node, policy, width) for i, node in changes.items()}
    new_bytes = {i: tuple(map(_as_stored, columns, r)) for i, r in rows.items()}
    old_bytes = {i: tuple([a[i].tobytes() for a in columns]) for i in rows}
    for j, a in enumerate(columns):
        changed = [i for i in rows if new_bytes[i][j] != old_bytes[i][j]]
        if changed:
            a = a.copy(order="K")  # keep layout
            for i in changed:
                a[i] = rows[i][j]
            a.flags.writeable = False
            columns[j] = a
    new = NodeArrays(*columns)
    _derived(new, arr, tuple(rows))
    return new


def _update_row(
    arr: NodeArrays, columns: list[np.ndarray], i: int, row: tuple[Any, ...]
) -> NodeArrays:
    """:func:`_update_rows` of one row ``i`` whose new values are ``row`` (``columns``:
    ``arr``'s arrays in field order): the same arrays, memoized both ways in
    :data:`_ROWS_MEMO`, without the bookkeeping of several rows."""
    key = tuple(map(_as_stored, columns, row))
    for src, at, seen, out in _ROWS_MEMO:
        if src is arr and at == i and seen == key:
            _derived(out, arr, (i,))
            return out
    old = tuple([a[i].tobytes() for a in columns])
    for j, a in enumerate(columns):
        if key[j] != old[j]:
            a = a.copy(order="K")  # keep layout
            a[i] = row[j]
            a.flags.writeable = False
            columns[j] = a
    new = NodeArrays(*columns)
    _ROWS_MEMO[:0] = [(arr, i, key, new), (new, i, old, arr)]
    del _ROWS_MEMO[_ROWS_MEMO_SIZE:]
    _derived(new, arr, (i,))
    return new


_LINEAGE: list[tuple[NodeArrays, NodeArrays, tuple[int, ...]]] = []
"""Recent row updates, most recent first: (arrays, the arrays they were made from, the
rows in which they may differ). See :func:`arrays_parent`."""

_LINEAGE_SIZE = 8


def _derived(new: NodeArrays, old: NodeArrays, rows: tuple[int, ...]) -> None:
    if _LINEAGE and _LINEAGE[0][0] is new and _LINEAGE[0][1] is old:
        return
    _LINEAGE.insert(0, (new, old, rows))
    del _LINEAGE[_LINEAGE_SIZE:]


def arrays_parent(arrays: NodeArrays) -> tuple[NodeArrays, tuple[int, ...]] | None:
    """(the arrays ``arrays`` were made from by a recent row update, the rows in which
    they may differ; every other row is equal in every array), or None. Lets per-node
    values computed for the parent be brought up to date by recomputing those rows only
    (``scheduler.core.schedule``)."""
    for new, old, rows in _LINEAGE:
        if new is arrays:
            return old, rows
    return None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """An immutable cluster view.

    Attributes:
        nodes: nodes sorted by name.
        index: node name -> position in ``nodes`` and in every array.
        pods: pod key -> resources it holds (bound, assumed or running pods only).
        arrays: per-node vectors (see :class:`NodeArrays`).
        policy: GPU selection policy ``best_bw`` was computed with.
        generation: increases with every transition (for logs and metrics).
        extra: other objects kept for round-tripping and gang bookkeeping (e.g. PodGroups,
            pending pods), read-only.
    """

    nodes: tuple[NodeInfo, ...]
    index: Mapping[str, int]
    pods: Mapping[str, PodInfo]
    arrays: NodeArrays
    policy: str
    generation: int = 0
    extra: Mapping[str, Any] = field(default_factory=lambda: EMPTY_MAP)

    def node(self, name: str) -> NodeInfo | None:
        """The node called ``name`` or None."""
        i = self.index.get(name)
        return None if i is None else self.nodes[i]

    @property
    def names(self) -> tuple[str, ...]:
        """Node names in snapshot order."""
        return tuple(n.name for n in self.nodes)

    def pods_on(self, node: str) -> list[PodInfo]:
        """Pods holding resources on ``node``, sorted by key."""
        return sorted((p for p in self.pods.values() if p.node == node), key=lambda p: p.key)

    def gang_members(self, gang: str) -> list[PodInfo]:
        """Pods of a gang that hold resources, sorted by key."""
        return sorted((p for p in self.pods.values() if p.gang == gang), key=lambda p: p.key)

    @property
    def assumed_topology_nodes(self) -> int:
        """GPU nodes whose interconnect is unknown (treated as all-SYS)."""
        return int(self.arrays.assumed.sum())

    @property
    def unmodeled(self) -> tuple[str, ...]:
        """Names of the nodes topoplace cannot model (``NodeInfo.unmodeled``), in order."""
        return tuple(n.name for n in self.nodes if n.unmodeled)

    @property
    def unmodeled_nodes(self) -> int:
        """How many nodes topoplace cannot model (GPU pods are refused there); for the
        ``/metrics`` gauge. O(nodes) attribute reads."""
        return sum(1 for n in self.nodes if n.unmodeled)


def with_pods(snap: ClusterSnapshot, pods: Mapping[str, PodInfo]) -> ClusterSnapshot:
    """``snap`` with its pod records replaced by ``pods``, as a new generation; nodes and
    arrays are shared, so ``pods`` must hold the same usage as ``snap.pods`` (the same
    as ``dataclasses.replace(snap, pods=pods, generation=...)``, without its per-field
    work)."""
    return ClusterSnapshot(
        snap.nodes, snap.index, pods, snap.arrays, snap.policy, snap.generation + 1, snap.extra
    )


_NODE_FIELDS = tuple(f.name for f in fields(NodeInfo))
_NODE_VALUES = attrgetter(*_NODE_FIELDS)
_USAGE_AT = tuple(
    _NODE_FIELDS.index(f)
    for f in ("used_mask", "cpu_used_milli", "memory_used_bytes", "share_used", "replicas_used")
)
_NODE_BY_FIELDS = all(f.init for f in fields(NodeInfo))
"""Whether a NodeInfo can be rebuilt from all its fields in order (else ``replace``)."""


def _with_usage(
    node: NodeInfo, used_mask: int, cpu: int, memory: int, share_used: Any, replicas: int
) -> NodeInfo:
    """``dataclasses.replace(node, used_mask=..., cpu_used_milli=..., memory_used_bytes=...,
    share_used=..., replicas_used=...)``, built from the node's fields in one call."""
    if not _NODE_BY_FIELDS:  # pragma: no cover - a field that __init__ does not take
        return replace(
            node,
            used_mask=used_mask,
            cpu_used_milli=cpu,
            memory_used_bytes=memory,
            share_used=share_used,
            replicas_used=replicas,
        )
    values = list(_NODE_VALUES(node))
    for at, v in zip(_USAGE_AT, (used_mask, cpu, memory, share_used, replicas), strict=True):
        values[at] = v
    return NodeInfo(*values)


def _checked(node: NodeInfo, params: SchedParams) -> NodeInfo:
    """``node``, or the unmodeled node its object makes when its array row cannot be
    computed (a shape the GPU-set selection does not support, ...). Topology answers are
    memoized, so the row computed later for the arrays costs a lookup."""
    if node.unmodeled or not node.gpu_capacity:
        return node
    try:
        _row(node, params.selection_policy, max(8, node.gpu_capacity))
    except Exception as exc:  # one node that cannot be modelled must not stop the others
        return unmodeled_node(node.raw, params.fabric, f"{type(exc).__name__}: {exc}"[:200])
    return node


def _log_unmodeled(node: NodeInfo) -> None:
    log.warning(
        "node %s: topoplace cannot model it (%s); GPU pods are refused there",
        node.name,
        node.unmodeled,
    )


def gpus_by_dra(node: NodeInfo) -> bool:
    """Whether ``node``'s GPUs are DRA devices: it has GPUs but its Node object (which it
    must carry) does not advertise ``nvidia.com/gpu`` as allocatable (kube-scheduler then hands that resource out through
    DRA, from a DeviceClass that names it: ``dra.extended_resource_classes``)."""
    status = node.raw.get("status")
    return (
        node.gpu_capacity > 0
        and not node.replicas
        and not node.sharing
        and isinstance(status, Mapping)
        and bool(status)
        and dra.node_serves_by_dra(node.raw, GPU_RESOURCE)
    )


def _pod_info(pod: Mapping[str, Any], node: NodeInfo, taken: int, assumed: bool = False) -> PodInfo:
    """PodInfo for a pod bound to ``node``; GPU indices from its placement or inferred.
    On a node whose GPUs are DRA devices the pod holds none itself: its ``nvidia.com/gpu``
    came through DRA, and the claim kube-scheduler allocated for it holds them."""
    n = 0 if gpus_by_dra(node) else pod_gpus(pod)
    rec = placement_of(pod)
    known = (
        rec is not None
        and rec.get("node") in (None, node.name)
        and len(rec["gpus"]) == n
        and all(g < node.gpu_capacity for g in rec["gpus"])
    )
    if known and rec is not None:
        gpus = tuple(sorted(rec["gpus"]))
    else:
        # Bound without our record (another scheduler, or a pre-topoplace pod): assume the
        # lowest free healthy indices, then any other free index. Deterministic.
        avail = node.all_mask & ~taken
        order = mask_to_indices(avail & node.usable_mask) + mask_to_indices(
            avail & ~node.usable_mask
        )
        gpus = tuple(sorted(order[:n]))
    gang, _ = gang_of(pod)
    return PodInfo(
        key=object_key(pod),
        uid=uid if isinstance(uid := meta(pod).get("uid"), str) else "",
        node=node.name,
        gpus=gpus,
        gpu_indices_known=bool(known),
        cpu_milli=pod_resource(pod, "cpu", cpu_milli),
        memory_bytes=pod_resource(pod, "memory", quantity_int),
        gang=gang,
        assumed=assumed,
        raw=pod,
    )


def build_snapshot(
    node_objs: Iterable[Mapping[str, Any]],
    pod_objs: Iterable[Mapping[str, Any]],
    params: SchedParams,
    extra: Mapping[str, Any] | None = None,
    inventory: dra.Inventory | None = None,
) -> ClusterSnapshot:
    """Build a snapshot from Node and Pod objects. ``inventory``: ``dra.inventory`` of
    ``extra``'s ResourceSlices when the caller has it already (read from them otherwise).

    Pods count when bound (``spec.nodeName``) and not Succeeded/Failed. Pods with a
    placement record are placed first so inferred indices never collide with known ones.
    Pods on unknown nodes are ignored, and so is a second pod with the key of one already
    counted.

    Never raises on odd objects (see the module docstring): objects without a name are
    skipped and logged, nodes topoplace cannot model are kept as unmodeled nodes, and a
    name shared by several Node objects makes one unmodeled node
    (:data:`UNMODELED_DUPLICATE`).
    """
    nodes: dict[str, NodeInfo] = {}
    now, devices = health_inputs(extra or EMPTY_MAP, params)
    for obj in node_objs:
        try:
            n = node_from_object(
                obj, params.fabric, params.health, now=now, devices=devices, sharing=params.sharing
            )
        except ObjectError as exc:
            log.warning("ignoring a Node object: %s", exc)
            continue
        if n.name in nodes:
            n = unmodeled_node(obj, params.fabric, UNMODELED_DUPLICATE)
        nodes[n.name] = _checked(n, params)
    for n in nodes.values():
        if n.unmodeled:
            _log_unmodeled(n)
    bound = [(p, node) for p in pod_objs if (node := _bound_node(p)) is not None]
    # Known placements (whole-GPU records, recorded shares) first, then the rest, each in
    # key order (deterministic).
    bound.sort(key=lambda pn: (not _has_record(pn[0]), object_key(pn[0])))
    taken: dict[str, int] = {}
    cpu: dict[str, int] = {}
    mem: dict[str, int] = {}
    replicas: dict[str, int] = {}
    pods: dict[str, PodInfo] = {}
    shared: dict[str, NodeInfo] = {}  # nodes carrying the share ledger built so far
    taken.update(_claim_holdings(extra or EMPTY_MAP, nodes, pods, inventory, shared))  # DRA first
    for p, node_name in bound:
        node = nodes.get(node_name)
        if node is None:
            continue
        if object_key(p) in pods:
            # Two objects with one key (a file, or names unreadable): the first one counts,
            # so every held GPU belongs to exactly one pod of the snapshot.
            log.warning("ignoring a second bound pod %s", object_key(p))
            continue
        cur = shared.get(node.name, node)
        used = taken.get(node.name, 0) | cur.shared_mask
        try:
            info = _bound_pod(p, replace(cur, used_mask=used), used, params)
        except Exception as exc:  # one unreadable pod must not stop the others
            log.warning("ignoring bound pod %s: %s", object_key(p), type(exc).__name__)
            continue
        if info.shares:
            share_used, _ = add_share(replace(cur, used_mask=used), info.shares)
            shared[node.name] = replace(cur, share_used=share_used)
        taken[node.name] = taken.get(node.name, 0) | indices_to_mask(info.gpus)
        cpu[node.name] = cpu.get(node.name, 0) + info.cpu_milli
        mem[node.name] = mem.get(node.name, 0) + info.memory_bytes
        if info.replicas:
            replicas[node.name] = replicas.get(node.name, 0) + info.replicas
        pods[info.key] = info
    ordered = tuple(
        replace(
            nodes[k],
            used_mask=taken.get(k, 0) | shared.get(k, nodes[k]).shared_mask,
            cpu_used_milli=cpu.get(k, 0),
            memory_used_bytes=mem.get(k, 0),
            share_used=shared.get(k, nodes[k]).share_used,
            replicas_used=replicas.get(k, 0),
        )
        for k in sorted(nodes)
    )
    return ClusterSnapshot(
        nodes=ordered,
        index={n.name: i for i, n in enumerate(ordered)},  # read-only by contract (hot path)
        pods=PodMap(pods),
        arrays=_arrays(ordered, params.selection_policy),
        policy=params.selection_policy,
        generation=0,
        extra=MappingProxyType(dict(extra or {})),
    )


def _claim_holdings(
    extra: Mapping[str, Any],
    nodes: Mapping[str, NodeInfo],
    pods: dict[str, PodInfo],
    inv: dra.Inventory | None = None,
    shared: dict[str, NodeInfo] | None = None,
) -> dict[str, int]:
    """Allocated ResourceClaims of ``extra`` as ledger holdings (``dra.HOLDER_PREFIX`` keys)
    added to ``pods``; returns the GPU masks they hold whole per node, and puts the nodes
    whose GPUs their shares (consumable capacity, MIG partitions) use in ``shared`` (with
    ``share_used``). Claims are exact facts (device names), so they are counted before
    pods whose indices may be inferred. A claim that would overcommit a GPU (a device two
    claims hold whole, shares past a GPU's memory or compute) is logged and not counted."""
    claims = extra.get(dra.CLAIMS_KEY)
    if not claims:
        return {}
    values = claims.values() if isinstance(claims, Mapping) else claims
    if inv is None:
        inv = dra.inventory(extra.get(RESOURCESLICES_KEY))
    if shared is None:
        shared = {}
    taken: dict[str, int] = {}
    for c in sorted((c for c in values if isinstance(c, Mapping)), key=dra.object_key):
        info = claim_holding_info(c, inv, nodes.get)
        if info is None:
            continue
        mask = indices_to_mask(info.gpus)
        cur = shared.get(info.node, nodes[info.node])
        held = taken.get(info.node, 0)
        if mask & (held | cur.shared_mask):
            log.warning("claim %s names a GPU another claim holds; not counted", info.key)
            continue
        if info.shares:
            why = check_shares(replace(cur, used_mask=held | cur.shared_mask), info.shares)
            if why:
                log.warning("claim %s overcommits a shared GPU (%s); not counted", info.key, why)
                continue
            share_used, _ = add_share(
                replace(cur, used_mask=held | cur.shared_mask | mask), info.shares
            )
            shared[info.node] = replace(cur, share_used=share_used)
        taken[info.node] = held | mask
        pods[info.key] = info
    return taken


def claim_holding_info(
    claim: Mapping[str, Any], inv: dra.Inventory, node_of: Any, assumed: bool = False
) -> PodInfo | None:
    """The ledger holding of an allocated claim (None: it holds no GPU of a known node).
    ``node_of(name)`` returns the snapshot's NodeInfo or None.

    Full GPUs a claim holds alone are held whole (``gpus``). Its shares of shared devices
    (consumable capacity, ``consumedCapacity``) and its MIG partitions are shares of their
    GPU (``shares``, :func:`claim_shares`): whole-GPU pods see the GPU used, shares see
    what is left of its memory and compute."""
    held = dra.claim_holding(claim, inv)
    if held is None:
        return None
    node = node_of(held[0])
    if node is None:
        return None
    whole, shares = claim_shares(claim, inv, node)
    if not whole and not shares:
        return None
    uid = meta(claim).get("uid")
    return PodInfo(
        key=dra.holder_key(dra.object_key(claim)),
        uid=uid if isinstance(uid, str) else "",
        node=node.name,
        gpus=whole,
        assumed=assumed,
        raw=claim,
        gpu_indices_known=True,
        shares=shares,
    )


def claim_shares(
    claim: Mapping[str, Any], inv: dra.Inventory, node: NodeInfo
) -> tuple[tuple[int, ...], tuple[GpuShare, ...]]:
    """(GPUs an allocated claim holds whole, its shares of GPUs) on ``node``, in the
    ledger's units.

    A share of a shared device (``dra.shared_results``) holds the same fraction of its
    GPU's memory as it consumes of the device's memory capacity, and of 1000 milli as of
    its compute capacity (``dra.gpu_share``). A MIG partition holds its memory as a
    fraction of its parent's, and the same fraction of compute. GPUs beyond the node's
    capacity are left out."""
    devs = node_devices(node)

    def ledger_mib(g: int) -> int:
        return devs[g].memory_mib if 0 <= g < len(devs) else 0

    shared_ids = set()
    shares: list[GpuShare] = []
    for did, _, amounts in dra.shared_results(claim):
        shared_ids.add(did)
        d = inv.by_id.get(did)
        if d is None or d.gpu is None or not 0 <= d.gpu < node.gpu_capacity:
            continue
        mib, milli = dra.gpu_share(d, amounts, ledger_mib(d.gpu))
        shares.append(GpuShare(d.gpu, mib, milli))
    whole: set[int] = set()
    for did in dra.exclusive_ids(claim):
        d = inv.by_id.get(did)
        if d is None or d.gpu is None or not 0 <= d.gpu < node.gpu_capacity:
            continue
        if not d.partition:
            whole.add(d.gpu)
            continue
        mine = d.capacities.get(dra.MEMORY_CAPACITY)
        parent = next(
            (
                p.capacities.get(dra.MEMORY_CAPACITY)
                for p in inv.by_node.get(d.node, ())
                if p.whole_gpu and p.gpu == d.gpu
            ),
            None,
        )
        if mine is None or parent is None or parent.value <= 0:
            whole.add(d.gpu)  # a partition of unknown size: the GPU, whole
            continue
        frac_milli = -(-mine.value * 1000 // parent.value)
        ledger = ledger_mib(d.gpu)
        mib = -(-mine.value * ledger // parent.value) if ledger else -(-mine.value // (1 << 20))
        shares.append(GpuShare(d.gpu, mib, min(1000, frac_milli)))
    return tuple(sorted(whole)), tuple(shares)


def _bound_node(pod: Any) -> str | None:
    """The node a pod holds resources on (``spec.nodeName``, not Succeeded/Failed), or None;
    never raises."""
    if not isinstance(pod, Mapping):
        return None
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if not isinstance(node, str) or not node or pod_terminated(pod):
        return None
    return node


def _has_record(pod: Mapping[str, Any]) -> bool:
    """Whether a bound pod records where it sits (placement record or a share hand-off)."""
    ann = meta(pod).get("annotations")
    if not isinstance(ann, Mapping):
        return False
    return placement_of(pod) is not None or any(k in ann for k in SHARE_RECORD_KEYS)


def _gpuless_pod(p: Mapping[str, Any], node: NodeInfo, **holds: Any) -> PodInfo:
    """PodInfo of a pod bound to ``node`` that holds no whole GPU (``holds``: its shares or
    replicas)."""
    gang, _ = gang_of(p)
    return PodInfo(
        key=object_key(p),
        uid=uid if isinstance(uid := meta(p).get("uid"), str) else "",
        node=node.name,
        gpus=(),
        cpu_milli=pod_resource(p, "cpu", cpu_milli),
        memory_bytes=pod_resource(p, "memory", quantity_int),
        gang=gang,
        raw=p,
        **holds,
    )


def _bound_pod(
    p: Mapping[str, Any], node: NodeInfo, taken: int, params: SchedParams | None = None
) -> PodInfo:
    """PodInfo of a bound pod during a build: its recorded GPUs, re-inferred when another
    record already claims one of them (a stale annotation). A fractional pod (HAMi,
    gpushare, KAI) holds shares on the per-GPU ledger instead of whole GPUs (recorded by
    its hand-off annotations, else inferred); ``node`` carries the ledger so far. On a
    time-slicing / MPS replica node a pod holds replicas (its request), no GPU."""
    if node.replicas:
        return _gpuless_pod(p, node, replicas=pod_replicas(p))
    got = bound_shares(p, node, (params or SchedParams()).sharing) if node.gpu_capacity else None
    if got is not None:
        shares, recorded = got
        return _gpuless_pod(p, node, gpu_indices_known=recorded, shares=shares)
    info = _pod_info(p, node, taken)
    if indices_to_mask(info.gpus) & taken:
        # Two records claim one GPU (stale annotation): re-infer this pod's indices.
        bare = {**p, "metadata": {**meta(p), "annotations": {}}}
        info = replace(_pod_info(bare, node, taken), raw=p, gang=info.gang)
    return info


def _podmap(pods: Mapping[str, PodInfo]) -> PodMap[PodInfo]:
    """``pods`` as a :class:`PodMap` (shared, not copied, when it is one)."""
    return pods if isinstance(pods, PodMap) else PodMap(pods)


def _with_changes(
    snap: ClusterSnapshot,
    changed: Mapping[str, NodeInfo],
    pods: Mapping[str, PodInfo],
    extra: Mapping[str, Any] | None = None,
) -> ClusterSnapshot:
    nodes = list(snap.nodes)
    rows: dict[int, NodeInfo] = {}
    for name, node in changed.items():
        i = snap.index[name]
        nodes[i] = node
        rows[i] = node
    width_ok = all(n.gpu_capacity <= snap.arrays.max_gpus for n in changed.values())
    arrays = (
        _update_rows(snap.arrays, rows, snap.policy) if width_ok else _arrays(nodes, snap.policy)
    )
    return ClusterSnapshot(
        nodes=tuple(nodes),
        index=snap.index,
        pods=_podmap(pods),
        arrays=arrays,
        policy=snap.policy,
        generation=snap.generation + 1,
        extra=snap.extra if extra is None else MappingProxyType(dict(extra)),
    )


def with_pod(snap: ClusterSnapshot, pod: PodInfo) -> ClusterSnapshot:
    """Add (or replace) a pod holding resources.

    Raises:
        KeyError: the pod's node is unknown.
        DoubleBookingError: one of its GPUs is held by another pod, unhealthy, or beyond
            the node's capacity; or it holds replicas on a node that has none, or more
            than the node's free replicas.
    """
    node = snap.node(pod.node)
    if node is None:
        raise KeyError(pod.node)
    base = snap
    if pod.key in snap.pods:
        base = without_pod(snap, pod.key)
        node = base.node(pod.node)
        assert node is not None
    mask = indices_to_mask(pod.gpus)
    if mask & ~node.all_mask:
        raise DoubleBookingError("GPU index beyond the node's capacity")
    if mask & node.used_mask:
        raise DoubleBookingError("GPU already held by another pod")
    share_used, used = node.share_used, node.used_mask | mask
    if pod.shares:
        why = check_shares(node, pod.shares)
        if why:
            raise DoubleBookingError(why)
        share_used, used = add_share(replace(node, used_mask=used), pod.shares)
    if pod.replicas:
        if not node.replicas:
            raise DoubleBookingError("node does not share its GPUs as replicas")
        if node.replicas_used + pod.replicas > node.replica_capacity:
            raise DoubleBookingError("GPU replicas overcommitted")
    pods = _podmap(base.pods).set(pod.key, pod)
    usage = (pod.node, pod.gpus, pod.cpu_milli, pod.memory_bytes, pod.shares, pod.replicas)
    for nodes, arrays, used_as, nodes_after, arrays_after in _ADDED:
        if nodes is base.nodes and arrays is base.arrays and used_as == usage:
            out = ClusterSnapshot(
                nodes=nodes_after,
                index=base.index,
                pods=pods,
                arrays=arrays_after,
                policy=base.policy,
                generation=base.generation + 1,
                extra=base.extra,
            )
            break
    else:
        new_node = _with_usage(
            node,
            used,
            node.cpu_used_milli + pod.cpu_milli,
            node.memory_used_bytes + pod.memory_bytes,
            share_used,
            node.replicas_used + pod.replicas,
        )
        out = _with_changes(base, {node.name: new_node}, pods)
        _ADDED.insert(0, (base.nodes, base.arrays, usage, out.nodes, out.arrays))
        del _ADDED[_PLACED_MEMO_SIZE:]
    if not pod.shares and not pod.replicas:
        _PLACED.insert(0, (out, pod.key, base))
        del _PLACED[_PLACED_MEMO_SIZE:]
    return out


_ADDED: list[tuple[tuple[NodeInfo, ...], NodeArrays, tuple[Any, ...], Any, NodeArrays]] = []
"""Recent :func:`with_pod` results, most recent first: (nodes and arrays it added a pod
to, the pod's usage (node, GPUs, CPU, memory, shares, replicas), the nodes and arrays it
gave). The nodes and arrays after depend on nothing else, so adding the same usage to
the same (identical, immutable) nodes and arrays again reuses them; entries hold them,
so identity comparison is safe."""

_PLACED: list[tuple[ClusterSnapshot, str, ClusterSnapshot]] = []
"""Recent whole-GPU placements, most recent first: (the snapshot :func:`with_pod` made,
the pod's key, the snapshot without it that the pod was added to). Removing that pod from
that very snapshot gives back exactly what it was added to (GPUs, CPU and memory are
subtracted as they were added), so :func:`without_pod` returns that, as a new
generation, instead of recomputing the node and its arrays: a nomination released by
the pod's next filter costs O(1). Fractional and replica pods are not memoized."""

_PLACED_MEMO_SIZE = 4


def without_pod(snap: ClusterSnapshot, key: str) -> ClusterSnapshot:
    """Release a pod's resources; unknown keys return ``snap`` unchanged (idempotent)."""
    pod = snap.pods.get(key)
    if pod is None:
        return snap
    for after, placed, before in _PLACED:
        if after is snap and placed == key:
            return replace(before, generation=snap.generation + 1)
    pods = _podmap(snap.pods).delete(key)
    node = snap.node(pod.node)
    if node is None:
        return replace(snap, pods=pods, generation=snap.generation + 1)
    share_used, used = node.share_used, node.used_mask & ~indices_to_mask(pod.gpus)
    if pod.shares:
        share_used, used = add_share(replace(node, used_mask=used), pod.shares, -1)
    new_node = _with_usage(
        node,
        used,
        max(0, node.cpu_used_milli - pod.cpu_milli),
        max(0, node.memory_used_bytes - pod.memory_bytes),
        share_used,
        max(0, node.replicas_used - pod.replicas),
    )
    return _with_changes(snap, {node.name: new_node}, pods)


def with_node_object(
    snap: ClusterSnapshot, obj: Mapping[str, Any], params: SchedParams
) -> ClusterSnapshot:
    """Add or update a node from its Node object, keeping the pods on it.

    A node topoplace cannot model is kept as an unmodeled node (logged when the update
    makes it one); the rest of the snapshot is unaffected.

    Raises:
        ObjectError: the object is not a mapping or has no name.
    """
    fresh = node_from_update(snap, obj, params)
    if fresh.unmodeled:
        old = snap.node(fresh.name)
        if old is None or old.unmodeled != fresh.unmodeled:
            _log_unmodeled(fresh)
    if fresh.name in snap.index:
        return _with_changes(snap, {fresh.name: fresh}, snap.pods)
    nodes = sorted([*snap.nodes, fresh], key=lambda n: n.name)
    return _rebuilt(snap, nodes, snap.pods)


def node_from_update(
    snap: ClusterSnapshot, obj: Mapping[str, Any], params: SchedParams
) -> NodeInfo:
    """The node as ``obj`` describes it, keeping what the snapshot's pods use on it (the
    update does not touch the snapshot). A node topoplace cannot model comes back as an
    unmodeled node (``NodeInfo.unmodeled``).

    Raises:
        ObjectError: the object is not a mapping or has no name.
    """
    now, devices = health_inputs(snap.extra, params)
    fresh = modeled_node(obj, params, now, devices)
    old = snap.node(fresh.name)
    if old is None:
        return fresh
    if fresh.all_mask & ~old.all_mask:
        # GPUs the snapshot's node did not have (a node unmodeled for a while, or one that
        # advertised fewer GPUs, comes back): the pods bound there still hold theirs, and
        # the old node's usage, cut to its own GPUs, no longer says so
        return usage_from_pods(fresh, snap.pods_on(fresh.name))
    return with_usage_of(fresh, old)


def usage_from_pods(node: NodeInfo, pods: Iterable[PodInfo]) -> NodeInfo:
    """``node`` carrying what ``pods`` (the snapshot's pods on it) hold: whole GPUs that
    exist on it, shares that still fit (a share that does not is logged and left out),
    CPU, memory and replicas."""
    used, cpu, memory, replicas = 0, 0, 0, 0
    share_used: Any = ()
    shared: list[PodInfo] = []
    for p in pods:
        used |= indices_to_mask(p.gpus) & node.all_mask
        cpu += p.cpu_milli
        memory += p.memory_bytes
        replicas += p.replicas
        if p.shares:
            shared.append(p)
    cur = _with_usage(node, used, cpu, memory, share_used, replicas if node.replicas else 0)
    for p in shared:
        why = check_shares(cur, p.shares)
        if why:
            log.warning("pod %s: share on %s not counted again: %s", p.key, node.name, why)
            continue
        share_used, used = add_share(cur, p.shares)
        cur = _with_usage(cur, used, cpu, memory, share_used, cur.replicas_used)
    return cur


def modeled_node(
    obj: Mapping[str, Any],
    params: SchedParams,
    now: float | None,
    devices: Mapping[str, Any],
) -> NodeInfo:
    """The node ``obj`` describes, before any pod's usage: :func:`node_from_object` with a
    snapshot's health inputs (``now`` and ``devices`` as :func:`health_inputs` gives
    them), as an unmodeled node when its array row cannot be computed. A function of
    these four inputs alone: the same inputs give an equal node.

    Raises:
        ObjectError: the object is not a mapping or has no name.
    """
    fresh = node_from_object(
        obj, params.fabric, params.health, now=now, devices=devices, sharing=params.sharing
    )
    return _checked(fresh, params)


def with_usage_of(node: NodeInfo, holder: NodeInfo) -> NodeInfo:
    """``node`` carrying what pods use on ``holder`` (the same node as the snapshot has
    it): held GPUs that still exist, CPU and memory requests."""
    share_used = holder.share_used[: node.gpu_capacity]
    return replace(
        node,
        used_mask=holder.used_mask & node.all_mask,
        cpu_used_milli=holder.cpu_used_milli,
        memory_used_bytes=holder.memory_used_bytes,
        share_used=share_used if any(t for _, _, t in share_used) else (),
        replicas_used=holder.replicas_used if node.replicas else 0,
    )


_USAGE_FIELDS = frozenset(
    {"used_mask", "cpu_used_milli", "memory_used_bytes", "share_used", "replicas_used", "health"}
)
_MODEL_FIELDS = tuple(f.name for f in fields(NodeInfo) if f.compare and f.name not in _USAGE_FIELDS)
"""The fields of a node that :func:`with_usage_of` takes from the modeled node as they
are (compared fields only: ``raw`` is not)."""


def holds_usage_of(held: NodeInfo, base: NodeInfo, health: NodeHealth) -> bool:
    """Whether ``replace(with_usage_of(base, held), health=health) == held``, decided
    without building that node: the periodic health refresh remodels every node and
    almost always finds it as it was (``ClusterCache.refresh_nodes``)."""
    if held.health != health:
        return False
    for name in _MODEL_FIELDS:
        a, b = getattr(held, name), getattr(base, name)
        if a is not b and a != b:
            return False
    share_used = held.share_used[: base.gpu_capacity]
    return (
        held.used_mask == held.used_mask & base.all_mask
        and held.share_used == (share_used if any(t for _, _, t in share_used) else ())
        and (base.replicas > 0 or held.replicas_used == 0)
    )


def with_nodes(
    snap: ClusterSnapshot,
    changed: Mapping[str, NodeInfo],
    extra: Mapping[str, Any] | None = None,
) -> ClusterSnapshot:
    """Replace many known nodes in one transition (one copy of the arrays, not one per
    node), and ``extra`` whole when given; names the snapshot does not know raise
    KeyError."""
    if not changed and extra is None:
        return snap
    return _with_changes(snap, changed, snap.pods, extra)


def health_inputs(
    extra: Mapping[str, Any], params: SchedParams
) -> tuple[float | None, Mapping[str, Any]]:
    """(now, DRA devices by node) from a snapshot's ``extra`` (see ``core.health``).

    The devices are indexed once per list of ResourceSlices and health parameters (the
    most recent pair, held and compared by identity: a new list of slices is a new
    object, as ``extra`` entries are replaced, never edited), not once per node: a node
    update or a health refresh reads its own node's devices, not every slice of the
    cluster again. The index is read-only."""
    slices = extra.get(RESOURCESLICES_KEY)
    if not slices:
        return parse_time(extra.get(NOW_KEY)), EMPTY_MAP
    memo = _DEVICES_MEMO[0] if _DEVICES_MEMO else None
    if memo is None or memo[0] is not slices or memo[1] is not params.health:
        memo = (slices, params.health, MappingProxyType(devices_by_node(slices, params.health)))
        _DEVICES_MEMO[:] = [memo]
    return parse_time(extra.get(NOW_KEY)), memo[2]


_DEVICES_MEMO: list[tuple[Any, Any, Mapping[str, Any]]] = []
"""(slices, health parameters, their devices by node) of the most recent call of
:func:`health_inputs` with slices."""


def index_slice_update(
    before: Any, after: Any, old: Mapping[str, Any], new: Mapping[str, Any], params: SchedParams
) -> None:
    """Let :func:`health_inputs` index ``after``, the list of ResourceSlices ``before``
    with the slice ``old`` replaced by ``new``, a taints-only update of it
    (``dra.taints_only_update``: the same devices in the same order), from ``before``'s
    index instead of from every slice: ``new``'s devices take the places of ``old``'s in
    its node's entry. Done only when ``before`` is the list indexed last with these health
    parameters; otherwise ``after`` is indexed whole on its first use. Either way the
    index is the one :func:`devices_by_node` gives for ``after``."""
    memo = _DEVICES_MEMO[0] if _DEVICES_MEMO else None
    if memo is None or memo[0] is not before or memo[1] is not params.health:
        return
    node = (new.get("spec") or {}).get("nodeName")
    olds = (old.get("spec") or {}).get("devices")
    news = (new.get("spec") or {}).get("devices")
    index = dict(memo[2])
    entry = index.get(node) if isinstance(node, str) else None
    if entry and isinstance(olds, list) and isinstance(news, list) and len(olds) == len(news):
        taking = {id(o): n for o, n in zip(olds, news, strict=True)}
        index[node] = tuple(taking.get(id(d), d) for d in entry)
    _DEVICES_MEMO[:] = [(after, params.health, MappingProxyType(index))]


def with_node_health(snap: ClusterSnapshot, name: str, health: NodeHealth) -> ClusterSnapshot:
    """Replace one node's health verdict (e.g. adjusted by its health history).

    Unknown names and unchanged verdicts return ``snap`` (idempotent).
    """
    node = snap.node(name)
    if node is None or node.health == health:
        return snap
    return _with_changes(snap, {name: replace(node, health=health)}, snap.pods)


def without_node(snap: ClusterSnapshot, name: str) -> ClusterSnapshot:
    """Remove a node and the pods on it; unknown names return ``snap`` (idempotent)."""
    if name not in snap.index:
        return snap
    nodes = [n for n in snap.nodes if n.name != name]
    pods = {k: p for k, p in snap.pods.items() if p.node != name}
    return _rebuilt(snap, nodes, pods)


def _rebuilt(
    snap: ClusterSnapshot, nodes: Sequence[NodeInfo], pods: Mapping[str, PodInfo]
) -> ClusterSnapshot:
    ordered = tuple(nodes)
    return ClusterSnapshot(
        nodes=ordered,
        index={n.name: i for i, n in enumerate(ordered)},  # read-only by contract (hot path)
        pods=PodMap(pods),
        arrays=_arrays(ordered, snap.policy),
        policy=snap.policy,
        generation=snap.generation + 1,
        extra=snap.extra,
    )


def only_node(
    snap: ClusterSnapshot, name: str, pods: Iterable[PodInfo] | None = None
) -> ClusterSnapshot:
    """``snap`` reduced to the node ``name`` and the pods on it (KeyError if unknown);
    ``pods``: those pods when the caller has them (else found by a pass over all pods).

    Every per-node decision (filter verdict, GPU choice) reads the same there, and each
    transition of it costs one node, not the cluster's arrays: for what-if questions
    about a single node, asked many times (preemption's dry run)."""
    node = snap.nodes[snap.index[name]]
    found = snap.pods.values() if pods is None else pods
    return _rebuilt(snap, (node,), {p.key: p for p in found if p.node == name})


def pod_info_for(
    snap: ClusterSnapshot,
    pod: Mapping[str, Any],
    node: str,
    assumed: bool = False,
    params: SchedParams | None = None,
) -> PodInfo:
    """PodInfo for a Pod object bound to ``node`` in this snapshot (indices inferred if no
    placement record, or if the record names GPUs other pods hold or the node does not
    have: a stale or forged annotation must not make :func:`with_pod` fail). Raises
    KeyError for an unknown node; never raises on odd Pod objects."""
    n = snap.node(node)
    if n is None:
        raise KeyError(node)
    old = snap.pods.get(object_key(pod))
    if old is not None and old.node == node:
        share_used, used = (
            add_share(n, old.shares, -1) if old.shares else (n.share_used, n.used_mask)
        )
        n = replace(n, share_used=share_used, used_mask=used & ~indices_to_mask(old.gpus))
    return replace(_bound_pod(pod, n, n.used_mask, params), assumed=assumed)


def health_state_name(state: int) -> str:
    """Lower-case name of a Health value."""
    return Health(state).name.lower()
