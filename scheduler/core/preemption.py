"""Which pods to preempt for a pending GPU pod, by topoplace's own fit and by whole gangs.

Pure: a function of the snapshot, the pending pod's request, kube-scheduler's candidate
nodes and the parameters.

kube-scheduler preempts on its own (DefaultPreemption, a PostFilter): for a pod no node
can take now, it removes every lower-priority pod from each candidate node in a dry run,
checks that the pod then passes its **in-tree** filters, and gives pods back one by one
(highest priority first) while it still does. It counts GPUs but cannot see which GPUs:
it may evict a pod whose GPUs do not give the pending pod a usable set (a required link
class, a node topoplace calls unhealthy for its GPUs), and it knows nothing of gangs: it
evicts one member of a training gang as readily as a lone pod, and the other members then
hold their GPUs for nothing until their job fails. With the extender's ``preemptVerb``
topoplace answers instead, node by node (:func:`select_victims`):

1. the pods that may go are the node's bound pods of lower priority (kube-scheduler's own
   rule); pods being deleted are gone already, and pods only held by topoplace (a gang
   plan's reservation, a bind in flight) are not pods kube-scheduler can evict;
2. with all of them gone, the pod must pass topoplace's filter there (health, GPUs free,
   link class, nodeSelector) and fit the node's CPU and memory; else the node is refused
   (evicting there helps nothing);
3. the pods are then given back, the costliest to lose first: higher priority, then gang
   members, the largest gang first (a gang member costs its whole gang's GPUs, since
   topoplace tears the gang down, see ``remediation.teardown_groups``), then pods alone,
   the smallest first (so the GPUs are freed by as few pods as can free them), then by
   name; a pod stays given back if the pod still fits. As kube-scheduler does, the pods
   whose eviction would violate a PodDisruptionBudget (``core.disruption``, walked in that
   order) are given back before all others, and the victims that still violate one are
   counted (``NumPDBViolations`` of the answer). The answer depends on the snapshot and the
   candidate nodes only, never on which pods kube-scheduler's dry run picked among equals
   (it orders pods of equal priority by start time, "now" for a pod not started): the
   same cluster gets the same victims;
4. pods kube-scheduler chose that hold no GPU stay victims: it evicted them for something
   topoplace does not model (ports, affinity, pod count), so they are needed;
5. among the nodes left, the one that costs least, in kube-scheduler's own order
   (``pickOneNodeForPreemption``) but counting what goes with a gang member: fewest
   PodDisruptionBudget violations (the victims' and those of the gang members torn down
   with them, whose evictions a budget would refuse), lowest highest victim priority,
   lowest sum of priorities, fewest pods (victims and the rest of their gangs), then
   fewest GPUs disrupted, the best GPU set the pod gets there (ring bottleneck), the node
   name. The extender answers with that node alone, so kube-scheduler
   nominates it (it picks among the nodes it is given), and the live choice is the
   engine's.

A fractional pod (HAMi, gpushare; ``share``) passes its own fit in steps 2 and 3: devices
with the memory and compute it asks (``fractional.choose_devices``), not whole GPUs;
kube-scheduler counts only replicas, and may free one on a GPU whose memory the pod cannot
use. Among pods of equal rank the larger shares go first (fewer pods free the memory).

A gang member that preempts is handled by the extender (see ``Extender.preempt``): its
gang must fit with every lower-priority pod gone, and its node is chosen among those the
gang's plan then uses, so members' preemptions add up to one placement of the gang.

A gang kube-scheduler never preempts for (its members pass the in-tree filters, topoplace
refuses the gang as a whole: one node, one NVLink domain, one leaf) gets its victims from
:func:`gang_victims`, for a preemption topoplace starts itself: the gang is planned on the
cluster without the pods of the lowest priorities first (kube-scheduler's first rule:
the lowest highest victim priority), the tier's nodes are given back the costliest first
while the gang still fits (kube-scheduler's reprieve, a node at a time), the victims are
the pods still gone holding GPUs the plan uses, and the pods a PodDisruptionBudget
protects stay.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.core.disruption import BUDGETS_EXTRA, Budgets, budgets_from, violating
from scheduler.core.fractional import (
    REASON_NO_SHARE_ROOM,
    NodeTenancy,
    ShareRequest,
    choose_devices,
    node_tenancy,
    node_verdict,
)
from scheduler.core.model import Health, NodeInfo, PodInfo, PodRequest
from scheduler.core.params import SchedParams
from scheduler.core.remediation import Broken, being_deleted, gang_key
from scheduler.core.schedule import (
    CODE_NODE_SELECTOR,
    FEASIBLE,
    REASON_UNKNOWN_NODE,
    PlacementResult,
    choose_gpus,
    filter_codes,
    selector_matches,
    verdict_reason,
)
from scheduler.core.snapshot import (
    ClusterSnapshot,
    DoubleBookingError,
    only_node,
    with_pod,
    without_pod,
)

__all__ = [
    "REASON_CPU_MEMORY",
    "REASON_GANG_NO_FIT",
    "REASON_GANG_NOT_NEEDED",
    "REASON_GANG_NO_LOWER",
    "GangChoice",
    "gang_victims",
    "REASON_NO_LOWER",
    "REASON_NOT_NEEDED",
    "NodeChoice",
    "PreemptionDecision",
    "Victim",
    "broken_gangs",
    "fits_on",
    "lowest_priorities",
    "pod_priority",
    "select_victims",
    "started_choice",
    "without_lower",
]

REASON_NO_LOWER = "no pod of lower priority on the node"
REASON_NOT_NEEDED = "the pod fits without evicting anything"
REASON_CPU_MEMORY = "not enough CPU or memory even with every lower-priority pod gone"
REASON_OUTSIDE_GANG_PLAN = "not a node of the gang's placement"
REASON_GANG_NO_LOWER = "no pod of lower priority in the cluster"
MAX_GANG_REPRIEVES = 32
"""Nodes whose lower-priority pods a gang's victim search tries to give back, one gang
solve each (:func:`gang_victims`), the costliest first; then as many pods at most on the
nodes its placement uses."""
REASON_GANG_NOT_NEEDED = "the gang fits once the pods being deleted are gone"
REASON_GANG_NO_FIT = (
    "the gang does not fit even with every lower-priority pod gone that no disruption "
    "budget protects"
)


def pod_priority(p: PodInfo) -> int:
    """The pod's ``spec.priority`` (0 when absent or malformed, as kube-scheduler reads an
    unset priority)."""
    spec = p.raw.get("spec") if isinstance(p.raw, Mapping) else None
    v = spec.get("priority") if isinstance(spec, Mapping) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _held(p: PodInfo) -> int:
    """GPUs a pod holds (a fractional pod counts each GPU it has a share of)."""
    return len(p.gpus) + len(p.shares) + p.replicas


def _share_memory(p: PodInfo) -> int:
    """GPU memory (MiB) a fractional pod's shares hold (0 for other pods)."""
    return sum(s.memory_mib for s in p.shares)


