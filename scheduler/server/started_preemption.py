"""Preemption topoplace starts for a pod kube-scheduler will not preempt for.

Why kube-scheduler does not: see ``scheduler.runtime.stranded``. This module is the
decision, over the extender's cache; the writes (evictions, Events, the wake) are the kube
adapter's (``scheduler.kube.preemptor``), and the offline replay calls the same functions
(``benchmarks/live/preemption.py``).

* :func:`start` chooses the victims for a refused pod as the ``preempt`` verb would
  (``core.preemption.select_victims``, with the pod's share for a HAMi or gpushare pod),
  among the nodes its latest filter refused only because the GPUs it could use are taken,
  with no victim of kube-scheduler's to keep (it proposed none). It never goes against a
  PodDisruptionBudget: a second preemptor next to kube-scheduler evicts through the
  Eviction API, which refuses such evictions, so only choices without a violation are
  taken (kube-scheduler's own rule would take the fewest). It honours
  ``preemptionPolicy: Never``, leaves gang members (the gang runtime plans them whole),
  time-slicing replica pods and DRA claim pods alone, and waits while an earlier
  preemption for the pod (the verb's or its own) still stands. The answer goes into the
  preemption ledger with ``"by": "topoplace"``, so the verb answers nothing more for the
  pod while its victims go, the gangs the victims belong to are torn down by the
  remediator, and ``/v1/inspect/preemptions`` shows it.
* :func:`start_gang` does the same for a gang the gang runtime refused whole while its
  members pass kube-scheduler's filters (``core.preemption.gang_victims``: the gang planned
  without the lowest priorities first, the victims the pods holding GPUs its placement
  uses, none a PodDisruptionBudget protects). It honours ``preemptionPolicy: Never`` on
  any pending member, leaves fractional and DRA claim gangs alone, and waits while a
  member's own preemption (the verb's) still stands.
* :func:`settle` checks a preemption in progress: once every victim is gone from the
  cache, the pod's GPUs (or shares) on the node are held for it (a nomination, as
  filter's) and it is due a wake (a gang is planned at once, its reservations held, and
  its parked members woken); after ``stranded.GIVE_UP_S`` with victims still there it is
  given up.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from scheduler.core import dra
from scheduler.core.fractional import ShareError, ShareRequest, is_share_pod
from scheduler.core.model import PodRequest
from scheduler.core.objects import ObjectError
from scheduler.core.preemption import (
    GangChoice,
    NodeChoice,
    PreemptionDecision,
    broken_gangs,
    fits_on,
    gang_victims,
    lowest_priorities,
    select_victims,
    started_choice,
)
from scheduler.core.remediation import being_deleted
from scheduler.core.schedule import PlacementResult
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.runtime.stranded import GIVE_UP_S, MAX_PREEMPTIONS, gang_of
from scheduler.server.verbs.base import Host
from scheduler.server.verbs.replica import is_replica_pod
from scheduler.server.verbs.share import hold_share, pod_share_request
from scheduler.server.verbs.whole import hold_gpus

log = logging.getLogger(__name__)

BY = "topoplace"
"""The ``by`` of the ledger's answers for preemptions topoplace started."""
REASON_NEVER = "preemptionPolicy: Never"
REASON_GANG = "a gang member (the gang runtime places its gang whole)"
REASON_KIND = "not a pod of whole GPUs or GPU shares (replica and claim pods are not covered)"
REASON_GANG_KIND = "a gang of GPU shares or DRA claims (only gangs of whole GPUs are covered)"
REASON_NO_MEMBER = "no member pending"
WOKEN = "woken"
GAVE_UP = "gave_up"


MIN_CANDIDATES = 100
"""Nodes searched for victims at least (see :func:`candidates`)."""
CANDIDATES_SHARE = 0.1
"""Share of the cluster's nodes searched for victims (see :func:`candidates`)."""


def candidates(
    nodes: Iterable[str],
    snap: ClusterSnapshot,
    lowest: Mapping[str, int],
    priority: int,
    busy: Collection[str] = (),
) -> dict[str, tuple[()]]:
    """The nodes a started preemption searches for victims, as ``select_victims``'s
    candidates (no victim of kube-scheduler's): those of ``nodes`` known and holding a pod
    of lower priority than ``priority``, not ``busy`` (a preemption in progress there: its
    freed GPUs are another pod's), at most ``max(100, 10 % of the nodes)`` (the bound
    kube-scheduler's DefaultPreemption puts on its own candidates, so a search costs what
    the verb's does), the nodes with the lowest-priority pods first, then by name."""
    cap = max(MIN_CANDIDATES, int(len(snap.nodes) * CANDIDATES_SHARE))
    ok = sorted(
        (lowest[n], n)
        for n in nodes
        if n in snap.index and lowest.get(n, priority) < priority and n not in busy
    )
    return {n: () for _, n in ok[:cap]}


