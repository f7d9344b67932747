"""Scenarios of the live benchmark: fake GPU nodes and pods in arrival order.

* ``mix`` (synthetic fabric): H100 nodes with leaf/spine labels
  (``network.topology.nvidia.com/leaf`` / ``spine``) and A100 nodes without, all 8 GPUs;
  ``big`` eight-GPU pods, then ``small`` one-GPU pods, optionally a few gangs
  (``topoplace.io/gang`` + ``topoplace.io/gang-size``) spread among the small pods.
  Acceptance size: 500 nodes (400 H100, 100 A100), 100 + 2,000 pods: at best 350 nodes
  used and 150 whole nodes free.
* ``openb``: the node list of the Alibaba openb trace and the whole-GPU tasks of one
  workload (``gpu_milli == 1000``), in creation-time order, capped at what fits (the
  requested GPUs never exceed the cluster's), with the trace's CPU and memory requests
  (``resources="trace"``) or token ones (``"minimal"``), and ``gpu_spec`` as a required
  node affinity on the GPU model.

Objects are plain API dicts; nodes and pods carry ``livebench.topoplace.io/run`` so a run
only ever lists and deletes its own.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN_LABEL = "livebench.topoplace.io/run"
PHASE_LABEL = "livebench.topoplace.io/phase"
GANG_ANNOTATION = "topoplace.io/gang"
GANG_SIZE_ANNOTATION = "topoplace.io/gang-size"
PREFERRED_ANNOTATION = "topoplace.io/topology-preferred"
LEAF_LABEL = "network.topology.nvidia.com/leaf"
SPINE_LABEL = "network.topology.nvidia.com/spine"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU = "nvidia.com/gpu"
PAUSE_IMAGE = "registry.k8s.io/pause:3.9"
HOLD_GATE = "livebench.topoplace.io/hold"
"""The scheduling gate a backlog run creates its pods with (removed in arrival order)."""

H100 = {
    PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.machine": "DGXH100",
}
A100 = {
    PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.machine": "DGXA100",
}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One fake GPU node."""

    name: str
    gpus: int
    cpu_milli: int = 192_000
    memory_mib: int = 2048 * 1024
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    template: Mapping[str, Any] | None = None
    """A Node object to create as it is (a scenario file's); the fields above describe it."""

    def to_object(self, run: str) -> dict[str, Any]:
        """A Node with Ready status and GPU capacity (kept on create, as a kubelet's)."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.template is not None:
            return _node_from_template(self.template, run, now)
        res = {
            "cpu": f"{self.cpu_milli}m",
            "memory": f"{self.memory_mib}Mi",
            "pods": str(self.pods),
            "ephemeral-storage": "1Ti",
            GPU: str(self.gpus),
        }
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(self.gpus),
            **self.labels,
            RUN_LABEL: run,
        }

        def cond(kind: str, status: str, reason: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "livebench fake node (no kubelet)",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }

        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "status": {
                "capacity": res,
                "allocatable": res,
                "conditions": [
                    cond("Ready", "True", "KubeletReady"),
                    cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                    cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                    cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                ],
                "addresses": [{"type": "Hostname", "address": self.name}],
            },
        }


_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def _node_from_template(template: Mapping[str, Any], run: str, now: str) -> dict[str, Any]:
    """A copy of ``template`` to create: server-set metadata dropped, the run's label added,
    condition times set to ``now`` (a Ready condition added if it has none)."""
    obj = copy.deepcopy(dict(template))
    obj.setdefault("apiVersion", "v1")
    obj.setdefault("kind", "Node")
    meta = obj.setdefault("metadata", {})
    for k in _SERVER_FIELDS:
        meta.pop(k, None)
    meta["labels"] = {**(meta.get("labels") or {}), RUN_LABEL: run}
    status = obj.setdefault("status", {})
    conds = status.setdefault("conditions", [])
    if not any(c.get("type") == "Ready" for c in conds):
        conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady"})
    for c in conds:
        c["lastHeartbeatTime"] = c["lastTransitionTime"] = now
    return obj


def _pod_from_template(
    template: Mapping[str, Any],
    name: str,
    namespace: str,
    scheduler_name: str,
    run: str,
    phase: str,
    gate: str,
) -> dict[str, Any]:
    """A copy of ``template`` to create as ``namespace/name`` for ``scheduler_name``: server-set
    metadata and status dropped, the run's labels added, no grace period (no kubelet), an
    explicit ``priority`` dropped (the Priority admission plugin sets it), held by ``gate``
    if given."""
    obj = copy.deepcopy(dict(template))
    obj.pop("status", None)
    meta = obj.setdefault("metadata", {})
    for k in _SERVER_FIELDS:
        meta.pop(k, None)
    meta["name"] = name
    meta["namespace"] = namespace
    labels = {**(meta.get("labels") or {}), RUN_LABEL: run}
    if phase:
        labels[PHASE_LABEL] = phase
    meta["labels"] = labels
    meta.setdefault("annotations", {})
    spec = obj.setdefault("spec", {})
    spec["schedulerName"] = scheduler_name
    spec["terminationGracePeriodSeconds"] = 0
    spec.pop("nodeName", None)
    if not spec.get("priorityClassName"):
        spec.pop("priority", None)
    if gate:
        spec["schedulingGates"] = [{"name": gate}]
    return obj


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod of the arrival sequence."""

    name: str
    gpus: int
    cpu_milli: int = 1000
    memory_mib: int = 1024
    gang: str = ""
    gang_size: int = 0
    preferred: str = ""
    gpu_models: tuple[str, ...] = ()
    """Allowed ``nvidia.com/gpu.product`` values (required node affinity); empty = any."""
    template: Mapping[str, Any] | None = None
    """A Pod object to create (a scenario file's, :mod:`benchmarks.engine.replay`); the
    fields above describe it."""
    arrive: float = 0.0
    """Arrival time in scenario seconds (or the position, for scenarios without times)."""
    depart: float | None = None
    """Explicit deletion time in scenario seconds (a trace's), if any."""
    duration: float | None = None
    """Scenario seconds the job runs once placed (a gang: once all members are bound)."""
    job: str = ""
    """The job (gang, or the pod itself) in the scenario file."""

    def to_object(
        self, namespace: str, scheduler_name: str, run: str, phase: str = "", gate: str = ""
    ) -> dict[str, Any]:
        """The Pod to create (requests = limits; never runs: no kubelet); with ``gate``, held
        by that scheduling gate (``spec.schedulingGates``) until it is removed."""
        if self.template is not None:
            return _pod_from_template(
                self.template, self.name, namespace, scheduler_name, run, phase, gate
            )
        res = {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi", GPU: str(self.gpus)}
        ann: dict[str, str] = {}
        if self.gang:
            ann[GANG_ANNOTATION] = self.gang
            ann[GANG_SIZE_ANNOTATION] = str(self.gang_size)
            if self.preferred:
                ann[PREFERRED_ANNOTATION] = self.preferred
        labels = {RUN_LABEL: run}
        if phase:
            labels[PHASE_LABEL] = phase
        spec: dict[str, Any] = {
            "schedulerName": scheduler_name,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    "resources": {"requests": res, "limits": res},
                }
            ],
        }
        if gate:
            spec["schedulingGates"] = [{"name": gate}]
        if self.gpu_models:
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": PRODUCT_LABEL,
                                        "operator": "In",
                                        "values": list(self.gpu_models),
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "labels": labels,
                "annotations": ann,
            },
            "spec": spec,
        }


