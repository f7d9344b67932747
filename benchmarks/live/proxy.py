"""A loopback TCP proxy that can drop or delay connections (the chaos runner puts it between
kube-scheduler and topoplace).

:class:`FaultProxy` listens on ``127.0.0.1:<listen>`` and forwards every connection to
``127.0.0.1:<target>``, on an asyncio loop in a thread of its own. Its mode changes at any
time from any thread:

* ``pass``: bytes flow both ways unchanged;
* ``drop``: connections open when the mode is set are cut (RST by ``SO_LINGER`` 0) and new
  ones are accepted and cut at once, so the client sees a reset, as with a dead peer;
* ``delay``: every chunk from the client waits ``delay`` seconds before it is forwarded
  (a slow network; longer than kube-scheduler's ``httpTimeout`` it times the call out);
* ``answer``: open connections are cut (a watch ends mid-stream) and every new request is
  answered by the proxy itself with HTTP ``status`` (429 and 503 with ``Retry-After: 1``,
  a ``Status`` body as kube-apiserver writes it) and ``Connection: close``, never
  forwarded: an overloaded or failing API server.

With ``server_ssl`` / ``upstream_ssl`` it terminates TLS on the client side and opens TLS
to the target (the chaos runner's contexts offer only ``http/1.1`` by ALPN, so Go clients
do not switch to HTTP/2, whose frames the ``answer`` mode could not answer): the runner
puts it in front of kube-apiserver for topoplace and kube-scheduler. Bytes are forwarded unchanged (bearer tokens pass through).

Counters (``accepted``, ``dropped``, ``delayed``, ``answered``) say what it did. Loopback
only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
import threading
from types import TracebackType
from typing import Self

MODES = ("pass", "drop", "delay", "answer")
REASONS = {429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}
MAX_HEAD = 65536
"""Bytes of a request head read at most before it is answered anyway."""


def answer_bytes(status: int) -> bytes:
    """The whole HTTP/1.1 response of the ``answer`` mode for ``status``."""
    reason = REASONS.get(status, "Error")
    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"chaos: {reason.lower()}",
            "reason": {429: "TooManyRequests", 503: "ServiceUnavailable"}.get(
                status, "InternalError"
            ),
            "code": status,
        }
    ).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if status in (429, 503):
        head.append("Retry-After: 1")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0) instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


class FaultProxy:
    """``127.0.0.1:listen`` -> ``127.0.0.1:target`` with a settable fault mode (see the
    module docstring); a context manager (:meth:`start` / :meth:`stop`)."""

    def __init__(
        self,
        listen: int,
        target: int,
        *,
        server_ssl: ssl.SSLContext | None = None,
        upstream_ssl: ssl.SSLContext | None = None,
    ) -> None:
        """``server_ssl``: TLS towards the clients (None: plain TCP); ``upstream_ssl``: TLS
        towards the target (None: plain TCP)."""
        self.listen = listen
        self.target = target
        self.server_ssl = server_ssl
        self.upstream_ssl = upstream_ssl
        self.mode = "pass"
        self.delay = 0.0
        self.status = 503
        self.accepted = 0
        self.dropped = 0
        self.delayed = 0
        self.answered = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ---- control (any thread) -----------------------------------------------------------

    def set_mode(self, mode: str, delay: float = 0.0, status: int = 503) -> None:
        """Switch to ``mode`` (one of :data:`MODES`); ``drop`` and ``answer`` also cut the
        open connections; ``status``: the answer of the ``answer`` mode.

        Raises:
            ValueError: an unknown mode.
        """
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode, self.delay, self.status = mode, max(0.0, delay), status
        if mode in ("drop", "answer") and self._loop is not None:
            self._loop.call_soon_threadsafe(self._cut_all)

    def start(self) -> FaultProxy:
        """Listen (raises OSError when the port is taken) and serve in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Stop listening, cut every connection and join the thread; idempotent."""
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self._shutdown)
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None

    # ---- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(
                    self._handle, "127.0.0.1", self.listen, reuse_address=True, ssl=self.server_ssl
                )
            )
        except OSError as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut_all()
        assert self._loop is not None
        self._loop.call_later(0.1, self._loop.stop)

    def _cut_all(self) -> None:
        for w in list(self._open):
            self.dropped += 1
            _reset(w)
        self._open.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "drop":
            self.dropped += 1
            _reset(writer)
            return
        if self.mode == "answer":
            await self._answer(reader, writer)
            return
        try:
            up_r, up_w = await asyncio.open_connection(
                "127.0.0.1", self.target, ssl=self.upstream_ssl
            )
        except OSError:
            _reset(writer)
            return
        self._open.update((writer, up_w))
        up = asyncio.ensure_future(self._pipe(reader, up_w, upstream=True))
        down = asyncio.ensure_future(self._pipe(up_r, writer, upstream=False))
        try:
            # The target's end ends the connection (a client waiting on a watch must see its
            # server gone, and TLS has no half-close to tell it); the client's end is passed
            # on as a half-close where the transport has one, else it ends the connection.
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
            if up.done() and not down.done() and up_w.can_write_eof():
                await down
        finally:
            for t in (up, down):
                t.cancel()
            for w in (writer, up_w):
                self._open.discard(w)
                with contextlib.suppress(Exception):
                    w.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read a request head (at most :data:`MAX_HEAD` bytes, 10 s), answer it with
        ``status`` and close."""
        self._open.add(writer)
        try:
            head = b""
            with contextlib.suppress(asyncio.TimeoutError, ConnectionError, OSError):
                async with asyncio.timeout(10):
                    while b"\r\n\r\n" not in head and len(head) < MAX_HEAD:
                        chunk = await reader.read(4096)
                        if not chunk:
                            break
                        head += chunk
            if head:
                self.answered += 1
                with contextlib.suppress(ConnectionError, OSError):
                    writer.write(answer_bytes(self.status))
                    await writer.drain()
        finally:
            self._open.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if upstream and self.mode == "delay" and self.delay > 0:
                    self.delayed += 1
                    await asyncio.sleep(self.delay)
                if self.mode == "drop":
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                if writer.can_write_eof():
                    writer.write_eof()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
