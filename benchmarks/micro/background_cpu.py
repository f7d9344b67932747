"""``background-cpu``: CPU of the extender's periodic loops, in process.

In kube mode three loops run beside the verbs, each holding the GIL while it runs, so their
cost is taken from filter and bind and grows with the cluster. One table, a row per loop,
cluster size and case (CPU ms, ``time.process_time``; ``--kind`` selects the loops):

**health refresh** (``ClusterCache.refresh_nodes``, every ``health_refresh_interval_s``,
30 s: heartbeats age, settle times and failure memories expire without any event). A cache
of ``--nodes`` synthetic 8-GPU nodes (``benchmarks.clusters.synthetic_cluster``) with a
health tracker, optionally one DRA ResourceSlice of eight GPUs per node (``--slices``: the
recorded slice, ``benchmarks.clusters.node_slices``), loaded as the watch's initial list
does (``replace_all``). Rows: the first refresh after that list, the next ``--runs``
(default 10; nothing changed but the time), and one node update from the watch
(``ClusterCache.upsert_node`` of a node object with a new label, which reads the same
health inputs).

**parked poll** (``ParkedPods.poll``, the janitor's wake check for refused pods, every
second). ``--nodes`` DGX H100 nodes, every GPU held by a bound pod; ``--parked`` 8-GPU pods
refused through the real ``Extender`` filter (each offered every node, as kube-scheduler
sends them with ``percentageOfNodesToScore: 100``); then ``poll`` is timed:

* ``idle``: nothing freed since the last poll (the common case);
* ``freed``: one node's pod deleted before each poll (one pod woken, the rest checked);
* ``joined``: a node (full) added before each poll: the node positions move, so every
  parked pod's candidates are mapped onto the new ones.

The waker is ``CountingWakerNoApi`` (a stand-in for the annotation patch through the API,
whose cost is the waker's thread's, not the poll's); nothing is bound.

**remediation check** (``scheduler.core.remediation.plan``, every
``remediation.check_seconds``, 5 s, over the cache's snapshot). A snapshot of ``--nodes``
synthetic 8-GPU nodes with every GPU held by a bound pod of topoplace's profile (one
8-GPU pod per node; every fourth node's pod a member of a gang of 16), checked in three
states: every node healthy (the usual case), one node failed (NVSentinel's fatal XID
condition: a gang member and its 15 mates are due), and 1 % of the nodes failed;
``--runs`` checks per case (default 20), every pod seen failing long enough to be due.

``topoplace bench background-cpu [--kind health parked remediation] [--nodes 500 5000]
[--parked 100 2000] [--polls 20] [--slices] [--runs N]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import orjson

from benchmarks.clusters import dgx_h100_nodes, make_pod, node_slices, synthetic_cluster
from benchmarks.micro.pod_path import StubBinderNoApi
from benchmarks.registry import Figures
from benchmarks.stats import p99

LOOPS = ("health", "parked", "remediation")

UPDATES = 50
"""Node updates timed per health-refresh case (a label added to a node, as a watch event
brings it)."""


# ---- health refresh -------------------------------------------------------------------------


def refresh_case(
    nodes: int, runs: int, slices: bool
) -> tuple[float, list[float], int, list[float]]:
    """(first refresh ms after the initial list, the next ``runs`` refreshes in ms, nodes
    changed by the last, ms of each of :data:`UPDATES` node updates from the watch)."""
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


# ---- parked poll ----------------------------------------------------------------------------


class CountingWakerNoApi:
    """Stands in for ``PodWaker.wake`` (an API patch per pod): counts the pods."""

    def __init__(self) -> None:
        self.woken = 0

    def __call__(self, keys: list[str], why: str) -> None:
        self.woken += len(keys)


def parked_case(nodes: int, parked: int, polls: int) -> dict[str, Any]:
    """Per case: CPU ms of each poll; and the pods parked and woken."""
    from scheduler.cli.main import load_params
    from scheduler.core.snapshot import build_snapshot
    from scheduler.runtime.cache import ClusterCache
    from scheduler.runtime.gangs import GangRuntime
    from scheduler.server import wire
    from scheduler.server.extender import Extender

    params = load_params(None)
    objs = dgx_h100_nodes(nodes)
    names = [o["metadata"]["name"] for o in objs]
    full = [
        make_pod(f"x{i}", 8, namespace="bench", node=n, gpu_indices=list(range(8)))
        for i, n in enumerate(names)
    ]
    cache = ClusterCache(build_snapshot(objs, full, params), params)
    ext = Extender(cache, StubBinderNoApi(), gangs=GangRuntime())
    waker = CountingWakerNoApi()
    ext.parked.waker = waker
    for i in range(parked):
        pod = make_pod(f"p{i}", 8, namespace="bench")
        cache.upsert_pod(pod)
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
        assert not orjson.loads(ext.filter_json(wire.RawBody(body), body))["NodeNames"]
    assert len(ext.parked) == parked
    ext.parked.poll(cache)
    out: dict[str, Any] = {"parked": len(ext.parked)}
    extra = dgx_h100_nodes(nodes + polls)[nodes:]
    for case in ("idle", "freed", "joined"):
        times = []
        for i in range(polls):
            if case == "freed":
                cache.delete_pod(f"bench/x{i}")
            elif case == "joined":
                name = extra[i]["metadata"]["name"]
                cache.upsert_node(extra[i])
                cache.upsert_pod(
                    make_pod(f"j{i}", 8, namespace="bench", node=name, gpu_indices=list(range(8)))
                )
            t = time.process_time()
            ext.parked.poll(cache)
            times.append(1000 * (time.process_time() - t))
        out[case] = times
    out["woken"] = waker.woken
    return out


# ---- remediation check ----------------------------------------------------------------------


XID = {
    "type": "GpuXidError",
    "status": "True",
    "reason": "GpuXidErrorIsNotHealthy",
    "message": "ErrorCode:79 GPU has fallen off the bus",
    "lastHeartbeatTime": "2026-12-02T20:00:00Z",
    "lastTransitionTime": "2026-12-02T20:00:00Z",
}


def remediation_cluster(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` synthetic nodes, each full with one bound 8-GPU pod (every fourth in a gang
    of 16)."""
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
    """``nodes`` with NVSentinel's fatal XID condition added to those at ``which``."""
    out = list(nodes)
    for i in which:
        obj = copy.deepcopy(out[i])
        obj["status"]["conditions"] = [*obj["status"]["conditions"], XID]
        out[i] = obj
    return out


