"""Which running pods sit on failed hardware, and what to evict so their work is re-placed.

Pure: a function of the snapshot (its nodes' health verdicts and Node objects, its pods),
:class:`RemediationParams`, :class:`~scheduler.core.health.HealthParams` and a ``now``
passed in. The kube adapter (``scheduler/kube/remediator.py``) keeps the only state (since
when each pod has been on failed hardware, what it evicted) and does the evictions.

Why topoplace evicts at all. Kubernetes evicts the pods of a node that stopped reporting
(the not-ready / unreachable ``NoExecute`` taints, after the pods' 300 s default
toleration), NVSentinel drains a node it quarantined, and the DRA device taint controller
evicts pods of a ``NoExecute``-tainted device. None of them knows gangs: when one member of
a training gang loses its node, the others keep their GPUs and wait in a collective until
their own timeout (NCCL's default is minutes), and the gang can only restart once they are
gone too. And the device plugin path has no per-GPU eviction at all: a fatal fault on one
GPU leaves its pod there. topoplace knows which GPUs each pod holds and which gang it is
in, so it evicts exactly the pods whose GPUs failed, and their whole gang, through the
Eviction API (PodDisruptionBudgets apply); their controllers recreate them and topoplace
places the new pods, all-or-nothing, on healthy hardware.

A pod counts as **on failed hardware** when it holds GPUs (whole, fractional shares or
replicas; or through DRA ResourceClaims reserved for it, ``status.reservedFor``) on a node
whose verdict is UNHEALTHY for one of ``node_reasons`` (a node topoplace cannot model is
not a failure, nor is a cordon), or holds a GPU whose own verdict carries one of
``gpu_reasons``. Only pods of topoplace's kube-scheduler profiles are
considered (``spec.schedulerName``), never a pod being deleted, never one annotated
:data:`OPT_OUT_ANNOTATION` ``: "off"``, never one only assumed.

Guards, all data: a fault must persist ``after_seconds`` before anything is evicted (a
kubelet restart is not a failure); when more than ``max_failed_node_share`` of the GPU
nodes have failed at once, nothing is evicted (a cluster-wide signal is more likely a
broken monitor than broken hardware, the reasoning of kube-controller-manager's
``unhealthyZoneThreshold``); the adapter also bounds evictions per minute.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from scheduler.core import dra
from scheduler.core.health import RESOURCESLICES_KEY, HealthParams, assess, devices_by_node
from scheduler.core.model import Health, NodeInfo, PodInfo
from scheduler.core.objects import gang_of, meta
from scheduler.core.params import RemediationParams
from scheduler.core.snapshot import ClusterSnapshot

__all__ = [  # RemediationParams lives with the other policy sections (params.py)
    "KIND_GANG",
    "KIND_GPU",
    "KIND_NODE",
    "KIND_PREEMPTED",
    "OPT_OUT_ANNOTATION",
    "Broken",
    "Fault",
    "Plan",
    "RemediationParams",
    "being_deleted",
    "eligible",
    "failed_gpus",
    "fault_rows",
    "gang_key",
    "node_failure",
    "on_failed_hardware",
    "plan",
    "teardown_groups",
]

OPT_OUT_ANNOTATION = "topoplace.io/remediation"
"""A pod annotated ``topoplace.io/remediation: "off"`` is never evicted by topoplace."""

KIND_NODE = "node"
"""The pod's node failed."""
KIND_GPU = "gpu"
"""One of the pod's GPUs failed (its node still serves)."""
KIND_GANG = "gang"
"""A member of the pod's gang is on failed hardware (the pod's own hardware is fine)."""
KIND_PREEMPTED = "preempted"
"""A member of the pod's gang was preempted (see :func:`teardown_groups`)."""
REASON_MEMBER_PREEMPTED = "a member of its gang was preempted"

MIN_NODES_FOR_SHARE_GUARD = 3
"""Below this many GPU nodes the storm guard does not apply (one of two nodes failing is
half the cluster, and still one failure)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A pod to evict, and why.

    Attributes:
        pod: ``namespace/name``.
        uid: the pod's UID (the eviction's precondition: never a namesake).
        node: its node.
        kind: :data:`KIND_NODE`, :data:`KIND_GPU` or :data:`KIND_GANG`.
        reason: the constant health reason (for ``gang``: the member's).
        gang: its gang key ("" for a pod alone).
        cause: the pod on failed hardware (itself unless ``kind`` is ``gang``).
        since: when it was first seen on failed hardware (for ``gang``: the cause's).
    """

    pod: str
    uid: str
    node: str
    kind: str
    reason: str
    gang: str = ""
    cause: str = ""
    since: float = 0.0


