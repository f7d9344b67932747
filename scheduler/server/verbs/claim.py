"""The verbs of DRA claim pods (``resourceClaims``, no ``nvidia.com/gpu`` request).

kube-scheduler's DRA plugin allocates the devices; topoplace predicts what it will give on
each node (:class:`scheduler.runtime.dra.DraRouter`) and filters and scores by that:

* filter: the router's verdict per node (the pod is remembered so bind finds it without a
  GET), narrowed to the best-scored node with ``extender.decide_in_filter``; a claim gang
  is placed whole by ``scheduler/kube/allocator.py``; a pod refused because topoplace's
  watch has not shown its claims yet is woken once it does (``ParkedPods.wait_for_claims``);
* score: the predicted device set's bandwidth, 0..10;
* shared devices over capacity (consumable capacity, whoever allocated the claims): logged
  once each and counted in ``topoplace_dra_overcommitted_devices``, set at each filter;
* bind: its claims are allocated by then; those kube-scheduler allocated are checked
  against the devices topoplace allocated (``DraRouter.before_bind_claims``), then a claim
  gang member binds as a pod alone (``whole.bind_start`` with its gang cleared);
* preempt: none of topoplace's (kube-scheduler's victims go back); explain: no summary.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from prometheus_client import Gauge

from scheduler.core import dra
from scheduler.core.model import PodRequest
from scheduler.core.objects import object_key
from scheduler.core.schedule import FilterOutcome
from scheduler.runtime.dra import REASON_CLAIMS_NOT_SEEN
from scheduler.server.verbs import whole
from scheduler.server.verbs.base import BindWrite, Host, PodKind

_OVERCOMMIT_GAUGES: weakref.WeakKeyDictionary[Any, Gauge] = weakref.WeakKeyDictionary()


def overcommit_gauge(ext: Host) -> Gauge | None:
    """``topoplace_dra_overcommitted_devices`` on the extender's registry (made once per
    registry; None when the extender has none)."""
    registry = getattr(ext.metrics, "registry", None)
    if registry is None:
        return None
    g = _OVERCOMMIT_GAUGES.get(registry)
    if g is None:
        g = Gauge(
            "topoplace_dra_overcommitted_devices",
            "Shared DRA devices whose allocated claims consume more than their capacity "
            "(whoever allocated them; each is also logged once)",
            registry=registry,
        )
        _OVERCOMMIT_GAUGES[registry] = g
    return g


def note_overcommits(ext: Host) -> None:
    """Set the overcommit gauge from the DRA router (``DraRouter.overcommits``: made once
    per claims object, so a claim pod's filter pays for it only after a claim changed)."""
    g = overcommit_gauge(ext)
    if g is not None:
        g.set(len({o.device for o in ext.dra.overcommits()}))


class Claims(PodKind):
    """Pods asking for no GPU by count that use DRA claims (``core.dra.uses_claims``)."""

    name = "claim"

    def filter(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """The DRA router's verdict; with ``extender.decide_in_filter`` (and the pod
        ours) only the node its prioritize scores best is kept, the other feasible ones
        failing as not chosen, as for whole-GPU pods: kube-scheduler then allocates there
        (the devices topoplace predicted and scored) and skips scoring."""
        ext.cache.remember_pending(pod)  # bind finds it without a GET
        note_overcommits(ext)
        out = ext.dra.filter(pod, names)
        if not out.feasible and REASON_CLAIMS_NOT_SEEN in out.failed.values():
            # refused for claims the watch had not shown: woken once it shows them all
            # (all its claims: some may have come in since the filter's snapshot)
            ext.parked.wait_for_claims(object_key(pod), dra.pod_claim_names(pod))
        if len(out.feasible) > 1 and ext.params.extender.decide_in_filter and ext.ours(pod):
            top = ext.dra.best(pod, out.feasible)
            if top:
                # the others are counted as not chosen, never sent: no map entry each
                n = len(out.feasible) - 1
                out = FilterOutcome((top,), out.failed, out.unresolvable)
                return ext.filter_reply(out, items, not_chosen=n)
        return ext.filter_reply(out, items)

    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """The DRA router's scores."""
        return [{"Host": n, "Score": s} for n, s in ext.dra.prioritize(pod, names)]

    def bind(
        self, ext: Host, key: str, pod: Mapping[str, Any], req: PodRequest, node: str, uid: str
    ) -> BindWrite | str:
        """A pod alone on ``node`` (a claim gang is whole already), once its claims are
        checked against topoplace's own allocations (``DraRouter.before_bind_claims``:
        a device kube-scheduler's PreBind gave from a view without topoplace's write
        fails the bind and is given back)."""
        err = ext.dra.before_bind_claims(key, pod, node, uid)
        if err:
            return err
        if req.gang:
            req = replace(req, gang="")
        return whole.bind_start(ext, key, pod, req, node, uid, self.explain(ext, req, node))


CLAIMS = Claims()
