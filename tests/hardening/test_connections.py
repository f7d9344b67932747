"""Issue 12, finding 4: slow and excess connections are cut, and health keeps answering.

Against a real ``topoplace serve`` process (uvicorn with the connection guard, the demo
cluster, a separate ``--health-port``). On today's main the flags do not exist and, without
them, a slow-header connection stayed open indefinitely and ~21,000 idle connections
exhausted the process's descriptors.

The only durations here are the server's configured deadlines and generous waits for a
behaviour (cut or not), never a speed assertion.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import orjson
import pytest

from tests.hardening.server import closed_by_peer, read_response, request, serve

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").exists(), reason="needs /proc (Linux) to count descriptors"
)


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def test_slow_headers_and_slow_bodies_are_cut(tmp_path: Path) -> None:
    with serve(tmp_path, "--read-timeout", "0.5") as srv:
        slow_head = _connect(srv.port)
        slow_head.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\n")
        slow_body = _connect(srv.port)
        slow_body.sendall(
            b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        )
        idle = _connect(srv.port)  # opens and never sends a byte
        t0 = time.monotonic()
        for i in range(60):  # a byte every 50 ms: slowloris keeps the connection busy
            with contextlib.suppress(OSError):
                slow_head.sendall(b"X-A: b\r\n"[i % 8 : i % 8 + 1])
                slow_body.sendall(b" ")
            time.sleep(0.05)
            if time.monotonic() - t0 > 3:
                break
        assert closed_by_peer(slow_head, 10), "slow headers were not cut"
        assert closed_by_peer(slow_body, 10), "a slow body was not cut"
        assert closed_by_peer(idle, 10), "an idle connection was not cut"
        status, _, body = request("127.0.0.1", srv.port, b"GET", b"/healthz")
        assert status == 200 and orjson.loads(body) == {"status": "ok"}
        for s in (slow_head, slow_body, idle):
            s.close()


def test_a_request_being_answered_is_not_cut_and_keep_alive_gets_a_new_deadline(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, "--read-timeout", "0.5") as srv:
        s = _connect(srv.port)
        for _ in range(3):  # three requests on one connection, spread over > 0.5 s
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = read_response(s)
            assert status == 200 and orjson.loads(body) == {"status": "ready"}
            time.sleep(0.3)
        s.close()


def test_excess_connections_are_reset_and_health_still_answers(tmp_path: Path) -> None:
    cap = 20
    with serve(
        tmp_path,
        "--max-connections",
        str(cap),
        "--max-connections-per-client",
        "1000",
        "--read-timeout",
        "60",
    ) as srv:
        base = srv.open_fds()
        held = [_connect(srv.port) for _ in range(cap)]
        flood = []
        for _ in range(400):
            with contextlib.suppress(OSError):
                flood.append(_connect(srv.port))
        # Every connection over the cap is reset by the server at once.
        refused = sum(closed_by_peer(s, 5) for s in flood)
        assert refused == len(flood) == 400
        assert srv.open_fds() <= base + cap + 8, "the server kept descriptors of refused sockets"
        # The probe port has its own budget.
        status, _, body = request("127.0.0.1", srv.health_port, b"GET", b"/healthz")
        assert status == 200 and orjson.loads(body) == {"status": "ok"}

        # ... and the counts are exported.
        def scrape() -> dict[str, str]:
            status, _, body = request("127.0.0.1", srv.health_port, b"GET", b"/metrics")
            assert status == 200
            lines = body.decode().splitlines()
            return dict(line.rsplit(" ", 1) for line in lines if "_connections" in line)

        samples = scrape()
        main = 'topoplace_http_connections_total{outcome="%s",port="main"}'
        assert float(samples[main % "refused"]) == 400
        assert float(samples[main % "accepted"]) == cap
        assert float(samples[main % "timed_out"]) == 0
        assert float(samples['topoplace_http_connections_open{port="main"}']) == cap
        health = 'topoplace_http_connections_total{outcome="accepted",port="health"}'
        assert float(scrape()[health]) == float(samples[health]) + 1  # one per request
        for s in held + flood:
            s.close()
        # Capacity comes back as connections close.
        for _ in range(100):
            try:
                status, _, _ = request("127.0.0.1", srv.port, b"GET", b"/healthz", timeout=2)
                if status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        assert status == 200


def test_one_client_cannot_take_every_connection(tmp_path: Path) -> None:
    with serve(tmp_path, "--max-connections-per-client", "5", "--read-timeout", "60") as srv:
        mine = [_connect(srv.port) for _ in range(5)]
        sixth = _connect(srv.port)
        assert closed_by_peer(sixth, 5)
        for s in mine:
            assert not closed_by_peer(s, 0.05)
        # Another client address (127.0.0.2 reaches 127.0.0.1 on Linux loopback).
        other = _connect(srv.port, "127.0.0.2")
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _ = read_response(other)
        assert status == 200
        # The health port: a flood from one address leaves the prober room.
        flood = [_connect(srv.health_port, "127.0.0.2") for _ in range(40)]
        status, _, _ = request("127.0.0.1", srv.health_port, b"GET", b"/healthz")
        assert status == 200
        for s in [*mine, sixth, other, *flood]:
            s.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Name: v\r\n\r\n",
        b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n",
    ],
    ids=["garbage", "bad-header-name", "bad-content-length", "head-over-64KiB"],
)
def test_malformed_http_gets_a_json_400(tmp_path: Path, raw: bytes, served: dict) -> None:
    srv = served["srv"]
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(raw)
        status, headers, body = read_response(s)
    assert status == 400
    assert headers[b"content-type"] == b"application/json"
    assert "error" in orjson.loads(body)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict:
    with serve(tmp_path_factory.mktemp("serve")) as srv:
        yield {"srv": srv}
