"""The GPU share right-sizer: how much GPU memory and compute each workload gets, and how it
shares a GPU, decided from measured usage within limits a team sets in advance.

Pure: no I/O and no clock. Time arrives only in the samples (``Sample.timestamp``, seconds);
inputs are never mutated. The edges feed it: ``scheduler.cli.rightsize`` (the offline replay),
``scheduler.kube.prometheus`` (series from a real Prometheus) and ``benchmarks.rightsize``.

The model (documented in ``docs/rightsizing.md``), anchored on the Vertical Pod Autoscaler's
recommender and changed where GPUs differ:

* **Peaks, not averages.** VPA keeps a decaying histogram of per-interval memory peaks and
  recommends its 90th percentile plus a 15 % safety margin. A GPU allocation that does not fit
  fails the request (a CUDA OOM, not a slow page-out), so the memory estimate here is the
  largest peak seen within the ``horizon`` (24 h: VPA's memory aggregation interval), never a
  percentile of them; the VPA-style decaying histogram is kept for compute, where a percentile
  is the right statistic (an SM share that is briefly too small slows, it does not fail).
* **Confidence from history length** (VPA: ``min(days of history, samples / 1440)``) widens the
  margin while the history is short: ``limit = peak x (1 + margin) x (1 + 1/c)^e``, with
  ``e = log2(1.15)`` so that the extra factor equals the margin itself at one day. The total
  headroom is 59 % after 6 hours, 32 % after a day and 18 % after a week.
* **Known weights are not uncertain.** When a policy states the model's weights
  (``model_weights``), they are resident and exact: the short-history widening covers only
  the peak above them (activations, KV cache, allocator caches), the margin the whole peak:
  ``(1 + margin) x (weights + (peak - weights) x (1 + 1/c)^e)``.
* **OOM bump at once.** Usage at or above the limit in force, or a recorded CUDA OOM /
  OOMKilled (metric ``oom_events``), raises the estimate to ``1.2 x`` the usage at the OOM
  (VPA's ratio) and the new limit is in force from the next instant, even if the change budget
  is spent (the OOM already restarted the container).
* **Preallocating servers** (vLLM: metric ``kv_cache_usage_ratio`` present) hold a flat
  used-memory series whatever they serve, so they are sized from their KV-cache use instead:
  ``non-KV memory + KV pool x peak KV use x headroom``.
* **Policies** (:class:`Policy`) clamp every recommendation: min/max memory, max tenants per
  GPU (and a GPU's compute limit, for placement), allowed modes, and a latency guard: while the workload's latency or queue metric is
  above its objective nothing shrinks.
* **Hysteresis.** A limit grows when the peak eats into the margin, shrinks only when the
  target is below ``(1 - margin)`` of it, and changes at most ``max_changes_per_day`` times in
  any 24 h (a shrink needs two changes of budget left, so a growth after it is always
  possible); compute and mode ride along (alone only while the latency guard is breached).
* **The sharing mode** (:func:`choose_mode`) follows from the measured compute, the memory
  limit, the guard and what the nodes offer (MIG profiles), with a one-line reason.

Why the memory limit is not tighter: on the shared GenAI pods, which idle near 22 GiB and
burst without warning to 40-47 GiB for an hour at a time, a limit with no OOM must hold the
burst level all day. Tighter models (a factor or a byte headroom over the maximum so far, a
steady floor plus scaled growth, slowly decaying peaks, fleet priors on peaks and on jumps
above a peak, each tuned on half the pods) have OOM samples on the other half at 1.8-2.1x;
this model keeps none at about 2.3x (``benchmarks/results/rightsize.md``,
``docs/rightsizing.md``).

Entry points: :class:`Recommender` (feed samples in time order, ask for the recommendation in
force) and :func:`replay` (a whole series -> the rows of ``recommendations.csv``; each row is
decided from data strictly before its timestamp).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import Any

from scheduler.core.quantity import parse_quantity_int

GiB = 1 << 30
MiB = 1 << 20

MEMORY = "gpu_memory_used_bytes"
UTILIZATION = "gpu_utilization_ratio"
KV_USAGE = "kv_cache_usage_ratio"
KV_CAPACITY = "kv_cache_capacity_bytes"
REQUESTS_WAITING = "requests_waiting"
LATENCY = "latency_seconds"
OOM_EVENTS = "oom_events"
METRICS: tuple[str, ...] = (
    MEMORY,
    UTILIZATION,
    KV_USAGE,
    KV_CAPACITY,
    REQUESTS_WAITING,
    LATENCY,
    OOM_EVENTS,
)
"""Metrics a series may carry. The replay's fixed interface needs only the first two; the
others come from the Prometheus reader (vLLM, guards) or from recorded OOMs."""
RATIO_METRICS = frozenset({UTILIZATION, KV_USAGE})
COMPUTE_STEP = 0.25
"""While the latency guard is breached, a compute share alone changes (a pod recreated) when
the estimate is a quarter of the SMs above it; otherwise compute and mode ride along with
memory changes."""

EXCLUSIVE = "exclusive"
MEMORY_SHARE = "memory-share"
TIME_SLICING = "time-slicing"
MPS = "mps"
MIG_PREFIX = "mig:"
BASE_MODES: tuple[str, ...] = (EXCLUSIVE, MEMORY_SHARE, TIME_SLICING, MPS, "mig")
"""Mode names a policy may allow (``mig`` allows every MIG profile the policy lists)."""

A100_80GB_MIG: tuple[tuple[str, int, float], ...] = (
    ("1g.10gb", 10 * GiB, 1 / 7),
    ("2g.20gb", 20 * GiB, 2 / 7),
    ("3g.40gb", 40 * GiB, 3 / 7),
    ("4g.40gb", 40 * GiB, 4 / 7),
    ("7g.80gb", 80 * GiB, 1.0),
)
"""MIG profiles of an A100/H100 80 GB (name, memory, share of the SMs), for policies that
write ``mig_profiles: a100-80gb``."""


class RightsizeError(ValueError):
    """Malformed policy or sample: the message says what and where."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One measurement: ``value`` of ``metric`` for a container at ``timestamp`` (seconds).

    Ratios (``gpu_utilization_ratio``, ``kv_cache_usage_ratio``) are 0..1; memory in bytes;
    ``oom_events`` > 0 records a CUDA OOM or an OOMKilled container at that time.
    """

    timestamp: float
    workload: str
    pod: str
    container: str
    metric: str
    value: float


@dataclass(frozen=True, slots=True)
class Params:
    """The recommender's few parameters, each with its reason (``docs/rightsizing.md``).

    Attributes:
        margin: safety margin on the memory peak and the compute percentile (VPA's 0.15).
        confidence_exponent: ``e`` in ``(1 + 1/c)^e``: the extra headroom while the history is
            short (c in days); ``log2(1.15)``: the extra factor is the margin itself at one day
            (+38 % at 6 h, +15 % at 1 day, +2.7 % at a week).
        horizon_s: how long a memory peak (or an OOM) counts: 24 h, VPA's memory interval.
        half_life_s: half-life of the compute histogram's weights (VPA's 24 h).
        compute_percentile: compute estimate (VPA's target CPU percentile, 0.9, raised to 0.95
            because co-located tenants add up their busy moments).
        oom_bump: ratio over the usage at an OOM (VPA's 1.2).
        max_changes_per_day: changes allowed per workload in any 24 h.
        gpu_memory_bytes: the GPU's memory when the policy does not say (80 GiB).
    """

    margin: float = 0.15
    confidence_exponent: float = 0.2016  # log2(1.15)
    horizon_s: float = 86_400.0
    half_life_s: float = 86_400.0
    compute_percentile: float = 0.95
    oom_bump: float = 1.2
    max_changes_per_day: int = 4
    gpu_memory_bytes: int = 80 * GiB


@dataclass(frozen=True, slots=True)
class Guard:
    """A latency guard: ``metric`` (``requests_waiting`` or ``latency_seconds``) must stay at
    or below ``objective``; while it does not, no recommendation shrinks."""

    metric: str
    objective: float


@dataclass(frozen=True, slots=True)
class Policy:
    """Limits a team sets in advance; every recommendation stays within them.

    Attributes:
        min_memory_bytes / max_memory_bytes: clamp of the memory limit (max also caps at the
            GPU's memory).
        max_tenants_per_gpu: 1 forces an exclusive GPU; otherwise the placer's co-location cap.
        gpu_compute_limit: the most of one GPU's SMs (a ratio, 0 < x <= 1) the tenants of a
            GPU may use together, each counted at its measured compute p95: share placement
            refuses a GPU where the workload's pod would take the sum past it (1.0: the
            whole GPU; lower keeps headroom for bursts above the p95).
        modes: allowed sharing modes (:data:`BASE_MODES`), in no particular order.
        guard: the latency guard, or None.
        gpu_memory_bytes: memory of the GPUs the workload runs on.
        mig_profiles: MIG profiles the nodes offer (name, memory bytes, SM share); empty: none.
        model_weights_bytes: the model's weights, resident and known: the short-history
            widening applies only above them (never above the lowest use seen); for preallocating servers
            without a KV capacity metric, the non-KV memory, so the KV pool is the rest.

    Raises:
        RightsizeError: ``gpu_compute_limit`` outside (0, 1].
    """

    min_memory_bytes: int = 1 * GiB
    max_memory_bytes: int = 80 * GiB
    max_tenants_per_gpu: int = 8
    gpu_compute_limit: float = 1.0
    modes: tuple[str, ...] = (EXCLUSIVE, MEMORY_SHARE, TIME_SLICING, MPS, "mig")
    guard: Guard | None = None
    gpu_memory_bytes: int = 80 * GiB
    mig_profiles: tuple[tuple[str, int, float], ...] = ()
    model_weights_bytes: int | None = None

    def __post_init__(self) -> None:
        x = self.gpu_compute_limit
        if isinstance(x, bool) or not isinstance(x, int | float) or not 0 < x <= 1:
            raise RightsizeError(f"gpu_compute_limit: {x!r} is not a number in (0, 1]")


@dataclass(frozen=True, slots=True)
class PolicySet:
    """A default policy with per-namespace and per-workload overrides (most specific wins).

    A workload named ``namespace/name`` is in ``namespace``; a bare name is in ``default``.
    """

    default: Policy = field(default_factory=Policy)
    namespaces: Mapping[str, Policy] = field(default_factory=dict)
    workloads: Mapping[str, Policy] = field(default_factory=dict)

    def for_workload(self, workload: str) -> Policy:
        """The policy in force for ``workload``."""
        if workload in self.workloads:
            return self.workloads[workload]
        ns = workload.split("/", 1)[0] if "/" in workload else "default"
        return self.namespaces.get(ns, self.default)


_POLICY_KEYS = frozenset(
    {
        "min_memory",
        "max_memory",
        "max_tenants_per_gpu",
        "gpu_compute_limit",
        "modes",
        "guard",
        "gpu_memory",
        "mig_profiles",
        "model_weights",
    }
)


def _bytes(value: object, where: str) -> int:
    try:
        return parse_quantity_int(value, low=0, high=1 << 50)
    except (ValueError, TypeError) as exc:
        raise RightsizeError(f"{where}: {value!r} is not a byte quantity ({exc})") from None


def policy_from_dict(data: Mapping[str, Any], base: Policy, where: str) -> Policy:
    """One policy block (``min_memory``, ``max_memory``, ``max_tenants_per_gpu``,
    ``gpu_compute_limit``, ``modes``, ``guard: {metric, objective}``, ``gpu_memory``,
    ``mig_profiles``, ``model_weights``) over ``base``. Quantities are Kubernetes quantities
    (``24Gi``) or byte counts; ``gpu_compute_limit`` is a number in (0, 1].

    Raises:
        RightsizeError: an unknown key, mode, guard metric or a malformed value.
    """
    if not isinstance(data, Mapping):
        raise RightsizeError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = set(data) - _POLICY_KEYS
    if unknown:
        raise RightsizeError(
            f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_POLICY_KEYS)}"
        )
    p = base
    if "min_memory" in data:
        p = replace(p, min_memory_bytes=_bytes(data["min_memory"], f"{where}.min_memory"))
    if "max_memory" in data:
        p = replace(p, max_memory_bytes=_bytes(data["max_memory"], f"{where}.max_memory"))
    if "gpu_memory" in data:
        p = replace(p, gpu_memory_bytes=_bytes(data["gpu_memory"], f"{where}.gpu_memory"))
    if "model_weights" in data:
        p = replace(p, model_weights_bytes=_bytes(data["model_weights"], f"{where}.model_weights"))
    if "max_tenants_per_gpu" in data:
        n = data["max_tenants_per_gpu"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RightsizeError(f"{where}.max_tenants_per_gpu: {n!r} is not an integer >= 1")
        p = replace(p, max_tenants_per_gpu=n)
    if "gpu_compute_limit" in data:
        x = data["gpu_compute_limit"]
        if isinstance(x, bool) or not isinstance(x, int | float) or not 0 < x <= 1:
            raise RightsizeError(f"{where}.gpu_compute_limit: {x!r} is not a number in (0, 1]")
        p = replace(p, gpu_compute_limit=float(x))
    if "modes" in data:
        modes = data["modes"]
        if not isinstance(modes, list) or not modes:
            raise RightsizeError(f"{where}.modes: expected a non-empty list of {list(BASE_MODES)}")
        bad = [m for m in modes if m not in BASE_MODES]
        if bad:
            raise RightsizeError(f"{where}.modes: unknown mode(s) {bad}; known: {list(BASE_MODES)}")
        p = replace(p, modes=tuple(modes))
    if "guard" in data:
        g = data["guard"]
        if g is None:
            p = replace(p, guard=None)
        else:
            if not isinstance(g, Mapping) or set(g) != {"metric", "objective"}:
                raise RightsizeError(f"{where}.guard: expected {{metric, objective}}")
            if g["metric"] not in (REQUESTS_WAITING, LATENCY):
                raise RightsizeError(
                    f"{where}.guard.metric: {g['metric']!r}; known: {REQUESTS_WAITING}, {LATENCY}"
                )
            try:
                objective = float(g["objective"])
            except (TypeError, ValueError):
                raise RightsizeError(
                    f"{where}.guard.objective: {g['objective']!r} is not a number"
                ) from None
            p = replace(p, guard=Guard(str(g["metric"]), objective))
    if "mig_profiles" in data:
        p = replace(p, mig_profiles=_mig_profiles(data["mig_profiles"], f"{where}.mig_profiles"))
    if p.min_memory_bytes > p.max_memory_bytes:
        raise RightsizeError(f"{where}: min_memory is above max_memory")
    return p


def _mig_profiles(value: object, where: str) -> tuple[tuple[str, int, float], ...]:
    if value == "a100-80gb" or value == "h100-80gb":
        return A100_80GB_MIG
    if not isinstance(value, list):
        raise RightsizeError(
            f"{where}: expected 'a100-80gb' or a list of {{name, memory, compute}}"
        )
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or set(item) != {"name", "memory", "compute"}:
            raise RightsizeError(f"{where}[{i}]: expected {{name, memory, compute}}")
        compute = float(item["compute"])
        if not 0 < compute <= 1:
            raise RightsizeError(f"{where}[{i}].compute: {compute} is not in (0, 1]")
        out.append((str(item["name"]), _bytes(item["memory"], f"{where}[{i}].memory"), compute))
    return tuple(sorted(out, key=lambda x: (x[1], x[2], x[0])))


def policies_from_dict(data: Mapping[str, Any] | None) -> PolicySet:
    """A :class:`PolicySet` from the policy file's mapping (``default``, ``namespaces``,
    ``workloads``; each block as in :func:`policy_from_dict`). Namespace blocks apply over the
    default, workload blocks over their namespace's.

    Raises:
        RightsizeError: malformed file, naming the block.
    """
    if data is None:
        return PolicySet()
    if not isinstance(data, Mapping):
        raise RightsizeError("policy: expected a mapping with default / namespaces / workloads")
    unknown = set(data) - {"default", "namespaces", "workloads"}
    if unknown:
        raise RightsizeError(f"policy: unknown key(s) {sorted(unknown)}")
    default = policy_from_dict(data.get("default") or {}, Policy(), "default")
    nss = {
        str(ns): policy_from_dict(block, default, f"namespaces.{ns}")
        for ns, block in (data.get("namespaces") or {}).items()
    }
    wls = {}
    for wl, block in (data.get("workloads") or {}).items():
        ns = str(wl).split("/", 1)[0] if "/" in str(wl) else "default"
        wls[str(wl)] = policy_from_dict(block, nss.get(ns, default), f"workloads.{wl}")
    return PolicySet(default, nss, wls)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The size and mode for every pod of a workload, in force from ``timestamp`` on.

    ``gpu_compute_ratio`` is the share of the GPU's SMs (0..1, in steps of 0.05);
    ``mode`` is one of :data:`BASE_MODES` with MIG written ``mig:<profile>``; ``reason`` is the
    one-line explanation of the size and the mode.
    """

    timestamp: float
    workload: str
    gpu_memory_limit_bytes: int
    gpu_compute_ratio: float
    mode: str
    reason: str
    oom: bool = False


