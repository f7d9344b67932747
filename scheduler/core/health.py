"""Graded node and GPU health from the signals real GPU clusters publish.

Pure: :func:`assess` / :func:`assess_node` are functions of the Node object, the node's
DRA devices, a ``now`` passed in (the core has no clock) and :class:`HealthParams`. Which
signal counts as fatal or degrading is data, with defaults taken from
``../shared/SIGNALS.md``. Each signal maps to a state, a constant reason and a risk:

==========================================  ==========  ====================================
signal                                      level       effect (default parameters)
==========================================  ==========  ====================================
Ready condition not True (or absent)        node        UNHEALTHY, "node not ready"
Ready True, ``lastHeartbeatTime`` older     node        DEGRADED, risk 0.5 (early warning:
than ``heartbeat_stale_seconds`` (needs                 the kubelet stopped posting status
``now``)                                                while the node still looks Ready)
``spec.unschedulable``                      node        unschedulable, "node cordoned"
fault taint (``fault_taints``) with effect  node        UNHEALTHY, "node tainted by a fault"
NoSchedule / NoExecute
NVSentinel state label in                   node        UNHEALTHY
``nvsentinel_bad_states``
``Gpu*``/``SysLogs*`` condition True:       node        fatal -> UNHEALTHY; degraded ->
``fatal_conditions`` /                                  DEGRADED (risk 0.3); other
``degraded_conditions`` / other                         ``Gpu*``/``SysLogs*`` -> DEGRADED;
``xid_conditions``                                      xid -> counts towards an XID burst
DRA device taint NoSchedule / NoExecute     GPU         GPU removed (``bad_mask``), node
(``gpu.nvidia.com/xid``, ``gpu-lost``, ...)             DEGRADED (risk 0.2)
DRA ``gpu.nvidia.com/xid`` effect None      GPU         counts towards an XID burst
DRA ``gpu.nvidia.com/unmonitored``          GPU         risk 0.1 (state unchanged)
>= ``xid_burst_threshold`` non-fatal XID    node        DEGRADED, risk 0.5 (early warning)
signals within ``xid_window_seconds``
``hami.io/device-cordon``,                  GPU         GPU removed, node DEGRADED (0.2)
``volcano.sh/gpu-unhealthy-ids``
``nvidia.com/gpu`` allocatable < capacity   GPU         that many GPUs removed (highest
                                                        indices not otherwise known bad)
==========================================  ==========  ====================================

**DRA devices.** When a snapshot's ``extra["resourceslices"]`` holds ResourceSlice objects
(``resource.k8s.io`` v1 or v1beta1; ``spec.nodeName``, ``spec.driver``,
``spec.devices[]``), :func:`devices_by_node` indexes the devices of the drivers in
``HealthParams.dra_drivers`` by node. A device maps to a GPU index by, in order: its
``index`` attribute (``{"int": 3}``, plain or qualified ``gpu.nvidia.com/index``); its
``uuid`` attribute looked up in the node's GPU UUID list (``topoplace.io/gpu-uuids`` or
HAMi's register annotation); for MIG devices (``type`` = ``mig``) the ``parentIndex`` /
``parentUUID`` attributes, so a tainted MIG slice removes its parent GPU; finally a device
name of the form ``gpu-<n>``. A tainted device that cannot be mapped removes one more GPU
conservatively (highest free index), exactly like an unresolvable per-GPU cordon entry.
v1beta1 nests attributes and taints under ``basic``; both layouts are read.

Risks from several signals combine as independent failure probabilities,
``1 - prod(1 - r_i)``, so two moderate risks are worse than one.

Every reason string is a constant so kube-scheduler's event message aggregates them.
Nothing here raises on malformed input: a signal that cannot be read is ignored, except
that a GPU exclusion that names an unknown device removes a GPU conservatively. Reading is
bounded: numbers (GPU indices, timestamps) are parsed from short text only, GPU UUID lists
are indexed once, and a GPU count outside ``0 .. MAX_NODE_GPUS`` is taken as 0 (such a node
is one topoplace cannot model; see :data:`REASON_UNMODELED`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scheduler.core.model import MAX_NODE_GPUS, Health, NodeHealth

REASON_NOT_READY = "node not ready"
REASON_CORDONED = "node cordoned"
REASON_FAULT_TAINT = "node tainted by a fault"
REASON_NVSENTINEL = "node quarantined by NVSentinel"
REASON_GPU_FAULT = "GPU fault condition"
REASON_DEGRADED_CONDITION = "degraded health condition"
REASON_GPU_CORDON = "GPU excluded by per-GPU cordon"
REASON_GPU_ALLOCATABLE = "device plugin reports unhealthy GPUs"
REASON_GPU_UNRESOLVED = "GPU exclusion names an unknown device"
REASON_DEVICE_TAINT = "GPU tainted by the DRA driver"
REASON_DEVICE_UNMONITORED = "GPU health unmonitored"
REASON_HEARTBEAT_STALE = "node heartbeat stale"
REASON_XID_BURST = "burst of non-fatal GPU errors"
REASON_FLAPPING = "node failed repeatedly"
REASON_FAILED_BEFORE = "node failed recently"
REASON_SETTLING = "node recovered recently"
REASON_UNMODELED = "node topoplace cannot model"
"""The verdict of a node topoplace cannot model (more GPUs than ``MAX_NODE_GPUS``, an
unreadable GPU count or field, a topology topoplace cannot compute): UNHEALTHY for GPU pods,
so it is refused with this reason while the rest of the cluster is served. Not a hardware
failure: ``remediation.node_failure`` does not count it."""

NVSENTINEL_STATE_LABEL = "dgxc.nvidia.com/nvsentinel-state"
HAMI_DEVICE_CORDON = "hami.io/device-cordon"
VOLCANO_UNHEALTHY_IDS = "volcano.sh/gpu-unhealthy-ids"
GPU_UUIDS_ANNOTATION = "topoplace.io/gpu-uuids"
HAMI_REGISTER = "hami.io/node-nvidia-register"
RESOURCESLICES_KEY = "resourceslices"
"""Key of ``ClusterSnapshot.extra`` holding ResourceSlice objects (list)."""
NOW_KEY = "now"
"""Key of ``ClusterSnapshot.extra`` holding the snapshot's wall-clock time (epoch seconds
or RFC 3339) for offline snapshots; live caches pass ``now`` through the health tracker."""

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class HealthParams:
    """Which signals are fatal or degrading, and how history is weighed.

    Loaded from ``policy.yaml`` ``health:`` (:meth:`from_config`); every field has a
    default, so older policy files keep working. Durations are seconds.

    Attributes:
        fatal_conditions: node conditions (status True) that make the node UNHEALTHY.
        degraded_conditions: node conditions (status True) that make it DEGRADED.
        degraded_condition_risk: risk of a degraded condition.
        unknown_condition_prefixes: other True conditions with these prefixes (NVSentinel
            check names) are treated as degraded; empty to ignore them.
        xid_conditions: conditions (status True, not fatal) that count as one non-fatal
            XID signal each, timed by ``lastTransitionTime``.
        fault_taints: node taint keys that mean a fault when NoSchedule / NoExecute.
        nvsentinel_bad_states: NVSentinel state label values that mean "not usable".
        honour_cordon: treat ``spec.unschedulable`` as unschedulable (kube-scheduler does).
        gpu_exclusions: read per-GPU exclusion annotations (HAMi, Volcano).
        check_allocatable: remove GPUs when allocatable is below capacity.
        gpu_loss_risk: node risk while some of its GPUs are excluded.
        dra_drivers: ResourceSlice drivers whose devices are this node's GPUs.
        dra_taints: read DRA device taints.
        dra_xid_taints: DRA taint keys that carry an XID (effect None = non-fatal).
        dra_unmonitored_taints: DRA taint keys meaning "health not monitored".
        unmonitored_risk: node risk while a GPU is unmonitored.
        heartbeat_stale_seconds: a Ready node whose ``lastHeartbeatTime`` is older is
            suspect (0 disables). The kubelet refreshes it at least every
            ``nodeStatusReportFrequency`` (5 min by default), hence the 6 min default.
        heartbeat_stale_risk: risk of a stale heartbeat.
        xid_window_seconds / xid_burst_threshold / xid_burst_risk: this many non-fatal XID
            signals within the window make the node suspect (threshold 0 disables).
        history: use transition history (flapping risk, settle time).
        flap_half_life_seconds: half-life of the memory of a failure.
        flap_weight: risk one fresh failure adds after recovery.
        flap_degraded_risk: history risk at or above which the node is DEGRADED.
        settle_seconds: a node recovered less than this long ago is DEGRADED.
        settle_risk: risk while settling.
        history_max_events: transitions remembered per node.
    """

    fatal_conditions: tuple[str, ...] = (
        "GpuXidError",
        "GpuMemWatch",
        "GpuNvlinkWatch",
        "GpuPcieWatch",
        "GpuInforomWatch",
        "SysLogsXIDError",
        "SysLogsSXIDError",
        "SysLogsGPUFallenOff",
    )
    degraded_conditions: tuple[str, ...] = ("GpuThermalWatch", "GpuPowerWatch")
    degraded_condition_risk: float = 0.3
    unknown_condition_prefixes: tuple[str, ...] = ("Gpu", "SysLogs")
    xid_conditions: tuple[str, ...] = ()
    fault_taints: tuple[str, ...] = (
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/network-unavailable",
        "nvidia.com/gpu-xid-error",
        "nvidia.com/gpu-nvlink-error",
        "nvidia.com/syslog-xid-error",
        "nvidia.com/gpu-error",
    )
    nvsentinel_bad_states: tuple[str, ...] = (
        "quarantined",
        "draining",
        "drain-succeeded",
        "drain-failed",
        "remediating",
        "remediation-failed",
    )
    honour_cordon: bool = True
    gpu_exclusions: bool = True
    check_allocatable: bool = True
    gpu_loss_risk: float = 0.2
    dra_drivers: tuple[str, ...] = ("gpu.nvidia.com",)
    dra_taints: bool = True
    dra_xid_taints: tuple[str, ...] = ("gpu.nvidia.com/xid",)
    dra_unmonitored_taints: tuple[str, ...] = ("gpu.nvidia.com/unmonitored",)
    unmonitored_risk: float = 0.1
    heartbeat_stale_seconds: float = 360.0
    heartbeat_stale_risk: float = 0.5
    xid_window_seconds: float = 3600.0
    xid_burst_threshold: int = 3
    xid_burst_risk: float = 0.5
    history: bool = True
    flap_half_life_seconds: float = 6 * 3600.0
    flap_weight: float = 0.35
    flap_degraded_risk: float = 0.5
    settle_seconds: float = 1800.0
    settle_risk: float = 0.4
    history_max_events: int = 16

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> HealthParams:
        """Build from the ``health:`` mapping of policy.yaml.

        Raises:
            ValueError: unknown keys, or negative durations / risks outside 0..1.
        """
        if not obj:
            return cls()
        known = set(cls.__dataclass_fields__)
        unknown = set(obj) - known
        if unknown:
            raise ValueError(f"unknown health settings: {sorted(unknown)}")
        kw: dict[str, Any] = {}
        for k, v in obj.items():
            kw[k] = tuple(str(x) for x in v) if isinstance(v, list | tuple) else v
        p = cls(**kw)
        for name in cls.__dataclass_fields__:
            v = getattr(p, name)
            if name.endswith("_risk") or name in ("flap_weight", "unmonitored_risk"):
                if not 0.0 <= float(v) <= 1.0:
                    raise ValueError(f"health.{name} must be within 0..1")
            elif (name.endswith("_seconds") or name.endswith("_threshold")) and float(v) < 0:
                raise ValueError(f"health.{name} must be >= 0")
        if p.history_max_events < 1:
            raise ValueError("health.history_max_events must be >= 1")
        return p

    @classmethod
    def ready_only(cls) -> HealthParams:
        """The baseline most schedulers implement: only the Ready condition counts.

        No cordon, taints, NVSentinel, per-GPU signals, early warnings or history (what
        HiveD or a Kueue/kube-scheduler setup without a health controller sees).
        """
        return cls(
            fatal_conditions=(),
            degraded_conditions=(),
            unknown_condition_prefixes=(),
            xid_conditions=(),
            fault_taints=(),
            nvsentinel_bad_states=(),
            honour_cordon=False,
            gpu_exclusions=False,
            check_allocatable=False,
            dra_taints=False,
            heartbeat_stale_seconds=0.0,
            xid_burst_threshold=0,
            history=False,
        )


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Health of one GPU of a node (for explanations; the decision uses ``bad_mask``)."""

    index: int
    state: Health = Health.HEALTHY
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HealthReport:
    """A node's verdict plus the per-GPU breakdown and the XID signals seen.

    Attributes:
        node: the verdict the snapshot stores.
        gpus: one entry per GPU index (capacity), in index order.
        xids: non-fatal XID signals as (time or None, stable key), sorted; the history
            uses the keys to count distinct signals across snapshots.
    """

    node: NodeHealth
    gpus: tuple[GpuHealth, ...]
    xids: tuple[tuple[float | None, str], ...] = ()


