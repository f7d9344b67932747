"""The immutable cluster model every decision works on.

Contracts:
    * Every type here is immutable (frozen dataclasses, tuples, read-only mappings and
      read-only numpy arrays). A decision takes one :class:`ClusterSnapshot` and never
      changes it; the cache produces a new snapshot for every change.
    * Nodes are kept sorted by name, so iteration order (and every tie-break derived from
      it) is deterministic.
    * GPU sets are bitmasks (bit ``i`` = GPU index ``i`` on the node). ``used_mask`` holds
      GPUs of bound or assumed pods; ``bad_mask`` holds GPUs excluded by health signals.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from topology.shape import GpuShape

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource name of whole NVIDIA GPUs."""

PLACEMENT_ANNOTATION = "topoplace.io/placement"
"""Versioned placement record written on the Binding (copied onto the Pod)."""

PLACEMENT_VERSION = 1

RESERVATION_PREFIX = "gang-reservation:"
"""Key prefix of pseudo pods that hold a planned gang slot until its member binds."""

EMPTY_MAP: Mapping[str, str] = MappingProxyType({})

MAX_NODE_GPUS = 62
"""Most GPUs a node topoplace models may have. The snapshot keeps, per node and link class,
a bitmask of feasible set sizes in an int64 column (bit k = a k-GPU set), so k <= 62. A
node advertising more (time-slicing replicas without GFD's replica labels, ...) is kept as a
node topoplace cannot model (``NodeInfo.unmodeled``): GPU pods are refused there."""

MAX_GANG_SIZE = 65536
"""Largest declared gang size (``topoplace.io/gang-size``, PodGroup ``minMember``) topoplace
plans; a larger declaration is refused for the pod with a reason."""


