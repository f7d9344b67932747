"""Gang scheduling in the extender: plan whole gangs, reserve them, hand out planned nodes.

Implements the ``GangHandler`` protocol of :mod:`scheduler.server.verbs.base` on top of the
pure core (:mod:`scheduler.core.gang`, :mod:`scheduler.core.policies`). Not pure: it keeps
plans in the cache (``cache.plans``, guarded by ``cache.lock``) and reservation pseudo pods
in the cache's snapshot.

Life of a gang
--------------
1. **First member's filter**: the whole gang is planned (members seen so far plus, when the
   gang declares a size, placeholders for the members not seen yet, planned with the first
   member's role and shape; members already bound are kept where they are). Every slot is
   reserved at once by assuming a pseudo pod ``gang-reservation:<gang>#<slot>`` with the
   planned GPUs and a TTL of ``params.gang.plan_ttl_seconds`` (coscheduling's
   scheduleTimeout), so no other pod can take those GPUs. If any reservation conflicts
   (the cluster changed during the solve) all are rolled back and the gang is planned again.
2. **Every member's filter** returns exactly its slot's node; all other nodes fail with the
   constant :data:`REASON_NOT_IN_PLAN`. Prioritize gives that node 10, others 0.
3. **Bind** (``choose``, called under the cache lock by the extender) releases the member's
   reservation and returns the planned GPUs, gang and plan id; the extender then assumes the
   real pod with those GPUs in the same critical section and writes the placement
   annotation. The plan travels to bind as an explicit
   :class:`~scheduler.core.objects.PlanRecord` (in a :class:`MemberPlacement`), so the
   annotation carries the whole plan: every slot's role, node and GPUs, the policy, the
   plan's creation time and TTL. The cluster keeps the plan from the first bind on.
4. A **refused** gang gets FailedNodes (resolvable) for every candidate with
   :data:`REASON_GANG_UNPLACEABLE`; nothing is reserved or bound, so no partial gang holds
   GPUs. The human-readable reason is in :meth:`GangRuntime.describe_plans` and the log.
5. A plan that **expires** (TTL), or **breaks** (a bind failed, a planned node turned
   unhealthy or vanished, a member was deleted, a reservation disappeared) is dropped whole
   (its remaining reservations released) and the gang is planned again whole at the next
   member's filter, members already bound staying fixed. One planner runs at a time, so a
   gang is never split across two live plans.

Members asking ``nvidia.com/gpu`` that a DeviceClass backs with DRA: on a DRA node (its GPUs
ResourceSlice devices, ``nvidia.com/gpu`` not advertised) kube-scheduler's allocator takes
such a member's GPUs in its PreBind, into a "special" claim, and the pod holds none itself.
The plan counts those nodes' free GPUs from the ledger (not held by any allocated claim,
healthy, untainted), places the gang over device-plugin and DRA nodes alike, and on DRA
nodes gives each member the first fit the allocator will give it (predicted, slot after
slot); members that opted in (``DRA_CHOICE_ANNOTATION``, written with the removal of the
gate ``topoplace.io/allocate``) keep the solver's NVLink-best set, which their special claim
is given at bind. At bind the member's slot takes the set its claim holds; a reservation a
claim took meanwhile is seated again (its own GPUs when free, else the next first fit).

Assumptions: without a declared size (no PodGroup minMember, no ``topoplace.io/gang-size``)
the gang is the members seen so far; a member arriving later for which the plan has no slot
of its role makes the gang re-plan (whole, bound members fixed). Refusals are remembered for
:data:`REFUSAL_HOLD_SECONDS` (ended early when GPUs are freed) and for as long as the
snapshot does not change, so that the members of a gang that does not fit do not each run
the solver.

Waking: kube-scheduler parks a member topoplace refused (only an update of the pod brings it
back before a 5-minute flush when QueueingHints are off, as in kube-scheduler <= 1.31).
When another member's filter plans the gang, the parked members are woken at once through
:attr:`GangRuntime.waker` (kube mode patches ``topoplace.io/requeue``); :meth:`GangRuntime.poll`
(kube mode's janitor, every second) wakes the parked members of a refused gang when the
cluster changed and has enough free GPUs for it, with backoff while it stays refused.

Restart
-------
:meth:`GangRuntime.recover` runs after the initial list, before readiness. It replays every
gang's plan from its bound members' placement records
(:func:`scheduler.core.gang.recover_plans`): bound members get their slots back, and
every unbound slot, including slots of members that do not exist yet, is reserved again
with a fresh TTL (the recorded one, counted from recovery), so no other pod gets those
GPUs and a gang whose other members never come releases them after one TTL. A plan that
cannot be replayed as recorded (a slot's node gone or unhealthy, its GPUs now held by
another pod, a bound member outside the plan) is planned again whole at once, bound
members fixed; if that is refused, only the bound members are installed and the gang is
planned when its members come. Records without a slot table (older records, or plans
above ``PLAN_SLOTS_MAX_BYTES``) give the bound members only, as before.

Off the event loop
------------------
Planning a gang (CP-SAT over the whole cluster) is the one heavy step of a verb. It never
runs on a thread that runs an event loop: :meth:`GangRuntime.filter` raises
:class:`PlanOffLoop` there before it changes anything, and the HTTP layer
(``scheduler/server/app.py``) calls the verb again on its planner thread, with
:data:`PLAN_DEADLINE` set to the request's arrival plus ``params.gang.plan_deadline_seconds``
(below kube-scheduler's extender ``httpTimeout``). The solver's result depends only on its
deterministic limit and pinned parameters; the deadline is a wall-clock guard checked when
the planner gets its turn and again before reserving: a planning past it is refused whole
(nothing reserved, :data:`REASON_PLAN_DEADLINE`), and not remembered, so the next member's
filter plans again.

Events (``ext.metrics.gang_events``): planned, refused, replanned, expired, bound,
recovered (a plan replayed from the records after a restart).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.core.gang import (
    DRA_CHOICE_ANNOTATION,
    GangRequest,
    GangSizeError,
    RecoveredPlan,
    declared_size,
    gang_request,
    gang_size,
    group_topology,
    member_size_conflict,
    parse_reservation_key,
    plan_id,
    recover_plans,
    recovery_request,
    reservation_key,
    reservation_pods,
    role_name,
    slot_of_assignment,
)
from scheduler.core.model import (
    RESERVATION_PREFIX,
    Health,
    PodInfo,
    PodRequest,
    indices_to_mask,
    mask_to_indices,
)
from scheduler.core.objects import ObjectError, PlanRecord, request_from_pod
from scheduler.core.policies.registry import DEFAULT_GANG_POLICY, GANG_POLICIES, get_policy
from scheduler.core.preemption import without_lower
from scheduler.core.schedule import Assignment, FilterOutcome, PlacementResult
from scheduler.core.snapshot import ClusterSnapshot, DoubleBookingError, gpus_by_dra
from scheduler.runtime.dra import ExtendedPick
from scheduler.runtime.parked import WAKE_BACKOFF_SECONDS, free_gpus
from scheduler.runtime.stranded import gang_record_key

log = logging.getLogger(__name__)

REASON_NOT_IN_PLAN = "node is not in this pod's gang plan"
REASON_GANG_UNPLACEABLE = "the pod's gang cannot be placed as a whole now"
REASON_PLANNED_NODE_NOT_OFFERED = "the pod's planned node was filtered out by kube-scheduler"
ERR_NO_PLAN = "no live gang plan for this pod; it will be planned again"
ERR_PLAN_BROKEN = "the gang plan expired or broke; the gang will be planned again"

REASON_PLAN_DEADLINE = "gang planning did not finish within its deadline; it is retried"

PLAN_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "topoplace_plan_deadline", default=None
)
"""``time.monotonic()`` by which the gang planning of the current request must be done
(set by the HTTP layer; None: ``plan_deadline_seconds`` from when planning starts)."""


class PlanOffLoop(Exception):
    """Raised by :meth:`GangRuntime.filter`, before it changes anything, when a gang must
    be planned on a thread that runs an event loop: call the verb again on a worker
    thread."""


def on_event_loop() -> bool:
    """Whether the calling thread is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