# ---- small readers that never raise -------------------------------------------------------


def _map(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _seq(x: Any) -> Sequence[Any]:
    return x if isinstance(x, list | tuple) else ()


def _str(x: Any) -> str:
    return x if isinstance(x, str) else ""


def _scalar(x: Any) -> str:
    """Text of a scalar for signal keys (``?`` for anything else, never a deep ``str()``)."""
    if isinstance(x, str):
        return x
    if x is None or isinstance(x, bool | int | float):
        return repr(x) if not isinstance(x, int) or x.bit_length() <= 64 else "?"
    return "?"


def _small_index(text: str) -> int | None:
    """A GPU index written as ASCII digits ("3"), None otherwise (bounded: short text only;
    ``str.isdigit`` also accepts "²", which ``int`` refuses)."""
    if 0 < len(text) <= 3 and text.isascii() and text.isdigit():
        return int(text)
    return None


_MAX_TIME_TEXT = 64
_MAX_EPOCH = 253402300799.0  # 9999-12-31T23:59:59Z


def parse_time(value: Any) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp (or a number); None if unreadable, not finite
    or outside years 1..9999 (bounded: long text is not parsed)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            t = float(value)
        except OverflowError:
            return None
        return t if -_MAX_EPOCH <= t <= _MAX_EPOCH else None  # also refuses NaN
    if not isinstance(value, str) or not value or len(value) > _MAX_TIME_TEXT:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp()
    except (ValueError, OverflowError):
        return None


def _conditions(node: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return [c for c in _seq(_map(node.get("status")).get("conditions")) if isinstance(c, Mapping)]


def _ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in _conditions(node):
        if c.get("type") == "Ready":
            return c
    return None


def _true(c: Mapping[str, Any]) -> bool:
    """A condition's status is True (the string, or a JSON true)."""
    v = c.get("status")
    return v == "True" or v is True


def node_ready(node: Mapping[str, Any]) -> bool:
    """True when the Node's Ready condition is True."""
    c = _ready_condition(node)
    return c is not None and _true(c)


def heartbeat_age(node: Mapping[str, Any], now: float) -> float | None:
    """Seconds since the Ready condition's ``lastHeartbeatTime`` (None if unknown)."""
    c = _ready_condition(node)
    t = parse_time(c.get("lastHeartbeatTime")) if c is not None else None
    return None if t is None else now - t


def _gpu_uuid_order(annotations: Mapping[str, Any]) -> list[str]:
    """GPU UUIDs in index order, from topoplace's or HAMi's node annotation."""
    raw = _str(annotations.get(GPU_UUIDS_ANNOTATION))
    if raw:
        return [u.strip() for u in raw.split(",") if u.strip()]
    raw = _str(annotations.get(HAMI_REGISTER))
    if raw:
        # HAMi registers devices either as JSON (newer) or as ':'-separated records whose
        # first ','-separated field is the UUID (older).
        try:
            devs = json.loads(raw)
            if isinstance(devs, list):
                return [_str(d.get("id") or d.get("ID")) for d in devs if isinstance(d, dict)]
        except (ValueError, RecursionError):
            pass
        return [rec.split(",")[0].strip() for rec in raw.split(":") if rec.strip()]
    return []


def _uuid_index(order: Sequence[str] | Mapping[str, int]) -> Mapping[str, int]:
    """UUID -> GPU index (first occurrence), built once so lookups are O(1)."""
    if isinstance(order, Mapping):
        return order
    out: dict[str, int] = {}
    for i, u in enumerate(order):
        out.setdefault(u, i)
    return out


def _resolve_gpu(entry: str, order: Mapping[str, int], gpu_count: int) -> int | None:
    """GPU index named by an index ("3") or a UUID in the node's UUID list."""
    i = _small_index(entry)
    if i is None:
        i = order.get(entry)
    return i if i is not None and i < gpu_count else None


def _excluded_gpus(annotations: Mapping[str, Any], gpu_count: int) -> tuple[int, int]:
    """(bad_mask, unresolved) from per-GPU exclusion annotations.

    Entries may be GPU indices ("3") or UUIDs resolved through the node's UUID list. An
    entry that cannot be resolved is counted in ``unresolved``; the caller removes that
    many GPUs conservatively.
    """
    entries: list[str] = []
    for key in (HAMI_DEVICE_CORDON, VOLCANO_UNHEALTHY_IDS):
        raw = _str(annotations.get(key))
        if raw:
            entries.extend(e.strip() for e in raw.split(",") if e.strip())
    if not entries:
        return 0, 0
    order = _uuid_index(_gpu_uuid_order(annotations))
    bad = 0
    unresolved = 0
    for e in sorted(set(entries)):
        i = _resolve_gpu(e, order, gpu_count)
        if i is None:
            unresolved += 1
        else:
            bad |= 1 << i
    return bad, unresolved


def _remove_highest(bad: int, count: int, gpu_count: int) -> tuple[int, int]:
    """Mark ``count`` more GPUs bad, highest indices first (deterministic, conservative).

    Returns (new bad mask, the GPUs newly marked)."""
    added = 0
    i = gpu_count - 1
    while count > 0 and i >= 0:
        if not bad & (1 << i):
            added |= 1 << i
            count -= 1
        i -= 1
    return bad | added, added


# ---- DRA ResourceSlices -----------------------------------------------------------------------


def allocatable_pools(
    slices: Any, drivers: Sequence[str] = ()
) -> list[tuple[tuple[str, str], list[tuple[str, Mapping[str, Any]]]]]:
    """The node-local ResourceSlices of ``drivers`` (all when empty) that kube-scheduler's
    DRA allocator uses, by pool: for each (driver, pool name) in order, the (name, slice)
    of its newest generation in name order, and only pools whose slices are all published
    (as many as their ``resourceSliceCount``). Anything unreadable is skipped."""
    pools: dict[tuple[str, str], list[tuple[int, str, Mapping[str, Any]]]] = {}
    for s in _seq(slices):
        if not isinstance(s, Mapping):
            continue
        spec = _map(s.get("spec"))
        driver = _str(spec.get("driver"))
        if not _str(spec.get("nodeName")) or not driver or (drivers and driver not in drivers):
            continue
        pool = _map(spec.get("pool"))
        sname = _str(_map(s.get("metadata")).get("name"))
        pools.setdefault((driver, _str(pool.get("name"))), []).append(
            (_count(pool.get("generation"), 0), sname, s)
        )
    out = []
    for key, entries in sorted(pools.items()):
        newest = max(g for g, _, _ in entries)
        current = sorted(((n, s) for g, n, s in entries if g == newest), key=lambda t: t[0])
        want = _count(
            _map(_map(current[0][1].get("spec")).get("pool")).get("resourceSliceCount"), 1
        )
        if len(current) == want:
            out.append((key, current))
    return out


def _count(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def devices_by_node(
    slices: Any, params: HealthParams | None = None
) -> Mapping[str, tuple[Mapping[str, Any], ...]]:
    """Index the devices of GPU ResourceSlices by node name: those the allocator uses
    (:func:`allocatable_pools`, as ``dra.inventory`` reads them), so a stale generation's
    slices and a pool half published count for nothing.

    Args:
        slices: ResourceSlice objects (anything else is ignored).
        params: only slices of ``params.dra_drivers`` count (defaults when None).

    Returns:
        node name -> its devices, in (slice name, device order) order.
    """
    drivers = (params or HealthParams()).dra_drivers
    acc: dict[str, list[tuple[str, int, Mapping[str, Any]]]] = {}
    for _, current in allocatable_pools(slices, drivers):
        for sname, s in current:
            spec = _map(s.get("spec"))
            node = _str(spec.get("nodeName"))
            for j, d in enumerate(_seq(spec.get("devices"))):
                if isinstance(d, Mapping):
                    acc.setdefault(node, []).append((sname, j, d))
    return {
        n: tuple(d for _, _, d in sorted(v, key=lambda t: (t[0], t[1]))) for n, v in acc.items()
    }


def _attr(device: Mapping[str, Any], name: str) -> Any:
    """A device attribute's value (``{"int": 3}`` -> 3), plain or driver-qualified."""
    attrs = _map(device.get("attributes")) or _map(_map(device.get("basic")).get("attributes"))
    for key in (name, f"gpu.nvidia.com/{name}"):
        v = attrs.get(key)
        if isinstance(v, Mapping):
            for kind in ("int", "string", "version", "bool"):
                if kind in v:
                    return v[kind]
        elif v is not None:
            return v
    return None


def _device_taints(device: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    raw = device.get("taints")
    if raw is None:
        raw = _map(device.get("basic")).get("taints")
    return [t for t in _seq(raw) if isinstance(t, Mapping)]


_GPU_NAME = re.compile(r"^gpu-([0-9]+)$")


def device_gpu_index(
    device: Mapping[str, Any], order: Sequence[str] | Mapping[str, int], gpu_count: int
) -> int | None:
    """GPU index of a DRA device (see the module docstring for the mapping); None if unknown.

    ``order`` is the node's GPU UUID list, or its index (UUID -> position) as built once
    per node by :func:`assess`.
    """
    uuids = _uuid_index(order)
    mig = _str(_attr(device, "type")).lower() == "mig"
    idx_names = ("parentIndex", "index") if mig else ("index",)
    uuid_names = ("parentUUID", "uuid") if mig else ("uuid",)
    for n in idx_names:
        v = _attr(device, n)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < gpu_count:
            return v
        i = _small_index(v) if isinstance(v, str) else None
        if i is not None and i < gpu_count:
            return i
    for n in uuid_names:
        v = _attr(device, n)
        i = uuids.get(v) if isinstance(v, str) else None
        if i is not None and i < gpu_count:
            return i
    m = _GPU_NAME.match(_str(device.get("name")))
    i = _small_index(m.group(1)) if m else None
    if i is not None and i < gpu_count:
        return i
    return None


# ---- the assessment --------------------------------------------------------------------------


class _Acc:
    """Accumulates a verdict: worst state, reasons by severity, independent risks."""

    def __init__(self, gpu_count: int) -> None:
        self.state = Health.HEALTHY
        self.reasons: list[tuple[int, int, str]] = []
        self.survive = 1.0
        self.gpu_state = [Health.HEALTHY] * gpu_count
        self.gpu_reasons: list[list[str]] = [[] for _ in range(gpu_count)]

    def add(self, state: Health, reason: str, risk: float) -> None:
        self.state = max(self.state, state)
        if all(r != reason for _, _, r in self.reasons):
            self.reasons.append((-int(state), len(self.reasons), reason))
        self.survive *= 1.0 - min(max(risk, 0.0), 1.0)

    def gpu(self, mask: int, state: Health, reason: str) -> None:
        for i in range(len(self.gpu_state)):
            if mask >> i & 1:
                self.gpu_state[i] = max(self.gpu_state[i], state)
                if reason not in self.gpu_reasons[i]:
                    self.gpu_reasons[i].append(reason)

    @property
    def risk(self) -> float:
        return round(1.0 - self.survive, 6)

    def sorted_reasons(self) -> tuple[str, ...]:
        return tuple(r for _, _, r in sorted(self.reasons))


def _condition_xid(ctype: str, c: Mapping[str, Any]) -> tuple[float | None, str]:
    """The XID signal of a true ``xid_conditions`` condition of type ``ctype``."""
    when = c.get("lastTransitionTime")
    return parse_time(when), f"condition/{ctype}/{_scalar(when)}"


def _device_xid(d: Mapping[str, Any], t: Mapping[str, Any]) -> tuple[float | None, str]:
    """The XID signal of a non-blocking ``dra_xid_taints`` taint ``t`` of device ``d``."""
    added = t.get("timeAdded")
    key = f"dra/{_scalar(d.get('name'))}/{_scalar(t.get('value'))}/{_scalar(added)}"
    return parse_time(added), key


def _xid_order(
    xids: Iterable[tuple[float | None, str]],
) -> list[tuple[float | None, str]]:
    """XID signals without repeats, oldest first (untimed last), then by key."""
    return sorted(set(xids), key=lambda x: (x[0] is None, x[0] or 0.0, x[1]))


def xid_signals(
    node: Mapping[str, Any],
    gpu_capacity: int,
    params: HealthParams,
    devices: Iterable[Mapping[str, Any]] = (),
) -> tuple[tuple[float | None, str], ...]:
    """The non-fatal XID signals of a Node object and its DRA devices: exactly
    ``assess(node, gpu_capacity, ..., devices=devices).xids``, without grading the node
    (what the health history counts across updates; ``tests/health/test_signals.py``
    checks the two agree)."""
    if not isinstance(node, Mapping):
        return ()
    xids: list[tuple[float | None, str]] = []
    if params.xid_conditions:
        for c in _conditions(node):
            if not _true(c):
                continue
            ctype = _str(c.get("type"))
            if (
                ctype
                and ctype != "Ready"
                and ctype not in params.fatal_conditions
                and ctype in params.xid_conditions
            ):
                xids.append(_condition_xid(ctype, c))
    ok_cap = isinstance(gpu_capacity, int) and 0 < gpu_capacity <= MAX_NODE_GPUS
    if params.dra_taints and params.dra_xid_taints and ok_cap:
        for d in devices if isinstance(devices, Iterable) else ():
            if not isinstance(d, Mapping):
                continue
            for t in _device_taints(d):
                effect = _str(t.get("effect")) or "None"
                if effect not in _BLOCKING_EFFECTS and _str(t.get("key")) in params.dra_xid_taints:
                    xids.append(_device_xid(d, t))
    return tuple(_xid_order(xids)) if xids else ()


def assess(
    node: Mapping[str, Any],
    gpu_capacity: int,
    gpu_allocatable: int,
    params: HealthParams,
    *,
    now: float | None = None,
    devices: Iterable[Mapping[str, Any]] = (),
) -> HealthReport:
    """Grade a Node object's health, with a per-GPU breakdown.

    Args:
        node: the Node object (camelCase Kubernetes JSON).
        gpu_capacity: physical GPUs.
        gpu_allocatable: GPUs advertised as allocatable.
        params: which signals are fatal or degrading.
        now: wall-clock epoch seconds; time-based signals (heartbeat age, XID window) are
            only assessed when given.
        devices: this node's DRA devices (:func:`devices_by_node`).

    Returns:
        The report; never raises on odd input. A ``gpu_capacity`` outside
        ``0 .. MAX_NODE_GPUS`` is taken as 0 (no per-GPU signals are read).
    """
    if not isinstance(node, Mapping):
        node = {}
    ok_cap = isinstance(gpu_capacity, int) and 0 <= gpu_capacity <= MAX_NODE_GPUS
    cap = int(gpu_capacity) if ok_cap else 0
    meta = _map(node.get("metadata"))
    labels = _map(meta.get("labels"))
    annotations = _map(meta.get("annotations"))
    spec = _map(node.get("spec"))
    acc = _Acc(cap)
    all_mask = (1 << cap) - 1
    bad = 0
    xids: list[tuple[float | None, str]] = []

    # Node-level signals.
    ready = _ready_condition(node)
    if ready is None or not _true(ready):
        acc.add(Health.UNHEALTHY, REASON_NOT_READY, 1.0)
    elif now is not None and params.heartbeat_stale_seconds > 0:
        age = heartbeat_age(node, now)
        if age is not None and age > params.heartbeat_stale_seconds:
            acc.add(Health.DEGRADED, REASON_HEARTBEAT_STALE, params.heartbeat_stale_risk)
    unschedulable = params.honour_cordon and spec.get("unschedulable") is True
    if unschedulable:
        acc.add(Health.HEALTHY, REASON_CORDONED, 0.0)
    for t in _seq(spec.get("taints")):
        t = _map(t)
        if t.get("key") in params.fault_taints and t.get("effect") in _BLOCKING_EFFECTS:
            acc.add(Health.UNHEALTHY, REASON_FAULT_TAINT, 1.0)
    if _str(labels.get(NVSENTINEL_STATE_LABEL)) in params.nvsentinel_bad_states:
        acc.add(Health.UNHEALTHY, REASON_NVSENTINEL, 1.0)
    for c in _conditions(node):
        if not _true(c):
            continue
        ctype = _str(c.get("type"))
        if not ctype or ctype == "Ready":
            continue
        if ctype in params.fatal_conditions:
            acc.add(Health.UNHEALTHY, REASON_GPU_FAULT, 1.0)
        elif ctype in params.xid_conditions:
            xids.append(_condition_xid(ctype, c))
        elif ctype in params.degraded_conditions or (
            params.unknown_condition_prefixes
            and ctype.startswith(params.unknown_condition_prefixes)
        ):
            acc.add(Health.DEGRADED, REASON_DEGRADED_CONDITION, params.degraded_condition_risk)

    # Per-GPU signals.
    order = _uuid_index(_gpu_uuid_order(annotations)) if cap else {}
    if params.gpu_exclusions and cap:
        cordoned, unresolved = _excluded_gpus(annotations, cap)
        if cordoned:
            acc.add(Health.DEGRADED, REASON_GPU_CORDON, params.gpu_loss_risk)
            acc.gpu(cordoned, Health.UNHEALTHY, REASON_GPU_CORDON)
            bad |= cordoned
        if unresolved:
            acc.add(Health.DEGRADED, REASON_GPU_UNRESOLVED, params.gpu_loss_risk)
            bad, added = _remove_highest(bad, unresolved, cap)
            acc.gpu(added, Health.UNHEALTHY, REASON_GPU_UNRESOLVED)
    if params.dra_taints and cap:
        unmapped = 0
        tainted = 0
        unmonitored = 0
        for d in devices if isinstance(devices, Iterable) else ():
            if not isinstance(d, Mapping):
                continue
            gi = device_gpu_index(d, order, cap)
            for t in _device_taints(d):
                key = _str(t.get("key"))
                effect = _str(t.get("effect")) or "None"
                if effect in _BLOCKING_EFFECTS:
                    if gi is None:
                        unmapped += 1
                    else:
                        tainted |= 1 << gi
                elif key in params.dra_xid_taints:
                    xids.append(_device_xid(d, t))
                    if gi is not None:
                        acc.gpu(1 << gi, Health.DEGRADED, REASON_XID_BURST)
                elif key in params.dra_unmonitored_taints and gi is not None:
                    unmonitored |= 1 << gi
        if tainted:
            acc.add(Health.DEGRADED, REASON_DEVICE_TAINT, params.gpu_loss_risk)
            acc.gpu(tainted, Health.UNHEALTHY, REASON_DEVICE_TAINT)
            bad |= tainted
        if unmapped:
            acc.add(Health.DEGRADED, REASON_DEVICE_TAINT, params.gpu_loss_risk)
            bad, added = _remove_highest(bad, unmapped, cap)
            acc.gpu(added, Health.UNHEALTHY, REASON_DEVICE_TAINT)
        if unmonitored:
            acc.add(Health.HEALTHY, REASON_DEVICE_UNMONITORED, params.unmonitored_risk)
            acc.gpu(unmonitored, Health.HEALTHY, REASON_DEVICE_UNMONITORED)
    alloc = gpu_allocatable if isinstance(gpu_allocatable, int) and ok_cap else cap
    missing = cap - max(alloc, 0) - (bad & all_mask).bit_count()
    if params.check_allocatable and alloc < cap and missing > 0:
        acc.add(Health.DEGRADED, REASON_GPU_ALLOCATABLE, params.gpu_loss_risk)
        bad, added = _remove_highest(bad, missing, cap)
        acc.gpu(added, Health.UNHEALTHY, REASON_GPU_ALLOCATABLE)

    # Early warning: a burst of non-fatal XIDs.
    xids = _xid_order(xids)
    if params.xid_burst_threshold > 0:
        recent = [
            x
            for x in xids
            if now is None or x[0] is None or now - x[0] <= params.xid_window_seconds
        ]
        if len(recent) >= params.xid_burst_threshold:
            acc.add(Health.DEGRADED, REASON_XID_BURST, params.xid_burst_risk)

    node_health = NodeHealth(
        state=acc.state,
        reasons=acc.sorted_reasons(),
        risk=acc.risk,
        bad_mask=bad & all_mask,
        unschedulable=unschedulable,
    )
    gpus = tuple(GpuHealth(i, acc.gpu_state[i], tuple(acc.gpu_reasons[i])) for i in range(cap))
    return HealthReport(node_health, gpus, tuple(xids))


def assess_node(
    node: Mapping[str, Any],
    gpu_capacity: int,
    gpu_allocatable: int,
    params: HealthParams,
    *,
    now: float | None = None,
    devices: Iterable[Mapping[str, Any]] = (),
) -> NodeHealth:
    """Grade a Node object's health (the verdict of :func:`assess`)."""
    return assess(node, gpu_capacity, gpu_allocatable, params, now=now, devices=devices).node


def merge(a: NodeHealth, b: NodeHealth) -> NodeHealth:
    """Combine two verdicts of one node: worst state, reasons by severity, OR of masks,
    risks combined as independent failure probabilities."""
    reasons = [(-int(a.state), 0, i, r) for i, r in enumerate(a.reasons)]
    reasons += [(-int(b.state), 1, i, r) for i, r in enumerate(b.reasons) if r not in a.reasons]
    return NodeHealth(
        state=max(a.state, b.state),
        reasons=tuple(r for *_, r in sorted(reasons)),
        risk=round(1.0 - (1.0 - a.risk) * (1.0 - b.risk), 6),
        bad_mask=a.bad_mask | b.bad_mask,
        unschedulable=a.unschedulable or b.unschedulable,
    )


def heartbeat_verdict(node: Mapping[str, Any], now: float, params: HealthParams) -> NodeHealth:
    """Only the heartbeat-staleness signal (for callers that learn ``now`` late)."""
    if params.heartbeat_stale_seconds <= 0 or not isinstance(node, Mapping) or not node_ready(node):
        return NodeHealth()
    age = heartbeat_age(node, now)
    if age is None or age <= params.heartbeat_stale_seconds:
        return NodeHealth()
    return NodeHealth(Health.DEGRADED, (REASON_HEARTBEAT_STALE,), params.heartbeat_stale_risk)
