"""DRA inventory of fake GPU nodes: a DeviceClass and, per node, ResourceSlices in the
shape the NVIDIA DRA GPU driver (driver ``gpu.nvidia.com``) publishes, in the
``resource.k8s.io`` version the server serves.

No kubelet or DRA driver runs on this plane, so nothing else writes slices; kube-scheduler's
DynamicResources plugin allocates claims from these.

Per node, by default, one slice: pool = node name, ``spec.nodeName`` = node, devices
``gpu-0..gpu-<n-1>`` with the attributes of the driver's full-GPU devices (``type``,
``index``, ``minor``, ``uuid``, ``productName``, ``brand``, ``architecture``,
``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``, capacity ``memory``),
plus the newer driver's ``pcieBusID`` and the standard ``resource.kubernetes.io/pcieRoot``
(``gpus_per_pcie_root`` GPUs share a root) unless ``pcie_root`` is off.

``mig=K`` makes the first K GPUs partitionable, as the driver's dynamic MIG does: each gets
its own slice with a counter set ``gpu-<i>-counter-set`` (``memory`` and
``memory-slice-0..7``); the full GPU consumes all of it and each MIG-like device
(``gpu-<i>-mig-<profile>-<gi>-<start>``, ``type=mig``) the memory slices of its placement,
so the allocator never hands out overlapping partitions. Up to 1.34 the counter set sits in
the GPU's slice; from 1.35 a slice holds devices or counters, so the sets go to separate
``<node>-<driver>-counters-<j>`` slices of the same pool. Partitions need the
``DRAPartitionableDevices`` gate (off before 1.36); without it the API server drops the
counters silently, which :func:`publish` detects.

``shared=S`` makes the next S GPUs (after the partitionable ones) shared devices, as
consumable capacity publishes them (``DRAConsumableCapacity``, beta and on by default from
1.34; v1 and v1beta2 only): ``allowMultipleAllocations: true``, capacity ``memory`` (the
GPU's, ``requestPolicy`` default the whole memory, ``validRange`` min 1Gi step 1Gi) and
``compute`` (100, percent of the SMs; ``requestPolicy`` ``validValues`` 10/25/50/100,
default 10). Several claims then share such a GPU by memory and compute; a claim that asks
no capacity takes all its memory.

v1beta1 nests a device's attributes and capacity under ``basic``; v1beta2 and v1 do not.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.cluster.flags import Version, separate_counter_slices, slice_api_version
from benchmarks.cluster.nodes import MANAGED_BY, MANAGED_LABEL

GROUP = "resource.k8s.io"
DRIVER = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
SHARED_CLASS = "shared-gpu.nvidia.com"
"""DeviceClass of the shared GPUs (``device.allowMultipleAllocations == true``)."""
MEMORY_SLICES = 8
MAX_COUNTER_SETS_PER_SLICE = 8

MIG_PROFILES: tuple[tuple[str, int, int, tuple[int, ...], str, int], ...] = (
    # name, GPU-instance profile id, memory slices, start slices, memory, multiprocessors
    ("1g.10gb", 19, 1, (0, 1, 2, 3, 4, 5, 6), "9856Mi", 16),
    ("2g.20gb", 14, 2, (0, 2, 4), "19968Mi", 32),
    ("3g.40gb", 9, 4, (0, 4), "40192Mi", 60),
    ("4g.40gb", 5, 4, (0,), "40192Mi", 64),
    ("7g.80gb", 0, 8, (0,), "80384Mi", 132),
)
"""H100-80GB-like MIG profiles (close to what NVML reports, not exact)."""


@dataclass(frozen=True, slots=True)
class GpuShape:
    """What every GPU of a node looks like as a DRA device."""

    product: str = "NVIDIA H100 80GB HBM3"
    brand: str = "Nvidia"
    architecture: str = "Hopper"
    memory: str = "80Gi"
    cuda_compute_capability: str = "9.0.0"
    driver_version: str = "550.90.7"
    cuda_driver_version: str = "12.4.0"
    pcie_root: bool = True
    gpus_per_pcie_root: int = 2


def gpu_uuid(node: str, i: int) -> str:
    """A stable ``GPU-<uuid>`` for GPU ``i`` of ``node``."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/gpu-{i}"))


