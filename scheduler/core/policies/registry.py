"""Registry of gang placement policies: one module per policy, registered by name.

A gang policy is a pure function ``plan(snapshot, gang, params) -> PlacementResult`` that
places every member of ``gang`` (all or nothing) on ``snapshot`` and never changes it.
Policies register themselves with the :func:`register` decorator when their module is
imported; :func:`get_policy` imports the built-in modules on first use, so importing this
module alone is cheap and free of import cycles: it imports no policy and nothing of
``scheduler.core.gang`` but types (planning several gangs, :func:`scheduler.core.gang.plan_gangs`,
looks policies up here).

Every registered policy must pass the same conformance tests (``tests/gang``): never
double-book a GPU, all-or-nothing, no mutation of its inputs, deterministic, and respect of
the gang's hard constraints (health, capacity, required level, NVLink exclusivity).

Contracts:
    * Names are lower-case, stable, and appear in results (``details["policy"]``) and in
      the CLI (``topoplace plan --policy``).
    * ``GANG_POLICIES`` is filled at import time only; callers treat it as read-only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler.core.gang import GangRequest
    from scheduler.core.params import SchedParams
    from scheduler.core.schedule import PlacementResult
    from scheduler.core.snapshot import ClusterSnapshot


class GangPolicy(Protocol):
    """Places a whole gang on a snapshot (pure; all or nothing)."""

    def __call__(
        self, snapshot: ClusterSnapshot, gang: GangRequest, params: SchedParams
    ) -> PlacementResult: ...


GANG_POLICIES: dict[str, GangPolicy] = {}
"""Registered gang policies by name (filled by :func:`register`)."""

_PRIMARY: dict[int, str] = {}

DEFAULT_GANG_POLICY = "topoplace"
"""The CP-SAT policy (also registered as ``cpsat``)."""

# Built-in policy modules, imported on first lookup. Order = order of listing.
BUILTIN_MODULES: tuple[str, ...] = (
    "scheduler.core.policies.cpsat",
    "scheduler.core.policies.greedy_topology",
    "scheduler.core.policies.first_fit",
    "scheduler.core.policies.kai_binpack",
    "scheduler.core.policies.kueue_bestfit",
    "scheduler.core.policies.kueue_balanced",
)

_loaded = False


def register(*names: str) -> Callable[[GangPolicy], GangPolicy]:
    """Decorator registering a policy under one or more names.

    Raises:
        ValueError: a name is already taken by a different policy.
    """

    def deco(fn: GangPolicy) -> GangPolicy:
        for name in names:
            old = GANG_POLICIES.get(name)
            if old is not None and old is not fn:
                raise ValueError(f"gang policy {name!r} is registered twice")
            GANG_POLICIES[name] = fn
        if names:
            _PRIMARY.setdefault(id(fn), names[0])
        return fn

    return deco


def load_builtin() -> None:
    """Import the built-in policy modules (idempotent)."""
    global _loaded
    if _loaded:
        return
    for mod in BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
    _loaded = True


def policy_names() -> list[str]:
    """Every registered name, sorted."""
    load_builtin()
    return sorted(GANG_POLICIES)


def distinct_policies() -> dict[str, GangPolicy]:
    """One entry per distinct policy, under its primary (first registered) name, sorted."""
    load_builtin()
    out: dict[str, GangPolicy] = {}
    for name in sorted(GANG_POLICIES):
        fn = GANG_POLICIES[name]
        primary = _PRIMARY.get(id(fn), name)
        out.setdefault(primary, fn)
    return dict(sorted(out.items()))


def get_policy(name: str) -> GangPolicy:
    """The policy registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the registered names.
    """
    load_builtin()
    try:
        return GANG_POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown gang policy {name!r}; registered: {', '.join(sorted(GANG_POLICIES))}"
        ) from None
