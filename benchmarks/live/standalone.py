"""What the standalone live benchmarks share (``benchmarks.live.dra``,
``benchmarks.live.fractional``): their command-line flags for the control plane and the
ports, the wait for a backlog's binds, topoplace's server-side verb latency, and how a
checkout is named in a report.

They run beside ``benchmarks.live.run`` (the scenario runner) because their pods carry what
it does not model: ResourceClaims, GPU shares.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.live.kubeapi import Api
from benchmarks.live.kubesched import Topoplace
from benchmarks.live.metrics import histogram_ms, parse_prometheus
from benchmarks.live.run import Plane

REPO = Path(__file__).resolve().parents[2]


def add_plane_args(ap: argparse.ArgumentParser) -> None:
    """``--kube-bin``, ``--topoplace-src``, ``--timeout``, ``--out`` and the ports of the
    control plane, both kube-schedulers and the extender."""
    ap.add_argument(
        "--kube-bin",
        default=os.environ.get("KUBE_BIN", ""),
        help="folder with etcd, kube-apiserver and kube-scheduler (default $KUBE_BIN)",
    )
    ap.add_argument("--topoplace-src", default=None, help="another checkout (an A/B)")
    ap.add_argument("--timeout", type=float, default=600.0, help="cap per arm, seconds")
    ap.add_argument("--out", required=True)
    ap.add_argument("--api-port", type=int, default=26443)
    ap.add_argument("--etcd-port", type=int, default=22379)
    ap.add_argument("--etcd-peer-port", type=int, default=22380)
    ap.add_argument("--topoplace-sched-port", type=int, default=21269)
    ap.add_argument("--default-sched-port", type=int, default=21279)
    ap.add_argument("--extender-port", type=int, default=28888)


BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")


def missing(args: argparse.Namespace) -> str:
    """What the run lacks to start (the binaries), or ""."""
    kb = Path(args.kube_bin) if args.kube_bin else None
    lacking = [b for b in BINARIES if kb is None or not (kb / b).is_file()]
    if lacking:
        return f"needs --kube-bin (or KUBE_BIN) with {', '.join(lacking)}"
    return ""


def up_plane(
    args: argparse.Namespace, prefix: str, *, dra: bool = False, feature_gates: Sequence[str] = ()
) -> tuple[Path, Plane, str, Api]:
    """A fresh control plane (the test cluster) in a new work folder, without a
    kube-scheduler (each arm runs its own), DRA served when ``dra``: (work folder, plane,
    kubeconfig, API client)."""
    work_dir = Path(tempfile.mkdtemp(prefix=prefix))
    plane = Plane.from_args(work_dir, args, dra=dra, feature_gates=feature_gates)
    kc = plane.up()
    return work_dir, plane, kc, Api(kc)


def down_plane(api: Api, plane: Plane, work_dir: Path, out: Path) -> None:
    """The end of a run: the client closed, the plane's logs kept under ``out/logs``, the
    plane stopped and its folder removed."""
    api.close()
    if (work_dir / "logs").is_dir():
        shutil.copytree(work_dir / "logs", out / "logs", dirs_exist_ok=True)
    plane.down(purge=True)


def wait_bound(api: Api, namespace: str, total: int, timeout: float) -> dict[str, float]:
    """pod -> when it was first seen bound (monotonic, pods listed every 0.2 s), until all
    ``total`` are, or nothing binds for 20 s, or ``timeout`` seconds passed."""
    seen: dict[str, float] = {}
    start = last = time.monotonic()
    while len(seen) < total:
        now = time.monotonic()
        if now - start > timeout or now - last > 20:
            break
        for p in api.list_pods(namespace).get("items", []):
            name = p["metadata"]["name"]
            if name not in seen and (p.get("spec") or {}).get("nodeName"):
                seen[name] = now
                last = now
        time.sleep(0.2)
    return seen


def pods_per_s(times: Sequence[float]) -> float:
    """Binds per second from the first bind to the last (nan for fewer than two)."""
    ts = sorted(times)
    return (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 1 and ts[-1] > ts[0] else float("nan")


def verb_ms(
    tp: Topoplace, verbs: Sequence[str] = ("filter", "prioritize")
) -> dict[str, dict[str, float]]:
    """Server-side latency of ``verbs`` of this topoplace so far (count, mean, p50, p99 ms
    of ``topoplace_request_seconds``; it is started fresh per arm)."""
    now = parse_prometheus(tp.metrics())
    return {v: histogram_ms({}, now, "topoplace_request_seconds", verb=v) for v in verbs}


def source_of(src: str | None) -> str:
    """The checkout topoplace ran from, with the revision a pinned export records."""
    if src is None:
        return "this checkout"
    rev = Path(src) / ".livebench-rev"
    return f"{src} ({rev.read_text().strip()})" if rev.is_file() else src
