"""The verbs of fractional (GPU-sharing) pods: HAMi and gpushare shares.

The whole-GPU hot path only pays :func:`scheduler.core.fractional.is_share_pod` (a few dict
lookups) to send a pod here; everything below runs for fractional pods alone.

* filter: every named node gets a verdict (unknown, broken, no backend for the request's
  form, no GPU with room) and the nodes that fit are scored by the configured sharing
  policy (``sharing.policy``: FGD) against the workload seen so far
  (:func:`scheduler.core.fractional.decide`). With ``extender.decide_in_filter`` only the
  winner is returned and its shares are nominated (held for the bind), exactly as for
  whole GPUs.
* score: the same decision's score, 0..10.
* bind: the nominated shares (or a fresh decision on the bound node), assumed under the
  cache lock, then the Binding carries the backend's hand-off annotations (HAMi's
  ``hami.io/*``, gpushare's ``ALIYUN_COM_GPU_MEM_*``), which the API server copies onto the
  pod in the same write that sets ``spec.nodeName``.
* preempt: victims that leave the pod a device with its memory and compute (a share
  request); a fractional gang member, or a pod whose share cannot be read, gets
  kube-scheduler's victims back.
* explain: no placement summary (the decision records hold the policy's choice,
  :func:`share_explanation`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from scheduler.core.fractional import (
    BACKEND_GPUSHARE,
    BACKEND_HAMI,
    REASON_COMPUTE_P95,
    REASON_NO_BACKEND,
    REASON_NO_SHARE_ROOM,
    REASON_TENANTS,
    REASON_TOO_MANY_DEVICES,
    ContainerAsk,
    NodeTenancy,
    ShareDecision,
    ShareError,
    ShareRequest,
    best_decision,
    decide,
    gpushare_annotations,
    hami_annotations,
    node_verdict,
    pod_shapes,
    resolve,
    shapes_distribution,
    share_request,
    share_shape,
    tenancy_reason,
)
from scheduler.core.model import PodInfo, PodRequest
from scheduler.core.objects import bound_pod, pod_resource
from scheduler.core.quantity import cpu_milli, quantity_int
from scheduler.core.schedule import (
    MAX_SCORE,
    REASON_NODE_SELECTOR,
    REASON_NOT_CHOSEN,
    REASON_UNKNOWN_NODE,
    known_positions,
    selector_matches,
    verdict_reason,
)
from scheduler.core.share_table import (
    FORMS,
    WHY_COMPUTE_P95,
    WHY_NONE,
    WHY_TENANTS,
    RowsVerdict,
    name_devices,
    vector_request,
)
from scheduler.core.sharing import typical_from_counts
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.server import wire
from scheduler.server.verbs.base import (
    BindWrite,
    Host,
    PodKind,
    PreemptAsk,
    hold_on,
    nominate_winner,
    precheck,
    sharing_reply,
)

REQUEST_MEMO = 256
"""Pods whose share request :func:`pod_share_request` keeps."""
_requests: dict[Any, tuple[Mapping[str, Any] | None, Any, ShareRequest]] = {}
_requests_lock = threading.Lock()


def _request_key(pod: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any] | None]:
    """(memo key, the object a hit must be) of ``pod``: its UID and resourceVersion when
    it has both (the API server gives every change of a pod a new resourceVersion, so two
    objects with the same pair have the same spec), else its identity (the object is held
    by the memo, so its id names it while kept)."""
    m = pod.get("metadata")
    if isinstance(m, Mapping):
        uid, rv = m.get("uid"), m.get("resourceVersion")
        if isinstance(uid, str) and isinstance(rv, str) and uid and rv:
            return (uid, rv), None
    return id(pod), pod


def pod_share_request(ext: Host, pod: Mapping[str, Any]) -> ShareRequest:
    """The pod's share request (ShareError if malformed).

    Kept for the last :data:`REQUEST_MEMO` pods (:func:`_request_key`) with the sharing
    parameters it was read with: filter reads the pod kube-scheduler sent, and bind reads
    the pending copy the watch delivered, the same pod at the same resourceVersion (a
    quarter of a share bind's CPU went to reading it again). A malformed pod is read, and
    refused, every time."""
    sharing = ext.params.sharing
    key, obj = _request_key(pod)
    got = _requests.get(key)
    if got is not None and got[0] is obj and got[1] is sharing:
        return got[2]
    req = share_request(pod, pod_resource(pod, "cpu", cpu_milli), sharing)
    if req is None:  # pragma: no cover - callers checked is_share_pod
        raise ShareError("pod asks for no GPU share")
    with _requests_lock:
        _requests[key] = (obj, sharing, req)
        while len(_requests) > REQUEST_MEMO:
            del _requests[next(iter(_requests))]
    return req


def _distribution(ext: Host, snap: ClusterSnapshot, req: ShareRequest) -> Any:
    """FGD's target workload: the pods holding GPUs and shares now, plus this request,
    read from every pod (memoized per pod set). The verbs use :func:`_vector_distribution`,
    the same workload from the shape counts kept between pods; this is its reference."""
    memo = ext.share_dist
    ask = next(c for c in req.containers if c.count)
    key = (id(snap.pods), req.cpu_milli, ask)
    if memo is not None and memo[0] is snap.pods and memo[1] == key:
        return memo[2]
    shapes = []
    for n in snap.nodes:
        if n.sharing == req.form and n.devices:
            d = n.devices[0]
            shapes.append(share_shape(req.cpu_milli, resolve(ask, d), d))
            break
    # The pods' shapes are kept between calls: only pods that changed are read again.
    held = ext.share_shapes = pod_shapes(snap.nodes, snap.pods.values(), ext.share_shapes)
    dist = shapes_distribution(held.values(), shapes, ext.params.sharing.popularity)
    ext.share_dist = (snap.pods, key, dist)
    return dist


def _held(ext: Host, snap: ClusterSnapshot) -> tuple[Any, Mapping[str, NodeTenancy], int]:
    """(the held pods' shape counts, the nodes' tenancy, its version) for ``snap``, kept
    between pods (``FitMemo.held``)."""
    memo = ext.share_fits
    epoch = memo.rows.refresh(snap.nodes)
    return memo.held.update(snap.nodes, snap.index, snap.pods, epoch)


def _decisions(
    ext: Host, snap: ClusterSnapshot, pod_req: PodRequest, req: ShareRequest, names: list[str]
) -> tuple[dict[str, ShareDecision], dict[str, str], dict[str, str]]:
    """(decisions of the nodes that fit, failed, unresolvable) over ``names``; a node
    whose GPUs with room the right-sizer's limits all refuse fails with their reason."""
    failed: dict[str, str] = {}
    unres: dict[str, str] = {}
    cands = []
    for name in names:
        i = precheck(snap, pod_req, name, failed, unres)
        if i is None:
            continue
        node = snap.nodes[i]
        why = node_verdict(node, req)
        if why:
            unres[name] = why
            continue
        cands.append(node)
    policy = ext.params.selection_policy
    # FGD's target workload from the held pods' shape counts kept between pods (what
    # _distribution reads from every pod: 20 ms a multi-GPU share pod at 1,213 nodes).
    counts, tenancy, _ = _held(ext, snap)
    ask = next(c for c in req.containers if c.count)
    dist = _vector_distribution(ext, snap, req, ask, counts)
    got = decide(
        cands,
        req,
        dist,
        ext.params.sharing,
        policy,
        ext.share_fits.fits(cands, req, policy, tenancy),
        tenancy,
    )
    for n in cands:
        if n.name not in got:
            why = tenancy_reason(n, req, tenancy.get(n.name)) if tenancy else ""
            failed[n.name] = why or REASON_NO_SHARE_ROOM
    return got, failed, unres


def share_filter(
    ext: Host,
    pod: Mapping[str, Any],
    pod_req: PodRequest,
    names: list[str],
    items: list[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """``ExtenderFilterResult`` for a fractional pod."""
    try:
        req = pod_share_request(ext, pod)
    except ShareError as exc:
        ext.metrics.filter_errors.labels(reason="invalid pod").inc()
        return wire.filter_result(None, None, {}, {}, f"invalid pod: {exc}")
    ext.cache.remember_pending(pod)
    with ext.cache.lock:
        snap = ext.decision_snapshot(pod_req)
        got, failed, unres = _decisions(ext, snap, pod_req, req, names)
        feasible = [n for n in names if n in got]
        best = best_decision(got)
        if best is not None:
            feasible = nominate_winner(
                ext, pod, pod_req, best.node, feasible, failed, shares=best.shares
            )
    _record_share(ext, "filter", pod_req, got, failed, unres)
    return sharing_reply(ext, feasible, failed, unres, items)


def hold_share(
    ext: Host, pod: Mapping[str, Any], pod_req: PodRequest, req: ShareRequest, node: str
) -> bool:
    """Hold for ``pod`` the shares its filter would choose on ``node`` now (a nomination,
    as filter's; its own earlier one released first); False when none fit there."""
    with ext.cache.lock:
        snap = ext.decision_snapshot(pod_req)
        got, _, _ = _decisions(ext, snap, pod_req, req, [node])
        return node in got and hold_on(ext, pod, pod_req, node, shares=got[node].shares)


def share_explanation(
    policy: str,
    got: Mapping[str, ShareDecision],
    failed: Mapping[str, str],
    unres: Mapping[str, str],
    runners_up: int = 3,
) -> dict[str, Any]:
    """A fractional pod's decision as a record: the sharing policy's choice (node, GPU
    shares, its 0..100 score and the 0..10 score prioritize returns, as ``points``), the
    next nodes by score with why they lost, and the reason counts of the nodes that
    cannot take it. Deterministic (ties by node name, as :func:`best_decision`)."""
    order = sorted(got.values(), key=lambda d: (-d.score, d.node))
    reasons: dict[str, int] = {}
    for r in (*failed.values(), *unres.values()):
        if r != REASON_NOT_CHOSEN:
            reasons[r] = reasons.get(r, 0) + 1
    return explanation_of(policy, order[: 1 + runners_up], len(order), reasons)


def explanation_of(
    policy: str, top: list[ShareDecision], feasible: int, reasons: Mapping[str, int]
) -> dict[str, Any]:
    """:func:`share_explanation` from its parts: the best decisions, best first (the
    choice, then the runners-up), how many nodes fit, and the reason counts of the nodes
    that do not (``REASON_NOT_CHOSEN`` left out)."""

    def row(d: ShareDecision) -> dict[str, Any]:
        score = d.score // 10
        return {
            "node": d.node,
            "score": score,
            "policy_score": d.score,
            "shares": [[sh.gpu, sh.memory_mib, sh.milli] for sh in d.shares],
            "points": {f"sharing policy {policy}": score},
        }

    chosen = row(top[0]) if top else None
    runners = []
    for d in top[1:]:
        r = row(d)
        r["why_lost"] = (
            f"policy score {d.score} < {top[0].score}"
            if d.score < top[0].score
            else f"tied at {d.score}, lost the tie-break by name"
        )
        runners.append(r)
    return {
        "kind": "share",
        "policy": policy,
        "outcome": "placed" if chosen else "pending",
        "chosen": chosen,
        "runners_up": runners,
        "feasible": feasible,
        "reasons": dict(sorted(reasons.items())),
    }


def _record_share(
    ext: Host,
    verb: str,
    pod_req: PodRequest,
    got: Mapping[str, ShareDecision],
    failed: Mapping[str, str],
    unres: Mapping[str, str],
) -> None:
    decisions = getattr(ext, "decisions", None)
    if decisions is not None:
        info = share_explanation(ext.params.sharing.policy, got, failed, unres)
        decisions.record_info(verb, pod_req.key, pod_req.gang, info)


def share_prioritize(
    ext: Host, pod: Mapping[str, Any], pod_req: PodRequest, names: list[str]
) -> list[dict[str, Any]]:
    """``HostPriorityList`` for a fractional pod: the sharing policy's score / 10."""
    try:
        req = pod_share_request(ext, pod)
    except ShareError:
        return [{"Host": n, "Score": 0} for n in names]
    snap = ext.cache.snapshot()
    got, failed, unres = _decisions(ext, snap, pod_req, req, names)
    _record_share(ext, "prioritize", pod_req, got, failed, unres)
    return [{"Host": n, "Score": (got[n].score // 10) if n in got else 0} for n in names]


def _containers(req: ShareRequest, shares: tuple[Any, ...]) -> list[list[Any]]:
    """Flat shares back into per-container lists (in container order)."""
    out, k = [], 0
    for c in req.containers:
        out.append(list(shares[k : k + c.count]))
        k += c.count
    return out


def share_bind_start(
    ext: Host,
    key: str,
    pod: Mapping[str, Any],
    pod_req: PodRequest,
    node: str,
    pod_uid: str,
    clock: Any = time.time,
) -> BindWrite | str:
    """Start binding a fractional pod: its shares held under the cache lock (the
    nominated ones, or a fresh decision on ``node``); returns the error, or the
    ``BindWrite`` whose annotations are the node backend's hand-off (the
    extender writes it through its binder and calls ``_bind_end``)."""
    try:
        req = pod_share_request(ext, pod)
    except ShareError as exc:
        return f"invalid pod: {exc}"
    cpu = pod_resource(pod, "cpu", cpu_milli)
    memory = pod_resource(pod, "memory", quantity_int)
    now = clock()
    handoff: dict[str, str] = {}

    def choose(s: ClusterSnapshot, nominated: tuple[int, ...] | None) -> PodInfo | str:
        n = s.node(node)
        if n is None:
            return REASON_UNKNOWN_NODE
        i = s.index[node]
        code = int(s.arrays.blocked[i])
        if code:
            return verdict_reason(s, code, i)
        why = node_verdict(n, req)
        if why:
            return why
        held = s.pods.get(key)
        if nominated is not None and held is not None and held.node == node and held.shares:
            shares = held.shares
        else:
            got, _, _ = _decisions(ext, s, pod_req, req, [node])
            if node not in got:
                return REASON_NO_SHARE_ROOM
            shares = got[node].shares
        containers = _containers(req, shares)
        if n.sharing == BACKEND_HAMI:
            ann = hami_annotations(n, containers, int(now))
        elif n.sharing == BACKEND_GPUSHARE:
            ann = gpushare_annotations(n, shares[0], req.units, ext.params.sharing, int(now * 1e9))
        else:  # pragma: no cover - node_verdict refuses nodes without a backend
            return "node has no GPU-sharing backend"
        handoff.clear()
        handoff.update(ann)
        return PodInfo(
            key=key,
            uid=pod_uid,
            node=node,
            gpus=(),
            cpu_milli=cpu,
            memory_bytes=memory,
            assumed=True,
            raw=bound_pod(pod, node, ann),
            shares=shares,
        )

    choice = ext.cache.assume_for_bind(key, node, choose)
    if isinstance(choice, str):
        return choice
    return BindWrite(key, pod, dict(handoff), pod_req, node, ())


# ---- the vector path: every offered node at once -----------------------------------------


@dataclass(frozen=True, slots=True)
class VectorVerdict:
    """A share pod's filter over offered positions, from columns
    (``scheduler.core.share_table``): what :func:`_decisions` gives, as arrays.

    Attributes:
        verdict: the rows that fit and their scores.
        groups: (unresolvable, reason, rows) of every row that cannot take the pod.
        tenancy: the nodes' tenancy it was decided with.
    """

    verdict: RowsVerdict
    groups: list[tuple[bool, str, np.ndarray]]
    tenancy: Mapping[str, NodeTenancy]

    def reasons(self) -> dict[str, int]:
        """Reason counts of the rows that cannot take the pod."""
        out: dict[str, int] = {}
        for _, reason, rows in self.groups:
            out[reason] = out.get(reason, 0) + len(rows)
        return out


def _vector_distribution(
    ext: Host, snap: ClusterSnapshot, req: ShareRequest, ask: ContainerAsk, counts: Any
) -> Any:
    """:func:`_distribution` from the held pods' shape ``counts`` kept between pods
    (:func:`_held`, read again only for the pods that changed; changed here)."""
    for n in snap.nodes:
        if n.sharing == req.form and n.devices:
            d = n.devices[0]
            counts[share_shape(req.cpu_milli, resolve(ask, d), d)] += 1
            break
    return typical_from_counts(counts, ext.params.sharing.popularity)


def _vector(
    ext: Host,
    snap: ClusterSnapshot,
    pod_req: PodRequest,
    req: ShareRequest,
    ask: ContainerAsk,
    pos: np.ndarray,
) -> VectorVerdict:
    """The verdict of every offered position (all known): the checks of :func:`precheck`
    and ``node_verdict`` in their order, then the fit and the policy's score of the rest
    by their distinct states."""
    groups: list[tuple[bool, str, np.ndarray]] = []
    blocked = snap.arrays.blocked[pos]
    rest = pos[blocked == 0]
    if len(rest) < len(pos):
        by_reason: dict[str, list[int]] = {}
        for i in pos[blocked != 0].tolist():
            by_reason.setdefault(verdict_reason(snap, int(snap.arrays.blocked[i]), i), []).append(i)
        groups.extend((True, r, np.array(v, dtype=np.int64)) for r, v in by_reason.items())
    if pod_req.node_selector:
        sel = pod_req.node_selector
        ok = np.array(
            [selector_matches(snap.nodes[i].labels, sel) for i in rest.tolist()], dtype=bool
        )
        if not ok.all():
            groups.append((True, REASON_NODE_SELECTOR, rest[~ok]))
        rest = rest[ok] if len(rest) else rest
    memo = ext.share_fits
    counts, tenancy, version = _held(ext, snap)
    dist = _vector_distribution(ext, snap, req, ask, counts)
    verdict, other, too_few = memo.rows.decide(
        snap.nodes,
        rest,
        FORMS.index(req.form),
        ask,
        req.limits,
        req.cpu_milli,
        dist,
        ext.params.sharing.policy,
        memo.held,
        snap.index,
        tenancy,
        version,
    )
    no_room, why = verdict.no_room, verdict.why
    for never, reason, rows in (
        (True, REASON_NO_BACKEND, other),
        (True, REASON_TOO_MANY_DEVICES, too_few),
        (False, REASON_NO_SHARE_ROOM, no_room[why == WHY_NONE]),
        (False, REASON_TENANTS, no_room[why == WHY_TENANTS]),
        (False, REASON_COMPUTE_P95, no_room[why == WHY_COMPUTE_P95]),
    ):
        if len(rows):
            groups.append((never, reason, rows))
    return VectorVerdict(verdict, groups, tenancy)


def _named(
    ext: Host, snap: ClusterSnapshot, req: ShareRequest, out: VectorVerdict, at: np.ndarray
) -> list[ShareDecision]:
    """The decisions (with their devices) of the fitting rows ``out.verdict.rows[at]``."""
    v = out.verdict
    found = []
    for j in at.tolist():
        node = snap.nodes[int(v.rows[j])]
        found.append(
            name_devices(
                v.scored,
                int(v.states[j]),
                node,
                req,
                ext.params.sharing.policy,
                ext.params.selection_policy,
                out.tenancy.get(node.name),
            )
        )
    return found


RUNNERS_UP = 3
"""Runners-up a share decision's record names (:func:`share_explanation`'s default)."""


def _record_vector(
    ext: Host,
    verb: str,
    snap: ClusterSnapshot,
    pod_req: PodRequest,
    req: ShareRequest,
    out: VectorVerdict,
    top: list[ShareDecision] | None = None,
) -> None:
    """Record the decision as :func:`_record_share` does (``top``: the best decisions,
    already named, when the caller has them)."""
    decisions = getattr(ext, "decisions", None)
    if decisions is None:
        return
    v = out.verdict
    if top is None:
        top = _named(ext, snap, req, out, v.order(1 + RUNNERS_UP))
    info = explanation_of(ext.params.sharing.policy, top, len(v.rows), out.reasons())
    decisions.record_info(verb, pod_req.key, pod_req.gang, info)


def share_filter_fast(
    ext: Host,
    pod: Mapping[str, Any],
    pod_req: PodRequest,
    names: Any,
    items: list[Mapping[str, Any]] | None,
) -> bytes | None:
    """:func:`share_filter` answered from columns and serialized from node positions, or
    None (the general path: Node objects sent, a name unknown, a request
    ``share_table.vector_request`` does not cover, or a malformed one). The same answer:
    the same nodes fit, the same winner with the same shares held."""
    if items is not None:
        return None
    try:
        req = pod_share_request(ext, pod)
    except ShareError:
        return None
    ask = vector_request(req, ext.params.sharing.policy)
    if ask is None:
        return None
    with ext.cache.lock:
        snap = ext.cache.snapshot()
        pos = known_positions(snap, names)
        table = ext.name_table(snap)
        if pos is None or table is None:
            return None
        ext.cache.remember_pending(pod)
        snap = ext.decision_snapshot(pod_req)
        out = _vector(ext, snap, pod_req, req, ask, pos)
        v = out.verdict
        order = v.order(1 + RUNNERS_UP)
        best = _named(ext, snap, req, out, order)
        chosen = None
        if (
            best
            and ext.params.extender.decide_in_filter
            and ext.ours(pod)
            and hold_on(ext, pod, pod_req, best[0].node, shares=best[0].shares)
        ):
            chosen = int(v.rows[order[0]])
    _record_vector(ext, "filter", snap, pod_req, req, out, best)
    fit = np.zeros(len(snap.nodes), dtype=bool)
    if chosen is not None:
        fit[chosen] = True
    else:
        fit[v.rows] = True
    feasible = pos[fit[pos]]
    not_chosen = len(v.rows) - len(feasible)
    room: list[str] = []
    if not len(feasible):
        room = [snap.nodes[int(i)].name for i in v.no_room.tolist()]
    ext.note_outcome(pod, pod_req, len(feasible) > 0, room)
    sizes = [(never, reason, len(rows)) for never, reason, rows in out.groups]
    ext.count_groups(len(feasible), sizes, not_chosen)
    if not ext.send_reasons(len(feasible)):
        return bytes(table.filter_result(feasible, []))
    return bytes(table.filter_result(feasible, out.groups))


def share_score_fast(
    ext: Host, pod: Mapping[str, Any], pod_req: PodRequest, names: Any
) -> bytes | None:
    """:func:`share_prioritize` answered from columns, or None (as
    :func:`share_filter_fast`)."""
    try:
        req = pod_share_request(ext, pod)
    except ShareError:
        return None
    ask = vector_request(req, ext.params.sharing.policy)
    if ask is None:
        return None
    snap = ext.cache.snapshot()
    pos = known_positions(snap, names)
    table = ext.name_table(snap)
    if pos is None or table is None:
        return None
    out = _vector(ext, snap, pod_req, req, ask, pos)
    _record_vector(ext, "prioritize", snap, pod_req, req, out)
    v = out.verdict
    score = np.zeros(len(snap.nodes), dtype=np.int64)
    score[v.rows] = v.scores // 10
    mine = score[pos]
    if len(mine) and (mine.min() < 0 or mine.max() > MAX_SCORE):
        # a baseline policy's score out of 0..10 (BestFit's on a node with much CPU):
        # the name table serializes 0..10 only
        return orjson.dumps(
            [
                {"Host": snap.nodes[int(i)].name, "Score": int(s)}
                for i, s in zip(pos, mine, strict=True)
            ]
        )
    return bytes(table.host_priorities(pos, mine))


class Shares(PodKind):
    """Pods asking for a share of a GPU (HAMi, gpushare): ``is_share_pod``."""

    name = "share"

    def filter(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """See :func:`share_filter`."""
        return share_filter(ext, pod, req, names, items)

    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """See :func:`share_prioritize`."""
        return share_prioritize(ext, pod, req, names)

    def filter_fast(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: Any,
        items: list[Mapping[str, Any]] | None,
    ) -> bytes | None:
        """See :func:`share_filter_fast`."""
        return share_filter_fast(ext, pod, req, names, items)

    def score_fast(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: Any
    ) -> bytes | None:
        """See :func:`share_score_fast`."""
        return share_score_fast(ext, pod, req, names)

    def bind(
        self, ext: Host, key: str, pod: Mapping[str, Any], req: PodRequest, node: str, uid: str
    ) -> BindWrite | str:
        """See :func:`share_bind_start`."""
        return share_bind_start(ext, key, pod, req, node, uid)

    def preempt(self, ext: Host, pod: Mapping[str, Any], req: PodRequest) -> PreemptAsk | None:
        """Victims that leave room for the pod's share; None for a gang member or a share
        that cannot be read."""
        if req.gang:
            return None
        with contextlib.suppress(ShareError):
            return PreemptAsk(share=pod_share_request(ext, pod))
        return None


SHARES = Shares()
