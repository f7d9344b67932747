"""A stand-in for what DRA needs from kube-controller-manager (the resourceclaim controller,
the garbage collector) and from the kubelet, on a plane that runs neither.

Without it a pod that names a ResourceClaimTemplate stays Pending with no event (the
scheduler waits for ``status.resourceClaimStatuses``, which only the controller writes), and
a deleted bound pod stays Terminating for ever (no kubelet confirms it), so its claims stay
reserved and allocated and a deleted claim hangs on its finalizer.

One pass does, in this order:

1. for each live pod naming a template and lacking that claim: create the claim
   (``generateName <pod>-<podClaim>-``, the pod as controller owner, annotation
   ``resource.kubernetes.io/pod-claim-name``) and record it in the pod's
   ``status.resourceClaimStatuses``;
2. (kubelet) force-delete pods that carry a ``deletionTimestamp``;
3. for each claim: drop ``reservedFor`` entries whose pod is gone, replaced (another uid)
   or done (Succeeded/Failed, or deleted before it was bound); when none is left, clear
   ``status.allocation`` and remove the finalizer ``resource.kubernetes.io/delete-protection``;
4. delete unreserved claims generated for a pod that is gone or done.

The decisions (:func:`template_claims`, :func:`terminating`, :func:`claim_action`) are pure
functions of listed objects; :class:`ClaimController` lists, decides and writes. Claims are
listed before pods, so a pod reserved in a listed claim was created before the pod list and
is never mistaken for gone; writes carry the claim's resourceVersion, so a claim changed
meanwhile is left to the next pass (409).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.cluster.dra import GROUP

log = logging.getLogger(__name__)

FINALIZER = "resource.kubernetes.io/delete-protection"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
PodKey = tuple[str, str]


def pod_key(pod: Mapping[str, Any]) -> PodKey:
    """(namespace, name)."""
    return pod["metadata"].get("namespace", ""), pod["metadata"]["name"]


def pod_done(pod: Mapping[str, Any]) -> bool:
    """The resourceclaim controller's ``isPodDone``: finished, or deleted before it was bound."""
    phase = (pod.get("status") or {}).get("phase")
    deleted = pod["metadata"].get("deletionTimestamp") is not None
    return phase in ("Succeeded", "Failed") or (
        deleted and not (pod.get("spec") or {}).get("nodeName")
    )


def owning_pod(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the pod that controls ``claim`` (a template claim), or None."""
    for o in claim["metadata"].get("ownerReferences") or []:
        if o.get("controller") and o.get("apiVersion") == "v1" and o.get("kind") == "Pod":
            return o["name"], o["uid"]
    return None


@dataclass(frozen=True, slots=True)
class NewClaim:
    """A claim to create for a pod's template entry."""

    pod: PodKey
    pod_claim: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """A pod's ``resourceClaimStatuses`` once its new claims exist: existing entries plus
    (podClaim name -> claim of an orphan found or of a :class:`NewClaim`)."""

    pod: PodKey
    existing: tuple[tuple[str, str], ...]
    found: tuple[tuple[str, str], ...]


def template_claims(
    pods: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    templates: Mapping[PodKey, Mapping[str, Any]],
    version: str,
) -> tuple[list[NewClaim], list[StatusUpdate]]:
    """Claims to create for live pods' template entries, and the pods whose claim statuses
    need writing. ``templates``: (namespace, template name) -> ResourceClaimTemplate. An
    existing claim owned by the pod for that entry (an interrupted earlier pass) is used
    instead of a new one; an entry whose template is missing is skipped."""
    claims = list(claims)
    new: list[NewClaim] = []
    updates: list[StatusUpdate] = []
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") is not None or pod_done(pod):
            continue
        ns, name = pod_key(pod)
        uid = pod["metadata"].get("uid")
        have = {
            s["name"]: s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        found: list[tuple[str, str]] = []
        wants = False
        for pc in (pod.get("spec") or {}).get("resourceClaims") or []:
            tmpl = pc.get("resourceClaimTemplateName")
            if not tmpl or pc["name"] in have:
                continue
            orphan = [
                c
                for c in claims
                if c["metadata"].get("namespace") == ns
                and owning_pod(c) == (name, uid)
                and (c["metadata"].get("annotations") or {}).get(POD_CLAIM_ANNOTATION) == pc["name"]
            ]
            if orphan:
                found.append((pc["name"], orphan[0]["metadata"]["name"]))
                continue
            t = templates.get((ns, tmpl))
            if t is None:
                continue
            wants = True
            tmeta = (t.get("spec") or {}).get("metadata") or {}
            gen = f"{name}-{pc['name']}-"
            if len(gen) > 57:
                gen = gen[:56] + "-"
            body = {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceClaim",
                "metadata": {
                    "generateName": gen,
                    "namespace": ns,
                    "annotations": {**(tmeta.get("annotations") or {}), POD_CLAIM_ANNOTATION: pc["name"]},
                    "labels": dict(tmeta.get("labels") or {}),
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid,
                         "controller": True, "blockOwnerDeletion": True}
                    ],
                },
                "spec": t["spec"]["spec"],
            }  # fmt: skip
            new.append(NewClaim((ns, name), pc["name"], body))
        if found or wants:
            existing = tuple((k, v) for k, v in have.items() if v)
            updates.append(StatusUpdate((ns, name), existing, tuple(found)))
    return new, updates