def _never(pod: Mapping[str, Any]) -> bool:
    """Whether the pod says ``preemptionPolicy: Never``."""
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and spec.get("preemptionPolicy") == "Never"


def _tried(
    ext: Host,
    key: str,
    now: float,
    outcome: str = "",
    answer: dict[str, Any] | None = None,
) -> None:
    """An attempt for record ``key`` that starts nothing: its ``answer`` recorded (when
    there is one), the record tried (it waits for another refusal and its backoff),
    counted under ``outcome`` ("": not counted)."""
    if answer is not None:
        ext.preemptions.record(answer, (), key)
    ext.stranded.tried(key, now)
    if outcome:
        ext.metrics.child(ext.metrics.started_preemptions, outcome).inc()


def _read(ext: Host, key: str) -> tuple[Mapping[str, Any], PodRequest, ShareRequest | None] | str:
    """The pending pod, its request and its share (None: whole GPUs); or why it is not
    preempted for."""
    pod = ext.cache.pending(key)
    if pod is None or key in ext.cache.snapshot().pods:
        return "no longer pending"
    if _never(pod):
        return REASON_NEVER
    try:
        req = ext.request(pod, None)
        share = pod_share_request(ext, pod) if is_share_pod(pod) else None
    except (ObjectError, ShareError) as exc:
        return f"invalid pod: {exc}"
    if req.gang:
        return REASON_GANG
    if share is None and (req.gpus <= 0 or dra.uses_claims(pod) or is_replica_pod(ext, pod, req)):
        return REASON_KIND
    return pod, req, share


def start(
    ext: Host, key: str, dry_run: bool = False, lowest: Mapping[str, int] | None = None
) -> NodeChoice | None:
    """Choose victims for the stranded pod ``key`` (module docstring); records the answer
    and, unless ``dry_run`` (then it only logs and counts), marks the preemption in
    progress. Returns the choice (the caller evicts its victims), or None: nothing to
    preempt now. ``lowest``: :func:`core.preemption.lowest_priorities` of the current
    snapshot (computed when not given; a caller starting several shares one), so a pod
    with nothing of lower priority on its nodes costs no victim search."""
    rec = ext.stranded.get(key)
    if rec is None or rec.node:
        return None
    now = ext.cache.now()
    got = _read(ext, key)
    if isinstance(got, str):
        log.debug("no preemption for %s: %s", key, got)
        ext.stranded.drop(key)
        return None
    _pod, req, share = got
    snap = ext.cache.snapshot()
    if lowest is None:
        lowest = lowest_priorities(snap)
    nodes = candidates(rec.nodes, snap, lowest, req.priority, ext.stranded.busy()[0])
    if not nodes:  # nothing of lower priority there (or taken): no search, no record
        _tried(ext, key, now, "none")
        log.debug("no preemption for %s: no pod of lower priority on its nodes", key)
        return None
    live = {p.uid for p in snap.pods.values() if p.uid and not being_deleted(p)}
    if ext.preemptions.waiting_for(
        key, live.__contains__, lambda node: not fits_on(snap, req, node, ext.params, share)
    ):
        _tried(ext, key, now)
        return None
    try:
        decision, chosen = _search(ext, snap, nodes, req, share)
    except Exception:  # tried, backed off: a failing search must not run every pass
        log.exception("victim search for %s failed", key)
        _tried(ext, key, now, "none")
        return None
    answer = {
        "pod": key,
        "by": BY,
        "dry_run": dry_run,
        "priority": req.priority,
        "gpus": req.gpus,
        "share": share.form if share is not None else "",
        "proposed": {n: 0 for n in sorted(nodes)},
        "chosen": chosen.as_dict() if chosen is not None else None,
        "options": len(decision.options),
        "refused": dict(decision.refused),
        "reason": ""
        if chosen is not None or not decision.options
        else "every choice evicts against a PodDisruptionBudget",
    }
    if chosen is None or dry_run:
        _tried(ext, key, now, "none" if chosen is None else "dry_run", answer)
        if chosen is None:
            log.info(
                "no preemption for %s: %s",
                key,
                answer["reason"]
                or "; ".join(f"{n}: {r}" for n, r in sorted(decision.refused.items())[:5])
                or "no node was refused only for GPUs taken",
            )
        else:
            log.warning(
                "preemption (dry run) for %s would evict %s on %s",
                key,
                ", ".join(v.pod for v in chosen.victims),
                chosen.node,
            )
        return None
    _started(ext, snap, key, answer, chosen, chosen.node, now)
    log.info(
        "preemption for %s (kube-scheduler sees room, topoplace's GPUs are taken): %s, victims %s",
        key,
        chosen.node,
        ", ".join(v.pod for v in chosen.victims),
    )
    return chosen


