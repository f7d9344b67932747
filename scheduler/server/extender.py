"""The extender's verbs as plain methods: parsed payload in, wire result out.

This layer owns no HTTP (see ``app.py``) and no Kubernetes I/O (a :class:`Binder` does
the API write). It turns extender payloads into core requests, runs the pure core on one
snapshot per call, keeps assumptions in the :class:`~scheduler.cache.ClusterCache`, and
records metrics.

Concurrency: kube-scheduler calls filter and prioritize one pod at a time but bind runs
asynchronously, so any verb may overlap a bind. Decisions read an immutable snapshot;
bind chooses and assumes GPUs atomically under the cache lock, so two binds can never
be given the same GPU.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from operator import getitem
from typing import Any, Protocol

import orjson

from scheduler.cache import ClusterCache
from scheduler.core.model import PLACEMENT_ANNOTATION, RESERVATION_PREFIX, PodInfo, PodRequest
from scheduler.core.objects import (
    ObjectError,
    meta,
    placement_value,
    pod_resource,
    request_from_pod,
)
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.schedule import (
    MAX_SCORE,
    REASON_UNKNOWN_NODE,
    FilterOutcome,
    choose_gpus,
    filter_nodes,
    name_positions,
    score_list,
    score_nodes,
)
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.server import wire
from scheduler.server.metrics import Metrics

log = logging.getLogger(__name__)

ERR_UNKNOWN_POD = "unknown pod: it was never seen in a filter call"
ERR_UID_MISMATCH = "pod UID does not match the pod seen in filter"
ERR_OTHER_NODE = "pod is already bound to another node"


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


class GangHandler(Protocol):
    """Gang-aware hooks (see ``scheduler/gangs.py``). Each returns None for pods it does
    not handle, so the single-pod path runs."""

    def filter(
        self, ext: Extender, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> FilterOutcome | None: ...

    def prioritize(
        self, ext: Extender, req: PodRequest, names: list[str]
    ) -> list[tuple[str, int]] | None: ...

    def choose(
        self, ext: Extender, snap: ClusterSnapshot, req: PodRequest, node: str
    ) -> tuple[tuple[int, ...], str, str] | str | None:
        """(gpus, gang, plan id) for a planned member, an error string, or None."""
        ...

    def bound(self, ext: Extender, req: PodRequest, ok: bool) -> None: ...


def _bound_pod(pod: Mapping[str, Any], node: str, annotation: str) -> dict[str, Any]:
    """The Pod object as the API server would show it after the binding."""
    m = dict(meta(pod))
    m["annotations"] = {**(m.get("annotations") or {}), PLACEMENT_ANNOTATION: annotation}
    spec = {**(pod.get("spec") or {}), "nodeName": node}
    return {**pod, "metadata": m, "spec": spec}


def _merge_gang(base: FilterOutcome, planned: FilterOutcome) -> FilterOutcome:
    """Combine the gang plan's verdict with the single-pod verdict.

    The plan decides which node a member may use (its own GPUs are reserved, so the
    single-pod filter would call that node full); broken hardware stays "never"
    (FailedAndUnresolvableNodes), so kube-scheduler's event names the real cause and
    preemption does not evict pods for a node that cannot serve anyway.
    """
    unres = dict(base.unresolvable)
    feasible = tuple(n for n in planned.feasible if n not in unres)
    failed = {n: r for n, r in planned.failed.items() if n not in unres}
    failed.update((n, r) for n, r in planned.unresolvable.items() if n not in unres)
    return FilterOutcome(feasible, failed, unres)


_SCORE_TAIL = tuple(f"{i}}}".encode() for i in range(MAX_SCORE + 1))
"""Serialized endings of a HostPriority entry, by score."""


class Extender:
    """filter / prioritize / bind / preempt over one cache.

    Args:
        cache: the cluster cache.
        binder: writes bindings (snapshot mode: :class:`SnapshotBinder`).
        metrics: Prometheus metrics.
        ready: returns True once the cache is synced and plans are recovered.
        gangs: gang-aware hooks, or None to treat every pod alone.
        fetch_pod: looks up a Pod object by key when bind meets a pod it has not seen in
            filter (kube mode: a GET from the API); None in snapshot mode.
    """

    def __init__(
        self,
        cache: ClusterCache,
        binder: Binder | None = None,
        metrics: Metrics | None = None,
        ready: Callable[[], bool] = lambda: True,
        gangs: GangHandler | None = None,
        fetch_pod: Callable[[str, str], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.cache = cache
        self.binder = binder or SnapshotBinder()
        self.metrics = metrics or Metrics()
        self.ready = ready
        self.gangs = gangs
        self.fetch_pod = fetch_pod
        self._host_entries: tuple[Any, list[tuple[bytes, ...]]] | None = None

    @property
    def params(self) -> Any:
        """The scheduling parameters."""
        return self.cache.params

    # ---- filter -------------------------------------------------------------------------

    def filter(self, body: Any) -> dict[str, Any]:
        """``ExtenderArgs`` -> ``ExtenderFilterResult``. Raises WireError on bad input."""
        pod, use_names, items = wire.extender_args(body)
        try:
            req = request_from_pod(pod, self.params.fabric)
        except ObjectError as exc:
            self.metrics.filter_errors.labels(reason="invalid pod").inc()
            return wire.filter_result(None, None, {}, {}, f"invalid pod: {exc}")
        if req.gpus > 0:
            self.cache.remember_pending(pod)
        out: FilterOutcome | None = None
        if self.gangs is not None and req.gang:
            planned = self.gangs.filter(self, pod, req, use_names)
            if planned is not None:
                base = filter_nodes(self.cache.snapshot(), req, use_names, self.params)
                out = _merge_gang(base, planned)
        if out is None:
            out = filter_nodes(self.cache.snapshot(), req, use_names, self.params)
        self._count_filter(out)
        if items is None:
            return wire.filter_result(list(out.feasible), None, out.failed, out.unresolvable)
        keep = set(out.feasible)
        return wire.filter_result(
            None,
            [n for n in items if wire.node_name_of(n) in keep],
            out.failed,
            out.unresolvable,
        )

    def _count_filter(self, out: FilterOutcome) -> None:
        m = self.metrics
        m.filter_nodes.labels(result="feasible").inc(len(out.feasible))
        m.filter_nodes.labels(result="failed").inc(len(out.failed))
        m.filter_nodes.labels(result="unresolvable").inc(len(out.unresolvable))
        reasons = Counter(out.failed.values())
        reasons.update(out.unresolvable.values())
        for reason, n in reasons.items():
            m.filter_reasons.labels(reason=reason).inc(n)
            if reason == REASON_UNKNOWN_NODE:
                log.warning("filter named %d node(s) unknown to topoplace", n)

    # ---- prioritize ---------------------------------------------------------------------

    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        """``ExtenderArgs`` -> ``HostPriorityList``. Raises WireError on bad input."""
        pod, use_names, _ = wire.extender_args(body)
        try:
            req = request_from_pod(pod, self.params.fabric)
        except ObjectError:
            return [{"Host": n, "Score": 0} for n in use_names]
        scores = None
        if self.gangs is not None and req.gang:
            scores = self.gangs.prioritize(self, req, use_names)
        if scores is None:
            scores = score_nodes(self.cache.snapshot(), req, use_names, self.params)
        return [{"Host": n, "Score": s} for n, s in scores]

    def prioritize_json(self, body: Any) -> bytes:
        """:meth:`prioritize` serialized as JSON bytes, built at C speed for large lists.

        Each node's eleven possible entries (``{"Host":"<name>","Score":0}`` .. ``10}``)
        are serialized once per snapshot node set; a reply is then one join, without a
        dict or a bytes object per node. Gang members and unknown hosts take the general
        path.
        """
        pod, use_names, _ = wire.extender_args(body)
        try:
            req = request_from_pod(pod, self.params.fabric)
        except ObjectError:
            req = None
        if req is None or (self.gangs is not None and req.gang):
            return orjson.dumps(self.prioritize(body))
        snap = self.cache.snapshot()
        pos = name_positions(snap, use_names)
        if len(pos) and int(pos.min()) < 0:
            return orjson.dumps(self.prioritize(body))  # unknown hosts: the general path
        scores = score_list(snap, req, use_names, self.params)
        entries = self._host_entries
        if entries is None or entries[0] is not snap.index:
            # One tuple per node (snapshot order) of its 11 possible serialized entries.
            entries = (
                snap.index,
                [
                    tuple(
                        b'{"Host":' + orjson.dumps(n.name) + b',"Score":' + t for t in _SCORE_TAIL
                    )
                    for n in snap.nodes
                ],
            )
            self._host_entries = entries
        per_node = entries[1]
        return (
            b"[" + b",".join(map(getitem, map(per_node.__getitem__, pos.tolist()), scores)) + b"]"
        )

    # ---- bind ---------------------------------------------------------------------------

    def bind(self, body: Any) -> dict[str, str]:
        """``ExtenderBindingArgs`` -> ``ExtenderBindingResult``. Raises WireError on bad input."""
        name, ns, uid, node = wire.binding_args(body)
        key = f"{ns}/{name}"
        err = self._bind(key, uid, node)
        self.metrics.binds.labels(result="ok" if not err else "error").inc()
        if err:
            log.info("bind %s -> %s refused: %s", key, node, err)
        return {"Error": err.replace("%", "%%")}

    def _bind(self, key: str, uid: str, node: str) -> str:
        snap = self.cache.snapshot()
        held = snap.pods.get(key)
        if held is not None and not held.assumed:
            # Idempotent retry of a bind that succeeded (reply lost or timed out).
            return "" if held.node == node else ERR_OTHER_NODE
        pod = self.cache.pending(key)
        if pod is None and self.fetch_pod is not None:
            ns, name = key.split("/", 1)
            pod = self.fetch_pod(ns, name)
        if pod is None:
            return ERR_UNKNOWN_POD
        pod_uid = str(meta(pod).get("uid") or "")
        if uid and pod_uid and uid != pod_uid:
            return ERR_UID_MISMATCH
        if snap.node(node) is None:
            return REASON_UNKNOWN_NODE
        try:
            req = request_from_pod(pod, self.params.fabric)
        except ObjectError as exc:
            return f"invalid pod: {exc}"

        def choose(s: ClusterSnapshot) -> PodInfo | str:
            gang, plan = "", ""
            picked: tuple[tuple[int, ...], str, str] | str | None = None
            if self.gangs is not None and req.gang:
                picked = self.gangs.choose(self, s, req, node)
            if isinstance(picked, str):
                return picked
            if picked is not None:
                gpus, gang, plan = picked
            else:
                gs = choose_gpus(s, req, node, self.params)
                if req.gpus and not gs.gpus:
                    return gs.error
                gpus = gs.gpus
            annotation = placement_value(node, gpus, gang or req.gang, plan)
            return PodInfo(
                key=key,
                uid=pod_uid,
                node=node,
                gpus=gpus,
                cpu_milli=pod_resource(pod, "cpu", cpu_milli),
                memory_bytes=pod_resource(pod, "memory", quantity_int),
                gang=gang or req.gang,
                assumed=True,
                raw=_bound_pod(pod, node, annotation),
            )

        choice = self.cache.assume_chosen(choose)
        if isinstance(choice, str):
            if self.gangs is not None and req.gang:
                self.gangs.bound(self, req, False)
            return choice
        annotation = (choice.raw.get("metadata") or {}).get("annotations", {})[PLACEMENT_ANNOTATION]
        try:
            err = self.binder.bind(pod, node, {PLACEMENT_ANNOTATION: annotation})
        except Exception as exc:  # an I/O edge: never let it crash the extender
            log.exception("binder failed for %s", key)
            err = f"binding failed: {type(exc).__name__}"
        if err:
            self.cache.forget(key)
        else:
            self.cache.confirm(key)
            self.cache.drop_pending(key)
        if self.gangs is not None and req.gang:
            self.gangs.bound(self, req, not err)
        return err

    # ---- preempt ------------------------------------------------------------------------

    def preempt(self, body: Any) -> dict[str, Any]:
        """``ExtenderPreemptionArgs`` -> ``ExtenderPreemptionResult``.

        Victims are passed through unchanged (as UIDs) until topology-aware preemption is
        designed: kube-scheduler's dry run already chose them.
        """
        _, victims, pdb = wire.preemption_args(body)
        return {
            "NodeNameToMetaVictims": {
                node: {"Pods": v, "NumPDBViolations": pdb.get(node, 0)}
                for node, v in sorted(victims.items())
            }
        }

    # ---- inspection ---------------------------------------------------------------------

    def snapshot_list(self) -> dict[str, Any]:
        """The current state as a Kubernetes List of Nodes and Pods (round-trips)."""
        snap = self.cache.snapshot()
        items: list[Any] = []
        for n in snap.nodes:
            items.append({"kind": "Node", "apiVersion": "v1", **n.raw})
        for key in sorted(snap.pods):
            p = snap.pods[key]
            if p.key.startswith(RESERVATION_PREFIX) or not p.raw:
                continue
            items.append({"kind": "Pod", "apiVersion": "v1", **p.raw})
        return {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}

    def placements(self) -> dict[str, Any]:
        """Held placements and gang plans, for ``/v1/inspect/placements``."""
        snap = self.cache.snapshot()
        pods = []
        for key in sorted(snap.pods):
            p = snap.pods[key]
            if not p.gpus:
                continue
            pods.append(
                {
                    "pod": key,
                    "node": p.node,
                    "gpus": list(p.gpus),
                    "state": "assumed" if p.assumed else "bound",
                    "gpu_indices_known": p.gpu_indices_known,
                    "gang": p.gang,
                    "expires_in_s": (
                        None
                        if self.cache.expiry_of(key) is None
                        else round(self.cache.expiry_of(key) - self.cache.now(), 3)  # type: ignore[operator]
                    ),
                }
            )
        plans = {}
        describe = getattr(self.gangs, "describe_plans", None)
        if callable(describe):
            plans = describe(self)
        return {"generation": snap.generation, "placements": pods, "gangs": plans}
