"""Extender latency over real loopback HTTP, against a parse-only floor.

For each cluster size (default 1,000 / 5,000 / 10,000 GPU nodes, built by
``benchmarks.clusters.synthetic_cluster``), the benchmark writes the cluster to a file,
starts ``topoplace serve --cluster FILE`` (uvicorn) in a subprocess, and times
sequential ``filter`` and ``prioritize`` calls with ``NodeNames`` payloads naming every
node, over one keep-alive connection, as kube-scheduler does. At 5,000 nodes it also
times ``filter`` with full ``Nodes`` objects (``nodeCacheCapable: false``).

Two ``NodeNames`` cases: the same list for every request (the issue's benchmark: the
extender may recognise a list it has seen), and ``NodeNames-shuffled``, a different order
of all nodes on every request. The second is what a large cluster sends: kube-scheduler
filters nodes with 16 goroutines and appends the feasible ones as they finish, so the
order changes from pod to pod and every name must be looked up.

The floor is a bare ASGI app on uvicorn that reads the same body, parses it with orjson
and answers a constant: what any Python extender pays before deciding anything. Server
and floor run side by side and requests alternate between them one by one, so a noisy
moment on the machine lands on both; the ratio column is p99 over the floor's p99 for
the same verb and payload.

Run: ``python -m benchmarks.extender_latency [--sizes 1000 5000 10000] [--requests 1000]
[--runs 3] [--only NodeNames NodeNames-shuffled Nodes] [--config POLICY.yaml]``. Prints
p50/p99 (ms) and requests/s per verb and size; with several runs, the median of the
per-run figures.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
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

from benchmarks.clusters import make_pod, synthetic_cluster
from scheduler.cli.demo import free_port


async def floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The floor: a bare ASGI app (no framework) that reads the body, parses it with
    orjson and answers a constant. It is what any Python extender on uvicorn pays before
    deciding anything, and stricter than a FastAPI endpoint doing the same."""
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    reply = b'{"status":"ok"}'
    if scope["method"] == "POST":
        body = orjson.loads(b"".join(chunks))
        reply = orjson.dumps({"Error": "", "n": len(body)})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(reply)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": reply})


FULL_NODES_REQUESTS = 100
"""Timed requests of the full-``Nodes`` case (each one carries every Node object)."""

SHUFFLED_BODIES = 64
"""Distinct candidate orders cycled through in the shuffled case."""


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
    This client only frames requests and reads ``Content-Length`` bytes into one buffer
    it reuses (no allocation per read), so the figures are the server's cost plus
    loopback transfer, for the floor and for topoplace alike.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(1 << 22)

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; returns (status, reply body)."""
        status, view = self.post_view(path, body)
        with view:
            return status, bytes(view)

    def post_view(self, path: str, body: bytes) -> tuple[int, memoryview]:
        """:meth:`post` without copying the reply: a view of the client's buffer, to be
        released before the next call (timed calls use this)."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)
        have = 0
        while (end := self.buf.find(b"\r\n\r\n", 0, have)) < 0:
            have += self._recv_into(have)
        header = bytes(self.buf[:end])
        status = int(header.split(b" ", 2)[1])
        length = 0
        for line in header.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        total = end + 4 + length
        if total > len(self.buf):
            self.buf.extend(bytes(total - len(self.buf)))
        while have < total:
            have += self._recv_into(have)
        if have != total:
            raise ConnectionError("server sent more than one reply")
        return status, memoryview(self.buf)[end + 4 : total]

    def _recv_into(self, at: int) -> int:
        if at == len(self.buf):
            self.buf.extend(bytes(len(self.buf)))
        with memoryview(self.buf) as view:
            n = self.sock.recv_into(view[at:])
        if not n:
            raise ConnectionError("server closed the connection")
        return n

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def _figures(lat: list[float], wall: float) -> dict[str, float]:
    lat = sorted(lat)
    return {
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
        "rps": len(lat) / wall,
    }


def _time_pair(
    server: RawClient,
    floor: RawClient,
    path: str,
    bodies: list[bytes],
    n: int,
    warmup: int = 30,
) -> tuple[dict[str, float], dict[str, float]]:
    """Time ``n`` requests to the server and ``n`` to the floor, interleaved one by one so
    both see the same machine (a noisy neighbour or a frequency change hits both), then
    (server figures, floor figures). Request i sends ``bodies[i % len(bodies)]``."""
    for i in range(warmup):
        assert server.post(path, bodies[i % len(bodies)])[0] == 200
        assert floor.post(path, bodies[i % len(bodies)])[0] == 200
    lat: tuple[list[float], list[float]] = ([], [])
    wall = [0.0, 0.0]
    for r in range(n):
        body = bodies[r % len(bodies)]
        for i, client in enumerate((server, floor)):
            s = time.perf_counter()
            status, view = client.post_view(path, body)
            took = time.perf_counter() - s
            view.release()
            assert status == 200
            lat[i].append(took)
            wall[i] += took
    return _figures(lat[0], wall[0]), _figures(lat[1], wall[1])


