"""Policy parameters: what ``config/policy.yaml`` says, as one frozen value.

The core never reads files: callers load the YAML and pass the mapping to
:func:`SchedParams.from_config`. Unknown keys are rejected with a clear error so a typo in
a policy file is caught at start-up rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.core.health import (
    REASON_DEVICE_TAINT,
    REASON_FAULT_TAINT,
    REASON_GPU_FAULT,
    REASON_NOT_READY,
    REASON_NVSENTINEL,
    HealthParams,
)
from topology.fabric import Fabric
from topology.select import POLICIES


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Weights of the prioritize components (any non-negative scale)."""

    topology: float = 4.0
    health: float = 2.0
    packing: float = 4.0


@dataclass(frozen=True, slots=True)
class GangParams:
    """Gang planning parameters (CP-SAT pinned for determinism)."""

    plan_ttl_seconds: float = 60.0
    solver_time_limit_seconds: float = 1.0
    seed: int = 7
    workers: int = 1
    spare_nodes: int = 0
    weights: Mapping[str, float] = field(default_factory=dict)
    max_reserved_gpus_per_namespace: int = 1024
    plan_deadline_seconds: float = 3.0
    """Wall-clock deadline of one gang planning in the extender (from the filter request's
    arrival, queueing included), below kube-scheduler's extender ``httpTimeout`` (5 s in
    the shipped configuration). The solver's result depends only on its deterministic
    limit (``solver_time_limit_seconds``); the deadline is a guard: a planning that
    overruns it is refused whole (nothing reserved) and is not remembered as a refusal."""
    """GPUs the unbound slots of one namespace's gang plans may hold at once (a filter
    call plans and reserves a whole gang; this bounds what any caller can lock up for a
    TTL). 0: no bound."""


@dataclass(frozen=True, slots=True)
class ExtenderParams:
    """How the live extender hands its decision to kube-scheduler.

    Attributes:
        decide_in_filter: filter returns only the engine's choice among the feasible
            candidates of a single GPU pod, so kube-scheduler (which skips scoring when one
            node is left) places it exactly where the engine would; False returns every
            feasible node and leaves the choice to the scores.
        nomination_ttl_seconds: how long the GPUs chosen in filter stay held for the pod's
            bind (a retried filter or the bind itself ends the hold earlier).
        reasons_when_placed: a filter reply that offers a node also carries the reasons
            of the nodes that failed. Off by default: kube-scheduler reads those reasons
            only to explain a pod it cannot place (and to pick preemption candidates), so
            with a node offered they are work for both sides and nothing else (250 of them
            cost kube-scheduler about 130 us to decode); they are always sent when no node
            is offered, and always counted in ``/metrics`` and the decision record.
    """

    decide_in_filter: bool = True
    nomination_ttl_seconds: float = 30.0
    reasons_when_placed: bool = False


SHARING_BACKENDS = ("hami", "gpushare")
"""Fractional backends topoplace can hand a share to (see ``scheduler.core.fractional``)."""
HAMI_LOCK_MODES = ("hold", "release")