@dataclass(frozen=True, slots=True)
class Scenario:
    """Nodes and pods (arrival order) of one benchmark."""

    name: str
    description: str
    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodSpec, ...]
    source: str = ""
    """Where the scenario comes from (a scenario file, its seed and cap), for reports."""

    @property
    def lifetimes(self) -> bool:
        """True if some pod leaves (an explicit departure or a duration)."""
        return any(p.depart is not None or p.duration is not None for p in self.pods)

    @property
    def gpu_capacity(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpus_requested(self) -> int:
        return sum(p.gpus for p in self.pods)

    def gangs(self) -> dict[str, list[str]]:
        """Gang name -> member pod names, arrival order."""
        out: dict[str, list[str]] = {}
        for p in self.pods:
            if p.gang:
                out.setdefault(p.gang, []).append(p.name)
        return out

    def best_nodes_used(self) -> int:
        """A lower bound on the nodes any placement uses: the fewest nodes (largest first)
        whose GPUs cover the request. Exact for ``mix`` (8-GPU nodes, pods of 1 or 8 GPUs)."""
        need = self.gpus_requested
        used = 0
        for g in sorted((n.gpus for n in self.nodes), reverse=True):
            if need <= 0:
                break
            need -= g
            used += 1
        return used

    def best_whole_free(self) -> int:
        """Upper bound on nodes left without any GPU in use (all nodes minus the bound
        above)."""
        return len(self.nodes) - self.best_nodes_used()


# ---- mix: synthetic fabric ----------------------------------------------------------------


def mix_scenario(
    nodes: int = 500,
    big: int = 100,
    small: int = 2000,
    *,
    h100_share: float = 0.8,
    nodes_per_leaf: int = 16,
    leaves_per_spine: int = 4,
    gangs: int = 0,
    gang_size: int = 4,
    gang_gpus: int = 8,
    gang_preferred: str = "",
) -> Scenario:
    """``nodes`` 8-GPU nodes (``h100_share`` H100 with leaf/spine labels, the rest A100),
    ``big`` 8-GPU pods, then ``small`` 1-GPU pods; ``gangs`` gangs of ``gang_size``
    members x ``gang_gpus`` GPUs spread evenly among the small pods (members arrive
    together)."""
    n_h100 = round(nodes * h100_share)
    specs: list[NodeSpec] = []
    for i in range(n_h100):
        leaf = i // nodes_per_leaf
        specs.append(
            NodeSpec(
                name=f"h100-{i:04d}",
                gpus=8,
                labels={
                    **H100,
                    LEAF_LABEL: f"leaf-{leaf:03d}",
                    SPINE_LABEL: f"spine-{leaf // leaves_per_spine:02d}",
                },
            )
        )
    for i in range(nodes - n_h100):
        specs.append(NodeSpec(name=f"a100-{i:04d}", gpus=8, labels=dict(A100)))
    seq: list[PodSpec] = [PodSpec(f"big-{i:04d}", 8) for i in range(big)]
    smalls = [PodSpec(f"small-{i:05d}", 1) for i in range(small)]
    cuts = [(k + 1) * small // (gangs + 1) for k in range(gangs)]
    start = 0
    for k, cut in enumerate(cuts):
        seq.extend(smalls[start:cut])
        start = cut
        seq.extend(
            PodSpec(
                f"gang-{k:02d}-{m}",
                gang_gpus,
                gang=f"gang-{k:02d}",
                gang_size=gang_size,
                preferred=gang_preferred,
            )
            for m in range(gang_size)
        )
    seq.extend(smalls[start:])
    desc = (
        f"{nodes} x 8-GPU nodes ({n_h100} H100 on leaf/spine, {nodes - n_h100} A100); "
        f"{big} x 8-GPU pods, then {small} x 1-GPU pods"
        + (f"; {gangs} gangs of {gang_size} x {gang_gpus} GPUs" if gangs else "")
    )
    return Scenario("mix", desc, tuple(specs), tuple(seq))


# ---- openb: a real node list and workload ------------------------------------------------


def dns_name(name: str) -> str:
    """A trace name as a DNS-1123 name (the trace writes `openb-node-0001` style names)."""
    return name.lower().replace("_", "-")


def openb_scenario(
    workload: str = "default",
    data: str | Path | None = None,
    *,
    max_pods: int | None = None,
    resources: str = "trace",
    max_nodes: int | None = None,
) -> Scenario:
    """The openb GPU node list and ``workload``'s whole-GPU tasks in creation order.

    Args:
        workload: pod list name (``default``, ``multigpu20``, ``gpuspec10``...).
        data: the trace directory (default ``../shared/data/alibaba-gpu-v2023``).
        max_pods: keep at most this many pods.
        resources: ``trace`` (the tasks' CPU and memory) or ``minimal`` (100m, 128Mi).
        max_nodes: keep this many nodes, evenly spaced over the list sorted by name (a
            smaller cluster with roughly the same model mix, for development). Pods are
            still capped at what fits.

    Raises:
        FileNotFoundError: the trace is absent.
        ValueError: unknown ``resources``.
    """
    from benchmarks.engine import openb

    if resources not in ("trace", "minimal"):
        raise ValueError("resources must be 'trace' or 'minimal'")
    raw_nodes = openb.load_nodes(data)
    if max_nodes is not None and max_nodes < len(raw_nodes):
        step = len(raw_nodes) / max(1, max_nodes)
        raw_nodes = [raw_nodes[int(i * step)] for i in range(max_nodes)]
    nodes = tuple(
        NodeSpec(
            name=dns_name(n.name),
            gpus=n.num_gpu,
            cpu_milli=n.cpu_milli_capacity,
            memory_mib=n.memory_mib_capacity,
            labels={PRODUCT_LABEL: n.gpu_model},
        )
        for n in raw_nodes
        if n.num_gpu > 0
    )
    tasks = openb.load_tasks(workload, data)
    times = openb.load_task_times(workload, data)
    order = sorted(
        range(len(tasks)), key=lambda i: (times.get(tasks[i].name, (0, 0))[0] if times else 0, i)
    )
    capacity = sum(n.gpus for n in nodes)
    biggest = max((n.gpus for n in nodes), default=0)
    pods: list[PodSpec] = []
    requested = 0
    for i in order:
        t = tasks[i]
        if t.num_gpu < 1 or t.gpu_milli != 1000 or t.num_gpu > biggest:
            continue
        if requested + t.num_gpu > capacity or (max_pods is not None and len(pods) >= max_pods):
            break
        requested += t.num_gpu
        cpu, mem = (t.cpu_milli, t.memory_mib) if resources == "trace" else (100, 128)
        pods.append(PodSpec(dns_name(t.name), t.num_gpu, cpu, mem, gpu_models=tuple(t.gpu_spec)))
    desc = (
        f"openb {workload}: {len(nodes)} GPU nodes ({capacity} GPUs) from the trace's node "
        f"list; {len(pods)} whole-GPU tasks ({requested} GPUs) in creation order, "
        f"{resources} CPU/memory requests"
    )
    return Scenario(f"openb-{workload}", desc, nodes, tuple(pods))
