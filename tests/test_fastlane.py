"""The verbs' fast lane (``scheduler/server/fastlane.py``) over real uvicorn and real sockets.

Each test runs uvicorn with the protocol ``serve`` runs (connection guard + fast lane) and,
where it compares, a second server whose verbs take uvicorn's ASGI path. The transport is
wrapped (:class:`WriteCounter`, a spy over the real transport, not a stand-in) to count
the writes a response takes.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from typing import Any

import orjson
import pytest

from benchmarks.clusters import make_pod, synthetic_cluster
from scheduler.cli.demo import ServerThread
from scheduler.cli.main import load_params
from scheduler.runtime.cache import ClusterCache
from scheduler.runtime.gangs import GangRuntime
from scheduler.server.app import create_app
from scheduler.server.extender import Extender
from scheduler.server.guard import GuardState, guarded_protocol
from scheduler.server.metrics import Metrics


class WriteCounter:
    """The real transport, with every ``write`` counted per connection (a spy)."""

    def __init__(self, transport: Any, writes: list[int]) -> None:
        self._t = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(len(data))
        self._t.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


def counting(protocol: type[Any], writes: list[int]) -> type[Any]:
    """``protocol`` whose transport is wrapped in a :class:`WriteCounter` into ``writes``."""

    class Counting(protocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(WriteCounter(transport, writes))

    return Counting


def cluster_extender(nodes: int = 24, binder: Any = None) -> Extender:
    objs = synthetic_cluster(nodes)["items"]
    node_objs = [o for o in objs if o["kind"] == "Node"]
    cache = ClusterCache.from_objects(node_objs, [], load_params(None))
    return Extender(cache, binder, Metrics(), gangs=GangRuntime(), profiles=("topoplace",))


def serve(ext: Extender, fast: bool, writes: list[int], state: GuardState | None = None) -> Any:
    app = create_app(ext)
    proto = guarded_protocol(state or GuardState(), app.verbs if fast else None)
    return ServerThread(app, http=counting(proto, writes))


def sequence(ext: Extender, pods: int, seed: int) -> list[tuple[str, bytes, dict[str, Any]]]:
    """Filter/prioritize/bind request bodies for ``pods`` pods (1 or 8 GPUs), as
    kube-scheduler sends them: every node in a shuffled order, then the chosen one."""
    names = [n.name for n in ext.cache.snapshot().nodes]
    rng = random.Random(seed)
    out = []
    for i in range(pods):
        gpus = 8 if i % 7 == 0 else 1
        pod = make_pod(f"p{i:04d}", gpus, namespace="fast", cpu="1", memory="1Gi")
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["metadata"]["resourceVersion"] = str(100 + i)
        order = names[:]
        rng.shuffle(order)
        out.append(("filter", orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": order}), pod))
    return out


def raw_exchange(port: int, data: bytes, responses: int, timeout: float = 5.0) -> list[bytes]:
    """Send ``data`` on one connection and read ``responses`` HTTP responses (each with a
    content-length), as raw bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return read_responses(s, responses)


def read_responses(s: socket.socket, n: int) -> list[bytes]:
    buf = b""
    out = []
    while len(out) < n:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].lower()
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(buf) >= end + 4 + length:
                out.append(buf[: end + 4 + length])
                buf = buf[end + 4 + length :]
                continue
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} responses: {buf[:200]!r}")
        buf += chunk
    return out


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)
    )