@dataclass(frozen=True, slots=True)
class SharingParams:
    """Fractional GPUs (``policy.yaml`` section ``sharing``).

    Attributes:
        policy: registered sharing policy that scores nodes and picks the device of a
            fractional pod (``scheduler.core.policies.sharing_policies``; ``fgd`` now).
        backends: backends topoplace hands shares through, in order of preference when a
            node publishes more than one; a node whose only backend is not listed takes
            no fractional pod from topoplace (its usage is still counted).
        backend_label: node label that names a node's backend explicitly (``hami``,
            ``gpushare`` or ``none``), over what the node publishes.
        gpushare_memory_unit_mib: MiB in one unit of ``aliyun.com/gpu-mem`` (the device
            plugin's ``--memory-unit``: GiB = 1024 by default, MiB = 1).
        popularity: share of the workload seen so far that the typical task shapes of
            FGD's fragmentation measure cover (the FGD artifact's 0.95).
        hami_lock: ``hold``: the HAMi node lock taken at bind stays until HAMi's device
            plugin releases it after Allocate (HAMi's protocol); ``release``: topoplace
            releases it as soon as the Binding is written (nodes without HAMi's device
            plugin, tests).
        hami_lock_expiry_seconds: a lock older than this is taken over (HAMi's 5 min).
        replicas: time-slicing / MPS replica nodes (``scheduler.core.replicas``):
            ``opt-in`` (pods that select replica nodes or ask ``nvidia.com/gpu.shared``
            take replicas there; no other GPU pod goes there) or ``off`` (replica nodes
            take no GPU pod from topoplace).
    """

    policy: str = "topoplace-share"
    backends: tuple[str, ...] = SHARING_BACKENDS
    backend_label: str = "topoplace.io/gpu-sharing"
    gpushare_memory_unit_mib: int = 1024
    popularity: float = 0.95
    hami_lock: str = "hold"
    hami_lock_expiry_seconds: float = 300.0
    replicas: str = "opt-in"

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> SharingParams:
        """Build from the ``sharing`` mapping; ValueError on unknown keys or bad values."""
        if not obj:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValueError("sharing must be a mapping")
        known = set(cls.__dataclass_fields__)
        if set(obj) - known:
            raise ValueError(f"unknown sharing settings: {sorted(set(obj) - known)}")
        p = cls()
        policy = obj.get("policy", p.policy)
        from scheduler.core.policies.sharing_policies import SHARING_POLICIES

        if policy not in SHARING_POLICIES or policy == "random":
            raise ValueError(
                f"sharing.policy {policy!r} is not a deterministic registered sharing policy"
            )
        backends = obj.get("backends", p.backends)
        if not isinstance(backends, list | tuple) or not all(
            b in SHARING_BACKENDS for b in backends
        ):
            raise ValueError(f"sharing.backends must be a list out of {list(SHARING_BACKENDS)}")
        unit = obj.get("gpushare_memory_unit_mib", p.gpushare_memory_unit_mib)
        if not isinstance(unit, int) or isinstance(unit, bool) or not 1 <= unit <= 1 << 20:
            raise ValueError("sharing.gpushare_memory_unit_mib must be an integer in 1..2^20")
        pop = obj.get("popularity", p.popularity)
        if not isinstance(pop, int | float) or isinstance(pop, bool) or not 0 < pop <= 1:
            raise ValueError("sharing.popularity must be in (0, 1]")
        lock = obj.get("hami_lock", p.hami_lock)
        if lock not in HAMI_LOCK_MODES:
            raise ValueError(f"sharing.hami_lock must be one of {list(HAMI_LOCK_MODES)}")
        expiry = obj.get("hami_lock_expiry_seconds", p.hami_lock_expiry_seconds)
        if not isinstance(expiry, int | float) or isinstance(expiry, bool) or expiry <= 0:
            raise ValueError("sharing.hami_lock_expiry_seconds must be > 0")
        replicas = obj.get("replicas", p.replicas)
        if replicas not in ("opt-in", "off"):
            raise ValueError("sharing.replicas must be one of ['opt-in', 'off']")
        label = obj.get("backend_label", p.backend_label)
        if not isinstance(label, str):
            raise ValueError("sharing.backend_label must be a string")
        return cls(
            policy=str(policy),
            backends=tuple(backends),
            backend_label=label,
            gpushare_memory_unit_mib=unit,
            popularity=float(pop),
            hami_lock=str(lock),
            hami_lock_expiry_seconds=float(expiry),
            replicas=str(replicas),
        )


PREEMPTION_START_MODES = ("off", "dry-run", "evict")


@dataclass(frozen=True, slots=True)
class PreemptionParams:
    """Preemption topoplace starts itself (policy.yaml ``preemption:``).

    kube-scheduler preempts only where its in-tree filters refuse the pod. A node it sends
    to the extender has passed them with every pod in place, so its dry run finds no
    victim there and it never calls ``preemptVerb`` for it: a pod that topoplace alone
    refuses (a GPU set without the required link, GPUs topoplace calls unhealthy,
    fractional pods whose GPU memory is taken) would wait behind pods of any lower
    priority (``scheduler.runtime.stranded``).

    Attributes:
        start: ``evict`` (topoplace chooses victims on those nodes as its ``preempt``
            verb would, never against a PodDisruptionBudget, and evicts them through the
            Eviction API), ``dry-run`` (log and count what it would evict) or ``off``.
    """

    start: str = "evict"

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> PreemptionParams:
        """Build from the ``preemption:`` mapping; ValueError on unknown keys or values."""
        if not obj:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValueError("preemption must be a mapping")
        if set(obj) - {"start"}:
            raise ValueError(f"unknown preemption settings: {sorted(set(obj) - {'start'})}")
        start = obj.get("start", cls.start)
        if start not in PREEMPTION_START_MODES:
            raise ValueError(
                f"preemption.start must be one of {list(PREEMPTION_START_MODES)}, got {start!r}"
            )
        return cls(start=str(start))