@dataclass(frozen=True, slots=True)
class Broken:
    """A gang that loses a member to preemption (recorded when topoplace names the victim).

    Attributes:
        gang: the gang key.
        victim: the preempted member (``namespace/name``) and ``victim_uid`` its UID.
        members: UIDs of the gang's other members bound at that moment: only these are torn
            down (a gang recreated under the same name later is a new gang).
        preemptor: the pod that preempts.
    """

    gang: str
    victim: str
    victim_uid: str
    members: frozenset[str]
    preemptor: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do now.

    Attributes:
        groups: the faults due for eviction, one group per incident (a pod alone, or a gang
            with every bound member), in a stable order (earliest fault first, then key).
        waiting: pods on failed hardware not yet due (key -> first seen), to carry over.
        failed_nodes / gpu_nodes: how many GPU nodes are failed / modelled.
        paused: why nothing may be evicted now ("" when evictions may proceed).
    """

    groups: tuple[tuple[Fault, ...], ...]
    waiting: Mapping[str, float]
    failed_nodes: int = 0
    gpu_nodes: int = 0
    paused: str = ""


def _holds_gpus(p: PodInfo) -> bool:
    return bool(p.gpus or p.shares or p.replicas)


def _gpus_of(p: PodInfo) -> tuple[int, ...]:
    return tuple(p.gpus) + tuple(s.gpu for s in p.shares)


def being_deleted(p: PodInfo) -> bool:
    """The pod carries a ``deletionTimestamp`` (it is going)."""
    return bool(meta(p.raw).get("deletionTimestamp"))


def _opted_out(p: PodInfo) -> bool:
    ann = meta(p.raw).get("annotations")
    return isinstance(ann, Mapping) and str(ann.get(OPT_OUT_ANNOTATION, "")).lower() == "off"


def _scheduler_name(p: PodInfo) -> str:
    spec = p.raw.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def gang_key(p: PodInfo) -> str:
    """The pod's gang key (``namespace/group``), read from its object: a claim pod's bind
    records it without one (its gang is whole already when its claims are allocated)."""
    return p.gang or gang_of(p.raw)[0]


def eligible(p: PodInfo, profiles: Collection[str], holding: bool = True) -> bool:
    """A pod topoplace may evict: bound (not only assumed), holding GPUs (``holding``; a
    pod whose GPUs its ResourceClaims hold holds none itself), of one of ``profiles``, not
    being deleted, not opted out."""
    return (
        not p.assumed
        and bool(p.node)
        and (_holds_gpus(p) or not holding)
        and _scheduler_name(p) in profiles
        and not being_deleted(p)
        and not _opted_out(p)
    )


def node_failure(node: NodeInfo, params: RemediationParams) -> str:
    """The reason ``node`` counts as failed hardware ("" when it does not)."""
    h = node.health
    if h.state < Health.UNHEALTHY or node.unmodeled:
        return ""
    return next((r for r in h.reasons if r in params.node_reasons), "")


def failed_gpus(
    node: NodeInfo,
    params: RemediationParams,
    health: HealthParams,
    devices: Iterable[Mapping[str, Any]] = (),
) -> Mapping[int, str]:
    """GPU index -> the reason it failed, for the GPUs of ``node`` whose own verdict
    carries one of ``params.gpu_reasons`` (only GPUs the node's verdict excludes are
    looked at; the per-GPU breakdown is assessed again from the Node object)."""
    if not node.health.bad_mask or not params.gpu_reasons:
        return {}
    report = assess(
        node.raw, node.gpu_capacity, node.gpu_allocatable, health, devices=tuple(devices)
    )
    out: dict[int, str] = {}
    for g in report.gpus:
        if node.health.bad_mask >> g.index & 1:
            hit = next((r for r in g.reasons if r in params.gpu_reasons), "")
            if hit:
                out[g.index] = hit
    return out


def on_failed_hardware(
    snap: ClusterSnapshot,
    params: RemediationParams,
    health: HealthParams,
    profiles: Collection[str],
) -> tuple[tuple[Fault, ...], int, int]:
    """Eligible pods on failed hardware (sorted by key, ``since`` unset), the GPU nodes
    failed, and the GPU nodes modelled."""
    failed: dict[str, str] = {}
    gpu_nodes = 0
    any_bad_gpu = False
    for n in snap.nodes:
        if n.unmodeled or not (n.gpu_capacity or n.replica_gpus or n.devices):
            continue
        gpu_nodes += 1
        any_bad_gpu = any_bad_gpu or bool(n.health.bad_mask)
        why = node_failure(n, params)
        if why:
            failed[n.name] = why
    if not failed and not (any_bad_gpu and params.gpu_reasons):
        return (), 0, gpu_nodes  # the usual case: no pod to look at
    slices = snap.extra.get(RESOURCESLICES_KEY) if isinstance(snap.extra, Mapping) else None
    devices: Mapping[str, tuple[Mapping[str, Any], ...]] | None = None
    gpu_cache: dict[str, Mapping[int, str]] = {}

    def hit(holder: PodInfo) -> tuple[str, str]:
        """(kind, reason) if ``holder``'s node or one of its GPUs failed, else ("", "")."""
        nonlocal devices
        why = failed.get(holder.node, "")
        if why:
            return KIND_NODE, why
        node = snap.node(holder.node)
        mine = _gpus_of(holder)
        if node is None or not any(node.health.bad_mask >> g & 1 for g in mine):
            return "", ""
        bad = gpu_cache.get(node.name)
        if bad is None:
            if devices is None:
                devices = devices_by_node(slices or (), health) if slices else {}
            bad = gpu_cache[node.name] = failed_gpus(
                node, params, health, devices.get(node.name, ())
            )
        reason = next((bad[g] for g in mine if g in bad), "")
        return (KIND_GPU, reason) if reason else ("", "")

    out: dict[str, Fault] = {}
    for key in sorted(snap.pods):
        p = snap.pods[key]
        if key.startswith(dra.HOLDER_PREFIX):  # a claim holds the GPUs: its consumers go
            if p.assumed:
                continue
            kind, why = hit(p)
            for q in _consumers(snap, p) if kind else ():
                if q.key not in out and eligible(q, profiles, holding=False):
                    out[q.key] = Fault(q.key, q.uid, q.node, kind, why, gang_key(q), q.key)
            continue
        if not eligible(p, profiles):
            continue
        kind, why = hit(p)
        if kind:
            out[key] = Fault(key, p.uid, p.node, kind, why, gang_key(p), key)
    return tuple(out[k] for k in sorted(out)), len(failed), gpu_nodes


