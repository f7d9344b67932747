"""Connection guard: the HTTP protocol uvicorn runs, with limits a hostile client cannot get
around.

uvicorn reads a request for as long as the client keeps the connection open: a client that
sends its headers one byte every few seconds (slowloris), or a body that never ends, holds
a connection and its file descriptor forever; httptools bounds neither the time nor the
size of a request head, and nothing bounds how many connections are open.
:func:`guarded_protocol` returns a subclass of the protocol uvicorn would pick itself
(:func:`protocol_class`: httptools, else h11; passed as ``uvicorn.Config(http=...)``) that
adds, per listening port:

* **connection cap**: at most ``max_connections`` open connections, and at most
  ``max_per_client`` from one client address; a connection over either cap is aborted as
  soon as it is accepted (its descriptor is released at once, the client sees a reset), so
  a flood of idle connections can never exhaust the process's descriptors;
* **request read deadline**: from the moment a connection opens (or its previous response
  was sent) the next request's headers *and* body must arrive within
  ``read_timeout_s``; a connection still reading when it expires is aborted. A request
  already read and being answered is never cut;
* **head size**: a request line and headers over :data:`MAX_HEAD_BYTES` get 400;
* **JSON 400**: malformed HTTP is answered ``{"error": ...}`` like every other refusal,
  not uvicorn's text.

Per request this costs two attribute stores and a clock read (measured with
``topoplace bench extender-latency``); deadlines are checked by one sweep per port every
:data:`SWEEP_S` seconds. uvicorn's own ``timeout_keep_alive`` (5 s) still closes idle
keep-alive connections first.

With TLS, asyncio calls ``connection_made`` after the handshake, so the cap counts
established connections; connections in their handshake are bounded by asyncio's
handshake timeout (60 s). The shipped deployment listens with TLS on 127.0.0.1 only and
serves probes on a separate plain-HTTP port (``serve --health-port``), which has its own,
smaller cap.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scheduler.server.responses import json_response

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
        accepted: connections admitted since start (kube-scheduler's extender client keeps
            only 2 idle connections, so this grows with its concurrency).
    """

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_per_client: int = DEFAULT_MAX_PER_CLIENT
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    open: int = 0
    per_client: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    timed_out: int = 0
    accepted: int = 0
    live: set[Any] = field(default_factory=set)
    _sweeper: Any = None

    def start_sweeping(self, loop: Any) -> None:
        """Check the read deadlines of the live connections every :data:`SWEEP_S` seconds
        (started by the first connection, on the server's loop)."""
        if self._sweeper is not None:
            return

        def sweep() -> None:
            now = loop.time()
            for proto in list(self.live):
                proto.read_expired(now)
            self._sweeper = loop.call_later(SWEEP_S, sweep)

        self._sweeper = loop.call_later(SWEEP_S, sweep)

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_client < 1 or self.read_timeout_s <= 0:
            raise ValueError(
                "connection guard: max_connections >= 1, max_per_client >= 1, read_timeout_s > 0"
            )


UVICORN_LEAN: dict[str, Any] = {
    "proxy_headers": False,
    "server_header": False,
    "date_header": False,
    "access_log": False,
}
"""uvicorn settings of both listeners. ``proxy_headers`` off: nothing proxies to the
extender, and trusting ``X-Forwarded-For`` from loopback would let any local client name
another caller in the bind audit line. No ``server``/``date`` headers (nobody reads them)
and no access log (the verbs log what matters, bind its audit line): work per request
that kube-scheduler's requests do not need."""


MAX_HEAD_BYTES = 64 * 1024
"""Request line and headers larger than this are refused with 400 (httptools has no limit
of its own; h11's is 16 KiB of a buffered, incomplete head)."""
SWEEP_S = 0.25
"""How often the read deadlines of a port's connections are checked."""


