"""The verbs of pods asking for whole GPUs (and of pods asking for none).

* filter: the engine's filter codes per node (``core.schedule.filter_codes``); with
  ``extender.decide_in_filter`` the engine's choice alone, its GPUs nominated (held for the
  bind). The common case (``NodeNames``, every name known) is decided and serialized from
  node positions by array operations (:meth:`Whole.filter_fast`, ``replies.py``). A pod
  asking for no GPU passes every node it may use.
* score: ``core.schedule.score_nodes`` (0..10), from positions when every name is known.
* bind: the nominated GPUs, or a fresh choice on the node, assumed under the cache lock
  after topoplace's own filter for the pod on that node (:func:`node_refuses`); on a HAMi
  node the Binding also carries HAMi's hand-off for a whole GPU. Gang members bind through
  the same function with the gang runtime's choice (``gang.py``), claim pods with their gang
  cleared (``claim.py``).
* preempt: ``core.preemption.select_victims`` among kube-scheduler's candidates (see
  ``preempt.py``); a pod asking for no GPU gets kube-scheduler's victims back.
* explain: the decision records' one-line summary of the node chosen.

Locking: every decision that holds GPUs runs under the cache lock on one snapshot
(``Host.decision_snapshot``), so two pods are never given the same GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from scheduler.core.fractional import BACKEND_HAMI, hami_annotations, whole_hami_containers
from scheduler.core.model import PLACEMENT_ANNOTATION, PodInfo, PodRequest
from scheduler.core.objects import bound_pod, meta, placement_value
from scheduler.core.preemption import fits_on
from scheduler.core.schedule import (
    CODE_NODE_SELECTOR,
    CODE_NOT_CHOSEN,
    FEASIBLE,
    REASON_UNKNOWN_NODE,
    ROOM_CODES,
    choose_gpus,
    filter_codes,
    filter_nodes,
    known_positions,
    name_positions,
    narrow_with_rank,
    outcome_of,
    score_nodes,
    score_positions,
    selector_matches,
    verdict_counts,
    verdict_groups,
    verdict_reason,
)
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.server.verbs.base import (
    ERR_NO_ROOM_CPU_MEMORY,
    BindWrite,
    Host,
    PodKind,
    PreemptAsk,
)

log = logging.getLogger(__name__)

GangPick = Callable[[ClusterSnapshot], Any]
"""The gang runtime's choice for a member on the bind's snapshot (``GangHandler.choose``):
a ``MemberPlacement``, an error string, or None."""


def node_refuses(
    snap: ClusterSnapshot,
    req: PodRequest,
    node: str,
    cpu: int,
    memory: int,
    check_gpus: bool,
    params: Any,
) -> str:
    """Why ``node`` cannot take the pod at bind time ("" if it can): topoplace's own
    filter for the pod on that node now (health, cordon, nodeSelector, and, unless the
    GPUs are already held for it by a nomination or a gang slot, room and link class),
    plus CPU and memory against what is bound there."""
    i = snap.index.get(node)
    if i is None:
        return REASON_UNKNOWN_NODE
    pos = np.array([i], dtype=np.int64)
    code = int(snap.arrays.blocked[i])
    if req.gpus > 0 and check_gpus:
        code = int(filter_codes(snap, req, pos, params)[0])
    elif code == FEASIBLE and not selector_matches(snap.nodes[i].labels, req.node_selector):
        code = CODE_NODE_SELECTOR
    if code != FEASIBLE:
        return verdict_reason(snap, code, i)
    n = snap.nodes[i]
    used_cpu, used_memory = n.cpu_used_milli, n.memory_used_bytes
    own = snap.pods.get(req.key)
    if own is not None and own.node == node:  # its nomination already counts its requests
        used_cpu -= own.cpu_milli
        used_memory -= own.memory_bytes
    if (n.cpu_milli and used_cpu + cpu > n.cpu_milli) or (
        n.memory_bytes and used_memory + memory > n.memory_bytes
    ):
        return ERR_NO_ROOM_CPU_MEMORY
    return ""


def _names_at(snap: ClusterSnapshot, positions: Any) -> list[str]:
    return [snap.nodes[int(i)].name for i in positions]


def nominate(
    ext: Host, pod: Mapping[str, Any], req: PodRequest, node: str, gpus: tuple[int, ...]
) -> bool:
    """Hold ``gpus`` of ``node`` for the single GPU pod's bind (a nomination with
    ``extender.nomination_ttl_seconds``); False when they are taken."""
    info = PodInfo(
        key=req.key,
        uid=str(meta(pod).get("uid") or ""),
        node=node,
        gpus=tuple(gpus),
        # The request read them strictly (request_from_pod), so they equal what the
        # lenient pod_resource(pod, "cpu" / "memory") would read: values in range.
        cpu_milli=req.cpu_milli,
        memory_bytes=req.memory_bytes,
        assumed=True,
        raw=pod,
    )
    return bool(ext.cache.nominate(info, ext.params.extender.nomination_ttl_seconds))


def decide(
    ext: Host, snap: ClusterSnapshot, pod: Mapping[str, Any], req: PodRequest, pos: Any
) -> tuple[Any, tuple[Any, Any] | None]:
    """Filter codes for a single GPU pod, narrowed to the engine's choice with its GPUs
    nominated when ``extender.decide_in_filter`` is on (cache lock held); and the
    ``(codes, rank)`` it chose by, for the decision record (None when it did not rank)."""
    params = ext.params
    codes = filter_codes(snap, req, pos, params)
    if not params.extender.decide_in_filter or not ext.ours(pod):
        return codes, None
    narrowed, i, rank = narrow_with_rank(snap, req, pos, codes, params)
    basis = (codes, rank)
    if i < 0:
        return codes, basis
    node = snap.nodes[int(pos[i])].name
    gs = choose_gpus(snap, req, node, params)
    if not gs.gpus:  # pragma: no cover - feasible nodes always have a set
        return codes, basis
    if not nominate(ext, pod, req, node, gs.gpus):
        return codes, basis
    return narrowed, basis


def hold_gpus(ext: Host, pod: Mapping[str, Any], req: PodRequest, node: str) -> bool:
    """Hold for the single GPU pod the GPUs its filter would choose on ``node`` now (its
    own earlier nomination released first); False when it does not fit there."""
    with ext.cache.lock:
        snap = ext.decision_snapshot(req)
        if fits_on(snap, req, node, ext.params):
            return False
        gs = choose_gpus(snap, req, node, ext.params)
        return bool(gs.gpus) and nominate(ext, pod, req, node, gs.gpus)


def filter_outcome(ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]) -> Any:
    """The general path's ``FilterOutcome``: decided (and nominated) for a GPU pod, the
    plain node filter for a pod asking for none."""
    if req.gpus > 0:
        with ext.cache.lock:
            snap = ext.decision_snapshot(req)
            pos = name_positions(snap, names)
            codes, basis = decide(ext, snap, pod, req, pos)
        ext.decisions.record("filter", snap, req, pos, basis)
        return outcome_of(snap, names, pos, codes)
    return filter_nodes(ext.cache.snapshot(), req, names, ext.params)


def scores(ext: Host, req: PodRequest, names: list[str]) -> list[dict[str, Any]]:
    """The general path's ``HostPriorityList`` (recorded for a GPU pod)."""
    snap = ext.cache.snapshot()
    got = score_nodes(snap, req, names, ext.params)
    if req.gpus > 0:
        ext.decisions.record("prioritize", snap, req, name_positions(snap, names))
    return [{"Host": n, "Score": s} for n, s in got]


