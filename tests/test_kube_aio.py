"""``scheduler.kube.aio.AsyncPoster``: the Binding POST from the event loop, over real
loopback sockets.

The peer is a small asyncio HTTP/1.1 server in the test (no API server runs in CI); it
answers with the recorded API server bodies of tests/fixtures/kube and can answer
chunked, close connections, or stay silent. The binder's error mapping over both paths is
tested in tests/test_kube_adapter.py; the live suite (tests/kube) binds through the real
kube-apiserver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from scheduler.kube.aio import AsyncPoster, _parse_head
from scheduler.kube.client import ApiError, ApiUnavailable, Timeouts
from tests.kube.recorded import recorded

CREATED = orjson.dumps(recorded("binding_201_created.json"))
CONFLICT = orjson.dumps(recorded("binding_409_already_bound_other_node.json"))


class Peer:
    """An HTTP/1.1 server on 127.0.0.1 answering each request with ``answer(n)`` (n: the
    request's number): bytes of a whole response, or None to close without answering."""

    def __init__(self, answer: Callable[[int], bytes | None]) -> None:
        self.answer = answer
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                out = self.answer(len(self.requests))
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def response(status: int, body: bytes, *, chunked: bool = False, close: bool = False) -> bytes:
    head = [f"HTTP/1.1 {status} X", "Content-Type: application/json"]
    if close:
        head.append("Connection: close")
    if chunked:
        head.append("Transfer-Encoding: chunked")
        half = len(body) // 2
        payload = b"".join(
            f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:half], body[half:])
        )
        return ("\r\n".join(head) + "\r\n\r\n").encode() + payload + b"0\r\n\r\n"
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def poster(url: str, token: Callable[[bool], str] = lambda fresh: "Bearer t", read=2.0) -> Any:
    return AsyncPoster(
        url,
        None,
        lambda fresh: {"Authorization": token(fresh), "Content-Type": "application/json"},
        Timeouts(connect=1.0, read=read),
    )


def run(answer: Callable[[int], bytes | None], client: Callable[[AsyncPoster], Any], **kw: Any):
    async def main() -> tuple[Any, Peer, AsyncPoster]:
        peer = Peer(answer)
        url = await peer.start()
        p = poster(url, **kw)
        try:
            out = await client(p)
        finally:
            p.close()
            await peer.stop()
        return out, peer, p

    return asyncio.run(main())