def terminating(pods: Iterable[Mapping[str, Any]]) -> list[PodKey]:
    """Pods a kubelet would confirm gone: those with a ``deletionTimestamp``."""
    return [pod_key(p) for p in pods if p["metadata"].get("deletionTimestamp") is not None]


@dataclass(frozen=True, slots=True)
class ClaimAction:
    """What to do with one claim (the default: nothing).

    Attributes:
        reserved_for: the ``reservedFor`` entries to write (None: no status write).
        deallocate: with that write, clear ``status.allocation`` (no consumer left).
        drop_finalizer: then remove :data:`FINALIZER`.
        delete: delete the claim (generated for a pod that is gone or done, unreserved).
    """

    reserved_for: tuple[dict[str, Any], ...] | None = None
    deallocate: bool = False
    drop_finalizer: bool = False
    delete: bool = False

    @property
    def any(self) -> bool:
        """True when there is something to write."""
        return self.reserved_for is not None or self.drop_finalizer or self.delete


def claim_action(claim: Mapping[str, Any], pods: Mapping[PodKey, Mapping[str, Any]]) -> ClaimAction:
    """The action for ``claim`` given the live ``pods`` ((namespace, name) -> pod, listed
    after the claim).

    The status is written when a ``reservedFor`` entry goes, or when a deleted claim still
    holds the finalizer with no consumer; with no consumer left it is deallocated and the
    finalizer removed (the claim can then go). An unreserved claim whose controlling pod is
    gone, replaced or done is deleted.
    """
    md, st = claim["metadata"], claim.get("status") or {}
    ns = md.get("namespace", "")
    reserved = list(st.get("reservedFor") or [])
    valid = []
    for r in reserved:
        if r.get("apiGroup") or r.get("resource") != "pods":
            valid.append(r)  # another kind of consumer: not ours to judge
            continue
        pod = pods.get((ns, r.get("name", "")))
        if pod is not None and pod["metadata"].get("uid") == r.get("uid") and not pod_done(pod):
            valid.append(r)
    fin = FINALIZER in (md.get("finalizers") or [])
    deleted = md.get("deletionTimestamp") is not None
    write = len(valid) < len(reserved) or (fin and deleted and not valid)
    delete = False
    if not valid:
        owner = owning_pod(claim)
        if owner is not None:
            pod = pods.get((ns, owner[0]))
            delete = pod is None or pod["metadata"].get("uid") != owner[1] or pod_done(pod)
    return ClaimAction(
        reserved_for=tuple(valid) if write else None,
        deallocate=write and fin and not valid,
        drop_finalizer=write and fin and not valid,
        delete=delete,
    )


def _served(api: Any) -> str | None:
    for g in (api.get("/apis") or {}).get("groups") or []:
        if g.get("name") == GROUP:
            served = [v["version"] for v in g.get("versions") or []]
            for v in ("v1", "v1beta2", "v1beta1"):
                if v in served:
                    return v
    return None


