"""CPU of the periodic health refresh (``ClusterCache.refresh_nodes``), in process.

In kube mode a thread re-assesses every node every ``health_refresh_interval_s`` (30 s):
heartbeats age, settle times and failure memories expire without any event. It holds the
GIL while it runs, so its cost is taken from filter and bind, and it grows with the
cluster. This benchmark builds a cache of ``--nodes`` synthetic 8-GPU nodes
(``benchmarks.clusters.synthetic_cluster``) with a health tracker, optionally one DRA
ResourceSlice of eight GPUs per node (``--slices``: the recorded slice of
``tests/fixtures/kube/dra-1.33``, renamed per node), loads them as the watch's initial
list does (``replace_all``), and times ``refresh_nodes``: the first refresh after that
list and the next ``--runs`` (nothing changed but the time).

Prints the conditions and, per case, the CPU ms of the first refresh and the median and
p99 of the others (``time.process_time``), and the median CPU ms of one node update from
the watch (``ClusterCache.upsert_node`` of a node object with a new label), which reads
the same health inputs.

Run: ``python -m benchmarks.health_refresh [--nodes 500 5000] [--runs 10] [--slices]
[--source DIR]`` (``--source`` imports ``scheduler`` from another checkout, e.g. an
export of an earlier revision, for a before / after comparison).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.checkout import add_source_option, import_scheduler

REPO = Path(__file__).resolve().parent.parent
SLICE_FIXTURE = REPO / "tests" / "fixtures" / "kube" / "dra-1.33" / "resourceslices.v1beta1.json"


def node_slices(names: list[str]) -> list[dict[str, Any]]:
    """One recorded GPU ResourceSlice per node, renamed to it, in a pool of its own named
    after it (devices as recorded)."""
    recorded = json.loads(SLICE_FIXTURE.read_text())["items"][0]
    out = []
    for name in names:
        s = copy.deepcopy(recorded)
        s["metadata"]["name"] = f"{name}-gpu.nvidia.com"
        s["spec"]["nodeName"] = name
        s["spec"]["pool"]["name"] = name  # a pool per node, as the driver publishes
        out.append(s)
    return out


def one_case(nodes: int, runs: int, slices: bool) -> tuple[float, list[float], int, list[float]]:
    """(first refresh ms after the initial list, the next ``runs`` refreshes in ms, nodes
    changed by the last, ms of each of :data:`UPDATES` node updates from the watch)."""
    from benchmarks.clusters import synthetic_cluster
    from scheduler.cli.main import load_params
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.health_tracker import HealthTracker

    objs = [o for o in synthetic_cluster(nodes)["items"] if o["kind"] == "Node"]
    params = load_params(None)
    extra = None
    if slices:
        from scheduler.core.health import RESOURCESLICES_KEY

        extra = {RESOURCESLICES_KEY: node_slices([o["metadata"]["name"] for o in objs])}
    # As in kube mode: an empty cache, then the watch's initial list (``replace_all``).
    cache = ClusterCache.from_objects([], [], params)
    cache.health_tracker = HealthTracker(params.health)
    cache.replace_all(objs, [], extra)
    t = time.process_time()
    cache.refresh_nodes()
    first = 1000 * (time.process_time() - t)
    times = []
    changed = 0
    for _ in range(runs):
        t = time.process_time()
        changed = cache.refresh_nodes()
        times.append(1000 * (time.process_time() - t))
    updates = []
    for i in range(min(UPDATES, len(objs))):
        obj = copy.deepcopy(objs[i])
        obj["metadata"].setdefault("labels", {})["benchmark/touched"] = str(i)
        t = time.process_time()
        cache.upsert_node(obj)
        updates.append(1000 * (time.process_time() - t))
    return first, times, changed, updates


UPDATES = 50
"""Node updates timed per case (a label added to a node, as a watch event brings it)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--runs", type=int, default=10, help="refreshes after the first")
    ap.add_argument("--slices", action="store_true", help="one DRA ResourceSlice per node")
    add_source_option(ap)
    args = ap.parse_args(argv)
    where = import_scheduler(args.source)
    from benchmarks.stats import p99

    print(
        f"health refresh, in process: scheduler from {where}; synthetic 8-GPU nodes, "
        f"{'one 8-GPU DRA ResourceSlice per node' if args.slices else 'no DRA slices'}, "
        f"health tracker on; the first refresh after the initial list, then {args.runs} more "
        "(CPU ms, process_time)"
    )
    print(
        "| nodes | first | median | p99 | nodes changed by the last "
        "| one node update from the watch, median |"
    )
    print("|---|---|---|---|---|---|")
    for n in args.nodes:
        first, times, changed, updates = one_case(n, args.runs, args.slices)
        print(
            f"| {n} | {first:.1f} | {statistics.median(times):.1f} | {p99(times):.1f} "
            f"| {changed} | {statistics.median(updates):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
