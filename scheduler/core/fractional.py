"""Fractional GPUs in the live model: inventory, requests, the per-GPU ledger, placement and
the hand-off formats of the node-side backends.

One ledger. ``NodeInfo.share_used`` holds, per GPU, the memory (MiB), compute (milli of the
device's SMs) and task count of the fractional pods on it, next to the whole-GPU
``used_mask`` (a GPU holding a share is also in ``used_mask``, so whole-GPU pods and gangs
never get it, and a share never goes on a GPU held whole). The snapshot transitions
(``snapshot.with_pod`` / ``without_pod``) keep both, and refuse any overcommit.

One policy code path. A fractional pod is scored by a registered sharing policy
(``scheduler.core.policies.sharing_policies``; ``topoplace-share`` by default, ``sharing.policy`` in
``policy.yaml``) on a :class:`~scheduler.core.sharing.SharingClusterView` projected from the
ledger, and :func:`place_on_view` picks host and device exactly as the offline simulator does
(``benchmarks.engine.placers.SharingPlacement`` calls the same function).

The projection (documented in ``docs/fractional.md``): FGD measures one dimension, milli-GPU.
A GPU's free share is ``min(free compute, free memory)`` as per mille of the device and a
request's share is ``max(compute, memory)`` per mille (rounded up); feasibility itself is
always the exact two-dimensional check (:func:`device_fits`), and a device whose projected
free share disagrees with it is clamped just above / below the request, so FGD never picks a
device that does not fit and never skips one that does. For the openb traces (no memory
dimension) the projection is the identity.

Backends (the formats are HAMi's and gpushare's own, see ``../shared/SIGNALS.md``):

* ``hami``: inventory from ``hami.io/node-nvidia-register`` (JSON list, or the older
  ``UUID,count,devmem,devcore,type,numa,health[,index,mode]:`` text); requests
  ``nvidia.com/gpu`` + ``nvidia.com/gpumem`` / ``gpumem-percentage`` / ``gpucores``;
  hand-off ``hami.io/vgpu-devices-allocated`` etc. (:func:`hami_annotations`).
* ``gpushare``: inventory from the node's ``aliyun.com/gpu-mem`` / ``aliyun.com/gpu-count``
  capacity; requests ``aliyun.com/gpu-mem``; hand-off ``ALIYUN_COM_GPU_MEM_*``.
* KAI / Run:ai ``gpu-fraction`` / ``gpu-memory`` pods are only counted (KAI's binder hands
  them their GPU).

Pure: no I/O, no clock (bind times are passed in), inputs never mutated. Every number read
from an object goes through ``quantity.parse_quantity_int`` (bounded cost, range-checked);
malformed input raises :class:`ShareError` with a constant-prefixed message.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from scheduler.core.model import (
    EMPTY_MAP,
    MAX_NODE_GPUS,
    PLACEMENT_ANNOTATION,
    GpuDevice,
    GpuShare,
    NodeInfo,
    PodInfo,
)
from scheduler.core.params import SharingParams
from scheduler.core.policies.sharing_policies import (
    NO_GPU,
    SharingContext,
    SharingPolicy,
    SharingScores,
    get_sharing_policy,
    select_host,
)
from scheduler.core.quantity import QuantityError, parse_quantity_int
from scheduler.core.sharing import (
    MILLI,
    FragmentationModel,
    SharingClusterView,
    SharingTask,
    TaskShape,
    TypicalDistribution,
    allocate,
    typical_from_counts,
)

# ---- keys ---------------------------------------------------------------------------------

HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_NODE = "hami.io/vgpu-node"
HAMI_TIME = "hami.io/vgpu-time"
HAMI_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_BIND_PHASE = "hami.io/bind-phase"
HAMI_BIND_TIME = "hami.io/bind-time"
HAMI_LOCK = "hami.io/mutex.lock"
HAMI_TYPE = "NVIDIA"
"""Device type HAMi writes in a container's device entry (``NvidiaGPUDevice``)."""
HAMI_MEM = "nvidia.com/gpumem"
HAMI_MEM_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_USE_TYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
GPU_COUNT = "nvidia.com/gpu"

ALIYUN_MEM = "aliyun.com/gpu-mem"
ALIYUN_COUNT = "aliyun.com/gpu-count"
ALIYUN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ALIYUN_POD = "ALIYUN_COM_GPU_MEM_POD"
ALIYUN_DEV = "ALIYUN_COM_GPU_MEM_DEV"
ALIYUN_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ALIYUN_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"

SHARE_RECORD_KEYS = (HAMI_ALLOCATED, HAMI_TO_ALLOCATE, ALIYUN_IDX)
"""Pod annotations that record where a fractional pod's shares sit."""

KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_NUM_DEVICES = "gpu-fraction-num-devices"

GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_PRODUCT = "nvidia.com/gpu.product"

BACKEND_HAMI = "hami"
BACKEND_GPUSHARE = "gpushare"
FORM_KAI = "kai"

MAX_REGISTER_CHARS = 65536
"""Longest ``hami.io/node-nvidia-register`` value read (64 GPUs of JSON fit in ~10 KiB)."""
MAX_ALLOCATION_CHARS = 16384
MAX_SELECTOR_CHARS = 4096
MAX_DEVICE_MEMORY_MIB = 1 << 31
MAX_CONTAINERS = 64

# ---- constant reasons (filter replies aggregate them) ---------------------------------------

REASON_NO_BACKEND = "node has no GPU-sharing backend for this request"
REASON_NO_SHARE_ROOM = "not enough free GPU memory or compute on any GPU"
REASON_TOO_MANY_DEVICES = "pod asks for more shared GPUs than the node has"
REASON_TENANTS = "every GPU with room already holds the right-sizer's most tenants per GPU"
REASON_COMPUTE_P95 = (
    "every GPU with room would exceed the right-sizer's compute limit at its tenants' p95"
)

RIGHTSIZE_ANNOTATION = "topoplace.io/rightsize"
"""The right-sizer's note on a pod (JSON, written by its admission webhook): the size it
applied and, for placement, the workload's measured compute p95 and its policy's tenancy
limits (:func:`tenant_limits`)."""
MAX_NOTE_CHARS = 8192


class ShareError(ValueError):
    """A fractional request or a backend annotation is malformed (refused, never a crash)."""


# ---- small readers --------------------------------------------------------------------------


def _int(value: Any, where: str, low: int = 0, high: int = MAX_DEVICE_MEMORY_MIB) -> int:
    try:
        return parse_quantity_int(value, low=low, high=high, whole=True)
    except QuantityError as exc:
        raise ShareError(f"{where}: {exc.reason}") from None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else EMPTY_MAP


def _list_of_words(text: str, where: str) -> tuple[str, ...]:
    if len(text) > MAX_SELECTOR_CHARS:
        raise ShareError(f"{where}: too long")
    return tuple(w.strip() for w in text.split(",") if w.strip())


# ---- inventory ------------------------------------------------------------------------------


def _assign_indices(devs: list[dict[str, Any]]) -> tuple[GpuDevice, ...]:
    """Devices with their published index when those are distinct and in range, else by
    position (HAMi omits ``index`` 0 in JSON and older registers carry none)."""
    n = len(devs)
    idx = [d["index"] for d in devs]
    if len(set(idx)) != n or any(i >= n for i in idx):
        idx = list(range(n))
    out = [
        GpuDevice(index=i, **{k: v for k, v in d.items() if k != "index"})
        for i, d in zip(idx, devs, strict=True)
    ]
    return tuple(sorted(out, key=lambda d: d.index))


def hami_devices(text: Any) -> tuple[GpuDevice, ...]:
    """The GPUs of a ``hami.io/node-nvidia-register`` value, in index order.

    A pure function of the string, kept for the last :data:`HAMI_REGISTER_MEMO` values
    (the devices are frozen): a node's object is read again on every update (the watch's
    ``MODIFIED`` events, HAMi's node lock taken and released at each bind among them) and
    its register, unchanged, was parsed twice each time (the GPU count, the inventory).

    Both of HAMi's encodings are read: the JSON list (``MarshalNodeDevices``: keys ``id``,
    ``index``, ``count``, ``devmem``, ``devcore``, ``type``, ``numa``, ``mode``, ``health``;
    Go's ``omitempty`` drops zero values, so a missing ``health`` is false and a missing
    ``index`` is 0) and the older text (``EncodeNodeDevices``:
    ``UUID,count,devmem,devcore,type,numa,health[,index,mode]:`` per device).

    Raises:
        ShareError: not a string, too long, malformed, a number out of range, no device,
            or more than ``MAX_NODE_GPUS`` devices.
    """
    if not isinstance(text, str):
        raise ShareError(f"{HAMI_REGISTER}: not a string")
    return _hami_devices(text)