class ClaimController:
    """The passes of the module docstring against ``api`` (a
    :class:`benchmarks.live.kubeapi.Api`), once (:meth:`one_pass`) or in a thread every
    ``interval`` seconds (:meth:`start` / :meth:`stop`). Only reads and writes the API."""

    def __init__(self, api: Any, *, interval: float = 0.5, force_delete: bool = True) -> None:
        self.api = api
        self.interval = interval
        self.force_delete = force_delete
        self.version = _served(api)
        self.passes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _claims(self) -> list[dict[str, Any]]:
        return list(self.api.get(f"/apis/{GROUP}/{self.version}/resourceclaims").get("items") or [])

    def _pods(self) -> list[dict[str, Any]]:
        return list(self.api.get("/api/v1/pods").get("items") or [])

    def one_pass(self) -> None:
        """One pass (raises the API's errors other than 404/409 on writes)."""
        if self.version is None:
            return
        v = self.version
        claims = self._claims()
        pods = self._pods()
        names = {
            (pod_key(p)[0], pc["resourceClaimTemplateName"])
            for p in pods
            for pc in (p.get("spec") or {}).get("resourceClaims") or []
            if pc.get("resourceClaimTemplateName")
        }
        templates: dict[PodKey, Mapping[str, Any]] = {}
        for ns, t in names:
            got = self.api.call(
                "GET", f"/apis/{GROUP}/{v}/namespaces/{ns}/resourceclaimtemplates/{t}", ok=(404,)
            )
            if got is not None:
                templates[(ns, t)] = got
        new, updates = template_claims(pods, claims, templates, v)
        made: dict[PodKey, list[tuple[str, str]]] = {}
        for nc in new:
            c = self.api.call(
                "POST", f"/apis/{GROUP}/{v}/namespaces/{nc.pod[0]}/resourceclaims", nc.body
            )
            made.setdefault(nc.pod, []).append((nc.pod_claim, c["metadata"]["name"]))
            log.info("created claim %s/%s for pod %s", nc.pod[0], c["metadata"]["name"], nc.pod[1])
        for up in updates:
            entries = [*up.existing, *up.found, *made.get(up.pod, [])]
            self.api.call(
                "PATCH",
                f"/api/v1/namespaces/{up.pod[0]}/pods/{up.pod[1]}/status",
                {"status": {"resourceClaimStatuses": [
                    {"name": k, "resourceClaimName": c} for k, c in entries
                ]}},
                content_type="application/merge-patch+json",
                ok=(404,),
            )  # fmt: skip
        if self.force_delete:
            gone = terminating(pods)
            for ns, name in gone:
                self.api.call(
                    "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                    {"gracePeriodSeconds": 0}, ok=(404,),
                )  # fmt: skip
            if gone:
                pods = self._pods()
        live = {pod_key(p): p for p in pods}
        for c in self._claims():
            self._apply(c, claim_action(c, live))
        self.passes += 1

    def _apply(self, claim: dict[str, Any], act: ClaimAction) -> None:
        if not act.any:
            return
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        path = f"/apis/{GROUP}/{self.version}/namespaces/{ns}/resourceclaims/{name}"
        ok = (404, 409)
        cur: dict[str, Any] | None = claim
        if act.reserved_for is not None or act.deallocate:
            st = dict(claim.get("status") or {})
            st["reservedFor"] = list(act.reserved_for or ()) or None
            if act.deallocate:
                st["allocation"] = None
            cur = self.api.call("PUT", f"{path}/status", {**claim, "status": st}, ok=ok)
            log.info("claim %s/%s: reservedFor %s%s", ns, name, st["reservedFor"],
                     "; deallocated" if act.deallocate else "")  # fmt: skip
        if cur is not None and act.drop_finalizer:
            md = dict(cur["metadata"])
            md["finalizers"] = [f for f in md.get("finalizers") or [] if f != FINALIZER]
            cur = self.api.call("PUT", path, {**cur, "metadata": md}, ok=ok)
        if cur is not None and act.delete:
            self.api.call("DELETE", path, ok=(404,))
            log.info("deleted claim %s/%s (its pod is gone or done)", ns, name)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.one_pass()
            except Exception as exc:  # a failed pass is retried at the next tick
                log.warning("claim controller pass failed: %s", exc)
            self._stop.wait(self.interval)

    def start(self) -> None:
        """Run passes in a daemon thread until :meth:`stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="claim-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (after its current pass); idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None


def pods_by_key(pods: Sequence[Mapping[str, Any]]) -> dict[PodKey, Mapping[str, Any]]:
    """(namespace, name) -> pod."""
    return {pod_key(p): p for p in pods}
