"""PodDisruptionBudgets, read as kube-scheduler's preemption reads them.

Pure: functions of PodDisruptionBudget objects (``policy/v1``) and pods.

kube-scheduler's DefaultPreemption (``filterPodsWithPDBViolation`` in
``pkg/scheduler/framework/plugins/defaultpreemption``) walks a node's potential victims,
most important first, and charges each pod to every budget of its namespace whose selector
matches its labels: a budget starts at its ``status.disruptionsAllowed`` and a pod that
drives one below zero *violates* it. Pods without labels match nothing; a budget with a
missing, empty or invalid selector matches nothing; a pod already listed in the budget's
``status.disruptedPods`` is being disrupted already and is not charged. Violating pods are
given back first, and among candidate nodes the one with the fewest violating victims wins
before any priority is compared. :func:`violating` is that walk; ``core.preemption`` uses
it the same way, and also charges the members of a gang a victim breaks (topoplace evicts
them through the Eviction API, which a budget with no disruption left refuses).

``status.disruptionsAllowed`` is kept by the disruption controller of
kube-controller-manager; a budget it has not processed reads 0, exactly as kube-scheduler
reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.model import PodInfo
from scheduler.core.objects import meta, object_key

__all__ = [
    "BUDGETS_EXTRA",
    "Budgets",
    "DisruptionBudget",
    "budgets_from",
    "label_selector_matches",
    "violating",
]

BUDGETS_EXTRA = "poddisruptionbudgets"
"""``snapshot.extra`` key: ``{"namespace/name": PodDisruptionBudget object}``."""

MAX_EXPRESSIONS = 64
"""Selector terms read per budget (a budget with more matches nothing)."""


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """One PodDisruptionBudget as preemption reads it.

    Attributes:
        key: ``namespace/name``.
        namespace: the namespace its selector applies in.
        selector: ``spec.selector`` (None: missing, empty or invalid, so it matches nothing).
        allowed: ``status.disruptionsAllowed`` (0 when absent).
        disrupted: pod names in ``status.disruptedPods`` (not charged again).
    """

    key: str
    namespace: str
    selector: Mapping[str, Any] | None
    allowed: int
    disrupted: frozenset[str]

    def covers(self, p: PodInfo) -> bool:
        """True when the budget charges ``p``: same namespace, labels matched, not
        already being disrupted."""
        namespace, _, name = p.key.partition("/")
        return namespace == self.namespace and self._charges(name, _labels(p))

    def _charges(self, name: str, labels: Mapping[str, Any]) -> bool:
        """The pod ``name`` of this budget's namespace with ``labels`` is charged."""
        return (
            self.selector is not None
            and bool(labels)
            and name not in self.disrupted
            and label_selector_matches(self.selector, labels)
        )


def _labels(p: PodInfo) -> Mapping[str, Any]:
    """The pod's labels (empty when missing or malformed: a pod without labels matches no
    budget)."""
    labels = meta(p.raw).get("labels") if isinstance(p.raw, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _valid(selector: Any) -> Mapping[str, Any] | None:
    """The selector when it selects something and is well formed, else None (kube: a nil
    or empty selector matches nothing, an invalid one is skipped)."""
    if not isinstance(selector, Mapping):
        return None
    ml = selector.get("matchLabels") or {}
    me = selector.get("matchExpressions") or []
    if not isinstance(ml, Mapping) or not isinstance(me, list) or len(me) > MAX_EXPRESSIONS:
        return None
    if not ml and not me:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in ml.items()):
        return None
    for e in me:
        if not isinstance(e, Mapping) or not isinstance(e.get("key"), str):
            return None
        op, values = e.get("operator"), e.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return None
        if op in ("In", "NotIn") and not values:
            return None
        if op in ("Exists", "DoesNotExist") and values:
            return None
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return None
    return selector


def label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """``metav1.LabelSelector`` semantics on a valid selector: every ``matchLabels`` pair
    and every ``matchExpressions`` term (In, NotIn, Exists, DoesNotExist) holds."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or ():
        k, op, values = e["key"], e["operator"], e.get("values") or ()
        if op == "In" and labels.get(k) not in values:
            return False
        if op == "NotIn" and k in labels and labels[k] in values:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


class Budgets:
    """Budgets sorted by key, indexed so that a pod is matched only against the budgets
    of its namespace that could select it: those whose ``matchLabels`` include one of its
    labels (by the first pair), and those selecting by ``matchExpressions`` alone. A
    cluster with a budget per service then costs a few selector checks per pod, not one
    per budget (``topoplace bench preemption-latency --budgets``).

    Iterating gives the budgets in key order.
    """

    __slots__ = ("_all", "_by_pair", "_scan")

    def __init__(self, budgets: Iterable[DisruptionBudget]) -> None:
        self._all = tuple(sorted(budgets, key=lambda b: b.key))
        by_pair: dict[tuple[str, str, str], list[int]] = {}
        scan: dict[str, list[int]] = {}
        for j, b in enumerate(self._all):
            if b.selector is None:
                continue  # matches nothing
            ml = b.selector.get("matchLabels") or {}
            if ml:
                k = min(ml)
                by_pair.setdefault((b.namespace, k, ml[k]), []).append(j)
            else:
                scan.setdefault(b.namespace, []).append(j)
        self._by_pair = by_pair
        self._scan = scan

    def __iter__(self) -> Iterator[DisruptionBudget]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def __getitem__(self, j: int) -> DisruptionBudget:
        return self._all[j]

    def covering(self, p: PodInfo) -> list[int]:
        """Positions of the budgets that charge ``p`` (:meth:`DisruptionBudget.covers`)."""
        namespace, _, name = p.key.partition("/")
        labels = _labels(p)
        if not labels:
            return []
        seen = list(self._scan.get(namespace, ()))
        for k, v in labels.items():
            seen += self._by_pair.get((namespace, k, v), ())
        return sorted(j for j in set(seen) if self._all[j]._charges(name, labels))


def budgets_from(objects: Iterable[Any]) -> Budgets:
    """The budgets of PodDisruptionBudget objects, sorted by key (malformed parts read as
    kube-scheduler reads them: no selector matches nothing, no status allows nothing)."""
    out = []
    for obj in objects:
        if not isinstance(obj, Mapping):
            continue
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        allowed = status.get("disruptionsAllowed", 0)
        disrupted = status.get("disruptedPods")
        out.append(
            DisruptionBudget(
                key=object_key(obj),
                namespace=str(meta(obj).get("namespace") or "default"),
                selector=_valid(spec.get("selector")),
                allowed=allowed
                if isinstance(allowed, int) and not isinstance(allowed, bool)
                else 0,
                disrupted=frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
            )
        )
    return Budgets(out)


def violating(pods: Sequence[PodInfo], budgets: Budgets) -> frozenset[str]:
    """Keys of the pods of ``pods`` (most important first) that would violate a budget if
    all of them were disrupted: each pod is charged to every budget that covers it, and
    a pod that takes one below zero violates it."""
    if not len(budgets):
        return frozenset()
    left: dict[int, int] = {}
    out = set()
    for p in pods:
        for j in budgets.covering(p):
            left[j] = left.get(j, budgets[j].allowed) - 1
            if left[j] < 0:
                out.add(p.key)
    return frozenset(out)