def bind_start(
    ext: Host,
    key: str,
    pod: Mapping[str, Any],
    req: PodRequest,
    node: str,
    pod_uid: str,
    why: str,
    gang_pick: GangPick | None = None,
) -> BindWrite | str:
    """Decide and hold a whole-GPU bind: the nominated GPUs, the gang runtime's
    (``gang_pick``, a gang member: its slot's GPUs are held for it) or a fresh choice, after
    :func:`node_refuses`; an error, or the write (placement annotation with ``why``, and
    HAMi's hand-off on a HAMi node)."""
    snap = ext.cache.snapshot()
    cpu, memory = req.cpu_milli, req.memory_bytes  # as pod_resource reads a valid pod
    params = ext.params

    def choose(s: ClusterSnapshot, nominated: tuple[int, ...] | None) -> PodInfo | str:
        held_for_it = nominated is not None or gang_pick is not None
        refused = node_refuses(s, req, node, cpu, memory, not held_for_it, params)
        if refused:
            return refused
        gang, plan = "", None
        picked: Any = gang_pick(s) if gang_pick is not None else None
        if isinstance(picked, str):
            return picked
        if picked is not None:
            gpus, gang, plan = picked.gpus, picked.gang, picked.plan
        elif nominated is not None:
            gpus = nominated
        else:
            gs = choose_gpus(s, req, node, params)
            if req.gpus and not gs.gpus:
                return gs.error
            gpus = gs.gpus
        annotation = placement_value(node, gpus, gang or req.gang, plan, why)
        return PodInfo(
            key=key,
            uid=pod_uid,
            node=node,
            gpus=gpus,
            cpu_milli=cpu,
            memory_bytes=memory,
            gang=gang or req.gang,
            assumed=True,
            raw=bound_pod(pod, node, {PLACEMENT_ANNOTATION: annotation}),
        )

    choice = ext.cache.assume_for_bind(key, node, choose)
    if isinstance(choice, str):
        return choice
    annotation = (choice.raw.get("metadata") or {}).get("annotations", {})[PLACEMENT_ANNOTATION]
    handoff = {PLACEMENT_ANNOTATION: annotation}
    target = snap.node(node)
    if target is not None and target.sharing == BACKEND_HAMI and choice.gpus:
        # HAMi's device plugin serves every nvidia.com/gpu container on its node from
        # its annotations: a whole GPU in HAMi's form (full memory, 100 % compute).
        containers = whole_hami_containers(target, pod, choice.gpus)
        handoff.update(hami_annotations(target, containers, int(time.time())))
    return BindWrite(key, pod, handoff, req, node, choice.gpus, why)