def _started(
    ext: Host,
    snap: ClusterSnapshot,
    key: str,
    answer: dict[str, Any],
    choice: NodeChoice | GangChoice,
    nodes: str,
    now: float,
) -> None:
    """Record a preemption started for record ``key`` on ``nodes`` (the ledger's answer
    and the gangs its victims break, the record in progress) and count it."""
    uids = [v.uid for v in choice.victims]
    ext.preemptions.record(answer, broken_gangs(snap, choice, key), key, uids, nodes)
    ext.stranded.preempting(key, nodes, uids, now)
    ext.metrics.child(ext.metrics.started_preemptions, "started").inc()
    for v in choice.victims:
        ext.metrics.child(ext.metrics.preemption_victims, "yes" if v.gang else "no").inc()


def _search(
    ext: Host,
    snap: ClusterSnapshot,
    nodes: Mapping[str, tuple[()]],
    req: PodRequest,
    share: ShareRequest | None,
) -> tuple[PreemptionDecision, NodeChoice | None]:
    """The victim search on ``nodes`` (:func:`candidates`) and the choice a started
    preemption takes from it (``core.preemption.started_choice``)."""
    decision = select_victims(snap, req, nodes, ext.params, share=share)
    return decision, started_choice(decision)


def cheaper_elsewhere(
    ext: Host,
    snap: ClusterSnapshot,
    req: PodRequest,
    share: ShareRequest | None,
    chosen: NodeChoice | None,
) -> NodeChoice | None:
    """For the ``preempt`` verb: the preemption topoplace would start on the nodes the
    pod's filter refused only for GPUs taken (which kube-scheduler never offers as
    candidates), when it costs less than ``chosen``, the best among kube-scheduler's
    candidates (or there is none); else None. The verb then answers nothing and the pod's
    preemption is started by topoplace (:func:`start`), so a node kube-scheduler cannot
    see as a candidate is not passed over for a costlier one it can (seen offline: three
    pods evicted on kube-scheduler's only candidate where one pod elsewhere frees an
    NVLink ring). Off with ``preemption.start: off`` and for gang members."""
    rec = ext.stranded.get(req.key)
    if ext.params.preemption.start != "evict" or req.gang or rec is None or rec.node:
        return None
    busy = ext.stranded.busy()[0]
    nodes = candidates(rec.nodes, snap, lowest_priorities(snap), req.priority, busy)
    if not nodes:
        return None
    _, alt = _search(ext, snap, nodes, req, share)
    if alt is None or (chosen is not None and chosen.cost <= alt.cost):
        return None
    return alt


def settle(ext: Host, key: str, present: Collection[str] | None = None) -> str:
    """Check ``key``'s preemption in progress: :data:`WOKEN` when its victims are gone
    (the pod's GPUs or shares on the node are held for it now, when they still fit: the
    caller wakes it), :data:`GAVE_UP` when they are still there after ``GIVE_UP_S``, ""
    while they go. ``present``: the UIDs of the cache's pods (read here when not given;
    a caller settling several shares one)."""
    rec = ext.stranded.get(key)
    if rec is None or not rec.node:
        return ""
    now = ext.cache.now()
    if present is None:
        present = {p.uid for p in ext.cache.snapshot().pods.values()}
    if not rec.victims.isdisjoint(present):
        if now - rec.preempted_at < GIVE_UP_S:
            return ""
        ext.stranded.settled(key)
        ext.metrics.child(ext.metrics.started_preemptions, GAVE_UP).inc()
        log.warning("preemption for %s on %s: victims still there, given up", key, rec.node)
        return GAVE_UP
    gang = gang_of(key)
    if gang:
        what = _plan_gang(ext, gang)
    else:
        got = _read(ext, key)
        if isinstance(got, str):
            ext.stranded.drop(key)
            return ""
        pod, req, share = got
        if share is not None:
            held = hold_share(ext, pod, req, share, rec.node)
        else:
            held = hold_gpus(ext, pod, req, rec.node)
        what = "its GPUs held" if held else "its GPUs were taken meanwhile"
    ext.stranded.settled(key)
    ext.metrics.child(ext.metrics.started_preemptions, WOKEN).inc()
    if rec.preemptions >= MAX_PREEMPTIONS:
        log.warning(
            "%s: %d preemptions started for it; if it is refused again, no more are",
            key,
            rec.preemptions,
        )
    log.info("preemption for %s: victims gone from %s, %s", key, rec.node, what)
    return WOKEN


