"""Recovery after a (re)start: rebuild decisions from what the cluster keeps.

topoplace keeps no state of its own (STYLE.md §6): every decision is persisted where the
cluster keeps it, and replayed from there before serving.

1. **Bound placements.** Each pod bound by topoplace carries ``topoplace.io/placement``
   (node, GPU indices, gang, plan id), written on the Binding atomically with
   ``spec.nodeName``. The initial list feeds those pods to the cache, whose
   :func:`~scheduler.core.snapshot.build_snapshot` places recorded pods first, so their
   exact GPUs are held again. :func:`recover` only counts and checks them.
2. **Gang plans.** A gang member's record also carries its gang's whole plan (every
   slot's role, node and GPUs, plan id, policy, creation time and TTL; see
   ``scheduler.core.objects.placement_value``). :func:`recover_gang_plans` is the single
   integration point: it calls the gang handler's ``recover(ext)``
   (``scheduler.runtime.gangs.GangRuntime``), which rebuilds each gang's plan from its bound
   members' records (:func:`scheduler.core.gang.recover_plans`) and installs it in
   ``cache.plans`` under the cache lock.
3. **Reservations.** Reservation pseudo pods live in memory and die with the process;
   ``GangRuntime.recover`` reserves every unbound slot of a recovered plan again (with a
   fresh TTL), including slots of members that do not exist yet, so no other pod can take
   them. A slot that cannot be reserved again (node gone or unhealthy, GPUs now held by
   another pod: the API is the truth) makes the gang be planned again whole, bound members
   fixed. Records without a slot table (written by older versions) give the bound members
   only; then :func:`replan_pending_gangs` plans every gang with pending members again
   (through the gang handler's ``filter``, as kube-scheduler's next call would) so those
   GPUs are held again before readiness, and members not created yet are planned when
   they come.

Readiness must stay false until :func:`recover` has returned (see ``runner.py``): a filter
served before recovery could hand a planned gang slot to another pod.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.dra import HOLDER_PREFIX
from scheduler.core.model import RESERVATION_PREFIX
from scheduler.core.objects import ObjectError, object_key, placement_of, request_from_pod
from scheduler.runtime.cache import ClusterCache

log = logging.getLogger(__name__)

GANG_RECOVERY_MODULE = "scheduler.core.gang"
GANG_RECOVERY_FUNCTION = "recover_plans"


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery found.

    Attributes:
        pods: pods holding resources.
        placements: pods whose GPUs come from a readable placement record.
        inferred: pods holding GPUs without a usable record (indices inferred).
        mismatched: records naming another node than ``spec.nodeName`` (ignored).
        gangs: gang plans recovered.
        gang_source: where gang plans came from (``"none"`` when no gang layer exists).
        replanned: gangs with pending members planned (reserved) again.
    """

    pods: int
    placements: int
    inferred: int
    mismatched: int
    gangs: int
    gang_source: str
    replanned: int = 0


def _plans_count(plans: Any) -> int:
    try:
        return len(plans)
    except TypeError:
        return 0


def recover_gang_plans(ext: Any) -> tuple[int, str]:
    """Rebuild live gang plans of ``ext`` (an Extender) after a restart; returns (number of
    gangs, source).

    Integration point with the gang layer:

    1. ``ext.gangs.recover(ext)`` when the gang handler has it (``scheduler.runtime.gangs.
       GangRuntime``: the recorded plans are replayed into ``cache.plans``, bound members
       in their slots and the other slots reserved again);
    2. without a gang handler, ``scheduler.core.gang.recover_plans(snapshot)`` is only
       counted (nothing would consume the plans): pods are then scheduled one by one;
    3. no gang layer at all: (0, "none").
    """
    gangs = getattr(ext, "gangs", None)
    hook = getattr(gangs, "recover", None)
    if callable(hook):
        out = hook(ext)
        n = out if isinstance(out, int) else _plans_count(out)
        return n, f"{type(gangs).__name__}.recover"
    try:
        mod = importlib.import_module(GANG_RECOVERY_MODULE)
    except ImportError as exc:
        if exc.name != GANG_RECOVERY_MODULE:
            raise
        return 0, "none"
    fn = getattr(mod, GANG_RECOVERY_FUNCTION, None)
    if not callable(fn):
        return 0, "none"
    plans = fn(ext.cache.snapshot())
    return _plans_count(plans), f"{GANG_RECOVERY_MODULE}.{GANG_RECOVERY_FUNCTION} (no gang handler)"


