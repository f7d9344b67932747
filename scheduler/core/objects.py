"""Kubernetes objects (camelCase JSON dicts) -> the core model.

Pure: every function reads its arguments only. Objects may come from a ``kubectl get -o
json`` List, from kube-scheduler's extender payloads (no kind/apiVersion), or from a watch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from scheduler.core.dra import dra_gpu_count
from scheduler.core.fractional import HAMI_REGISTER, ShareError, hami_devices, node_inventory
from scheduler.core.health import REASON_UNMODELED, HealthParams, assess_node
from scheduler.core.linkclass import class_rank
from scheduler.core.model import (
    EMPTY_MAP,
    FIELD_NODE_NAME,
    GPU_RESOURCE,
    MAX_GANG_SIZE,
    MAX_NODE_GPUS,
    PLACEMENT_ANNOTATION,
    PLACEMENT_VERSION,
    Health,
    NodeAffinity,
    NodeHealth,
    NodeInfo,
    PodRequest,
    TopologyConstraint,
    frozen_map,
)
from scheduler.core.params import SharingParams
from scheduler.core.quantity import (
    QUANTITY_MAX,
    REASON_OUT_OF_RANGE,
    QuantityError,
    parse_quantity_int,
    quantity_int,
)
from scheduler.core.replicas import (
    MAX_NODE_REPLICAS,
    REPLICAS_LABEL,
    STRATEGY_LABEL,
    ReplicaError,
    node_replicas,
    replica_resource,
)
from topology.fabric import Fabric
from topology.shape import assumed_shape, resolve_node_shape

MIN_LINK_ANNOTATION = "topoplace.io/min-link"
GANG_ANNOTATION = "topoplace.io/gang"
GANG_SIZE_ANNOTATION = "topoplace.io/gang-size"
GANG_ROLE_ANNOTATION = "topoplace.io/role"
TOPOLOGY_REQUIRED = "topoplace.io/topology-required"
TOPOLOGY_PREFERRED = "topoplace.io/topology-preferred"

# (kind of key, key) in order of precedence for gang membership. ("spec", ...) is a field of
# the pod's spec: Kubernetes' own PodGroup (scheduling.k8s.io/v1alpha2, 1.36+).
GANG_KEYS: tuple[tuple[str, str], ...] = (
    ("annotation", GANG_ANNOTATION),
    ("spec", "schedulingGroup.podGroupName"),
    ("label", "scheduling.x-k8s.io/pod-group"),
    ("annotation", "scheduling.k8s.io/group-name"),
    ("annotation", "pod-group-name"),
    ("label", "pod-group-name"),
    ("label", "grove.io/podgang"),
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
    """A Kubernetes object is malformed in a way that prevents a decision.

    The one exception the object readers raise: every malformed field topoplace reads from
    a Pod it is asked to place (a list where an object belongs, a number that is not one or
    is out of range, ...) is an ObjectError with a clear message, never another exception.
    Node objects only raise it for a missing name; any other problem makes a node
    topoplace cannot model (see :func:`node_from_object`).
    """


# ---- readers ------------------------------------------------------------------------------
#
# Strict readers (``_obj``, ``_strmap``, ``_text``, ``_number``) raise ObjectError naming
# the field; they read pods topoplace is asked to place and nodes it models. Lenient readers
# (``_lmap``, ``_lstr``) read objects already admitted (bound pods): anything unreadable
# counts as absent. Neither ever calls ``str()`` on a value of unknown type, and every number
# goes through ``quantity.parse_quantity_int`` (bounded cost, range-checked).


def _lmap(value: Any) -> Mapping[str, Any]:
    return value if type(value) is dict or isinstance(value, Mapping) else EMPTY_MAP


def _lstr(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return EMPTY_MAP
    if type(value) is not dict and not isinstance(value, Mapping):  # dict: no ABC check
        raise ObjectError(f"{where} must be an object")
    return value


def _strmap(value: Any, where: str) -> Mapping[str, str]:
    m = _obj(value, where)
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ObjectError(f"{where} must map strings to strings")
    return m


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ObjectError(f"{where} must be a string")
    return value


def _number(value: Any, where: str, **limits: Any) -> int:
    """A number of an object (``parse_quantity_int`` with ``limits``); ObjectError if bad."""
    try:
        return parse_quantity_int(value, **limits)
    except QuantityError as exc:
        if exc.reason != REASON_OUT_OF_RANGE:
            raise ObjectError(f"{where}: {exc.reason}") from None
        unit = " milli" if limits.get("scale10") == 3 else ""
        lo, hi = limits.get("low", 0), limits.get("high", QUANTITY_MAX)
        raise ObjectError(f"{where}: out of range ({lo}..{hi}{unit})") from None


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's metadata mapping (empty if absent or not a mapping)."""
    m = obj.get("metadata") if type(obj) is dict or isinstance(obj, Mapping) else None
    return m if type(m) is dict or isinstance(m, Mapping) else EMPTY_MAP


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a namespaced object (``default`` namespace if absent; fields
    that are not strings count as absent)."""
    m = meta(obj)
    return f"{_lstr(m.get('namespace')) or 'default'}/{_lstr(m.get('name'))}"


# ---- nodes --------------------------------------------------------------------------------


def _node_gpu_counts(node: Mapping[str, Any]) -> tuple[int, int]:
    """(capacity, allocatable) whole GPUs, strictly read; capacity falls back to allocatable.

    Raises:
        ObjectError: unreadable fields, counts that are not whole numbers, or more GPUs than
            :data:`~scheduler.core.model.MAX_NODE_GPUS`.
    """
    status = _obj(node.get("status"), "status")
    allocatable = _obj(status.get("allocatable"), "status.allocatable")
    capacity = _obj(status.get("capacity"), "status.capacity")
    raw_alloc = allocatable.get(GPU_RESOURCE)
    raw_cap = capacity.get(GPU_RESOURCE)
    alloc = (
        0 if raw_alloc is None else _number(raw_alloc, f"allocatable {GPU_RESOURCE}", whole=True)
    )
    cap = alloc if raw_cap is None else _number(raw_cap, f"capacity {GPU_RESOURCE}", whole=True)
    cap = max(cap, alloc)
    if cap > MAX_NODE_GPUS:
        raise ObjectError(f"{cap} GPUs, more than the {MAX_NODE_GPUS} topoplace models per node")
    return cap, alloc


def node_gpus(node: Mapping[str, Any]) -> tuple[int, int]:
    """(capacity, allocatable) whole GPUs of a Node; capacity falls back to allocatable.

    Never raises: (0, 0) when the counts are unreadable or above ``MAX_NODE_GPUS`` (a node
    topoplace cannot model), so callers can size per-GPU work by the result.
    """
    try:
        return _node_gpu_counts(node if isinstance(node, Mapping) else EMPTY_MAP)
    except ObjectError:
        return 0, 0


def node_from_object(
    node: Mapping[str, Any],
    fabric: Fabric,
    health: HealthParams,
    used_mask: int = 0,
    *,
    now: float | None = None,
    devices: Mapping[str, Any] | None = None,
    sharing: SharingParams | None = None,
) -> NodeInfo:
    """Build a :class:`NodeInfo` from a Node object.

    ``now`` (wall-clock epoch seconds) enables time-based health signals; ``devices`` maps
    node names to their DRA devices (``health.devices_by_node``).

    No single node may poison the cluster view: a named node topoplace cannot model (more
    GPUs than ``MAX_NODE_GPUS``, an unreadable field or number, or any other failure while
    reading it) comes back as :func:`unmodeled_node`, which GPU pods are refused on with
    the constant reason ``health.REASON_UNMODELED``. Cost is bounded by the object's size.

    Raises:
        ObjectError: the object is not a mapping or has no name (it cannot be kept).
    """
    if not isinstance(node, Mapping):
        raise ObjectError("node object is not an object")
    m = meta(node)
    name = m.get("name")
    if not name or not isinstance(name, str):
        raise ObjectError("node object without metadata.name")
    try:
        return _modeled_node(node, name, fabric, health, used_mask, now, devices, sharing)
    except ObjectError as exc:
        return unmodeled_node(node, fabric, str(exc))
    except Exception as exc:  # any failure to model one node must not stop the others
        return unmodeled_node(node, fabric, f"{type(exc).__name__} while reading the node")


def _modeled_node(
    node: Mapping[str, Any],
    name: str,
    fabric: Fabric,
    health: HealthParams,
    used_mask: int,
    now: float | None,
    devices: Mapping[str, Any] | None,
    sharing: SharingParams | None = None,
) -> NodeInfo:
    m = meta(node)
    labels = frozen_map(_strmap(m.get("labels"), "metadata.labels"))
    annotations = frozen_map(_strmap(m.get("annotations"), "metadata.annotations"))
    if (REPLICAS_LABEL in labels or STRATEGY_LABEL in labels) and HAMI_REGISTER not in annotations:
        replica = _replica_node(node, name, labels, annotations, fabric, health, now, devices)
        if replica is not None:
            return replica
    if HAMI_REGISTER in annotations:
        # HAMi advertises nvidia.com/gpu as split replicas; its register lists the GPUs.
        # Unhealthy GPUs it lists are excluded one by one (bad_mask) below.
        cap = alloc = _hami_gpu_count(annotations)
    else:
        cap, alloc = _node_gpu_counts(node)
    if cap == 0 and devices:
        # A DRA node: its GPUs are ResourceSlice devices, not an extended resource.
        cap = alloc = dra_gpu_count(_lmap(devices).get(name, ()))
    status = _obj(node.get("status"), "status")
    try:
        backend, inventory = node_inventory(
            labels,
            annotations,
            _obj(status.get("capacity"), "status.capacity"),
            cap,
            sharing or SharingParams(),
        )
    except ShareError as exc:
        raise ObjectError(str(exc)) from None
    shape, how = resolve_node_shape(labels, annotations, cap)
    allocatable = _obj(status.get("allocatable"), "allocatable")
    cpu = allocatable.get("cpu")
    mem = allocatable.get("memory")
    verdict = assess_node(node, cap, alloc, health, now=now, devices=_lmap(devices).get(name, ()))
    sick = sum(1 << d.index for d in inventory if not d.healthy)
    if sick & ((1 << cap) - 1) & ~verdict.bad_mask:
        verdict = replace(verdict, bad_mask=verdict.bad_mask | (sick & ((1 << cap) - 1)))
    return NodeInfo(
        name=name,
        labels=labels,
        annotations=annotations,
        shape=shape,
        shape_source=how,
        gpu_capacity=cap,
        gpu_allocatable=alloc,
        used_mask=used_mask,
        health=verdict,
        fabric_path=fabric.path(labels),
        cpu_milli=0 if cpu is None else _number(cpu, "allocatable cpu", scale10=3),
        memory_bytes=0 if mem is None else _number(mem, "allocatable memory"),
        raw=node,
        devices=inventory,
        sharing=backend,
    )


def _replica_node(
    node: Mapping[str, Any],
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    fabric: Fabric,
    health: HealthParams,
    now: float | None,
    devices: Mapping[str, Any] | None,
) -> NodeInfo | None:
    """The node as a time-slicing / MPS replica node (``scheduler.core.replicas``), or None
    when its labels do not make it one. No GPUs in the whole-GPU model; node health
    (conditions, cordons, taints) as for any node.

    Raises:
        ObjectError: contradictory or out-of-range replica labels or resources.
    """
    status = _obj(node.get("status"), "status")
    allocatable = _obj(status.get("allocatable"), "status.allocatable")
    try:
        inv = node_replicas(labels, _obj(status.get("capacity"), "status.capacity"), allocatable)
    except ReplicaError as exc:
        raise ObjectError(str(exc)) from None
    if inv is None:
        return None
    cpu = allocatable.get("cpu")
    mem = allocatable.get("memory")
    verdict = assess_node(node, 0, 0, health, now=now, devices=_lmap(devices).get(name, ()))
    return NodeInfo(
        name=name,
        labels=labels,
        annotations=annotations,
        shape=assumed_shape(0),
        shape_source=REPLICAS_SHAPE_SOURCE,
        gpu_capacity=0,
        gpu_allocatable=0,
        used_mask=0,
        health=verdict,
        fabric_path=fabric.path(labels),
        cpu_milli=0 if cpu is None else _number(cpu, "allocatable cpu", scale10=3),
        memory_bytes=0 if mem is None else _number(mem, "allocatable memory"),
        raw=node,
        replicas=inv.per_gpu,
        replica_gpus=inv.gpus,
        replica_capacity=inv.capacity,
        replica_strategy=inv.strategy,
    )


REPLICAS_SHAPE_SOURCE = "replicas"
"""``NodeInfo.shape_source`` of a time-slicing / MPS replica node (no GPU topology)."""


def _hami_gpu_count(annotations: Mapping[str, str]) -> int:
    """GPUs of a HAMi node, from its register (ObjectError if malformed)."""
    try:
        return len(hami_devices(annotations[HAMI_REGISTER]))
    except ShareError as exc:
        raise ObjectError(str(exc)) from None


UNMODELED_SHAPE_SOURCE = "unmodeled"
"""``NodeInfo.shape_source`` of a node topoplace cannot model."""


def unmodeled_node(node: Mapping[str, Any], fabric: Fabric, why: str) -> NodeInfo:
    """A named node topoplace cannot model: kept in the snapshot (its name, its labels when
    readable, the pods on it) with no GPUs in the model and an UNHEALTHY verdict whose only
    reason is ``health.REASON_UNMODELED``, so GPU pods are refused there with that reason.

    Args:
        node: the Node object (must have a string ``metadata.name``).
        fabric: the cluster fabric (for the node's domains when its labels are readable).
        why: what was wrong (logs and inspection only; not a filter reason).
    """
    m = meta(node)
    try:
        labels = frozen_map(_strmap(m.get("labels"), "metadata.labels"))
        path = fabric.path(labels)
    except Exception:  # unreadable labels: the node is in no domain
        labels = EMPTY_MAP
        path = tuple(None for _ in fabric.levels)
    return NodeInfo(
        name=_lstr(m.get("name")),
        labels=labels,
        annotations=EMPTY_MAP,
        shape=assumed_shape(0),
        shape_source=UNMODELED_SHAPE_SOURCE,
        gpu_capacity=0,
        gpu_allocatable=0,
        used_mask=0,
        health=NodeHealth(Health.UNHEALTHY, (REASON_UNMODELED,)),
        fabric_path=path,
        raw=node,
        unmodeled=why or "unreadable node",
    )


# ---- pods ---------------------------------------------------------------------------------


def _containers(pod: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = _lmap(_lmap(pod).get("spec")).get(key)
    if not isinstance(items, list | tuple):
        return []
    return [c for c in items if isinstance(c, Mapping)]


def _request_of(container: Mapping[str, Any], resource: str) -> Any:
    res = _lmap(container.get("resources"))
    req = _lmap(res.get("requests")).get(resource)
    if req is None:
        # Extended resources and unset requests default to the limit.
        req = _lmap(res.get("limits")).get(resource)
    return req


def pod_resource(pod: Mapping[str, Any], resource: str, parse: Any = quantity_int) -> int:
    """Effective request of a resource: max(sum over containers, any init container).

    Lenient (for pods already admitted): unreadable fields count as absent and ``parse``
    decides what an unreadable value is worth (``quantity_int``: 0).
    """
    total = sum(parse(_request_of(c, resource), 0) for c in _containers(pod, "containers"))
    init = max(
        (parse(_request_of(c, resource), 0) for c in _containers(pod, "initContainers")),
        default=0,
    )
    return max(total, init)


def _container_requests(
    spec: Mapping[str, Any],
) -> Iterator[tuple[bool, Mapping[str, Any], Mapping[str, Any]]]:
    """(init container?, requests, limits) of every container, then every init container,
    of a pod's ``spec``, each checked as it is reached: ObjectError for a list that is not
    one, an entry that is not an object, resources/requests/limits that are not objects."""
    for init, key in ((False, "containers"), (True, "initContainers")):
        items = spec.get(key)
        if items is None:
            items = ()
        if type(items) is not list and not isinstance(items, list | tuple):
            raise ObjectError(f"spec.{key} must be a list")
        for c in items:
            if type(c) is not dict and not isinstance(c, Mapping):
                raise ObjectError(f"spec.{key} entries must be objects")
            res = _obj(c.get("resources"), f"spec.{key}[].resources")
            requests = _obj(res.get("requests"), f"spec.{key}[].resources.requests")
            limits = _obj(res.get("limits"), f"spec.{key}[].resources.limits")
            yield init, requests, limits


def _requested(requests: Mapping[str, Any], limits: Mapping[str, Any], resource: str) -> Any:
    """A container's request of ``resource`` (extended resources and unset requests
    default to the limit), or None."""
    value = requests.get(resource)
    return limits.get(resource) if value is None else value


def _effective(resource: str, values: list[int], init: list[int], **bounds: Any) -> int:
    """max(sum over containers, any init container), checked against ``bounds``' high."""
    value = max(sum(values), max(init, default=0))
    high = bounds.get("high", QUANTITY_MAX)
    if value > high:  # the sum over containers
        unit = " milli" if bounds.get("scale10") == 3 else ""
        raise ObjectError(f"{resource} request: out of range (0..{high}{unit})")
    return value


