"""The verbs of pods that take GPU replicas (time-slicing / MPS, ``scheduler.core.replicas``).

A replica pod (``sharing.replicas: opt-in``, not a gang member, opting in) asks for a number
of replicas of a node's shared GPUs; the kubelet's device plugin picks the device.

* filter: every named node gets a verdict (unknown, broken, not a replica node, too few
  free replicas) and the choice (most free replicas, then least risk) is nominated with
  ``extender.decide_in_filter``;
* score: 10 for the choice, else 9 x the share of the node's free replicas the pod takes;
* bind: the replicas held on the node under the cache lock, no hand-off annotation;
* preempt: none of topoplace's (kube-scheduler's victims go back); explain: no summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.model import PodInfo, PodRequest
from scheduler.core.objects import ObjectError, bound_pod, pod_resource, replica_request
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.replicas import ReplicaVerdicts, opts_in
from scheduler.core.replicas import choose as choose_replica_node
from scheduler.core.replicas import node_reason as replica_reason
from scheduler.core.schedule import REASON_UNKNOWN_NODE
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.server import wire
from scheduler.server.verbs.base import (
    BindWrite,
    Host,
    PodKind,
    nominate_winner,
    precheck,
    sharing_reply,
)


def is_replica_pod(ext: Host, pod: Mapping[str, Any], pod_req: PodRequest) -> bool:
    """Whether the pod takes GPU replicas (``sharing.replicas: opt-in``, not a gang member,
    and it opts in: :func:`scheduler.core.replicas.opts_in`). Cheap: a few dict lookups."""
    return ext.params.sharing.replicas == "opt-in" and not pod_req.gang and opts_in(pod)


def _replica_verdicts(
    snap: ClusterSnapshot, pod_req: PodRequest, replicas: int, names: list[str], key: str
) -> ReplicaVerdicts:
    """Verdicts of a replica pod over ``names`` (its own held replicas count as free)."""
    failed: dict[str, str] = {}
    unres: dict[str, str] = {}
    cands: list[tuple[str, int, float]] = []
    own = snap.pods.get(key)
    for name in names:
        i = precheck(snap, pod_req, name, failed, unres, shared_ok=True)
        if i is None:
            continue
        node = snap.nodes[i]
        held = own.replicas if own is not None and own.node == name else 0
        never, why = replica_reason(node, replicas, pod_req.min_link, held)
        if why:
            (unres if never else failed)[name] = why
            continue
        cands.append((name, node.replicas_free + held, node.health.risk))
    choice, scores = choose_replica_node(cands, replicas)
    feasible = tuple(n for n in names if n in scores)
    return ReplicaVerdicts(feasible, failed, unres, choice, scores)


def _replica_count(pod: Mapping[str, Any]) -> int | str:
    try:
        return replica_request(pod)
    except ObjectError as exc:
        return f"invalid pod: {exc}"


def replica_filter(
    ext: Host,
    pod: Mapping[str, Any],
    pod_req: PodRequest,
    names: list[str],
    items: list[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """``ExtenderFilterResult`` for a pod that takes GPU replicas."""
    n = _replica_count(pod)
    if isinstance(n, str):
        ext.metrics.filter_errors.labels(reason="invalid pod").inc()
        return wire.filter_result(None, None, {}, {}, n)
    if n <= 0:  # asks for no replica: nothing for topoplace to decide
        return wire.filter_result(names if items is None else None, items, {}, {})
    ext.cache.remember_pending(pod)
    with ext.cache.lock:
        snap = ext.decision_snapshot(pod_req)
        v = _replica_verdicts(snap, pod_req, n, names, pod_req.key)
        feasible = list(v.feasible)
        failed = dict(v.failed)
        if v.choice:
            feasible = nominate_winner(ext, pod, pod_req, v.choice, feasible, failed, replicas=n)
    return sharing_reply(ext, feasible, failed, dict(v.unresolvable), items)


def replica_prioritize(
    ext: Host, pod: Mapping[str, Any], pod_req: PodRequest, names: list[str]
) -> list[dict[str, Any]]:
    """``HostPriorityList`` for a replica pod: 10 for the choice, else 9 x the share of
    the node's free replicas the pod takes, 0 where it does not fit."""
    n = _replica_count(pod)
    if isinstance(n, str) or n <= 0:
        return [{"Host": name, "Score": 0} for name in names]
    v = _replica_verdicts(ext.cache.snapshot(), pod_req, n, names, pod_req.key)
    return [{"Host": name, "Score": v.scores.get(name, 0)} for name in names]


def replica_bind_start(
    ext: Host, key: str, pod: Mapping[str, Any], pod_req: PodRequest, node: str, uid: str
) -> BindWrite | str:
    """Start binding a replica pod: its replicas held on ``node`` under the cache lock (the
    nominated hold, or a fresh check); returns the error, or the ``BindWrite``
    with no hand-off annotation (the kubelet picks the device)."""
    n = _replica_count(pod)
    if isinstance(n, str):
        return n
    cpu = pod_resource(pod, "cpu", cpu_milli)
    memory = pod_resource(pod, "memory", quantity_int)

    def choose(s: ClusterSnapshot, _nominated: tuple[int, ...] | None) -> PodInfo | str:
        v = _replica_verdicts(s, pod_req, n, [node], key)
        if node not in v.scores:
            return v.failed.get(node) or v.unresolvable.get(node) or REASON_UNKNOWN_NODE
        return PodInfo(
            key=key,
            uid=uid,
            node=node,
            gpus=(),
            cpu_milli=cpu,
            memory_bytes=memory,
            gang=pod_req.gang,
            assumed=True,
            raw=bound_pod(pod, node),
            replicas=n,
        )

    choice = ext.cache.assume_for_bind(key, node, choose)
    if isinstance(choice, str):
        return choice
    return BindWrite(key, pod, {}, pod_req, node, ())


class Replicas(PodKind):
    """Pods that take GPU replicas: :func:`is_replica_pod`."""

    name = "replica"

    def filter(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """See :func:`replica_filter`."""
        return replica_filter(ext, pod, req, names, items)

    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """See :func:`replica_prioritize`."""
        return replica_prioritize(ext, pod, req, names)

    def bind(
        self, ext: Host, key: str, pod: Mapping[str, Any], req: PodRequest, node: str, uid: str
    ) -> BindWrite | str:
        """See :func:`replica_bind_start`."""
        return replica_bind_start(ext, key, pod, req, node, uid)


REPLICAS = Replicas()