@functools.cache
def protocol_class() -> type[Any]:
    """The guarded protocol class over the HTTP implementation uvicorn would pick itself
    (httptools when installed, else h11), built on first use: importing this module does
    not load uvicorn, so the CLI's other commands start fast.

    Per request it costs two attribute stores and a clock read; deadlines are checked by
    one sweep per port every :data:`SWEEP_S` seconds, not by a timer per request.
    """
    import orjson

    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base

        h11 = None
    except ImportError:  # pragma: no cover - uvicorn without its [standard] extras
        import h11  # type: ignore[no-redef]
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    from uvicorn.logging import TRACE_LOG_LEVEL
    from uvicorn.protocols.http.flow_control import FlowControl

    class GuardedProtocol(Base):  # type: ignore[misc, valid-type]
        """uvicorn's protocol with connection caps and a request read deadline (see the
        module docstring). Subclassed per port by :func:`guarded_protocol`."""

        guard: GuardState = GuardState()
        httptools = h11 is None
        """Whether the protocol is uvicorn's httptools one (the fast lane needs it)."""
        _counted: str | None = None
        _read_since: float | None = None
        """Loop time the request being read started to be awaited (None: none is)."""
        _head: int = 0
        """Bytes of the current request's head received so far (-1: head complete)."""

        def _connected(self, transport: Any) -> None:
            """uvicorn's ``connection_made`` (the same for httptools and h11), with the
            addresses from the transport's extra info (``sockname``, ``peername``, kept
            by the transport) instead of a ``getsockname``/``getpeername`` call on its
            socket: under uvloop each of those builds a socket object (measured: about
            10 us per connection against 2.5; kube-scheduler opens a new connection for
            about 1 in 4-5 requests). Same values: a transport without a socket, or
            uvicorn's trace logging, takes uvicorn's own code."""
            if self.logger.level <= TRACE_LOG_LEVEL or transport.get_extra_info("socket") is None:
                super().connection_made(transport)
                return
            self.connections.add(self)
            self.transport = transport
            self.flow = FlowControl(transport)
            self.server = _local_addr(transport.get_extra_info("sockname"))
            self.client = _remote_addr(transport.get_extra_info("peername"))
            self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"

        def connection_made(self, transport: Any) -> None:
            self._connected(transport)
            g = self.guard
            host = self.client[0] if self.client else ""
            if g.open >= g.max_connections or g.per_client[host] >= g.max_per_client:
                g.refused += 1
                if g.refused == 1 or g.refused % 1000 == 0:
                    log.warning(
                        "connection from %s refused: %d open (cap %d), %d from it (cap "
                        "%d); %d refused so far",
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
            g.accepted += 1
            g.per_client[host] += 1
            g.live.add(self)
            self._counted = host
            self._read_since = self.loop.time()
            self._head = 0
            g.start_sweeping(self.loop)

        def connection_lost(self, exc: Exception | None) -> None:
            host = self._counted
            if host is not None:
                self._counted = None
                g = self.guard
                g.open -= 1
                g.live.discard(self)
                g.per_client[host] -= 1
                if g.per_client[host] <= 0:
                    del g.per_client[host]
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._head < 0:  # reading a body (or answering): nothing to count
                super().data_received(data)
                return
            if self._read_since is None:
                self._read_since = self.loop.time()
            room = MAX_HEAD_BYTES - self._head
            if len(data) > room and data.find(b"\r\n\r\n", 0, room + 4) < 0:
                self._head = -1  # the head would not end within the limit
                self.send_400_response("request line and headers too large")
                return
            super().data_received(data)
            if h11 is not None:  # h11: the state machine says where the request is
                state = self.conn.their_state
                if state is h11.SEND_BODY:
                    self._head = -1
                elif state is h11.DONE:
                    self._head = -1
                    self._read_since = None
            if self._head >= 0:  # the head is still incomplete after these bytes
                self._head += len(data)
                if self._head > MAX_HEAD_BYTES and not self.transport.is_closing():
                    self._head = -1
                    self.send_400_response("request line and headers too large")

        def on_headers_complete(self) -> None:  # httptools
            self._head = -1
            super().on_headers_complete()

        def on_message_complete(self) -> None:  # httptools
            self._read_since = None
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._read_since = self.loop.time()  # the next request has its own deadline
            self._head = 0

        def read_expired(self, now: float) -> bool:
            """Abort the connection if its request has been read for longer than the
            deadline; True if it was aborted."""
            since = self._read_since
            if since is None or now - since < self.guard.read_timeout_s:
                return False
            if self.transport.is_closing():
                return False
            self.guard.timed_out += 1
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.abort()
            return True

        def send_400_response(self, msg: str) -> None:
            """Malformed HTTP: a JSON 400 and close (uvicorn's answer is text/plain)."""
            self.transport.write(json_response(400, orjson.dumps({"error": msg}), False))
            self.transport.close()

    return GuardedProtocol


def _local_addr(info: Any) -> tuple[str, int | None] | None:
    """uvicorn's ``get_local_addr`` of a socket whose ``getsockname()`` is ``info``."""
    if isinstance(info, tuple):
        return (str(info[0]), int(info[1]))
    if isinstance(info, str):
        return (info, None)
    return None


def _remote_addr(info: Any) -> tuple[str, int] | None:
    """uvicorn's ``get_remote_addr`` of a socket whose ``getpeername()`` is ``info``
    (None when it failed)."""
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) else None


def guarded_protocol(state: GuardState, verbs: Any = None) -> type[Any]:
    """A subclass of the guarded protocol (:func:`protocol_class`) whose connections share
    ``state`` (one per listening port); with ``verbs`` (the app's ``VerbRoutes``) and
    httptools, the verbs take the fast lane (``fastlane.py``)."""
    if verbs is not None and protocol_class().httptools:
        paths = {p.encode(): r for p, r in verbs.verbs.items()}
        attrs = {"guard": state, "verbs": verbs, "_paths": paths}
        return type("GuardedFastProtocol", (_fast_class(),), attrs)
    return type("GuardedProtocol", (protocol_class(),), {"guard": state})


@functools.cache
def _fast_class() -> type[Any]:
    from scheduler.server.fastlane import fast_lane

    return fast_lane(protocol_class())


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


def uvicorn_guard_kwargs(state: GuardState, verbs: Any = None) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments that install the guard for one port (and the
    verbs' fast lane, given the app's ``VerbRoutes``)."""
    return {"http": guarded_protocol(state, verbs)}


class GuardCollector:
    """Prometheus collector of a port's connection counters (read when scraped):
    ``topoplace_http_connections_total{port, outcome}`` (``accepted``, ``refused`` over a
    cap, ``timed_out`` reading a request) and ``topoplace_http_connections_open{port}``."""

    def __init__(self, states: dict[str, GuardState]) -> None:
        self.states = states

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        total = CounterMetricFamily(
            "topoplace_http_connections",
            "Connections to a listening port by outcome: accepted, refused (over a cap), "
            "timed_out (a request not read within the deadline)",
            labels=["port", "outcome"],
        )
        open_now = GaugeMetricFamily(
            "topoplace_http_connections_open", "Connections open now", labels=["port"]
        )
        for port, s in self.states.items():
            total.add_metric([port, "accepted"], s.accepted)
            total.add_metric([port, "refused"], s.refused)
            total.add_metric([port, "timed_out"], s.timed_out)
            open_now.add_metric([port], s.open)
        yield total
        yield open_now
