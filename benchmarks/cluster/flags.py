"""Which flags a Kubernetes version needs on this loopback control plane (pure).

Facts are read from the Kubernetes trees (``pkg/features/kube_features.go``: when a gate
went beta, GA, and was locked to its default; ``pkg/controlplane``: which
``resource.k8s.io`` versions are served by default):

* ``DynamicResourceAllocation``: beta and **off** in 1.32 and 1.33 (then the API server
  must also be told to serve ``resource.k8s.io/v1beta1``; 1.33 adds ``v1beta2``, which
  kubectl prefers), GA and on in 1.34, locked on from 1.35. ``resource.k8s.io/v1`` is
  served by default from 1.34.
* ``SchedulerQueueingHints``: beta in 1.28 (off) to 1.33 (on from 1.32), GA and locked on
  from 1.34: ``--feature-gates SchedulerQueueingHints=false`` makes kube-scheduler >= 1.34
  refuse to start.
* ``DRAPartitionableDevices`` (MIG-like partitions with shared counters): alpha and off in
  1.33 to 1.35, beta and on from 1.36. From 1.35 a ResourceSlice holds either devices or
  ``sharedCounters``, not both.
* ``DRAConsumableCapacity`` (shared devices: ``allowMultipleAllocations``, request
  ``capacity.requests``, result ``consumedCapacity`` and ``shareID``): alpha and off in 1.34
  and 1.35, beta and on from 1.36; unknown to 1.33 (its ``resource.k8s.io`` drops the
  fields).

A gate locked to its default may only be set to that default; :func:`usable_gates`
drops the entries a version would refuse, so callers can ask for what they want
everywhere and get what each version accepts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Version = tuple[int, int]
"""(major, minor), e.g. (1, 36)."""

OLDEST_DRA: Version = (1, 32)
"""Structured-parameters DRA (``resource.k8s.io/v1beta1``); older releases had alpha only."""

LOCKED: dict[str, tuple[Version, bool]] = {
    "SchedulerQueueingHints": ((1, 34), True),
    "DynamicResourceAllocation": ((1, 35), True),
}
"""gate -> (first version where it is locked, the locked value)."""

SINCE: dict[str, Version] = {
    "DynamicResourceAllocation": (1, 26),
    "SchedulerQueueingHints": (1, 28),
    "DRADeviceTaints": (1, 33),
    "DRAPartitionableDevices": (1, 33),
    "DRAConsumableCapacity": (1, 34),
    "DRADeviceTaintRules": (1, 35),
    "GenericWorkload": (1, 35),
    "GangScheduling": (1, 35),
}
"""gate -> first version that knows it (a version refuses to start with a gate it does not
know, so :func:`usable_gates` drops those)."""

DEFAULT_ON: dict[str, Version] = {
    "SchedulerQueueingHints": (1, 32),
    "DynamicResourceAllocation": (1, 34),
    "DRAPartitionableDevices": (1, 36),
}
"""gate -> first version where it is on by default (those this harness asks about)."""


class VersionError(ValueError):
    """A version string that names no Kubernetes release, or one this harness refuses."""


def parse_version(text: str) -> Version:
    """(major, minor) from ``Kubernetes v1.36.2``, ``v1.33.0``, ``1.36`` or a ``/version``
    minor such as ``36+``.

    Raises:
        VersionError: no ``M.N`` in ``text``.
    """
    m = re.search(r"v?(\d+)\.(\d+)", text)
    if m is None:
        raise VersionError(f"no Kubernetes version in {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_gates(entries: Iterable[str]) -> dict[str, bool]:
    """``["A=true", "B=false,C=true"]`` -> {A: True, B: False, C: True}, later entries
    winning.

    Raises:
        ValueError: an entry that is not ``Name=true|false``.
    """
    out: dict[str, bool] = {}
    for entry in entries:
        for part in entry.split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, value = part.partition("=")
            if not sep or value.lower() not in ("true", "false") or not name:
                raise ValueError(f"feature gate {part!r} is not Name=true|false")
            out[name] = value.lower() == "true"
    return out


def gate_on(version: Version, name: str, gates: dict[str, bool]) -> bool:
    """Whether gate ``name`` is on in ``version`` with ``gates`` set (unknown gates: as
    given, else off)."""
    if name in LOCKED and version >= LOCKED[name][0]:
        return LOCKED[name][1]
    if name in gates:
        return gates[name]
    return name in DEFAULT_ON and version >= DEFAULT_ON[name]


def usable_gates(version: Version, gates: dict[str, bool]) -> dict[str, bool]:
    """``gates`` without the entries ``version`` locks (it refuses a locked gate set to
    the other value, and setting it to the locked value does nothing) or does not know yet
    (:data:`SINCE`)."""
    return {
        k: v
        for k, v in gates.items()
        if not (k in LOCKED and version >= LOCKED[k][0]) and version >= SINCE.get(k, (0, 0))
    }


def gates_arg(gates: dict[str, bool]) -> tuple[str, ...]:
    """``("--feature-gates", "A=true,B=false")`` (sorted), or () for no gates."""
    if not gates:
        return ()
    return ("--feature-gates", ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items())))


@dataclass(frozen=True, slots=True)
class PlaneFlags:
    """What kube-apiserver and kube-scheduler are started with, for one version.

    Attributes:
        gates: feature gates for both (locked ones removed).
        runtime_config: kube-apiserver ``--runtime-config`` entries (``group/version=true``).
    """

    gates: dict[str, bool]
    runtime_config: tuple[str, ...]

    def apiserver_args(self) -> tuple[str, ...]:
        """The version-dependent kube-apiserver arguments."""
        rc = ("--runtime-config", ",".join(self.runtime_config)) if self.runtime_config else ()
        return (*gates_arg(self.gates), *rc)

    def scheduler_args(self) -> tuple[str, ...]:
        """The version-dependent kube-scheduler arguments."""
        return gates_arg(self.gates)


def plane_flags(
    version: Version,
    *,
    dra: bool,
    gates: Sequence[str] = (),
    runtime_config: Sequence[str] = (),
    workloads: bool = False,
) -> PlaneFlags:
    """The flags of a plane of ``version``, with DRA on when ``dra`` and the caller's
    extra ``gates`` (``Name=bool`` entries) and ``runtime_config`` entries.

    ``workloads`` serves Kubernetes' own gang API where this harness knows its shape: from
    1.36, ``scheduling.k8s.io/v1alpha2`` (PodGroup; alpha, off by default) with the gate
    ``GenericWorkload``; nothing on older versions.

    Raises:
        VersionError: ``dra`` on a version older than 1.32.
        ValueError: a malformed gate entry.
    """
    want = parse_gates(gates)
    rc = [r for r in runtime_config if r]
    if dra:
        if version < OLDEST_DRA:
            raise VersionError(
                f"DRA needs Kubernetes >= 1.32 (resource.k8s.io/v1beta1); "
                f"{version[0]}.{version[1]} has alpha DRA only"
            )
        if version < (1, 34):
            want = {"DynamicResourceAllocation": True, **want}
            served = ["resource.k8s.io/v1beta1=true"]
            if version >= (1, 33):
                served.append("resource.k8s.io/v1beta2=true")
            if version >= (1, 33) and want.get("DRADeviceTaints"):
                # kube-scheduler 1.33 watches DeviceTaintRules, served in v1alpha3 only
                served.append("resource.k8s.io/v1alpha3=true")
            rc = served + [r for r in rc if r not in served]
        elif want.get("DRADeviceTaintRules") and version >= (1, 36):
            # 1.36 serves DeviceTaintRules in v1beta2 (off by default)
            rc = [*rc, "resource.k8s.io/v1beta2=true"]
    if workloads and version >= (1, 36):
        want = {"GenericWorkload": True, **want}
        rc = [*rc, "scheduling.k8s.io/v1alpha2=true"]
    return PlaneFlags(usable_gates(version, want), tuple(dict.fromkeys(rc)))


def queueing_hints_off(version: Version) -> tuple[str, ...]:
    """kube-scheduler arguments that switch QueueingHints off where a version still lets
    them (<= 1.33), else ()."""
    return gates_arg(usable_gates(version, {"SchedulerQueueingHints": False}))


def separate_counter_slices(version: Version) -> bool:
    """True where a ResourceSlice may hold ``sharedCounters`` or devices, not both (>= 1.35)."""
    return version >= (1, 35)


def slice_api_version(version: Version, served: Sequence[str] = ()) -> str:
    """The ``resource.k8s.io`` version to write slices in: ``v1`` from 1.34, ``v1beta1``
    on 1.32/1.33 (what their kube-scheduler reads); ``served`` (discovery), when given,
    overrides a guess the server does not serve.

    Raises:
        VersionError: the server serves none of v1, v1beta1, v1beta2.
    """
    want = "v1" if version >= (1, 34) else "v1beta1"
    if not served or want in served:
        return want
    for v in ("v1", "v1beta1", "v1beta2"):
        if v in served:
            return v
    raise VersionError(f"resource.k8s.io is served in {list(served)}: none this harness writes")