def replan_pending_gangs(
    ext: Any, pending: Iterable[Mapping[str, Any]], scheduler_names: Iterable[str] = ()
) -> int:
    """Plan (and so reserve) again every gang that has pending members; returns how many
    gangs got a plan.

    Reservations of a gang's unbound members live only in memory and die with the
    process. Without this step, a competitor scheduled between the restart and the next
    filter call of a member could take GPUs the gang had been promised. For each gang
    with pending members (the watch knows them even when kube-scheduler has not retried
    them yet, e.g. gated pods), the gang handler's ``filter`` is called for its first
    pending member over every node, exactly as kube-scheduler's next filter call would:
    a recovered plan is completed around the bound members and the other slots are
    reserved (with the usual plan TTL) before readiness turns true.

    Only gangs topoplace is known to schedule are planned: those with a recovered plan
    (a member was bound by topoplace), and those whose pods name one of
    ``scheduler_names`` in ``spec.schedulerName``. A pending gang of another scheduler
    must not get reservations.

    Args:
        ext: the Extender (``gangs`` must implement ``filter``).
        pending: unbound, non-terminated Pod objects.
        scheduler_names: kube-scheduler profiles that call topoplace.
    """
    gangs = getattr(ext, "gangs", None)
    if gangs is None or not callable(getattr(gangs, "filter", None)):
        return 0
    ours = set(scheduler_names)
    with ext.cache.lock:
        recovered = set(ext.cache.plans)
    firsts: dict[str, tuple[Mapping[str, Any], Any]] = {}
    for pod in sorted(pending, key=object_key):
        try:
            req = request_from_pod(pod, ext.params.fabric)
        except ObjectError:
            continue
        if not req.gang or req.gpus <= 0 or req.gang in firsts:
            continue
        sched = str((pod.get("spec") or {}).get("schedulerName") or "")
        if req.gang in recovered or sched in ours:
            firsts[req.gang] = (pod, req)
    names = list(ext.cache.snapshot().names)
    planned = 0
    for gang in sorted(firsts):
        pod, req = firsts[gang]
        try:
            out = gangs.filter(ext, pod, req, names)
        except Exception:  # a gang handler bug must not block start-up
            log.exception("re-planning gang %s after restart failed", gang)
            continue
        if out is not None and out.feasible:
            planned += 1
        else:
            log.info("gang %s: no plan after restart (its members will be retried)", gang)
    return planned


def recover(
    ext: Any, pending: Iterable[Mapping[str, Any]] = (), scheduler_names: Iterable[str] = ()
) -> RecoveryReport:
    """Check recovered placements, rebuild gang plans of ``ext`` (an Extender) and reserve
    again for gangs with pending members; call after the initial sync, before readiness.

    Args:
        ext: the Extender.
        pending: unbound Pod objects the watch knows (see :func:`replan_pending_gangs`).
        scheduler_names: kube-scheduler profiles that call topoplace (see there).
    """
    cache: ClusterCache = ext.cache
    snap = cache.snapshot()
    placements = inferred = mismatched = 0
    pods = 0
    for key, p in snap.pods.items():
        if key.startswith((RESERVATION_PREFIX, HOLDER_PREFIX)):
            continue
        pods += 1
        if not p.gpus:
            continue
        if p.gpu_indices_known:
            placements += 1
        else:
            inferred += 1
            rec = placement_of(p.raw) if p.raw else None
            if rec is not None and rec.get("node") not in (None, p.node):
                mismatched += 1
                log.warning(
                    "pod %s: placement record names node %s but it is bound to %s",
                    key,
                    rec.get("node"),
                    p.node,
                )
    gangs_n, source = recover_gang_plans(ext)
    replanned = replan_pending_gangs(ext, pending, scheduler_names)
    report = RecoveryReport(pods, placements, inferred, mismatched, gangs_n, source, replanned)
    log.info(
        "recovered %d placements from annotations (%d inferred, %d mismatched), "
        "%d gang plans (%s); %d gang(s) with pending members planned again",
        placements,
        inferred,
        mismatched,
        gangs_n,
        source,
        replanned,
    )
    return report