def test_posts_on_one_kept_alive_connection() -> None:
    async def client(p: AsyncPoster) -> list[dict[str, Any]]:
        return [await p.post_json(f"/api/v1/x{i}", b'{"i":%d}' % i) for i in range(3)]

    out, peer, p = run(lambda n: response(201, CREATED), client)
    assert [o["kind"] for o in out] == ["Status"] * 3
    assert p.opened == 1 and peer.connections == 1
    head, body = peer.requests[2]
    assert head.startswith(b"POST /api/v1/x2 HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer t\r\n" in head and b"\r\nContent-Length: 7\r\n" in head
    assert body == b'{"i":2}'


def test_concurrent_posts_open_more_connections_and_reuse_them() -> None:
    async def client(p: AsyncPoster) -> int:
        for _ in range(2):
            await asyncio.gather(*(p.post_json("/a", b"{}") for _ in range(4)))
        return len(p._idle)

    idle, peer, p = run(lambda n: response(201, CREATED), client)
    assert p.opened == 4 and peer.connections == 4 and idle == 4
    assert len(peer.requests) == 8


def test_a_burst_as_large_as_the_cap_keeps_its_connections() -> None:
    """Every connection a burst of concurrent binds opened is kept: the next burst opens
    none (the idle pool is as large as the in-flight cap)."""

    async def client(p: AsyncPoster) -> int:
        for _ in range(3):
            await asyncio.gather(*(p.post_json("/a", b"{}") for _ in range(16)))
        return len(p._idle)

    idle, peer, p = run(lambda n: response(201, CREATED), client)
    assert p.opened == 16 and peer.connections == 16 and idle == 16
    assert len(peer.requests) == 48


def test_chunked_answer_and_error_status_map_to_api_errors() -> None:
    async def client(p: AsyncPoster) -> tuple[dict[str, Any], ApiError]:
        ok = await p.post_json("/a", b"{}")
        with pytest.raises(ApiError) as info:
            await p.post_json("/a", b"{}")
        return ok, info.value

    answers = {1: response(201, CREATED, chunked=True), 2: response(409, CONFLICT)}
    (ok, err), _, _ = run(lambda n: answers[n], client)
    assert ok == recorded("binding_201_created.json")
    assert err.status == 409 and err.conflict and "already assigned" in err.message


def test_a_connection_the_server_closed_is_replaced_once() -> None:
    """The server closes the kept-alive connection after its answer (Connection: close not
    announced): the next POST finds it dead before any answer and is sent on a new one."""

    def answer(n: int) -> bytes | None:
        return response(201, CREATED) if n != 2 else None

    async def client(p: AsyncPoster) -> int:
        await p.post_json("/a", b"{}")
        await p.post_json("/b", b"{}")  # request 2: the peer closes without answering
        return len(p._idle)

    _, peer, p = run(answer, client)
    assert [h.split(b" ")[1] for h, _ in peer.requests] == [b"/a", b"/b", b"/b"]
    assert p.opened == 2


def test_connection_close_is_honoured() -> None:
    async def client(p: AsyncPoster) -> None:
        await p.post_json("/a", b"{}")
        await p.post_json("/b", b"{}")

    _, peer, p = run(lambda n: response(201, CREATED, close=True), client)
    assert p.opened == 2 and peer.connections == 2


def test_401_refreshes_credentials_and_retries_once() -> None:
    seen: list[bool] = []

    def token(fresh: bool) -> str:
        seen.append(fresh)
        return "Bearer new" if fresh else "Bearer old"

    answers = {1: response(401, b'{"kind":"Status","code":401}'), 2: response(201, CREATED)}
    out, peer, _ = run(lambda n: answers[n], lambda p: p.post_json("/a", b"{}"), token=token)
    assert out["kind"] == "Status" and seen == [False, True]
    assert b"Bearer new" in peer.requests[1][0]


def test_silence_is_a_timeout_and_garbage_is_unavailable() -> None:
    async def silent(p: AsyncPoster) -> ApiUnavailable:
        with pytest.raises(ApiUnavailable) as info:
            await p.post_json("/a", b"{}")
        return info.value

    err, _, _ = run(lambda n: b"", silent, read=0.3)
    assert err.timeout
    err, _, _ = run(lambda n: b"SSH-2.0-OpenSSH\r\n\r\n", silent)
    assert not err.timeout and "not an HTTP/1.1 response" in err.message


def test_unreachable_server_is_unavailable() -> None:
    async def main() -> ApiUnavailable:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ApiUnavailable) as info:
            await poster(f"http://127.0.0.1:{port}").post_json("/a", b"{}")
        return info.value

    assert not asyncio.run(main()).timeout


@pytest.mark.parametrize(
    "head,want",
    [
        (b"HTTP/1.1 201 Created\r\nContent-Length: 12\r\n\r\n", (201, "Created", 12, False, False)),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\nConnection: close\r\n\r\n",
            (200, "OK", None, True, True),
        ),
        (b"HTTP/1.0 500 Oops\r\n\r\n", (500, "Oops", None, False, True)),
    ],
)
def test_parse_head(head: bytes, want: tuple[Any, ...]) -> None:
    assert _parse_head(head) == want


@pytest.mark.parametrize(
    "head", [b"HTTP/1.1 2x1 X\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"]
)
def test_parse_head_refuses_nonsense(head: bytes) -> None:
    with pytest.raises(ApiUnavailable):
        _parse_head(head)


def test_a_post_runs_on_the_callers_task_without_a_task_of_its_own() -> None:
    """The read deadline does not wrap the request in a Task of its own (``wait_for`` in
    Python 3.11 does: one more Task and loop turn per Binding)."""
    seen: list[set[str]] = []

    def answer(n: int) -> bytes:
        seen.append({t.get_coro().__qualname__ for t in asyncio.all_tasks()})
        return response(201, CREATED)

    async def client(p: AsyncPoster) -> dict[str, Any]:
        return await p.post_json("/a", b"{}")

    out, _, _ = run(answer, client)
    assert out["kind"] == "Status" and len(seen) == 1
    assert "run.<locals>.main" in seen[0]  # the caller's task, seen from the peer
    assert not {q for q in seen[0] if q.startswith("AsyncPoster.")}


def test_a_timed_out_post_drops_its_connection_and_the_next_one_opens_another() -> None:
    async def client(p: AsyncPoster) -> tuple[bool, dict[str, Any], int]:
        with pytest.raises(ApiUnavailable) as info:
            await p.post_json("/a", b"{}")
        idle_after_timeout = len(p._idle)
        out = await p.post_json("/b", b"{}")
        return info.value.timeout, out, idle_after_timeout

    (timeout, out, idle), peer, p = run(
        lambda n: b"" if n == 1 else response(201, CREATED), client, read=0.3
    )
    assert timeout and idle == 0
    assert out["kind"] == "Status"
    assert p.opened == 2 and peer.connections == 2 and len(p._idle) == 0  # closed by p.close()