def _serve(args: list[str]) -> tuple[subprocess.Popen[bytes], RawClient]:
    port = free_port()
    proc = _start([sys.executable, *args, "--port", str(port)], port)
    return proc, RawClient(port)


def run_size(
    size: int,
    requests: int,
    full_nodes: bool,
    only: tuple[str, ...] = (),
    config: str | None = None,
) -> dict[str, dict[str, float]]:
    """Time every case at one cluster size (only the payload modes in ``only`` if given;
    the server runs with the policy file ``config`` if given); returns case -> figures."""
    cluster = synthetic_cluster(size)
    nodes = [o for o in cluster["items"] if o["kind"] == "Node"]
    names = [n["metadata"]["name"] for n in nodes]
    pod = make_pod("bench-pod", 4, namespace="bench")
    pod.pop("kind"), pod.pop("apiVersion")
    rng = random.Random(size)
    shuffled = []
    for _ in range(SHUFFLED_BODIES):
        order = list(names)
        rng.shuffle(order)
        shuffled.append(orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": order}))
    bodies = {
        "NodeNames": [orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})],
        "NodeNames-shuffled": shuffled,
    }
    if only:
        bodies = {m: b for m, b in bodies.items() if m in only}
    if full_nodes and (not only or "Nodes" in only):
        bodies["Nodes"] = [
            orjson.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None})
        ]
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        path.write_bytes(orjson.dumps(cluster))
        del cluster, nodes
        gc.collect()
        gc.freeze()  # the client is the instrument: keep its own GC out of the figures
        started = [
            _serve(
                ["-m", "scheduler.cli.main", "--log-level", "WARNING", "serve"]
                + ["--cluster", str(path)]
                + (["--config", config] if config else [])
            ),
            _serve(
                ["-m", "uvicorn", "benchmarks.extender_latency:floor_app"]
                + ["--log-level", "warning"]
            ),
        ]
        (_, server), (_, floor) = started
        try:
            for mode, sent in bodies.items():
                r = orjson.loads(server.post("/scheduler/filter", sent[0])[1])
                assert not r["Error"] and (r["NodeNames"] or r["Nodes"]["items"]), r
                verbs = ("filter",) if mode == "Nodes" else ("filter", "prioritize")
                for verb in verbs:
                    n = min(requests, FULL_NODES_REQUESTS) if mode == "Nodes" else requests
                    mine, base = _time_pair(server, floor, f"/scheduler/{verb}", sent, n)
                    out[f"{verb}/{mode}"] = mine
                    out[f"floor-{verb}/{mode}"] = base
        finally:
            for proc, client in started:
                client.close()
                proc.terminate()
                proc.wait(timeout=30)
            gc.unfreeze()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000])
    ap.add_argument("--requests", type=int, default=1000, help="timed requests per case")
    ap.add_argument("--runs", type=int, default=3, help="runs per size; the median run is shown")
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument(
        "--only",
        nargs="+",
        default=[],
        choices=["NodeNames", "NodeNames-shuffled", "Nodes"],
        help="time only these payloads (default: all)",
    )
    ap.add_argument("--config", help="policy YAML for the server (default: the shipped one)")
    a = ap.parse_args(argv)
    print(
        f"extender latency: sequential requests over one keep-alive loopback connection, "
        f"4-GPU pod, {a.requests} timed requests per case (after 30 warm-up), {a.runs} run(s); "
        f"policy {a.config or 'shipped'}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    results: dict[str, Any] = {}
    print(
        f"{'nodes':>6}  {'case':<26} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}  {'p99 / floor p99':>15}"
    )
    for size in a.sizes:
        runs = [
            run_size(size, a.requests, size == 5000, tuple(a.only), a.config) for _ in range(a.runs)
        ]
        merged = {
            case: {k: statistics.median(r[case][k] for r in runs) for k in runs[0][case]}
            for case in runs[0]
        }
        results[str(size)] = merged
        for case, f in sorted(merged.items()):
            floor = merged[case if case.startswith("floor") else f"floor-{case}"]
            ratio = f["p99_ms"] / floor["p99_ms"]
            print(
                f"{size:>6}  {case:<26} {f['p50_ms']:>8.2f} {f['p99_ms']:>8.2f} "
                f"{f['rps']:>8.0f}  {ratio:>15.2f}"
            )
    if a.json:
        Path(a.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
