"""DRA objects from the API server: discovery, the watched kinds, and claim writes.

kube mode lists and watches ``resource.k8s.io`` ResourceSlices, ResourceClaims and
DeviceClasses in the newest version the server serves (v1, else v1beta2, else v1beta1;
Kubernetes 1.32-1.34+), through the same raw-JSON reflector as Nodes and Pods
(:class:`~scheduler.kube.watcher.KubeWatcher`), and feeds them to the cache:

* slices and classes: ``snapshot.extra`` (``scheduler.core.dra`` keys), then every node is
  re-read (a slice changes a node's GPU count and per-GPU health: device taints), except
  for a slice update that changes only its devices' taints, which re-reads its node alone
  (``ClusterCache.apply_slice_taints``);
* claims: ``extra["resourceclaims"]`` and, when allocated, a holding of their GPUs in the
  ledger (``ClusterCache.apply_claim``), whoever allocated them.

Nothing is watched when the server does not serve the group (a cluster without DRA).

The writes of topoplace's own allocator (:mod:`scheduler.kube.allocator`) are here too:
the finalizer and ``status.allocation`` of a claim, removing a pod's scheduling gate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from scheduler.core import dra
from scheduler.kube.client import ApiError, KubeApi, ResourceKind, strip_object

log = logging.getLogger(__name__)

VERSIONS = ("v1", "v1beta2", "v1beta1")
"""``resource.k8s.io`` versions topoplace reads, newest first."""


def kinds_for(version: str) -> tuple[ResourceKind, ResourceKind, ResourceKind]:
    """(slices, claims, classes) of one ``resource.k8s.io`` version."""
    g = dra.GROUP
    return (
        ResourceKind(g, version, "resourceslices", "ResourceSlice"),
        ResourceKind(g, version, "resourceclaims", "ResourceClaim"),
        ResourceKind(g, version, "deviceclasses", "DeviceClass"),
    )


def served_version(api: Any) -> str | None:
    """The newest ``resource.k8s.io`` version of :data:`VERSIONS` that serves all three
    kinds, or None (no DRA on this server). Discovery errors other than 403/404 raise."""
    for v in VERSIONS:
        res = api.api_resources(dra.GROUP, v)
        names = {
            r.get("name") for r in (res or {}).get("resources") or () if isinstance(r, Mapping)
        }
        if {"resourceslices", "resourceclaims", "deviceclasses"} <= names:
            return v
    return None


def discover(api: Any) -> tuple[ResourceKind, ...]:
    """The DRA kinds to watch (empty when the server does not serve DRA)."""
    try:
        v = served_version(api)
    except ApiError as exc:
        log.warning("discovery of %s failed: %s; not watching DRA objects", dra.GROUP, exc)
        return ()
    if v is None:
        return ()
    log.info("DRA: %s/%s served (ResourceSlices, ResourceClaims, DeviceClasses)", dra.GROUP, v)
    return kinds_for(v)


def is_dra_kind(kind: ResourceKind) -> bool:
    """Whether ``kind`` is one of the DRA kinds."""
    return kind.group == dra.GROUP


def extra_from_stores(stores: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``extra`` entries from the reflector stores (plural -> key -> object): every DRA key
    present (empty when nothing is stored), so a relist that empties one clears it."""
    objs: list[Any] = []
    for plural in ("resourceslices", "resourceclaims", "deviceclasses"):
        objs += list((stores.get(plural) or {}).values())
    out = dra.extra_of(objs)
    out.setdefault(dra.SLICES_KEY, [])
    out.setdefault(dra.CLAIMS_KEY, {})
    out.setdefault(dra.CLASSES_KEY, {})
    return out


# ---- writes (topoplace's own allocator) -----------------------------------------------------


class ClaimWriter:
    """Writes to claims and pods through the API's raw JSON calls.

    Args:
        api: the :class:`KubeApi`.
        version: the ``resource.k8s.io`` version served (see :func:`served_version`).
    """

    def __init__(self, api: KubeApi, version: str) -> None:
        self.api = api
        self.version = version

    def _claim_path(self, ns: str, name: str, sub: str = "") -> str:
        path = (
            f"/apis/{dra.GROUP}/{self.version}/namespaces/{quote(ns, safe='')}"
            f"/resourceclaims/{quote(name, safe='')}"
        )
        return path + (f"/{sub}" if sub else "")

    def get_claim(self, ns: str, name: str) -> dict[str, Any]:
        """GET one claim (raw JSON). Raises ApiError."""
        return strip_object(self.api.request_json("GET", self._claim_path(ns, name)))

    def list_claims(self) -> list[dict[str, Any]]:
        """A consistent (quorum) list of every claim. Raises ApiError."""
        kind = kinds_for(self.version)[1]
        return [c for c in self.api.list(kind).get("items") or () if isinstance(c, dict)]

    def update_claim(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the claim (metadata/spec; optimistic concurrency on resourceVersion)."""
        m = claim.get("metadata") or {}
        return self.api.request_json(
            "PUT", self._claim_path(m.get("namespace") or "default", m["name"]), claim
        )

    def update_claim_status(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the claim's status subresource (optimistic concurrency on resourceVersion)."""
        m = claim.get("metadata") or {}
        return self.api.request_json(
            "PUT", self._claim_path(m.get("namespace") or "default", m["name"], "status"), claim
        )

    def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        """GET one pod (raw JSON; its status names the claim of its extended resources).
        Raises ApiError."""
        path = f"/api/v1/namespaces/{quote(ns, safe='')}/pods/{quote(name, safe='')}"
        return self.api.request_json("GET", path)

    def wake_pod(self, ns: str, name: str, why: str) -> None:
        """Patch the waker's annotation (``scheduler.kube.waker.WAKE_ANNOTATION``) onto a
        pod: an update of the pod moves it out of kube-scheduler's unschedulable queue.
        Raises ApiError."""
        from scheduler.kube.waker import WAKE_ANNOTATION

        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.api.patch_pod_annotations(ns, name, {WAKE_ANNOTATION: f"{stamp} {why}"[:200]})

    def remove_gate(
        self, pod: Mapping[str, Any], gate: str, annotations: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Remove scheduling gate ``gate`` from a pod (JSON patch guarded by a test of the
        gate list, so a concurrent change fails with 422 instead of removing another gate),
        adding ``annotations`` in the same patch."""
        m = pod.get("metadata") or {}
        gates = list((pod.get("spec") or {}).get("schedulingGates") or [])
        keep = [g for g in gates if g.get("name") != gate]
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/spec/schedulingGates", "value": gates},
            {"op": "replace", "path": "/spec/schedulingGates", "value": keep},
        ]
        if annotations and not m.get("annotations"):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": dict(annotations)})
        elif annotations:
            for k, v in sorted(annotations.items()):
                path = "/metadata/annotations/" + k.replace("~", "~0").replace("/", "~1")
                ops.append({"op": "add", "path": path, "value": v})
        path = (
            f"/api/v1/namespaces/{quote(m.get('namespace') or 'default', safe='')}"
            f"/pods/{quote(m['name'], safe='')}"
        )
        return self.api.request_json("PATCH", path, ops, "application/json-patch+json")
