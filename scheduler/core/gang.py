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
  under ``extra["podgroups"]``, else the ``topoplace.io/gang-size`` annotation.
* :func:`plan_gangs`: several gangs in priority order, each seeing the reservations of the
  ones before it.
* :func:`recover_plans`: rebuild live plans from bound pods' placement annotations after a
  restart.

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
    RESERVATION_PREFIX,
    PodInfo,
    PodRequest,
    TopologyConstraint,
    frozen_map,
)
from scheduler.core.objects import placement_of
from scheduler.core.quantity import quantity_int
from scheduler.core.schedule import Assignment, PlacementResult
from scheduler.core.snapshot import ClusterSnapshot, with_pod

if TYPE_CHECKING:
    from scheduler.core.params import SchedParams
    from scheduler.core.policies.registry import GangPolicy

PODGROUPS_KEY = "podgroups"
"""Key of ``ClusterSnapshot.extra`` holding PodGroup objects by ``namespace/name``."""

NVLINK_LEVEL = "nvlink-domain"
"""Fabric level of multi-node NVLink domains (one NVL72 rack = one domain)."""

SLOT_SEPARATOR = "#"
"""Separates the gang key from the slot id in placeholders and reservation keys."""


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
    """

    key: str
    roles: tuple[GangRole, ...]
    topology: TopologyConstraint = TopologyConstraint()
    priority: int = 0
    fixed: tuple[Assignment, ...] = ()

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
    )


def gang_request(
    members: Sequence[PodRequest],
    size: int = 0,
    fixed: Sequence[Assignment] = (),
    fixed_roles: Mapping[str, str] | None = None,
) -> GangRequest:
    """The gang of ``members`` (all of one gang), completed to its declared ``size``.

    Args:
        members: the members seen so far and not yet holding resources (at least one), the
            first one seen first: its role completes the gang up to ``size``.
        size: declared gang size (0 = unknown: the gang is the members seen plus ``fixed``).
        fixed: members already holding resources.
        fixed_roles: pod key -> role of fixed members (so their count is taken from the
            right role when completing to ``size``); fixed members of unknown role are
            taken from the first member's role.

    Raises:
        ValueError: no members, or members of different gangs.
    """
    if not members:
        raise ValueError("a gang request needs at least one member")
    gang = members[0].gang
    if any(m.gang != gang for m in members):
        raise ValueError("members of different gangs")
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
        topology=topo or TopologyConstraint(),
        priority=max(m.priority for m in ordered),
        fixed=tuple(sorted(fixed, key=lambda a: a.pod)),
    )


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


def podgroup_min_member(obj: Mapping[str, Any]) -> int:
    """minMember of a PodGroup object (scheduler-plugins, KAI) or minAvailable (Volcano)."""
    spec = obj.get("spec") or {}
    for key in ("minMember", "minAvailable"):
        v = spec.get(key)
        if v is not None:
            return max(0, quantity_int(v, 0))
    return 0


def declared_size(req: PodRequest, snapshot: ClusterSnapshot) -> int:
    """The gang's declared size: the PodGroup's minMember when the snapshot carries the
    PodGroup (``extra["podgroups"]["ns/name"]``), else the gang-size annotation, else 0."""
    groups = snapshot.extra.get(PODGROUPS_KEY) if snapshot.extra else None
    if isinstance(groups, Mapping) and req.gang:
        obj = groups.get(req.gang)
        if isinstance(obj, Mapping):
            n = podgroup_min_member(obj)
            if n > 0:
                return n
    return max(0, req.gang_size)


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
    from scheduler.core.policies.registry import DEFAULT_GANG_POLICY, get_policy

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


@dataclass(frozen=True, slots=True)
class RecoveredPlan:
    """A gang's live plan rebuilt from bound pods' placement annotations.

    Attributes:
        gang: gang key.
        members: (pod key, node, GPUs) of every bound member, sorted by pod key.
        member_plans: the plan id each member carries (aligned with ``members``); several
            ids appear after a partial re-plan.
    """

    gang: str
    members: tuple[Assignment, ...]
    member_plans: tuple[str, ...]

    @property
    def plan_ids(self) -> tuple[str, ...]:
        """Distinct plan ids, sorted."""
        return tuple(sorted(set(self.member_plans)))

    @property
    def plan_id(self) -> str:
        """The id carried by most members (ties: the smallest)."""
        counts: dict[str, int] = {}
        for pid in self.member_plans:
            counts[pid] = counts.get(pid, 0) + 1
        return min(counts, key=lambda p: (-counts[p], p)) if counts else ""


def recover_plans(snapshot: ClusterSnapshot) -> dict[str, RecoveredPlan]:
    """Rebuild gang plans from the placement annotations of pods holding resources.

    Only pods whose record names a gang and a plan id count (the extender writes both on
    every gang member's Binding). Reservation pseudo pods are ignored: they die with the
    process, and the members they held are planned again. Pure; sorted output.
    """
    found: dict[str, tuple[list[Assignment], list[str]]] = {}
    for key in sorted(snapshot.pods):
        pod = snapshot.pods[key]
        if key.startswith(RESERVATION_PREFIX) or not pod.raw:
            continue
        rec = placement_of(pod.raw)
        if rec is None or not rec.get("gang") or not rec.get("plan"):
            continue
        gang = str(rec["gang"])
        members, plans = found.setdefault(gang, ([], []))
        members.append(Assignment(key, pod.node, tuple(pod.gpus)))
        plans.append(str(rec["plan"]))
    return {
        gang: RecoveredPlan(gang, tuple(members), tuple(plans))
        for gang, (members, plans) in sorted(found.items())
    }


def with_fixed(gang: GangRequest, fixed: Sequence[Assignment]) -> GangRequest:
    """The same gang with ``fixed`` members (already bound) attached."""
    return replace(gang, fixed=tuple(sorted(fixed, key=lambda a: a.pod)))
