"""Extender latency over real loopback HTTP, against a parse-only floor.

For each cluster size (default 1,000 / 5,000 / 10,000 GPU nodes, built by
``benchmarks.clusters.synthetic_cluster``), the benchmark writes the cluster to a file,
starts ``topoplace serve --cluster FILE`` (uvicorn) in a subprocess, and times
sequential ``filter`` and ``prioritize`` calls with ``NodeNames`` payloads naming every
node, over one keep-alive connection, as kube-scheduler does. At 5,000 nodes it also
times ``filter`` with full ``Nodes`` objects (``nodeCacheCapable: false``). The floor is
a bare uvicorn app that reads the same body, parses it with orjson and answers a
constant: what any Python extender pays before deciding anything.

Run: ``python -m benchmarks.extender_latency [--sizes 1000 5000 10000] [--requests 300]
[--runs 3]``. Prints p50/p99 (ms) and requests/s per verb and size; with several runs,
the median of the per-run figures.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from benchmarks.clusters import make_pod, synthetic_cluster
from scheduler.cli.demo import free_port

floor_app = FastAPI()


@floor_app.get("/healthz")
async def _healthz() -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


@floor_app.post("/scheduler/{verb}")
async def _floor(verb: str, request: Request) -> Response:
    """Parse the body and answer a constant: the cost floor of any Python extender."""
    body = orjson.loads(await request.body())
    return Response(orjson.dumps({"Error": "", "n": len(body)}), media_type="application/json")


def _start(args: list[str], port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("KUBECONFIG", None)
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start in time")


class RawClient:
    """A minimal HTTP/1.1 keep-alive client over one socket.

    kube-scheduler's Go client parses replies at native speed; httpx's pure-Python parser
    would add milliseconds per 100 KB reply and measure the client instead of the server.
    This client only frames requests and reads ``Content-Length`` bytes, so the figures are
    the server's cost plus loopback transfer, for the floor and for topoplace alike.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; returns (status, reply body)."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        header, _, rest = self.buf.partition(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        length = 0
        for line in header.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        parts = [rest]
        have = len(rest)
        while have < length:
            chunk = self._recv()
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self.buf = data[length:]
        return status, data[:length]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return chunk

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def _time(client: RawClient, path: str, body: bytes, n: int, warmup: int = 30) -> dict[str, float]:
    for _ in range(warmup):
        assert client.post(path, body)[0] == 200
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        status, _ = client.post(path, body)
        lat.append(time.perf_counter() - s)
        assert status == 200
    wall = time.perf_counter() - t0
    lat.sort()
    return {
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
        "rps": n / wall,
    }


def run_size(size: int, requests: int, full_nodes: bool) -> dict[str, dict[str, float]]:
    """Time every case at one cluster size; returns case -> figures."""
    cluster = synthetic_cluster(size)
    nodes = [o for o in cluster["items"] if o["kind"] == "Node"]
    names = [n["metadata"]["name"] for n in nodes]
    pod = make_pod("bench-pod", 4, namespace="bench")
    pod.pop("kind"), pod.pop("apiVersion")
    bodies = {"NodeNames": orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})}
    if full_nodes:
        bodies["Nodes"] = orjson.dumps(
            {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
        )
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        path.write_bytes(orjson.dumps(cluster))
        port = free_port()
        proc = _start(
            [
                sys.executable,
                "-m",
                "scheduler.cli.main",
                "--log-level",
                "WARNING",
                "serve",
                "--cluster",
                str(path),
                "--port",
                str(port),
            ],
            port,
        )
        try:
            c = RawClient(port)
            try:
                for mode, body in bodies.items():
                    r = orjson.loads(c.post("/scheduler/filter", body)[1])
                    assert not r["Error"] and (r["NodeNames"] or r["Nodes"]["items"]), r
                    out[f"filter/{mode}"] = _time(c, "/scheduler/filter", body, requests)
                    if mode == "NodeNames":
                        out[f"prioritize/{mode}"] = _time(
                            c, "/scheduler/prioritize", body, requests
                        )
            finally:
                c.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        port = free_port()
        proc = _start(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "benchmarks.extender_latency:floor_app",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            port,
        )
        try:
            c = RawClient(port)
            try:
                for mode, body in bodies.items():
                    out[f"floor/{mode}"] = _time(c, "/scheduler/filter", body, requests)
            finally:
                c.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    ap.add_argument("--requests", type=int, default=300, help="timed requests per case")
    ap.add_argument("--runs", type=int, default=3, help="runs per size; the median run is shown")
    ap.add_argument("--json", help="also write the raw figures to this file")
    a = ap.parse_args(argv)
    print(
        f"extender latency: sequential requests over one keep-alive loopback connection, "
        f"4-GPU pod, {a.requests} timed requests per case (after 30 warm-up), {a.runs} run(s); "
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    results: dict[str, Any] = {}
    print(
        f"{'nodes':>6}  {'case':<22} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}  {'p99 / floor p99':>15}"
    )
    for size in a.sizes:
        runs = [run_size(size, a.requests, full_nodes=(size == 5000)) for _ in range(a.runs)]
        merged = {
            case: {k: statistics.median(r[case][k] for r in runs) for k in runs[0][case]}
            for case in runs[0]
        }
        results[str(size)] = merged
        for case, f in sorted(merged.items()):
            mode = case.split("/")[1]
            ratio = f["p99_ms"] / merged[f"floor/{mode}"]["p99_ms"]
            print(
                f"{size:>6}  {case:<22} {f['p50_ms']:>8.2f} {f['p99_ms']:>8.2f} {f['rps']:>8.0f}  {ratio:>15.2f}"
            )
    if a.json:
        Path(a.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
