"""The verbs of gang members (with a gang handler, ``scheduler/runtime/gangs.py``).

A gang is placed whole by the gang runtime (CP-SAT over every member); a member's verbs
follow its gang's plan:

* filter: the plan's node for the member, merged with the single-pod verdict so broken
  hardware stays "never" (:func:`merge_gang`); a pod the handler does not take (None) is
  filtered as a pod alone (``whole.py``).
* score: the plan's node scores 10, the others 0 (the handler's answer), else as a pod alone.
* bind: the member's slot (GPUs reserved by the plan) through the whole-GPU bind, with the
  handler told whether it held (``GangHandler.bound``). A member whose ``nvidia.com/gpu``
  a DeviceClass backs, bound to a DRA node, holds no GPU itself: the special claim
  kube-scheduler made for it in PreBind holds them (checked, or given topoplace's choice
  first, as for a pod alone: ``DraRouter.before_bind``), and the plan predicted that
  claim's first fit (``GangRuntime._dra_first_fit``).
* preempt: victims only when the whole gang fits once every lower-priority pod is gone, and
  only on the nodes of that placement (``GangHandler.preemption_plan``).
* explain: the gang plan's summary (plan id, policy, the solver's numbers).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scheduler.core.model import PodRequest
from scheduler.core.schedule import FilterOutcome, filter_nodes
from scheduler.core.snapshot import ClusterSnapshot
from scheduler.server.decisions import gang_member_summary
from scheduler.server.verbs import whole
from scheduler.server.verbs.base import BindWrite, Host, PodKind, PreemptAsk

log = logging.getLogger(__name__)


def merge_gang(base: FilterOutcome, planned: FilterOutcome) -> FilterOutcome:
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


def gang_filter_info(out: FilterOutcome, candidates: int) -> dict[str, Any]:
    """A gang member's filter verdict for the decision records."""
    reasons = Counter(out.failed.values())
    reasons.update(out.unresolvable.values())
    return {
        "planned_node": out.feasible[0] if out.feasible else None,
        "candidates": candidates,
        "reasons": dict(sorted(reasons.items())),
    }


class Gang(PodKind):
    """Members of a gang when the extender has a gang handler."""

    name = "gang"

    def filter(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """The plan's verdict merged with the pod's own (see the module docstring)."""
        assert ext.gangs is not None  # the kind of a gang member only with a handler
        planned = ext.gangs.filter(ext, pod, req, names)
        if planned is None:
            return whole.WHOLE.filter(ext, pod, req, names, items)
        base = filter_nodes(ext.cache.snapshot(), req, names, ext.params)
        out = merge_gang(base, planned)
        ext.decisions.record_info("filter", req.key, req.gang, gang_filter_info(out, len(names)))
        return ext.filter_reply(out, items)

    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """The handler's scores (recorded), else as a pod alone."""
        assert ext.gangs is not None
        got = ext.gangs.prioritize(ext, req, names)
        if got is None:
            return whole.scores(ext, req, names)
        top = [(n, s) for n, s in got if s]
        node, score = top[0] if top else (None, 0)
        info = {"planned_node": node, "score": score, "points": {"gang plan": score}}
        ext.decisions.record_info("prioritize", req.key, req.gang, info)
        return [{"Host": n, "Score": s} for n, s in got]

    def bind(
        self, ext: Host, key: str, pod: Mapping[str, Any], req: PodRequest, node: str, uid: str
    ) -> BindWrite | str:
        """The member's planned GPUs through :func:`whole.bind_start`; a refusal is told
        to the handler (success is told once the write settles, by the extender)."""
        gangs = ext.gangs
        assert gangs is not None
        why = self.explain(ext, req, node)
        held = req
        if req.gpus > 0 and ext.dra.split_by_dra([node])[0] and ext.dra.extended_resources(pod):
            # nvidia.com/gpu that DRA backs, on a DRA node: the special claim kube-scheduler
            # made in its PreBind holds the GPUs (given the plan's set first when topoplace
            # chose it, else checked), and the pod holds none itself (as ``extended.py``)
            err = ext.dra.before_bind(key, node, pod, uid)
            if err:
                gangs.bound(ext, req, False)
                return str(err)
            held = replace(req, gpus=0)

        def pick(s: ClusterSnapshot) -> Any:
            return gangs.choose(ext, s, req, node)

        out = whole.bind_start(ext, key, pod, held, node, uid, why, pick)
        if isinstance(out, str):
            gangs.bound(ext, req, False)
        elif held is not req:
            out = replace(out, req=req)  # the gang runtime is told of the member as planned
        return out

    def preempt(self, ext: Host, pod: Mapping[str, Any], req: PodRequest) -> PreemptAsk | None:
        """Victims within the gang's placement with every lower-priority pod gone (none of
        topoplace's for a member asking for no GPU)."""
        gangs = ext.gangs
        if req.gpus <= 0 or gangs is None:
            return None

        def scope(snap: ClusterSnapshot) -> tuple[frozenset[str] | None, str]:
            placed = gangs.preemption_plan(ext, snap, req)
            if placed is None:
                return None, ""
            if placed.ok:
                return frozenset(a.node for a in placed.assignments), ""
            return None, (
                f"the gang does not fit even with every lower-priority pod gone: {placed.reason}"
            )

        return PreemptAsk(scope=scope)

    def explain(self, ext: Host, req: PodRequest, node: str) -> str:
        """The gang plan's one-line summary for ``node`` ("" with no plan recorded)."""
        try:
            plan = ext.decisions.gang_plan(req.gang)
            return gang_member_summary(plan, node) if plan is not None else ""
        except Exception:  # an explanation must never cost a placement
            log.exception("explaining the bind of %s failed", req.key)
            return ""


GANG = Gang()
