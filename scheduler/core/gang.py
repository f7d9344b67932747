"""Gangs: who belongs together, what they ask for, and how plans are recorded.

Pure. A gang (pod group) is placed all or nothing by a gang policy (see
``scheduler/core/policies``); this module holds what every policy and the extender share:

* :class:`GangRole` / :class:`GangRequest`: the gang as the solver sees it. Members are
  grouped by role (``topoplace.io/role``, else by their resource shape: GPUs, CPU, memory,
  min-link, nodeSelector), because pods of one role are interchangeable and the solver
  counts pods per role instead of handling each pod.
* :func:`gang_request`: build a request from the members seen so far and the declared
  size. When the gang declares more members than have been seen, the plan still covers the
  whole declared gang: the unseen members are planned **with the role and shape of the
  first member** (the first one seen: the first in the sequence given), which is exact for the usual
  homogeneous worker gangs and conservative (it reserves GPUs) for a launcher that has not
  shown up yet; the extender re-plans when a member arrives whose role has no slot.
* :func:`declared_size`: minMember from the PodGroup object (scheduler-plugins / KAI
  ``spec.minMember``, Volcano ``spec.minAvailable``) when the snapshot carries PodGroups
  under ``extra["podgroups"]``, else the ``topoplace.io/gang-size`` annotation;
  :func:`gang_size` is the same, checked (see "Declared sizes" below).
* :func:`plan_gangs`: several gangs in priority order, each seeing the reservations of the
  ones before it.
* :func:`recover_plans`: rebuild live plans from bound pods' placement annotations after a
  restart: the whole plan (every slot, bound or not) when the records carry its slot
  table (:func:`plan_of_record`), else the bound members only; :func:`recovery_request`
  builds the gang to plan again when a recorded plan cannot be replayed.

Declared sizes: a gang's size is its PodGroup's minMember when the snapshot carries the
PodGroup, else what its members' ``topoplace.io/gang-size`` annotations declare; members
without the annotation take the size the others declare. **Members that declare different
sizes are refused** (:class:`GangSizeError`, reason :data:`REASON_GANG_SIZE_CONFLICT`, for
every member that comes while they disagree), whether the disagreeing members are pending
or already hold resources, and even when a PodGroup decides the size: two declarations of
one gang that disagree mean two workloads share a group name, or a job was resized under
running pods, and any guess binds pods that were meant to be all-or-nothing as a partial
gang (planning the smaller size binds half of the larger gang; planning the larger waits
for pods that may never exist). topoplace does not guess; the reason tells the user what
to fix. A declared size above :data:`~scheduler.core.model.MAX_GANG_SIZE` is refused the
same way (:data:`REASON_GANG_SIZE_INVALID`). Members already bound stay bound (nothing is
evicted). The extender checks :func:`gang_size` when it plans, and
:func:`member_size_conflict` when a member claims a slot of a live plan.

Slots: the members of a gang are numbered per role, ``<role>-<i>``; slot ``i`` of a role
belongs to the i-th known member of that role (pod keys sorted) or, past the known ones, to
a placeholder ``<gang>#<role>-<i>`` that a later member claims. Reservation pseudo-pods are
keyed ``gang-reservation:<gang>#<slot>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from scheduler.core.model import (
    EMPTY_MAP,
    MAX_GANG_SIZE,
    MAX_NODE_GPUS,
    RESERVATION_PREFIX,
    Health,
    NodeAffinity,
    PodInfo,
    PodRequest,
    TopologyConstraint,
    frozen_map,
    indices_to_mask,
)
from scheduler.core.objects import ObjectError, gang_of, map_level, placement_of
from scheduler.core.policies.registry import DEFAULT_GANG_POLICY, GangPolicy, get_policy
from scheduler.core.quantity import QuantityError, parse_quantity_int
from scheduler.core.schedule import Assignment, PlacementResult
from scheduler.core.snapshot import ClusterSnapshot, with_pod

if TYPE_CHECKING:
    from scheduler.core.params import SchedParams
    from topology.fabric import Fabric

PODGROUPS_KEY = "podgroups"
"""Key of ``ClusterSnapshot.extra`` holding PodGroup objects by ``namespace/name``."""

NVLINK_LEVEL = "nvlink-domain"
"""Fabric level of multi-node NVLink domains (one NVL72 rack = one domain)."""

SLOT_SEPARATOR = "#"
"""Separates the gang key from the slot id in placeholders and reservation keys."""

DRA_CHOICE_ANNOTATION = "topoplace.io/dra-gang-choice"
"""Written ``"true"`` on a gang member whose ``nvidia.com/gpu`` a DeviceClass backs with DRA
when the gate ``topoplace.io/allocate`` is removed from it (it opted in): on a DRA node the
member is planned with the solver's (NVLink-best) GPU set, which is given to its special
claim at bind, instead of the set kube-scheduler's allocator would pick (its first fit)."""

