"""Resident memory of ``topoplace serve`` after 100,000 distinct pods went through filter.

Starts ``topoplace serve --cluster`` on a 2,000-node DGX H100 fleet
(``benchmarks.gang_solver.dgx_fleet``) and sends ``--pods`` filter requests, each for a
distinct real-shaped 1-GPU pod (``benchmarks.clusters.make_pod``: distinct name, UID,
labels, an env list and a command, as users write them) naming 16 nodes, over one
keep-alive connection. Every such pod is remembered for its bind in the pending-pod
store (bounded in entries and bytes, oldest evicted first) and its filter nominates GPUs
in the cache (held for ``nomination_ttl_seconds``, then dropped). Prints the server's
RSS (``/proc/<pid>/status`` VmRSS) at start, every 20,000 pods and at the end, with the
conditions.

Run: ``python -m benchmarks.hardening_rss [--pods 100000] [--nodes 2000] [--source DIR]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import orjson

from benchmarks.clusters import make_pod
from benchmarks.gang_solver import dgx_fleet
from benchmarks.hardening_health import serving

REPO = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--source", default=str(REPO), help="checkout whose serve is run")
    args = ap.parse_args(argv)
    nodes, pods = dgx_fleet(args.nodes)
    names = [n["metadata"]["name"] for n in nodes]
    with serving(args.source, nodes + pods, [], health_port=False) as served:
        proc, port, commit = served.proc, served.port, served.commit
        print(
            f"conditions: {args.nodes} nodes (dgx_fleet), serve from {args.source} at "
            f"{commit}, {args.pods} distinct 1-GPU pods through filter (16 candidate "
            f"nodes each), one keep-alive connection, load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        print(f"RSS at start: {rss_mib(proc.pid):.0f} MiB")
        client = KeepAlive(port)
        t0 = time.monotonic()
        for i in range(args.pods):
            pod = make_pod(f"rss-{i:06d}", 1, namespace=f"ns-{i % 97}")
            spec = pod["spec"]["containers"][0]
            spec["env"] = [{"name": f"VAR_{k}", "value": "x" * 32} for k in range(8)]
            spec["command"] = ["python", "-m", "train", f"--run={i}"]
            cands = [names[(i * 16 + k) % len(names)] for k in range(16)]
            client.post("/scheduler/filter", orjson.dumps({"Pod": pod, "NodeNames": cands}))
            if (i + 1) % 20_000 == 0:
                print(
                    f"RSS after {i + 1} pods: {rss_mib(proc.pid):.0f} MiB "
                    f"({time.monotonic() - t0:.0f} s)"
                )
        print(f"RSS at the end: {rss_mib(proc.pid):.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
