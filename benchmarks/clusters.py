"""Keyword builders for real-shaped Node and Pod objects, and synthetic clusters.

Objects look exactly like ``kubectl get nodes,pods -o json`` items: GFD labels
(``nvidia.com/gpu.*``), the NVLink clique label, Topograph fabric labels
(``network.topology.nvidia.com/*``), Ready conditions, capacity/allocatable. Used by the
demo cluster, the benchmarks and the tests (kube-scheduler ``st.MakePod()`` style:
keyword builders instead of giant literals).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.core.objects import placement_value

# GFD product strings as GFD writes them (spaces -> dashes) and the matching memory (MiB).
PRODUCTS: dict[str, tuple[str, int, str]] = {
    "gb200": ("NVIDIA-GB200", 189471, "Blackwell"),
    "h100": ("NVIDIA-H100-80GB-HBM3", 81559, "hopper"),
    "h200": ("NVIDIA-H200", 143771, "hopper"),
    "a100": ("NVIDIA-A100-SXM4-80GB", 81920, "ampere"),
    "v100": ("Tesla-V100-SXM2-32GB", 32768, "volta"),
    "l40s": ("NVIDIA-L40S", 46068, "ada-lovelace"),
    "t4": ("Tesla-T4", 15360, "turing"),
}


def _uid(seed: str) -> str:
    return str(uuid.UUID(hashlib.sha1(seed.encode()).hexdigest()[:32]))


def make_node(
    name: str,
    gpus: int = 8,
    product: str = "h100",
    *,
    clique: str | None = None,
    accelerator: str | None = None,
    leaf: str | None = None,
    spine: str | None = None,
    core: str | None = None,
    zone: str | None = "dc1-hall-a",
    machine: str | None = None,
    topology: str | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    conditions: Sequence[Mapping[str, Any]] = (),
    taints: Sequence[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    allocatable_gpus: int | None = None,
    cpu: str = "224",
    memory: str = "2063562Mi",
) -> dict[str, Any]:
    """A GPU Node object with GFD and Topograph labels.

    Args:
        name: node name.
        gpus: GPU capacity.
        product: key of :data:`PRODUCTS` or a literal GFD product string.
        clique: ``nvidia.com/gpu.clique`` value (``<ClusterUUID>.<CliqueID>``).
        accelerator / leaf / spine / core: Topograph fabric labels.
        machine: ``nvidia.com/gpu.machine`` (e.g. "DGX-H100").
        topology: ``topoplace.io/gpu-topology`` annotation (catalog name or link list).
        ready / unschedulable / conditions / taints: health signals.
        allocatable_gpus: allocatable below capacity models device-plugin-unhealthy GPUs.
    """
    prod, mem, family = PRODUCTS.get(product, (product, 0, "unknown"))
    lab: dict[str, str] = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "arm64" if product == "gb200" else "amd64",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": prod,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.sharing-strategy": "none",
    }
    if mem:
        lab["nvidia.com/gpu.memory"] = str(mem)
    if machine:
        lab["nvidia.com/gpu.machine"] = machine
    if zone:
        lab["topology.kubernetes.io/zone"] = zone
    for key, val in (
        ("nvidia.com/gpu.clique", clique),
        ("network.topology.nvidia.com/accelerator", accelerator),
        ("network.topology.nvidia.com/leaf", leaf),
        ("network.topology.nvidia.com/spine", spine),
        ("network.topology.nvidia.com/core", core),
    ):
        if val:
            lab[key] = val
    lab.update(labels or {})
    ann = dict(annotations or {})
    if topology:
        ann["topoplace.io/gpu-topology"] = topology
    conds = [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status"
            if ready
            else "container runtime network not ready",
            "lastHeartbeatTime": "2026-11-29T20:00:00Z",
            "lastTransitionTime": "2026-11-01T00:00:00Z",
        }
    ]
    conds.extend(dict(c) for c in conditions)
    node_taints = [dict(t) for t in taints]
    if not ready:
        node_taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    if unschedulable:
        node_taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    spec: dict[str, Any] = {"taints": node_taints} if node_taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    alloc = gpus if allocatable_gpus is None else allocatable_gpus
    node: dict[str, Any] = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": _uid("node/" + name),
            "labels": lab,
            "annotations": ann,
        },
        "spec": spec,
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "110"},
            "allocatable": {
                "cpu": cpu,
                "memory": memory,
                "nvidia.com/gpu": str(alloc),
                "pods": "110",
            },
            "conditions": conds,
        },
    }
    return node


def replica_node(
    name: str,
    gpus: int = 8,
    product: str = "h100",
    replicas: int = 10,
    strategy: str = "time-slicing",
    *,
    renamed: bool = False,
    allocatable_replicas: int | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """A GPU node whose NVIDIA device plugin shares each GPU as ``replicas`` time-slicing
    or MPS replicas, labelled as GPU Feature Discovery does (``nvidia.com/gpu.replicas``,
    ``nvidia.com/gpu.sharing-strategy``, ``nvidia.com/gpu.count`` = physical GPUs, the
    product with a ``-SHARED`` suffix), advertising ``gpus * replicas`` of
    ``nvidia.com/gpu`` (``nvidia.com/gpu.shared`` with ``renamed``: the device plugin's
    ``renameByDefault``)."""
    node = make_node(name, gpus, product, **kw)
    lab = node["metadata"]["labels"]
    lab["nvidia.com/gpu.product"] += "-SHARED"
    lab["nvidia.com/gpu.replicas"] = str(replicas)
    lab["nvidia.com/gpu.sharing-strategy"] = strategy
    total = gpus * replicas
    alloc = total if allocatable_replicas is None else allocatable_replicas
    resource = "nvidia.com/gpu.shared" if renamed else "nvidia.com/gpu"
    for key, value in (("capacity", total), ("allocatable", alloc)):
        node["status"][key].pop("nvidia.com/gpu")
        node["status"][key][resource] = str(value)
    return node


def make_pod(
    name: str,
    gpus: int = 1,
    *,
    namespace: str = "default",
    node: str | None = None,
    gpu_indices: Sequence[int] | None = None,
    gang: str | None = None,
    gang_size: int | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    cpu: str = "8",
    memory: str = "64Gi",
    phase: str | None = None,
    scheduler_name: str = "topoplace",
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod object requesting ``gpus`` whole GPUs.

    With ``node`` it is bound (``spec.nodeName``, phase Running); with ``gpu_indices`` it
    carries topoplace's placement record.
    """
    ann = dict(annotations or {})
    if gang:
        ann["topoplace.io/gang"] = gang
        if gang_size:
            ann["topoplace.io/gang-size"] = str(gang_size)
    if node and gpu_indices is not None:
        ann["topoplace.io/placement"] = placement_value(node, tuple(sorted(gpu_indices)), "")
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [
            {
                "name": "main",
                "image": "nvcr.io/nvidia/pytorch:24.08-py3",
                "resources": resources,
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priority": 0,
    }
    if node:
        spec["nodeName"] = node
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": _uid(f"pod/{namespace}/{name}"),
            "labels": dict(labels or {}),
            "annotations": ann,
        },
        "spec": spec,
        "status": {"phase": phase or ("Running" if node else "Pending")},
    }


