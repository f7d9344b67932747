"""``memory``: the server's memory and responsiveness under load.

``--kind rss`` (default): resident memory of ``topoplace serve`` while many distinct pods go
through filter. It starts ``topoplace serve --cluster`` on a 2,000-node DGX H100 fleet
(``benchmarks.micro.gang_solver.dgx_fleet``) and sends ``--pods`` filter requests, each for a
distinct real-shaped 1-GPU pod (``benchmarks.clusters.make_pod``: distinct name, UID,
labels, an env list and a command, as users write them) naming 16 nodes, over one
keep-alive connection. Every such pod is remembered for its bind in the pending-pod
store (bounded in entries and bytes, oldest evicted first) and its filter nominates GPUs
in the cache (held for ``nomination_ttl_seconds``, then dropped). Figures: the server's
RSS (``/proc/<pid>/status`` VmRSS) at start, every 20,000 pods and at the end, with the
conditions.

``--kind healthz``: ``/healthz`` while the extender works hard (gang planning on 2,000
nodes, a 50 MB body). It starts ``topoplace serve --cluster`` on a 2,000-node DGX H100 fleet
(``benchmarks.micro.gang_solver.dgx_fleet``, realistic partial use and faults) with a health port,
and runs, for ``--seconds`` each:

* **gangs**: one client POSTs filter for the first member of a new 16 x 8-GPU gang (a new
  gang name and namespace every request, so every request plans with CP-SAT over every
  node); refusals (cluster full) plan too;
* **body**: one client POSTs a 50 MB body to filter, again and again (refused with 413
  above ``--max-body-bytes``; the default 64 MiB admits it and it is parsed);
* **idle**: nothing else.

Meanwhile another client GETs ``/healthz`` every 10 ms, each on a new connection, on the
health port and on the main port, and records the wall time of each. Figures: the
number of plannings, and p50 / p99 / max of ``/healthz`` per case and port.

``topoplace bench memory [--pods 100000] [--nodes 2000]``;
``topoplace bench memory --kind healthz [--seconds 20] [--nodes 2000] [--cases idle gangs
body] [--max-body-bytes N]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from benchmarks.clusters import as_list, make_pod
from benchmarks.micro.gang_solver import dgx_fleet
from benchmarks.registry import Figures

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Served:
    """A running ``topoplace serve`` (see :func:`serving`)."""

    proc: subprocess.Popen[bytes]
    port: int
    health: int | None
    commit: str


@contextmanager
def serving(
    objects: list[dict[str, Any]], extra: list[str], health_port: bool, source: str = str(REPO)
) -> Iterator[Served]:
    """``topoplace serve --cluster`` over ``objects`` (Nodes and Pods), run from checkout
    ``source`` (default this one) with ``extra`` arguments (and its own ``--health-port`` when
    ``health_port``), up once ``/healthz`` answers 200 (SystemExit with the tail of its log
    when it exits or is not up within 300 s); terminated on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Path(tmp) / "cluster.json"
        cluster.write_bytes(orjson.dumps(as_list(objects)))
        port = free_port()
        health = free_port() if health_port else None
        log = open(Path(tmp) / "serve.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli.main", "--log-level", "WARNING", "serve"]
            + ["--cluster", str(cluster), "--port", str(port)]
            + ([] if health is None else ["--health-port", str(health)])
            + extra,
            cwd=source,
            env={**os.environ, "PYTHONPATH": source},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 300
            while http(port if health is None else health, "GET", "/healthz", timeout=2) != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((Path(tmp) / "serve.log").read_text()[-3000:])
                time.sleep(0.2)
            commit = subprocess.run(
                ["git", "-C", source, "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            yield Served(proc, port, health, commit)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()


def http(port: int, method: str, path: str, body: bytes = b"", timeout: float = 30) -> int:
    """One request on a new connection; the status code (0 when the connection failed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            s.sendall(head + body)
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    return 0
                data += chunk
            while s.recv(65536):
                pass
            return int(data.split(b" ", 2)[1])
    except OSError:
        return 0


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile by rank (NaN when empty)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def probe(port: int, stop: threading.Event, out: list[float], failures: list[int]) -> None:
    """GET /healthz every 10 ms on a new connection until ``stop``; wall times to ``out``."""
    while not stop.is_set():
        t = time.perf_counter()
        status = http(port, "GET", "/healthz", timeout=30)
        out.append(time.perf_counter() - t)
        if status != 200:
            failures.append(status)
        time.sleep(0.01)


def gang_load(port: int, names: list[str], stop: threading.Event, done: list[float]) -> None:
    """Filter the first member of a new 16 x 8-GPU gang, again and again, until ``stop``."""
    i = 0
    while not stop.is_set():
        pod = make_pod(
            f"m-{i}-0",
            8,
            namespace=f"bench-{i}",
            annotations={"topoplace.io/gang": f"g{i}", "topoplace.io/gang-size": "16"},
        )
        body = orjson.dumps({"Pod": pod, "NodeNames": names})
        t = time.perf_counter()
        http(port, "POST", "/scheduler/filter", body, timeout=60)
        done.append(time.perf_counter() - t)
        i += 1


def body_load(port: int, size: int, stop: threading.Event, done: list[float]) -> None:
    """POST a ``size``-byte filter body, again and again, until ``stop``."""
    names = orjson.dumps([f"node-{i:07d}" for i in range(size // 16)])
    body = b'{"Pod":{"metadata":{"name":"big"}},"NodeNames":' + names + b"}"
    while not stop.is_set():
        t = time.perf_counter()
        http(port, "POST", "/scheduler/filter", body, timeout=60)
        done.append(time.perf_counter() - t)


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (``VmRSS``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class KeepAlive:
    """Sequential requests on one HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def post(self, path: str, body: bytes) -> bytes:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        self.sock.sendall(head.encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 20)
        head_b, _, rest = self.buf.partition(b"\r\n\r\n")
        length = 0
        for line in head_b.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        while len(rest) < length:
            rest += self.sock.recv(1 << 20)
        self.buf = rest[length:]
        return rest[:length]


def rss(args: argparse.Namespace) -> Figures:
    """RSS at the start, every 20,000 pods (or at the end) of ``--pods`` filters."""
    nodes, pods = dgx_fleet(args.nodes)
    names = [n["metadata"]["name"] for n in nodes]
    rows: list[tuple[Any, ...]] = []
    step = min(20_000, args.pods)
    with serving(nodes + pods, [], health_port=False) as served:
        proc, port = served.proc, served.port
        rows.append((0, rss_mib(proc.pid), 0.0))
        client = KeepAlive(port)
        t0 = time.monotonic()
        for i in range(args.pods):
            pod = make_pod(f"rss-{i:06d}", 1, namespace=f"ns-{i % 97}")
            spec = pod["spec"]["containers"][0]
            spec["env"] = [{"name": f"VAR_{k}", "value": "x" * 32} for k in range(8)]
            spec["command"] = ["python", "-m", "train", f"--run={i}"]
            cands = [names[(i * 16 + k) % len(names)] for k in range(16)]
            client.post("/scheduler/filter", orjson.dumps({"Pod": pod, "NodeNames": cands}))
            if (i + 1) % step == 0 or i + 1 == args.pods:
                rows.append((i + 1, rss_mib(proc.pid), round(time.monotonic() - t0, 1)))
    return Figures(
        "Resident memory of topoplace serve while distinct pods go through filter",
        ("pods sent", "RSS MiB", "seconds"),
        rows,
        {
            "nodes": f"{args.nodes} (dgx_fleet)",
            "pods": f"{args.pods} distinct 1-GPU pods, 16 candidate nodes each",
            "connection": "one keep-alive",
        },  # fmt: skip
    )


def healthz(args: argparse.Namespace) -> Figures:
    """Per case and port: /healthz n, p50, p99, max, failures; and the load's requests."""
    nodes, pods = dgx_fleet(args.nodes)
    names = [n["metadata"]["name"] for n in nodes]
    body_arg = ["--max-body-bytes", str(args.max_body_bytes)] if args.max_body_bytes else []
    rows: list[tuple[Any, ...]] = []
    with serving(nodes + pods, body_arg, health_port=True) as served:
        port, health = served.port, served.health
        assert health is not None
        for case in args.cases:
            stop = threading.Event()
            work: list[float] = []
            lat: dict[str, list[float]] = {"health port": [], "main port": []}
            fails: dict[str, list[int]] = {"health port": [], "main port": []}
            threads = [
                threading.Thread(target=probe, args=(p, stop, lat[k], fails[k]))
                for k, p in (("health port", health), ("main port", port))
            ]
            if case == "gangs":
                threads.append(threading.Thread(target=gang_load, args=(port, names, stop, work)))
            elif case == "body":
                threads.append(threading.Thread(
                    target=body_load, args=(port, args.body_mb * 2**20, stop, work)))  # fmt: skip
            for t in threads:
                t.start()
            time.sleep(args.seconds)
            stop.set()
            for t in threads:
                t.join()
            load = (
                f"{len(work)} requests, median {statistics.median(work) * 1000:.0f} ms"
                if work
                else ""
            )
            for k, xs in lat.items():
                rows.append((case, k, len(xs), pct(xs, 0.5) * 1000, pct(xs, 0.99) * 1000,
                             max(xs) * 1000, len(fails[k]), load))  # fmt: skip
    return Figures(
        "/healthz wall ms while the extender works (new connection every 10 ms)",
        ("case", "port", "probes", "p50 ms", "p99 ms", "max ms", "failed", "load requests"),
        rows,
        {
            "nodes": f"{args.nodes} (dgx_fleet)",
            "seconds per case": args.seconds,
            "max body": args.max_body_bytes or "default (64 MiB)",
            "body MB": args.body_mb,
        },  # fmt: skip
    )


def add_arguments(ap: Any) -> None:
    """Both kinds' flags."""
    ap.add_argument("--kind", choices=("rss", "healthz"), default="rss")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=100_000, help="rss: distinct pods filtered")
    ap.add_argument("--seconds", type=float, default=20.0, help="healthz: seconds per case")
    ap.add_argument("--body-mb", type=int, default=50, help="healthz: the big body's size")
    ap.add_argument("--max-body-bytes", type=int,
                    help="healthz: passed to serve (the shipped Deployment: 16 MiB)")  # fmt: skip
    ap.add_argument("--cases", nargs="+", default=["idle", "gangs", "body"],
                    choices=["idle", "gangs", "body"], help="healthz: cases")  # fmt: skip


def run(args: argparse.Namespace) -> Figures:
    """``--kind rss`` (default) or ``healthz``."""
    return healthz(args) if args.kind == "healthz" else rss(args)
