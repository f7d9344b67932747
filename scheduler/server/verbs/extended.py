"""The verbs of pods asking ``nvidia.com/gpu`` that a DeviceClass backs with DRA.

From 1.34 (on by default in 1.36, ``DRAExtendedResource``) a DeviceClass may name an
extended resource (``spec.extendedResourceName``); on a node that does not advertise it,
kube-scheduler allocates it through DRA, as a "special" claim it makes for the pod in its
PreBind. One pod spec then runs on device-plugin and DRA nodes alike (``docs/dra.md``
section 5):

* filter: offered device-plugin nodes only, the whole-GPU verbs (the pod is then a whole-GPU
  pod); else device-plugin nodes by the whole-GPU filter, DRA nodes by what kube-scheduler's
  allocator would give the special claim there (``DraRouter.filter_extended``); a gated pod
  topoplace chose for is kept to its node;
* score: every node on one scale, by the ring bandwidth of the set it would really get
  (``DraRouter.prioritize_extended``);
* bind: on a device-plugin node a whole-GPU bind; on a DRA node the special claim holds the
  GPUs (the pod holds none itself), and for a pod topoplace chose devices for, the claim is
  given them first; any other's is checked against topoplace's own allocations
  (``DraRouter.before_bind``);
* preempt: none of topoplace's (kube-scheduler's victims go back); explain: no summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scheduler.core.model import PodRequest
from scheduler.server.verbs import whole
from scheduler.server.verbs.base import BindWrite, Host, PodKind


class Extended(PodKind):
    """Pods whose ``nvidia.com/gpu`` (any extended resource) a DeviceClass backs."""

    name = "extended"

    def filter(
        self,
        ext: Host,
        pod: Mapping[str, Any],
        req: PodRequest,
        names: list[str],
        items: list[Mapping[str, Any]] | None,
    ) -> dict[str, Any]:
        """The DRA router's verdict on DRA nodes, the whole-GPU filter elsewhere."""
        by_dra, _ = ext.dra.split_by_dra(names)
        if not by_dra and ext.dra.extended_pick(req.key) is None:
            return whole.WHOLE.filter(ext, pod, req, names, items)
        ext.cache.remember_pending(pod, req)  # bind finds it without a GET
        mapped = ext.dra.extended_resources(pod)
        return ext.filter_reply(ext.dra.filter_extended(pod, req, names, mapped, ext.params), items)

    def score(
        self, ext: Host, pod: Mapping[str, Any], req: PodRequest, names: list[str]
    ) -> list[dict[str, Any]]:
        """The DRA router's scores (one scale for both kinds of node)."""
        by_dra, _ = ext.dra.split_by_dra(names)
        if not by_dra:
            return whole.scores(ext, req, names)
        mapped = ext.dra.extended_resources(pod)
        got = ext.dra.prioritize_extended(pod, req, names, mapped, ext.params)
        return [{"Host": n, "Score": s} for n, s in got]

    def bind(
        self, ext: Host, key: str, pod: Mapping[str, Any], req: PodRequest, node: str, uid: str
    ) -> BindWrite | str:
        """A whole-GPU bind on a device-plugin node; on a DRA node the special claim holds
        the GPUs (given topoplace's choice first, for a pod it chose for)."""
        by_dra, _ = ext.dra.split_by_dra([node])
        if not by_dra:
            return whole.WHOLE.bind(ext, key, pod, req, node, uid)
        err = ext.dra.before_bind(key, node, pod, uid)
        if err:
            return str(err)
        return whole.bind_start(ext, key, pod, replace(req, gpus=0, gang=""), node, uid, "")


EXTENDED = Extended()