def as_list(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Wrap objects in a Kubernetes ``List``."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": list(items),
    }


def nvl72_racks(
    racks: int, *, leaves_per_spine: int = 4, prefix: str = "gb200"
) -> list[dict[str, Any]]:
    """GB200 NVL72 racks: 18 four-GPU trays per rack, one NVLink domain per rack.

    Rack r gets ClusterUUID ``<uuid(r)>``, clique id 1, leaf ``leaf-<r>`` (one rack per
    leaf) and spine ``spine-<r // leaves_per_spine>``.
    """
    nodes = []
    for r in range(racks):
        cluster_uuid = _uid(f"nvl72/{prefix}/{r}")
        for t in range(18):
            nodes.append(
                make_node(
                    f"{prefix}-r{r:03d}-t{t:02d}",
                    4,
                    "gb200",
                    clique=f"{cluster_uuid}.1",
                    leaf=f"leaf-{prefix}-{r:03d}",
                    spine=f"spine-{prefix}-{r // leaves_per_spine:02d}",
                    machine="GB200-NVL72",
                    cpu="144",
                    memory="884Gi",
                )
            )
    return nodes


def dgx_h100_nodes(
    count: int, *, nodes_per_leaf: int = 32, leaves_per_spine: int = 4, prefix: str = "dgx-h100"
) -> list[dict[str, Any]]:
    """DGX H100 scalable units: 32 nodes per leaf group, leaves grouped under spines."""
    out = []
    for i in range(count):
        leaf = i // nodes_per_leaf
        out.append(
            make_node(
                f"{prefix}-{i:05d}",
                8,
                "h100",
                leaf=f"leaf-{prefix}-{leaf:03d}",
                spine=f"spine-{prefix}-{leaf // leaves_per_spine:02d}",
                machine="DGX-H100",
            )
        )
    return out