def _consumers(snap: ClusterSnapshot, holding: PodInfo) -> list[PodInfo]:
    """The pods a claim holding is reserved for (``status.reservedFor``, matched by UID
    when it is given), as the snapshot holds them."""
    ns = meta(holding.raw).get("namespace")
    status = holding.raw.get("status")
    refs = status.get("reservedFor") if isinstance(status, Mapping) else None
    out = []
    for r in refs if isinstance(refs, list) and isinstance(ns, str) else ():
        if not isinstance(r, Mapping) or r.get("resource", "pods") != "pods":
            continue
        q = snap.pods.get(f"{ns}/{r.get('name')}")
        if q is not None and (not r.get("uid") or r.get("uid") == q.uid):
            out.append(q)
    return out


def plan(
    snap: ClusterSnapshot,
    params: RemediationParams,
    health: HealthParams,
    profiles: Collection[str],
    now: float,
    since: Mapping[str, float],
) -> Plan:
    """What to evict at ``now``.

    Args:
        snap: the cluster as the cache holds it.
        params: remediation policy (its ``mode`` is the caller's business).
        health: the health parameters the verdicts were made with.
        profiles: kube-scheduler profiles whose pods topoplace places.
        now: the caller's clock.
        since: pod key -> when it was first seen on failed hardware (the previous plan's
            ``waiting``, plus the groups the caller has not evicted yet).

    Returns:
        The due groups, every pod still on failed hardware with its first-seen time, and
        the storm guard's verdict. A pod no longer on failed hardware drops out of
        ``waiting`` (its clock starts again if it fails again).
    """
    faults, failed, gpu_nodes = on_failed_hardware(snap, params, health, profiles)
    waiting = {f.pod: since.get(f.pod, now) for f in faults}
    paused = ""
    if gpu_nodes >= MIN_NODES_FOR_SHARE_GUARD and failed > params.max_failed_node_share * gpu_nodes:
        paused = (
            f"{failed} of {gpu_nodes} GPU nodes failed at once, over "
            f"max_failed_node_share {params.max_failed_node_share:g}: evictions held"
        )
    due = [f for f in faults if now - waiting[f.pod] >= params.after_seconds]
    if paused or not due:
        return Plan((), waiting, failed, gpu_nodes, paused)
    members: dict[str, list[PodInfo]] = {}
    if params.whole_gangs:
        for key in sorted(snap.pods):
            p = snap.pods[key]
            g = gang_key(p)
            if g and eligible(p, profiles, holding=False):  # DRA members hold no GPU
                members.setdefault(g, []).append(p)
    by_pod = {f.pod: f for f in faults}
    groups: list[tuple[Fault, ...]] = []
    taken: set[str] = set()
    for f in sorted(due, key=lambda f: (waiting[f.pod], f.pod)):
        if f.pod in taken:
            continue
        group = [replace(f, since=waiting[f.pod])]
        taken.add(f.pod)
        for p in members.get(f.gang, ()) if f.gang else ():
            if p.key in taken:
                continue
            taken.add(p.key)
            own = by_pod.get(p.key)  # on failed hardware too (due or not: the gang goes whole)
            if own is not None:
                group.append(replace(own, since=waiting[p.key]))
            else:
                group.append(
                    Fault(p.key, p.uid, p.node, KIND_GANG, f.reason, f.gang, f.pod, waiting[f.pod])
                )
        groups.append(tuple(group))
    return Plan(tuple(groups), waiting, failed, gpu_nodes, "")