SHARE_MEMORY_MIN = "1Gi"
"""``validRange.min`` and ``step`` of a shared GPU's memory."""
SHARE_COMPUTE_VALUES = ("10", "25", "50", "100")
"""``validValues`` of a shared GPU's ``compute`` (percent of its SMs)."""
SHARE_COMPUTE_DEFAULT = "10"


def _device(
    version: str,
    name: str,
    attributes: Mapping[str, Any],
    capacity: Mapping[str, str],
    consumes: list[dict[str, Any]] | None = None,
    policies: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "attributes": dict(attributes),
        "capacity": {
            k: {
                "value": v,
                **({"requestPolicy": dict(policies[k])} if policies and k in policies else {}),
            }
            for k, v in capacity.items()
        },
    }
    if policies is not None:
        body["allowMultipleAllocations"] = True
    if consumes:
        body["consumesCounters"] = consumes
    return {"name": name, "basic": body} if version == "v1beta1" else {"name": name, **body}


def gpu_attributes(node: str, i: int, shape: GpuShape) -> dict[str, Any]:
    """The attributes of full GPU ``i`` of ``node``."""
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"},
        "index": {"int": i},
        "minor": {"int": i},
        "uuid": {"string": gpu_uuid(node, i)},
        "productName": {"string": shape.product},
        "brand": {"string": shape.brand},
        "architecture": {"string": shape.architecture},
        "cudaComputeCapability": {"version": shape.cuda_compute_capability},
        "driverVersion": {"version": shape.driver_version},
        "cudaDriverVersion": {"version": shape.cuda_driver_version},
    }
    if shape.pcie_root:
        root = i // max(1, shape.gpus_per_pcie_root)
        attrs["pcieBusID"] = {"string": f"0000:{0x18 + 0x10 * i:02x}:00.0"}
        attrs["resource.kubernetes.io/pcieRoot"] = {"string": f"pci0000:{0x10 * (root + 1):02x}"}
    return attrs


def _counters(memory: str, slices: range) -> dict[str, Any]:
    out = {"memory": {"value": memory}}
    out.update({f"memory-slice-{k}": {"value": "1"} for k in slices})
    return out


def _gpu_device(
    version: str, node: str, i: int, shape: GpuShape, counter_set: str | None = None
) -> dict[str, Any]:
    consumes = None
    if counter_set:
        consumes = [
            {"counterSet": counter_set, "counters": _counters(shape.memory, range(MEMORY_SLICES))}
        ]
    return _device(
        version, f"gpu-{i}", gpu_attributes(node, i, shape), {"memory": shape.memory}, consumes
    )


def shared_gpu_device(version: str, node: str, i: int, shape: GpuShape) -> dict[str, Any]:
    """Full GPU ``i`` of ``node`` as a shared device (consumable capacity: see the module
    docstring)."""
    policies = {
        "memory": {
            "default": shape.memory,
            "validRange": {"min": SHARE_MEMORY_MIN, "step": SHARE_MEMORY_MIN},
        },
        "compute": {"default": SHARE_COMPUTE_DEFAULT, "validValues": list(SHARE_COMPUTE_VALUES)},
    }
    return _device(
        version,
        f"gpu-{i}",
        gpu_attributes(node, i, shape),
        {"memory": shape.memory, "compute": "100"},
        None,
        policies,
    )


def mig_devices(
    version: str, node: str, i: int, shape: GpuShape, counter_set: str
) -> list[dict[str, Any]]:
    """The MIG-like devices of partitionable GPU ``i``, one per profile and placement."""
    parent = gpu_attributes(node, i, shape)
    out = []
    for prof, gi, size, starts, mem, sms in MIG_PROFILES:
        for start in starts:
            name = f"gpu-{i}-mig-{prof.replace('.', '')}-{gi}-{start}"
            attrs = {k: v for k, v in parent.items() if k not in ("index", "minor", "uuid", "type")}
            attrs.update(
                type={"string": "mig"},
                profile={"string": prof},
                parentIndex={"int": i},
                parentUUID=parent["uuid"],
                uuid={"string": "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{name}"))},
            )
            consumes = [
                {"counterSet": counter_set, "counters": _counters(mem, range(start, start + size))}
            ]
            out.append(
                _device(
                    version, name, attrs, {"memory": mem, "multiprocessors": str(sms)}, consumes
                )
            )
    return out