def _plan_gang(ext: Host, gang: str) -> str:
    """Plan ``gang`` once its victims are gone (``GangRuntime.plan_now``: its GPUs
    reserved, its members woken); what happened, for the log."""
    try:
        planned = ext.gangs.plan_now(ext, gang, "after the preemption for it") if ext.gangs else ""
    except Exception:  # its members stay parked; the gang runtime's poll wakes them
        log.exception("planning gang %s after its preemption failed", gang)
        planned = ""
    return f"planned {planned}, members woken" if planned else "not planned yet"


def _read_gang(ext: Host, gang: str) -> tuple[PodRequest, list[str]] | str:
    """A pending member's request and every pending member's key, or why the gang is not
    preempted for."""
    if ext.gangs is None:
        return "no gang runtime"
    pending = ext.gangs.pending_members(ext, gang)
    if not pending:
        return REASON_NO_MEMBER
    for r in pending:
        pod = ext.cache.pending(r.key)
        if pod is None:
            continue
        if _never(pod):
            return REASON_NEVER
        if is_share_pod(pod) or dra.uses_claims(pod) or is_replica_pod(ext, pod, r):
            return REASON_GANG_KIND
    return pending[0], [r.key for r in pending]


def start_gang(
    ext: Host, key: str, dry_run: bool = False, lowest: Mapping[str, int] | None = None
) -> GangChoice | None:
    """:func:`start` for the refused gang of record ``key`` (``stranded.gang_record_key``):
    the victims of ``core.preemption.gang_victims``, recorded under the key (``"gang"`` in
    the answer), the preemption marked in progress on the victims' nodes. Returns the
    choice (the caller evicts its victims) or None."""
    rec = ext.stranded.get(key)
    if rec is None or rec.node:
        return None
    now = ext.cache.now()
    gang = gang_of(key)
    got = _read_gang(ext, gang)
    if isinstance(got, str):
        log.debug("no preemption for gang %s: %s", gang, got)
        ext.stranded.drop(key)
        return None
    req, members = got
    snap = ext.cache.snapshot()
    if lowest is None:
        lowest = lowest_priorities(snap)
    if not any(v < req.priority for v in lowest.values()):  # nothing lower: no solve
        _tried(ext, key, now, "none")
        log.debug("no preemption for gang %s: no pod of lower priority", gang)
        return None
    live = {p.uid for p in snap.pods.values() if p.uid and not being_deleted(p)}
    if any(ext.preemptions.waiting_for(m, live.__contains__, lambda _n: False) for m in members):
        _tried(ext, key, now)  # a member's own preemption (the verb's) still going
        return None
    gangs = ext.gangs
    assert gangs is not None  # _read_gang checked
    try:
        choice: GangChoice | str = gang_victims(
            snap,
            req.priority,
            lambda s: _placement(gangs.what_if(ext, s, req)),
            ext.stranded.busy()[1],
        )
    except Exception:  # the gang policy failed: tried, backed off, never a crash loop
        log.exception("victim search for gang %s failed", gang)
        choice = "the victim search failed (see the log)"
    answer: dict[str, Any] = {
        "pod": key,
        "gang": gang,
        "by": BY,
        "dry_run": dry_run,
        "priority": req.priority,
        "gpus": req.gpus,
        "members_pending": members,
        "chosen": choice.as_dict() if isinstance(choice, GangChoice) else None,
        "reason": choice if isinstance(choice, str) else "",
    }
    if isinstance(choice, str) or dry_run:
        _tried(ext, key, now, "none" if isinstance(choice, str) else "dry_run", answer)
        if isinstance(choice, str):
            log.info("no preemption for gang %s: %s", gang, choice)
        else:
            log.warning(
                "preemption (dry run) for gang %s would evict %s",
                gang,
                ", ".join(v.pod for v in choice.victims),
            )
        return None
    _started(ext, snap, key, answer, choice, ",".join(sorted(set(choice.nodes.values()))), now)
    log.info(
        "preemption for gang %s (its members pass kube-scheduler's filters, the gang fits "
        "nowhere whole): victims %s",
        gang,
        ", ".join(f"{v.pod} on {choice.nodes[v.pod]}" for v in choice.victims),
    )
    return choice


def _placement(result: PlacementResult | None) -> PlacementResult:
    """``GangRuntime.what_if``'s answer, a gang with no member left to place refused."""
    return result if result is not None else PlacementResult(ok=False, reason=REASON_NO_MEMBER)