class DecayingHistogram:
    """VPA's decaying histogram on 0..1 (compute ratios): 100 buckets of 0.01, each sample
    weighted ``2^((t - t_ref) / half_life)`` so that recent samples count more; the reference
    time moves forward when weights grow large (renormalisation keeps them finite).
    """

    BUCKETS = 100

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.weights = [0.0] * self.BUCKETS
        self.total = 0.0
        self.ref = 0.0
        self.started = False

    def add(self, value: float, t: float) -> None:
        """Add one sample of ``value`` (clamped to 0..1) taken at ``t``."""
        if not self.started:
            self.ref, self.started = t, True
        w = 2.0 ** ((t - self.ref) / self.half_life_s)
        if w > 1e6:
            scale = 1.0 / w
            self.weights = [x * scale for x in self.weights]
            self.total *= scale
            self.ref = t
            w = 1.0
        b = min(self.BUCKETS - 1, max(0, math.ceil(min(1.0, max(0.0, value)) * self.BUCKETS) - 1))
        self.weights[b] += w
        self.total += w

    def percentile(self, q: float) -> float:
        """The upper edge of the bucket holding the ``q`` quantile (0 when empty)."""
        if self.total <= 0:
            return 0.0
        acc = 0.0
        for i, w in enumerate(self.weights):
            acc += w
            if acc >= q * self.total:
                return (i + 1) / self.BUCKETS
        return 1.0


