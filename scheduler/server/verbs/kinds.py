"""Which kind a pod is: the one rule every verb dispatches by.

In order, first match wins:

1. a share of a GPU (HAMi, gpushare: ``core.fractional.is_share_pod``) -> ``share.SHARES``;
2. GPU replicas (time-slicing / MPS, opted in) -> ``replica.REPLICAS``;
3. no GPU by count but DRA claims (``core.dra.uses_claims``) -> ``claim.CLAIMS``;
4. a gang member, when the extender has a gang handler -> ``gang.GANG`` (also when a
   DeviceClass backs its ``nvidia.com/gpu``: the gang is planned over device-plugin and DRA
   nodes alike, and on a DRA node the member's special claim holds the planned GPUs);
5. GPUs by count that a DeviceClass backs with DRA (``DraRouter.extended_resources``) ->
   ``extended.EXTENDED``;
6. anything else: whole GPUs, or none -> ``whole.WHOLE``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core import dra
from scheduler.core.fractional import is_share_pod
from scheduler.core.model import PodRequest
from scheduler.server.verbs.base import Host, PodKind
from scheduler.server.verbs.claim import CLAIMS
from scheduler.server.verbs.extended import EXTENDED
from scheduler.server.verbs.gang import GANG
from scheduler.server.verbs.replica import REPLICAS, is_replica_pod
from scheduler.server.verbs.share import SHARES
from scheduler.server.verbs.whole import WHOLE

KINDS: tuple[PodKind, ...] = (SHARES, REPLICAS, CLAIMS, GANG, EXTENDED, WHOLE)
"""Every kind, in the order :func:`kind_of` tries them."""


def kind_of(ext: Host, pod: Mapping[str, Any], req: PodRequest) -> PodKind:
    """The kind whose verbs answer for ``pod`` (its request ``req``); see the module
    docstring. Cheap: a few dict lookups."""
    if is_share_pod(pod):
        return SHARES
    if is_replica_pod(ext, pod, req):
        return REPLICAS
    if req.gpus <= 0 and dra.uses_claims(pod):
        return CLAIMS
    if ext.gangs is not None and req.gang:
        return GANG
    if req.gpus > 0 and ext.dra.extended_resources(pod):
        return EXTENDED
    return WHOLE
