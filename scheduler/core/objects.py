"""Kubernetes objects (camelCase JSON dicts) -> the core model.

Pure: every function reads its arguments only. Objects may come from a ``kubectl get -o
json`` List, from kube-scheduler's extender payloads (no kind/apiVersion), or from a watch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from scheduler.core.health import HealthParams, assess_node
from scheduler.core.linkclass import class_rank
from scheduler.core.model import (
    EMPTY_MAP,
    GPU_RESOURCE,
    PLACEMENT_ANNOTATION,
    PLACEMENT_VERSION,
    NodeInfo,
    PodRequest,
    TopologyConstraint,
    frozen_map,
)
from scheduler.core.quantity import cpu_milli, quantity_int
from topology.fabric import Fabric
from topology.shape import resolve_node_shape

MIN_LINK_ANNOTATION = "topoplace.io/min-link"
GANG_ANNOTATION = "topoplace.io/gang"
GANG_SIZE_ANNOTATION = "topoplace.io/gang-size"
GANG_ROLE_ANNOTATION = "topoplace.io/role"
TOPOLOGY_REQUIRED = "topoplace.io/topology-required"
TOPOLOGY_PREFERRED = "topoplace.io/topology-preferred"

# (kind of key, key) in order of precedence for gang membership.
GANG_KEYS: tuple[tuple[str, str], ...] = (
    ("annotation", GANG_ANNOTATION),
    ("label", "scheduling.x-k8s.io/pod-group"),
    ("annotation", "scheduling.k8s.io/group-name"),
    ("annotation", "pod-group-name"),
    ("label", "pod-group-name"),
)
REQUIRED_TOPOLOGY_KEYS = (
    TOPOLOGY_REQUIRED,
    "kai.scheduler/topology-required-placement",
    "kueue.x-k8s.io/podset-required-topology",
)
PREFERRED_TOPOLOGY_KEYS = (
    TOPOLOGY_PREFERRED,
    "kai.scheduler/topology-preferred-placement",
    "kueue.x-k8s.io/podset-preferred-topology",
)
HOSTNAME_LEVEL = "node"
"""Pseudo fabric level meaning "all members on one node" (``kubernetes.io/hostname``)."""


class ObjectError(ValueError):
    """A Kubernetes object is malformed in a way that prevents a decision."""


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's metadata mapping (empty if absent)."""
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else EMPTY_MAP


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a namespaced object (``default`` namespace if absent)."""
    m = meta(obj)
    return f"{m.get('namespace') or 'default'}/{m.get('name') or ''}"


def node_gpus(node: Mapping[str, Any]) -> tuple[int, int]:
    """(capacity, allocatable) whole GPUs of a Node; capacity falls back to allocatable."""
    status = node.get("status") or {}
    alloc = quantity_int((status.get("allocatable") or {}).get(GPU_RESOURCE), 0)
    cap = quantity_int((status.get("capacity") or {}).get(GPU_RESOURCE), alloc)
    return max(cap, alloc), alloc


def node_from_object(
    node: Mapping[str, Any],
    fabric: Fabric,
    health: HealthParams,
    used_mask: int = 0,
    *,
    now: float | None = None,
    devices: Mapping[str, Any] | None = None,
) -> NodeInfo:
    """Build a :class:`NodeInfo` from a Node object.

    ``now`` (wall-clock epoch seconds) enables time-based health signals; ``devices`` maps
    node names to their DRA devices (``health.devices_by_node``).

    Raises:
        ObjectError: the object has no name.
    """
    m = meta(node)
    name = m.get("name")
    if not name or not isinstance(name, str):
        raise ObjectError("node object without metadata.name")
    labels = frozen_map(m.get("labels"))
    annotations = frozen_map(m.get("annotations"))
    cap, alloc = node_gpus(node)
    shape, how = resolve_node_shape(labels, annotations, cap)
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    return NodeInfo(
        name=name,
        labels=labels,
        annotations=annotations,
        shape=shape,
        shape_source=how,
        gpu_capacity=cap,
        gpu_allocatable=alloc,
        used_mask=used_mask,
        health=assess_node(
            node, cap, alloc, health, now=now, devices=(devices or {}).get(name, ())
        ),
        fabric_path=fabric.path(labels),
        cpu_milli=cpu_milli(allocatable.get("cpu"), 0),
        memory_bytes=quantity_int(allocatable.get("memory"), 0),
        raw=node,
    )


def _containers(pod: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [c for c in (spec.get(key) or ()) if isinstance(c, Mapping)]


def _request_of(container: Mapping[str, Any], resource: str) -> Any:
    res = container.get("resources") or {}
    req = (res.get("requests") or {}).get(resource)
    if req is None:
        # Extended resources and unset requests default to the limit.
        req = (res.get("limits") or {}).get(resource)
    return req


def pod_resource(pod: Mapping[str, Any], resource: str, parse: Any = quantity_int) -> int:
    """Effective request of a resource: max(sum over containers, any init container)."""
    total = sum(parse(_request_of(c, resource), 0) for c in _containers(pod, "containers"))
    init = max(
        (parse(_request_of(c, resource), 0) for c in _containers(pod, "initContainers")),
        default=0,
    )
    return max(total, init)


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """Whole GPUs a pod requests (``nvidia.com/gpu``)."""
    return pod_resource(pod, GPU_RESOURCE)


def pod_terminated(pod: Mapping[str, Any]) -> bool:
    """True for Succeeded/Failed pods, which hold no resources."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def gang_of(pod: Mapping[str, Any]) -> tuple[str, int]:
    """(gang key ``namespace/group``, declared size or 0) of a pod, ("", 0) if none."""
    m = meta(pod)
    labels = m.get("labels") or {}
    annotations = m.get("annotations") or {}
    ns = m.get("namespace") or "default"
    for kind, key in GANG_KEYS:
        src = annotations if kind == "annotation" else labels
        v = src.get(key)
        if v:
            size = quantity_int(annotations.get(GANG_SIZE_ANNOTATION), 0)
            return f"{ns}/{v}", max(size, 0)
    return "", 0


