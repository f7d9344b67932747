"""Leadership of a topoplace replica: it follows its kube-scheduler's leader-election Lease.

topoplace ships as a sidecar of kube-scheduler (``config/deploy/deployment.yaml``): each
replica's kube-scheduler calls its own topoplace on 127.0.0.1, and kube-scheduler elects
its leader on the ``coordination.k8s.io/v1`` Lease of its configuration
(``leaderElection.resourceName``, ``topoplace-system/topoplace-scheduler``). Only the leading
kube-scheduler schedules, so the topoplace replica that must act is the one *beside the
leader*. A second, independent election among topoplace replicas could pick the other pod
and leave the leading kube-scheduler talking to a replica that refuses everything; so
topoplace does not elect, it follows the scheduler's Lease (as HAMi does beside
kube-scheduler) with the real kubernetes client:

* kube-scheduler's identity in the Lease is ``<hostname>_<uuid>``; both containers of a
  pod share the hostname (the pod name), so this replica leads when the Lease's
  ``holderIdentity`` is its identity or starts with ``<identity>_``;
* a Lease is trusted for ``leaseDurationSeconds`` after this replica last *saw it change*
  (client-go's rule: local observation time, no clock comparison with the holder); a
  holder that stops renewing loses the lead here when the duration passes, as it does for
  the other candidates;
* when the Lease cannot be read, the last answer stands for ``leaseDurationSeconds`` from
  the last successful read, then the replica steps down.

:class:`LeaseFollower` polls the Lease (one GET per ``poll_s``; RBAC: ``get`` on that
Lease) and calls ``on_started`` / ``on_stopped`` on each change of leadership, from its
own thread. What a takeover does (replay plans, reserve again) is the runner's
(``runner.py``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 1.0
DEFAULT_LEASE_DURATION_S = 15.0
"""client-go's default ``leaseDuration``, used when a Lease does not say."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a Lease says about leadership (``coordination.k8s.io/v1`` ``spec``).

    Attributes:
        holder: ``holderIdentity`` ("" when released or never held).
        renew_time: ``renewTime`` as written (RFC 3339 with microseconds); any change of it
            is a renewal.
        duration_s: ``leaseDurationSeconds``.
        transitions: ``leaseTransitions``.
        resource_version: ``metadata.resourceVersion``.
    """

    holder: str
    renew_time: str
    duration_s: float
    transitions: int
    resource_version: str


def lease_record(obj: Mapping[str, Any] | None) -> LeaseRecord | None:
    """The leadership fields of a Lease object (raw JSON); None for None or a non-Lease.

    Malformed fields read as absent: an unusable holder is nobody, an unusable duration is
    :data:`DEFAULT_LEASE_DURATION_S`.
    """
    if not isinstance(obj, Mapping) or obj.get("kind", "Lease") != "Lease":
        return None
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    holder = spec.get("holderIdentity")
    duration = spec.get("leaseDurationSeconds")
    if isinstance(duration, bool) or not isinstance(duration, int) or duration <= 0:
        duration = DEFAULT_LEASE_DURATION_S
    transitions = spec.get("leaseTransitions")
    return LeaseRecord(
        holder=holder if isinstance(holder, str) else "",
        renew_time=str(spec.get("renewTime") or ""),
        duration_s=float(duration),
        transitions=transitions if isinstance(transitions, int) else 0,
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def holds(holder: str, identity: str) -> bool:
    """Whether the Lease holder ``holder`` is the kube-scheduler beside this replica, whose
    identity prefix (hostname) is ``identity``: kube-scheduler writes ``<hostname>_<uuid>``."""
    return bool(identity) and (holder == identity or holder.startswith(identity + "_"))


def default_identity() -> str:
    """This replica's identity: the hostname, which is kube-scheduler's identity prefix in
    the same pod."""
    return socket.gethostname()


class LeaseFollower:
    """Follows a Lease and says whether the kube-scheduler beside this replica leads.

    Args:
        get_lease: returns the Lease object (raw JSON) or None when it does not exist;
            raises on any other failure.
        identity: this replica's identity prefix (see :func:`holds`).
        describe: the Lease's ``namespace/name``, for logs and errors.
        on_started: called (in the polling thread) when this replica starts to lead.
        on_stopped: called when it stops.
        clock: monotonic seconds.
        poll_s: seconds between two reads of the Lease.
    """

    def __init__(
        self,
        get_lease: Callable[[], Mapping[str, Any] | None],
        identity: str,
        describe: str = "",
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = DEFAULT_POLL_S,
    ) -> None:
        if not identity:
            raise ValueError("leader identity must not be empty")
        self.get_lease = get_lease
        self.identity = identity
        self.describe = describe
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.poll_s = poll_s
        self.leader = False
        """Whether the kube-scheduler beside this replica holds the Lease (last poll)."""
        self.record: LeaseRecord | None = None
        self._seen: tuple[str, str] | None = None
        self._seen_at = 0.0
        self._read_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _leads(self, now: float) -> bool:
        rec = self.record
        if rec is None or not holds(rec.holder, self.identity):
            return False
        if self._read_at is None or now - self._read_at > rec.duration_s:
            return False  # the Lease could not be read for a whole duration
        return now - self._seen_at <= rec.duration_s

    def observe(self) -> bool:
        """Read the Lease once, update :attr:`leader` and call the callbacks on a change;
        returns :attr:`leader`. A failed read keeps the last record (see module docstring)."""
        now = self.clock()
        try:
            obj = self.get_lease()
        except Exception as exc:  # an I/O edge: judge by the last record
            log.warning("lease %s: cannot read it (%s)", self.describe, exc)
        else:
            self._read_at = now
            rec = lease_record(obj)
            self.record = rec
            key = (rec.holder, rec.renew_time) if rec is not None else None
            if key != self._seen:
                self._seen = key
                self._seen_at = now
        leads = self._leads(now)
        if leads != self.leader:
            self.leader = leads
            holder = self.record.holder if self.record is not None else ""
            if leads:
                log.info(
                    "lease %s: held by %s, the kube-scheduler beside this replica (%s): "
                    "taking over",
                    self.describe,
                    holder,
                    self.identity,
                )
                self.on_started()
            else:
                log.info(
                    "lease %s: held by %s, not by this replica (%s): standing by",
                    self.describe,
                    holder or "nobody",
                    self.identity,
                )
                self.on_stopped()
        return self.leader

    def start(self) -> None:
        """Poll in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.observe()
                except Exception:  # a callback bug must not stop following the Lease
                    log.exception("lease %s: following it failed", self.describe)
                self._stop.wait(self.poll_s)

        self._thread = threading.Thread(target=loop, name="lease-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (the current leadership is left as it is)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def kube_lease_getter(api: Any, namespace: str, name: str) -> Callable[[], dict[str, Any] | None]:
    """A ``get_lease`` for :class:`LeaseFollower` over ``api`` (a ``scheduler.kube.client.
    KubeApi``): GET ``coordination.k8s.io/v1`` Lease ``namespace/name`` as raw JSON, None
    when it does not exist."""
    made: list[Any] = []

    def get() -> dict[str, Any] | None:
        from kubernetes import client

        from scheduler.kube.client import ApiError

        if not made:
            made.append(client.CoordinationV1Api(api.api_client))
        try:
            return api._json(made[0].read_namespaced_lease, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    return get


def parse_lease_ref(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` -> (namespace, name). Raises ValueError."""
    ns, sep, name = text.strip().partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ValueError(f"lease {text!r}: expected NAMESPACE/NAME")
    return ns, name