def _evictable(p: PodInfo) -> bool:
    """A pod kube-scheduler knows and may delete: bound, with a UID, not only assumed by
    topoplace, not being deleted."""
    return not p.assumed and bool(p.uid) and bool(p.node) and not being_deleted(p)


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod to preempt.

    Attributes:
        pod: ``namespace/name``.
        uid: its UID (what kube-scheduler's reply names).
        priority: its priority.
        gpus: GPUs it holds.
        gang: its gang key ("" alone).
    """

    pod: str
    uid: str
    priority: int
    gpus: int
    gang: str = ""


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """The victims on one node, and what the pod gets there once they are gone.

    Attributes:
        node: the node.
        victims: the pods to preempt, highest priority first (kube-scheduler reads
            ``Pods[0]`` as the highest-priority victim).
        gangs_broken: gangs that lose a member (their other members go too).
        gang_members: the other bound members of those gangs (keys), torn down with them.
        gpus_disrupted: GPUs the victims and those members hold.
        gpus: the GPUs the pod gets there afterwards.
        bottleneck_gbps: their ring bottleneck (0 for one GPU).
    """

    node: str
    victims: tuple[Victim, ...]
    gangs_broken: tuple[str, ...]
    gang_members: tuple[str, ...]
    gpus_disrupted: int
    gpus: tuple[int, ...]
    bottleneck_gbps: float
    members_priority: int = 0
    """The sum of the torn-down members' priorities."""
    pdb_violations: int = 0
    """Victims whose eviction violates a PodDisruptionBudget (kube-scheduler's count)."""
    members_pdb_violations: int = 0
    """Torn-down gang members whose eviction a PodDisruptionBudget would refuse."""

    @property
    def cost(self) -> tuple[Any, ...]:
        """What the choice among nodes minimizes (see the module docstring, step 5)."""
        return (
            self.pdb_violations + self.members_pdb_violations,
            max(v.priority for v in self.victims),
            sum(v.priority for v in self.victims) + self.members_priority,
            len(self.victims) + len(self.gang_members),
            self.gpus_disrupted,
            -self.bottleneck_gbps,
            self.node,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (decision logs, ``/v1/inspect/preemptions``)."""
        return {
            "node": self.node,
            "victims": [
                {"pod": v.pod, "priority": v.priority, "gpus": v.gpus, "gang": v.gang}
                for v in self.victims
            ],
            "gangs_broken": list(self.gangs_broken),
            "gang_members_torn_down": list(self.gang_members),
            "gpus_disrupted": self.gpus_disrupted,
            "pdb_violations": self.pdb_violations,
            "members_pdb_violations": self.members_pdb_violations,
            "gpus": list(self.gpus),
            "bottleneck_gbps": self.bottleneck_gbps,
        }


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    """topoplace's answer to one preemption.

    Attributes:
        chosen: the cheapest node and its victims, or None (preempt nothing).
        options: every node where preemption helps, cheapest first.
        refused: node -> why preempting there does not help.
    """

    chosen: NodeChoice | None
    options: tuple[NodeChoice, ...]
    refused: Mapping[str, str]


def lowest_priorities(snap: ClusterSnapshot) -> dict[str, int]:
    """Per node, the lowest priority of a pod there that preemption may evict (nodes
    without one are absent): a pod of priority ``p`` can preempt only on nodes whose
    value is below ``p``. One pass over the pods."""
    out: dict[str, int] = {}
    for p in snap.pods.values():
        if _evictable(p):
            v = pod_priority(p)
            if v < out.get(p.node, v + 1):
                out[p.node] = v
    return out


def without_lower(snap: ClusterSnapshot, priority: int) -> ClusterSnapshot:
    """``snap`` with every evictable pod of priority below ``priority`` removed, and every
    pod being deleted (what the cluster looks like if preemption went all the way)."""
    out = snap
    for key in sorted(snap.pods):
        p = snap.pods[key]
        if being_deleted(p) or (_evictable(p) and pod_priority(p) < priority):
            out = without_pod(out, key)
    return out


def fits_on(
    snap: ClusterSnapshot,
    req: PodRequest,
    node: str,
    params: SchedParams,
    share: ShareRequest | None = None,
) -> str:
    """ "" when ``req`` fits ``node`` now (topoplace's filter, CPU and memory), else why
    not (an unknown node: :data:`REASON_UNKNOWN_NODE`). ``share``: the pod's GPU share
    (a fractional pod), placed on the node's devices instead of whole GPUs."""
    i = snap.index.get(node)
    return REASON_UNKNOWN_NODE if i is None else _fits(snap, req, i, params, share)


def _fits(
    snap: ClusterSnapshot,
    req: PodRequest,
    i: int,
    params: SchedParams,
    share: ShareRequest | None = None,
) -> str:
    """ "" when ``req`` passes topoplace's filter on the node at position ``i`` and fits
    its CPU and memory, else the reason. A fractional pod (``share``) passes the checks
    its own filter makes: the node not blocked, its nodeSelector, a sharing backend, and
    devices with the memory and compute it asks (``fractional.choose_devices``)."""
    n = snap.nodes[i]
    if share is None:
        code = int(filter_codes(snap, req, np.array([i], dtype=np.int64), params)[0])
    else:
        code = int(snap.arrays.blocked[i])
        if code == FEASIBLE and not selector_matches(n.labels, req.node_selector):
            code = CODE_NODE_SELECTOR
    if code != FEASIBLE:
        return verdict_reason(snap, code, i)
    if share is not None:
        why = node_verdict(n, share)
        if why:
            return why
        if choose_devices(n, share, None, params.selection_policy, _tenancy(snap, n)) is None:
            return REASON_NO_SHARE_ROOM
    if (n.cpu_milli and n.cpu_used_milli + req.cpu_milli > n.cpu_milli) or (
        n.memory_bytes and n.memory_used_bytes + req.memory_bytes > n.memory_bytes
    ):
        return REASON_CPU_MEMORY
    return ""


def _tenancy(snap: ClusterSnapshot, node: NodeInfo) -> NodeTenancy:
    """``node``'s tenancy from the share pods ``snap`` holds on it: the right-sizer's
    limits (tenants per GPU, compute at p95) a share must keep, as filter keeps them."""
    return node_tenancy(node, (p for p in snap.pods.values() if p.node == node.name))


def _gang_gpus(p: PodInfo, gangs: Mapping[str, list[PodInfo]]) -> int:
    """GPUs ``p``'s whole gang holds (0 for a pod alone): what evicting it costs, since
    the rest of its gang is torn down with it."""
    g = gang_key(p)
    return sum(_held(m) for m in gangs.get(g, ())) if g else 0


def _index(
    snap: ClusterSnapshot, nodes: Collection[str]
) -> tuple[dict[str, list[PodInfo]], dict[str, list[PodInfo]]]:
    """(gang -> its evictable members, node -> its pods, for ``nodes``), by key, in one
    pass over the pods."""
    gangs: dict[str, list[PodInfo]] = {}
    on: dict[str, list[PodInfo]] = {n: [] for n in nodes}
    for key in sorted(snap.pods):
        p = snap.pods[key]
        g = gang_key(p)
        if g and _evictable(p):
            gangs.setdefault(g, []).append(p)
        here = on.get(p.node)
        if here is not None:
            here.append(p)
    return gangs, on


def _on_node(
    snap: ClusterSnapshot,
    req: PodRequest,
    name: str,
    proposed: Collection[str],
    gangs: Mapping[str, list[PodInfo]],
    pods: Sequence[PodInfo],
    params: SchedParams,
    budgets: Budgets,
    share: ShareRequest | None = None,
) -> NodeChoice | str:
    """The victims on ``name`` (a :class:`NodeChoice`) or why preemption there does not help."""
    i = snap.index.get(name)
    if i is None:
        return REASON_UNKNOWN_NODE
    node = snap.nodes[i]
    if node.health.state >= Health.UNHEALTHY:
        return node.health.reasons[0] if node.health.reasons else "node unhealthy"
    base = only_node(snap, name, pods)  # what-ifs on one node cost one node
    i = 0
    lower: list[PodInfo] = []
    for p in pods:
        if being_deleted(p):
            base = without_pod(base, p.key)  # leaving already
        elif _evictable(p) and pod_priority(p) < req.priority:
            lower.append(p)
    if not lower:
        return REASON_NO_LOWER
    every = base
    for p in lower:
        every = without_pod(every, p.key)
    why = _fits(every, req, i, params, share)
    if why:
        return why
    # Pods kube-scheduler evicts for something topoplace does not model stay victims.
    needed = {p.key for p in lower if p.uid in proposed and not _held(p)}

    ranked = sorted(
        lower,
        key=lambda p: (-pod_priority(p), -_gang_gpus(p, gangs), _held(p), _share_memory(p), p.key),
    )
    viol = violating(ranked, budgets)
    # Budget violators are given back first, then the rest, each in the same order.
    order = sorted((p for p in ranked if p.key not in needed), key=lambda p: p.key not in viol)
    cur, gone = every, {p.key for p in lower}
    for p in order:
        try:
            trial = with_pod(cur, p)
        except (DoubleBookingError, KeyError):  # a GPU of it failed meanwhile: rebuild
            trial = base
            for k in sorted(gone - {p.key}):
                trial = without_pod(trial, k)
        if not _fits(trial, req, i, params, share):
            cur = trial
            gone.discard(p.key)
    if not gone:
        return REASON_NOT_NEEDED
    victims = sorted((p for p in lower if p.key in gone), key=lambda p: (-pod_priority(p), p.key))
    broken = sorted({gang_key(p) for p in victims if gang_key(p)})
    others = sorted(m.key for g in broken for m in gangs.get(g, ()) if m.key not in gone)
    disrupted = sum(_held(p) for p in victims) + sum(_held(snap.pods[k]) for k in others)
    torn = violating([p for p in ranked if p.key in gone] + [snap.pods[k] for k in others], budgets)
    if share is None:
        gs = choose_gpus(cur, req, name, params)
        gpus, bottleneck = tuple(gs.gpus), float(gs.bottleneck_gbps)
    else:
        n = cur.nodes[i]
        got = choose_devices(n, share, None, params.selection_policy, _tenancy(cur, n)) or []
        gpus, bottleneck = tuple(sorted({s.gpu for c in got for s in c})), 0.0
    return NodeChoice(
        node=name,
        victims=tuple(
            Victim(p.key, p.uid, pod_priority(p), _held(p), gang_key(p)) for p in victims
        ),
        gangs_broken=tuple(broken),
        gang_members=tuple(others),
        gpus_disrupted=disrupted,
        gpus=gpus,
        bottleneck_gbps=bottleneck,
        members_priority=sum(pod_priority(snap.pods[k]) for k in others),
        pdb_violations=sum(1 for p in victims if p.key in viol),
        members_pdb_violations=sum(1 for k in others if k in torn),
    )


def select_victims(
    snap: ClusterSnapshot,
    req: PodRequest,
    candidates: Mapping[str, Collection[str]],
    params: SchedParams,
    within: Collection[str] | None = None,
    share: ShareRequest | None = None,
) -> PreemptionDecision:
    """Victims for ``req`` on each of kube-scheduler's candidate nodes, and the cheapest.

    Args:
        snap: the cluster.
        req: the pending pod (whole GPUs; its ``priority`` decides who may go).
        candidates: node -> the UIDs kube-scheduler's dry run would evict there.
        params: scheduling parameters (the filter topoplace applies).
            PodDisruptionBudgets are read from ``snap.extra`` (``core.disruption``).
        within: when given, only these nodes may be chosen (a gang member: the nodes of
            its gang's placement); the others are refused.
        share: the pod's GPU share when it is a fractional pod (HAMi, gpushare): it must
            then get devices with the memory and compute it asks, not whole GPUs.

    Returns:
        The decision; ``chosen`` is None when no node helps.
    """
    gangs, on = _index(snap, candidates)
    budgets = budgets_from((snap.extra.get(BUDGETS_EXTRA) or {}).values())
    options: list[NodeChoice] = []
    refused: dict[str, str] = {}
    for name in sorted(candidates):
        if within is not None and name not in within:
            refused[name] = REASON_OUTSIDE_GANG_PLAN
            continue
        got = _on_node(
            snap, req, name, frozenset(candidates[name]), gangs, on[name], params, budgets, share
        )
        if isinstance(got, str):
            refused[name] = got
        else:
            options.append(got)
    options.sort(key=lambda c: c.cost)
    return PreemptionDecision(options[0] if options else None, tuple(options), refused)


def started_choice(decision: PreemptionDecision) -> NodeChoice | None:
    """The choice for a preemption topoplace starts itself (no kube-scheduler candidates;
    ``server.started_preemption``): the cheapest option that violates no
    PodDisruptionBudget, its victims' or their torn-down gang members' (the Eviction API
    would refuse those evictions), or None."""
    return next(
        (c for c in decision.options if not c.pdb_violations + c.members_pdb_violations), None
    )


@dataclass(frozen=True, slots=True)
class GangChoice:
    """The victims for a whole gang, and the placement it gets once they are gone.

    Attributes:
        placement: the gang's placement on the cluster without the victims (the gang
            policy's, as planned again once they are gone).
        victims: the pods to preempt, highest priority first.
        nodes: victim key -> its node.
        gangs_broken / gang_members: the victims' gangs and their other bound members
            (torn down with them), as :class:`NodeChoice`'s.
        gpus_disrupted: GPUs the victims and those members hold.
        tier: the highest priority among the victims.
    """

    placement: PlacementResult
    victims: tuple[Victim, ...]
    nodes: Mapping[str, str]
    gangs_broken: tuple[str, ...]
    gang_members: tuple[str, ...]
    gpus_disrupted: int
    tier: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``/v1/inspect/preemptions``)."""
        return {
            "nodes": sorted({a.node for a in self.placement.assignments}),
            "victims": [
                {
                    "pod": v.pod,
                    "node": self.nodes[v.pod],
                    "priority": v.priority,
                    "gpus": v.gpus,
                    "gang": v.gang,
                }
                for v in self.victims
            ],
            "gangs_broken": list(self.gangs_broken),
            "gang_members_torn_down": list(self.gang_members),
            "gpus_disrupted": self.gpus_disrupted,
            "pdb_violations": 0,
            "placement": [
                {"pod": a.pod, "node": a.node, "gpus": list(a.gpus)}
                for a in self.placement.assignments
            ],
        }


def _uses(p: PodInfo, taken: Mapping[str, set[int]]) -> bool:
    """Whether ``p`` holds a GPU of ``taken`` (node -> GPU indices), or, not knowing which
    GPUs it holds (time-slicing replicas, indices not recorded), any GPU of a node there."""
    on = taken.get(p.node)
    if on is None:
        return False
    if p.replicas or not p.gpu_indices_known:
        return True
    return not on.isdisjoint(p.gpus) or any(s.gpu in on for s in p.shares)


def gang_victims(
    snap: ClusterSnapshot,
    priority: int,
    plan: Callable[[ClusterSnapshot], PlacementResult],
    held: Collection[str] = (),
) -> GangChoice | str:
    """Victims for a gang of ``priority`` that no node can take whole now, or why none
    helps (a preemption topoplace starts: kube-scheduler preempts for no member, see the
    module docstring).

    ``plan`` places the gang on a snapshot (the gang policy, members already bound kept
    where they are). The lower priorities are tried lowest first: the gang is planned on
    the cluster without every evictable pod of priority up to the tier (and every pod being
    deleted). At the first tier where it fits, the tier's pods are given back a node at a
    time, the costliest node first (highest priority, then sum of priorities, then most
    pods; at most :data:`MAX_GANG_REPRIEVES` nodes, one solve each), while the gang still
    fits, then the pods left on the placement's nodes one at a time, the costliest to lose
    first (at most as many again); the victims are then the pods still gone that hold a
    GPU the placement uses, with their gangs' other members torn down. Pods a
    PodDisruptionBudget protects (the victims' and those members', walked highest priority
    first) are kept and the tier planned again: the Eviction API would refuse them. The
    victims must leave room for the gang by themselves (it is planned again without only
    them); else every pod of the tier on the placement's nodes goes, else the whole tier.
    ``held``: UIDs of pods being deleted whose GPUs stay counted as taken (the victims of
    another preemption in progress: their GPUs are for the pod they go for).
    Deterministic: the same snapshot and gang give the same victims."""
    gangs, _ = _index(snap, ())
    budgets = budgets_from((snap.extra.get(BUDGETS_EXTRA) or {}).values())
    lower = sorted(
        (p for p in snap.pods.values() if _evictable(p) and pod_priority(p) < priority),
        key=lambda p: (-pod_priority(p), p.key),
    )
    if not lower:
        return REASON_GANG_NO_LOWER
    base = snap
    for key in sorted(snap.pods):
        p = snap.pods[key]
        if being_deleted(p) and p.uid not in held:
            base = without_pod(base, key)
    if base is not snap and plan(base).ok:  # room once they are gone: nothing to evict
        return REASON_GANG_NOT_NEEDED
    kept: set[str] = set()  # protected by a budget
    for tier in sorted({pod_priority(p) for p in lower}):
        while True:
            pool = [p for p in lower if pod_priority(p) <= tier and p.key not in kept]
            got = _gang_tier(base, pool, gangs, budgets, plan, tier)
            if isinstance(got, frozenset):  # victims a budget protects: keep them, again
                kept |= got
                continue
            if got is not None:
                return got
            break
    return REASON_GANG_NO_FIT


def _gang_tier(
    base: ClusterSnapshot,
    pool: Sequence[PodInfo],
    gangs: Mapping[str, list[PodInfo]],
    budgets: Budgets,
    plan: Callable[[ClusterSnapshot], PlacementResult],
    tier: int,
) -> GangChoice | frozenset[str] | None:
    """:func:`gang_victims` for one tier: the choice, the keys a budget protects among its
    victims (and their torn-down members), or None (the gang does not fit)."""

    def without(keys: Collection[str]) -> ClusterSnapshot:
        out = base
        for k in sorted(keys):
            out = without_pod(out, k)
        return out

    if not pool:
        return None
    trial = plan(without(p.key for p in pool))
    if not trial.ok:
        return None
    # Given back node by node, the costliest to lose first (kube-scheduler's reprieve, a
    # node's pods at a time): a node stays given back when the gang still fits.
    on: dict[str, list[PodInfo]] = {}
    for p in pool:
        on.setdefault(p.node, []).append(p)
    order = sorted(
        on,
        key=lambda n: (
            -max(pod_priority(p) for p in on[n]),
            -sum(pod_priority(p) for p in on[n]),
            -len(on[n]),
            n,
        ),
    )
    gone_keys = {p.key for p in pool}
    for n in order[:MAX_GANG_REPRIEVES]:
        back = gone_keys - {p.key for p in on[n]}
        moved = plan(without(back))
        if moved.ok:
            gone_keys, trial = back, moved

    # Then the pods left on the placement's nodes, one at a time, the costliest to lose
    # first (as for a pod alone: higher priority, then gang members, the largest gang
    # first, then the smallest pods): the gang's GPU sets were chosen with every one gone.
    used = {a.node for a in trial.assignments}
    left = sorted(
        (p for p in pool if p.key in gone_keys and p.node in used),
        key=lambda p: (-pod_priority(p), -_gang_gpus(p, gangs), _held(p), p.key),
    )
    for p in left[:MAX_GANG_REPRIEVES]:
        back = gone_keys - {p.key}
        moved = plan(without(back))
        if moved.ok:
            gone_keys, trial = back, moved
    pool = [p for p in pool if p.key in gone_keys]
    if not pool:  # it fits with every pod given back: nothing of this tier is needed
        return None
    taken: dict[str, set[int]] = {}
    for a in trial.assignments:
        taken.setdefault(a.node, set()).update(a.gpus)
    on_nodes = [p for p in pool if p.node in taken]
    for victims in ([p for p in on_nodes if _uses(p, taken)], on_nodes, list(pool)):
        if not victims:
            continue
        placed = plan(without(p.key for p in victims))
        if placed.ok:
            break
    else:  # pragma: no cover - the whole pool is what the trial ran without
        return None
    gone = {p.key for p in victims}
    broken = sorted({gang_key(p) for p in victims if gang_key(p)})
    others = sorted(m.key for g in broken for m in gangs.get(g, ()) if m.key not in gone)
    walked = sorted(victims, key=lambda p: (-pod_priority(p), p.key))
    torn = [base.pods[k] for k in others if k in base.pods]
    viol = violating(walked + torn, budgets)
    if viol:
        # a protected member keeps its whole gang's victims in place
        protect = set(viol)
        for p in walked + torn:
            if p.key in viol and gang_key(p):
                protect |= {m.key for m in gangs.get(gang_key(p), ())}
        return frozenset(protect) if any(p.key in protect for p in pool) else None
    return GangChoice(
        placement=placed,
        victims=tuple(Victim(p.key, p.uid, pod_priority(p), _held(p), gang_key(p)) for p in walked),
        nodes={p.key: p.node for p in walked},
        gangs_broken=tuple(broken),
        gang_members=tuple(others),
        gpus_disrupted=sum(_held(p) for p in victims) + sum(_held(p) for p in torn),
        tier=max(pod_priority(p) for p in victims),
    )


def broken_gangs(
    snap: ClusterSnapshot, choice: NodeChoice | GangChoice, preemptor: str
) -> list[Broken]:
    """The gangs ``choice`` breaks, as records for their teardown
    (``remediation.teardown_groups``): per gang its first victim and the UIDs of its other
    members bound now."""
    gone = {v.uid for v in choice.victims}
    torn = set(choice.gang_members)
    out = []
    for g in choice.gangs_broken:
        first = next(v for v in choice.victims if v.gang == g)
        members = frozenset(
            p.uid
            for k in sorted(torn)
            if (p := snap.pods.get(k)) is not None and gang_key(p) == g and p.uid not in gone
        )
        out.append(Broken(g, first.pod, first.uid, members, preemptor))
    return out