def hami_register(node: str, gpus: int, memory_mib: int, gpu_type: str, split: int = 10) -> str:
    """A ``hami.io/node-nvidia-register`` value as HAMi's device plugin writes it (JSON,
    Go ``omitempty``: index 0 left out)."""
    import json

    devs = []
    for i in range(gpus):
        d: dict[str, Any] = {"id": "GPU-" + _uid(f"gpu/{node}/{i}"), "count": split}
        d.update(devmem=memory_mib, devcore=100, type=gpu_type, mode="hami-core", health=True)
        if i:
            d["index"] = i
        devs.append(d)
    return json.dumps(devs, separators=(",", ":"))


def demo_cluster() -> dict[str, Any]:
    """The embedded demo cluster (``config/clusters/demo.yaml``): 28 nodes.

    * one GB200 NVL72 domain of 18 four-GPU trays (one leaf), one tray carrying an
      NVSentinel ``GpuXidError`` condition;
    * four DGX H100 on two leaves under one spine: one NotReady, one cordoned;
    * two DGX-1 V100 (hybrid cube-mesh) on a third leaf, one with GPU 3 in
      ``hami.io/device-cordon``;
    * two PCIe 8-GPU servers: one described by a topology annotation, one with no
      topology information at all (treated as all-SYS and reported);
    * two HAMi-registered inference nodes (4 x T4, 4 x L40S) for fractional pods;
    * a few pods already running with placement records.
    """
    nodes = nvl72_racks(1, prefix="gb200")
    for n in nodes:
        n["metadata"]["labels"]["network.topology.nvidia.com/spine"] = "spine-a"
    xid = nodes[5]
    xid["status"]["conditions"].append(
        {
            "type": "GpuXidError",
            "status": "True",
            "reason": "GpuXidErrorIsNotHealthy",
            "message": "ErrorCode:79 GPU has fallen off the bus PCI:0000:1b:00 Recommended Action=RESTART_BM;",
            "lastHeartbeatTime": "2026-11-29T19:55:00Z",
            "lastTransitionTime": "2026-11-29T19:55:00Z",
        }
    )
    for i in range(4):
        nodes.append(
            make_node(
                f"dgx-h100-{i + 1:02d}",
                8,
                "h100",
                leaf="leaf-h100-a" if i < 2 else "leaf-h100-b",
                spine="spine-a",
                machine="DGX-H100",
                ready=(i != 2),
                unschedulable=(i == 3),
            )
        )
    v100_uuids = ["GPU-" + _uid(f"gpu/dgx1-v100-02/{g}") for g in range(8)]
    nodes.append(
        make_node("dgx1-v100-01", 8, "v100", leaf="leaf-v100", spine="spine-b", machine="DGX-1")
    )
    nodes.append(
        make_node(
            "dgx1-v100-02",
            8,
            "v100",
            leaf="leaf-v100",
            spine="spine-b",
            machine="DGX-1",
            annotations={
                "topoplace.io/gpu-uuids": ",".join(v100_uuids),
                "hami.io/device-cordon": v100_uuids[3],
            },
        )
    )
    nodes.append(
        make_node(
            "pcie-l40s-01",
            8,
            "l40s",
            leaf="leaf-pcie",
            spine="spine-b",
            topology="pcie-8gpu-2socket",
        )
    )
    nodes.append(make_node("pcie-l40s-02", 8, "l40s", leaf="leaf-pcie", spine="spine-b"))
    # Inference nodes running HAMi's device plugin: GPUs registered per device, shared.
    for name, gpus, product in (("infer-t4-01", 4, "t4"), ("infer-l40s-01", 4, "l40s")):
        node = make_node(name, gpus, product, leaf="leaf-pcie", spine="spine-b")
        node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = hami_register(
            name, gpus, PRODUCTS[product][1], PRODUCTS[product][0]
        )
        for k in ("capacity", "allocatable"):
            node["status"][k]["nvidia.com/gpu"] = str(gpus * 10)  # HAMi's split replicas
        nodes.append(node)
    pods = [
        make_pod(
            "llama-ft-0", 4, namespace="ml-train", node="dgx-h100-01", gpu_indices=[0, 1, 2, 3]
        ),
        make_pod("embed-0", 2, namespace="ml-serve", node="dgx-h100-01", gpu_indices=[4, 5]),
        make_pod(
            "bert-0", 4, namespace="ml-train", node="gb200-r000-t00", gpu_indices=[0, 1, 2, 3]
        ),
        make_pod("resnet-0", 2, namespace="ml-train", node="dgx1-v100-01", gpu_indices=[0, 3]),
        make_pod("notebook-0", 1, namespace="research", node="pcie-l40s-01"),
        make_pod("finished-0", 8, namespace="ml-train", node="dgx-h100-02", phase="Succeeded"),
    ]
    return as_list(nodes + pods)


