"""CPU of one remediation check (``scheduler.core.remediation.plan``), in process.

In kube mode a thread runs the check every ``remediation.check_seconds`` (5 s) over the
cache's snapshot; it holds the GIL while it runs, so its cost is taken from filter and
bind. This benchmark builds a snapshot of ``--nodes`` synthetic 8-GPU nodes
(``benchmarks.clusters.synthetic_cluster``) with every GPU held by a bound pod of
topoplace's profile (one 8-GPU pod per node; every fourth node's pod a member of a gang
of 16), and times the check in three states: every node healthy (the usual case), one
node failed (NVSentinel's fatal XID condition: a gang member and its 15 mates are due),
and 1 % of the nodes failed.

Prints the conditions and, per case, the median and p99 CPU ms over ``--runs`` checks
(``time.process_time``) and the pods the check found due.

Run: ``python -m benchmarks.remediation_check [--nodes 500 5000] [--runs 20]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from typing import Any

XID = {
    "type": "GpuXidError",
    "status": "True",
    "reason": "GpuXidErrorIsNotHealthy",
    "message": "ErrorCode:79 GPU has fallen off the bus",
    "lastHeartbeatTime": "2026-12-02T20:00:00Z",
    "lastTransitionTime": "2026-12-02T20:00:00Z",
}


def cluster(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` synthetic nodes, each full with one bound 8-GPU pod (every fourth in a gang
    of 16)."""
    from benchmarks.clusters import make_pod, synthetic_cluster

    nodes = [o for o in synthetic_cluster(n)["items"] if o["kind"] == "Node"]
    pods = []
    for i, node in enumerate(nodes):
        name = node["metadata"]["name"]
        gpus = int(node["status"]["capacity"].get("nvidia.com/gpu", 0))
        if not gpus:
            continue
        gang = f"train-{i // 64}" if i % 4 == 0 else None
        pods.append(
            make_pod(
                f"p-{i:05d}", gpus, node=name, gpu_indices=range(gpus), gang=gang, gang_size=16
            )
        )
    return nodes, pods


def failed(nodes: list[dict[str, Any]], which: list[int]) -> list[dict[str, Any]]:
    out = list(nodes)
    for i in which:
        obj = copy.deepcopy(out[i])
        obj["status"]["conditions"] = [*obj["status"]["conditions"], XID]
        out[i] = obj
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)
    from benchmarks.stats import p99
    from scheduler.cli.main import load_params
    from scheduler.core.remediation import plan
    from scheduler.core.snapshot import build_snapshot

    params = load_params(None)
    rp = params.remediation
    print(
        f"remediation check, in process: synthetic 8-GPU nodes, every GPU held by a bound pod "
        f"(a quarter of them gang members, gangs of 16); the shipped policy (mode "
        f"{rp.mode}, after {rp.after_seconds:g} s); {args.runs} checks per case, every pod "
        "seen failing long enough to be due (CPU ms, process_time)"
    )
    print("| nodes | pods | nodes failed | median | p99 | pods due |")
    print("|---|---|---|---|---|---|")
    for n in args.nodes:
        nodes, pods = cluster(n)
        # node 0 carries a gang member (i % 4 == 0), so its whole gang is due
        for bad in ([], [0], list(range(0, n, 100))):
            snap = build_snapshot(failed(nodes, bad), pods, params)
            since = {p: 0.0 for p in snap.pods}
            times = []
            due = 0
            for _ in range(args.runs):
                t = time.process_time()
                got = plan(snap, rp, params.health, ("topoplace",), 1e9, since)
                times.append(1000 * (time.process_time() - t))
                due = sum(len(g) for g in got.groups)
            print(
                f"| {len(snap.nodes)} | {len(snap.pods)} | {len(bad)} "
                f"| {statistics.median(times):.2f} | {p99(times):.2f} | {due} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