def map_level(value: str, fabric: Fabric) -> str:
    """Map a constraint value (our level name, or a KAI/Kueue label key) to a level name.

    Raises:
        ObjectError: the value names no known level.
    """
    v = value.strip()
    if v in ("kubernetes.io/hostname", HOSTNAME_LEVEL):
        return HOSTNAME_LEVEL
    for lvl in fabric.levels:
        if v == lvl.name or v in lvl.label_keys:
            return lvl.name
    names = ", ".join([HOSTNAME_LEVEL] + [lvl.name for lvl in fabric.levels])
    raise ObjectError(f"unknown topology level {v!r}; expected one of {names} or their label keys")


def topology_of(pod: Mapping[str, Any], fabric: Fabric) -> TopologyConstraint:
    """The pod's (gang's) topology constraint from topoplace, KAI or Kueue annotations."""
    m = meta(pod)
    ann = {**(m.get("labels") or {}), **(m.get("annotations") or {})}
    req = next((ann[k] for k in REQUIRED_TOPOLOGY_KEYS if ann.get(k)), "")
    pref = next((ann[k] for k in PREFERRED_TOPOLOGY_KEYS if ann.get(k)), "")
    return TopologyConstraint(
        required=map_level(req, fabric) if req else "",
        preferred=map_level(pref, fabric) if pref else "",
    )


def request_from_pod(pod: Mapping[str, Any], fabric: Fabric) -> PodRequest:
    """What a pending pod asks for.

    Raises:
        ObjectError: malformed annotations (unknown link class or topology level).
    """
    m = meta(pod)
    annotations = m.get("annotations") or {}
    labels = m.get("labels") or {}
    min_link = str(annotations.get(MIN_LINK_ANNOTATION, "")).strip().lower()
    if min_link:
        try:
            class_rank(min_link)
        except ValueError as exc:
            raise ObjectError(str(exc)) from None
    gang, size = gang_of(pod)
    spec = pod.get("spec") or {}
    role = str(annotations.get(GANG_ROLE_ANNOTATION) or labels.get(GANG_ROLE_ANNOTATION) or "")
    return PodRequest(
        key=object_key(pod),
        uid=str(m.get("uid") or ""),
        gpus=pod_gpus(pod),
        cpu_milli=pod_resource(pod, "cpu", cpu_milli),
        memory_bytes=pod_resource(pod, "memory"),
        min_link=min_link,
        gang=gang,
        gang_size=size,
        role=role,
        topology=topology_of(pod, fabric) if gang else TopologyConstraint(),
        node_selector=frozen_map(spec.get("nodeSelector")),
        priority=int(spec.get("priority") or 0),
    )