REFUSAL_HOLD_SECONDS = 2.0
RESERVE_RETRIES = 2
DONE_KEPT = 64
FIRST_SEEN_KEPT = 4096
"""Gangs whose first filter time is kept (for the gang wait histogram)."""

# Slot states.
RESERVED = "reserved"
BINDING = "binding"
BOUND = "bound"


@dataclass(frozen=True, slots=True)
class MemberPlacement:
    """What bind writes for a planned gang member: its GPUs, its gang and the whole plan."""

    gpus: tuple[int, ...]
    gang: str
    plan: PlanRecord


@dataclass
class Slot:
    """One planned member. Mutable; guarded by the cache lock."""

    slot: str
    role: str
    node: str
    gpus: tuple[int, ...]
    member: str = ""
    state: str = RESERVED


@dataclass
class GangPlan:
    """A live plan of one gang. Mutable; guarded by the cache lock.

    Attributes:
        gang / plan_id / policy: identity.
        request: the gang as planned (roles, sizes).
        slots: slot id -> :class:`Slot`.
        members: pod key -> slot id for members that have claimed a slot.
        created / expires: cache clock times.
        details: the policy's record (status, objective, domains, bandwidth...).
        wall_created: wall-clock epoch seconds the plan was made (written in the record).
        ttl: seconds unbound slots stay reserved.
        record: the plan as written into members' placement records (built once).
    """

    gang: str
    plan_id: str
    policy: str
    request: GangRequest
    slots: dict[str, Slot]
    members: dict[str, str]
    created: float
    expires: float
    details: Mapping[str, Any] = field(default_factory=dict)
    wall_created: float = 0.0
    ttl: float = 0.0
    record: PlanRecord | None = field(default=None, repr=False)

    def complete(self) -> bool:
        """Every slot is bound."""
        return all(s.state == BOUND for s in self.slots.values())


@dataclass(frozen=True)
class _Refusal:
    reason: str
    generation: int
    at: float
    members: int
    details: Mapping[str, Any]
    free: int = 0
    """Free healthy GPUs in the cluster when the gang was refused."""


def _over_namespace_cap(
    snap: ClusterSnapshot, greq: GangRequest, result: PlacementResult, gp: Any
) -> str:
    """Why reserving this plan would exceed its namespace's bound on reserved GPUs ("" if
    it would not). Counts the unbound slots of the namespace's other live plans."""
    cap = int(getattr(gp, "max_reserved_gpus_per_namespace", 0) or 0)
    if cap <= 0:
        return ""
    ns = greq.key.split("/", 1)[0]
    held = 0
    for key, pod in snap.pods.items():
        parsed = parse_reservation_key(key)
        if parsed is not None and parsed[0] != greq.key and parsed[0].split("/", 1)[0] == ns:
            held += len(pod.gpus)
    new = sum(len(p.gpus) for p in reservation_pods(greq, result))
    if held + new > cap:
        return (
            f"namespace {ns} would hold {held + new} GPUs in unbound gang reservations "
            f"(bound: {cap})"
        )
    return ""


