"""Pure model of GPU interconnects (inside a node) and of the cluster fabric (between nodes).

* :mod:`topology.links`  link labels -> bandwidth (GB/s) and go-gpuallocator pair weights
* :mod:`topology.shape`  ``GpuShape``: catalog, ``nvidia-smi topo -m`` / link-list parsing,
  node resolution from labels and annotations
* :mod:`topology.select` GPU-set choice (``nvidia-best-effort``, ``topoplace``), memoized
* :mod:`topology.fabric` inter-node tiers from node labels, collective bandwidth

Everything here is pure: no file, network, environment or clock access, no Kubernetes or web
framework imports, and inputs are never modified.
"""

from topology.fabric import DEFAULT_LEVELS, Fabric, FabricLevel
from topology.select import (
    POLICIES,
    GpuSet,
    best_bottlenecks,
    best_set,
    ring_bottleneck,
    select_gpus,
)
from topology.shape import (
    CATALOG,
    GpuShape,
    assumed_shape,
    catalog_shape,
    parse_link_list,
    parse_topo_matrix,
    parse_topology_spec,
    resolve_node_shape,
)

__all__ = [
    "CATALOG",
    "DEFAULT_LEVELS",
    "POLICIES",
    "Fabric",
    "FabricLevel",
    "GpuSet",
    "GpuShape",
    "assumed_shape",
    "best_bottlenecks",
    "best_set",
    "catalog_shape",
    "parse_link_list",
    "parse_topo_matrix",
    "parse_topology_spec",
    "resolve_node_shape",
    "ring_bottleneck",
    "select_gpus",
]
