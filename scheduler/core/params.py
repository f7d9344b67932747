"""Policy parameters: what ``config/policy.yaml`` says, as one frozen value.

The core never reads files: callers load the YAML and pass the mapping to
:func:`SchedParams.from_config`. Unknown keys are rejected with a clear error so a typo in
a policy file is caught at start-up rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.core.health import HealthParams
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
    """

    decide_in_filter: bool = True
    nomination_ttl_seconds: float = 30.0


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
        return replace(
            p, extender=ExtenderParams(decide_in_filter=decide, nomination_ttl_seconds=ttl)
        )
