"""The verb interface every pod kind implements, and what the kinds share.

A :class:`PodKind` answers kube-scheduler's verbs for one kind of pod (whole GPUs, gang
members, GPU shares, GPU replicas, DRA claims; see ``kinds.py`` for which pod is which). The
extender (``scheduler/server/extender.py``) parses the payloads, picks the pod's kind and calls
it; a kind reads and writes the extender's state only through :class:`Host`, so no module of
this package imports the extender.

Contracts shared by every kind:

* ``filter`` answers an ``ExtenderFilterResult`` and may nominate (hold) the chosen node's
  GPUs, shares or replicas for the bind (``extender.decide_in_filter``);
* ``score`` answers a ``HostPriorityList`` (0..10 per node);
* ``bind`` decides and holds what the pod gets on the node under the cache lock
  (``ClusterCache.assume_for_bind``): an error string, or a :class:`BindWrite` the extender
  writes through its binder and then settles (confirm or forget);
* ``preempt`` says what a preemption for the pod needs (:class:`PreemptAsk`), or None when
  kube-scheduler's own victims go back unchanged;
* ``explain`` is the one-line why of binding the pod to a node, for its placement record.

Errors are data: nothing here raises for a pod it cannot place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler.core.fractional import ShareRequest
from scheduler.core.model import PodInfo, PodRequest
from scheduler.core.objects import meta, pod_resource
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.schedule import (
    REASON_NOT_CHOSEN,
    REASON_UNKNOWN_NODE,
    FilterOutcome,
    PlacementResult,
    selector_matches,
    verdict_reason,
)
from scheduler.core.snapshot import BLOCKED_SHARED, ClusterSnapshot

ERR_UNKNOWN_POD = "unknown pod: it was never seen in a filter call"
ERR_UID_MISMATCH = "pod UID does not match the pod seen in filter"
ERR_OTHER_NODE = "pod is already bound to another node"
ERR_NOT_OUR_PROFILE = "pod's schedulerName is not one of topoplace's profiles"
ERR_ALREADY_BOUND = "pod is already bound"
ERR_NO_ROOM_CPU_MEMORY = "node lacks the CPU or memory the pod requests"
ERR_BIND_IN_FLIGHT = REASON_BIND_IN_FLIGHT = "the pod's bind to another node is still being written"
"""Filter's reason for the other nodes, and bind's error for another node, while a bind of
the pod is in flight (``ClusterCache.binding``): kube-scheduler gave up on it after its
``httpTimeout`` and scheduled the pod again, but the write may still land."""
REASON_NODE_SELECTOR = "node does not match the pod's nodeSelector"


class Binder(Protocol):
    """Writes a binding somewhere. Returns "" on success or an error message."""

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> str:
        """Bind ``pod`` to ``node`` with ``annotations`` merged onto the pod."""
        ...


class SnapshotBinder:
    """Binder for snapshot mode: the cache is the only record; nothing to write."""

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> str:
        """Always succeeds: the caller has already assumed the placement."""
        return ""


@dataclass(frozen=True, slots=True)
class BindWrite:
    """A bind decided and held (a kind's ``bind``), waiting for its write."""

    key: str
    pod: Mapping[str, Any]
    annotations: Mapping[str, str]
    req: PodRequest
    node: str = ""
    gpus: tuple[int, ...] = ()
    why: str = ""
    """The decision's one-line summary written into the placement record (for the
    decision records)."""


@dataclass(frozen=True, slots=True)
class PreemptAsk:
    """What a preemption for a pod needs (a kind's ``preempt``).

    Attributes:
        share: the GPU share the victims must leave room for (a fractional pod), else None.
        scope: for a gang member, called with the snapshot once the preemption is not
            waiting for an earlier one: ``(nodes, why)``, the nodes the victims may be on
            (None: any) and, when non-empty, why no victim is named at all.
    """

    share: ShareRequest | None = None
    scope: Callable[[ClusterSnapshot], tuple[frozenset[str] | None, str]] | None = None


class GangHandler(Protocol):
    """Gang-aware hooks (see ``scheduler/runtime/gangs.py``). Each returns None for pods it does
    not handle, so the single-pod path runs."""

    def filter(
        self, ext: Any, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> FilterOutcome | None: ...

    def prioritize(
        self, ext: Any, req: PodRequest, names: list[str]
    ) -> list[tuple[str, int]] | None: ...

    def choose(self, ext: Any, snap: ClusterSnapshot, req: PodRequest, node: str) -> Any:
        """A ``MemberPlacement`` (gpus, gang, plan record) for a planned member, an error
        string, or None for pods it does not handle."""
        ...

    def bound(self, ext: Any, req: PodRequest, ok: bool) -> None: ...

    def preemption_plan(
        self, ext: Any, snap: ClusterSnapshot, req: PodRequest
    ) -> PlacementResult | None:
        """The placement of ``req``'s gang if every pod of lower priority were gone, or
        None for a pod it does not handle."""
        ...

    def what_if(self, ext: Any, snap: ClusterSnapshot, req: PodRequest) -> PlacementResult | None:
        """The placement of ``req``'s gang on ``snap``, or None for a pod it does not
        handle (the victim search of a preemption topoplace starts for a gang)."""
        ...

    def pending_members(self, ext: Any, gang: str) -> list[PodRequest]:
        """The requests of ``gang``'s members seen and still pending."""
        ...

    def plan_now(self, ext: Any, gang: str, why: str) -> str:
        """Plan ``gang`` now and wake its parked members; the plan id or ""."""
        ...


class Host(Protocol):
    """What a pod kind uses of the extender (:class:`scheduler.server.extender.Extender`).

    Attributes are the extender's state (one cache, its metrics, decision records, the DRA
    router, the gang handler, parked and stranded pods, the preemption ledger, the sharing
    memos); methods are the steps every kind's verbs share.
    """

    cache: Any
    metrics: Any
    decisions: Any
    dra: Any
    gangs: GangHandler | None
    parked: Any
    stranded: Any
    preemptions: Any
    share_fits: Any
    share_shapes: Any
    share_dist: Any

    @property
    def params(self) -> Any:
        """The scheduling parameters."""
        ...

    def request(self, pod: Mapping[str, Any], head: bytes | None = None) -> PodRequest:
        """``request_from_pod(pod)``, memoized for the body ``head`` (ObjectError if invalid)."""
        ...

    def ours(self, pod: Mapping[str, Any]) -> bool:
        """Whether topoplace binds this pod (its schedulerName is one of the profiles)."""
        ...

    def decision_snapshot(self, req: PodRequest) -> ClusterSnapshot:
        """The snapshot a single pod's filter decides on (cache lock held)."""
        ...

    def filter_reply(
        self, out: FilterOutcome, items: list[Mapping[str, Any]] | None
    ) -> dict[str, Any]:
        """Count a filter's outcome and answer it."""
        ...

    def send_reasons(self, offered: int) -> bool:
        """Whether a filter reply offering ``offered`` nodes carries failed nodes' reasons."""
        ...

    def note_outcome(
        self, pod: Mapping[str, Any], req: PodRequest, offered: bool, room: Iterable[str] = ()
    ) -> bool:
        """Tell parked and stranded pods what filter answered; True for a refusal noted."""
        ...

    def count_groups(
        self, feasible: int, groups: list[tuple[bool, str, int]], not_chosen: int = 0
    ) -> None:
        """Count a vector verdict into the metrics."""
        ...

    def name_table(self, snap: ClusterSnapshot) -> Any:
        """The serialized-name table of the snapshot's node set, or None."""
        ...


class PodKind(ABC):
    """One kind of pod and its verbs (see the module docstring for the contracts).

    ``filter``, ``score`` and ``bind`` are each kind's own; ``preempt`` defaults to passing
    kube-scheduler's victims back (None), ``explain`` to no summary, and the ``*_fast``
    variants (answers serialized straight from node positions) to None, "take the general
    path".
    """

    name = ""

    @abstractmethod
    def filter(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """``ExtenderFilterResult`` for ``pod`` over ``names`` (``items``: the Node
        objects, when kube-scheduler sent them)."""

    @abstractmethod
    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """``HostPriorityList`` for ``pod`` over ``names``."""

    @abstractmethod
    def bind(
        self,
        ext: Host,
        key: str,
        pod: Mapping[str, Any],
        req: PodRequest,
        node: str,
        uid: str,
    ) -> BindWrite | str:
        """Decide and hold the bind of ``pod`` (``key``, ``uid``) to ``node``: an error, or
        what to write."""

    def preempt(self, ext: Host, pod: Mapping[str, Any], req: PodRequest) -> PreemptAsk | None:
        """What a preemption for ``pod`` needs; None: kube-scheduler's victims go back."""
        return None

    def explain(self, ext: Host, req: PodRequest, node: str) -> str:
        """The one-line why of binding ``req`` to ``node`` ("" when none is held)."""
        return ""

    def filter_fast(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: Any,
        items: list[Mapping[str, Any]] | None,
    ) -> bytes | None:
        """The filter reply serialized from node positions, or None (general path).
        ``names``: as ``wire.extender_args`` returns them with ``defer_names``."""
        return None

    def score_fast(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: Any
    ) -> bytes | None:
        """The prioritize reply serialized from node positions, or None (general path)."""
        return None


def spec_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's spec, or an empty mapping when it is missing or malformed."""
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def zero_scores(names: Iterable[str]) -> list[dict[str, Any]]:
    """A ``HostPriorityList`` of 0 for every node (a pod topoplace cannot read)."""
    return [{"Host": n, "Score": 0} for n in names]


# ---- what the sharing kinds (shares, replicas) share ------------------------------------


def precheck(
    snap: ClusterSnapshot,
    pod_req: PodRequest,
    name: str,
    failed: dict[str, str],
    unres: dict[str, str],
    shared_ok: bool = False,
) -> int | None:
    """The row of node ``name`` when it passes the checks every sharing pod shares (known,
    not blocked, matches the pod's nodeSelector), else None with its reason recorded in
    ``failed`` / ``unres``. ``shared_ok``: a node blocked only for GPU sharing
    (``BLOCKED_SHARED``) passes (replica nodes are such nodes)."""
    i = snap.index.get(name)
    if i is None:
        failed[name] = REASON_UNKNOWN_NODE
        return None
    code = int(snap.arrays.blocked[i])
    if code and not (shared_ok and code == BLOCKED_SHARED):
        unres[name] = verdict_reason(snap, code, i)
        return None
    if not selector_matches(snap.nodes[i].labels, pod_req.node_selector):
        unres[name] = REASON_NODE_SELECTOR
        return None
    return i


def hold_on(ext: Host, pod: Mapping[str, Any], pod_req: PodRequest, node: str, **hold: Any) -> bool:
    """Nominate ``pod`` on ``node`` with ``hold`` (its shares or replicas) for
    ``extender.nomination_ttl_seconds``; False when they are taken."""
    info = PodInfo(
        key=pod_req.key,
        uid=str(meta(pod).get("uid") or ""),
        node=node,
        gpus=(),
        cpu_milli=pod_resource(pod, "cpu", cpu_milli),
        memory_bytes=pod_resource(pod, "memory", quantity_int),
        assumed=True,
        raw=pod,
        **hold,
    )
    return bool(ext.cache.nominate(info, ext.params.extender.nomination_ttl_seconds))


def nominate_winner(
    ext: Host,
    pod: Mapping[str, Any],
    pod_req: PodRequest,
    node: str,
    feasible: list[str],
    failed: dict[str, str],
    **hold: Any,
) -> list[str]:
    """With ``extender.decide_in_filter`` (and the pod ours): hold filter's winner ``node``
    for the pod's bind (``hold``: its shares or replicas); once held, the other feasible
    nodes fail as not chosen (in ``failed``) and only ``node`` is returned, else
    ``feasible`` as it was."""
    if not (ext.params.extender.decide_in_filter and ext.ours(pod)):
        return feasible
    if not hold_on(ext, pod, pod_req, node, **hold):
        return feasible
    for n in feasible:
        if n != node:
            failed[n] = REASON_NOT_CHOSEN
    return [node]


def sharing_reply(
    ext: Host,
    feasible: list[str],
    failed: dict[str, str],
    unres: dict[str, str],
    items: list[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """Count a sharing pod's filter outcome and answer it (``Host.filter_reply``)."""
    return ext.filter_reply(FilterOutcome(tuple(feasible), failed, unres), items)
