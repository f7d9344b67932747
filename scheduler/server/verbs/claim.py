"""The verbs of DRA claim pods (``resourceClaims``, no ``nvidia.com/gpu`` request).

kube-scheduler's DRA plugin allocates the devices; topoplace predicts what it will give on
each node (:class:`scheduler.runtime.dra.DraRouter`) and filters and scores by that:

* filter: the router's verdict per node (the pod is remembered so bind finds it without a
  GET); a claim gang is placed whole by ``scheduler/kube/allocator.py``;
* score: the predicted device set's bandwidth, 0..10;
* bind: its claims are allocated by then, so a claim gang member binds as a pod alone
  (``whole.bind_start`` with its gang cleared);
* preempt: none of topoplace's (kube-scheduler's victims go back); explain: no summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scheduler.core.model import PodRequest
from scheduler.server.verbs import whole
from scheduler.server.verbs.base import BindWrite, Host, PodKind


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
        """The DRA router's verdict."""
        ext.cache.remember_pending(pod)  # bind finds it without a GET
        return ext.filter_reply(ext.dra.filter(pod, names), items)

    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """The DRA router's scores."""
        return [{"Host": n, "Score": s} for n, s in ext.dra.prioritize(pod, names)]

    def bind(
        self, ext: Host, key: str, pod: Mapping[str, Any], req: PodRequest, node: str, uid: str
    ) -> BindWrite | str:
        """A pod alone on ``node`` (a claim gang is whole already)."""
        if req.gang:
            req = replace(req, gang="")
        return whole.bind_start(ext, key, pod, req, node, uid, self.explain(ext, req, node))


CLAIMS = Claims()