def fault_rows(
    faults: Iterable[Fault],
    since: Mapping[str, float] | None = None,
    after: float = 0.0,
    now: float = 0.0,
) -> list[dict[str, Any]]:
    """The pods on failed hardware as ``GET /v1/inspect/remediation`` shows them: where and
    why; with ``since`` (what the remediator tracks), also for how long each has been seen
    (None: not yet) and in how many seconds it is due."""
    rows: list[dict[str, Any]] = []
    for f in faults:
        row: dict[str, Any] = {
            "pod": f.pod,
            "node": f.node,
            "kind": f.kind,
            "reason": f.reason,
            "gang": f.gang,
        }
        if since is not None:
            seen = since.get(f.pod)
            row["seen_for_seconds"] = None if seen is None else round(now - seen, 3)
            row["due_in_seconds"] = (
                after if seen is None else round(max(0.0, seen + after - now), 3)
            )
        rows.append(row)
    return rows


def teardown_groups(
    snap: ClusterSnapshot, broken: Iterable[Broken], profiles: Collection[str]
) -> tuple[tuple[tuple[Fault, ...], Broken], ...]:
    """The rest of each gang that lost a member to preemption, to evict now.

    A training gang that loses one member cannot go on: the others would wait in a
    collective and hold their GPUs until their job fails. So, as for a member on failed
    hardware, the gang goes whole and its controller recreates it (gang schedulers preempt
    whole pod groups for the same reason). A record counts once its victim is being deleted
    or gone (kube-scheduler did preempt it); until then it waits (``()`` is not returned
    for it). Only the members recorded with it are evicted, and only those
    :func:`eligible` now (not opted out, not being deleted, of topoplace's profiles).

    Returns:
        (group, record) for every record whose victim went, the group possibly empty
        (nothing left to evict: the record is done).
    """
    by_uid = {p.uid: p for p in snap.pods.values() if p.uid}
    out: list[tuple[tuple[Fault, ...], Broken]] = []
    for b in broken:
        victim = by_uid.get(b.victim_uid)
        if victim is not None and not being_deleted(victim):
            continue  # not preempted (yet)
        group = tuple(
            Fault(p.key, p.uid, p.node, KIND_PREEMPTED, REASON_MEMBER_PREEMPTED, b.gang, b.victim)
            for uid in sorted(b.members)
            if (p := by_uid.get(uid)) is not None and eligible(p, profiles, holding=False)
        )
        out.append((group, b))
    return tuple(out)