class Whole(PodKind):
    """Pods asking for whole GPUs, or for none (every pod no other kind takes)."""

    name = "whole"

    def filter(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """See the module docstring (filter)."""
        return ext.filter_reply(filter_outcome(ext, pod, req, names), items)

    def filter_fast(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: Any,
        items: list[Mapping[str, Any]] | None,
    ) -> bytes | None:
        """The reply from node positions: a GPU pod decided by array operations, a pod
        asking for none (not a gang member) passing every node; None when kube-scheduler
        sent Node objects or a name is unknown."""
        if items is not None:
            return None
        if req.gpus > 0:
            return _filter_gpus_fast(ext, pod, req, names)
        if req.gang:
            return None
        # No GPUs asked (every pod comes here when managedResources is empty, for
        # claim pods): every node passes, answered from positions.
        snap = ext.cache.snapshot()
        pos = known_positions(snap, names)
        table = ext.name_table(snap)
        if table is None or pos is None:
            return None
        ext.count_groups(len(pos), [])
        out: bytes = table.filter_result(pos, [])
        return out

    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """``core.schedule.score_nodes``."""
        return scores(ext, req, names)

    def score_fast(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: Any
    ) -> bytes | None:
        """Scores serialized from node positions; None when a host is unknown."""
        snap = ext.cache.snapshot()
        pos = known_positions(snap, names)
        table = ext.name_table(snap)
        if table is None or pos is None:
            return None
        ext.decisions.record("prioritize", snap, req, pos)
        out: bytes = table.host_priorities(pos, score_positions(snap, req, pos, ext.params))
        return out

    def bind(
        self, ext: Host, key: str, pod: Mapping[str, Any], req: PodRequest, node: str, uid: str
    ) -> BindWrite | str:
        """See :func:`bind_start`."""
        return bind_start(ext, key, pod, req, node, uid, self.explain(ext, req, node))

    def preempt(self, ext: Host, pod: Mapping[str, Any], req: PodRequest) -> PreemptAsk | None:
        """Victims for the pod's GPUs; none of topoplace's for a pod asking for none."""
        return PreemptAsk() if req.gpus > 0 else None

    def explain(self, ext: Host, req: PodRequest, node: str) -> str:
        """The decision records' summary of ``req`` on ``node``; never fails a bind."""
        try:
            return str(ext.decisions.bind_summary(req.key, node)) if req.gpus > 0 else ""
        except Exception:  # an explanation must never cost a placement
            log.exception("explaining the bind of %s failed", req.key)
            return ""


def _filter_gpus_fast(ext: Host, pod: Mapping[str, Any], req: PodRequest, names: Any) -> Any:
    """:meth:`Whole.filter_fast` for a GPU pod: decided on one snapshot under the cache
    lock, answered from positions (nodes the engine did not choose are counted, not sent;
    nor are failed ones when a node is offered, ``Host.send_reasons``)."""
    with ext.cache.lock:
        snap = ext.decision_snapshot(req)
        pos = known_positions(snap, names)
        table = ext.name_table(snap)
        if table is None or pos is None:
            return None
        codes, basis = decide(ext, snap, pod, req, pos)
    ext.decisions.record("filter", snap, req, pos, basis)
    counts = np.bincount(codes, minlength=CODE_NOT_CHOSEN + 1)
    feasible = pos[codes == FEASIBLE]
    room = () if len(feasible) else _names_at(snap, pos[np.isin(codes, ROOM_CODES)])
    if ext.note_outcome(pod, req, len(feasible) > 0, room):
        # kube-scheduler parks it: wake it when its candidates have the GPUs
        ext.parked.refused(req.key, req.gpus, snap, pos)
    not_chosen = int(counts[CODE_NOT_CHOSEN])
    if not ext.send_reasons(len(feasible)):  # counted only: no node lists
        sizes = verdict_counts(snap, pos, codes, (CODE_NOT_CHOSEN,), counts)
        ext.count_groups(len(feasible), sizes, not_chosen)
        return table.filter_result(feasible, [])
    groups = verdict_groups(snap, pos, codes, (CODE_NOT_CHOSEN,), counts)
    sizes = [(never, reason, len(idx)) for never, reason, idx in groups]
    ext.count_groups(len(feasible), sizes, not_chosen)
    return table.filter_result(feasible, [(n, r, pos[i]) for n, r, i in groups])


WHOLE = Whole()
