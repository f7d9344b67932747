"""The chaos runner's TCP proxy (benchmarks/live/proxy.py) in front of a real echo server on
loopback: bytes pass, connections are cut in ``drop``, chunks wait in ``delay``."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from benchmarks.live.proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    p = FaultProxy(_free_port(), server.server_address[1])
    with p:
        yield p
    server.shutdown()
    server.server_close()


def _roundtrip(port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got


def test_pass_forwards_both_ways(proxy: FaultProxy) -> None:
    assert _roundtrip(proxy.listen, b"filter") == b"filter"
    assert proxy.accepted == 1 and proxy.dropped == 0


def test_drop_cuts_new_and_open_connections(proxy: FaultProxy) -> None:
    held = socket.create_connection(("127.0.0.1", proxy.listen), timeout=5)
    held.sendall(b"x")
    assert held.recv(1) == b"x"
    proxy.set_mode("drop")
    with pytest.raises((ConnectionResetError, AssertionError)):
        # the open connection was reset: recv gives RST (or EOF on some kernels)
        assert held.recv(1) != b""
    held.close()
    with pytest.raises((ConnectionResetError, AssertionError)):
        assert _roundtrip(proxy.listen, b"bind") == b"bind"
    assert proxy.dropped >= 2
    proxy.set_mode("pass")
    assert _roundtrip(proxy.listen, b"again") == b"again"


def test_delay_holds_each_chunk(proxy: FaultProxy) -> None:
    proxy.set_mode("delay", 0.4)
    t0 = time.monotonic()
    assert _roundtrip(proxy.listen, b"slow") == b"slow"
    assert time.monotonic() - t0 >= 0.4
    assert proxy.delayed == 1


def test_unknown_mode_is_refused(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="not one of"):
        proxy.set_mode("lose")


def _request(port: int, timeout: float = 5.0) -> bytes:
    """One HTTP request over a fresh connection; everything read until the peer closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        return got


@pytest.mark.parametrize("status", [429, 500, 503])
def test_answer_cuts_open_connections_and_answers_new_requests(
    proxy: FaultProxy, status: int
) -> None:
    import json

    held = socket.create_connection(("127.0.0.1", proxy.listen), timeout=5)
    held.sendall(b"watch")
    assert held.recv(16) == b"watch"  # a watch in flight
    proxy.set_mode("answer", status=status)
    time.sleep(0.2)
    with pytest.raises((ConnectionResetError, OSError)):
        held.sendall(b"more")
        if not held.recv(16):
            raise ConnectionResetError("closed")
    held.close()
    got = _request(proxy.listen)
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} ")
    assert "Connection: close" in lines
    assert ("Retry-After: 1" in lines) == (status in (429, 503))
    doc = json.loads(body)
    assert doc["kind"] == "Status" and doc["code"] == status
    assert proxy.answered == 1
    proxy.set_mode("pass")
    assert _roundtrip(proxy.listen, b"again") == b"again"  # forwarded again, never answered
    assert proxy.answered == 1


class _Hangup(socketserver.BaseRequestHandler):
    """Answers one chunk, then closes its end (a kube-apiserver going away under a watch)."""

    def handle(self) -> None:
        if data := self.request.recv(4096):
            self.request.sendall(data)
        self.request.close()


def test_tls_target_gone_ends_the_client_connection(tmp_path) -> None:
    """TLS has no half-close: when the target closes, the client's connection must end too
    (a watch client otherwise waits on a dead stream for ever)."""
    srv_ctx, cli_ctx = _tls_contexts(tmp_path)

    class TlsHangup(socketserver.ThreadingTCPServer):
        daemon_threads = True

        def get_request(self):  # type: ignore[no-untyped-def]
            sock, addr = super().get_request()
            return srv_ctx.wrap_socket(sock, server_side=True), addr

    server = TlsHangup(("127.0.0.1", 0), _Hangup)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    p = FaultProxy(_free_port(), server.server_address[1], server_ssl=srv_ctx, upstream_ssl=cli_ctx)
    try:
        with (
            p,
            socket.create_connection(("127.0.0.1", p.listen), timeout=5) as raw,
            cli_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
        ):
            s.sendall(b"watch")
            assert s.recv(64) == b"watch"
            s.settimeout(3)
            with contextlib.suppress(ConnectionResetError, ssl.SSLError):  # an end, not a timeout
                assert s.recv(64) == b""
    finally:
        server.shutdown()
        server.server_close()


def _tls_contexts(tmp_path):  # type: ignore[no-untyped-def]
    """A self-signed pair for 127.0.0.1: (server context, client context trusting it)."""

    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=x",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    srv_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    srv_ctx.load_cert_chain(crt, key)
    cli_ctx = ssl.create_default_context(cafile=str(crt))
    return srv_ctx, cli_ctx


def test_tls_on_both_sides_forwards_bytes(tmp_path) -> None:
    """A TLS client -> proxy (TLS terminated) -> TLS echo server; only http/1.1 offered."""
    srv_ctx, cli_ctx = _tls_contexts(tmp_path)

    class TlsEcho(socketserver.ThreadingTCPServer):
        daemon_threads = True

        def get_request(self):  # type: ignore[no-untyped-def]
            sock, addr = super().get_request()
            return srv_ctx.wrap_socket(sock, server_side=True), addr

    server = TlsEcho(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    p = FaultProxy(_free_port(), server.server_address[1], server_ssl=srv_ctx, upstream_ssl=cli_ctx)
    try:
        with (
            p,
            socket.create_connection(("127.0.0.1", p.listen), timeout=5) as raw,
            cli_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
        ):
            s.sendall(b"over tls")
            assert s.recv(64) == b"over tls"
    finally:
        server.shutdown()
        server.server_close()
    assert p.accepted == 1
