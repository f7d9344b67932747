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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduler.core import dra
from scheduler.core.health import (
    REASON_DEVICE_TAINT,
    REASON_FAULT_TAINT,
    REASON_GPU_FAULT,
    REASON_NOT_READY,
    REASON_NVSENTINEL,
    RESOURCESLICES_KEY,
    HealthParams,
    assess,
    devices_by_node,
)
from scheduler.core.model import Health, NodeInfo, PodInfo

if TYPE_CHECKING:  # the snapshot module imports the parameters, which import this one
    from scheduler.core.snapshot import ClusterSnapshot

MODES = ("off", "dry-run", "evict")
OPT_OUT_ANNOTATION = "topoplace.io/remediation"
"""A pod annotated ``topoplace.io/remediation: "off"`` is never evicted by topoplace."""

KIND_NODE = "node"
"""The pod's node failed."""
KIND_GPU = "gpu"
"""One of the pod's GPUs failed (its node still serves)."""
KIND_GANG = "gang"
"""A member of the pod's gang is on failed hardware (the pod's own hardware is fine)."""

MIN_NODES_FOR_SHARE_GUARD = 3
"""Below this many GPU nodes the storm guard does not apply (one of two nodes failing is
half the cluster, and still one failure)."""


@dataclass(frozen=True, slots=True)
class RemediationParams:
    """What topoplace does about pods on failed hardware (policy.yaml ``remediation:``).

    Attributes:
        mode: ``off`` (nothing), ``dry-run`` (log and count what would be evicted) or
            ``evict`` (evict through the Eviction API).
        after_seconds: how long a pod must have been on failed hardware before it is
            evicted.
        whole_gangs: evict every bound member of a gang one of whose members is on failed
            hardware (a gang cannot run with a member missing).
        node_reasons: UNHEALTHY node verdict reasons that mean failed hardware.
        gpu_reasons: per-GPU reasons that mean the GPU failed.
        grace_period_seconds: the evictions' grace period (None: each pod's own).
        max_evictions_per_minute: bound on evictions per minute (a whole gang waits for
            room, unless it is larger than the bound).
        max_failed_node_share: above this share of GPU nodes failed at once, nothing is
            evicted.
        check_seconds: how often the adapter looks.
    """

    mode: str = "dry-run"
    after_seconds: float = 60.0
    whole_gangs: bool = True
    node_reasons: tuple[str, ...] = (
        REASON_NOT_READY,
        REASON_FAULT_TAINT,
        REASON_NVSENTINEL,
        REASON_GPU_FAULT,
    )
    gpu_reasons: tuple[str, ...] = (REASON_DEVICE_TAINT,)
    grace_period_seconds: int | None = None
    max_evictions_per_minute: int = 60
    max_failed_node_share: float = 0.5
    check_seconds: float = 5.0

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> RemediationParams:
        """Build from the ``remediation:`` mapping of policy.yaml.

        Raises:
            ValueError: unknown keys or values out of range (the message names the key).
        """
        if not obj:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValueError("remediation must be a mapping")
        unknown = set(obj) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown remediation settings: {sorted(unknown)}")
        d = cls()
        mode = obj.get("mode", d.mode)
        if mode not in MODES:
            raise ValueError(f"remediation.mode must be one of {list(MODES)}, got {mode!r}")
        whole = obj.get("whole_gangs", d.whole_gangs)
        if not isinstance(whole, bool):
            raise ValueError("remediation.whole_gangs must be true or false")
        reasons: dict[str, tuple[str, ...]] = {}
        for key in ("node_reasons", "gpu_reasons"):
            v = obj.get(key, getattr(d, key))
            if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"remediation.{key} must be a list of reason strings")
            reasons[key] = tuple(v)
        grace = obj.get("grace_period_seconds", d.grace_period_seconds)
        if grace is not None and (
            isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= 86400
        ):
            raise ValueError("remediation.grace_period_seconds must be null or 0..86400")
        nums = {}
        for key, lo, hi in (
            ("after_seconds", 0.0, 86400.0),
            ("max_failed_node_share", 0.0, 1.0),
            ("check_seconds", 0.05, 3600.0),
        ):
            v = obj.get(key, getattr(d, key))
            if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
                raise ValueError(f"remediation.{key} must be a number in {lo:g}..{hi:g}")
            nums[key] = float(v)
        rate = obj.get("max_evictions_per_minute", d.max_evictions_per_minute)
        if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= 100_000:
            raise ValueError("remediation.max_evictions_per_minute must be an integer >= 1")
        return cls(
            mode=mode,
            whole_gangs=whole,
            grace_period_seconds=grace,
            max_evictions_per_minute=rate,
            **reasons,
            **nums,
        )


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


def _terminating(p: PodInfo) -> bool:
    meta = p.raw.get("metadata") if isinstance(p.raw, Mapping) else None
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


def _opted_out(p: PodInfo) -> bool:
    meta = p.raw.get("metadata") if isinstance(p.raw, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(ann, Mapping) and str(ann.get(OPT_OUT_ANNOTATION, "")).lower() == "off"


def _scheduler_name(p: PodInfo) -> str:
    spec = p.raw.get("spec") if isinstance(p.raw, Mapping) else None
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def gang_key(p: PodInfo) -> str:
    """The pod's gang key (``namespace/group``), read from its object: a claim pod's bind
    records it without one (its gang is whole already when its claims are allocated)."""
    if p.gang:
        return p.gang
    from scheduler.core.objects import gang_of  # objects -> params -> this module

    return gang_of(p.raw)[0] if isinstance(p.raw, Mapping) and p.raw else ""


def eligible(p: PodInfo, profiles: Collection[str], holding: bool = True) -> bool:
    """A pod topoplace may evict: bound (not only assumed), holding GPUs (``holding``; a
    pod whose GPUs its ResourceClaims hold holds none itself), of one of ``profiles``, not
    being deleted, not opted out."""
    return (
        not p.assumed
        and bool(p.node)
        and (_holds_gpus(p) or not holding)
        and _scheduler_name(p) in profiles
        and not _terminating(p)
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
    raw = holding.raw if isinstance(holding.raw, Mapping) else {}
    meta = raw.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    status = raw.get("status")
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
    groups: list[tuple[Fault, ...]] = []
    taken: set[str] = set()
    for f in sorted(due, key=lambda f: (waiting[f.pod], f.pod)):
        if f.pod in taken:
            continue
        direct = {g.pod: g for g in faults if f.gang and g.gang == f.gang}
        group = [Fault(f.pod, f.uid, f.node, f.kind, f.reason, f.gang, f.pod, waiting[f.pod])]
        taken.add(f.pod)
        for p in members.get(f.gang, ()) if f.gang else ():
            if p.key in taken:
                continue
            taken.add(p.key)
            own = direct.get(p.key)
            if own is not None:  # on failed hardware too (due or not: the gang goes whole)
                group.append(
                    Fault(p.key, p.uid, p.node, own.kind, own.reason, f.gang, p.key, waiting[p.key])
                )
            else:
                group.append(
                    Fault(p.key, p.uid, p.node, KIND_GANG, f.reason, f.gang, f.pod, waiting[f.pod])
                )
        groups.append(tuple(group))
    return Plan(tuple(groups), waiting, failed, gpu_nodes, "")