class GangRuntime:
    """The extender's gang handler (see module docstring).

    Args:
        policy: gang policy name; None = ``params.placement_policy`` when it names a gang
            policy, else the CP-SAT policy.
        wall_clock: epoch seconds, for the creation time written into plan records (the
            cache clock is monotonic and does not survive a restart).
    """

    def __init__(
        self,
        policy: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        deadline_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._wall = wall_clock
        self._deadline_clock = deadline_clock
        self._plan_lock = threading.RLock()
        self._members: dict[str, dict[str, PodRequest]] = {}
        self._refusals: dict[str, _Refusal] = {}
        self._done: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._planned_before: set[str] = set()
        self._parked: dict[str, set[str]] = {}
        self._wakes: dict[str, tuple[float, int, int]] = {}  # gang -> (at, count, generation)
        self._first_seen: dict[str, float] = {}  # gang -> cache time of its first filter
        self.waker: Callable[[list[str], str], None] | None = None
        """Makes kube-scheduler retry pods it parked (kube mode: patches an annotation, which
        moves a pod out of the unschedulable queue). None: nothing to wake (snapshot mode)."""

    # ---- helpers --------------------------------------------------------------------------

    def sizes(self) -> dict[str, tuple[int, int | None]]:
        """Entries of each per-gang store, with its cap (None: gangs still pending or
        planned; a gang's entries go when it completes or its pods go):
        ``/v1/inspect/state``."""
        with self._plan_lock:
            return {
                "members": (len(self._members), None),
                "refusals": (len(self._refusals), None),
                "done": (len(self._done), DONE_KEPT),
                "planned_before": (len(self._planned_before), None),
                "parked": (len(self._parked), None),
                "wakes": (len(self._wakes), None),
                "first_seen": (len(self._first_seen), FIRST_SEEN_KEPT),
            }

    def policy_name(self, ext: Any) -> str:
        """The gang policy in use."""
        if self.policy:
            return self.policy
        name = getattr(ext.params, "placement_policy", "") or ""
        get_policy(DEFAULT_GANG_POLICY)  # loads the registry
        return name if name in GANG_POLICIES else DEFAULT_GANG_POLICY

    @staticmethod
    def _event(ext: Any, event: str) -> None:
        try:
            ext.metrics.gang_events.labels(event=event).inc()
        except Exception:  # metrics must never break scheduling
            log.debug("gang metric %s not recorded", event)

    def _drop(self, ext: Any, gang: str, event: str | None, why: str = "") -> None:
        """Drop a plan and release its unbound reservations (cache lock held)."""
        cache = ext.cache
        plan = cache.plans.pop(gang, None)
        if plan is None:
            return
        for s in plan.slots.values():
            if s.state != BOUND:
                cache.forget(reservation_key(gang, s.slot))
        if event:
            self._event(ext, event)
        log.info("gang %s: plan %s dropped (%s)", gang, plan.plan_id, why or event)

    def _broken(self, ext: Any, plan: GangPlan) -> str:
        """Why a live plan can no longer be followed ("" if it can)."""
        cache = ext.cache
        snap = cache.snapshot()
        if cache.now() >= plan.expires and not plan.complete():
            return "expired"
        for s in plan.slots.values():
            if s.state == BOUND:
                held = snap.pods.get(s.member)
                if held is None or held.node != s.node:
                    return "member deleted"
                continue
            if s.state == RESERVED:
                res = snap.pods.get(reservation_key(plan.gang, s.slot))
                if res is None and not self._reseat(ext, plan, s) and not self._by_claim(ext, s):
                    return "reservation lost"
                snap = cache.snapshot()
            i = snap.index.get(s.node)
            if i is None:
                return "node gone"
            a = snap.arrays
            if int(a.state[i]) >= int(Health.UNHEALTHY) or bool(a.unschedulable[i]):
                return "node unhealthy"
            if s.member and s.state == RESERVED:
                req = self._members.get(plan.gang, {}).get(s.member)
                if (
                    req is not None
                    and cache.pending(s.member) is None
                    and snap.pods.get(s.member) is None
                ):
                    return "member deleted"
        return ""

    def _live_plan(self, ext: Any, gang: str) -> GangPlan | None:
        """The gang's plan if it can still be followed; drops it otherwise."""
        cache = ext.cache
        with cache.lock:
            cache.expire()
            plan: GangPlan | None = cache.plans.get(gang)
            if plan is None:
                return None
            why = self._broken(ext, plan)
            if why:
                self._drop(ext, gang, "expired" if why == "expired" else None, why)
                return None
            return plan

    def _claim(self, plan: GangPlan, req: PodRequest) -> Slot | None:
        """The member's slot, claiming a free one of its role if needed (cache lock held)."""
        sid = plan.members.get(req.key)
        if sid is not None:
            return plan.slots[sid]
        want = role_name(req)
        for s in sorted(plan.slots.values(), key=lambda s: _slot_order(s.slot)):
            if not s.member and s.role == want and s.state == RESERVED:
                s.member = req.key
                plan.members[req.key] = s.slot
                return s
        return None

    # ---- planning -------------------------------------------------------------------------

    def _request(self, ext: Any, snap: ClusterSnapshot, req: PodRequest) -> GangRequest:
        gang = req.gang
        seen = self._members.setdefault(gang, {})
        seen[req.key] = req
        fixed = [
            Assignment(p.key, p.node, tuple(p.gpus))
            for p in snap.gang_members(gang)
            if not p.key.startswith(RESERVATION_PREFIX)
        ]
        fixed_keys = {f.pod for f in fixed}
        cache = ext.cache
        for k in list(seen):
            gone = k != req.key and cache.pending(k) is None
            if k in fixed_keys or gone:
                del seen[k]  # bound already, or deleted while pending
        # Insertion order = order seen: the first member's role completes the gang.
        members = list(seen.values())
        return gang_request(
            members,
            gang_size(req, snap, members),
            fixed,
            declared_topology=group_topology(req, snap, ext.params.fabric),
        )

    def _plan(self, ext: Any, req: PodRequest, event: str) -> GangPlan | _Refusal:
        return self._solve(ext, req.gang, lambda snap: self._request(ext, snap, req), event)

    def _solve(
        self,
        ext: Any,
        gang: str,
        build: Callable[[ClusterSnapshot], GangRequest],
        event: str,
    ) -> GangPlan | _Refusal:
        """Plan the gang ``build`` makes from the current snapshot and reserve every slot;
        retried when the cluster changed during the solve."""
        cache = ext.cache
        params = ext.params
        name = self.policy_name(ext)
        fn = get_policy(name)
        now = self._deadline_clock
        deadline = PLAN_DEADLINE.get()
        if deadline is None:
            deadline = now() + float(params.gang.plan_deadline_seconds)
        for _ in range(RESERVE_RETRIES + 1):
            if now() >= deadline:
                break
            snap = cache.snapshot()
            greq = build(snap)
            started = time.perf_counter()
            result: PlacementResult = fn(snap, greq, params)
            _observe(ext, "gang_plan_seconds", time.perf_counter() - started)
            if now() >= deadline:
                break
            if not result.ok:
                return self._refuse(ext, gang, result.reason, snap, greq.size, result.details)
            result = self._dra_first_fit(ext, snap, greq, result)
            over = _over_namespace_cap(snap, greq, result, params.gang)
            if over:
                return self._refuse(ext, gang, over, snap, greq.size)
            plan = self._reserve(ext, greq, result, name)
            if plan is not None:
                self._refusals.pop(gang, None)
                stranded = getattr(ext, "stranded", None)
                if stranded is not None:  # planned: nothing to preempt for it
                    stranded.offered(gang_record_key(gang))
                self._event(ext, event)
                _note(ext, "plan", gang, {**_describe(plan, plan.created, "live"), "gang": gang})
                log.info(
                    "gang %s: plan %s (%d members, %s)",
                    gang,
                    plan.plan_id,
                    len(plan.slots),
                    result.details.get("status", ""),
                )
                return plan
        else:
            return self._refuse(
                ext,
                gang,
                "the cluster kept changing while the gang was being reserved",
                cache.snapshot(),
                0,
            )
        return self._refuse(ext, gang, REASON_PLAN_DEADLINE, cache.snapshot(), 0, remember=False)

    def _refuse(
        self,
        ext: Any,
        gang: str,
        reason: str,
        snap: ClusterSnapshot,
        members: int,
        details: Mapping[str, Any] | None = None,
        remember: bool = True,
    ) -> _Refusal:
        """Record and count a refusal of ``gang`` seen on ``snap`` (``remember``: hold it
        for the gang's other members, see the module docstring)."""
        ref = _Refusal(
            reason,
            snap.generation,
            ext.cache.now(),
            members,
            dict(details or {}),
            free_gpus(snap),
        )
        if remember:
            self._refusals[gang] = ref
        self._event(ext, "refused")
        need = sum(r.gpus for r in self._members.get(gang, {}).values())
        _note(
            ext,
            "refusal",
            gang,
            {
                "reason": reason,
                "members": members,
                "free_gpus": ref.free,
                "gpus_requested_by_members_seen": need,
                "details": _jsonable(ref.details),
            },
        )
        log.info("gang %s refused: %s", gang, reason)
        return ref

    def _reserve(
        self, ext: Any, greq: GangRequest, result: PlacementResult, policy: str
    ) -> GangPlan | None:
        """Assume every slot's reservation atomically; None (nothing held) on conflict."""
        cache = ext.cache
        ttl = float(ext.params.gang.plan_ttl_seconds)
        pods = reservation_pods(greq, result)
        pid = plan_id(greq.key, list(result.assignments) + list(greq.fixed))
        roles = {key: role.name for _, role, key in greq.slots()}
        with cache.lock:
            done: list[str] = []
            try:
                for p in pods:
                    cache.assume(p, ttl)
                    done.append(p.key)
            except (DoubleBookingError, KeyError, ValueError) as exc:
                for k in done:
                    cache.forget(k)
                log.info("gang %s: reservation conflict (%s); planning again", greq.key, exc)
                return None
            slots: dict[str, Slot] = {}
            members: dict[str, str] = {}
            for a in result.assignments:
                sid = slot_of_assignment(greq, a.pod)
                member = "" if "#" in a.pod else a.pod
                slots[sid] = Slot(sid, roles[a.pod], a.node, tuple(a.gpus), member, RESERVED)
                if member:
                    members[member] = sid
            snap = cache.snapshot()
            for f in greq.fixed:
                sid = f"bound-{f.pod}"
                role = _role_of(ext, snap.pods.get(f.pod))
                gpus = tuple(f.gpus) or _claim_held(ext, snap, f.pod, f.node)
                slots[sid] = Slot(sid, role, f.node, gpus, f.pod, BOUND)
                members[f.pod] = sid
            now = cache.now()
            plan = GangPlan(
                gang=greq.key,
                plan_id=pid,
                policy=policy,
                request=greq,
                slots=slots,
                members=members,
                created=now,
                expires=now + ttl,
                details=dict(result.details),
                wall_created=self._wall(),
                ttl=ttl,
            )
            cache.plans[greq.key] = plan
            return plan

    # ---- nvidia.com/gpu that DRA backs (members on DRA nodes) ------------------------------

    @staticmethod
    def _dra_pod(ext: Any, key: str) -> tuple[Mapping[str, Any], Mapping[str, str]] | None:
        """(pod, its extended resources a DeviceClass backs) for pending member ``key`` whose
        ``nvidia.com/gpu`` DRA hands out on DRA nodes; None for any other member (or an
        extender without a DRA router)."""
        router = getattr(ext, "dra", None)
        pod = ext.cache.pending(key) if router is not None else None
        if pod is None:
            return None
        mapped = router.extended_resources(pod)
        return (pod, mapped) if mapped else None

    @staticmethod
    def _chosen(pod: Mapping[str, Any]) -> bool:
        """Whether the member opted in to topoplace's GPU choice on DRA nodes (the gate
        ``topoplace.io/allocate``, removed with :data:`DRA_CHOICE_ANNOTATION` written)."""
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        return str(notes.get(DRA_CHOICE_ANNOTATION, "")).lower() == "true"

    def _hand_over(self, ext: Any, plan: GangPlan, slot: Slot) -> None:
        """For an opted-in member (:meth:`_chosen`) whose slot is on a DRA node: remember the
        slot's GPUs as topoplace's choice for it in the DRA router (``ExtendedPick``), so
        that its bind gives them to the special claim kube-scheduler makes
        (``DraRouter.before_bind``), as for a gated pod alone. Cache lock held."""
        got = self._dra_pod(ext, slot.member) if slot.member else None
        n = ext.cache.snapshot().node(slot.node)
        if got is None or n is None or not gpus_by_dra(n) or not self._chosen(got[0]):
            return
        inv = ext.cache.dra_inventory()
        by_gpu = {d.gpu: d for d in inv.by_node.get(slot.node, ()) if d.kind == "gpu"}
        if any(g not in by_gpu for g in slot.gpus):
            return
        devs = tuple(by_gpu[g] for g in sorted(slot.gpus))
        hold = ""  # the slot's reservation holds the GPUs; dropping the choice frees nothing
        ext.dra.pick_extended(
            slot.member, ExtendedPick(slot.node, devs, tuple(sorted(slot.gpus)), hold)
        )

    def _claim_gpus(self, ext: Any, req: PodRequest, node: str) -> tuple[int, ...] | None:
        """For a member whose GPUs DRA backs, bound to a DRA ``node``: the GPUs its special
        claim holds there (``()`` while the watch has not shown the claim yet); None for
        any other member or node (the member holds its slot's GPUs itself)."""
        n = ext.cache.snapshot().node(node)
        got = self._dra_pod(ext, req.key) if req.gpus > 0 else None
        if n is None or got is None or not gpus_by_dra(n):
            return None
        held = ext.dra.extended_gpus(got[0], node)
        return tuple(held) if held is not None else ()

    def _first_fit(
        self,
        ext: Any,
        snap: ClusterSnapshot,
        node: str,
        member: tuple[Mapping[str, Any], Mapping[str, str]],
        held: set[int],
        count: int,
    ) -> tuple[int, ...] | None:
        """The GPUs kube-scheduler's allocator gives ``member``'s special claim on DRA node
        ``node`` (its first fit, ``DraRouter.plans``) with GPUs ``held`` taken besides the
        allocated claims; None when that is not ``count`` GPUs free in the ledger (the
        prediction is unknown, or the first fit would take a GPU topoplace holds for
        something kube-scheduler does not see)."""
        inv = ext.cache.dra_inventory(snap)
        ids = frozenset(d.id for d in inv.by_node.get(node, ()) if d.gpu in held)
        (plan,) = ext.dra.plans(member[0], [node], also_held=ids, extended=member[1])
        gpus = tuple(sorted(plan.gpus))
        if plan.verdict or len(gpus) != count or any(g in held for g in gpus):
            return None
        return gpus

    def _dra_first_fit(
        self, ext: Any, snap: ClusterSnapshot, greq: GangRequest, result: PlacementResult
    ) -> PlacementResult:
        """The plan with the GPU set of every member planned on a DRA node, whose
        ``nvidia.com/gpu`` a DeviceClass backs, replaced by the set kube-scheduler's
        allocator will give its special claim there.

        kube-scheduler allocates such a member's GPUs itself (first fit, in its PreBind),
        so a plan agrees with what the member gets only with these sets. The solver chose
        the nodes and how many members each takes (the counts are the same: free = not
        held by an allocated claim, healthy, untainted, as the ledger counts them); on each
        DRA node the members, in slot order, get the successive first fits, each predicted
        with the GPUs the ledger holds there and the earlier slots' taken (placeholders
        take the first member's pod). Where a first fit is unknown, or would take a GPU
        the ledger holds for something kube-scheduler does not see (another gang's
        reservation), the solver's sets are kept, all of them; whichever set the member's
        claim really gets is what it holds at bind (:meth:`choose`), and the slots it displaced are
        seated again (:meth:`_reseat`). A gang whose members opted in to topoplace's choice
        (:meth:`_chosen`) keeps the solver's sets: each member's claim is given its set at
        bind (:meth:`_hand_over`)."""
        if not result.ok or getattr(ext, "dra", None) is None:
            return result
        pods = {}
        for k in self._members.get(greq.key, {}):
            got = self._dra_pod(ext, k)
            if got is not None:
                pods[k] = got
        if not pods:
            return result
        template = next(iter(pods.values()))
        if self._chosen(template[0]):  # topoplace gives the claims its own sets at bind
            return result
        order = sorted(
            result.assignments, key=lambda a: _slot_order(slot_of_assignment(greq, a.pod))
        )
        held: dict[str, set[int]] = {}
        sets: dict[str, tuple[int, ...]] = {}
        for a in order:
            node = snap.node(a.node)
            member = pods.get(a.pod) or (template if "#" in a.pod else None)
            if not a.gpus or node is None or member is None or not gpus_by_dra(node):
                continue
            taken = held.setdefault(a.node, set(mask_to_indices(node.used_mask)))
            gpus = self._first_fit(ext, snap, a.node, member, taken, len(a.gpus))
            if gpus is None:  # the solver's sets, all of them (they never overlap)
                return result
            sets[a.pod] = gpus
            taken.update(gpus)
        if not sets:
            return result
        out = tuple(replace(a, gpus=sets.get(a.pod, a.gpus)) for a in result.assignments)
        details = {**result.details, "dra_first_fit_slots": len(sets)}
        return replace(result, assignments=out, details=details)

    def _by_claim(self, ext: Any, slot: Slot) -> bool:
        """Whether ``slot``'s member will hold its GPUs through a special claim (its
        ``nvidia.com/gpu`` DRA backs, on a DRA node): its reservation only keeps others off
        them meanwhile, and a reservation a claim event took that cannot be seated again
        at once (a watch event older than topoplace's own write of the claim) does not
        break the plan; kube-scheduler's DRA filter and the bind's claim check still
        decide whether the member fits."""
        n = ext.cache.snapshot().node(slot.node)
        return (
            n is not None
            and gpus_by_dra(n)
            and bool(slot.member)
            and self._dra_pod(ext, slot.member) is not None
        )

    def _reseat(self, ext: Any, plan: GangPlan, slot: Slot) -> bool:
        """Reserve again the unbound ``slot`` of ``plan`` whose reservation is gone, when its
        members' ``nvidia.com/gpu`` DRA backs and its node is a DRA node: a member's special
        claim (kube-scheduler's first fit) took GPUs the slot held, which happens when
        members on one node bind in another order than their slots, or for a moment before
        an opted-in member's claim is given its planned GPUs. The slot gets its own GPUs
        again when they are free, else the first fit of what is free now. Cache lock held;
        True when it holds GPUs again (nothing changes otherwise)."""
        cache = ext.cache
        key = reservation_key(plan.gang, slot.slot)
        snap = cache.snapshot()
        if snap.pods.get(key) is not None:
            return True
        node = snap.node(slot.node)
        if node is None or not slot.gpus or not gpus_by_dra(node):
            return False
        member = self._dra_pod(ext, slot.member) if slot.member else None
        if member is None:
            member = next(
                (m for k in plan.members if (m := self._dra_pod(ext, k)) is not None), None
            )
        if member is None:
            return False
        taken = set(mask_to_indices(node.used_mask))
        if not taken & set(slot.gpus) and not (
            indices_to_mask(slot.gpus) & ~node.usable_mask
        ):  # the GPUs it held are free again (a claim took them for a moment)
            gpus: tuple[int, ...] | None = slot.gpus
        else:
            gpus = self._first_fit(ext, snap, slot.node, member, taken, len(slot.gpus))
        if gpus is None:
            return False
        role = next((r for r in plan.request.roles if r.name == slot.role), None)
        info = PodInfo(
            key=key,
            uid="",
            node=slot.node,
            gpus=gpus,
            cpu_milli=role.cpu_milli if role is not None else 0,
            memory_bytes=role.memory_bytes if role is not None else 0,
            gang=plan.gang,
            assumed=True,
        )
        try:
            cache.assume(info, max(0.0, plan.expires - cache.now()))
        except (DoubleBookingError, KeyError, ValueError):
            return False
        if gpus != slot.gpus:
            log.info(
                "gang %s: slot %s seated again on %s GPUs %s (was %s)",
                plan.gang,
                slot.slot,
                slot.node,
                list(gpus),
                list(slot.gpus),
            )
            slot.gpus = gpus
            plan.record = None
        if slot.member and ext.dra.extended_pick(slot.member) is not None:
            self._hand_over(ext, plan, slot)
        return True

    # ---- GangHandler ----------------------------------------------------------------------

    def filter(
        self, ext: Any, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> FilterOutcome | None:
        """Planned node for a gang member; plans (and reserves) the gang when needed."""
        if not req.gang:
            return None
        cache = ext.cache
        if req.gang not in self._first_seen:
            self._first_seen[req.gang] = cache.now()
            if len(self._first_seen) > FIRST_SEEN_KEPT:  # gangs that never completed
                del self._first_seen[next(iter(self._first_seen))]
        # The extender remembers only GPU pods for bind, and only through its own filter:
        # members without GPUs (launchers) and members planned from elsewhere (restart
        # recovery) must be found at bind, and their pending state tells a deleted member.
        cache.remember_pending(pod)
        with self._plan_lock:
            plan = self._live_plan(ext, req.gang)
            why = member_size_conflict(plan.request, req) if plan is not None else ""
            if why:
                return _invalid(names, why)
            if plan is not None:
                with cache.lock:
                    self._members.setdefault(req.gang, {})[req.key] = req
                    slot = self._claim(plan, req)
                if slot is None:
                    # No slot for this member's role: re-plan the gang whole.
                    with cache.lock:
                        self._drop(ext, req.gang, None, "member without a slot")
                else:
                    self._parked.get(req.gang, set()).discard(req.key)
                    with cache.lock:
                        self._hand_over(ext, plan, slot)
                    return _outcome(names, slot.node)
            event = "replanned" if req.gang in self._planned_before else "planned"
            ref = self._refusals.get(req.gang)
            snap = cache.snapshot()
            # A refusal stands while nothing changed, and for a short hold while nothing was
            # freed (so the members of a gang that does not fit do not each run the solver);
            # a deletion the refusal did not see (the watch lagged) ends the hold at once.
            if ref is not None and (
                ref.generation == snap.generation
                or (cache.now() - ref.at < REFUSAL_HOLD_SECONDS and free_gpus(snap) <= ref.free)
            ):
                self._members.setdefault(req.gang, {})[req.key] = req
                self._park(req)
                _stranded(ext, req.gang, names)
                return _refused(names)
            if on_event_loop():
                raise PlanOffLoop(req.gang)
            try:
                out = self._plan(ext, req, event)
            except GangSizeError as exc:
                log.info("gang %s: member %s refused: %s", req.gang, req.key, exc.reason)
                return _invalid(names, exc.reason)
            if isinstance(out, _Refusal):
                self._park(req)
                _stranded(ext, req.gang, names)
                return _refused(names)
            self._planned_before.add(req.gang)
            self._wake_parked(ext, req.gang, f"planned {out.plan_id}", besides=req.key)
            with cache.lock:
                slot = self._claim(out, req)
                if slot is not None:
                    self._hand_over(ext, out, slot)
            if slot is None:  # pragma: no cover - the plan covers every member seen
                return _refused(names)
            return _outcome(names, slot.node)

    # ---- waking parked members -------------------------------------------------------------

    def _park(self, req: PodRequest) -> None:
        """Remember a member whose filter was refused: kube-scheduler parks it (no in-tree
        plugin rejected it, so without QueueingHints no cluster event brings it back; only
        an update of the pod itself or the 5-minute flush does)."""
        self._parked.setdefault(req.gang, set()).add(req.key)

    def _wake_parked(self, ext: Any, gang: str, why: str, besides: str = "") -> list[str]:
        """Ask kube-scheduler to retry the gang's parked members now."""
        keys = sorted(k for k in self._parked.pop(gang, set()) if k != besides)
        cache = ext.cache
        snap = cache.snapshot()
        keys = [k for k in keys if k not in snap.pods and cache.pending(k) is not None]
        if not keys or self.waker is None:
            return []
        at, count, _ = self._wakes.get(gang, (0.0, 0, -1))
        self._wakes[gang] = (cache.now(), count + 1, snap.generation)
        self._event(ext, "woken")
        log.info("gang %s: waking %d parked member(s) (%s)", gang, len(keys), why)
        try:
            self.waker(keys, why)
        except Exception:  # the waker is an I/O edge: never let it break a filter
            log.exception("gang %s: waking parked members failed", gang)
        return keys

    def poll(self, ext: Any) -> list[str]:
        """Periodic check (kube mode's janitor): wake the parked members of a refused gang
        when the cluster changed since the refusal and now has enough free healthy GPUs for
        the gang's requests, with backoff (:data:`WAKE_BACKOFF_SECONDS`) while it stays
        refused. A woken member's filter plans the gang, and the plan wakes the others.
        Returns the keys woken."""
        woken: list[str] = []
        cache = ext.cache
        with self._plan_lock:
            snap = cache.snapshot()
            free = free_gpus(snap)
            now = cache.now()
            self._forget_gone(cache, snap)
            for gang in sorted(self._parked):
                if not self._parked[gang]:
                    del self._parked[gang]
                    continue
                if gang in cache.plans:
                    # A live plan: its members come back when their slot is theirs to claim.
                    woken += self._wake_parked(ext, gang, "plan is live")
                    continue
                ref = self._refusals.get(gang)
                at, count, gen = self._wakes.get(gang, (0.0, 0, -1))
                changed = ref is None or ref.generation != snap.generation
                if not changed or gen == snap.generation:
                    continue
                delay = WAKE_BACKOFF_SECONDS[min(count, len(WAKE_BACKOFF_SECONDS) - 1)]
                if count and now - at < delay:
                    continue
                members = self._members.get(gang, {})
                need = sum(r.gpus for r in members.values())
                if need > free:
                    continue
                woken += self._wake_parked(ext, gang, "the cluster changed since the refusal")
        return woken

    def _forget_gone(self, cache: Any, snap: ClusterSnapshot) -> None:
        """Forget the refusal (and wake and member records) of every refused gang none of
        whose pods is pending or bound any more: its pods were deleted (the job ended, or
        was preempted) and nothing else ever drops it (plan lock held)."""
        for gang in list(self._refusals):
            if gang in cache.plans or snap.gang_members(gang):
                continue
            if any(cache.pending(k) is not None for k in self._members.get(gang, {})):
                continue
            for per_gang in (self._refusals, self._members, self._wakes, self._parked):
                per_gang.pop(gang, None)

    def prioritize(
        self, ext: Any, req: PodRequest, names: list[str]
    ) -> list[tuple[str, int]] | None:
        """10 for the member's planned node, 0 elsewhere."""
        if not req.gang:
            return None
        with ext.cache.lock:
            plan = ext.cache.plans.get(req.gang)
            sid = plan.members.get(req.key) if plan is not None else None
            node = plan.slots[sid].node if plan is not None and sid is not None else None
        return [(n, 10 if n == node else 0) for n in names]

    def choose(
        self, ext: Any, snap: ClusterSnapshot, req: PodRequest, node: str
    ) -> MemberPlacement | str | None:
        """Turn the member's reservation into the real pod (called under the cache lock)."""
        if not req.gang:
            return None
        cache = ext.cache
        with cache.lock:
            plan = cache.plans.get(req.gang)
            if plan is None:
                return ERR_NO_PLAN
            slot = self._claim(plan, req)
            if slot is None:
                return REASON_NOT_IN_PLAN
            if slot.node != node:
                return REASON_NOT_IN_PLAN
            by_claim = self._claim_gpus(ext, req, node)
            if slot.state == BOUND:
                gpus = () if by_claim is not None else slot.gpus
                return MemberPlacement(gpus, plan.gang, _record(plan))
            key = reservation_key(plan.gang, slot.slot)
            if slot.state == RESERVED:
                lost = cache.snapshot().pods.get(key) is None
                if (lost and by_claim is None) or cache.now() >= plan.expires:
                    self._drop(ext, plan.gang, "expired", "reservation expired before bind")
                    return ERR_PLAN_BROKEN
                cache.forget(key)
                slot.state = BINDING
            if by_claim is None:
                return MemberPlacement(slot.gpus, plan.gang, _record(plan))
            # The member's special claim holds its GPUs (the pod holds none): the slot
            # records the set the claim got, and slots on the node whose reservations that
            # set displaced are seated again on what is left.
            if by_claim and by_claim != slot.gpus:
                slot.gpus = by_claim
                plan.record = None
            for other in sorted(plan.slots.values(), key=lambda o: _slot_order(o.slot)):
                if other.node == node and other.state == RESERVED:
                    self._reseat(ext, plan, other)
            return MemberPlacement((), plan.gang, _record(plan))

    def bound(self, ext: Any, req: PodRequest, ok: bool) -> None:
        """Record a member's bind outcome; a failed bind breaks the plan."""
        if not req.gang:
            return
        cache = ext.cache
        with cache.lock:
            plan = cache.plans.get(req.gang)
            sid = plan.members.get(req.key) if plan is not None else None
            if plan is None or sid is None:
                return
            slot = plan.slots[sid]
            if ok:
                if slot.state != BOUND:
                    slot.state = BOUND
                    self._event(ext, "bound")
                self._members.get(req.gang, {}).pop(req.key, None)
                if plan.complete():
                    first = self._first_seen.pop(req.gang, None)
                    if first is not None:
                        _observe(ext, "gang_wait_seconds", cache.now() - first)
                    cache.plans.pop(req.gang, None)
                    self._done[req.gang] = _describe(plan, cache.now(), "complete")
                    self._done.move_to_end(req.gang)
                    while len(self._done) > DONE_KEPT:
                        self._done.popitem(last=False)
                    self._members.pop(req.gang, None)
                    self._parked.pop(req.gang, None)
                    self._wakes.pop(req.gang, None)
                    self._planned_before.discard(req.gang)  # a reused name plans afresh
            elif slot.state == BINDING:
                # The member's reservation was released for a bind that failed: the plan
                # cannot be followed any more; drop it whole (re-planned at the next filter).
                slot.state = RESERVED
                self._drop(ext, req.gang, None, "bind failed")
            # A bind refused before its reservation was released (wrong node, unknown
            # member) leaves the plan intact.

    def preemption_plan(
        self, ext: Any, snap: ClusterSnapshot, req: PodRequest
    ) -> PlacementResult | None:
        """The placement of ``req``'s gang on ``snap`` with every pod of lower priority gone
        (``preemption.without_lower``), by the gang policy; None for a lone pod. Changes
        nothing: preemption only asks whether, and where, the whole gang could go."""
        return self.what_if(ext, without_lower(snap, req.priority), req)

    def what_if(self, ext: Any, snap: ClusterSnapshot, req: PodRequest) -> PlacementResult | None:
        """The placement of ``req``'s gang (its members seen so far, placeholders for the
        rest of its declared size, members bound on ``snap`` kept where they are) on
        ``snap``, by the gang policy; None for a lone pod or a gang with no member left to
        place. Changes nothing."""
        if not req.gang:
            return None
        seen = dict(self._members.get(req.gang, {}))
        seen.pop(req.key, None)
        members = [req, *seen.values()]
        fixed = [
            Assignment(p.key, p.node, tuple(p.gpus))
            for p in snap.gang_members(req.gang)
            if not p.key.startswith(RESERVATION_PREFIX)
        ]
        done = {f.pod for f in fixed}
        members = [m for m in members if m.key not in done]
        if not members:
            return None
        try:
            greq = gang_request(
                members,
                gang_size(req, snap, members),
                fixed,
                declared_topology=group_topology(req, snap, ext.params.fabric),
            )
        except (GangSizeError, ValueError) as exc:
            return PlacementResult(ok=False, reason=str(exc))
        fn = get_policy(self.policy_name(ext))
        return fn(snap, greq, ext.params)

    # ---- preemption topoplace starts for a refused gang -----------------------------------

    def pending_members(self, ext: Any, gang: str) -> list[PodRequest]:
        """The requests of ``gang``'s members seen and still pending, in the order seen."""
        cache = ext.cache
        held = cache.snapshot().pods
        return [
            r
            for k, r in list(self._members.get(gang, {}).items())
            if k not in held and cache.pending(k) is not None
        ]

    def plan_now(self, ext: Any, gang: str, why: str) -> str:
        """Plan ``gang`` now (its reservations held, as at a member's filter) and wake its
        parked members: the victims of a preemption topoplace started for it are gone
        (``server.started_preemption``). Returns the plan id, or "" (no member pending, or
        refused: the members stay parked and :meth:`poll` wakes them on a change). Never
        on an event loop (it solves)."""
        with self._plan_lock:
            plan = self._live_plan(ext, gang)
            if plan is None:
                pending = self.pending_members(ext, gang)
                if not pending:
                    return ""
                event = "replanned" if gang in self._planned_before else "planned"
                try:
                    out = self._plan(ext, pending[0], event)
                except GangSizeError as exc:
                    log.info("gang %s: not planned after preemption: %s", gang, exc.reason)
                    return ""
                if isinstance(out, _Refusal):
                    return ""
                self._planned_before.add(gang)
                plan = out
            self._wake_parked(ext, gang, f"planned {plan.plan_id} {why}")
            return plan.plan_id

    # ---- inspection and recovery ----------------------------------------------------------

    def describe_plans(self, ext: Any) -> dict[str, Any]:
        """Live plans, recent complete ones and refusals, for ``/v1/inspect/placements``."""
        cache = ext.cache
        out: dict[str, Any] = {}
        with cache.lock:
            now = cache.now()
            for gang, d in self._done.items():
                out[gang] = d
            for gang in sorted(cache.plans):
                out[gang] = _describe(cache.plans[gang], now, "live")
            for gang, ref in sorted(self._refusals.items()):
                if gang not in cache.plans:
                    out[gang] = {
                        "state": "refused",
                        "reason": ref.reason,
                        "members": ref.members,
                        "refused_s_ago": round(now - ref.at, 3),
                        "details": _jsonable(ref.details),
                    }
        return dict(sorted(out.items()))

    def recover(self, ext: Any) -> int:
        """Replay the gang plans recorded in bound members' placement annotations (after a
        restart, before readiness; see the module docstring). Returns the number of gangs
        recovered."""
        cache = ext.cache
        with self._plan_lock:
            found = recover_plans(cache.snapshot())
            for gang, rp in found.items():
                with cache.lock:
                    if gang in cache.plans:
                        continue
                if len(rp.plan_ids) > 1:
                    log.warning(
                        "gang %s: bound members carry %d plan ids (%s); following plan %s",
                        gang,
                        len(rp.plan_ids),
                        ", ".join(rp.plan_ids),
                        rp.plan_id,
                    )
                if rp.table is None:
                    self._install_bound(ext, rp, "no plan recorded")
                    continue
                why = self._replay(ext, rp) if rp.replayable else "; ".join(rp.problems)
                if not why:
                    continue
                log.warning(
                    "gang %s: recorded plan %s cannot be replayed (%s); planning it again "
                    "whole, bound members fixed",
                    gang,
                    rp.plan_id,
                    why,
                )
                if not self._replan_recovered(ext, rp):
                    self._install_bound(ext, rp, f"not replayable: {why}")
        return len(found)

    def _recovery_ttl(self, ext: Any, rp: RecoveredPlan) -> float:
        recorded = rp.table.ttl if rp.table is not None else 0.0
        return recorded if recorded > 0 else float(ext.params.gang.plan_ttl_seconds)

    def _replay(self, ext: Any, rp: RecoveredPlan) -> str:
        """Install a recorded plan and reserve its unbound slots again; "" on success, else
        why not (nothing is held then)."""
        assert rp.table is not None
        cache = ext.cache
        gang = rp.gang
        ttl = self._recovery_ttl(ext, rp)
        snap = cache.snapshot()
        shapes: dict[str, PodRequest] = {}
        for m in rp.members:
            req = _request_of(ext, snap.pods.get(m.pod))
            if req is not None:
                shapes.setdefault(role_name(req), req)
        with cache.lock:
            done: list[str] = []
            try:
                for s in rp.open_slots:
                    shape = shapes.get(s.role)
                    key = reservation_key(gang, s.slot)
                    cache.assume(
                        PodInfo(
                            key=key,
                            uid="",
                            node=s.node,
                            gpus=s.gpus,
                            cpu_milli=shape.cpu_milli if shape is not None else 0,
                            memory_bytes=shape.memory_bytes if shape is not None else 0,
                            gang=gang,
                            assumed=True,
                        ),
                        ttl,
                    )
                    done.append(key)
            except (DoubleBookingError, KeyError, ValueError) as exc:
                for k in done:
                    cache.forget(k)
                return f"reservation conflict: {exc}"
            slots = {
                s.slot: Slot(
                    s.slot, s.role, s.node, s.gpus, s.member, BOUND if s.member else RESERVED
                )
                for s in rp.slots
            }
            now = cache.now()
            cache.plans[gang] = GangPlan(
                gang=gang,
                plan_id=rp.table.plan_id,
                policy=rp.table.policy or "recovered",
                request=GangRequest(key=gang, roles=()),
                slots=slots,
                members={s.member: s.slot for s in rp.slots if s.member},
                created=now,
                expires=now + ttl,
                details={
                    "status": "recovered",
                    "recovery": "replayed",
                    "plan_ids": list(rp.plan_ids),
                    "reserved": len(done),
                },
                wall_created=rp.table.created or self._wall(),
                ttl=ttl,
            )
        self._planned_before.add(gang)
        self._event(ext, "recovered")
        log.info(
            "gang %s: plan %s replayed (%d bound, %d slots reserved again for %.0fs)",
            gang,
            rp.plan_id,
            len(rp.slots) - len(done),
            len(done),
            ttl,
        )
        return ""

    def _replan_recovered(self, ext: Any, rp: RecoveredPlan) -> bool:
        """Plan a recovered gang again whole (bound members fixed) and reserve it; True when
        a plan is installed."""
        cache = ext.cache
        snap = cache.snapshot()
        bound = [r for r in (_request_of(ext, snap.pods.get(m.pod)) for m in rp.members) if r]
        if not bound:
            return False
        first = sorted(bound, key=lambda r: r.key)[0]
        size = declared_size(first, snap)
        topo = group_topology(first, snap, ext.params.fabric)

        def build(s: ClusterSnapshot) -> GangRequest:
            fixed = [
                Assignment(p.key, p.node, tuple(p.gpus))
                for p in s.gang_members(rp.gang)
                if not p.key.startswith(RESERVATION_PREFIX)
            ]
            greq = recovery_request(rp, bound, size, fixed, declared_topology=topo)
            return greq if greq is not None else GangRequest(key=rp.gang, roles=(), fixed=())

        if recovery_request(rp, bound, size) is None:
            return False  # every member is bound: nothing to plan
        event = "replanned"
        out = self._solve(ext, rp.gang, build, event)
        if isinstance(out, _Refusal):
            log.info("gang %s: not placeable after restart (%s)", rp.gang, out.reason)
            return False
        self._planned_before.add(rp.gang)
        with cache.lock:
            out.details = {**out.details, "recovery": "replanned", "plan_ids": list(rp.plan_ids)}
        return True

    def _install_bound(self, ext: Any, rp: RecoveredPlan, why: str) -> None:
        """Install a plan of the bound members only: members not bound yet are planned
        again (whole, bound members fixed) when they come."""
        cache = ext.cache
        with cache.lock:
            if rp.gang in cache.plans:
                return
            slots = {
                f"bound-{m.pod}": Slot(f"bound-{m.pod}", "", m.node, m.gpus, m.pod, BOUND)
                for m in rp.members
            }
            now = cache.now()
            ttl = self._recovery_ttl(ext, rp)
            cache.plans[rp.gang] = GangPlan(
                gang=rp.gang,
                plan_id=rp.plan_id,
                policy="recovered",
                request=GangRequest(key=rp.gang, roles=()),
                slots=slots,
                members={m.pod: f"bound-{m.pod}" for m in rp.members},
                created=now,
                expires=now + ttl,
                details={
                    "status": "recovered",
                    "recovery": "bound only",
                    "plan_ids": list(rp.plan_ids),
                },
                wall_created=rp.table.created if rp.table is not None else 0.0,
                ttl=ttl,
            )
        log.info("gang %s: bound members recovered only (%s)", rp.gang, why)


def _claim_held(ext: Any, snap: ClusterSnapshot, key: str, node: str) -> tuple[int, ...]:
    """The GPUs the special claim of bound pod ``key`` holds on ``node`` (its
    ``nvidia.com/gpu`` DRA backs; the pod itself holds none), else ()."""
    pod = snap.pods.get(key)
    router = getattr(ext, "dra", None)
    if pod is None or not pod.raw or router is None:
        return ()
    held = router.extended_gpus(pod.raw, node)
    return tuple(held) if held is not None else ()


def _request_of(ext: Any, pod: PodInfo | None) -> PodRequest | None:
    """The request of a bound pod from its object (None without one or when malformed)."""
    if pod is None or not pod.raw:
        return None
    try:
        return request_from_pod(pod.raw, ext.params.fabric)
    except ObjectError:
        return None


def _role_of(ext: Any, pod: PodInfo | None) -> str:
    req = _request_of(ext, pod)
    return role_name(req) if req is not None else ""


def _record(plan: GangPlan) -> PlanRecord:
    """The plan as members' placement records carry it (built once per plan)."""
    if plan.record is None:
        plan.record = PlanRecord.of(
            plan.plan_id,
            [
                (s.role, s.node, s.gpus)
                for s in sorted(plan.slots.values(), key=lambda s: _slot_order(s.slot))
            ],
            plan.policy,
            plan.wall_created,
            plan.ttl,
        )
    return plan.record


def _slot_order(slot: str) -> tuple[str, int]:
    role, _, i = slot.rpartition("-")
    return (role, int(i)) if i.isdigit() else (slot, 0)


def _outcome(names: list[str], node: str) -> FilterOutcome:
    if node not in names:
        return FilterOutcome((), {n: REASON_PLANNED_NODE_NOT_OFFERED for n in names}, {})
    return FilterOutcome((node,), {n: REASON_NOT_IN_PLAN for n in names if n != node}, {})


def _invalid(names: list[str], reason: str) -> FilterOutcome:
    """Every candidate fails with ``reason`` (the member cannot join its gang as declared)."""
    return FilterOutcome((), dict.fromkeys(names, reason), {})


def _note(ext: Any, verb: str, gang: str, info: dict[str, Any]) -> None:
    """Record a gang decision in the extender's decision records, if it keeps any."""
    log_ = getattr(ext, "decisions", None)
    if log_ is not None:
        log_.record_info(verb, gang, gang, info)


def _observe(ext: Any, metric: str, value: float) -> None:
    """Observe ``value`` on the extender's histogram ``metric``, if it has one."""
    hist = getattr(getattr(ext, "metrics", None), metric, None)
    if hist is not None:
        hist.observe(value)


def _stranded(ext: Any, gang: str, names: list[str]) -> None:
    """Remember a refusal of ``gang`` for the preemption topoplace may start for it
    (``runtime.stranded``): kube-scheduler preempts for no member whose in-tree filters
    pass, however low the priority of the pods the gang needs gone."""
    stranded = getattr(ext, "stranded", None)
    if stranded is not None:
        stranded.refused(gang_record_key(gang), names, ext.cache.now())


def _refused(names: list[str]) -> FilterOutcome:
    return FilterOutcome((), {n: REASON_GANG_UNPLACEABLE for n in names}, {})


def _jsonable(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out[k] = _jsonable(v)
        elif isinstance(v, list | tuple):
            out[k] = list(v)
        elif isinstance(v, bool | int | float | str) or v is None:
            out[k] = v
        else:
            out[k] = str(v)
    return out


def _describe(plan: GangPlan, now: float, state: str) -> dict[str, Any]:
    return {
        "state": state,
        "plan": plan.plan_id,
        "policy": plan.policy,
        "expires_in_s": round(plan.expires - now, 3) if state == "live" else None,
        "slots": [
            {
                "slot": s.slot,
                "role": s.role,
                "node": s.node,
                "gpus": list(s.gpus),
                "member": s.member,
                "state": s.state,
            }
            for s in sorted(plan.slots.values(), key=lambda s: _slot_order(s.slot))
        ],
        "details": _jsonable(plan.details),
    }


def describe_plans(ext: Any) -> dict[str, Any]:
    """The extender's gang plans (``{}`` when it has no :class:`GangRuntime`)."""
    gangs = getattr(ext, "gangs", None)
    if isinstance(gangs, GangRuntime):
        return gangs.describe_plans(ext)
    return {}


__all__ = [
    "ERR_NO_PLAN",
    "ERR_PLAN_BROKEN",
    "REASON_GANG_UNPLACEABLE",
    "REASON_NOT_IN_PLAN",
    "REASON_PLANNED_NODE_NOT_OFFERED",
    "GangPlan",
    "GangRuntime",
    "Slot",
    "describe_plans",
]