def node_slices(
    node: str,
    version: str,
    *,
    gpus: int = 8,
    shape: GpuShape = GpuShape(),
    mig: int = 0,
    separate_counters: bool = False,
    driver: str = DRIVER,
    shared: int = 0,
) -> list[dict[str, Any]]:
    """The ResourceSlice objects of one node (counter slices first), ready to POST:
    ``apiVersion``, ``kind``, ``metadata`` (name, managed-by label), ``spec`` with the pool
    (name = node, generation 1, ``resourceSliceCount``). ``shared``: GPUs after the
    partitionable ones published as shared devices (:func:`shared_gpu_device`)."""
    base = f"{node}-{driver}"
    mig = max(0, min(mig, gpus))
    shared = max(0, min(shared, gpus - mig))

    def full(i: int) -> dict[str, Any]:
        if mig <= i < mig + shared:
            return shared_gpu_device(version, node, i, shape)
        return _gpu_device(version, node, i, shape)

    specs: list[tuple[str, dict[str, Any]]] = []
    if mig == 0:
        devs = [full(i) for i in range(gpus)]
        specs.append((base, {"devices": devs}))
    else:
        sets = [
            {
                "name": f"gpu-{i}-counter-set",
                "counters": _counters(shape.memory, range(MEMORY_SLICES)),
            }
            for i in range(mig)
        ]
        if separate_counters:
            for j in range(0, mig, MAX_COUNTER_SETS_PER_SLICE):
                name = f"{base}-counters-{j // MAX_COUNTER_SETS_PER_SLICE}"
                specs.append((name, {"sharedCounters": sets[j : j + MAX_COUNTER_SETS_PER_SLICE]}))
        for i in range(mig):
            cs = sets[i]["name"]
            spec: dict[str, Any] = {
                "devices": [_gpu_device(version, node, i, shape, cs)]
                + mig_devices(version, node, i, shape, cs)
            }
            if not separate_counters:
                spec["sharedCounters"] = [sets[i]]
            specs.append((f"{base}-gpu-{i}", spec))
        if gpus > mig:
            devs = [full(i) for i in range(mig, gpus)]
            specs.append((f"{base}-rest", {"devices": devs}))
    out = []
    for name, spec in specs:
        out.append(
            {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceSlice",
                "metadata": {"name": name, "labels": {MANAGED_LABEL: MANAGED_BY}},
                "spec": {
                    **spec,
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"generation": 1, "name": node, "resourceSliceCount": len(specs)},
                },
            }
        )
    return out


def device_class(
    version: str,
    name: str = DRIVER,
    kind: str = "gpu",
    driver: str = DRIVER,
    shared: bool = False,
) -> dict[str, Any]:
    """The DeviceClass that selects ``driver``'s devices of ``type`` ``kind`` (the NVIDIA
    chart's CEL selector); ``shared``: only shared devices (consumable capacity)."""
    expr = f"device.driver == '{driver}' && device.attributes['{driver}'].type == '{kind}'"
    if shared:
        expr += " && device.allowMultipleAllocations == true"
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {MANAGED_LABEL: MANAGED_BY}},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def served_versions(api: Any) -> list[str]:
    """The ``resource.k8s.io`` versions ``api`` serves (discovery; empty: no DRA)."""
    for g in (api.get("/apis") or {}).get("groups") or []:
        if g.get("name") == GROUP:
            return [v["version"] for v in g.get("versions") or []]
    return []


class PublishError(RuntimeError):
    """The API server refused or altered an object the publisher wrote."""