def split(resp: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    head, body = resp.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, value = line.split(b": ", 1)
        headers[name.lower()] = value
    return status, headers, body


def test_fast_lane_replies_match_the_asgi_path_byte_for_byte_in_one_write_each() -> None:
    # Two identical extenders, one served through the fast lane and one through uvicorn's
    # ASGI path, are driven through the same 30 pods (filter, prioritize, bind each).
    fast_w: list[int] = []
    slow_w: list[int] = []
    fast_ext, slow_ext = cluster_extender(), cluster_extender()
    bodies = sequence(fast_ext, 30, seed=7)
    placed = []
    with serve(fast_ext, True, fast_w) as f, serve(slow_ext, False, slow_w) as s:
        fs = socket.create_connection(("127.0.0.1", f.port), timeout=5)
        ss = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        with fs, ss:
            for _, body, pod in bodies:
                answers = []
                for sock, writes in ((fs, fast_w), (ss, slow_w)):
                    before = len(writes)
                    sock.sendall(post("/scheduler/filter", body))
                    (r,) = read_responses(sock, 1)
                    answers.append((r, len(writes) - before))
                (fr, fn), (sr, sn) = answers
                assert split(fr)[0] == 200
                assert split(fr)[1:] == split(sr)[1:]  # same headers, same body bytes
                assert (fn, sn) == (1, 2)  # the fast lane writes head and body at once
                (node,) = orjson.loads(split(fr)[2])["NodeNames"]
                name = pod["metadata"]["name"]
                prio = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": [node]})
                uid = pod["metadata"]["uid"]
                bind = orjson.dumps(
                    {"PodName": name, "PodNamespace": "fast", "PodUID": uid, "Node": node}
                )
                for path, b in (("/scheduler/prioritize", prio), ("/scheduler/bind", bind)):
                    fs.sendall(post(path, b))
                    ss.sendall(post(path, b))
                    (fr,) = read_responses(fs, 1)
                    (sr,) = read_responses(ss, 1)
                    assert split(fr)[1:] == split(sr)[1:], path
                placed.append((name, node, orjson.loads(split(fr)[2])))
    # The sequence did real work: pods were bound, and 8-GPU pods got whole nodes.
    assert all(reply.get("Error") in ("", None) for _, _, reply in placed)
    assert len({node for _, node, _ in placed}) >= 4
    # Every fast-lane response was one write; the ASGI path took two per response.
    assert fast_w and len(fast_w) == 90
    assert len(slow_w) == 180


@pytest.fixture
def fast_server():
    writes: list[int] = []
    ext = cluster_extender()
    with serve(ext, True, writes, GuardState(read_timeout_s=0.5)) as srv:
        yield srv, ext, writes


def _filter_body(ext: Extender, name: str = "q0", gpus: int = 1) -> tuple[bytes, dict[str, Any]]:
    names = [n.name for n in ext.cache.snapshot().nodes]
    pod = make_pod(name, gpus, namespace="fast", cpu="1", memory="1Gi")
    pod["metadata"]["uid"] = f"uid-{name}"
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}), pod


def test_pipelined_requests_are_answered_in_order_behind_a_pending_bind(fast_server) -> None:
    srv, ext, writes = fast_server
    fbody, pod = _filter_body(ext)
    (r,) = raw_exchange(srv.port, post("/scheduler/filter", fbody), 1)
    (node,) = orjson.loads(split(r)[2])["NodeNames"]
    bind = orjson.dumps({"PodName": "q0", "PodNamespace": "fast", "PodUID": "uid-q0", "Node": node})
    other, _ = _filter_body(ext, "q1", 8)
    # bind (answered by a task: its result is awaited) then filter and a GET, in one write:
    # the filter must wait for the bind's answer, and the GET for the filter's.
    data = post("/scheduler/bind", bind) + post("/scheduler/filter", other)
    data += b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    rs = raw_exchange(srv.port, data, 3)
    assert [split(x)[0] for x in rs] == [200, 200, 200]
    assert orjson.loads(split(rs[0])[2]) == {"Error": ""}
    second = orjson.loads(split(rs[1])[2])
    assert len(second["NodeNames"]) == 1 and second["NodeNames"] != [node]  # 8 GPUs elsewhere
    assert orjson.loads(split(rs[2])[2]) == {"status": "ok"}
    assert ext.cache.snapshot().pods["fast/q0"].node == node


def test_connection_close_is_honoured_and_announced(fast_server) -> None:
    srv, ext, _ = fast_server
    body, _ = _filter_body(ext)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(post("/scheduler/filter", body, b"Connection: close\r\n"))
        (r,) = read_responses(s, 1)
        assert split(r)[1][b"connection"] == b"close"
        assert s.recv(100) == b""  # the server closed its side