class _Window:
    """Sliding maximum over the last ``horizon`` seconds (monotonic deque, O(1) amortised)."""

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self.q: deque[tuple[float, float]] = deque()

    def add(self, t: float, v: float) -> None:
        while self.q and self.q[-1][1] <= v:
            self.q.pop()
        self.q.append((t, v))

    def max(self, now: float) -> float:
        while self.q and self.q[0][0] < now - self.horizon_s:
            self.q.popleft()
        return self.q[0][1] if self.q else 0.0


class WorkloadState:
    """Everything the recommender knows about one workload (mutable; owned by one
    :class:`Recommender`)."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.first_t: float | None = None
        self.last_t = 0.0
        self.memory_samples = 0
        self.mem_peak = _Window(params.horizon_s)
        self.mem_floor = _Window(params.horizon_s)  # of negated values: the minimum
        self.oom_floor = _Window(params.horizon_s)
        self.kv_peak = _Window(params.horizon_s)
        self.last_memory = 0.0
        self.kv_capacity: float | None = None
        self.util = DecayingHistogram(params.half_life_s)
        self.util_sum = 0.0
        self.util_n = 0
        self.guard_value: dict[str, float] = {}
        self.current: Recommendation | None = None
        self.changes: deque[float] = deque()
        self.oom_pending = False
        self.pods: dict[tuple[str, str], None] = {}


class Recommender:
    """Per-workload recommendations from samples fed in time order.

    Contract: :meth:`observe` samples with non-decreasing timestamps; :meth:`decide` at time
    ``t`` uses only samples observed so far (the caller feeds samples before ``t`` first) and
    returns the new recommendation when one is due at ``t``, else None. The recommendation in
    force is :meth:`current`. Not thread-safe; one instance per replay or per controller loop.
    """

    def __init__(self, policies: PolicySet | None = None, params: Params | None = None) -> None:
        self.policies = policies or PolicySet()
        self.params = params or Params()
        self.states: dict[str, WorkloadState] = {}

    def state(self, workload: str) -> WorkloadState:
        """The workload's state (created on first use)."""
        st = self.states.get(workload)
        if st is None:
            st = self.states[workload] = WorkloadState(workload, self.params)
        return st

    def current(self, workload: str) -> Recommendation | None:
        """The recommendation in force for ``workload`` (None before its first)."""
        st = self.states.get(workload)
        return st.current if st else None

    def observe(self, s: Sample) -> None:
        """Take one sample. Memory at or above the limit in force, or ``oom_events`` > 0, is an
        OOM: the estimate rises to ``oom_bump x`` the usage and a change is due at once."""
        st = self.state(s.workload)
        st.pods.setdefault((s.pod, s.container), None)
        if st.first_t is None:
            st.first_t = s.timestamp
        st.last_t = s.timestamp
        if s.metric == MEMORY:
            st.memory_samples += 1
            st.last_memory = s.value
            st.mem_peak.add(s.timestamp, s.value)
            st.mem_floor.add(s.timestamp, -s.value)
            limit = st.current.gpu_memory_limit_bytes if st.current else None
            # A preallocating server's used memory is its pool, not its need: no OOM from it.
            if limit is not None and s.value >= limit and not st.kv_peak.q:
                self._oom(st, s.timestamp, s.value)
        elif s.metric == UTILIZATION:
            st.util.add(s.value, s.timestamp)
            st.util_sum += s.value
            st.util_n += 1
        elif s.metric == KV_USAGE:
            st.kv_peak.add(s.timestamp, s.value)
        elif s.metric == KV_CAPACITY:
            st.kv_capacity = s.value
        elif s.metric in (REQUESTS_WAITING, LATENCY):
            st.guard_value[s.metric] = s.value
        elif s.metric == OOM_EVENTS:
            if s.value > 0:
                limit = st.current.gpu_memory_limit_bytes if st.current else 0
                self._oom(st, s.timestamp, max(float(limit), st.last_memory))
        else:
            raise RightsizeError(f"unknown metric {s.metric!r}; known: {', '.join(METRICS)}")

    def _oom(self, st: WorkloadState, t: float, usage: float) -> None:
        st.oom_floor.add(t, usage * self.params.oom_bump)
        st.oom_pending = True

    def start_at(self, now: float) -> None:
        """Make every workload's target at ``now`` the recommendation in force, with the
        whole change budget: for a recommender that has just learnt from a history in
        which none of its decisions were applied (the running right-sizer's first read)."""
        for wl, st in self.states.items():
            tgt = self.target(wl, now)
            if tgt is not None:
                st.current = tgt
            st.changes.clear()
            st.oom_pending = False

    def guard_breached(self, workload: str) -> bool:
        """Whether the workload's latency guard is above its objective (last value seen)."""
        st = self.states.get(workload)
        guard = self.policies.for_workload(workload).guard
        if st is None or guard is None:
            return False
        v = st.guard_value.get(guard.metric)
        return v is not None and v > guard.objective

    def confidence_days(self, st: WorkloadState, now: float) -> float:
        """VPA's confidence: the lesser of the history's length in days and the number of
        memory samples over one a minute for a day."""
        if st.first_t is None:
            return 0.0
        return min((now - st.first_t) / 86_400.0, st.memory_samples / 1440.0)

    def target(self, workload: str, now: float) -> Recommendation | None:
        """The unsmoothed recommendation for ``workload`` at ``now`` from what was observed
        (None without any memory sample). Hysteresis is :meth:`decide`'s."""
        st = self.states.get(workload)
        if st is None or st.memory_samples == 0:
            return None
        p, policy = self.params, self.policies.for_workload(workload)
        c = max(self.confidence_days(st, now), 1e-3)
        headroom = (1 + p.margin) * (1 + 1 / c) ** p.confidence_exponent
        why = []
        peak = st.mem_peak.max(now)
        kv_peak = st.kv_peak.max(now) if st.kv_peak.q else None
        if kv_peak is not None:
            pool = st.kv_capacity
            if pool is None and policy.model_weights_bytes is not None:
                pool = max(0.0, st.last_memory - policy.model_weights_bytes)
            if pool:
                non_kv = max(0.0, st.last_memory - pool)
                memory = non_kv + pool * min(1.0, kv_peak * headroom)
                why.append(
                    f"preallocating server: {non_kv / GiB:.1f} GiB + KV pool {pool / GiB:.1f} GiB"
                    f" x peak use {kv_peak:.0%} x {headroom:.2f}"
                )
            else:
                memory = peak * headroom
                why.append("preallocating server without KV capacity: sized from used memory")
        else:
            # Model weights the team states are resident and known: the headroom covers the
            # rest (activations, KV cache, allocator caches), never below the lowest use seen.
            floor = 0.0
            memory = peak * headroom
            if policy.model_weights_bytes:
                floor = min(float(policy.model_weights_bytes), -st.mem_floor.max(now))
            if floor:
                # the margin covers the whole peak, the short-history widening only its part
                # above the weights
                widen = headroom / (1 + p.margin)
                memory = (1 + p.margin) * (floor + (peak - floor) * widen)
                why.append(
                    f"(weights {floor / GiB:.1f} GiB + (peak {peak / GiB:.1f} GiB - weights)"
                    f" x {widen:.2f}) x {1 + p.margin:.2f} ({c:.2f} days of history)"
                )
            else:
                why.append(f"peak {peak / GiB:.1f} GiB x {headroom:.2f} ({c:.2f} days of history)")
        oom = st.oom_floor.max(now)
        if oom > memory:
            memory = oom
            why.append(f"OOM: {oom / GiB:.1f} GiB")
        cap = min(policy.max_memory_bytes, policy.gpu_memory_bytes)
        limit = int(min(cap, max(policy.min_memory_bytes, math.ceil(memory / MiB) * MiB)))
        if limit != math.ceil(memory / MiB) * MiB:
            why.append("clamped by policy")
        util_p = st.util.percentile(p.compute_percentile)
        util_mean = st.util_sum / st.util_n if st.util_n else 0.0
        compute = min(1.0, max(0.05, math.ceil(util_p * (1 + p.margin) * 20 - 1e-9) / 20))
        mode, mode_why = choose_mode(
            policy, limit, util_p, util_mean, self.guard_breached(workload), kv_peak is not None
        )
        if mode == EXCLUSIVE:
            compute = 1.0
        elif mode.startswith(MIG_PREFIX):
            prof = next(x for x in policy.mig_profiles if MIG_PREFIX + x[0] == mode)
            limit, compute = prof[1], prof[2]
        return Recommendation(
            now, workload, limit, round(compute, 4), mode, "; ".join([*why, mode_why])
        )

    def decide(self, workload: str, now: float) -> Recommendation | None:
        """The new recommendation in force from ``now``, or None when the one in force stays.

        Hysteresis: the first recommendation is made at the first decision after a memory
        sample; an OOM raises it at once (even with no budget left: the OOM restarted the
        container anyway); otherwise memory grows when the peak eats into the margin
        (``peak x (1 + margin) > limit``) and shrinks when the target is under
        ``(1 - margin)`` of the limit (never while the guard is breached, and only with two
        changes of budget left, so a growth after it stays possible). Compute and mode ride
        along with those changes; alone they change only while the guard is breached (to an
        exclusive GPU, or compute up by :data:`COMPUTE_STEP`). At most
        ``max_changes_per_day`` changes in any 24 h, OOM raises aside.
        """
        st = self.states.get(workload)
        if st is None:
            return None
        tgt = self.target(workload, now)
        if tgt is None:
            return None
        cur = st.current
        while st.changes and st.changes[0] <= now - 86_400.0:
            st.changes.popleft()
        left = self.params.max_changes_per_day - len(st.changes)
        m = self.params.margin
        new: Recommendation | None = None
        if cur is None:
            new = tgt
        elif st.oom_pending:
            if tgt.gpu_memory_limit_bytes > cur.gpu_memory_limit_bytes:
                new = replace(tgt, oom=True)
        elif left >= 1:
            peak = st.mem_peak.max(now)
            guard = self.guard_breached(workload)
            grow = (
                peak * (1 + m) > cur.gpu_memory_limit_bytes
                and tgt.gpu_memory_limit_bytes > cur.gpu_memory_limit_bytes
            )
            shrink = (
                left >= 2
                and not guard
                and tgt.gpu_memory_limit_bytes < cur.gpu_memory_limit_bytes * (1 - m)
            )
            # Compute and mode move a pod on their own only for the latency guard: a compute
            # shortfall slows a tenant (the guard measures it), it does not fail it.
            to_exclusive = guard and tgt.mode == EXCLUSIVE and cur.mode != EXCLUSIVE
            compute_up = guard and tgt.gpu_compute_ratio >= cur.gpu_compute_ratio + COMPUTE_STEP
            if grow or shrink:
                new = tgt
            elif to_exclusive or compute_up:
                new = replace(tgt, gpu_memory_limit_bytes=cur.gpu_memory_limit_bytes)
        st.oom_pending = False
        if new is None:
            return None
        if cur is not None:
            st.changes.append(now)
        st.current = new
        return new