def placement_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod's topoplace placement record, or None if absent or unreadable.

    Only ``v``, ``node`` and ``gpus`` are checked here (this runs for every bound pod);
    a gang plan's optional keys (``slots``, ``created``, ...) are checked by their reader
    (``scheduler.core.gang.plan_of_record``). Records without them (written before plans
    were recorded) stay valid.
    """
    raw = (meta(pod).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
    if not raw:
        return None
    try:
        rec = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(rec, dict) or rec.get("v") != PLACEMENT_VERSION:
        return None
    gpus = rec.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(g, int) and g >= 0 for g in gpus):
        return None
    return rec


PLAN_SLOTS_MAX_BYTES = 128 * 1024
"""Largest serialized slot table written into a placement record (half of Kubernetes'
256 KiB limit on all annotations of an object). A 512-member gang takes about 40 KiB; a
plan whose table is larger is written without it (``slots_omitted`` = its slot count), and
after a restart its unbound members are planned again when they come instead of being
re-reserved from the record."""


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """A gang plan as a member's placement record carries it (see :func:`placement_value`).

    Attributes:
        plan_id: the plan's id.
        slots: the plan's complete slot table, ``(role, node, GPU indices)`` per slot,
            bound members included (empty: only the id is written).
        policy: the gang policy that made the plan.
        created: wall-clock epoch seconds the plan was made.
        ttl: seconds an unbound slot stays reserved.
    """

    plan_id: str
    slots: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    policy: str = ""
    created: float = 0.0
    ttl: float = 0.0

    @classmethod
    def of(
        cls,
        plan_id: str,
        slots: Any = (),
        policy: str = "",
        created: float = 0.0,
        ttl: float = 0.0,
    ) -> PlanRecord:
        """A record with its slot table normalized to tuples of str, str, ints."""
        table = tuple((str(r), str(n), tuple(int(g) for g in gs)) for r, n, gs in slots)
        return cls(str(plan_id), table, str(policy), float(created), float(ttl))


def placement_value(
    node: str, gpus: tuple[int, ...], gang: str = "", plan: PlanRecord | None = None
) -> str:
    """Serialize a placement record (compact JSON, sorted keys) for the annotation.

    With a ``plan`` the record names it (``"plan"``) and, when the plan has a slot table,
    carries the whole plan: ``"policy"``, ``"created"``, ``"ttl"`` and
    ``"slots": [[role, node, [gpus]], ...]`` (optional keys of version 1: readers that do
    not know them ignore them). A slot table above :data:`PLAN_SLOTS_MAX_BYTES` is left
    out (``"slots_omitted": <count>``).
    """
    rec: dict[str, Any] = {"v": PLACEMENT_VERSION, "node": node, "gpus": list(gpus)}
    if gang:
        rec["gang"] = gang
    if plan is not None and plan.plan_id:
        rec["plan"] = plan.plan_id
    if plan is not None and plan.slots:
        if plan.policy:
            rec["policy"] = plan.policy
        rec["created"] = round(plan.created, 3)
        rec["ttl"] = round(plan.ttl, 3)
        table = [[r, n, list(gs)] for r, n, gs in plan.slots]
        if len(orjson.dumps(table)) <= PLAN_SLOTS_MAX_BYTES:
            rec["slots"] = table
        else:
            rec["slots_omitted"] = len(table)
    return orjson.dumps(rec, option=orjson.OPT_SORT_KEYS).decode()
