"""The chaos runner's TCP proxy (benchmarks/live/proxy.py) in front of a real echo server on
loopback: bytes pass, connections are cut in ``drop``, chunks wait in ``delay``."""

from __future__ import annotations

import socket
import socketserver
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
