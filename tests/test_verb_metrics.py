"""The verbs' request metrics (``VerbRoutes.count``) as scraped from ``/metrics``, over
real sockets through the fast lane and through uvicorn's ASGI path: one
``topoplace_requests_total`` series per verb and status code that was answered, one
``topoplace_request_seconds`` histogram per verb, with exact counts."""

from __future__ import annotations

import re
import socket

import orjson
import pytest

from benchmarks.clusters import make_pod
from tests.test_fastlane import cluster_extender, post, read_responses, serve, split


def _get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("fast", [True, False])
def test_requests_and_latency_series_count_each_answer_once(fast: bool) -> None:
    ext = cluster_extender()
    names = [n.name for n in ext.cache.snapshot().nodes]
    with serve(ext, fast, []) as srv, socket.create_connection(("127.0.0.1", srv.port)) as s:

        def send(path: str, body: bytes) -> tuple[int, bytes]:
            s.sendall(post(path, body))
            status, _, reply = split(read_responses(s, 1)[0])
            return status, reply

        for i in range(3):
            pod = make_pod(f"m{i}", 1, namespace="met", cpu="1", memory="1Gi")
            pod["metadata"]["uid"] = f"uid-m{i}"
            status, reply = send(
                "/scheduler/filter", orjson.dumps({"Pod": pod, "NodeNames": names})
            )
            assert status == 200
            if i == 0:
                (node,) = orjson.loads(reply)["NodeNames"]
                bind = {"PodName": "m0", "PodNamespace": "met", "PodUID": "uid-m0", "Node": node}
                assert send("/scheduler/bind", orjson.dumps(bind)) == (200, b'{"Error":""}')
        assert send("/scheduler/filter", b"{not json")[0] == 400
        assert send("/scheduler/bind", b"[1,")[0] == 400
        assert send("/scheduler/prioritize", b"{}")[0] == 400
        text = _get(srv.port, "/metrics").decode()
    requests = sorted(re.findall(r"^topoplace_requests_total\{(.*)\} (.*)$", text, re.M))
    assert requests == [
        ('code="200",verb="bind"', "1.0"),
        ('code="200",verb="filter"', "3.0"),
        ('code="400",verb="bind"', "1.0"),
        ('code="400",verb="filter"', "1.0"),
        ('code="400",verb="prioritize"', "1.0"),
    ]
    counts = dict(re.findall(r'^topoplace_request_seconds_count\{verb="(\w+)"\} (.*)$', text, re.M))
    assert counts == {"filter": "4.0", "bind": "2.0", "prioritize": "1.0"}
    inf = dict(
        re.findall(
            r'^topoplace_request_seconds_bucket\{le="\+Inf",verb="(\w+)"\} (.*)$', text, re.M
        )
    )
    assert inf == counts
    sums = dict(re.findall(r'^topoplace_request_seconds_sum\{verb="(\w+)"\} (.*)$', text, re.M))
    assert all(0 < float(v) < 60 for v in sums.values()) and sums.keys() == counts.keys()
