"""Cluster fabric: how fast GPUs on different nodes talk, from node labels.

Nodes carry their place in the network as labels (NVIDIA Topograph writes
``network.topology.nvidia.com/{accelerator,leaf,spine,core}``; GFD writes
``nvidia.com/gpu.clique``; clouds write their own). A :class:`Fabric` is an ordered list of
:class:`FabricLevel` from the closest domain (an NVLink domain) to the farthest (a zone). Two
nodes communicate at the bandwidth of the lowest level whose domain they share.

Domain ids are taken as globally unique label values (Topograph writes them that way), so two
nodes are in the same leaf iff their leaf labels are equal; higher levels are not consulted to
disambiguate.

The bandwidths are a MODEL of per-GPU inter-node bandwidth (GB/s per direction), documented
beside :data:`DEFAULT_LEVELS`; a cluster can override them with :meth:`Fabric.from_config`.

Contract: pure functions of their arguments; inputs are never modified.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topology.select import path_bottleneck, ring_bottleneck
from topology.shape import GpuShape

__all__ = [
    "DEFAULT_CROSS_CLUSTER_GBPS",
    "DEFAULT_LEVELS",
    "TRANSFORMS",
    "Fabric",
    "FabricLevel",
]

#: Value transforms a level may apply to its label value.
#: ``clique-prefix``: ``nvidia.com/gpu.clique`` is ``<ClusterUUID>.<CliqueID>``; the part
#: before the first dot is the physical NVLink domain (rack), the CliqueID only a Fabric
#: Manager partition of it (NVIDIA/k8s-device-plugin internal/lm/fabric.go; Topograph
#: docs/reference/node-labels.md).
TRANSFORMS: tuple[str, ...] = ("", "clique-prefix")


@dataclass(frozen=True, slots=True)
class FabricLevel:
    """One tier of the cluster network.

    Attributes:
        name: ``"nvlink-domain"``, ``"accelerator"``, ``"leaf"``, ``"spine"``, ``"core"``,
            ``"zone"`` or any configured name (unique within a fabric).
        label_keys: Node label keys holding the domain id; the first present (non-empty)
            one wins.
        bandwidth_gbps: Per-GPU bandwidth (GB/s per direction) between two nodes whose lowest
            common domain is this level.
        value_transform: ``""`` or ``"clique-prefix"`` (see :data:`TRANSFORMS`).
    """

    name: str
    label_keys: tuple[str, ...]
    bandwidth_gbps: float
    value_transform: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a fabric level needs a name")
        if not self.label_keys or not all(isinstance(k, str) and k for k in self.label_keys):
            raise ValueError(f"level {self.name!r}: label_keys must be non-empty strings")
        if not (isinstance(self.bandwidth_gbps, int | float) and self.bandwidth_gbps > 0):
            raise ValueError(f"level {self.name!r}: bandwidth_gbps must be > 0")
        if not math.isfinite(self.bandwidth_gbps):
            raise ValueError(f"level {self.name!r}: bandwidth_gbps must be finite")
        if self.value_transform not in TRANSFORMS:
            raise ValueError(
                f"level {self.name!r}: unknown transform {self.value_transform!r}; "
                f"known: {', '.join(t or '(none)' for t in TRANSFORMS)}"
            )

    def domain(self, labels: Mapping[str, str]) -> str | None:
        """This level's domain id for a node, or None if unlabelled."""
        for key in self.label_keys:
            value = labels.get(key)
            if isinstance(value, str) and value:
                if self.value_transform == "clique-prefix":
                    value = value.split(".", 1)[0]
                return value or None
        return None