def test_chunked_body_is_read_whole(fast_server) -> None:
    srv, ext, writes = fast_server
    body, _ = _filter_body(ext)
    half = len(body) // 2
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:half], body[half:]))
    head = b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    before = len(writes)
    (r,) = raw_exchange(srv.port, head + chunked + b"0\r\n\r\n", 1)
    status, _, reply = split(r)
    assert status == 200 and len(orjson.loads(reply)["NodeNames"]) == 1
    assert len(writes) - before == 1


def test_a_body_over_the_limit_gets_413_and_the_connection_closes() -> None:
    writes: list[int] = []
    ext = cluster_extender()
    app = create_app(ext, max_body_bytes=500)
    proto = counting(guarded_protocol(GuardState(), app.verbs), writes)
    body, _ = _filter_body(ext)
    assert len(body) > 500
    with ServerThread(app, http=proto) as srv:
        # Without a declared length (chunked): refused by the fast lane as it grows.
        head = b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(head + b"%x\r\n%s\r\n" % (len(body), body))
            (r,) = read_responses(s, 1)
            assert s.recv(100) == b""
        status, headers, reply = split(r)
        assert status == 413 and headers[b"connection"] == b"close"
        assert orjson.loads(reply) == {"error": "request body larger than 500 bytes"}
        # With a declared length: uvicorn's path refuses it the same way.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(post("/scheduler/filter", body))
            (r2,) = read_responses(s, 1)
        assert split(r2)[0] == 413 and split(r2)[2] == reply
        text = srv_metrics(srv.port)
        assert 'topoplace_requests_total{code="413",verb="filter"} 2.0' in text


def srv_metrics(port: int) -> str:
    (r,) = raw_exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 1)
    return split(r)[2].decode()


def test_malformed_and_wrong_method_requests_get_their_json_errors(fast_server) -> None:
    srv, ext, _ = fast_server
    rs = raw_exchange(
        srv.port,
        post("/scheduler/filter", b"{not json")
        + post("/scheduler/bind", b"[1, 2")
        + b"GET /scheduler/filter HTTP/1.1\r\nHost: x\r\n\r\n",
        3,
    )
    (s1, _, b1), (s2, _, b2), (s3, h3, b3) = map(split, rs)
    assert s1 == 400 and orjson.loads(b1)["error"].startswith("malformed JSON")
    assert s2 == 400 and orjson.loads(b2)["error"].startswith("malformed JSON")
    assert s3 == 405 and h3[b"allow"] == b"POST" and orjson.loads(b3) == {"error": "use POST"}
    # The fast lane counts its requests in the same metrics as the ASGI path.
    body, _ = _filter_body(ext)
    raw_exchange(srv.port, post("/scheduler/filter", body), 1)
    text = srv_metrics(srv.port)
    assert 'topoplace_requests_total{code="400",verb="filter"} 1.0' in text
    assert 'topoplace_requests_total{code="200",verb="filter"} 1.0' in text
    assert 'topoplace_requests_total{code="400",verb="bind"} 1.0' in text


def test_expect_continue_and_query_strings_take_uvicorns_path_with_the_same_answer(
    fast_server,
) -> None:
    srv, ext, writes = fast_server
    body, _ = _filter_body(ext)
    (plain,) = raw_exchange(srv.port, post("/scheduler/filter", body), 1)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        head = post("/scheduler/filter", b"", b"Expect: 100-continue\r\n")
        head = head.replace(b"Content-Length: 0", b"Content-Length: %d" % len(body))
        s.sendall(head)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
        before = len(writes)
        s.sendall(body)
        (r,) = read_responses(s, 1)
        assert len(writes) - before == 2  # uvicorn's path: head and body apart
    (q,) = raw_exchange(srv.port, post("/scheduler/filter?x=1", body), 1)
    assert split(r)[2] == split(q)[2] == split(plain)[2]