def choose_mode(
    policy: Policy,
    limit_bytes: int,
    util_p: float,
    util_mean: float,
    guard_breached: bool,
    preallocating: bool,
) -> tuple[str, str]:
    """The sharing mode and its one-line reason, from the measured compute (``util_p``: the
    high percentile, ``util_mean``), the memory limit, the latency guard and the policy.

    Preference, first allowed wins:

    * one tenant per GPU allowed, the memory over 90 % of the GPU (nothing useful fits beside
      it), a compute percentile of 0.7 or more, or the guard breached: **exclusive**
      (co-location would hurt or cannot fit);
    * MIG profiles offered and one fits memory and compute: the smallest such **MIG** profile
      when compute is steady (p95 >= 0.3) or a guard is set (hardware isolation of SMs and
      memory bandwidth);
    * compute p95 of 0.3 or more: **MPS** (kernels of tenants run concurrently, each capped at
      its SM share), else a memory-isolated share;
    * otherwise a **memory-isolated share** (HAMi / gpushare / DRA capacity): low compute, the
      memory limit is what matters;
    * **time-slicing** last: it isolates neither memory nor SMs.
    """
    allowed = set(policy.modes)
    gpu = policy.gpu_memory_bytes
    frac = limit_bytes / gpu if gpu else 1.0
    order: list[tuple[str, str]] = []
    if policy.max_tenants_per_gpu <= 1:
        order.append((EXCLUSIVE, "policy allows one tenant per GPU"))
    if guard_breached:
        order.append((EXCLUSIVE, "latency guard breached: no co-location"))
    if frac > 0.9:
        order.append((EXCLUSIVE, f"needs {frac:.0%} of the GPU's memory: nothing fits beside it"))
    if util_p >= 0.7:
        order.append((EXCLUSIVE, f"compute p95 {util_p:.0%}: busy enough to need the GPU alone"))
    if "mig" in allowed and policy.mig_profiles and (util_p >= 0.3 or policy.guard is not None):
        for name, mem, sm in policy.mig_profiles:
            if mem >= limit_bytes and sm >= util_p:
                order.append(
                    (MIG_PREFIX + name, f"steady compute p95 {util_p:.0%}: MIG {name} isolates SMs")
                )
                break
    if util_p >= 0.3:
        order.append(
            (MPS, f"compute p95 {util_p:.0%}, mean {util_mean:.0%}: MPS runs tenants concurrently")
        )
    kind = "KV-sized " if preallocating else ""
    order.append(
        (
            MEMORY_SHARE,
            f"compute p95 {util_p:.0%}, mean {util_mean:.0%}: {kind}memory-isolated share",
        )
    )
    order.append((TIME_SLICING, "only time-slicing allowed: no memory isolation"))
    order.append((EXCLUSIVE, "no sharing mode allowed"))
    for mode, why in order:
        base = "mig" if mode.startswith(MIG_PREFIX) else mode
        if base in allowed:
            return mode, why
    return EXCLUSIVE, "no allowed mode fits: exclusive"