REASON_GANG_SIZE_CONFLICT = "gang members declare different gang sizes"
"""Filter reason for a member of a gang whose members' ``topoplace.io/gang-size``
annotations disagree (see "Declared sizes" in the module docstring)."""

REASON_GANG_SIZE_INVALID = "declared gang size above the limit topoplace plans"
"""Filter reason for a member of a gang declared larger than ``MAX_GANG_SIZE``."""

PODGROUP_SIZE_MAX = 2**31 - 1
"""minMember is an int32 in the PodGroup CRDs; larger or unreadable values are ignored."""


class GangSizeError(ObjectError):
    """A gang's declared size cannot be planned: its members disagree, or it is out of range.

    Attributes:
        reason: a constant (``REASON_GANG_SIZE_*``), to be returned to kube-scheduler as the
            filter reason for every candidate node of the member (unresolvable: no node and no
            preemption helps until the declarations are fixed).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GangRole:
    """Interchangeable members of one gang.

    Attributes:
        name: role name (``topoplace.io/role`` or a shape signature such as ``8gpu``).
        count: members of this role to place.
        gpus: whole GPUs per member.
        cpu_milli / memory_bytes: requests per member (0 = not constrained).
        min_link: minimum ring link class per member ("" = any).
        node_selector: labels a node must carry (offline use; kube-scheduler applies it
            online before asking us).
        node_affinity: the members' required node affinity
            (:data:`~scheduler.core.model.NodeAffinity`): like ``node_selector``, the plan
            places every member, seen or not, only on nodes it allows.
        members: known pod keys of this role, sorted; at most ``count``. Slots past them
            are placeholders for members not seen yet.
    """

    name: str
    count: int
    gpus: int
    cpu_milli: int = 0
    memory_bytes: int = 0
    min_link: str = ""
    node_selector: Mapping[str, str] = field(default_factory=lambda: EMPTY_MAP)
    members: tuple[str, ...] = ()
    node_affinity: NodeAffinity = ()

    def slot_ids(self) -> tuple[str, ...]:
        """``<role>-<i>`` for every member of the role."""
        return tuple(f"{self.name}-{i}" for i in range(self.count))


@dataclass(frozen=True, slots=True)
class GangRequest:
    """A whole gang to place, all or nothing.

    Attributes:
        key: gang key ``namespace/group``.
        roles: member groups, sorted by name.
        topology: required / preferred fabric level (``node`` = one node).
        priority: the highest member priority (orders :func:`plan_gangs`).
        fixed: members already holding resources (bound earlier); they stay where they
            are, count towards the gang's domains, and pin its required-level domain.
        member_size: the size the members' ``topoplace.io/gang-size`` annotations declare
            (0: none declares one); a member declaring another size may not claim a slot
            (:func:`member_size_conflict`).
    """

    key: str
    roles: tuple[GangRole, ...]
    topology: TopologyConstraint = TopologyConstraint()
    priority: int = 0
    fixed: tuple[Assignment, ...] = ()
    member_size: int = 0

    @property
    def size(self) -> int:
        """Members to place (fixed members excluded)."""
        return sum(r.count for r in self.roles)

    @property
    def total_gpus(self) -> int:
        """GPUs the members to place ask for."""
        return sum(r.count * r.gpus for r in self.roles)

    def slots(self) -> list[tuple[str, GangRole, str]]:
        """(slot id, role, pod key or placeholder) for every member to place, in order."""
        out = []
        for role in self.roles:
            for i, sid in enumerate(role.slot_ids()):
                pod = role.members[i] if i < len(role.members) else placeholder(self.key, sid)
                out.append((sid, role, pod))
        return out

    def describe(self) -> str:
        """Short human description, e.g. ``16 pods x 4 GPUs`` or ``1 x 0 + 8 x 8 GPUs``."""
        parts = [f"{r.count} x {r.gpus} GPUs" for r in self.roles]
        if len(parts) == 1:
            r = self.roles[0]
            return f"{r.count} pod{'s' if r.count != 1 else ''} x {r.gpus} GPUs"
        return " + ".join(parts)


def placeholder(gang: str, slot: str) -> str:
    """Pod key stand-in for a member not seen yet (``#`` never occurs in pod names)."""
    return f"{gang}{SLOT_SEPARATOR}{slot}"


def is_placeholder(pod: str) -> bool:
    """True for a placeholder pod key made by :func:`placeholder`."""
    return SLOT_SEPARATOR in pod


def reservation_key(gang: str, slot: str) -> str:
    """Key of the pseudo pod that holds a planned slot until its member binds."""
    return f"{RESERVATION_PREFIX}{gang}{SLOT_SEPARATOR}{slot}"


def parse_reservation_key(key: str) -> tuple[str, str] | None:
    """(gang, slot) of a reservation key, None for other keys."""
    if not key.startswith(RESERVATION_PREFIX):
        return None
    gang, sep, slot = key[len(RESERVATION_PREFIX) :].rpartition(SLOT_SEPARATOR)
    return (gang, slot) if sep else None


def _qty(value: int, units: tuple[tuple[int, str], ...]) -> str:
    for div, suffix in units:
        if value % div == 0:
            return f"{value // div}{suffix}"
    return str(value)


def role_name(req: PodRequest) -> str:
    """The member's role: ``topoplace.io/role`` or its resource shape (``8gpu-16cpu-64Gi``)."""
    if req.role:
        return req.role
    sig = f"{req.gpus}gpu"
    if req.cpu_milli:
        sig += "-" + _qty(req.cpu_milli, ((1000, "cpu"), (1, "mcpu")))
    if req.memory_bytes:
        sig += "-" + _qty(req.memory_bytes, ((2**30, "Gi"), (2**20, "Mi"), (1, "B")))
    if req.min_link:
        sig += f"-{req.min_link}"
    if req.node_selector:
        sig += "-" + ",".join(f"{k}={v}" for k, v in sorted(req.node_selector.items()))
    if req.node_affinity:
        sig += "-aff" + hashlib.sha256(repr(req.node_affinity).encode()).hexdigest()[:8]
    return sig


def _role_from(req: PodRequest, name: str, count: int, members: Sequence[str]) -> GangRole:
    return GangRole(
        name=name,
        count=count,
        gpus=max(0, req.gpus),
        cpu_milli=max(0, req.cpu_milli),
        memory_bytes=max(0, req.memory_bytes),
        min_link=req.min_link,
        node_selector=frozen_map(req.node_selector),
        members=tuple(sorted(members)),
        node_affinity=req.node_affinity,
    )


def gang_request(
    members: Sequence[PodRequest],
    size: int = 0,
    fixed: Sequence[Assignment] = (),
    fixed_roles: Mapping[str, str] | None = None,
    declared_topology: TopologyConstraint | None = None,
) -> GangRequest:
    """The gang of ``members`` (all of one gang), completed to its declared ``size``.

    Args:
        members: the members seen so far and not yet holding resources (at least one), the
            first one seen first: its role completes the gang up to ``size``.
        size: declared gang size (0 = unknown: the size the members' annotations declare,
            else the gang is the members seen plus ``fixed``).
        fixed: members already holding resources.
        fixed_roles: pod key -> role of fixed members (so their count is taken from the
            right role when completing to ``size``); fixed members of unknown role are
            taken from the first member's role.
        declared_topology: the constraint the gang's group object declares
            (:func:`group_topology`), used when no member's annotations declare one.

    Raises:
        GangSizeError: the members declare different sizes, or ``size`` is above
            ``MAX_GANG_SIZE`` (see "Declared sizes" in the module docstring).
        ValueError: no members, or members of different gangs.
    """
    if not members:
        raise ValueError("a gang request needs at least one member")
    gang = members[0].gang
    if any(m.gang != gang for m in members):
        raise ValueError("members of different gangs")
    member_size = _agreed((m.gang_size for m in members), 0)
    size = size or member_size
    if not 0 <= size <= MAX_GANG_SIZE:
        raise GangSizeError(REASON_GANG_SIZE_INVALID)
    first = members[0]
    ordered = sorted(members, key=lambda m: m.key)
    by_role: dict[str, list[PodRequest]] = {}
    for m in ordered:
        by_role.setdefault(role_name(m), []).append(m)
    counts = {name: len(ms) for name, ms in by_role.items()}
    missing = max(0, size - len(ordered) - len(fixed))
    counts[role_name(first)] += missing
    roles = tuple(
        _role_from(by_role[name][0], name, counts[name], [m.key for m in by_role[name]])
        for name in sorted(by_role)
    )
    topo = next((m.topology for m in ordered if m.topology.required or m.topology.preferred), None)
    return GangRequest(
        key=gang,
        roles=roles,
        topology=topo or declared_topology or TopologyConstraint(),
        priority=max(m.priority for m in ordered),
        fixed=tuple(sorted(fixed, key=lambda a: a.pod)),
        member_size=member_size,
    )


def _agreed(sizes: Any, first: int) -> int:
    """The one non-zero size among ``first`` and ``sizes`` (0 if none).

    Raises:
        GangSizeError: two different non-zero sizes.
    """
    seen = first
    for n in sizes:
        if n and seen and n != seen:
            raise GangSizeError(REASON_GANG_SIZE_CONFLICT)
        seen = seen or n
    return seen


def member_size_conflict(gang: GangRequest, req: PodRequest) -> str:
    """Why ``req`` may not join the planned ``gang`` because of its declared size: the
    constant :data:`REASON_GANG_SIZE_CONFLICT` when both it and the planned members declare
    a size and the sizes differ, else ""."""
    if req.gang_size and gang.member_size and req.gang_size != gang.member_size:
        return REASON_GANG_SIZE_CONFLICT
    return ""


def simple_gang(
    key: str,
    pods: int,
    gpus: int,
    *,
    required: str = "",
    preferred: str = "",
    cpu_milli: int = 0,
    memory_bytes: int = 0,
    role: str = "worker",
    priority: int = 0,
    min_link: str = "",
) -> GangRequest:
    """A homogeneous gang of ``pods`` members with ``gpus`` GPUs each (CLI, benchmarks)."""
    return GangRequest(
        key=key,
        roles=(
            GangRole(
                name=role,
                count=pods,
                gpus=gpus,
                cpu_milli=cpu_milli,
                memory_bytes=memory_bytes,
                min_link=min_link,
            ),
        ),
        topology=TopologyConstraint(required=required, preferred=preferred),
        priority=priority,
    )


def _count(v: Any) -> int:
    """A whole number in ``0 .. PODGROUP_SIZE_MAX``, else 0 (bounded cost)."""
    try:
        return parse_quantity_int(v, high=PODGROUP_SIZE_MAX, whole=True)
    except QuantityError:
        return 0


GROVE_PODGANG_MAX_GROUPS = 1024
"""Most ``spec.podgroups`` entries of a Grove PodGang read; a longer list declares no size."""


def podgroup_min_member(obj: Mapping[str, Any]) -> int:
    """The gang size a group object declares; 0 when absent, unreadable, or not a whole
    number in ``0 .. PODGROUP_SIZE_MAX`` (bounded cost: see ``scheduler.core.quantity``).

    Read, by the object's shape:

    * scheduler-plugins and KAI PodGroups: ``spec.minMember``; Volcano: ``spec.minAvailable``;
    * Kubernetes' own PodGroup (``scheduling.k8s.io/v1alpha2``, 1.36+):
      ``spec.schedulingPolicy.gang.minCount`` (a ``basic`` policy declares no gang: 0);
    * Grove's PodGang (``scheduler.grove.io/v1alpha1``): the sum of ``minReplicas`` over
      ``spec.podgroups`` (each PodClique's guaranteed part; pods beyond it are best effort).
    """
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        return 0
    for key in ("minMember", "minAvailable"):
        v = spec.get(key)
        if v is not None:
            return _count(v)
    policy = spec.get("schedulingPolicy")
    if isinstance(policy, Mapping):
        gang = policy.get("gang")
        return _count(gang.get("minCount")) if isinstance(gang, Mapping) else 0
    groups = spec.get("podgroups")
    if isinstance(groups, list) and len(groups) <= GROVE_PODGANG_MAX_GROUPS:
        total = 0
        for g in groups:
            if not isinstance(g, Mapping) or g.get("minReplicas") is None:
                return 0
            n = _count(g.get("minReplicas"))
            if n <= 0:
                return 0
            total += n
        return total if total <= PODGROUP_SIZE_MAX else 0
    return 0


def podgroup_topology(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(required, preferred) topology keys a group object declares, ``("", "")`` if none.

    Kubernetes' PodGroup: the first ``spec.schedulingConstraints.topology[].key`` (a node
    label key every member must share a value of: required). Grove's PodGang:
    ``spec.topologyConstraint.packConstraint.required`` / ``.preferred``. The keys are node
    label keys (``kubernetes.io/hostname``, Topograph's, ``nvidia.com/gpu.clique``); the
    caller maps them to fabric levels (:func:`scheduler.core.objects.map_level`).
    """
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        return "", ""
    cons = spec.get("schedulingConstraints")
    if isinstance(cons, Mapping) and isinstance(cons.get("topology"), list):
        for t in cons["topology"][:16]:
            if isinstance(t, Mapping) and isinstance(t.get("key"), str) and t["key"]:
                return t["key"], ""
    tc = spec.get("topologyConstraint")
    pack = tc.get("packConstraint") if isinstance(tc, Mapping) else None
    if isinstance(pack, Mapping):
        req, pref = pack.get("required"), pack.get("preferred")
        return (req if isinstance(req, str) else ""), (pref if isinstance(pref, str) else "")
    return "", ""


def group_topology(
    req: PodRequest, snapshot: ClusterSnapshot, fabric: Fabric
) -> TopologyConstraint | None:
    """The topology constraint of ``req``'s gang declared on its group object (Kubernetes
    PodGroup or Grove PodGang in ``extra["podgroups"]``), or None when the object is not
    there or declares none. A key that names no level of ``fabric`` is ignored (the pods'
    own annotations, read strictly, still apply)."""
    groups = snapshot.extra.get(PODGROUPS_KEY) if snapshot.extra else None
    obj = groups.get(req.gang) if isinstance(groups, Mapping) and req.gang else None
    if not isinstance(obj, Mapping):
        return None
    required, preferred = podgroup_topology(obj)
    levels = []
    for key in (required, preferred):
        try:
            levels.append(map_level(key, fabric) if key else "")
        except ObjectError:
            levels.append("")
    if not any(levels):
        return None
    return TopologyConstraint(required=levels[0], preferred=levels[1])


def _podgroup_size(req: PodRequest, snapshot: ClusterSnapshot) -> int:
    groups = snapshot.extra.get(PODGROUPS_KEY) if snapshot.extra else None
    if isinstance(groups, Mapping) and req.gang:
        obj = groups.get(req.gang)
        if isinstance(obj, Mapping):
            return podgroup_min_member(obj)
    return 0


def _held_sizes(req: PodRequest, snapshot: ClusterSnapshot) -> list[int]:
    """Sizes declared by the gang's members holding resources (their Pod objects)."""
    if not req.gang:
        return []
    return [
        gang_of(p.raw)[1]
        for p in snapshot.gang_members(req.gang)
        if p.raw and not p.key.startswith(RESERVATION_PREFIX)
    ]


def declared_size(req: PodRequest, snapshot: ClusterSnapshot) -> int:
    """The gang's declared size: the PodGroup's minMember when the snapshot carries the
    PodGroup (``extra["podgroups"]["ns/name"]``), else the gang-size annotation of ``req``,
    else the largest one declared by the gang's members holding resources, else 0.

    Never raises (recovery reads it); :func:`gang_size` is the checked form the extender
    plans with.
    """
    n = _podgroup_size(req, snapshot)
    if n > 0:
        return n
    return max(0, req.gang_size) or max(_held_sizes(req, snapshot), default=0)


def gang_size(
    req: PodRequest, snapshot: ClusterSnapshot, members: Sequence[PodRequest] = ()
) -> int:
    """:func:`declared_size`, checked: the ``topoplace.io/gang-size`` annotations of ``req``,
    of ``members`` (pending members seen) and of the gang's members holding resources in
    ``snapshot`` must agree (members without one join), and the size must not exceed
    ``MAX_GANG_SIZE`` (see "Declared sizes" in the module docstring).

    Raises:
        GangSizeError: declarations disagree, or the size is out of range; ``reason`` is the
            filter reason for the member.
    """
    agreed = _agreed([m.gang_size for m in members] + _held_sizes(req, snapshot), req.gang_size)
    n = _podgroup_size(req, snapshot) or agreed
    if n > MAX_GANG_SIZE:
        raise GangSizeError(REASON_GANG_SIZE_INVALID)
    return n


# ---- plan ids, reservations ---------------------------------------------------------------


def plan_id(gang: str, assignments: Sequence[Assignment], salt: str = "") -> str:
    """A short deterministic id of a plan: a digest of the gang and its assignments."""
    h = hashlib.sha1(gang.encode())
    for a in sorted(assignments, key=lambda a: (a.pod, a.node)):
        h.update(f"|{a.pod}@{a.node}:{','.join(map(str, a.gpus))}".encode())
    h.update(salt.encode())
    return h.hexdigest()[:12]


def slot_of_assignment(gang: GangRequest, pod: str) -> str:
    """The slot id of ``pod`` (a member key or a placeholder) in ``gang``."""
    for sid, _, key in gang.slots():
        if key == pod:
            return sid
    raise KeyError(pod)


def reservation_pods(gang: GangRequest, result: PlacementResult) -> list[PodInfo]:
    """Pseudo pods holding every slot of a successful plan (assumed, gang set)."""
    roles = {key: role for _, role, key in gang.slots()}
    out = []
    for a in result.assignments:
        role = roles.get(a.pod)
        if role is None:
            continue
        slot = slot_of_assignment(gang, a.pod)
        out.append(
            PodInfo(
                key=reservation_key(gang.key, slot),
                uid="",
                node=a.node,
                gpus=tuple(a.gpus),
                cpu_milli=role.cpu_milli,
                memory_bytes=role.memory_bytes,
                gang=gang.key,
                assumed=True,
            )
        )
    return out


def with_reservations(
    snapshot: ClusterSnapshot, gang: GangRequest, result: PlacementResult
) -> ClusterSnapshot:
    """The snapshot with a plan's slots held by reservation pseudo pods.

    Raises:
        DoubleBookingError: the plan gives a GPU that is already held.
    """
    snap = snapshot
    for pod in reservation_pods(gang, result):
        snap = with_pod(snap, pod)
    return snap


def plan_gangs(
    snapshot: ClusterSnapshot,
    gangs: Sequence[GangRequest],
    params: SchedParams,
    policy: str | GangPolicy | None = None,
) -> list[PlacementResult]:
    """Plan several gangs in priority order (highest first, then input order).

    Each gang sees the reservations of the gangs planned before it; a refused gang holds
    nothing. Results come back in input order. ``snapshot`` is not changed.
    """
    fn = get_policy(policy or DEFAULT_GANG_POLICY) if not callable(policy) else policy
    order = sorted(range(len(gangs)), key=lambda i: (-gangs[i].priority, i))
    results: dict[int, PlacementResult] = {}
    snap = snapshot
    for i in order:
        res = fn(snap, gangs[i], params)
        if res.ok:
            snap = with_reservations(snap, gangs[i], res)
        results[i] = res
    return [results[i] for i in range(len(gangs))]


# ---- recovery ---------------------------------------------------------------------------

PROBLEM_NODE_GONE = "node gone"
PROBLEM_NODE_UNHEALTHY = "node unhealthy"
PROBLEM_GPUS_UNHEALTHY = "GPUs unhealthy or missing"
PROBLEM_GPUS_HELD = "GPUs held by another pod"
PROBLEM_OUTSIDE_PLAN = "bound member outside the recorded plan"


@dataclass(frozen=True, slots=True)
class PlanTable:
    """A gang plan as recorded in a member's placement record.

    Attributes:
        plan_id: the plan's id.
        policy: the gang policy that made it ("" if not recorded).
        created: wall-clock epoch seconds it was made (0 if not recorded).
        ttl: seconds an unbound slot stays reserved (0 if not recorded).
        slots: ``(role, node, GPU indices)`` of every slot, bound members included.
    """

    plan_id: str
    policy: str
    created: float
    ttl: float
    slots: tuple[tuple[str, str, tuple[int, ...]], ...]


def plan_of_record(rec: Mapping[str, Any]) -> PlanTable | None:
    """The plan a placement record carries (see ``objects.placement_value``), or None when
    the record has no usable slot table (older records, tables left out for size, or
    malformed ones)."""
    pid = rec.get("plan")
    table = rec.get("slots")
    if not isinstance(pid, str) or not pid or not isinstance(table, list) or not table:
        return None
    slots: list[tuple[str, str, tuple[int, ...]]] = []
    for row in table:
        if not isinstance(row, list) or len(row) != 3:
            return None
        role, node, gpus = row
        if not isinstance(role, str) or not isinstance(node, str) or not node:
            return None
        if not isinstance(gpus, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MAX_NODE_GPUS for g in gpus
        ):
            return None
        slots.append((role, node, tuple(sorted(gpus))))
    created, ttl = rec.get("created", 0), rec.get("ttl", 0)
    return PlanTable(
        plan_id=pid,
        policy=policy if isinstance(policy := rec.get("policy"), str) else "",
        created=float(created) if isinstance(created, int | float) else 0.0,
        ttl=float(ttl) if isinstance(ttl, int | float) and ttl > 0 else 0.0,
        slots=tuple(slots),
    )


@dataclass(frozen=True, slots=True)
class RecoveredSlot:
    """One slot of a recovered plan.

    Attributes:
        slot: slot id (``<role>-<i>``, numbered per role in table order).
        role: the role a member must have to claim it ("" for members bound before the plan
            was made whose role was not known).
        node / gpus: where the slot is.
        member: pod key of the bound member holding it ("" = not bound: to re-reserve).
        problem: why the slot cannot be reserved again ("" = it can), one of the
            ``PROBLEM_*`` constants.
    """

    slot: str
    role: str
    node: str
    gpus: tuple[int, ...]
    member: str = ""
    problem: str = ""


@dataclass(frozen=True, slots=True)
class RecoveredPlan:
    """A gang's live plan rebuilt from bound pods' placement annotations.

    Attributes:
        gang: gang key.
        members: (pod key, node, GPUs) of every bound member, sorted by pod key.
        member_plans: the plan id each member carries (aligned with ``members``); several
            ids appear after a partial re-plan.
        table: the recorded plan chosen (None: no member's record carries a slot table;
            then only the bound members are known).
        slots: the chosen plan's slots, bound members matched to theirs (empty without a
            table).
        outside: bound members that hold no slot of the chosen plan.
    """

    gang: str
    members: tuple[Assignment, ...]
    member_plans: tuple[str, ...]
    table: PlanTable | None = None
    slots: tuple[RecoveredSlot, ...] = ()
    outside: tuple[str, ...] = ()

    @property
    def plan_ids(self) -> tuple[str, ...]:
        """Distinct plan ids, sorted."""
        return tuple(sorted(set(self.member_plans)))

    @property
    def plan_id(self) -> str:
        """The chosen table's id, else the id carried by most members (ties: the smallest)."""
        if self.table is not None:
            return self.table.plan_id
        counts: dict[str, int] = {}
        for pid in self.member_plans:
            counts[pid] = counts.get(pid, 0) + 1
        return min(counts, key=lambda p: (-counts[p], p)) if counts else ""

    @property
    def open_slots(self) -> tuple[RecoveredSlot, ...]:
        """Slots no bound member holds (to be reserved again)."""
        return tuple(s for s in self.slots if not s.member)

    @property
    def problems(self) -> tuple[str, ...]:
        """``<slot>: <problem>`` for every slot that cannot be reserved again, and one entry
        per bound member outside the plan. Empty: the plan can be replayed as recorded."""
        out = [f"{s.slot}: {s.problem}" for s in self.slots if s.problem]
        out += [f"{m}: {PROBLEM_OUTSIDE_PLAN}" for m in self.outside]
        return tuple(out)

    @property
    def replayable(self) -> bool:
        """A slot table was recorded and every open slot can be reserved again."""
        return self.table is not None and not self.problems


def _match(
    table: PlanTable, members: Sequence[Assignment]
) -> tuple[list[tuple[str, str, str, tuple[int, ...], str]], list[str]]:
    """Number the table's slots and match bound members to them by (node, GPU set); a
    member holding no GPU on record (its GPUs a DRA claim holds) by node.

    Returns (slot id, role, node, gpus, member) rows in table order and the members that
    match no slot.
    """
    counts: dict[str, int] = {}
    rows: list[tuple[str, str, str, tuple[int, ...], str]] = []
    for role, node, gpus in table.slots:
        i = counts.get(role, 0)
        counts[role] = i + 1
        rows.append((f"{role}-{i}" if role else f"bound-{i}", role, node, gpus, ""))
    free: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for j, (_, _, node, gpus, _) in enumerate(rows):
        free.setdefault((node, gpus), []).append(j)
    outside: list[str] = []
    for m in members:
        cands = free.get((m.node, tuple(sorted(m.gpus))))
        if not cands and not m.gpus:
            # a member whose GPUs a DRA claim holds (``nvidia.com/gpu`` backed by DRA on a
            # DRA node) holds none itself: any slot of its node with GPUs
            cands = next((c for (n, g), c in free.items() if n == m.node and g and c), None)
        if not cands:
            outside.append(m.pod)
            continue
        j = cands.pop(0)
        sid, role, node, gpus, _ = rows[j]
        rows[j] = (sid, role, node, gpus, m.pod)
    return rows, outside


def _slot_problem(snapshot: ClusterSnapshot, node: str, gpus: tuple[int, ...]) -> str:
    """Why an unbound slot cannot be reserved again on ``snapshot`` ("" if it can)."""
    info = snapshot.node(node)
    if info is None:
        return PROBLEM_NODE_GONE
    if info.health.state >= Health.UNHEALTHY or info.health.unschedulable:
        return PROBLEM_NODE_UNHEALTHY
    mask = indices_to_mask(gpus)
    if mask & ~info.usable_mask:
        return PROBLEM_GPUS_UNHEALTHY
    if mask & info.used_mask:
        return PROBLEM_GPUS_HELD
    return ""


def recover_plans(snapshot: ClusterSnapshot) -> dict[str, RecoveredPlan]:
    """Rebuild gang plans from the placement annotations of pods holding resources.

    Only pods whose record names a gang and a plan id count (the extender writes both on
    every gang member's Binding). Reservation pseudo pods are ignored: they die with the
    process; the records are the truth.

    When members' records carry the plan's slot table, the whole plan is rebuilt: among
    the recorded plans (normally one: every member of a gang carries the same plan id) the
    one holding the most bound members is chosen (ties: the newest, then the largest id),
    bound members are matched to their slots by node and GPU set, and every unbound slot
    is checked against ``snapshot``: its node must exist and be healthy and schedulable,
    and its GPUs healthy and held by no pod (the API is the truth), else the slot carries a
    ``PROBLEM_*`` and the plan is not replayable. Pure; sorted output.
    """
    found: dict[str, tuple[list[Assignment], list[str], dict[str, PlanTable]]] = {}
    for key in sorted(snapshot.pods):
        pod = snapshot.pods[key]
        if key.startswith(RESERVATION_PREFIX) or not pod.raw:
            continue
        rec = placement_of(pod.raw)
        gang, pid = (rec.get("gang"), rec.get("plan")) if rec is not None else ("", "")
        if not gang or not pid or not isinstance(gang, str) or not isinstance(pid, str):
            continue  # written by topoplace as strings; anything else is not its record
        members, plans, tables = found.setdefault(gang, ([], [], {}))
        members.append(Assignment(key, pod.node, tuple(pod.gpus)))
        plans.append(pid)
        if pid not in tables:
            table = plan_of_record(rec)
            if table is not None:
                tables[pid] = table
    out: dict[str, RecoveredPlan] = {}
    for gang, (members, plans, tables) in sorted(found.items()):
        best: tuple[tuple[int, float, str], PlanTable, list[Any], list[str]] | None = None
        for pid in sorted(tables):
            table = tables[pid]
            rows, outside = _match(table, members)
            rank = (len(members) - len(outside), table.created, pid)
            if best is None or rank > best[0]:
                best = (rank, table, rows, outside)
        if best is None:
            out[gang] = RecoveredPlan(gang, tuple(members), tuple(plans))
            continue
        _, table, rows, outside = best
        slots = tuple(
            RecoveredSlot(
                sid, role, node, gpus, member, "" if member else _slot_problem(snapshot, node, gpus)
            )
            for sid, role, node, gpus, member in rows
        )
        out[gang] = RecoveredPlan(
            gang, tuple(members), tuple(plans), table, slots, tuple(sorted(outside))
        )
    return out


def recovery_request(
    plan: RecoveredPlan,
    bound: Sequence[PodRequest],
    size: int = 0,
    fixed: Sequence[Assignment] | None = None,
    declared_topology: TopologyConstraint | None = None,
) -> GangRequest | None:
    """The gang to plan again after a restart when its recorded plan cannot be replayed.

    Bound members stay fixed; the members still to come are planned with the roles of the
    recorded open slots (completed, or cut, to ``size`` when the gang declares one), each
    with the shape of a bound member of that role, else the first bound member's shape
    with the slot's GPU count. Without a recorded table the missing members take the first
    bound member's role, as :func:`gang_request` does.

    Args:
        plan: the recovered plan.
        bound: requests of the gang's bound members (their pod objects), at least one.
        size: declared gang size (0 = the recorded table's size).
        fixed: members holding resources now (default: ``plan.members``).
        declared_topology: the constraint the gang's group object declares
            (:func:`group_topology`), used when no bound member's annotations declare one.

    Returns:
        The request, or None when no member is left to place (or ``bound`` is empty, or
        ``size`` exceeds ``MAX_GANG_SIZE``: the gang is then planned, and refused with a
        reason, when its members come).
    """
    if not bound or size > MAX_GANG_SIZE:
        return None
    fixed = tuple(plan.members if fixed is None else fixed)
    first = sorted(bound, key=lambda r: r.key)[0]
    by_role: dict[str, PodRequest] = {}
    for r in sorted(bound, key=lambda r: r.key):
        by_role.setdefault(role_name(r), r)
    open_roles = [(s.role, len(s.gpus)) for s in plan.open_slots]
    total = size if size > 0 else (len(plan.slots) or len(fixed))
    missing = max(0, total - len(fixed))
    if missing == 0:
        return None
    open_roles = open_roles[:missing]
    while len(open_roles) < missing:
        open_roles.append((role_name(first), max(0, first.gpus)))
    counts: dict[str, int] = {}
    gpus_of: dict[str, int] = {}
    for role, g in open_roles:
        name = role or role_name(first)
        counts[name] = counts.get(name, 0) + 1
        gpus_of.setdefault(name, g)
    roles = []
    for name in sorted(counts):
        shape = by_role.get(name)
        if shape is not None:
            roles.append(_role_from(shape, name, counts[name], ()))
        else:
            roles.append(replace(_role_from(first, name, counts[name], ()), gpus=gpus_of[name]))
    reqs = sorted(bound, key=lambda r: r.key)
    topo = next((r.topology for r in reqs if r.topology.required or r.topology.preferred), None)
    return GangRequest(
        key=plan.gang,
        roles=tuple(roles),
        topology=topo or declared_topology or TopologyConstraint(),
        priority=max(r.priority for r in reqs),
        fixed=tuple(sorted(fixed, key=lambda a: a.pod)),
    )


def with_fixed(gang: GangRequest, fixed: Sequence[Assignment]) -> GangRequest:
    """The same gang with ``fixed`` members (already bound) attached."""
    return replace(gang, fixed=tuple(sorted(fixed, key=lambda a: a.pod)))
