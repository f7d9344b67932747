"""``extender-latency``: extender latency over real loopback HTTP, against a parse-only floor.

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

``topoplace bench extender-latency [--sizes 1000 5000 10000] [--requests 1000] [--runs 3]
[--only NodeNames NodeNames-shuffled Nodes] [--config POLICY.yaml]``: p50/p99 (ms) and
requests/s per verb and size; with several runs, the median of the per-run figures.

``--kind plumbing``: the server CPU per pod of the HTTP plumbing, filter + bind over real
loopback keep-alive, as kube-scheduler's Go client drives it. It starts ``topoplace serve --cluster FILE`` (the shipped protocol: connection guard, fast
lane, uvloop; ``--log-level INFO``, so every bind writes its audit line to the server's
stderr, here a file) in a subprocess and plays kube-scheduler for each pod: ``filter``
with every node name in a new order, then ``bind`` to the node it returned, each answer
awaited before the next request. Like kube-scheduler's extender client (Go's
``http.Transport`` keeps 2 idle connections per host), a request goes out on a NEW
connection with probability ``--new-conn`` (default 0.22: about 1 in 4-5, as measured
live) and a pool of at most 2 idle connections is kept; the rest are closed after their
answer. The binder is the snapshot one (no API write), so bind's server CPU here is
decision + plumbing.

Server CPU is read from ``/proc/PID/task/*/schedstat`` (nanoseconds on CPU, all the
server's threads) around each pod; per run the mean per pod, and median and p99 over the
pods of all runs. With ``--tree A --tree B`` one server runs from each source tree
(``PYTHONPATH``, working directory), side by side, and each pod goes to all of them in
turn (the order alternating per pod), so noise on the shared machine lands on all alike.
``--unknown`` sends, per pod, two binds of pods the server never saw instead (each
refused at once, counted and audited): the plumbing alone. ``--names N`` sends N node
names (a random sample) per filter (less engine work per pod, so the plumbing's share is
larger).

``topoplace bench extender-latency --kind plumbing [--nodes 500] [--pods 1000] [--warmup 200]
[--runs 3] [--new-conn 0.22] [--names N] [--unknown] [--tree DIR ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
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
from benchmarks.registry import Figures
from benchmarks.stats import p99
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
                ["-m", "uvicorn", "benchmarks.micro.extender_latency:floor_app"]
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


IDLE_CONNECTIONS = 2
"""Idle connections kube-scheduler's extender client keeps (Go's default per host)."""


def _server_ns(pid: int, settle_s: float = 0.05) -> int:
    """Nanoseconds on CPU of all the threads of process ``pid`` so far.

    A thread's ``schedstat`` counts its time up to when it last left the CPU: a thread
    still running (finishing a reply) shows none of its current stretch. So the threads
    are read once none is running (``R`` in ``stat``), or after ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while True:
        total = 0
        running = False
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    stat = f.read()
                running |= stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"R"
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # a thread that ended: its time is lost (worker threads only)
        if not running or time.monotonic() > deadline:
            return total
        time.sleep(0.0002)


def _post(path: str, body: bytes) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Go-http-client/1.1\r\n"
        b"Content-Length: %d\r\nContent-Type: application/json\r\n"
        b"Accept-Encoding: gzip\r\n\r\n%s" % (path.encode(), len(body), body)
    )


def _read_reply(s: socket.socket) -> bytes:
    buf = b""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].lower()
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(buf) >= end + 4 + length:
                if not head.startswith(b"http/1.1 200"):
                    raise RuntimeError(f"server answered {buf[:200]!r}")
                return buf[end + 4 : end + 4 + length]
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk


class GoLikeClient:
    """Sequential requests over a pool of at most :data:`IDLE_CONNECTIONS` idle
    connections; a request opens a new connection with probability ``new_conn``."""

    def __init__(self, port: int, new_conn: float, seed: int) -> None:
        self.port = port
        self.new_conn = new_conn
        self.rng = random.Random(seed)
        self.idle: list[socket.socket] = []
        self.opened = 0

    def post(self, path: str, body: bytes) -> bytes:
        if not self.idle or self.rng.random() < self.new_conn:
            s = socket.create_connection(("127.0.0.1", self.port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.opened += 1
        else:
            s = self.idle.pop()
        s.sendall(_post(path, body))
        reply = _read_reply(s)
        if len(self.idle) < IDLE_CONNECTIONS:
            self.idle.append(s)
        else:
            s.close()
        return reply

    def close(self) -> None:
        for s in self.idle:
            s.close()
        self.idle.clear()


def _start_tree(tree: str, cluster: Path, port: int, log: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": tree}
    env.pop("KUBECONFIG", None)
    args = [sys.executable, "-m", "scheduler.cli.main", "--log-level", "INFO", "serve"]
    args += ["--cluster", str(cluster), "--port", str(port)]
    proc = subprocess.Popen(args, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited; see its log")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if s.recv(100).startswith(b"HTTP/1.1 200"):
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start in time")


def plumbing_run(
    trees: list[str], cluster: Path, names: list[str], args: argparse.Namespace, seed: int
) -> dict[str, tuple[list[float], float, int]]:
    """One fresh server per tree, all serving at once, driven pod by pod in turn (the
    order alternates per pod). Per tree: per-pod server CPU (seconds), the whole-process
    CPU per pod (seconds) and connections opened."""
    rng = random.Random(seed)
    bodies = []
    for i in range(args.warmup + args.pods):
        pod = make_pod(f"p{i:05d}", 1, namespace="bench", cpu="1", memory="1Gi")
        pod["metadata"]["uid"] = f"uid-{seed}-{i}"
        pod["metadata"]["resourceVersion"] = str(1000 + i)
        order = rng.sample(names, args.names)
        bodies.append((pod, orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": order})))
    stack = contextlib.ExitStack()
    logs = {t: stack.enter_context(tempfile.TemporaryFile()) for t in trees}  # noqa: SIM115
    procs: dict[str, subprocess.Popen[bytes]] = {}
    clients: dict[str, GoLikeClient] = {}
    per_pod: dict[str, list[float]] = {t: [] for t in trees}
    begin: dict[str, int] = {}
    out = {}
    try:
        for t in trees:
            port = free_port()
            procs[t] = _start_tree(t, cluster, port, logs[t])
            clients[t] = GoLikeClient(port, args.new_conn, seed)
        for i, (pod, body) in enumerate(bodies):
            if i == args.warmup:
                for t in trees:
                    begin[t] = _server_ns(procs[t].pid)
                    clients[t].opened = 0
            for t in trees if i % 2 == 0 else trees[::-1]:
                pid, client = procs[t].pid, clients[t]
                before = _server_ns(pid)
                md = pod["metadata"]
                if args.unknown:
                    _refused(client, md["name"])
                else:
                    (node,) = orjson.loads(client.post("/scheduler/filter", body))["NodeNames"]
                    bind = orjson.dumps(
                        {"PodName": md["name"], "PodNamespace": "bench", "PodUID": md["uid"]}
                        | {"Node": node}
                    )
                    answer = orjson.loads(client.post("/scheduler/bind", bind))
                    if answer.get("Error"):
                        raise RuntimeError(f"bind {md['name']}: {answer['Error']}")
                if i >= args.warmup:
                    per_pod[t].append((_server_ns(pid) - before) / 1e9)
        time.sleep(0.05)  # let the servers finish counting the last answers
        for t in trees:
            whole = (_server_ns(procs[t].pid) - begin[t]) / 1e9 / args.pods
            out[t] = (per_pod[t], whole, clients[t].opened)
    finally:
        for c in clients.values():
            c.close()
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)
    with stack:
        audits = {t: _audit_lines(log) for t, log in logs.items()}
    for t, audit in audits.items():
        binds = (args.warmup + args.pods) * (2 if args.unknown else 1)
        if audit != binds:
            raise RuntimeError(f"{t}: {audit} audit lines for {binds} binds")
    return out


def _refused(client: GoLikeClient, name: str) -> None:
    """``--unknown``: two binds of pods the server never saw (each refused at once, with
    its metrics and audit line): the plumbing with next to no decision."""
    for suffix in ("a", "b"):
        bind = {"PodName": f"{name}{suffix}", "PodNamespace": "bench", "Node": "nowhere"}
        answer = orjson.loads(client.post("/scheduler/bind", orjson.dumps(bind)))
        if not answer.get("Error", "").startswith("unknown pod"):
            raise RuntimeError(f"bind of an unknown pod answered {answer}")


def _audit_lines(log: Any) -> int:
    log.seek(0)
    return sum(1 for line in log if b"topoplace.bind:" in line)


def add_arguments(ap: Any) -> None:
    """Both kinds' flags (the runner adds ``--runs``, default 3)."""
    ap.add_argument("--kind", choices=("latency", "plumbing"), default="latency")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 10000],
                    help="latency: cluster sizes")  # fmt: skip
    ap.add_argument("--requests", type=int, default=1000, help="latency: timed requests per case")
    ap.add_argument("--only", nargs="+", default=[],
                    choices=["NodeNames", "NodeNames-shuffled", "Nodes"],
                    help="latency: time only these payloads (default: all)")  # fmt: skip
    ap.add_argument("--config", help="latency: policy YAML for the server (default: shipped)")
    ap.add_argument("--nodes", type=int, default=500, help="plumbing: cluster size")
    ap.add_argument("--pods", type=int, default=1000, help="plumbing: measured pods per run")
    ap.add_argument("--warmup", type=int, default=200, help="plumbing: pods before measuring")
    ap.add_argument("--names", type=int, default=None,
                    help="plumbing: node names per filter (default: all)")  # fmt: skip
    ap.add_argument("--unknown", action="store_true",
                    help="plumbing: two binds of unknown pods per pod instead of filter + bind")  # fmt: skip
    ap.add_argument("--new-conn", type=float, default=0.22,
                    help="plumbing: share of requests on a new connection")  # fmt: skip
    ap.add_argument("--tree", action="append",
                    help="plumbing: source tree to serve from (repeat: side by side)")  # fmt: skip


def run(args: argparse.Namespace) -> Figures:
    """``--kind latency`` (default) or ``plumbing``."""
    return plumbing(args) if args.kind == "plumbing" else latency(args)


def latency(a: argparse.Namespace) -> Figures:
    """Per size, the median over ``--runs`` of each case's p50, p99 and requests/s."""
    runs_n = a.runs or 3
    rows: list[tuple[Any, ...]] = []
    for size in a.sizes:
        runs = [
            run_size(size, a.requests, size == 5000, tuple(a.only), a.config) for _ in range(runs_n)
        ]
        merged = {
            case: {k: statistics.median(r[case][k] for r in runs) for k in runs[0][case]}
            for case in runs[0]
        }
        for case, f in sorted(merged.items()):
            floor = merged[case if case.startswith("floor") else f"floor-{case}"]
            rows.append((size, case, f["p50_ms"], f["p99_ms"], round(f["rps"]),
                         f["p99_ms"] / floor["p99_ms"]))  # fmt: skip
    return Figures(
        "Extender latency over loopback HTTP (sequential, one keep-alive connection)",
        ("nodes", "case", "p50 ms", "p99 ms", "req/s", "p99 / floor p99"),
        rows,
        {
            "pod": "4 GPUs",
            "requests per case": f"{a.requests} (after 30 warm-up)",
            "runs": f"{runs_n} (median run)",
            "policy": a.config or "shipped",
            "python": sys.version.split()[0],
        },  # fmt: skip
    )


def plumbing(args: argparse.Namespace) -> Figures:
    """Per source tree, the server CPU per pod: median and p99 over the pods of all runs,
    the per-run whole-process means and the connections opened."""
    runs_n = args.runs or 3
    trees = [str(Path(t).resolve()) for t in (args.tree or [os.getcwd()])]
    cluster = synthetic_cluster(args.nodes)
    names = [o["metadata"]["name"] for o in cluster["items"] if o["kind"] == "Node"]
    args.names = args.names or len(names)
    results: dict[str, list[tuple[list[float], float, int]]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        path.write_bytes(orjson.dumps(cluster))
        del cluster
        gc.collect()
        gc.freeze()
        try:
            for seed in range(runs_n):
                for tree, got in plumbing_run(trees, path, names, args, seed).items():
                    results[tree].append(got)
        finally:
            gc.unfreeze()
    rows = []
    for tree, runs in results.items():
        xs = [1000 * x for r in runs for x in r[0]]
        rows.append((tree, statistics.median(xs), p99(xs),
                     ", ".join(f"{1000 * r[1]:.3f}" for r in runs),
                     ", ".join(str(r[2]) for r in runs)))  # fmt: skip
    what = "2 binds of unknown pods" if args.unknown else "filter + bind"
    return Figures(
        f"Server CPU ms per pod ({what}) over loopback keep-alive, Go-like client",
        ("tree", "median ms", "p99 ms", "run means ms (whole process)", "connections opened"),
        rows,
        {
            "nodes": args.nodes,
            "names per filter": f"{args.names} (shuffled)",
            "pods per run": f"{args.pods} after {args.warmup} warm-up",
            "runs": runs_n,
            "new connection per request": args.new_conn,
        },  # fmt: skip
    )