HAMI_REGISTER_MEMO = 4096
"""Distinct ``hami.io/node-nvidia-register`` values whose devices are kept (one a node)."""


@functools.lru_cache(maxsize=HAMI_REGISTER_MEMO)
def _hami_devices(text: str) -> tuple[GpuDevice, ...]:
    """:func:`hami_devices` of a string (errors are raised again on each call: not kept)."""
    if len(text) > MAX_REGISTER_CHARS:
        raise ShareError(f"{HAMI_REGISTER}: too long")
    t = text.strip()
    devs: list[dict[str, Any]] = []
    if t.startswith("["):
        try:
            items = orjson.loads(t)
        except orjson.JSONDecodeError:
            raise ShareError(f"{HAMI_REGISTER}: not JSON") from None
        if not isinstance(items, list):
            raise ShareError(f"{HAMI_REGISTER}: not a list")
        for it in items:
            if not isinstance(it, Mapping):
                raise ShareError(f"{HAMI_REGISTER}: entries must be objects")
            health = it.get("health", False)
            uuid, typ, mode = it.get("id", ""), it.get("type", ""), it.get("mode", "")
            if not isinstance(health, bool) or not all(
                isinstance(x, str) and len(x) <= 256 for x in (uuid, typ, mode)
            ):
                raise ShareError(f"{HAMI_REGISTER}: malformed device")
            devs.append(
                {
                    "index": _int(it.get("index", 0), "index", high=MAX_NODE_GPUS - 1),
                    "uuid": uuid,
                    "type": typ,
                    "memory_mib": _int(it.get("devmem", 0), "devmem"),
                    "cores": _int(it.get("devcore", 0), "devcore", high=10_000),
                    "split": _int(it.get("count", 0), "count", high=1 << 16),
                    "numa": _int(it.get("numa", 0), "numa", low=-1, high=1 << 16),
                    "healthy": health and mode != "mig",
                }
            )
    else:
        for seg in t.split(":"):
            if not seg:
                continue
            items = seg.split(",")
            if len(items) not in (7, 9):
                raise ShareError(f"{HAMI_REGISTER}: unexpected field count")
            health = items[6].strip().lower()
            if health not in ("true", "false", "1", "0", "t", "f"):
                raise ShareError(f"{HAMI_REGISTER}: health must be a boolean")
            mode = items[8] if len(items) == 9 else "hami-core"
            devs.append(
                {
                    "index": _int(items[7], "index", high=MAX_NODE_GPUS - 1)
                    if len(items) == 9
                    else len(devs),
                    "uuid": items[0][:256],
                    "type": items[4][:256],
                    "memory_mib": _int(items[2], "devmem"),
                    "cores": _int(items[3], "devcore", high=10_000),
                    "split": _int(items[1], "count", high=1 << 16),
                    "numa": _int(items[5], "numa", low=-1, high=1 << 16),
                    "healthy": health in ("true", "1", "t") and mode != "mig",
                }
            )
    if not devs:
        raise ShareError(f"{HAMI_REGISTER}: no device")
    if len(devs) > MAX_NODE_GPUS:
        raise ShareError(f"{HAMI_REGISTER}: more than {MAX_NODE_GPUS} devices")
    return _assign_indices(devs)


def node_inventory(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    capacity: Mapping[str, Any],
    gpu_count: int,
    params: SharingParams,
) -> tuple[str, tuple[GpuDevice, ...]]:
    """(backend, devices) of a node from what it publishes.

    HAMi's register wins when present (``hami``); else gpushare capacity
    (``aliyun.com/gpu-mem`` over ``aliyun.com/gpu-count`` GPUs: ``gpushare``); else GFD labels
    (``nvidia.com/gpu.memory``, product; no backend: the node's GPUs are counted for
    accounting only). ``sharing.backend_label`` on the node overrides the backend (``none``
    disables it); a backend not in ``sharing.backends`` is dropped.

    Raises:
        ShareError: a published inventory is malformed.
    """
    backend = ""
    devices: tuple[GpuDevice, ...] = ()
    if HAMI_REGISTER in annotations:
        devices = hami_devices(annotations[HAMI_REGISTER])
        backend = BACKEND_HAMI
    elif capacity.get(ALIYUN_MEM) is not None:
        total = _int(capacity.get(ALIYUN_MEM), f"capacity {ALIYUN_MEM}", high=1 << 40)
        count = capacity.get(ALIYUN_COUNT)
        n = _int(count, f"capacity {ALIYUN_COUNT}", high=MAX_NODE_GPUS) if count else gpu_count
        if n > 0:
            per = total // n * params.gpushare_memory_unit_mib
            devices = tuple(
                GpuDevice(index=i, memory_mib=min(per, MAX_DEVICE_MEMORY_MIB)) for i in range(n)
            )
            backend = BACKEND_GPUSHARE
    elif gpu_count > 0:
        mem = labels.get(GFD_MEMORY)
        mib = 0
        if mem:
            try:
                mib = parse_quantity_int(mem, high=MAX_DEVICE_MEMORY_MIB, whole=True)
            except QuantityError:
                mib = 0
        product = labels.get(GFD_PRODUCT, "")[:256]
        devices = tuple(GpuDevice(index=i, type=product, memory_mib=mib) for i in range(gpu_count))
    forced = labels.get(params.backend_label, "") if params.backend_label else ""
    if forced in (BACKEND_HAMI, BACKEND_GPUSHARE):
        backend = forced if devices else ""
    elif forced == "none":
        backend = ""
    if backend and backend not in params.backends:
        backend = ""
    return backend, devices


