"""Hand-off at bind for fractional backends: HAMi's node lock around the Binding.

The decision itself travels in ``Binding.metadata.annotations`` (see
``scheduler.server.verbs.share``): the API server copies them onto the pod in the
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

With ``hold`` one bind per node runs at a time: the lock names the pod HAMi's device plugin
is to allocate, and stays until it has. With ``release`` the lock only keeps other HAMi
binders (HAMi's own scheduler) off the node while topoplace writes, so topoplace's binds to
one node share it (:class:`_Session`): the first takes the lock (naming its pod), the binds
that arrive meanwhile write their Bindings beside it, and the last one out releases it;
at most :data:`MAX_SHARED_BINDS` binds share one take, so the node is let go between
batches. Binds of one node overlapping never put two pods on one GPU's memory or compute:
each bind's shares are held in topoplace's ledger, under the cache lock, before it is
written (``share.share_bind_start``). Packing sends consecutive pods to one node; each
bind was three API writes in a row behind the one before it (lock, Binding, release),
and a burst of them queued there for seconds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

from scheduler.core.fractional import HAMI_LOCK, HAMI_NODE
from scheduler.core.objects import meta
from scheduler.kube.client import ApiError

log = logging.getLogger(__name__)

ERR_NODE_LOCKED = "node is locked by another HAMi bind"
MAX_SHARED_BINDS = 32
"""Binds that may share one take of a node's lock (``release`` mode)."""
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