def add_arguments(ap: Any) -> None:
    """Loops, sizes, parked pods, polls, slices (the runner's ``--runs``: health refreshes
    after the first, default 10, and remediation checks per case, default 20)."""
    ap.add_argument("--kind", nargs="+", choices=LOOPS, default=list(LOOPS),
                    help="the loops timed (default all)")  # fmt: skip
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    ap.add_argument("--parked", type=int, nargs="+", default=[100, 2000],
                    help="parked poll: refused pods waiting")  # fmt: skip
    ap.add_argument("--polls", type=int, default=20, help="parked poll: polls timed per case")
    ap.add_argument("--slices", action="store_true",
                    help="health refresh: one DRA ResourceSlice per node")  # fmt: skip


def run(args: argparse.Namespace) -> Figures:
    """Every selected loop at every node count."""
    from scheduler.cli.main import load_params
    from scheduler.core.remediation import plan
    from scheduler.core.snapshot import build_snapshot

    rows: list[tuple[Any, ...]] = []
    if "health" in args.kind:
        runs = args.runs or 10
        for n in args.nodes:
            first, times, changed, updates = refresh_case(n, runs, args.slices)
            rows.append(("health refresh", n, "first after the list", first, first,
                         f"{'with' if args.slices else 'no'} DRA slices"))  # fmt: skip
            rows.append(("health refresh", n, f"next {runs}", statistics.median(times),
                         p99(times), f"nodes changed by the last: {changed}"))  # fmt: skip
            rows.append(("health refresh", n, "one node update (watch)",
                         statistics.median(updates), p99(updates), f"{len(updates)} updates"))  # fmt: skip
    if "parked" in args.kind:
        for n in args.nodes:
            for k in args.parked:
                r = parked_case(n, k, args.polls)
                for case in ("idle", "freed", "joined"):
                    t = r[case]
                    rows.append(("parked poll", n, f"{r['parked']} parked, {case}",
                                 statistics.median(t), p99(t),
                                 f"woken over the freed polls: {r['woken']}"))  # fmt: skip
    if "remediation" in args.kind:
        runs = args.runs or 20
        params = load_params(None)
        rp = params.remediation
        for n in args.nodes:
            nodes, pods = remediation_cluster(n)
            # node 0 carries a gang member (i % 4 == 0), so its whole gang is due
            for bad in ([], [0], list(range(0, n, 100))):
                snap = build_snapshot(failed(nodes, bad), pods, params)
                since = {p: 0.0 for p in snap.pods}
                times = []
                due = 0
                for _ in range(runs):
                    t = time.process_time()
                    got = plan(snap, rp, params.health, ("topoplace",), 1e9, since)
                    times.append(1000 * (time.process_time() - t))
                    due = sum(len(g) for g in got.groups)
                rows.append(("remediation check", len(snap.nodes), f"{len(bad)} nodes failed",
                             statistics.median(times), p99(times),
                             f"{len(snap.pods)} pods, {due} due"))  # fmt: skip
    return Figures(
        "CPU ms of one pass of each periodic loop (in process, process_time)",
        ("loop", "nodes", "case", "median ms", "p99 ms", "detail"),
        rows,
        {
            "health refresh": "synthetic 8-GPU nodes, health tracker on",
            "parked poll": f"DGX H100 nodes all full, 8-GPU pods refused, {args.polls} polls per case",
            "remediation check": "synthetic 8-GPU nodes, every GPU held (a quarter gang members, "
            "gangs of 16), the shipped policy",
            "runs": args.runs or "refresh 10, remediation 20",
        },  # fmt: skip
    )