# ---- what the right-sizer learned ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What the right-sizer says of a pod's workload, for co-location (milli of a GPU).

    Attributes:
        p95_milli: the workload's measured compute p95 (None: not measured).
        max_tenants: its policy's most tenants on one GPU (0: no bound).
        limit_milli: its policy's compute limit for one GPU's tenants together, each at
            its p95 (0: no bound).
    """

    p95_milli: int | None = None
    max_tenants: int = 0
    limit_milli: int = 0


def _ratio_milli(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 <= value <= 64:  # a ratio of one GPU (a limit may exceed 1: oversubscription)
        return None
    return int(-(-round(value * 1_000_000) // 1000))  # milli, rounded up


def tenant_limits(annotations: Mapping[str, Any]) -> TenantLimits | None:
    """The right-sizer's limits a pod carries (``topoplace.io/rightsize``), or None.

    Read from the note's ``compute_p95`` (else ``gpu_compute_ratio``, the compute share
    it sized from the p95 with its margin: an upper bound), ``max_tenants_per_gpu`` and
    ``gpu_compute_limit`` (ratios of one GPU). Lenient: a note that is not JSON, or a
    value out of range, counts as absent (the pod is admitted already)."""
    text = annotations.get(RIGHTSIZE_ANNOTATION)
    if not isinstance(text, str) or len(text) > MAX_NOTE_CHARS:
        return None
    try:
        note = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(note, Mapping):
        return None
    p95 = _ratio_milli(note.get("compute_p95"))
    if p95 is None:
        p95 = _ratio_milli(note.get("gpu_compute_ratio"))
    tenants = note.get("max_tenants_per_gpu")
    if isinstance(tenants, bool) or not isinstance(tenants, int) or not 1 <= tenants <= 1 << 16:
        tenants = 0
    limit = _ratio_milli(note.get("gpu_compute_limit")) or 0
    if p95 is None and not tenants and not limit:
        return None
    return TenantLimits(p95, tenants, limit)


GpuTenancy = tuple[int, int, int]
"""One GPU's tenants as the right-sizer sees them: (their compute p95 summed, milli; the
least ``max_tenants`` among them, 0: none; the least ``limit_milli``, 0: none). A tenant
without a measured p95 counts its compute share (what it may use)."""
NodeTenancy = tuple[GpuTenancy, ...]
"""Per GPU index of a node (GPUs without tenants: ``(0, 0, 0)``)."""
NO_TENANCY: GpuTenancy = (0, 0, 0)


def node_tenancy(node: NodeInfo, pods: Iterable[PodInfo]) -> NodeTenancy:
    """The tenancy of ``node``'s GPUs from the share pods on it (``pods``: those whose
    ``node`` is this node; others are skipped)."""
    out = [list(NO_TENANCY) for _ in range(node.gpu_capacity)]
    for p in pods:
        if p.node != node.name or not p.shares:
            continue
        lim = tenant_limits(_map(_map(p.raw.get("metadata")).get("annotations")))
        for sh in p.shares:
            if not 0 <= sh.gpu < node.gpu_capacity:
                continue
            t = out[sh.gpu]
            t[0] += lim.p95_milli if lim is not None and lim.p95_milli is not None else sh.milli
            if lim is not None and lim.max_tenants:
                t[1] = min(t[1], lim.max_tenants) if t[1] else lim.max_tenants
            if lim is not None and lim.limit_milli:
                t[2] = min(t[2], lim.limit_milli) if t[2] else lim.limit_milli
    return tuple((a, b, c) for a, b, c in out)


def tenancy_binds(tenancy: NodeTenancy | None, limits: TenantLimits | None) -> bool:
    """Whether the right-sizer's limits can refuse anything on a node with ``tenancy``
    (its GPUs') for a request with ``limits``: a tenant count or a compute limit is set on
    one side or the other. When not, :func:`tenancy_refusal` allows every tenant there, and
    a node's placement is the same with its tenancy or without (no check needed)."""
    if tenancy is None:
        return False
    if limits is not None and (limits.max_tenants > 0 or limits.limit_milli > 0):
        return True
    return any(t[1] > 0 or t[2] > 0 for t in tenancy)


def tenancy_refusal(
    tasks: int, gpu: GpuTenancy, limits: TenantLimits | None, share_milli: int
) -> str:
    """Why the right-sizer's limits refuse one more tenant (``limits``, taking
    ``share_milli`` of compute) on a GPU that holds ``tasks`` shares with tenancy ``gpu``
    ("" when they allow it). A pod alone on a GPU is never refused (the limits are about
    co-location); otherwise every tenant's policy holds, the newcomer's included: at most
    the least ``max_tenants`` of them, and their compute p95 together within the least
    ``limit_milli``."""
    if tasks <= 0:
        return ""
    caps = [c for c in (gpu[1], limits.max_tenants if limits else 0) if c > 0]
    if caps and tasks + 1 > min(caps):
        return REASON_TENANTS
    lims = [c for c in (gpu[2], limits.limit_milli if limits else 0) if c > 0]
    if lims:
        own = limits.p95_milli if limits is not None and limits.p95_milli is not None else None
        if gpu[0] + (share_milli if own is None else own) > min(lims):
            return REASON_COMPUTE_P95
    return ""


# ---- requests -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """What one container asks per device: ``count`` devices, each with ``memory_mib``
    (0: ``memory_percent`` of the device) and ``cores`` percent of its SMs."""

    count: int
    memory_mib: int = 0
    memory_percent: int = 0
    cores: int = 0


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """A fractional pod's request.

    Attributes:
        form: ``hami``, ``gpushare`` (both placed and handed off by topoplace) or ``kai``
            (accounting only).
        containers: one :class:`ContainerAsk` per ``spec.containers`` entry (count 0 for
            containers without GPUs), in order: HAMi's hand-off keeps the positions.
        cpu_milli: CPU request of the pod (FGD's measure uses it).
        use_types / nouse_types / use_uuids / nouse_uuids: HAMi's device selectors.
        units: gpushare: ``aliyun.com/gpu-mem`` units requested (written back as
            ``ALIYUN_COM_GPU_MEM_POD``).
        limits: what the right-sizer says of the pod's workload (:func:`tenant_limits`),
            or None.
    """

    form: str
    containers: tuple[ContainerAsk, ...]
    cpu_milli: int = 0
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    units: int = 0
    limits: TenantLimits | None = None

    @property
    def devices(self) -> int:
        """Devices asked over all containers."""
        return sum(c.count for c in self.containers)


def _resource(container: Mapping[str, Any], name: str) -> Any:
    """A container's value of an extended resource: limits first, then requests (HAMi)."""
    res = _map(container.get("resources"))
    v = _map(res.get("limits")).get(name)
    return _map(res.get("requests")).get(name) if v is None else v


SHARE_RESOURCES = (HAMI_MEM, HAMI_MEM_PERCENT, HAMI_CORES, ALIYUN_MEM)


def is_share_pod(pod: Mapping[str, Any]) -> bool:
    """Cheap test (a few dict lookups per container): does the pod ask for a GPU share in a
    form topoplace places (HAMi memory/cores, gpushare memory)? The whole-GPU path is not
    slowed: only pods that carry such a resource take the fractional branch."""
    spec = _map(_map(pod).get("spec"))
    items = spec.get("containers")
    if not isinstance(items, list):
        return False
    for c in items[:MAX_CONTAINERS]:
        if not isinstance(c, Mapping):
            continue
        res = _map(c.get("resources"))
        lim, req = _map(res.get("limits")), _map(res.get("requests"))
        for k in SHARE_RESOURCES:
            if k in lim or k in req:
                return True
    return False


def share_request(
    pod: Mapping[str, Any], cpu_milli: int = 0, params: SharingParams | None = None
) -> ShareRequest | None:
    """The pod's fractional request, or None when it asks for no share.

    HAMi (``nvidia.com/gpumem``, ``gpumem-percentage``, ``gpucores`` with ``nvidia.com/gpu``;
    a container with a share resource and no count asks for 1 device, as HAMi's webhook
    sets; no memory given means 100 % of the device, HAMi's default) or gpushare
    (``aliyun.com/gpu-mem`` summed over containers, one GPU). Every value is a bounded,
    whole number: memory ``0..2^31`` MiB, percentages ``0..100``, counts
    ``0..MAX_NODE_GPUS``.

    Raises:
        ShareError: malformed containers or values, both forms at once, or a gpushare
            request for more than one GPU.
    """
    params = params or SharingParams()
    spec = _map(_map(pod).get("spec"))
    items = spec.get("containers")
    if not isinstance(items, list) or not is_share_pod(pod):
        return None
    if len(items) > MAX_CONTAINERS:
        raise ShareError("too many containers")
    ann = _map(_map(_map(pod).get("metadata")).get("annotations"))
    hami, units, asks = False, 0, []
    for c in items:
        if not isinstance(c, Mapping):
            raise ShareError("spec.containers entries must be objects")
        mem, pct, cores = (_resource(c, k) for k in (HAMI_MEM, HAMI_MEM_PERCENT, HAMI_CORES))
        ali = _resource(c, ALIYUN_MEM)
        count_raw = _resource(c, GPU_COUNT)
        count = 0 if count_raw is None else _int(count_raw, GPU_COUNT, high=MAX_NODE_GPUS)
        if ali is not None:
            units += _int(ali, ALIYUN_MEM, low=0, high=MAX_DEVICE_MEMORY_MIB)
        if mem is None and pct is None and cores is None:
            asks.append(ContainerAsk(count))
            continue
        hami = True
        m = 0 if mem is None else _int(mem, HAMI_MEM)
        p = 0 if pct is None else _int(pct, HAMI_MEM_PERCENT, high=100)
        if m == 0 and p == 0:
            p = 100
        asks.append(
            ContainerAsk(
                count or 1, m, p, 0 if cores is None else _int(cores, HAMI_CORES, high=100)
            )
        )
    if hami and units:
        raise ShareError("pod asks for both HAMi and gpushare shares")
    selectors: dict[str, tuple[str, ...]] = {}
    for key, field_ in (
        (HAMI_USE_TYPE, "use_types"),
        (HAMI_NOUSE_TYPE, "nouse_types"),
        (HAMI_USE_UUID, "use_uuids"),
        (HAMI_NOUSE_UUID, "nouse_uuids"),
    ):
        v = ann.get(key)
        if v is not None:
            if not isinstance(v, str):
                raise ShareError(f"{key}: not a string")
            selectors[field_] = _list_of_words(v, key)
    limits = tenant_limits(ann)
    if hami:
        return ShareRequest(BACKEND_HAMI, tuple(asks), cpu_milli, **selectors, limits=limits)
    if units <= 0:
        return None
    n = 1
    for c in items:
        v = _resource(c, ALIYUN_COUNT)
        if v is not None:
            n = max(n, _int(v, ALIYUN_COUNT, high=MAX_NODE_GPUS))
    if n != 1:
        raise ShareError("gpushare shares one GPU per pod (aliyun.com/gpu-count must be 1)")
    mib = units * params.gpushare_memory_unit_mib
    if mib > MAX_DEVICE_MEMORY_MIB:
        raise ShareError(f"{ALIYUN_MEM}: out of range")
    first = next(
        i for i, c in enumerate(items) if isinstance(c, Mapping) and _resource(c, ALIYUN_MEM)
    )
    containers = tuple(
        ContainerAsk(1, mib, 0, 0) if i == first else ContainerAsk(0) for i in range(len(items))
    )
    return ShareRequest(BACKEND_GPUSHARE, containers, cpu_milli, units=units, limits=limits)


def kai_request(pod: Mapping[str, Any]) -> ShareRequest | None:
    """A KAI / Run:ai fractional pod (``gpu-fraction`` or ``gpu-memory`` annotations), for
    accounting only: KAI's own binder, not topoplace, hands such pods their GPU. Lenient
    (the pod is already admitted): unreadable values count as absent."""
    ann = _map(_map(_map(pod).get("metadata")).get("annotations"))
    frac, mem = ann.get(KAI_FRACTION), ann.get(KAI_MEMORY)
    if frac is None and mem is None:
        return None
    n = 1
    try:
        if ann.get(KAI_NUM_DEVICES) is not None:
            n = max(1, _int(ann.get(KAI_NUM_DEVICES), KAI_NUM_DEVICES, high=MAX_NODE_GPUS))
        if mem is not None:
            return ShareRequest(FORM_KAI, (ContainerAsk(n, _int(mem, KAI_MEMORY)),))
        pct = parse_quantity_int(frac, scale10=2, low=0, high=100)  # rounds up to a percent
    except (ShareError, QuantityError):
        return None
    return ShareRequest(FORM_KAI, (ContainerAsk(n, 0, pct, pct),)) if pct else None


# ---- the ledger -----------------------------------------------------------------------------


def node_devices(node: NodeInfo) -> tuple[GpuDevice, ...]:
    """The node's per-GPU inventory, one entry per GPU index (memory 0 where unknown)."""
    if len(node.devices) == node.gpu_capacity:
        return node.devices
    known = {d.index: d for d in node.devices}
    return tuple(known.get(i, GpuDevice(index=i)) for i in range(node.gpu_capacity))


def usage_of(node: NodeInfo, gpu: int) -> tuple[int, int, int]:
    """(memory MiB, compute milli, tasks) held by shares on ``gpu``."""
    return node.share_used[gpu] if gpu < len(node.share_used) else (0, 0, 0)


def milli_capacity(dev: GpuDevice) -> int:
    """Compute of a device in milli units (HAMi ``devcore`` percent x 10; 1000 if unset)."""
    return dev.cores * 10 if dev.cores > 0 else MILLI


def resolve(ask: ContainerAsk, dev: GpuDevice) -> GpuShare:
    """The share ``ask`` takes on ``dev`` (a percentage of memory resolved as HAMi does:
    ``devmem * percent / 100``)."""
    mem = ask.memory_mib or dev.memory_mib * ask.memory_percent // 100
    return GpuShare(dev.index, mem, ask.cores * 10)


def _selected(req: ShareRequest, dev: GpuDevice) -> bool:
    """HAMi's type and UUID selectors (``checkGPUtype``: case-insensitive substring of the
    type; ``CheckUUID``: exact UUIDs)."""
    t = dev.type.upper()
    if req.use_types and not any(u.upper() in t for u in req.use_types):
        return False
    if req.nouse_types and any(u.upper() in t for u in req.nouse_types):
        return False
    if req.use_uuids:
        return dev.uuid in req.use_uuids
    return not (req.nouse_uuids and dev.uuid in req.nouse_uuids)


def device_fits(
    node: NodeInfo,
    dev: GpuDevice,
    share: GpuShare,
    used: tuple[int, int, int] | None = None,
    req: ShareRequest | None = None,
    tenancy: GpuTenancy | None = None,
) -> bool:
    """Whether ``share`` fits on ``dev`` now (HAMi's ``Fit`` rules): the GPU is healthy,
    not held whole, not cordoned, its memory is known; memory and compute fit; fewer tasks
    than its split count; a 100 % compute share needs an idle GPU and a share without a
    compute bound does not go on a GPU whose compute is fully held. With ``tenancy`` (the
    GPU's, :func:`node_tenancy`) the right-sizer's limits hold too
    (:func:`tenancy_refusal`)."""
    i = dev.index
    bit = 1 << i
    if not dev.healthy or not node.usable_mask & bit:
        return False
    if dev.memory_mib <= 0 and share.memory_mib > 0:
        return False  # memory unknown: only a share of compute alone (KAI accounting) fits
    mem, milli, tasks = usage_of(node, i) if used is None else used
    if node.used_mask & bit and not tasks:
        return False  # held whole
    cap = milli_capacity(dev)
    if share.memory_mib > dev.memory_mib - mem or share.milli > cap - milli:
        return False
    if dev.split and tasks >= dev.split:
        return False
    if share.milli >= cap and tasks:
        return False
    if share.milli == 0 and milli >= cap:
        return False
    if tenancy is not None and tenancy_refusal(
        tasks, tenancy, req.limits if req is not None else None, share.milli
    ):
        return False
    return req is None or _selected(req, dev)


def _gpu_tenancy(tenancy: NodeTenancy | None, gpu: int) -> GpuTenancy | None:
    return tenancy[gpu] if tenancy is not None and gpu < len(tenancy) else None


def add_share(
    node: NodeInfo, shares: Sequence[GpuShare], sign: int = 1
) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """(new ``share_used``, new ``used_mask``) after adding (``sign`` 1) or releasing (-1)
    ``shares``. No check here (see :func:`check_shares`); a GPU's bit in ``used_mask``
    follows its task count."""
    used = list(node.share_used) + [(0, 0, 0)] * (node.gpu_capacity - len(node.share_used))
    mask = node.used_mask
    for s in shares:
        if not 0 <= s.gpu < node.gpu_capacity:
            continue
        m, c, t = used[s.gpu]
        before = t
        t = max(0, t + sign)
        used[s.gpu] = (max(0, m + sign * s.memory_mib), max(0, c + sign * s.milli), t)
        if t and not before:
            mask |= 1 << s.gpu
        elif before and not t:
            mask &= ~(1 << s.gpu)
            used[s.gpu] = (0, 0, 0)
    if not any(t for _, _, t in used):
        return (), mask
    return tuple(used), mask


def check_shares(node: NodeInfo, shares: Sequence[GpuShare]) -> str:
    """Why ``shares`` cannot be added to ``node`` ("" if they can): an index beyond the
    node, a GPU held whole, or memory / compute / split overcommitted (shares of one pod on
    one GPU are summed)."""
    devs = node_devices(node)
    per: dict[int, list[GpuShare]] = {}
    for s in shares:
        if not 0 <= s.gpu < node.gpu_capacity:
            return "GPU index beyond the node's capacity"
        per.setdefault(s.gpu, []).append(s)
    for g, items in per.items():
        mem, milli, tasks = usage_of(node, g)
        if node.used_mask & (1 << g) and not tasks:
            return "GPU held whole by another pod"
        dev = devs[g]
        add_mem = sum(s.memory_mib for s in items)
        add_milli = sum(s.milli for s in items)
        if dev.memory_mib and mem + add_mem > dev.memory_mib:
            return "GPU memory overcommitted"
        if mem + add_mem > (dev.memory_mib or MAX_DEVICE_MEMORY_MIB):
            return "GPU memory overcommitted"
        if milli + add_milli > milli_capacity(dev):
            return "GPU compute overcommitted"
        if dev.split and tasks + len(items) > dev.split:
            return "GPU share count exceeded"
    return ""


# ---- recorded shares (rebuild on restart, pods of other schedulers) -----------------------------


def hami_value(node: NodeInfo, per_container: Sequence[Sequence[GpuShare]]) -> str:
    """HAMi's ``EncodePodSingleDevice``: ``UUID,NVIDIA,memMiB,cores:`` per device, each
    container's list followed by ``;`` (containers without devices stay as empty slots)."""
    devs = node_devices(node)
    out = []
    for shares in per_container:
        out.append(
            "".join(
                f"{devs[s.gpu].uuid},{HAMI_TYPE},{s.memory_mib},{s.milli // 10}:" for s in shares
            )
        )
        out.append(";")
    return "".join(out)


def parse_hami_value(node: NodeInfo, text: Any) -> list[list[GpuShare]]:
    """Per container, the shares a HAMi device annotation records on ``node``.

    Raises:
        ShareError: malformed, too long, or naming a UUID the node does not publish.
    """
    if not isinstance(text, str) or len(text) > MAX_ALLOCATION_CHARS:
        raise ShareError("HAMi device annotation: not a string or too long")
    by_uuid = {d.uuid: d.index for d in node_devices(node) if d.uuid}
    out: list[list[GpuShare]] = []
    body = text[:-1] if text.endswith(";") else text
    for ctr in body.split(";") if body else []:
        shares = []
        for entry in ctr.split(":"):
            if not entry:
                continue
            f = entry.split(",")
            if len(f) < 4:
                raise ShareError("HAMi device annotation: malformed entry")
            if f[0] not in by_uuid:
                raise ShareError("HAMi device annotation: unknown GPU UUID")
            mem = _int(f[2], "HAMi device memory")
            cores = _int(f[3], "HAMi device cores", high=10_000)
            shares.append(GpuShare(by_uuid[f[0]], mem, cores * 10))
        out.append(shares)
    return out


def recorded_shares(
    pod: Mapping[str, Any], node: NodeInfo, params: SharingParams
) -> tuple[GpuShare, ...] | None:
    """The shares a bound pod's annotations record on ``node`` (HAMi's allocation, written by
    topoplace or HAMi's scheduler; gpushare's ``ALIYUN_COM_GPU_MEM_IDX`` / ``_POD``), or None
    when it records none or the record is unreadable (the caller then infers them)."""
    ann = _map(_map(_map(pod).get("metadata")).get("annotations"))
    value = ann.get(HAMI_ALLOCATED) or ann.get(HAMI_TO_ALLOCATE)
    try:
        if value:
            shares = tuple(s for ctr in parse_hami_value(node, value) for s in ctr)
            return shares or None
        if ann.get(ALIYUN_IDX) is not None and ann.get(ALIYUN_POD) is not None:
            idx = _int(ann[ALIYUN_IDX], ALIYUN_IDX, high=MAX_NODE_GPUS - 1)
            units = _int(ann[ALIYUN_POD], ALIYUN_POD)
            if idx >= node.gpu_capacity:
                return None
            return (GpuShare(idx, units * params.gpushare_memory_unit_mib, 0),)
    except ShareError:
        return None
    return None


def held_request(pod: Mapping[str, Any], params: SharingParams) -> ShareRequest | None:
    """What a bound pod holds as a share, read leniently: its fractional request (HAMi,
    gpushare), a KAI fraction, or None for a pod that holds no share."""
    try:
        req = share_request(pod, 0, params)
    except ShareError:
        req = None
    return req if req is not None else kai_request(pod)


def bound_shares(
    pod: Mapping[str, Any], node: NodeInfo, params: SharingParams
) -> tuple[tuple[GpuShare, ...], bool] | None:
    """(shares, recorded) a bound pod holds on ``node``, or None if it holds no share.

    Recorded shares are taken as they are (a stale record that would overcommit is
    re-inferred by the caller); without a record (KAI pods, or pods bound without the
    hand-off) each device is inferred on the GPUs with room, fullest first, lowest index on
    ties (deterministic)."""
    req = held_request(pod, params)
    ann = _map(_map(_map(pod).get("metadata")).get("annotations"))
    if req is None and PLACEMENT_ANNOTATION in ann:
        return None  # a whole-GPU pod topoplace placed (its HAMi hand-off is not a share)
    rec = recorded_shares(pod, node, params)
    if rec is not None and not check_shares(node, rec):
        return rec, True
    if req is None:
        return None if rec is None else (rec, True)
    got = choose_devices(node, req)
    if got is None:
        return (), False
    return tuple(s for ctr in got for s in ctr), False


# ---- placement on one node ------------------------------------------------------------------


def choose_devices(
    node: NodeInfo,
    req: ShareRequest,
    first: int | None = None,
    policy: str = "nvidia-best-effort",
    tenancy: NodeTenancy | None = None,
) -> list[list[GpuShare]] | None:
    """Per container, the devices ``req`` gets on ``node`` (None if it does not fit).

    Containers are placed in order on the ledger as the previous ones leave it. A
    container's devices are distinct GPUs. One device: ``first`` when given (the sharing
    policy's choice) and it fits, else the tightest fit (least memory left, then lowest
    index). Several devices: among the GPUs that fit, the best-connected set of the node's
    topology (``topology.select.best_set``), the tightest otherwise. ``tenancy``: the
    node's (:func:`node_tenancy`), whose limits a device must keep (None: not checked).
    """
    from topology.select import best_set

    if tenancy is not None and not tenancy_binds(tenancy, req.limits):
        tenancy = None  # no limit applies: every device's check would allow it
    devs = node_devices(node)
    used = {i: usage_of(node, i) for i in range(node.gpu_capacity)}

    def fits(d: Any, s: GpuShare) -> bool:
        return device_fits(node, d, s, used[d.index], req, _gpu_tenancy(tenancy, d.index))

    out: list[list[GpuShare]] = []
    for ask in req.containers:
        if ask.count <= 0:
            out.append([])
            continue
        # One device: the policy's, when it fits, whatever the others are.
        d = next((d for d in devs if d.index == first), None) if ask.count == 1 else None
        if d is not None and fits(d, s := resolve(ask, d)):
            shares = [s]
        else:
            each = ((d, resolve(ask, d)) for d in devs)
            ranked = sorted(
                (d.memory_mib - used[d.index][0] - s.memory_mib, d.index, s)
                for d, s in each
                if fits(d, s)
            )
            if len(ranked) < ask.count:
                return None
            pick = ranked[: ask.count]  # the tightest
            if ask.count > 1:
                mask = sum(1 << f[1] for f in ranked)
                chosen = (
                    best_set(node.shape, mask, ask.count, policy) if node.gpu_capacity else None
                )
                if chosen is not None and len(chosen.gpus) == ask.count:
                    pick = [f for f in ranked if f[1] in chosen.gpus]
            shares = [f[2] for f in sorted(pick, key=lambda f: f[1])]
        for s in shares:
            m, c, t = used[s.gpu]
            used[s.gpu] = (m + s.memory_mib, c + s.milli, t + 1)
        out.append(shares)
    return out


# ---- the sharing-policy view and the one placement function ----------------------------------


def place_on_view(
    view: SharingClusterView,
    task: SharingTask,
    policy: SharingPolicy,
    result: SharingScores,
    rng: Any = None,
) -> tuple[int, tuple[int, ...]]:
    """Host and devices for ``task`` from a policy's scores: the highest score wins (ties to
    the lowest ``view.rank``); a GPU-sharing task takes the device the policy named, or the
    policy's selection rule (``best`` / ``worst`` / ``random`` drawn from ``rng``).

    The simulator (``benchmarks.engine.placers.SharingPlacement``) and the live extender
    (:func:`decide`) both call this.

    Returns:
        (node index into the view, device indices).
    """
    i = select_host(result, view.rank)
    if not task.needs_gpu:
        return i, ()
    chosen_gpu = int(result.gpus[np.searchsorted(result.nodes, i)])
    if task.is_sharing and chosen_gpu != NO_GPU:
        if view.gpu_free[i, chosen_gpu] < task.gpu_milli:
            raise RuntimeError(
                f"policy {policy.name} chose GPU {chosen_gpu} of node {i} without room for "
                f"{task.name}"
            )
        return i, (chosen_gpu,)
    snap = view.node(i)
    draw = None
    if policy.gpu_selection == "random" and task.is_sharing:
        room = sum(1 for f in snap.gpu_free_milli if f >= task.gpu_milli)
        draw = rng.intn(room)
    got = allocate(snap, task, policy.gpu_selection, draw)
    if got is None:  # pragma: no cover - callers pass feasible nodes only
        raise RuntimeError(f"{task.name} does not fit node {i}")
    return i, got


def _per_mille_up(part: int, whole: int) -> int:
    return -(-part * MILLI // whole) if whole > 0 else 0


def task_milli(share: GpuShare, dev: GpuDevice) -> int:
    """A share as one number for FGD: ``max(compute, memory)`` per mille of the device,
    rounded up, at least 1."""
    return max(
        1,
        _per_mille_up(share.milli, milli_capacity(dev)),
        _per_mille_up(share.memory_mib, dev.memory_mib),
    )


def share_dims(share: GpuShare, dev: GpuDevice) -> tuple[int, int]:
    """A share in two dimensions: (compute, memory) per mille of the device, rounded up,
    at most 1000 each; a share of neither counts 1 per mille of memory (as
    :func:`task_milli` counts it 1), so every share takes room."""
    c = min(MILLI, _per_mille_up(share.milli, milli_capacity(dev)))
    m = min(MILLI, _per_mille_up(share.memory_mib, dev.memory_mib))
    return (c, m) if c or m else (0, 1)


def free_dims_of(node: NodeInfo, dev: GpuDevice, used: tuple[int, int, int]) -> tuple[int, int]:
    """A GPU's free (compute, memory) per mille of the device, rounded down; (0, 0) where
    :func:`free_milli` is 0 for the GPU's state (held whole, unhealthy, memory unknown)."""
    bit = 1 << dev.index
    if not dev.healthy or dev.memory_mib <= 0 or not node.usable_mask & bit:
        return 0, 0
    mem, milli, tasks = used
    if node.used_mask & bit and not tasks:
        return 0, 0
    cap = milli_capacity(dev)
    return (
        max(0, (cap - milli) * MILLI // cap),
        max(0, (dev.memory_mib - mem) * MILLI // dev.memory_mib),
    )


def free_milli(node: NodeInfo, dev: GpuDevice, used: tuple[int, int, int]) -> int:
    """A GPU's free share as one number for FGD: ``min(free compute, free memory)`` per
    mille of the device; 0 for a GPU held whole, unhealthy or of unknown memory."""
    bit = 1 << dev.index
    if not dev.healthy or dev.memory_mib <= 0 or not node.usable_mask & bit:
        return 0
    mem, milli, tasks = used
    if node.used_mask & bit and not tasks:
        return 0
    cap = milli_capacity(dev)
    return max(
        0, min((cap - milli) * MILLI // cap, (dev.memory_mib - mem) * MILLI // dev.memory_mib)
    )


def share_shape(cpu_milli: int, share: GpuShare, dev: GpuDevice, devices: int = 1) -> TaskShape:
    """FGD's task shape of a share on ``dev``: :func:`task_milli` (at most 1000) as its one
    number and :func:`share_dims` as its two dimensions, over ``devices`` GPUs."""
    milli = min(MILLI, task_milli(share, dev))
    return TaskShape(cpu_milli, milli, devices, dims=share_dims(share, dev))


PodShape = tuple[PodInfo, tuple[GpuDevice, ...] | None, TaskShape]
"""A pod, the device inventory its share was read against (None for whole GPUs), its shape."""


def pod_shapes(
    nodes: Iterable[NodeInfo],
    pods: Iterable[PodInfo],
    known: Mapping[str, PodShape] | None = None,
) -> dict[str, PodShape]:
    """FGD's task shape of every pod holding GPUs or shares, by pod key: a share as
    :func:`task_milli` of its device, whole GPUs as 1000 milli each. A shape in ``known``
    is taken again when its pod is the very object given and its node's devices are the
    same object (a snapshot keeps unchanged objects), so a caller that keeps the result
    reads only the pods that changed."""
    by_name = {n.name: n for n in nodes}
    known = known or {}
    out: dict[str, PodShape] = {}
    for p in pods:
        if p.shares:
            node = by_name.get(p.node)
            if node is None:
                continue
            devs = node_devices(node)
            hit = known.get(p.key)
            if hit is not None and hit[0] is p and hit[1] is devs:
                out[p.key] = hit
                continue
            s = p.shares[0]
            if s.gpu >= len(devs):
                continue
            out[p.key] = (p, devs, share_shape(p.cpu_milli, s, devs[s.gpu], len(p.shares)))
        elif p.gpus:
            hit = known.get(p.key)
            if hit is not None and hit[0] is p:
                out[p.key] = hit
            else:
                out[p.key] = (p, None, TaskShape(p.cpu_milli, MILLI, len(p.gpus)))
    return out


def shapes_distribution(
    shapes: Iterable[PodShape], extra: Iterable[TaskShape] = (), popularity: float = 0.95
) -> TypicalDistribution:
    """FGD's target workload from :func:`pod_shapes` plus ``extra`` shapes, ranked as the
    FGD artifact ranks them."""
    counts: Counter[TaskShape] = Counter(shape for _, _, shape in shapes)
    counts.update(extra)
    return typical_from_counts(counts, popularity)


def workload_distribution(
    nodes: Iterable[NodeInfo],
    pods: Iterable[PodInfo],
    extra: Iterable[TaskShape] = (),
    popularity: float = 0.95,
) -> TypicalDistribution:
    """FGD's target workload from the pods seen so far: every pod holding GPUs or shares
    (a share as :func:`task_milli` of its device, whole GPUs as 1000 milli each) plus
    ``extra`` shapes (the pod being placed), ranked as the FGD artifact ranks them."""
    return shapes_distribution(pod_shapes(nodes, pods).values(), extra, popularity)


class ShareDecision:
    """The decision for one fractional pod on one node.

    Attributes:
        node: node name.
        containers: per container, the shares it gets (named on first use when the
            decision was made lazily: :func:`decide` scores every node that fits, and
            only the few nodes a caller looks at need their devices).
        score: node score 0..100 (the sharing policy's, e.g. FGD's sigmoid of the
            fragmentation drop).
    """

    __slots__ = ("node", "score", "_containers", "_source", "_index")

    def __init__(
        self,
        node: str,
        containers: tuple[tuple[GpuShare, ...], ...] | None,
        score: int,
        source: _ScoredGroup | None = None,
        index: int = 0,
    ) -> None:
        if containers is None and source is None:
            raise ValueError("a ShareDecision needs its containers or a group to name them")
        self.node = node
        self.score = score
        self._containers = containers
        self._source = source
        self._index = index

    @property
    def containers(self) -> tuple[tuple[GpuShare, ...], ...]:
        if self._containers is None:
            assert self._source is not None
            self._containers = self._source.devices(self._index)
            self._source = None
        return self._containers

    @property
    def shares(self) -> tuple[GpuShare, ...]:
        """Every share of the pod."""
        return tuple(s for c in self.containers for s in c)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShareDecision):
            return NotImplemented
        return (self.node, self.score, self.containers) == (
            other.node,
            other.score,
            other.containers,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ShareDecision(node={self.node!r}, containers={self.containers!r}, score={self.score})"
        )


@dataclass(frozen=True, slots=True)
class Fit:
    """What :func:`decide` computes of one node for one request form, before scoring.

    Attributes:
        node: the node, as the fit was computed on it.
        got: the devices the request gets there without a policy's choice (None: it
            does not fit).
        free: the projected free share per GPU index (see :func:`decide`).
        need: the request's share there (per mille of a device).
        model: the device type.
        free_dims: per GPU index, the free (compute, memory) per mille, clamped to the
            exact fit like ``free``.
        need_dims: the request's (compute, memory) per mille there.
        tenancy: the node's tenancy the fit kept (:func:`node_tenancy`; None: none).
    """

    node: NodeInfo
    got: list[list[GpuShare]] | None
    free: tuple[int, ...] = ()
    need: int = 0
    model: str = ""
    free_dims: tuple[tuple[int, int], ...] = ()
    need_dims: tuple[int, int] = (0, 0)
    tenancy: NodeTenancy | None = None


def fit_form(req: ShareRequest, selection_policy: str) -> tuple[ShareRequest, str]:
    """What a :class:`Fit` depends on besides the node: the request without its CPU (which
    the fit does not read) and the device selection policy."""
    return replace(req, cpu_milli=0), selection_policy


def node_verdict(node: NodeInfo, req: ShareRequest) -> str:
    """Why ``node`` can never take ``req`` ("" if it may): no matching backend, or more
    devices per container than it has."""
    if node.sharing != req.form:
        return REASON_NO_BACKEND
    if any(c.count > node.gpu_capacity for c in req.containers):
        return REASON_TOO_MANY_DEVICES
    return ""


def _fit(
    node: NodeInfo,
    req: ShareRequest,
    ask: ContainerAsk,
    selection_policy: str,
    tenancy: NodeTenancy | None = None,
) -> Fit:
    """``node``'s :class:`Fit` for ``req`` (``ask``: its first container asking devices;
    ``tenancy``: the node's, kept by the right-sizer's limits)."""
    got = choose_devices(node, req, None, selection_policy, tenancy)
    if got is None:
        return Fit(node, None, tenancy=tenancy)
    devs = node_devices(node)
    free = [0] * node.gpu_capacity
    free_dims = [(0, 0)] * node.gpu_capacity
    need = 0
    need_dims = (0, 0)
    for d in devs:
        u = usage_of(node, d.index)
        s = resolve(ask, d)
        m = min(MILLI, task_milli(s, d))
        tc, tm = share_dims(s, d)
        f = free_milli(node, d, u)
        fc, fm = free_dims_of(node, d, u)
        if device_fits(node, d, s, u, req, _gpu_tenancy(tenancy, d.index)):
            f = max(f, m)
            fc, fm = max(fc, tc), max(fm, tm)
        else:
            f = min(f, m - 1)
            if tc > 0:
                fc = min(fc, tc - 1)
            else:
                fm = min(fm, tm - 1)
        free[d.index] = max(0, f)
        free_dims[d.index] = (max(0, fc), max(0, fm))
        if m > need:
            need, need_dims = m, (tc, tm)
    return Fit(
        node,
        got,
        tuple(free),
        need,
        devs[0].type if devs else "",
        tuple(free_dims),
        need_dims,
        tenancy,
    )


def node_fits(
    nodes: Sequence[NodeInfo],
    req: ShareRequest,
    selection_policy: str = "nvidia-best-effort",
    known: Mapping[str, Fit] | None = None,
    tenancy: Mapping[str, NodeTenancy] | None = None,
) -> dict[str, Fit]:
    """The :class:`Fit` of every node of ``nodes`` that ``req``'s form may go on
    (:func:`node_verdict`), by name. A fit in ``known`` (of the same form, see
    :func:`fit_form`) is taken again when its node is the very object given: a snapshot
    replaces a node's object whenever anything on it changes (its objects are immutable),
    so a fit is reused only for the state it was computed on (and the same tenancy,
    ``tenancy``: per node name, :func:`node_tenancy`; a node not in it has no tenant the
    right-sizer's limits count)."""
    ask = next((c for c in req.containers if c.count), None)
    out: dict[str, Fit] = {}
    if ask is None:
        return out
    known = known or {}
    tenancy = tenancy or EMPTY_MAP
    for n in nodes:
        if node_verdict(n, req):
            continue
        f = known.get(n.name)
        t = tenancy.get(n.name)
        if f is not None and f.node is n and f.tenancy == t:
            out[n.name] = f
        else:
            out[n.name] = _fit(n, req, ask, selection_policy, t)
    return out


def decide(
    nodes: Sequence[NodeInfo],
    req: ShareRequest,
    dist: TypicalDistribution,
    params: SharingParams,
    selection_policy: str = "nvidia-best-effort",
    fits: Mapping[str, Fit] | None = None,
    tenancy: Mapping[str, NodeTenancy] | None = None,
) -> dict[str, ShareDecision]:
    """Score every node of ``nodes`` that can take ``req`` now, with its devices.

    A single-device, single-container pod is scored by the configured sharing policy on the
    projected view (:func:`free_milli`, :func:`task_milli`, clamped to the exact fit), and
    :func:`place_on_view` names its device, as in the simulator. Other pods (several
    devices or containers) take :func:`choose_devices` per node, scored by the same policy
    as a whole-GPU-like task of their per-device share (FGD: the fragmentation drop).
    Nodes are given in any order; the result is keyed by name, each node's score is that
    node's alone, so the winner is the same whatever the order (ties: lowest name).

    ``fits``: :func:`node_fits` of these nodes for ``req``'s form (a node without a fit
    for its very object is fitted here); a caller that decides pod after pod keeps them
    and hands them to the next :func:`node_fits` as ``known``, so that only nodes that
    changed are fitted again. A single-device pod's devices on a node are
    named when its decision's ``containers`` are first read. Either way the decisions are
    exactly those computed afresh.

    ``tenancy`` (per node name, :func:`node_tenancy`): a GPU that the right-sizer's limits
    refuse (:func:`tenancy_refusal`) takes no share, as one without room.
    """
    policy = get_sharing_policy(params.policy)
    out: dict[str, ShareDecision] = {}
    simple = len([c for c in req.containers if c.count]) == 1 and req.devices == 1
    ask = next((c for c in req.containers if c.count), None)
    if ask is None:
        return out
    fits = fits or {}
    tenancy = tenancy or EMPTY_MAP
    fit_nodes: list[Fit] = []
    for n in sorted(nodes, key=lambda n: n.name):
        f = fits.get(n.name)
        t = tenancy.get(n.name)
        if f is None or f.node is not n or f.tenancy != t:  # not for this very node: fit it
            if node_verdict(n, req):
                continue
            f = _fit(n, req, ask, selection_policy, t)
        if f.got is not None:
            fit_nodes.append(f)
    if not fit_nodes:
        return out
    # The projected view: one row per fitting node; the request's share per node.
    k = len(fit_nodes)
    width = max(8, max(f.node.gpu_capacity for f in fit_nodes))
    gpu_free = np.zeros((k, width), dtype=np.int64)
    gpu_free_dims = np.zeros((k, width, 2), dtype=np.int64)
    for i, f in enumerate(fit_nodes):
        gpu_free[i, : len(f.free)] = f.free
        if f.free_dims:
            gpu_free_dims[i, : len(f.free_dims)] = f.free_dims
    view = SharingClusterView(
        names=tuple(f.node.name for f in fit_nodes),
        models=tuple(f.model for f in fit_nodes),
        gpu_count=np.array([f.node.gpu_capacity for f in fit_nodes], dtype=np.int64),
        gpu_free=gpu_free,
        cpu_free=np.array(
            [
                max(0, f.node.cpu_milli - f.node.cpu_used_milli) if f.node.cpu_milli else 1 << 40
                for f in fit_nodes
            ],
            dtype=np.int64,
        ),
        cpu_capacity=np.array([f.node.cpu_milli for f in fit_nodes], dtype=np.int64),
        memory_free=np.zeros(k, dtype=np.int64),
        memory_capacity=np.zeros(k, dtype=np.int64),
        affinity=np.zeros((k, width + 1), dtype=np.int64),
        version=np.zeros(k, dtype=np.int64),
        rank=np.arange(k, dtype=np.int64),
        gpu_free_dims=gpu_free_dims,
    )
    frag = FragmentationModel.build(dist, view.model_names)
    if not simple:
        # Several devices or containers: FGD's measure of the drop in fragmentation the
        # chosen devices leave (the policy's single-device scoring does not apply).
        from scheduler.core.policies.sharing_policies import sigmoid_score

        free = view.gpu_free
        after = free.copy()
        for i, f in enumerate(fit_nodes):
            devs = node_devices(f.node)
            for s in (s for c in f.got or () for s in c):
                after[i, s.gpu] = max(0, after[i, s.gpu] - min(MILLI, task_milli(s, devs[s.gpu])))
        cpu = view.cpu_free
        delta = frag.node_frag(free, cpu, view.model_ids) - frag.node_frag(
            after, cpu - req.cpu_milli, view.model_ids
        )
        scores = sigmoid_score(delta)
        for i, f in enumerate(fit_nodes):
            got = tuple(tuple(c) for c in f.got or ())
            out[f.node.name] = ShareDecision(f.node.name, got, int(scores[i]))
        return out
    # Nodes whose GPUs give the request the same share form one group (one policy call).
    groups: dict[tuple[int, tuple[int, int]], list[int]] = {}
    for i, f in enumerate(fit_nodes):
        groups.setdefault((f.need, f.need_dims), []).append(i)
    for (need, need_dims), members in sorted(groups.items()):
        cand = np.array(members, dtype=np.int64)
        task = SharingTask(
            name="", cpu_milli=req.cpu_milli, num_gpu=1, gpu_milli=need, gpu_dims=need_dims
        )
        ctx = SharingContext(candidates=cand, frag=frag)
        result = policy.score(view, task, ctx)
        group = _ScoredGroup(view, task, policy, result, fit_nodes, req, selection_policy)
        nodes, scores = result.nodes.tolist(), result.scores.tolist()
        for j, (i, score) in enumerate(zip(nodes, scores, strict=True)):
            name = fit_nodes[i].node.name
            out[name] = ShareDecision(name, None, int(score), group, j)
    return out


class _ScoredGroup:
    """One policy call of :func:`decide` (nodes whose GPUs give the request the same
    share): names the devices of its ``j``-th scored node on demand."""

    __slots__ = ("view", "task", "policy", "result", "fits", "req", "selection_policy")

    def __init__(
        self,
        view: SharingClusterView,
        task: SharingTask,
        policy: SharingPolicy,
        result: SharingScores,
        fits: list[Fit],
        req: ShareRequest,
        selection_policy: str,
    ) -> None:
        self.view, self.task, self.policy, self.result = view, task, policy, result
        self.fits, self.req, self.selection_policy = fits, req, selection_policy

    def devices(self, j: int) -> tuple[tuple[GpuShare, ...], ...]:
        """The devices a single-device pod gets on the ``j``-th scored node: the policy's
        device (:func:`place_on_view` on that node's own scores) if it fits, else the
        fit's."""
        r = self.result
        one = SharingScores(r.nodes[j : j + 1], r.scores[j : j + 1], r.gpus[j : j + 1])
        first = policy_device(self.view, self.task, self.policy, one)
        f = self.fits[int(r.nodes[j])]
        got = (
            choose_devices(f.node, self.req, first, self.selection_policy, f.tenancy) or f.got or []
        )
        return tuple(tuple(c) for c in got)


def policy_device(
    view: SharingClusterView, task: SharingTask, policy: SharingPolicy, one: SharingScores
) -> int | None:
    """The device :func:`place_on_view` names for ``task`` on the one node ``one`` scores,
    or None when the view's own allocation refuses it there: a share of a whole device
    (100 % of its compute) the policy leaves to the selection rule, on a node whose free
    CPU the view counts short (the share's fit reads no CPU; kube-scheduler checks it).
    The caller then takes the fit's tightest device."""
    try:
        _, gpus = place_on_view(view, task, policy, one)
    except RuntimeError:
        return None
    return gpus[0] if gpus else None


def tenancy_reason(node: NodeInfo, req: ShareRequest, tenancy: NodeTenancy | None) -> str:
    """Why ``req`` does not fit ``node`` when only the right-sizer's limits refuse it
    (:data:`REASON_TENANTS` if any GPU with room is at its most tenants, else
    :data:`REASON_COMPUTE_P95`), "" otherwise (no room at all, or it fits)."""
    if not tenancy_binds(tenancy, req.limits):
        return ""
    if choose_devices(node, req, None, "nvidia-best-effort", tenancy):
        return ""
    if choose_devices(node, req) is None:
        return ""
    ask = next((c for c in req.containers if c.count), None)
    if ask is not None:
        for d in node_devices(node):
            s = resolve(ask, d)
            u = usage_of(node, d.index)
            t = _gpu_tenancy(tenancy, d.index)
            if (
                t is not None
                and device_fits(node, d, s, u, req)
                and tenancy_refusal(u[2], t, req.limits, s.milli) == REASON_TENANTS
            ):
                return REASON_TENANTS
    return REASON_COMPUTE_P95


def best_decision(decisions: Mapping[str, ShareDecision]) -> ShareDecision | None:
    """The winner: highest score, ties to the lowest node name."""
    if not decisions:
        return None
    return min(decisions.values(), key=lambda d: (-d.score, d.node))


# ---- hand-off annotations (the edge adds the clock) ------------------------------------------


def hami_annotations(
    node: NodeInfo, containers: Sequence[Sequence[GpuShare]], now_s: int
) -> dict[str, str]:
    """The annotations HAMi's device plugin reads, as HAMi's scheduler writes them
    (``PatchAnnotations`` at filter, bind-phase and bind-time at bind)."""
    value = hami_value(node, containers)
    return {
        HAMI_NODE: node.name,
        HAMI_TIME: str(now_s),
        HAMI_TO_ALLOCATE: value,
        HAMI_ALLOCATED: value,
        HAMI_BIND_PHASE: "allocating",
        HAMI_BIND_TIME: str(now_s),
    }


def gpushare_annotations(
    node: NodeInfo, share: GpuShare, units: int, params: SharingParams, now_ns: int
) -> dict[str, str]:
    """The annotations gpushare's device plugin reads (``GetUpdatedPodAnnotationSpec``)."""
    dev = node_devices(node)[share.gpu]
    return {
        ALIYUN_IDX: str(share.gpu),
        ALIYUN_DEV: str(dev.memory_mib // params.gpushare_memory_unit_mib),
        ALIYUN_POD: str(units),
        ALIYUN_ASSIGNED: "false",
        ALIYUN_ASSUME_TIME: str(now_ns),
    }


def whole_hami_containers(
    node: NodeInfo, pod: Mapping[str, Any], gpus: Sequence[int]
) -> list[list[GpuShare]]:
    """A whole-GPU pod on a HAMi node, in HAMi's form (each GPU's full memory, 100 % of its
    compute), spread over its containers by their ``nvidia.com/gpu`` counts (HAMi's device
    plugin serves every ``nvidia.com/gpu`` container on its node from these annotations)."""
    devs = node_devices(node)
    spec = _map(_map(pod).get("spec"))
    items = [c for c in spec.get("containers") or () if isinstance(c, Mapping)]
    left = list(gpus)
    out: list[list[GpuShare]] = []
    for c in items:
        try:
            n = _int(_resource(c, GPU_COUNT) or 0, GPU_COUNT, high=MAX_NODE_GPUS)
        except ShareError:
            n = 0
        take, left = left[:n], left[n:]
        out.append([GpuShare(g, devs[g].memory_mib, milli_capacity(devs[g])) for g in take])
    return out


def describe_ledger(node: NodeInfo) -> list[dict[str, Any]]:
    """Per GPU: memory total / used / free (MiB), compute used (milli), tasks, held whole
    (for ``/v1/inspect`` and the demo)."""
    out = []
    whole = node.used_mask & ~node.shared_mask
    for d in node_devices(node):
        mem, milli, tasks = usage_of(node, d.index)
        out.append(
            {
                "gpu": d.index,
                "uuid": d.uuid,
                "memory_mib": d.memory_mib,
                "memory_used_mib": mem,
                "memory_free_mib": max(0, d.memory_mib - mem) if not whole >> d.index & 1 else 0,
                "compute_used_milli": milli,
                "tasks": tasks,
                "whole": bool(whole >> d.index & 1),
            }
        )
    return out