REMEDIATION_MODES = ("off", "dry-run", "evict")


@dataclass(frozen=True, slots=True)
class RemediationParams:
    """What topoplace does about pods on failed hardware (policy.yaml ``remediation:``).

    Attributes:
        mode: ``off`` (nothing), ``dry-run`` (log and count what would be evicted) or
            ``evict`` (evict through the Eviction API).
        after_seconds: how long a pod must have been on failed hardware before it is
            evicted.
        whole_gangs: evict every bound member of a gang one of whose members is on failed
            hardware (a gang cannot run with a member missing).
        node_reasons: UNHEALTHY node verdict reasons that mean failed hardware.
        gpu_reasons: per-GPU reasons that mean the GPU failed.
        grace_period_seconds: the evictions' grace period (None: each pod's own).
        max_evictions_per_minute: bound on evictions per minute (a whole gang waits for
            room, unless it is larger than the bound).
        max_failed_node_share: above this share of GPU nodes failed at once, nothing is
            evicted.
        check_seconds: how often the adapter looks.
    """

    mode: str = "dry-run"
    after_seconds: float = 60.0
    whole_gangs: bool = True
    node_reasons: tuple[str, ...] = (
        REASON_NOT_READY,
        REASON_FAULT_TAINT,
        REASON_NVSENTINEL,
        REASON_GPU_FAULT,
    )
    gpu_reasons: tuple[str, ...] = (REASON_DEVICE_TAINT,)
    grace_period_seconds: int | None = None
    max_evictions_per_minute: int = 60
    max_failed_node_share: float = 0.5
    check_seconds: float = 5.0

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> RemediationParams:
        """Build from the ``remediation:`` mapping of policy.yaml.

        Raises:
            ValueError: unknown keys or values out of range (the message names the key).
        """
        if not obj:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValueError("remediation must be a mapping")
        unknown = set(obj) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown remediation settings: {sorted(unknown)}")
        d = cls()
        mode = obj.get("mode", d.mode)
        if mode is False:  # YAML 1.1 reads a bare `off` as false
            mode = "off"
        if mode not in REMEDIATION_MODES:
            raise ValueError(
                f"remediation.mode must be one of {list(REMEDIATION_MODES)}, got {mode!r}"
            )
        whole = obj.get("whole_gangs", d.whole_gangs)
        if not isinstance(whole, bool):
            raise ValueError("remediation.whole_gangs must be true or false")
        reasons: dict[str, tuple[str, ...]] = {}
        for key in ("node_reasons", "gpu_reasons"):
            v = obj.get(key, getattr(d, key))
            if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"remediation.{key} must be a list of reason strings")
            reasons[key] = tuple(v)
        grace = obj.get("grace_period_seconds", d.grace_period_seconds)
        if grace is not None and (
            isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= 86400
        ):
            raise ValueError("remediation.grace_period_seconds must be null or 0..86400")
        nums = {}
        for key, lo, hi in (
            ("after_seconds", 0.0, 86400.0),
            ("max_failed_node_share", 0.0, 1.0),
            ("check_seconds", 0.05, 3600.0),
        ):
            v = obj.get(key, getattr(d, key))
            if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
                raise ValueError(f"remediation.{key} must be a number in {lo:g}..{hi:g}")
            nums[key] = float(v)
        rate = obj.get("max_evictions_per_minute", d.max_evictions_per_minute)
        if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= 100_000:
            raise ValueError("remediation.max_evictions_per_minute must be an integer >= 1")
        return cls(
            mode=mode,
            whole_gangs=whole,
            grace_period_seconds=grace,
            max_evictions_per_minute=rate,
            **reasons,
            **nums,
        )


RIGHTSIZE_MODES = ("off", "initial", "recreate")