#: Default tiers, closest first. Figures are per GPU, per direction:
#:
#: * ``nvlink-domain`` 900 GB/s: nodes of one multi-node NVLink domain (GB200 NVL72 rack)
#:   talk over NVLink 5.0, 18 links x 50 GB/s per direction per GPU (link_bandwidths.csv,
#:   "NVLink 5.0" row). Key: ``nvidia.com/gpu.clique`` with the ClusterUUID prefix.
#: * ``accelerator`` 900 GB/s: Topograph's accelerator tier is the same kind of domain
#:   ("high-speed interconnect domains, such as NVLink", Topograph k8s docs).
#: * ``leaf`` 50 GB/s: rail-optimized InfiniBand, one NDR 400 Gb/s ConnectX-7 per GPU
#:   (link_bandwidths.csv, "NDR" row) and a non-blocking leaf. Old Topograph label
#:   ``/block``; AWS ``network-node-layer-3`` and GCE ``gce-topology-subblock`` are the
#:   nearest tiers those clouds publish.
#: * ``spine`` 25 GB/s, ``core`` 12.5 GB/s: ASSUMED 2:1 and 4:1 oversubscription above the
#:   leaf (typical for large fabrics; not measured). Keys: Topograph spine/core, AWS layers
#:   2/1, GCE block.
#: * ``zone`` 3.125 GB/s: ASSUMED (a data-centre interconnect shared by many nodes; 25 Gb/s
#:   per GPU), same ``topology.kubernetes.io/zone``.
#:
#: Nodes sharing nothing get :data:`DEFAULT_CROSS_CLUSTER_GBPS`.
DEFAULT_LEVELS: tuple[FabricLevel, ...] = (
    FabricLevel("nvlink-domain", ("nvidia.com/gpu.clique",), 900.0, "clique-prefix"),
    FabricLevel("accelerator", ("network.topology.nvidia.com/accelerator",), 900.0),
    FabricLevel(
        "leaf",
        (
            "network.topology.nvidia.com/leaf",
            "network.topology.nvidia.com/block",
            "topology.k8s.aws/network-node-layer-3",
            "cloud.google.com/gce-topology-subblock",
        ),
        50.0,
    ),
    FabricLevel(
        "spine",
        (
            "network.topology.nvidia.com/spine",
            "topology.k8s.aws/network-node-layer-2",
            "cloud.google.com/gce-topology-block",
        ),
        25.0,
    ),
    FabricLevel(
        "core",
        ("network.topology.nvidia.com/core", "topology.k8s.aws/network-node-layer-1"),
        12.5,
    ),
    FabricLevel("zone", ("topology.kubernetes.io/zone",), 3.125),
)

#: Nodes with no labelled domain in common: ASSUMED 10 Gb/s per GPU (1.25 GB/s).
DEFAULT_CROSS_CLUSTER_GBPS = 1.25

