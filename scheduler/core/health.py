"""Node and GPU health from the signals real GPU clusters publish.

Pure: ``assess_node`` is a function of the Node object and the health parameters.
Which signal counts as fatal or degrading is data (:class:`HealthParams`), with defaults
taken from ``../shared/SIGNALS.md``:

* Ready condition not True -> UNHEALTHY ("node not ready").
* ``spec.unschedulable`` -> unschedulable ("node cordoned").
* Taints whose key is a known fault taint (not-ready, unreachable, NVSentinel's fault
  taints) with effect NoSchedule/NoExecute -> UNHEALTHY ("node tainted by a fault").
* NVSentinel ``dgxc.nvidia.com/nvsentinel-state`` in a quarantine/drain/remediation state
  -> UNHEALTHY ("node quarantined by NVSentinel").
* NVSentinel node conditions (``Gpu*``, ``SysLogs*``) with status True: fatal ones make
  the node UNHEALTHY ("GPU fault condition"), the rest DEGRADED with risk.
* Per-GPU exclusions (``hami.io/device-cordon``, ``volcano.sh/gpu-unhealthy-ids``) and
  allocatable below capacity remove GPUs, not the node: they go into ``bad_mask``.

Every reason string is a constant so kube-scheduler's event message aggregates them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.model import Health, NodeHealth

REASON_NOT_READY = "node not ready"
REASON_CORDONED = "node cordoned"
REASON_FAULT_TAINT = "node tainted by a fault"
REASON_NVSENTINEL = "node quarantined by NVSentinel"
REASON_GPU_FAULT = "GPU fault condition"
REASON_DEGRADED_CONDITION = "degraded health condition"
REASON_GPU_CORDON = "GPU excluded by per-GPU cordon"
REASON_GPU_ALLOCATABLE = "device plugin reports unhealthy GPUs"
REASON_GPU_UNRESOLVED = "GPU exclusion names an unknown device"

NVSENTINEL_STATE_LABEL = "dgxc.nvidia.com/nvsentinel-state"
HAMI_DEVICE_CORDON = "hami.io/device-cordon"
VOLCANO_UNHEALTHY_IDS = "volcano.sh/gpu-unhealthy-ids"
GPU_UUIDS_ANNOTATION = "topoplace.io/gpu-uuids"
HAMI_REGISTER = "hami.io/node-nvidia-register"


@dataclass(frozen=True, slots=True)
class HealthParams:
    """Which signals are fatal or degrading. Loaded from ``policy.yaml`` ``health:``."""

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
    fault_taints: tuple[str, ...] = (
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
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
    gpu_loss_risk: float = 0.2

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> HealthParams:
        """Build from the ``health:`` mapping of policy.yaml (unknown keys rejected)."""
        if not obj:
            return cls()
        known = set(cls.__dataclass_fields__)
        unknown = set(obj) - known
        if unknown:
            raise ValueError(f"unknown health settings: {sorted(unknown)}")
        kw: dict[str, Any] = {}
        for k, v in obj.items():
            kw[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)


def _conditions(node: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return ((node.get("status") or {}).get("conditions")) or ()


def node_ready(node: Mapping[str, Any]) -> bool:
    """True when the Node's Ready condition is True."""
    for c in _conditions(node):
        if c.get("type") == "Ready":
            return str(c.get("status")) == "True"
    return False


def _gpu_uuid_order(annotations: Mapping[str, str]) -> list[str]:
    """GPU UUIDs in index order, from topoplace's or HAMi's node annotation."""
    raw = annotations.get(GPU_UUIDS_ANNOTATION)
    if raw:
        return [u.strip() for u in raw.split(",") if u.strip()]
    raw = annotations.get(HAMI_REGISTER)
    if raw:
        # HAMi registers devices either as JSON (newer) or as ':'-separated records whose
        # first ','-separated field is the UUID (older).
        try:
            devs = json.loads(raw)
            if isinstance(devs, list):
                return [str(d.get("id") or d.get("ID") or "") for d in devs if isinstance(d, dict)]
        except ValueError:
            pass
        return [rec.split(",")[0].strip() for rec in raw.split(":") if rec.strip()]
    return []


