"""Binding pods through the API: the ``pods/binding`` subresource, with annotations.

:class:`KubeBinder` implements :class:`scheduler.server.verbs.base.Binder`. It POSTs the
same v1 ``Binding`` kube-scheduler's DefaultBinder sends
(``../shared/fixtures/extender/binding_request.json``; from the event loop in protobuf, as
it does, see ``scheduler/kube/protobuf.py``) plus ``metadata.annotations``
holding the placement record; the API server merges those annotations into the Pod in the
same atomic update that sets ``spec.nodeName`` (``BindingREST``), so a pod is never bound
without its placement, nor annotated without being bound.

Contract of :meth:`KubeBinder.bind`: returns "" when the pod is bound to ``node`` (now or
already), else a short error message for kube-scheduler. It never raises for API or
transport failures; the extender then releases the assumption and kube-scheduler
requeues the pod.

Idempotency (extender-protocol.md §8, kubernetes#96579): a retried bind of a pod that is
already bound to the same node succeeds. On 409 Conflict, and when the answer was lost
(timeout, reset), the pod is read back: bound to ``node`` with the same UID, and carrying
the placement record this bind writes (when it writes one) -> "". Bound there with another
record (an earlier bind whose answer was lost chose other GPUs) is a conflict: the GPUs
this bind chose are released and the pod's own record, from the watch, is what is held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from scheduler.core.objects import PLACEMENT_ANNOTATION, meta, placement_of
from scheduler.kube.client import ApiError, ApiUnavailable, KubeApi
from scheduler.kube.metrics import KubeMetrics

log = logging.getLogger(__name__)

ERR_CONFLICT = "binding conflict"
ERR_POD_GONE = "pod no longer exists"
ERR_TIMEOUT = "binding timed out; the API server did not answer"
ERR_UNAVAILABLE = "API server unavailable"
ERR_SERVER = "API server error"
ERR_REJECTED = "binding rejected"


def binding_body(
    pod: Mapping[str, Any], node: str, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The v1 ``Binding`` for ``pod`` -> ``node``: name, namespace, uid (a precondition
    the server checks), and the annotations to merge into the pod."""
    m = meta(pod)
    md: dict[str, Any] = {
        "name": str(m.get("name") or ""),
        "namespace": str(m.get("namespace") or "default"),
    }
    if m.get("uid"):
        md["uid"] = str(m["uid"])
    if annotations:
        md["annotations"] = dict(annotations)
    return {
        "kind": "Binding",
        "apiVersion": "v1",
        "metadata": md,
        "target": {"kind": "Node", "name": node},
    }


def _gpus_of(pod: Mapping[str, Any]) -> tuple[Any, tuple[int, ...]] | None:
    """(node, GPUs) of the pod's placement record, None without a readable one."""
    rec = placement_of(pod)
    return None if rec is None else (rec.get("node"), tuple(sorted(rec.get("gpus") or ())))


class KubeBinder:
    """Writes bindings through the API server (:class:`~scheduler.server.verbs.base.Binder`).

    Args:
        api: the API.
        metrics: adapter metrics (``bind_api`` outcomes); optional.
    """

    def __init__(self, api: KubeApi, metrics: KubeMetrics | None = None) -> None:
        self.api = api
        self.metrics = metrics

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.bind_api.labels(outcome=outcome).inc()

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> str:
        """Bind ``pod`` to ``node`` with ``annotations``; "" on success, else an error."""
        body = binding_body(pod, node, annotations)
        md = body["metadata"]
        ns, name, uid = md["namespace"], md["name"], md.get("uid", "")
        try:
            self.api.create_binding(ns, name, body)
        except ApiError as exc:
            if self._settled_by_reading(exc) and self._already_bound(ns, name, uid, node, md):
                return self._bound_after(exc, ns, name, node)
            return self._failed(exc)
        self._count("ok")
        return ""

    async def bind_async(
        self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]
    ) -> str:
        """:meth:`bind` from the event loop: the POST without a worker thread
        (:meth:`KubeApi.create_binding_async`); the rare read-back after a lost answer or
        a conflict runs in a thread."""
        body = binding_body(pod, node, annotations)
        md = body["metadata"]
        ns, name, uid = md["namespace"], md["name"], md.get("uid", "")
        try:
            await self.api.create_binding_async(ns, name, body)
        except ApiError as exc:
            if self._settled_by_reading(exc) and await asyncio.to_thread(
                self._already_bound, ns, name, uid, node, md
            ):
                return self._bound_after(exc, ns, name, node)
            return self._failed(exc)
        self._count("ok")
        return ""

    @staticmethod
    def _settled_by_reading(exc: ApiError) -> bool:
        """Whether reading the pod back can show the bind happened: the answer was lost
        (no answer at all) or the server says the pod is bound already (409)."""
        return isinstance(exc, ApiUnavailable) or exc.conflict

    def _bound_after(self, exc: ApiError, ns: str, name: str, node: str) -> str:
        self._count("idempotent")
        if isinstance(exc, ApiUnavailable):
            log.info("bind %s/%s -> %s: answer lost (%s) but the pod is bound", ns, name, node, exc)
        return ""

    def _failed(self, exc: ApiError) -> str:
        if isinstance(exc, ApiUnavailable):
            self._count("timeout" if exc.timeout else "unavailable")
            return ERR_TIMEOUT if exc.timeout else f"{ERR_UNAVAILABLE}: {exc.message}"
        return self._error(exc)

    def _error(self, exc: ApiError) -> str:
        if exc.conflict:
            self._count("conflict")
            return f"{ERR_CONFLICT}: {exc.message}"
        if exc.not_found:
            self._count("not_found")
            return f"{ERR_POD_GONE}: {exc.message}"
        if exc.status >= 500 or exc.status == 429:
            self._count("server_error")
            return f"{ERR_SERVER} {exc.status}: {exc.message}"
        self._count("client_error")
        return f"{ERR_REJECTED} ({exc.status}): {exc.message}"

    def _already_bound(
        self, ns: str, name: str, uid: str, node: str, md: Mapping[str, Any] | None = None
    ) -> bool:
        """True when the pod (same UID, if known) is bound to ``node`` and carries the
        placement record of ``md`` (the Binding's metadata), if that has one."""
        pod = self.fetch_pod(ns, name)
        if pod is None:
            return False
        if uid and str(meta(pod).get("uid") or "") != uid:
            return False
        if (pod.get("spec") or {}).get("nodeName") != node:
            return False
        sent = ((md or {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        if sent is None:
            return True
        return _gpus_of(pod) == _gpus_of(
            {"metadata": {"annotations": {PLACEMENT_ANNOTATION: sent}}}
        )

    def fetch_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the API has it now (raw JSON), or None when absent or unreachable.

        Suitable as ``Extender(fetch_pod=...)``.
        """
        try:
            return self.api.get_pod(namespace, name)
        except ApiError as exc:
            if not exc.not_found:
                log.warning("GET pod %s/%s failed: %s", namespace, name, exc)
            return None