class _Blocking:
    """The blocking API calls the lock makes, as awaitables that never suspend (so that the
    lock's one protocol, written as coroutines, also runs without an event loop)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def get_node(self, name: str) -> dict[str, Any]:
        return dict(self.api.get_node(name))

    async def patch(
        self, name: str, annotations: Mapping[str, str | None], rv: str
    ) -> dict[str, Any]:
        return dict(self.api.patch_node_annotations(name, annotations, rv))

    async def get_pod(self, namespace: str, name: str) -> Any:
        return self.api.get_pod(namespace, name)


class _EventLoop(_Blocking):
    """The lock's API calls from the event loop: the API's ``*_async`` calls where it has
    them (``KubeApi``: no worker thread), else the blocking call in a worker thread."""

    async def get_node(self, name: str) -> dict[str, Any]:
        call = getattr(self.api, "get_node_async", None)
        if call is not None:
            return dict(await call(name))
        return dict(await asyncio.to_thread(self.api.get_node, name))

    async def patch(
        self, name: str, annotations: Mapping[str, str | None], rv: str
    ) -> dict[str, Any]:
        call = getattr(self.api, "patch_node_annotations_async", None)
        if call is not None:
            return dict(await call(name, annotations, rv))
        return dict(await asyncio.to_thread(self.api.patch_node_annotations, name, annotations, rv))

    async def get_pod(self, namespace: str, name: str) -> Any:
        return await asyncio.to_thread(self.api.get_pod, namespace, name)


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine whose awaits are all :class:`_Blocking`'s (it never suspends)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a blocking HAMi lock call suspended")


class HamiNodeLock:
    """Take and release ``hami.io/mutex.lock`` on a node, in HAMi's format.

    One protocol, written once as coroutines (:meth:`_acquire`, :meth:`_release`), run
    from the event loop (:meth:`acquire_async`, :meth:`release_async`: the API's async
    calls, no worker thread) or blocking (:meth:`acquire`, :meth:`release`). A release
    right after this lock's own acquire patches the node version that acquire's patch
    returned, and an acquire on a node this lock released last patches the version that
    release returned, without reading the node first (the patches are conditional: if
    anything changed the node meanwhile, the server answers 409 and the node is read, as
    before). Back-to-back binds on one node (a packing policy's usual case) then cost one
    read in all instead of two each.

    Args:
        api: needs ``get_node``, ``patch_node_annotations`` and ``get_pod`` (and uses
            ``get_node_async`` / ``patch_node_annotations_async`` when it has them).
        expiry_s: a lock older than this is taken over (HAMi's ``NodeLockTimeout``).
        clock: wall clock (epoch seconds).
    """

    def __init__(self, api: Any, expiry_s: float = 300.0, clock: Callable[[], float] = time.time):
        self.api = api
        self.expiry_s = expiry_s
        self.clock = clock
        self._taken: dict[tuple[str, str, str], str] = {}
        """(node, namespace, pod) -> the node's resourceVersion after this lock's patch."""
        self._free_at: dict[str, str] = {}
        """node -> the resourceVersion at which this lock's release left it unlocked."""

    def acquire(self, node: str, namespace: str, name: str) -> str:
        """Take the lock for the pod; "" on success (also when it already holds it)."""
        return str(_drive(self._acquire(_Blocking(self.api), node, namespace, name)))

    def release(self, node: str, namespace: str, name: str) -> None:
        """Delete the lock if this pod holds it (HAMi's owner check); errors are logged."""
        _drive(self._release(_Blocking(self.api), node, namespace, name))

    def keep(self, node: str, namespace: str, name: str) -> None:
        """The pod's lock stays (``hold``: HAMi's device plugin releases it): forget the
        version this lock's acquire left, which only its own release would use."""
        self._taken.pop((node, namespace, name), None)

    async def acquire_async(self, node: str, namespace: str, name: str) -> str:
        """:meth:`acquire` from the event loop."""
        return await self._acquire(_EventLoop(self.api), node, namespace, name)

    async def release_async(self, node: str, namespace: str, name: str) -> None:
        """:meth:`release` from the event loop."""
        await self._release(_EventLoop(self.api), node, namespace, name)

    async def _pod_exists(self, calls: _Blocking, ns: str, name: str) -> bool:
        try:
            await calls.get_pod(ns, name)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def _acquire(self, calls: _Blocking, node: str, namespace: str, name: str) -> str:
        free_at = self._free_at.pop(node, None)
        for _ in range(LOCK_RETRIES):
            try:
                if free_at is not None:
                    # This lock released the node at that version: if the node is still
                    # at it, the lock is free (a conditional patch checks), no read needed.
                    m: Mapping[str, Any] = {"resourceVersion": free_at}
                    free_at = None
                else:
                    m = meta(await calls.get_node(node))
                held = (m.get("annotations") or {}).get(HAMI_LOCK)
                if held:
                    parsed = parse_lock(held)
                    if parsed is not None:
                        t, ns, pod = parsed
                        if (ns, pod) == (namespace, name):
                            return ""
                        fresh = self.clock() - t <= self.expiry_s
                        if fresh and (not ns or not pod or await self._pod_exists(calls, ns, pod)):
                            return f"{ERR_NODE_LOCKED} ({ns}/{pod})"
                    log.info("taking over HAMi node lock %r on %s", held, node)
                value = lock_value(namespace, name, self.clock())
                after = await calls.patch(
                    node, {HAMI_LOCK: value}, str(m.get("resourceVersion") or "")
                )
                rv = str(meta(after).get("resourceVersion") or "")
                if rv:
                    self._taken[(node, namespace, name)] = rv
                return ""
            except ApiError as exc:
                if exc.conflict:
                    continue  # the node changed under us: read it again
                return f"{ERR_LOCK_FAILED}: {exc.message}"
        return f"{ERR_LOCK_FAILED}: node kept changing"

    async def _release(self, calls: _Blocking, node: str, namespace: str, name: str) -> None:
        rv = self._taken.pop((node, namespace, name), None)
        for _ in range(LOCK_RETRIES):
            try:
                if rv is None:
                    obj = await calls.get_node(node)
                    m = meta(obj)
                    held = (m.get("annotations") or {}).get(HAMI_LOCK) or ""
                    if not held.endswith(f",{namespace},{name}"):
                        return
                    rv = str(m.get("resourceVersion") or "")
                after = await calls.patch(node, {HAMI_LOCK: None}, rv)
                rv = str(meta(after).get("resourceVersion") or "")
                if rv:
                    self._free_at[node] = rv
                return
            except ApiError as exc:
                rv = None  # read the node again
                if exc.conflict:
                    continue
                log.warning("releasing HAMi node lock on %s failed: %s", node, exc)
                return


class _Session:
    """One take of a node's HAMi lock shared by topoplace's binds to that node (``release``
    mode): the pod the lock names, the take's outcome once known, the binds in it."""

    __slots__ = ("owner", "taken", "members", "joined", "done")

    def __init__(self, owner: tuple[str, str], taken: asyncio.Future[str]) -> None:
        self.owner = owner
        self.taken = taken
        self.members = 0
        self.joined = 0
        self.done = asyncio.Event()


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
        self._per_node_async: dict[str, asyncio.Lock] = {}
        self._sessions: dict[str, _Session] = {}
        self.shared_binds = 0
        """Binds that wrote beside another under one take of the lock (``release``)."""

    def fetch_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The inner binder's pod lookup."""
        return self.inner.fetch_pod(namespace, name)

    def _node_alock(self, node: str) -> asyncio.Lock:
        lk = self._per_node_async.get(node)
        if lk is None:
            lk = self._per_node_async[node] = asyncio.Lock()
        return lk

    def _node_mutex(self, node: str) -> threading.Lock:
        with self._mutex:
            lk = self._per_node.get(node)
            if lk is None:
                lk = self._per_node[node] = threading.Lock()
            return lk

    async def bind_async(
        self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]
    ) -> str:
        """:meth:`bind` from the event loop, without a worker thread: every bind without a
        HAMi hand-off is the inner binder's own ``bind_async`` (no extra API call: the
        whole-GPU path is untouched); a HAMi hand-off takes the lock, writes the Binding and
        releases the lock with the API's async calls, one bind per node at a time.

        (Before, a HAMi hand-off ran in a worker thread: at 300 nodes and some 20
        fractional pods a second, the threads waited on the event loop for the GIL, binds
        took seconds, and kube-scheduler's 5 s timeout retried pods already bound.)"""
        inner = getattr(self.inner, "bind_async", None)
        if HAMI_NODE not in annotations:
            if inner is not None:
                return str(await inner(pod, node, annotations))
            return self.inner.bind(pod, node, annotations)
        m = meta(pod)
        ns, name = str(m.get("namespace") or "default"), str(m.get("name") or "")
        if self.mode == "release":
            return await self._bind_shared(pod, node, annotations, ns, name)
        async with self._node_alock(node):
            err = await self.lock.acquire_async(node, ns, name)
            if err:
                return err
            err = "binding failed"
            try:
                if inner is not None:
                    err = str(await inner(pod, node, annotations))
                else:
                    err = await asyncio.to_thread(self.inner.bind, pod, node, annotations)
            finally:
                if err or self.mode == "release":
                    await self.lock.release_async(node, ns, name)
                else:
                    self.lock.keep(node, ns, name)
            return err

    async def _join(self, node: str, ns: str, name: str) -> _Session:
        """The node's open session, joined, or a new one whose lock take starts now (one
        that is full is waited out: its lock is released before another take)."""
        while True:
            async with self._node_alock(node):
                sess = self._sessions.get(node)
                if sess is None:
                    taken = asyncio.ensure_future(self.lock.acquire_async(node, ns, name))
                    sess = self._sessions[node] = _Session((ns, name), taken)
                if sess.joined < MAX_SHARED_BINDS:
                    sess.members += 1
                    sess.joined += 1
                    if sess.joined > 1:
                        self.shared_binds += 1
                    return sess
                done = sess.done
            await done.wait()

    async def _leave(self, node: str, sess: _Session, err: str) -> None:
        """Leave ``sess``; the last one out releases the lock (under the node's asyncio
        lock, so a new take waits for the release)."""
        async with self._node_alock(node):
            sess.members -= 1
            if sess.members:
                return
            if self._sessions.get(node) is sess:
                del self._sessions[node]
            try:
                if not err:
                    await self.lock.release_async(node, *sess.owner)
            finally:
                sess.done.set()

    async def _bind_shared(
        self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str], ns: str, name: str
    ) -> str:
        """``release`` mode: the Binding written under a take of the node's lock shared
        with the node's other binds in flight (see the module docstring)."""
        sess = await self._join(node, ns, name)
        taken = ""
        try:
            taken = await asyncio.shield(sess.taken)
            if taken:
                return taken
            inner = getattr(self.inner, "bind_async", None)
            if inner is not None:
                return str(await inner(pod, node, annotations))
            return str(await asyncio.to_thread(self.inner.bind, pod, node, annotations))
        finally:
            await self._leave(node, sess, taken)

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
                else:
                    self.lock.keep(node, ns, name)
            return err