def _excluded_gpus(annotations: Mapping[str, str], gpu_count: int) -> tuple[int, int]:
    """(bad_mask, unresolved) from per-GPU exclusion annotations.

    Entries may be GPU indices ("3") or UUIDs resolved through the node's UUID list. An
    entry that cannot be resolved is counted in ``unresolved``; the caller removes that
    many GPUs conservatively.
    """
    entries: list[str] = []
    for key in (HAMI_DEVICE_CORDON, VOLCANO_UNHEALTHY_IDS):
        raw = annotations.get(key)
        if raw:
            entries.extend(e.strip() for e in raw.split(",") if e.strip())
    if not entries:
        return 0, 0
    order = _gpu_uuid_order(annotations)
    bad = 0
    unresolved = 0
    for e in sorted(set(entries)):
        if e.isdigit() and int(e) < gpu_count:
            bad |= 1 << int(e)
        elif e in order and order.index(e) < gpu_count:
            bad |= 1 << order.index(e)
        else:
            unresolved += 1
    return bad, unresolved


def _remove_highest(mask_all: int, bad: int, count: int, gpu_count: int) -> int:
    """Mark ``count`` more GPUs bad, highest indices first (deterministic, conservative)."""
    i = gpu_count - 1
    while count > 0 and i >= 0:
        if not bad & (1 << i):
            bad |= 1 << i
            count -= 1
        i -= 1
    return bad & mask_all


def assess_node(
    node: Mapping[str, Any], gpu_capacity: int, gpu_allocatable: int, params: HealthParams
) -> NodeHealth:
    """Grade a Node object's health.

    Args:
        node: the Node object (camelCase Kubernetes JSON).
        gpu_capacity: physical GPUs.
        gpu_allocatable: GPUs advertised as allocatable.
        params: which signals are fatal or degrading.

    Returns:
        The verdict; never raises on odd input.
    """
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    state = Health.HEALTHY
    reasons: list[str] = []
    risk = 0.0

    def worse(s: Health, reason: str, r: float) -> None:
        nonlocal state, risk
        if s > state:
            state = s
        if reason not in reasons:
            reasons.append(reason)
        risk = max(risk, r)

    if not node_ready(node):
        worse(Health.UNHEALTHY, REASON_NOT_READY, 1.0)
    unschedulable = bool(spec.get("unschedulable"))
    if unschedulable:
        reasons.append(REASON_CORDONED)
    for t in spec.get("taints") or ():
        if t.get("key") in params.fault_taints and t.get("effect") in ("NoSchedule", "NoExecute"):
            worse(Health.UNHEALTHY, REASON_FAULT_TAINT, 1.0)
    if labels.get(NVSENTINEL_STATE_LABEL) in params.nvsentinel_bad_states:
        worse(Health.UNHEALTHY, REASON_NVSENTINEL, 1.0)
    for c in _conditions(node):
        if str(c.get("status")) != "True":
            continue
        ctype = c.get("type", "")
        if ctype in params.fatal_conditions:
            worse(Health.UNHEALTHY, REASON_GPU_FAULT, 1.0)
        elif ctype in params.degraded_conditions:
            worse(Health.DEGRADED, REASON_DEGRADED_CONDITION, params.degraded_condition_risk)

    all_mask = (1 << gpu_capacity) - 1
    bad, unresolved = _excluded_gpus(annotations, gpu_capacity)
    if bad:
        worse(Health.DEGRADED, REASON_GPU_CORDON, params.gpu_loss_risk)
    if unresolved:
        worse(Health.DEGRADED, REASON_GPU_UNRESOLVED, params.gpu_loss_risk)
        bad = _remove_highest(all_mask, bad, unresolved, gpu_capacity)
    missing = gpu_capacity - gpu_allocatable - (bad & all_mask).bit_count()
    if gpu_allocatable < gpu_capacity and missing > 0:
        worse(Health.DEGRADED, REASON_GPU_ALLOCATABLE, params.gpu_loss_risk)
        bad = _remove_highest(all_mask, bad, missing, gpu_capacity)
    return NodeHealth(
        state=state,
        reasons=tuple(reasons),
        risk=risk,
        bad_mask=bad & all_mask,
        unschedulable=unschedulable,
    )
