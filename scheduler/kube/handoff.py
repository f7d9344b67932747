"""Hand-off at bind for fractional backends: HAMi's node lock around the Binding.

The decision itself travels in ``Binding.metadata.annotations`` (see
``scheduler.server.fractional_verbs``): the API server copies them onto the pod in the
same write that sets ``spec.nodeName``. HAMi's device plugin additionally expects the node
lock HAMi's scheduler takes at bind (``pkg/util/nodelock``): the node annotation
``hami.io/mutex.lock = <RFC3339 time>,<namespace>,<pod>``, set with a conditional patch,
taken over when it is older than the expiry (5 min) or its pod no longer exists, refused
otherwise; released (the annotation deleted) when the bind fails. On success HAMi leaves
it to the device plugin, which releases it after ``Allocate`` (``sharing.hami_lock: hold``,
the default); ``release`` makes topoplace delete it right after the Binding (clusters and
tests without HAMi's device plugin).

:class:`HandoffBinder` wraps the :class:`~scheduler.kube.binder.KubeBinder`: binds whose
annotations carry ``hami.io/vgpu-node`` take the lock first; every other bind passes
through untouched (no extra API call on the whole-GPU path).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from scheduler.core.fractional import HAMI_LOCK, HAMI_NODE
from scheduler.core.objects import meta
from scheduler.kube.client import ApiError

log = logging.getLogger(__name__)

ERR_NODE_LOCKED = "node is locked by another HAMi bind"
ERR_LOCK_FAILED = "could not take HAMi's node lock"
LOCK_RETRIES = 5


def lock_value(namespace: str, name: str, now: float) -> str:
    """HAMi's ``GenerateNodeLockKeyByPod``: ``<RFC3339>,<namespace>,<pod>``."""
    stamp = datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp},{namespace},{name}"


def parse_lock(value: str) -> tuple[float, str, str] | None:
    """HAMi's ``ParseNodeLock``: (epoch seconds, namespace, pod); None if malformed."""
    parts = value.split(",")
    if len(parts) not in (1, 3) or len(value) > 1024:
        return None
    try:
        t = datetime.fromisoformat(parts[0].replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        return None
    ns, pod = (parts[1], parts[2]) if len(parts) == 3 else ("", "")
    return t.timestamp(), ns, pod


class HamiNodeLock:
    """Take and release ``hami.io/mutex.lock`` on a node, in HAMi's format.

    Args:
        api: needs ``get_node``, ``patch_node_annotations`` and ``get_pod``.
        expiry_s: a lock older than this is taken over (HAMi's ``NodeLockTimeout``).
        clock: wall clock (epoch seconds).
    """

    def __init__(self, api: Any, expiry_s: float = 300.0, clock: Callable[[], float] = time.time):
        self.api = api
        self.expiry_s = expiry_s
        self.clock = clock

    def _pod_exists(self, ns: str, name: str) -> bool:
        try:
            self.api.get_pod(ns, name)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def acquire(self, node: str, namespace: str, name: str) -> str:
        """Take the lock for the pod; "" on success (also when it already holds it)."""
        for _ in range(LOCK_RETRIES):
            try:
                obj = self.api.get_node(node)
                m = meta(obj)
                held = (m.get("annotations") or {}).get(HAMI_LOCK)
                if held:
                    parsed = parse_lock(held)
                    if parsed is not None:
                        t, ns, pod = parsed
                        if (ns, pod) == (namespace, name):
                            return ""
                        fresh = self.clock() - t <= self.expiry_s
                        if fresh and (not ns or not pod or self._pod_exists(ns, pod)):
                            return f"{ERR_NODE_LOCKED} ({ns}/{pod})"
                    log.info("taking over HAMi node lock %r on %s", held, node)
                value = lock_value(namespace, name, self.clock())
                self.api.patch_node_annotations(
                    node, {HAMI_LOCK: value}, str(m.get("resourceVersion") or "")
                )
                return ""
            except ApiError as exc:
                if exc.conflict:
                    continue  # the node changed under us: read it again
                return f"{ERR_LOCK_FAILED}: {exc.message}"
        return f"{ERR_LOCK_FAILED}: node kept changing"

    def release(self, node: str, namespace: str, name: str) -> None:
        """Delete the lock if this pod holds it (HAMi's owner check); errors are logged."""
        for _ in range(LOCK_RETRIES):
            try:
                obj = self.api.get_node(node)
                m = meta(obj)
                held = (m.get("annotations") or {}).get(HAMI_LOCK) or ""
                if not held.endswith(f",{namespace},{name}"):
                    return
                self.api.patch_node_annotations(
                    node, {HAMI_LOCK: None}, str(m.get("resourceVersion") or "")
                )
                return
            except ApiError as exc:
                if exc.conflict:
                    continue
                log.warning("releasing HAMi node lock on %s failed: %s", node, exc)
                return


class HandoffBinder:
    """A binder that takes HAMi's node lock around binds that hand a GPU to HAMi.

    Args:
        inner: the binder that writes the Binding (``KubeBinder``).
        lock: the HAMi node lock.
        mode: ``hold`` (the device plugin releases it) or ``release`` (released after the
            Binding is written).
    """

    def __init__(self, inner: Any, lock: HamiNodeLock, mode: str = "hold") -> None:
        self.inner = inner
        self.lock = lock
        self.mode = mode
        self._mutex = threading.Lock()
        self._per_node: dict[str, threading.Lock] = {}

    def fetch_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The inner binder's pod lookup."""
        return self.inner.fetch_pod(namespace, name)

    def _node_mutex(self, node: str) -> threading.Lock:
        with self._mutex:
            lk = self._per_node.get(node)
            if lk is None:
                lk = self._per_node[node] = threading.Lock()
            return lk

    async def bind_async(
        self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]
    ) -> str:
        """:meth:`bind` from the event loop: every bind without a HAMi hand-off is the inner
        binder's own ``bind_async`` (no thread, no extra API call: the whole-GPU path is
        untouched); a HAMi hand-off (lock, Binding, release) runs in a worker thread."""
        if HAMI_NODE not in annotations:
            inner = getattr(self.inner, "bind_async", None)
            if inner is not None:
                return str(await inner(pod, node, annotations))
            return self.inner.bind(pod, node, annotations)
        return await asyncio.to_thread(self.bind, pod, node, annotations)

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> str:
        """Bind through the inner binder; under HAMi's node lock for HAMi hand-offs."""
        if HAMI_NODE not in annotations:
            return self.inner.bind(pod, node, annotations)
        m = meta(pod)
        ns, name = str(m.get("namespace") or "default"), str(m.get("name") or "")
        with self._node_mutex(node):
            err = self.lock.acquire(node, ns, name)
            if err:
                return err
            err = "binding failed"
            try:
                err = self.inner.bind(pod, node, annotations)
            finally:
                if err or self.mode == "release":
                    self.lock.release(node, ns, name)
            return err
