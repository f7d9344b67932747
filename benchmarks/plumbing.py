"""Server CPU per pod of the HTTP plumbing: filter + bind over real loopback keep-alive.

Starts ``topoplace serve --cluster FILE`` (the shipped protocol: connection guard, fast
lane, uvloop; ``--log-level INFO``, so every bind writes its audit line to the server's
stderr, here a file) in a subprocess and plays kube-scheduler for each pod: ``filter``
with every node name in a new order, then ``bind`` to the node it returned, each answer
awaited before the next request. Like kube-scheduler's extender client (Go's
``http.Transport`` keeps 2 idle connections per host), a request goes out on a NEW
connection with probability ``--new-conn`` (default 0.22: about 1 in 4-5, as measured
live) and a pool of at most 2 idle connections is kept; the rest are closed after their
answer. The binder is the snapshot one (no API write: its client CPU is measured by
``benchmarks/bind_client.py``), so bind's server CPU here is decision + plumbing.

Server CPU is read from ``/proc/PID/task/*/schedstat`` (nanoseconds on CPU, all the
server's threads) around each pod; per run the mean per pod, and median and p99 over the
pods of all runs. With ``--tree A --tree B`` one server runs from each source tree
(``PYTHONPATH``, working directory), side by side, and each pod goes to all of them in
turn (the order alternating per pod), so noise on the shared machine lands on all alike.
``--unknown`` sends, per pod, two binds of pods the server never saw instead (each
refused at once, counted and audited): the plumbing alone. ``--names N`` sends N node names (a random sample) per filter (less engine work per pod, so the
plumbing's share is larger).

Run: ``python -m benchmarks.plumbing [--nodes 500] [--pods 1000] [--warmup 200] [--runs 3]
[--new-conn 0.22] [--names N] [--unknown] [--tree DIR ...]``.
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

import orjson

from benchmarks.clusters import make_pod, synthetic_cluster
from benchmarks.stats import p99
from scheduler.cli.demo import free_port

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


def _start(tree: str, cluster: Path, port: int, log: Any) -> subprocess.Popen[bytes]:
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


def one_run(
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
            procs[t] = _start(t, cluster, port, logs[t])
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=1000, help="measured pods per run")
    ap.add_argument("--warmup", type=int, default=200, help="pods placed before measuring")
    ap.add_argument("--runs", type=int, default=3, help="runs per tree")
    ap.add_argument("--names", type=int, default=None, help="node names per filter (default: all)")
    ap.add_argument(
        "--unknown",
        action="store_true",
        help="per pod, two binds of unknown pods instead of filter + bind (plumbing only)",
    )
    ap.add_argument("--new-conn", type=float, default=0.22, help="share of new connections")
    ap.add_argument(
        "--tree", action="append", help="source tree to serve from (repeat: side by side)"
    )
    args = ap.parse_args(argv)
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
        for run in range(args.runs):
            for tree, got in one_run(trees, path, names, args, seed=run).items():
                results[tree].append(got)
    print(
        f"plumbing: {args.nodes} nodes ({args.names} names per filter, shuffled), "
        f"{args.pods} one-GPU pods per run after {args.warmup} warm-up, {args.runs} runs, "
        f"servers of all trees side by side, pod by pod in turn, new connection per request p={args.new_conn}, "
        f"{os.cpu_count()} CPUs; server CPU per pod "
        + ("(2 binds of unknown pods)" if args.unknown else "(filter + bind)")
        + ", ms"
    )
    print("| tree | median | p99 | run means (whole process) | connections opened per run |")
    print("|---|---|---|---|---|")
    for tree, runs in results.items():
        xs = [1000 * x for r in runs for x in r[0]]
        print(
            f"| {tree} | {statistics.median(xs):.3f} | {p99(xs):.3f} | "
            + ", ".join(f"{1000 * r[1]:.3f}" for r in runs)
            + " | "
            + ", ".join(str(r[2]) for r in runs)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
