"""``/healthz`` while the extender works hard: gang planning on 2,000 nodes, a 50 MB body.

Starts ``topoplace serve --cluster`` on a 2,000-node DGX H100 fleet
(``benchmarks.gang_solver.dgx_fleet``, realistic partial use and faults) with a health port,
and runs, for ``--seconds`` each:

* **gangs**: one client POSTs filter for the first member of a new 16 x 8-GPU gang (a new
  gang name and namespace every request, so every request plans with CP-SAT over every
  node); refusals (cluster full) plan too;
* **body**: one client POSTs a 50 MB body to filter, again and again (refused with 413
  above ``--max-body-bytes``; the default 64 MiB admits it and it is parsed);
* **idle**: nothing else.

Meanwhile another client GETs ``/healthz`` every 10 ms, each on a new connection, on the
health port and on the main port, and records the wall time of each. Prints conditions,
the number of plannings, and p50 / p99 / max of ``/healthz`` per case and port.

Run: ``python -m benchmarks.hardening_health [--seconds 20] [--nodes 2000] [--source DIR]
[--max-body-bytes N] [--cases idle gangs body]``
(``--source`` runs the server from another checkout, e.g. ``/work/main``, for a before /
after comparison; its ``serve`` must know ``--health-port``).
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
from benchmarks.gang_solver import dgx_fleet

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
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
    source: str, objects: list[dict[str, Any]], extra: list[str], health_port: bool
) -> Iterator[Served]:
    """``topoplace serve --cluster`` over ``objects`` (Nodes and Pods), run from checkout
    ``source`` with ``extra`` arguments (and its own ``--health-port`` when
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
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def probe(port: int, stop: threading.Event, out: list[float], failures: list[int]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        status = http(port, "GET", "/healthz", timeout=30)
        out.append(time.perf_counter() - t)
        if status != 200:
            failures.append(status)
        time.sleep(0.01)


def gang_load(port: int, names: list[str], stop: threading.Event, done: list[float]) -> None:
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
    names = orjson.dumps([f"node-{i:07d}" for i in range(size // 16)])
    body = b'{"Pod":{"metadata":{"name":"big"}},"NodeNames":' + names + b"}"
    while not stop.is_set():
        t = time.perf_counter()
        http(port, "POST", "/scheduler/filter", body, timeout=60)
        done.append(time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--body-mb", type=int, default=50)
    ap.add_argument("--source", default=str(REPO), help="checkout whose serve is run")
    ap.add_argument(
        "--max-body-bytes", type=int, help="passed to serve (the shipped Deployment: 16 MiB)"
    )
    ap.add_argument("--cases", nargs="+", default=["idle", "gangs", "body"])
    args = ap.parse_args(argv)
    nodes, pods = dgx_fleet(args.nodes)
    names = [n["metadata"]["name"] for n in nodes]
    body_arg = ["--max-body-bytes", str(args.max_body_bytes)] if args.max_body_bytes else []
    with serving(args.source, nodes + pods, body_arg, health_port=True) as served:
        port, health, commit = served.port, served.health, served.commit
        assert health is not None
        print(
            f"conditions: {args.nodes} nodes (dgx_fleet), serve from {args.source} at "
            f"{commit}, {args.seconds:.0f} s per case, /healthz every 10 ms on a new "
            f"connection (health port and main port), max body "
            f"{args.max_body_bytes or 'default (64 MiB)'}, load average "
            f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs"
        )
        for case in args.cases:
            stop = threading.Event()
            work: list[float] = []
            lat = {"health port": [], "main port": []}
            fails: dict[str, list[int]] = {"health port": [], "main port": []}
            threads = [
                threading.Thread(target=probe, args=(p, stop, lat[k], fails[k]))
                for k, p in (("health port", health), ("main port", port))
            ]
            if case == "gangs":
                threads.append(threading.Thread(target=gang_load, args=(port, names, stop, work)))
            elif case == "body":
                threads.append(
                    threading.Thread(
                        target=body_load, args=(port, args.body_mb * 2**20, stop, work)
                    )
                )
            for t in threads:
                t.start()
            time.sleep(args.seconds)
            stop.set()
            for t in threads:
                t.join()
            extra = ""
            if work:
                extra = (
                    f"; {len(work)} {case} requests, median "
                    f"{statistics.median(work) * 1000:.0f} ms each"
                )
            print(f"\n{case}{extra}")
            for k in lat:
                xs = lat[k]
                print(
                    f"  /healthz {k}: n={len(xs)} p50 {pct(xs, 0.5) * 1000:.1f} ms, "
                    f"p99 {pct(xs, 0.99) * 1000:.1f} ms, max {max(xs) * 1000:.1f} ms, "
                    f"failed {len(fails[k])}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