@dataclass(frozen=True, slots=True)
class Row:
    """One row of ``recommendations.csv``: the recommendation for a pod's container in force
    from ``timestamp`` on."""

    timestamp: float
    workload: str
    pod: str
    container: str
    gpu_memory_limit_bytes: int
    gpu_compute_ratio: float
    mode: str
    reason: str
    oom: bool


def replay(
    samples: Iterable[Sample],
    policies: PolicySet | None = None,
    params: Params | None = None,
) -> tuple[list[Row], Recommender]:
    """Replay a series: at every distinct timestamp ``t``, each workload with samples at ``t``
    is decided first, from the samples before ``t``; then the samples at ``t`` are taken. A
    recommendation decided at ``t`` is written for every (pod, container) of its workload seen
    so far and is in force from ``t`` on; a pod first seen at ``t`` gets the one in force then
    (as admission would give it), from its own samples nothing.

    Samples must be sorted by timestamp (stable within a timestamp). Returns the rows in time
    order (then workload, pod, container) and the recommender with its final state. Cost:
    one decision per workload and instant it has samples at.
    """
    rec = Recommender(policies, params)
    rows: list[Row] = []
    written: dict[str, set[tuple[str, str]]] = {}
    last_t: float | None = None
    for t, group in groupby(samples, key=lambda x: x.timestamp):
        if last_t is not None and t < last_t:
            raise RightsizeError(f"samples out of order at t={t}")
        last_t = t
        batch = list(group)
        for s in batch:  # the pod exists at t (not its values): it gets what is in force
            rec.state(s.workload).pods.setdefault((s.pod, s.container), None)
        for wl in sorted({s.workload for s in batch}):
            r = rec.decide(wl, t)
            cur = rec.current(wl)
            if cur is None:
                continue
            st = rec.states[wl]
            seen = written.setdefault(wl, set())
            targets = sorted(st.pods) if r is not None else sorted(set(st.pods) - seen)
            for pod, ctr in targets:
                seen.add((pod, ctr))
                rows.append(
                    Row(
                        t,
                        wl,
                        pod,
                        ctr,
                        cur.gpu_memory_limit_bytes,
                        cur.gpu_compute_ratio,
                        cur.mode,
                        cur.reason,
                        cur.oom and r is not None,
                    )
                )
        for s in batch:
            rec.observe(s)
    return rows, rec


def workloads_summary(rec: Recommender) -> Sequence[Recommendation]:
    """The final recommendation of every workload, sorted by name."""
    return [r for wl in sorted(rec.states) if (r := rec.current(wl)) is not None]