def frozen_map(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Return a read-only copy of ``d`` (an empty shared map for ``None``)."""
    if not d:
        return EMPTY_MAP
    return MappingProxyType(dict(d))


NodeAffinity = tuple[tuple[tuple[str, str, tuple[str, ...]], ...], ...]
"""A pod's required node affinity: ``nodeSelectorTerms`` (any one must match), each a tuple of
requirements ``(key, operator, values)`` that must all match. Label requirements carry the
label key; ``matchFields`` requirements carry ``"field:metadata.name"``. Operators are
Kubernetes' (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``). ``()`` = none."""

FIELD_NODE_NAME = "field:metadata.name"
"""Key of a ``matchFields`` requirement on the node's name in :data:`NodeAffinity`."""


def _requirement_matches(
    key: str, op: str, values: tuple[str, ...], labels: Mapping[str, str], name: str
) -> bool:
    if key == FIELD_NODE_NAME:
        present, value = True, name
    else:
        present, value = key in labels, labels.get(key, "")
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def affinity_matches(affinity: NodeAffinity, labels: Mapping[str, str], name: str) -> bool:
    """True when a node (its labels and name) satisfies a required node affinity, as
    kube-scheduler's NodeAffinity plugin decides it: any term whose requirements all hold (a
    term with no requirement matches nothing); no affinity at all matches every node."""
    if not affinity:
        return True
    return any(
        term and all(_requirement_matches(k, op, v, labels, name) for k, op, v in term)
        for term in affinity
    )


def popcount(mask: int) -> int:
    """Number of set bits of a non-negative int."""
    return mask.bit_count()


def mask_to_indices(mask: int) -> tuple[int, ...]:
    """Bit positions of ``mask`` in increasing order."""
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def indices_to_mask(indices: Any) -> int:
    """Bitmask with the given GPU indices set.

    Raises:
        ValueError: an index outside ``0 .. MAX_NODE_GPUS - 1`` (a shift by an index read
            from an object must never allocate a huge integer).
    """
    m = 0
    for i in indices:
        i = int(i)
        if not 0 <= i < MAX_NODE_GPUS:
            raise ValueError("GPU index out of range")
        m |= 1 << i
    return m


class Health(enum.IntEnum):
    """Graded health of a node or GPU. Ordered: a larger value is worse."""

    HEALTHY = 0
    DEGRADED = 1
    UNHEALTHY = 2


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """Health verdict of one node.

    Attributes:
        state: HEALTHY, DEGRADED (usable, carries risk) or UNHEALTHY (never place here).
        reasons: constant, aggregatable reason strings (no node names or counts).
        risk: 0.0 (no known risk) .. 1.0 (certain failure); subtracted by scoring.
        bad_mask: GPUs excluded individually (per-GPU faults) while the node stays usable.
        unschedulable: True when the node is cordoned or tainted NoSchedule/NoExecute in a
            way that kube-scheduler would honour; reported as unresolvable.
    """

    state: Health = Health.HEALTHY
    reasons: tuple[str, ...] = ()
    risk: float = 0.0
    bad_mask: int = 0
    unschedulable: bool = False


HEALTHY = NodeHealth()


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU as its node publishes it (HAMi's ``hami.io/node-nvidia-register``,
    gpushare's capacity, or GFD labels); the inventory fractional pods are placed on.

    Attributes:
        index: GPU index on the node (bit ``index`` of the node's masks).
        uuid: device UUID ("" when the node does not publish it).
        type: device type / product ("" when unknown).
        memory_mib: device memory in MiB (0: unknown; no fractional pod is placed there).
        cores: compute the device is split into, in percent of its SMs (HAMi ``devcore``).
        split: most tasks that may share the device (HAMi ``count``; 0: no bound).
        numa: NUMA node.
        healthy: the node side reports the device healthy.
    """

    index: int
    uuid: str = ""
    type: str = ""
    memory_mib: int = 0
    cores: int = 100
    split: int = 0
    numa: int = 0
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class GpuShare:
    """What one fractional pod holds on one GPU: memory (MiB) and compute (milli of the
    device's SMs, 0..1000; HAMi ``gpucores`` percent times 10)."""

    gpu: int
    memory_mib: int
    milli: int


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as topoplace sees it.

    Attributes:
        name: node name.
        labels / annotations: read-only copies of the Node's metadata.
        shape: intra-node GPU topology (shared by all nodes of that hardware shape).
        shape_source: "annotation", "gfd" or "assumed" (conservative all-SYS fallback).
        gpu_capacity: physical GPUs (``status.capacity``; falls back to allocatable).
        gpu_allocatable: GPUs the device plugin advertises as allocatable.
        used_mask: GPUs held by bound or assumed pods.
        health: health verdict (including GPUs excluded individually).
        fabric_path: domain id per fabric level (None where unlabelled).
        cpu_milli / memory_bytes: allocatable CPU and memory.
        cpu_used_milli / memory_used_bytes: requests of pods bound to the node.
        raw: the Node object as received (read-only), for round-tripping the snapshot.
        unmodeled: why topoplace cannot model this node ("" when it can). Such a node has
            no GPUs in the model (``gpu_capacity`` 0) and an UNHEALTHY verdict whose reason
            is the constant ``health.REASON_UNMODELED``, so GPU pods are refused there while
            the rest of the cluster is served; this text (for logs and inspection only,
            not a filter reason) says what was wrong.
        devices: per-GPU inventory in index order (``GpuDevice``; empty when the node
            publishes nothing beyond a GPU count).
        sharing: the fractional backend that hands shares to containers on this node
            (``"hami"``, ``"gpushare"`` or "" for none).
        share_used: the per-GPU ledger of fractional pods, index-aligned with the GPUs:
            (memory MiB, compute milli, tasks) held by shares; empty when no GPU holds a
            share. A GPU holding a share is also set in ``used_mask``, so whole-GPU pods
            and gangs never get it; a share never goes on a GPU held whole.
        replicas: GPU replicas per physical GPU on a time-slicing / MPS node (the NVIDIA
            device plugin's ``sharing.timeSlicing`` / ``sharing.mps``; GFD label
            ``nvidia.com/gpu.replicas``); 0 when the node does not share GPUs by replicas.
            Such a node has no GPUs in the whole-GPU model (``gpu_capacity`` 0): the
            kubelet picks the device, so topoplace counts replicas per node
            (``scheduler.core.replicas``).
        replica_gpus: physical GPUs of a replica node (GFD ``nvidia.com/gpu.count``).
        replica_capacity: replicas the node can hand out (``min(allocatable, replica_gpus
            x replicas)``).
        replica_strategy: ``time-slicing``, ``mps`` or "" (older GFD: replicas only).
        replicas_used: replicas held by bound or assumed pods on the node.
    """

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    shape: GpuShape
    shape_source: str
    gpu_capacity: int
    gpu_allocatable: int
    used_mask: int
    health: NodeHealth
    fabric_path: tuple[str | None, ...]
    cpu_milli: int = 0
    memory_bytes: int = 0
    cpu_used_milli: int = 0
    memory_used_bytes: int = 0
    raw: Mapping[str, Any] = field(default_factory=lambda: EMPTY_MAP, compare=False, repr=False)
    unmodeled: str = ""
    devices: tuple[GpuDevice, ...] = ()
    sharing: str = ""
    share_used: tuple[tuple[int, int, int], ...] = ()
    replicas: int = 0
    replica_gpus: int = 0
    replica_capacity: int = 0
    replica_strategy: str = ""
    replicas_used: int = 0

    @property
    def replicas_free(self) -> int:
        """Replicas a pod may still take on a replica node (0 elsewhere)."""
        return max(0, self.replica_capacity - self.replicas_used)

    @property
    def all_mask(self) -> int:
        """Every GPU index of the node."""
        return (1 << self.gpu_capacity) - 1

    @property
    def usable_mask(self) -> int:
        """GPUs not excluded by health, whether free or not."""
        return self.all_mask & ~self.health.bad_mask

    @property
    def free_mask(self) -> int:
        """GPUs that are healthy and not held by any pod."""
        return self.usable_mask & ~self.used_mask

    @property
    def free_gpus(self) -> int:
        """Number of free healthy GPUs."""
        return popcount(self.free_mask)

    @property
    def shared_mask(self) -> int:
        """GPUs holding at least one fractional share (a subset of ``used_mask``)."""
        m = 0
        for i, (_, _, tasks) in enumerate(self.share_used):
            if tasks:
                m |= 1 << i
        return m


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod that holds (or is assumed to hold) resources on a node.

    Attributes:
        key: ``namespace/name``.
        uid: the pod's UID ("" when unknown).
        node: node name the pod is bound or assumed to.
        gpus: GPU indices it holds (empty for pods without GPUs).
        gpu_indices_known: False when the indices were inferred because the pod carried no
            placement annotation (bound by another scheduler); they are then the lowest free.
        cpu_milli / memory_bytes: requests.
        gang: gang key ``namespace/group`` or "".
        assumed: True while only assumed by topoplace (not yet confirmed by the API).
        raw: the Pod object as received (read-only), for round-tripping.
        shares: what a fractional pod holds per GPU (``gpus`` is then empty: it holds no
            whole GPU).
        replicas: time-slicing / MPS replicas it holds on a replica node (``gpus`` is then
            empty: the kubelet picks the device).
    """

    key: str
    uid: str
    node: str
    gpus: tuple[int, ...]
    gpu_indices_known: bool = True
    cpu_milli: int = 0
    memory_bytes: int = 0
    gang: str = ""
    assumed: bool = False
    raw: Mapping[str, Any] = field(default_factory=lambda: EMPTY_MAP, compare=False, repr=False)
    shares: tuple[GpuShare, ...] = ()
    replicas: int = 0


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """A gang's fabric-level constraint, KAI/Kueue style.

    Attributes:
        required: fabric level all members must share one domain of ("" = none).
        preferred: fabric level the solver tries to keep members inside ("" = none).
    """

    required: str = ""
    preferred: str = ""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for, read from the Pod object.

    Attributes:
        key: ``namespace/name``.
        uid: pod UID.
        gpus: whole GPUs requested (``nvidia.com/gpu``; max of sum over containers and any
            init container).
        cpu_milli / memory_bytes: requests.
        min_link: minimum link class every ring hop of its GPU set must have ("" = any);
            one of "nvlink", "pix", "pxb", "phb", "node", "sys".
        gang: gang key ``namespace/group`` ("" for a lone pod).
        gang_size: members the pod's ``topoplace.io/gang-size`` annotation declares
            (1 .. :data:`MAX_GANG_SIZE`), else 0.
        role: role of the member inside the gang (pods of one role are interchangeable).
        topology: the gang's topology constraint.
        node_selector: the pod's nodeSelector (already applied by kube-scheduler; used
            offline by the CLI and simulator).
        priority: pod priority.
        node_affinity: the pod's required node affinity (:data:`NodeAffinity`). Like
            ``node_selector``, kube-scheduler applies it to the pod it asks about; a gang
            plan applies both to the members it places ahead of their own filter.
    """

    key: str
    uid: str = ""
    gpus: int = 0
    cpu_milli: int = 0
    memory_bytes: int = 0
    min_link: str = ""
    gang: str = ""
    gang_size: int = 0
    role: str = ""
    topology: TopologyConstraint = TopologyConstraint()
    node_selector: Mapping[str, str] = field(default_factory=lambda: EMPTY_MAP)
    priority: int = 0
    node_affinity: NodeAffinity = ()

    @property
    def namespace(self) -> str:
        """The pod's namespace."""
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        """The pod's name."""
        return self.key.split("/", 1)[-1]