def _upsert(api: Any, version: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    base = f"/apis/{GROUP}/{version}/{plural}"
    got = api.call("POST", base, body, ok=(409,))
    if got is not None:
        return dict(got)
    name = body["metadata"]["name"]
    cur = api.get(f"{base}/{name}")
    body = {
        **body,
        "metadata": {**body["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]},
    }
    if plural == "resourceslices":  # a driver bumps the pool generation on every change
        gen = int((cur["spec"].get("pool") or {}).get("generation", 0)) + 1
        body["spec"] = {**body["spec"], "pool": {**body["spec"]["pool"], "generation": gen}}
    return dict(api.call("PUT", f"{base}/{name}", body))


def publish(
    api: Any,
    server_version: Version,
    nodes: Sequence[str],
    *,
    gpus: int = 8,
    shape: GpuShape = GpuShape(),
    mig: int = 0,
    device_classes: bool = True,
    shared: int = 0,
) -> str:
    """Write the DeviceClass(es) and every node's slices through ``api`` (a
    :class:`benchmarks.live.kubeapi.Api`); slices of an earlier layout of those nodes are
    deleted. Returns the ``resource.k8s.io`` version written. ``shared``: shared GPUs per
    node (consumable capacity, :func:`node_slices`).

    Raises:
        PublishError: the server serves no DRA, dropped the counters of a partitionable
            slice (``DRAPartitionableDevices`` off; that slice is deleted again), or
            ``shared`` is asked of a server without consumable capacity (v1beta1 only, or
            ``DRAConsumableCapacity`` off: the server drops ``allowMultipleAllocations``).
    """
    served = served_versions(api)
    if not served:
        raise PublishError(
            "the API server does not serve resource.k8s.io: start the plane with DRA "
            "(Kubernetes >= 1.32)"
        )
    version = slice_api_version(server_version, served)
    if shared and version == "v1beta1":
        raise PublishError(
            "shared devices (consumable capacity) need resource.k8s.io v1beta2 or v1: "
            f"this server writes {version}"
        )
    if device_classes:
        _upsert(api, version, "deviceclasses", device_class(version))
        if mig:
            _upsert(api, version, "deviceclasses", device_class(version, MIG_CLASS, "mig"))
        if shared:
            body = device_class(version, SHARED_CLASS, shared=True)
            _upsert(api, version, "deviceclasses", body)
    separate = separate_counter_slices(server_version)
    base = f"/apis/{GROUP}/{version}/resourceslices"
    mine = api.get(base, labelSelector=f"{MANAGED_LABEL}={MANAGED_BY}").get("items") or []
    for node in nodes:
        wanted = node_slices(
            node,
            version,
            gpus=gpus,
            shape=shape,
            mig=mig,
            separate_counters=separate,
            shared=shared,
        )
        names = {s["metadata"]["name"] for s in wanted}
        for old in mine:
            if old["spec"].get("nodeName") == node and old["metadata"]["name"] not in names:
                api.call("DELETE", f"{base}/{old['metadata']['name']}", ok=(404,))
        for body in wanted:
            got = _upsert(api, version, "resourceslices", body)
            if _shares(body) and not _shares(got):
                api.call("DELETE", f"{base}/{body['metadata']['name']}", ok=(404,))
                raise PublishError(
                    f"kube-apiserver dropped allowMultipleAllocations of "
                    f"{body['metadata']['name']}: turn the DRAConsumableCapacity feature gate "
                    "on (kube-apiserver and kube-scheduler) or publish without shared GPUs"
                )
            if body["spec"].get("sharedCounters") and not got["spec"].get("sharedCounters"):
                api.call("DELETE", f"{base}/{body['metadata']['name']}", ok=(404,))
                raise PublishError(
                    f"kube-apiserver dropped the shared counters of {body['metadata']['name']}: "
                    "turn the DRAPartitionableDevices feature gate on (kube-apiserver and "
                    "kube-scheduler) or publish without partitions"
                )
    return version


def _shares(body: Mapping[str, Any]) -> bool:
    """Whether a slice has a shared device (``allowMultipleAllocations``)."""
    return any(d.get("allowMultipleAllocations") is True for d in body["spec"].get("devices") or ())


def delete_slices(api: Any, version: str, nodes: Sequence[str]) -> int:
    """Delete the slices this harness published for ``nodes``; how many."""
    base = f"/apis/{GROUP}/{version}/resourceslices"
    n = 0
    for sl in api.get(base, labelSelector=f"{MANAGED_LABEL}={MANAGED_BY}").get("items") or []:
        if sl["spec"].get("nodeName") in nodes:
            api.call("DELETE", f"{base}/{sl['metadata']['name']}", ok=(404,))
            n += 1
    return n