Path = tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Fabric:
    """The cluster's network tiers and the bandwidth model over them.

    Attributes:
        levels: Tiers, closest (fastest) first; names unique.
        cross_cluster_gbps: Bandwidth between nodes that share no labelled domain.
    """

    levels: tuple[FabricLevel, ...] = DEFAULT_LEVELS
    cross_cluster_gbps: float = DEFAULT_CROSS_CLUSTER_GBPS

    def __post_init__(self) -> None:
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"fabric level names must be unique: {names}")
        if not (
            isinstance(self.cross_cluster_gbps, int | float)
            and math.isfinite(self.cross_cluster_gbps)
            and self.cross_cluster_gbps > 0
        ):
            raise ValueError("cross_cluster_gbps must be a finite number > 0")

    def path(self, labels: Mapping[str, str]) -> Path:
        """Domain id per level for a node's labels (None where unlabelled)."""
        return tuple(level.domain(labels) for level in self.levels)

    def level_index(self, name: str) -> int:
        """Position of a level by name.

        Raises:
            ValueError: Unknown name; the message lists the known ones.
        """
        for i, level in enumerate(self.levels):
            if level.name == name:
                return i
        raise ValueError(
            f"unknown fabric level {name!r}; known: {', '.join(lv.name for lv in self.levels)}"
        )

    def common_level(self, a: Path, b: Path) -> int:
        """Lowest level index where both paths have the same non-None id; ``len(levels)`` if none."""
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x is not None and x == y:
                return i
        return len(self.levels)

    def bandwidth_between(self, a: Path, b: Path) -> float:
        """Per-GPU bandwidth between two *different* nodes with paths ``a`` and ``b``."""
        level = self.common_level(a, b)
        if level < len(self.levels):
            return self.levels[level].bandwidth_gbps
        return self.cross_cluster_gbps

    def ring_order(self, paths: Sequence[Path]) -> list[int]:
        """Order (indices into ``paths``) in which a ring should visit nodes.

        Sorting by the path read from the farthest level to the closest puts nodes sharing a
        zone next to each other, inside that those sharing a core, and so on down to the NVLink
        domain. In a hierarchical fabric this ring crosses each tier the minimum number of
        times (twice per tier boundary it must cross), so its slowest hop is the lowest level
        that contains every member, which is the best any order can do. Unlabelled tiers sort
        after labelled ones; ties keep input order.
        """

        def key(i: int) -> tuple[tuple[int, str], ...]:
            return tuple((0, v) if v is not None else (1, "") for v in reversed(paths[i]))

        return sorted(range(len(paths)), key=key)

    def collective_bandwidth(
        self,
        members: Sequence[tuple[Path, GpuShape, tuple[int, ...]]],
        include_intra_node: bool = False,
    ) -> float:
        """Estimated ring all-reduce bottleneck (GB/s per direction) of a placement.

        Args:
            members: One entry per node: ``(path, shape, gpus used on that node)``.
            include_intra_node: For multi-node placements also bound the ring by each node's
                internal segment (best Hamiltonian path through its GPUs). Off by default: the
                contract is the inter-node hops; on, a PCIe-only node slower than the network
                shows as the bottleneck.

        Returns:
            Single node: the ring bottleneck of its GPUs (0.0 for one GPU). Several nodes: the
            minimum hop bandwidth around the ring ordered by :meth:`ring_order` (including the
            hop that closes the ring). 0.0 for an empty placement.
        """
        members = [m for m in members if m[2]]
        if not members:
            return 0.0
        if len(members) == 1:
            _, shape, gpus = members[0]
            return ring_bottleneck(shape, gpus)
        order = self.ring_order([m[0] for m in members])
        hops = [
            self.bandwidth_between(members[order[i]][0], members[order[(i + 1) % len(order)]][0])
            for i in range(len(order))
        ]
        value = min(hops)
        if include_intra_node:
            for _, shape, gpus in members:
                if len(gpus) >= 2:
                    value = min(value, path_bottleneck(shape, gpus))
        return value

    @classmethod
    def from_config(cls, obj: Mapping[str, Any]) -> Fabric:
        """Build a fabric from configuration data.

        Format::

            {"levels": [{"name": "leaf", "labels": ["network.topology.nvidia.com/leaf"],
                         "bandwidth_gbps": 50, "transform": ""}, ...],
             "cross_cluster_gbps": 1.25}

        Both keys are optional (defaults: :data:`DEFAULT_LEVELS`,
        :data:`DEFAULT_CROSS_CLUSTER_GBPS`). ``labels`` may be a single string.

        Raises:
            ValueError: Wrong types, missing level fields, invalid values.
        """
        if not isinstance(obj, Mapping):
            raise ValueError("fabric config must be a mapping")
        levels = DEFAULT_LEVELS
        raw_levels = obj.get("levels")
        if raw_levels is not None:
            if not isinstance(raw_levels, Sequence) or isinstance(raw_levels, str):
                raise ValueError("'levels' must be a list")
            built = []
            for i, raw in enumerate(raw_levels):
                if not isinstance(raw, Mapping):
                    raise ValueError(f"level {i} must be a mapping")
                name = raw.get("name")
                labels = raw.get("labels", raw.get("label_keys"))
                if isinstance(labels, str):
                    labels = [labels]
                bandwidth = raw.get("bandwidth_gbps")
                transform = raw.get("transform", raw.get("value_transform", "")) or ""
                if not isinstance(name, str):
                    raise ValueError(f"level {i}: 'name' must be a string")
                if not isinstance(labels, Sequence) or not all(isinstance(k, str) for k in labels):
                    raise ValueError(f"level {name!r}: 'labels' must be a list of strings")
                if isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float):
                    raise ValueError(f"level {name!r}: 'bandwidth_gbps' must be a number")
                if not isinstance(transform, str):
                    raise ValueError(f"level {name!r}: 'transform' must be a string")
                built.append(FabricLevel(name, tuple(labels), float(bandwidth), transform))
            levels = tuple(built)
        cross = obj.get("cross_cluster_gbps", DEFAULT_CROSS_CLUSTER_GBPS)
        if isinstance(cross, bool) or not isinstance(cross, int | float):
            raise ValueError("'cross_cluster_gbps' must be a number")
        return cls(levels=levels, cross_cluster_gbps=float(cross))
