"""A real ``topoplace serve`` process for the hardening tests (uvicorn, the connection
guard, a health port), started and stopped by pid, plus a raw HTTP/1.1 client."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import h11

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """A running ``topoplace serve``."""

    proc: subprocess.Popen[bytes]
    port: int
    health_port: int
    log: Path

    def rss_bytes(self) -> int:
        """Resident set size of the server process (from /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu_ns(self) -> int:
        """CPU time the server process has used so far, in ns: the sum over its threads of
        the first field of ``/proc/<pid>/task/<tid>/schedstat`` (time on a CPU). Unlike wall
        time, it does not grow while the process waits for a CPU on a loaded machine."""
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended
                total += int((task / "schedstat").read_text().split()[0])
        return total

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


@contextlib.contextmanager
def serve(tmp: Path, *extra: str, cluster: str | None = None) -> Iterator[Served]:
    """``topoplace serve`` on free ports (main + ``--health-port``) until the block ends."""
    port, health = free_port(), free_port()
    log = tmp / f"serve-{port}.log"
    args = [sys.executable, "-m", "scheduler.cli.main", "--log-level", "WARNING", "serve"]
    args += ["--port", str(port), "--health-port", str(health), *extra]
    if cluster is not None:
        args += ["--cluster", cluster]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                status, _, _ = request("127.0.0.1", health, b"GET", b"/healthz", timeout=2)
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not start:\n" + log.read_text()
            time.sleep(0.1)
        yield Served(proc, port, health, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def read_response(sock: socket.socket) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP/1.1 response from ``sock`` (status, headers, body)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    status, headers, body = 0, {}, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = sock.recv(65536)
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            headers = {k.lower(): v for k, v in event.headers}
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return status, headers, body


def request(
    host: str,
    port: int,
    method: bytes,
    path: bytes,
    body: bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
    timeout: float = 10,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request on a new connection; the raw bytes are written as given."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        head = b"%s %s HTTP/1.1\r\nHost: topoplace\r\n" % (method, path)
        head += b"".join(b"%s: %s\r\n" % kv for kv in headers)
        head += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        s.sendall(head + body)
        return read_response(s)


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the server closed (or reset) ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
