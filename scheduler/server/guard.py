"""Connection guard: the HTTP protocol uvicorn runs, with limits a hostile client cannot get
around.

uvicorn (h11) reads a request for as long as the client keeps the connection open: a client
that sends its headers one byte every few seconds (slowloris), or a body that never ends,
holds a connection and its file descriptor forever, and nothing bounds how many
connections are open. :func:`guarded_protocol` returns a subclass of uvicorn's
``H11Protocol`` (:func:`protocol_class`, passed as ``uvicorn.Config(http=...)``) that adds, per listening port:

* **connection cap**: at most ``max_connections`` open connections, and at most
  ``max_per_client`` from one client address; a connection over either cap is aborted as
  soon as it is accepted (its descriptor is released at once, the client sees a reset), so
  a flood of idle connections can never exhaust the process's descriptors;
* **request read deadline**: from the moment a connection opens (or its previous response
  was sent) the next request's headers *and* body must arrive within
  ``read_timeout_s``; a connection still reading when it expires is aborted. A request
  already read and being answered is never cut;
* **JSON 400**: malformed HTTP (bad request line, headers over h11's 16 KiB limit) is
  answered ``{"error": ...}`` like every other refusal, not uvicorn's text.

Nothing here runs per request on an accepted connection beyond arming one timer per
request; the verbs' hot path is unchanged. ``uvicorn``'s own ``timeout_keep_alive``
still closes idle keep-alive connections.

With TLS, asyncio calls ``connection_made`` after the handshake, so the cap counts
established connections; connections in their handshake are bounded by asyncio's
handshake timeout (60 s). The shipped deployment listens with TLS on 127.0.0.1 only and
serves probes on a separate plain-HTTP port (``serve --health-port``), which has its own,
smaller cap.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_PER_CLIENT = 256
DEFAULT_READ_TIMEOUT_S = 10.0
"""A request (headers and body) must be read within this many seconds: kube-scheduler's
extender ``httpTimeout`` is 5 s, and 64 MiB arrive over loopback in well under one."""
HEALTH_MAX_CONNECTIONS = 64
HEALTH_MAX_PER_CLIENT = 16


@dataclass
class GuardState:
    """Counters shared by the connections of one listening port (event loop thread only).

    Attributes:
        max_connections: open connections allowed on the port.
        max_per_client: open connections allowed from one client address.
        read_timeout_s: seconds to read one request (headers and body).
        open: connections open now.
        per_client: open connections per client address.
        refused: connections aborted over a cap since start.
        timed_out: connections aborted because a request was not read in time.
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_per_client: int = DEFAULT_MAX_PER_CLIENT
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    open: int = 0
    per_client: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    timed_out: int = 0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_client < 1 or self.read_timeout_s <= 0:
            raise ValueError(
                "connection guard: max_connections >= 1, max_per_client >= 1, read_timeout_s > 0"
            )


@functools.cache
def protocol_class() -> type[Any]:
    """The guarded protocol class (built on first use: importing this module does not load
    uvicorn or h11, so the CLI's other commands start fast)."""
    import h11
    import orjson
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol with a connection cap and a request read deadline (see the
        module docstring). Subclassed per port by :func:`guarded_protocol`."""

        guard: GuardState = GuardState()
        _read_timer: asyncio.TimerHandle | None = None
        _counted: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            g = self.guard
            host = self.client[0] if self.client else ""
            if g.open >= g.max_connections or g.per_client[host] >= g.max_per_client:
                g.refused += 1
                if g.refused == 1 or g.refused % 1000 == 0:
                    log.warning(
                        "connection from %s refused: %d open (cap %d), %d from it (cap %d); "
                        "%d refused so far",
                        host or "?",
                        g.open,
                        g.max_connections,
                        g.per_client[host],
                        g.max_per_client,
                        g.refused,
                    )
                transport.abort()
                return
            g.open += 1
            g.per_client[host] += 1
            self._counted = host
            self._arm_read_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_read_timer()
            host = self._counted
            if host is not None:
                self._counted = None
                g = self.guard
                g.open -= 1
                g.per_client[host] -= 1
                if g.per_client[host] <= 0:
                    del g.per_client[host]
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_read_timer()  # the next request has its own deadline

        def _arm_read_timer(self) -> None:
            self._cancel_read_timer()
            self._read_timer = self.loop.call_later(self.guard.read_timeout_s, self._read_expired)

        def _cancel_read_timer(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_expired(self) -> None:
            """The read deadline passed: abort if the request is still being read (or has not
            started); leave a request that is being answered alone."""
            self._read_timer = None
            if self.transport.is_closing():
                return
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):  # headers or body due
                self.guard.timed_out += 1
                if self.cycle is not None and not self.cycle.response_complete:
                    self.cycle.disconnected = True
                    self.cycle.message_event.set()
                self.transport.abort()

        def send_400_response(self, msg: str) -> None:
            """Malformed HTTP: a JSON 400 and close (uvicorn's answer is text/plain)."""
            body = orjson.dumps({"error": msg})
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            try:
                for event in (
                    h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                    h11.Data(data=body),
                    h11.EndOfMessage(),
                ):
                    self.transport.write(self.conn.send(event) or b"")
            except h11.LocalProtocolError:  # a response had started: nothing more to say
                self.transport.abort()
                return
            self.transport.close()

    return GuardedH11Protocol


def guarded_protocol(state: GuardState) -> type[Any]:
    """A subclass of the guarded protocol (:func:`protocol_class`) whose connections share
    ``state`` (one per listening port)."""
    return type("GuardedH11Protocol", (protocol_class(),), {"guard": state})


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit of open files to the hard limit; returns (soft, hard) after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


def uvicorn_guard_kwargs(state: GuardState) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments that install the guard for one port."""
    return {"http": guarded_protocol(state)}