def synthetic_cluster(
    num_nodes: int, *, used_fraction: float = 0.4, seed: int = 1
) -> dict[str, Any]:
    """A large mixed fleet for benchmarks: NVL72 racks, DGX H100 SUs and DGX-1 V100s.

    About half the GPUs sit in NVL72 racks, a third in DGX H100 nodes, the rest in DGX-1
    V100s; ``used_fraction`` of nodes run a pod using half of their GPUs. Deterministic.
    """
    import random

    rng = random.Random(seed)
    racks = max(1, num_nodes // 2 // 18)
    nodes = nvl72_racks(racks)
    h100 = max(1, (num_nodes - len(nodes)) * 2 // 3)
    nodes += dgx_h100_nodes(h100)
    for i in range(max(0, num_nodes - len(nodes))):
        nodes.append(
            make_node(
                f"dgx1-v100-{i:05d}",
                8,
                "v100",
                leaf=f"leaf-v100-{i // 32:03d}",
                spine="spine-v100",
                machine="DGX-1",
            )
        )
    nodes = nodes[:num_nodes]
    pods = []
    for n in nodes:
        if rng.random() < used_fraction:
            g = int(n["status"]["capacity"]["nvidia.com/gpu"]) // 2
            name = n["metadata"]["name"]
            pods.append(
                make_pod(f"job-{name}", g, namespace="bench", node=name, gpu_indices=list(range(g)))
            )
    return as_list(nodes + pods)


def resource_claim(
    name: str,
    count: int,
    version: str = "v1beta2",
    namespace: str = "default",
    cls: str = "gpu.nvidia.com",
) -> dict[str, Any]:
    """A pending ResourceClaim of ``count`` devices of DeviceClass ``cls``, in the shape of
    ``resource.k8s.io/<version>`` (v1beta1: ``deviceClassName``/``count`` on the request;
    v1beta2 and v1: under ``exactly``)."""
    if version == "v1beta1":
        req: dict[str, Any] = {"name": "gpus", "deviceClassName": cls, "count": count}
    else:
        req = {"name": "gpus", "exactly": {"deviceClassName": cls, "count": count}}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": _uid(f"claim/{namespace}/{name}"),
        },
        "spec": {"devices": {"requests": [req]}},
    }


def claim_pod(
    name: str, claim: str, scheduler: str = "topoplace", namespace: str = "default"
) -> dict[str, Any]:
    """A pod whose GPUs are the ResourceClaim ``claim`` (one container using it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": _uid(f"pod/{namespace}/{name}")},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.9",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "claims": [{"name": "gpus"}],
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


DRA_FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kube" / "dra-1.33"
"""Recorded DRA objects of a real cluster (NVIDIA's DRA driver on kube 1.33)."""


def node_slices(names: Sequence[str]) -> list[dict[str, Any]]:
    """One recorded 8-GPU ``gpu.nvidia.com`` ResourceSlice (``DRA_FIXTURES``) per node,
    renamed to it, in a pool of its own named after it (devices as recorded)."""
    import copy
    import json

    path = DRA_FIXTURES / "resourceslices.v1beta1.json"
    recorded = json.loads(path.read_text())["items"][0]
    out = []
    for name in names:
        s = copy.deepcopy(recorded)
        s["metadata"]["name"] = f"{name}-gpu.nvidia.com"
        s["spec"]["nodeName"] = name
        s["spec"]["pool"]["name"] = name  # a pool per node, as the driver publishes
        out.append(s)
    return out


def hami_node(
    name: str, gpus: int = 8, product: str = "h100", split: int = 10, **kw: Any
) -> dict[str, Any]:
    """A node running HAMi's device plugin: ``nvidia.com/gpu`` advertised as ``gpus *
    split`` replicas, and the register annotation (:func:`hami_register`)."""
    from scheduler.core.fractional import HAMI_REGISTER

    gpu_type, memory_mib = PRODUCTS[product][0], PRODUCTS[product][1]
    ann = {HAMI_REGISTER: hami_register(name, gpus, memory_mib, gpu_type, split)}
    node = make_node(name, gpus, product, annotations=ann, **kw)
    for k in ("capacity", "allocatable"):
        node["status"][k]["nvidia.com/gpu"] = str(gpus * split)
    return node


def hami_pod(
    name: str, mem_mib: int, cores: int, *, namespace: str = "infer", node: str | None = None
) -> dict[str, Any]:
    """A HAMi fractional pod: one GPU share of ``mem_mib`` MiB and ``cores`` % of the
    cores, as container limits (``nvidia.com/gpu``, ``gpumem``, ``gpucores``)."""
    pod = make_pod(name, 0, namespace=namespace, node=node, cpu="2", memory="8Gi")
    pod["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(mem_mib),
        "nvidia.com/gpucores": str(cores),
    }
    return pod