def _strict_resource(pod: Mapping[str, Any], resource: str, **bounds: Any) -> int:
    """:func:`pod_resource`, strictly read: ObjectError for malformed containers or values,
    and for an effective request outside ``bounds``."""
    spec = _obj(pod.get("spec"), "spec")
    values: tuple[list[int], list[int]] = ([], [])
    for init, requests, limits in _container_requests(spec):
        req = _requested(requests, limits, resource)
        if req is not None:
            values[init].append(_number(req, f"{resource} request", **bounds))
    return _effective(resource, *values, **bounds)


def _strict_requests(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """(GPUs, CPU millis, memory bytes) a pod's ``spec`` requests, strictly read in one pass
    over its containers: the same values, and the same ObjectError for the same malformed
    input, as :func:`_strict_resource` for ``nvidia.com/gpu`` (``0 .. MAX_NODE_GPUS``,
    whole), then ``cpu`` (milli) and ``memory`` would give one after the other. The first
    reading checks every container's structure and its GPU value in order, so structure
    and GPU errors come first, in walk order; then the GPU total's range, then each CPU
    value and the CPU total, then memory."""
    gpus: tuple[list[int], list[int]] = ([], [])
    cpus: tuple[list[Any], list[Any]] = ([], [])
    mems: tuple[list[Any], list[Any]] = ([], [])
    for init, requests, limits in _container_requests(spec):
        g = _requested(requests, limits, GPU_RESOURCE)
        if g is not None:
            gpus[init].append(_number(g, f"{GPU_RESOURCE} request", high=MAX_NODE_GPUS, whole=True))
        v = _requested(requests, limits, "cpu")
        if v is not None:
            cpus[init].append(v)
        v = _requested(requests, limits, "memory")
        if v is not None:
            mems[init].append(v)
    gpu = _effective(GPU_RESOURCE, *gpus, high=MAX_NODE_GPUS, whole=True)
    cpu = _effective(
        "cpu", *([_number(v, "cpu request", scale10=3) for v in vs] for vs in cpus), scale10=3
    )
    memory = _effective("memory", *([_number(v, "memory request") for v in vs] for vs in mems))
    return gpu, cpu, memory


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """Whole GPUs a pod requests (``nvidia.com/gpu``); lenient, as :func:`pod_resource`."""
    return pod_resource(pod, GPU_RESOURCE)


def pod_replicas(pod: Mapping[str, Any]) -> int:
    """GPU replicas a bound pod holds on a replica node (``nvidia.com/gpu.shared`` if it
    asks for it, else ``nvidia.com/gpu``); lenient, as :func:`pod_resource`."""
    return min(pod_resource(pod, replica_resource(pod)), MAX_NODE_REPLICAS)


def replica_request(pod: Mapping[str, Any]) -> int:
    """GPU replicas a pending pod asks for, strictly read (``0 .. MAX_NODE_REPLICAS``).

    Raises:
        ObjectError: malformed containers or values, or a request out of range.
    """
    if not isinstance(pod, Mapping):
        raise ObjectError("pod must be an object")
    return _strict_resource(pod, replica_resource(pod), high=MAX_NODE_REPLICAS, whole=True)


def pod_terminated(pod: Mapping[str, Any]) -> bool:
    """True for Succeeded/Failed pods, which hold no resources."""
    return _lmap(_lmap(pod).get("status")).get("phase") in ("Succeeded", "Failed")


def _gang_key(m: Mapping[str, Any], spec: Any = None) -> str:
    """The gang key ``namespace/group`` of a pod's metadata and spec ("" if none); lenient.

    The first of :data:`GANG_KEYS` the pod carries names the group: a PodGroup of
    scheduler-plugins, Volcano, KAI or Kubernetes itself (``spec.schedulingGroup``), or a
    Grove PodGang (label ``grove.io/podgang``). The group object, when watched, is found in
    ``snapshot.extra["podgroups"]`` under the same key.
    """
    labels = _lmap(m.get("labels"))
    annotations = _lmap(m.get("annotations"))
    ns = _lstr(m.get("namespace")) or "default"
    for kind, key in GANG_KEYS:
        if kind == "spec":
            v = _lstr(_lmap(_lmap(spec).get("schedulingGroup")).get("podGroupName"))
        else:
            v = _lstr((annotations if kind == "annotation" else labels).get(key))
        if v:
            return f"{ns}/{v}"
    return ""


def _gang_size(annotations: Mapping[str, Any]) -> int:
    """The ``topoplace.io/gang-size`` annotation, strictly read (0 when absent or empty).

    Raises:
        ObjectError: not a whole number in ``0 .. MAX_GANG_SIZE``.
    """
    raw = annotations.get(GANG_SIZE_ANNOTATION)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return 0
    return _number(raw, GANG_SIZE_ANNOTATION, high=MAX_GANG_SIZE, whole=True)


def gang_of(pod: Mapping[str, Any]) -> tuple[str, int]:
    """(gang key ``namespace/group``, declared size or 0) of a pod, ("" , 0) if none.

    Lenient (pods already admitted): an unreadable or out-of-range size counts as 0.
    :func:`request_from_pod` reads the size strictly.
    """
    m = meta(pod)
    gang = _gang_key(m, _lmap(pod).get("spec"))
    if not gang:
        return "", 0
    try:
        return gang, _gang_size(_lmap(m.get("annotations")))
    except ObjectError:
        return gang, 0


def map_level(value: str, fabric: Fabric) -> str:
    """Map a constraint value (our level name, or a KAI/Kueue label key) to a level name.

    Raises:
        ObjectError: the value is not a string or names no known level.
    """
    if not isinstance(value, str):
        raise ObjectError("a topology level must be a string")
    v = value.strip()
    if v in ("kubernetes.io/hostname", HOSTNAME_LEVEL):
        return HOSTNAME_LEVEL
    for lvl in fabric.levels:
        if v == lvl.name or v in lvl.label_keys:
            return lvl.name
    names = ", ".join([HOSTNAME_LEVEL] + [lvl.name for lvl in fabric.levels])
    shown = v if len(v) <= 64 else v[:64] + "..."
    raise ObjectError(
        f"unknown topology level {shown!r}; expected one of {names} or their label keys"
    )


def topology_of(pod: Mapping[str, Any], fabric: Fabric) -> TopologyConstraint:
    """The pod's (gang's) topology constraint from topoplace, KAI or Kueue annotations.

    Raises:
        ObjectError: a constraint names no known level.
    """
    m = meta(pod)
    ann = {**_lmap(m.get("labels")), **_lmap(m.get("annotations"))}
    req = next((ann[k] for k in REQUIRED_TOPOLOGY_KEYS if ann.get(k)), "")
    pref = next((ann[k] for k in PREFERRED_TOPOLOGY_KEYS if ann.get(k)), "")
    return TopologyConstraint(
        required=map_level(req, fabric) if req else "",
        preferred=map_level(pref, fabric) if pref else "",
    )


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def request_from_pod(pod: Mapping[str, Any], fabric: Fabric) -> PodRequest:
    """What a pending pod asks for.

    Every field read is checked, with bounded cost: metadata, labels, annotations and
    nodeSelector must be objects of strings, containers lists of objects, quantities
    well-formed and in range (GPUs ``0 .. MAX_NODE_GPUS``, CPU and memory
    ``0 .. QUANTITY_MAX``), ``topoplace.io/gang-size`` a whole number in
    ``0 .. MAX_GANG_SIZE``, ``spec.priority`` a 32-bit integer.

    Raises:
        ObjectError: any malformed field (the message names it), an unknown link class
            or topology level; never another exception.
    """
    if not isinstance(pod, Mapping):
        raise ObjectError("pod must be an object")
    m = _obj(pod.get("metadata"), "metadata")
    name = _text(m.get("name"), "metadata.name")
    namespace = _text(m.get("namespace"), "metadata.namespace")
    uid = _text(m.get("uid"), "metadata.uid")
    annotations = _strmap(m.get("annotations"), "metadata.annotations")
    labels = _strmap(m.get("labels"), "metadata.labels")
    spec = _obj(pod.get("spec"), "spec")
    min_link = annotations.get(MIN_LINK_ANNOTATION, "").strip().lower()
    if min_link:
        try:
            class_rank(min_link if len(min_link) <= 64 else min_link[:64] + "...")
        except ValueError as exc:
            raise ObjectError(str(exc)) from None
    gang = _gang_key(m, spec)
    size = _gang_size(annotations) if gang else 0
    priority = spec.get("priority")
    gpus, cpu, memory = _strict_requests(spec)
    return PodRequest(
        key=f"{namespace or 'default'}/{name}",
        uid=uid,
        gpus=gpus,
        cpu_milli=cpu,
        memory_bytes=memory,
        min_link=min_link,
        gang=gang,
        gang_size=size,
        role=annotations.get(GANG_ROLE_ANNOTATION) or labels.get(GANG_ROLE_ANNOTATION) or "",
        topology=topology_of(pod, fabric) if gang else TopologyConstraint(),
        node_selector=frozen_map(_strmap(spec.get("nodeSelector"), "spec.nodeSelector")),
        priority=0
        if priority is None
        else _number(priority, "spec.priority", low=INT32_MIN, high=INT32_MAX, whole=True),
        node_affinity=node_affinity_of(spec) if gang else (),
    )


AFFINITY_MAX_TERMS = 32
"""Most ``nodeSelectorTerms`` (and requirements per term, values per requirement x 8) read."""
AFFINITY_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def _list(value: Any, where: str, most: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObjectError(f"{where} must be a list")
    if len(value) > most:
        raise ObjectError(f"{where} has more than {most} entries")
    return value


def node_affinity_of(spec: Mapping[str, Any]) -> NodeAffinity:
    """The pod's required node affinity
    (``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``) as
    :data:`~scheduler.core.model.NodeAffinity`; ``()`` when it has none.

    Raises:
        ObjectError: a field of the wrong type, an unknown operator, or more than
            :data:`AFFINITY_MAX_TERMS` terms (requirements per term; 8x that many values).
    """
    aff = _obj(_obj(spec.get("affinity"), "spec.affinity").get("nodeAffinity"), "nodeAffinity")
    req = _obj(aff.get("requiredDuringSchedulingIgnoredDuringExecution"), "nodeAffinity.required")
    where = "nodeSelectorTerms"
    terms: list[tuple[tuple[str, str, tuple[str, ...]], ...]] = []
    for term in _list(req.get("nodeSelectorTerms"), where, AFFINITY_MAX_TERMS):
        t = _obj(term, where)
        out: list[tuple[str, str, tuple[str, ...]]] = []
        for field_name, prefix in (("matchExpressions", ""), ("matchFields", "field:")):
            for e in _list(t.get(field_name), f"{where}.{field_name}", AFFINITY_MAX_TERMS):
                e = _obj(e, f"{where}.{field_name}")
                key, op = _text(e.get("key"), "requirement key"), e.get("operator")
                if op not in AFFINITY_OPERATORS:
                    shown = op[:32] if isinstance(op, str) else type(op).__name__
                    raise ObjectError(f"{where}: unknown operator {shown!r}")
                vals = _list(e.get("values"), "requirement values", 8 * AFFINITY_MAX_TERMS)
                if not all(isinstance(v, str) for v in vals):
                    raise ObjectError(f"{where}: requirement values must be strings")
                k = prefix + key
                if prefix and k != FIELD_NODE_NAME:
                    raise ObjectError(f"{where}.matchFields: only metadata.name is supported")
                out.append((k, op, tuple(vals)))
        terms.append(tuple(out))
    return tuple(terms)


def placement_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod's topoplace placement record, or None if absent or unreadable.

    Only ``v``, ``node`` and ``gpus`` are checked here (this runs for every bound pod; GPU
    indices must be ints in ``0 .. MAX_NODE_GPUS - 1``);
    a gang plan's optional keys (``slots``, ``created``, ...) are checked by their reader
    (``scheduler.core.gang.plan_of_record``). Records without them (written before plans
    were recorded) stay valid.
    """
    raw = _lmap(meta(pod).get("annotations")).get(PLACEMENT_ANNOTATION)
    if not raw or not isinstance(raw, str):
        return None
    try:
        rec = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(rec, dict) or rec.get("v") != PLACEMENT_VERSION:
        return None
    gpus = rec.get("gpus")
    if not isinstance(gpus, list) or not all(
        isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MAX_NODE_GPUS for g in gpus
    ):
        return None
    node = rec.get("node")
    if node is not None and not isinstance(node, str):
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
    node: str,
    gpus: tuple[int, ...],
    gang: str = "",
    plan: PlanRecord | None = None,
    why: str = "",
) -> str:
    """Serialize a placement record (compact JSON, sorted keys) for the annotation.

    With a ``plan`` the record names it (``"plan"``) and, when the plan has a slot table,
    carries the whole plan: ``"policy"``, ``"created"``, ``"ttl"`` and
    ``"slots": [[role, node, [gpus]], ...]`` (optional keys of version 1: readers that do
    not know them ignore them). A slot table above :data:`PLAN_SLOTS_MAX_BYTES` is left
    out (``"slots_omitted": <count>``). A non-empty ``why`` (the one-line summary of the
    decision, see ``server/decisions.py``) is added under ``"why"`` (readers ignore it).
    """
    rec: dict[str, Any] = {"v": PLACEMENT_VERSION, "node": node, "gpus": list(gpus)}
    if why:
        rec["why"] = why
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


REDACTED_CONTAINER_KEYS = ("env", "envFrom", "command", "args", "lifecycle", "volumeMounts")
"""Container fields left out of inspected pods: values and commands may hold secrets."""
REDACTED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
"""Annotations left out of inspected pods (the last applied one repeats the whole spec)."""


def bound_pod(
    pod: Mapping[str, Any], node: str, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The Pod object as the API server shows it after a binding to ``node`` that carried
    ``annotations`` (merged over the pod's own); ``pod`` is not changed."""
    out = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}
    if annotations:
        m = dict(meta(pod))
        m["annotations"] = {**(m.get("annotations") or {}), **annotations}
        out["metadata"] = m
    return out


def redacted_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A Pod object without what placement does not need and secrets could hide in:
    containers' env, envFrom, command, args, lifecycle hooks and mounts, the pod's volumes,
    managed fields, and the last-applied-configuration annotation. Names, images,
    resources, scheduling fields, labels and the other annotations are kept, so the
    object still loads back as the same placement."""
    out = {k: v for k, v in pod.items() if k != "spec"}
    meta_in = pod.get("metadata")
    if isinstance(meta_in, Mapping):
        m = {k: v for k, v in meta_in.items() if k != "managedFields"}
        ann = m.get("annotations")
        if isinstance(ann, Mapping):
            m["annotations"] = {k: v for k, v in ann.items() if k not in REDACTED_ANNOTATIONS}
        out["metadata"] = m
    spec_in = pod.get("spec")
    if isinstance(spec_in, Mapping):
        spec = {k: v for k, v in spec_in.items() if k != "volumes"}
        for kind in ("containers", "initContainers", "ephemeralContainers"):
            cs = spec_in.get(kind)
            if isinstance(cs, list):
                spec[kind] = [
                    {k: v for k, v in c.items() if k not in REDACTED_CONTAINER_KEYS}
                    if isinstance(c, Mapping)
                    else c
                    for c in cs
                ]
        out["spec"] = spec
    return out