def test_a_verb_request_that_stalls_is_cut_at_the_read_deadline(fast_server) -> None:
    srv, ext, _ = fast_server  # read_timeout_s=0.5
    body, _ = _filter_body(ext)
    req = post("/scheduler/filter", body)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(req[: len(req) - 10])  # the head and most of the body, then nothing
        t0 = time.monotonic()
        got = b""
        try:
            while chunk := s.recv(100):
                got += chunk
        except ConnectionResetError:
            pass  # aborted: a reset or an end of stream, never an answer
        assert got == b""
        assert 0.4 < time.monotonic() - t0 < 3.0
    # A request answered in time re-arms the deadline for the next one on the connection.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(req)
        read_responses(s, 1)
        time.sleep(0.3)
        s.sendall(req)
        read_responses(s, 1)


class SlowBinderNoApi:
    """Stands in for the API write (no API server here): the Binding takes ``delay`` s."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.bound: list[tuple[str, str]] = []

    async def bind_async(self, pod: Any, node: str, annotations: Any) -> str:
        await asyncio.sleep(self.delay)
        self.bound.append((pod["metadata"]["name"], node))
        return ""

    def bind(self, pod: Any, node: str, annotations: Any) -> str:
        self.bound.append((pod["metadata"]["name"], node))
        return ""


def test_a_client_gone_during_a_bind_loses_nothing_and_the_server_serves_on() -> None:
    binder = SlowBinderNoApi(0.3)
    ext = cluster_extender(binder=binder)
    writes: list[int] = []
    with serve(ext, True, writes) as srv:
        body, _ = _filter_body(ext)
        (r,) = raw_exchange(srv.port, post("/scheduler/filter", body), 1)
        (node,) = orjson.loads(split(r)[2])["NodeNames"]
        bind = orjson.dumps(
            {"PodName": "q0", "PodNamespace": "fast", "PodUID": "uid-q0", "Node": node}
        )
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(post("/scheduler/bind", bind))
            time.sleep(0.05)
        # The bind finishes with nobody to answer; the pod is bound once, and the server
        # answers the next request.
        time.sleep(0.5)
        assert binder.bound == [("q0", node)]
        assert ext.cache.snapshot().pods["fast/q0"].node == node
        other, _ = _filter_body(ext, "q1")
        (r2,) = raw_exchange(srv.port, post("/scheduler/filter", other), 1)
        assert split(r2)[0] == 200
        assert 'topoplace_requests_total{code="499",verb="bind"} 1.0' in srv_metrics(srv.port)


def test_shutdown_waits_for_a_pending_bind_and_answers_it() -> None:
    binder = SlowBinderNoApi(0.5)
    ext = cluster_extender(binder=binder)
    writes: list[int] = []
    srv = serve(ext, True, writes)
    with srv:
        body, _ = _filter_body(ext)
        (r,) = raw_exchange(srv.port, post("/scheduler/filter", body), 1)
        (node,) = orjson.loads(split(r)[2])["NodeNames"]
        bind = orjson.dumps(
            {"PodName": "q0", "PodNamespace": "fast", "PodUID": "uid-q0", "Node": node}
        )
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        s.sendall(post("/scheduler/bind", bind))
        time.sleep(0.1)
        srv.server.should_exit = True  # SIGTERM's effect
        (answer,) = read_responses(s, 1)
        s.close()
    status, headers, reply = split(answer)
    assert status == 200 and orjson.loads(reply) == {"Error": ""}
    assert headers[b"connection"] == b"close"  # the server is going away
    assert binder.bound == [("q0", node)]


def test_large_requests_one_after_another_on_one_connection(fast_server) -> None:
    # Regression: a request whose body ends in a read that is answered at once (filter)
    # must not have that read counted as the next request's head (64 KiB head limit); a
    # 5,000-node NodeNames body is ~150 KB and arrives in several reads.
    srv, ext, writes = fast_server
    body, _ = _filter_body(ext)
    d = orjson.loads(body)
    d["NodeNames"] = d["NodeNames"] + [f"ghost-{i:06d}" for i in range(10_000)]
    big = orjson.dumps(d)
    assert len(big) > 2 * 64 * 1024
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        for _ in range(6):
            s.sendall(post("/scheduler/filter", big))
            (r,) = read_responses(s, 1)
            status, _, reply = split(r)
            assert status == 200 and len(orjson.loads(reply)["NodeNames"]) == 1
