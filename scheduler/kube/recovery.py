"""Recovery after a (re)start: rebuild decisions from what the cluster keeps.

topoplace keeps no state of its own (STYLE.md §6): every decision is persisted where the
cluster keeps it, and replayed from there before serving.

1. **Bound placements.** Each pod bound by topoplace carries ``topoplace.io/placement``
   (node, GPU indices, gang, plan id), written on the Binding atomically with
   ``spec.nodeName``. The initial list feeds those pods to the cache, whose
   :func:`~scheduler.core.snapshot.build_snapshot` places recorded pods first, so their
   exact GPUs are held again. :func:`recover` only counts and checks them.
2. **Gang plans.** Live plans (members planned but not all bound yet) are rebuilt by the
   gang layer from the snapshot (bound members' placement records and the PodGroups in
   ``extra["podgroups"]``). :func:`recover_gang_plans` is the single integration point:
   it calls the gang handler's ``recover(cache)`` when it has one, else
   ``scheduler.core.gang.recover_plans(snapshot)`` when that module exists, and stores
   the result in ``cache.plans`` under the cache lock.

Readiness must stay false until :func:`recover` has returned (see ``runner.py``): a filter
served before recovery could hand a planned gang slot to another pod.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cache import ClusterCache
from scheduler.core.model import RESERVATION_PREFIX
from scheduler.core.objects import placement_of

log = logging.getLogger(__name__)

GANG_RECOVERY_MODULE = "scheduler.core.gang"
GANG_RECOVERY_FUNCTION = "recover_plans"


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery found.

    Attributes:
        pods: pods holding resources.
        placements: pods whose GPUs come from a readable placement record.
        inferred: pods holding GPUs without a usable record (indices inferred).
        mismatched: records naming another node than ``spec.nodeName`` (ignored).
        gangs: gang plans recovered.
        gang_source: where gang plans came from (``"none"`` when no gang layer exists).
    """

    pods: int
    placements: int
    inferred: int
    mismatched: int
    gangs: int
    gang_source: str


def _plans_count(plans: Any) -> int:
    try:
        return len(plans)
    except TypeError:
        return 0


def recover_gang_plans(cache: ClusterCache, gangs: Any = None) -> tuple[int, str]:
    """Rebuild live gang plans into the cache; returns (number of plans, source).

    Integration point with the gang layer, tried in order:

    1. ``gangs.recover(cache)`` if the gang handler has it (it stores plans itself and
       returns them or their number);
    2. ``scheduler.core.gang.recover_plans(snapshot) -> {gang key: plan}``, stored into
       ``cache.plans``;
    3. nothing (no gang layer): (0, "none").
    """
    hook = getattr(gangs, "recover", None)
    if callable(hook):
        out = hook(cache)
        n = out if isinstance(out, int) else _plans_count(out)
        return n, f"{type(gangs).__name__}.recover"
    try:
        mod = importlib.import_module(GANG_RECOVERY_MODULE)
    except ImportError as exc:
        if exc.name != GANG_RECOVERY_MODULE:
            raise
        return 0, "none"
    fn = getattr(mod, GANG_RECOVERY_FUNCTION, None)
    if not callable(fn):
        return 0, "none"
    with cache.lock:
        plans = fn(cache.snapshot())
        if isinstance(plans, Mapping):
            cache.plans.update(plans)
    return _plans_count(plans), f"{GANG_RECOVERY_MODULE}.{GANG_RECOVERY_FUNCTION}"


def recover(cache: ClusterCache, gangs: Any = None) -> RecoveryReport:
    """Check recovered placements and rebuild gang plans (call after the initial sync)."""
    snap = cache.snapshot()
    placements = inferred = mismatched = 0
    pods = 0
    for key, p in snap.pods.items():
        if key.startswith(RESERVATION_PREFIX):
            continue
        pods += 1
        if not p.gpus:
            continue
        if p.gpu_indices_known:
            placements += 1
        else:
            inferred += 1
            rec = placement_of(p.raw) if p.raw else None
            if rec is not None and rec.get("node") not in (None, p.node):
                mismatched += 1
                log.warning(
                    "pod %s: placement record names node %s but it is bound to %s",
                    key,
                    rec.get("node"),
                    p.node,
                )
    gangs_n, source = recover_gang_plans(cache, gangs)
    report = RecoveryReport(pods, placements, inferred, mismatched, gangs_n, source)
    log.info(
        "recovered %d placements from annotations (%d inferred, %d mismatched), %d gang plans (%s)",
        placements,
        inferred,
        mismatched,
        gangs_n,
        source,
    )
    return report