@dataclass(frozen=True, slots=True)
class RightsizeParams:
    """The right-sizer inside the running extender (policy.yaml ``rightsize:``;
    ``docs/rightsizing.md``). Absent section: disabled.

    Attributes:
        enabled: True when the policy has a ``rightsize:`` section.
        prometheus_url: the Prometheus the recommender reads (``http://host:9090``).
        mode: ``off`` (recommendations published only: ``/metrics``,
            ``/v1/inspect/rightsize``, ``topoplace explain``, the workload's annotation),
            ``initial`` (also written into new pods by the admission webhook) or
            ``recreate`` (also: pods whose size is off by more than ``min_change`` are
            evicted one at a time, so their controller recreates them right-sized).
        interval_seconds: how often Prometheus is read and the recommendations decided.
        lookback_seconds: history read at start (the recommender's first decision).
        step_seconds: resolution of the series read (``query_range`` step).
        policies_file: a right-sizer policy file (``topoplace rightsize replay --policy``);
            read by the adapter, not here.
        policies: the same policies inline (a mapping with ``default`` / ``namespaces`` /
            ``workloads``); validated here, kept as given. Not both.
        namespaces: the namespaces right-sized (empty: all).
        annotate: write each recommendation on its workload (``topoplace.io/rightsize``).
        min_replicas: Recreate acts only on workloads with at least this many pods.
        min_age_seconds: Recreate evicts only pods at least this old.
        min_change: Recreate evicts a pod only when its GPU memory differs from the
            recommendation by more than this ratio (0.1: 10 %).
        min_eviction_interval_seconds: at most one Recreate eviction per this many seconds.
    """

    enabled: bool = False
    prometheus_url: str = ""
    mode: str = "off"
    interval_seconds: float = 60.0
    lookback_seconds: float = 86_400.0
    step_seconds: float = 60.0
    policies_file: str | None = None
    policies: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    namespaces: tuple[str, ...] = ()
    annotate: bool = True
    min_replicas: int = 2
    min_age_seconds: float = 600.0
    min_change: float = 0.1
    min_eviction_interval_seconds: float = 60.0

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> RightsizeParams:
        """Build from the ``rightsize:`` mapping of policy.yaml (None: disabled).

        Raises:
            ValueError: unknown keys, a missing ``prometheus_url``, values out of range or
                malformed inline policies (the message names the key).
        """
        if obj is None:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValueError("rightsize must be a mapping")
        known = set(cls.__dataclass_fields__) - {"enabled"}
        unknown = set(obj) - known
        if unknown:
            raise ValueError(
                f"unknown rightsize settings: {sorted(unknown)}; known: {sorted(known)}"
            )
        url = obj.get("prometheus_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError("rightsize.prometheus_url must be an http(s) URL")
        mode = obj.get("mode", "off")
        if mode is False:  # YAML 1.1 reads a bare ``off`` as false
            mode = "off"
        if mode not in RIGHTSIZE_MODES:
            raise ValueError(f"rightsize.mode must be one of {list(RIGHTSIZE_MODES)}, got {mode!r}")
        d = cls()
        nums: dict[str, float] = {}
        for key, lo, hi in (
            ("interval_seconds", 0.05, 86_400.0),
            ("lookback_seconds", 1.0, 30 * 86_400.0),
            ("step_seconds", 0.05, 3600.0),
            ("min_age_seconds", 0.0, 30 * 86_400.0),
            ("min_change", 0.0, 10.0),
            ("min_eviction_interval_seconds", 0.0, 86_400.0),
        ):
            v = obj.get(key, getattr(d, key))
            if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
                raise ValueError(f"rightsize.{key} must be a number in {lo:g}..{hi:g}")
            nums[key] = float(v)
        reps = obj.get("min_replicas", d.min_replicas)
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 2:
            raise ValueError("rightsize.min_replicas must be an integer >= 2")
        annotate = obj.get("annotate", True)
        if not isinstance(annotate, bool):
            raise ValueError("rightsize.annotate must be true or false")
        nss = obj.get("namespaces") or []
        if not isinstance(nss, list) or not all(isinstance(x, str) and x for x in nss):
            raise ValueError("rightsize.namespaces must be a list of namespace names")
        pfile = obj.get("policies_file")
        if pfile is not None and (not isinstance(pfile, str) or not pfile):
            raise ValueError("rightsize.policies_file must be a path")
        inline = obj.get("policies")
        if inline is not None:
            if pfile is not None:
                raise ValueError("rightsize: policies_file and policies are exclusive")
            from scheduler.core.rightsize import RightsizeError, policies_from_dict

            try:
                policies_from_dict(inline)
            except RightsizeError as exc:
                raise ValueError(f"rightsize.policies: {exc}") from None
        return cls(
            enabled=True,
            prometheus_url=url,
            mode=str(mode),
            policies_file=pfile,
            policies=inline,
            namespaces=tuple(nss),
            annotate=annotate,
            min_replicas=reps,
            **nums,
        )


@dataclass(frozen=True, slots=True)
class SchedParams:
    """Everything a decision depends on besides the snapshot and the request."""

    selection_policy: str = "nvidia-best-effort"
    weights: ScoreWeights = ScoreWeights()
    health: HealthParams = HealthParams()
    fabric: Fabric = Fabric()
    gang: GangParams = GangParams()
    placement_policy: str = "topoplace"
    extender: ExtenderParams = ExtenderParams()
    sharing: SharingParams = SharingParams()
    remediation: RemediationParams = RemediationParams()
    preemption: PreemptionParams = PreemptionParams()
    rightsize: RightsizeParams = RightsizeParams()

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None) -> SchedParams:
        """Build from a parsed policy.yaml mapping.

        Raises:
            ValueError: unknown sections or keys, or invalid values.
        """
        if not obj:
            return cls()
        known = {
            "scoring",
            "health",
            "fabric",
            "gang",
            "selection_policy",
            "placement_policy",
            "extender",
            "sharing",
            "remediation",
            "preemption",
            "rightsize",
        }
        unknown = set(obj) - known
        if unknown:
            raise ValueError(
                f"unknown policy sections: {sorted(unknown)}; expected {sorted(known)}"
            )
        p = cls()
        sel = obj.get("selection_policy", p.selection_policy)
        if sel not in POLICIES:
            raise ValueError(f"selection_policy {sel!r} is not one of {list(POLICIES)}")
        p = replace(p, selection_policy=sel)
        if "placement_policy" in obj:
            p = replace(p, placement_policy=str(obj["placement_policy"]))
        scoring = obj.get("scoring") or {}
        if set(scoring) - {"weights"}:
            raise ValueError(f"unknown scoring keys: {sorted(set(scoring) - {'weights'})}")
        w = scoring.get("weights") or {}
        if set(w) - {"topology", "health", "packing"}:
            raise ValueError(
                f"unknown scoring weights: {sorted(set(w) - {'topology', 'health', 'packing'})}"
            )
        weights = ScoreWeights(**{k: float(v) for k, v in w.items()})
        if (
            min(weights.topology, weights.health, weights.packing) < 0
            or (weights.topology + weights.health + weights.packing) <= 0
        ):
            raise ValueError("scoring weights must be non-negative and not all zero")
        p = replace(p, weights=weights, health=HealthParams.from_config(obj.get("health")))
        fab = obj.get("fabric")
        if fab and fab != {"levels": "default"} and fab.get("levels") != "default":
            p = replace(p, fabric=Fabric.from_config(fab))
        g = obj.get("gang") or {}
        gknown = set(GangParams.__dataclass_fields__)
        if set(g) - gknown:
            raise ValueError(f"unknown gang settings: {sorted(set(g) - gknown)}")
        gp = GangParams(**{k: (dict(v) if isinstance(v, Mapping) else v) for k, v in g.items()})
        if (
            gp.workers < 1
            or gp.solver_time_limit_seconds <= 0
            or gp.plan_ttl_seconds <= 0
            or not gp.plan_deadline_seconds > 0
        ):
            raise ValueError(
                "gang: workers >= 1, solver_time_limit_seconds > 0, plan_ttl_seconds > 0, "
                "plan_deadline_seconds > 0"
            )
        if not isinstance(gp.max_reserved_gpus_per_namespace, int) or (
            gp.max_reserved_gpus_per_namespace < 0
        ):
            raise ValueError("gang: max_reserved_gpus_per_namespace must be an integer >= 0")
        p = replace(p, gang=gp)
        e = obj.get("extender") or {}
        eknown = set(ExtenderParams.__dataclass_fields__)
        if set(e) - eknown:
            raise ValueError(f"unknown extender settings: {sorted(set(e) - eknown)}")
        decide = e.get("decide_in_filter", True)
        if not isinstance(decide, bool):
            raise ValueError("extender.decide_in_filter must be true or false")
        try:
            ttl = float(e.get("nomination_ttl_seconds", ExtenderParams().nomination_ttl_seconds))
        except (TypeError, ValueError):
            raise ValueError("extender.nomination_ttl_seconds must be a number") from None
        if not 0 < ttl <= 3600:
            raise ValueError("extender.nomination_ttl_seconds must be in (0, 3600]")
        reasons = e.get("reasons_when_placed", False)
        if not isinstance(reasons, bool):
            raise ValueError("extender.reasons_when_placed must be true or false")
        return replace(
            p,
            extender=ExtenderParams(
                decide_in_filter=decide, nomination_ttl_seconds=ttl, reasons_when_placed=reasons
            ),
            sharing=SharingParams.from_config(obj.get("sharing")),
            remediation=RemediationParams.from_config(obj.get("remediation")),
            preemption=PreemptionParams.from_config(obj.get("preemption")),
            rightsize=RightsizeParams.from_config(obj.get("rightsize")),
        )
