"""A short seeded chaos run on the live suite's plane (benchmarks/live/chaos.py).

A stream of whole-GPU pods, gangs (with and without a leaf constraint), HAMi shares and DRA
claim pods (gated with ``topoplace.io/allocate`` and ungated) runs through the shipped
kube-scheduler configuration, with the extender hop through the runner's fault proxy and
both topoplace and kube-scheduler reaching kube-apiserver through its TLS API proxy, while
a seeded schedule kills and restarts topoplace, hangs it past the extender's
``httpTimeout``, kills kube-scheduler and kube-apiserver, compacts etcd, drops the extender
connections, has the API proxy answer 429 (``Retry-After``) and 500/503 with open watches
cut, and changes a node's GPU and topology labels' shape. Asserted: no invariant read from the API server is ever
broken, every fault is followed by a probe pod bound within 60 s, every pending pod is
bound within the settle bound once the faults stop, and topoplace's ledger then equals the
one rebuilt from the API server.

Needs the suite's own plane (``KUBE_BIN`` without ``KUBECONFIG``: the runner restarts its
kube-apiserver in place) and ``etcdctl`` beside the binaries for the compaction. Ports: its
topoplace at ``TOPOPLACE_KUBE_PORT`` + 4 (``TOPOPLACE_KUBE_CHAOS_PORT``), its proxy at
+ 2 (``TOPOPLACE_KUBE_CHAOS_PROXY_PORT``), its API proxy at + 30
(``TOPOPLACE_KUBE_CHAOS_API_PROXY_PORT``), its kube-scheduler at
``TOPOPLACE_KUBE_SCHED_PORT`` + 4; ``TOPOPLACE_KUBE_CHAOS_SECONDS`` (default 120) bounds
the faulted part, ``TOPOPLACE_KUBE_CHAOS_SEED`` (default 3) picks the run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.kube.conftest import _CLUSTER, SHIPPED_SCHED_PORT, derived_port

FAULTS = (
    "tp-kill",
    "tp-stop",
    "ks-kill",
    "api-kill",
    "etcd-compact",
    "proxy-drop",
    "api-throttle",
    "api-error",
    "node-labels",
)
RECOVERY_BOUND_S = 60.0
SETTLE_BOUND_S = 150.0


def test_short_chaos_run_breaks_nothing(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from benchmarks.live import chaos

    cluster: Any = request.config.stash.get(_CLUSTER, None)
    if cluster is None:
        pytest.skip("needs the suite's own plane (KUBE_BIN without KUBECONFIG)")
    kinds = [
        k for k in FAULTS if k != "etcd-compact" or (Path(cluster.kube_bin) / "etcdctl").is_file()
    ]
    out = tmp_path_factory.mktemp("chaos")
    args = chaos.parse_args(
        [
            "--out", str(out),
            "--seed", os.environ.get("TOPOPLACE_KUBE_CHAOS_SEED", "3"),
            "--duration", os.environ.get("TOPOPLACE_KUBE_CHAOS_SECONDS", "120"),
            "--faults", ",".join(kinds),
            "--gap", "3",
            "--hold", "0.6",
            "--arrival", "1.5",
            "--lifetime", "20",
            "--settle", str(SETTLE_BOUND_S),
            "--probe-timeout", str(RECOVERY_BOUND_S),
            "--topoplace-port", str(derived_port("TOPOPLACE_KUBE_CHAOS_PORT", 4)),
            "--proxy-port", str(derived_port("TOPOPLACE_KUBE_CHAOS_PROXY_PORT", 2)),
            "--api-proxy-port", str(derived_port("TOPOPLACE_KUBE_CHAOS_API_PROXY_PORT", 30)),
            "--scheduler-port", str(SHIPPED_SCHED_PORT + 4),
        ]
    )  # fmt: skip
    result, version = chaos.run(args, cluster=cluster)
    chaos.write(out, result, args, version, "tests/kube/test_chaos_live.py")
    where = f"(report and logs in {out})"
    assert [f"{v.kind} {v.subject}: {v.detail}" for _, v in result.violations] == [], where
    injected = {f.kind for f in result.faults if not f.note.startswith("failed")}
    assert len(result.faults) >= len(kinds) and injected == set(kinds), (result.faults, where)
    slow = [(f.kind, f.recovery) for f in result.faults if not f.recovery <= RECOVERY_BOUND_S]
    assert slow == [], where
    assert all(not math.isnan(f.recovery) for f in result.faults)
    assert result.pending_after_settle == [], where
    assert result.ledger_checked and result.ledger_diff == [], where
    assert sum(result.bound.values()) > 0 and result.reads > 0
    dra = {k: result.bound[k] for k in ("dra", "dra-gated")}
    assert all(n > 0 for n in dra.values()), (dict(result.created), dra, where)
